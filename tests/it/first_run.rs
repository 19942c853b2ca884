//! The operator's and the data scientist's first day: `dtf local` with the
//! training flags and a CSV of their own (no config file), a command line
//! that cannot run, the figures a run reports, `dtf eval` and `dtf predict`
//! on the model's own data, `dtf status` after the end, the TF launcher's
//! flags, and a refused token.

use crate::util::*;
use dtf::config::Mode;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `dtf ARGS` with `TMPDIR` = `tmp` (where `dtf local` makes its run
/// directory) and `env`, to completion.
pub(crate) fn dtf_in(tmp: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let tmp = tmp.to_str().unwrap();
    let mut env = env.to_vec();
    env.push(("TMPDIR", tmp));
    run("dtf", &args, &env, Duration::from_secs(180))
}

/// Three well-separated blobs in 4 features, label column `class` (not
/// `label`), as `blobs_train.csv` and `blobs_test.csv` in `dir`.
fn blobs(dir: &Path) -> PathBuf {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut write = |name: &str, rows: usize| {
        let mut text = String::from("f0,f1,f2,f3,class\n");
        for _ in 0..rows {
            let c = rng.random_range(0..3usize);
            let cells: Vec<String> = (0..4)
                .map(|j| {
                    let centre = if j == c { 3.0 } else { 0.0 };
                    format!("{:.3}", centre + rng.random_range(-0.5..0.5f32))
                })
                .collect();
            text.push_str(&format!("{},{c}\n", cells.join(",")));
        }
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    write("blobs_test.csv", 90);
    write("blobs_train.csv", 600)
}

/// The `dtf-local-*` directories in `tmp`.
fn run_dirs(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dtf-local-"))
        })
        .collect()
}

pub(crate) fn json(out: &Ran) -> serde_json::Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}):\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        )
    })
}

#[test]
fn a_csv_of_ones_own_trains_evaluates_and_predicts_with_no_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let train = blobs(dir.path());
    let ckpt = dir.path().join("ckpt");
    let args = [
        "local",
        "--data",
        train.to_str().unwrap(),
        "--workers",
        "1",
        "--optimizer",
        "adam",
        "--learning-rate",
        "0.01",
        "--hidden",
        "8",
        "--batch-size",
        "20",
        "--set",
        "train.beta1=0.8",
        "--steps",
        "400",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--keep-run-dir",
        "--evaluator",
        "--json",
    ];
    // A key from the environment is in the run's dtf.toml too.
    let env = [("DTF_TRAIN__MOMENTUM", "0.5")];
    let out = dtf_in(&tmp, &args, &env);
    assert!(out.status.success(), "dtf local failed:\n{}", out.stderr);
    let report = json(&out);
    assert_eq!(report["outcome"], "trained", "{report}");
    assert_eq!(report["global_step"], 400, "{report}");
    assert_eq!(report["optimizer"], "adam", "{report}");
    assert_eq!(report["layers"], serde_json::json!([4, 8, 3]), "{report}");
    assert_eq!(report["already_complete"], false, "{report}");
    let rate = report["steps_per_sec"].as_f64().unwrap_or(0.0);
    assert!(rate > 0.0, "steps were made, so a rate: {report}");
    assert!(
        report["test_accuracy"].as_f64().unwrap() > 0.9,
        "the blobs are separable: {report}"
    );
    // The header and the summary name the optimizer and the model; the
    // label column was inferred and said so.
    for needle in ["adam (beta1 = 0.8", "[4, 8, 3]", "label column \"class\""] {
        assert!(
            out.stderr.contains(needle),
            "no {needle:?} in:\n{}",
            out.stderr
        );
    }
    // What ran is what the run directory's dtf.toml says.
    let run_dir = PathBuf::from(report["run_dir"].as_str().unwrap());
    let ran: dtf::config::Config =
        toml::from_str(&std::fs::read_to_string(run_dir.join("dtf.toml")).unwrap()).unwrap();
    assert_eq!(ran.train.optimizer, dtf::config::OptimizerKind::Adam);
    assert_eq!(
        (ran.train.beta1, ran.train.momentum, ran.train.learning_rate),
        (0.8, 0.5, 0.01)
    );
    assert_eq!((ran.train.batch_size, ran.train.last_step), (20, 400));
    assert_eq!(ran.data.label, "class");
    assert_eq!(ran.model.layers, [4, 8, 3]);

    // dtf eval: the checkpoint's own test data, with no --data.
    let out = dtf_in(&tmp, &["eval", ckpt.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "dtf eval failed:\n{}", out.stderr);
    let ev = json(&out);
    assert_eq!(ev["examples"], 90, "the blobs' test file: {ev}");
    assert_eq!(ev["global_step"], 400, "{ev}");

    // dtf predict: plain decimals, one line per row.
    let test = dir.path().join("blobs_test.csv");
    let out = dtf_in(
        &tmp,
        &[
            "predict",
            ckpt.to_str().unwrap(),
            "--input",
            test.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "dtf predict failed:\n{}", out.stderr);
    assert_eq!(out.stdout.lines().count(), 91, "{}", out.stdout);
    assert!(!out.stdout.contains("e-"), "no exponents:\n{}", out.stdout);

    // dtf status after the end: the ps tasks have exited, the run is
    // complete, so 0; the evaluator has its row.
    let config = run_dir.join("dtf.toml");
    let out = dtf_in(&tmp, &["status", "--config", config.to_str().unwrap()], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a complete run is not an alarm:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("evaluator:0") && out.stdout.contains("run complete  yes"),
        "{}",
        out.stdout
    );

    // The same command again: already complete, said so, no rate made up.
    let out = dtf_in(&tmp, &args, &env);
    assert!(
        out.status.success(),
        "second dtf local failed:\n{}",
        out.stderr
    );
    let again = json(&out);
    assert_eq!(again["already_complete"], true, "{again}");
    assert_eq!(again["steps_per_sec"], serde_json::Value::Null, "{again}");
    assert!(out.stderr.contains("already complete"), "{}", out.stderr);
}

#[test]
fn a_local_command_line_that_cannot_run_exits_2_naming_the_flag_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let train = blobs(dir.path());
    let ambiguous = dir.path().join("odd_train.csv");
    std::fs::write(&ambiguous, "a,b,c\n1,2,0\n").unwrap();
    std::fs::write(dir.path().join("odd_test.csv"), "a,b,c\n1,2,0\n").unwrap();
    let data = train.to_str().unwrap();
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &["--data", data, "--batch-size", "5000"],
            &["--batch-size 5000", "600 training examples"],
        ),
        (
            &["--data", data, "--steps", "0"],
            &["--steps 0", "train.last_step"],
        ),
        (
            &["--data", data, "--set", "train.optimiser=adam"],
            &["--set train.optimiser=adam", "did you mean `optimizer`"],
        ),
        (
            &["--data", data, "--optimizer", "adm"],
            &["--optimizer adm", "adam"],
        ),
        (
            &["--data", data, "--set", "nokey"],
            &["--set", "section.key=value"],
        ),
        (
            &["--data", ambiguous.to_str().unwrap()],
            &["odd_train.csv", "a, b, c", "--label"],
        ),
        (
            &["--data", data, "--label", "f9"],
            &["blobs_train.csv", "f9"],
        ),
    ];
    for (args, needles) in cases {
        let mut all = vec!["local"];
        all.extend_from_slice(args);
        let out = dtf_in(&tmp, &all, &[]);
        assert_eq!(out.status.code(), Some(2), "{all:?}:\n{}", out.stderr);
        for needle in needles {
            assert!(
                out.stderr.contains(needle),
                "{all:?}: no {needle:?} in:\n{}",
                out.stderr
            );
        }
        assert!(
            !out.stderr.contains("dtf status"),
            "no hint for a run that never started:\n{}",
            out.stderr
        );
        assert_eq!(
            run_dirs(&tmp),
            Vec::<PathBuf>::new(),
            "{all:?} left a run directory"
        );
    }
}

#[test]
fn local_shows_progress_as_lines_when_stderr_is_not_a_terminal() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let tmp = c.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let config = c.config_path.to_str().unwrap();
    let out = dtf_in(
        &tmp,
        &[
            "local",
            "--config",
            config,
            "--workers",
            "1",
            "--steps",
            "30000",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("dtf local: step "))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("steps/s") && l.contains("ETA")),
        "progress lines with a rate and an ETA:\n{}",
        out.stderr
    );
    // The resume and status hints name the program that was run.
    let program = bin("dtf").display().to_string();
    assert!(
        out.stderr.contains(&format!("{program} status --config")),
        "{}",
        out.stderr
    );
}

#[test]
fn one_ctrl_c_delivered_twice_is_one_graceful_stop() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let tmp = c.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let ckpt = c.dir.path().join("kept");
    let mut child = std::process::Command::new(bin("dtf"))
        .args([
            "local",
            "--workers",
            "1",
            "--steps",
            "100000000",
            "--save-secs",
            "3600",
        ])
        .arg("--config")
        .arg(&c.config_path)
        .arg("--checkpoint-dir")
        .arg(&ckpt)
        .arg("--json")
        .env("TMPDIR", &tmp)
        .env_remove("TF_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    until(Duration::from_secs(60), "the chief to train", || {
        let run = run_dirs(&tmp).pop()?;
        let log = std::fs::read_to_string(run.join("logs/worker-0.log")).ok()?;
        log.contains("Progress.").then_some(())
    });
    // Two SIGINTs back to back, as `timeout --foreground` and a terminal
    // can deliver one Ctrl-C.
    for _ in 0..2 {
        // SAFETY: a pid this test spawned and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    let status = until(Duration::from_secs(90), "dtf local to stop", || {
        child.try_wait().unwrap()
    });
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(130));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["forced"], false, "one stop, not two: {report}");
    let step = report["global_step"].as_u64().unwrap_or(0);
    assert!(
        step > 0,
        "the final checkpoint keeps the progress: {report}"
    );
}

#[test]
fn a_worker_whose_token_the_ps_refuses_exits_78() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    c.start("ps", 0);
    // The worker's own config: the same cluster, another token.
    let mut other = c.cfg.clone();
    let token = c.dir.path().join("other-token");
    std::fs::write(&token, "another-token-0123456789").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    other.security.token_file = token;
    let path = c.dir.path().join("other.toml");
    std::fs::write(&path, other.to_toml()).unwrap();
    let out = run(
        "dtf-worker",
        &[
            "--config".as_ref(),
            path.as_os_str(),
            "--task".as_ref(),
            "0".as_ref(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(
        out.status.code(),
        Some(78),
        "a refused token is a configuration error, not restarted:\n{}",
        out.stderr
    );
}

#[test]
fn the_tf_launcher_flags_define_the_cluster() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    // A file whose cluster is elsewhere: the flags win.
    let mut cfg = c.cfg.clone();
    cfg.cluster = Default::default();
    let path = c.dir.path().join("nocluster.toml");
    std::fs::write(&path, cfg.to_toml()).unwrap();
    let ps = c.cfg.cluster.ps.join(",");
    let workers = c.cfg.cluster.worker.join(",");
    let ps_hosts = format!("--ps_hosts={ps}");
    let worker_hosts = format!("--worker_hosts={workers}");
    let out = run(
        "dtf-worker",
        &[
            ps_hosts.as_ref(),
            worker_hosts.as_ref(),
            "--job_name=worker".as_ref(),
            "--task_index=1".as_ref(),
            "-c".as_ref(),
            path.as_os_str(),
            "check-config".as_ref(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout
            .contains("valid for worker:1 (cluster: 1 ps, 2 workers"),
        "{}",
        out.stdout
    );
    // A bad address is named with the flag that gave it.
    let out = run(
        "dtf-ps",
        &[
            "--ps_hosts=nonsense".as_ref(),
            "--task_index=0".as_ref(),
            "-c".as_ref(),
            path.as_os_str(),
            "check-config".as_ref(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    assert!(out.stderr.contains("--ps_hosts=nonsense"), "{}", out.stderr);
}

/// `args` as a command line.
fn os_args(args: &[String]) -> Vec<&OsStr> {
    args.iter().map(OsStr::new).collect()
}

/// Issue 43: TensorFlow 1.x's launch line — `--ps_hosts`, `--worker_hosts`,
/// `--job_name`, `--task_index` — with `--token-file` and no configuration
/// file runs a cluster to the end (it exited 78 on the missing
/// /etc/dtf/dtf.toml, then on /etc/dtf/token).
#[test]
fn tensorflow_flags_and_a_token_file_run_a_cluster_without_a_config_file() {
    let mut c = Cluster::new(1, 1, 60, Mode::Async);
    let flags = |job: &str| -> Vec<String> {
        vec![
            format!("--ps_hosts={}", c.cfg.cluster.ps.join(",")),
            format!("--worker_hosts={}", c.cfg.cluster.worker.join(",")),
            format!("--job_name={job}"),
            "--task_index=0".to_owned(),
            format!("--token-file={}", c.cfg.security.token_file.display()),
        ]
    };
    let (ps, worker) = (flags("ps"), flags("worker"));
    // What is not a TensorFlow flag comes from DTF_… variables, as a
    // launch script sets them: this test's tiny data and directories, a
    // short run. DTF_CONFIG=/dev/null: no file, even where the host has an
    // /etc/dtf/dtf.toml (the default path's absence is the unit tests').
    let dir = |p: &Path| p.display().to_string();
    let env: Vec<(&str, String)> = vec![
        ("DTF_CONFIG", "/dev/null".to_owned()),
        ("DTF_DATA__DIR", dir(&c.cfg.data.dir)),
        ("DTF_MODEL__LAYERS", format!("{:?}", c.cfg.model.layers)),
        ("DTF_TRAIN__BATCH_SIZE", c.cfg.train.batch_size.to_string()),
        ("DTF_TRAIN__LAST_STEP", c.cfg.train.last_step.to_string()),
        ("DTF_CHECKPOINT__DIR", dir(&c.cfg.checkpoint.dir)),
        (
            "DTF_CLUSTER__RUNTIME_DIR",
            c.cfg.cluster.runtime_dir.clone(),
        ),
        ("DTF_PS__SNAPSHOT_DIR", c.cfg.ps.snapshot_dir.clone()),
    ];
    let env_str: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let env_os: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, OsStr::new(v))).collect();

    // check-config takes the same command line, the flags on either side.
    let mut check: Vec<String> = vec!["check-config".to_owned()];
    check.extend(ps.iter().cloned());
    let out = run(
        "dtf-ps",
        &os_args(&check),
        &env_str,
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.starts_with(
            "the command line (no configuration file): valid for ps:0 (cluster: 1 ps, 1 workers"
        ),
        "{}",
        out.stdout
    );

    c.start_args("ps:0", "ps", &os_args(&ps), &env_os);
    c.start_args("worker:0", "worker", &os_args(&worker), &env_os);
    c.wait_all_success(Duration::from_secs(120));
    assert_eq!(
        checkpoint_steps(&c.cfg.checkpoint.dir).last(),
        Some(&c.cfg.train.last_step),
        "{}",
        c.log("worker:0")
    );
    assert!(
        c.log("worker:0").contains("No configuration file"),
        "{}",
        c.log("worker:0")
    );

    // Without the token file: exit 78, saying how to make one.
    let absent = c.dir.path().join("no-token");
    let mut no_token = worker.clone();
    no_token.pop();
    no_token.push(format!("--token-file={}", absent.display()));
    no_token.push("check-config".to_owned());
    let out = run(
        "dtf-worker",
        &os_args(&no_token),
        &env_str,
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    for part in [
        "head -c 32 /dev/urandom",
        "--token-file FILE",
        "DTF_SECURITY__TOKEN_FILE",
    ] {
        assert!(out.stderr.contains(part), "{part:?} not in {}", out.stderr);
    }
}

#[test]
fn a_sync_stall_names_the_missing_worker() {
    let mut c = Cluster::new(1, 2, 100000, Mode::Sync);
    c.start("ps", 0);
    c.start("worker", 0);
    // worker:1 never starts: the chief's wait names it.
    let log = c.wait_log(
        "worker:0",
        "Waiting for the other replicas' gradients.",
        1,
        Duration::from_secs(60),
    );
    assert!(log.contains("worker:1 (never seen)"), "{log}");
}

/// One CSV of one's own, tab-separated, with no test file: dtf local tests
/// on the seeded `data.test_fraction` split of its rows and says so, and
/// the two runs on the same file agree on that split.
#[test]
fn a_lone_tab_separated_file_is_split_for_its_test_set() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let blobs = std::fs::read_to_string(blobs(dir.path())).unwrap();
    let all = dir.path().join("mine.csv");
    std::fs::write(&all, blobs.replace(',', "\t")).unwrap();
    let args = [
        "local",
        "--data",
        all.to_str().unwrap(),
        "--workers",
        "1",
        "--hidden",
        "8",
        "--batch-size",
        "20",
        "--steps",
        "300",
        "--json",
    ];
    let out = dtf_in(&tmp, &args, &[]);
    assert!(out.status.success(), "dtf local failed:\n{}", out.stderr);
    let report = json(&out);
    assert_eq!(report["layers"], serde_json::json!([4, 8, 3]), "{report}");
    assert!(
        report["test_accuracy"].as_f64().unwrap() > 0.9,
        "the blobs are separable: {report}"
    );
    let said = format!(
        "no test file: testing on {} (its seeded 20 % test split), training on the other 480 examples",
        all.display()
    );
    assert!(
        out.stderr.contains(&said),
        "no {said:?} in:\n{}",
        out.stderr
    );
    // dtf eval on the run's checkpoint with the same file scores the same
    // test rows: the split is a function of the file alone.
    let ckpt = format!("{}/checkpoints", report["run_dir"].as_str().unwrap());
    let eval = dtf_in(&tmp, &["eval", &ckpt, "--json"], &[]);
    assert!(eval.status.success(), "{}", eval.stderr);
    assert_eq!(
        json(&eval)["accuracy"],
        report["test_accuracy"],
        "{}",
        eval.stdout
    );
}

/// Three separable iris-like classes named `setosa`, `versicolor` and
/// `virginica` in the column `species`, as `iris_train.csv` and
/// `iris_test.csv` in `dir`; the test file's rows come in another order.
fn iris(dir: &Path) -> PathBuf {
    use rand::{Rng, SeedableRng};
    let names = ["virginica", "setosa", "versicolor"];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut write = |name: &str, rows: usize| {
        let mut text = String::from("sepal_length,sepal_width,petal_length,petal_width,species\n");
        for _ in 0..rows {
            let c = rng.random_range(0..3usize);
            let cells: Vec<String> = (0..4)
                .map(|j| {
                    let centre = if j == c { 3.0 } else { 0.0 };
                    format!("{:.3}", centre + rng.random_range(-0.5..0.5f32))
                })
                .collect();
            text.push_str(&format!("{},{}\n", cells.join(","), names[c]));
        }
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    write("iris_test.csv", 60);
    write("iris_train.csv", 450)
}

#[test]
fn class_names_in_the_label_column_train_and_come_back_from_predict_and_eval() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let train = iris(dir.path());
    let test = dir.path().join("iris_test.csv");
    let ckpt = dir.path().join("ckpt");
    let args = [
        "local",
        "--data",
        train.to_str().unwrap(),
        "--workers",
        "2",
        "--optimizer",
        "adam",
        "--learning-rate",
        "0.01",
        "--hidden",
        "8",
        "--batch-size",
        "20",
        "--steps",
        "300",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--evaluator",
        "--json",
    ];
    let out = dtf_in(&tmp, &args, &[]);
    assert!(out.status.success(), "dtf local failed:\n{}", out.stderr);
    let report = json(&out);
    assert_eq!(report["outcome"], "trained", "{report}");
    assert_eq!(report["layers"], serde_json::json!([4, 8, 3]), "{report}");
    assert!(
        report["test_accuracy"].as_f64().unwrap() > 0.9,
        "the classes are separable: {report}"
    );
    assert!(
        out.stderr.contains(
            "dtf local: label column \"species\" holds 3 class names: setosa, versicolor, virginica"
        ),
        "{}",
        out.stderr
    );
    // The names, in class order, are the checkpoint's.
    let model = dtf::predict::Trained::load(&ckpt).unwrap();
    let names = ["setosa", "versicolor", "virginica"].map(String::from);
    assert_eq!(model.meta.class_names.as_deref(), Some(&names[..]));

    // dtf predict: the class, its name, the probabilities.
    let predict = |extra: &[&str]| {
        let mut args = vec![
            "predict",
            ckpt.to_str().unwrap(),
            "--input",
            test.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = dtf_in(&tmp, &args, &[]);
        assert!(out.status.success(), "dtf predict failed:\n{}", out.stderr);
        out.stdout
    };
    let text = predict(&[]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "class,class_name,p0,p1,p2", "{text}");
    assert_eq!(lines.len(), 61, "{text}");
    // Nearly every row's name is the one in the test file's label column.
    let want: Vec<String> = std::fs::read_to_string(&test)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap().to_owned())
        .collect();
    let mut right = 0;
    for (line, want) in lines[1..].iter().zip(&want) {
        let cells: Vec<&str> = line.split(',').collect();
        let class: usize = cells[0].parse().unwrap();
        assert_eq!(cells[1], names[class], "{line}");
        right += usize::from(cells[1] == want);
    }
    assert!(right >= 54, "{right} of 60 right:\n{text}");
    let json_lines = predict(&["--json"]);
    for line in json_lines.lines() {
        let p: serde_json::Value = serde_json::from_str(line).unwrap();
        let class = p["class"].as_u64().unwrap() as usize;
        assert_eq!(p["class_name"], names[class], "{line}");
        assert_eq!(p["probabilities"].as_array().unwrap().len(), 3, "{line}");
    }

    // dtf eval on the test CSV: its names read through the checkpoint's.
    let out = dtf_in(
        &tmp,
        &[
            "eval",
            ckpt.to_str().unwrap(),
            "--data",
            test.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "dtf eval failed:\n{}", out.stderr);
    let ev = json(&out);
    assert_eq!(ev["examples"], 60, "{ev}");
    assert!(ev["accuracy"].as_f64().unwrap() > 0.9, "{ev}");
    // A name the model was not trained on: the file, the line and the name.
    let odd = dir.path().join("odd_test.csv");
    std::fs::write(
        &odd,
        "sepal_length,sepal_width,petal_length,petal_width,species\n3,0,0,0,setosa\n0,0,0,3,iris-x\n",
    )
    .unwrap();
    let out = dtf_in(
        &tmp,
        &[
            "eval",
            ckpt.to_str().unwrap(),
            "--data",
            odd.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("odd_test.csv")
            && out.stderr.contains("line 3")
            && out
                .stderr
                .contains("label \"iris-x\" is not one of the 3 class names"),
        "{}",
        out.stderr
    );
    // --threshold cannot make class names binary.
    let out = dtf_in(
        &tmp,
        &[
            "local",
            "--data",
            train.to_str().unwrap(),
            "--threshold",
            "1",
            "--steps",
            "1",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("is not a number") && out.stderr.contains("leave data.threshold unset"),
        "{}",
        out.stderr
    );
}
