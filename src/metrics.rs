//! Prometheus metrics: one process-wide registry of dtf's counters, gauges and
//! histograms ([`global`]), and the `/metrics` HTTP endpoint ([`spawn`]) that
//! every daemon serves when `metrics.listen` is set.
//!
//! The metrics live in a global so that instrumenting the worker and ps costs
//! one line per hook and no plumbing; which of them a daemon exposes depends
//! on its role (a ps has no push latency, a worker no stale gradients).
//!
//! `metrics.listen` is one address in the one cluster-wide config file. The
//! usual deployment runs one task per host, so the same `host:port` (say
//! `0.0.0.0:9464`) works everywhere. Tasks that share a host override it per
//! process with the environment, `DTF_METRICS__LISTEN=127.0.0.1:9465` (a
//! systemd drop-in's `Environment=` for `dtf-worker@1`, say): the same
//! layering every other key has, rather than a port offset per task that
//! nobody would guess. A changed `metrics.listen` applies on reload.
//!
//! Which metrics a role exposes is `registry`'s (one [`Registry`] per
//! process, built by role); the handles, their updates, the scrape-time
//! sources and the endpoint are here.
//!
//! The ps's numbers come from its own `State` RPC answer, read at scrape time,
//! so the ps service needs no instrumentation beyond [`observe_ps`].

mod registry;

use crate::config::{Config, Role};
use crate::transport::PsState;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use ndarray::ArrayD;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// The content type of the OpenMetrics text format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric a dtf process keeps. Cheap handles: clones share the value.
pub struct Metrics {
    /// `dtf_up{role,task}`: 1 while the process runs.
    up: Family<Labels, Gauge>,
    /// `dtf_global_step`: the global step last seen (ps: this shard's step).
    global_step: Gauge,
    /// `dtf_steps_total`: worker: steps computed here; ps: updates applied.
    steps: Counter,
    /// `dtf_examples_total`: examples this worker trained on.
    examples: Counter,
    /// `dtf_loss`: training loss of the latest batch (ps: latest push).
    loss: FloatGauge,
    /// `dtf_learning_rate`: the learning rate of the latest step.
    learning_rate: FloatGauge,
    /// `dtf_push_seconds`: round trip of a (fused) push to every ps.
    push_seconds: Histogram,
    /// `dtf_pull_seconds`: round trip of a pull from every ps (sync: includes the wait for the step).
    pull_seconds: Histogram,
    /// `dtf_sent_bytes_total`: tensor bytes this worker sent (gradients).
    sent_bytes: Counter,
    /// `dtf_received_bytes_total`: tensor bytes this worker received (parameters).
    received_bytes: Counter,
    /// `dtf_stale_gradients_total`: ps, sync: gradients dropped as stale.
    stale_gradients: Counter,
    /// `dtf_initialized`: ps: 1 once its shard has values.
    initialized: Gauge,
    /// When the chief last wrote a checkpoint, for `dtf_checkpoint_age_seconds`.
    checkpoint_at: Mutex<Option<SystemTime>>,
    /// `dtf_checkpoint_age_seconds`: set from `checkpoint_at` at scrape time.
    checkpoint_age: FloatGauge,
    /// `dtf_checkpoint_duration_seconds`: how long the latest checkpoint took to write.
    checkpoint_duration: FloatGauge,
    /// `dtf_checkpoint_failures_total`: checkpoints the chief could not write.
    checkpoint_failures: Counter,
    /// `dtf_reloads_total{result="ok|rejected"}`.
    reloads: Family<Labels, Counter>,
    /// `dtf_ps_transport{ps,transport}`: worker: 1 for the transport its
    /// latest call to each ps took (`shm` or `tcp`), 0 for the other.
    ps_transport: Family<Labels, Gauge>,
    /// `dtf_shm_connections`: ps: open shared-memory connections (the rest are TCP).
    shm_connections: Gauge,
    /// `dtf_ps_link_sent_bytes_total{ps}`: worker: gRPC message bytes sent to each ps over TCP.
    link_sent: Family<Labels, Counter>,
    /// `dtf_ps_link_received_bytes_total{ps}`: worker: gRPC message bytes received from each ps over TCP.
    link_received: Family<Labels, Counter>,
    /// `dtf_ps_compression{ps,compression}`: worker: 1 for the compression
    /// of its link to each ps (`none` over shared memory); ps (no `ps`
    /// label): 1 for its own `cluster.compression`.
    compression: Family<Labels, Gauge>,
    /// `dtf_kernel{precision,tier}`: worker: 1 for the precision policy and
    /// the kernel tier its GEMMs run on (`kernel::tier`).
    kernel: Family<Labels, Gauge>,
    /// `dtf_denormals_flushed`: 1 when the thread that ran the latest step
    /// (worker), update (ps) or evaluation had FTZ and DAZ set, 0 when not,
    /// read from the thread itself (`kernel::denormals_flushed`); -1 until
    /// the first.
    denormals_flushed: Gauge,
    /// `dtf_membership_epoch`: ps: its membership epoch; worker: ps 0's, as last heard.
    membership_epoch: Gauge,
    /// `dtf_members`: ps: the workers in its `cluster.worker`.
    members: Gauge,
    /// `dtf_membership_refusals_total`: ps: pushes refused by the membership.
    membership_refusals: Counter,
    /// `dtf_snapshot_age_seconds`: ps: age of its newest snapshot's state (-1: none).
    snapshot_age: FloatGauge,
    /// `dtf_snapshot_step`: ps: the step of its newest snapshot.
    snapshot_step: Gauge,
    /// `dtf_snapshot_duration_seconds`: ps: how long the latest snapshot took to write.
    snapshot_duration: FloatGauge,
    /// `dtf_snapshot_copy_seconds`: ps: how long the latest snapshot held the shard lock.
    snapshot_copy: FloatGauge,
    /// `dtf_snapshot_bytes`: ps: size of the latest snapshot file.
    snapshot_bytes: Gauge,
    /// `dtf_snapshot_delta`: ps: the latest snapshot is the Nth delta
    /// after a whole one (0: whole; `ps.snapshot_full_every`).
    snapshot_delta: Gauge,
    /// `dtf_snapshot_failures_total`: ps: snapshots that could not be written.
    snapshot_failures: Counter,
    /// `dtf_snapshot_replica_step`: ps: the step of the newest snapshot its ring neighbour keeps.
    replica_step: Gauge,
    /// `dtf_snapshot_replica_failures_total`: ps: snapshots its neighbour did not take.
    replica_failures: Counter,
    /// `dtf_ps_memory_full`: ps: 1 while its tables create no rows (near
    /// its cgroup's memory limit, `ps::memory`).
    memory_full: Gauge,
    /// `dtf_table_rows{table}`: ps: rows of each embedding table it holds.
    table_rows: Family<Labels, Gauge>,
    /// `dtf_table_rows_evicted_total{table}`: ps: rows evicted (`model.tables`).
    table_evicted: Family<Labels, Counter>,
    /// `dtf_table_ids_refused_total{table}`: ps: gradient rows dropped, the
    /// id not yet admitted (`min_count`) or no room (`max_rows`).
    table_refused: Family<Labels, Counter>,
    /// `dtf_eval_accuracy`: evaluator: test accuracy of the newest checkpoint scored.
    eval_accuracy: FloatGauge,
    /// `dtf_eval_ema_accuracy`: evaluator: its EMA test accuracy.
    eval_ema_accuracy: FloatGauge,
    /// `dtf_eval_loss`: evaluator: its test loss.
    eval_loss: FloatGauge,
    /// `dtf_eval_auc`: evaluator: its test AUC (wide & deep; NaN for the MLP).
    eval_auc: FloatGauge,
    /// `dtf_eval_ema_auc`: evaluator: its EMA test AUC (as `eval_auc`).
    eval_ema_auc: FloatGauge,
    /// `dtf_eval_best_score`: evaluator: the best checkpoint's `[eval] metric`.
    eval_best: FloatGauge,
    /// `dtf_eval_checkpoints_total`: evaluator: checkpoints scored by this process.
    eval_checkpoints: Counter,
    /// `dtf_eval_skipped_total`: evaluator: checkpoints that did not verify.
    eval_skipped: Counter,
    /// Serializes the ps's refresh so two scrapes do not add a delta twice.
    refresh: tokio::sync::Mutex<()>,
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    /// Fresh metrics; a process uses [`global`].
    fn new() -> Self {
        Self {
            up: Family::default(),
            global_step: Gauge::default(),
            steps: Counter::default(),
            examples: Counter::default(),
            loss: FloatGauge::default(),
            learning_rate: FloatGauge::default(),
            // 0.5 ms .. ~16 s.
            push_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            pull_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            sent_bytes: Counter::default(),
            received_bytes: Counter::default(),
            stale_gradients: Counter::default(),
            initialized: Gauge::default(),
            checkpoint_at: Mutex::new(None),
            checkpoint_age: FloatGauge::default(),
            checkpoint_duration: FloatGauge::default(),
            checkpoint_failures: Counter::default(),
            reloads: Family::default(),
            ps_transport: Family::default(),
            shm_connections: Gauge::default(),
            link_sent: Family::default(),
            link_received: Family::default(),
            compression: Family::default(),
            kernel: Family::default(),
            denormals_flushed: {
                let g = Gauge::default();
                g.set(-1);
                g
            },
            membership_epoch: Gauge::default(),
            members: Gauge::default(),
            membership_refusals: Counter::default(),
            snapshot_age: FloatGauge::default(),
            snapshot_step: Gauge::default(),
            snapshot_duration: FloatGauge::default(),
            snapshot_copy: FloatGauge::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_delta: Gauge::default(),
            snapshot_failures: Counter::default(),
            replica_step: Gauge::default(),
            replica_failures: Counter::default(),
            memory_full: Gauge::default(),
            table_rows: Family::default(),
            table_evicted: Family::default(),
            table_refused: Family::default(),
            eval_accuracy: FloatGauge::default(),
            eval_ema_accuracy: FloatGauge::default(),
            eval_loss: FloatGauge::default(),
            eval_auc: FloatGauge::default(),
            eval_ema_auc: FloatGauge::default(),
            eval_best: FloatGauge::default(),
            eval_checkpoints: Counter::default(),
            eval_skipped: Counter::default(),
            refresh: tokio::sync::Mutex::new(()),
        }
    }
}

fn tensor_bytes(tensors: &[ArrayD<f32>]) -> u64 {
    tensors
        .iter()
        .map(|t| (t.len() * size_of::<f32>()) as u64)
        .sum()
}

impl Metrics {
    /// A worker finished a step: the global step it now sees, the batch size,
    /// and the step's loss and learning rate.
    pub fn step(&self, global_step: u64, examples: usize, loss: f32, learning_rate: f32) {
        self.global_step.set(global_step as i64);
        self.steps.inc();
        self.examples.inc_by(examples as u64);
        self.loss.set(f64::from(loss));
        self.learning_rate.set(f64::from(learning_rate));
    }

    /// A worker's push round trip: the gradients it sent and, if it succeeded,
    /// the parameters that came back (fused pull).
    pub fn pushed(&self, took: Duration, sent: &[ArrayD<f32>], received: &[ArrayD<f32>], ok: bool) {
        self.push_seconds.observe(took.as_secs_f64());
        self.sent_bytes.inc_by(tensor_bytes(sent));
        if ok {
            self.received_bytes.inc_by(tensor_bytes(received));
        }
    }

    /// A worker's successful pull of `received`.
    pub fn pulled(&self, took: Duration, received: &[ArrayD<f32>]) {
        self.pull_seconds.observe(took.as_secs_f64());
        self.received_bytes.inc_by(tensor_bytes(received));
    }

    /// The chief wrote a checkpoint; it took `took`.
    pub fn checkpoint_written(&self, took: Duration) {
        *self.checkpoint_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(SystemTime::now());
        self.checkpoint_duration.set(took.as_secs_f64());
    }

    /// A worker's transport to each ps (index order), as `Cluster::transports` says.
    pub fn transports(&self, via: &[crate::transport::Via]) {
        for (ps, via) in via.iter().enumerate() {
            for name in ["shm", "tcp"] {
                self.ps_transport
                    .get_or_create(&vec![
                        ("ps".into(), ps.to_string()),
                        ("transport".into(), name.into()),
                    ])
                    .set(i64::from(via.to_string() == name));
            }
        }
    }

    /// A worker's precision policy and the kernel tier its GEMMs run on.
    pub fn kernel(&self, precision: crate::kernel::Precision, tier: crate::kernel::Tier) {
        self.kernel
            .get_or_create(&vec![
                ("precision".into(), precision.name().into()),
                ("tier".into(), tier.name().into()),
            ])
            .set(1);
    }

    /// The calling thread just computed (a step, an update, an
    /// evaluation): records whether it flushes denormals. One read of
    /// MXCSR and one store.
    pub fn computed_here(&self) {
        self.denormals_flushed
            .set(i64::from(crate::kernel::denormals_flushed()));
    }

    /// A worker heard membership epoch `epoch` from ps 0.
    pub fn membership_epoch(&self, epoch: u64) {
        self.membership_epoch.set(epoch as i64);
    }

    /// The chief could not write a checkpoint.
    pub fn checkpoint_failed(&self) {
        self.checkpoint_failures.inc();
    }

    /// The evaluator scored the checkpoint at `step`; `best` is the best
    /// checkpoint's score by `[eval] metric`.
    pub fn evaluated(&self, step: u64, scores: crate::eval::Scores, best: Option<f32>) {
        self.global_step.set(step as i64);
        self.eval_accuracy.set(f64::from(scores.accuracy));
        self.eval_ema_accuracy.set(f64::from(scores.ema_accuracy));
        self.eval_loss.set(f64::from(scores.loss));
        self.eval_auc.set(f64::from(scores.auc));
        self.eval_ema_auc.set(f64::from(scores.ema_auc));
        if let Some(b) = best {
            self.eval_best.set(f64::from(b));
        }
        self.eval_checkpoints.inc();
    }

    /// The evaluator skipped a checkpoint that does not verify.
    pub fn eval_skipped(&self) {
        self.eval_skipped.inc();
    }

    /// A reload was applied (`ok`) or rejected.
    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "rejected" };
        self.reloads
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
    }

    /// Brings the scrape-time values up to date.
    async fn refresh(&self) {
        let _one = self.refresh.lock().await;
        if let Some(at) = *self.checkpoint_at.lock().unwrap_or_else(|e| e.into_inner()) {
            self.checkpoint_age
                .set(at.elapsed().unwrap_or_default().as_secs_f64());
        }
        if let Some(links) = LINKS.get() {
            for (ps, l) in links().into_iter().enumerate() {
                let labels = vec![("ps".into(), ps.to_string())];
                // The links count since the process started, as these counters do.
                let sent = self.link_sent.get_or_create(&labels);
                sent.inc_by(l.sent.saturating_sub(sent.get()));
                let received = self.link_received.get_or_create(&labels);
                received.inc_by(l.received.saturating_sub(received.get()));
                for name in ["none", "bf16", "onebit"] {
                    let mut labels = labels.clone();
                    labels.push(("compression".into(), name.into()));
                    self.compression
                        .get_or_create(&labels)
                        .set(i64::from(l.compression == name));
                }
            }
        }
        let Some(ps) = PS.get() else { return };
        let s = ps();
        self.compression
            .get_or_create(&vec![("compression".into(), s.compression.clone())])
            .set(1);
        self.shm_connections.set(i64::from(s.shm_connections));
        self.global_step.set(s.global_step as i64);
        self.initialized.set(i64::from(s.initialized));
        self.loss.set(f64::from(s.last_loss));
        // The ps counts since its start, as these counters do: add the difference.
        let applied = s.updates_applied.max(s.pushes_applied);
        self.steps.inc_by(applied.saturating_sub(self.steps.get()));
        self.stale_gradients
            .inc_by(s.stale_gradients.saturating_sub(self.stale_gradients.get()));
        self.membership_refusals.inc_by(
            s.membership_refusals
                .saturating_sub(self.membership_refusals.get()),
        );
        self.membership_epoch.set(s.membership_epoch as i64);
        self.members.set(i64::from(s.members));
        self.snapshot_age.set(s.snapshot_age_seconds);
        self.snapshot_step.set(s.snapshot_step as i64);
        self.snapshot_duration.set(s.snapshot_seconds);
        self.snapshot_copy.set(s.snapshot_copy_seconds);
        self.snapshot_bytes.set(s.snapshot_bytes as i64);
        self.snapshot_delta.set(i64::from(s.snapshot_delta));
        self.snapshot_failures.inc_by(
            s.snapshot_failures
                .saturating_sub(self.snapshot_failures.get()),
        );
        self.replica_step.set(s.replica_step as i64);
        self.replica_failures.inc_by(
            s.replica_failures
                .saturating_sub(self.replica_failures.get()),
        );
        self.memory_full.set(i64::from(s.memory_full));
        for t in &s.tables {
            let labels = vec![("table".into(), t.table.clone())];
            self.table_rows
                .get_or_create(&labels)
                .set(i64::try_from(t.rows).unwrap_or(i64::MAX));
            let evicted = self.table_evicted.get_or_create(&labels);
            evicted.inc_by(t.evicted.saturating_sub(evicted.get()));
            let refused = self.table_refused.get_or_create(&labels);
            refused.inc_by(t.refused.saturating_sub(refused.get()));
        }
    }
}

/// Reads the ps's `State`: what the ps metrics come from.
type StateFn = Box<dyn Fn() -> PsState + Send + Sync>;

/// The ps whose `State` the ps metrics are read from.
static PS: OnceLock<StateFn> = OnceLock::new();

/// Reads a worker's links to the ps tasks.
type LinksFn = Box<dyn Fn() -> Vec<crate::transport::Link> + Send + Sync>;

/// The worker's links the link metrics are read from.
static LINKS: OnceLock<LinksFn> = OnceLock::new();

/// Makes `links` (a worker's `Cluster::links`) the source of this
/// process's per-ps link metrics (the first one wins).
pub fn observe_links(links: impl Fn() -> Vec<crate::transport::Link> + Send + Sync + 'static) {
    let _ = LINKS.set(Box::new(links));
}

/// Makes `state` (the ps's plain accessor) the source of this process's ps
/// metrics (the first one wins). A function, so that `metrics` needs nothing
/// from `ps`.
pub fn observe_ps(state: impl Fn() -> PsState + Send + Sync + 'static) {
    let _ = PS.set(Box::new(state));
}

impl Metrics {
    /// The text of `registry` (built by [`Metrics::registry`]) now: what `/metrics` serves.
    pub async fn render(&self, registry: &Registry) -> String {
        self.refresh().await;
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, registry);
        out
    }
}

async fn scrape(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        global().render(&registry).await,
    )
}

/// The `/metrics` server of a daemon; dropping it stops the server.
pub struct MetricsServer {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `/metrics` for this `role` task on `metrics.listen` while it is set,
/// moving when a reload changes it. A bind failure is logged; the task goes on
/// without metrics until the address changes.
pub fn spawn(role: Role, task: usize, mut config: watch::Receiver<Arc<Config>>) -> MetricsServer {
    let registry = Arc::new(global().registry(role, task));
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(registry);
    let task = tokio::spawn(async move {
        loop {
            let listen = config.borrow_and_update().metrics.listen.clone();
            if !listen.is_empty() {
                match tokio::net::TcpListener::bind(&listen).await {
                    Ok(l) => {
                        info!(listen = %l.local_addr().map(|a| a.to_string()).unwrap_or(listen.clone()), "Serving metrics on /metrics.");
                        let mut watch = config.clone();
                        let moved = async move {
                            while watch.changed().await.is_ok() {
                                if watch.borrow_and_update().metrics.listen != listen {
                                    return;
                                }
                            }
                        };
                        if let Err(e) = axum::serve(l, app.clone())
                            .with_graceful_shutdown(moved)
                            .await
                        {
                            warn!(error = %e, "Metrics server stopped.");
                        }
                        match config.has_changed() {
                            Ok(_) => continue,
                            Err(_) => return,
                        }
                    }
                    Err(e) => {
                        error!(listen, error = %e, "Cannot serve metrics (metrics.listen); set another address or DTF_METRICS__LISTEN.")
                    }
                }
            }
            if config.changed().await.is_err() {
                return;
            }
        }
    });
    MetricsServer { task }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn worker_text_has_the_documented_names() {
        let m = Metrics::new();
        m.step(7, 20, 0.5, 0.1);
        m.pushed(
            Duration::from_millis(3),
            &[ArrayD::zeros(vec![10])],
            &[ArrayD::zeros(vec![10])],
            true,
        );
        m.reloaded(false);
        m.checkpoint_written(Duration::from_millis(12));
        let text = m.render(&m.registry(Role::Worker, 0)).await;
        for name in [
            "dtf_up{role=\"worker\",task=\"0\"} 1",
            "dtf_global_step 7",
            "dtf_steps_total",
            "dtf_examples_total",
            "dtf_loss 0.5",
            "dtf_push_seconds_bucket",
            "dtf_sent_bytes_total",
            "dtf_checkpoint_age_seconds",
            "dtf_checkpoint_duration_seconds 0.012",
            "dtf_reloads_total{result=\"rejected\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(
            !text.contains("dtf_stale_gradients"),
            "a worker has no stale-gradient counter:\n{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
