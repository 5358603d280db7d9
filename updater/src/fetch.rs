//! Artifact fetching: one entry point, [`Fetcher::fetch`], dispatching on
//! the artifact URL's scheme. Every source writes through the one
//! streaming path of [`crate::stream`] (counted, hashed, never held whole
//! in memory).
//!
//! HTTPS: redirects disabled (a 3xx is an error naming its Location), a
//! connect bound and a whole-request bound, a declared `Content-Length`
//! above the limit refused before the body is read, and a body that ends
//! before its declared length refused as truncated. Trust anchors are the
//! system store plus the config's `ca-file`.
//!
//! OCI references are pulled by [`crate::oci`] (manifest checks, token,
//! blob redirects) over the same client and into the same streaming path.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use fleet_common::contracts::UpgradeReason;
use fleet_common::durable::{AtomicFile, DurableError};
pub use fleet_common::https::TlsSetupError;
use fleet_common::https::{self, ClientSettings, Trust};
use fleet_common::limits::MAX_ARTIFACT_BYTES;
use fleet_common::validate::{ArtifactUrl, HttpsUrl, OciReference, Sha256Hex};
use std::time::Duration;

use crate::config::Bounds;
use crate::oci::{OciError, Pull};
use crate::stream::{describe_io, stream_verified, Fetched, StreamError, TRANSPORT_HINTS};

/// A fetch that did not produce the artifact.
#[derive(Debug)]
pub enum FetchError {
    /// The trust store could not be built (the CA file changed since the
    /// start, say).
    Trust {
        url: String,
        error: TlsSetupError,
    },
    Oci {
        reference: OciReference,
        error: Box<OciError>,
    },
    Request {
        url: String,
        message: String,
    },
    Status {
        url: String,
        status: u16,
    },
    Redirect {
        url: String,
        status: u16,
        location: String,
    },
    DeclaredTooLarge {
        url: String,
        declared: u64,
        limit: u64,
    },
    TooLarge {
        url: String,
        limit: u64,
    },
    Truncated {
        url: String,
        received: u64,
        message: String,
    },
    Body {
        url: String,
        received: u64,
        message: String,
    },
    Write(DurableError),
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trust { url, error } => {
                write!(f, "downloading {url}: {error} (updater config key ca-file)")
            }
            Self::Oci { reference, error } => write!(f, "{reference}: {error}"),
            Self::Request { url, message } => write!(f, "downloading {url}: {message}"),
            Self::Status { url, status } => {
                write!(f, "downloading {url}: the server answered HTTP {status}")
            }
            Self::Redirect { url, status, location } => write!(
                f,
                "downloading {url}: the server redirects (HTTP {status}, Location: {location}); redirects are refused: publish the artifact at its final https:// URL"
            ),
            Self::DeclaredTooLarge { url, declared, limit } => write!(
                f,
                "downloading {url}: the server declares {declared} bytes, more than the limit of {limit}"
            ),
            Self::TooLarge { url, limit } => write!(
                f,
                "downloading {url}: the body exceeds the limit of {limit} bytes; download stopped"
            ),
            Self::Truncated { url, received, message } => write!(
                f,
                "downloading {url}: the body ended after {received} bytes, before its declared length ({message})"
            ),
            Self::Body { url, received, message } => {
                write!(f, "downloading {url}: reading the body failed after {received} bytes: {message}")
            }
            Self::Write(e) => write!(f, "saving the download: {e}"),
        }
    }
}

impl std::error::Error for FetchError {}

impl FetchError {
    /// Whether saving the download failed for lack of space (freeing some
    /// and downloading again may succeed).
    pub fn is_no_space(&self) -> bool {
        match self {
            Self::Write(e) => e.is_no_space(),
            Self::Oci { error, .. } => matches!(&**error, OciError::Write(e) if e.is_no_space()),
            _ => false,
        }
    }

    /// The public reason of an attempt that failed here.
    pub fn reason(&self) -> UpgradeReason {
        match self {
            Self::DeclaredTooLarge { .. } | Self::TooLarge { .. } => UpgradeReason::TooLarge,
            Self::Oci { error, .. } => error.reason(),
            Self::Write(_) => UpgradeReason::Install,
            _ => UpgradeReason::Download,
        }
    }
}

/// Fetches artifacts. The HTTPS client (trust store, timeouts) is built
/// for each fetch, not kept: an idle updater holds no parsed trust store
/// (~0.3 MiB of its resident memory), and a CA bundle updated on the device
/// is used by the next upgrade without a restart.
#[derive(Debug)]
pub struct Fetcher {
    ca_file: Option<PathBuf>,
    settings: ClientSettings,
    /// The bound of one whole OCI pull (token, manifest, blob and its
    /// redirects together), as `https_request` bounds one HTTPS download.
    pull_bound: Duration,
}

impl Fetcher {
    /// Checks the trust anchors (the system store, plus `ca_file` when
    /// given: it must hold usable certificates) and keeps the bounds.
    pub fn new(ca_file: Option<&Path>, bounds: &Bounds) -> Result<Self, TlsSetupError> {
        https::check_trust(Trust::System { extra: ca_file })?;
        Ok(Self {
            ca_file: ca_file.map(Path::to_owned),
            settings: ClientSettings {
                connect: bounds.https_connect,
                request: bounds.https_request,
                user_agent: concat!("fleet-updater/", env!("CARGO_PKG_VERSION")),
            },
            pull_bound: bounds.https_request,
        })
    }

    /// The client of one fetch: the system store plus the CA file, ring,
    /// redirects off, the connect and request bounds.
    fn agent(&self, url: &str) -> Result<ureq::Agent, FetchError> {
        https::agent(
            Trust::System {
                extra: self.ca_file.as_deref(),
            },
            self.settings,
        )
        .map_err(|e| FetchError::Trust {
            url: url.to_owned(),
            error: e,
        })
    }

    /// Fetches `url` into `out`, at most `limit` bytes (never more than the
    /// compiled ceiling), returning the size and SHA-256 of what was written.
    /// The caller compares that SHA-256 with the attempt's; an OCI pull also
    /// refuses, before downloading, a release whose manifest names another
    /// `sha256`.
    pub fn fetch(
        &self,
        url: &ArtifactUrl,
        sha256: &Sha256Hex,
        limit: u64,
        out: &mut AtomicFile,
    ) -> Result<Fetched, FetchError> {
        let limit = limit.min(MAX_ARTIFACT_BYTES);
        match url {
            ArtifactUrl::Https(u) => self.https(u, limit, out),
            ArtifactUrl::Oci(reference) => Pull::new(
                &self.agent(&reference.to_string())?,
                reference,
                self.pull_bound,
            )
            .run(sha256, limit, out)
            .map_err(|error| FetchError::Oci {
                reference: reference.clone(),
                error: Box::new(error),
            }),
        }
    }

    fn https(
        &self,
        url: &HttpsUrl,
        limit: u64,
        out: &mut AtomicFile,
    ) -> Result<Fetched, FetchError> {
        let shown = url.to_string();
        let response = match self.agent(&shown)?.get(&shown).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(status, _)) => {
                return Err(FetchError::Status { url: shown, status })
            }
            Err(ureq::Error::Transport(t)) => {
                return Err(FetchError::Request {
                    url: shown,
                    message: https::transport_message(&t, TRANSPORT_HINTS),
                })
            }
        };
        let status = response.status();
        if (300..400).contains(&status) {
            return Err(FetchError::Redirect {
                url: shown,
                status,
                location: response
                    .header("location")
                    .unwrap_or("(none)")
                    .chars()
                    .take(256)
                    .collect(),
            });
        }
        if status != 200 {
            return Err(FetchError::Status { url: shown, status });
        }
        // A Transfer-Encoding overrides Content-Length (RFC 9112 6.3): the
        // length is then only known by counting.
        let declared = response
            .header("content-length")
            .filter(|_| response.header("transfer-encoding").is_none())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(declared) = declared {
            if declared > limit {
                return Err(FetchError::DeclaredTooLarge {
                    url: shown,
                    declared,
                    limit,
                });
            }
        }
        stream_verified(response.into_reader(), limit, out).map_err(|e| match e {
            StreamError::TooLarge => FetchError::TooLarge { url: shown, limit },
            StreamError::Read { received, source }
                if source.kind() == io::ErrorKind::UnexpectedEof && declared.is_some() =>
            {
                FetchError::Truncated {
                    url: shown,
                    received,
                    message: source.to_string(),
                }
            }
            StreamError::Read { received, source } => FetchError::Body {
                url: shown,
                received,
                message: describe_io(&source),
            },
            StreamError::Write(e) => FetchError::Write(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, "not pem").expect("write");
        let e = Fetcher::new(Some(&p), &Bounds::default()).expect_err("no certs");
        assert_eq!(
            e.to_string(),
            format!(
                "the CA file {} holds no PEM certificate: give a PEM file of CA certificates",
                p.display()
            )
        );
    }

    #[test]
    fn a_ca_file_broken_after_the_start_fails_the_fetch_not_the_daemon() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("ca.pem");
        let bundle = std::fs::read(https::SYSTEM_CA_BUNDLE).expect("ca-certificates installed");
        std::fs::write(&p, bundle).expect("write");
        let fetcher = Fetcher::new(Some(&p), &Bounds::default()).expect("a good CA file");
        std::fs::write(&p, "not pem").expect("write");
        let url = HttpsUrl::parse("https://127.0.0.1:1/agent").expect("url");
        let mut out = AtomicFile::create(&dir.path().join("artifact"), 0o644).expect("temp file");
        let e = fetcher
            .https(&url, 1024, &mut out)
            .expect_err("no trust anchors");
        assert!(matches!(e, FetchError::Trust { .. }), "{e:?}");
        assert_eq!(e.reason(), UpgradeReason::Download);
        assert!(
            e.to_string().contains("(updater config key ca-file)"),
            "{e}"
        );
    }
}
