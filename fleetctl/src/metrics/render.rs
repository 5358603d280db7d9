//! `/metrics` in the Prometheus text format (version 0.0.4), from the
//! view: aggregates by a bounded set of label values, and per-device
//! series only where a person must act (`rollback-failed`, offline past
//! the bound, over the traffic budget). Every series carries the
//! `--group-by` labels as `label_<key>`.

use std::collections::HashMap;
use std::fmt::Write;
use std::hash::Hash;
use std::time::Duration;

use fleet_common::contracts::{RolloutPhase, UpgradePhase, UpgradeReason};
use fleet_common::Timestamp;

use super::view::Presence;
use super::view::{DeviceState, Upgrade, View};
use super::{connection_state, Connection};

/// The metric name prefix.
pub const PREFIX: &str = "harmony_fleet";

/// What the exporter knows of its own view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ViewStatus {
    /// NATS is not answering the exporter's consumer: the values are the
    /// last view.
    pub stale: bool,
    /// Since the exporter last heard from NATS.
    pub age: Duration,
    /// The first replay of the status bucket has ended.
    pub complete: bool,
    /// From the start to the first complete view.
    pub first_view: Option<Duration>,
}

/// The bounds past which a device gets a series of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// A device not connected longer than this.
    pub offline_after: Duration,
    /// Bytes a day (sent and received) above which a device is over budget.
    pub traffic_budget_per_day: u64,
}

/// Histogram bounds of a device's bytes a day: powers of four around the
/// budget (5 MiB a month is about 175 KiB a day).
const TRAFFIC_BUCKETS: [u64; 7] = [
    16_384, 65_536, 262_144, 1_048_576, 4_194_304, 16_777_216, 67_108_864,
];

/// One metric family being written.
struct Out {
    text: String,
    group_keys: Vec<String>,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {PREFIX}_{name} {help}");
        let _ = writeln!(self.text, "# TYPE {PREFIX}_{name} {kind}");
    }

    /// A sample: `labels` then the group labels (`groups`, in the order of
    /// `--group-by`).
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], groups: &[String], value: f64) {
        let _ = write!(self.text, "{PREFIX}_{name}");
        let mut first = true;
        let group_pairs = self.group_keys.iter().zip(groups);
        let mut put = |text: &mut String, k: &str, v: &str| {
            text.push(if first { '{' } else { ',' });
            first = false;
            let _ = write!(text, "{k}=\"{}\"", escape(v));
        };
        for (k, v) in labels {
            put(&mut self.text, k, v);
        }
        for (k, v) in group_pairs {
            put(&mut self.text, k, v);
        }
        if !first {
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// A label value as the text format writes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A label key as a Prometheus label name: `label_` and the key with
/// every character outside `[a-zA-Z0-9_]` as `_` (`site`: `label_site`).
pub fn group_label_name(key: &str) -> String {
    let mut s = String::from("label_");
    s.extend(
        key.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
    s
}

/// Devices counted by a key and their group values, borrowed from the
/// view: a scrape allocates per series, not per device.
type Counts<'a, K> = HashMap<(K, &'a [String]), u64>;

fn bump<'a, K: Eq + Hash>(m: &mut Counts<'a, K>, k: K, groups: &'a [String], by: u64) {
    *m.entry((k, groups)).or_default() += by;
}

/// A map's entries in key order, as the page lists them.
fn sorted<K: Ord, V>(m: &HashMap<K, V>) -> Vec<(&K, &V)> {
    let mut v: Vec<(&K, &V)> = m.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// The whole page.
pub fn render(view: &View, status: ViewStatus, bounds: Bounds, now: Timestamp) -> String {
    let mut o = Out {
        text: String::new(),
        group_keys: view.group_by.iter().map(|k| group_label_name(k)).collect(),
    };
    let mut devices: Counts<[&str; 4]> = HashMap::new();
    let mut phases: Counts<(&'static str, &str)> = HashMap::new();
    let mut quarantined: Counts<()> = HashMap::new();
    let mut refused: Counts<&'static str> = HashMap::new();
    let mut workloads: Counts<(&str, &'static str)> = HashMap::new();
    let mut health: Counts<(&str, &'static str)> = HashMap::new();
    let mut reverted: Counts<&str> = HashMap::new();
    let mut traffic: Counts<&'static str> = HashMap::new();
    let mut traffic_hist: HashMap<&[String], ([u64; TRAFFIC_BUCKETS.len()], u64, u64)> =
        HashMap::new();
    let mut freeze_oldest: HashMap<&[String], Duration> = HashMap::new();
    let mut rollback_failed: Vec<(&str, &str, &[String])> = Vec::new();
    let mut offline: Vec<(&str, Duration, &[String])> = Vec::new();
    let mut over_budget: Vec<(&str, u64, &[String])> = Vec::new();

    for (id, d) in &view.devices {
        let d: &DeviceState = d;
        let id = id.as_str();
        let g = d.groups.as_slice();
        let conn = connection_state(d.heartbeat, d.stale_after, d.presence, now);
        bump(
            &mut devices,
            [
                d.agent_version.as_deref().unwrap_or_default(),
                d.arch.unwrap_or_default(),
                d.config_state.unwrap_or(""),
                conn.as_str(),
            ],
            g,
            1,
        );
        let last_seen = match d.presence {
            Some(Presence::Offline { last_seen: Some(t) }) => Some(t),
            _ => d.heartbeat.map(|(at, _)| at),
        };
        if let (Connection::Offline | Connection::Stale | Connection::Stopped, Some(at)) =
            (conn, last_seen)
        {
            let since = now.since(at);
            if since > bounds.offline_after {
                offline.push((id, since, g));
            }
        }
        match &d.upgrade {
            Some(Upgrade::Attempt {
                phase,
                reason,
                target_version,
            }) => {
                bump(&mut phases, (phase.as_str(), target_version.as_str()), g, 1);
                if *phase == UpgradePhase::RollbackFailed {
                    rollback_failed.push((id, target_version.as_str(), g));
                }
                if *phase == UpgradePhase::RollbackFailed
                    || *reason == Some(UpgradeReason::Quarantined)
                {
                    bump(&mut quarantined, (), g, 1);
                }
            }
            Some(Upgrade::RefusedIntent { reason }) => bump(&mut refused, reason.as_str(), g, 1),
            None => {}
        }
        for (name, state) in &d.workloads {
            bump(&mut workloads, (name.as_str(), *state), g, 1);
        }
        for (name, h) in &d.health {
            bump(&mut health, (name.as_str(), h.health), g, 1);
            if h.reverted {
                bump(&mut reverted, name.as_str(), g, 1);
            }
        }
        if let Some((sent, received)) = d.traffic_day {
            bump(&mut traffic, "sent", g, sent);
            bump(&mut traffic, "received", g, received);
            let total = sent.saturating_add(received);
            let h = traffic_hist.entry(g).or_default();
            for (i, b) in TRAFFIC_BUCKETS.iter().enumerate() {
                if total <= *b {
                    h.0[i] += 1;
                }
            }
            h.1 += 1;
            h.2 = h.2.saturating_add(total);
            if total > bounds.traffic_budget_per_day {
                over_budget.push((id, total, g));
            }
        }
        if let Some(since) = d.frozen_since {
            let age = now.since(since);
            let e = freeze_oldest.entry(g).or_default();
            *e = (*e).max(age);
        }
    }

    rollback_failed.sort_unstable_by(|a, b| a.0.cmp(b.0));
    offline.sort_unstable_by(|a, b| a.0.cmp(b.0));
    over_budget.sort_unstable_by(|a, b| a.0.cmp(b.0));
    o.family(
        "devices",
        "gauge",
        "Devices by agent version, arch, config state and connection state.",
    );
    for (([v, a, c, s], g), n) in sorted(&devices) {
        o.sample(
            "devices",
            &[
                ("agent_version", v),
                ("arch", a),
                ("config_state", c),
                ("connection", s),
            ],
            g,
            *n as f64,
        );
    }
    o.family(
        "upgrade_devices",
        "gauge",
        "Devices by the phase of their last upgrade attempt and its target version.",
    );
    for (((p, t), g), n) in sorted(&phases) {
        o.sample(
            "upgrade_devices",
            &[("phase", p), ("target_version", t)],
            g,
            *n as f64,
        );
    }
    o.family(
        "upgrade_quarantined_devices",
        "gauge",
        "Devices whose updater refuses attempts until root repair (rollback-failed or quarantined).",
    );
    for (((), g), n) in sorted(&quarantined) {
        o.sample("upgrade_quarantined_devices", &[], g, *n as f64);
    }
    o.family(
        "refused_intent_devices",
        "gauge",
        "Devices whose agent refused an upgrade intent without a valid attempt identity, by reason.",
    );
    for ((r, g), n) in sorted(&refused) {
        o.sample("refused_intent_devices", &[("reason", r)], g, *n as f64);
    }
    o.family(
        "device_rollback_failed",
        "gauge",
        "Set to 1 per device in rollback-failed: a person must repair it (updater/REPAIR.md).",
    );
    for (id, t, g) in &rollback_failed {
        o.sample(
            "device_rollback_failed",
            &[("device", id), ("target_version", t)],
            g,
            1.0,
        );
    }
    o.family(
        "device_offline_seconds",
        "gauge",
        "Per device not connected longer than the exporter's --offline-after: seconds since it was last seen.",
    );
    for (id, since, g) in &offline {
        o.sample(
            "device_offline_seconds",
            &[("device", id)],
            g,
            since.as_secs() as f64,
        );
    }
    o.family(
        "device_traffic_over_budget_bytes",
        "gauge",
        "Per device over the traffic budget: its bytes (sent and received) on the last whole UTC day.",
    );
    for (id, total, g) in &over_budget {
        o.sample(
            "device_traffic_over_budget_bytes",
            &[("device", id)],
            g,
            *total as f64,
        );
    }
    o.family(
        "changefreeze_oldest_seconds",
        "gauge",
        "Age of the oldest change freeze among the group's frozen devices.",
    );
    for (g, age) in sorted(&freeze_oldest) {
        o.sample("changefreeze_oldest_seconds", &[], g, age.as_secs() as f64);
    }
    o.family(
        "workloads",
        "gauge",
        "Workloads by name and observed state (one per device running it).",
    );
    for (((w, s), g), n) in sorted(&workloads) {
        o.sample("workloads", &[("workload", w), ("state", s)], g, *n as f64);
    }
    o.family(
        "workload_health",
        "gauge",
        "Workloads by name and health as the device's probes judge it.",
    );
    for (((w, h), g), n) in sorted(&health) {
        o.sample(
            "workload_health",
            &[("workload", w), ("health", h)],
            g,
            *n as f64,
        );
    }
    o.family(
        "workload_reverted",
        "gauge",
        "Workloads the device reverted to their last healthy spec, by name.",
    );
    for ((w, g), n) in sorted(&reverted) {
        o.sample("workload_reverted", &[("workload", w)], g, *n as f64);
    }
    o.family(
        "traffic_day_bytes",
        "gauge",
        "The fleet's bytes on the last whole UTC day, by direction (devices' own counters).",
    );
    for ((dir, g), n) in sorted(&traffic) {
        o.sample("traffic_day_bytes", &[("direction", dir)], g, *n as f64);
    }
    o.family(
        "device_traffic_day_bytes",
        "histogram",
        "Distribution of devices' bytes (sent and received) on the last whole UTC day.",
    );
    for (g, (buckets, count, sum)) in sorted(&traffic_hist) {
        for (b, n) in TRAFFIC_BUCKETS.iter().zip(buckets) {
            let le = b.to_string();
            o.sample(
                "device_traffic_day_bytes_bucket",
                &[("le", &le)],
                g,
                *n as f64,
            );
        }
        o.sample(
            "device_traffic_day_bytes_bucket",
            &[("le", "+Inf")],
            g,
            *count as f64,
        );
        o.sample("device_traffic_day_bytes_sum", &[], g, *sum as f64);
        o.sample("device_traffic_day_bytes_count", &[], g, *count as f64);
    }
    rollouts(&mut o, view);
    o.family(
        "unreadable_values",
        "gauge",
        "Values that failed to parse, by kind (status key, labels, rollout): read with fleetctl device status.",
    );
    for (k, n) in view.unreadable() {
        o.sample("unreadable_values", &[("kind", k)], &[], n as f64);
    }
    o.family(
        "exporter_view_stale",
        "gauge",
        "Set to 1 while NATS does not answer the exporter: every other series is its last view.",
    );
    o.sample(
        "exporter_view_stale",
        &[],
        &[],
        f64::from(u8::from(status.stale)),
    );
    o.family(
        "exporter_view_age_seconds",
        "gauge",
        "Seconds since the exporter last heard from NATS.",
    );
    o.sample(
        "exporter_view_age_seconds",
        &[],
        &[],
        status.age.as_secs_f64(),
    );
    o.family(
        "exporter_view_complete",
        "gauge",
        "Set to 1 once the exporter has read every status key once.",
    );
    o.sample(
        "exporter_view_complete",
        &[],
        &[],
        f64::from(u8::from(status.complete)),
    );
    if let Some(t) = status.first_view {
        o.family(
            "exporter_first_view_seconds",
            "gauge",
            "Seconds from the exporter's start to its first complete view.",
        );
        o.sample("exporter_first_view_seconds", &[], &[], t.as_secs_f64());
    }
    o.family(
        "exporter_updates_total",
        "counter",
        "Status and label changes the exporter applied.",
    );
    o.sample("exporter_updates_total", &[], &[], view.updates as f64);
    o.family(
        "exporter_devices_known",
        "gauge",
        "Devices the exporter's view holds.",
    );
    o.sample(
        "exporter_devices_known",
        &[],
        &[],
        view.devices.len() as f64,
    );
    o.text
}

/// Each rollout's progress: one series per rollout (rollouts are few: an
/// operator starts them).
fn rollouts(o: &mut Out, view: &View) {
    const PHASES: [RolloutPhase; 4] = [
        RolloutPhase::Running,
        RolloutPhase::Halted,
        RolloutPhase::Aborted,
        RolloutPhase::Complete,
    ];
    o.family(
        "rollout_phase",
        "gauge",
        "Set to 1 for each rollout's phase (running, halted, aborted, complete), 0 for the others.",
    );
    for r in &view.rollouts {
        for p in PHASES {
            o.sample(
                "rollout_phase",
                &[
                    ("rollout", &r.id),
                    ("kind", r.kind().as_str()),
                    ("phase", p.as_str()),
                ],
                &[],
                f64::from(u8::from(r.phase == p)),
            );
        }
    }
    let per = |o: &mut Out,
               name: &str,
               help: &str,
               f: &dyn Fn(&fleet_common::contracts::RolloutState) -> u64| {
        o.family(name, "gauge", help);
        for r in &view.rollouts {
            o.sample(
                name,
                &[("rollout", &r.id), ("kind", r.kind().as_str())],
                &[],
                f(r) as f64,
            );
        }
    };
    per(
        o,
        "rollout_batch",
        "The batch under way (1-based), or the last one once ended.",
        &|r| u64::from(r.current_batch) + 1,
    );
    per(
        o,
        "rollout_batches",
        "The rollout's number of batches.",
        &|r| r.batch_ends.len() as u64,
    );
    per(o, "rollout_devices", "Devices the rollout covers.", &|r| {
        r.devices.len() as u64
    });
    per(
        o,
        "rollout_succeeded_devices",
        "Devices that succeeded in the rollout's ended batches.",
        &|r| r.results.iter().map(|b| u64::from(b.succeeded)).sum(),
    );
    per(
        o,
        "rollout_failed_devices",
        "Devices that failed in the rollout's ended batches.",
        &|r| r.results.iter().map(|b| b.failed.len() as u64).sum(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::js::KvEntry;

    #[test]
    fn label_values_are_escaped_and_keys_made_names() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(
            group_label_name("example.com/site-id"),
            "label_example_com_site_id"
        );
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.5), "0.5");
    }

    #[test]
    fn a_rollback_failed_device_has_a_series_of_its_own_and_others_only_counts() {
        let mut v = View::new(vec!["site".into()]);
        let put = |v: &mut View, key: &str, val: &str| {
            v.apply_status(&KvEntry {
                key: key.into(),
                seq: 1,
                value: Some(val.as_bytes().to_vec()),
            })
        };
        let upgrade = |phase: &str| {
            format!(
                r#"{{"phase":"{phase}","attempt-uuid":"0b9a4f53-2f0c-4b8e-9a55-6f6f3f0f6d11","attempt-digest":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","target-version":"2.0","attempt-started-at":"2026-11-29T13:44:31.000Z","phase-changed-at":"2026-11-29T13:44:31.000Z","transitions":[]}}"#
            )
        };
        put(&mut v, "dev1.upgrade", &upgrade("rollback-failed"));
        put(&mut v, "dev2.upgrade", &upgrade("complete"));
        v.apply_label(&KvEntry {
            key: "labels.dev1".into(),
            seq: 1,
            value: Some(br#"{"labels":{"site":"berlin"}}"#.to_vec()),
        });
        let status = ViewStatus {
            stale: false,
            age: Duration::ZERO,
            complete: true,
            first_view: Some(Duration::from_millis(1500)),
        };
        let bounds = Bounds {
            offline_after: Duration::from_secs(300),
            traffic_budget_per_day: 1000,
        };
        let text = render(&v, status, bounds, Timestamp::now());
        assert!(text.contains(
            "harmony_fleet_device_rollback_failed{device=\"dev1\",target_version=\"2.0\",label_site=\"berlin\"} 1\n"
        ), "{text}");
        assert!(!text.contains("device_rollback_failed{device=\"dev2\""));
        assert!(text.contains(
            "harmony_fleet_upgrade_devices{phase=\"complete\",target_version=\"2.0\",label_site=\"\"} 1\n"
        ));
        assert!(
            text.contains("harmony_fleet_upgrade_quarantined_devices{label_site=\"berlin\"} 1\n")
        );
        assert!(text.contains("harmony_fleet_exporter_first_view_seconds 1.5\n"));
        assert!(text.contains("harmony_fleet_unreadable_values{kind=\"upgrade\"} 0\n"));
    }
}
