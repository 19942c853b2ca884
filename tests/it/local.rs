//! `dtf local`, `dtf eval` and `dtf inspect` as a user runs them.

use crate::util::*;
use dtf::config::Mode;
use std::process::Command;
use std::time::Duration;

/// The whole of stdout as one JSON value: with `--json`, dtf prints nothing else there.
fn sole_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn last_json(out: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "last line {line:?} is not JSON ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `dtf local --config <c's> --ps 1 --checkpoint-dir CKPT --json ARGS`.
fn local_json(c: &Cluster, ckpt: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "local",
        "--config",
        c.config_path.to_str().unwrap(),
        "--ps",
        "1",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--json",
    ];
    all.extend_from_slice(args);
    dtf_output(&all)
}

#[test]
fn local_run_resumes_from_its_checkpoints_and_eval_matches_numpy() {
    // The tiny data set and model, through a base config.
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let ckpt = c.dir.path().join("kept");
    let ckpt_s = ckpt.to_str().unwrap();
    let run = |steps: &str| {
        local_json(
            &c,
            &ckpt,
            &["--workers", "2", "--steps", steps, "--keep-run-dir"],
        )
    };

    // Without --keep-run-dir, a finished run whose checkpoints went elsewhere removes its
    // run directory (config, token, logs, snapshots): nothing is left in /tmp.
    let out = local_json(&c, &ckpt, &["--workers", "2", "--steps", "100"]);
    assert!(
        out.status.success(),
        "dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = sole_json(&out);
    assert_eq!(first["outcome"], "trained", "{first}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("test accuracy"),
        "with --json the summary goes to stderr"
    );
    for key in [
        "global_step",
        "test_accuracy",
        "ema_test_accuracy",
        "steps_per_sec",
    ] {
        assert!(first.get(key).is_some(), "{key} missing from {first}");
    }
    assert_eq!(first["global_step"], 100, "{first}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let announced = stderr
        .lines()
        .find_map(|l| l.rsplit_once("; run directory "))
        .map(|(_, d)| std::path::PathBuf::from(d.trim()))
        .unwrap_or_else(|| panic!("no run directory announced:\n{stderr}"));
    assert!(first["run_dir"].is_null(), "{first}");
    assert!(
        !announced.exists(),
        "{} was left behind",
        announced.display()
    );
    assert!(ckpt.join("model.ckpt-100.safetensors").is_file());

    // A second run on the same directory continues where the first stopped.
    let out = run("200");
    assert!(
        out.status.success(),
        "second dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = sole_json(&out);
    assert_eq!(second["global_step"], 200, "{second}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = format!("resumed from step 100 (checkpoint {ckpt_s}/model.ckpt-100.safetensors)");
    assert!(
        stderr.contains(&said),
        "the console should say {said:?}:\n{stderr}"
    );
    let run_dir = second["run_dir"].as_str().unwrap();
    let chief = std::fs::read_to_string(format!("{run_dir}/logs/worker-0.log")).unwrap();
    assert!(
        chief.contains("Restored the model"),
        "the chief should restore; its log:\n{chief}"
    );

    // dtf eval agrees with an independent safetensors + numpy implementation.
    let data = c.cfg.data.dir.to_str().unwrap();
    let out = dtf_output(&["eval", ckpt_s, "--data", data, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = sole_json(&out);
    assert_eq!(ours["global_step"], second["global_step"]);
    let file = ours["checkpoint"].as_str().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/checkpoint_numpy.py");
    let out = output_within(
        Command::new("python3").args([script, file, data]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "numpy reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = last_json(&out);
    assert_eq!(theirs["global_step"], ours["global_step"]);
    for key in ["accuracy", "ema_accuracy"] {
        let (a, b) = (ours[key].as_f64().unwrap(), theirs[key].as_f64().unwrap());
        assert!((a - b).abs() < 1e-6, "{key}: dtf eval {a}, numpy {b}");
    }

    // dtf inspect shows what is inside.
    let out = dtf_output(&["inspect", ckpt_s]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "layer1/weights",
        "layer2/biases",
        "ExponentialMovingAverage",
        "global_step",
        "dtf-1",
    ] {
        assert!(
            text.contains(needle),
            "inspect output lacks {needle}:\n{text}"
        );
    }
    let out = dtf_output(&["inspect", ckpt_s, "--json"]);
    assert!(out.status.success());
    let json = sole_json(&out);
    assert_eq!(json["verified"], true, "{json}");
    assert_eq!(
        json["model"]["metadata"]["global_step"],
        second["global_step"].to_string().as_str(),
        "{json}"
    );
    let tensors = json["model"]["tensors"].as_array().unwrap();
    assert!(
        tensors
            .iter()
            .any(|t| t["name"] == "layer1/weights" && t["dtype"] == "F32"),
        "{json}"
    );
    let ema = json["ema"]["tensors"].as_array().unwrap();
    assert!(
        ema.iter()
            .any(|t| t["name"] == "layer1/weights/ExponentialMovingAverage"),
        "{json}"
    );
}

#[test]
fn local_run_with_a_failing_task_stops_and_names_it() {
    // Missing data is caught before anything starts (exit 2, tests/it/first_run.rs):
    // a task that fails while training is one that dies.
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let (mut run, run_dir, _) = training_local(&c, false);
    let worker = task_pid(&run_dir, "dtf-worker", 1);
    // SAFETY: a process of this test's dtf local, alive (just found).
    unsafe { libc::kill(worker, libc::SIGKILL) };
    let (status, _) = run.wait(Duration::from_secs(60));
    let err = run.stderr();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("worker:1 failed") && err.contains("worker-1.log"),
        "stderr should name the task and its log:\n{err}"
    );
    let left = processes_with(run_dir.join("dtf.toml").to_str().unwrap());
    assert!(left.is_empty(), "tasks outlived dtf local: {left:?}");
}

/// `--steps N` ends at exactly N, in both modes: no push is applied past
/// `last_step`, so two workers racing for the last step cannot overshoot it,
/// and the final checkpoint is `model.ckpt-N`.
#[test]
fn local_steps_end_exactly_at_last_step_in_both_modes() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let config = c.config_path.to_str().unwrap();
    for mode in ["async", "sync"] {
        let ckpt = c.dir.path().join(mode);
        let out = dtf_output(&[
            "local",
            "--config",
            config,
            "--workers",
            "2",
            "--mode",
            mode,
            "--steps",
            "2000",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--json",
        ]);
        assert!(
            out.status.success(),
            "dtf local --mode {mode} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = sole_json(&out);
        assert_eq!(report["global_step"], 2000, "{mode}: {report}");
        let steps = checkpoint_steps(&ckpt);
        assert_eq!(steps.last(), Some(&2000), "{mode}: checkpoints {steps:?}");
    }
}

#[test]
fn local_tasks_each_serve_metrics_on_their_own_port() {
    let mut c = Cluster::new(1, 2, 100, Mode::Async);
    // Three consecutive free ports, the first in the base config.
    let base = free_port_run(3);
    c.cfg.metrics.listen = format!("127.0.0.1:{base}");
    c.write_config();
    let config = c.config_path.to_str().unwrap();
    let out = dtf_output(&["local", "--config", config, "--steps", "100", "--json"]);
    assert!(
        out.status.success(),
        "dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run_dir = sole_json(&out)["run_dir"].as_str().unwrap().to_owned();
    for (k, log) in ["ps-0", "worker-0", "worker-1"].iter().enumerate() {
        let text = std::fs::read_to_string(format!("{run_dir}/logs/{log}.log")).unwrap();
        let port = base + k as u16;
        assert!(
            text.contains("Serving metrics") && text.contains(&format!("127.0.0.1:{port}")),
            "{log} should serve metrics on port {port}:\n{text}"
        );
        assert!(!text.contains("Cannot serve metrics"), "{log}:\n{text}");
        // A normal run warns of nothing: not the workers' shared-memory connections
        // closing as they exit (once read as "dropped"), nor a worker that asked for its
        // ps a moment before the ps listened (once a WARN at 0 s waited).
        assert!(
            !text.contains(" WARN "),
            "{log} warns on a normal finish:\n{text}"
        );
    }
}

/// A `dtf local` started in the background, its output collected as it comes.
struct Background {
    /// The `dtf local` process.
    child: std::process::Child,
    /// What it printed on stdout so far.
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    /// What it printed on stderr so far.
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Background {
    /// Starts `dtf ARGS` in a process group of its own, as a shell starts a
    /// foreground job: a signal to the group is then what Ctrl-C sends.
    fn start(args: &[&str]) -> Self {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(bin("dtf"))
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("TF_CONFIG")
            .env_remove("DTF_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let collect = |mut r: Box<dyn std::io::Read + Send>| {
            let buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let b = buf.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    b.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            });
            buf
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The run directory `dtf local` announces on stderr.
    fn run_dir(&self) -> std::path::PathBuf {
        until(
            Duration::from_secs(30),
            "dtf local to name its run directory",
            || {
                let err = self.stderr();
                let line = err.lines().find(|l| l.contains("run directory "))?;
                Some(line.rsplit_once("run directory ")?.1.trim().into())
            },
        )
    }

    /// Waits for it to exit (test failure past `deadline`); its status and stdout.
    fn wait(&mut self, deadline: Duration) -> (std::process::ExitStatus, String) {
        let status = until(deadline, "dtf local to exit", || {
            self.child.try_wait().unwrap()
        });
        // The readers finish once the pipes close, shortly after the exit.
        let out = until(Duration::from_secs(10), "dtf local's output to end", || {
            (std::sync::Arc::strong_count(&self.stdout) == 1
                && std::sync::Arc::strong_count(&self.stderr) == 1)
                .then(|| self.stdout.lock().unwrap().clone())
        });
        (status, out)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of the live processes whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

/// A long `dtf local` on the tiny data set whose only periodic checkpoint is
/// the initial one (save_secs is an hour), running until the chief has
/// trained a while: returns it, its run directory and its checkpoint dir.
fn training_local(c: &Cluster, json: bool) -> (Background, std::path::PathBuf, std::path::PathBuf) {
    let ckpt = c.dir.path().join("kept");
    let mut args = vec![
        "local",
        "--config",
        c.config_path.to_str().unwrap(),
        "--steps",
        "100000000",
        "--save-secs",
        "3600",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ];
    if json {
        args.push("--json");
    }
    let run = Background::start(&args);
    let run_dir = run.run_dir();
    let chief = run_dir.join("logs/worker-0.log");
    until(
        Duration::from_secs(60),
        "the chief to make progress",
        || {
            let log = std::fs::read_to_string(&chief).ok()?;
            log.contains("Progress.").then_some(())
        },
    );
    assert_eq!(
        processes_with(run_dir.join("dtf.toml").to_str().unwrap()).len(),
        3,
        "one ps and two workers run"
    );
    (run, run_dir, ckpt)
}

/// What a stop by `sig` must leave: the children gone, a final checkpoint
/// past the initial one, exit 128 + `sig`.
fn assert_stopped_cleanly(
    status: std::process::ExitStatus,
    run_dir: &std::path::Path,
    ckpt: &std::path::Path,
    sig: i32,
    stderr: &str,
) -> u64 {
    assert_eq!(status.code(), Some(128 + sig), "stderr:\n{stderr}");
    let left = processes_with(run_dir.join("dtf.toml").to_str().unwrap());
    assert!(left.is_empty(), "tasks outlived dtf local: {left:?}");
    let steps = checkpoint_steps(ckpt);
    let last = steps.last().copied().unwrap_or(0);
    assert!(
        last > 0 && steps.len() >= 2,
        "a final checkpoint past the initial one, found steps {steps:?}; chief's log:\n{}",
        std::fs::read_to_string(run_dir.join("logs/worker-0.log")).unwrap_or_default()
    );
    last
}

#[test]
fn ctrl_c_stops_local_with_a_final_checkpoint_and_says_how_to_resume() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let (mut run, run_dir, ckpt) = training_local(&c, false);
    // Ctrl-C: SIGINT to the whole foreground process group.
    // SAFETY: a process group this test created.
    unsafe { libc::kill(-(run.child.id() as i32), libc::SIGINT) };
    let (status, stdout) = run.wait(Duration::from_secs(90));
    let stderr = run.stderr();
    let step = assert_stopped_cleanly(status, &run_dir, &ckpt, libc::SIGINT, &stderr);
    assert!(
        stdout.contains(&format!("stopped by SIGINT at global step {step}")),
        "the summary names the step of the final checkpoint; stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let resume = stdout
        .lines()
        .find_map(|l| l.strip_prefix("resume: "))
        .unwrap_or_else(|| panic!("no resume line in:\n{stdout}"));
    assert!(
        resume.starts_with(&format!("{} local ", bin("dtf").display()))
            && resume.contains(&format!("--checkpoint-dir {}", ckpt.display()))
            && resume.contains("--steps 100000000"),
        "{resume}"
    );
}

#[test]
fn sigterm_stops_local_with_a_final_checkpoint() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let (mut run, run_dir, ckpt) = training_local(&c, true);
    // SAFETY: a pid this test spawned and has not reaped.
    unsafe { libc::kill(run.child.id() as i32, libc::SIGTERM) };
    let (status, stdout) = run.wait(Duration::from_secs(90));
    let stderr = run.stderr();
    let step = assert_stopped_cleanly(status, &run_dir, &ckpt, libc::SIGTERM, &stderr);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON value ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    assert!(
        stderr.contains("stopped by SIGTERM")
            && stderr.contains(&format!("resume: {} local", bin("dtf").display())),
        "with --json the summary goes to stderr:\n{stderr}"
    );
    assert_eq!(json["outcome"], "stopped", "{json}");
    assert_eq!(json["signal"], "SIGTERM", "{json}");
    assert_eq!(json["forced"], false, "{json}");
    assert_eq!(json["global_step"].as_u64(), Some(step), "{json}");
}

#[test]
fn local_tasks_die_with_a_killed_dtf_local() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let (mut run, run_dir, _) = training_local(&c, false);
    run.child.kill().unwrap();
    run.child.wait().unwrap();
    let config = run_dir.join("dtf.toml");
    until(Duration::from_secs(10), "every task to exit", || {
        processes_with(config.to_str().unwrap())
            .is_empty()
            .then_some(())
    });
}

/// The pid of `dtf local`'s task `bin` (`dtf-worker`) `index`, found by its command line.
fn task_pid(run_dir: &std::path::Path, bin: &str, index: usize) -> i32 {
    let config = run_dir.join("dtf.toml");
    let wanted = format!("/{bin}\0--config\0{}\0--task\0{index}\0", config.display());
    processes_with(config.to_str().unwrap())
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&wanted))
        })
        .unwrap_or_else(|| panic!("no {bin} {index} running"))
}

#[test]
fn a_second_ctrl_c_kills_every_local_task_at_once() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let (mut run, run_dir, _) = training_local(&c, true);
    // A worker that cannot act on SIGTERM keeps the graceful stop waiting
    // (up to 35 s); only the second signal can end it sooner.
    let frozen = task_pid(&run_dir, "dtf-worker", 1);
    // SAFETY: a process of this test's dtf local, alive (just found).
    unsafe { libc::kill(frozen, libc::SIGSTOP) };
    let group = -(run.child.id() as i32);
    // SAFETY: a process group this test created.
    unsafe { libc::kill(group, libc::SIGINT) };
    until(
        Duration::from_secs(10),
        "dtf local to begin its stop",
        || run.stderr().contains("stopping the workers").then_some(()),
    );
    // A signal within SAME_SIGNAL_WINDOW of the first is the same stop
    // (one Ctrl-C delivered twice): a person's second Ctrl-C comes later.
    std::thread::sleep(dtf::local::SAME_SIGNAL_WINDOW + Duration::from_millis(100));
    // SAFETY: as above.
    unsafe { libc::kill(group, libc::SIGINT) };
    let (status, stdout) = run.wait(Duration::from_secs(10));
    let stderr = run.stderr();
    assert_eq!(status.code(), Some(130), "stderr:\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{stdout}"));
    assert_eq!(json["forced"], true, "{json}");
    let left = processes_with(run_dir.join("dtf.toml").to_str().unwrap());
    assert!(left.is_empty(), "tasks outlived dtf local: {left:?}");
}

/// A resume whose model differs from its checkpoints' (another hidden
/// width) is refused before any task starts: both shapes named, nothing
/// left behind, and the checkpoints untouched.
#[test]
fn a_resume_with_another_model_is_refused_before_anything_starts() {
    let c = Cluster::new(1, 1, 30, Mode::Async);
    let ckpt = c.dir.path().join("kept");
    let run = |layers: &str| {
        local_json(
            &c,
            &ckpt,
            &["--workers", "1", "--steps", "30", "--set", layers],
        )
    };
    let trained = format!("model.layers=[{}, 16, {CLASSES}]", SIDE * SIDE);
    let out = run(&trained);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = checkpoint_steps(&ckpt);
    let other = format!("model.layers=[{}, 8, {CLASSES}]", SIDE * SIDE);
    let out = run(&other);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let shapes = format!(
        "shape [{}, 16], the model expects [{}, 8]",
        SIDE * SIDE,
        SIDE * SIDE
    );
    assert!(
        stderr.contains(&shapes),
        "both shapes should be named:\n{stderr}"
    );
    assert!(
        !stderr.contains("failed ("),
        "refused before any task started, not by a failing task:\n{stderr}"
    );
    let run_dir = stderr
        .split("run directory ")
        .nth(1)
        .and_then(|r| r.lines().next())
        .expect("the run directory is named");
    assert!(
        !std::path::Path::new(run_dir).exists(),
        "nothing ran, so nothing is kept: {run_dir}"
    );
    assert_eq!(checkpoint_steps(&ckpt), before);
}

/// `dtf inspect … | head`: output to a pipe whose reader has gone ends the
/// tools by SIGPIPE, as it ends `cat`, and never with a panic.
#[test]
fn a_closed_output_pipe_ends_the_tools_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let c = Cluster::new(1, 1, 30, Mode::Async);
    let file = write_checkpoint(&c.cfg, 7);
    let (file, data) = (file.to_str().unwrap(), c.cfg.data.dir.to_str().unwrap());
    for args in [
        vec!["inspect", file],
        vec!["inspect", file, "--json"],
        vec!["eval", file, "--data", data],
    ] {
        // No reader from the start: the first write fails, whatever the timing.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child = Command::new(bin("dtf"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = until(Duration::from_secs(60), "dtf to exit", || {
            child.try_wait().unwrap()
        });
        assert_eq!(
            status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {status:?}\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}:\n{stderr}");
    }
}

/// `check-config` (dtf's and a worker's) says what a run would resume from, and refuses a
/// model other than its checkpoints' — another hidden width — naming both shapes, before
/// anything starts (the chief would only fail on them once the cluster is up).
#[test]
fn check_config_names_the_resume_and_refuses_another_model() {
    let mut c = Cluster::new(1, 1, 60, Mode::Async);
    let ckpt = c.dir.path().join("kept");
    let out = local_json(&c, &ckpt, &["--workers", "1", "--steps", "60"]);
    assert!(
        out.status.success(),
        "dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.cfg.checkpoint.dir = ckpt.clone();
    c.write_config();
    let config = c.config_path.to_str().unwrap().to_owned();
    let config = config.as_str();
    let check = |program: &str| {
        let mut args = vec!["--config", config, "check-config"];
        if program == "dtf-worker" {
            args.extend(["--task", "0"]);
        }
        Command::new(bin(program))
            .args(if program == "dtf" {
                vec!["check-config", "--config", config]
            } else {
                args
            })
            .output()
            .unwrap()
    };
    let resumes = "resumes from step 60 (checkpoint ";
    for program in ["dtf", "dtf-worker"] {
        let out = check(program);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(resumes),
            "{program} check-config: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut layers = c.cfg.model.layers.clone();
    let trained = layers[1];
    layers[1] = trained * 2;
    c.cfg.model.layers = layers.clone();
    c.write_config();
    for program in ["dtf", "dtf-worker"] {
        let out = check(program);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{program}: {stderr}");
        let (old, new) = (
            format!("[{}, {trained}]", layers[0]),
            format!("[{}, {}]", layers[0], layers[1]),
        );
        assert!(
            stderr.contains(&old) && stderr.contains(&new),
            "{program} should name {old} and {new}:\n{stderr}"
        );
    }
    // The shapes fit, the activation does not: the weights were trained in ReLU.
    layers[1] = trained;
    c.cfg.model.layers = layers;
    c.cfg.model.activation = dtf::model::Activation::Tanh;
    c.write_config();
    let said = "trained with activation \"relu\", but this run's model.activation is \"tanh\"";
    for program in ["dtf", "dtf-worker"] {
        let out = check(program);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{program}: {stderr}");
        assert!(stderr.contains(said), "{program}: {stderr}");
    }
    // And dtf local refuses that resume before anything starts.
    let out = local_json(
        &c,
        &ckpt,
        &["--workers", "1", "--steps", "80", "--activation", "tanh"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(said), "{stderr}");
    assert!(!ckpt.join("model.ckpt-80.safetensors").exists());
}
