//! `dtf local`, `dtf eval` and `dtf inspect` as a user runs them.

use crate::util::*;
use dtf::config::Mode;
use std::process::Command;
use std::time::Duration;

/// `dtf ARGS` to completion (a test failure past 180 s), as [`run`] runs it.
fn dtf(args: &[&str]) -> std::process::Output {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let ran = run("dtf", &args, &[], std::time::Duration::from_secs(180));
    std::process::Output {
        status: ran.status,
        stdout: ran.stdout.into_bytes(),
        stderr: ran.stderr.into_bytes(),
    }
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

#[test]
fn local_run_resumes_from_its_checkpoints_and_eval_matches_numpy() {
    // The tiny data set and model, through a base config.
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let ckpt = c.dir.path().join("kept");
    let (config, ckpt_s) = (c.config_path.to_str().unwrap(), ckpt.to_str().unwrap());
    let run = |steps: &str| {
        dtf(&[
            "local",
            "--config",
            config,
            "--ps",
            "1",
            "--workers",
            "2",
            "--steps",
            steps,
            "--checkpoint-dir",
            ckpt_s,
            "--json",
        ])
    };

    let out = run("100");
    assert!(
        out.status.success(),
        "dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = last_json(&out);
    for key in [
        "global_step",
        "test_accuracy",
        "ema_test_accuracy",
        "steps_per_sec",
    ] {
        assert!(first.get(key).is_some(), "{key} missing from {first}");
    }
    assert!(
        (100..=101).contains(&first["global_step"].as_u64().unwrap()),
        "{first}"
    );

    // A second run on the same directory continues where the first stopped.
    let out = run("200");
    assert!(
        out.status.success(),
        "second dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = last_json(&out);
    assert!(
        (200..=201).contains(&second["global_step"].as_u64().unwrap()),
        "{second}"
    );
    let run_dir = second["run_dir"].as_str().unwrap();
    let chief = std::fs::read_to_string(format!("{run_dir}/logs/worker-0.log")).unwrap();
    assert!(
        chief.contains("Restored the model"),
        "the chief should restore; its log:\n{chief}"
    );

    // dtf eval agrees with an independent safetensors + numpy implementation.
    let data = c.cfg.data.dir.to_str().unwrap();
    let out = dtf(&["eval", ckpt_s, "--data", data, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = last_json(&out);
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
    let out = dtf(&["inspect", ckpt_s]);
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
}

#[test]
fn local_run_with_a_failing_task_stops_and_names_it() {
    let mut c = Cluster::new(1, 2, 100, Mode::Async);
    c.cfg.data.dir = c.dir.path().join("no-such-data");
    c.write_config();
    let out = dtf(&[
        "local",
        "--config",
        c.config_path.to_str().unwrap(),
        "--steps",
        "50",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("worker:") && err.contains("no-such-data"),
        "stderr should name the task and the cause:\n{err}"
    );
}

#[test]
fn local_tasks_each_serve_metrics_on_their_own_port() {
    let mut c = Cluster::new(1, 2, 100, Mode::Async);
    // Three consecutive free ports, the first in the base config.
    let base = loop {
        let p: u16 = free_addrs(1)[0]
            .rsplit_once(':')
            .unwrap()
            .1
            .parse()
            .unwrap();
        if p < u16::MAX - 2
            && (1..3).all(|k| std::net::TcpListener::bind(("127.0.0.1", p + k)).is_ok())
        {
            break p;
        }
    };
    c.cfg.metrics.listen = format!("127.0.0.1:{base}");
    c.write_config();
    let config = c.config_path.to_str().unwrap();
    let out = dtf(&["local", "--config", config, "--steps", "100", "--json"]);
    assert!(
        out.status.success(),
        "dtf local failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run_dir = last_json(&out)["run_dir"].as_str().unwrap().to_owned();
    for (k, log) in ["ps-0", "worker-0", "worker-1"].iter().enumerate() {
        let text = std::fs::read_to_string(format!("{run_dir}/logs/{log}.log")).unwrap();
        let port = base + k as u16;
        assert!(
            text.contains("Serving metrics") && text.contains(&format!("127.0.0.1:{port}")),
            "{log} should serve metrics on port {port}:\n{text}"
        );
        assert!(!text.contains("Cannot serve metrics"), "{log}:\n{text}");
    }
}
