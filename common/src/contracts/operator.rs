//! What only the operator reads and writes, in `fleet-operator`
//! (never exported to devices): a device's labels, and the state of a
//! staged rollout, so that any operator's `fleetctl` can show, resume or
//! abort it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::release::Release;
use super::workload::WorkloadSpec;
use crate::time::Timestamp;
use crate::validate::{DeviceId, Sha256Hex, WorkloadName};

/// Labels one device carries at most.
pub const MAX_LABELS_PER_DEVICE: usize = 64;
/// Longest label key or value (as Kubernetes).
pub const MAX_LABEL_CHARS: usize = 63;
/// Longest rollout id.
pub const MAX_ROLLOUT_ID_CHARS: usize = 64;

/// Names of the device facts a selector reads from `fleet-status`
/// `<device>.info`: no label may take one.
pub const FACT_NAMES: [&str; 6] = [
    "device",
    "arch",
    "agent-version",
    "os",
    "config-state",
    "frozen",
];

/// A label key or value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    Key(String),
    Value { key: String, value: String },
    ReservedKey(String),
    TooMany(usize),
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(k) => write!(
                f,
                "label key {k:?}: use 1 to {MAX_LABEL_CHARS} letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            ),
            Self::Value { key, value } => write!(
                f,
                "label {key}={value:?}: a value is empty or up to {MAX_LABEL_CHARS} letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            ),
            Self::ReservedKey(k) => write!(
                f,
                "label key {k:?} is the name of a device fact ({}): pick another key",
                FACT_NAMES.join(", ")
            ),
            Self::TooMany(n) => write!(
                f,
                "{n} labels: a device carries at most {MAX_LABELS_PER_DEVICE}; remove some with KEY-"
            ),
        }
    }
}

impl std::error::Error for LabelError {}

fn label_token(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && s.len() <= MAX_LABEL_CHARS
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Whether `k` is a valid label key (reserved fact names aside).
pub fn is_label_key(k: &str) -> bool {
    label_token(k)
}

/// Whether `v` is a valid label value (empty is valid).
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || label_token(v)
}

/// Checks a label a device may carry.
pub fn check_label(key: &str, value: &str) -> Result<(), LabelError> {
    if !label_token(key) {
        return Err(LabelError::Key(key.to_owned()));
    }
    if FACT_NAMES.contains(&key) {
        return Err(LabelError::ReservedKey(key.to_owned()));
    }
    if !is_label_value(value) {
        return Err(LabelError::Value {
            key: key.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// `fleet-operator` `labels.<device>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DeviceLabels {
    pub labels: BTreeMap<String, String>,
}

impl DeviceLabels {
    /// Parses and checks every label.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let l: DeviceLabels = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        l.check().map_err(|e| e.to_string())?;
        Ok(l)
    }

    pub fn check(&self) -> Result<(), LabelError> {
        if self.labels.len() > MAX_LABELS_PER_DEVICE {
            return Err(LabelError::TooMany(self.labels.len()));
        }
        for (k, v) in &self.labels {
            check_label(k, v)?;
        }
        Ok(())
    }
}

/// Whether `id` is a valid rollout id (a KV key token).
pub fn is_rollout_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ROLLOUT_ID_CHARS
        && id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// Where a staged rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutPhase {
    /// Batches are being issued (or a resume will issue them).
    Running,
    /// A batch ended below the success threshold: nothing more is issued.
    Halted,
    /// The operator aborted it: nothing more is issued.
    Aborted,
    /// Every batch ended at or above the threshold.
    Complete,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Halted => "halted",
            Self::Aborted => "aborted",
            Self::Complete => "complete",
        }
    }
}

impl fmt::Display for RolloutPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device that counted against a batch, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RolloutFailure {
    pub device: DeviceId,
    pub reason: String,
}

/// A batch that ended, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct BatchResult {
    pub succeeded: u32,
    pub failed: Vec<RolloutFailure>,
    /// Frozen when the batch ended (not counted; a resume picks them up).
    pub frozen: Vec<DeviceId>,
    pub timed_out: bool,
    pub ended_at: Timestamp,
}

/// What a device's document held for a workload before a workload
/// rollout wrote it: what `rollout undo` writes back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreviousSpec {
    /// The device did not have the workload: undo removes it.
    Absent,
    /// This spec (kept once in [`PreviousSpecs::specs`]).
    Spec(Sha256Hex),
    /// A spec that did not validate: undo cannot put it back.
    Invalid,
}

/// The devices that ran one previous spec, and the spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SpecDevices {
    pub spec: WorkloadSpec,
    pub devices: Vec<DeviceId>,
}

/// Each device's previous spec, grouped by spec so that a rollout over
/// 10,000 devices that mostly ran the same spec keeps each device id once
/// and each spec once (one `fleet-operator` value holds it all).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PreviousSpecs {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Vec<DeviceId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid: Vec<DeviceId>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub specs: BTreeMap<Sha256Hex, SpecDevices>,
}

impl PreviousSpecs {
    /// Every recorded device with what it held.
    pub fn by_device(&self) -> BTreeMap<DeviceId, PreviousSpec> {
        let mut m = BTreeMap::new();
        for d in &self.absent {
            m.insert(d.clone(), PreviousSpec::Absent);
        }
        for d in &self.invalid {
            m.insert(d.clone(), PreviousSpec::Invalid);
        }
        for (h, g) in &self.specs {
            for d in &g.devices {
                m.insert(d.clone(), PreviousSpec::Spec(h.clone()));
            }
        }
        m
    }

    /// Records `device` (the caller checks it is not recorded yet);
    /// `spec` is the spec of a [`PreviousSpec::Spec`].
    pub fn record(
        &mut self,
        device: DeviceId,
        previous: &PreviousSpec,
        spec: Option<&WorkloadSpec>,
    ) {
        match (previous, spec) {
            (PreviousSpec::Absent, _) => self.absent.push(device),
            (PreviousSpec::Spec(h), Some(spec)) => self
                .specs
                .entry(h.clone())
                .or_insert_with(|| SpecDevices {
                    spec: spec.clone(),
                    devices: Vec::new(),
                })
                .devices
                .push(device),
            (PreviousSpec::Invalid, _) | (PreviousSpec::Spec(_), None) => self.invalid.push(device),
        }
    }

    pub fn spec(&self, h: &Sha256Hex) -> Option<&WorkloadSpec> {
        self.specs.get(h).map(|g| &g.spec)
    }

    pub fn len(&self) -> usize {
        self.absent.len()
            + self.invalid.len()
            + self.specs.values().map(|g| g.devices.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The target of a workload rollout: one workload's spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadRollout {
    pub workload: WorkloadName,
    pub spec: WorkloadSpec,
    pub spec_hash: Sha256Hex,
    /// Each device's previous spec of the workload, recorded (in the state
    /// written by compare-and-set) before its document is written.
    #[serde(default)]
    pub previous: PreviousSpecs,
    /// When `rollout undo` last ran (it may run again: it is idempotent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undone_at: Option<Timestamp>,
}

/// What a rollout rolls out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutKind {
    Agent,
    Workload,
}

impl RolloutKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Workload => "workload",
        }
    }
}

impl fmt::Display for RolloutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `fleet-operator` `rollouts.<id>`: a staged rollout, of an agent release
/// (`release`) or of a workload's spec (`workload`, fleetctl 0.3 on;
/// fleetctl 0.2 lists such a rollout as unreadable). The devices are
/// fixed when it starts, in batch order; `batch-ends[i]` is the number of
/// devices in batches `0..=i`. Each device's progress is not kept here: it
/// is read from its intent (`fleet-control`) or its desired document
/// (`fleet-workloads`) and its status (`fleet-status`), so a resumed
/// rollout sees what was issued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RolloutState {
    pub id: String,
    /// An agent rollout's release (every state fleetctl 0.2 wrote has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Release>,
    /// A workload rollout's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRollout>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The batches as given (`1`, `5%`).
    pub batches: Vec<String>,
    pub success_threshold_pct: u8,
    pub batch_timeout_secs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<String>,
    pub devices: Vec<DeviceId>,
    pub batch_ends: Vec<u32>,
    pub phase: RolloutPhase,
    /// The batch under way (or the last one, once ended).
    pub current_batch: u32,
    pub batch_started_at: Timestamp,
    pub results: Vec<BatchResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt_reason: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl RolloutState {
    pub fn kind(&self) -> RolloutKind {
        if self.workload.is_some() {
            RolloutKind::Workload
        } else {
            RolloutKind::Agent
        }
    }

    /// What it rolls out, in words: `agent 1.4.0`, `workload web spec 1a2b3c4d5e6f`.
    pub fn target(&self) -> String {
        match (&self.workload, &self.release) {
            (Some(w), _) => format!(
                "workload {} spec {}",
                w.workload,
                &w.spec_hash.as_str()[..12]
            ),
            (None, Some(r)) => format!("agent {}", r.version),
            (None, None) => "nothing (neither release nor workload)".to_owned(),
        }
    }

    /// The devices of batch `i`.
    pub fn batch(&self, i: usize) -> &[DeviceId] {
        let end = self.batch_ends.get(i).map_or(0, |e| *e as usize);
        let start = if i == 0 {
            0
        } else {
            self.batch_ends.get(i - 1).map_or(end, |e| *e as usize)
        };
        self.devices.get(start..end).unwrap_or(&[])
    }

    /// The batch of device index `n`.
    pub fn batch_of(&self, n: usize) -> usize {
        self.batch_ends
            .iter()
            .position(|e| n < *e as usize)
            .unwrap_or(self.batch_ends.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_checked() {
        assert!(check_label("site", "berlin").is_ok());
        assert!(check_label("tier", "").is_ok());
        assert!(check_label("a.b_c-d", "v1.2_x").is_ok());
        assert_eq!(
            check_label("-x", "v"),
            Err(LabelError::Key("-x".to_owned()))
        );
        assert!(matches!(
            check_label("site", "bad value"),
            Err(LabelError::Value { .. })
        ));
        assert_eq!(
            check_label("arch", "x"),
            Err(LabelError::ReservedKey("arch".to_owned()))
        );
        assert!(check_label(&"k".repeat(64), "v").is_err());
        assert!(is_rollout_id("r-20261201-1"));
        assert!(!is_rollout_id("R.1"));
    }
}
