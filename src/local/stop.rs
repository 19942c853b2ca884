//! How `dtf local` stops: SIGINT and SIGTERM caught from the start, the
//! workers first (the chief writes its final checkpoint while the ps tasks
//! still serve), then the ps tasks, each within a deadline; a second signal
//! kills every task at once. Says where the run stands and how to resume it.

use super::*;
use tokio::signal::unix::{Signal, SignalKind, signal};

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

/// SIGINT and SIGTERM, caught from the start of a run so that neither kills
/// `dtf local` while its tasks still run.
pub(super) struct StopSignals {
    /// SIGINT.
    int: Signal,
    /// SIGTERM.
    term: Signal,
}

impl StopSignals {
    pub(super) fn install() -> Result<Self, LocalError> {
        Ok(StopSignals {
            int: signal(SignalKind::interrupt()).map_err(io("catching SIGINT"))?,
            term: signal(SignalKind::terminate()).map_err(io("catching SIGTERM"))?,
        })
    }

    /// The next stop signal.
    pub(super) async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            _ = self.int.recv() => StopSignal::Interrupt,
            _ = self.term.recv() => StopSignal::Terminate,
        }
    }
}

/// A signal this soon after the first is taken as the same stop: a person
/// does not press Ctrl-C twice within it, but one press can be delivered twice.
pub const SAME_SIGNAL_WINDOW: Duration = Duration::from_secs(1);

/// The stop that `sig` asked for: SIGTERM to the workers, which finish
/// their step (the chief then writes a final checkpoint, the ps tasks still
/// serving), up to [`WORKER_STOP_LIMIT`]; then SIGTERM to the ps tasks, up to
/// [`PS_STOP_LIMIT`]; SIGKILL to any task past its deadline. A second signal
/// (after [`SAME_SIGNAL_WINDOW`]) kills every task at once. Returns where the run stands (`seconds` unset).
pub(super) async fn stop(
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
    // One Ctrl-C can arrive as two signals (`timeout --foreground`, a
    // terminal and a wrapper each passing it on): one within
    // [`SAME_SIGNAL_WINDOW`] of the first is the same stop, not a second one.
    let first = tokio::time::Instant::now();
    let forced = {
        let mut graceful = std::pin::pin!(graceful);
        loop {
            tokio::select! {
                p = &mut graceful => {
                    problems = p;
                    break false;
                }
                _ = signals.recv() => {
                    if first.elapsed() >= SAME_SIGNAL_WINDOW {
                        break true;
                    }
                }
            }
        }
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
        resume: resume_command(opts, cfg),
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
pub(super) fn newest_checkpoint(cfg: &Config) -> Result<Option<(PathBuf, u64)>, LocalError> {
    let specs = Mlp::new(&cfg.model.layers)?.variables();
    let newest = checkpoint::restore_latest(&cfg.checkpoint.dir, &specs)
        .map_err(|e| LocalError::Eval(e.into()))?;
    if let Some((path, _)) = &newest {
        checkpoint::check_activation(path, cfg.model.activation)
            .map_err(|e| LocalError::Eval(e.into()))?;
    }
    Ok(newest.map(|(path, c)| (path, c.global_step)))
}

/// `dtf local …` that continues this run, naming the program as it was run:
/// the same cluster, base config, data and keys, on this run's checkpoints.
fn resume_command(opts: &Options, cfg: &Config) -> String {
    let mut args = vec![
        opts.program.clone(),
        "local".into(),
        "--ps".into(),
        opts.ps.to_string(),
        "--workers".into(),
        opts.workers.to_string(),
    ];
    let paths = [
        ("--config", opts.config.as_deref()),
        ("--data", opts.data.as_deref()),
        ("--test", opts.test.as_deref()),
        ("--checkpoint-dir", Some(cfg.checkpoint.dir.as_path())),
    ];
    for (flag, path) in paths {
        if let Some(p) = path {
            args.push(flag.into());
            args.push(p.display().to_string());
        }
    }
    for o in opts.overrides.iter().filter(|o| o.key != "train.last_step") {
        args.extend(["--set".into(), o.as_set()]);
    }
    if opts.evaluator {
        args.push("--evaluator".into());
    }
    args.extend(["--steps".into(), cfg.train.last_step.to_string()]);
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

/// After a task failed: SIGTERM to every task still running, then SIGKILL
/// to any that lingers past [`PS_STOP_LIMIT`].
pub(super) async fn stop_all(tasks: &mut [Task]) {
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
}
