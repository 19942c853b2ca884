//! `dtf local`: a whole cluster on this machine — P `dtf-ps` and W
//! `dtf-worker` processes on free 127.0.0.1 ports, watched until the run
//! ends, then the final checkpoint evaluated.

use crate::auth::Credentials;
use crate::config::{Config, Mode};
use crate::eval::{self, Evaluation};
use crate::model::Mlp;
use crate::worker::client::Cluster;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

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

/// What `dtf local --json` prints as its last line.
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
    name: String,
    log: PathBuf,
    child: Child,
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

/// Runs the cluster to `last_step` and evaluates the result.
///
/// Errors: [`LocalError::Task`] with the failing task's log when any task
/// exits non-zero (the others are stopped), or setup and evaluation errors.
pub async fn run(opts: &Options, run_dir: &Path) -> Result<Report, LocalError> {
    let started = Instant::now();
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
        tick.tick().await;
        for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
            if let Some(status) = t
                .child
                .try_wait()
                .map_err(io(format!("waiting for {}", t.name)))?
            {
                t.status = Some(status);
                if !status.success() {
                    let err = LocalError::Task {
                        task: t.name.clone(),
                        status,
                        log: t.log.clone(),
                        tail: tail(&t.log, 20),
                    };
                    stop_all(&mut tasks).await;
                    bar.abandon();
                    return Err(err);
                }
            }
        }
        if tasks.iter().all(|t| t.status.is_some()) {
            break;
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
    }
    bar.finish_and_clear();
    let steps_per_sec = match first {
        Some((t0, s0)) if last.0 > t0 => (last.1 - s0) as f64 / (last.0 - t0).as_secs_f64(),
        _ => 0.0,
    };
    let (dir, data) = (cfg.checkpoint.dir.clone(), cfg.data.dir.clone());
    let ev: Evaluation = tokio::task::spawn_blocking(move || eval::evaluate(&dir, &data))
        .await
        .map_err(|e| LocalError::Setup(format!("evaluation task: {e}")))??;
    if ev.global_step < cfg.train.last_step {
        return Err(LocalError::Incomplete {
            dir: cfg.checkpoint.dir,
            step: ev.global_step,
            last_step: cfg.train.last_step,
        });
    }
    Ok(Report {
        global_step: ev.global_step,
        test_accuracy: ev.accuracy,
        ema_test_accuracy: ev.ema_accuracy,
        steps_per_sec,
        seconds: started.elapsed().as_secs_f64(),
        checkpoint_dir: cfg.checkpoint.dir,
        run_dir: run_dir.to_path_buf(),
    })
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

/// SIGTERM to every task still running, then SIGKILL to any that lingers.
async fn stop_all(tasks: &mut [Task]) {
    for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
        if let Some(pid) = t.child.id() {
            // SAFETY: kill(2) on a pid we spawned and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
    // One deadline for all, then SIGKILL to any that lingers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for t in tasks.iter_mut().filter(|t| t.status.is_none()) {
        if tokio::time::timeout_at(deadline, t.child.wait())
            .await
            .is_err()
        {
            let _ = t.child.kill().await;
        }
    }
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
