//! `AgentUpgradeAttempt`: what the operator CAS-writes to a device's
//! `agent-upgrade-intent` key, and its content digest.

use serde::{Deserialize, Serialize};

use crate::validate::{Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version};

/// One upgrade attempt for one device. No source version and no expiry
/// (`docs/design/upgrade.md` "The attempt"): a device back after months upgrades
/// directly to the current target.
///
/// Fields are declared in sorted order so the serialized form is canonical
/// JSON (sorted keys, no whitespace), which [`AgentUpgradeAttempt::digest`]
/// hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AgentUpgradeAttempt {
    pub arch: Arch,
    pub artifact_url: ArtifactUrl,
    pub device_id: DeviceId,
    pub max_bytes: MaxBytes,
    pub sha256: Sha256Hex,
    pub target_version: Version,
    pub uuid: AttemptUuid,
}

impl AgentUpgradeAttempt {
    /// The canonical JSON: keys sorted, no whitespace.
    pub fn canonical_json(&self) -> Vec<u8> {
        // INVARIANT: every field serializes to a JSON string or number, so
        // serialization cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// SHA-256 over the canonical JSON. A UUID seen again with another digest
    /// is refused by the agent and by the updater.
    pub fn digest(&self) -> Sha256Hex {
        Sha256Hex::of(&self.canonical_json())
    }
}
