//! What the daemons and `dtf eval`/`dtf inspect` do with hostile or stale
//! contents of `checkpoint.dir`: FIFOs, devices, huge headers, an index that
//! points elsewhere or lags behind.

use crate::util::*;
use dtf::config::Mode;
use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn a_fifo_checkpoint_does_not_block_the_daemons_or_the_tools() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let dir = c.cfg.checkpoint.dir.clone();
    write_checkpoint(&c.cfg, 50);
    let fifo = dir.join("model.ckpt-100.safetensors");
    mkfifo(&fifo);

    // Both daemons read checkpoint.dir before anything else (is the run
    // complete?): a blocked open() would keep them from ever getting here.
    c.start("ps", 0);
    c.wait_log("ps:0", "Parameter server ready.", 1, DEADLINE);
    c.signal("ps:0", libc::SIGTERM);
    let status = c.wait("ps:0", DEADLINE);
    assert!(status.success(), "ps:0 {status}; log:\n{}", c.log("ps:0"));

    let ran = dtf_quick(&[OsStr::new("inspect"), fifo.as_os_str()]);
    assert!(!ran.status.success());
    assert!(
        ran.stderr.contains("model.ckpt-100.safetensors")
            && ran.stderr.contains("a FIFO, not a regular file"),
        "{}",
        ran.stderr
    );
    let ran = dtf_quick(&[
        OsStr::new("eval"),
        fifo.as_os_str(),
        OsStr::new("--data"),
        c.cfg.data.dir.as_os_str(),
    ]);
    assert!(!ran.status.success());
    assert!(ran.stderr.contains("a FIFO"), "{}", ran.stderr);
}

#[test]
fn a_huge_safetensors_header_is_refused_by_inspect_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    // 30 MB of header (the issue's was 99 MB: 32 s and 1.4 GB to parse).
    let len: usize = 30_000_000;
    let head = r#"{"__metadata__":{"pad":""#;
    let tail = r#""}}"#;
    let mut bytes = (len as u64).to_le_bytes().to_vec();
    bytes.extend(head.as_bytes());
    bytes.resize(8 + len - tail.len(), b'x');
    bytes.extend(tail.as_bytes());
    let file = tmp.path().join("model.ckpt-5.safetensors");
    std::fs::write(&file, &bytes).unwrap();
    drop(bytes);

    let started = std::time::Instant::now();
    let ran = dtf_quick(&[OsStr::new("inspect"), file.as_os_str()]);
    let took = started.elapsed();
    assert!(!ran.status.success());
    assert!(
        ran.stderr.contains("its header claims 30000000 bytes"),
        "{}",
        ran.stderr
    );
    eprintln!("dtf inspect refused a 30 MB header in {took:?}");
}

#[test]
fn an_index_pointing_outside_checkpoint_dir_is_not_followed_by_eval_or_inspect() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let dir = c.cfg.checkpoint.dir.clone();
    write_checkpoint(&c.cfg, 100);
    let mut other = c.cfg.clone();
    other.checkpoint.dir = c.dir.path().join("other");
    let outside = write_checkpoint(&other, 500);
    std::fs::write(
        dir.join("checkpoint.dtf"),
        "model_checkpoint_path: \"../other/model.ckpt-500.safetensors\"\n",
    )
    .unwrap();
    assert_eval_step(&c, &dir, 100);
    std::fs::write(
        dir.join("checkpoint.dtf"),
        format!("model_checkpoint_path: \"{}\"\n", outside.display()),
    )
    .unwrap();
    let ran = dtf_quick(&[OsStr::new("inspect"), dir.as_os_str()]);
    assert!(ran.status.success(), "{}", ran.stderr);
    assert!(
        ran.stdout.contains("model.ckpt-100.safetensors") && !ran.stdout.contains("500"),
        "{}",
        ran.stdout
    );
}

/// `dtf eval DIR --json` succeeds on the checkpoint at `step`.
fn assert_eval_step(c: &Cluster, dir: &Path, step: u64) {
    let ran = dtf_quick(&[
        OsStr::new("eval"),
        dir.as_os_str(),
        OsStr::new("--data"),
        c.cfg.data.dir.as_os_str(),
        OsStr::new("--json"),
    ]);
    assert!(ran.status.success(), "{}", ran.stderr);
    let want = format!("\"global_step\":{step},");
    assert!(ran.stdout.contains(&want), "{}", ran.stdout);
}

#[test]
fn a_stale_index_does_not_make_eval_inspect_and_restore_disagree() {
    // What a double SIGTERM can leave: the step-200 pair renamed into place,
    // the index still naming step 100.
    let c = Cluster::new(1, 1, 1000, Mode::Async);
    let dir = c.cfg.checkpoint.dir.clone();
    write_checkpoint(&c.cfg, 100);
    let index = std::fs::read(dir.join("checkpoint.dtf")).unwrap();
    write_checkpoint(&c.cfg, 200);
    std::fs::write(dir.join("checkpoint.dtf"), index).unwrap();

    assert_eval_step(&c, &dir, 200);

    let ran = dtf_quick(&[OsStr::new("inspect"), dir.as_os_str()]);
    assert!(ran.status.success(), "{}", ran.stderr);
    assert!(
        ran.stdout.contains("model.ckpt-200.safetensors") && ran.stdout.contains("global_step=200"),
        "{}",
        ran.stdout
    );

    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    let (path, ckpt) = dtf::checkpoint::restore_latest(&dir, &specs)
        .unwrap()
        .unwrap();
    assert_eq!(ckpt.global_step, 200, "{}", path.display());
}

/// A chief that finds checkpoints but none that verifies does not start
/// afresh (new checkpoints would bury the operator's): it exits 1 naming the
/// directory and the newest's fault, leaves every file in place, and the ps
/// stays uninitialized.
#[test]
fn a_chief_whose_checkpoints_all_fail_to_verify_exits_1_and_keeps_them() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    let dir = c.cfg.checkpoint.dir.clone();
    let good = write_checkpoint(&c.cfg, 50);
    // Flip one byte of the tensor data: the CRC no longer matches.
    let mut bytes = std::fs::read(&good).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&good, &bytes).unwrap();
    let before = checkpoint_steps(&dir);
    assert_eq!(before, vec![50]);

    c.start("ps", 0);
    c.wait_log("ps:0", "Parameter server ready.", 1, DEADLINE);
    c.start("worker", 0);
    let status = c.wait("worker:0", DEADLINE);
    let log = c.log("worker:0");
    assert_eq!(status.code(), Some(1), "worker:0 {status}; log:\n{log}");
    assert!(
        log.contains("none of its 1 checkpoints verifies") && log.contains("model.ckpt-50"),
        "{log}"
    );
    assert_eq!(
        checkpoint_steps(&dir),
        before,
        "no checkpoint written or removed"
    );
    assert_eq!(
        std::fs::read(&good).unwrap(),
        bytes,
        "the damaged file is left as it was"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state = rt.block_on(async {
        let mut ps = c.client(0, Some(TOKEN)).await;
        ps.state(dtf::transport::pb::StateRequest {})
            .await
            .unwrap()
            .into_inner()
    });
    assert!(!state.initialized, "the ps was initialized: {state:?}");
}
