//! HTTPS towards the identity provider (its JWKS): a ureq agent
//! that speaks HTTPS only, follows no redirect, bounds the connect and the
//! whole request, and trusts either the built-in web PKI roots or exactly
//! the CAs of one PEM file; bodies are read up to a limit.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleet_common::limits::{IDP_CONNECT_TIMEOUT, IDP_REQUEST_TIMEOUT};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Why an HTTPS exchange with the identity provider failed.
#[derive(Debug)]
pub enum HttpsError {
    CaFile {
        path: PathBuf,
        detail: String,
    },
    NoCertificates {
        path: PathBuf,
    },
    Tls(String),
    /// Connect, TLS handshake, timeout or protocol failure.
    Request {
        url: String,
        detail: String,
    },
    /// A status other than 200 (redirects included: none is followed).
    Status {
        url: String,
        status: u16,
    },
    TooLarge {
        url: String,
        limit: u64,
    },
    Read {
        url: String,
        source: std::io::Error,
    },
}

impl fmt::Display for HttpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CaFile { path, detail } => write!(
                f,
                "cannot read the CA file {}: {detail}; point the config at a PEM file of CA certificates",
                path.display()
            ),
            Self::NoCertificates { path } => write!(
                f,
                "the CA file {} holds no PEM certificate",
                path.display()
            ),
            Self::Tls(e) => write!(f, "cannot set up TLS: {e}"),
            Self::Request { url, detail } => write!(
                f,
                "request to {url} failed: {detail}; check the URL, the network and the CA"
            ),
            Self::Status { url, status } => write!(
                f,
                "{url} answered HTTP {status} (redirects are not followed): check the URL"
            ),
            Self::TooLarge { url, limit } => {
                write!(f, "{url} answered more than {limit} bytes")
            }
            Self::Read { url, source } => write!(f, "reading the answer of {url} failed: {source}"),
        }
    }
}

impl std::error::Error for HttpsError {}

/// An agent trusting `ca_file`'s certificates only, or the built-in web PKI
/// roots when `None`.
pub fn agent(ca_file: Option<&Path>) -> Result<ureq::Agent, HttpsError> {
    let mut builder = ureq::AgentBuilder::new()
        .https_only(true)
        .redirects(0)
        .timeout_connect(IDP_CONNECT_TIMEOUT)
        .timeout(IDP_REQUEST_TIMEOUT)
        .user_agent(concat!("fleet-auth-callout/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_file {
        let ca_err = |detail: String| HttpsError::CaFile {
            path: path.to_owned(),
            detail,
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| ca_err(e.to_string()))?;
        for cert in certs {
            let cert = cert.map_err(|e| ca_err(e.to_string()))?;
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(HttpsError::NoCertificates {
                path: path.to_owned(),
            });
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpsError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        builder = builder.tls_config(Arc::new(config));
    }
    Ok(builder.build())
}

/// `GET url`, 200 required, body up to `limit` bytes.
pub fn get(agent: &ureq::Agent, url: &str, limit: u64) -> Result<Vec<u8>, HttpsError> {
    match agent.get(url).set("Accept", "application/json").call() {
        Ok(response) if response.status() == 200 => read_body(url, response, limit),
        Ok(response) => Err(HttpsError::Status {
            url: url.to_owned(),
            status: response.status(),
        }),
        Err(ureq::Error::Status(status, _)) => Err(HttpsError::Status {
            url: url.to_owned(),
            status,
        }),
        Err(e) => Err(request_error(url, e)),
    }
}

fn request_error(url: &str, e: ureq::Error) -> HttpsError {
    HttpsError::Request {
        url: url.to_owned(),
        detail: e.to_string(),
    }
}

fn read_body(url: &str, response: ureq::Response, limit: u64) -> Result<Vec<u8>, HttpsError> {
    let mut body = Vec::new();
    response
        .into_reader()
        .take(limit + 1)
        .read_to_end(&mut body)
        .map_err(|source| HttpsError::Read {
            url: url.to_owned(),
            source,
        })?;
    if body.len() as u64 > limit {
        return Err(HttpsError::TooLarge {
            url: url.to_owned(),
            limit,
        });
    }
    Ok(body)
}
