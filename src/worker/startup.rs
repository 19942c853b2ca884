//! Before the first step: the model initialized on every ps (by the chief,
//! or awaited by the others), and a re-shard's placement recognised.

use super::*;

impl Worker {
    /// The ps tasks whose shard is not the one this worker's placement
    /// gives them, or that are re-sharding: a re-shard is under way (or
    /// the hosts' files disagree on `cluster.ps`), and they are not to be
    /// trained against or seeded.
    pub(super) fn placed_otherwise(&self, states: &[PsState]) -> Vec<usize> {
        states
            .iter()
            .enumerate()
            .filter(|&(ps, s)| {
                s.resharding
                    || !s
                        .variables
                        .iter()
                        .map(String::as_str)
                        .eq(self.cluster.shard(ps).map(|v| v.name.as_str()))
            })
            .map(|(ps, _)| ps)
            .collect()
    }

    /// Sleeps [`INIT_POLL`] between looks at the shards.
    ///
    /// Errors: [`WorkerError::Interrupted`] at once when the task is stopped.
    pub(super) async fn init_poll(&self) -> Result<(), WorkerError> {
        tokio::select! {
            _ = tokio::time::sleep(INIT_POLL) => Ok(()),
            _ = self.shutdown.cancelled() => Err(WorkerError::Interrupted),
        }
    }

    /// Waits until every shard is initialized (the chief initializes or
    /// restores those that are not). Returns true if the run is complete.
    pub(super) async fn ensure_initialized(&mut self) -> Result<bool, WorkerError> {
        let mut backoff = Backoff::new();
        // Its own log schedule: "waiting for the chief" is news as soon as
        // the ps answers, even just after a "waiting for the ps" line.
        let mut chief_wait = Backoff::new();
        let mut placed_wait = Backoff::new();
        let mut fetch_wait = Backoff::new();
        loop {
            if self.shutdown.is_cancelled() {
                return Err(WorkerError::Interrupted);
            }
            if self.resharding() {
                return Err(WorkerError::Reshard);
            }
            let states = match self.cluster.states().await {
                Ok(s) => s,
                Err(e) if e.is_unavailable() => {
                    backoff.wait(&e.to_string(), &self.shutdown).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            // A ps started with model.hidden waits for the widths the
            // chief resolved from the data; until then it holds no shard.
            let widthless: Vec<usize> = states
                .iter()
                .enumerate()
                .filter(|(_, s)| s.needs_widths)
                .map(|(ps, _)| ps)
                .collect();
            if !widthless.is_empty() {
                match &self.chief {
                    Some(_) => {
                        info!(ps = ?widthless, layers = ?self.model.layers(), "Sending the model's widths to ps tasks started with model.hidden.");
                        match self
                            .cluster
                            .send_widths(&widthless, self.model.layers())
                            .await
                        {
                            Err(e) if e.is_unavailable() => {
                                backoff.wait(&e.to_string(), &self.shutdown).await?;
                            }
                            Err(e) => return Err(e.into()),
                            Ok(()) => self.init_poll().await?,
                        }
                    }
                    None => {
                        if chief_wait.should_log() {
                            info!(ps = ?widthless, "Waiting for the chief to send the model's widths to ps tasks started with model.hidden.");
                        }
                        self.init_poll().await?;
                    }
                }
                continue;
            }
            let otherwise = self.placed_otherwise(&states);
            if !otherwise.is_empty() {
                // A ps of another list still stopped for a re-shard whose
                // word it missed (its reload came after the chief's): the
                // chief, started again under the new list, tells it again.
                // Not one of this chief's own list: that state is this
                // chief's to checkpoint, once its own file changes.
                let ours = crate::transport::cluster_id(&self.ps);
                let stopped: Vec<usize> = otherwise
                    .iter()
                    .copied()
                    .filter(|&ps| states[ps].resharding && states[ps].cluster != ours)
                    .collect();
                if let Some(chief) = self.chief.as_ref().filter(|_| !stopped.is_empty()) {
                    chief.tell_reshard(0, &stopped, false).await;
                }
                if placed_wait.should_log() {
                    warn!(ps = ?otherwise, cluster_ps = ?self.ps, "Waiting for ps tasks that hold another placement: a re-shard is under way, or their cluster.ps differs from this task's.");
                }
                self.init_poll().await?;
                continue;
            }
            if states.iter().any(|s| s.complete) {
                return Ok(true);
            }
            let missing: Vec<usize> = states
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.initialized)
                .map(|(i, _)| i)
                .collect();
            if missing.is_empty() {
                return Ok(false);
            }
            // A ps started on an empty disk fetches its shard's copy from
            // its ring neighbour: not to be seeded meanwhile.
            let fetching: Vec<usize> = missing
                .iter()
                .copied()
                .filter(|&ps| states[ps].fetching)
                .collect();
            if !fetching.is_empty() {
                if fetch_wait.should_log() {
                    info!(ps = ?fetching, "Waiting for ps tasks that fetch their shard's copy from their ring neighbour (they started with no snapshot of their own).");
                }
                self.init_poll().await?;
                continue;
            }
            let Some(chief) = &mut self.chief else {
                if chief_wait.should_log() {
                    info!(uninitialized_ps = ?missing, "Waiting for the chief to initialize the model.");
                }
                self.init_poll().await?;
                continue;
            };
            chief.fill(&states, &missing, &self.seen).await?;
        }
    }
}
