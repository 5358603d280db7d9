//! `UpgradeStatus`: the public view of one upgrade transaction, answered by
//! the updater's `status` request and mirrored by the agent into
//! `fleet-status` `<device>.upgrade`; and [`UpgradeReport`], what that key
//! holds: such a status, or a [`RefusedIntent`] for an intent the agent
//! refused before it named a valid attempt (no valid UUID or target
//! version to publish a status under).
//!
//! Compatibility: a report of either form is one JSON object; an attempt's
//! status is told apart by its `attempt-uuid`, a refused intent by its
//! `intent`. Every status an older agent wrote still reads as
//! [`UpgradeReport::Attempt`]. A fleetctl older than the refused-intent
//! form cannot read one (it says the key is unreadable).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::bounded::{Bounded, Transitions};
use crate::limits::MAX_INTENT_EXCERPTS;
use crate::time::Timestamp;
use crate::validate::{AttemptUuid, BoundedText, Excerpt, Sha256Hex, Version};

/// The seven public phases (`docs/design/upgrade.md` "Status").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradePhase {
    Preparing,
    Stopping,
    Starting,
    Complete,
    RollingBack,
    Failed,
    RollbackFailed,
}

impl UpgradePhase {
    /// No further change happens without a new attempt (or root repair).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed | Self::RollbackFailed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Stopping => "stopping",
            Self::Starting => "starting",
            Self::Complete => "complete",
            Self::RollingBack => "rolling-back",
            Self::Failed => "failed",
            Self::RollbackFailed => "rollback-failed",
        }
    }
}

impl std::fmt::Display for UpgradePhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transaction is in its phase: machine-readable, stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeReason {
    /// The agent accepted the attempt and asked the updater to prepare it.
    Accepted,
    /// The agent drained because the updater stopped it for a cutover.
    Updater,
    /// The candidate became ready and the transaction committed.
    Ready,
    /// The target version was already the active one.
    AlreadyActive,
    /// The artifact could not be fetched (network, TLS, HTTP status, redirect, timeout).
    Download,
    /// The artifact's SHA-256 differs from the attempt's.
    Checksum,
    /// The artifact is larger than the attempt's limit or the 100 MiB ceiling.
    TooLarge,
    /// The OCI manifest is not a Harmony agent artifact.
    Artifact,
    /// The binary could not be installed, or an installed one failed re-verification.
    Install,
    /// The candidate's `--self-test` failed or timed out.
    Probe,
    /// The candidate reports a compiled version other than the target.
    VersionMismatch,
    /// The running agent could not be stopped within the bound.
    StopFailed,
    /// The candidate did not become ready within the start bound.
    StartFailed,
    /// The updater restarted during the transaction and recovered it.
    Interrupted,
    /// Restoring or starting the previous agent failed.
    RollbackFailed,
    /// The agent refused the attempt (another device or arch, invalid content).
    Rejected,
    /// The attempt's UUID was seen before with different content.
    Conflict,
    /// The updater is in `rollback-failed` and refuses attempts until root repair.
    Quarantined,
    /// The device is in a change freeze.
    Frozen,
    /// The updater could not be reached or answered with an error.
    UpdaterUnavailable,
}

impl UpgradeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Updater => "updater",
            Self::Ready => "ready",
            Self::AlreadyActive => "already-active",
            Self::Download => "download",
            Self::Checksum => "checksum",
            Self::TooLarge => "too-large",
            Self::Artifact => "artifact",
            Self::Install => "install",
            Self::Probe => "probe",
            Self::VersionMismatch => "version-mismatch",
            Self::StopFailed => "stop-failed",
            Self::StartFailed => "start-failed",
            Self::Interrupted => "interrupted",
            Self::RollbackFailed => "rollback-failed",
            Self::Rejected => "rejected",
            Self::Conflict => "conflict",
            Self::Quarantined => "quarantined",
            Self::Frozen => "frozen",
            Self::UpdaterUnavailable => "updater-unavailable",
        }
    }
}

impl std::fmt::Display for UpgradeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One timed phase change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct StatusTransition {
    pub phase: UpgradePhase,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
}

/// The public status of one upgrade transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct UpgradeStatus {
    pub phase: UpgradePhase,
    pub attempt_uuid: AttemptUuid,
    pub attempt_digest: Sha256Hex,
    pub target_version: Version,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    pub attempt_started_at: Timestamp,
    pub phase_changed_at: Timestamp,
    /// How long the old agent took to drain, once it has stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<BoundedText>,
    /// systemd invocation id of the agent unit run this status concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<BoundedText>,
    /// Where the logs are: a journalctl selector such as
    /// `_SYSTEMD_UNIT=fleet-agent.service _SYSTEMD_INVOCATION_ID=<id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_ref: Option<BoundedText>,
    pub transitions: Transitions<StatusTransition>,
}

impl UpgradeStatus {
    /// A status entering its first phase now.
    pub fn begin(
        uuid: AttemptUuid,
        digest: Sha256Hex,
        target_version: Version,
        phase: UpgradePhase,
        reason: Option<UpgradeReason>,
        now: Timestamp,
    ) -> Self {
        let mut transitions = Transitions::default();
        transitions.push(StatusTransition {
            phase,
            at: now,
            reason,
        });
        Self {
            phase,
            attempt_uuid: uuid,
            attempt_digest: digest,
            target_version,
            reason,
            detail: None,
            error: None,
            attempt_started_at: now,
            phase_changed_at: now,
            drain_duration_ms: None,
            boot_id: None,
            invocation_id: None,
            journal_ref: None,
            transitions,
        }
    }

    /// Moves to `phase` now, recording a transition when the phase changes.
    pub fn enter(&mut self, phase: UpgradePhase, reason: Option<UpgradeReason>, now: Timestamp) {
        if self.phase != phase || self.reason != reason {
            self.transitions.push(StatusTransition {
                phase,
                at: now,
                reason,
            });
            if self.phase != phase {
                self.phase_changed_at = now;
            }
        }
        self.phase = phase;
        self.reason = reason;
    }
}

/// Why an intent could not be reported under an attempt: the first rule
/// it broke that leaves it without a valid UUID or target version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntentRule {
    /// The value is larger than any attempt.
    TooLarge,
    /// The value is not a JSON object.
    Malformed,
    MissingUuid,
    /// The UUID is not a canonical hyphenated, non-nil UUID.
    InvalidUuid,
    MissingTargetVersion,
    /// The target version breaks the version rule (ASCII letters, digits,
    /// `.+_-`, at most 64, no `..`).
    InvalidTargetVersion,
}

impl IntentRule {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLarge => "too-large",
            Self::Malformed => "malformed",
            Self::MissingUuid => "missing-uuid",
            Self::InvalidUuid => "invalid-uuid",
            Self::MissingTargetVersion => "missing-target-version",
            Self::InvalidTargetVersion => "invalid-target-version",
        }
    }
}

impl std::fmt::Display for IntentRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which value of the intent key was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct IntentRef {
    /// The `fleet-control` stream sequence (KV revision) of the value, when
    /// the agent could tell it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// SHA-256 of the value's bytes as written.
    pub digest: Sha256Hex,
    pub bytes: u64,
    /// The UUID, when it was valid (and the target version was not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<AttemptUuid>,
}

/// One offending field of a refused intent, quoted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FieldExcerpt {
    /// The field's name, as written (escaped).
    pub field: Excerpt,
    /// The field's value: a string's text, any other JSON value's text.
    pub excerpt: Excerpt,
    /// Length of the value in characters (the excerpt shows at most 64).
    pub chars: u64,
}

impl FieldExcerpt {
    /// Quotes field `name` and its value `text`.
    pub fn of(name: &str, text: &str) -> Self {
        Self {
            field: Excerpt::of(name),
            excerpt: Excerpt::of(text),
            chars: u64::try_from(text.chars().count()).unwrap_or(u64::MAX),
        }
    }
}

/// An intent the agent refused without a valid attempt identity, so the
/// operator sees the refusal and its reason. Always phase `failed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RefusedIntentJson", into = "RefusedIntentJson")]
pub struct RefusedIntent {
    /// [`UpgradeReason::Rejected`], or [`UpgradeReason::Conflict`] when its
    /// valid UUID was seen before with other content.
    pub reason: RefusalReason,
    pub intent: IntentRef,
    pub rule: IntentRule,
    /// The offending fields (and the identity fields), quoted.
    pub fields: Bounded<FieldExcerpt, MAX_INTENT_EXCERPTS>,
    /// What is wrong and what to write instead.
    pub error: BoundedText,
    pub refused_at: Timestamp,
}

/// The reasons a refused intent may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    Rejected,
    Conflict,
}

impl RefusalReason {
    pub fn reason(self) -> UpgradeReason {
        match self {
            Self::Rejected => UpgradeReason::Rejected,
            Self::Conflict => UpgradeReason::Conflict,
        }
    }
}

/// The wire form of [`RefusedIntent`]: `phase` is always `failed`, so a
/// script reading only `phase` and `reason` sees a failure.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RefusedIntentJson {
    phase: UpgradePhase,
    reason: UpgradeReason,
    intent: IntentRef,
    rule: IntentRule,
    fields: Bounded<FieldExcerpt, MAX_INTENT_EXCERPTS>,
    error: BoundedText,
    refused_at: Timestamp,
}

impl From<RefusedIntent> for RefusedIntentJson {
    fn from(r: RefusedIntent) -> Self {
        Self {
            phase: UpgradePhase::Failed,
            reason: r.reason.reason(),
            intent: r.intent,
            rule: r.rule,
            fields: r.fields,
            error: r.error,
            refused_at: r.refused_at,
        }
    }
}

impl TryFrom<RefusedIntentJson> for RefusedIntent {
    type Error = String;
    fn try_from(j: RefusedIntentJson) -> Result<Self, String> {
        if j.phase != UpgradePhase::Failed {
            return Err(format!(
                "a refused intent has phase failed, not {}",
                j.phase
            ));
        }
        let reason = match j.reason {
            UpgradeReason::Rejected => RefusalReason::Rejected,
            UpgradeReason::Conflict => RefusalReason::Conflict,
            other => {
                return Err(format!(
                    "a refused intent has reason rejected or conflict, not {other}"
                ))
            }
        };
        Ok(Self {
            reason,
            intent: j.intent,
            rule: j.rule,
            fields: j.fields,
            error: j.error,
            refused_at: j.refused_at,
        })
    }
}

/// What `fleet-status` `<device>.upgrade` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeReport {
    /// The status of an upgrade attempt (the only form before refused
    /// intents were reported).
    Attempt(UpgradeStatus),
    /// An intent refused before it named a valid attempt.
    RefusedIntent(RefusedIntent),
}

impl UpgradeReport {
    pub fn phase(&self) -> UpgradePhase {
        match self {
            Self::Attempt(s) => s.phase,
            Self::RefusedIntent(_) => UpgradePhase::Failed,
        }
    }

    pub fn reason(&self) -> Option<UpgradeReason> {
        match self {
            Self::Attempt(s) => s.reason,
            Self::RefusedIntent(r) => Some(r.reason.reason()),
        }
    }

    pub fn attempt(&self) -> Option<&UpgradeStatus> {
        match self {
            Self::Attempt(s) => Some(s),
            Self::RefusedIntent(_) => None,
        }
    }
}

impl Serialize for UpgradeReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Attempt(a) => a.serialize(s),
            Self::RefusedIntent(r) => r.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for UpgradeReport {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        let has = |k: &str| v.as_object().is_some_and(|o| o.contains_key(k));
        if has("attempt-uuid") {
            serde_json::from_value(v)
                .map(Self::Attempt)
                .map_err(D::Error::custom)
        } else if has("intent") {
            serde_json::from_value(v)
                .map(Self::RefusedIntent)
                .map_err(D::Error::custom)
        } else {
            Err(D::Error::custom(
                "an upgrade report has attempt-uuid (an attempt's status) or intent (a refused intent)",
            ))
        }
    }
}

impl From<UpgradeStatus> for UpgradeReport {
    fn from(s: UpgradeStatus) -> Self {
        Self::Attempt(s)
    }
}
