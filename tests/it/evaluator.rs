//! `dtf-evaluator` and `checkpoint.save_steps`, as real processes: the
//! done-when run of `dtf local --evaluator` on Fashion-MNIST read back by
//! TensorBoard's `EventAccumulator`, an evaluator started late and
//! restarted, half-written and damaged checkpoints, config errors, and
//! checkpoints at exact step multiples.

use crate::util::*;
use dtf::config::{Config, Mode};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SOON: Duration = Duration::from_secs(60);

/// The `eval/` run as TensorBoard reads it: tag → [(step, value)].
fn accumulate(run_dir: &Path) -> BTreeMap<String, Vec<(u64, f64)>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/read_events.py");
    let out = output_within(
        Command::new("python3")
            .arg(script)
            .arg("--accumulator")
            .arg(run_dir),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "EventAccumulator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["scalars"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(tag, points)| {
            let points = points
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
                .collect();
            (tag.clone(), points)
        })
        .collect()
}

/// The evaluator's ledger: (step, ema_accuracy) per line, in order.
fn ledger(ckpt: &Path) -> Vec<(u64, f64)> {
    ledger_of(ckpt, "ema_accuracy")
}

/// The evaluator's ledger: (step, `key`'s score) per line, in order; a
/// line without that score (or with `null`: NaN) fails the test.
fn ledger_of(ckpt: &Path, key: &str) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(ckpt.join("eval/evaluated.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let score = v[key]
                .as_f64()
                .unwrap_or_else(|| panic!("no number {key} in the ledger line {l}"));
            (v["global_step"].as_u64().unwrap(), score)
        })
        .collect()
}

/// `best/index.json`: (step, ema_accuracy), best first.
fn best_index(ckpt: &Path) -> Vec<(u64, f64)> {
    best_index_of(ckpt, "ema_accuracy")
}

/// `best/index.json`: (step, `key`'s score), best first.
fn best_index_of(ckpt: &Path, key: &str) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(ckpt.join("best/index.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["global_step"].as_u64().unwrap(),
                e[key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("no number {key} in {text}")),
            )
        })
        .collect()
}

/// A checkpoint at `step` whose values depend on the step (so that the
/// scores differ), saved as the chief does (keeping them all).
fn save_checkpoint(cfg: &Config, step: u64) -> std::path::PathBuf {
    let mlp = dtf::model::Mlp::new(&cfg.model.layers).unwrap();
    let names: Vec<String> = mlp.variables().iter().map(|v| v.name.clone()).collect();
    let values = mlp.init(step);
    let shadows = mlp.init(step + 7);
    let ckpt = dtf::checkpoint::Checkpoint {
        global_step: step,
        variables: names.iter().cloned().zip(values).collect(),
        shadows: names.into_iter().zip(shadows).collect(),
        slots: Default::default(),
        run: 0,
        shard_steps: Vec::new(),
        table_optimizers: Vec::new(),
        increment: None,
        tables: Vec::new(),
    };
    dtf::checkpoint::Saver::new(&cfg.checkpoint.dir, 100)
        .unwrap()
        .save(&ckpt)
        .unwrap()
}

/// The best set holds `keep` entries, no checkpoint outside it scored
/// better, and best/ holds exactly their files and the index.
fn assert_best_set(ckpt: &Path, keep: usize) {
    assert_best_set_by(ckpt, keep, "ema_accuracy");
}

/// [`assert_best_set`] by `key` (a higher-is-better score).
fn assert_best_set_by(ckpt: &Path, keep: usize, key: &str) {
    let best = best_index_of(ckpt, key);
    let scored = ledger_of(ckpt, key);
    assert_eq!(best.len(), keep.min(scored.len()), "{best:?}");
    let worst_kept = best.iter().map(|b| b.1).fold(f64::INFINITY, f64::min);
    for (step, ema) in &scored {
        if !best.iter().any(|b| b.0 == *step) {
            assert!(
                *ema <= worst_kept,
                "step {step} ({ema}) beats the best set {best:?}"
            );
        }
    }
    let mut files: Vec<String> = std::fs::read_dir(ckpt.join("best"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut want: Vec<String> = best
        .iter()
        .flat_map(|(s, _)| {
            [
                format!("model.ckpt-{s}.safetensors"),
                format!("model.ckpt-{s}.ema.safetensors"),
            ]
        })
        .chain(["index.json".to_string()])
        .collect();
    want.sort();
    assert_eq!(files, want);
}

#[test]
fn local_evaluator_scores_checkpoints_for_tensorboard_and_keeps_the_best() {
    // The done-when run, as written: Fashion-MNIST and the default model.
    let data = Path::new(dtf::config::DEFAULT_DATA_DIR);
    assert!(
        data.join("t10k-labels-idx1-ubyte.gz").exists()
            || data.join("t10k-labels-idx1-ubyte").exists(),
        "this test needs Fashion-MNIST in {} (Debian: dataset-fashion-mnist)",
        data.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("D");
    let d_s = d.to_str().unwrap();
    let args = [
        "local",
        "--ps",
        "1",
        "--workers",
        "2",
        "--steps",
        "3000",
        "--save-secs",
        "1",
        "--evaluator",
        "--checkpoint-dir",
        d_s,
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let ran = run("dtf", &args, &[], Duration::from_secs(900));
    assert!(ran.status.success(), "dtf local failed:\n{}", ran.stderr);
    let summary = ran
        .stdout
        .lines()
        .find(|l| l.starts_with("best checkpoint: "))
        .unwrap_or_else(|| panic!("no best checkpoint in the summary:\n{}", ran.stdout))
        .to_string();

    // TensorBoard's own reader: ema_accuracy (and the others) at every scored step.
    let scalars = accumulate(&d.join("eval"));
    let ema = &scalars["ema_accuracy"];
    assert!(
        ema.len() >= 3,
        "ema_accuracy at {} steps: {ema:?}",
        ema.len()
    );
    for tag in ["accuracy", "loss"] {
        let steps: Vec<u64> = scalars[tag].iter().map(|p| p.0).collect();
        assert_eq!(steps, ema.iter().map(|p| p.0).collect::<Vec<_>>(), "{tag}");
    }
    let mut steps: Vec<u64> = ema.iter().map(|p| p.0).collect();
    let n = steps.len();
    steps.sort_unstable();
    steps.dedup();
    assert_eq!(steps.len(), n, "a step scored twice: {ema:?}");
    assert!(
        *steps.last().unwrap() >= 3000,
        "the final checkpoint is scored: {steps:?}"
    );

    // best/: at most keep_best (3), including the best the events show.
    assert_best_set(&d, 3);
    let best = best_index(&d);
    let top = ema.iter().map(|p| p.1).fold(f64::MIN, f64::max);
    assert!(
        (best[0].1 - top).abs() < 1e-6,
        "best {best:?}, events' top {top}"
    );
    assert!(
        ema.iter()
            .any(|p| p.0 == best[0].0 && (p.1 - top).abs() < 1e-6)
    );
    assert!(
        summary.contains(&format!("model.ckpt-{}.safetensors", best[0].0))
            && summary.contains(&format!("ema_accuracy {top:.4}")),
        "{summary}"
    );

    // dtf eval on best/ evaluates its best checkpoint.
    let best_dir = d.join("best");
    let out = run(
        "dtf",
        &["eval".as_ref(), best_dir.as_os_str(), "--json".as_ref()],
        &[],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let ev: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(ev["global_step"].as_u64().unwrap(), best[0].0);
    assert!(
        (ev["ema_accuracy"].as_f64().unwrap() - top).abs() < 1e-6,
        "{ev}"
    );
}

/// Wide & deep (`dtf local` picks it for categorical data) is scored by
/// AUC: finite AUCs raw and EMA in the ledger and in TensorBoard, and
/// best/ ranked by EMA AUC, the default metric of a wide & deep run.
#[test]
fn local_evaluator_scores_wide_deep_by_auc_and_keeps_the_best_auc() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("synth");
    let made = dtf_output(&[
        "synth",
        "--out",
        data.to_str().unwrap(),
        "--rows",
        "4000",
        "--fields",
        "3",
        "--cardinality",
        "40",
        "--weight-std",
        "1.0",
    ]);
    assert!(
        made.status.success(),
        "dtf synth: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let d = tmp.path().join("D");
    let ran = dtf_output(&[
        "local",
        "--data",
        data.to_str().unwrap(),
        "--ps",
        "1",
        "--workers",
        "1",
        "--steps",
        "300",
        "--batch-size",
        "64",
        "--save-steps",
        "50",
        "--set",
        "checkpoint.max_to_keep=20",
        "--evaluator",
        "--checkpoint-dir",
        d.to_str().unwrap(),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "dtf local failed:\n{stderr}");
    assert!(stderr.contains("model wide_deep"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&ran.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); stderr:\n{stderr}"));

    // Every checkpoint scored has finite AUCs, raw and EMA.
    let ema_auc = ledger_of(&d, "ema_auc");
    let auc = ledger_of(&d, "auc");
    assert!(ema_auc.len() >= 3, "{ema_auc:?}");
    for (step, v) in ema_auc.iter().chain(&auc) {
        assert!(
            v.is_finite() && (0.0..=1.0).contains(v),
            "step {step}: AUC {v}"
        );
    }
    assert!(
        ema_auc.iter().any(|p| p.0 >= 300),
        "the final checkpoint is scored: {ema_auc:?}"
    );

    // best/: ranked by EMA AUC, the best the ledger holds first.
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("best/index.json")).unwrap()).unwrap();
    assert_eq!(index["metric"], "ema_auc", "{index}");
    assert_best_set_by(&d, 3, "ema_auc");
    let best = best_index_of(&d, "ema_auc");
    let top = ema_auc.iter().map(|p| p.1).fold(f64::MIN, f64::max);
    assert_eq!(best[0].1, top, "best {best:?}, ledger {ema_auc:?}");
    assert!(best.windows(2).all(|w| w[0].1 >= w[1].1), "{best:?}");
    assert_eq!(report["best"]["metric"], "ema_auc", "{report}");
    assert_eq!(
        report["best"]["global_step"].as_u64(),
        Some(best[0].0),
        "{report}"
    );

    // TensorBoard's reader: auc and ema_auc at every scored step.
    let scalars = accumulate(&d.join("eval"));
    let steps = |tag: &str| -> Vec<u64> {
        let mut s: Vec<u64> = scalars[tag].iter().map(|p| p.0).collect();
        s.sort_unstable();
        s
    };
    let mut scored: Vec<u64> = ema_auc.iter().map(|p| p.0).collect();
    scored.sort_unstable();
    for tag in ["auc", "ema_auc", "loss", "ema_accuracy"] {
        assert_eq!(steps(tag), scored, "{tag}: {scalars:?}");
    }
    for (step, v) in &scalars["ema_auc"] {
        let want = ema_auc.iter().find(|p| p.0 == *step).unwrap().1;
        assert!((v - want).abs() < 1e-6, "step {step}: {v} vs {want}");
    }
}

#[test]
fn a_late_evaluator_scores_newest_first_and_a_restarted_one_scores_nothing_twice() {
    let mut c = Cluster::new(1, 1, 2000, Mode::Async);
    for step in (1..=10).map(|k| k * 100) {
        save_checkpoint(&c.cfg, step);
    }
    let ckpt = c.cfg.checkpoint.dir.clone();
    let n = NotifySocket::bind(c.dir.path());
    c.start_with_env("evaluator", 0, &[("NOTIFY_SOCKET", n.path.as_os_str())]);
    let msg = n.next(SOON, "READY=1");
    assert!(
        msg.contains("READY=1") && msg.contains("STATUS=evaluator:"),
        "{msg}"
    );
    // Newest first: a late evaluator does not work through the backlog in order.
    let first = until(SOON, "a first checkpoint scored", || {
        ledger(&ckpt).first().copied()
    });
    assert_eq!(first.0, 1000, "{:?}", ledger(&ckpt));
    until(SOON, "three scored", || {
        (ledger(&ckpt).len() >= 3).then_some(())
    });
    let status = n.next(SOON, "STATUS after a score");
    assert!(status.contains("scored"), "{status}");

    // Stopped part-way and started again: it goes on where it was.
    c.kill("evaluator:0");
    let before = ledger(&ckpt);
    c.start("evaluator", 0);
    until(SOON, "all ten scored", || {
        (ledger(&ckpt).len() >= 10).then_some(())
    });
    let after = ledger(&ckpt);
    assert_eq!(&after[..before.len()], &before[..]);
    let mut steps: Vec<u64> = after.iter().map(|r| r.0).collect();
    steps.sort_unstable();
    assert_eq!(
        steps,
        (1..=10).map(|k| k * 100).collect::<Vec<_>>(),
        "{after:?}"
    );
    assert_best_set(&ckpt, 3);

    // A new checkpoint at last_step: scored, then the evaluator exits 0.
    save_checkpoint(&c.cfg, 2000);
    let status = c.wait("evaluator:0", SOON);
    assert!(status.success(), "{}", c.log("evaluator:0"));
    assert_eq!(ledger(&ckpt).len(), 11);
    let best = best_index(&ckpt);
    assert_best_set(&ckpt, 3);

    // Restarted on a complete run: nothing scored again, the best set kept.
    c.start("evaluator", 0);
    assert!(c.wait("evaluator:0", SOON).success());
    assert_eq!(ledger(&ckpt).len(), 11);
    assert_eq!(best_index(&ckpt), best);
    let scalars = accumulate(&ckpt.join("eval"));
    assert_eq!(scalars["ema_accuracy"].len(), 11, "{scalars:?}");
    let log = c.log("evaluator:0");
    assert_eq!(log.matches("Checkpoint scored.").count(), 11, "{log}");
}

#[test]
fn half_written_and_damaged_checkpoints_are_skipped_not_fatal() {
    let mut c = Cluster::new(1, 1, 1000, Mode::Async);
    let ckpt = c.cfg.checkpoint.dir.clone();
    save_checkpoint(&c.cfg, 100);
    // Half-written: the model file of step 200 holds its first half (a copy
    // in progress, by something other than dtf's atomic saver).
    let whole_200 = {
        let path = save_checkpoint(&c.cfg, 200);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        bytes
    };
    // Damaged: a flipped byte inside step 300's data.
    let path = save_checkpoint(&c.cfg, 300);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 5;
    bytes[last] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    c.start("evaluator", 0);
    c.wait_log("evaluator:0", "does not verify", 2, SOON);
    until(SOON, "step 100 scored", || {
        ledger(&ckpt).iter().any(|r| r.0 == 100).then_some(())
    });

    // The copy completes (replaced as a whole, as rsync does): scored now.
    let tmp = ckpt.join(".copy-tmp");
    std::fs::write(&tmp, &whole_200).unwrap();
    std::fs::rename(&tmp, ckpt.join("model.ckpt-200.safetensors")).unwrap();
    until(SOON, "step 200 scored", || {
        ledger(&ckpt).iter().any(|r| r.0 == 200).then_some(())
    });

    // The last step: scored, and the evaluator exits 0; the damaged one was
    // never scored and was reported once, not at every rescan.
    save_checkpoint(&c.cfg, 1000);
    assert!(
        c.wait("evaluator:0", SOON).success(),
        "{}",
        c.log("evaluator:0")
    );
    let steps: Vec<u64> = ledger(&ckpt).iter().map(|r| r.0).collect();
    assert!(!steps.contains(&300), "{steps:?}");
    let log = c.log("evaluator:0");
    let reports = log
        .lines()
        .filter(|l| l.contains("step=300") && l.contains("does not verify"))
        .count();
    assert_eq!(reports, 1, "{log}");
    assert!(
        ckpt.join("model.ckpt-300.safetensors").exists(),
        "left in place"
    );
}

#[test]
fn save_steps_writes_checkpoints_at_exact_multiples() {
    // One worker: the chief sees every global step, so the multiples are exact.
    let mut c = Cluster::new(1, 1, 250, Mode::Async);
    c.cfg.checkpoint.save_secs = None;
    c.cfg.checkpoint.save_steps = 50;
    c.cfg.checkpoint.max_to_keep = 100;
    c.write_config();
    c.start_all();
    c.wait_all_success(Duration::from_secs(120));
    assert_eq!(
        checkpoint_steps(&c.cfg.checkpoint.dir),
        [0, 50, 100, 150, 200, 250]
    );
}

#[test]
fn save_steps_reloads_live() {
    // Saving by time (an hour) at first; a reload switches to every 40 steps.
    let mut c = Cluster::new(1, 1, 100_000, Mode::Async);
    c.cfg.checkpoint.save_secs = Some(3600);
    c.cfg.checkpoint.max_to_keep = 100;
    c.write_config();
    c.start_all();
    c.wait_log("worker:0", "Checkpoint written.", 1, SOON);
    c.cfg.checkpoint.save_secs = None;
    c.cfg.checkpoint.save_steps = 40;
    c.write_config_by_rename();
    c.wait_log("worker:0", "Configuration reloaded.", 1, SOON);
    let dir = c.cfg.checkpoint.dir.clone();
    let steps = until(SOON, "three checkpoints by step", || {
        let s: Vec<u64> = checkpoint_steps(&dir)
            .into_iter()
            .filter(|&s| s > 0)
            .collect();
        (s.len() >= 3).then_some(s)
    });
    assert!(steps.iter().all(|s| s % 40 == 0), "{steps:?}");
}

#[test]
fn full_every_reloads_live() {
    // Wide & deep, every checkpoint whole at first; a reload makes one in
    // three whole and the others deltas.
    let mut c = Cluster::new(1, 1, 100_000, Mode::Async);
    wide_deep_on_synth(&mut c, 2_000);
    c.cfg.checkpoint.save_secs = None;
    c.cfg.checkpoint.save_steps = 20;
    c.cfg.checkpoint.max_to_keep = 100;
    c.write_config();
    c.start_all();
    c.wait_log("worker:0", "Checkpoint written.", 3, SOON);
    let log = c.log("worker:0");
    assert!(!log.contains("kind=\"delta\""), "{log}");
    c.cfg.checkpoint.full_every = 3;
    c.write_config_by_rename();
    c.wait_log("worker:0", "Configuration reloaded.", 1, SOON);
    c.wait_log("worker:0", "kind=\"delta\"", 2, SOON);
    let dir = c.cfg.checkpoint.dir.clone();
    let deltas = checkpoint_steps(&dir)
        .into_iter()
        .filter(|s| {
            let path = dir.join(format!("model.ckpt-{s}.safetensors"));
            dtf::checkpoint::read_metadata(&path).is_ok_and(|m| m["format"] == "dtf-1-delta")
        })
        .count();
    assert!(deltas >= 2, "{deltas} deltas");
}

#[test]
fn evaluator_config_errors_exit_78_naming_the_keys() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let base = std::fs::read_to_string(&c.config_path).unwrap();
    // (what the config says, what it says instead, what the error names).
    let cases: [(&str, &str, &[&str]); 3] = [
        // The Cluster's config sets save_secs = 1: save_steps makes both.
        (
            "save_steps = 0",
            "save_steps = 100",
            &["checkpoint.save_secs", "checkpoint.save_steps"],
        ),
        (
            "keep_best = 3",
            "keep_best = 0",
            &["eval.keep_best", "positive"],
        ),
        (
            "metric = \"ema_accuracy\"",
            "metric = \"f1\"",
            &["eval.metric", "ema_accuracy", "loss"],
        ),
    ];
    for (i, (was, bad, needles)) in cases.iter().enumerate() {
        assert!(base.contains(was), "{base}");
        let text = base.replacen(was, bad, 1);
        let path = c.dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, text).unwrap();
        for program in ["dtf-evaluator", "dtf-worker"] {
            let ran = run(
                program,
                &[
                    "--config".as_ref(),
                    path.as_os_str(),
                    "--task".as_ref(),
                    "0".as_ref(),
                ],
                &[],
                SOON,
            );
            assert_eq!(
                ran.status.code(),
                Some(78),
                "{program} {bad}: {}",
                ran.stderr
            );
            for needle in *needles {
                assert!(
                    ran.stderr.contains(needle),
                    "{program} {bad}: {}",
                    ran.stderr
                );
            }
        }
    }

    // TF_CONFIG's task type `evaluator` is dtf-evaluator's, and no other daemon's.
    let tf = r#"{"cluster": {}, "task": {"type": "evaluator", "index": 0}}"#;
    let config = c.config_path.as_os_str();
    let ran = run(
        "dtf-evaluator",
        &["--config".as_ref(), config, "check-config".as_ref()],
        &[("TF_CONFIG", tf)],
        SOON,
    );
    assert!(ran.status.success(), "{}", ran.stderr);
    assert!(
        ran.stdout.contains("valid for evaluator:0"),
        "{}",
        ran.stdout
    );
    let ran = run(
        "dtf-worker",
        &["--config".as_ref(), config, "check-config".as_ref()],
        &[("TF_CONFIG", tf)],
        SOON,
    );
    assert_eq!(ran.status.code(), Some(78), "{}", ran.stderr);
    assert!(ran.stderr.contains("evaluator"), "{}", ran.stderr);
}

/// Issue 25: files named like checkpoints that do not verify cost the
/// evaluator a listing of the directory each (quadratic: 47 s for 6000)
/// before the real checkpoint was scored. Now one listing serves them all.
#[test]
fn garbage_named_like_checkpoints_costs_one_listing_not_one_each() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    write_checkpoint(&c.cfg, 5);
    for step in 1000..3000 {
        std::fs::write(
            c.cfg
                .checkpoint
                .dir
                .join(format!("model.ckpt-{step}.safetensors")),
            b"not a checkpoint",
        )
        .unwrap();
    }
    let mut ev = dtf::evaluator::Evaluator::open(&c.cfg).unwrap();
    while let Some(step) = ev.next_step() {
        ev.evaluate(step).unwrap();
    }
    assert_eq!(ev.scored().keys().copied().collect::<Vec<_>>(), [5]);
    assert!(ev.listings() <= 2, "{} listings", ev.listings());
}

/// Issue 25: with `checkpoint.dir` removed and made again while it ran, the
/// evaluator exited 1 at the next checkpoint (`eval/evaluated.jsonl: No
/// such file or directory`). Now it scores it.
#[test]
fn the_evaluator_survives_its_directory_removed_and_made_again() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    write_checkpoint(&c.cfg, 5);
    let mut ev = dtf::evaluator::Evaluator::open(&c.cfg).unwrap();
    assert_eq!(ev.next_step(), Some(5));
    assert!(ev.evaluate(5).unwrap().is_some());
    std::fs::remove_dir_all(&c.cfg.checkpoint.dir).unwrap();
    write_checkpoint(&c.cfg, 10);
    ev.rescan();
    assert_eq!(ev.next_step(), Some(10));
    assert!(ev.evaluate(10).unwrap().is_some());
    let ledger = c.cfg.checkpoint.dir.join("eval/evaluated.jsonl");
    assert!(
        std::fs::read_to_string(ledger)
            .unwrap()
            .contains("\"global_step\":10")
    );
    assert!(
        c.cfg
            .checkpoint
            .dir
            .join("best/model.ckpt-10.safetensors")
            .is_file()
    );
}
