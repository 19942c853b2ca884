//! Configuration errors as an operator meets them: through the binaries,
//! exit code 78 (EX_CONFIG) and a message naming the key and the file. Also
//! `TF_CONFIG`, `DTF_…` overrides, and a start on a finished run.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const QUICK: Duration = Duration::from_secs(10);

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `dtf-ps --config F --task N` (the daemon itself, not check-config).
pub fn ps(config: &Path, task: usize, env: &[(&str, &str)]) -> Ran {
    let t = task.to_string();
    run(
        "dtf-ps",
        &[os("--config"), config.as_os_str(), os("--task"), os(&t)],
        env,
        QUICK,
    )
}

/// `dtf-worker --config F --task N check-config`.
pub fn worker_check(config: &Path, task: Option<usize>, env: &[(&str, &str)]) -> Ran {
    let t = task.map(|t| t.to_string());
    let mut args = vec![os("--config"), config.as_os_str()];
    if let Some(t) = &t {
        args.extend([os("--task"), os(t)]);
    }
    args.push(os("check-config"));
    run("dtf-worker", &args, env, QUICK)
}

/// Exit 78 and a message naming every one of `names`.
pub fn assert_config_error(what: &str, ran: &Ran, names: &[&str]) {
    assert_eq!(
        ran.status.code(),
        Some(78),
        "{what}: exit {}; stderr:\n{}",
        ran.status,
        ran.stderr
    );
    for n in names {
        assert!(
            ran.stderr.contains(n),
            "{what}: stderr does not name {n:?}:\n{}",
            ran.stderr
        );
    }
}

/// A valid two-worker cluster, and its file's text.
fn base() -> (Cluster, String) {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let text = std::fs::read_to_string(&c.config_path).unwrap();
    (c, text)
}

#[test]
fn file_errors_exit_78_naming_the_key_and_the_file() {
    let (c, text) = base();
    let file = c.config_path.display().to_string();
    assert!(text.contains("batch_size = 20\n"), "{text}");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "unknown key",
            text.replace("batch_size = 20\n", "batch_size = 20\nbatch_sise = 3\n"),
            "train.batch_sise",
        ),
        (
            "wrong type",
            text.replace("batch_size = 20\n", "batch_size = \"twenty\"\n"),
            "train.batch_size",
        ),
        (
            "out of range",
            text.replace("batch_size = 20\n", "batch_size = 0\n"),
            "train.batch_size",
        ),
        (
            "duplicate address",
            text.replace(
                &format!("\"{}\"]", c.cfg.cluster.worker[1]),
                &format!("\"{}\"]", c.cfg.cluster.ps[0]),
            ),
            "cluster.worker[1]",
        ),
    ];
    for (what, bad, key) in &cases {
        assert_ne!(bad, &text, "{what}: the edit did not apply");
        std::fs::write(&c.config_path, bad).unwrap();
        assert_config_error(
            &format!("dtf-ps, {what}"),
            &ps(&c.config_path, 0, &[]),
            &[key, &file],
        );
        assert_config_error(
            &format!("dtf-worker check-config, {what}"),
            &worker_check(&c.config_path, Some(1), &[]),
            &[key, &file],
        );
        assert_config_error(
            &format!("dtf check-config, {what}"),
            &dtf_check(&c.config_path),
            &[key, &file],
        );
    }
    let dup = worker_check(&c.config_path, Some(0), &[]);
    assert!(dup.stderr.contains("duplicate address"), "{}", dup.stderr);

    // The valid file passes all three.
    std::fs::write(&c.config_path, &text).unwrap();
    let ok = dtf_check(&c.config_path);
    assert!(
        ok.status.success(),
        "dtf check-config on a valid file: {}\n{}",
        ok.status,
        ok.stderr
    );
    let ok = worker_check(&c.config_path, Some(1), &[]);
    assert!(
        ok.status.success(),
        "dtf-worker check-config: {}\n{}",
        ok.status,
        ok.stderr
    );
    assert!(ok.stdout.contains("valid for worker:1"), "{}", ok.stdout);

    // A missing file names it.
    let missing = c.dir.path().join("absent.toml");
    let missing_name = missing.display().to_string();
    assert_config_error(
        "dtf-ps, missing file",
        &ps(&missing, 0, &[]),
        &[&missing_name],
    );
    assert_config_error(
        "dtf-worker, missing file",
        &worker_check(&missing, Some(0), &[]),
        &[&missing_name],
    );
    assert_config_error("dtf, missing file", &dtf_check(&missing), &[&missing_name]);
}

#[test]
fn task_outside_the_cluster_exits_78() {
    let (c, _) = base();
    let file = c.config_path.display().to_string();
    assert_config_error(
        "ps:1 of 1",
        &ps(&c.config_path, 1, &[]),
        &["cluster.ps", &file, "ps:1"],
    );
    assert_config_error(
        "worker:2 of 2",
        &worker_check(&c.config_path, Some(2), &[]),
        &["cluster.worker", &file, "worker:2"],
    );
    // No --task and no TF_CONFIG: say how to give one.
    assert_config_error(
        "no task",
        &worker_check(&c.config_path, None, &[]),
        &["--task"],
    );
}

#[test]
fn token_file_problems_exit_78_naming_it() {
    let (c, _) = base();
    let token = &c.cfg.security.token_file;
    let token_name = token.display().to_string();
    std::fs::set_permissions(token, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_config_error(
        "token 0644, dtf-ps",
        &ps(&c.config_path, 0, &[]),
        &["security.token_file", &token_name, "0644"],
    );
    assert_config_error(
        "token 0644, check-config",
        &worker_check(&c.config_path, Some(0), &[]),
        &["security.token_file", &token_name],
    );
    std::fs::remove_file(token).unwrap();
    assert_config_error(
        "no token, dtf-ps",
        &ps(&c.config_path, 0, &[]),
        &["security.token_file", &token_name],
    );
    assert_config_error(
        "no token, check-config",
        &worker_check(&c.config_path, Some(0), &[]),
        &["security.token_file", &token_name],
    );
}

/// `dtf-ps --config F --task 0 check-config`.
fn ps_check(config: &Path) -> Ran {
    let args = [os("--config"), config.as_os_str(), os("--task"), os("0")];
    let mut args = args.to_vec();
    args.push(os("check-config"));
    run("dtf-ps", &args, &[], QUICK)
}

/// One validation path: what stops a daemon from starting makes every
/// `check-config` refuse the file too, so `valid` means the daemons start.
#[test]
fn every_check_config_refuses_what_stops_a_start() {
    let (mut c, _) = base();
    let good = c.cfg.clone();
    let token_name = c.cfg.security.token_file.display().to_string();
    let file = c.config_path.display().to_string();
    let data = c.cfg.data.dir.display().to_string();
    type Break = fn(&mut Cluster);
    let cases: [(&str, Break, &[&str]); 3] = [
        (
            "token 0644",
            |c| {
                let perm = std::fs::Permissions::from_mode(0o644);
                std::fs::set_permissions(&c.cfg.security.token_file, perm).unwrap();
            },
            &["security.token_file", "0644"],
        ),
        (
            "layers [100, 10] on 64-pixel images",
            |c| c.cfg.model.layers = vec![100, CLASSES],
            &["model.layers", "100 inputs", "64 pixels"],
        ),
        (
            "batch larger than the data",
            |c| c.cfg.train.batch_size = 5000,
            &["train.batch_size", "5000", "2000 training examples"],
        ),
    ];
    for (what, break_it, names) in cases {
        c.cfg = good.clone();
        c.write_config();
        std::fs::set_permissions(
            &c.cfg.security.token_file,
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        break_it(&mut c);
        c.write_config();
        let mut names = names.to_vec();
        names.push(if what.starts_with("token") {
            &token_name
        } else {
            &data
        });
        if !what.starts_with("token") {
            names.push(&file);
        }
        assert_config_error(
            &format!("dtf check-config, {what}"),
            &dtf_check(&c.config_path),
            &names,
        );
        assert_config_error(
            &format!("dtf-ps check-config, {what}"),
            &ps_check(&c.config_path),
            &names,
        );
        assert_config_error(
            &format!("dtf-worker check-config, {what}"),
            &worker_check(&c.config_path, Some(1), &[]),
            &names,
        );
        assert_config_error(
            &format!("dtf-ps start, {what}"),
            &ps(&c.config_path, 0, &[]),
            &names,
        );
    }
    // Data this host cannot read is not an error here: a ps host need not hold it.
    c.cfg = good;
    c.cfg.data.dir = c.dir.path().join("elsewhere");
    c.write_config();
    let ran = dtf_check(&c.config_path);
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn tf_config_selects_the_task_and_the_cluster() {
    let (mut c, _) = base();
    // Without a chief: the lists as they are; the task from "task".
    let tf = format!(
        r#"{{"cluster": {{"ps": ["{}", "{}"], "worker": ["{}"]}}, "task": {{"type": "ps", "index": 1}}}}"#,
        c.cfg.cluster.ps[0], c.cfg.cluster.worker[0], c.cfg.cluster.worker[1]
    );
    let ran = worker_check(&c.config_path, None, &[("TF_CONFIG", &tf)]);
    assert_config_error(
        "dtf-worker with a ps TF_CONFIG task",
        &ran,
        &["TF_CONFIG", "ps"],
    );
    // The ps listens where TF_CONFIG says ps 1 is, and says it is task 1.
    let addr = c.cfg.cluster.worker[0].clone();
    let child = std::process::Command::new(bin("dtf-ps"))
        .arg("--config")
        .arg(&c.config_path)
        .env("TF_CONFIG", &tf)
        .env_remove("NOTIFY_SOCKET")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(c.log_path("ps:1")).unwrap())
        .spawn()
        .unwrap();
    // Owned by the cluster, so it is killed when the test ends.
    c.procs.push(("ps:1".into(), child));
    let state = client(&addr, Some(TOKEN))
        .await
        .state(pb::StateRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.task, 1, "TF_CONFIG's task index");

    // With a chief: the chief is worker 0 and "worker" i is worker i + 1.
    let tf_chief = |kind: &str, index: usize| {
        format!(
            r#"{{"cluster": {{"chief": ["{}"], "ps": ["{}"], "worker": ["{}"]}}, "task": {{"type": "{kind}", "index": {index}}}}}"#,
            c.cfg.cluster.worker[0], c.cfg.cluster.ps[0], c.cfg.cluster.worker[1]
        )
    };
    for (kind, index, task) in [("chief", 0, "worker:0"), ("worker", 0, "worker:1")] {
        let ran = worker_check(
            &c.config_path,
            None,
            &[("TF_CONFIG", &tf_chief(kind, index))],
        );
        assert!(
            ran.status.success(),
            "TF_CONFIG {kind} {index}: {}\n{}",
            ran.status,
            ran.stderr
        );
        assert!(
            ran.stdout.contains(&format!("valid for {task}")),
            "TF_CONFIG {kind} {index}: {}",
            ran.stdout
        );
    }
    let ran = worker_check(
        &c.config_path,
        None,
        &[("TF_CONFIG", &tf_chief("worker", 1))],
    );
    assert_config_error(
        "TF_CONFIG worker index past the list",
        &ran,
        &["TF_CONFIG", "worker:2", "cluster.worker"],
    );
    // --task wins over TF_CONFIG's task.
    let ran = worker_check(
        &c.config_path,
        Some(0),
        &[("TF_CONFIG", &tf_chief("worker", 0))],
    );
    assert!(
        ran.stdout.contains("valid for worker:0"),
        "{}\n{}",
        ran.stdout,
        ran.stderr
    );
}

#[test]
fn environment_overrides_the_file() {
    let (c, _) = base();
    let ran = worker_check(&c.config_path, Some(0), &[("DTF_TRAIN__LAST_STEP", "37")]);
    assert!(ran.status.success(), "{}\n{}", ran.status, ran.stderr);
    assert!(
        ran.stdout.contains("train.last_step = 37"),
        "{}",
        ran.stdout
    );
    let ran = worker_check(&c.config_path, Some(0), &[]);
    assert!(
        ran.stdout.contains("train.last_step = 100"),
        "{}",
        ran.stdout
    );
    let ran = worker_check(&c.config_path, Some(0), &[("DTF_TRAIN__LAST_STEP", "0")]);
    assert_config_error(
        "DTF_TRAIN__LAST_STEP=0",
        &ran,
        &["DTF_TRAIN__LAST_STEP", "train.last_step"],
    );
}

#[test]
fn a_run_to_an_env_overridden_last_step_stops_there() {
    let mut c = Cluster::new(1, 1, 100_000, Mode::Async);
    let env = [("DTF_TRAIN__LAST_STEP", OsStr::new("40"))];
    c.start_with_env("ps", 0, &env);
    c.start_with_env("worker", 0, &env);
    c.wait_all_success(Duration::from_secs(60));
    let steps = checkpoint_steps(&c.cfg.checkpoint.dir);
    assert_eq!(
        steps.last(),
        Some(&40),
        "final checkpoint at DTF_TRAIN__LAST_STEP: {steps:?}"
    );
}

#[test]
fn every_task_started_on_a_finished_run_exits_0_at_once() {
    let (mut c, _) = base();
    write_checkpoint(&c.cfg, 100);
    for (role, index) in [("ps", 0), ("worker", 0), ("worker", 1)] {
        let name = format!("{role}:{index}");
        c.start(role, index);
        let s = c.wait(&name, QUICK);
        assert!(
            s.success(),
            "{name} exited with {s}; log:\n{}",
            c.log(&name)
        );
        assert!(
            c.log(&name).contains("already complete"),
            "{name} says why:\n{}",
            c.log(&name)
        );
    }
    // Past the checkpoint's step the run is not complete: the ps serves.
    let env = [("DTF_TRAIN__LAST_STEP", OsStr::new("101"))];
    c.start_with_env("ps", 0, &env);
    c.wait_log("ps:0", "Parameter server ready", 1, QUICK);
    assert!(c.child("ps:0").try_wait().unwrap().is_none());
}

/// The chief killed between its final checkpoint and telling the ps tasks
/// (found by the fault harness): started again, it finds the run complete,
/// and the ps tasks, which cannot see that checkpoint (another host), are
/// told, and exit, instead of serving on for ever.
#[test]
fn a_chief_started_on_a_finished_run_tells_the_ps_tasks() {
    let (mut c, _) = base();
    write_checkpoint(&c.cfg, 100);
    let elsewhere = tempfile::tempdir().unwrap();
    c.start_with_env(
        "ps",
        0,
        &[("DTF_CHECKPOINT__DIR", elsewhere.path().as_os_str())],
    );
    c.wait_log("ps:0", "Parameter server ready", 1, QUICK);
    c.start("worker", 0);
    assert!(c.wait("worker:0", QUICK).success(), "{}", c.log("worker:0"));
    let chief = c.log("worker:0");
    assert!(
        chief.contains("Told the ps tasks the run is complete."),
        "{chief}"
    );
    let s = c.wait("ps:0", QUICK);
    assert!(s.success(), "ps:0 exited with {s}:\n{}", c.log("ps:0"));
    assert!(c.log("ps:0").contains("Run complete."), "{}", c.log("ps:0"));
}
