//! A connection the ps accepted, as the limits see it: the registry of open
//! connections (those not yet authenticated, oldest first, shed first),
//! each [`Conn`] closed when it idles unauthenticated or is shed, what a
//! request knows of its connection ([`ConnInfo`], [`peer`]), and the token
//! check that marks a connection authenticated ([`Guard`]).

use super::limits::{RefusalLog, SHED_SLACK, UNAUTHENTICATED_IDLE};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::codegen::http;
use tonic::service::Interceptor;
use tonic::transport::server::Connected;

/// The open connections, and those not yet authenticated by age.
pub(super) struct Registry {
    /// Connections open (accepted and not yet dropped).
    pub(super) open: AtomicUsize,
    /// Of those, shed and not yet dropped: they no longer count against the cap.
    pub(super) closing: AtomicUsize,
    /// Notified whenever a connection is dropped: the accept loop waits on
    /// it while too many shed connections are still closing.
    pub(super) dropped: tokio::sync::Notify,
    /// Not yet authenticated, oldest first: cancelling a token closes its
    /// connection.
    pub(super) unauthenticated: Mutex<BTreeMap<u64, CancellationToken>>,
    /// Source of connection ids (increasing: the smallest is the oldest).
    pub(super) next_id: AtomicU64,
    /// Connections allowed before shedding.
    pub(super) cap: usize,
}

impl Registry {
    /// Whether the descriptors allow another connection now: at most
    /// [`SHED_SLACK`] shed ones may still be closing past the cap.
    pub(super) fn may_accept(&self) -> bool {
        self.open.load(Ordering::Acquire) < self.cap + SHED_SLACK
    }

    fn forget(&self, id: u64) {
        self.unauthenticated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// What a request knows of its connection (a request extension, through
/// [`Connected`]).
#[derive(Clone)]
pub struct ConnInfo {
    /// The peer's address.
    remote: Option<SocketAddr>,
    /// Set by the first authenticated call.
    authenticated: Arc<AtomicBool>,
    /// This connection's key in the registry.
    id: u64,
    /// The registry, to leave its unauthenticated list.
    registry: Arc<Registry>,
}

impl ConnInfo {
    /// The peer's address.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }

    /// Marks the connection as used by a cluster member: it is no longer
    /// closed for idling or shed for newcomers.
    fn authenticate(&self) {
        if !self.authenticated.swap(true, Ordering::AcqRel) {
            self.registry.forget(self.id);
        }
    }
}

/// The connection of a request, plain or under TLS ([`Io`]).
fn conn_info(ext: &http::Extensions) -> Option<&ConnInfo> {
    ext.get::<ConnInfo>()
}

/// The peer's address of a request that came through
/// [`super::listen::incoming`].
pub fn peer(ext: &http::Extensions) -> Option<SocketAddr> {
    conn_info(ext).and_then(|c| c.remote)
}

/// An accepted connection: closed when it idles unauthenticated or is shed.
pub struct Conn {
    /// The socket.
    stream: TcpStream,
    /// Shared with the connection's requests.
    info: ConnInfo,
    /// Fires [`UNAUTHENTICATED_IDLE`] after accept.
    idle: Pin<Box<Sleep>>,
    /// Completes when the connection is shed for a newer one.
    shed: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Cancelled when it is shed (what `shed` waits on).
    shed_token: CancellationToken,
}

impl Conn {
    /// What requests on this connection know of it.
    pub(super) fn info(&self) -> &ConnInfo {
        &self.info
    }

    /// Waits for the client's first bytes and copies up to `buf.len()` of
    /// them, leaving them to be read; 0 when it closed without sending any.
    ///
    /// Errors: the connection idled or was shed ([`Conn::closing`]), or the
    /// socket failed.
    pub(super) async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        std::future::poll_fn(|cx| {
            self.closing(cx)?;
            let mut read = ReadBuf::new(buf);
            self.stream.poll_peek(cx, &mut read)
        })
        .await
    }

    /// An error once the connection must close. Polled on every read: the
    /// server always has one pending, so the timers wake it.
    fn closing(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.info.authenticated.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.shed.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room: too many connections",
            ));
        }
        if self.idle.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no authenticated call: idle connection closed",
            ));
        }
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let registry = &self.info.registry;
        registry.forget(self.info.id);
        if self.shed_token.is_cancelled() {
            registry.closing.fetch_sub(1, Ordering::AcqRel);
        }
        registry.open.fetch_sub(1, Ordering::AcqRel);
        registry.dropped.notify_one();
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.closing(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.closing(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    // Forwarded: without them hyper copies every response into one buffer
    // instead of handing the socket its pieces (writev).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.closing(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Registers an accepted connection, shedding the oldest unauthenticated
/// one when at the cap; None (the socket closed) when nothing can be shed.
/// Connections already shed and still closing do not count: they are going.
pub(super) fn admit(
    registry: &Arc<Registry>,
    stream: TcpStream,
    remote: SocketAddr,
    log: &RefusalLog,
) -> Option<Conn> {
    let open = registry.open.load(Ordering::Acquire);
    let staying = open.saturating_sub(registry.closing.load(Ordering::Acquire));
    if staying >= registry.cap {
        let oldest = registry
            .unauthenticated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_first();
        match oldest {
            Some((_, shed)) => {
                registry.closing.fetch_add(1, Ordering::AcqRel);
                shed.cancel();
            }
            None => {
                log.refused(
                    Some(remote),
                    &format!(
                        "too many connections ({staying} open, all authenticated, limit {})",
                        registry.cap
                    ),
                );
                return None;
            }
        }
    }
    let _ = stream.set_nodelay(true);
    let id = registry.next_id.fetch_add(1, Ordering::Relaxed);
    let shed = CancellationToken::new();
    registry
        .unauthenticated
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, shed.clone());
    registry.open.fetch_add(1, Ordering::AcqRel);
    Some(Conn {
        stream,
        info: ConnInfo {
            remote: Some(remote),
            authenticated: Arc::new(AtomicBool::new(false)),
            id,
            registry: registry.clone(),
        },
        idle: Box::pin(tokio::time::sleep(UNAUTHENTICATED_IDLE)),
        shed: Box::pin(shed.clone().cancelled_owned()),
        shed_token: shed,
    })
}

/// The token check ([`crate::auth::CheckToken`]) that also marks the
/// connection authenticated, and logs refusals with the peer.
#[derive(Clone)]
pub struct Guard {
    /// The cluster token check.
    check: crate::auth::CheckToken,
    /// Where refusals go.
    log: Arc<RefusalLog>,
}

impl Guard {
    pub fn new(check: crate::auth::CheckToken, log: Arc<RefusalLog>) -> Self {
        Self { check, log }
    }
}

impl Interceptor for Guard {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let conn = conn_info(req.extensions()).cloned();
        match self.check.call(req) {
            Ok(req) => {
                if let Some(c) = conn {
                    c.authenticate();
                }
                Ok(req)
            }
            Err(status) => {
                self.log
                    .refused(conn.and_then(|c| c.remote), status.message());
                Err(status)
            }
        }
    }
}
