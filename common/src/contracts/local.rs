//! Requests and responses of the two local sockets (`docs/design/protocol.md`
//! "The local sockets"): one JSON request per connection, newline-terminated,
//! one JSON response.
//!
//! ```text
//! {"request":"status"}
//! {"request":"upgrade","attempt":{...}}
//! → {"ok":true,"status":{...}}
//! → {"ok":false,"error":{"code":"busy","message":"...","reasons":[...]}}
//! ```

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::attempt::AgentUpgradeAttempt;
use super::device::ConfigStateReport;
use super::status::{UpgradePhase, UpgradeStatus};
use crate::validate::{AttemptUuid, BoundedText, DeviceId, Version};

/// A request to the updater socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "request", deny_unknown_fields)]
pub enum UpdaterRequest {
    /// Read-only; always answered within 15 s. (A struct variant, so serde
    /// refuses unknown fields on it too.)
    Status {},
    /// Mutating; one at a time; answered when preparation and probe end.
    Upgrade { attempt: AgentUpgradeAttempt },
}

/// The updater's answer to `status` and `upgrade`: the current or last
/// transaction, `null` when there has never been one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct UpdaterReply {
    pub status: Option<UpgradeStatus>,
}

/// Target of a config-state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigStateName {
    Configured,
    Changefreeze,
}

/// A request to the agent socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "request", deny_unknown_fields)]
pub enum AgentRequest {
    /// The agent's view: config state, connection, reconciler, upgrade.
    Status {},
    /// Reads the config state, or sets it when `set` is given.
    Configstate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<ConfigStateName>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<BoundedText>,
    },
}

/// The agent's answer to `configstate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ConfigStateReply {
    pub config_state: ConfigStateReport,
}

/// The agent's answer to `status`: its own view, for whoever decides when to
/// freeze (a safety controller, `fleet-agent node status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AgentStatusReply {
    pub device_id: DeviceId,
    pub agent_version: Version,
    pub config_state: ConfigStateReport,
    pub nats: NatsView,
    /// A complete desired-state snapshot has been read by the current
    /// consumer (false at start, and while a new one is read).
    pub snapshot_complete: bool,
    pub mutations: MutationsView,
    pub upgrade: UpgradeView,
    /// Why a freeze asked for now would be refused; empty when it would be
    /// accepted or the agent is already frozen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze_blockers: Vec<Refusal>,
}

/// The agent's NATS connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    rename_all_fields = "kebab-case",
    tag = "state",
    deny_unknown_fields
)]
pub enum NatsView {
    /// (Struct variants, so serde refuses unknown fields on them too.)
    Connected {},
    /// Not connected (or never yet) for this long.
    Disconnected { for_secs: u64 },
}

/// Which workload mutations the agent admits now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MutationAdmission {
    /// Every mutation the desired state calls for.
    Open,
    /// Change freeze: only restores from the last applied spec, local images only.
    Frozen,
    /// Shutting down: none.
    Draining,
}

/// The reconciler's mutations, at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct MutationsView {
    pub admission: MutationAdmission,
    /// The mutation running now ("replace web").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<BoundedText>,
    /// Mutations planned and not started.
    pub pending: u32,
    /// The image being pulled now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulling: Option<BoundedText>,
}

/// What the agent knows of agent upgrades.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct UpgradeView {
    pub updater: UpdaterView,
    /// An upgrade intent was accepted and has not completed.
    pub intent_pending: bool,
}

/// The updater's transaction as the agent last asked it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    rename_all_fields = "kebab-case",
    tag = "state",
    deny_unknown_fields
)]
pub enum UpdaterView {
    /// No updater socket, or nobody listening: no transaction can progress.
    Absent {},
    /// The updater answered and has never run a transaction.
    Idle {},
    /// The updater's current or last transaction.
    Transaction {
        phase: UpgradePhase,
        attempt: AttemptUuid,
        target_version: Version,
    },
    /// The updater did not answer as it should; nothing is known.
    Unknown { error: BoundedText },
}

/// Machine-readable error codes of both sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// Too many concurrent clients, or a mutating request is already running.
    Busy,
    /// The request is malformed or its content is refused.
    Invalid,
    /// The attempt's UUID was seen before with other content.
    Conflict,
    /// The updater is in `rollback-failed`: root repair first.
    Quarantined,
    /// The device is in a change freeze.
    Frozen,
    /// A state change was refused; `reasons` lists why.
    Refused,
    /// The caller's uid and groups are not allowed on this socket.
    Forbidden,
    /// The request exceeds 1 MiB.
    TooLarge,
    /// The request did not arrive within the read deadline.
    Timeout,
    /// The daemon failed; `message` says where.
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Busy => "busy",
            Self::Invalid => "invalid",
            Self::Conflict => "conflict",
            Self::Quarantined => "quarantined",
            Self::Frozen => "frozen",
            Self::Refused => "refused",
            Self::Forbidden => "forbidden",
            Self::TooLarge => "too-large",
            Self::Timeout => "timeout",
            Self::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the agent refused to enter a change freeze (`docs/design/freeze.md`
/// "Entering").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Refusal {
    /// No complete desired-state snapshot has been consumed yet.
    NoSnapshot,
    /// NATS has been unreachable for longer than the heartbeat window.
    Disconnected,
    /// The agent is shutting down.
    Draining,
    /// An upgrade transaction is not terminal.
    UpgradeInProgress,
    /// An upgrade intent was accepted and has not completed.
    IntentPending,
    /// A workload mutation, removal or pull is pending or in flight.
    ReconcilerBusy,
    /// An image or artifact download is in progress.
    DownloadInProgress,
    /// The freeze could not be written to disk (a full disk, for
    /// instance); a freeze is answered only once it is.
    NotPersisted,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSnapshot => "no-snapshot",
            Self::Disconnected => "disconnected",
            Self::Draining => "draining",
            Self::UpgradeInProgress => "upgrade-in-progress",
            Self::IntentPending => "intent-pending",
            Self::ReconcilerBusy => "reconciler-busy",
            Self::DownloadInProgress => "download-in-progress",
            Self::NotPersisted => "not-persisted",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error half of a response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: BoundedText,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Refusal>,
    /// When retrying makes sense, after how many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl AsRef<str>) -> Self {
        Self {
            code,
            message: BoundedText::truncate(message),
            reasons: Vec::new(),
            retry_after_secs: None,
        }
    }
}

impl fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if !self.reasons.is_empty() {
            let r: Vec<&str> = self.reasons.iter().map(|r| r.as_str()).collect();
            write!(f, " (reasons: {})", r.join(", "))?;
        }
        if let Some(s) = self.retry_after_secs {
            write!(f, "; retry in {s} s")?;
        }
        Ok(())
    }
}

/// A whole response: `{"ok":true, ...payload}` or `{"ok":false,"error":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<T> {
    Ok(T),
    Err(ErrorBody),
}

#[derive(Serialize, Deserialize)]
struct OkEnvelope<T> {
    ok: bool,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrEnvelope {
    ok: bool,
    error: ErrorBody,
}

impl<T: Serialize> Response<T> {
    /// The response line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let json = match self {
            Self::Ok(body) => serde_json::to_vec(&OkEnvelope { ok: true, body }),
            Self::Err(error) => serde_json::to_vec(&ErrEnvelope {
                ok: false,
                error: error.clone(),
            }),
        };
        // A payload that cannot serialize is a bug; answer `internal` rather
        // than nothing.
        let mut out = json.unwrap_or_else(|e| {
            serde_json::to_vec(&ErrEnvelope {
                ok: false,
                error: ErrorBody::new(ErrorCode::Internal, format!("response serialization: {e}")),
            })
            .unwrap_or_default()
        });
        out.push(b'\n');
        out
    }
}

impl<T: DeserializeOwned> Response<T> {
    /// Parses a response line.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        #[derive(Deserialize)]
        struct Probe {
            ok: bool,
        }
        let value: serde_json::Value = serde_json::from_slice(bytes)?;
        let Probe { ok } = serde_json::from_value(value.clone())?;
        if ok {
            let env: OkEnvelope<T> = serde_json::from_value(value)?;
            Ok(Self::Ok(env.body))
        } else {
            let env: ErrEnvelope = serde_json::from_value(value)?;
            Ok(Self::Err(env.error))
        }
    }
}
