//! What an operator watches a run with: the chief's TensorBoard events file
//! (read back by TensorBoard's own Python code), every daemon's `/metrics`,
//! and `dtf status`.

use crate::util::*;
use dtf::config::Mode;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

fn events_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    files.sort();
    files
}

/// `tests/read_events.py FILE`'s JSON. Fails (does not skip) without the
/// `tensorboard` Python package: CI installs it.
fn read_events(path: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/read_events.py");
    let out = output_within(
        std::process::Command::new("python3").arg(script).arg(path),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "tests/read_events.py failed (needs `python3 -m pip install tensorboard`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("read_events.py prints JSON")
}

#[test]
fn chief_summaries_are_read_back_by_tensorboard() {
    let mut c = Cluster::new(1, 2, 100, Mode::Sync);
    c.cfg.train.save_summaries_steps = 20;
    c.write_config();
    c.start_all();
    c.wait_all_success(RUN);

    let files = events_files(&c.cfg.checkpoint.dir);
    assert_eq!(
        files.len(),
        1,
        "one events file, from the chief only: {files:?}"
    );
    let name = files[0].file_name().unwrap().to_str().unwrap().to_owned();
    let secs: u64 = name
        .trim_start_matches("events.out.tfevents.")
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(secs > 1_600_000_000, "unix seconds in {name}");

    let read = read_events(&files[0]);
    assert_eq!(read["file_version"], "brain.Event:2");
    let events = read["events"].as_array().unwrap();
    let with = |tag: &str| -> Vec<(u64, &serde_json::Map<String, Value>)> {
        events
            .iter()
            .filter(|e| e["scalars"].get(tag).is_some())
            .map(|e| {
                (
                    e["step"].as_u64().unwrap(),
                    e["scalars"].as_object().unwrap(),
                )
            })
            .collect()
    };

    // Sync mode: the chief computes at every step, so summaries fall on the multiples.
    let train = with("loss");
    let steps: Vec<u64> = train.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        vec![0, 20, 40, 60, 80],
        "loss summaries every train.save_summaries_steps"
    );
    // decay_steps = 2000 training examples / batch 20.
    let decay_steps = 2000.0 / 20.0;
    for (step, s) in &train {
        let loss = s["loss"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0, "loss {loss} at step {step}");
        let want = 0.1 * 0.99f64.powf(*step as f64 / decay_steps);
        let lr = s["learning_rate"].as_f64().unwrap();
        assert!(
            (lr - want).abs() <= 1e-6 * want,
            "learning_rate {lr} at step {step}, schedule says {want}"
        );
        if *step > 0 {
            let rate = s["global_step/sec"].as_f64().unwrap();
            assert!(
                rate.is_finite() && rate > 0.0,
                "global_step/sec {rate} at step {step}"
            );
        }
    }
    assert!(
        train[4].1["loss"].as_f64().unwrap() < train[0].1["loss"].as_f64().unwrap(),
        "the loss falls on a learnable problem"
    );

    let eval = with("accuracy");
    assert_eq!(eval.len(), 1, "one evaluation, at the end");
    assert_eq!(eval[0].0, 100);
    let ev = dtf::eval::evaluate(&c.cfg.checkpoint.dir, &c.cfg.data.dir).unwrap();
    assert_eq!(ev.global_step, 100);
    let (acc, ema) = (
        eval[0].1["accuracy"].as_f64().unwrap(),
        eval[0].1["ema_accuracy"].as_f64().unwrap(),
    );
    assert!(
        (acc - f64::from(ev.accuracy)).abs() < 1e-6,
        "summary accuracy {acc} vs dtf eval {}",
        ev.accuracy
    );
    assert!(
        (ema - f64::from(ev.ema_accuracy)).abs() < 1e-6,
        "summary ema_accuracy {ema} vs dtf eval {}",
        ev.ema_accuracy
    );
}

/// The samples of a Prometheus/OpenMetrics text, checking every line's syntax:
/// `# ...` comments, or `name{labels} value`.
fn parse_metrics(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let name = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                for pair in labels.split(',') {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad label in {line:?}"));
                    assert!(
                        !k.is_empty() && v.starts_with('"') && v.ends_with('"') && v.len() >= 2,
                        "bad label {pair:?} in {line:?}"
                    );
                }
                name
            }
            None => series,
        };
        assert!(
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        samples.push((series.to_owned(), value));
    }
    samples
}

fn sample(samples: &[(String, f64)], series: &str) -> Option<f64> {
    samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v)
}

fn scrape(addr: &str) -> Option<Vec<(String, f64)>> {
    http_get(addr, "/metrics").map(|t| parse_metrics(&t))
}

#[test]
fn every_task_serves_metrics_on_its_own_address_and_global_step_increases() {
    let mut c = Cluster::new(1, 2, 1_000_000, Mode::Async);
    let addrs = free_addrs(3);
    // One config for the cluster; each process gets its own address from the environment.
    c.start_env("ps", 0, &[("DTF_METRICS__LISTEN", &addrs[0])]);
    c.start_env("worker", 0, &[("DTF_METRICS__LISTEN", &addrs[1])]);
    c.start_env("worker", 1, &[("DTF_METRICS__LISTEN", &addrs[2])]);

    let step_of = |addr: &str| scrape(addr).and_then(|s| sample(&s, "dtf_global_step"));
    let first = until(RUN, "the ps to report a global step", || {
        step_of(&addrs[0]).filter(|&s| s > 0.0)
    });
    until(RUN, "the ps's dtf_global_step to increase", || {
        step_of(&addrs[0]).filter(|&s| s > first)
    });

    let ps = scrape(&addrs[0]).unwrap();
    assert_eq!(sample(&ps, "dtf_up{role=\"ps\",task=\"0\"}"), Some(1.0));
    assert_eq!(sample(&ps, "dtf_initialized"), Some(1.0));
    assert!(sample(&ps, "dtf_steps_total").unwrap() > 0.0);
    assert_eq!(
        sample(&ps, "dtf_stale_gradients_total"),
        Some(0.0),
        "async mode drops nothing"
    );

    // The chief: training, push latency, traffic and its checkpoints.
    // Its first step too: the first checkpoint (step 0's, at the start)
    // may come before it, the other worker's steps moving the ps.
    let chief = until(
        RUN,
        "the chief's first checkpoint and step in its metrics",
        || {
            scrape(&addrs[1]).filter(|s| {
                sample(s, "dtf_checkpoint_duration_seconds").is_some_and(|d| d > 0.0)
                    && sample(s, "dtf_steps_total").is_some_and(|n| n > 0.0)
            })
        },
    );
    assert_eq!(
        sample(&chief, "dtf_up{role=\"worker\",task=\"0\"}"),
        Some(1.0)
    );
    let steps = sample(&chief, "dtf_steps_total").unwrap();
    assert!(steps > 0.0);
    assert!(sample(&chief, "dtf_examples_total").unwrap() >= steps * 20.0 - 20.0);
    assert!(sample(&chief, "dtf_push_seconds_count").unwrap() > 0.0);
    // Every worker pulls the variables before its first step.
    assert!(sample(&chief, "dtf_pull_seconds_count").unwrap() > 0.0);
    assert!(sample(&chief, "dtf_sent_bytes_total").unwrap() > 0.0);
    assert!(sample(&chief, "dtf_received_bytes_total").unwrap() > 0.0);
    assert!(sample(&chief, "dtf_loss").unwrap().is_finite());
    assert_eq!(
        sample(&chief, "dtf_checkpoint_failures_total"),
        Some(0.0),
        "a healthy run loses no checkpoint"
    );
    let age = sample(&chief, "dtf_checkpoint_age_seconds").unwrap();
    assert!(
        (0.0..60.0).contains(&age),
        "checkpoint age {age} s with checkpoint.save_secs = 1"
    );

    let worker = scrape(&addrs[2]).unwrap();
    assert_eq!(
        sample(&worker, "dtf_up{role=\"worker\",task=\"1\"}"),
        Some(1.0)
    );
    let w1 = sample(&worker, "dtf_global_step").unwrap();
    until(RUN, "worker 1's dtf_global_step to increase", || {
        step_of(&addrs[2]).filter(|&s| s > w1)
    });
    assert!(
        !worker.iter().any(|(s, _)| s.starts_with("dtf_checkpoint")),
        "only the chief checkpoints"
    );
}

#[test]
fn metrics_are_off_without_metrics_listen() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.start_all();
    until(RUN, "the chief to train", || {
        c.log("worker:0").contains("Training.").then_some(())
    });
    assert!(
        !c.log("ps:0").contains("Serving metrics")
            && !c.log("worker:0").contains("Serving metrics")
    );
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dtf status --json: {e}; stdout:\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn status_lists_every_task_and_fails_when_a_ps_is_down() {
    let mut c = Cluster::new(2, 2, 1_000_000, Mode::Async);
    for (role, i) in [("ps", 0), ("ps", 1), ("worker", 0)] {
        c.start(role, i);
    }
    // Workers are known from their pushes: worker 1 has not started.
    let json = until(RUN, "dtf status to show the chief training", || {
        let j = json_of(&c.dtf(&["status", "--json"]));
        (j["tasks"][2]["contact"] == "live").then_some(j)
    });
    assert_eq!(json["tasks"][3]["contact"], "never seen", "{json}");
    assert_eq!(json["tasks"][3]["global_step"], Value::Null, "{json}");
    c.start("worker", 1);
    // Wait until both shards are initialized and training has moved.
    let json = until(RUN, "dtf status to show a training cluster", || {
        let out = c.dtf(&["status", "--json"]);
        let j = json_of(&out);
        let ready = out.status.success()
            && j["tasks"][0]["initialized"] == true
            && j["tasks"][1]["initialized"] == true
            && j["global_step"].as_u64().is_some_and(|s| s > 0)
            && j["tasks"][3]["contact"] == "live"
            && j["checkpoint"].is_object();
        ready.then_some(j)
    });
    let tasks = json["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    let roles: Vec<&str> = tasks.iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["ps", "ps", "chief", "worker"]);
    for (t, addr) in tasks
        .iter()
        .zip(c.cfg.cluster.ps.iter().chain(&c.cfg.cluster.worker))
    {
        assert_eq!(t["address"], addr.as_str());
    }
    assert_eq!(tasks[0]["reachable"], true);
    // A string: a 64-bit id would lose bits as a JSON number read into a double.
    let incarnation = tasks[0]["incarnation"].as_str().unwrap_or_default();
    assert!(
        incarnation.parse::<u64>().is_ok(),
        "incarnation {:?} is not a decimal string",
        tasks[0]["incarnation"]
    );
    assert_eq!(
        tasks[2]["reachable"],
        Value::Null,
        "workers do not listen: unknown, not guessed"
    );
    for w in &tasks[2..] {
        assert!(w["global_step"].as_u64().is_some_and(|s| s > 0), "{w}");
        assert!(
            w["examples_per_sec"].as_f64().is_some_and(|r| r > 0.0),
            "{w}"
        );
        assert!(w["last_contact_secs"].as_f64().is_some(), "{w}");
    }
    assert_eq!(json["complete"], false);
    assert_eq!(json["all_ps_reachable"], true);
    assert!(json["checkpoint"]["age_secs"].as_f64().is_some());

    let out = c.dtf(&["status"]);
    assert!(
        out.status.success(),
        "dtf status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "ps:0",
        "ps:1",
        "worker:0",
        "worker:1",
        "chief",
        &c.cfg.cluster.ps[0],
        &c.cfg.cluster.ps[1],
        "checkpoint",
        "live (",
    ] {
        assert!(table.contains(needle), "{needle} missing from:\n{table}");
    }

    // A worker that stopped pushing goes stale; the cluster is still up.
    c.kill("worker:1");
    let out = until(RUN, "dtf status to show worker 1 stale", || {
        let out = c.dtf(&["status", "--json"]);
        (json_of(&out)["tasks"][3]["contact"] == "stale").then_some(out)
    });
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_of(&out)["tasks"][2]["contact"], "live");
    let table = String::from_utf8(c.dtf(&["status"]).stdout).unwrap();
    assert!(table.contains("stale ("), "{table}");

    c.kill("ps:1");
    let out = c.dtf(&["status", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a ps is down: dtf status exits 1"
    );
    let j = json_of(&out);
    assert_eq!(j["tasks"][1]["reachable"], false);
    assert_eq!(j["tasks"][0]["reachable"], true);
    assert_eq!(j["all_ps_reachable"], false);
    let out = c.dtf(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ps:1"),
        "the table names the unreachable ps"
    );
}

/// Without a readable config, one line that says what to do, naming the
/// file once and the reason once.
#[test]
fn status_without_a_config_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("dtf.toml");
    let ran = run(
        "dtf",
        &["status".as_ref(), "--config".as_ref(), missing.as_os_str()],
        &[],
        Duration::from_secs(30),
    );
    assert_eq!(ran.status.code(), Some(1), "{}", ran.stderr);
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", ran.stderr);
    let line = lines[0];
    assert!(
        line.contains(&missing.display().to_string()) && line.contains("--config"),
        "{line}"
    );
    assert_eq!(line.matches("No such file").count(), 1, "{line}");
}
