//! HTTPS towards the identity provider (its JWKS), on the shared client of
//! `fleet_common::https`: HTTPS only, no redirect, the connect and the whole
//! request bounded, trusting either the system bundle or exactly the CAs of
//! one PEM file; bodies are read up to a limit.

use std::fmt;
use std::path::Path;

use fleet_common::https::{self, BodyError, ClientSettings, Trust};
use fleet_common::limits::{IDP_CONNECT_TIMEOUT, IDP_REQUEST_TIMEOUT};

/// Why an HTTPS exchange with the identity provider failed.
#[derive(Debug)]
pub enum HttpsError {
    /// The trust store (the CA file, or the system bundle) could not be built.
    Setup(https::TlsSetupError),
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
            Self::Setup(e) => write!(f, "{e} (https_ca_file)"),
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

/// An agent trusting `ca_file`'s certificates only, or the system bundle
/// when `None`.
pub fn agent(ca_file: Option<&Path>) -> Result<ureq::Agent, HttpsError> {
    https::agent(
        Trust::file_or_system(ca_file),
        ClientSettings {
            connect: IDP_CONNECT_TIMEOUT,
            request: IDP_REQUEST_TIMEOUT,
            user_agent: concat!("fleet-auth-callout/", env!("CARGO_PKG_VERSION")),
        },
    )
    .map_err(HttpsError::Setup)
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
    https::read_body(response, limit).map_err(|e| match e {
        BodyError::TooLarge { limit } => HttpsError::TooLarge {
            url: url.to_owned(),
            limit,
        },
        BodyError::Read(source) => HttpsError::Read {
            url: url.to_owned(),
            source,
        },
    })
}
