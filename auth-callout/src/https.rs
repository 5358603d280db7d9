//! HTTPS towards the identity provider (its JWKS), on the shared client of
//! `fleet_common::https`: HTTPS only, no redirect, the connect and the whole
//! request bounded, trusting either the system bundle or exactly the CAs of
//! one PEM file; bodies are read up to a limit.

use std::fmt;
use std::path::Path;

use fleet_common::https::{self, ClientSettings, ExchangeError, Trust};
use fleet_common::limits::{IDP_CONNECT_TIMEOUT, IDP_REQUEST_TIMEOUT};

/// Why an HTTPS exchange with the identity provider failed.
#[derive(Debug)]
pub enum HttpsError {
    /// The trust store (the CA file, or the system bundle) could not be built.
    Setup(https::TlsSetupError),
    Exchange(ExchangeError),
    /// A status other than 200 (redirects included: none is followed).
    Status {
        url: String,
        status: u16,
    },
}

impl fmt::Display for HttpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Setup(e) => write!(f, "{e} (https_ca_file)"),
            Self::Exchange(e) => e.fmt(f),
            Self::Status { url, status } => write!(
                f,
                "{url} answered HTTP {status} (redirects are not followed): check the URL"
            ),
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
        Ok(response) if response.status() == 200 => {
            https::read_body_of(url, response, limit).map_err(HttpsError::Exchange)
        }
        Ok(response) => Err(HttpsError::Status {
            url: url.to_owned(),
            status: response.status(),
        }),
        Err(ureq::Error::Status(status, _)) => Err(HttpsError::Status {
            url: url.to_owned(),
            status,
        }),
        Err(e) => Err(HttpsError::Exchange(ExchangeError::request(url, &e))),
    }
}
