//! The nemeses: what the harness does to a running cluster, and what each
//! may cost it (the recovery promises of docs/design.md "Recovery").
//!
//! The extension point is the [`Nemesis`] enum: a new fault is a variant, a
//! `kind` name, a bound in [`Nemesis::bound`], and its injection and healing
//! in `run.rs` (`Driver::inject`, `Driver::heal`). Network faults wait for
//! the hosts harness of network namespaces (issue 31, `tests/it/hosts.rs`):
//! [`Nemesis::Partition`] and [`Nemesis::SlowLink`] are declared, never drawn,
//! and `Driver::inject` refuses them until the cluster runs in namespaces.

use std::fmt;
use std::time::Duration;

/// A task of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Task {
    /// `ps:N`.
    Ps(usize),
    /// `worker:N` (0: the chief).
    Worker(usize),
    /// `evaluator:0`.
    Evaluator,
}

impl Task {
    /// The role's binary suffix (`dtf-<role>`) and the index.
    pub fn role_index(self) -> (&'static str, usize) {
        match self {
            Task::Ps(i) => ("ps", i),
            Task::Worker(i) => ("worker", i),
            Task::Evaluator => ("evaluator", 0),
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (role, index) = self.role_index();
        write!(f, "{role}:{index}")
    }
}

/// A live edit of `dtf.toml` (written by rename, as an editor saves).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Edit {
    /// `train.learning_rate`.
    LearningRate(f32),
    /// `checkpoint.save_secs` (and `save_steps = 0`).
    SaveSecs(u64),
    /// `checkpoint.save_steps` (and `save_secs` unset).
    SaveSteps(u64),
    /// `train.last_step` moved, but kept far ahead of the step (the harness
    /// alone brings it close, at the end of the run).
    LastStepFarAhead(u64),
    /// A file every task must refuse (`train.learning_rate = -1`), put back
    /// after `duration`; no task is started meanwhile (it would exit 78, as
    /// it should, and systemd would not restart it).
    Invalid {
        /// How long the bad file stays.
        duration: Duration,
    },
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Nemesis {
    /// SIGKILL, and started again `down` later (as systemd's
    /// `Restart=on-failure` would, with its own delay).
    Kill {
        /// The victim.
        task: Task,
        /// How long it stays down.
        down: Duration,
    },
    /// SIGSTOP, then SIGCONT after `duration`.
    Pause {
        /// The victim.
        task: Task,
        /// How long it stays stopped.
        duration: Duration,
    },
    /// SIGTERM (a graceful stop), then started again once it exited.
    Restart {
        /// The victim.
        task: Task,
    },
    /// The checkpoint directory (a small tmpfs) filled to the last byte,
    /// freed after `duration`.
    DiskFull {
        /// How long it stays full.
        duration: Duration,
    },
    /// A live config edit.
    Edit(Edit),
    /// `task`'s host cut off from every other host for `duration` (plans
    /// on hosts only).
    Partition {
        /// The host cut off.
        task: Task,
        /// How long.
        duration: Duration,
    },
    /// `task`'s host's link shaped by a `tbf` qdisc (plans on hosts only).
    SlowLink {
        /// The host whose link is slow.
        task: Task,
        /// The rate, kbit/s.
        kbit: u32,
        /// How long.
        duration: Duration,
    },
    /// A ps's state directory (`<ps.snapshot_dir>/ps-N`, its ring copies
    /// of its neighbour's snapshots in `replica-ps-*` included) copied
    /// aside; `after` later the ps SIGKILLed, the directory replaced by that
    /// older copy, and the ps started again `down` later: a disk put back
    /// from an old image, a volume snapshot restored by mistake.
    StaleState {
        /// The ps.
        ps: usize,
        /// How long after the copy the ps is killed.
        after: Duration,
        /// How long it stays down.
        down: Duration,
    },
    /// A ps SIGKILLed; while it is down the older of its two snapshot files
    /// is renamed `shard-<newest step + 1>.safetensors`, in its own
    /// directory and in each `replica-ps-*` it keeps; started again `down`
    /// later. A file's name is no proof of its contents.
    RenamedSnapshot {
        /// The ps.
        ps: usize,
        /// How long it stays down.
        down: Duration,
    },
    /// A ps's snapshot writes fail for `window` (its directory made
    /// immutable, `chattr +i`: no file may be created or renamed there,
    /// even by root), then the ps is SIGKILLed and started again `down`
    /// later: it comes back from the snapshot before the window, its own
    /// step counter behind the others' (in async mode each shard counts its
    /// own updates).
    Drift {
        /// The ps.
        ps: usize,
        /// How long its writes fail before the kill.
        window: Duration,
        /// How long it stays down.
        down: Duration,
    },
}

/// The kinds [`super::schedule::Plan::draw`] draws (`Nemesis::kind`), for
/// reports and coverage; plans on hosts add `partition` and `slow-link`.
pub const KINDS: &[&str] = &[
    "kill",
    "pause",
    "restart",
    "disk-full",
    "edit-learning-rate",
    "edit-save",
    "edit-last-step",
    "edit-invalid",
    "stale-state",
    "renamed-snapshot",
    "drift",
];

/// How far the global step may go back after a fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// Not at all.
    Nothing,
    /// Back to the newest checkpoint that existed when the fault struck
    /// (today's promise for a ps's death).
    Checkpoint,
    /// To no less than the step seen this many seconds before the fault
    /// (a ps's own snapshots: `ps.snapshot_secs`).
    Seconds(f64),
    /// By at most this many steps.
    Steps(u64),
}

impl Nemesis {
    /// A short name of its kind (one of [`KINDS`], or a network fault's).
    pub fn kind(&self) -> &'static str {
        match self {
            Nemesis::Kill { .. } => "kill",
            Nemesis::Pause { .. } => "pause",
            Nemesis::Restart { .. } => "restart",
            Nemesis::DiskFull { .. } => "disk-full",
            Nemesis::Edit(Edit::LearningRate(_)) => "edit-learning-rate",
            Nemesis::Edit(Edit::SaveSecs(_) | Edit::SaveSteps(_)) => "edit-save",
            Nemesis::Edit(Edit::LastStepFarAhead(_)) => "edit-last-step",
            Nemesis::Edit(Edit::Invalid { .. }) => "edit-invalid",
            Nemesis::Partition { .. } => "partition",
            Nemesis::SlowLink { .. } => "slow-link",
            Nemesis::StaleState { .. } => "stale-state",
            Nemesis::RenamedSnapshot { .. } => "renamed-snapshot",
            Nemesis::Drift { .. } => "drift",
        }
    }

    /// The task the fault kills (and the harness starts again), if any.
    pub fn kills(&self) -> Option<Task> {
        match *self {
            Nemesis::Kill { task, .. } | Nemesis::Restart { task } => Some(task),
            Nemesis::StaleState { ps, .. }
            | Nemesis::RenamedSnapshot { ps, .. }
            | Nemesis::Drift { ps, .. } => Some(Task::Ps(ps)),
            _ => None,
        }
    }

    /// What the fault may cost the global step: docs/design.md's recovery
    /// promises. A ps that dies (killed, or stopped and started again)
    /// comes back from its own snapshot, so it loses at most what came after
    /// the last one (`ps.snapshot_secs`, plus a second for a snapshot that
    /// is late on a loaded machine; in sync mode with several ps it resumes
    /// at the other shards' step); with snapshots off, the chief re-seeds
    /// it from the newest checkpoint. Nothing else may cost a step.
    ///
    /// The faults on a ps's state are measured from their kill (where the
    /// history records them): a renamed snapshot costs what a kill does (the
    /// newest state is still on disk, under its own name); a state
    /// directory put back from an older copy too when a ring keeper holds
    /// the newer state (two ps or more), else back to the newest checkpoint
    /// (nothing newer exists); a ps whose writes failed for `window` before
    /// its kill, a kill's loss plus the window (its last snapshot is from
    /// before the window).
    pub fn bound(&self, cfg: &dtf::config::Config) -> Bound {
        let snapshots = cfg.ps.snapshot_secs > 0;
        let kill = Bound::Seconds(cfg.ps.snapshot_secs as f64 + 1.0);
        match self {
            _ if !snapshots && self.kills().is_some_and(|t| matches!(t, Task::Ps(_))) => {
                Bound::Checkpoint
            }
            Nemesis::Kill {
                task: Task::Ps(_), ..
            }
            | Nemesis::Restart { task: Task::Ps(_) }
            | Nemesis::RenamedSnapshot { .. } => kill,
            Nemesis::StaleState { .. } if cfg.cluster.ps.len() >= 2 => kill,
            Nemesis::StaleState { .. } => Bound::Checkpoint,
            Nemesis::Drift { window, .. } => {
                Bound::Seconds(cfg.ps.snapshot_secs as f64 + 1.0 + window.as_secs_f64())
            }
            _ => Bound::Nothing,
        }
    }
}

impl fmt::Display for Nemesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: &Duration| d.as_secs_f64();
        match self {
            Nemesis::Kill { task, down } => write!(f, "SIGKILL {task}, down {:.1}s", s(down)),
            Nemesis::Pause { task, duration } => {
                write!(f, "SIGSTOP {task} for {:.1}s", s(duration))
            }
            Nemesis::Restart { task } => write!(f, "SIGTERM {task} and start it again"),
            Nemesis::DiskFull { duration } => {
                write!(f, "fill checkpoint.dir for {:.1}s", s(duration))
            }
            Nemesis::Edit(Edit::LearningRate(lr)) => write!(f, "edit train.learning_rate = {lr}"),
            Nemesis::Edit(Edit::SaveSecs(n)) => write!(f, "edit checkpoint.save_secs = {n}"),
            Nemesis::Edit(Edit::SaveSteps(n)) => write!(f, "edit checkpoint.save_steps = {n}"),
            Nemesis::Edit(Edit::LastStepFarAhead(n)) => {
                write!(f, "edit train.last_step (far ahead, +{n})")
            }
            Nemesis::Edit(Edit::Invalid { duration }) => {
                write!(f, "an invalid dtf.toml for {:.1}s", s(duration))
            }
            Nemesis::Partition { task, duration } => {
                write!(f, "partition {task} for {:.1}s", s(duration))
            }
            Nemesis::SlowLink {
                task,
                kbit,
                duration,
            } => write!(
                f,
                "slow link of {task}: {kbit} kbit/s for {:.1}s",
                s(duration)
            ),
            Nemesis::StaleState { ps, after, down } => write!(
                f,
                "stale state of ps:{ps}: its directory copied aside, {:.1}s later SIGKILL, the copy put back, down {:.1}s",
                s(after),
                s(down)
            ),
            Nemesis::RenamedSnapshot { ps, down } => write!(
                f,
                "SIGKILL ps:{ps}, its older snapshots renamed past the newest, down {:.1}s",
                s(down)
            ),
            Nemesis::Drift { ps, window, down } => write!(
                f,
                "ps:{ps}'s snapshot writes fail for {:.1}s, then SIGKILL, down {:.1}s",
                s(window),
                s(down)
            ),
        }
    }
}
