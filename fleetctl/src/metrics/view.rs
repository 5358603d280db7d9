//! The exporter's view of the fleet: per device, only what a series
//! needs, kept from the changes of `fleet-status` and the labels of
//! `fleet-operator` as [`View::apply_status`] and [`View::apply_label`]
//! receive them; the rollouts as last read ([`View::set_rollouts`]).
//!
//! A value that fails to parse leaves what was known of the device
//! untouched except that key's part, which is cleared and counted under
//! its kind ([`View::unreadable`]); nothing else is dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fleet_common::contracts::{
    DeviceInfo, DeviceLabels, HealthReport, Heartbeat, RolloutState, TrafficReport, UpgradePhase,
    UpgradeReason, UpgradeReport, WorkloadsReport,
};
use fleet_common::presence::Connection;
use fleet_common::subjects::{StatusKey, LABELS_PREFIX};
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;

use crate::js::KvEntry;

/// The upgrade part of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    Attempt {
        phase: UpgradePhase,
        reason: Option<UpgradeReason>,
        target_version: String,
    },
    /// An intent refused without a valid attempt identity.
    RefusedIntent { reason: UpgradeReason },
}

/// One workload on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadHealth {
    pub health: &'static str,
    pub reverted: bool,
}

/// A device's connection as the cluster's presence last said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Online,
    /// Every server answered and none has it: since when, at best.
    Offline {
        last_seen: Option<Timestamp>,
    },
    /// A server did not answer completely: it may be there.
    Unknown,
}

/// One device, as far as the series need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceState {
    pub agent_version: Option<String>,
    pub arch: Option<&'static str>,
    pub config_state: Option<&'static str>,
    /// When the change freeze started, while frozen.
    pub frozen_since: Option<Timestamp>,
    /// The last heartbeat's time and whether it was the last of a run.
    pub heartbeat: Option<(Timestamp, bool)>,
    /// How old that heartbeat may be for its agent's version
    /// ([`crate::fleet::stale_after`]).
    pub stale_after: std::time::Duration,
    /// What the cluster says of its connection, when it gives presence
    /// (docs/design/presence.md).
    pub presence: Option<Presence>,
    pub upgrade: Option<Upgrade>,
    /// Workload name to its observed state.
    pub workloads: BTreeMap<String, &'static str>,
    pub health: BTreeMap<String, WorkloadHealth>,
    /// Bytes sent and received on the last whole UTC day (yesterday).
    pub traffic_day: Option<(u64, u64)>,
    /// Values of the `--group-by` labels, in the order asked for.
    pub groups: Vec<String>,
    /// Status keys whose last value did not parse.
    pub unreadable: BTreeSet<&'static str>,
}

/// The fleet as the exporter knows it.
#[derive(Debug, Default)]
pub struct View {
    /// The label keys series are grouped by (`--group-by`).
    pub group_by: Vec<String>,
    pub devices: HashMap<String, DeviceState>,
    /// Label values of devices not (yet) in `devices`.
    labels: HashMap<String, Vec<String>>,
    /// Label values that did not parse, by device.
    pub unreadable_labels: BTreeSet<String>,
    pub rollouts: Vec<RolloutState>,
    /// Rollout keys whose value is not a rollout state.
    pub unreadable_rollouts: usize,
    /// Changes applied since the start.
    pub updates: u64,
}

/// The kinds a `..._unreadable` series counts, in its order.
pub const UNREADABLE_KINDS: [&str; 8] = [
    "info",
    "heartbeat",
    "upgrade",
    "workloads",
    "health",
    "traffic",
    "labels",
    "rollout",
];

fn kind(key: StatusKey) -> &'static str {
    key.as_str()
}

impl View {
    /// The devices known and the best time each was last there (its last
    /// heartbeat), for a presence read.
    pub fn presence_query(&self) -> Vec<(DeviceId, Option<Timestamp>)> {
        self.devices
            .iter()
            .filter_map(|(id, d)| Some((DeviceId::parse(id).ok()?, d.heartbeat.map(|(at, _)| at))))
            .collect()
    }

    /// Sets what the cluster says of each device's connection (`None`:
    /// it gives no presence, or could not be asked: the heartbeat rule
    /// alone judges).
    pub fn set_presence(&mut self, read: Option<&BTreeMap<DeviceId, Connection>>) {
        for (id, d) in &mut self.devices {
            d.presence = read.and_then(|m| {
                let c = m.get(&DeviceId::parse(id).ok()?)?;
                Some(match c {
                    Connection::Online(_) => Presence::Online,
                    Connection::Offline { last_seen } => Presence::Offline {
                        last_seen: Some(*last_seen),
                    },
                    Connection::NeverSeen => Presence::Offline { last_seen: None },
                    Connection::Unknown { .. } => Presence::Unknown,
                })
            });
        }
    }

    pub fn new(group_by: Vec<String>) -> Self {
        Self {
            group_by,
            ..Self::default()
        }
    }

    /// One change of `fleet-status` (`<device>.<key>`).
    pub fn apply_status(&mut self, e: &KvEntry) {
        self.updates += 1;
        let Some((device, key)) = e.key.split_once('.') else {
            return;
        };
        let Some(key) = StatusKey::ALL.into_iter().find(|k| k.as_str() == key) else {
            return;
        };
        if !self.devices.contains_key(device) {
            let groups = self
                .labels
                .remove(device)
                .unwrap_or_else(|| vec![String::new(); self.group_by.len()]);
            self.devices.insert(
                device.to_owned(),
                DeviceState {
                    groups,
                    ..DeviceState::default()
                },
            );
        }
        let Some(d) = self.devices.get_mut(device) else {
            return;
        };
        let Some(bytes) = e.value.as_deref() else {
            clear(d, key);
            d.unreadable.remove(kind(key));
            return;
        };
        if set(d, key, bytes) {
            d.unreadable.remove(kind(key));
        } else {
            clear(d, key);
            d.unreadable.insert(kind(key));
        }
    }

    /// One change of `fleet-operator` under `labels.`.
    pub fn apply_label(&mut self, e: &KvEntry) {
        self.updates += 1;
        let Some(device) = e.key.strip_prefix(&format!("{LABELS_PREFIX}.")) else {
            return;
        };
        let values = match e.value.as_deref().filter(|v| !v.is_empty()) {
            None => {
                self.unreadable_labels.remove(device);
                vec![String::new(); self.group_by.len()]
            }
            Some(bytes) => match DeviceLabels::from_json(bytes) {
                Ok(l) => {
                    self.unreadable_labels.remove(device);
                    self.group_by
                        .iter()
                        .map(|k| l.labels.get(k).cloned().unwrap_or_default())
                        .collect()
                }
                Err(_) => {
                    self.unreadable_labels.insert(device.to_owned());
                    vec![String::new(); self.group_by.len()]
                }
            },
        };
        match self.devices.get_mut(device) {
            Some(d) => d.groups = values,
            None => {
                self.labels.insert(device.to_owned(), values);
            }
        }
    }

    /// The rollouts as last listed, and how many keys were not states.
    pub fn set_rollouts(&mut self, rollouts: Vec<RolloutState>, unreadable: usize) {
        self.rollouts = rollouts;
        self.unreadable_rollouts = unreadable;
    }

    /// Values that failed to parse, by kind ([`UNREADABLE_KINDS`]).
    pub fn unreadable(&self) -> BTreeMap<&'static str, usize> {
        let mut out: BTreeMap<&'static str, usize> =
            UNREADABLE_KINDS.iter().map(|k| (*k, 0)).collect();
        for d in self.devices.values() {
            for k in &d.unreadable {
                *out.entry(k).or_default() += 1;
            }
        }
        *out.entry("labels").or_default() += self.unreadable_labels.len();
        *out.entry("rollout").or_default() += self.unreadable_rollouts;
        out
    }
}

fn clear(d: &mut DeviceState, key: StatusKey) {
    match key {
        StatusKey::Info => {
            d.agent_version = None;
            d.arch = None;
            d.config_state = None;
            d.frozen_since = None;
        }
        StatusKey::Heartbeat => d.heartbeat = None,
        StatusKey::Upgrade => d.upgrade = None,
        StatusKey::Workloads => d.workloads.clear(),
        StatusKey::Health => d.health.clear(),
        StatusKey::Traffic => d.traffic_day = None,
    }
}

/// Sets `key`'s part of `d` from its value; false when it does not parse.
fn set(d: &mut DeviceState, key: StatusKey, bytes: &[u8]) -> bool {
    match key {
        StatusKey::Info => {
            let Ok(i) = serde_json::from_slice::<DeviceInfo>(bytes) else {
                return false;
            };
            d.agent_version = Some(i.agent_version.to_string());
            d.arch = Some(i.arch.as_str());
            d.config_state = Some(i.config_state.state.name());
            d.frozen_since = match &i.config_state.state {
                fleet_common::contracts::ConfigState::Changefreeze(f) => Some(f.since),
                fleet_common::contracts::ConfigState::Configured => None,
            };
        }
        StatusKey::Heartbeat => {
            let Ok(h) = serde_json::from_slice::<Heartbeat>(bytes) else {
                return false;
            };
            d.heartbeat = Some((h.at, h.stopping.is_some()));
            d.stale_after = crate::fleet::stale_after(&h.agent_version);
        }
        StatusKey::Upgrade => {
            let Ok(u) = serde_json::from_slice::<UpgradeReport>(bytes) else {
                return false;
            };
            d.upgrade = Some(match u {
                UpgradeReport::Attempt(s) => Upgrade::Attempt {
                    phase: s.phase,
                    reason: s.reason,
                    target_version: s.target_version.to_string(),
                },
                UpgradeReport::RefusedIntent(r) => Upgrade::RefusedIntent {
                    reason: r.reason.reason(),
                },
            });
        }
        StatusKey::Workloads => {
            let Ok(w) = serde_json::from_slice::<WorkloadsReport>(bytes) else {
                return false;
            };
            d.workloads = w
                .workloads
                .iter()
                .map(|(n, s)| (n.to_string(), s.state.name()))
                .collect();
        }
        StatusKey::Health => {
            let Ok(h) = serde_json::from_slice::<HealthReport>(bytes) else {
                return false;
            };
            d.health = h
                .workloads
                .iter()
                .map(|(n, w)| {
                    (
                        n.to_string(),
                        WorkloadHealth {
                            health: w.health.as_str(),
                            reverted: w.reverted.is_some(),
                        },
                    )
                })
                .collect();
        }
        StatusKey::Traffic => {
            let Ok(t) = serde_json::from_slice::<TrafficReport>(bytes) else {
                return false;
            };
            d.traffic_day = t
                .yesterday
                .map(|y| (y.counters.bytes_sent, y.counters.bytes_received));
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: Option<&str>) -> KvEntry {
        KvEntry {
            key: key.into(),
            seq: 1,
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    const HB: &str = r#"{"at":"2026-11-29T13:44:31.000Z","uptime-secs":30,"agent-version":"1.0","config-state":{"state":"configured"}}"#;

    #[test]
    fn an_unreadable_value_is_counted_by_kind_and_the_rest_is_kept() {
        let mut v = View::new(vec!["site".into()]);
        v.apply_status(&entry("dev1.heartbeat", Some(HB)));
        v.apply_status(&entry("dev1.workloads", Some("{not json")));
        v.apply_status(&entry("dev2.upgrade", Some(r#"{"phase":"bogus"}"#)));
        v.apply_label(&entry(
            "labels.dev1",
            Some(r#"{"labels":{"site":"berlin"}}"#),
        ));
        v.apply_label(&entry("labels.dev3", Some("[]")));
        let d = &v.devices["dev1"];
        assert!(d.heartbeat.is_some());
        assert_eq!(d.groups, vec!["berlin".to_owned()]);
        let u = v.unreadable();
        assert_eq!(u["workloads"], 1);
        assert_eq!(u["upgrade"], 1);
        assert_eq!(u["labels"], 1);
        assert_eq!(u["info"], 0);
        // A readable value again clears the count.
        v.apply_status(&entry("dev1.workloads", None));
        assert_eq!(v.unreadable()["workloads"], 0);
    }

    #[test]
    fn labels_written_before_the_device_reported_are_kept() {
        let mut v = View::new(vec!["site".into()]);
        v.apply_label(&entry("labels.dev9", Some(r#"{"labels":{"site":"oslo"}}"#)));
        v.apply_status(&entry("dev9.heartbeat", Some(HB)));
        assert_eq!(v.devices["dev9"].groups, vec!["oslo".to_owned()]);
    }
}
