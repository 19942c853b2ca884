//! The workers a ps has heard from. Workers serve no RPC, so what an
//! operator learns about them (`dtf status`) comes from here: each push
//! names its worker and step, and the ps keeps, per worker, the time of the
//! latest one, its step and the examples per second it pushed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Shortest window an examples/s figure is computed over: shorter ones
/// jump with every push.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// What the ps knows of one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contact {
    /// Worker task index.
    pub worker: u32,
    /// The step of its latest push.
    pub step: u64,
    /// Time since its latest push.
    pub since: Duration,
    /// Examples per second it pushed lately (0 before its first window).
    pub examples_per_sec: f64,
}

/// One worker's record.
#[derive(Debug)]
struct Seen {
    /// Its latest push.
    last: Instant,
    /// The step of that push.
    step: u64,
    /// The current rate window: start, examples since.
    window: (Instant, u64),
    /// The rate over the last complete window, if any.
    rate: Option<f64>,
}

/// Every worker a ps has had a push from, by task index.
#[derive(Debug)]
pub struct Workers {
    /// The cluster's worker count: larger indices are not recorded, so a
    /// confused peer cannot grow the table.
    count: usize,
    /// By worker index.
    seen: BTreeMap<u32, Seen>,
}

impl Workers {
    /// An empty table for a cluster of `count` workers.
    pub fn new(count: usize) -> Self {
        Self {
            count,
            seen: BTreeMap::new(),
        }
    }

    /// `worker` pushed `examples` examples computed at `step`, at `now`.
    pub fn heard(&mut self, worker: u32, step: u64, examples: u64, now: Instant) {
        if worker as usize >= self.count {
            return;
        }
        let seen = self.seen.entry(worker).or_insert(Seen {
            last: now,
            step,
            window: (now, 0),
            rate: None,
        });
        seen.last = now;
        seen.step = step;
        seen.window.1 += examples;
        let elapsed = now.saturating_duration_since(seen.window.0);
        if elapsed >= RATE_WINDOW {
            seen.rate = Some(seen.window.1 as f64 / elapsed.as_secs_f64());
            seen.window = (now, 0);
        }
    }

    /// Every worker heard from, in index order, as of `now`.
    pub fn report(&self, now: Instant) -> Vec<Contact> {
        self.seen
            .iter()
            .map(|(&worker, s)| {
                let open = now.saturating_duration_since(s.window.0).as_secs_f64();
                // Before a window completes, the open one is the best figure.
                let rate = s.rate.unwrap_or(if open > 0.0 {
                    s.window.1 as f64 / open
                } else {
                    0.0
                });
                Contact {
                    worker,
                    step: s.step,
                    since: now.saturating_duration_since(s.last),
                    examples_per_sec: rate,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_each_workers_latest_push_and_rate() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Workers::new(2);
        assert!(w.report(t0).is_empty(), "never seen: not listed");
        // Worker 1 pushes 100 examples every 100 ms for 2 s: 1000 examples/s.
        for k in 0..=20 {
            w.heard(1, 10 + k, 100, at(100 * k));
        }
        // Outside the cluster: ignored.
        w.heard(7, 1, 100, at(2000));
        let r = w.report(at(2500));
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!((r[0].worker, r[0].step), (1, 30));
        assert_eq!(r[0].since, Duration::from_millis(500));
        assert!(
            (r[0].examples_per_sec - 1050.0).abs() < 1.0,
            "2100 examples over 2 s: {r:?}"
        );
        w.heard(0, 3, 100, at(2600));
        let r = w.report(at(2600));
        assert_eq!(r.iter().map(|c| c.worker).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(r[0].since, Duration::ZERO);
    }
}
