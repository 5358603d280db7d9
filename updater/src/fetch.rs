//! Artifact fetching: one entry point, [`Fetcher::fetch`], dispatching on
//! the artifact URL's scheme, and one streaming path shared by every source
//! ([`stream_verified`]): bytes are counted against the limit, hashed and
//! written to the caller's temp file as they arrive, never held whole in
//! memory.
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
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use fleet_common::contracts::UpgradeReason;
use fleet_common::durable::{AtomicFile, DurableError, DurableStep};
pub use fleet_common::https::TlsSetupError;
use fleet_common::https::{self, ClientSettings, Trust};
use fleet_common::limits::MAX_ARTIFACT_BYTES;
use fleet_common::validate::{ArtifactUrl, HttpsUrl, OciReference, Sha256Hex};
use sha2::Digest;
use std::time::Duration;

use crate::config::Bounds;
use crate::oci::{OciError, Pull};

/// Read size of the streaming path: large enough that hashing and writing
/// run at memory speed, small enough to keep the updater's RSS flat.
const CHUNK_BYTES: usize = 128 * 1024;
/// Blocks in flight between the reading and the hashing thread.
const PIPELINE_BLOCKS: usize = 3;

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

/// What a finished fetch wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub bytes: u64,
    pub sha256: Sha256Hex,
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

/// The way forward of a failed download, in the words of the updater's
/// config ([`https::transport_message`]).
pub(crate) const TRANSPORT_HINTS: https::TransportHints = https::TransportHints {
    certificate: "the server's certificate is not trusted: give its CA in ca-file of the updater config, or fix the server's chain",
    connect: "check the URL and the device's network",
};

pub(crate) fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            format!("timed out ({e}): the server stalled")
        }
        _ => e.to_string(),
    }
}

/// A failure of the shared streaming path.
#[derive(Debug)]
pub enum StreamError {
    TooLarge,
    Read { received: u64, source: io::Error },
    Write(DurableError),
}

/// Copies `body` into `out` until EOF, hashing as it goes, refusing more
/// than `limit` bytes (it reads one byte past the limit to know).
///
/// Two threads share the work: this one reads (for HTTPS, that is TLS
/// decryption) while a scoped `updater-hash` thread hashes and writes the
/// blocks already read; [`PIPELINE_BLOCKS`] blocks circulate between them,
/// so memory stays bounded. If that thread cannot be created, one thread
/// does everything.
pub fn stream_verified(
    mut body: impl Read,
    limit: u64,
    out: &mut AtomicFile,
) -> Result<Fetched, StreamError> {
    match pipelined(&mut body, limit, out) {
        Some(result) => result,
        None => {
            log::warn!("cannot start the hashing thread; hashing on the download thread");
            sequential(&mut body, limit, out)
        }
    }
}

/// [`stream_verified`] on two threads; `None` when the second thread
/// cannot be created (nothing was read then).
fn pipelined(
    body: &mut impl Read,
    limit: u64,
    out: &mut AtomicFile,
) -> Option<Result<Fetched, StreamError>> {
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIPELINE_BLOCKS);
        let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::Builder::new()
            .name("updater-hash".to_owned())
            .spawn_scoped(scope, move || -> Result<Sha256Hex, DurableError> {
                let mut hasher = sha2::Sha256::new();
                for (block, n) in full_rx {
                    hasher.update(&block[..n]);
                    out.write_all(&block[..n])?;
                    // The reader may have stopped; the block is then dropped.
                    let _ = free_tx.send(block);
                }
                Ok(Sha256Hex::from_digest(&hasher.finalize().into()))
            })
            .ok()?;
        let mut spare: Vec<Vec<u8>> = (0..PIPELINE_BLOCKS)
            .map(|_| vec![0u8; CHUNK_BYTES])
            .collect();
        let mut received: u64 = 0;
        let outcome = loop {
            let mut block = match spare.pop() {
                Some(b) => b,
                None => match free_rx.recv() {
                    Ok(b) => b,
                    // The writer stopped: its error is collected below.
                    Err(_) => break Ok(()),
                },
            };
            let n = match fill(body, &mut block) {
                Ok(n) => n,
                Err((n, source)) => {
                    break Err(StreamError::Read {
                        received: received + n as u64,
                        source,
                    })
                }
            };
            if n == 0 {
                break Ok(());
            }
            received += n as u64;
            if received > limit {
                break Err(StreamError::TooLarge);
            }
            if full_tx.send((block, n)).is_err() {
                break Ok(());
            }
        };
        drop(full_tx);
        let hashed = writer.join().unwrap_or_else(|_| {
            Err(DurableError {
                step: DurableStep::Write,
                path: PathBuf::from("the download"),
                source: io::Error::other("the hashing thread panicked"),
            })
        });
        Some(outcome.and_then(|()| {
            let sha256 = hashed.map_err(StreamError::Write)?;
            Ok(Fetched {
                bytes: received,
                sha256,
            })
        }))
    })
}

/// [`stream_verified`] on the calling thread alone.
fn sequential(
    body: &mut impl Read,
    limit: u64,
    out: &mut AtomicFile,
) -> Result<Fetched, StreamError> {
    let mut hasher = sha2::Sha256::new();
    let mut block = vec![0u8; CHUNK_BYTES];
    let mut received: u64 = 0;
    loop {
        let n = fill(body, &mut block).map_err(|(n, source)| StreamError::Read {
            received: received + n as u64,
            source,
        })?;
        if n == 0 {
            break;
        }
        received += n as u64;
        if received > limit {
            return Err(StreamError::TooLarge);
        }
        hasher.update(&block[..n]);
        out.write_all(&block[..n]).map_err(StreamError::Write)?;
    }
    Ok(Fetched {
        bytes: received,
        sha256: Sha256Hex::from_digest(&hasher.finalize().into()),
    })
}

/// Reads until `block` is full or EOF (TLS yields one 16 KiB record per
/// read), so hashing and writing run on large blocks. On error, also says
/// how many bytes of this block had arrived.
fn fill(body: &mut impl Read, block: &mut [u8]) -> Result<usize, (usize, io::Error)> {
    let mut n = 0;
    while n < block.len() {
        match body.read(&mut block[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((n, e)),
        }
    }
    Ok(n)
}

/// SHA-256 of a file, streamed.
pub fn hash_file(path: &Path) -> io::Result<Sha256Hex> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Sha256Hex::from_digest(&hasher.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_hashes_counts_and_stops_past_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("a");
        let data = vec![7u8; 300_000];
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        let got = stream_verified(&data[..], 300_000, &mut out).expect("fits");
        assert_eq!(got.bytes, 300_000);
        assert_eq!(got.sha256, Sha256Hex::of(&data));
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        assert!(matches!(
            stream_verified(&data[..], 299_999, &mut out),
            Err(StreamError::TooLarge)
        ));
        // The single-thread fallback gives the same answers.
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        assert_eq!(
            sequential(&mut &data[..], 300_000, &mut out).expect("fits"),
            got
        );
        out.commit().expect("commit");
        assert_eq!(std::fs::read(&target).expect("read"), data);
        let mut out = AtomicFile::create(&target, 0o755).expect("create");
        assert!(matches!(
            sequential(&mut &data[..], 299_999, &mut out),
            Err(StreamError::TooLarge)
        ));
        let f = dir.path().join("f");
        std::fs::write(&f, &data).expect("write");
        assert_eq!(hash_file(&f).expect("hash"), Sha256Hex::of(&data));
    }

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
