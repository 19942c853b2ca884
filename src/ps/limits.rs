//! What keeps a ps serving its workers when a client, authenticated or not,
//! opens connections or sends requests faster than it can serve them
//! (issue 15): every bound the ps enforces, in one place.
//!
//! - Connections: at most [`MAX_CONNECTIONS`] (less when the descriptor limit
//!   is lower). Past it the oldest connection that has not yet made an
//!   authenticated call is closed to make room; when every connection is
//!   authenticated the new one is closed at once. Connections being closed
//!   to make room do not count against the cap (they are going), so a
//!   newcomer is never refused because the server has not yet got round to
//!   closing those it shed; while more than [`SHED_SLACK`] are still
//!   closing, the ps stops accepting until one has closed (the newcomer
//!   waits in the listen backlog) instead of refusing it. So a worker that
//!   connects during a flood is shed only if it idles longer than every
//!   connection that came before it.
//! - A connection that makes no authenticated call within
//!   [`UNAUTHENTICATED_IDLE`] is closed; HTTP/2 keepalive pings find dead peers.
//! - At most [`MAX_REQUESTS`] calls in progress, and response bytes reserved
//!   from a budget of [`RESPONSE_BUDGET`] shard snapshots; past either, the call
//!   gets `RESOURCE_EXHAUSTED` (the worker backs off and retries).
//! - Every refused call or connection, and every failed TLS handshake
//!   ([`super::tls`]), is logged with the peer's address, at most once per
//!   peer per [`REFUSAL_LOG_INTERVAL`].

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::service::Interceptor;
use tonic::transport::server::Connected;
use tracing::{info, warn};

use super::tls::{self, Io};

/// Open connections a ps accepts: far above any real cluster (one per
/// worker, plus `dtf status`), far below what exhausts its memory.
pub const MAX_CONNECTIONS: usize = 1024;

/// Descriptors kept free of connections: checkpoints, logs, the metrics
/// endpoint, connections being closed.
const FD_RESERVE: usize = 64;

/// Connections the ps lets linger past [`MAX_CONNECTIONS`] while those it
/// shed are still closing; beyond it, it accepts no more until one closes.
const SHED_SLACK: usize = 32;

/// How long a connection may stay open without an authenticated call. A
/// worker calls within milliseconds of connecting.
pub const UNAUTHENTICATED_IDLE: Duration = Duration::from_secs(10);

/// HTTP/2 keepalive: a ping after this long without frames…
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// …and the connection is closed when the ping is not answered within this.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Calls in progress at once, all connections together (a sync push waits up
/// to a second for its step, so a large sync cluster holds one per worker).
pub const MAX_REQUESTS: usize = 64;

/// Response bytes in flight, in shard snapshots: a pull or fused push-pull
/// reserves one (two with shadows) from when it arrives until its response
/// has been sent or dropped.
pub const RESPONSE_BUDGET: usize = 32;

/// A peer's refusals are logged at most once per this interval; the next
/// line counts those left out.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Peers the refusal log remembers; beyond, entries older than the interval
/// are forgotten (so a scan from many addresses cannot grow it without end).
const REFUSAL_LOG_PEERS: usize = 4096;

/// Refusal lines per [`REFUSAL_LOG_INTERVAL`], all peers together: a flood
/// from thousands of addresses (each new to the per-peer limit) once wrote
/// 7970 lines in seconds. The next line after a quiet interval counts those
/// left out (`suppressed_all`).
pub const REFUSAL_LOG_LINES: u64 = 20;

/// Logs refusals with the peer's address, rate-limited per peer address
/// and overall.
#[derive(Default)]
pub struct RefusalLog {
    /// Per peer IP (None: unknown): when its last line was written, and how
    /// many refusals were left out since.
    peers: Mutex<HashMap<Option<IpAddr>, (Instant, u64)>>,
    /// All peers together: the current interval's start, lines written in
    /// it, and refusals left out since the last line.
    all: Mutex<Option<(Instant, u64, u64)>>,
}

impl RefusalLog {
    /// Records a refusal of `peer` for `reason`, logging it unless this peer's
    /// last line is more recent than [`REFUSAL_LOG_INTERVAL`] or
    /// [`REFUSAL_LOG_LINES`] were written this interval. Returns whether
    /// it wrote a line.
    pub fn refused(&self, peer: Option<SocketAddr>, reason: &str) -> bool {
        let now = Instant::now();
        let suppressed = {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            if peers.len() >= REFUSAL_LOG_PEERS {
                peers.retain(|_, (last, _)| now.duration_since(*last) < REFUSAL_LOG_INTERVAL);
            }
            match peers.get_mut(&peer.map(|p| p.ip())) {
                Some((last, left_out)) if now.duration_since(*last) < REFUSAL_LOG_INTERVAL => {
                    *left_out += 1;
                    return false;
                }
                Some((last, left_out)) => {
                    *last = now;
                    std::mem::take(left_out)
                }
                None => {
                    if peers.len() >= REFUSAL_LOG_PEERS {
                        // Every remembered peer is recent: a flood from
                        // many addresses. Log, but remember no more.
                        0
                    } else {
                        peers.insert(peer.map(|p| p.ip()), (now, 0));
                        0
                    }
                }
            }
        };
        let suppressed_all = {
            let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
            let (start, lines, left_out) = all.get_or_insert((now, 0, 0));
            if now.duration_since(*start) >= REFUSAL_LOG_INTERVAL {
                (*start, *lines) = (now, 0);
            }
            if *lines >= REFUSAL_LOG_LINES {
                *left_out += 1;
                return false;
            }
            *lines += 1;
            std::mem::take(left_out)
        };
        let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
        warn!(peer = %peer, reason = %reason, suppressed, suppressed_all, "Refused.");
        true
    }
}

/// The open connections, and those not yet authenticated by age.
struct Registry {
    /// Connections open (accepted and not yet dropped).
    open: AtomicUsize,
    /// Of those, shed and not yet dropped: they no longer count against the cap.
    closing: AtomicUsize,
    /// Notified whenever a connection is dropped: the accept loop waits on
    /// it while too many shed connections are still closing.
    dropped: tokio::sync::Notify,
    /// Not yet authenticated, oldest first: cancelling a token closes its
    /// connection.
    unauthenticated: Mutex<BTreeMap<u64, CancellationToken>>,
    /// Source of connection ids (increasing: the smallest is the oldest).
    next_id: AtomicU64,
    /// Connections allowed before shedding.
    cap: usize,
}

impl Registry {
    /// Whether the descriptors allow another connection now: at most
    /// [`SHED_SLACK`] shed ones may still be closing past the cap.
    fn may_accept(&self) -> bool {
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

/// The peer's address of a request that came through [`incoming`].
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

/// Raises the soft descriptor limit to the hard one (the units set
/// `LimitNOFILE=`; elsewhere the soft default of 1024 would be the first
/// bound hit) and returns the connections that fit under it.
fn connection_cap() -> usize {
    cap_for(crate::files::raise_nofile_limit())
}

/// The connections a ps accepts under a soft descriptor limit of `nofile`:
/// [`MAX_CONNECTIONS`], less what the descriptors it keeps for itself and
/// for connections being closed need. (Public so tests size their floods by it.)
pub fn cap_for(nofile: u64) -> usize {
    let soft = usize::try_from(nofile).unwrap_or(usize::MAX);
    MAX_CONNECTIONS.min(soft.saturating_sub(FD_RESERVE + SHED_SLACK).max(1))
}

/// What the accept loop of [`incoming`] holds.
struct Accepting {
    /// Where clients connect.
    listener: TcpListener,
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
    listener: TcpListener,
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

/// Registers an accepted connection, shedding the oldest unauthenticated
/// one when at the cap; None (the socket closed) when nothing can be shed.
/// Connections already shed and still closing do not count: they are going.
fn admit(
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

/// Response bytes a call reserved ([`Budget`]), handed from the handler to
/// [`Admission`] in the response's extensions, released with the body.
#[derive(Clone)]
pub struct Reserved {
    /// Returned to the budget when the last clone is dropped.
    _permit: Arc<OwnedSemaphorePermit>,
}

/// The response budget of one ps: [`RESPONSE_BUDGET`] snapshots of its
/// shard, in KiB (a semaphore counts in u32).
pub struct Budget {
    /// KiB available.
    kib: Arc<Semaphore>,
    /// KiB of one snapshot of the shard's values.
    snapshot_kib: u32,
}

impl Budget {
    /// A budget for a shard of `shard_bytes` bytes of values.
    pub fn new(shard_bytes: usize) -> Self {
        let snapshot_kib = u32::try_from(shard_bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let total = (snapshot_kib as usize)
            .saturating_mul(RESPONSE_BUDGET)
            .min(Semaphore::MAX_PERMITS);
        Self {
            kib: Arc::new(Semaphore::new(total)),
            snapshot_kib,
        }
    }

    /// Reserves `snapshots` snapshots' worth of response bytes.
    ///
    /// Errors: `RESOURCE_EXHAUSTED` when the budget is spent.
    pub fn reserve(&self, snapshots: u32) -> Result<Reserved, tonic::Status> {
        let kib = self.snapshot_kib.saturating_mul(snapshots);
        match self.kib.clone().try_acquire_many_owned(kib) {
            Ok(p) => Ok(Reserved {
                _permit: Arc::new(p),
            }),
            Err(_) => Err(crate::transport::proto::status(
                tonic::Code::ResourceExhausted,
                format!(
                    "ps busy: {RESPONSE_BUDGET} snapshots of the shard already in flight; retry later"
                ),
            )),
        }
    }
}

/// Admits at most [`MAX_REQUESTS`] calls at once to the service it wraps;
/// each holds its place (and its [`Reserved`] response bytes) until its
/// response body has been sent or dropped.
#[derive(Clone)]
pub struct Admission<S> {
    /// The gRPC service.
    inner: S,
    /// Places for calls in progress.
    requests: Arc<Semaphore>,
    /// Where refusals go.
    log: Arc<RefusalLog>,
}

impl<S> Admission<S> {
    pub fn new(inner: S, log: Arc<RefusalLog>) -> Self {
        Self {
            inner,
            requests: Arc::new(Semaphore::new(MAX_REQUESTS)),
            log,
        }
    }
}

impl<S: NamedService> NamedService for Admission<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Admission<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Ok(place) = self.requests.clone().try_acquire_owned() else {
            let reason = format!("{MAX_REQUESTS} calls already in progress");
            self.log.refused(peer(req.extensions()), &reason);
            let status = crate::transport::proto::status(
                tonic::Code::ResourceExhausted,
                format!("ps busy: {reason}; retry later"),
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        // The generated server is always ready: a clone may take the call.
        let mut inner = self.inner.clone();
        std::mem::swap(&mut inner, &mut self.inner);
        Box::pin(async move {
            let res = inner.call(req).await?;
            let (mut parts, body) = res.into_parts();
            let reserved = parts.extensions.remove::<Reserved>();
            let body = Body::new(Held {
                body,
                _held: (place, reserved),
            });
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// A response body that keeps its call's place and reserved bytes until it
/// is dropped: sent, or abandoned by a peer that went away.
struct Held {
    /// The response.
    body: Body,
    /// Released on drop.
    _held: (OwnedSemaphorePermit, Option<Reserved>),
}

impl tonic::codegen::Body for Held {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        tonic::codegen::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        tonic::codegen::Body::size_hint(&self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_past_its_snapshots_and_frees_on_drop() {
        let b = Budget::new(4096);
        let held: Vec<_> = (0..RESPONSE_BUDGET)
            .map(|_| b.reserve(1).unwrap())
            .collect();
        let err = b.reserve(1).err().unwrap();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        drop(held);
        assert!(b.reserve(2).is_ok());
    }

    #[test]
    fn refusals_are_counted_per_peer() {
        let log = RefusalLog::default();
        let a: SocketAddr = "10.0.0.1:5".parse().unwrap();
        for _ in 0..5 {
            log.refused(Some(a), "wrong token");
        }
        let peers = log.peers.lock().unwrap();
        assert_eq!(peers.get(&Some(a.ip())).map(|e| e.1), Some(4));
    }

    /// Issue 25: 8000 connections from distinct 127.x addresses wrote 7970
    /// lines in seconds; the log is bounded overall too.
    #[test]
    fn refusals_from_many_addresses_are_rate_limited_overall() {
        let log = RefusalLog::default();
        let written = (0..8000u32)
            .filter(|i| {
                let [_, b, c, d] = i.to_be_bytes();
                let peer = SocketAddr::from(([127, b, c, d], 5));
                log.refused(Some(peer), "too many connections")
            })
            .count();
        assert_eq!(written as u64, REFUSAL_LOG_LINES);
        assert_eq!(log.all.lock().unwrap().unwrap().2, 8000 - REFUSAL_LOG_LINES);
    }
}
