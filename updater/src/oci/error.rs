//! What a failed pull says: [`OciError`], on which request ([`Step`]),
//! with URLs and registry text cut to a readable length.

use std::fmt;
use std::time::Duration;

use fleet_common::contracts::{ManifestError, UpgradeReason, OCI_MANIFEST_MEDIA_TYPE};
use fleet_common::durable::DurableError;
use fleet_common::limits::MAX_BLOB_REDIRECTS;
use fleet_common::validate::Sha256Hex;

/// Characters of a URL or registry message shown in an error.
pub(super) const SHOWN_CHARS: usize = 160;

/// The request an error happened on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Manifest,
    Token,
    Blob,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Manifest => "fetching the manifest",
            Self::Token => "getting an anonymous token",
            Self::Blob => "downloading the blob",
        })
    }
}

/// A pull that did not produce the artifact. Shown after the reference.
#[derive(Debug)]
pub enum OciError {
    Transport {
        step: Step,
        url: String,
        message: String,
    },
    Status {
        step: Step,
        url: String,
        status: u16,
        /// The registry's first error, `CODE: message`, when it sent one.
        registry: Option<String>,
    },
    /// A manifest or token request answered with a redirect.
    Redirect {
        step: Step,
        url: String,
        status: u16,
        location: String,
    },
    /// A 401 without a challenge this client can answer.
    Challenge {
        url: String,
        why: String,
    },
    TokenResponse {
        url: String,
        why: String,
    },
    /// Still 401 (or 403) with the anonymous token.
    Unauthorized {
        step: Step,
        url: String,
        status: u16,
    },
    BodyTooLarge {
        step: Step,
        url: String,
        limit: u64,
    },
    Body {
        step: Step,
        url: String,
        received: u64,
        message: String,
    },
    ContentType {
        url: String,
        found: String,
    },
    ManifestDigest {
        got: Sha256Hex,
    },
    Manifest {
        digest: Sha256Hex,
        error: ManifestError,
    },
    LayerDigest {
        layer: Sha256Hex,
        attempt: Sha256Hex,
    },
    LayerTooLarge {
        size: u64,
        limit: u64,
    },
    /// The blob's `Content-Length` is over the layer's declared size.
    BlobLength {
        url: String,
        length: u64,
        declared: u64,
    },
    /// The blob ran past the layer's declared size.
    BlobTooLong {
        url: String,
        declared: u64,
    },
    /// The blob ended before the layer's declared size.
    BlobShort {
        url: String,
        got: u64,
        declared: u64,
    },
    RedirectInsecure {
        url: String,
        location: String,
    },
    RedirectLocation {
        url: String,
        location: String,
        why: &'static str,
    },
    TooManyRedirects {
        url: String,
    },
    Deadline {
        step: Step,
        bound: Duration,
    },
    Write(DurableError),
}

impl fmt::Display for OciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport { step, url, message } => {
                write!(f, "{step} ({}): {message}", shown(url))
            }
            Self::Status {
                step,
                url,
                status,
                registry,
            } => {
                write!(f, "{step} ({}): the server answered HTTP {status}", shown(url))?;
                if let Some(r) = registry {
                    write!(f, " ({r})")?;
                }
                match (step, status) {
                    (Step::Manifest, 404) => f.write_str(
                        "; the registry has no such tag or digest: check the reference, or publish the release with `fleetctl artifact push`",
                    ),
                    (Step::Blob, 404) => f.write_str(
                        "; the registry has the manifest but not its blob: publish the release again",
                    ),
                    (_, 429 | 500..=599) => f.write_str("; the registry is unavailable: retry later with a new attempt"),
                    _ => Ok(()),
                }
            }
            Self::Redirect {
                step,
                url,
                status,
                location,
            } => write!(
                f,
                "{step} ({}): the server redirects (HTTP {status}, Location: {}); manifest and token requests do not follow redirects: use the registry's own address",
                shown(url),
                shown(location)
            ),
            Self::Challenge { url, why } => write!(
                f,
                "{} asks for authentication: {why}; only registries that allow anonymous pulls are supported",
                shown(url)
            ),
            Self::TokenResponse { url, why } => write!(
                f,
                "getting an anonymous token ({}): {why}",
                shown(url)
            ),
            Self::Unauthorized { step, url, status } => write!(
                f,
                "{step} ({}): HTTP {status} even with an anonymous token: the repository does not allow anonymous pulls; make it public to the devices",
                shown(url)
            ),
            Self::BodyTooLarge { step, url, limit } => write!(
                f,
                "{step} ({}): the answer is larger than the limit of {limit} bytes; nothing more was read",
                shown(url)
            ),
            Self::Body {
                step,
                url,
                received,
                message,
            } => write!(
                f,
                "{step} ({}): reading the answer failed after {received} bytes: {message}",
                shown(url)
            ),
            Self::ContentType { url, found } => write!(
                f,
                "the manifest ({}) has Content-Type {}, not {OCI_MANIFEST_MEDIA_TYPE}: the reference does not name a fleet agent release (an image index or a Docker manifest?); publish it with `fleetctl artifact push`",
                shown(url),
                shown(found)
            ),
            Self::ManifestDigest { got } => write!(
                f,
                "the registry served a manifest with digest sha256:{got}, not the one the reference names; nothing was downloaded"
            ),
            Self::Manifest { digest, error } => {
                write!(f, "manifest sha256:{digest} refused: {error}")
            }
            Self::LayerDigest { layer, attempt } => write!(
                f,
                "the release's binary has sha256 {layer}, not the attempt's {attempt}: the reference names another build; nothing was downloaded"
            ),
            Self::LayerTooLarge { size, limit } => write!(
                f,
                "the release's binary is {size} bytes, more than the limit of {limit}; nothing was downloaded"
            ),
            Self::BlobLength {
                url,
                length,
                declared,
            } => write!(
                f,
                "downloading the blob ({}): the server declares {length} bytes, the manifest's layer {declared}; nothing was read",
                shown(url)
            ),
            Self::BlobTooLong { url, declared } => write!(
                f,
                "downloading the blob ({}): it is longer than the {declared} bytes the manifest declares; download stopped",
                shown(url)
            ),
            Self::BlobShort { url, got, declared } => write!(
                f,
                "downloading the blob ({}): it has {got} bytes, the manifest declares {declared}",
                shown(url)
            ),
            Self::RedirectInsecure { url, location } => write!(
                f,
                "downloading the blob ({}): redirected to {}, which is not https://; refused",
                shown(url),
                shown(location)
            ),
            Self::RedirectLocation { url, location, why } => write!(
                f,
                "downloading the blob ({}): redirected to {}: {why}",
                shown(url),
                shown(location)
            ),
            Self::TooManyRedirects { url } => write!(
                f,
                "downloading the blob: more than {MAX_BLOB_REDIRECTS} redirects (the last to {}); refused",
                shown(url)
            ),
            Self::Deadline { step, bound } => write!(
                f,
                "{step}: the pull did not finish within its bound of {} s",
                bound.as_secs()
            ),
            Self::Write(e) => write!(f, "saving the download: {e}"),
        }
    }
}

impl std::error::Error for OciError {}

impl OciError {
    /// The public reason of an attempt that failed here.
    pub fn reason(&self) -> UpgradeReason {
        match self {
            Self::BodyTooLarge {
                step: Step::Manifest,
                ..
            }
            | Self::ContentType { .. }
            | Self::ManifestDigest { .. }
            | Self::Manifest { .. } => UpgradeReason::Artifact,
            Self::LayerDigest { .. }
            | Self::BlobLength { .. }
            | Self::BlobTooLong { .. }
            | Self::BlobShort { .. } => UpgradeReason::Checksum,
            Self::LayerTooLarge { .. } => UpgradeReason::TooLarge,
            Self::Write(_) => UpgradeReason::Install,
            _ => UpgradeReason::Download,
        }
    }
}

/// A URL or registry text in a message: at most [`SHOWN_CHARS`] characters.
pub(super) fn shown(v: &str) -> String {
    let mut out: String = v.chars().take(SHOWN_CHARS).collect();
    if v.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    out
}
