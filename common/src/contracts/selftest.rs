//! `SelfTestReport`: what `fleet-agent --self-test --config PATH` prints on
//! stdout, one JSON object, read by the updater's probe
//! (`docs/design/upgrade.md` "Preparation and probe").
//!
//! The updater is never self-updated, so it must read the reports of agents
//! newer than itself: unknown fields are accepted here, unlike every other
//! contract. Only `version` is required.

use serde::{Deserialize, Serialize};

use super::bounded::Bounded;
use crate::limits::MAX_SELF_TEST_CHECKS;
use crate::validate::{BoundedText, Version};

/// The candidate's own account of its probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SelfTestReport {
    /// The version compiled into the candidate; the probe requires it to
    /// equal the attempt's target version.
    pub version: Version,
    /// The steps the probe took (config, podman, nats, buckets, consumer,
    /// updater socket, snapshot), in order. On failure the agent exits
    /// non-zero and the failing checks say why.
    #[serde(default, skip_serializing_if = "Bounded::is_empty")]
    pub checks: Bounded<SelfTestCheck, MAX_SELF_TEST_CHECKS>,
}

/// One probe step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SelfTestCheck {
    pub name: BoundedText,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
}

impl SelfTestReport {
    /// The names and details of the failed checks, for an error message.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| match &c.detail {
                Some(d) => format!("{}: {d}", c.name),
                None => c.name.to_string(),
            })
            .collect()
    }
}
