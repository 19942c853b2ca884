//! The fault harness, after Jepsen and etcd's robustness tests: a seed draws
//! a cluster and a fault schedule (`schedule`), nemeses inject the faults
//! (`nemesis`, injected by `run`), a history records what was seen
//! (`history`), and a checker holds it to dtf's promises (`checker`).
//!
//! CI runs a few seeds as ordinary tests (`chaos::ci_seed_*`);
//! `scripts/chaos.sh --seeds N` runs many through [`from_env`]. docs/chaos.md
//! says what is checked and what long runs found.

mod checker;
mod history;
mod nemesis;
mod run;
mod schedule;

use checker::Expect;
use schedule::Plan;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a set of seeds did.
#[derive(Default)]
struct Tally {
    seeds: usize,
    injected: BTreeMap<&'static str, usize>,
    skipped: usize,
    failed: Vec<u64>,
}

impl Tally {
    fn summary(&self, wall: Duration) -> String {
        let faults: usize = self.injected.values().sum();
        let kinds: Vec<String> = self
            .injected
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        format!(
            "chaos: {} seeds, {} faults injected ({}), {} skipped (victim not running, or an edit of last_step after the end), {} seeds with violations {:?}, wall {:.0} s",
            self.seeds,
            faults,
            kinds.join(", "),
            self.skipped,
            self.failed.len(),
            self.failed,
            wall.as_secs_f64()
        )
    }
}

/// Runs each seed; prints each one's plan and outcome, and the report of
/// any that violates an invariant.
fn run_seeds(
    seeds: impl IntoIterator<Item = u64>,
    seconds: u64,
    reference: bool,
    (hosts, sparse): (bool, bool),
) -> Tally {
    let mut tally = Tally::default();
    for seed in seeds {
        let plan = draw(seed, seconds, hosts, sparse);
        let out = run::run(&plan, &Expect::default(), reference);
        tally.seeds += 1;
        tally.skipped += out.skipped;
        for (k, n) in &out.injected {
            *tally.injected.entry(k).or_default() += n;
        }
        if std::env::var_os("DTF_CHAOS_VERBOSE").is_some() {
            eprintln!("{plan}");
            for e in out
                .events
                .iter()
                .filter(|e| !matches!(e.what, history::What::Metrics { .. }))
            {
                eprintln!("  {e}");
            }
        }
        if out.violations.is_empty() {
            eprintln!(
                "chaos seed {seed}: ok in {:.0} s: {:?} {:?} {} ps {} workers{}, {} faults, {} restores, final step {}",
                out.wall.as_secs_f64(),
                plan.mode,
                plan.transport,
                plan.ps,
                plan.workers,
                if plan.evaluator { " evaluator" } else { "" },
                out.injected.values().sum::<usize>(),
                out.restores(),
                out.last_step(),
            );
        } else {
            tally.failed.push(seed);
            eprintln!("chaos seed {seed}: FAILED\n{}", out.report(&plan));
        }
    }
    tally
}

/// Seed `seed`'s plan: on hosts or not, sparse (wide & deep) or not.
fn draw(seed: u64, seconds: u64, hosts: bool, sparse: bool) -> Plan {
    let mut plan = match hosts {
        true => Plan::draw_on_hosts(seed, seconds),
        false => Plan::draw(seed, seconds),
    };
    plan.sparse = sparse;
    plan
}

/// `DTF_CHAOS_SEEDS` (`K`, or `A-B`), `DTF_CHAOS_SECONDS` (default 20),
/// `DTF_CHAOS_REFERENCE=0` to skip the fault-free runs, `DTF_CHAOS_HOSTS=1`
/// for plans on hosts (network faults too), `DTF_CHAOS_SPARSE=1` for wide &
/// deep on embedding tables instead of the MLP, `DTF_CHAOS_LIST=1` to print the
/// plans and run nothing: what `scripts/chaos.sh` runs.
#[test]
#[ignore = "run by scripts/chaos.sh"]
fn from_env() {
    let var = |k: &str| std::env::var(k).ok();
    let seeds = var("DTF_CHAOS_SEEDS").unwrap_or_else(|| "1-3".into());
    let seeds: Vec<u64> = match seeds.split_once('-') {
        Some((a, b)) => (a.parse().expect("DTF_CHAOS_SEEDS=A-B")
            ..=b.parse().expect("DTF_CHAOS_SEEDS=A-B"))
            .collect(),
        None => vec![seeds.parse().expect("DTF_CHAOS_SEEDS=K")],
    };
    let seconds = var("DTF_CHAOS_SECONDS").map_or(20, |s| s.parse().expect("DTF_CHAOS_SECONDS"));
    let reference = var("DTF_CHAOS_REFERENCE").as_deref() != Some("0");
    let hosts = var("DTF_CHAOS_HOSTS").as_deref() == Some("1");
    let sparse = var("DTF_CHAOS_SPARSE").as_deref() == Some("1");
    if var("DTF_CHAOS_LIST").as_deref() == Some("1") {
        for seed in seeds {
            eprint!("{}", draw(seed, seconds, hosts, sparse));
        }
        return;
    }
    let began = Instant::now();
    let tally = run_seeds(seeds, seconds, reference, (hosts, sparse));
    let summary = tally.summary(began.elapsed());
    eprintln!("{summary}");
    if let Some(path) = var("DTF_CHAOS_SUMMARY") {
        std::fs::write(path, format!("{summary}\n")).unwrap();
    }
    assert!(tally.failed.is_empty(), "{summary}");
}

/// CI's short form: one seed, its faults over 20 s, checked in full.
fn ci(seed: u64) {
    ci_with(seed, (false, false));
}

fn ci_with(seed: u64, kind: (bool, bool)) {
    let began = Instant::now();
    let tally = run_seeds([seed], 20, true, kind);
    assert!(
        tally.failed.is_empty(),
        "{}",
        tally.summary(began.elapsed())
    );
}

#[test]
fn ci_seed_1() {
    ci(1);
}

/// Failed once in its first three runs (2026-12-01, the violation's text
/// lost); after the fixes of two sync hangs (chaos seed 4) it passed 9 of 9
/// as `scripts/chaos.sh --seed 2` and 11 of 11 as this test, under load.
#[test]
fn ci_seed_2() {
    ci(2);
}

#[test]
fn ci_seed_6() {
    ci(6);
}

/// Found by seed 4 (sync, TCP, 2 ps, 3 workers): worker:1 SIGSTOPped for
/// 3.9 s, then ps:0 stopped by SIGTERM and started again. The chief
/// re-seeded both shards from the checkpoint, which cleared ps:1's sync
/// accumulator while the workers waited for the step their gradients were
/// in: every worker waited for ever. Fixed with the ps snapshots (issue
/// 26): a worker whose parameters came from a ps process that is gone
/// computes afresh instead of waiting (`Worker::wait_for_step`). Then it
/// found a worker that ended one step early (`Progress::reached`;
/// `sync::a_worker_that_read_the_shards_a_step_apart_does_not_end_the_run_early`).
#[test]
fn sync_ps_restart_after_a_stopped_worker_completes() {
    let tally = run_seeds([4], 20, false, (false, false));
    assert!(tally.failed.is_empty(), "seed 4 still fails");
}

/// A seed on hosts: each task in a network namespace of its own, links cut
/// and slowed beside the other faults.
#[test]
fn ci_hosts_seed_1() {
    ci_with(1, (true, false));
}

/// A sparse plan (issue 42): wide & deep on embedding tables, seed 8's
/// cluster and faults (async, TCP, 2 ps, 3 workers and the evaluator; three
/// ps kills, one on the chief's save, a full disk, live and invalid edits);
/// the same invariants hold with table rows in every snapshot, ring copy
/// and checkpoint.
#[test]
fn ci_sparse_seed_8() {
    ci_with(8, (false, true));
}
