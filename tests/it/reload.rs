//! Every live-reloadable key, changed in a running cluster, does what
//! dtf.toml(5) says — one test per key (or pair), and a test that ties
//! `dtf::config::LIVE_KEYS` to them. (docs.rs ties the same list to the man
//! page's "Reloads live." marks.)

use crate::util::*;
use dtf::config::Mode;
use std::time::Duration;

/// Long enough for a loaded 2-core machine to start a cluster and train a while.
const RUN: Duration = Duration::from_secs(120);

/// Each live key and the test in this file that shows its effect.
const SHOWN_BY: &[(&str, &str)] = &[
    ("log.level", "log_level_reloads_live"),
    ("checkpoint.save_secs", "save_secs_reloads_live"),
    ("checkpoint.max_to_keep", "max_to_keep_reloads_live"),
    ("checkpoint.full_every", "full_every_reloads_live"),
    (
        "train.last_step",
        "last_step_reloads_live_and_the_run_ends_exactly_there",
    ),
    ("train.learning_rate", "learning_rate_and_decay_reload_live"),
    (
        "train.learning_rate_decay",
        "learning_rate_and_decay_reload_live",
    ),
    (
        "train.log_step_count_steps",
        "log_step_count_steps_reloads_live",
    ),
    (
        "train.save_summaries_steps",
        "save_summaries_steps_reloads_live",
    ),
    ("metrics.listen", "metrics_listen_reloads_live"),
    ("train.lr_schedule", "the_schedule_keys_reload_live"),
    ("train.lr_boundaries", "the_schedule_keys_reload_live"),
    ("train.lr_values", "the_schedule_keys_reload_live"),
    ("train.cosine_alpha", "the_schedule_keys_reload_live"),
    (
        "train.learning_rate_decay_steps",
        "the_schedule_keys_reload_live",
    ),
    ("train.staircase", "the_schedule_keys_reload_live"),
    ("train.warmup_steps", "the_schedule_keys_reload_live"),
    // With the evaluator's tests: saving by steps is its subject there.
    ("checkpoint.save_steps", "save_steps_reloads_live"),
    // With the membership tests (both transports, async and sync).
    ("cluster.worker", "a_worker_joins_a_running_run_async"),
    ("cluster.ps", "the_ps_list_grows_and_shrinks_back_async"),
];

#[test]
fn every_live_key_has_a_test_showing_its_effect() {
    let live: Vec<&str> = dtf::config::LIVE_KEYS.iter().map(|k| k.key).collect();
    let shown: Vec<&str> = SHOWN_BY.iter().map(|(k, _)| *k).collect();
    let (mut a, mut b) = (live.clone(), shown.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "LIVE_KEYS and the keys this file shows the effect of");
    let source = [
        include_str!("reload.rs"),
        include_str!("evaluator.rs"),
        include_str!("membership.rs"),
    ]
    .concat();
    for (key, test) in SHOWN_BY {
        assert!(
            source.contains(&format!("#[test]\nfn {test}()"))
                || source.contains(&format!("async fn {test}(transport)")),
            "{key}: no test {test} in tests/it/reload.rs, evaluator.rs or membership.rs"
        );
    }
}

/// Writes the changed config (by rename, as an editor saves) and waits
/// until every task in `names` says it applied a change of `key`.
fn reload(c: &mut Cluster, names: &[&str], key: &str) {
    let before: Vec<usize> = names
        .iter()
        .map(|n| c.log(n).matches("Configuration reloaded.").count())
        .collect();
    c.write_config_by_rename();
    for (n, count) in names.iter().zip(before) {
        let log = c.wait_log(n, "Configuration reloaded.", count + 1, RUN);
        assert!(
            log.contains(key),
            "{n}'s reload does not name {key}:\n{log}"
        );
    }
}

/// The value of the unlabelled metric `name` in a scrape.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// `/metrics` of `addr`: `(dtf_learning_rate, dtf_global_step)` once both are there.
fn lr_and_step(addr: &str) -> Option<(f64, f64)> {
    let text = http_get(addr, "/metrics")?;
    Some((
        gauge(&text, "dtf_learning_rate")?,
        gauge(&text, "dtf_global_step")?,
    ))
}

/// `train.learning_rate` and `train.learning_rate_decay`: the worker's
/// `dtf_learning_rate` follows `base · decay^(step / decay_steps)` with the
/// new values. The tiny set has 2000 examples in batches of 20: 100 steps
/// per decay period.
#[test]
fn learning_rate_and_decay_reload_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.train.learning_rate = 0.1;
    c.cfg.train.learning_rate_decay = 1.0;
    c.write_config();
    c.start("ps", 0);
    // The worker's /metrics on an address of its own (DTF_METRICS__LISTEN
    // holds through reloads).
    let addr = free_addrs(1).remove(0);
    c.start_env("worker", 0, &[("DTF_METRICS__LISTEN", &addr)]);
    let close = |lr: f64, want: f64| (lr - want).abs() <= 0.01 * want;
    until(RUN, "dtf_learning_rate 0.1", || {
        lr_and_step(&addr).filter(|&(lr, s)| s > 0.0 && close(lr, 0.1))
    });

    c.cfg.train.learning_rate = 0.4;
    reload(&mut c, &["worker:0"], "train.learning_rate");
    until(RUN, "dtf_learning_rate 0.4 after the reload", || {
        lr_and_step(&addr).filter(|&(lr, _)| close(lr, 0.4))
    });

    c.cfg.train.learning_rate_decay = 0.5;
    reload(&mut c, &["worker:0"], "train.learning_rate_decay");
    let (lr, step) = until(RUN, "a decayed dtf_learning_rate", || {
        lr_and_step(&addr).filter(|&(lr, _)| lr < 0.39)
    });
    // The step moves between the worker's computation and the scrape:
    // allow a few steps' worth (0.5^(5/100) ≈ 0.966).
    let want = 0.4 * 0.5f64.powf(step / 100.0);
    assert!(
        lr <= want / 0.96 && lr >= want * 0.96,
        "dtf_learning_rate {lr} at step {step}: the schedule says {want}"
    );
}

/// The learning-rate schedule's keys: each reload changes the worker's `dtf_learning_rate`
/// as TensorFlow's schedule of that name says — piecewise_constant's values past its
/// boundary, cosine_decay's end at alpha, exponential_decay continuous then staircase,
/// and a warmup that starts the schedule over from a sliver of its rate.
#[test]
fn the_schedule_keys_reload_live() {
    use dtf::config::LrSchedule;
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.train.learning_rate = 0.1;
    c.cfg.train.learning_rate_decay = 1.0;
    c.write_config();
    c.start("ps", 0);
    let addr = free_addrs(1).remove(0);
    c.start_env("worker", 0, &[("DTF_METRICS__LISTEN", &addr)]);
    let close = |lr: f64, want: f64| (lr - want).abs() <= 0.001 * want;
    until(RUN, "dtf_learning_rate 0.1", || {
        lr_and_step(&addr).filter(|&(lr, s)| s > 0.0 && close(lr, 0.1))
    });

    // piecewise_constant: 0.3 up to step 1, then 0.05.
    c.cfg.train.lr_schedule = LrSchedule::PiecewiseConstant;
    c.cfg.train.lr_boundaries = vec![1];
    c.cfg.train.lr_values = vec![0.3, 0.05];
    reload(&mut c, &["worker:0"], "train.lr_schedule");
    until(RUN, "piecewise_constant's 0.05", || {
        lr_and_step(&addr).filter(|&(lr, _)| close(lr, 0.05))
    });

    // cosine_decay over 1 step: at its end, alpha · learning_rate.
    c.cfg.train.lr_schedule = LrSchedule::CosineDecay;
    c.cfg.train.learning_rate_decay_steps = 1;
    c.cfg.train.cosine_alpha = 0.25;
    reload(&mut c, &["worker:0"], "train.cosine_alpha");
    until(RUN, "cosine_decay's end at 0.025", || {
        lr_and_step(&addr).filter(|&(lr, _)| close(lr, 0.025))
    });

    // exponential_decay by 0.5 per 1000 steps: continuous, the rate is between the
    // stairs (0.1 · 0.5^k)...
    let stair = |lr: f64| (0..60).any(|k| close(lr, 0.1 * 0.5f64.powi(k)));
    c.cfg.train.lr_schedule = LrSchedule::ExponentialDecay;
    c.cfg.train.learning_rate_decay = 0.5;
    c.cfg.train.learning_rate_decay_steps = 1000;
    reload(&mut c, &["worker:0"], "train.learning_rate_decay_steps");
    until(RUN, "a continuous decay, between the stairs", || {
        lr_and_step(&addr).filter(|&(lr, _)| lr < 0.0999 && !stair(lr))
    });
    // ...and with staircase on, it is always on one.
    c.cfg.train.staircase = true;
    reload(&mut c, &["worker:0"], "train.staircase");
    until(RUN, "a rate on a stair", || {
        lr_and_step(&addr).filter(|&(lr, _)| stair(lr))
    });

    // A warmup longer than the run: a sliver of the rate.
    c.cfg.train.warmup_steps = 1_000_000_000;
    reload(&mut c, &["worker:0"], "train.warmup_steps");
    until(RUN, "the warmup's sliver of 0.1", || {
        lr_and_step(&addr).filter(|&(lr, _)| lr < 1e-4)
    });
}

/// `checkpoint.save_secs`: from an hour to a second, the chief starts
/// writing timed checkpoints, several, at rising steps.
#[test]
fn save_secs_reloads_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.checkpoint.save_secs = Some(3600);
    c.write_config();
    c.start_all();
    let dir = c.cfg.checkpoint.dir.clone();
    let step = past(&c, 20);
    // Only the initial checkpoint (written off the training path).
    let before = until(RUN, "the initial checkpoint", || {
        let s = checkpoint_steps(&dir);
        (!s.is_empty()).then_some(s)
    });
    assert_eq!(before, [0], "with save_secs = 3600, at step {step}");

    c.cfg.checkpoint.save_secs = Some(1);
    reload(&mut c, &["worker:0"], "checkpoint.save_secs");
    let steps = until(RUN, "three timed checkpoints after the reload", || {
        let s = checkpoint_steps(&dir);
        (s.iter().filter(|&&s| s > 0).count() >= 3).then_some(s)
    });
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
}

/// `checkpoint.max_to_keep`: lowered to 1, the chief's next save leaves
/// only the newest checkpoint.
#[test]
fn max_to_keep_reloads_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.checkpoint.save_secs = Some(1);
    c.cfg.checkpoint.max_to_keep = 10;
    c.write_config();
    c.start_all();
    let dir = c.cfg.checkpoint.dir.clone();
    let kept = until(RUN, "three checkpoints kept", || {
        let s = checkpoint_steps(&dir);
        (s.len() >= 3).then_some(s)
    });

    c.cfg.checkpoint.max_to_keep = 1;
    reload(&mut c, &["worker:0"], "checkpoint.max_to_keep");
    let newest = *kept.last().unwrap();
    until(RUN, "one newer checkpoint alone", || {
        let s = checkpoint_steps(&dir);
        (s.len() == 1 && s[0] > newest).then_some(())
    });
}

/// `train.log_step_count_steps`: the worker's "Progress." line, absent
/// with a huge interval, appears once it is lowered.
#[test]
fn log_step_count_steps_reloads_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.train.log_step_count_steps = 1_000_000;
    c.write_config();
    c.start_all();
    past(&c, 100);
    assert!(!c.log("worker:0").contains("Progress."));

    c.cfg.train.log_step_count_steps = 10;
    reload(&mut c, &["worker:0"], "train.log_step_count_steps");
    c.wait_log("worker:0", "Progress.", 2, RUN);
}

/// `log.level`: at `warn` the worker's info lines are not logged; back at
/// `info` they are.
#[test]
fn log_level_reloads_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.log.level = "warn".into();
    c.cfg.train.log_step_count_steps = 10;
    c.write_config();
    c.start_all();
    past(&c, 100);
    assert!(!c.log("worker:0").contains("Progress."));

    c.cfg.log.level = "info".into();
    // At `warn` the reload's own info line is not logged: wait for its effect.
    c.write_config_by_rename();
    c.wait_log("worker:0", "Progress.", 2, RUN);
}

/// `train.save_summaries_steps`: with a huge interval the chief's events
/// file stops growing after the first summary; lowered, it grows again.
#[test]
fn save_summaries_steps_reloads_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.cfg.train.save_summaries_steps = 1_000_000;
    // No timed checkpoints: nothing else writes to the events file.
    c.cfg.checkpoint.save_secs = Some(3600);
    c.write_config();
    c.start_all();
    let dir = c.cfg.checkpoint.dir.clone();
    let events = || -> Option<u64> {
        std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("events.out.tfevents.")
            })
            .and_then(|e| e.metadata().ok())
            .map(|m| m.len())
    };
    past(&c, 20);
    let first = until(RUN, "the events file", events);
    past(&c, 200);
    assert_eq!(
        events(),
        Some(first),
        "no summary between steps 0 and 1000000"
    );

    c.cfg.train.save_summaries_steps = 10;
    reload(&mut c, &["worker:0"], "train.save_summaries_steps");
    until(RUN, "summaries every 10 steps after the reload", || {
        events().filter(|&n| n > first)
    });
}

/// `metrics.listen`: turned on, `/metrics` answers on the new address;
/// turned off again, it stops. (The ps keeps metrics off through
/// `DTF_METRICS__LISTEN`, so the worker alone takes the address.)
#[test]
fn metrics_listen_reloads_live() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    c.start_env("ps", 0, &[("DTF_METRICS__LISTEN", "")]);
    c.start("worker", 0);
    past(&c, 10);
    let addr = free_addrs(1).remove(0);
    assert!(http_get(&addr, "/metrics").is_none());
    c.cfg.metrics.listen = addr.clone();
    reload(&mut c, &["worker:0"], "metrics.listen");
    let text = until(RUN, "/metrics on the new address", || {
        http_get(&addr, "/metrics")
    });
    assert!(text.contains("dtf_up{role=\"worker\""), "{text}");
    // The reload that opened it is counted (dtf_reloads_total).
    until(RUN, "dtf_reloads_total{result=\"ok\"} >= 1", || {
        let text = http_get(&addr, "/metrics")?;
        let ok = text
            .lines()
            .find_map(|l| l.strip_prefix("dtf_reloads_total{result=\"ok\"} "))?;
        (ok.trim().parse::<f64>().ok()? >= 1.0).then_some(())
    });

    c.cfg.metrics.listen = String::new();
    reload(&mut c, &["worker:0"], "metrics.listen");
    until(RUN, "/metrics to stop answering", || {
        http_get(&addr, "/metrics").is_none().then_some(())
    });
}

/// `train.last_step`: lowered on a running cluster (ps and workers reload
/// it), the run completes, at exactly the new step.
#[test]
fn last_step_reloads_live_and_the_run_ends_exactly_there() {
    let mut c = Cluster::new(1, 2, 1_000_000, Mode::Async);
    c.start_all();
    let step = past(&c, 50);
    // The tiny model trains thousands of steps a second on shared memory,
    // and a reload waits 200 ms for the file to settle: room for it to land
    // on every task before the step gets there.
    let last = step + 20_000;
    c.cfg.train.last_step = last;
    reload(&mut c, &["ps:0", "worker:0", "worker:1"], "train.last_step");
    let now = global_step(&c);
    assert!(
        now < last,
        "step {now} already past {last} when the reload landed"
    );
    c.wait_all_success(RUN);
    let steps = checkpoint_steps(&c.cfg.checkpoint.dir);
    assert_eq!(steps.last(), Some(&last), "checkpoints {steps:?}");
}

/// Starts ps 0 of `c` reading its config through `config` (a link set up by
/// the caller), and waits until it is ready.
fn ps_through(c: &mut Cluster, config: std::path::PathBuf) {
    c.config_path = config;
    c.start("ps", 0);
    c.wait_log("ps:0", "Parameter server ready.", 1, RUN);
}

/// Issue 25: with the config a symbolic link whose target is edited, live
/// reload never fired (0 reloads, nothing logged).
#[test]
fn a_config_that_is_a_link_reloads_when_its_target_is_edited() {
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    let real = c.dir.path().join("etc");
    std::fs::create_dir(&real).unwrap();
    let target = real.join("dtf.toml");
    std::fs::write(&target, c.cfg.to_toml()).unwrap();
    let link = c.dir.path().join("linked.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    ps_through(&mut c, link);
    c.cfg.train.last_step = 999_999;
    // Written in place, through the link's target, not the link.
    std::fs::write(&target, c.cfg.to_toml()).unwrap();
    let log = c.wait_log("ps:0", "Configuration reloaded.", 1, RUN);
    assert!(log.contains("train.last_step"), "{log}");
}
