//! HTTPS clients, built one way for every component that speaks HTTPS
//! (artifact downloads and registries in the updater and fleetctl, the
//! identity provider in the agent and the auth callout): rustls with the
//! ring provider, HTTPS only, no redirects (a caller that follows them does
//! so hop by hop, checking each), the connect and the whole request bounded,
//! and bodies read up to a limit.
//!
//! Trust anchors are either the system bundle (plus an extra PEM file) or
//! exactly one PEM file; see [`Trust`]. Behind the `https` feature, so
//! crates without HTTPS don't link ureq and rustls.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The Debian/Ubuntu system trust store (package ca-certificates).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Which certificate authorities a client trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust<'a> {
    /// The system bundle, plus every CA of `extra` when given.
    System { extra: Option<&'a Path> },
    /// Exactly the CAs of this PEM file.
    Only(&'a Path),
}

impl<'a> Trust<'a> {
    /// `Only(path)` when a CA file is configured, else the system bundle.
    pub fn file_or_system(ca_file: Option<&'a Path>) -> Self {
        match ca_file {
            Some(p) => Self::Only(p),
            None => Self::System { extra: None },
        }
    }
}

/// A client that could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSetupError {
    /// The CA file is unreadable, not PEM, or holds an unusable certificate.
    CaFile {
        path: PathBuf,
        message: String,
    },
    /// The CA file holds no certificate.
    NoCertificates {
        path: PathBuf,
    },
    /// Neither the system bundle nor an extra file gave a trust anchor.
    NoTrustAnchors,
    Rustls(String),
}

impl fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CaFile { path, message } => write!(
                f,
                "cannot use the CA file {}: {message}: give a PEM file of CA certificates",
                path.display()
            ),
            Self::NoCertificates { path } => write!(
                f,
                "the CA file {} holds no PEM certificate: give a PEM file of CA certificates",
                path.display()
            ),
            Self::NoTrustAnchors => write!(
                f,
                "no trust anchors: {SYSTEM_CA_BUNDLE} is missing or empty and no CA file is configured; install ca-certificates or configure a CA file"
            ),
            Self::Rustls(e) => write!(f, "cannot set up TLS: {e}"),
        }
    }
}

impl std::error::Error for TlsSetupError {}

/// Adds every certificate of the PEM file `path`, refusing a file without one.
fn add_pem_file(roots: &mut rustls::RootCertStore, path: &Path) -> Result<(), TlsSetupError> {
    let bad = |message: String| TlsSetupError::CaFile {
        path: path.to_owned(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut added = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not valid PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("unusable certificate: {e}")))?;
        added += 1;
    }
    if added == 0 {
        return Err(TlsSetupError::NoCertificates {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// The trust anchors of `trust`.
pub fn root_store(trust: Trust<'_>) -> Result<rustls::RootCertStore, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    match trust {
        Trust::Only(path) => add_pem_file(&mut roots, path)?,
        Trust::System { extra } => {
            match std::fs::read(SYSTEM_CA_BUNDLE) {
                Ok(pem) => {
                    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
                        // A system bundle may hold a certificate rustls
                        // cannot use; skipping it is what every client does.
                        let _ = roots.add(cert);
                    }
                }
                Err(e) => log::warn!("system trust store {SYSTEM_CA_BUNDLE} unreadable: {e}"),
            }
            if let Some(path) = extra {
                add_pem_file(&mut roots, path)?;
            }
        }
    }
    if roots.is_empty() {
        return Err(TlsSetupError::NoTrustAnchors);
    }
    Ok(roots)
}

/// Checks `trust` cheaply, without keeping anything: a CA file must hold
/// usable certificates; without one, the system bundle must be there. A
/// daemon that builds its client only when it needs one (the updater, idle
/// almost always) still refuses a bad CA file at start.
pub fn check_trust(trust: Trust<'_>) -> Result<(), TlsSetupError> {
    match trust {
        Trust::Only(path) | Trust::System { extra: Some(path) } => {
            add_pem_file(&mut rustls::RootCertStore::empty(), path)
        }
        Trust::System { extra: None } => match std::fs::metadata(SYSTEM_CA_BUNDLE) {
            Ok(m) if m.len() > 0 => Ok(()),
            _ => Err(TlsSetupError::NoTrustAnchors),
        },
    }
}

/// A rustls client config (ring provider, safe default versions) on `trust`.
pub fn client_config(trust: Trust<'_>) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let roots = root_store(trust)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Rustls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The bounds and identity of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSettings {
    /// TCP connect and TLS handshake.
    pub connect: Duration,
    /// One whole request, body included.
    pub request: Duration,
    /// `User-Agent`, e.g. `fleet-updater/0.1.0`.
    pub user_agent: &'static str,
}

/// ureq's TLS on our rustls config. ureq is built without its `tls`
/// feature: that one compiles in webpki-roots (Mozilla's roots, ~250 KiB of
/// every binary) and builds a client config on them for every agent, though
/// we never trust them — our anchors are the system's or a CA file's.
#[derive(Debug)]
struct RustlsConnector(Arc<rustls::ClientConfig>);

impl ureq::TlsConnector for RustlsConnector {
    fn connect(
        &self,
        dns_name: &str,
        mut io: Box<dyn ureq::ReadWrite>,
    ) -> Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        // An IPv6 literal comes bracketed from the URL.
        let name = dns_name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(dns_name);
        // ureq lets a connector build its errors from I/O errors only.
        let server = rustls_pki_types::ServerName::try_from(name.to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a TLS server name: {e}"),
            )
        })?;
        let mut conn = rustls::ClientConnection::new(Arc::clone(&self.0), server)
            .map_err(|e| io::Error::other(format!("TLS session setup failed: {e}")))?;
        // The handshake here, so that its failure (an untrusted
        // certificate, say) is reported as such, not as a failed read.
        conn.complete_io(&mut io).map_err(|e| {
            io::Error::new(e.kind(), format!("TLS handshake with {name} failed: {e}"))
        })?;
        Ok(Box::new(TlsStream(rustls::StreamOwned::new(conn, io))))
    }
}

/// One TLS connection for ureq.
struct TlsStream(rustls::StreamOwned<rustls::ClientConnection, Box<dyn ureq::ReadWrite>>);

impl fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TlsStream").finish()
    }
}

impl ureq::ReadWrite for TlsStream {
    fn socket(&self) -> Option<&std::net::TcpStream> {
        self.0.get_ref().socket()
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl io::Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// A ureq agent builder whose TLS is `config` (nothing else set).
pub fn agent_builder(config: Arc<rustls::ClientConfig>) -> ureq::AgentBuilder {
    ureq::AgentBuilder::new().tls_connector(Arc::new(RustlsConnector(config)))
}

/// A ureq agent: HTTPS only, no redirects, bounded by `settings`, on `trust`.
pub fn agent(trust: Trust<'_>, settings: ClientSettings) -> Result<ureq::Agent, TlsSetupError> {
    Ok(agent_builder(client_config(trust)?)
        .https_only(true)
        .redirects(0)
        .timeout_connect(settings.connect)
        .timeout(settings.request)
        .user_agent(settings.user_agent)
        .build())
}

/// What a caller of [`transport_message`] tells its user to do, in the
/// words of its own configuration (the updater's config file, fleetctl's
/// flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportHints {
    /// When the server's certificate is not trusted.
    pub certificate: &'static str,
    /// When the connection or the name lookup failed.
    pub connect: &'static str,
}

/// ureq's transport error without the URL (the caller names it), with its
/// causes each said once, and the way forward for the usual ones: a stall,
/// an untrusted certificate (`hints.certificate`), no connection
/// (`hints.connect`).
pub fn transport_message(t: &ureq::Transport, hints: TransportHints) -> String {
    use std::error::Error;
    let kind = t.kind().to_string();
    let mut msg = kind.clone();
    if let Some(m) = t.message() {
        msg.push_str(": ");
        msg.push_str(m);
    }
    let mut source = t.source();
    while let Some(s) = source {
        let text = s.to_string();
        // ureq's I/O errors may wrap its own transport error: its kind
        // would be said twice.
        let text = text.strip_prefix(&format!("{kind}: ")).unwrap_or(&text);
        if !msg.contains(text) {
            msg.push_str(": ");
            msg.push_str(text);
        }
        source = s.source();
    }
    if msg.contains("timed out") {
        msg.push_str("; the server stalled");
    } else if msg.contains("certificate") {
        msg.push_str("; ");
        msg.push_str(hints.certificate);
    } else if matches!(
        t.kind(),
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns
    ) {
        msg.push_str("; ");
        msg.push_str(hints.connect);
    }
    msg
}

/// Why one HTTPS exchange failed once the client was built; each names the
/// URL. Callers wrap it in their own error with what they add (the config
/// key of their CA file, the statuses they refuse).
#[derive(Debug)]
pub enum ExchangeError {
    /// Connect, TLS handshake, timeout or protocol failure.
    Request {
        url: String,
        detail: String,
    },
    TooLarge {
        url: String,
        limit: u64,
    },
    Read {
        url: String,
        source: io::Error,
    },
}

impl ExchangeError {
    /// A request to `url` that got no HTTP answer.
    pub fn request(url: &str, e: &ureq::Error) -> Self {
        Self::Request {
            url: url.to_owned(),
            detail: e.to_string(),
        }
    }
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request { url, detail } => write!(
                f,
                "request to {url} failed: {detail}; check the URL, the network and the CA"
            ),
            Self::TooLarge { url, limit } => {
                write!(f, "{url} answered more than {limit} bytes")
            }
            Self::Read { url, source } => write!(f, "reading the answer of {url} failed: {source}"),
        }
    }
}

impl std::error::Error for ExchangeError {}

/// [`read_body`] of the answer of `url`, failures naming it.
pub fn read_body_of(
    url: &str,
    response: ureq::Response,
    limit: u64,
) -> Result<Vec<u8>, ExchangeError> {
    read_body(response, limit).map_err(|e| match e {
        BodyError::TooLarge { limit } => ExchangeError::TooLarge {
            url: url.to_owned(),
            limit,
        },
        BodyError::Read(source) => ExchangeError::Read {
            url: url.to_owned(),
            source,
        },
    })
}

/// A body that could not be read whole.
#[derive(Debug)]
pub enum BodyError {
    TooLarge { limit: u64 },
    Read(io::Error),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { limit } => write!(f, "the answer is larger than {limit} bytes"),
            Self::Read(e) => write!(f, "reading the answer: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Reads a response body, refusing one larger than `limit` bytes.
pub fn read_body(response: ureq::Response, limit: u64) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    response
        .into_reader()
        .take(limit.saturating_add(1))
        .read_to_end(&mut body)
        .map_err(BodyError::Read)?;
    if body.len() as u64 > limit {
        return Err(BodyError::TooLarge { limit });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_ca_files_with_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, b"# nothing\n").expect("write");
        assert_eq!(
            root_store(Trust::Only(&empty)).err(),
            Some(TlsSetupError::NoCertificates {
                path: empty.clone()
            })
        );
        let missing = dir.path().join("missing.pem");
        let e = root_store(Trust::System {
            extra: Some(&missing),
        })
        .expect_err("missing file");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot use the CA file {}", missing.display())),
            "{e}"
        );
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        assert!(matches!(
            root_store(Trust::Only(&garbage)),
            Err(TlsSetupError::CaFile { .. })
        ));
    }

    #[test]
    fn system_bundle_is_used() {
        // This machine has ca-certificates (make deps installs curl, which
        // depends on it).
        let roots = root_store(Trust::System { extra: None }).expect("system roots");
        assert!(roots.len() > 10, "{} roots", roots.len());
    }
}
