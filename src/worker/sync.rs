//! The waits of a sync step: for the step to advance, naming the workers
//! whose gradients are missing while it does not.

use super::*;

/// The workers (of `workers`) with no gradient for `step` at the ps whose
/// worker table is `heard`: `worker:1 (last push for step 40, 14 s ago),
/// worker:2 (never seen)`; `none` when every worker pushed for it (the ps
/// is applying it).
fn missing_workers(heard: &[WorkerContact], step: u64, workers: usize) -> String {
    let missing: Vec<String> = (0..workers)
        .filter_map(|w| {
            let latest = heard.iter().find(|c| c.task as usize == w);
            match latest {
                Some(c) if c.step >= step => None,
                Some(c) => Some(format!(
                    "worker:{w} (last push for step {}, {:.0} s ago)",
                    c.step,
                    c.since.as_secs_f64()
                )),
                None => Some(format!("worker:{w} (never seen)")),
            }
        })
        .collect();
    if missing.is_empty() {
        "none".into()
    } else {
        missing.join(", ")
    }
}

impl Worker {
    /// Sync: waits until every shard has moved past the step we pushed for.
    /// A shard still at the tagged step has our gradient pending; one behind
    /// it was restored from a checkpoint: compute afresh. So does a shard
    /// whose process is not the one the parameters were read from
    /// (`read_from`, incarnations): restored from its snapshot, it may be at
    /// the tagged step without our gradient, which died with its
    /// predecessor.
    pub(super) async fn wait_for_step(
        &mut self,
        mut progress: Progress,
        tags: &[u64],
        read_from: &[u64],
        last_progress: Instant,
        params: &mut [ArrayD<f32>],
    ) -> Result<Progress, WorkerError> {
        let mut waiting = Backoff::new();
        let want: Vec<u64> = tags.iter().map(|t| t + 1).collect();
        // A worker removed meanwhile stops waiting: its gradient is in, and
        // the ps tasks no longer wait for it. A shard at `last_step` takes
        // no more steps (its answer was `AtLastStep`): nothing to wait for.
        while !progress.complete
            && self.is_member()
            && !self.resharding()
            && self.cluster.incarnations() == read_from
            && progress
                .steps
                .iter()
                .zip(tags)
                .any(|(&now, &tag)| now == tag && now < self.config.borrow().train.last_step)
        {
            if last_progress.elapsed() > SYNC_STALL_LIMIT {
                return Err(WorkerError::Stalled {
                    secs: SYNC_STALL_LIMIT.as_secs(),
                    why: format!(
                        "waiting for step {} to be aggregated (train.replicas_to_aggregate)",
                        tags[0] + 1
                    ),
                });
            }
            if last_progress.elapsed() >= WAIT_LOG_EVERY && waiting.should_log() {
                let missing = match self.cluster.states().await {
                    Ok(states) => missing_workers(
                        &states[0].workers,
                        tags[0],
                        self.cfg().cluster.worker.len(),
                    ),
                    Err(e) => format!("unknown ({e})"),
                };
                info!(
                    step = tags[0],
                    waited_secs = last_progress.elapsed().as_secs(),
                    replicas_to_aggregate = self.cfg().replicas_to_aggregate(),
                    missing = %missing,
                    "Waiting for the other replicas' gradients."
                );
            }
            progress = self.pull(params, Some(&want)).await?;
        }
        Ok(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_sync_stall_names_the_workers_whose_gradient_is_missing() {
        let contact = |task, step, seconds_ago| WorkerContact {
            task,
            step,
            since: std::time::Duration::from_secs_f64(seconds_ago),
            examples_per_sec: 0.0,
            ..Default::default()
        };
        let heard = [contact(0, 41, 0.1), contact(1, 40, 14.0)];
        assert_eq!(
            missing_workers(&heard, 41, 3),
            "worker:1 (last push for step 40, 14 s ago), worker:2 (never seen)"
        );
        assert_eq!(missing_workers(&heard, 40, 2), "none");
    }
}
