//! dtf.toml in a Kubernetes ConfigMap volume (deploy/kubernetes): the file
//! is a symlink through `..data`, and an update swaps `..data` to a new
//! directory by rename, as the kubelet's atomic writer does. The daemon
//! reloads on that swap as it does on an editor's save.

use crate::util::*;
use dtf::config::Mode;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

const SOON: Duration = Duration::from_secs(60);

/// Writes `text` as the volume's new version `version` and swaps `..data`
/// to it: the steps of the kubelet's `AtomicWriter`, which readers see as one
/// rename.
fn publish(volume: &Path, version: &str, text: &str) {
    let dir = volume.join(version);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("dtf.toml"), text).unwrap();
    symlink(version, volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
}

#[test]
fn a_configmap_update_reloads_the_running_daemon() {
    let mut c = Cluster::new(1, 1, 100_000, Mode::Async);
    let volume = c.dir.path().join("configmap");
    std::fs::create_dir(&volume).unwrap();
    publish(&volume, "..2026_12_02_00_00_00.1", &c.cfg.to_toml());
    symlink("..data/dtf.toml", volume.join("dtf.toml")).unwrap();
    c.config_path = volume.join("dtf.toml");
    c.start("ps", 0);
    c.wait_log("ps:0", "Parameter server ready.", 1, SOON);

    c.cfg.train.last_step = 2000;
    publish(&volume, "..2026_12_02_00_01_00.2", &c.cfg.to_toml());
    std::fs::remove_dir_all(volume.join("..2026_12_02_00_00_00.1")).unwrap();
    let log = c.wait_log("ps:0", "Configuration reloaded.", 1, SOON);
    let line = log
        .lines()
        .rfind(|l| l.contains("Configuration reloaded."))
        .unwrap_or_default();
    assert!(
        line.contains("train.last_step"),
        "the reload names the changed key: {line}"
    );
}
