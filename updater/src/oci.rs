//! Pulling an agent release from an OCI registry (docs/design/upgrade.md "Artifacts"),
//! anonymously, over the updater's HTTPS client.
//!
//! Steps, all within one deadline (the attempt's whole-download bound):
//!
//! 1. `GET /v2/<repo>/manifests/<tag|digest>` with the OCI manifest
//!    `Accept`, redirects refused. A 401 with a `Bearer` challenge is
//!    answered once: an anonymous `GET <realm>?service=..&scope=..`
//!    (redirects refused, at most [`MAX_TOKEN_RESPONSE_BYTES`]), then the
//!    request again with `Authorization: Bearer <token>`.
//! 2. The manifest: `Content-Type` the OCI image manifest, at most
//!    [`MAX_MANIFEST_BYTES`], its SHA-256 equal to the reference's digest
//!    for a by-digest reference, a fleet agent artifact
//!    ([`AgentArtifact::from_manifest`]), its layer's digest the attempt's
//!    sha256, its layer's size within the attempt's limit.
//! 3. `GET /v2/<repo>/blobs/sha256:<layer>`, following at most
//!    [`MAX_BLOB_REDIRECTS`] redirects, each checked here (ureq follows
//!    none): https only, and the token is sent only to the registry's own
//!    origin, so a CDN never sees it. The body is streamed through
//!    [`stream_verified`] into the caller's temp file, bounded by the
//!    layer's declared size.

use std::fmt;
use std::io::{self, Read};
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    registry_error_summary, AgentArtifact, ManifestError, UpgradeReason, MAX_REGISTRY_ERROR_BYTES,
    OCI_MANIFEST_MEDIA_TYPE,
};
use fleet_common::durable::{AtomicFile, DurableError};
use fleet_common::https;
use fleet_common::limits::{MAX_BLOB_REDIRECTS, MAX_MANIFEST_BYTES, MAX_TOKEN_RESPONSE_BYTES};
use fleet_common::validate::{OciReference, OciTarget, Sha256Hex};
use serde::Deserialize;

use crate::fetch::{describe_io, stream_verified, Fetched, StreamError, TRANSPORT_HINTS};

/// Longest redirect `Location` or token realm followed: presigned CDN URLs
/// run past a kilobyte, none is near this.
const MAX_URL_CHARS: usize = 8 * 1024;
/// Characters of a URL or registry message shown in an error.
const SHOWN_CHARS: usize = 160;

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

/// One pull: the reference, its deadline, and the token once there is one.
pub struct Pull<'a> {
    agent: &'a ureq::Agent,
    reference: &'a OciReference,
    origin: Origin,
    deadline: Instant,
    bound: Duration,
    token: Option<String>,
}

impl fmt::Debug for Pull<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token stays out of logs.
        f.debug_struct("Pull")
            .field("reference", &self.reference.to_string())
            .field("has_token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> Pull<'a> {
    /// A pull of `reference` that must finish within `bound`.
    pub fn new(agent: &'a ureq::Agent, reference: &'a OciReference, bound: Duration) -> Self {
        Self {
            agent,
            reference,
            origin: Origin::of(reference.host(), reference.port()),
            deadline: Instant::now() + bound,
            bound,
            token: None,
        }
    }

    /// Pulls the release into `out`: the manifest checked against the
    /// attempt (`sha256`, at most `limit` bytes), then the blob streamed.
    pub fn run(
        mut self,
        sha256: &Sha256Hex,
        limit: u64,
        out: &mut AtomicFile,
    ) -> Result<Fetched, OciError> {
        let manifest = self.manifest()?;
        let digest = Sha256Hex::of(&manifest);
        if let OciTarget::Digest(wanted) = self.reference.target() {
            if &digest != wanted {
                return Err(OciError::ManifestDigest { got: digest });
            }
        }
        let artifact =
            AgentArtifact::from_manifest(&manifest).map_err(|error| OciError::Manifest {
                digest: digest.clone(),
                error,
            })?;
        if &artifact.sha256 != sha256 {
            return Err(OciError::LayerDigest {
                layer: artifact.sha256,
                attempt: sha256.clone(),
            });
        }
        if artifact.size > limit {
            return Err(OciError::LayerTooLarge {
                size: artifact.size,
                limit,
            });
        }
        log::info!(
            "{}: manifest sha256:{digest}, binary sha256:{} ({} bytes)",
            self.reference,
            artifact.sha256,
            artifact.size
        );
        self.blob(&artifact, out)
    }

    fn base(&self) -> String {
        format!(
            "https://{}/v2/{}",
            self.reference.registry(),
            self.reference.repository()
        )
    }

    fn manifest(&mut self) -> Result<Vec<u8>, OciError> {
        let url = format!(
            "{}/manifests/{}",
            self.base(),
            self.reference.manifest_reference()
        );
        let response = self.registry_get(Step::Manifest, &url, Some(OCI_MANIFEST_MEDIA_TYPE))?;
        let status = response.status();
        if status != 200 {
            return Err(redirect_or_status(Step::Manifest, &url, response));
        }
        let content_type = response.header("content-type").unwrap_or("(none)");
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if !essence.eq_ignore_ascii_case(OCI_MANIFEST_MEDIA_TYPE) {
            return Err(OciError::ContentType {
                url,
                found: content_type.to_owned(),
            });
        }
        read_body(Step::Manifest, &url, response, MAX_MANIFEST_BYTES)
    }

    fn blob(
        &mut self,
        artifact: &AgentArtifact,
        out: &mut AtomicFile,
    ) -> Result<Fetched, OciError> {
        let first = format!("{}/blobs/sha256:{}", self.base(), artifact.sha256);
        // INVARIANT: built from a validated reference, so it parses; the
        // error is for completeness.
        let mut url = Hop::parse(&first).map_err(|_| OciError::Transport {
            step: Step::Blob,
            url: first.clone(),
            message: "not a valid https URL".to_owned(),
        })?;
        let mut redirects = 0;
        let response = loop {
            // The token goes to the registry's own origin only: a CDN that
            // serves the blob never sees it.
            let response = if url.origin == self.origin {
                self.registry_get(Step::Blob, &url.url, None)?
            } else {
                self.get(Step::Blob, &url.url, None, None)?
            };
            let status = response.status();
            if status == 200 {
                break response;
            }
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Err(redirect_or_status(Step::Blob, &url.url, response));
            }
            let location = response.header("location").unwrap_or_default().to_owned();
            redirects += 1;
            if redirects > MAX_BLOB_REDIRECTS {
                return Err(OciError::TooManyRedirects { url: location });
            }
            let next = url.resolve(&location).map_err(|why| match why {
                LocationError::NotHttps => OciError::RedirectInsecure {
                    url: url.url.clone(),
                    location: location.clone(),
                },
                LocationError::Invalid(why) => OciError::RedirectLocation {
                    url: url.url.clone(),
                    location: location.clone(),
                    why,
                },
            })?;
            log::info!(
                "{}: blob redirected (HTTP {status}) to {}{}",
                self.reference,
                shown(&next.url),
                if next.origin == self.origin {
                    ""
                } else {
                    ", another host: without the token"
                }
            );
            url = next;
        };
        let shown_url = url.url;
        let declared = declared_length(&response);
        if let Some(d) = declared.filter(|d| *d > artifact.size) {
            return Err(OciError::BlobLength {
                url: shown_url,
                length: d,
                declared: artifact.size,
            });
        }
        let fetched =
            stream_verified(response.into_reader(), artifact.size, out).map_err(|e| match e {
                StreamError::TooLarge => OciError::BlobTooLong {
                    url: shown_url.clone(),
                    declared: artifact.size,
                },
                StreamError::Read { received, source } => OciError::Body {
                    step: Step::Blob,
                    url: shown_url.clone(),
                    received,
                    message: body_message(&source, declared.is_some()),
                },
                StreamError::Write(e) => OciError::Write(e),
            })?;
        if fetched.bytes != artifact.size {
            return Err(OciError::BlobShort {
                url: shown_url,
                got: fetched.bytes,
                declared: artifact.size,
            });
        }
        Ok(fetched)
    }

    /// A GET to the registry: with the token when there is one; on a 401
    /// without one, the challenge is answered and the request sent again.
    fn registry_get(
        &mut self,
        step: Step,
        url: &str,
        accept: Option<&str>,
    ) -> Result<ureq::Response, OciError> {
        let token = self.token.clone();
        let first = self.get(step.clone(), url, accept, token.as_deref())?;
        let unauthorized = |status| OciError::Unauthorized {
            step: step.clone(),
            url: url.to_owned(),
            status,
        };
        match (first.status(), token) {
            (401, None) => {
                let challenge = challenge_of(url, &first)?;
                let token = self.fetch_token(&challenge)?;
                let retried = self.get(step.clone(), url, accept, Some(&token))?;
                self.token = Some(token);
                match retried.status() {
                    s @ (401 | 403) => Err(unauthorized(s)),
                    _ => Ok(retried),
                }
            }
            (s @ (401 | 403), Some(_)) => Err(unauthorized(s)),
            _ => Ok(first),
        }
    }

    /// One GET within the deadline. Every status comes back as a response
    /// (errors included, so a 401's challenge can be read); only transport
    /// failures are errors.
    fn get(
        &self,
        step: Step,
        url: &str,
        accept: Option<&str>,
        token: Option<&str>,
    ) -> Result<ureq::Response, OciError> {
        let remaining = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(OciError::Deadline {
                step: step.clone(),
                bound: self.bound,
            })?;
        let mut request = self.agent.get(url).timeout(remaining);
        if let Some(a) = accept {
            request = request.set("Accept", a);
        }
        if let Some(t) = token {
            request = request.set("Authorization", &format!("Bearer {t}"));
        }
        match request.call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => Ok(r),
            Err(ureq::Error::Transport(t)) => Err(OciError::Transport {
                step,
                url: url.to_owned(),
                message: https::transport_message(&t, TRANSPORT_HINTS),
            }),
        }
    }

    /// The anonymous token for `challenge`.
    fn fetch_token(&self, challenge: &Challenge) -> Result<String, OciError> {
        let realm = Hop::parse(&challenge.realm).map_err(|why| OciError::Challenge {
            url: self.base(),
            why: match why {
                LocationError::NotHttps => {
                    format!(
                        "its token realm {} is not https://",
                        shown(&challenge.realm)
                    )
                }
                LocationError::Invalid(why) => {
                    format!("its token realm {}: {why}", shown(&challenge.realm))
                }
            },
        })?;
        let scope = challenge
            .scope
            .clone()
            .unwrap_or_else(|| format!("repository:{}:pull", self.reference.repository()));
        let mut url = realm.url;
        url.push(if url.contains('?') { '&' } else { '?' });
        if let Some(service) = &challenge.service {
            url.push_str("service=");
            url.push_str(&percent_encode(service));
            url.push('&');
        }
        url.push_str("scope=");
        url.push_str(&percent_encode(&scope));
        let response = self.get(Step::Token, &url, Some("application/json"), None)?;
        if response.status() != 200 {
            return Err(redirect_or_status(Step::Token, &url, response));
        }
        let body = read_body(Step::Token, &url, response, MAX_TOKEN_RESPONSE_BYTES)?;
        #[derive(Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let bad = |why: String| OciError::TokenResponse {
            url: url.clone(),
            why,
        };
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| bad(format!("the answer is not token JSON: {e}")))?;
        let token = answer
            .token
            .filter(|t| !t.is_empty())
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| bad("the answer has neither token nor access_token".to_owned()))?;
        // It goes into a header: visible ASCII only.
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad(
                "the token has characters that cannot be sent in a header".to_owned(),
            ));
        }
        Ok(token)
    }
}

/// The error for a response that is neither 200 nor followed.
fn redirect_or_status(step: Step, url: &str, response: ureq::Response) -> OciError {
    let status = response.status();
    if (300..400).contains(&status) {
        return OciError::Redirect {
            step,
            url: url.to_owned(),
            status,
            location: response.header("location").unwrap_or("(none)").to_owned(),
        };
    }
    OciError::Status {
        step,
        url: url.to_owned(),
        status,
        registry: registry_error(response),
    }
}

/// The first error of a registry's error JSON, `CODE: message`.
fn registry_error(response: ureq::Response) -> Option<String> {
    let body = https::read_body(response, MAX_REGISTRY_ERROR_BYTES).ok()?;
    registry_error_summary(&body)
}

/// `Content-Length`, unless a `Transfer-Encoding` overrides it (RFC 9112 6.3).
fn declared_length(response: &ureq::Response) -> Option<u64> {
    response
        .header("content-length")
        .filter(|_| response.header("transfer-encoding").is_none())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A body of at most `limit` bytes, refused unread when it declares more.
fn read_body(
    step: Step,
    url: &str,
    response: ureq::Response,
    limit: u64,
) -> Result<Vec<u8>, OciError> {
    let too_large = || OciError::BodyTooLarge {
        step: step.clone(),
        url: url.to_owned(),
        limit,
    };
    let declared = declared_length(&response);
    if declared.is_some_and(|d| d > limit) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    if let Err(e) = response
        .into_reader()
        .take(limit + 1)
        .read_to_end(&mut body)
    {
        return Err(OciError::Body {
            step,
            url: url.to_owned(),
            received: body.len() as u64,
            message: body_message(&e, declared.is_some()),
        });
    }
    if body.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(body)
}

fn body_message(e: &io::Error, declared: bool) -> String {
    if e.kind() == io::ErrorKind::UnexpectedEof && declared {
        format!("the body ended before its declared length ({e})")
    } else {
        describe_io(e)
    }
}

/// A `Bearer` challenge (RFC 6750), as registries send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    realm: String,
    service: Option<String>,
    scope: Option<String>,
}

fn challenge_of(url: &str, response: &ureq::Response) -> Result<Challenge, OciError> {
    let headers = response.all("www-authenticate");
    let refuse = |why: String| OciError::Challenge {
        url: url.to_owned(),
        why,
    };
    if headers.is_empty() {
        return Err(refuse(
            "HTTP 401 without a WWW-Authenticate header".to_owned(),
        ));
    }
    let mut schemes = Vec::new();
    for h in &headers {
        match parse_bearer(h) {
            Ok(c) => return Ok(c),
            Err(ChallengeError::Scheme(s)) => schemes.push(s),
            Err(ChallengeError::Malformed(why)) => {
                return Err(refuse(format!("its Bearer challenge {}: {why}", shown(h))))
            }
        }
    }
    Err(refuse(format!(
        "it offers {} authentication, not an anonymous Bearer token",
        schemes.join(", ")
    )))
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ChallengeError {
    /// Another scheme (Basic, ...): its name.
    Scheme(String),
    Malformed(&'static str),
}

/// Parses `Bearer realm="..",service="..",scope=".."` (parameters as
/// tokens or quoted strings, in any order, unknown ones ignored).
pub(crate) fn parse_bearer(header: &str) -> Result<Challenge, ChallengeError> {
    let header = header.trim();
    let (scheme, mut rest) = header.split_once([' ', '\t']).unwrap_or((header, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ChallengeError::Scheme(
            scheme.chars().take(SHOWN_CHARS).collect(),
        ));
    }
    let (mut realm, mut service, mut scope) = (None, None, None);
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            break;
        }
        let eq = rest
            .find('=')
            .ok_or(ChallengeError::Malformed("a parameter without '='"))?;
        let name = rest[..eq].trim().to_ascii_lowercase();
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, escaped)) => v.push(escaped),
                        None => break,
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => v.push(c),
                }
            }
            let end = end.ok_or(ChallengeError::Malformed("an unterminated quoted string"))?;
            value = v;
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find([',', ' ', '\t']).unwrap_or(rest.len());
            value = rest[..end].to_owned();
            rest = &rest[end..];
        }
        match name.as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            "scope" => scope = Some(value),
            _ => {}
        }
    }
    let realm = realm.ok_or(ChallengeError::Malformed("no realm"))?;
    Ok(Challenge {
        realm,
        service,
        scope,
    })
}

/// RFC 3986 percent-encoding of everything but the unreserved characters.
fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `host:port` of an https URL, lowercase, port 443 made explicit: two
/// URLs are one origin when these are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin(String);

impl Origin {
    fn of(host: &str, port: Option<u16>) -> Self {
        Self(format!(
            "{}:{}",
            host.to_ascii_lowercase(),
            port.unwrap_or(443)
        ))
    }
}

/// Why a redirect target or realm cannot be followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LocationError {
    NotHttps,
    Invalid(&'static str),
}

/// An absolute https URL to request, and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hop {
    url: String,
    origin: Origin,
    /// Index in `url` where the path starts (after the authority).
    path_at: usize,
}

impl Hop {
    /// An absolute URL: `https://` (scheme case-insensitive), a host with
    /// an optional port, no credentials; the fragment is dropped.
    fn parse(v: &str) -> Result<Self, LocationError> {
        if v.len() > MAX_URL_CHARS {
            return Err(LocationError::Invalid("longer than 8 KiB"));
        }
        if !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LocationError::Invalid(
                "contains whitespace, control or non-ASCII characters",
            ));
        }
        let v = v.split('#').next().unwrap_or_default();
        let Some((scheme, rest)) = v.split_once("://") else {
            return Err(LocationError::Invalid("not an absolute URL"));
        };
        if !scheme.eq_ignore_ascii_case("https") {
            return Err(LocationError::NotHttps);
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.contains('@') {
            return Err(LocationError::Invalid(
                "credentials in the URL are not allowed",
            ));
        }
        let port_of = |p: &str| {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or(LocationError::Invalid("invalid port"))
        };
        let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
            let close = inner
                .find(']')
                .ok_or(LocationError::Invalid("invalid host"))?;
            let after = &inner[close + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(port_of(p)?),
                None if after.is_empty() => None,
                None => return Err(LocationError::Invalid("invalid host")),
            };
            let address = &inner[..close];
            if address.is_empty()
                || !address
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            {
                return Err(LocationError::Invalid("invalid host"));
            }
            (&authority[..close + 2], port)
        } else {
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(port_of(p)?)),
                None => (authority, None),
            };
            if !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                return Err(LocationError::Invalid("invalid host"));
            }
            (host, port)
        };
        if host.is_empty() {
            return Err(LocationError::Invalid("no host"));
        }
        let mut url = format!("https://{}", &rest[..end]);
        let path_at = url.len();
        match &rest[end..] {
            "" => url.push('/'),
            p if p.starts_with('?') => {
                url.push('/');
                url.push_str(p);
            }
            p => url.push_str(p),
        }
        Ok(Self {
            url,
            origin: Origin::of(host, port),
            path_at,
        })
    }

    /// `location` (absolute, scheme-relative, absolute-path or relative)
    /// resolved against this URL.
    fn resolve(&self, location: &str) -> Result<Self, LocationError> {
        if location.is_empty() {
            return Err(LocationError::Invalid("the redirect has no Location"));
        }
        let scheme_end = location.find(':');
        let first_delimiter = location.find(['/', '?', '#']);
        let has_scheme = match (scheme_end, first_delimiter) {
            (Some(c), Some(d)) => c < d,
            (Some(_), None) => true,
            _ => false,
        };
        if has_scheme {
            return Self::parse(location);
        }
        let authority_end = self.path_at;
        let target = if location.starts_with("//") {
            format!("https:{location}")
        } else if location.starts_with('/') {
            format!("{}{location}", &self.url[..authority_end])
        } else {
            let path = self.url[authority_end..].split('?').next().unwrap_or("/");
            if location.starts_with('?') {
                format!("{}{path}{location}", &self.url[..authority_end])
            } else {
                let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
                format!("{}{dir}{location}", &self.url[..authority_end])
            }
        };
        Self::parse(&target)
    }
}

/// A URL or registry text in a message: at most [`SHOWN_CHARS`] characters.
fn shown(v: &str) -> String {
    let mut out: String = v.chars().take(SHOWN_CHARS).collect();
    if v.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_parse() {
        assert_eq!(
            parse_bearer(
                r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:fleet/agent:pull""#
            ),
            Ok(Challenge {
                realm: "https://auth.example.com/token".into(),
                service: Some("registry.example.com".into()),
                scope: Some("repository:fleet/agent:pull".into()),
            })
        );
        // Any order, spaces, unquoted values, escapes, commas inside quotes,
        // unknown parameters, a lowercase scheme.
        assert_eq!(
            parse_bearer(
                r#"bearer  scope="repository:a:pull,push" , error="insufficient_scope", realm=https://r/t,service="s\"x""#
            ),
            Ok(Challenge {
                realm: "https://r/t".into(),
                service: Some("s\"x".into()),
                scope: Some("repository:a:pull,push".into()),
            })
        );
        assert_eq!(
            parse_bearer(r#"Basic realm="registry""#),
            Err(ChallengeError::Scheme("Basic".into()))
        );
        assert_eq!(
            parse_bearer(r#"Bearer service="x""#),
            Err(ChallengeError::Malformed("no realm"))
        );
        assert_eq!(
            parse_bearer(r#"Bearer realm="https://x"#),
            Err(ChallengeError::Malformed("an unterminated quoted string"))
        );
        assert_eq!(
            parse_bearer(r#"Bearer realm"#),
            Err(ChallengeError::Malformed("a parameter without '='"))
        );
    }

    #[test]
    fn hops_resolve_and_keep_their_origin() {
        let base = Hop::parse("https://Reg.Example.com/v2/a/blobs/sha256:x?y=1#frag").expect("ok");
        assert_eq!(base.url, "https://Reg.Example.com/v2/a/blobs/sha256:x?y=1");
        assert_eq!(base.origin, Origin("reg.example.com:443".into()));
        let cases = [
            (
                "https://cdn.example.com:8443/b?sig=1",
                "https://cdn.example.com:8443/b?sig=1",
                "cdn.example.com:8443",
            ),
            (
                "HTTPS://cdn.example.com",
                "https://cdn.example.com/",
                "cdn.example.com:443",
            ),
            (
                "//cdn.example.com/b",
                "https://cdn.example.com/b",
                "cdn.example.com:443",
            ),
            (
                "/other/path",
                "https://Reg.Example.com/other/path",
                "reg.example.com:443",
            ),
            (
                "c?z",
                "https://Reg.Example.com/v2/a/blobs/c?z",
                "reg.example.com:443",
            ),
            (
                "?z",
                "https://Reg.Example.com/v2/a/blobs/sha256:x?z",
                "reg.example.com:443",
            ),
            ("https://[::1]:5000/b", "https://[::1]:5000/b", "[::1]:5000"),
            ("https://[::1]/b", "https://[::1]/b", "[::1]:443"),
            (
                "https://reg.example.com:443/b",
                "https://reg.example.com:443/b",
                "reg.example.com:443",
            ),
        ];
        for (location, url, origin) in cases {
            let hop = base
                .resolve(location)
                .unwrap_or_else(|e| panic!("{location}: {e:?}"));
            assert_eq!(
                (hop.url.as_str(), hop.origin.0.as_str()),
                (url, origin),
                "{location}"
            );
        }
        assert_eq!(base.resolve("http://cdn/b"), Err(LocationError::NotHttps));
        assert_eq!(base.resolve("ftp://cdn/b"), Err(LocationError::NotHttps));
        assert_eq!(base.resolve("HTTP://cdn/b"), Err(LocationError::NotHttps));
        assert_eq!(
            base.resolve("https://user:pw@cdn/b"),
            Err(LocationError::Invalid(
                "credentials in the URL are not allowed"
            ))
        );
        assert_eq!(
            base.resolve("https://cdn:0/b"),
            Err(LocationError::Invalid("invalid port"))
        );
        assert_eq!(
            base.resolve("https://cdn:x/b"),
            Err(LocationError::Invalid("invalid port"))
        );
        assert_eq!(
            base.resolve("https:///b"),
            Err(LocationError::Invalid("no host"))
        );
        assert_eq!(
            base.resolve("https://cdn/a b"),
            Err(LocationError::Invalid(
                "contains whitespace, control or non-ASCII characters"
            ))
        );
        assert_eq!(
            base.resolve(""),
            Err(LocationError::Invalid("the redirect has no Location"))
        );
        assert!(base
            .resolve(&format!("https://cdn/{}", "a".repeat(9000)))
            .is_err());
    }

    #[test]
    fn percent_encoding_of_token_parameters() {
        assert_eq!(
            percent_encode("repository:fleet/agent:pull"),
            "repository%3Afleet%2Fagent%3Apull"
        );
        assert_eq!(percent_encode("a-b.c_d~e"), "a-b.c_d~e");
    }

    #[test]
    fn reasons() {
        let d = Sha256Hex::of(b"x");
        assert_eq!(
            OciError::LayerDigest {
                layer: d.clone(),
                attempt: d.clone()
            }
            .reason(),
            UpgradeReason::Checksum
        );
        assert_eq!(
            OciError::LayerTooLarge { size: 2, limit: 1 }.reason(),
            UpgradeReason::TooLarge
        );
        assert_eq!(
            OciError::BodyTooLarge {
                step: Step::Manifest,
                url: String::new(),
                limit: 1
            }
            .reason(),
            UpgradeReason::Artifact
        );
        assert_eq!(
            OciError::BodyTooLarge {
                step: Step::Token,
                url: String::new(),
                limit: 1
            }
            .reason(),
            UpgradeReason::Download
        );
        assert_eq!(
            OciError::TooManyRedirects { url: String::new() }.reason(),
            UpgradeReason::Download
        );
    }
}
