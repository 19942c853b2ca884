//! The ps's accept loop ([`incoming`]): connections admitted within the
//! limits (the ps's `conn`), and under TLS handed to a handshake task of
//! their own (the ps's `tls`) before they are served.

use super::conn::{Conn, Registry, admit};
use super::limits::{MAX_REQUESTS, RefusalLog, UNAUTHENTICATED_IDLE, connection_cap};
use super::tls::{self, Io};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

/// What the accept loop of [`incoming`] holds.
struct Accepting {
    /// Where clients connect (shared: a ps waiting for its widths serves
    /// on it, then the ps with its shard).
    listener: Arc<TcpListener>,
    /// The connections open.
    registry: Arc<Registry>,
    /// Where refusals go.
    log: Arc<RefusalLog>,
    /// The ps's side of TLS; None: plaintext.
    tls: Option<TlsAcceptor>,
    /// Handshakes in progress, one task each (aborted when the server drops
    /// the stream).
    handshakes: JoinSet<Option<tokio_rustls::server::TlsStream<Conn>>>,
}

/// Accepts connections on `listener` within the connection limits, for
/// `Server::serve_with_incoming_shutdown`; with `tls`, yields each once its
/// handshake is done, and logs those that fail it.
pub fn incoming(
    listener: Arc<TcpListener>,
    log: Arc<RefusalLog>,
    tls: Option<TlsAcceptor>,
) -> impl futures::Stream<Item = io::Result<Io>> + Send + 'static {
    let cap = connection_cap();
    info!(
        max_connections = cap,
        idle_secs = UNAUTHENTICATED_IDLE.as_secs(),
        max_requests = MAX_REQUESTS,
        "Connection limits."
    );
    let registry = Arc::new(Registry {
        open: AtomicUsize::new(0),
        closing: AtomicUsize::new(0),
        dropped: tokio::sync::Notify::new(),
        unauthenticated: Mutex::new(BTreeMap::new()),
        next_id: AtomicU64::new(0),
        cap,
    });
    let state = Accepting {
        listener,
        registry,
        log,
        tls,
        handshakes: JoinSet::new(),
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            tokio::select! {
                // Finished handshakes first: their clients are waiting.
                biased;
                Some(done) = s.handshakes.join_next(), if !s.handshakes.is_empty() => {
                    match done {
                        Ok(Some(stream)) => return Some((Ok(Io::Tls(Box::new(stream))), s)),
                        // Failed, and logged.
                        Ok(None) => {}
                        Err(e) => warn!(error = %e, "A TLS handshake task failed."),
                    }
                }
                // Too many shed connections still closing: accept again
                // once one has gone (a newcomer waits in the backlog rather
                // than being refused).
                _ = s.registry.dropped.notified(), if !s.registry.may_accept() => {}
                accepted = s.listener.accept(), if s.registry.may_accept() => {
                    let (stream, remote) = match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of descriptors (EMFILE/ENFILE) or a connection
                            // reset before accept: keep serving those open; a
                            // pause so a full table does not spin the loop.
                            s.log.refused(None, &format!("accept failed: {e}"));
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Some(conn) = admit(&s.registry, stream, remote, &s.log) else {
                        continue;
                    };
                    match &s.tls {
                        None => return Some((Ok(Io::Plain(conn)), s)),
                        // In a task of its own: a client that connects and
                        // says nothing holds up no one else's accept.
                        Some(acceptor) => {
                            let (acceptor, log) = (acceptor.clone(), s.log.clone());
                            s.handshakes
                                .spawn(async move { tls::handshake(&acceptor, conn, &log).await });
                        }
                    }
                }
            }
        }
    })
}
