//! A ps started with `model.hidden` does not read the data set: the widths
//! around the hidden ones (the inputs, the classes) are the chief's, who
//! resolved them from the data. Until it has them, the ps serves `State`
//! only (`needs_widths`), holds no shard, and refuses everything else; the
//! chief sends them alone in an `Initialize` (`layers`). The ps checks them
//! against its own `model.hidden` and its memory, and serves again from the
//! start with its shard ([`learn`]): restoring its snapshot, fetching its
//! ring copy, being seeded, as any ps at start.

use super::{PsError, PsService, grpc, listen};
use crate::auth::Credentials;
use crate::config::Config;
use crate::transport::call::Initialized;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

/// Whether this ps waits for the widths, and the widths once taken.
pub(super) struct Widths {
    /// Started without them (`model.layers` left empty: `model.hidden`
    /// and no data read).
    needed: bool,
    /// The model's widths, input first, as the chief sent them (checked).
    taken: OnceLock<Vec<usize>>,
    /// Cancelled once they are taken: the server stops, to start again
    /// with the shard.
    done: CancellationToken,
}

impl Widths {
    /// For a ps whose configuration has the widths (`layers` not empty), or not.
    pub(super) fn new(config: &Config) -> Self {
        Self {
            needed: config.model.layers.is_empty(),
            taken: OnceLock::new(),
            done: CancellationToken::new(),
        }
    }
}

impl PsService {
    /// Whether this ps waits for the chief's widths (`State`'s `needs_widths`).
    pub(super) fn needs_widths(&self) -> bool {
        let w = &self.inner.widths;
        w.needed && w.taken.get().is_none()
    }

    /// While the widths are not known, the answer to every call that needs
    /// the shard: `FAILED_PRECONDITION`, as an uninitialized shard's, so a
    /// worker goes back to waiting for the chief (who sends them).
    pub(super) fn widths_known(&self) -> Result<(), Status> {
        match self.inner.widths.needed {
            false => Ok(()),
            true => Err(Status::failed_precondition(format!(
                "ps:{} was started with model.hidden and does not read the data: it waits for \
                 the chief to send the model's widths",
                self.inner.task
            ))),
        }
    }

    /// While the widths are not known, the answer to the ring's calls
    /// (`Replicate`, `FetchReplica`): `UNAVAILABLE`, so the neighbour asks
    /// again — the copies this ps keeps are on its disk, served once it
    /// has its widths (a ps that lost its disk must not give up on them).
    pub(super) fn ring_ready(&self) -> Result<(), Status> {
        match self.inner.widths.needed {
            false => Ok(()),
            true => Err(Status::unavailable(format!(
                "ps:{} waits for the chief to send the model's widths; it serves the ring's \
                 copies once it has them",
                self.inner.task
            ))),
        }
    }

    /// `Initialize` with `layers`: the chief's widths. A ps that waits for
    /// them takes them when they fit its `model.hidden` and its memory,
    /// and then starts again with its shard; one that has its own answers
    /// `applied: false` when they are the same.
    ///
    /// Errors: `INVALID_ARGUMENT` naming both models when they differ, or
    /// the bound the widths pass.
    pub(super) fn take_widths(&self, layers: &[usize]) -> Result<Initialized, Status> {
        let answer = Initialized {
            applied: false,
            incarnation: self.inner.incarnation,
        };
        let config = self.inner.config.borrow().clone();
        let w = &self.inner.widths;
        if !w.needed {
            return match layers == config.model.layers.as_slice() {
                true => Ok(answer),
                false => Err(Status::invalid_argument(format!(
                    "ps:{}: the chief's model has widths {layers:?}, this ps's {:?}: every task \
                     must have the same model (model.hidden, model.layers)",
                    self.inner.task, config.model.layers
                ))),
            };
        }
        let mut mine = (*config).clone();
        mine.learn_widths(layers)
            .map_err(|e| Status::invalid_argument(format!("ps:{}: {e}", self.inner.task)))?;
        let fresh = w.taken.set(mine.model.layers.clone()).is_ok();
        if fresh {
            info!(ps = self.inner.task, layers = ?mine.model.layers, "Took the model's widths from the chief; serving the shard.");
        }
        w.done.cancel();
        Ok(answer)
    }
}

/// Serves ps `task` without a shard on `listener` until the chief sends the
/// model's widths: returns the configuration with them (following every
/// reload of `live`, the widths kept), or `None` when `shutdown` came first.
///
/// Errors: [`PsError`] when the server fails.
pub(super) async fn learn(
    live: watch::Receiver<Arc<Config>>,
    task: usize,
    credentials: &Credentials,
    listener: Arc<TcpListener>,
    shutdown: CancellationToken,
) -> Result<Option<watch::Receiver<Arc<Config>>>, PsError> {
    let service = PsService::new(live.clone(), task)?;
    info!(
        ps = task,
        "model.hidden without the data: waiting for the chief to send the model's widths."
    );
    let limit = crate::transport::message_limit(&live.borrow());
    let router = grpc::router(&service, credentials, limit).await;
    let stop = shutdown.child_token();
    let incoming = listen::incoming(
        listener,
        service.inner.edge.refusals.clone(),
        credentials.server_tls(),
    );
    let done = service.inner.widths.done.clone();
    let server = router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
    tokio::pin!(server);
    // Stopped gracefully once the widths are taken: the answer to the
    // chief's call leaves before its connection closes. Bounded like the
    // shard's server.
    let result = tokio::select! {
        result = &mut server => result,
        () = done.cancelled() => {
            stop.cancel();
            tokio::select! {
                result = &mut server => result,
                () = tokio::time::sleep(super::serve::SERVER_DRAIN) => {
                    warn!(ps = task, "A client still connected after the widths came: its connection is dropped.");
                    Ok(())
                }
            }
        }
    };
    result?;
    let Some(layers) = service.inner.widths.taken.get().cloned() else {
        return Ok(None);
    };
    Ok(Some(with_widths(live, layers)))
}

/// `live` with `layers` as `model.layers` in every value, reloads included
/// (a reload keeps the running widths while `model.hidden` is unchanged).
fn with_widths(
    mut live: watch::Receiver<Arc<Config>>,
    layers: Vec<usize>,
) -> watch::Receiver<Arc<Config>> {
    let fill = move |c: &Config| {
        let mut c = c.clone();
        c.model.layers = layers.clone();
        Arc::new(c)
    };
    let (tx, rx) = watch::channel(fill(&live.borrow_and_update()));
    tokio::spawn(async move {
        while live.changed().await.is_ok() {
            let next = fill(&live.borrow_and_update());
            if tx.send(next).is_err() {
                return;
            }
        }
    });
    rx
}
