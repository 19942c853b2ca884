//! What `dtf local` shows while it trains, and the figure it reports at the
//! end: the run's step timeline (ps 0's global step, as watched), a bar with
//! an ETA on a terminal, plain lines elsewhere (a pipe, CI, the journal),
//! where a bar would print nothing until the end.

use super::Progress;
use std::time::{Duration, Instant};

/// The run's steps as watched: where it started, and when each higher step
/// was first seen.
#[derive(Debug, Clone)]
pub(super) struct Timeline {
    /// When the tasks were started, and the step they resume from.
    start: (Instant, u64),
    /// The first look that found the cluster initialized, and its step.
    first: Option<(Instant, u64)>,
    /// When the highest step so far was first seen, and that step.
    last: Option<(Instant, u64)>,
}

impl Timeline {
    /// A run whose tasks start now, from `resumed` (the newest checkpoint's step, or 0).
    pub(super) fn new(resumed: u64) -> Self {
        Timeline {
            start: (Instant::now(), resumed),
            first: None,
            last: None,
        }
    }

    /// ps 0 said `step` now.
    pub(super) fn saw(&mut self, step: u64) {
        self.saw_at(Instant::now(), step);
    }

    fn saw_at(&mut self, now: Instant, step: u64) {
        if self.first.is_none() {
            self.first = Some((now, step));
        }
        if self.last.is_none_or(|(_, s)| step > s) {
            self.last = Some((now, step));
        }
    }

    /// Global steps per second over the run, which ended at `final_step`
    /// when every task had exited (`done`). The span is from the first look
    /// at the running cluster (else the start) to when the last step was
    /// first seen (else `done`, for steps made after the last look): a run
    /// shorter than one look still gets its rate. `None` when no step was made.
    pub(super) fn per_sec(&self, final_step: u64, done: Instant) -> Option<f64> {
        let from = self.first.unwrap_or(self.start);
        let to = match self.last {
            Some((t, s)) if s >= final_step => (t, s),
            _ => (done, final_step),
        };
        let rate = |(t0, s0): (Instant, u64), (t1, s1): (Instant, u64)| {
            let secs = t1.checked_duration_since(t0)?.as_secs_f64();
            (s1 > s0 && secs > 0.0).then(|| (s1 - s0) as f64 / secs)
        };
        rate(from, to).or_else(|| rate(self.start, (done, final_step)))
    }

    /// Steps per second lately: over the looks of the last few seconds.
    fn recent(&self) -> Option<f64> {
        let (t1, s1) = self.last?;
        let (t0, s0) = self.first?;
        let secs = t1.checked_duration_since(t0)?.as_secs_f64();
        (s1 > s0 && secs > 0.0).then(|| (s1 - s0) as f64 / secs)
    }
}

/// The progress display and its timeline.
pub(super) struct Display {
    /// How progress is shown.
    progress: Progress,
    /// The bar (hidden when progress goes as lines).
    bar: indicatif::ProgressBar,
    /// The last step.
    steps: u64,
    /// When the last line was printed.
    printed: Instant,
    /// The tenth of the run the last line was printed in.
    tenth: u64,
    /// The run's steps as watched.
    pub(super) timeline: Timeline,
}

impl Display {
    /// The display for a run to `steps` that resumes from `resumed`.
    pub(super) fn new(progress: Progress, steps: u64, resumed: u64) -> Self {
        let bar = match progress {
            Progress::Bar => {
                let bar = indicatif::ProgressBar::new(steps);
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] step {pos}/{len} ETA {eta} {msg}",
                ) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar.set_position(resumed.min(steps));
                bar.reset_eta();
                bar
            }
            Progress::Lines(_) => indicatif::ProgressBar::hidden(),
        };
        Display {
            progress,
            bar,
            steps,
            printed: Instant::now(),
            tenth: tenth(resumed, steps),
            timeline: Timeline::new(resumed),
        }
    }

    /// ps 0 is at `step`, its last loss and examples/s as given.
    pub(super) fn show(&mut self, step: u64, loss: f32, examples_per_sec: f64) {
        self.timeline.saw(step);
        match self.progress {
            Progress::Bar => {
                self.bar.set_position(step.min(self.steps));
                self.bar
                    .set_message(format!("loss {loss:.4} · {examples_per_sec:.0} examples/s"));
            }
            Progress::Lines(every) => {
                let t = tenth(step, self.steps);
                if t > self.tenth || self.printed.elapsed() >= every {
                    self.tenth = t;
                    self.printed = Instant::now();
                    eprintln!("{}", self.line(step, loss));
                }
            }
        }
    }

    /// `dtf local: step 1200/20000 (6 %)  loss 0.4321  2345 steps/s  ETA 8 s`.
    fn line(&self, step: u64, loss: f32) -> String {
        let pct = step.min(self.steps) * 100 / self.steps.max(1);
        let mut line = format!(
            "dtf local: step {step}/{} ({pct} %)  loss {loss:.4}",
            self.steps
        );
        if let Some(rate) = self.timeline.recent() {
            let left = self.steps.saturating_sub(step) as f64 / rate;
            line.push_str(&format!(
                "  {rate:.0} steps/s  ETA {}",
                eta(Duration::from_secs_f64(left))
            ));
        }
        line
    }

    /// Training is over: the bar goes (its line is not left behind to be
    /// printed again under what follows).
    pub(super) fn clear(&self) {
        self.bar.finish_and_clear();
    }
}

/// Which tenth of a run to `steps` step `step` is in (0–10).
fn tenth(step: u64, steps: u64) -> u64 {
    step.min(steps) * 10 / steps.max(1)
}

/// `8 s`, `3 min 20 s`, `1 h 5 min`.
fn eta(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_shorter_than_one_look_still_has_a_rate() {
        let mut t = Timeline::new(0);
        let done = t.start.0 + Duration::from_millis(200);
        // Never seen running: the span is from the start to the end.
        let rate = t.per_sec(1000, done).unwrap();
        assert!((rate - 5000.0).abs() < 1.0, "{rate}");
        // Seen once at its last step: still a rate, not 0.
        t.saw_at(t.start.0 + Duration::from_millis(100), 1000);
        assert!(t.per_sec(1000, done).unwrap() > 0.0);
        // Seen moving: the rate between the looks.
        let mut t = Timeline::new(100);
        let s = t.start.0;
        t.saw_at(s + Duration::from_secs(1), 200);
        t.saw_at(s + Duration::from_secs(2), 1200);
        assert_eq!(t.per_sec(1200, s + Duration::from_secs(3)), Some(1000.0));
        // No step made: no figure.
        let t = Timeline::new(500);
        assert_eq!(t.per_sec(500, t.start.0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn eta_reads_as_a_person_would_say_it() {
        assert_eq!(eta(Duration::from_secs(8)), "8 s");
        assert_eq!(eta(Duration::from_secs(200)), "3 min 20 s");
        assert_eq!(eta(Duration::from_secs(3900)), "1 h 5 min");
        assert_eq!((tenth(0, 100), tenth(55, 100), tenth(500, 100)), (0, 5, 10));
    }
}
