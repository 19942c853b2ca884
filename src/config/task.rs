//! Which task a process is: its [`Role`] and index ([`TaskId`]), as the
//! configuration, `--task` and `TF_CONFIG` name it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A task's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Parameter server: holds a shard of the variables.
    Ps,
    /// Worker: computes gradients; worker 0 is the chief.
    Worker,
    /// Evaluator (`dtf-evaluator`): scores each new checkpoint; talks to no
    /// ps, so it has no address in `[cluster]`. One per cluster, index 0.
    Evaluator,
}

/// One task of the cluster, e.g. `worker:1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId {
    /// ps or worker.
    pub role: Role,
    /// Index into the role's address list.
    pub index: usize,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Ps => "ps",
            Role::Worker => "worker",
            Role::Evaluator => "evaluator",
        })
    }
}

impl fmt::Display for TaskId {
    /// `ps:0`, `worker:1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.role, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_display() {
        assert_eq!(
            TaskId {
                role: Role::Ps,
                index: 0
            }
            .to_string(),
            "ps:0"
        );
        assert_eq!(
            TaskId {
                role: Role::Worker,
                index: 1
            }
            .to_string(),
            "worker:1"
        );
    }
}
