//! What a chaos run records: every observation and every action, with the
//! seconds since the cluster was started. The checker reads nothing else,
//! so a history written by hand tests it (`checker.rs`'s tests).

use super::nemesis::{Bound, Task};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the start.
    pub t: f64,
    /// What happened or was seen.
    pub what: What,
}

/// What an entry says.
#[derive(Debug, Clone, PartialEq)]
pub enum What {
    /// `dtf status --json`: each ps's step when it answered initialized
    /// (ps 0's is the global step), the run's completeness, the newest
    /// checkpoint's step.
    Status {
        /// Each ps's step (None: unreachable or uninitialized).
        steps: Vec<Option<u64>>,
        /// A ps or the final checkpoint says the run is complete.
        complete: bool,
        /// The newest checkpoint that verifies.
        checkpoint: Option<u64>,
    },
    /// A task's `/metrics`: `dtf_global_step` and
    /// `dtf_checkpoint_failures_total` where it has them.
    Metrics {
        /// Whose.
        task: Task,
        /// `dtf_global_step`.
        global_step: Option<f64>,
        /// `dtf_checkpoint_failures_total`.
        checkpoint_failures: Option<f64>,
    },
    /// The chief's log: it restored these ps tasks' shards from the
    /// checkpoint at `step`.
    Restored {
        /// The ps tasks re-seeded.
        ps: Vec<usize>,
        /// The checkpoint's step.
        step: u64,
    },
    /// The chief's log: ps `ps` restarted with a snapshot of its own, which
    /// the chief adopted; the shard resumes at `step`. The shard held that
    /// step then, though the first status sample may see it only after it
    /// trained on (seed 22).
    Adopted {
        /// The ps task.
        ps: usize,
        /// The step it resumes at: its snapshot's (in sync mode with
        /// several ps, that of the shards that kept running).
        step: u64,
    },
    /// A fault injected, with the most it may cost the global step.
    Fault {
        /// `Nemesis::kind`.
        kind: &'static str,
        /// Its description.
        text: String,
        /// docs/design.md's promise for it.
        bound: Bound,
    },
    /// A fault's first part, before it strikes (and before its `Fault`
    /// entry): a ps's state directory copied aside, its snapshot writes
    /// made to fail.
    Prepare {
        /// What was done.
        text: String,
    },
    /// A fault's end (a task started again, resumed, the disk freed...).
    Heal {
        /// What was undone.
        text: String,
    },
    /// A task started (by the harness or its stand-in for systemd).
    Start {
        /// Which.
        task: Task,
    },
    /// A task exited.
    Exit {
        /// Which.
        task: Task,
        /// Its exit code, if it exited.
        code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
        /// The harness caused it (SIGKILL, or SIGTERM of a restart).
        by_harness: bool,
    },
    /// A checkpoint file checked after the run: its step, or why it does not verify.
    Verified {
        /// The file's name.
        file: String,
        /// Its step, or the error.
        result: Result<u64, String>,
    },
    /// The end of the run as the harness saw it.
    Done {
        /// `train.last_step` in the final config.
        last_step: u64,
        /// Every task exited 0 and a final checkpoint is there.
        complete: bool,
    },
    /// EMA test accuracy of the final checkpoint, and of a fault-free run
    /// of the same steps.
    Accuracy {
        /// This run's.
        ema: f32,
        /// The fault-free run's.
        reference: f32,
    },
    /// A process of this run still alive after it ended.
    Leftover {
        /// Its pid and command line.
        text: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:8.2}s  ", self.t)?;
        match &self.what {
            What::Status {
                steps,
                complete,
                checkpoint,
            } => write!(
                f,
                "status: step {} checkpoint {}{}",
                steps.iter().map(opt).collect::<Vec<_>>().join("/"),
                opt(checkpoint),
                if *complete { " complete" } else { "" }
            ),
            What::Metrics {
                task,
                global_step,
                checkpoint_failures,
            } => write!(
                f,
                "metrics {task}: dtf_global_step {} dtf_checkpoint_failures_total {}",
                opt(global_step),
                opt(checkpoint_failures)
            ),
            What::Fault { text, bound, .. } => write!(f, "FAULT {text} (may lose: {bound:?})"),
            What::Restored { ps, step } => write!(f, "chief restored ps {ps:?} from step {step}"),
            What::Adopted { ps, step } => {
                write!(
                    f,
                    "chief adopted ps:{ps}'s own snapshot: resumes at step {step}"
                )
            }
            What::Prepare { text } => write!(f, "prepare: {text}"),
            What::Heal { text } => write!(f, "heal: {text}"),
            What::Start { task } => write!(f, "start {task}"),
            What::Exit {
                task,
                code,
                signal,
                by_harness,
            } => write!(
                f,
                "exit {task}: code {} signal {}{}",
                opt(code),
                opt(signal),
                if *by_harness { " (the harness's)" } else { "" }
            ),
            What::Verified { file, result } => match result {
                Ok(step) => write!(f, "verified {file}: step {step}"),
                Err(e) => write!(f, "DOES NOT VERIFY {file}: {e}"),
            },
            What::Done {
                last_step,
                complete,
            } => write!(f, "done: last_step {last_step}, complete {complete}"),
            What::Accuracy { ema, reference } => {
                write!(f, "EMA accuracy {ema:.4}, fault-free {reference:.4}")
            }
            What::Leftover { text } => write!(f, "LEFT RUNNING: {text}"),
        }
    }
}

fn opt<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), |v| v.to_string())
}

/// A history being recorded, shared by the driver and the poller.
#[derive(Clone)]
pub struct Recorder {
    /// When the run started.
    start: Instant,
    /// The entries, in the order recorded.
    events: Arc<Mutex<Vec<Event>>>,
    /// Held through one [`Recorder::observe`].
    observing: Arc<Mutex<()>>,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Arc::default(),
            observing: Arc::default(),
        }
    }

    /// Records what `look` saw, one look at a time. Two `dtf status` calls
    /// that overlap can end in the other order than they read the ps: the
    /// one that read first, recorded last, made the step seem to go back
    /// (seed 48, by 10 steps, on a loaded machine).
    pub fn observe(&self, look: impl FnOnce() -> Option<What>) {
        let _one = self.observing.lock().unwrap();
        if let Some(what) = look() {
            self.record(what);
        }
    }

    /// Seconds since the start.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Records `what` now. A poll records what it saw when it ends: a
    /// checkpoint it saw existed by then, which is what the checker's
    /// bounds need.
    pub fn record(&self, what: What) {
        let t = self.now();
        self.events.lock().unwrap().push(Event { t, what });
    }

    /// The history so far, by time.
    pub fn events(&self) -> Vec<Event> {
        let mut e = self.events.lock().unwrap().clone();
        e.sort_by(|a, b| a.t.total_cmp(&b.t));
        e
    }
}
