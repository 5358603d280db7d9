//! The identifiers and bounded values: device, workload, version, arch,
//! attempt UUID, SHA-256, bounded text and excerpts, byte limits.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_ARTIFACT_BYTES, MAX_EXCERPT_CHARS, MAX_TEXT_CHARS};

use super::error::{all_ascii, string_newtype, ValidationError, EXCERPT_MAX_CHARS};

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
    pub const MAX_CHARS: usize = EXCERPT_MAX_CHARS;

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
