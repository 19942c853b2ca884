//! What makes `dtf-ps` and `dtf-worker` well-mannered systemd daemons:
//! logging, readiness and status (sd_notify), the watchdog, signals, and
//! config reload on SIGHUP or file change — one [`Control`] enum fed by
//! signals and the file watcher, one loop that acts on it.

use crate::config::{self, Config, ConfigError, Role, TaskId};
use crate::worker::{self, Outcome, Reporter};
use sd_notify::NotifyState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use tracing_subscriber::{EnvFilter, reload};

/// Exit code for a configuration error (sysexits' EX_CONFIG): the units set
/// `RestartPreventExitStatus=78` so a typo does not restart in a loop.
pub const EX_CONFIG: u8 = 78;
/// Exit code for a runtime failure (systemd restarts the unit).
pub const EX_FAILURE: u8 = 1;
/// How long a graceful stop may take before the daemon exits anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// What the control loop is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// SIGTERM/SIGINT: stop gracefully (a second one: at once).
    Shutdown,
    /// SIGHUP or the config file changed: re-read it.
    Reload,
}

/// A daemon's failure, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Runtime(String),
}

impl DaemonError {
    /// 78 for configuration errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Config(_) => EX_CONFIG,
            DaemonError::Runtime(_) => EX_FAILURE,
        }
    }
}

/// Sends states to systemd; a no-op without `NOTIFY_SOCKET`.
pub fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!(error = %e, "sd_notify failed.");
    }
}

/// The handle that changes the log level on reload.
pub type LogHandle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Installs the global subscriber: one event per line, fields included, no
/// colour unless stderr is a terminal (journald gets plain text).
pub fn init_logging(level: &str) -> LogHandle {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // Under systemd the journal stamps each line itself.
    let fmt = if std::env::var_os("JOURNAL_STREAM").is_some() { fmt.without_time().boxed() } else { fmt.boxed() };
    let _ = tracing_subscriber::registry().with(filter).with(fmt).try_init();
    handle
}

/// Loads and validates the config, and checks the task index (and the token).
///
/// Errors: [`ConfigError`] naming the key and the file.
pub fn load(path: &Path, task: Option<usize>, role: Role) -> Result<(Config, TaskId), ConfigError> {
    let cfg = Config::load(path)?;
    let index = match (task, config::task_from_env()?) {
        (Some(i), _) => i,
        (None, Some(t)) if t.role == role => t.index,
        (None, Some(t)) => {
            return Err(ConfigError::Invalid(format!("TF_CONFIG names a {:?} task, but this is the {role:?} daemon", t.role)));
        }
        (None, None) => return Err(ConfigError::Invalid("no task index: pass --task N or set TF_CONFIG".into())),
    };
    let id = TaskId { role, index };
    cfg.check_task(id)?;
    Ok((cfg, id))
}

/// Feeds [`Control`] from SIGTERM, SIGINT, SIGHUP and changes to `path`.
/// The watcher is returned so it lives as long as the caller wants it.
fn control_sources(path: &Path) -> Result<(mpsc::UnboundedReceiver<Control>, Option<notify::RecommendedWatcher>), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = mpsc::unbounded_channel();
    let sig = |k: SignalKind| signal(k).map_err(|e| DaemonError::Runtime(format!("signal handler: {e}")));
    let (mut term, mut int, mut hup) = (sig(SignalKind::terminate())?, sig(SignalKind::interrupt())?, sig(SignalKind::hangup())?);
    let t = tx.clone();
    tokio::spawn(async move {
        loop {
            let c = tokio::select! {
                _ = term.recv() => Control::Shutdown,
                _ = int.recv() => Control::Shutdown,
                _ = hup.recv() => Control::Reload,
            };
            if t.send(c).is_err() {
                return;
            }
        }
    });
    Ok((rx, watch_file(path, tx)))
}

/// Watches the config file's directory (editors replace files rather than
/// write them in place) and sends [`Control::Reload`] when the file changes.
fn watch_file(path: &Path, tx: mpsc::UnboundedSender<Control>) -> Option<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = path.parent()?.to_path_buf();
    let name = path.file_name()?.to_owned();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && matches!(ev.kind, EventKind::Create(_) | EventKind::Modify(_))
            && ev.paths.iter().any(|p| p.file_name() == Some(&name))
        {
            let _ = ev_tx.send(());
        }
    })
    .map_err(|e| warn!(error = %e, "Config file watcher unavailable; reload with SIGHUP."))
    .ok()?;
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        warn!(dir = %dir.display(), error = %e, "Cannot watch the config directory; reload with SIGHUP.");
        return None;
    }
    // Debounce: an editor's save is several events; reload once they settle.
    tokio::spawn(async move {
        while ev_rx.recv().await.is_some() {
            while let Ok(Some(())) = tokio::time::timeout(Duration::from_millis(200), ev_rx.recv()).await {}
            if tx.send(Control::Reload).is_err() {
                return;
            }
        }
    });
    Some(watcher)
}

/// Sends `WATCHDOG=1` at half the interval systemd asked for, while the runtime lives.
fn start_watchdog() {
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period / 2);
            loop {
                tick.tick().await;
                notify(&[NotifyState::Watchdog]);
            }
        });
    }
}

/// Re-reads the file, validates it as a reload of the running config, and
/// applies it. An invalid file changes nothing and sends no RELOADING.
fn reload(path: &Path, current: &watch::Sender<Arc<Config>>, log: &LogHandle) {
    let old = current.borrow().clone();
    let new = match Config::load(path).and_then(|new| old.reload(new)) {
        Ok(new) => new,
        Err(e) => {
            error!(error = %e, "Reload rejected; the running configuration stays.");
            return;
        }
    };
    let mut states = vec![NotifyState::Reloading];
    if let Ok(usec) = NotifyState::monotonic_usec_now() {
        states.push(usec);
    }
    notify(&states);
    if new.log.level != old.log.level
        && let Ok(f) = EnvFilter::try_new(&new.log.level)
    {
        let _ = log.reload(f);
    }
    let changed = old.changed_keys(&new);
    current.send_replace(Arc::new(new));
    info!(changed = ?changed, "Configuration reloaded.");
    notify(&[NotifyState::Ready]);
}

/// Runs the control loop until `work` finishes: reloads on [`Control::Reload`],
/// cancels `shutdown` on the first [`Control::Shutdown`], exits at once on the second.
async fn supervise<T>(
    path: PathBuf,
    config: watch::Sender<Arc<Config>>,
    log: LogHandle,
    shutdown: CancellationToken,
    work: impl std::future::Future<Output = T>,
) -> Result<T, DaemonError> {
    let (mut control, _watcher) = control_sources(&path)?;
    start_watchdog();
    tokio::pin!(work);
    let mut stopping = false;
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            c = control.recv() => match c {
                Some(Control::Reload) => reload(&path, &config, &log),
                Some(Control::Shutdown) if stopping => {
                    warn!("Second stop signal: exiting now.");
                    std::process::exit(i32::from(EX_FAILURE));
                }
                Some(Control::Shutdown) => {
                    stopping = true;
                    info!("Stopping gracefully (send the signal again to exit at once).");
                    notify(&[NotifyState::Stopping]);
                    shutdown.cancel();
                    let deadline = tokio::time::sleep(DRAIN_LIMIT);
                    tokio::spawn(async move {
                        deadline.await;
                        error!(secs = DRAIN_LIMIT.as_secs(), "Graceful stop took too long; exiting.");
                        std::process::exit(i32::from(EX_FAILURE));
                    });
                }
                None => {}
            },
        }
    }
}

/// `dtf-ps`: serves ps task `task` until the run is complete or it is stopped.
///
/// Errors: [`DaemonError::Config`] (exit 78) or [`DaemonError::Runtime`].
pub async fn run_ps(path: PathBuf, cfg: Config, task: TaskId, log: LogHandle) -> Result<(), DaemonError> {
    let token = cfg.read_token()?;
    let addr = cfg.address(task).unwrap_or_default().to_string();
    if let Some(step) = worker::completed_run(&cfg) {
        info!(global_step = step, "The run is already complete (final checkpoint present); exiting.");
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| DaemonError::Runtime(format!("ps:{} cannot listen on {addr} (cluster.ps[{}]): {e}", task.index, task.index)))?;
    let shutdown = CancellationToken::new();
    let (tx, _rx) = watch::channel(Arc::new(cfg.clone()));
    notify(&[NotifyState::Ready, NotifyState::Status(&format!("ps:{} serving on {addr}", task.index))]);
    info!(task = task.index, %addr, "Parameter server ready.");
    let served = supervise(path, tx, log, shutdown.clone(), crate::ps::serve(&cfg, task.index, &token, listener, shutdown.clone())).await?;
    notify(&[NotifyState::Stopping]);
    served.map_err(|e| DaemonError::Runtime(e.to_string()))
}

/// `dtf-worker`: trains as worker `task` until `last_step` or stopped.
///
/// Errors: [`DaemonError::Config`] (exit 78) or [`DaemonError::Runtime`].
pub async fn run_worker(path: PathBuf, cfg: Config, task: TaskId, log: LogHandle) -> Result<Outcome, DaemonError> {
    let token = cfg.read_token()?;
    let shutdown = CancellationToken::new();
    let (tx, rx) = watch::channel(Arc::new(cfg));
    let work = worker::run(rx, task.index, &token, shutdown.clone(), &Systemd);
    let out = supervise(path, tx, log, shutdown, work).await?;
    notify(&[NotifyState::Stopping]);
    out.map_err(|e| DaemonError::Runtime(e.to_string()))
}

/// Reports a worker's progress to systemd.
struct Systemd;

impl Reporter for Systemd {
    fn ready(&self) {
        notify(&[NotifyState::Ready]);
    }
    fn status(&self, line: &str) {
        notify(&[NotifyState::Status(line)]);
    }
}

/// The command line both daemons share.
#[derive(Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    /// The cluster configuration file.
    #[arg(long, short = 'c', default_value = config::DEFAULT_PATH, env = "DTF_CONFIG")]
    pub config: PathBuf,
    /// This task's index in its role's address list (the unit instance: dtf-ps@N).
    /// Default: TF_CONFIG's task.
    #[arg(long, short = 't')]
    pub task: Option<usize>,
    #[command(subcommand)]
    pub command: Option<DaemonCommand>,
}

/// Subcommands of the daemons.
#[derive(Debug, clap::Subcommand)]
pub enum DaemonCommand {
    /// Validate the configuration (and the task and token) without starting; exit 78 if invalid.
    CheckConfig,
}

/// The whole of `dtf-ps` / `dtf-worker` after argument parsing: returns the exit code.
pub fn main(role: Role, args: Args) -> std::process::ExitCode {
    let (cfg, task) = match load(&args.config, args.task, role).and_then(|(c, t)| c.read_token().map(|_| (c, t))) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(EX_CONFIG);
        }
    };
    if let Some(DaemonCommand::CheckConfig) = args.command {
        println!("{}: valid for {task}", args.config.display());
        return std::process::ExitCode::SUCCESS;
    }
    let log = init_logging(&cfg.log.level);
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "Cannot start the async runtime.");
            return std::process::ExitCode::from(EX_FAILURE);
        }
    };
    let result = rt.block_on(async {
        match role {
            Role::Ps => run_ps(args.config, cfg, task, log).await,
            Role::Worker => run_worker(args.config, cfg, task, log).await.map(|_| ()),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "{task} failed.");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
