//! Validated newtypes for every identifier that crosses a wire or names a file.
//!
//! Each type is built only through `parse` (or serde, which calls `parse`), so a
//! value of the type is proof the rule held. Rules:
//!
//! | type | rule |
//! |---|---|
//! | [`DeviceId`] | `^[A-Za-z0-9_-]{1,64}$` (a safe NATS subject token) |
//! | [`WorkloadName`] | `^[a-z0-9][a-z0-9_-]{0,62}$` |
//! | [`Version`] | `^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`, no `..`: never a path |
//! | [`Arch`] | `x86_64`, `aarch64`, `armv7` |
//! | [`AttemptUuid`] | canonical hyphenated UUID, not nil |
//! | [`Sha256Hex`] | 64 lowercase hex digits |
//! | [`ArtifactUrl`] | `https://host[:port]/path` or `oci://host[:port]/repo(:tag|@sha256:hex)` |
//! | [`BoundedText`] | at most [`MAX_TEXT_CHARS`] characters |
//! | [`MaxBytes`] | 1 ..= [`MAX_ARTIFACT_BYTES`] |

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_ARTIFACT_BYTES, MAX_EXCERPT_CHARS, MAX_TEXT_CHARS};

/// Why a value was refused. Every variant names the field's rule so the
/// message tells the writer what to send instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidationError {
    DeviceId(String),
    WorkloadName(String),
    Version(String),
    Arch(String),
    Uuid(String),
    Sha256(String),
    ArtifactUrl { url: String, why: &'static str },
    TextTooLong { chars: usize },
    MaxBytes(u64),
    Excerpt(String),
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeviceId(v) => write!(
                f,
                "invalid device id {}: use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'",
                shown(v)
            ),
            Self::WorkloadName(v) => write!(
                f,
                "invalid workload name {}: use 1 to 63 characters from a-z, 0-9, '_' and '-', starting with a letter or digit",
                shown(v)
            ),
            Self::Version(v) => write!(
                f,
                "invalid version {}: use 1 to 64 ASCII characters from A-Z, a-z, 0-9, '.', '+', '_' and '-', starting with a letter or digit, without '..'",
                shown(v)
            ),
            Self::Arch(v) => write!(
                f,
                "invalid arch {}: use one of x86_64, aarch64, armv7",
                shown(v)
            ),
            Self::Uuid(v) => write!(
                f,
                "invalid attempt uuid {}: use a canonical hyphenated, non-nil UUID such as 0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10",
                shown(v)
            ),
            Self::Sha256(v) => write!(
                f,
                "invalid sha256 {}: use exactly 64 lowercase hexadecimal digits",
                shown(v)
            ),
            Self::ArtifactUrl { url, why } => write!(
                f,
                "invalid artifact url {}: {why}; use https://host[:port]/path or oci://host[:port]/repository:tag or oci://host[:port]/repository@sha256:<64 hex>",
                shown(url)
            ),
            Self::TextTooLong { chars } => write!(
                f,
                "text of {chars} characters is longer than the limit of {MAX_TEXT_CHARS}: shorten it"
            ),
            Self::MaxBytes(v) => write!(
                f,
                "invalid max-bytes {v}: use 1 to {MAX_ARTIFACT_BYTES} (100 MiB)"
            ),
            Self::Excerpt(v) => write!(
                f,
                "invalid excerpt {}: use at most {} characters from printable ASCII, other characters escaped as \\u{{...}}, optionally ending in '…'",
                shown(v),
                Excerpt::MAX_CHARS
            ),
        }
    }
}

impl std::error::Error for ValidationError {}

/// Quotes a refused value for a message, shortened and with control
/// characters escaped so a hostile value cannot forge log lines.
fn shown(v: &str) -> String {
    const SHOWN_CHARS: usize = 80;
    let mut out: String = v.chars().take(SHOWN_CHARS).collect();
    if v.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    format!("{out:?}")
}

fn all_ascii(v: &str, allowed: impl Fn(u8) -> bool) -> bool {
    v.bytes().all(allowed)
}

/// Implements `FromStr`, `Display`, `AsRef<str>` and string serde for a
/// validated string newtype whose `parse` does the checking.
macro_rules! string_newtype {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl std::str::FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }
        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::parse(&s)
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
    };
}

/// A device identifier, safe as one NATS subject token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DeviceId(String);
string_newtype!(DeviceId);

impl DeviceId {
    pub const MAX_CHARS: usize = 64;
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let ok = !v.is_empty()
            && v.len() <= Self::MAX_CHARS
            && all_ascii(v, |b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(v.to_owned()))
        } else {
            Err(ValidationError::DeviceId(v.to_owned()))
        }
    }
}

/// A workload name: also the container name suffix and a KV key token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WorkloadName(String);
string_newtype!(WorkloadName);

impl WorkloadName {
    pub const MAX_CHARS: usize = 63;
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let lower_digit = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let ok = match v.as_bytes().first() {
            Some(&first) => {
                lower_digit(first)
                    && v.len() <= Self::MAX_CHARS
                    && all_ascii(v, |b| lower_digit(b) || b == b'_' || b == b'-')
            }
            None => false,
        };
        if ok {
            Ok(Self(v.to_owned()))
        } else {
            Err(ValidationError::WorkloadName(v.to_owned()))
        }
    }
}

/// An agent version. It becomes part of a file name
/// (`fleet-agent-v<version>`), so it can never express a path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Version(String);
string_newtype!(Version);

impl Version {
    pub const MAX_CHARS: usize = 64;
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let ok = match v.as_bytes().first() {
            Some(first) => {
                first.is_ascii_alphanumeric()
                    && v.len() <= Self::MAX_CHARS
                    && all_ascii(v, |b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'_' | b'-')
                    })
                    && !v.contains("..")
            }
            None => false,
        };
        if ok {
            Ok(Self(v.to_owned()))
        } else {
            Err(ValidationError::Version(v.to_owned()))
        }
    }

    /// The leading `MAJOR.MINOR.PATCH` numbers, if the version starts with
    /// them (`0.3.0`, `0.3.0-upgrade-test`, `1.4.0+build.1`).
    pub fn release(&self) -> Option<(u64, u64, u64)> {
        let end = self.0.find(['-', '+']).unwrap_or(self.0.len());
        let mut it = self.0[..end].split('.').map(|n| n.parse::<u64>().ok());
        match (it.next(), it.next(), it.next(), it.next()) {
            (Some(Some(a)), Some(Some(b)), Some(Some(c)), None) => Some((a, b, c)),
            _ => None,
        }
    }

    /// Whether this version's release is `min` (`MAJOR.MINOR.PATCH`) or
    /// later. A pre-release or build of a version counts as that version:
    /// our test and bench agents are pre-releases built from the same
    /// source. A version that does not start with three numbers is not.
    pub fn is_at_least(&self, min: &str) -> bool {
        let min = Version(min.to_owned()).release();
        match (self.release(), min) {
            (Some(v), Some(m)) => v >= m,
            _ => false,
        }
    }
}

/// CPU architectures the fleet runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Arch {
    X86_64,
    Aarch64,
    Armv7,
}

impl Arch {
    /// Every architecture the fleet ships.
    pub const ALL: [Arch; 3] = [Self::X86_64, Self::Aarch64, Self::Armv7];

    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        match v {
            "x86_64" => Ok(Self::X86_64),
            "aarch64" => Ok(Self::Aarch64),
            "armv7" => Ok(Self::Armv7),
            _ => Err(ValidationError::Arch(v.to_owned())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64",
            Self::Aarch64 => "aarch64",
            Self::Armv7 => "armv7",
        }
    }

    /// The architecture this binary was compiled for, if it is one we ship.
    pub fn current() -> Option<Self> {
        if cfg!(target_arch = "x86_64") {
            Some(Self::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Self::Aarch64)
        } else if cfg!(target_arch = "arm") {
            Some(Self::Armv7)
        } else {
            None
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for Arch {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Arch> for String {
    fn from(v: Arch) -> String {
        v.as_str().to_owned()
    }
}

/// The identity of one upgrade attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AttemptUuid(uuid::Uuid);

impl AttemptUuid {
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let refused = || ValidationError::Uuid(v.to_owned());
        // Only the canonical lowercase hyphenated form, so one attempt has
        // exactly one spelling and one digest.
        if v.len() != 36 || v.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(refused());
        }
        let parsed = uuid::Uuid::try_parse(v).map_err(|_| refused())?;
        if parsed.is_nil() || parsed.is_max() {
            return Err(refused());
        }
        Ok(Self(parsed))
    }

    /// A fresh random (v4) attempt identity.
    pub fn new_random() -> Self {
        Self(uuid::Uuid::new_v4())
    }
}

impl fmt::Display for AttemptUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

impl TryFrom<String> for AttemptUuid {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<AttemptUuid> for String {
    fn from(v: AttemptUuid) -> String {
        v.to_string()
    }
}

impl std::str::FromStr for AttemptUuid {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A SHA-256 digest as 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sha256Hex(String);
string_newtype!(Sha256Hex);

impl Sha256Hex {
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        if v.len() == 64 && all_ascii(v, |b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            Ok(Self(v.to_owned()))
        } else {
            Err(ValidationError::Sha256(v.to_owned()))
        }
    }

    /// The hex form of a finished hash.
    pub fn from_digest(bytes: &[u8; 32]) -> Self {
        use std::fmt::Write;
        let mut out = String::with_capacity(64);
        for b in bytes {
            // INVARIANT: writing to a String cannot fail.
            let _ = write!(out, "{b:02x}");
        }
        Self(out)
    }

    /// SHA-256 of `data`.
    pub fn of(data: &[u8]) -> Self {
        use sha2::Digest;
        Self::from_digest(&sha2::Sha256::digest(data).into())
    }
}

/// Free text (detail, error, reason) bounded at [`MAX_TEXT_CHARS`] characters.
///
/// Parsing refuses longer text; [`BoundedText::truncate`] is for text this
/// program composes itself (an error chain), which it shortens instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BoundedText(String);
string_newtype!(BoundedText);

impl BoundedText {
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let chars = v.chars().count();
        if chars > MAX_TEXT_CHARS {
            Err(ValidationError::TextTooLong { chars })
        } else {
            Ok(Self(v.to_owned()))
        }
    }

    /// Keeps at most [`MAX_TEXT_CHARS`] characters, marking a cut with `…`.
    pub fn truncate(v: impl AsRef<str>) -> Self {
        let v = v.as_ref();
        if v.chars().count() <= MAX_TEXT_CHARS {
            return Self(v.to_owned());
        }
        let mut out: String = v.chars().take(MAX_TEXT_CHARS - 1).collect();
        out.push('…');
        Self(out)
    }
}

/// A bounded, escaped quotation of untrusted text (an offending field of a
/// refused intent): at most [`MAX_EXCERPT_CHARS`] characters of the
/// original, each outside printable ASCII written `\u{..}` and each `\`
/// written `\\`, and `…` appended when the original was longer. Safe to
/// print on a terminal or in a log line; look-alikes such as fullwidth
/// digits and NULs become visible.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Excerpt(String);
string_newtype!(Excerpt);

impl Excerpt {
    /// Longest escaped form: every character escaped as `\u{10ffff}`, plus `…`.
    pub const MAX_CHARS: usize = MAX_EXCERPT_CHARS * 10 + 1;

    /// Quotes `v`: the first [`MAX_EXCERPT_CHARS`] characters, escaped.
    pub fn of(v: &str) -> Self {
        let mut out = String::new();
        for c in v.chars().take(MAX_EXCERPT_CHARS) {
            match c {
                '\\' => out.push_str("\\\\"),
                ' '..='~' => out.push(c),
                _ => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            }
        }
        if v.chars().nth(MAX_EXCERPT_CHARS).is_some() {
            out.push('…');
        }
        Self(out)
    }

    /// Accepts an escaped form as [`of`](Self::of) writes it (printable
    /// ASCII, an optional final `…`), so what is read can be printed as is.
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        let body = v.strip_suffix('…').unwrap_or(v);
        if v.chars().count() <= Self::MAX_CHARS && all_ascii(body, |b| (b' '..=b'~').contains(&b)) {
            Ok(Self(v.to_owned()))
        } else {
            Err(ValidationError::Excerpt(v.to_owned()))
        }
    }
}

/// An attempt's byte limit: at least one byte, at most the compiled ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct MaxBytes(u64);

impl MaxBytes {
    pub fn new(v: u64) -> Result<Self, ValidationError> {
        if (1..=MAX_ARTIFACT_BYTES).contains(&v) {
            Ok(Self(v))
        } else {
            Err(ValidationError::MaxBytes(v))
        }
    }
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for MaxBytes {
    type Error = ValidationError;
    fn try_from(v: u64) -> Result<Self, Self::Error> {
        Self::new(v)
    }
}

impl From<MaxBytes> for u64 {
    fn from(v: MaxBytes) -> u64 {
        v.0
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_id_rules() {
        for ok in ["dev1", "A-b_9", &"x".repeat(64)] {
            assert_eq!(
                DeviceId::parse(ok).map(|d| d.to_string()),
                Ok(ok.to_string())
            );
        }
        for bad in [
            "",
            "a.b",
            "a*",
            "a>",
            "a b",
            "dev\n",
            "dév",
            &"x".repeat(65),
            "a/b",
            "a\0",
        ] {
            assert_eq!(
                DeviceId::parse(bad),
                Err(ValidationError::DeviceId(bad.to_string()))
            );
        }
        assert_eq!(
            DeviceId::parse("a.b").map_err(|e| e.to_string()),
            Err(
                "invalid device id \"a.b\": use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'"
                    .to_string()
            )
        );
    }

    #[test]
    fn workload_name_rules() {
        for ok in ["web", "0db", "a_b-c", &"a".repeat(63)] {
            assert!(WorkloadName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Web",
            "-web",
            "_web",
            "we.b",
            "we b",
            &"a".repeat(64),
            "wéb",
            "a/b",
        ] {
            assert_eq!(
                WorkloadName::parse(bad),
                Err(ValidationError::WorkloadName(bad.to_string()))
            );
        }
    }

    #[test]
    fn version_is_never_a_path() {
        for ok in ["1.2.3", "1.2.3-rc.1+build_7", "v2", &"1".repeat(64)] {
            assert!(Version::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "..",
            "1..2",
            "../etc",
            "1/2",
            "/abs",
            ".hidden",
            "-1",
            "1\0",
            "1\n",
            "1 2",
            "1.2\u{2024}3", // one-dot leader, a '.' lookalike
            "１.2",         // fullwidth digit
            &"1".repeat(65),
        ] {
            assert_eq!(
                Version::parse(bad),
                Err(ValidationError::Version(bad.to_string())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn arch_rules() {
        assert_eq!(Arch::parse("x86_64"), Ok(Arch::X86_64));
        assert_eq!(Arch::parse("aarch64"), Ok(Arch::Aarch64));
        assert_eq!(Arch::parse("armv7"), Ok(Arch::Armv7));
        for bad in ["amd64", "arm64", "X86_64", "", "riscv64"] {
            assert_eq!(
                Arch::parse(bad),
                Err(ValidationError::Arch(bad.to_string()))
            );
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(Arch::current(), Some(Arch::X86_64));
        #[cfg(target_arch = "aarch64")]
        assert_eq!(Arch::current(), Some(Arch::Aarch64));
    }

    #[test]
    fn uuid_rules() {
        let ok = "0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10";
        assert_eq!(
            AttemptUuid::parse(ok).map(|u| u.to_string()),
            Ok(ok.to_string())
        );
        for bad in [
            "",
            "0F6E4C1A-6D0B-4C39-9B64-3F1D2A7E5C10",
            "0f6e4c1a6d0b4c399b643f1d2a7e5c10",
            "{0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10}",
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c1g",
        ] {
            assert_eq!(
                AttemptUuid::parse(bad),
                Err(ValidationError::Uuid(bad.to_string())),
                "{bad}"
            );
        }
        let fresh = AttemptUuid::new_random();
        assert_eq!(AttemptUuid::parse(&fresh.to_string()), Ok(fresh));
    }

    #[test]
    fn sha256_rules() {
        let ok = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Sha256Hex::of(b"").as_str(), ok);
        assert!(Sha256Hex::parse(ok).is_ok());
        for bad in [
            &ok.to_uppercase(),
            &ok[..63],
            &format!("{ok}0"),
            &ok.replace('e', "g"),
            "",
        ] {
            assert_eq!(
                Sha256Hex::parse(bad),
                Err(ValidationError::Sha256(bad.to_string()))
            );
        }
    }

    #[test]
    fn bounded_text() {
        let long = "é".repeat(MAX_TEXT_CHARS + 1);
        assert_eq!(
            BoundedText::parse(&long),
            Err(ValidationError::TextTooLong {
                chars: MAX_TEXT_CHARS + 1
            })
        );
        assert!(BoundedText::parse(&long[..long.len() - 2]).is_ok());
        let cut = BoundedText::truncate(&long);
        assert_eq!(cut.as_str().chars().count(), MAX_TEXT_CHARS);
        assert!(cut.as_str().ends_with('…'));
        let err: Result<BoundedText, _> = serde_json::from_str(&format!("{long:?}"));
        assert!(err.is_err());
    }

    #[test]
    fn max_bytes_rules() {
        assert!(MaxBytes::new(1).is_ok());
        assert!(MaxBytes::new(MAX_ARTIFACT_BYTES).is_ok());
        assert_eq!(MaxBytes::new(0), Err(ValidationError::MaxBytes(0)));
        assert_eq!(
            MaxBytes::new(MAX_ARTIFACT_BYTES + 1),
            Err(ValidationError::MaxBytes(MAX_ARTIFACT_BYTES + 1))
        );
    }

    #[test]
    fn artifact_url_accepts() {
        let d = "a".repeat(64);
        for ok in [
            "https://example.com/agent",
            "https://127.0.0.1:8443/releases/fleet-agent?x=1",
            "https://[::1]:8443/a",
            "oci://registry.example.com/fleet/agent:1.2.3",
            "oci://127.0.0.1:5000/fleet-agent:v1",
            "oci://localhost:5000/a/b-c/d__e:latest",
            &format!("oci://reg.io/fleet/agent@sha256:{d}"),
            "oci://[::1]:5000/fleet/agent:1.0",
            "oci://reg.io/fleet/agent:_x",
            &format!("oci://reg.io/fleet/agent:{}", "t".repeat(128)),
        ] {
            let parsed = ArtifactUrl::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(parsed.to_string(), ok);
        }
        let ArtifactUrl::Oci(r) =
            ArtifactUrl::parse("oci://127.0.0.1:5000/fleet/agent:1.0").expect("valid")
        else {
            panic!("not oci")
        };
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "fleet/agent");
        assert_eq!(r.target(), &OciTarget::Tag("1.0".into()));
        assert_eq!(r.manifest_reference(), "1.0");
        let ArtifactUrl::Oci(r) = ArtifactUrl::parse(&format!(
            "oci://Reg.IO:443/fleet/agent@sha256:{}",
            "c".repeat(64)
        ))
        .expect("valid") else {
            panic!("not oci")
        };
        assert_eq!((r.host(), r.port()), ("reg.io", Some(443)));
        assert_eq!(r.manifest_reference(), format!("sha256:{}", "c".repeat(64)));
        assert!(
            ArtifactUrl::parse(&format!("oci://reg.io/fleet/agent:{}", "t".repeat(129))).is_err()
        );
    }

    #[test]
    fn artifact_url_refuses() {
        let d = "a".repeat(64);
        let cases: &[(&str, &str)] = &[
            ("http://example.com/agent", "the scheme is neither https:// nor oci://"),
            ("file:///usr/bin/agent", "the scheme is neither https:// nor oci://"),
            ("ftp://x/y", "the scheme is neither https:// nor oci://"),
            ("HTTPS://example.com/a", "the scheme is neither https:// nor oci://"),
            ("https://example.com", "the URL has no path"),
            ("https://user:pw@example.com/a", "credentials in the URL are not allowed"),
            ("https://exa mple.com/a", "contains whitespace, control or non-ASCII characters"),
            ("https://exämple.com/a", "contains whitespace, control or non-ASCII characters"),
            ("https://example.com:0/a", "invalid port"),
            ("https://example.com:99999/a", "invalid port"),
            ("https://-bad.com/a", "invalid host name"),
            ("https:///a", "invalid host name"),
            ("https://example.com/a#frag", "the URL has a fragment"),
            ("oci://reg.io/fleet/agent", "the reference has neither a :tag nor an @sha256: digest"),
            ("oci://reg.io", "the reference has no repository"),
            ("oci://reg.io/Fleet/agent:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet//agent:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet/agent:.bad", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io/fleet/agent@sha512:abc", "only sha256 manifest digests are supported"),
            ("oci://reg.io/fleet/agent@sha256:ABC", "the digest is not 64 lowercase hex"),
            ("oci://reg.io/fleet/agent@sha256:", "the digest is not 64 lowercase hex"),
            ("oci://reg.io/fleet/agent:", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io/fleet/agent:1?x=y", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io/fleet/agent:1#f", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io:5000/:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet/agent/:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/-fleet/agent:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet/agent:tag:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://user@reg.io/fleet/agent:1", "credentials in the URL are not allowed"),
            ("oci://reg.io:0/fleet/agent:1", "invalid port"),
            ("oci://reg.io:5000", "the reference has no repository"),
            ("oci:reg.io/fleet/agent:1", "the scheme is neither https:// nor oci://"),
        ];
        for (url, why) in cases {
            assert_eq!(
                ArtifactUrl::parse(url),
                Err(ValidationError::ArtifactUrl {
                    url: url.to_string(),
                    why
                }),
                "{url}"
            );
        }
        let long = format!("https://example.com/{}", "a".repeat(1100));
        assert!(ArtifactUrl::parse(&long).is_err());
        assert!(ArtifactUrl::parse(&format!("oci://reg.io/a:tag@sha256:{d}")).is_err());
        assert_eq!(
            ArtifactUrl::parse("http://x/y").map_err(|e| e.to_string()),
            Err("invalid artifact url \"http://x/y\": the scheme is neither https:// nor oci://; use https://host[:port]/path or oci://host[:port]/repository:tag or oci://host[:port]/repository@sha256:<64 hex>".to_string())
        );
    }
}
