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
use crate::config::{Config, Mode};
use crate::eval::{self, Evaluation};
use crate::model::Mlp;
use crate::worker::client::Cluster;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// How long the workers get, after SIGTERM, to finish their step and (the
/// chief) write the final checkpoint. The daemons give up on their own
/// graceful stop after 30 s (`daemon::DRAIN_LIMIT`); the margin lets them do
/// so, and name why in their log, before they are killed.
pub const WORKER_STOP_LIMIT: Duration = Duration::from_secs(35);
/// How long the ps tasks (and, after a task failed, every task) get after
/// SIGTERM before SIGKILL: they hold nothing that is not in a checkpoint.
pub const PS_STOP_LIMIT: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// ps tasks.
    pub ps: usize,
    /// worker tasks.
    pub workers: usize,
    /// `last_step`.
    pub steps: u64,
    /// Training mode.
    pub mode: Mode,
    /// Where the IDX files are (default: the config default).
    pub data: Option<PathBuf>,
    /// Keep checkpoints here (default: a fresh directory under the run directory).
    pub checkpoint_dir: Option<PathBuf>,
    /// Overrides `checkpoint.save_secs`.
    pub save_secs: Option<u64>,
    /// Where `dtf-ps` and `dtf-worker` are.
    pub bin_dir: PathBuf,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// A base config to start from (hyperparameters); cluster and paths are replaced.
    pub base: Config,
    /// The file `base` was read from, if any: the resume command names it.
    pub base_path: Option<PathBuf>,
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
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Eval(#[from] eval::EvalError),
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

/// The signal that stopped a local run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StopSignal {
    /// Ctrl-C.
    #[serde(rename = "SIGINT")]
    Interrupt,
    /// `kill`, or a service manager stopping it.
    #[serde(rename = "SIGTERM")]
    Terminate,
}

impl StopSignal {
    /// Its name, as `kill -l` spells it.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "SIGINT",
            StopSignal::Terminate => "SIGTERM",
        }
    }

    /// What a shell reports for a program killed by it (128 + its number),
    /// so scripts can tell an interrupted run from a failed one.
    pub fn exit_code(self) -> u8 {
        match self {
            StopSignal::Interrupt => 130,
            StopSignal::Terminate => 143,
        }
    }
}

/// Where a stopped run stands, and how to go on.
#[derive(Debug, Clone, Serialize)]
pub struct Stopped {
    /// The signal that stopped it.
    pub signal: StopSignal,
    /// A second signal came: the tasks were killed without waiting for the
    /// chief's final checkpoint.
    pub forced: bool,
    /// The step of the newest valid checkpoint: where a resumed run starts.
    pub global_step: Option<u64>,
    /// The newest valid checkpoint's model file.
    pub checkpoint: Option<PathBuf>,
    /// `train.last_step` of this run.
    pub last_step: u64,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Where the checkpoints are.
    pub checkpoint_dir: PathBuf,
    /// Where the configuration and the tasks' logs are.
    pub run_dir: PathBuf,
    /// The command that continues this run from its newest checkpoint.
    pub resume: String,
    /// Tasks that did not stop cleanly (killed at a deadline, or failed),
    /// each with its log.
    pub problems: Vec<String>,
}

/// What a trained run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The final checkpoint's step.
    pub global_step: u64,
    /// Test accuracy of the raw variables.
    pub test_accuracy: f32,
    /// Test accuracy of the EMA shadows.
    pub ema_test_accuracy: f32,
    /// Global steps per second while training.
    pub steps_per_sec: f64,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Where the checkpoints are.
    pub checkpoint_dir: PathBuf,
    /// Where the configuration and the tasks' logs are.
    pub run_dir: PathBuf,
}

/// One spawned task.
struct Task {
    /// `ps:0`, `worker:1`.
    name: String,
    /// A worker (stopped before the ps tasks).
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

/// Writes a run directory (config, token) for `opts` and returns the config's path.
pub fn prepare(opts: &Options, run_dir: &Path) -> Result<(PathBuf, Config), LocalError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(run_dir.join("logs"))
        .map_err(io(format!("creating {}", run_dir.display())))?;
    let ports = free_ports(opts.ps + opts.workers)?;
    let mut cfg = opts.base.clone();
    cfg.cluster.ps = ports[..opts.ps]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    cfg.cluster.worker = ports[opts.ps..]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    cfg.train.last_step = opts.steps;
    cfg.train.mode = opts.mode;
    if let Some(d) = &opts.data {
        cfg.data.dir = d.clone();
    }
    cfg.checkpoint.dir = opts
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| run_dir.join("checkpoints"));
    if let Some(s) = opts.save_secs {
        cfg.checkpoint.save_secs = s;
    }
    let token_path = run_dir.join("token");
    let token = format!("{:032x}", rand::random::<u128>());
    std::fs::write(&token_path, &token).map_err(io(format!("writing {}", token_path.display())))?;
    std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod token"))?;
    cfg.security.token_file = token_path;
    cfg.validate()
        .map_err(|e| LocalError::Setup(e.to_string()))?;
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
    // SAFETY: between fork and exec the closure calls only prctl(2) and
    // getppid(2), both async-signal-safe, and allocates nothing (an OS error
    // code is not an allocation).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
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
        worker: name.starts_with("worker"),
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

/// SIGINT and SIGTERM, caught from the start of a run so that neither kills
/// `dtf local` while its tasks still run.
struct StopSignals {
    /// SIGINT.
    int: Signal,
    /// SIGTERM.
    term: Signal,
}

impl StopSignals {
    fn install() -> Result<Self, LocalError> {
        Ok(StopSignals {
            int: signal(SignalKind::interrupt()).map_err(io("catching SIGINT"))?,
            term: signal(SignalKind::terminate()).map_err(io("catching SIGTERM"))?,
        })
    }

    /// The next stop signal.
    async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            _ = self.int.recv() => StopSignal::Interrupt,
            _ = self.term.recv() => StopSignal::Terminate,
        }
    }
}

/// What one look at the tasks found.
enum Watch {
    /// Still training.
    Running,
    /// Every task has exited 0.
    Done,
}

/// Runs the cluster to `last_step` and evaluates the result, or stops it on
/// SIGINT or SIGTERM (see [`stop`]) and says where it stopped.
///
/// Errors: [`LocalError::Task`] with the failing task's log when any task
/// exits non-zero (the others are stopped); [`LocalError::Incomplete`] when
/// every task exited 0 short of `last_step`; setup and evaluation errors.
pub async fn run(opts: &Options, run_dir: &Path) -> Result<Outcome, LocalError> {
    let started = Instant::now();
    // Before any task exists: from here on a signal never kills dtf local
    // with its tasks left behind.
    let mut signals = StopSignals::install()?;
    let (config_path, cfg) = prepare(opts, run_dir)?;
    let roles = (0..opts.ps)
        .map(|i| ("dtf-ps", i, format!("ps:{i}")))
        .chain((0..opts.workers).map(|i| ("dtf-worker", i, format!("worker:{i}"))));
    let metrics = metrics_addresses(&cfg.metrics.listen, opts.ps + opts.workers);
    let mut tasks = Vec::new();
    for (k, (bin, i, name)) in roles.enumerate() {
        let listen = metrics.as_ref().map(|m| m[k].as_str());
        if let Some(listen) = listen {
            eprintln!("{name}: metrics on http://{listen}/metrics");
        }
        tasks.push(spawn(
            &opts.bin_dir.join(bin),
            &config_path,
            i,
            name,
            listen,
            run_dir,
        )?);
    }
    let credentials = Credentials::load(&cfg).map_err(|e| LocalError::Setup(e.to_string()))?;
    let specs = Mlp::new(&cfg.model.layers)
        .map_err(|e| LocalError::Setup(e.to_string()))?
        .variables();
    let cluster = Cluster::new(&cfg, specs, &credentials).map_err(LocalError::Setup)?;

    let bar = progress_bar(opts);
    let (mut first, mut last) = (None::<(Instant, u64)>, (Instant::now(), 0u64));
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        // One look at the tasks and the cluster, abandoned as soon as a stop
        // signal comes (a ps that does not answer must not delay the stop).
        let look = async {
            tick.tick().await;
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
            if let Ok(states) = cluster.states().await {
                let s = &states[0];
                if s.initialized {
                    let now = Instant::now();
                    if first.is_none() && s.global_step > 0 {
                        first = Some((now, s.global_step));
                    }
                    if s.global_step > last.1 {
                        last = (now, s.global_step);
                    }
                    bar.set_position(s.global_step.min(opts.steps));
                    bar.set_message(format!(
                        "loss {:.4} · {:.0} examples/s",
                        s.last_loss, s.examples_per_sec
                    ));
                }
            }
            Ok(Watch::Running)
        };
        let looked = tokio::select! {
            sig = signals.recv() => Err(sig),
            r = look => Ok(r),
        };
        match looked {
            Ok(Ok(Watch::Running)) => {}
            Ok(Ok(Watch::Done)) => break,
            Ok(Err(err)) => {
                stop_all(&mut tasks).await;
                bar.abandon();
                return Err(err);
            }
            Err(sig) => {
                bar.abandon();
                let stopped = stop(opts, &cfg, run_dir, &mut tasks, sig, &mut signals).await;
                return Ok(Outcome::Stopped(Stopped {
                    seconds: started.elapsed().as_secs_f64(),
                    ..stopped
                }));
            }
        }
    }
    bar.finish_and_clear();
    let steps_per_sec = match first {
        Some((t0, s0)) if last.0 > t0 => (last.1 - s0) as f64 / (last.0 - t0).as_secs_f64(),
        _ => 0.0,
    };
    let (dir, data) = (cfg.checkpoint.dir.clone(), cfg.data.dir.clone());
    let evaluation = tokio::task::spawn_blocking(move || eval::evaluate(&dir, &data));
    // Every task has exited; a signal now only cuts the evaluation short.
    let ev: Evaluation = tokio::select! {
        ev = evaluation => ev.map_err(|e| LocalError::Setup(format!("evaluation task: {e}")))??,
        sig = signals.recv() => {
            let stopped = stop(opts, &cfg, run_dir, &mut tasks, sig, &mut signals).await;
            return Ok(Outcome::Stopped(Stopped {
                seconds: started.elapsed().as_secs_f64(),
                ..stopped
            }));
        }
    };
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
        steps_per_sec,
        seconds: started.elapsed().as_secs_f64(),
        checkpoint_dir: cfg.checkpoint.dir,
        run_dir: run_dir.to_path_buf(),
    }))
}

/// The stop that `sig` asked for: SIGTERM to the workers, which finish
/// their step (the chief then writes a final checkpoint, the ps tasks still
/// serving), up to [`WORKER_STOP_LIMIT`]; then SIGTERM to the ps tasks, up to
/// [`PS_STOP_LIMIT`]; SIGKILL to any task past its deadline. A second signal
/// kills every task at once. Returns where the run stands (`seconds` unset).
async fn stop(
    opts: &Options,
    cfg: &Config,
    run_dir: &Path,
    tasks: &mut [Task],
    sig: StopSignal,
    signals: &mut StopSignals,
) -> Stopped {
    eprintln!(
        "dtf local: {}: stopping the workers (the chief writes a final checkpoint), then the ps tasks; {} again to stop at once",
        sig.name(),
        match sig {
            StopSignal::Interrupt => "Ctrl-C",
            StopSignal::Terminate => "SIGTERM",
        }
    );
    let mut problems = Vec::new();
    let graceful = async {
        let mut problems = Vec::new();
        for (workers, limit) in [(true, WORKER_STOP_LIMIT), (false, PS_STOP_LIMIT)] {
            let group = tasks.iter_mut().filter(|t| t.worker == workers);
            problems.extend(terminate(group.collect(), limit).await);
        }
        problems
    };
    let forced = tokio::select! {
        p = graceful => {
            problems = p;
            false
        }
        _ = signals.recv() => true,
    };
    if forced {
        eprintln!("dtf local: second signal: killing every task");
        for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
            // Reaped, so that none is left behind when dtf local exits.
            let _ = t.child.kill().await;
            t.status = t.child.try_wait().ok().flatten();
        }
    }
    let (global_step, checkpoint) = match newest_checkpoint(cfg) {
        Ok(Some((path, step))) => (Some(step), Some(path)),
        Ok(None) => (None, None),
        Err(e) => {
            problems.push(format!("no usable checkpoint: {e}"));
            (None, None)
        }
    };
    Stopped {
        signal: sig,
        forced,
        global_step,
        checkpoint,
        last_step: cfg.train.last_step,
        seconds: 0.0,
        checkpoint_dir: cfg.checkpoint.dir.clone(),
        run_dir: run_dir.to_path_buf(),
        resume: resume_command(opts, &cfg.checkpoint.dir),
        problems,
    }
}

/// SIGTERM to each of `tasks` still running, then waits for them until
/// `limit`, then SIGKILL. Returns a line per task that did not stop cleanly.
async fn terminate(mut tasks: Vec<&mut Task>, limit: Duration) -> Vec<String> {
    for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
        if let Some(pid) = t.child.id() {
            // SAFETY: kill(2) on a pid we spawned and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
    let deadline = tokio::time::Instant::now() + limit;
    let mut problems = Vec::new();
    for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
        match tokio::time::timeout_at(deadline, t.child.wait()).await {
            Ok(Ok(status)) => {
                use std::os::unix::process::ExitStatusExt;
                t.status = Some(status);
                // A task that had not yet installed its handlers (just
                // started) dies of the SIGTERM itself: that is the stop asked for.
                if !status.success() && status.signal() != Some(libc::SIGTERM) {
                    problems.push(format!(
                        "{} exited with {status} while stopping; its log: {}",
                        t.name,
                        t.log.display()
                    ));
                }
            }
            Ok(Err(e)) => problems.push(format!("waiting for {}: {e}", t.name)),
            Err(_) => {
                let _ = t.child.kill().await;
                t.status = t.child.try_wait().ok().flatten();
                problems.push(format!(
                    "{} did not stop within {} s and was killed; its log: {}",
                    t.name,
                    limit.as_secs(),
                    t.log.display()
                ));
            }
        }
    }
    problems
}

/// The newest checkpoint of `cfg` that verifies, and its step.
fn newest_checkpoint(cfg: &Config) -> Result<Option<(PathBuf, u64)>, LocalError> {
    let specs = Mlp::new(&cfg.model.layers)
        .map_err(|e| LocalError::Setup(e.to_string()))?
        .variables();
    let newest = checkpoint::restore_latest(&cfg.checkpoint.dir, &specs)
        .map_err(|e| LocalError::Eval(e.into()))?;
    Ok(newest.map(|(path, c)| (path, c.global_step)))
}

/// `dtf local …` that continues this run: the same cluster, base config and
/// data, on this run's checkpoints.
fn resume_command(opts: &Options, checkpoint_dir: &Path) -> String {
    let mut args = vec![
        "dtf".to_string(),
        "local".into(),
        "--ps".into(),
        opts.ps.to_string(),
        "--workers".into(),
        opts.workers.to_string(),
        "--mode".into(),
        match opts.mode {
            Mode::Async => "async".into(),
            Mode::Sync => "sync".into(),
        },
    ];
    let paths = [
        ("--config", opts.base_path.as_deref()),
        ("--data", opts.data.as_deref()),
        ("--checkpoint-dir", Some(checkpoint_dir)),
    ];
    for (flag, path) in paths {
        if let Some(p) = path {
            args.push(flag.into());
            args.push(p.display().to_string());
        }
    }
    if let Some(s) = opts.save_secs {
        args.extend(["--save-secs".into(), s.to_string()]);
    }
    args.extend(["--steps".into(), opts.steps.to_string()]);
    args.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a POSIX shell reads it back: as is when it holds only safe
/// characters, else in single quotes (a `'` written as `'\''`).
fn shell_quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-+=/.,:@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn progress_bar(opts: &Options) -> indicatif::ProgressBar {
    if !opts.progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(opts.steps);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] step {pos}/{len} {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// After a task failed: SIGTERM to every task still running, then SIGKILL
/// to any that lingers past [`PS_STOP_LIMIT`].
async fn stop_all(tasks: &mut [Task]) {
    terminate(tasks.iter_mut().collect(), PS_STOP_LIMIT).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_command_quotes_what_a_shell_would_split() {
        assert_eq!(
            shell_quote("/tmp/dtf-local-x/checkpoints"),
            "/tmp/dtf-local-x/checkpoints"
        );
        assert_eq!(shell_quote("my dir"), "'my dir'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

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
