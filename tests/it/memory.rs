//! A ps whose tables grow past its cgroup's memory limit refuses new rows
//! and keeps training, rather than the kernel killing it (issue 42 item 3).

use crate::util::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A memory cgroup of its own under this process's, removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    /// A child of this process's memory cgroup (v1's memory hierarchy, or
    /// v2) limited to `limit` bytes.
    fn new(limit: u64) -> Self {
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let v1 = text
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()));
        let (base, file) = match &v1 {
            Some(path) => (
                PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                "memory.limit_in_bytes",
            ),
            None => {
                let path = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
                (
                    PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/')),
                    "memory.max",
                )
            }
        };
        let dir = base.join(format!("dtf-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot make the memory cgroup {} (this test needs root and a writable cgroup tree): {e}",
                dir.display()
            )
        });
        std::fs::write(dir.join(file), limit.to_string()).unwrap();
        Self { dir }
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its process has exited.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The pid of the `dtf-ps` whose command line names `needle`.
fn ps_pid(needle: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains("dtf-ps") && cmd.contains(needle)).then_some(pid)
    })
}

#[test]
fn a_ps_near_its_cgroup_memory_limit_refuses_new_rows_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("syn");
    // More distinct ids (2.4 M, nearly uniform) than 512 MiB of rows hold
    // (dim 16 with Adagrad: ~250 bytes a row, on the ps that holds them
    // all). Rows grow here at ~100 MB/s, a tenth of the limit per look:
    // a tighter limit would be passed between two looks.
    let out = dtf_output(&[
        "synth",
        "--out",
        data.to_str().unwrap(),
        "--rows",
        "300000",
        "--fields",
        "8",
        "--cardinality",
        "1000000",
        "--exponent",
        "0.5",
    ]);
    assert!(out.status.success(), "{out:?}");
    let cgroup = MemoryCgroup::new(512 << 20);
    // The run directory is made under TMPDIR: this test's own.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let port = free_port_run(1);
    let stdout = std::fs::File::create(dir.path().join("out.json")).unwrap();
    let stderr = std::fs::File::create(dir.path().join("err.txt")).unwrap();
    let mut child = Command::new(bin("dtf"))
        .args(["local", "--data", data.to_str().unwrap()])
        .args(["--ps", "1", "--workers", "1", "--steps", "3000", "--json"])
        .env("TMPDIR", &tmp)
        .args(["--set", &format!("metrics.listen=127.0.0.1:{port}")])
        .env_remove("TF_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let pid = until(Duration::from_secs(60), "the ps process", || {
        ps_pid(tmp.to_str().unwrap())
    });
    // From here on its new memory is charged to the small cgroup.
    cgroup.enter(pid);
    let addr = format!("127.0.0.1:{port}");
    let table = "dtf_table_ids_refused_total{table=\"deep/embeddings\"}";
    until(Duration::from_secs(180), "the ps to refuse rows", || {
        if let Ok(Some(status)) = child.try_wait() {
            let err = std::fs::read_to_string(dir.path().join("err.txt")).unwrap_or_default();
            panic!("the run ended ({status}) before the ps refused a row: {err}");
        }
        let text = http_get(&addr, "/metrics")?;
        let full = metric_sample(&text, "dtf_ps_memory_full")?;
        let refused = metric_sample(&text, table)?;
        (full == 1.0 && refused > 0.0).then_some(())
    });
    let status = until(Duration::from_secs(300), "the run's end", || {
        child.try_wait().unwrap()
    });
    let err = std::fs::read_to_string(dir.path().join("err.txt")).unwrap();
    assert!(
        status.success(),
        "the ps was not killed, the run completed: {err}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out.json")).unwrap())
            .unwrap();
    assert_eq!(report["global_step"], 3000, "{report}");
    assert!(report["test_auc"].as_f64().is_some(), "{report}");
    let run_dir = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let log = std::fs::read_to_string(run_dir.join("logs/ps-0.log")).unwrap();
    assert!(log.contains("Memory nearly full"), "{log}");
}
