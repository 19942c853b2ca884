//! The daemons as systemd sees them: sd_notify readiness, status, watchdog,
//! reload (SIGHUP and file edits, valid and not), and stopping.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use std::ffi::OsStr;
use std::time::Duration;

const SOON: Duration = Duration::from_secs(10);

fn has(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

fn has_prefix(msg: &str, prefix: &str) -> bool {
    msg.lines().any(|l| l.starts_with(prefix))
}

/// Asserts `msg` is `RELOADING=1` with a current `MONOTONIC_USEC=`, and the
/// next notification is `READY=1`.
fn expect_reload(n: &NotifySocket, before_usec: u64, what: &str) {
    let msg = n.next(SOON, what);
    assert!(
        has(&msg, "RELOADING=1"),
        "{what}: expected RELOADING=1, got {msg:?}"
    );
    let usec: u64 = msg
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("{what}: RELOADING=1 without MONOTONIC_USEC=: {msg:?}"))
        .parse()
        .unwrap();
    assert!(
        (before_usec..=monotonic_usec()).contains(&usec),
        "{what}: MONOTONIC_USEC={usec} is not between the change and now"
    );
    let msg = n.next(SOON, what);
    assert!(
        has(&msg, "READY=1"),
        "{what}: expected READY=1 after RELOADING=1, got {msg:?}"
    );
}

/// The ps still answers, with the token.
async fn ps_answers(c: &Cluster) {
    let s = c
        .client(0, Some(TOKEN))
        .await
        .state(pb::StateRequest {})
        .await;
    assert!(s.is_ok(), "ps does not answer State: {s:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ps_notifies_ready_reloading_and_stopping() {
    let mut c = Cluster::new(1, 1, 1000, Mode::Async);
    let n = NotifySocket::bind(c.dir.path());
    c.start_with_env("ps", 0, &[("NOTIFY_SOCKET", n.path.as_os_str())]);

    // Start: READY=1, with a STATUS= line in it or right after.
    let msg = n.next(SOON, "READY=1 at start");
    assert!(
        has(&msg, "READY=1"),
        "the first notification is not READY=1: {msg:?}"
    );
    if !has_prefix(&msg, "STATUS=") {
        let status = n.next(SOON, "STATUS= after READY=1");
        assert!(
            has_prefix(&status, "STATUS="),
            "no STATUS= after READY=1: {status:?}"
        );
    }
    ps_answers(&c).await;

    // SIGHUP: RELOADING=1 + MONOTONIC_USEC=, then READY=1.
    let t = monotonic_usec();
    c.signal("ps:0", libc::SIGHUP);
    expect_reload(&n, t, "SIGHUP");

    // An editor's save (temp file + rename) of a reloadable key.
    let t = monotonic_usec();
    c.cfg.train.last_step = 2000;
    c.write_config_by_rename();
    expect_reload(&n, t, "config replaced by rename");
    let log = c.wait_log("ps:0", "Configuration reloaded.", 1, SOON);
    assert!(
        log.contains("train.last_step: 1000 → 2000"),
        "the reload names the changed key, its old and new value:\n{log}"
    );
    assert_eq!(
        log.matches("Configuration reloaded.").count(),
        1,
        "a SIGHUP that changed nothing is not an INFO line:\n{log}"
    );

    // An in-place write.
    let t = monotonic_usec();
    c.cfg.log.level = "debug".into();
    c.write_config();
    expect_reload(&n, t, "config written in place");
    c.wait_log("ps:0", "Configuration reloaded.", 2, SOON);

    // Invalid edits: logged, no RELOADING=1, the ps keeps serving. The
    // datagram would be sent before the error is logged, so once the log
    // says so, an empty socket proves none was sent.
    std::fs::write(&c.config_path, "[train\nlast_step = 5\n").unwrap();
    let log = c.wait_log("ps:0", "Reload rejected", 1, SOON);
    assert!(
        log.contains(&c.config_path.display().to_string()),
        "the error names the file:\n{log}"
    );
    assert_eq!(
        n.drain(),
        Vec::<String>::new(),
        "an invalid file must not send RELOADING=1"
    );
    ps_answers(&c).await;

    let mut moved = c.cfg.clone();
    moved.train.batch_size += 1;
    std::fs::write(&c.config_path, moved.to_toml()).unwrap();
    let log = c.wait_log("ps:0", "Reload rejected", 2, SOON);
    assert!(
        log.contains("train.batch_size cannot change while running"),
        "the error names the key:\n{log}"
    );
    assert_eq!(
        n.drain(),
        Vec::<String>::new(),
        "a non-reloadable change must not send RELOADING=1"
    );
    c.signal("ps:0", libc::SIGHUP);
    c.wait_log("ps:0", "Reload rejected", 3, SOON);
    assert_eq!(
        n.drain(),
        Vec::<String>::new(),
        "SIGHUP on a rejected file must not send RELOADING=1"
    );
    ps_answers(&c).await;

    // The rejected files left the running configuration as it was: a
    // reload of it with one key changed names that key alone.
    let reloads = c.log("ps:0").matches("Configuration reloaded.").count();
    let t = monotonic_usec();
    c.cfg.log.level = "info".into();
    c.write_config_by_rename();
    expect_reload(&n, t, "the running config with log.level changed");
    let log = c.wait_log("ps:0", "Configuration reloaded.", reloads + 1, SOON);
    let last = log
        .lines()
        .rfind(|l| l.contains("Configuration reloaded."))
        .unwrap_or_default();
    assert!(
        last.contains(r#"changed=log.level: "debug" → "info""#),
        "each change shows its old and new value: {last}"
    );

    // SIGTERM: STOPPING=1 (once), exit 0.
    c.signal("ps:0", libc::SIGTERM);
    let msg = n.next(SOON, "STOPPING=1");
    assert!(has(&msg, "STOPPING=1"), "expected STOPPING=1, got {msg:?}");
    let status = tokio::task::block_in_place(|| c.wait("ps:0", SOON));
    assert!(
        status.success(),
        "ps exited with {status}; log:\n{}",
        c.log("ps:0")
    );
    let rest: Vec<String> = n
        .drain()
        .into_iter()
        .filter(|m| m.trim() != "WATCHDOG=1")
        .collect();
    assert_eq!(rest, Vec::<String>::new(), "nothing after STOPPING=1");
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_is_ready_only_when_training_and_reports_steps() {
    let mut c = Cluster::new(1, 1, 200, Mode::Async);
    let n = NotifySocket::bind(c.dir.path());
    c.start_with_env("worker", 0, &[("NOTIFY_SOCKET", n.path.as_os_str())]);

    // No ps yet: the worker waits, and is not ready — not even after a reload.
    let waiting = c.wait_log("worker:0", "Waiting for the ps tasks", 1, SOON);
    // The reason in one line for people: which ps, what failed; no dumps.
    let line = waiting
        .lines()
        .find(|l| l.contains("Waiting for the ps tasks"))
        .unwrap_or_default();
    assert!(
        line.contains("ps:0: unavailable") && line.contains("refused"),
        "{line}"
    );
    for dump in ["metadata", "Status {", "ConnectError", "Error("] {
        assert!(!line.contains(dump), "{dump} in {line}");
    }
    // A reload that changes something (one that changes nothing logs only
    // at DEBUG).
    // One reload, by the file watcher (a SIGHUP as well would make a second,
    // which could land after READY=1).
    c.cfg.train.save_summaries_steps = 50;
    c.write_config_by_rename();
    c.wait_log("worker:0", "Configuration reloaded.", 1, SOON);
    let early = n.drain();
    assert!(
        !early.iter().any(|m| has(m, "READY=1")),
        "READY=1 before the worker trains: {early:?}"
    );

    c.start("ps", 0);
    let msg = n.next(Duration::from_secs(30), "READY=1 once training");
    assert!(has(&msg, "READY=1"), "expected READY=1, got {msg:?}");
    let log = c.log("worker:0");
    assert!(
        log.contains("Initialized the model"),
        "READY=1 before the chief initialized the model:\n{log}"
    );

    // STATUS= lines with the step, then the end of the run.
    let mut statuses = Vec::new();
    let stopping = loop {
        let msg = n.next(Duration::from_secs(60), "STATUS= lines, then STOPPING=1");
        if has(&msg, "STOPPING=1") {
            break msg;
        }
        assert!(
            !has(&msg, "READY=1"),
            "a second READY=1 without a reload: {msg:?}"
        );
        statuses.extend(
            msg.lines()
                .filter_map(|l| l.strip_prefix("STATUS="))
                .map(str::to_owned),
        );
    };
    assert!(
        statuses.iter().any(|s| s.contains("step")),
        "no STATUS= with the step: {statuses:?} then {stopping:?}"
    );
    let status = tokio::task::block_in_place(|| c.wait("worker:0", Duration::from_secs(60)));
    assert!(
        status.success(),
        "worker exited with {status}; log:\n{}",
        c.log("worker:0")
    );
}

#[test]
fn watchdog_pings_at_half_the_interval() {
    let mut c = Cluster::new(1, 1, 1000, Mode::Async);
    let n = NotifySocket::bind(c.dir.path());
    c.start_with_env(
        "ps",
        0,
        &[
            ("NOTIFY_SOCKET", n.path.as_os_str()),
            ("WATCHDOG_USEC", OsStr::new("400000")),
        ],
    );
    let watchdog = |msg: &str| msg.lines().filter(|l| *l == "WATCHDOG=1").count();
    // From the first ping, count the pings of the next 2 s: every 200 ms
    // that is 10; at the full 400 ms interval it would be 5. (tokio's
    // interval catches up on late ticks, so a loaded machine delays pings
    // but does not drop them.)
    while watchdog(
        &n.recv(Duration::from_secs(5))
            .expect("no WATCHDOG=1 within 5 s"),
    ) == 0
    {}
    let start = std::time::Instant::now();
    let mut pings = 0;
    while let Some(left) = Duration::from_secs(2).checked_sub(start.elapsed()) {
        match n.recv(left) {
            Some(msg) => pings += watchdog(&msg),
            None => break,
        }
    }
    assert!(pings >= 8, "{pings} pings in 2 s with WATCHDOG_USEC=400000");

    // A watchdog meant for another process (WATCHDOG_PID) is not ours.
    let mut c = Cluster::new(1, 1, 1000, Mode::Async);
    let n = NotifySocket::bind(c.dir.path());
    c.start_with_env(
        "ps",
        0,
        &[
            ("NOTIFY_SOCKET", n.path.as_os_str()),
            ("WATCHDOG_USEC", OsStr::new("200000")),
            ("WATCHDOG_PID", OsStr::new("1")),
        ],
    );
    assert!(has(&n.next(SOON, "READY=1"), "READY=1"));
    // Three of its 100 ms periods: no ping in any of them.
    let start = std::time::Instant::now();
    while let Some(left) = Duration::from_millis(600).checked_sub(start.elapsed()) {
        if let Some(msg) = n.recv(left) {
            assert!(
                !has(&msg, "WATCHDOG=1"),
                "pings for another pid's watchdog: {msg:?}"
            );
        }
    }
}

#[test]
fn sigterm_mid_run_finishes_the_step_and_the_chief_checkpoints() {
    let mut c = Cluster::new(1, 2, 1_000_000, Mode::Async);
    // Only the start and the stop write checkpoints.
    c.cfg.checkpoint.save_secs = Some(3600);
    c.write_config();
    c.start_all();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut ps = rt.block_on(c.client(0, Some(TOKEN)));
    rt.block_on(eventually(
        Duration::from_secs(60),
        "50 global steps",
        || {
            let mut ps = ps.clone();
            async move {
                (ps.state(pb::StateRequest {})
                    .await
                    .ok()?
                    .into_inner()
                    .global_step
                    >= 50)
                    .then_some(())
            }
        },
    ));
    // The initial checkpoint is written off the training path: under load it
    // may land after step 50.
    let before = until(SOON, "the initial checkpoint", || {
        let steps = checkpoint_steps(&c.cfg.checkpoint.dir);
        (!steps.is_empty()).then_some(steps)
    });
    assert_eq!(before, vec![0], "only the initial checkpoint so far");

    c.signal("worker:1", libc::SIGTERM);
    let s = c.wait("worker:1", SOON);
    assert!(
        s.success(),
        "worker:1 exited with {s}; log:\n{}",
        c.log("worker:1")
    );
    assert!(
        c.log("worker:1").contains("Stopped"),
        "worker:1 says it stopped:\n{}",
        c.log("worker:1")
    );

    c.signal("worker:0", libc::SIGTERM);
    let s = c.wait("worker:0", SOON);
    assert!(
        s.success(),
        "the chief exited with {s}; log:\n{}",
        c.log("worker:0")
    );
    let step = rt
        .block_on(ps.state(pb::StateRequest {}))
        .unwrap()
        .into_inner()
        .global_step;
    let after = checkpoint_steps(&c.cfg.checkpoint.dir);
    let newest = *after.last().unwrap();
    assert!(
        newest >= 50 && newest <= step,
        "the chief's final checkpoint is at step {newest} (ps at {step}): {after:?}"
    );
    // The ps is not complete: the run was stopped, not finished.
    assert!(
        !rt.block_on(ps.state(pb::StateRequest {}))
            .unwrap()
            .into_inner()
            .complete
    );

    c.signal("ps:0", libc::SIGTERM);
    let s = c.wait("ps:0", SOON);
    assert!(s.success(), "ps exited with {s}; log:\n{}", c.log("ps:0"));
}

#[test]
fn sigterm_stops_a_worker_waiting_for_absent_ps_promptly() {
    for index in [0, 1] {
        let mut c = Cluster::new(1, 2, 1000, Mode::Async);
        let name = format!("worker:{index}");
        c.start("worker", index);
        c.wait_log(&name, "Waiting for the ps tasks", 1, SOON);
        c.signal(&name, libc::SIGTERM);
        let s = c.wait(&name, Duration::from_secs(3));
        assert!(
            s.success(),
            "{name} exited with {s}; log:\n{}",
            c.log(&name)
        );
    }
}

#[test]
fn a_second_sigterm_exits_a_stuck_stop_at_once() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.start_all();
    c.wait_log("worker:0", "Training.", 1, Duration::from_secs(30));
    // A hung ps (stopped, so its socket accepts but never answers) leaves the
    // chief's step in flight: the graceful stop waits for it.
    c.signal("ps:0", libc::SIGSTOP);
    c.signal("worker:0", libc::SIGTERM);
    c.wait_log(
        "worker:0",
        "Stopping gracefully",
        1,
        Duration::from_secs(10),
    );
    assert!(
        c.child("worker:0").try_wait().unwrap().is_none(),
        "the chief exited before its step finished; log:\n{}",
        c.log("worker:0")
    );
    let t = std::time::Instant::now();
    c.signal("worker:0", libc::SIGTERM);
    // At once: well inside the 30 s graceful drain, with room for a loaded machine.
    let s = c.wait("worker:0", Duration::from_secs(10));
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(
        s.code(),
        Some(1),
        "a forced exit loses the final checkpoint and must not claim success: {s}"
    );
    assert!(
        c.log("worker:0").contains("Second stop signal"),
        "{}",
        c.log("worker:0")
    );
}

/// `dtf-ROLE ARGS` to completion.
fn daemon(role: &str, args: &[&str]) -> Ran {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    run(&format!("dtf-{role}"), &args, &[], Duration::from_secs(30))
}

#[test]
fn daemons_take_tensorflow_job_name_and_task_index() {
    let c = Cluster::new(1, 2, 100, Mode::Async);
    let config = c.config_path.to_str().unwrap();
    for (role, index) in [("ps", "0"), ("worker", "1")] {
        let job = format!("--job_name={role}");
        let ran = daemon(
            role,
            &["-c", config, &job, "--task_index", index, "check-config"],
        );
        assert!(
            ran.status.success() && ran.stdout.contains(&format!("valid for {role}:{index}")),
            "dtf-{role} {job} --task_index {index}: {}\n{}",
            ran.status,
            ran.stderr
        );
    }
    // A job name that is not the daemon's role is a configuration error.
    let ran = daemon(
        "worker",
        &[
            "-c",
            config,
            "--job_name",
            "ps",
            "--task_index",
            "0",
            "check-config",
        ],
    );
    assert_eq!(ran.status.code(), Some(78), "stderr:\n{}", ran.stderr);
    assert!(
        ran.stderr.contains("--job_name ps") && ran.stderr.contains("use dtf-ps"),
        "the message names the flag and the daemon to use:\n{}",
        ran.stderr
    );
    let ran = daemon(
        "ps",
        &["-c", config, "--job_name", "worker", "--task_index", "0"],
    );
    assert_eq!(ran.status.code(), Some(78), "stderr:\n{}", ran.stderr);
}

#[test]
fn each_daemon_help_names_its_own_unit() {
    for (role, other) in [("ps", "worker"), ("worker", "ps")] {
        let ran = daemon(role, &["--help"]);
        assert!(ran.status.success(), "{}", ran.stderr);
        assert!(
            ran.stdout.contains(&format!("dtf-{role}@N"))
                && !ran.stdout.contains(&format!("dtf-{other}@")),
            "dtf-{role} --help:\n{}",
            ran.stdout
        );
        assert!(ran.stdout.contains("--task_index"), "{}", ran.stdout);
    }
}

/// Issue 44: a ps stopped with SIGTERM while a worker is frozen (SIGSTOP,
/// its TCP connection open) exits within about a second of its drain, not
/// when HTTP/2 keepalive gives the connection up (30 s).
#[test]
fn a_sigterm_does_not_wait_for_a_frozen_workers_connection() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.use_transport(dtf::config::Transport::Tcp);
    c.start_all();
    c.wait_log("worker:0", "Training.", 1, Duration::from_secs(30));
    c.signal("worker:0", libc::SIGSTOP);
    c.signal("ps:0", libc::SIGTERM);
    // Well inside the 30 s the drain took, with room for a loaded machine.
    let s = c.wait("ps:0", Duration::from_secs(10));
    c.signal("worker:0", libc::SIGCONT);
    assert!(s.success(), "{s:?}:\n{}", c.log("ps:0"));
    assert!(
        c.log("ps:0").contains("their connections are dropped"),
        "{}",
        c.log("ps:0")
    );
}
