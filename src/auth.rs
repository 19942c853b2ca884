//! Who may talk to a ps: the cluster's shared bearer token on every RPC,
//! and mutual TLS when `[security] tls_*` are set.

use crate::config::{Config, ConfigError, read_file};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig, server::WebPkiClientVerifier};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server};
use tonic::{Request, Status};

/// What a task proves itself with and checks its peers against, read once
/// at start from the files `[security]` names.
#[derive(Clone)]
pub struct Credentials {
    /// The cluster token.
    token: String,
    /// This host's certificate and key, and the cluster's CA; `None`: plaintext.
    tls: Option<(Identity, Certificate)>,
    /// The same, as the ps's side of the handshake (the ps's `tls` module).
    server_tls: Option<TlsAcceptor>,
}

impl Credentials {
    /// Reads the token and, when configured, the TLS files.
    ///
    /// Errors: [`ConfigError::File`] naming the key: a file missing, readable
    /// by others (the token and the TLS key), empty or not PEM, or a key that
    /// does not belong to the certificate.
    pub fn load(config: &Config) -> Result<Self, ConfigError> {
        let token = config.read_token()?;
        let [(_, Some(cert)), (_, Some(key)), (_, Some(ca))] = config.tls_paths() else {
            // validate() allows all three or none.
            return Ok(Self::plaintext(token));
        };
        let (cert_path, ca_path) = (cert, ca);
        let cert = read_certificates("security.tls_cert", cert)?;
        let ca = read_certificates("security.tls_ca", ca)?;
        let key_pem = read_file("security.tls_key", key, true)?;
        if let Err(e) = PrivateKeyDer::from_pem_slice(&key_pem) {
            return Err(ConfigError::File {
                key: "security.tls_key",
                path: key.to_owned(),
                problem: format!("not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
            });
        }
        // rustls checks that the key is the certificate's.
        let server_tls = server_tls(&cert, &key_pem, &ca).map_err(|(name, problem)| {
            let path = match name {
                "security.tls_cert" => cert_path,
                "security.tls_ca" => ca_path,
                _ => key,
            };
            ConfigError::File {
                key: name,
                path: path.to_owned(),
                problem,
            }
        })?;
        Ok(Self {
            token,
            tls: Some((Identity::from_pem(cert, key_pem), Certificate::from_pem(ca))),
            server_tls: Some(server_tls),
        })
    }

    /// The token alone, over plaintext.
    pub fn plaintext(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            tls: None,
            server_tls: None,
        }
    }

    /// TLS is on.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A client endpoint for the ps at `addr` (`host:port`): https, verifying
    /// the ps against the CA and presenting this host's certificate, when TLS
    /// is on; http otherwise.
    ///
    /// Errors: an address that is not a URI authority, or TLS settings a
    /// client cannot use.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, ClientError> {
        let scheme = if self.tls() { "https" } else { "http" };
        let ep = Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|source| {
            ClientError::Address {
                addr: addr.to_owned(),
                source,
            }
        })?;
        match &self.tls {
            None => Ok(ep),
            Some((identity, ca)) => ep
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(ca.clone())
                        .identity(identity.clone()),
                )
                .map_err(|source| ClientError::Tls {
                    addr: addr.to_owned(),
                    source,
                }),
        }
    }

    /// A server builder. It never does TLS itself: tonic's handshake drops
    /// the reason a client failed it, so the ps does its own in its accept
    /// loop with [`Credentials::server_tls`] and logs who failed and why.
    pub fn server(&self) -> Server {
        Server::builder()
    }

    /// When TLS is on, the ps's side of the handshake: it presents this
    /// host's certificate, offers HTTP/2 (ALPN `h2`) and requires every
    /// client to present a certificate the cluster CA signed.
    pub fn server_tls(&self) -> Option<TlsAcceptor> {
        self.server_tls.clone()
    }

    /// The server's check of the token.
    pub fn check_token(&self) -> CheckToken {
        CheckToken::new(&self.token)
    }

    /// What a shared-memory client presents (`transport::shm`): the same
    /// `Bearer <token>` bytes as the gRPC header.
    pub fn bearer(&self) -> Vec<u8> {
        format!("Bearer {}", self.token).into_bytes()
    }

    /// The client's token header.
    ///
    /// Errors: the token has characters a header cannot carry.
    pub fn add_token(&self) -> Result<AddToken, ClientError> {
        AddToken::new(&self.token)
    }
}

/// Why a client of a ps cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not a URI authority.
    #[error("address {addr:?}: {source}")]
    Address {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The TLS settings cannot make a client.
    #[error("address {addr:?}: TLS: {source}")]
    Tls {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The token has characters a header cannot carry.
    #[error("the cluster token must be printable ASCII without newlines")]
    Token,
}

/// Ends every explanation of a TLS mismatch ([`explain_tls_mismatch`]).
pub const TLS_ADVICE: &str = "set security.tls_* on every task or on none";

/// The transport errors of two ends that disagree about TLS, said plainly
/// and made retryable (`UNAVAILABLE`): while TLS is rolled out, the other
/// end may be the next to change. Other statuses are returned as they are.
pub fn explain_tls_mismatch(status: Status) -> Status {
    let message = status.message();
    let hint = if message.contains("InvalidContentType") {
        // rustls read something that is not TLS.
        "the ps does not speak TLS, but security.tls_* are set here"
    } else if status.code() == tonic::Code::Internal && message.contains("h2 protocol error") {
        // A TLS server's answer to a plaintext HTTP/2 preface.
        "the ps broke off the HTTP/2 connection: it may require TLS, which is not set here"
    } else {
        return status;
    };
    Status::unavailable(format!("{message} ({hint}; {TLS_ADVICE})"))
}

/// Whether the server at `addr` answers the start of a plaintext HTTP/2
/// connection with a TLS alert record (content type 21, version 3.x), as a
/// TLS server does. A plaintext gRPC client meets such a server as one of
/// several connection errors, depending on timing; this asks it directly.
/// False when it cannot tell within a second.
pub async fn answers_with_tls(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PRI *").await.ok()?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        Some(head == [21, 3])
    };
    tokio::time::timeout(std::time::Duration::from_secs(1), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// The ps's TLS configuration from PEM files already checked to parse:
/// `cert` (with its chain) and `key` presented, clients verified against
/// `ca`, a client certificate required, HTTP/2 negotiated (ALPN `h2`). The
/// ring provider, as tonic's client side uses (`tls-ring`).
///
/// Errors: the key of the file at fault and the problem in words, e.g. a
/// key that is not the certificate's.
fn server_tls(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<TlsAcceptor, (&'static str, String)> {
    const CERT: &str = "security.tls_cert";
    const CA: &str = "security.tls_ca";
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| (CERT, e.to_string()))?;
    let key =
        PrivateKeyDer::from_pem_slice(key).map_err(|e| ("security.tls_key", e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        let c = c.map_err(|e| (CA, e.to_string()))?;
        roots
            .add(c)
            .map_err(|e| (CA, format!("not a usable CA certificate: {e}")))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| (CA, e.to_string()))?;
    // As the other tasks' handshakes will check it (each presents this
    // certificate): dates, and a chain to security.tls_ca. An expired
    // certificate once passed `check-config` and the worker waited forever.
    if let Some((leaf, rest)) = chain.split_first() {
        verifier
            .verify_client_cert(leaf, rest, rustls_pki_types::UnixTime::now())
            .map_err(|e| {
                (
                    CERT,
                    format!(
                        "a handshake would refuse it: {e} (checked as the other tasks check it: \
                         its dates, and a chain to security.tls_ca)"
                    ),
                )
            })?;
    }
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| (CERT, e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            (
                "security.tls_key",
                format!("cannot serve with security.tls_cert and this key: {e}"),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A PEM file of one or more certificates, checked to parse.
fn read_certificates(key: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let pem = read_file(key, path, false)?;
    let fail = |problem: String| ConfigError::File {
        key,
        path: path.to_owned(),
        problem,
    };
    match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
        Ok(certs) if certs.is_empty() => Err(fail(
            "no certificate in the file: expected PEM `BEGIN CERTIFICATE` blocks".into(),
        )),
        Ok(_) => Ok(pem),
        Err(e) => Err(fail(format!("not a PEM certificate: {e}"))),
    }
}

/// Server side: accepts only `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct CheckToken {
    /// The whole expected header value, `Bearer <token>`.
    expected: std::sync::Arc<[u8]>,
}

impl CheckToken {
    pub fn new(token: &str) -> Self {
        Self {
            expected: format!("Bearer {token}").into_bytes().into(),
        }
    }

    /// Whether `got` is `Bearer <token>`, compared in constant time: the
    /// comparison must not reveal how much of a guess was right.
    pub fn matches(&self, got: &[u8]) -> bool {
        bool::from(got.ct_eq(&self.expected))
    }
}

impl Interceptor for CheckToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(got) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "missing authorization: Bearer <token> (security.token_file)",
            ));
        };
        if self.matches(got.as_bytes()) {
            Ok(req)
        } else {
            Err(Status::unauthenticated(
                "wrong cluster token (compare security.token_file on both hosts)",
            ))
        }
    }
}

/// Client side: adds the token to every request.
#[derive(Clone)]
pub struct AddToken {
    /// `Bearer <token>`, parsed once.
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl AddToken {
    /// Errors when the token has characters a header cannot carry.
    pub fn new(token: &str) -> Result<Self, ClientError> {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| ClientError::Token)?;
        Ok(Self { value })
    }
}

impl Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut()
            .insert("authorization", self.value.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_right_token() {
        let mut check = CheckToken::new("s3cret");
        assert_eq!(
            check.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut wrong = AddToken::new("s3cres").unwrap();
        let req = wrong.call(Request::new(())).unwrap();
        assert_eq!(
            check.call(req).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut right = AddToken::new("s3cret").unwrap();
        assert!(check.call(right.call(Request::new(())).unwrap()).is_ok());
    }
}
