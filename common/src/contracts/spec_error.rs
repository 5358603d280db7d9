//! [`SpecError`]: why a part of a workload spec is refused. Shared by the
//! workload spec itself (`workload.rs`) and its health check and update
//! strategy (`health.rs`), so neither depends on the other for it.

use std::fmt;

/// A refused part of a workload spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecError {
    Image(String),
    Arg {
        what: &'static str,
        why: &'static str,
    },
    EnvName(String),
    Port {
        why: &'static str,
    },
    Volume(String),
    TooMany {
        what: &'static str,
        max: usize,
    },
    Health {
        why: &'static str,
    },
    Strategy {
        why: &'static str,
    },
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Image(v) => write!(f, "invalid image {v:?}: use a reference such as registry.example.com/app:1.2 (letters, digits, . _ - / : @; not starting with '-')"),
            Self::Arg { what, why } => write!(f, "invalid {what}: {why}"),
            Self::EnvName(v) => write!(f, "invalid environment variable name {v:?}: use A-Z, a-z, 0-9 and '_', not starting with a digit"),
            Self::Port { why } => write!(f, "invalid port mapping: {why}"),
            Self::Volume(v) => write!(f, "invalid volume {v:?}: the host side is a named volume ([a-z0-9][a-z0-9_.-]*) or an absolute path without '..', the container side an absolute path"),
            Self::TooMany { what, max } => write!(f, "too many {what}: at most {max}"),
            Self::Health { why } => write!(f, "invalid health: {why}"),
            Self::Strategy { why } => write!(f, "invalid update-strategy: {why}"),
        }
    }
}

impl std::error::Error for SpecError {}
