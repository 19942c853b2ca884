//! The evaluator's best checkpoints: the ranking by `[eval] metric`, the
//! `keep_best` kept, and the directory (`checkpoint.dir/best`) that holds
//! their copies.

use crate::checkpoint::best::{BestDir, Entry, Index};
use crate::checkpoint::{self, CheckpointError};
use crate::config::Metric;
use crate::eval::Scores;
use std::path::Path;

/// The best checkpoints: the ranking, and the directory that holds them.
pub struct Best {
    /// `checkpoint.dir/best`.
    dir: BestDir,
    /// `[eval] metric`.
    pub(super) metric: Metric,
    /// `[eval] keep_best`.
    keep: usize,
    /// The kept checkpoints, best first.
    entries: Vec<Entry>,
}

impl Best {
    /// Opens `dir`, re-ranking what its index holds by `metric` and keeping
    /// `keep` (the config may have changed since it was written).
    ///
    /// Errors: [`CheckpointError::Io`] if the directory cannot be created or written.
    pub fn open(dir: &Path, metric: Metric, keep: usize) -> Result<Self, CheckpointError> {
        let (dir, index) = BestDir::open(dir)?;
        let mut best = Best {
            dir,
            metric,
            keep,
            entries: Vec::new(),
        };
        if let Some(index) = index {
            let before = index.checkpoints.clone();
            let (kept, removed) = best.rank(index.checkpoints);
            best.entries = kept;
            if best.entries != before || index.metric != metric.name() {
                best.dir.replace(&best.index(), None, &removed)?;
            }
        }
        Ok(best)
    }

    /// `entries` best first by the metric (ties: the older step first, so
    /// a checkpoint must beat the kept ones to replace them), cut at `keep`:
    /// (kept, steps of the rest).
    fn rank(&self, mut entries: Vec<Entry>) -> (Vec<Entry>, Vec<u64>) {
        let metric = self.metric;
        let score = |e: &Entry| e.scores.get(metric);
        entries.sort_by(|a, b| {
            let (x, y) = (score(a), score(b));
            let order = if metric.better(x, y) {
                std::cmp::Ordering::Less
            } else if metric.better(y, x) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            };
            // NaN ranks last: it is never better, nor is anything better than it.
            order
                .then_with(|| score(a).is_nan().cmp(&score(b).is_nan()))
                .then_with(|| a.global_step.cmp(&b.global_step))
        });
        let removed = entries
            .iter()
            .skip(self.keep)
            .map(|e| e.global_step)
            .collect();
        entries.truncate(self.keep);
        (entries, removed)
    }

    fn index(&self) -> Index {
        Index {
            metric: self.metric.name().into(),
            checkpoints: self.entries.clone(),
            pending: Vec::new(),
        }
    }

    /// The kept checkpoints, best first.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Offers a scored checkpoint, with the bytes of its two files. If it
    /// ranks among the best, they are written into the directory and the
    /// checkpoint that dropped out is removed. Returns whether it was kept.
    /// A checkpoint with a score that is not finite (diverged weights), or
    /// without the metric's score (an AUC of the MLP), is never kept: it
    /// would displace a usable one.
    ///
    /// Errors: [`CheckpointError::Io`]; the set is then unchanged.
    pub fn offer(
        &mut self,
        step: u64,
        scores: Scores,
        model: &[u8],
        ema: &[u8],
    ) -> Result<bool, CheckpointError> {
        if !scores.finite() || !scores.get(self.metric).is_finite() {
            scores_event!(
                warn,
                scores,
                step,
                "Checkpoint not kept among the best: a score is not a finite number."
            );
            return Ok(false);
        }
        let mut entries: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| e.global_step != step)
            .cloned()
            .collect();
        entries.push(Entry {
            file: checkpoint::model_file_name(step),
            global_step: step,
            scores,
        });
        let (kept, removed) = self.rank(entries);
        if !kept.iter().any(|e| e.global_step == step) {
            return Ok(false);
        }
        let index = Index {
            metric: self.metric.name().into(),
            checkpoints: kept.clone(),
            pending: Vec::new(),
        };
        self.dir
            .replace(&index, Some((step, model, ema)), &removed)?;
        self.entries = kept;
        Ok(true)
    }
}
