//! The parameter-server task: serves its shard over gRPC.
//!
//! [`serve`] is the entry point (an already-bound listener and a shutdown
//! token, so tests bind port 0). [`shard`] holds the update rules,
//! [`limits`] the bounds on connections and calls, [`tls`] the handshake.

pub mod limits;
pub mod shard;
pub mod tls;
pub mod workers;

use crate::auth::Credentials;
use crate::config::{Config, Mode, Role, TaskId};
use crate::model::Mlp;
use crate::pb;
use crate::pb::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::{placement, rpc};
use shard::{Pushed, Rule, Shard};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

/// How long a sync push or a `min_step` pull waits for the step to advance
/// before answering anyway; the caller then asks again. Bounded so no RPC
/// hangs on a dead peer.
const STEP_WAIT: Duration = Duration::from_secs(1);

/// How long a ps lingers after the run is complete, so that workers still
/// waiting on it hear so rather than finding it gone.
const COMPLETE_LINGER: Duration = Duration::from_secs(2);

/// Errors that stop a ps task.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// What the service shares between requests.
struct Inner {
    /// This task's index.
    task: usize,
    /// Random per process start: lets the chief see a restart.
    incarnation: u64,
    /// The shard, behind one lock: a push is atomic for the shard.
    shard: Mutex<Shard>,
    /// The shard's step, for waiters.
    step_tx: watch::Sender<u64>,
    /// Set when the chief declares the run complete.
    complete: CancellationToken,
    /// Throughput estimate: (window start, examples since then, last rate).
    rate: Mutex<(Instant, u64, f64)>,
    /// Examples per push (`train.batch_size`), for the rate.
    batch_size: u64,
    /// Response bytes pulls may have in flight.
    budget: limits::Budget,
    /// Refused calls, logged per peer.
    refusals: Arc<limits::RefusalLog>,
    /// Slots per variable of the optimizer (for the response budget).
    slots_per_var: u32,
    /// The live configuration (`train.last_step` bounds every push).
    config: watch::Receiver<Arc<Config>>,
    /// Every worker's latest push, for `State` (and so `dtf status`).
    workers: Mutex<workers::Workers>,
}

/// The gRPC service of one ps task.
#[derive(Clone)]
pub struct PsService {
    inner: Arc<Inner>,
}

impl PsService {
    /// Builds the shard of ps task `task` as `config` places the model;
    /// reloads of `config` move `train.last_step`.
    ///
    /// Errors: [`PsError::Model`] for a bad `model.layers`.
    pub fn new(config: watch::Receiver<Arc<Config>>, task: usize) -> Result<Self, PsError> {
        let live = config;
        let config: Arc<Config> = live.borrow().clone();
        let mlp = Mlp::new(&config.model.layers)?;
        let specs = placement::shard(
            &mlp.variables(),
            config.cluster.ps.len(),
            config.cluster.placement,
            task,
        );
        let rule = match config.train.mode {
            Mode::Async => Rule::Async,
            Mode::Sync => Rule::Sync {
                replicas: config.replicas_to_aggregate(),
                total: config.total_num_replicas(),
            },
        };
        let shard_bytes = specs
            .iter()
            .map(|s| 4 * s.shape.iter().product::<usize>())
            .sum();
        let optimizer = config.train.optimizer();
        let shard = Shard::new(
            task,
            specs,
            rule,
            config.train.moving_average_decay,
            optimizer,
        );
        Ok(Self {
            inner: Arc::new(Inner {
                task,
                incarnation: rand::random::<u64>() >> 1,
                shard: Mutex::new(shard),
                step_tx: watch::channel(0).0,
                complete: CancellationToken::new(),
                rate: Mutex::new((Instant::now(), 0, 0.0)),
                batch_size: config.train.batch_size as u64,
                budget: limits::Budget::new(shard_bytes),
                refusals: Arc::new(limits::RefusalLog::default()),
                slots_per_var: optimizer.slot_names().len() as u32,
                config: live,
                workers: Mutex::new(workers::Workers::new(config.cluster.worker.len())),
            }),
        })
    }

    /// The token cancelled when the run is complete.
    pub fn completed(&self) -> CancellationToken {
        self.inner.complete.clone()
    }

    /// Reserves response bytes for `snapshots` snapshots of the shard,
    /// logging a refusal with the caller's address.
    ///
    /// Errors: `RESOURCE_EXHAUSTED` when [`limits::RESPONSE_BUDGET`] is spent.
    fn reserve<T>(&self, req: &Request<T>, snapshots: u32) -> Result<limits::Reserved, Status> {
        self.inner.budget.reserve(snapshots).inspect_err(|e| {
            let peer = limits::peer(req.extensions());
            self.inner.refusals.refused(peer, e.message());
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock would be a bug in Shard; the state it
        // left is still the best there is, so keep serving it.
        self.inner.shard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Encodes the current values (and shadows, and slots) under the lock:
    /// a consistent snapshot.
    fn snapshot(
        &self,
        shard: &Shard,
        names: &[String],
        with_shadows: bool,
        with_slots: bool,
    ) -> Result<Snapshot, Status> {
        let values = shard.values()?;
        let pick = |i: usize| names.is_empty() || names.contains(&shard.specs()[i].name);
        for n in names {
            if !shard.specs().iter().any(|s| &s.name == n) {
                return Err(shard::ShardError::UnknownVariable {
                    ps: self.inner.task,
                    name: n.clone(),
                    held: shard.specs().iter().map(|s| s.name.clone()).collect(),
                }
                .into());
            }
        }
        let vars = (0..values.len())
            .filter(|&i| pick(i))
            .map(|i| rpc::encode(&shard.specs()[i].name, &values[i]))
            .collect();
        let shadows = if with_shadows {
            let sh = shard.shadows()?;
            (0..sh.len())
                .filter(|&i| pick(i))
                .map(|i| rpc::encode(&shard.specs()[i].name, &sh[i]))
                .collect()
        } else {
            Vec::new()
        };
        let slots = if with_slots {
            let slots = shard.slots()?;
            let specs = shard.optimizer().slot_specs(shard.specs());
            specs
                .iter()
                .filter(|spec| spec.var.is_none_or(pick))
                .map(|spec| match spec.var {
                    Some(i) => rpc::encode(&spec.name, &slots.per_var[i][spec.index]),
                    None => rpc::encode(
                        &spec.name,
                        &ndarray::ArrayD::from_elem(
                            ndarray::IxDyn(&[]),
                            slots.non_slots[spec.index],
                        ),
                    ),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok((vars, shadows, slots))
    }

    /// Waits (at most [`STEP_WAIT`]) until the step is at least `min_step` or the run is complete.
    async fn wait_for_step(&self, min_step: u64) {
        let mut rx = self.inner.step_tx.subscribe();
        let done = self.inner.complete.clone();
        let _ = tokio::time::timeout(STEP_WAIT, async {
            tokio::select! {
                _ = rx.wait_for(|&s| s >= min_step) => {}
                _ = done.cancelled() => {}
            }
        })
        .await;
    }

    fn count_examples(&self, examples: u64) {
        let mut r = self.inner.rate.lock().unwrap_or_else(|e| e.into_inner());
        r.1 += examples;
        let elapsed = r.0.elapsed().as_secs_f64();
        if elapsed >= 2.0 {
            r.2 = r.1 as f64 / elapsed;
            *r = (Instant::now(), 0, r.2);
        }
    }
}

/// A snapshot's (variables, shadows, slots) as wire tensors.
type Snapshot = (Vec<pb::Tensor>, Vec<pb::Tensor>, Vec<pb::Tensor>);

/// `tensors` checked as the shard's variables ([`Shard::arrange_bytes`]),
/// copied out in model order.
fn arranged(shard: &Shard, tensors: &[pb::Tensor]) -> Result<Vec<ndarray::ArrayD<f32>>, Status> {
    let views = tensors
        .iter()
        .map(rpc::view)
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = shard.arrange_bytes(views.iter().map(|v| (v.name, v.shape.as_slice(), v.data)))?;
    Ok(bytes
        .into_iter()
        .zip(shard.specs())
        .map(|(b, spec)| {
            ndarray::ArrayD::from_shape_vec(spec.shape.as_slice(), bytemuck::pod_collect_to_vec(b))
                .expect("arrange_bytes checked the shape")
        })
        .collect())
}

#[tonic::async_trait]
impl ParameterServer for PsService {
    async fn state(
        &self,
        _: Request<pb::StateRequest>,
    ) -> Result<Response<pb::StateResponse>, Status> {
        let s = self.lock();
        let c = s.counters();
        let rate = self.inner.rate.lock().unwrap_or_else(|e| e.into_inner()).2;
        let workers = self
            .inner
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .report(Instant::now())
            .into_iter()
            .map(|w| pb::WorkerContact {
                task: w.worker,
                step: w.step,
                seconds_ago: w.since.as_secs_f64(),
                examples_per_sec: w.examples_per_sec,
            })
            .collect();
        Ok(Response::new(pb::StateResponse {
            task: self.inner.task as u32,
            incarnation: self.inner.incarnation,
            initialized: s.is_initialized(),
            global_step: s.step(),
            complete: s.is_complete(),
            variables: s.specs().iter().map(|v| v.name.clone()).collect(),
            updates_applied: c.updates_applied,
            gradients_aggregated: c.gradients_aggregated,
            stale_gradients: c.stale_gradients,
            pushes_applied: c.pushes_applied,
            last_loss: s.last_loss(),
            examples_per_sec: rate,
            workers,
        }))
    }

    async fn initialize(
        &self,
        req: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
        let req = req.into_inner();
        if i64::try_from(req.global_step).is_err() {
            return Err(shard::ShardError::StepRange(req.global_step).into());
        }
        let mut s = self.lock();
        let values = arranged(&s, &req.variables)?;
        let shadows = if req.shadows.is_empty() {
            None
        } else {
            Some(arranged(&s, &req.shadows)?)
        };
        // No slots: fresh ones (a new run, or a checkpoint of another optimizer).
        let slots = if req.slots.is_empty() {
            None
        } else {
            let views = req
                .slots
                .iter()
                .map(rpc::view)
                .collect::<Result<Vec<_>, _>>()?;
            Some(s.arrange_slots(views.iter().map(|v| (v.name, v.shape.as_slice(), v.data)))?)
        };
        let applied = s.initialize(values, shadows, slots, req.global_step, req.force);
        if applied {
            info!(
                ps = self.inner.task,
                step = req.global_step,
                "Shard initialized."
            );
            self.inner.step_tx.send_replace(req.global_step);
        }
        Ok(Response::new(pb::InitializeResponse {
            applied,
            incarnation: self.inner.incarnation,
        }))
    }

    async fn pull(
        &self,
        req: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        let snapshots = {
            let r = req.get_ref();
            let slots = self.inner.slots_per_var;
            1 + u32::from(r.with_shadows) + u32::from(r.with_slots) * slots
        };
        let reserved = self.reserve(&req, snapshots)?;
        let req = req.into_inner();
        if req.min_step > 0 {
            self.wait_for_step(req.min_step).await;
        }
        let s = self.lock();
        let (variables, shadows, slots) =
            self.snapshot(&s, &req.names, req.with_shadows, req.with_slots)?;
        let mut res = Response::new(pb::PullResponse {
            variables,
            shadows,
            slots,
            global_step: s.step(),
            incarnation: self.inner.incarnation,
            complete: s.is_complete(),
        });
        res.extensions_mut().insert(reserved);
        Ok(res)
    }

    async fn push(
        &self,
        req: Request<pb::PushRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        // Reserved before anything is applied: a refused push changes nothing.
        let reserved = if req.get_ref().pull {
            Some(self.reserve(&req, 1)?)
        } else {
            None
        };
        let req = req.into_inner();
        // Any authenticated push is contact, applied or not.
        self.inner
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .heard(req.worker, req.step, self.inner.batch_size, Instant::now());
        if req.incarnation != 0 && req.incarnation != self.inner.incarnation {
            return Err(rpc::status(
                tonic::Code::FailedPrecondition,
                format_args!(
                    "ps:{} restarted since the parameters were pulled (incarnation {} ≠ {}): pull again",
                    self.inner.task, req.incarnation, self.inner.incarnation
                ),
            ));
        }
        // Applied straight from the request's bytes: no gradient array is built.
        let grads = req
            .gradients
            .iter()
            .map(rpc::view)
            .collect::<Result<Vec<_>, _>>()?;
        let outcome = {
            let mut s = self.lock();
            if s.is_complete() {
                None
            } else {
                s.set_last_step(self.inner.config.borrow().train.last_step);
                let grads =
                    s.arrange_bytes(grads.iter().map(|v| (v.name, v.shape.as_slice(), v.data)))?;
                let outcome =
                    s.push_bytes(&grads, req.learning_rate, req.step, req.worker, req.loss)?;
                self.inner.step_tx.send_replace(s.step());
                Some(outcome)
            }
        };
        if outcome.is_some_and(|o| o != Pushed::AtLastStep) {
            self.count_examples(self.inner.batch_size);
        }
        if outcome == Some(Pushed::Pending) && req.pull {
            self.wait_for_step(req.step + 1).await;
        }
        let s = self.lock();
        let variables = if req.pull {
            self.snapshot(&s, &[], false, false)?.0
        } else {
            Vec::new()
        };
        let mut res = Response::new(pb::PushResponse {
            variables,
            global_step: s.step(),
            incarnation: self.inner.incarnation,
            complete: s.is_complete(),
            stale: outcome == Some(Pushed::Stale),
        });
        if let Some(r) = reserved {
            res.extensions_mut().insert(r);
        }
        Ok(res)
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let step = req.into_inner().global_step;
        self.lock().set_complete();
        if !self.inner.complete.is_cancelled() {
            info!(ps = self.inner.task, step, "Run complete.");
        }
        self.inner.complete.cancel();
        Ok(Response::new(pb::CompleteResponse {}))
    }
}

/// Largest message a task may need to send or receive for this model: every
/// variable of the model, its shadow and its optimizer slots, plus room for
/// framing. Derived, so a big model never fails on gRPC's 4 MiB default.
pub fn message_limit(config: &Config) -> usize {
    let floats: usize = config
        .model
        .layers
        .windows(2)
        .map(|w| w[0] * w[1] + w[1])
        .sum();
    let copies = 2 + config.train.optimizer().slot_names().len();
    copies * 4 * floats + (1 << 20)
}

/// HTTP/2 frame size both ends accept: a 1.6 MB tensor in 2 frames, not 100
/// of the default 16 KiB.
pub const FRAME: u32 = 1 << 20;

/// HTTP/2 flow-control window for a model's messages: a whole push or pull in
/// flight without waiting for WINDOW_UPDATEs (the default is 64 KiB).
pub fn window(limit: usize) -> u32 {
    u32::try_from(limit).unwrap_or(u32::MAX).min((1 << 31) - 1)
}

/// Serves ps task `task` on `listener` until `shutdown` is cancelled or, with
/// `cluster.ps_exit_when_complete`, shortly after the run is complete.
///
/// Errors: [`PsError`] when the model is invalid or the server fails.
pub async fn serve(
    live: watch::Receiver<Arc<Config>>,
    task: usize,
    credentials: &Credentials,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), PsError> {
    let config: Arc<Config> = live.borrow().clone();
    let service = PsService::new(live.clone(), task)?;
    crate::metrics::observe_ps(service.clone());
    rpc::keep_freed_buffers();
    let limit = message_limit(&config);
    let id = TaskId {
        role: Role::Ps,
        index: task,
    };
    {
        let s = service.lock();
        let names: Vec<&str> = s.specs().iter().map(|v| v.name.as_str()).collect();
        info!(task = %id, variables = ?names, "Serving shard.");
    }
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ParameterServerServer<PsService>>()
        .await;
    let svc = ParameterServerServer::new(service.clone())
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let refusals = service.inner.refusals.clone();
    // The token is checked first: a call without it never takes a place.
    let svc = tonic::service::interceptor::InterceptedService::new(
        limits::Admission::new(svc, refusals.clone()),
        limits::Guard::new(credentials.check_token(), refusals.clone()),
    );

    let stop = shutdown.child_token();
    let linger = {
        let (complete, stop, exit) = (
            service.completed(),
            stop.clone(),
            config.cluster.ps_exit_when_complete,
        );
        tokio::spawn(async move {
            complete.cancelled().await;
            if exit {
                tokio::time::sleep(COMPLETE_LINGER).await;
                info!(ps = task, "Run complete; exiting.");
                stop.cancel();
            }
        })
    };
    let incoming = limits::incoming(listener, refusals, credentials.server_tls());
    let result = credentials
        .server()
        .http2_keepalive_interval(Some(limits::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(limits::KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(window(limit))
        .initial_connection_window_size(window(limit))
        .max_frame_size(FRAME)
        .add_service(health)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    linger.abort();
    if let Err(e) = &result {
        warn!(ps = task, error = %e, "Server stopped with an error.");
    }
    Ok(result?)
}
