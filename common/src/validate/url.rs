//! Artifact locations: [`ArtifactUrl`], an [`HttpsUrl`] or an
//! [`OciReference`], with their host and path rules.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::MAX_TEXT_CHARS;

use super::error::ValidationError;
use super::ids::Sha256Hex;

/// Where an agent artifact comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ArtifactUrl {
    Https(HttpsUrl),
    Oci(OciReference),
}

impl ArtifactUrl {
    pub const MAX_CHARS: usize = MAX_TEXT_CHARS;

    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let refuse = |why| ValidationError::ArtifactUrl {
            url: v.to_owned(),
            why,
        };
        if v.len() > Self::MAX_CHARS {
            return Err(refuse("longer than 1024 characters"));
        }
        if !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refuse(
                "contains whitespace, control or non-ASCII characters",
            ));
        }
        if let Some(rest) = v.strip_prefix("https://") {
            HttpsUrl::parse_rest(rest).map(Self::Https).map_err(refuse)
        } else if let Some(rest) = v.strip_prefix("oci://") {
            OciReference::parse_rest(rest)
                .map(Self::Oci)
                .map_err(refuse)
        } else {
            Err(refuse("the scheme is neither https:// nor oci://"))
        }
    }
}

impl fmt::Display for ArtifactUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Https(u) => u.fmt(f),
            Self::Oci(r) => r.fmt(f),
        }
    }
}

impl TryFrom<String> for ArtifactUrl {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<ArtifactUrl> for String {
    fn from(v: ArtifactUrl) -> String {
        v.to_string()
    }
}

impl std::str::FromStr for ArtifactUrl {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// An `https://` URL with a host, optional port and a path; no credentials,
/// no fragment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpsUrl {
    authority: Authority,
    /// Path and query, starting with `/`.
    path_and_query: String,
}

impl HttpsUrl {
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        match ArtifactUrl::parse(v)? {
            ArtifactUrl::Https(u) => Ok(u),
            ArtifactUrl::Oci(_) => Err(ValidationError::ArtifactUrl {
                url: v.to_owned(),
                why: "an https:// URL is required here",
            }),
        }
    }

    fn parse_rest(rest: &str) -> Result<Self, &'static str> {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err("the URL has no path"),
        };
        if path.contains('#') {
            return Err("the URL has a fragment");
        }
        Ok(Self {
            authority: Authority::parse(authority)?,
            path_and_query: path.to_owned(),
        })
    }

    pub fn host(&self) -> &str {
        &self.authority.host
    }
    pub fn port(&self) -> Option<u16> {
        self.authority.port
    }
    pub fn path_and_query(&self) -> &str {
        &self.path_and_query
    }
}

impl fmt::Display for HttpsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "https://{}{}", self.authority, self.path_and_query)
    }
}

/// `host[:port]` of a URL or registry: a DNS name, an IPv4 address or a
/// bracketed IPv6 address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Authority {
    host: String,
    port: Option<u16>,
}

impl Authority {
    fn parse(v: &str) -> Result<Self, &'static str> {
        if v.contains('@') {
            return Err("credentials in the URL are not allowed");
        }
        let (host, port) = if let Some(rest) = v.strip_prefix('[') {
            let end = rest.find(']').ok_or("unterminated IPv6 address")?;
            let host = &rest[..end];
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("invalid IPv6 address");
            }
            let after = &rest[end + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err("invalid text after the IPv6 address"),
            };
            (format!("[{host}]"), port)
        } else {
            let (host, port) = match v.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (v, None),
            };
            if !valid_hostname(host) {
                return Err("invalid host name");
            }
            (host.to_ascii_lowercase(), port)
        };
        let port = match port {
            None => None,
            Some(p) => {
                if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("invalid port");
                }
                match p.parse::<u16>() {
                    Ok(0) | Err(_) => return Err("invalid port"),
                    Ok(n) => Some(n),
                }
            }
        };
        Ok(Self { host, port })
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// DNS labels of letters, digits and inner hyphens (IPv4 literals pass as such).
fn valid_hostname(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// `oci://host[:port]/repository:tag` or `oci://host[:port]/repository@sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciReference {
    registry: Authority,
    repository: String,
    target: OciTarget,
}

/// What an OCI reference points at: a mutable tag or an immutable manifest digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OciTarget {
    Tag(String),
    Digest(Sha256Hex),
}

impl OciReference {
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        match ArtifactUrl::parse(v)? {
            ArtifactUrl::Oci(r) => Ok(r),
            ArtifactUrl::Https(_) => Err(ValidationError::ArtifactUrl {
                url: v.to_owned(),
                why: "an oci:// reference is required here",
            }),
        }
    }

    fn parse_rest(rest: &str) -> Result<Self, &'static str> {
        let (authority, rest) = rest
            .split_once('/')
            .ok_or("the reference has no repository")?;
        let registry = Authority::parse(authority)?;
        let (repository, target) = if let Some((repo, digest)) = rest.split_once('@') {
            let hex = digest
                .strip_prefix("sha256:")
                .ok_or("only sha256 manifest digests are supported")?;
            let hex = Sha256Hex::parse(hex).map_err(|_| "the digest is not 64 lowercase hex")?;
            (repo, OciTarget::Digest(hex))
        } else {
            // The tag separator is the last ':' after the last '/'.
            let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
            match rest[last_slash..].rfind(':') {
                Some(i) => {
                    let (repo, tag) = (&rest[..last_slash + i], &rest[last_slash + i + 1..]);
                    if !valid_tag(tag) {
                        return Err("invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'");
                    }
                    (repo, OciTarget::Tag(tag.to_owned()))
                }
                None => return Err("the reference has neither a :tag nor an @sha256: digest"),
            }
        };
        if !valid_repository(repository) {
            return Err("invalid repository: use lowercase path components separated by '/'");
        }
        Ok(Self {
            registry,
            repository: repository.to_owned(),
            target,
        })
    }

    /// `host[:port]` of the registry.
    pub fn registry(&self) -> String {
        self.registry.to_string()
    }
    pub fn host(&self) -> &str {
        &self.registry.host
    }
    pub fn port(&self) -> Option<u16> {
        self.registry.port
    }
    pub fn repository(&self) -> &str {
        &self.repository
    }
    pub fn target(&self) -> &OciTarget {
        &self.target
    }
    /// The `<reference>` part of `/v2/<name>/manifests/<reference>`.
    pub fn manifest_reference(&self) -> String {
        match &self.target {
            OciTarget::Tag(t) => t.clone(),
            OciTarget::Digest(d) => format!("sha256:{d}"),
        }
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            OciTarget::Tag(t) => write!(f, "oci://{}/{}:{t}", self.registry, self.repository),
            OciTarget::Digest(d) => {
                write!(f, "oci://{}/{}@sha256:{d}", self.registry, self.repository)
            }
        }
    }
}

/// OCI distribution tag grammar: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
fn valid_tag(t: &str) -> bool {
    match t.as_bytes().first() {
        Some(&b) => {
            (b.is_ascii_alphanumeric() || b == b'_')
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        }
        None => false,
    }
}

/// OCI distribution name grammar: components of `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
/// separated by `/`.
fn valid_repository(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= 255
        && r.split('/').all(|c| {
            let bytes = c.as_bytes();
            let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
                return false;
            }
            let mut i = 0;
            while i < bytes.len() {
                let b = bytes[i];
                if alnum(b) {
                    i += 1;
                    continue;
                }
                // A separator run: '.', '_', '__' or one or more '-'.
                let run_end = bytes[i..]
                    .iter()
                    .position(|&x| alnum(x))
                    .map_or(bytes.len(), |p| i + p);
                let sep = &c[i..run_end];
                let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
                if !ok {
                    return false;
                }
                i = run_end;
            }
            true
        })
}
