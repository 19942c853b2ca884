//! The daemons' command line: [`Args`], TensorFlow's flag spellings
//! included, the `--job_name` check, and the configuration it names
//! ([`Args::load`]).

use crate::config::{self, Config, ConfigError, Role, TaskId};
use std::path::{Path, PathBuf};

/// The command line both daemons share; [`Args::parse_for`] fits its help
/// to one of them. `--task_index`, `--job_name`, `--ps_hosts` and
/// `--worker_hosts` are TensorFlow's spelling (`tf.app.flags` in the
/// reference program), so its launch scripts work, and with `--token-file`
/// they run a task without a configuration file (issue 43). Every option is
/// global: `dtf-ps check-config --ps_hosts=…` checks the command line it
/// would start with, whichever side of `check-config` the flags are.
#[derive(Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    /// The cluster configuration file; /dev/null: none. Default:
    /// /etc/dtf/dtf.toml, which may be absent when --ps_hosts/--worker_hosts
    /// or TF_CONFIG give the cluster.
    #[arg(long, short = 'c', env = "DTF_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// This task's index in its role's address list (the N of the unit instance).
    /// Default: TF_CONFIG's task.
    #[arg(
        long,
        short = 't',
        visible_aliases = ["task_index", "task-index"],
        global = true
    )]
    pub task: Option<usize>,
    /// TensorFlow's job name: accepted when it is this daemon's role.
    #[arg(
        long = "job_name",
        visible_alias = "job-name",
        value_name = "ROLE",
        global = true
    )]
    pub job_name: Option<String>,
    /// TensorFlow's --ps_hosts: the ps tasks' host:port, comma-separated
    /// (cluster.ps, over the file and the environment).
    #[arg(
        long = "ps_hosts",
        visible_alias = "ps-hosts",
        value_name = "HOST:PORT,…",
        global = true
    )]
    pub ps_hosts: Option<String>,
    /// TensorFlow's --worker_hosts: the workers' host:port, comma-separated,
    /// the chief first (cluster.worker, over the file and the environment).
    #[arg(
        long = "worker_hosts",
        visible_alias = "worker-hosts",
        value_name = "HOST:PORT,…",
        global = true
    )]
    pub worker_hosts: Option<String>,
    /// The cluster's token file (security.token_file, over the file and
    /// DTF_SECURITY__TOKEN_FILE).
    #[arg(long = "token-file", value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<DaemonCommand>,
}

impl Args {
    /// The keys this command line sets: `--ps_hosts` and `--worker_hosts`
    /// as `cluster.ps` and `cluster.worker`, `--token-file` as
    /// `security.token_file`.
    pub fn overrides(&self) -> Vec<config::Override> {
        // Every entry is kept, an empty one too: `a:1,,b:2` is an error
        // naming entry 1, not a list whose later indices silently shift.
        // Only a flag with no host at all is the empty list.
        let list = |hosts: &str| {
            if hosts.trim().is_empty() {
                return "[]".to_owned();
            }
            let quoted: Vec<String> = hosts
                .split(',')
                .map(|h| format!("{:?}", h.trim()))
                .collect();
            format!("[{}]", quoted.join(", "))
        };
        let hosts = [
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
        });
        let token = self.token_file.as_deref().map(|path| {
            let path = path.to_string_lossy();
            config::Override::string("security.token_file", &path, format!("--token-file={path}"))
        });
        hosts.chain(token).collect()
    }

    /// The configuration and the task this command line names for the
    /// `role` daemon, with the file it was read from (`None`: none, see
    /// [`config::daemon_file`]): `--job_name` checked, the file (or none),
    /// the environment, `TF_CONFIG`, then the flags over them all.
    ///
    /// Errors: [`ConfigError`]: a `--job_name` of another role, no file and
    /// no cluster, any error of [`Config::load_task`].
    pub fn load(&self, role: Role) -> Result<(Option<PathBuf>, Config, TaskId), ConfigError> {
        self.load_from(role, Path::new(config::DEFAULT_PATH))
    }

    /// [`Args::load`] with `default` in place of `/etc/dtf/dtf.toml`.
    fn load_from(
        &self,
        role: Role,
        default: &Path,
    ) -> Result<(Option<PathBuf>, Config, TaskId), ConfigError> {
        check_job_name(role, self.job_name.as_deref())?;
        let command_line = self.overrides();
        let file = config::daemon_file(self.config.as_deref(), &command_line, default)?;
        let (cfg, task) = Config::load_task(file.as_deref(), &command_line, self.task, role)?;
        Ok((file, cfg, task))
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
            })
            .mut_arg("token_file", |a| {
                if role == Role::Evaluator {
                    a.help("Accepted so one launch line serves every task; the evaluator calls no ps and reads no token")
                } else {
                    a.help("The cluster's token file (security.token_file, over the file and DTF_SECURITY__TOKEN_FILE). Default: /etc/dtf/token")
                }
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
        "chief" => "the chief is worker 0: dtf-worker --job_name=worker --task_index=0".to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::*;
    use clap::Parser;

    /// `dtf-ROLE ARGS…` loaded as the daemon would, with `default` in place
    /// of `/etc/dtf/dtf.toml`.
    fn load(
        role: Role,
        args: &[&str],
        default: &Path,
    ) -> Result<(Option<PathBuf>, Config, TaskId), ConfigError> {
        let args = Args::try_parse_from(std::iter::once("dtf").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        args.load_from(role, default)
    }

    fn err(role: Role, args: &[&str], default: &Path) -> String {
        match load(role, args, default) {
            Ok((_, _, task)) => panic!("{args:?} loaded as {task}"),
            Err(e) => e.to_string(),
        }
    }

    const PS: &str = "--ps_hosts=10.0.0.1:2222,10.0.0.2:2222";
    const WORKERS: &str = "--worker_hosts=10.0.0.3:2222,10.0.0.4:2222";

    /// Issue 43: TensorFlow 1.x's launch line, with no configuration file,
    /// exited 78 on the missing /etc/dtf/dtf.toml.
    #[test]
    fn tensorflow_flags_alone_run_a_task_without_a_file() {
        let _env = env_lock();
        remove_env("TF_CONFIG");
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("dtf.toml");
        let (file, cfg, task) = load(
            Role::Ps,
            &[
                PS,
                WORKERS,
                "--job_name=ps",
                "--task_index=1",
                "--token-file=/srv/dtf/token",
            ],
            &absent,
        )
        .unwrap();
        assert_eq!(file, None);
        assert_eq!(
            task,
            TaskId {
                role: Role::Ps,
                index: 1
            }
        );
        assert_eq!(cfg.cluster.ps, ["10.0.0.1:2222", "10.0.0.2:2222"]);
        assert_eq!(cfg.cluster.worker, ["10.0.0.3:2222", "10.0.0.4:2222"]);
        assert_eq!(cfg.security.token_file, Path::new("/srv/dtf/token"));
        assert_eq!(cfg.sources.origin("cluster.ps"), PS);
        assert_eq!(
            cfg.sources.origin("security.token_file"),
            "--token-file=/srv/dtf/token"
        );
        // Everything else at its default.
        let defaults = Config::default();
        assert_eq!(cfg.train, defaults.train);
        assert_eq!(cfg.data, defaults.data);
        assert_eq!(cfg.model, defaults.model);

        // The dashed spellings, and the flags after `check-config`, are the same.
        let (file, dashed, task) = load(
            Role::Worker,
            &[
                "check-config",
                "--ps-hosts=10.0.0.1:2222,10.0.0.2:2222",
                "--worker-hosts",
                "10.0.0.3:2222,10.0.0.4:2222",
                "--job-name",
                "worker",
                "--task-index",
                "1",
            ],
            &absent,
        )
        .unwrap();
        assert_eq!(file, None);
        assert_eq!(
            task,
            TaskId {
                role: Role::Worker,
                index: 1
            }
        );
        assert_eq!(dashed.cluster, cfg.cluster);
        assert_eq!(dashed.security, defaults.security);

        // TF_CONFIG's cluster stands for the flags as well.
        set_env(
            "TF_CONFIG",
            r#"{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}"#,
        );
        let loaded = load(Role::Worker, &[], &absent);
        remove_env("TF_CONFIG");
        let (file, cfg, task) = loaded.unwrap();
        assert_eq!(
            (file, cfg.cluster.ps, task.index),
            (None, vec!["p:1".to_owned()], 0)
        );
    }

    #[test]
    fn the_token_file_comes_from_the_flag_over_the_environment_over_the_file() {
        let _env = env_lock();
        remove_env("TF_CONFIG");
        let (dir, path) = write_config("[security]\ntoken_file = \"/from/file\"\n");
        let file = path.to_str().unwrap();
        let absent = dir.path().join("absent.toml");
        let token = |args: &[&str]| load(Role::Ps, args, &absent).unwrap().1.security.token_file;
        assert_eq!(token(&["-c", file, "-t", "0"]), Path::new("/from/file"));
        set_env("DTF_SECURITY__TOKEN_FILE", "/from/env");
        assert_eq!(token(&["-c", file, "-t", "0"]), Path::new("/from/env"));
        // A path that reads as a number stays a path.
        assert_eq!(
            token(&["-c", file, "-t", "0", "--token-file", "1234"]),
            Path::new("1234")
        );
        remove_env("DTF_SECURITY__TOKEN_FILE");
    }

    #[test]
    fn the_flags_override_the_files_cluster_and_keep_its_other_keys() {
        let _env = env_lock();
        remove_env("TF_CONFIG");
        let (_dir, path) = write_config(&format!("{TWO_WORKERS}[train]\nlast_step = 7\n"));
        let file = path.to_str().unwrap();
        let (read, cfg, task) = load(
            Role::Worker,
            &["-c", file, PS, "--task_index=1"],
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(read.as_deref(), Some(path.as_path()));
        assert_eq!(task.index, 1);
        assert_eq!(cfg.cluster.ps, ["10.0.0.1:2222", "10.0.0.2:2222"]);
        assert_eq!(cfg.cluster.worker, ["h:2", "h:3"]);
        assert_eq!(cfg.train.last_step, 7);
    }

    #[test]
    fn a_file_is_required_unless_the_cluster_is_given_elsewhere() {
        let _env = env_lock();
        remove_env("TF_CONFIG");
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("dtf.toml");
        // Nothing gives the cluster: the missing file says both ways out.
        let e = err(Role::Ps, &["--task", "0"], &absent);
        for part in [
            absent.to_str().unwrap(),
            "no such file",
            "--config FILE",
            "--ps_hosts",
            "--worker_hosts",
        ] {
            assert!(e.contains(part), "{part:?} not in {e}");
        }
        // A file named on the command line must exist: a typo is not "no file".
        let named = dir.path().join("typo.toml");
        let e = err(
            Role::Ps,
            &["-c", named.to_str().unwrap(), PS, "-t", "0"],
            &absent,
        );
        assert!(e.contains("typo.toml") && e.contains("cannot read"), "{e}");
        // /dev/null names no file, whatever is at the default path.
        let (_d, present) = write_config("[train]\nlast_step = 7\n");
        let (file, cfg, _) = load(Role::Ps, &["-c", "/dev/null", PS, "-t", "0"], &present).unwrap();
        assert_eq!(
            (file, cfg.train.last_step),
            (None, Config::default().train.last_step)
        );
        // /dev/null and no cluster anywhere: an error, not the built-in 127.0.0.1 cluster.
        let e = err(Role::Ps, &["-c", "/dev/null", "-t", "0"], &present);
        assert!(
            e.contains("no cluster is given") && e.contains("--ps_hosts"),
            "{e}"
        );
        // A default file that exists is read.
        let (file, cfg, _) = load(Role::Ps, &[PS, "-t", "0"], &present).unwrap();
        assert_eq!(
            (file.as_deref(), cfg.train.last_step),
            (Some(present.as_path()), 7)
        );
    }

    /// What a careless operator types: each a configuration error (exit 78)
    /// that names the flag and what would be right.
    #[test]
    fn careless_tensorflow_command_lines_are_clear_errors() {
        let _env = env_lock();
        remove_env("TF_CONFIG");
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("dtf.toml");
        let cases: &[(Role, &[&str], &[&str])] = &[
            (
                Role::Ps,
                &[PS, WORKERS, "--job_name=ps", "--task_index=5"],
                &[
                    "task ps:5: the cluster has 2 ps tasks",
                    "(cluster.ps in --ps_hosts=10.0.0.1:2222,10.0.0.2:2222)",
                ],
            ),
            (
                Role::Worker,
                &[PS, WORKERS, "--job_name=worker", "--task_index=2"],
                &[
                    "task worker:2: the cluster has 2 worker tasks",
                    "--worker_hosts=",
                ],
            ),
            (
                Role::Ps,
                &["--ps_hosts=", WORKERS, "--task_index=0"],
                &["--ps_hosts=: cluster.ps: is empty: expected at least one host:port"],
            ),
            (
                Role::Ps,
                &[PS, "--worker_hosts= ", "--task_index=0"],
                &["cluster.worker: is empty"],
            ),
            (
                Role::Ps,
                &["--ps_hosts=10.0.0.1", WORKERS, "--task_index=0"],
                &[
                    "--ps_hosts=10.0.0.1: cluster.ps[0]: invalid address \"10.0.0.1\": no port",
                    "e.g. 10.0.0.1:2222",
                ],
            ),
            (
                Role::Ps,
                &[
                    "--ps_hosts=10.0.0.1:2222,,10.0.0.2:2222",
                    WORKERS,
                    "--task_index=0",
                ],
                &["cluster.ps[1]: invalid address \"\""],
            ),
            (
                Role::Ps,
                &[
                    "--ps_hosts=10.0.0.1:2222,10.0.0.1:2222",
                    WORKERS,
                    "--task_index=0",
                ],
                &["cluster.ps[1]: duplicate address \"10.0.0.1:2222\" (also cluster.ps[0])"],
            ),
            (
                Role::Worker,
                &[PS, "--worker_hosts=10.0.0.2:2222", "--task_index=0"],
                &[
                    "--worker_hosts=10.0.0.2:2222: cluster.worker[0]: duplicate address",
                    "also cluster.ps[1]",
                ],
            ),
            (
                Role::Ps,
                &[PS, WORKERS, "--job_name=chief", "--task_index=0"],
                &[
                    "--job_name chief",
                    "the chief is worker 0: dtf-worker --job_name=worker --task_index=0",
                ],
            ),
            (
                Role::Worker,
                &[PS, WORKERS, "--job_name=ps", "--task_index=0"],
                &["--job_name ps", "use dtf-ps for ps tasks"],
            ),
            (
                Role::Ps,
                &[PS, WORKERS, "--job_name=master", "--task_index=0"],
                &["dtf's job names are ps, worker and evaluator"],
            ),
            (
                Role::Ps,
                &[PS, WORKERS, "--job_name=ps"],
                &["no task index: pass --task N"],
            ),
        ];
        for (role, args, wanted) in cases {
            let e = err(*role, args, &absent);
            for w in *wanted {
                assert!(e.contains(w), "dtf-{role} {args:?}: {w:?} not in {e}");
            }
        }
    }
}
