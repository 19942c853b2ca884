//! Faults found by adversarial testing (the hardening issue), one test per
//! fault, named for it.

use crate::util::*;
use dtf::config::Mode;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A tmpfs mounted at `path` for the test's lifetime (lazily unmounted on
/// drop, so a failing test leaves no mount behind).
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` bytes at `path` (created). Needs root, as CI is.
    pub(crate) fn mount(path: &Path, size: usize) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0750")])
            .arg("tmpfs")
            .arg(path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(path.to_path_buf())
    }

    /// Fills the file system to the last byte with `filler`.
    pub(crate) fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.0.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn final_checkpoint_on_a_full_disk_fails_the_run_and_a_restart_completes_it() {
    const LAST: u64 = 2000;
    let mut c = Cluster::new(1, 2, LAST, Mode::Async);
    let disk = Tmpfs::mount(&c.cfg.checkpoint.dir, 256 * 1024);
    let filler = disk.fill();
    let metrics = free_addrs(1).remove(0);
    c.start("ps", 0);
    c.start_env("worker", 0, &[("DTF_METRICS__LISTEN", &metrics)]);
    c.start("worker", 1);

    // Every failed save is counted where an operator's alert can see it.
    until(
        Duration::from_secs(60),
        "a failed checkpoint in the chief's metrics",
        || {
            let m = http_get(&metrics, "/metrics")?;
            let n: f64 = m
                .lines()
                .find_map(|l| l.strip_prefix("dtf_checkpoint_failures_total "))?
                .trim()
                .parse()
                .ok()?;
            (n >= 1.0).then_some(())
        },
    );

    // The chief fails rather than declaring the run complete...
    let chief = tokio::task::block_in_place(|| c.wait("worker:0", Duration::from_secs(120)));
    let log = c.log("worker:0");
    assert_eq!(chief.code(), Some(1), "chief exit status; log:\n{log}");
    assert!(
        log.contains("final checkpoint at step") && log.contains("the run is not complete"),
        "the chief names the lost final checkpoint; log:\n{log}"
    );
    assert!(
        log.contains("No space left on device"),
        "the chief says why; log:\n{log}"
    );
    // ...and the ps keeps serving the trained variables, not complete.
    let s = c.state(0).await.expect("ps:0 answers State");
    assert!(
        s.initialized && !s.complete,
        "ps state after the failure: {s:?}"
    );
    assert!(s.global_step >= LAST, "ps global step {}", s.global_step);
    assert!(checkpoint_steps(&c.cfg.checkpoint.dir).is_empty());

    // Once there is room, a restarted chief writes it and completes the run.
    std::fs::remove_file(filler).unwrap();
    c.start("worker", 0);
    tokio::task::block_in_place(|| c.wait_all_success(Duration::from_secs(120)));
    let steps = checkpoint_steps(&c.cfg.checkpoint.dir);
    assert!(
        steps.last().is_some_and(|&s| s >= LAST),
        "final checkpoint written after the restart: {steps:?}"
    );
}

#[test]
fn dtf_local_exits_nonzero_when_the_final_checkpoint_cannot_be_written() {
    // The tiny data set and model, through a base config.
    let c = Cluster::new(1, 2, 50, Mode::Async);
    let ckpt = c.dir.path().join("kept");
    let disk = Tmpfs::mount(&ckpt, 256 * 1024);
    disk.fill();
    let ran = run(
        "dtf",
        &[
            "local".as_ref(),
            "--config".as_ref(),
            c.config_path.as_os_str(),
            "--steps".as_ref(),
            "50".as_ref(),
            "--checkpoint-dir".as_ref(),
            ckpt.as_os_str(),
        ],
        &[],
        Duration::from_secs(180),
    );
    assert_eq!(
        ran.status.code(),
        Some(1),
        "dtf local must fail; stderr:\n{}",
        ran.stderr
    );
    assert!(
        ran.stderr.contains("final checkpoint") && ran.stderr.contains("No space left on device"),
        "dtf local says the final checkpoint was lost, and why; stderr:\n{}",
        ran.stderr
    );
    assert!(
        !ran.stdout.contains("accuracy"),
        "no accuracy is reported for an incomplete run; stdout:\n{}",
        ran.stdout
    );
}

#[test]
fn network_partition_between_ps_and_workers_stalls_training_and_it_resumes() {
    const LAST: u64 = 4000;
    let mut c = Cluster::new(1, 2, LAST, Mode::Async);
    let net = crate::hosts::Hosts::new(2, c.dir.path());
    c.place(&net, &[0], &[1, 1]);
    let (a, b) = (net.host(0), net.host(1));
    c.start_on(a, "ps", 0, &[]);
    c.start_on(b, "worker", 0, &[]);
    c.start_on(b, "worker", 1, &[]);

    let before = until(Duration::from_secs(120), "training to start", || {
        c.step_from(a).filter(|&s| s >= 200)
    });
    assert!(before < LAST, "the run ended before the partition");
    net.cut(1);
    // While the link is down no gradient reaches the ps: its step stands still.
    let cut = c.step_from(a).unwrap();
    let held = std::time::Instant::now();
    while held.elapsed() < Duration::from_secs(5) {
        let now = c.step_from(a).unwrap();
        assert!(
            now <= cut + 2,
            "step moved from {cut} to {now} while partitioned"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for w in ["worker:0", "worker:1"] {
        let exited = c.child(w).try_wait().unwrap();
        assert!(
            exited.is_none(),
            "{w} gave up during the partition ({exited:?}); its log:\n{}",
            c.log(w)
        );
    }
    net.heal(1);
    until(
        Duration::from_secs(60),
        "training to resume after the partition",
        || c.step_from(a).filter(|&s| s > cut + 100),
    );
    c.wait_all_success(Duration::from_secs(180));
    let steps = checkpoint_steps(&c.cfg.checkpoint.dir);
    assert!(
        steps.last().is_some_and(|&s| s >= LAST),
        "final checkpoint after the partition: {steps:?}"
    );
}
