//! `dtf local`: a whole cluster of local processes, trained, then its
//! summary.

use super::{Context, Result, chain, usage};
use std::io::IsTerminal;
use std::process::ExitCode;

/// `dtf local`: exit 0 when trained, 2 for a command line that cannot run
/// (nothing is created), 130/143 when stopped by SIGINT/SIGTERM.
pub fn local(mut opts: crate::local::Options, json: bool) -> Result<ExitCode> {
    let _log = crate::daemon::init_logging("warn");
    let exe = std::env::current_exe().map_err(|e| Context::wrap("locating the dtf binary", e))?;
    opts.bin_dir = exe
        .parent()
        .ok_or("the dtf binary has no directory")?
        .to_path_buf();
    // The hints name the dtf that was run: `dtf` from $PATH as typed, any
    // other as its absolute path (a relative one breaks after a `cd`).
    let typed = std::env::args().next().unwrap_or_else(|| "dtf".into());
    opts.program = if typed.contains('/') {
        exe.display().to_string()
    } else {
        typed
    };
    for path in [
        &mut opts.data,
        &mut opts.test,
        &mut opts.checkpoint_dir,
        &mut opts.config,
        &mut opts.init_from,
    ] {
        *path = path.as_deref().map(crate::local::absolute);
    }
    if std::io::stderr().is_terminal() {
        opts.progress = crate::local::Progress::Bar;
    }
    let mut notes = Vec::new();
    let planned = match crate::local::plan(&opts, &mut notes) {
        Ok(cfg) => cfg,
        Err(e) => return Ok(usage(&chain(&e))),
    };
    // Checked against the model before anything is created: a checkpoint
    // that does not fit is a command line that cannot run (exit 2).
    let seed = match opts
        .init_from
        .as_deref()
        .map(|p| crate::local::Seed::load(p, &planned, opts.checkpoint_dir.as_deref()))
    {
        None => None,
        Some(Ok(seed)) => Some(seed),
        Some(Err(e)) => return Ok(usage(&chain(&e))),
    };
    let run_dir = tempfile::Builder::new()
        .prefix("dtf-local-")
        .tempdir()
        .map_err(|e| Context::wrap("creating a run directory", e))?
        .keep();
    let t = &planned.train;
    eprintln!(
        "dtf local: {} ps + {} workers, {}, {} (learning rate {}), model {:?}, batch {}, to step {}; run directory {}",
        opts.ps,
        opts.workers,
        t.mode,
        t.optimizer().describe(),
        t.learning_rate,
        planned.model.layers,
        t.batch_size,
        t.last_step,
        run_dir.display()
    );
    for note in &notes {
        eprintln!("dtf local: {note}");
    }
    eprintln!(
        "watch it from another shell: {} status --config {}",
        opts.program,
        run_dir.join("dtf.toml").display()
    );
    // The run's in-process work (the final evaluation) flushes denormals
    // as its tasks do.
    let rt = crate::kernel::compute_threads(
        tokio::runtime::Builder::new_multi_thread().enable_all(),
        planned.train.flush_denormals,
    )
    .build()?;
    let mut outcome = rt.block_on(crate::local::run(&opts, &planned, seed.as_ref(), &run_dir))?;
    // Every task has exited and every connection closes with the runtime.
    drop(rt);
    // A finished run whose checkpoints went elsewhere leaves nothing behind: the run
    // directory holds only its config, token, logs and the ps tasks' snapshots. A failed
    // or stopped run keeps it (its logs say why; its resume command reads its config).
    if let crate::local::Outcome::Trained(report) = &mut outcome
        && !opts.keep_run_dir
        && opts.checkpoint_dir.is_some()
        && !report.checkpoint_dir.starts_with(&run_dir)
    {
        match std::fs::remove_dir_all(&run_dir) {
            Ok(()) => report.run_dir = None,
            Err(e) => eprintln!(
                "dtf local: cannot remove the run directory {}: {e}",
                run_dir.display()
            ),
        }
    }
    super::end_on_closed_pipe();
    let code = summary(&outcome, json);
    if json {
        println!("{}", serde_json::to_string(&outcome)?);
    }
    Ok(code)
}

/// Prints how a local run ended and returns its exit code: 0 when trained,
/// 130/143 when stopped by SIGINT/SIGTERM. With --json, stdout holds the
/// JSON alone; the lines for people go to stderr.
fn summary(outcome: &crate::local::Outcome, json: bool) -> ExitCode {
    let say = |line: String| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    match outcome {
        crate::local::Outcome::Trained(report) => {
            if report.already_complete {
                say(format!(
                    "already complete: the newest checkpoint is at global step {}; nothing to \
                     train (raise --steps to train on)",
                    report.global_step
                ));
            }
            let rate = report
                .steps_per_sec
                .map_or_else(String::new, |r| format!("  {r:.1} steps/s"));
            match &report.regression {
                Some(r) => say(format!(
                    "global_step {}  test RMSE {:.4}  EMA test RMSE {:.4}  test MAE {:.4}  EMA \
                     test MAE {:.4}{rate}  ({:.1} s)",
                    report.global_step,
                    r.test_rmse,
                    r.ema_test_rmse,
                    r.test_mae,
                    r.ema_test_mae,
                    report.seconds
                )),
                None => say(format!(
                    "global_step {}  test accuracy {:.4}  EMA test accuracy {:.4}{rate}  ({:.1} s)",
                    report.global_step,
                    report.test_accuracy,
                    report.ema_test_accuracy,
                    report.seconds
                )),
            }
            if let Some(b) = &report.binary {
                let examples = report
                    .examples_per_sec
                    .map_or_else(String::new, |r| format!("  {r:.0} examples/s"));
                say(format!(
                    "test AUC {:.4}  EMA test AUC {:.4}  test log loss {:.4}  EMA test log loss \
                     {:.4}{examples}",
                    b.test_auc, b.ema_test_auc, b.test_logloss, b.ema_test_logloss
                ));
            }
            say(format!("precision {}", report.precision.name()));
            say(format!(
                "model {:?} trained with {}",
                report.layers,
                serde_json::to_value(report.optimizer)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ));
            say(format!("checkpoints: {}", report.checkpoint_dir.display()));
            if let Some(b) = &report.best {
                say(format!(
                    "best checkpoint: {} (global_step {}, {} {:.4}; {} checkpoints scored)",
                    b.checkpoint.display(),
                    b.global_step,
                    b.metric,
                    b.score,
                    b.scored
                ));
            }
            ExitCode::SUCCESS
        }
        crate::local::Outcome::Stopped(s) => {
            for p in &s.problems {
                eprintln!("warning: {p}");
            }
            let how = if s.forced { "killed" } else { "stopped" };
            match (&s.global_step, &s.checkpoint) {
                (Some(step), Some(path)) => say(format!(
                    "{how} by {} at global step {step} of {}; newest checkpoint {}",
                    s.signal.name(),
                    s.last_step,
                    path.display()
                )),
                _ => say(format!(
                    "{how} by {} with no usable checkpoint yet (last step {}); a new run starts afresh",
                    s.signal.name(),
                    s.last_step
                )),
            }
            say(format!("logs: {}", s.run_dir.join("logs").display()));
            say(format!("resume: {}", s.resume));
            ExitCode::from(s.signal.exit_code())
        }
    }
}
