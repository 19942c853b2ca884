//! The step's buffers, reused every step, and the throughput the worker
//! reports to systemd.

use super::*;

/// What one step reads and writes, allocated once: the hot path allocates
/// no activations or gradients.
pub(super) struct StepBuffers {
    /// This worker's shuffled order of the training examples.
    pub(super) batches: Batches,
    /// The mini-batch's inputs.
    pub(super) x: Array2<f32>,
    /// The mini-batch's labels.
    pub(super) y: Vec<u8>,
    /// The mini-batch's labels as values, for a regression model.
    pub(super) values: Vec<f32>,
    /// The parameters as last pulled.
    pub(super) params: Vec<ArrayD<f32>>,
    /// Activations and their gradients.
    pub(super) ws: model::Workspace,
    /// Wide & deep's batch: dense x, labels and the categorical ids.
    pub(super) batch: data::Batch,
    /// Wide & deep's rows: the batch's ids deduplicated, their gradients.
    pub(super) sparse: SparseBuffers,
    /// The gradient pushed to the ps tasks.
    pub(super) grads: Vec<ArrayD<f32>>,
    /// The membership epoch each ps last answered with.
    pub(super) epochs: Vec<u64>,
}

impl StepBuffers {
    pub(super) fn new(w: &Worker, cfg: &Config) -> Self {
        let batch = cfg.train.batch_size;
        // Dropout's masks: each worker its own, apart from its shuffling's.
        let dropout_seed = cfg.train.seed ^ (0x6472_6f70_0000_0000 | w.task as u64);
        let params: Vec<ArrayD<f32>> = w
            .model
            .variables()
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        StepBuffers {
            batches: Batches::new(
                w.train.len(),
                batch,
                cfg.train.seed.wrapping_add(1 + w.task as u64),
            ),
            x: Array2::zeros((batch, w.train.features())),
            y: Vec::with_capacity(batch),
            values: Vec::new(),
            grads: params.clone(),
            params,
            epochs: vec![0; w.cluster.num_ps()],
            ws: model::Workspace::seeded(dropout_seed),
            batch: data::Batch::default(),
            sparse: SparseBuffers {
                ws: model::wide_deep::Workspace::seeded(dropout_seed),
                ..SparseBuffers::default()
            },
        }
    }
}

/// Wide & deep's per-step buffers beside [`StepBuffers`]'.
#[derive(Default)]
pub(super) struct SparseBuffers {
    /// The batch's distinct ids and each occurrence's row.
    pub(super) dedup: model::wide_deep::Dedup,
    /// The deep part's activations and their gradients.
    pub(super) ws: model::wide_deep::Workspace,
    /// The pulled rows' gradients.
    pub(super) row_grads: model::wide_deep::RowGrads,
}

/// Counts this worker's steps and logs the rates every
/// `train.log_step_count_steps` (TensorFlow's `StepCounterHook`).
pub(super) struct Rate {
    /// Steps this worker computed.
    pub(super) local_steps: u64,
    /// When the current window started.
    pub(super) since: Instant,
    /// The global step when it started.
    pub(super) global_step: u64,
    /// Steps this worker computed in it.
    pub(super) steps: u64,
}

impl Rate {
    pub(super) fn new(global_step: u64) -> Self {
        Rate {
            local_steps: 0,
            since: Instant::now(),
            global_step,
            steps: 0,
        }
    }

    /// One local step done; the cluster is at `global_step`.
    pub(super) fn step(
        &mut self,
        cfg: &Config,
        global_step: u64,
        loss: f32,
        reporter: &dyn Reporter,
    ) {
        self.local_steps += 1;
        self.steps += 1;
        if !self
            .local_steps
            .is_multiple_of(cfg.train.log_step_count_steps)
        {
            return;
        }
        let secs = self.since.elapsed().as_secs_f64().max(1e-9);
        let gsps = global_step.saturating_sub(self.global_step) as f64 / secs;
        let eps = self.steps as f64 * cfg.train.batch_size as f64 / secs;
        info!(
            global_step,
            loss = %format!("{loss:.4}"),
            global_steps_per_sec = %format!("{gsps:.1}"),
            examples_per_sec = %format!("{eps:.0}"),
            "Progress."
        );
        reporter.status(&format!(
            "step {global_step} loss {loss:.4} {eps:.0} examples/s"
        ));
        *self = Rate {
            local_steps: self.local_steps,
            ..Rate::new(global_step)
        };
    }
}
