//! A release as the operator describes it to `fleetctl upgrade` and
//! `fleetctl rollout`: one agent version and, per architecture, where its
//! binary is, its SHA-256 and a byte limit. fleetctl turns it into one
//! [`AgentUpgradeAttempt`] per device (that device's architecture, a new
//! UUID).
//!
//! ```json
//! { "version": "1.4.0",
//!   "artifacts": {
//!     "x86_64":  { "artifact-url": "https://releases.example.com/fleet-agent/1.4.0/x86_64",
//!                  "sha256": "5f70…", "max-bytes": 20971520 },
//!     "aarch64": { "artifact-url": "oci://registry.example.com/fleet-agent@sha256:…",
//!                  "sha256": "9a1c…", "max-bytes": 20971520 } } }
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use super::attempt::AgentUpgradeAttempt;
use crate::validate::{Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version};

/// The binary of one architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ReleaseArtifact {
    pub artifact_url: ArtifactUrl,
    pub sha256: Sha256Hex,
    pub max_bytes: MaxBytes,
}

/// The binaries of a release, by architecture (unknown architectures are
/// refused by name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseArtifacts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x86_64: Option<ReleaseArtifact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aarch64: Option<ReleaseArtifact>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armv7: Option<ReleaseArtifact>,
}

/// A release file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Release {
    pub version: Version,
    pub artifacts: ReleaseArtifacts,
}

/// A release file that cannot be used.
#[derive(Debug)]
pub enum ReleaseError {
    Json(serde_json::Error),
    NoArtifacts,
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json(e) => write!(
                f,
                "not a release: {e}; write {{\"version\": \"1.4.0\", \"artifacts\": {{\"x86_64\": {{\"artifact-url\": \"https://…\", \"sha256\": \"<64 hex>\", \"max-bytes\": <bytes>}}}}}} (fleetctl artifact push prints an entry)"
            ),
            Self::NoArtifacts => write!(
                f,
                "the release lists no artifact: give at least one of x86_64, aarch64, armv7 under \"artifacts\""
            ),
        }
    }
}

impl std::error::Error for ReleaseError {}

impl Release {
    /// Parses and validates a release file.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ReleaseError> {
        let r: Release = serde_json::from_slice(bytes).map_err(ReleaseError::Json)?;
        if Arch::ALL.iter().all(|a| r.artifact(*a).is_none()) {
            return Err(ReleaseError::NoArtifacts);
        }
        Ok(r)
    }

    /// The binary for `arch`, if the release has one.
    pub fn artifact(&self, arch: Arch) -> Option<&ReleaseArtifact> {
        match arch {
            Arch::X86_64 => self.artifacts.x86_64.as_ref(),
            Arch::Aarch64 => self.artifacts.aarch64.as_ref(),
            Arch::Armv7 => self.artifacts.armv7.as_ref(),
        }
    }

    /// The attempt for `device` of architecture `arch`, named `uuid`; `None`
    /// when the release has no binary for `arch`.
    pub fn attempt(
        &self,
        device: &DeviceId,
        arch: Arch,
        uuid: AttemptUuid,
    ) -> Option<AgentUpgradeAttempt> {
        let a = self.artifact(arch)?;
        Some(AgentUpgradeAttempt {
            arch,
            artifact_url: a.artifact_url.clone(),
            device_id: device.clone(),
            max_bytes: a.max_bytes,
            sha256: a.sha256.clone(),
            target_version: self.version.clone(),
            uuid,
        })
    }

    /// Whether `attempt` carries exactly this release (version, and the
    /// binary of its architecture): the release metadata is unchanged.
    pub fn is_release_of(&self, attempt: &AgentUpgradeAttempt) -> bool {
        attempt.target_version == self.version
            && self.artifact(attempt.arch).is_some_and(|a| {
                a.artifact_url == attempt.artifact_url
                    && a.sha256 == attempt.sha256
                    && a.max_bytes == attempt.max_bytes
            })
    }
}
