//! The ps's side of mutual TLS, done in its own accept loop
//! (`listen::incoming`) rather than by tonic (`Server::tls_config`),
//! which drops the reason a handshake failed: here every failure is logged
//! with the peer's address and why, through the same rate-limited
//! [`RefusalLog`] as a wrong token, as an operator auditing access needs.
//!
//! Each handshake runs in a task of its own, so a client that connects and
//! says nothing holds up no one else's accept; it is bounded like any
//! connection not yet authenticated ([`super::limits::UNAUTHENTICATED_IDLE`],
//! and shed first when the ps is at its connection limit).

use super::conn::{Conn, ConnInfo};
use super::limits::{RefusalLog, UNAUTHENTICATED_IDLE};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{AlertDescription, CertificateError, Error as TlsError, InvalidMessage};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

/// The first byte of a TLS handshake record (content type 22).
const HANDSHAKE_RECORD: u8 = 0x16;

/// How a plaintext HTTP/2 client (a gRPC client without TLS) starts.
const HTTP2_PREFACE: &[u8] = b"PRI ";

/// A connection the ps serves: plain, or under TLS once the handshake is done.
pub enum Io {
    /// TLS is off.
    Plain(Conn),
    /// TLS is on; boxed, as a TLS session is large beside a socket.
    Tls(Box<TlsStream<Conn>>),
}

/// Runs the handshake on `conn`; None (the connection closed) when it fails,
/// after logging the peer and the reason to `log`.
pub async fn handshake(
    acceptor: &TlsAcceptor,
    mut conn: Conn,
    log: &RefusalLog,
) -> Option<TlsStream<Conn>> {
    let peer = conn.info().remote_addr();
    let refuse = |reason: String| log.refused(peer, &format!("TLS handshake failed: {reason}"));
    // The first bytes say whether the client speaks TLS at all, which
    // rustls's error does not tell apart from a malformed handshake.
    let mut head = [0u8; 4];
    let n = match conn.peek(&mut head).await {
        // Closed without a byte: a port probe (or a readiness check), not a
        // refused client.
        Ok(0) => return None,
        Ok(n) => n,
        Err(e) => {
            refuse(io_reason(&e));
            return None;
        }
    };
    // A client that is not TLS still goes through rustls, which answers it
    // with an alert: a plaintext dtf recognises the alert and says that the
    // ps requires TLS (`auth::answers_with_tls`).
    match acceptor.accept(conn).await {
        Ok(tls) => Some(tls),
        Err(e) => {
            refuse(reason(&e, &head[..n]));
            None
        }
    }
}

/// Why a handshake failed, in words, from its error and the first bytes the
/// client sent.
fn reason(e: &io::Error, head: &[u8]) -> String {
    if head.first() != Some(&HANDSHAKE_RECORD) {
        return if head.starts_with(HTTP2_PREFACE) {
            "not TLS: a plaintext HTTP/2 (gRPC) client; set security.tls_* on every task or on none"
                .into()
        } else {
            // Escaped: readable when it is text ("GET ", "SSH-"), safe when not.
            format!(
                "not TLS: the client's first bytes \"{}\" are not a TLS handshake",
                head.escape_ascii()
            )
        };
    }
    let Some(tls) = e.get_ref().and_then(|e| e.downcast_ref::<TlsError>()) else {
        return io_reason(e);
    };
    match tls {
        TlsError::NoCertificatesPresented => {
            "no client certificate (every task needs security.tls_cert signed by the cluster CA)"
                .into()
        }
        TlsError::InvalidCertificate(c) => certificate_reason(c),
        TlsError::AlertReceived(
            a @ (AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown),
        ) => format!(
            "the client rejected the ps's certificate (alert {a:?}): its security.tls_ca is not the cluster CA"
        ),
        TlsError::AlertReceived(a) => format!("the client ended the handshake (alert {a:?})"),
        TlsError::NoApplicationProtocol => {
            "the client does not offer HTTP/2 (ALPN h2): not a gRPC client".into()
        }
        TlsError::PeerIncompatible(p) => format!("the client's TLS is incompatible: {p:?}"),
        TlsError::InvalidMessage(InvalidMessage::InvalidContentType) => {
            "not TLS: a record of unknown type".into()
        }
        other => other.to_string(),
    }
}

/// Why the client's certificate was refused.
fn certificate_reason(c: &CertificateError) -> String {
    match c {
        CertificateError::UnknownIssuer => {
            "client certificate not signed by the cluster CA (security.tls_ca)".into()
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            format!("client certificate expired ({c})")
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            format!("client certificate not valid yet ({c}); compare the clocks")
        }
        CertificateError::BadSignature => "client certificate with a bad signature".into(),
        other => format!("client certificate refused: {other}"),
    }
}

/// Why the connection failed under the handshake: the ps's own limits
/// (`Conn` turns them into errors), or the client going away.
fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::TimedOut => format!(
            "handshake not done within {} s of connecting",
            UNAUTHENTICATED_IDLE.as_secs()
        ),
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => "the client closed the connection mid-handshake".into(),
        _ => e.to_string(),
    }
}

impl Io {
    /// The connection under TLS, if any.
    fn conn(&self) -> &Conn {
        match self {
            Io::Plain(c) => c,
            Io::Tls(t) => t.get_ref().0,
        }
    }
}

impl Connected for Io {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.conn().info().clone()
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(c) => Pin::new(c).poll_read(cx, buf),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

// Every method forwarded, the vectored ones too: without them hyper copies
// every response into one buffer (see `Conn`).
impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(c) => Pin::new(c).poll_write(cx, buf),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(c) => Pin::new(c).poll_write_vectored(cx, bufs),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(c) => c.is_write_vectored(),
            Io::Tls(t) => t.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(c) => Pin::new(c).poll_flush(cx),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(c) => Pin::new(c).poll_shutdown(cx),
            Io::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rustls(e: TlsError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn each_failure_is_said_in_words() {
        let hello = [HANDSHAKE_RECORD, 3, 1, 0];
        let cases = [
            (
                rustls(TlsError::InvalidMessage(InvalidMessage::InvalidContentType)),
                &b"PRI "[..],
                "plaintext HTTP/2",
            ),
            (
                rustls(TlsError::InvalidMessage(InvalidMessage::InvalidContentType)),
                b"GET ",
                "not TLS: the client's first bytes \"GET \"",
            ),
            (
                rustls(TlsError::InvalidMessage(InvalidMessage::InvalidContentType)),
                b"\x00\x01ab",
                "bytes \"\\x00\\x01ab\"",
            ),
            (
                rustls(TlsError::NoCertificatesPresented),
                &hello,
                "no client certificate",
            ),
            (
                rustls(TlsError::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                &hello,
                "not signed by the cluster CA",
            ),
            (
                rustls(TlsError::AlertReceived(AlertDescription::UnknownCA)),
                &hello,
                "rejected the ps's certificate",
            ),
            (
                io::Error::new(io::ErrorKind::TimedOut, "idle"),
                &hello,
                "not done within 10 s",
            ),
            (
                io::Error::from(io::ErrorKind::UnexpectedEof),
                &hello,
                "closed the connection mid-handshake",
            ),
        ];
        for (e, head, want) in cases {
            let got = reason(&e, head);
            assert!(got.contains(want), "{e:?} {head:?}: {got}");
        }
    }
}
