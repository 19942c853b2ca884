//! Momentum, Adam and Adagrad with their slots on the ps: training with each,
//! sync mode, a ps killed and re-seeded, checkpoints as `dtf inspect`, the
//! numpy reader and a warm start from another optimizer see them.

use crate::util::*;
use dtf::config::{Mode, OptimizerKind};
use dtf::transport::pb;
use std::process::Command;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(180);

/// The newest checkpoint of `c` that verifies against its model.
fn newest(c: &Cluster) -> Option<dtf::checkpoint::Checkpoint> {
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    dtf::checkpoint::restore_latest(&c.cfg.checkpoint.dir, &specs)
        .unwrap()
        .map(|(_, ck)| ck)
}

/// A named scalar slot of a checkpoint.
fn scalar(ck: &dtf::checkpoint::Checkpoint, name: &str) -> f32 {
    let (_, a) = ck
        .slots
        .tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} missing from the checkpoint"));
    a.iter().copied().next().unwrap()
}

/// `beta^(step + 1)` as the ps computes it: TensorFlow's `beta_power`
/// starts at `beta` and is multiplied by it, in f32, once per update.
fn power(beta: f32, step: u64) -> f32 {
    (0..step).fold(beta, |p, _| p * beta)
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_adam_updates_slots_once_per_aggregated_step() {
    // One ps: the snapshot's step and the powers come from the same shard.
    let mut c = Cluster::new(1, 2, 60, Mode::Sync);
    c.cfg.train.optimizer = OptimizerKind::Adam;
    c.cfg.train.learning_rate = 0.01;
    c.write_config();
    c.start_all();
    tokio::task::block_in_place(|| c.wait_all_success(RUN));
    let ck = newest(&c).expect("a final checkpoint");
    let step = ck.global_step;
    assert!(step >= 60, "{step}");
    assert_eq!(ck.slots.optimizer.name(), "adam");
    // Two replicas per step: the powers advanced exactly once per step (bit
    // for bit: the same f32 products), not once per gradient.
    assert_eq!(scalar(&ck, "beta1_power"), power(0.9, step));
    assert_eq!(scalar(&ck, "beta2_power"), power(0.999, step));
    for (name, a) in &ck.slots.tensors {
        if name.ends_with("/Adam_1") {
            assert!(
                a.iter().any(|&v| v > 0.0),
                "{name}: the second moment never moved"
            );
        }
    }
    let acc = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert!(acc.accuracy > 0.5, "Adam did not learn: {acc:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ps_killed_with_sigkill_gets_its_slots_back_from_the_checkpoint() {
    let mut c = Cluster::new(2, 1, 1_000_000, Mode::Async);
    c.cfg.train.optimizer = OptimizerKind::Adam;
    // A slow decay, so that the power still tells the step it has seen: on
    // shared memory the tiny model may be 100,000 steps in before the pull,
    // and 0.9999^100000 is still a normal f32 (0.99^10000 is not).
    c.cfg.train.beta1 = 0.9999;
    c.cfg.train.learning_rate = 0.01;
    // No snapshots: the checkpoint is what the restarted ps gets.
    c.cfg.ps.snapshot_secs = 0;
    c.write_config();
    c.start_all();
    // Round-robin over 2 ps: layer1/biases, whose name sorts first and so
    // keeps the powers (TensorFlow's rule), is on ps:1.
    until(RUN, "a checkpoint past step 50", || {
        newest(&c).filter(|ck| ck.global_step >= 50)
    });
    c.kill("ps:1");
    c.start("ps", 1);
    let ps = c.client(1, Some(TOKEN)).await;
    let pulled = eventually(RUN, "ps:1 to be re-seeded", || {
        let mut ps = ps.clone();
        async move {
            let r = ps
                .pull(pb::PullRequest {
                    with_slots: true,
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            Some(r)
        }
    })
    .await;
    let names: Vec<&str> = pulled.slots.iter().map(|t| t.name.as_str()).collect();
    for want in [
        "layer1/biases/Adam",
        "layer1/biases/Adam_1",
        "layer2/biases/Adam",
        "beta1_power",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.starts_with("layer1/weights")),
        "ps:1 holds no weights: {names:?}"
    );
    let beta1_power = pulled
        .slots
        .iter()
        .find(|t| t.name == "beta1_power")
        .map(|t| f32::from_le_bytes(t.data[..4].try_into().unwrap()))
        .unwrap();
    // Restored from the checkpoint, the power is beta1^(step + 1) for the
    // shard's step (a fresh one would be beta1^(steps since the restart)),
    // with beta1 as the ps holds it: an f32.
    let beta1 = f64::from(0.9999f32);
    let seen = (f64::from(beta1_power).ln() / beta1.ln()).round() as i64 - 1;
    let step = pulled.global_step as i64;
    assert!(
        step >= 50 && (seen - step).abs() <= 3,
        "beta1_power {beta1_power} is of step {seen}, the shard is at step {step}"
    );
    let m = pulled
        .slots
        .iter()
        .find(|t| t.name == "layer1/biases/Adam")
        .unwrap();
    assert!(
        m.data.chunks_exact(4).any(|b| b != [0; 4]),
        "the first moment was not restored"
    );
}

/// `dtf ARGS`, which must succeed; its stdout.
fn dtf_ok(args: &[&str]) -> String {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let ran = run("dtf", &args, &[], RUN);
    assert!(
        ran.status.success(),
        "dtf {args:?}: {}\n{}",
        ran.status,
        ran.stderr
    );
    ran.stdout
}

/// `dtf local` of `c`'s config for `steps` into `dir`; its JSON summary.
fn local(c: &Cluster, steps: &str, dir: &str) -> serde_json::Value {
    let out = dtf_ok(&[
        "local",
        "--config",
        c.config_path.to_str().unwrap(),
        "--ps",
        "2",
        "--workers",
        "2",
        "--steps",
        steps,
        "--checkpoint-dir",
        dir,
        "--keep-run-dir",
        "--json",
    ]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The numpy reader's view of the newest checkpoint in `dir`.
fn numpy(dir: &str, data: &str) -> serde_json::Value {
    let eval: serde_json::Value =
        serde_json::from_str(&dtf_ok(&["eval", dir, "--data", data, "--json"])).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/checkpoint_numpy.py");
    let out = output_within(
        Command::new("python3").args([script, eval["checkpoint"].as_str().unwrap(), data]),
        RUN,
    );
    assert!(
        out.status.success(),
        "numpy reader: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // dtf eval ignores the slots: the same accuracies as the reader.
    for key in ["accuracy", "ema_accuracy"] {
        let (a, b) = (eval[key].as_f64().unwrap(), theirs[key].as_f64().unwrap());
        assert!((a - b).abs() < 1e-6, "{key}: dtf eval {a}, numpy {b}");
    }
    theirs
}

#[test]
fn each_optimizer_trains_and_checkpoints_its_slots_and_a_change_is_a_warm_start() {
    let mut c = Cluster::new(2, 2, 100, Mode::Async);
    let data = c.cfg.data.dir.to_str().unwrap().to_owned();
    for (kind, lr, slots) in [
        (OptimizerKind::Momentum, 0.05, &["Momentum"][..]),
        (OptimizerKind::Adagrad, 0.1, &["Adagrad"][..]),
        (OptimizerKind::Adam, 0.01, &["Adam", "Adam_1"][..]),
    ] {
        c.cfg.train.optimizer = kind;
        c.cfg.train.learning_rate = lr;
        c.write_config();
        let dir = c.dir.path().join(format!("{kind:?}"));
        let dir = dir.to_str().unwrap();
        let summary = local(&c, "100", dir);
        assert!(
            summary["test_accuracy"].as_f64().unwrap() > 0.5,
            "{kind:?} did not learn: {summary}"
        );
        let theirs = numpy(dir, &data);
        let name = format!("{kind:?}").to_lowercase();
        assert_eq!(theirs["optimizer"]["name"], name.as_str(), "{theirs}");
        for var in ["layer1/weights", "layer2/biases"] {
            for s in slots {
                let slot = format!("{var}/{s}");
                assert!(theirs["slots"].get(&slot).is_some(), "{slot}: {theirs}");
            }
        }
        let inspect = dtf_ok(&["inspect", dir]);
        assert!(
            inspect.contains(&format!("layer1/weights/{}", slots[0])),
            "{inspect}"
        );
    }
    // The Adam checkpoint has the powers, as TensorFlow names them.
    let adam_dir = c.dir.path().join("Adam");
    let adam_dir = adam_dir.to_str().unwrap();
    let theirs = numpy(adam_dir, &data);
    assert_eq!(theirs["slots"]["beta1_power"], serde_json::json!([]));

    // Momentum on Adam's checkpoint: its variables go on, its slots start
    // fresh, the chief says so once, and Adam's slots leave the checkpoint.
    c.cfg.train.optimizer = OptimizerKind::Momentum;
    c.cfg.train.learning_rate = 0.05;
    c.write_config();
    let summary = local(&c, "200", adam_dir);
    let step = summary["global_step"].as_u64().unwrap();
    assert!((200..=201).contains(&step), "{summary}");
    let run_dir = summary["run_dir"].as_str().unwrap();
    let chief = std::fs::read_to_string(format!("{run_dir}/logs/worker-0.log")).unwrap();
    assert_eq!(
        chief.matches("is of another optimizer").count(),
        1,
        "the chief should warn once; its log:\n{chief}"
    );
    let theirs = numpy(adam_dir, &data);
    assert_eq!(theirs["optimizer"]["name"], "momentum", "{theirs}");
    let names: Vec<&String> = theirs["slots"].as_object().unwrap().keys().collect();
    assert!(
        names.iter().all(|n| n.ends_with("/Momentum")),
        "only Momentum's slots: {names:?}"
    );
}
