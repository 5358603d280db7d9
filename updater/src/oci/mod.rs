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
//!
//! | module | holds |
//! |---|---|
//! | this one | [`Pull`]: the requests in order, the deadline, reading bodies |
//! | `error` | [`OciError`] and the request it happened on ([`Step`]) |
//! | `challenge` | the `Bearer` challenge and the anonymous token request |
//! | `redirect` | checking each blob redirect and its origin |

mod challenge;
mod error;
mod redirect;

use std::fmt;
use std::io::{self, Read};
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    registry_error_summary, AgentArtifact, MAX_REGISTRY_ERROR_BYTES, OCI_MANIFEST_MEDIA_TYPE,
};
use fleet_common::durable::AtomicFile;
use fleet_common::https;
use fleet_common::limits::{MAX_BLOB_REDIRECTS, MAX_MANIFEST_BYTES, MAX_TOKEN_RESPONSE_BYTES};
use fleet_common::validate::{OciReference, OciTarget, Sha256Hex};
use serde::Deserialize;

use crate::stream::{describe_io, stream_verified, Fetched, StreamError, TRANSPORT_HINTS};

use challenge::{challenge_of, percent_encode, Challenge};
#[cfg(test)]
pub(crate) use challenge::{parse_bearer, ChallengeError};
use error::shown;
pub use error::{OciError, Step};
use redirect::{Hop, LocationError, Origin};

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

#[cfg(test)]
mod tests {
    use fleet_common::contracts::UpgradeReason;

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
