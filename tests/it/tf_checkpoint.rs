//! Issue 43, item 7: TensorFlow checkpoints both ways — `dtf export
//! --tf-checkpoint`, `dtf local --init-from` a checkpoint TensorFlow itself
//! wrote (tests/fixtures/tf-checkpoint, from `tf.compat.v1.train.Saver`) or
//! dtf exported, and the refusals, each before anything is created.

use crate::util::*;
use dtf::config::Mode;
use std::ffi::OsStr;
use std::path::Path;

/// The TensorFlow-written fixture: model [64, 16, 4] (the tiny data's with
/// 16 hidden units), global_step 40, EMA shadows.
fn fixture() -> std::path::PathBuf {
    repo_file("tests/fixtures/tf-checkpoint")
}

/// `dtf local` on `c`'s tiny data with one worker, into `ckpt`, keeping
/// every checkpoint (the seed among them, to be read back).
fn local(c: &Cluster, ckpt: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "local",
        "--config",
        c.config_path.to_str().unwrap(),
        "--ps",
        "1",
        "--workers",
        "1",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--set",
        "checkpoint.max_to_keep=1000",
    ];
    all.extend_from_slice(args);
    dtf_output(&all)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Element k of layer l's tensor in the fixture: (k − 500)/64 + l/8.
fn reference(n: usize, layer: usize) -> Vec<f32> {
    (0..n)
        .map(|k| (k as f32 - 500.0) / 64.0 + layer as f32 / 8.0)
        .collect()
}

#[test]
fn dtf_local_starts_from_a_checkpoint_tensorflow_wrote() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let ckpt = c.dir.path().join("from-tf");
    let fixture = fixture();
    let out = local(
        &c,
        &ckpt,
        &["--steps", "60", "--init-from", fixture.to_str().unwrap()],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "dtf local failed:\n{err}");
    let said = format!(
        "dtf local: initialized from TensorFlow checkpoint {}: 4 variables, their EMA \
         shadows, optimizer slots start fresh; global_step 40 carries over",
        fixture.join("model.ckpt-40").display()
    );
    assert!(
        err.contains(&said),
        "the console should say {said:?}:\n{err}"
    );
    assert!(err.contains("resumed from step 40"), "{err}");
    // The seed the chief restored holds TensorFlow's values, bit for bit.
    let seed = dtf::checkpoint::load(&ckpt.join("model.ckpt-40.safetensors"), None).unwrap();
    assert_eq!(seed.global_step, 40);
    for ((name, value), (_, shadow)) in seed.variables.iter().zip(&seed.shadows) {
        let layer = if name.starts_with("layer1") { 1 } else { 2 };
        let want = reference(value.len(), layer);
        assert_eq!(value.iter().copied().collect::<Vec<_>>(), want, "{name}");
        let want: Vec<f32> = want.iter().map(|v| v - 0.5).collect();
        assert_eq!(
            shadow.iter().copied().collect::<Vec<_>>(),
            want,
            "{name} EMA"
        );
    }
    assert_eq!(checkpoint_steps(&ckpt).last(), Some(&60));
}

#[test]
fn an_exported_checkpoint_starts_a_new_run_with_the_same_bits() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let original = write_checkpoint(&c.cfg, 30);
    let tf_dir = c.dir.path().join("tf");
    let ran = dtf_quick(&[
        OsStr::new("export"),
        OsStr::new("--tf-checkpoint"),
        tf_dir.as_os_str(),
        c.cfg.checkpoint.dir.as_os_str(),
    ]);
    assert!(ran.status.success(), "{}", ran.stderr);
    assert!(ran.stderr.contains("model.ckpt-30"), "{}", ran.stderr);
    for name in ["model.ckpt-30.index", "model.ckpt-30.data-00000-of-00001"] {
        assert!(tf_dir.join(name).is_file(), "{name} missing");
    }
    assert_eq!(
        std::fs::read_to_string(tf_dir.join("checkpoint")).unwrap(),
        "model_checkpoint_path: \"model.ckpt-30\"\n\
         all_model_checkpoint_paths: \"model.ckpt-30\"\n"
    );
    // dtf's own directory points TensorFlow at nothing it cannot load.
    assert!(!c.cfg.checkpoint.dir.join("checkpoint").exists());

    let ckpt = c.dir.path().join("second");
    let out = local(
        &c,
        &ckpt,
        &["--steps", "50", "--init-from", tf_dir.to_str().unwrap()],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "dtf local failed:\n{err}");
    assert!(
        err.contains("initialized from TensorFlow checkpoint")
            && err.contains("global_step 30 carries over"),
        "{err}"
    );
    let before = dtf::checkpoint::load(&original, None).unwrap();
    let seed = dtf::checkpoint::load(&ckpt.join("model.ckpt-30.safetensors"), None).unwrap();
    assert_eq!(seed.variables, before.variables);
    assert_eq!(seed.shadows, before.shadows);
    assert_eq!(checkpoint_steps(&ckpt).last(), Some(&50));
}

#[test]
fn init_from_refuses_before_anything_is_created() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let fixture = fixture();
    let fixture_s = fixture.to_str().unwrap();
    let fresh = c.dir.path().join("fresh");

    // Another model: the variable and both shapes are named.
    let out = local(
        &c,
        &fresh,
        &["--set", "model.layers=[64,8,4]", "--init-from", fixture_s],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("layer1/weights: shape [64, 16] in the checkpoint") && err.contains("[64, 8]"),
        "{err}"
    );
    assert!(!fresh.exists(), "nothing is created");

    // Nothing to train: the step carries over.
    let out = local(&c, &fresh, &["--steps", "40", "--init-from", fixture_s]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("at or past the last step 40"), "{err}");

    // A checkpoint directory that already has checkpoints.
    write_checkpoint(&c.cfg, 10);
    let out = local(&c, &c.cfg.checkpoint.dir, &["--init-from", fixture_s]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("already holds checkpoints"), "{err}");
    assert_eq!(checkpoint_steps(&c.cfg.checkpoint.dir), [10]);

    // A damaged data file: named, with what is wrong.
    let damaged = c.dir.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), damaged.join(entry.file_name())).unwrap();
    }
    let data = damaged.join("model.ckpt-40.data-00000-of-00001");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[100] ^= 0x10;
    std::fs::write(&data, bytes).unwrap();
    let out = local(&c, &fresh, &["--init-from", damaged.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&data.display().to_string()) && err.contains("CRC-32C mismatch"),
        "{err}"
    );
    assert!(!fresh.exists(), "nothing is created");
}

#[test]
fn export_needs_an_output() {
    let ran = dtf_quick(&[OsStr::new("export"), OsStr::new("/nonexistent")]);
    assert_eq!(ran.status.code(), Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("--onnx") && ran.stderr.contains("--tf-checkpoint"),
        "{}",
        ran.stderr
    );
}
