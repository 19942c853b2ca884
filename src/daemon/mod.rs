//! What makes `dtf-ps`, `dtf-worker` and `dtf-evaluator` well-mannered systemd daemons:
//! logging, readiness and status (sd_notify), the watchdog, signals, and
//! config reload on SIGHUP or file change — one [`Control`] enum fed by
//! signals and the file watcher, one loop that acts on it.
//!
//! - here — the control loop ([`run`]), the start checks ([`preflight`])
//!   and [`main`], re-exec for a re-shard;
//! - `systemd` — sd_notify ([`Notifier`]) and the watchdog;
//! - `logging` — [`init_logging`] and the reloadable level;
//! - `args` — the command line ([`Args`]) and the `--job_name` check;
//! - the config file's watcher is `config::watcher`, fed back as
//!   [`Control::Reload`].

mod args;
mod logging;
mod systemd;

pub use args::{Args, DaemonCommand, check_job_name};
pub use logging::{LogHandle, init_logging};
pub use systemd::{Notifier, notify};

use crate::auth::Credentials;
use crate::config::{self, Config, ConfigError, DataFormat, Role, TaskId};
use crate::data::{self, ResolveError};
use crate::worker::{self, Outcome};
use sd_notify::NotifyState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};
use tracing_subscriber::EnvFilter;

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
    /// The configuration cannot work (exit 78).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A signal handler could not be installed.
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The ps's address cannot be bound (in use, not local, no permission).
    #[error("ps:{task} cannot listen on {addr} (cluster.ps[{task}]): {source}")]
    Listen {
        task: usize,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The ps's server failed.
    #[error(transparent)]
    Ps(#[from] crate::ps::PsError),
    /// The worker stopped with an error.
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    /// The evaluator cannot work (no test set, unwritable `eval/` or `best/`).
    #[error(transparent)]
    Evaluator(#[from] crate::evaluator::EvaluatorError),
}

impl DaemonError {
    /// 78 for configuration errors (a token the ps tasks refuse is one:
    /// restarting cannot fix it), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Config(_) => EX_CONFIG,
            DaemonError::Worker(e) if e.is_refused_token() || e.is_config() => EX_CONFIG,
            _ => EX_FAILURE,
        }
    }
}

/// The sources of [`Control`]: signal handlers and the config file watcher.
struct Controls {
    /// What the signals and the watcher ask for.
    rx: mpsc::UnboundedReceiver<Control>,
    /// Kept alive so the file keeps being watched; `None` if watching failed.
    _watcher: Option<config::watcher::Watcher>,
}

/// Feeds [`Control`] from SIGTERM, SIGINT, SIGHUP and changes to `path`
/// (`None`, no file: nothing to watch; a SIGHUP still reloads).
///
/// Called before the task says `READY=1`: until the handlers are installed a
/// SIGHUP would kill the process (its default action), and systemd may send
/// one as soon as the unit is up.
fn control_sources(path: Option<&Path>) -> Result<Controls, DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = mpsc::unbounded_channel();
    let sig = |k: SignalKind| signal(k).map_err(DaemonError::Signals);
    let (mut term, mut int, mut hup) = (
        sig(SignalKind::terminate())?,
        sig(SignalKind::interrupt())?,
        sig(SignalKind::hangup())?,
    );
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
    Ok(Controls {
        rx,
        _watcher: path.and_then(|path| {
            config::watcher::watch(path, move || tx.send(Control::Reload).is_ok())
        }),
    })
}

/// Re-reads the file, validates it as a reload of the running config, and
/// applies it. An invalid file changes nothing and sends no RELOADING.
/// Before the task is ready, the reload is applied silently: a `READY=1`
/// after it would tell systemd the task is up when it is not.
fn reload(
    path: Option<&Path>,
    current: &watch::Sender<Arc<Config>>,
    log: &LogHandle,
    notifier: &Notifier,
) {
    let old = current.borrow().clone();
    let new = match Config::load_file(path).and_then(|new| old.reload(new)) {
        Ok(new) => new,
        Err(e) => {
            crate::metrics::global().reloaded(false);
            error!(error = %e, "Reload rejected; the running configuration stays.");
            return;
        }
    };
    let announce = notifier.is_ready();
    if announce {
        let mut states = vec![NotifyState::Reloading];
        if let Ok(usec) = NotifyState::monotonic_usec_now() {
            states.push(usec);
        }
        notify(&states);
    }
    if new.log.level != old.log.level
        && let Ok(f) = EnvFilter::try_new(&new.log.level)
    {
        let _ = log.reload(f);
    }
    let changes = old.changes(&new);
    current.send_replace(Arc::new(new));
    crate::metrics::global().reloaded(true);
    if changes.is_empty() {
        // A SIGHUP, or an edit saved back as it was: nothing to tell.
        debug!("Configuration reloaded; nothing changed.");
    } else {
        info!(changed = %changes.join(", "), "Configuration reloaded.");
    }
    if announce {
        notify(&[NotifyState::Ready]);
    }
}

/// Runs the control loop until `work` finishes: reloads on [`Control::Reload`],
/// cancels `shutdown` on the first [`Control::Shutdown`], exits at once on the second.
///
/// Returns `None` when a stop came before the task was ready: it had not
/// started its job, so there is nothing to drain, and `work` is dropped
/// rather than waited for (a worker still waiting for its ps tasks would
/// otherwise wait out the drain limit).
async fn supervise<T>(
    controls: Controls,
    path: Option<&Path>,
    config: watch::Sender<Arc<Config>>,
    log: LogHandle,
    notifier: &Notifier,
    shutdown: CancellationToken,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    let Controls {
        rx: mut control,
        _watcher,
    } = controls;
    systemd::start_watchdog();
    tokio::pin!(work);
    let mut stopping = false;
    let mut open = true;
    loop {
        tokio::select! {
            out = &mut work => return Some(out),
            c = control.recv(), if open => match c {
                Some(Control::Reload) => reload(path, &config, &log, notifier),
                Some(Control::Shutdown) if stopping => {
                    warn!("Second stop signal: exiting now.");
                    std::process::exit(i32::from(EX_FAILURE));
                }
                Some(Control::Shutdown) => {
                    stopping = true;
                    notifier.stopping();
                    shutdown.cancel();
                    if !notifier.is_ready() {
                        info!("Stopped before the task was ready; nothing to drain.");
                        return None;
                    }
                    info!("Stopping gracefully (send the signal again to exit at once).");
                    let deadline = tokio::time::sleep(DRAIN_LIMIT);
                    tokio::spawn(async move {
                        deadline.await;
                        error!(secs = DRAIN_LIMIT.as_secs(), "Graceful stop took too long; exiting.");
                        std::process::exit(i32::from(EX_FAILURE));
                    });
                }
                // Every sender is gone (cannot happen while the signal task
                // lives); stop polling rather than spin.
                None => open = false,
            },
        }
    }
}

/// Tells systemd that the task started on a complete run: `READY=1` first
/// (a `Type=notify` service that exits before it counts as a failed start),
/// then `STOPPING=1`.
fn announce_complete(notifier: &Notifier, task: TaskId, step: u64) {
    if !notifier.is_ready() {
        notifier.ready(&format!(
            "{task}: the run is complete (global step {step}); exiting"
        ));
    }
    notifier.stopping();
}

/// `dtf-ps`, `dtf-worker` and `dtf-evaluator`: one lifecycle for every role. Installs the
/// control sources, says so and exits at once on a complete run, serves
/// metrics, then runs the role's job under [`supervise`] (reload, graceful
/// stop, watchdog) until it ends.
///
/// Returns what the process does next: exit, or ([`Next::Restart`], a
/// re-shard) start again under the new `cluster.ps`.
///
/// Errors: [`DaemonError`]: exit 78 for configuration, 1 for the rest.
pub async fn run(
    role: Role,
    path: Option<PathBuf>,
    cfg: Config,
    task: TaskId,
    credentials: Credentials,
    log: LogHandle,
) -> Result<Next, DaemonError> {
    let notifier = Notifier::default();
    let controls = control_sources(path.as_deref())?;
    // Any task that can see the final checkpoint (the chief; others on its
    // host) knows the run is over without asking ps tasks that have exited.
    // Not the evaluator: the final checkpoint may be the one it has to score.
    if role != Role::Evaluator
        && let Some(step) = worker::completed_run(&cfg)
    {
        info!(global_step = step, dir = %cfg.checkpoint.dir.display(), "The run is already complete (final checkpoint present); nothing to do.");
        if role == Role::Worker && task.index == 0 {
            worker::tell_complete(&cfg, &credentials, step).await;
        }
        announce_complete(&notifier, task, step);
        return Ok(Next::Exit);
    }
    let shutdown = CancellationToken::new();
    let (tx, rx) = watch::channel(Arc::new(cfg));
    let _metrics = crate::metrics::spawn(role, task.index, tx.subscribe());
    let job = async {
        match role {
            Role::Ps => serve_ps(rx, task, &credentials, &notifier, shutdown.clone()).await,
            Role::Worker => {
                let out =
                    worker::run(rx, task.index, &credentials, shutdown.clone(), &notifier).await?;
                match out {
                    Outcome::AlreadyComplete { global_step } => {
                        announce_complete(&notifier, task, global_step);
                        Ok(Next::Exit)
                    }
                    Outcome::Reshard { .. } => Ok(Next::Restart),
                    _ => Ok(Next::Exit),
                }
            }
            Role::Evaluator => {
                crate::evaluator::run(rx, &notifier, shutdown.clone()).await?;
                Ok(Next::Exit)
            }
        }
    };
    let out = supervise(
        controls,
        path.as_deref(),
        tx,
        log,
        &notifier,
        shutdown.clone(),
        job,
    )
    .await;
    // A stop signal during the re-shard is a stop: systemd heard STOPPING=1.
    let out = match out {
        Some(Ok(Next::Restart)) if shutdown.is_cancelled() => Some(Ok(Next::Exit)),
        out => out,
    };
    match out {
        // systemd's reload protocol: the new image says READY=1 again.
        Some(Ok(Next::Restart)) => {
            let mut states = vec![
                NotifyState::Reloading,
                NotifyState::Status("re-sharding: starting again under the new cluster.ps"),
            ];
            if let Ok(usec) = NotifyState::monotonic_usec_now() {
                states.push(usec);
            }
            notify(&states);
        }
        _ => notifier.stopping(),
    }
    // None: stopped before the task was ready, with nothing to drain.
    out.unwrap_or(Ok(Next::Exit))
}

/// What a daemon does once its job ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Exits (0).
    Exit,
    /// Starts again in the same process ([`reexec`]): `cluster.ps` changed
    /// and the cluster re-shards.
    Restart,
}

/// Starts this program again in this process: `execve` of
/// `/proc/self/exe` with the same arguments and environment. The PID stays,
/// so systemd (and whatever else started the task) sees one process
/// throughout; every descriptor dtf opened is close-on-exec. Returns only
/// when the exec fails (exit 1: systemd restarts the task).
fn reexec() -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_default();
    info!("Starting again under the new cluster.ps.");
    // Until the new image installs its handler, a SIGHUP (a reload) would
    // end the process; ignored dispositions survive the exec.
    // SAFETY: setting a signal's disposition to SIG_IGN has no
    // preconditions; the exec follows at once.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    let e = std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(args)
        .exec();
    error!(error = %e, "Cannot start again for the re-shard; exiting (a supervisor restarts the task).");
    std::process::ExitCode::from(EX_FAILURE)
}

/// The ps's job: listen on its address, say `READY=1`, serve until the run
/// is complete or `shutdown`.
async fn serve_ps(
    config: watch::Receiver<Arc<Config>>,
    task: TaskId,
    credentials: &Credentials,
    notifier: &Notifier,
    shutdown: CancellationToken,
) -> Result<Next, DaemonError> {
    let cfg = config.borrow().clone();
    let addr = cfg.address(task).unwrap_or_default().to_string();
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| DaemonError::Listen {
            task: task.index,
            addr: addr.clone(),
            source,
        })?;
    notifier.ready(&format!("ps:{} serving on {addr}", task.index));
    info!(task = task.index, %addr, tls = credentials.tls(), "Parameter server ready.");
    let ended =
        crate::ps::serve(config.clone(), task.index, credentials, listener, shutdown).await?;
    if ended == crate::ps::Ended::Stopped {
        return Ok(Next::Exit);
    }
    // Still listed at the same address: start again under the new list.
    // Gone, or moved (another host takes the index): exit 0.
    let now = config.borrow().address(task).map(str::to_owned);
    if now.as_deref() == Some(addr.as_str()) {
        return Ok(Next::Restart);
    }
    info!(task = %task, %addr, now = ?now, "No longer in cluster.ps at this address: exiting.");
    Ok(Next::Exit)
}

/// The checks every start of `dtf-ps` and `dtf-worker` and every
/// `check-config` (theirs and `dtf check-config`) run, so that `valid` means
/// the daemons start: the values ([`Config::load`] validated them), the
/// token and TLS files (not the evaluator's), and the model against the
/// training data:
///
/// - with `model.hidden`, the widths come from the data, which must be
///   readable here for a worker or the evaluator; a ps does not read it
///   and leaves `model.layers` empty: it takes the widths from the chief;
/// - IDX data readable here: its header against `model.layers[0]` and
///   `train.batch_size` (cheap: a ps host reads 16 bytes, not the set);
/// - NumPy or CSV data present here, for a worker (and `dtf check-config`):
///   the whole set, as the worker reads it at start anyway. A ps host need
///   not hold the data; the worker then checks it when it loads it.
///
/// Errors: [`ResolveError::Config`] for an unusable token or TLS file, or
/// naming `model.layers` or `train.batch_size` when the data cannot train
/// this model; [`ResolveError::Data`] when `model.hidden` needs data that
/// cannot be read.
pub fn preflight(cfg: &mut Config, role: Role) -> Result<Credentials, ResolveError> {
    // The evaluator calls no ps: it needs no token (and its unit may not
    // read one).
    let credentials = if role == Role::Evaluator {
        Credentials::plaintext(String::new())
    } else {
        Credentials::load(cfg)?
    };
    let examples = if cfg.model.hidden.is_some() && role == Role::Ps {
        // The ps takes the widths from the chief (`ps::widths`): no data here.
        cfg.model.layers = Vec::new();
        None
    } else if cfg.model.hidden.is_some() {
        Some(data::resolve_model(cfg)?.examples)
    } else if cfg.data.format == DataFormat::Idx {
        let dir = &cfg.data.dir;
        match data::images_shape(dir, data::Split::Train) {
            Ok((_, pixels)) if pixels != cfg.model.layers[0] => {
                return Err(cfg
                    .bad(
                        "model.layers[0]",
                        format!(
                            "has {} inputs, but the images in data.dir {} have {pixels} pixels, \
                             {pixels} features per row: expected {pixels}, or give only the \
                             hidden widths as model.hidden",
                            cfg.model.layers[0],
                            dir.display()
                        ),
                    )
                    .into());
            }
            Ok((examples, _)) => Some(examples),
            Err(_) => None,
        }
    } else if role != Role::Ps && data::is_present(&cfg.data) {
        Some(data::resolve_model(cfg)?.examples)
    } else {
        None
    };
    if let Some(examples) = examples
        && cfg.train.batch_size > examples
    {
        return Err(cfg
            .bad(
                "train.batch_size",
                format!(
                    "{} is more than the {examples} training examples in {}",
                    cfg.train.batch_size,
                    data::describe(&cfg.data)
                ),
            )
            .into());
    }
    Ok(credentials)
}

/// For `check-config` of a worker (the chief restores, every worker reads the same
/// directory): `"; resumes from step N (checkpoint …)"` when `checkpoint.dir` holds a
/// checkpoint that fits the model, `""` when it holds none, and the error that the chief
/// would only meet once the cluster is up when it holds checkpoints none of which fits
/// (another `model.hidden`, say: both shapes named). Reads the newest checkpoints whole,
/// as the chief does.
pub fn resumes_from(
    cfg: &Config,
    role: Role,
) -> Result<String, crate::checkpoint::CheckpointError> {
    if role != Role::Worker {
        return Ok(String::new());
    }
    let Ok(mlp) = crate::model::Mlp::new(&cfg.model.layers) else {
        return Ok(String::new());
    };
    let Some((path, c)) = crate::checkpoint::restore_latest(&cfg.checkpoint.dir, &mlp.variables())?
    else {
        return Ok(String::new());
    };
    crate::checkpoint::check_activation(&path, cfg.model.activation)?;
    Ok(format!(
        "; resumes from step {} (checkpoint {})",
        c.global_step,
        path.display()
    ))
}

/// The whole of `dtf-ps` / `dtf-worker` after argument parsing: returns the exit code.
pub fn main(role: Role, args: Args) -> std::process::ExitCode {
    // Every load from here on, reloads included, sees the cluster the
    // command line gave: a reload of the file must not move it.
    config::set_command_line(args.overrides());
    let loaded = args
        .load(role)
        .map_err(ResolveError::from)
        .and_then(|(file, mut c, t)| {
            let credentials = preflight(&mut c, role)?;
            Ok((file, c, t, credentials))
        });
    let (file, cfg, task, credentials) = match loaded {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(EX_CONFIG);
        }
    };
    let check_only = matches!(args.command, Some(DaemonCommand::CheckConfig));
    let resumes = match check_only.then(|| resumes_from(&cfg, role)) {
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(EX_CONFIG);
        }
        Some(Ok(r)) if role == Role::Ps && cfg.model.layers.is_empty() => {
            r + "; the model's widths around model.hidden come from the chief"
        }
        Some(Ok(r)) => r,
        None => String::new(),
    };
    if check_only {
        // The effective values that most often come from elsewhere than the
        // file (DTF_… variables, TF_CONFIG, flags), so an operator sees what applies.
        let source = match &file {
            Some(path) => path.display().to_string(),
            None => "the command line (no configuration file)".to_owned(),
        };
        println!(
            "{source}: valid for {task} (cluster: {} ps, {} workers; train.mode = {}, train.last_step = {}; \
             token: {}){resumes}",
            cfg.cluster.ps.len(),
            cfg.cluster.worker.len(),
            cfg.train.mode,
            cfg.train.last_step,
            if role == Role::Evaluator {
                "none needed".to_owned()
            } else {
                cfg.security.token_file.display().to_string()
            }
        );
        return std::process::ExitCode::SUCCESS;
    }
    let log = init_logging(&cfg.log.level);
    if file.is_none() {
        info!(
            ps = %cfg.cluster.ps.join(","),
            worker = %cfg.cluster.worker.join(","),
            "No configuration file: the cluster from the command line or TF_CONFIG, every other key from DTF_… variables or its default."
        );
    }
    // Every thread of the runtime computes (the worker's steps, the ps's
    // updates, the evaluator's scoring), so each flushes denormals.
    let rt = match crate::kernel::compute_threads(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all(),
        cfg.train.flush_denormals,
    )
    .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "Cannot start the async runtime.");
            return std::process::ExitCode::from(EX_FAILURE);
        }
    };
    let result = rt.block_on(run(role, file, cfg, task, credentials, log));
    match result {
        Ok(Next::Exit) => std::process::ExitCode::SUCCESS,
        // The job is done (a ps's last snapshot written, a chief's
        // checkpoint); what else runs, the exec ends.
        Ok(Next::Restart) => reexec(),
        Err(e) => {
            error!(error = %e, "{task} failed.");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
