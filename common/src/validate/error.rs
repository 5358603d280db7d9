//! [`ValidationError`], and what every validated type shares: the
//! quoting of a refused value and the impls of a string newtype.

use std::fmt;

use crate::limits::{MAX_ARTIFACT_BYTES, MAX_EXCERPT_CHARS, MAX_TEXT_CHARS};

/// Longest escaped form of an excerpt: every character escaped as
/// `\u{10ffff}`, plus `…` ([`super::Excerpt::MAX_CHARS`]).
pub(super) const EXCERPT_MAX_CHARS: usize = MAX_EXCERPT_CHARS * 10 + 1;

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
                EXCERPT_MAX_CHARS
            ),
        }
    }
}

impl std::error::Error for ValidationError {}

/// Quotes a refused value for a message, shortened and with control
/// characters escaped so a hostile value cannot forge log lines.
pub(super) fn shown(v: &str) -> String {
    const SHOWN_CHARS: usize = 80;
    let mut out: String = v.chars().take(SHOWN_CHARS).collect();
    if v.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    format!("{out:?}")
}

pub(super) fn all_ascii(v: &str, allowed: impl Fn(u8) -> bool) -> bool {
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
pub(super) use string_newtype;
