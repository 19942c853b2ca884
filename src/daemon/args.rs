//! The daemons' command line: [`Args`], TensorFlow's flag spellings
//! included, and the `--job_name` check.

use crate::config::{self, ConfigError, Role};
use std::path::PathBuf;

/// The command line both daemons share; [`Args::parse_for`] fits its help
/// to one of them. `--task_index` and `--job_name` are TensorFlow's spelling
/// (`tf.app.flags` in the reference program), so its launch scripts work.
#[derive(Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    /// The cluster configuration file.
    #[arg(long, short = 'c', default_value = config::DEFAULT_PATH, env = "DTF_CONFIG")]
    pub config: PathBuf,
    /// This task's index in its role's address list (the N of the unit instance).
    /// Default: TF_CONFIG's task.
    #[arg(long, short = 't', visible_alias = "task_index")]
    pub task: Option<usize>,
    /// TensorFlow's job name: accepted when it is this daemon's role.
    #[arg(long = "job_name", value_name = "ROLE")]
    pub job_name: Option<String>,
    /// TensorFlow's --ps_hosts: the ps tasks' host:port, comma-separated
    /// (cluster.ps, over the file and the environment).
    #[arg(long = "ps_hosts", value_name = "HOST:PORT,…")]
    pub ps_hosts: Option<String>,
    /// TensorFlow's --worker_hosts: the workers' host:port, comma-separated,
    /// the chief first (cluster.worker, over the file and the environment).
    #[arg(long = "worker_hosts", value_name = "HOST:PORT,…")]
    pub worker_hosts: Option<String>,
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<DaemonCommand>,
}

impl Args {
    /// The keys this command line sets: `--ps_hosts` and `--worker_hosts`
    /// as `cluster.ps` and `cluster.worker`.
    pub fn overrides(&self) -> Vec<config::Override> {
        let list = |hosts: &str| {
            let quoted: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("{h:?}"))
                .collect();
            format!("[{}]", quoted.join(", "))
        };
        [
            ("--ps_hosts", "cluster.ps", &self.ps_hosts),
            ("--worker_hosts", "cluster.worker", &self.worker_hosts),
        ]
        .into_iter()
        .filter_map(|(flag, key, hosts)| {
            let hosts = hosts.as_deref()?;
            Some(config::Override {
                key: key.into(),
                value: list(hosts),
                flag: format!("{flag}={hosts}"),
            })
        })
        .collect()
    }

    /// Parses the command line of the daemon for `role`, exiting with usage
    /// (2) on a bad one; the help names that daemon and its unit.
    pub fn parse_for(role: Role) -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let (name, about) = match role {
            Role::Ps => (
                "dtf-ps",
                "A parameter-server task of a dtf cluster (dtf-ps@N.service)",
            ),
            Role::Worker => (
                "dtf-worker",
                "A worker task of a dtf cluster (dtf-worker@N.service); worker 0 is the chief",
            ),
            Role::Evaluator => (
                "dtf-evaluator",
                "The evaluator of a dtf cluster (dtf-evaluator.service): scores each new checkpoint, keeps the best",
            ),
        };
        let command = Args::command()
            .name(name)
            .about(about)
            .mut_arg("task", |a| {
                a.help(if role == Role::Evaluator {
                    "This task's index: 0, the one evaluator of the cluster. Default: TF_CONFIG's task, else 0".to_string()
                } else {
                    format!(
                        "This task's index in cluster.{role}: N of the unit {name}@N. Default: TF_CONFIG's task"
                    )
                })
            })
            .mut_arg("job_name", |a| {
                a.help(format!(
                    "TensorFlow's --job_name; must be \"{role}\" for {name} (exit 78 otherwise)"
                ))
            });
        Args::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
    }
}

/// TensorFlow starts every task from one program with `--job_name`; here
/// each role has its own daemon, so a job name that is not this daemon's role
/// is a mistake in the unit or script, caught before it serves as the wrong
/// kind of task.
///
/// Errors: [`ConfigError::Key`] naming the daemon to use instead.
pub fn check_job_name(role: Role, job_name: Option<&str>) -> Result<(), ConfigError> {
    let Some(job) = job_name else {
        return Ok(());
    };
    if job == role.to_string() {
        return Ok(());
    }
    let instead = match job {
        "ps" => "use dtf-ps for ps tasks".to_string(),
        "worker" => "use dtf-worker for worker tasks".to_string(),
        "evaluator" => "use dtf-evaluator for the evaluator".to_string(),
        "chief" => "the chief is worker 0: dtf-worker --task 0".to_string(),
        _ => "dtf's job names are ps, worker and evaluator".to_string(),
    };
    Err(ConfigError::Key {
        origin: "command line".into(),
        key: format!("--job_name {job}"),
        problem: format!("this is dtf-{role}, which runs {role} tasks only ({instead})"),
    })
}

/// Subcommands of the daemons.
#[derive(Debug, clap::Subcommand)]
pub enum DaemonCommand {
    /// Validate the configuration, the task and (ps, worker) the token and TLS files, without starting; exit 78 if invalid.
    CheckConfig,
}
