//! `dtf local`: a whole cluster on this machine — P `dtf-ps` and W
//! `dtf-worker` processes on free 127.0.0.1 ports, watched until the run
//! ends, then the final checkpoint evaluated.
//!
//! `dtf local` owns its tasks: they run in a process group of their own, so
//! the terminal's Ctrl-C reaches only `dtf local`, which stops them in the
//! order that keeps the run resumable (workers first, so the chief writes a
//! final checkpoint while the ps tasks still serve; then the ps tasks). They
//! die with it even when it is SIGKILLed (`PR_SET_PDEATHSIG`).

use crate::auth::Credentials;
use crate::checkpoint;
use crate::config::{Config, ConfigError};
use crate::data;
use crate::eval::{self, Evaluation};
use crate::model::Mlp;
use crate::transport::Cluster;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use stop::{StopSignals, stop, stop_all};
use tokio::process::{Child, Command};

mod init;
mod plan;
mod progress;
mod report;
mod stop;

pub use init::Seed;
pub use plan::{absolute, plan};
pub use report::{Best, BinaryReport, RegressionReport, Report};
pub use stop::{SAME_SIGNAL_WINDOW, StopSignal, Stopped};

/// How long the workers get, after SIGTERM, to finish their step and (the
/// chief) write the final checkpoint. The daemons give up on their own
/// graceful stop after 30 s (`daemon::DRAIN_LIMIT`); the margin lets them do
/// so, and name why in their log, before they are killed.
pub const WORKER_STOP_LIMIT: Duration = Duration::from_secs(35);
/// How long the ps tasks (and, after a task failed, every task) get after
/// SIGTERM before SIGKILL: they hold nothing that is not in a checkpoint.
pub const PS_STOP_LIMIT: Duration = Duration::from_secs(5);

/// The evaluator's niceness in `dtf local`, as `dtf-evaluator.service`'s `Nice=`.
pub const EVALUATOR_NICE: i32 = 10;

/// What to run, as the command line gave it; [`plan`] settles the configuration.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// ps tasks.
    pub ps: usize,
    /// worker tasks.
    pub workers: usize,
    /// The data set: a directory of IDX files, a `.npz` or a training
    /// `.csv` (default: the config's `[data]`). This and the other paths
    /// are made absolute by `cli::local`.
    pub data: Option<PathBuf>,
    /// The test `.csv` beside `data` (default: its name with `train` → `test`).
    pub test: Option<PathBuf>,
    /// Keep checkpoints here (default: a fresh directory under the run directory).
    pub checkpoint_dir: Option<PathBuf>,
    /// Start from this checkpoint (`--init-from`: TensorFlow's or dtf's;
    /// see [`Seed`]) instead of a fresh initialization.
    pub init_from: Option<PathBuf>,
    /// A configuration file to start from (hyperparameters); cluster and
    /// paths are replaced.
    pub config: Option<PathBuf>,
    /// Keys set on the command line (`--optimizer`, `--set k=v`), in order,
    /// over the file and the `DTF_…` environment.
    pub overrides: Vec<crate::config::Override>,
    /// Run `dtf-evaluator` beside the cluster (`dtf local --evaluator`).
    pub evaluator: bool,
    /// Keep the run directory after a finished run whose checkpoints went to
    /// `checkpoint_dir` (`--keep-run-dir`); without it, only a run that failed, was stopped,
    /// or keeps its checkpoints inside it leaves it behind.
    pub keep_run_dir: bool,
    /// Where `dtf-ps`, `dtf-worker` and `dtf-evaluator` are; this and the
    /// next two are the process's, filled in by `cli::local`.
    pub bin_dir: PathBuf,
    /// The `dtf` the user ran, as the hints (resume, status) should name it.
    pub program: String,
    /// How progress is shown while training.
    pub progress: Progress,
}

/// How `dtf local` shows its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A bar redrawn in place, with an ETA (stderr is a terminal).
    Bar,
    /// A plain line now and then (stderr is a pipe, a file, a journal): at
    /// every tenth of the run and at least this often.
    Lines(Duration),
}

impl Default for Progress {
    /// Lines every 10 s: the form that suits a pipe, a file or a journal.
    fn default() -> Self {
        Progress::Lines(Duration::from_secs(10))
    }
}

/// Errors of a local run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{task} failed ({status}); its log {log}:\n{tail}")]
    Task {
        task: String,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    /// The data set named on the command line cannot be used.
    #[error(transparent)]
    Data(#[from] data::DataError),
    /// The model's widths cannot be taken from the data set.
    #[error(transparent)]
    Resolve(#[from] data::ResolveError),
    /// The run's configuration is invalid, or its token cannot be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `model.layers` does not describe a model.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The ps addresses or the token cannot make a client (from `Cluster::new`).
    #[error(transparent)]
    Cluster(#[from] crate::transport::ClusterError),
    /// The final evaluation's blocking task panicked or was cancelled.
    #[error("evaluation task: {0}")]
    EvalTask(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Eval(#[from] eval::EvalError),
    /// `--init-from` names no checkpoint this run can start from; the
    /// problem says why (and names the file or variable).
    #[error("--init-from {path}: {problem}")]
    InitFrom {
        /// The path given.
        path: PathBuf,
        /// What is wrong and what would be right.
        problem: String,
    },
    /// Every task exited 0, yet the newest checkpoint is short of the last
    /// step: never report such a run as trained.
    #[error(
        "the newest checkpoint in {dir} is at step {step}, short of the last step {last_step}: the final checkpoint is missing"
    )]
    Incomplete {
        dir: PathBuf,
        step: u64,
        last_step: u64,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LocalError {
    let what = what.into();
    move |source| LocalError::Io { what, source }
}

/// How a local run ended; `dtf local --json` prints it as one object whose
/// `outcome` is `trained` or `stopped`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Trained to `last_step` and evaluated.
    Trained(Report),
    /// Stopped by a signal before the end.
    Stopped(Stopped),
}

/// The best checkpoint in `dir/best/`, from its index.
fn best_of(cfg: &Config) -> Option<Best> {
    let dir = cfg.checkpoint.dir.join(checkpoint::best::DIR);
    let index = checkpoint::best::read_index(&dir)?;
    let first = index.checkpoints.first()?;
    let ledger = cfg
        .checkpoint
        .dir
        .join(crate::evaluator::EVAL_DIR)
        .join(crate::evaluator::LEDGER);
    let scored = count_lines(&ledger);
    Some(Best {
        checkpoint: index.best_file(&dir)?,
        global_step: first.global_step,
        metric: index.metric.clone(),
        score: first.scores.get(cfg.eval.metric),
        scored,
    })
}

/// Lines in the evaluator's ledger, counted as they stream by (it may be
/// large) from a regular file only (a FIFO would block).
fn count_lines(path: &Path) -> usize {
    use std::io::Read;
    let Ok((file, _)) = crate::files::open_regular(path) else {
        return 0;
    };
    let mut reader = std::io::BufReader::new(file);
    let mut buf = [0u8; 64 << 10];
    let (mut lines, mut last) = (0, b'\n');
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count();
        last = buf[n - 1];
    }
    lines + usize::from(last != b'\n')
}

/// One spawned task.
struct Task {
    /// `ps:0`, `worker:1`, `evaluator:0`.
    name: String,
    /// A worker or the evaluator (stopped before the ps tasks).
    worker: bool,
    /// Its stdout and stderr.
    log: PathBuf,
    /// The process.
    child: Child,
    /// Its exit status, once reaped.
    status: Option<ExitStatus>,
}

/// Free ports on 127.0.0.1, found by binding port 0. Another process could
/// take one before the task binds it; that fails the run loudly, not silently.
fn free_ports(n: usize) -> Result<Vec<u16>, LocalError> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(io("binding a free port"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(io("reading a port"))
}

/// Writes a run directory (config, token) for `planned` ([`plan`]'s) and
/// returns the config's path and the config the tasks run with.
pub fn prepare(
    opts: &Options,
    planned: &Config,
    run_dir: &Path,
) -> Result<(PathBuf, Config), LocalError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(run_dir.join("logs"))
        .map_err(io(format!("creating {}", run_dir.display())))?;
    let ports = free_ports(opts.ps + opts.workers)?;
    let mut cfg = planned.clone();
    cfg.cluster.ps = ports[..opts.ps]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    cfg.cluster.worker = ports[opts.ps..]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    // The shared-memory sockets of this run, apart from any other's.
    cfg.cluster.runtime_dir = run_dir.join("run").display().to_string();
    // The ps tasks' snapshots (ps-N/) beside the run, unless the base config names a place.
    if cfg.ps.snapshot_dir.is_empty() {
        cfg.ps.snapshot_dir = run_dir.join("state").display().to_string();
    }
    cfg.checkpoint.dir = opts
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| run_dir.join("checkpoints"));
    let token_path = run_dir.join("token");
    let token = format!("{:032x}", rand::random::<u128>());
    std::fs::write(&token_path, &token).map_err(io(format!("writing {}", token_path.display())))?;
    std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod token"))?;
    cfg.security.token_file = token_path;
    cfg.validate()?;
    let path = run_dir.join("dtf.toml");
    std::fs::write(&path, cfg.to_toml()).map_err(io(format!("writing {}", path.display())))?;
    Ok((path, cfg))
}

/// `metrics.listen` of each task in start order (ps tasks, then workers):
/// the configured `host:port` for the first, the next ports for the others,
/// as every task of a local cluster shares one host. `None` when metrics are
/// off or the port is 0 (each task then binds a port of its own anyway).
fn metrics_addresses(listen: &str, tasks: usize) -> Option<Vec<String>> {
    let (host, port) = listen.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    (0..tasks)
        .map(|k| {
            let port = port.checked_add(u16::try_from(k).ok()?)?;
            Some(format!("{host}:{port}"))
        })
        .collect()
}

/// Starts `bin` for `task`, logging to `logs/<name>.log` in `run_dir`;
/// `metrics` overrides `metrics.listen` (`DTF_METRICS__LISTEN`).
///
/// The task gets a process group of its own, so a Ctrl-C on the terminal
/// (SIGINT to the whole foreground group) reaches `dtf local` alone and the
/// stop goes in its order; and `PR_SET_PDEATHSIG`, so it is killed when
/// `dtf local` dies, however it dies.
fn spawn(
    bin: &Path,
    config: &Path,
    task: usize,
    name: String,
    metrics: Option<&str>,
    run_dir: &Path,
) -> Result<Task, LocalError> {
    let log = run_dir
        .join("logs")
        .join(format!("{}.log", name.replace(':', "-")));
    let file = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
    let err = file.try_clone().map_err(io("log file"))?;
    let mut command = Command::new(bin);
    // The run directory's dtf.toml is what runs: the `DTF_<SECTION>__<KEY>`
    // variables are in it already, and must not be applied twice.
    for (name, _) in std::env::vars_os() {
        let config_var = name
            .to_str()
            .is_some_and(|n| n.starts_with(crate::config::ENV_PREFIX) && n.contains("__"));
        if config_var {
            command.env_remove(name);
        }
    }
    if let Some(listen) = metrics {
        command.env("DTF_METRICS__LISTEN", listen);
    }
    command.process_group(0);
    // The parent-death signal fires when the *thread* that forked exits, not
    // the process. `run` is the future that `block_on` polls on the main
    // thread, which lives as long as `dtf local`, so that is the same here.
    // SIGKILL rather than SIGTERM: the ps tasks die at the same instant, so
    // the chief could not write a checkpoint anyway, and nothing is left
    // draining for 30 s after the owner is gone.
    let parent = std::process::id() as libc::pid_t;
    // The evaluator below training, as its unit's Nice=10: it takes the CPU
    // the training tasks leave.
    let niceness = if name.starts_with("evaluator") {
        EVALUATOR_NICE
    } else {
        0
    };
    // SAFETY: between fork and exec the closure calls only prctl(2),
    // nice(2) and getppid(2), all async-signal-safe, and allocates nothing (an OS error
    // code is not an allocation).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // Best effort: nice(2) may fail only with EPERM for negative values.
            if niceness != 0 {
                libc::nice(niceness);
            }
            // dtf local may have died before prctl took effect: the child was
            // then reparented and no signal will come, so do not exec at all.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = command
        .arg("--config")
        .arg(config)
        .arg("--task")
        .arg(task.to_string())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("TF_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(io(format!("starting {}", bin.display())))?;
    Ok(Task {
        worker: name.starts_with("worker") || name.starts_with("evaluator"),
        name,
        log,
        child,
        status: None,
    })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What one look at the tasks found.
enum Watch {
    /// Still training.
    Running,
    /// Every task has exited 0.
    Done,
}

/// Runs the cluster `planned` ([`plan`]'s) describes to `last_step` in
/// `run_dir` (a fresh directory, this run's) and evaluates the result, or
/// stops it on SIGINT or SIGTERM (see [`stop`]) and says where it stopped.
/// A checkpoint directory already at `last_step` is evaluated, not trained.
/// `seed` (`--init-from`, checked by [`Seed::load`]) is written into the
/// run's checkpoint directory first. When the run cannot start (no task was started), `run_dir` is removed.
///
/// Errors: [`LocalError::Task`] with the failing task's log when any task
/// exits non-zero (the others are stopped); [`LocalError::Incomplete`] when
/// every task exited 0 short of `last_step`; setup and evaluation errors.
pub async fn run(
    opts: &Options,
    planned: &Config,
    seed: Option<&Seed>,
    run_dir: &Path,
) -> Result<Outcome, LocalError> {
    let started = Instant::now();
    // Before any task exists: from here on a signal never kills dtf local
    // with its tasks left behind.
    let setup = async {
        let signals = StopSignals::install()?;
        let (config_path, cfg) = prepare(opts, planned, run_dir)?;
        // `--init-from`: the chief restores the seed as any checkpoint.
        if let Some(seed) = seed {
            seed.plant(&cfg.checkpoint.dir)?;
            eprintln!("{}", seed.describe());
        }
        // Checkpoints none of which fits this model (another --hidden, say)
        // are refused here, naming both shapes, before any task exists:
        // the chief would only fail on them once the cluster is up.
        let newest = stop::newest_checkpoint(&cfg)?;
        let resumed = newest.as_ref().map_or(0, |(_, step)| *step);
        if resumed >= cfg.train.last_step {
            return Ok((signals, cfg, Vec::new(), resumed));
        }
        if let Some((path, step)) = &newest {
            eprintln!(
                "dtf local: resumed from step {step} (checkpoint {})",
                path.display()
            );
        }
        // The tasks inherit it: a ps holds a descriptor per connection, and a
        // fresh shell's soft limit (1024) is below what the units give it.
        crate::files::raise_nofile_limit();
        let tasks = spawn_all(opts, &cfg, &config_path, run_dir)?;
        Ok::<_, LocalError>((signals, cfg, tasks, resumed))
    };
    let (mut signals, cfg, mut tasks, resumed) = match setup.await {
        Ok(s) => s,
        Err(e) => {
            // Nothing ran: nothing to keep.
            let _ = std::fs::remove_dir_all(run_dir);
            return Err(e);
        }
    };
    let already_complete = tasks.is_empty();
    let mut display = progress::Display::new(opts.progress, cfg.train.last_step, resumed);
    if !already_complete {
        let credentials = Credentials::load(&cfg)?;
        let specs = Mlp::new(&cfg.model.layers)?.variables();
        let cluster = Cluster::new(&cfg, specs, &credentials)?;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            // One look at the tasks and the cluster, abandoned as soon as a stop
            // signal comes (a ps that does not answer must not delay the stop).
            let looked = tokio::select! {
                sig = signals.recv() => Err(sig),
                r = async {
                    tick.tick().await;
                    look(&mut tasks, &cluster, &mut display).await
                } => Ok(r),
            };
            match looked {
                Ok(Ok(Watch::Running)) => {}
                Ok(Ok(Watch::Done)) => break,
                Ok(Err(err)) => {
                    stop_all(&mut tasks).await;
                    display.clear();
                    return Err(err);
                }
                Err(sig) => {
                    display.clear();
                    let stopped = stop(opts, &cfg, run_dir, &mut tasks, sig, &mut signals).await;
                    return Ok(Outcome::Stopped(Stopped {
                        seconds: started.elapsed().as_secs_f64(),
                        ..stopped
                    }));
                }
            }
        }
    }
    let done = Instant::now();
    display.clear();
    let (dir, data) = (cfg.checkpoint.dir.clone(), cfg.data.clone());
    let evaluation = tokio::task::spawn_blocking(move || eval::evaluate_on(&dir, &data));
    // Every task has exited; a signal now only cuts the evaluation short.
    let ev: Evaluation = tokio::select! {
        ev = evaluation => ev.map_err(LocalError::EvalTask)??,
        sig = signals.recv() => {
            let stopped = stop(opts, &cfg, run_dir, &mut tasks, sig, &mut signals).await;
            return Ok(Outcome::Stopped(Stopped {
                seconds: started.elapsed().as_secs_f64(),
                ..stopped
            }));
        }
    };
    let steps_per_sec = display.timeline.per_sec(ev.global_step, done);
    if ev.global_step < cfg.train.last_step {
        return Err(LocalError::Incomplete {
            dir: cfg.checkpoint.dir,
            step: ev.global_step,
            last_step: cfg.train.last_step,
        });
    }
    Ok(Outcome::Trained(Report {
        global_step: ev.global_step,
        test_accuracy: ev.accuracy,
        ema_test_accuracy: ev.ema_accuracy,
        binary: ev.binary.map(|b| BinaryReport {
            test_auc: b.auc,
            ema_test_auc: b.ema_auc,
            test_logloss: b.log_loss,
            ema_test_logloss: b.ema_log_loss,
        }),
        regression: ev.regression.map(|r| RegressionReport {
            test_rmse: r.rmse,
            ema_test_rmse: r.ema_rmse,
            test_mae: r.mae,
            ema_test_mae: r.ema_mae,
        }),
        steps_per_sec,
        examples_per_sec: steps_per_sec.map(|r| r * cfg.train.batch_size as f64),
        already_complete,
        optimizer: cfg.train.optimizer,
        layers: cfg.model.layers.clone(),
        precision: cfg.train.precision,
        seconds: started.elapsed().as_secs_f64(),
        best: opts.evaluator.then(|| best_of(&cfg)).flatten(),
        checkpoint_dir: cfg.checkpoint.dir,
        run_dir: Some(run_dir.to_path_buf()),
    }))
}

/// Starts every ps task, then every worker, then (`--evaluator`) the
/// evaluator, each with its own metrics port when `metrics.listen` is set.
/// The evaluator exits by itself once it has scored the final checkpoint,
/// so the run ends when every task has exited, as without it.
fn spawn_all(
    opts: &Options,
    cfg: &Config,
    config_path: &Path,
    run_dir: &Path,
) -> Result<Vec<Task>, LocalError> {
    let evaluators = usize::from(opts.evaluator);
    let roles = (0..opts.ps)
        .map(|i| ("dtf-ps", i, format!("ps:{i}")))
        .chain((0..opts.workers).map(|i| ("dtf-worker", i, format!("worker:{i}"))))
        .chain((0..evaluators).map(|i| ("dtf-evaluator", i, format!("evaluator:{i}"))));
    let metrics = metrics_addresses(&cfg.metrics.listen, opts.ps + opts.workers + evaluators);
    let mut tasks = Vec::new();
    for (k, (bin, i, name)) in roles.enumerate() {
        let listen = metrics.as_ref().map(|m| m[k].as_str());
        if let Some(listen) = listen {
            eprintln!("{name}: metrics on http://{listen}/metrics");
        }
        tasks.push(spawn(
            &opts.bin_dir.join(bin),
            config_path,
            i,
            name,
            listen,
            run_dir,
        )?);
    }
    Ok(tasks)
}

/// Reaps the tasks that exited (a failure ends the run with that task's
/// log) and shows ps 0's progress.
async fn look(
    tasks: &mut [Task],
    cluster: &Cluster,
    display: &mut progress::Display,
) -> Result<Watch, LocalError> {
    for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
        if let Some(status) = t
            .child
            .try_wait()
            .map_err(io(format!("waiting for {}", t.name)))?
        {
            t.status = Some(status);
            if !status.success() {
                return Err(LocalError::Task {
                    task: t.name.clone(),
                    status,
                    log: t.log.clone(),
                    tail: tail(&t.log, 20),
                });
            }
        }
    }
    if tasks.iter().all(|t| t.status.is_some()) {
        return Ok(Watch::Done);
    }
    if let Ok(states) = cluster.states().await
        && states[0].initialized
    {
        let s = &states[0];
        display.show(s.global_step, s.last_loss, s.examples_per_sec);
    }
    Ok(Watch::Running)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_local_task_gets_its_own_metrics_port() {
        assert_eq!(
            metrics_addresses("127.0.0.1:9464", 3).unwrap(),
            ["127.0.0.1:9464", "127.0.0.1:9465", "127.0.0.1:9466"]
        );
        assert_eq!(
            metrics_addresses("[::1]:9000", 2).unwrap(),
            ["[::1]:9000", "[::1]:9001"]
        );
        assert_eq!(metrics_addresses("", 3), None);
        assert_eq!(metrics_addresses("127.0.0.1:0", 3), None);
        assert_eq!(metrics_addresses("127.0.0.1:65535", 2), None);
    }
}
