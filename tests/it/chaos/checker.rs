//! The checker: what must hold of every chaos run's history, whatever the
//! faults. Each invariant is one function; `check` runs them all. The tests
//! at the bottom feed it wrong histories, one per invariant, and show it
//! flags each (and passes a right one).

use super::history::{Event, What};
use super::nemesis::{Bound, Task};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The limits a run is held to.
#[derive(Debug, Clone)]
pub struct Expect {
    /// At most this many exits of one task that the harness did not cause
    /// (and that were not a clean 0)…
    pub max_failures: usize,
    /// …within this many seconds: more is a restart loop.
    pub loop_window: f64,
    /// The run completes within this many seconds of the last fault's end.
    pub complete_within: f64,
    /// The final EMA test accuracy is within this of a fault-free run's.
    pub accuracy_band: f32,
    /// A fault that may cost steps shows its recovery within this many
    /// seconds, or the step going back is not its doing.
    pub recovery_window: f64,
}

impl Default for Expect {
    fn default() -> Self {
        Self {
            max_failures: 3,
            loop_window: 30.0,
            complete_within: 90.0,
            accuracy_band: 0.05,
            recovery_window: 60.0,
        }
    }
}

/// One broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which invariant (a short name).
    pub invariant: &'static str,
    /// When, in the history's seconds.
    pub t: f64,
    /// What was wrong.
    pub message: String,
}

/// Every violation of `events` (a history sorted by time).
pub fn check(events: &[Event], expect: &Expect) -> Vec<Violation> {
    let mut out = Vec::new();
    step_never_goes_back_beyond_its_bound(events, expect, &mut out);
    every_checkpoint_verifies(events, &mut out);
    final_checkpoint_at_last_step(events, &mut out);
    no_task_crashes(events, &mut out);
    no_restart_loop(events, expect, &mut out);
    completes_after_the_last_fault(events, expect, &mut out);
    nothing_left_running(events, &mut out);
    accuracy_within_band(events, expect, &mut out);
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    out
}

/// Each ps's step (ps 0's is the global step) only goes back when a
/// fault that may cost steps struck at most `recovery_window` before; each
/// such fault explains one step back per ps, and the step lands no lower
/// than that fault's bound. The chief's restores and adoptions count as
/// observations.
fn step_never_goes_back_beyond_its_bound(events: &[Event], e: &Expect, out: &mut Vec<Violation>) {
    let shards = events
        .iter()
        .map(|ev| match &ev.what {
            What::Status { steps, .. } => steps.len(),
            What::Restored { ps, .. } => ps.iter().max().map_or(0, |m| m + 1),
            What::Adopted { ps, .. } => ps + 1,
            _ => 0,
        })
        .max()
        .unwrap_or(0);
    for shard in 0..shards {
        let seen = |ev: &Event| held(ev, shard);
        let mut prev: Option<(f64, u64)> = None;
        let mut used = vec![false; events.len()];
        for ev in events {
            let Some(s) = seen(ev) else {
                continue;
            };
            if let Some((t1, s1)) = prev
                && s < s1
            {
                // The chief's restore (or adoption) is read from its log
                // after the fact: status samples taken after it may come
                // first in the history, and their drop already used the
                // fault. It is the same recovery, so it may share that fault
                // (its bound still holds).
                let restore = matches!(ev.what, What::Restored { .. } | What::Adopted { .. });
                let fault = events.iter().enumerate().find(|(j, f)| {
                    (!used[*j] || restore)
                        && f.t <= ev.t
                        && ev.t - f.t <= e.recovery_window
                        && matches!(f.what, What::Fault { bound, .. } if bound != Bound::Nothing)
                });
                match fault {
                    None => out.push(Violation {
                        invariant: "step-monotonic",
                        t: ev.t,
                        message: format!(
                            "ps:{shard}'s step went back from {s1} (at {t1:.2}s) to {s}, and no fault that may cost steps struck in the {:.0} s before",
                            e.recovery_window
                        ),
                    }),
                    Some((j, f)) => {
                        used[j] = true;
                        let What::Fault { bound, ref text, .. } = f.what else {
                            unreachable!()
                        };
                        let floor = floor(events, f.t, bound, s1, shard);
                        if s < floor {
                            out.push(Violation {
                                invariant: "step-monotonic",
                                t: ev.t,
                                message: format!(
                                    "ps:{shard}'s step went back from {s1} to {s} after \"{text}\" at {:.2}s, which may lose at most {bound:?}: no lower than {floor}",
                                    f.t
                                ),
                            });
                        }
                    }
                }
            }
            prev = Some((ev.t, s));
        }
    }
}

/// The step of ps `shard` that `ev` shows: a status sample's, or the step
/// the chief restored or adopted its shard at.
fn held(ev: &Event, shard: usize) -> Option<u64> {
    match &ev.what {
        What::Status { steps, .. } => steps.get(shard).copied().flatten(),
        What::Restored { ps, step } if ps.contains(&shard) => Some(*step),
        What::Adopted { ps, step } if *ps == shard => Some(*step),
        _ => None,
    }
}

/// The lowest step a fault at `t` with `bound` may take the global step to,
/// from `before`, the step of ps `shard` last seen.
fn floor(events: &[Event], t: f64, bound: Bound, before: u64, shard: usize) -> u64 {
    let seen_by = |until: f64| events.iter().filter(move |e| e.t <= until);
    match bound {
        Bound::Nothing => before,
        Bound::Steps(n) => before.saturating_sub(n),
        // The newest checkpoint known to exist when the fault struck.
        Bound::Checkpoint => seen_by(t)
            .filter_map(|e| match &e.what {
                What::Status { checkpoint, .. } => *checkpoint,
                _ => None,
            })
            .max()
            .unwrap_or(0),
        // The lowest step the shard held from `secs` before the fault to
        // the fault: the step seen then, or lower where an earlier fault's
        // recovery took it back inside that span (a snapshot written then
        // holds no more than the shard had). Seeds 22 and 69: a `drift`
        // kill, then a plain kill of the same ps 3 s later. The snapshot
        // the chief adopted is such a step even when no status sample saw
        // it (seed 22: the first one came 90 ms later, 2100 steps on).
        Bound::Seconds(secs) => {
            let then = seen_by(t - secs)
                .filter(|e| matches!(e.what, What::Status { .. }))
                .filter_map(|e| held(e, shard))
                .next_back()
                .unwrap_or(0);
            seen_by(t)
                .filter(|e| e.t > t - secs)
                .filter_map(|e| held(e, shard))
                .fold(then, u64::min)
        }
    }
}

fn every_checkpoint_verifies(events: &[Event], out: &mut Vec<Violation>) {
    for ev in events {
        if let What::Verified {
            file,
            result: Err(e),
        } = &ev.what
        {
            out.push(Violation {
                invariant: "checkpoint-verifies",
                t: ev.t,
                message: format!("{file} does not verify: {e}"),
            });
        }
    }
}

/// A complete run has its final checkpoint at exactly `last_step`, and none beyond.
fn final_checkpoint_at_last_step(events: &[Event], out: &mut Vec<Violation>) {
    let Some((t, last_step)) = events.iter().find_map(|e| match e.what {
        What::Done {
            last_step,
            complete: true,
        } => Some((e.t, last_step)),
        _ => None,
    }) else {
        return;
    };
    let steps: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.what {
            What::Verified { result: Ok(s), .. } => Some(*s),
            _ => None,
        })
        .collect();
    if !steps.contains(&last_step) {
        out.push(Violation {
            invariant: "final-checkpoint",
            t,
            message: format!("the run is complete, but no checkpoint at last_step {last_step} (checkpoints: {steps:?})"),
        });
    }
    if let Some(beyond) = steps.iter().find(|&&s| s > last_step) {
        out.push(Violation {
            invariant: "final-checkpoint",
            t,
            message: format!("a checkpoint at step {beyond}, past last_step {last_step}"),
        });
    }
}

/// The exits that say a task crashed: a panic (101), an abort (134), a
/// segfault (139), any signal the harness did not send.
fn crash(code: Option<i32>, signal: Option<i32>, by_harness: bool) -> Option<String> {
    match (code, signal) {
        (Some(c @ (101 | 134 | 139)), _) => Some(format!("exit code {c}: a crash")),
        (Some(78), _) => Some("exit code 78: it refused its configuration".into()),
        (Some(c), _) if c >= 128 => Some(format!("exit code {c}: killed by a signal")),
        (_, Some(s)) if !(by_harness && (s == libc::SIGKILL || s == libc::SIGTERM)) => Some(
            format!("killed by signal {s}, which the harness did not send"),
        ),
        _ => None,
    }
}

fn no_task_crashes(events: &[Event], out: &mut Vec<Violation>) {
    for ev in events {
        if let What::Exit {
            task,
            code,
            signal,
            by_harness,
        } = ev.what
            && let Some(why) = crash(code, signal, by_harness)
        {
            out.push(Violation {
                invariant: "no-crash",
                t: ev.t,
                message: format!("{task}: {why}"),
            });
        }
    }
}

/// No task fails on its own more than `max_failures` times in `loop_window` s.
fn no_restart_loop(events: &[Event], e: &Expect, out: &mut Vec<Violation>) {
    let mut failures: BTreeMap<Task, Vec<f64>> = BTreeMap::new();
    for ev in events {
        if let What::Exit {
            task,
            code,
            by_harness: false,
            ..
        } = ev.what
            && code != Some(0)
        {
            failures.entry(task).or_default().push(ev.t);
        }
    }
    for (task, times) in failures {
        if let Some(w) = times
            .windows(e.max_failures + 1)
            .find(|w| w[e.max_failures] - w[0] <= e.loop_window)
        {
            out.push(Violation {
                invariant: "no-restart-loop",
                t: w[e.max_failures],
                message: format!(
                    "{task} failed {} times in {:.1} s (at most {} in {:.0} s)",
                    w.len(),
                    w[e.max_failures] - w[0],
                    e.max_failures,
                    e.loop_window
                ),
            });
        }
    }
}

/// The run completes, within `complete_within` of the last fault's end.
fn completes_after_the_last_fault(events: &[Event], e: &Expect, out: &mut Vec<Violation>) {
    let last_fault = events
        .iter()
        .filter(|e| matches!(e.what, What::Fault { .. } | What::Heal { .. }))
        .map(|e| e.t)
        .fold(0.0, f64::max);
    match events.iter().find(|e| matches!(e.what, What::Done { .. })) {
        None => out.push(Violation {
            invariant: "completes",
            t: events.last().map_or(0.0, |e| e.t),
            message: "the run never ended".into(),
        }),
        Some(done) => {
            let What::Done { complete, .. } = done.what else {
                unreachable!()
            };
            if !complete {
                out.push(Violation {
                    invariant: "completes",
                    t: done.t,
                    message: "the tasks did not all exit 0 with the final checkpoint written"
                        .into(),
                });
            } else if done.t - last_fault > e.complete_within {
                out.push(Violation {
                    invariant: "completes",
                    t: done.t,
                    message: format!(
                        "completed {:.1} s after the last fault ended (at {last_fault:.2}s); the bound is {:.0} s",
                        done.t - last_fault,
                        e.complete_within
                    ),
                });
            }
        }
    }
}

fn nothing_left_running(events: &[Event], out: &mut Vec<Violation>) {
    for ev in events {
        if let What::Leftover { text } = &ev.what {
            out.push(Violation {
                invariant: "no-leftover",
                t: ev.t,
                message: format!("still running after the run: {text}"),
            });
        }
    }
}

fn accuracy_within_band(events: &[Event], e: &Expect, out: &mut Vec<Violation>) {
    for ev in events {
        if let What::Accuracy { ema, reference } = ev.what
            && (ema - reference).abs() > e.accuracy_band
        {
            out.push(Violation {
                invariant: "accuracy",
                t: ev.t,
                message: format!(
                    "final EMA accuracy {ema:.4}, a fault-free run's {reference:.4}: more than {} apart",
                    e.accuracy_band
                ),
            });
        }
    }
}

/// Each violation with the history around it (`/metrics` samples left
/// out: the status polls carry the step), then how to replay.
pub fn report(events: &[Event], violations: &[Violation], replay: &str) -> String {
    let mut s = String::new();
    for v in violations {
        let _ = writeln!(
            s,
            "VIOLATION [{}] at {:.2}s: {}",
            v.invariant, v.t, v.message
        );
        let _ = writeln!(s, "  history around it:");
        for ev in events
            .iter()
            .filter(|e| e.t >= v.t - 8.0 && e.t <= v.t + 2.0)
            .filter(|e| !matches!(e.what, What::Metrics { .. }))
        {
            let _ = writeln!(s, "    {ev}");
        }
    }
    let _ = writeln!(s, "replay: {replay}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t: f64, what: What) -> Event {
        Event { t, what }
    }

    fn status(t: f64, step: u64, checkpoint: u64) -> Event {
        ev(
            t,
            What::Status {
                steps: vec![Some(step)],
                complete: false,
                checkpoint: Some(checkpoint),
            },
        )
    }

    fn fault(t: f64, kind: &'static str, bound: Bound) -> Event {
        ev(
            t,
            What::Fault {
                kind,
                text: kind.into(),
                bound,
            },
        )
    }

    fn exit(t: f64, task: Task, code: Option<i32>, signal: Option<i32>, by_harness: bool) -> Event {
        ev(
            t,
            What::Exit {
                task,
                code,
                signal,
                by_harness,
            },
        )
    }

    /// A right history: a ps killed at 2.5 s, the step back to the
    /// checkpoint at 200, the run complete at 1000 with its final checkpoint.
    fn good() -> Vec<Event> {
        vec![
            status(1.0, 100, 0),
            status(2.0, 300, 200),
            fault(2.5, "kill", Bound::Checkpoint),
            exit(2.5, Task::Ps(0), None, Some(libc::SIGKILL), true),
            ev(3.0, What::Start { task: Task::Ps(0) }),
            ev(
                3.2,
                What::Status {
                    steps: vec![None],
                    complete: false,
                    checkpoint: Some(200),
                },
            ),
            status(4.0, 210, 200),
            status(5.0, 1000, 1000),
            exit(5.5, Task::Worker(0), Some(0), None, false),
            ev(
                6.0,
                What::Verified {
                    file: "model.ckpt-200.safetensors".into(),
                    result: Ok(200),
                },
            ),
            ev(
                6.0,
                What::Verified {
                    file: "model.ckpt-1000.safetensors".into(),
                    result: Ok(1000),
                },
            ),
            ev(
                6.0,
                What::Done {
                    last_step: 1000,
                    complete: true,
                },
            ),
            ev(
                7.0,
                What::Accuracy {
                    ema: 0.95,
                    reference: 0.96,
                },
            ),
        ]
    }

    /// The invariants `events` violates.
    fn flagged(mut events: Vec<Event>) -> Vec<&'static str> {
        events.sort_by(|a, b| a.t.total_cmp(&b.t));
        let v = check(&events, &Expect::default());
        let mut names: Vec<&str> = v.iter().map(|v| v.invariant).collect();
        names.dedup();
        names
    }

    fn with(mut events: Vec<Event>, more: Vec<Event>) -> Vec<Event> {
        events.extend(more);
        events
    }

    #[test]
    fn a_right_history_passes() {
        assert_eq!(flagged(good()), Vec::<&str>::new());
    }

    #[test]
    fn step_going_back_without_a_fault_that_may_cost_steps_is_flagged() {
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        assert_eq!(flagged(h), ["step-monotonic"]);
        // A worker's death costs no step.
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        h.push(fault(2.5, "kill", Bound::Nothing));
        assert_eq!(flagged(h), ["step-monotonic"]);
        // A fault long before does not explain it.
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        h.push(fault(-100.0, "kill", Bound::Checkpoint));
        assert_eq!(flagged(h), ["step-monotonic"]);
        // One fault explains one step back, not two.
        let h = with(good(), vec![status(4.5, 500, 200), status(4.6, 220, 200)]);
        assert_eq!(flagged(h), ["step-monotonic"]);
    }

    /// Seed 52: the restarted ps seeded from the checkpoint (200), trained
    /// on (210, seen by a status sample), and only then the chief's log line
    /// of that restore read: the same recovery, not a second step back.
    #[test]
    fn a_restore_read_from_the_log_after_the_steps_it_began_is_one_recovery() {
        let restored = |step| What::Restored { ps: vec![0], step };
        let h = with(good(), vec![ev(4.1, restored(200))]);
        assert_eq!(flagged(h), Vec::<&str>::new());
        // Its bound still holds: a restore below the checkpoint is flagged.
        let h = with(good(), vec![ev(4.1, restored(150))]);
        assert_eq!(flagged(h), ["step-monotonic"]);
        // And a status sample's second step back still needs a fault of its own.
        let h = with(
            good(),
            vec![
                ev(4.1, restored(200)),
                status(4.5, 500, 200),
                status(4.6, 220, 200),
            ],
        );
        assert_eq!(flagged(h), ["step-monotonic"]);
    }

    #[test]
    fn step_going_back_past_its_bound_is_flagged() {
        // Below the newest checkpoint that existed when the ps died.
        let h = with(good(), vec![status(3.8, 150, 200)]);
        assert_eq!(flagged(h), ["step-monotonic"]);
        // Issue 26's bound: no lower than the step seen that long before the fault.
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        h.push(fault(2.5, "kill", Bound::Seconds(0.5)));
        assert_eq!(
            flagged(h.clone()),
            ["step-monotonic"],
            "210 < 300 seen at 2.0 s"
        );
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        h.push(fault(2.5, "kill", Bound::Seconds(1.0)));
        assert_eq!(flagged(h), Vec::<&str>::new(), "210 >= 100 seen at 1.0 s");
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        h.push(fault(2.5, "kill", Bound::Steps(50)));
        assert_eq!(flagged(h), ["step-monotonic"]);
    }

    /// A fault on a ps's state is recorded at its kill, after its
    /// preparation: `drift` made the ps's writes fail from 3.0 s for 1 s
    /// (a `prepare` entry), killed it at 4.0 s, and may lose
    /// `snapshot_secs` (1) + 1 + the window (1) counted from the kill: back
    /// to no lower than the step seen at 1.0 s, the last snapshot being
    /// from before the window.
    #[test]
    fn a_fault_on_a_ps_state_is_bounded_from_its_kill() {
        let drift = |back_to| {
            vec![
                status(1.0, 100, 0),
                status(2.0, 200, 0),
                status(3.0, 300, 0),
                ev(
                    3.0,
                    What::Prepare {
                        text: "ps:0's writes fail".into(),
                    },
                ),
                status(3.5, 400, 0),
                status(4.0, 500, 0),
                fault(4.0, "drift", Bound::Seconds(3.0)),
                status(4.5, back_to, 0),
            ]
        };
        let steps = |h: Vec<Event>| {
            let v = check(&h, &Expect::default());
            v.into_iter()
                .filter(|v| v.invariant == "step-monotonic")
                .count()
        };
        assert_eq!(steps(drift(300)), 0, "the snapshot before the window");
        assert_eq!(steps(drift(100)), 0, "the step seen 3 s before the kill");
        assert_eq!(steps(drift(90)), 1, "below it");
        // The preparation alone explains nothing.
        let mut h = drift(300);
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        assert_eq!(steps(h), 1);
    }

    /// Seeds 22 and 69: a `drift` kill at 4.0 s takes the step back from
    /// 500 to 150 (within its bound); the ps trains on to 200 and a plain
    /// kill at 5.0 s, which may lose 2 s, takes it to 160. Its floor is the
    /// lowest step held in the 2 s before it (150, after the drift's
    /// recovery), not the 300 seen at 3.0 s, before the drift.
    #[test]
    fn a_second_fault_inside_the_first_s_bound_counts_from_its_recovery() {
        let h = |back_to| {
            vec![
                status(1.0, 100, 0),
                status(2.0, 200, 0),
                status(3.0, 300, 0),
                status(4.0, 500, 0),
                fault(4.0, "drift", Bound::Seconds(3.0)),
                status(4.3, 150, 0),
                status(4.8, 200, 0),
                fault(5.0, "kill", Bound::Seconds(2.0)),
                status(5.5, back_to, 0),
            ]
        };
        let steps = |h: Vec<Event>| {
            check(&h, &Expect::default())
                .into_iter()
                .filter(|v| v.invariant == "step-monotonic")
                .count()
        };
        assert_eq!(steps(h(160)), 0);
        assert_eq!(steps(h(150)), 0, "the lowest step held in its 2 s");
        assert_eq!(steps(h(149)), 1, "below it");
        // Without the first fault and its recovery, the floor is the step
        // seen 2 s before the kill, as before.
        let mut plain = h(160);
        plain.retain(|e| e.t < 4.0 || e.t > 4.9);
        assert_eq!(steps(plain), 1, "160 < 300 seen at 3.0 s");
    }

    /// Seed 22 (2026-12-05, one ps, async): a `drift` kill at 18.85 s; the
    /// ps came back from its snapshot at 254529, which the chief adopted at
    /// 20.36 s, and the first status sample (20.45 s) already saw 256632.
    /// Killed again at 21.05 s, before the new process's first snapshot
    /// (due a second after it started), it came back from the same file,
    /// 254529: state it held 0.7 s before the kill, within the kill's 2 s.
    /// Without the adoption in the history, the lowest step seen in those
    /// 2 s was 256632, and the return to 254529 was flagged as a loss.
    #[test]
    fn a_snapshot_the_chief_adopted_is_a_step_the_shard_held() {
        let adopted = |t, step| ev(t, What::Adopted { ps: 0, step });
        // The ps comes back at `back_to`, seen first by a status sample
        // 893 steps on, and the chief's adoption of it is read after that.
        let h = |adoption: bool, back_to: u64| {
            let mut h = vec![
                status(18.82, 310983, 175143),
                status(18.85, 311448, 175143),
                fault(18.85, "drift", Bound::Seconds(5.65)),
                status(20.45, 256632, 175143),
                status(20.85, 263628, 175143),
                status(21.05, 265153, 175143),
                fault(21.05, "kill", Bound::Seconds(2.0)),
                status(23.70, back_to + 893, 175143),
                adopted(23.75, back_to),
                status(24.12, back_to + 6369, 175143),
            ];
            if adoption {
                h.push(adopted(20.36, 254529));
            }
            h.sort_by(|a, b| a.t.total_cmp(&b.t));
            h
        };
        let steps = |h: Vec<Event>| {
            check(&h, &Expect::default())
                .into_iter()
                .filter(|v| v.invariant == "step-monotonic")
                .count()
        };
        assert_eq!(steps(h(true, 254529)), 0);
        assert_eq!(
            steps(h(false, 254529)),
            1,
            "the history as recorded before adoptions were"
        );
        // Below the adopted snapshot (an older file chosen) is a loss.
        assert_eq!(steps(h(true, 254529 - 894)), 1);
    }

    #[test]
    fn a_restore_below_the_checkpoint_or_a_shard_going_back_alone_is_checked() {
        // The chief's restore is an observation: from a checkpoint older than the newest.
        let restored = |t, ps: Vec<usize>, step| ev(t, What::Restored { ps, step });
        let h = with(good(), vec![restored(3.5, vec![0], 150)]);
        assert_eq!(flagged(h), ["step-monotonic"]);
        let h = with(good(), vec![restored(3.5, vec![0], 200)]);
        assert_eq!(flagged(h), Vec::<&str>::new());
        // ps 1's step is checked on its own: back without a fault...
        let two = |t, a, b| {
            ev(
                t,
                What::Status {
                    steps: vec![Some(a), Some(b)],
                    complete: false,
                    checkpoint: Some(200),
                },
            )
        };
        let h = with(good(), vec![two(70.1, 1000, 900), two(70.2, 1000, 400)]);
        assert_eq!(flagged(h), ["step-monotonic"]);
        // ...or past its bound after one.
        let h = with(
            good(),
            vec![
                two(70.1, 1000, 900),
                fault(70.15, "kill", Bound::Checkpoint),
                two(70.2, 1000, 100),
            ],
        );
        assert_eq!(flagged(h), ["step-monotonic"]);
    }

    #[test]
    fn a_checkpoint_that_does_not_verify_is_flagged() {
        let h = with(
            good(),
            vec![ev(
                6.0,
                What::Verified {
                    file: "model.ckpt-600.safetensors".into(),
                    result: Err("checksum mismatch".into()),
                },
            )],
        );
        assert_eq!(flagged(h), ["checkpoint-verifies"]);
    }

    #[test]
    fn a_complete_run_without_its_final_checkpoint_or_past_it_is_flagged() {
        let mut h = good();
        h.retain(|e| {
            !matches!(
                &e.what,
                What::Verified {
                    result: Ok(1000),
                    ..
                }
            )
        });
        assert_eq!(flagged(h), ["final-checkpoint"]);
        let h = with(
            good(),
            vec![ev(
                6.0,
                What::Verified {
                    file: "model.ckpt-1003.safetensors".into(),
                    result: Ok(1003),
                },
            )],
        );
        assert_eq!(flagged(h), ["final-checkpoint"]);
    }

    #[test]
    fn crashes_are_flagged_and_the_harness_s_own_signals_are_not() {
        for (code, signal) in [
            (Some(101), None),
            (Some(134), None),
            (Some(139), None),
            (Some(78), None),
            (None, Some(libc::SIGSEGV)),
            (None, Some(libc::SIGABRT)),
        ] {
            let h = with(
                good(),
                vec![exit(4.2, Task::Worker(1), code, signal, false)],
            );
            assert_eq!(flagged(h), ["no-crash"], "{code:?} {signal:?}");
        }
        // A SIGKILL the harness did not send.
        let h = with(
            good(),
            vec![exit(4.2, Task::Worker(1), None, Some(9), false)],
        );
        assert_eq!(flagged(h), ["no-crash"]);
        // The harness's SIGTERM, and a runtime error (1) restarted once.
        let h = with(
            good(),
            vec![
                exit(4.2, Task::Worker(1), None, Some(libc::SIGTERM), true),
                exit(4.3, Task::Worker(0), Some(1), None, false),
            ],
        );
        assert_eq!(flagged(h), Vec::<&str>::new());
    }

    #[test]
    fn a_restart_loop_is_flagged() {
        let fails: Vec<Event> = (0..4)
            .map(|i| exit(3.0 + f64::from(i), Task::Worker(1), Some(1), None, false))
            .collect();
        assert_eq!(flagged(with(good(), fails.clone())), ["no-restart-loop"]);
        // The same failures far apart are not a loop.
        let spread: Vec<Event> = (0..4)
            .map(|i| {
                exit(
                    -200.0 + 40.0 * f64::from(i),
                    Task::Worker(1),
                    Some(1),
                    None,
                    false,
                )
            })
            .collect();
        assert_eq!(flagged(with(good(), spread)), Vec::<&str>::new());
    }

    #[test]
    fn a_run_that_does_not_complete_or_completes_late_is_flagged() {
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Done { .. }));
        assert_eq!(flagged(h), ["completes"]);
        let mut h = good();
        for e in &mut h {
            if let What::Done { complete, .. } = &mut e.what {
                *complete = false;
            }
        }
        assert_eq!(flagged(h), ["completes"]);
        let mut h = good();
        for e in &mut h {
            if matches!(e.what, What::Done { .. }) {
                e.t = 200.0;
            }
        }
        assert_eq!(flagged(h), ["completes"]);
    }

    #[test]
    fn a_process_left_running_is_flagged() {
        let h = with(
            good(),
            vec![ev(
                7.0,
                What::Leftover {
                    text: "4242 dtf-ps --task 0".into(),
                },
            )],
        );
        assert_eq!(flagged(h), ["no-leftover"]);
    }

    #[test]
    fn accuracy_outside_the_band_is_flagged() {
        let h = with(
            good(),
            vec![ev(
                7.5,
                What::Accuracy {
                    ema: 0.70,
                    reference: 0.96,
                },
            )],
        );
        assert_eq!(flagged(h), ["accuracy"]);
    }

    #[test]
    fn the_report_shows_the_history_around_each_violation_and_the_replay_command() {
        let mut h = good();
        h.retain(|e| !matches!(e.what, What::Fault { .. }));
        let v = check(&h, &Expect::default());
        let r = report(&h, &v, "scripts/chaos.sh --seed 7");
        assert!(r.contains("VIOLATION [step-monotonic]"), "{r}");
        assert!(r.contains("status: step 300 checkpoint 200"), "{r}");
        assert!(r.contains("exit ps:0: code - signal 9"), "{r}");
        assert!(r.ends_with("replay: scripts/chaos.sh --seed 7\n"), "{r}");
    }
}
