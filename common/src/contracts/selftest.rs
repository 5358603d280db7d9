//! `SelfTestReport`: what `fleet-agent --self-test` prints on stdout, one
//! JSON line. The updater reads `version` to check the candidate's compiled
//! version against the attempt's target, and keeps `failed-step` and the
//! step details for its status. The process exit code names the failed
//! step too (see `fleet-agent --help`).

use serde::{Deserialize, Serialize};

use crate::validate::{BoundedText, Version};

/// One probe step and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SelfTestStep {
    /// `config`, `podman`, `nats-auth`, `buckets`, `device-keys`,
    /// `desired-consumer`, `updater-socket`, `snapshot`.
    pub step: String,
    pub ok: bool,
    pub detail: BoundedText,
    pub duration_ms: u64,
}

/// The whole probe outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SelfTestReport {
    /// The compiled version of the probed binary.
    pub version: Version,
    pub ok: bool,
    /// The steps run, in order; the last one failed when `ok` is false.
    pub steps: Vec<SelfTestStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
}
