//! Configurations that used to validate and then crash, hang or fail late:
//! each must now be refused at start with exit 78 (EX_CONFIG) and a message
//! naming the key and where it came from, by the daemons and by every
//! `check-config`.

use crate::config_errors::{assert_config_error, ps, worker_check};
use crate::util::*;
use dtf::config::{Config, Mode};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Writes `edit(cfg)` as the cluster's file, then asserts that `dtf-ps`,
/// `dtf-worker check-config` and `dtf check-config` all exit 78 naming
/// every one of `names` and the file.
fn refused_everywhere(what: &str, edit: impl FnOnce(&mut Config), names: &[&str]) {
    let c = Cluster::new(1, 1, 10, Mode::Async);
    let mut cfg = c.cfg.clone();
    edit(&mut cfg);
    std::fs::write(&c.config_path, cfg.to_toml()).unwrap();
    let file = c.config_path.display().to_string();
    let names: Vec<&str> = names.iter().copied().chain([file.as_str()]).collect();
    refused_by_daemons(&c.config_path, &names);
    assert_config_error(
        &format!("dtf check-config, {what}"),
        &dtf_check(&c.config_path),
        &names,
    );
}

/// `dtf-ps` (starting) and `dtf-worker check-config` on `config` exit 78
/// naming every one of `names`.
fn refused_by_daemons(config: &Path, names: &[&str]) {
    assert_config_error("dtf-ps", &ps(config, 0, &[]), names);
    assert_config_error(
        "dtf-worker check-config",
        &worker_check(config, Some(0), &[]),
        names,
    );
}

#[test]
fn a_model_larger_than_memory_exits_78_instead_of_aborting() {
    refused_everywhere(
        "layers [784, 1e8, 10]",
        |c| c.model.layers = vec![784, 100_000_000, 10],
        &["model.layers", "636000000080 bytes", "MemTotal"],
    );
}

#[test]
fn a_model_whose_size_overflows_exits_78_instead_of_panicking() {
    refused_everywhere(
        "layers [2^32, 2^32, 10]",
        |c| c.model.layers = vec![1 << 32, 1 << 32, 10],
        &["model.layers", "2^64 bytes"],
    );
}

#[test]
fn a_billion_example_batch_exits_78_instead_of_failing_in_the_worker() {
    refused_everywhere(
        "batch_size 1e9",
        |c| c.train.batch_size = 1_000_000_000,
        &["train.batch_size", "1 to 1000000"],
    );
}

#[test]
fn a_learning_rate_of_1e30_exits_78_instead_of_training_to_infinity() {
    refused_everywhere(
        "learning_rate 1e30",
        |c| c.train.learning_rate = 1e30,
        &["train.learning_rate", "(0, 10]"],
    );
    refused_everywhere(
        "regularization_rate 1e30",
        |c| c.train.regularization_rate = 1e30,
        &["train.regularization_rate", "[0, 1]"],
    );
}

#[test]
fn localhost_and_127_0_0_1_on_one_port_exit_78() {
    refused_everywhere(
        "localhost:X and 127.0.0.1:X",
        |c| {
            let port = c.cluster.ps[0].rsplit_once(':').unwrap().1.to_owned();
            c.cluster.ps[0] = format!("localhost:{port}");
            c.cluster.worker[0] = format!("127.0.0.1:{port}");
        },
        &["cluster.worker[0]", "duplicate address", "cluster.ps[0]"],
    );
}

#[test]
fn a_fifo_as_token_file_exits_78_instead_of_hanging() {
    let c = Cluster::new(1, 1, 10, Mode::Async);
    let token = &c.cfg.security.token_file;
    std::fs::remove_file(token).unwrap();
    mkfifo(token);
    let names = ["security.token_file", &token.display().to_string(), "FIFO"];
    refused_by_daemons(&c.config_path, &names);
}

#[test]
fn a_fifo_or_dev_zero_as_config_file_exits_78_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("dtf.toml");
    mkfifo(&fifo);
    for (path, kind) in [
        (fifo.as_path(), "FIFO"),
        (Path::new("/dev/zero"), "character device"),
    ] {
        let name = path.display().to_string();
        refused_by_daemons(path, &[&name, kind]);
        assert_config_error("dtf check-config", &dtf_check(path), &[&name, kind]);
    }
}

#[test]
fn a_token_with_an_embedded_newline_exits_78_naming_it() {
    let c = Cluster::new(1, 1, 10, Mode::Async);
    let token = &c.cfg.security.token_file;
    std::fs::write(token, "first-line\nsecond-line\n").unwrap();
    std::fs::set_permissions(token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let names = [
        "security.token_file",
        &token.display().to_string(),
        "control character",
    ];
    refused_by_daemons(&c.config_path, &names);
}

#[test]
fn tf_config_with_two_chiefs_exits_78_naming_it() {
    let c = Cluster::new(1, 1, 10, Mode::Async);
    let json = r#"{"cluster": {"chief": ["127.0.0.1:1"], "master": ["127.0.0.1:2"],
                   "ps": ["127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}}"#;
    let env = [("TF_CONFIG", json)];
    let names = ["TF_CONFIG", "cluster.master", "2 chiefs"];
    assert_config_error(
        "dtf-worker check-config",
        &worker_check(&c.config_path, None, &env),
        &names,
    );
}
