//! `fleetctl status [--json]`: the fleet as a table — device, agent
//! version, config state, age of the last heartbeat, upgrade phase,
//! workloads ready — read in one pass ([`crate::fleet::read`]); and
//! `fleetctl device status DEVICE`: one device in detail.

use std::fmt::Write;
use std::time::Duration;

use std::collections::BTreeMap;

use fleet_common::contracts::{RefusedIntent, UpgradePhase};
use fleet_common::presence::Connection;
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::fleet::{self, DeviceView, Keys, Scope};
use crate::labels::{self, Device};
use crate::selector::Selector;

/// `12s`, `4m`, `3h`, `2d`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The connection cell: the cluster's presence, or `-` when there is none.
fn connection_cell(d: &DeviceView) -> String {
    d.connection
        .as_ref()
        .map_or_else(|| "-".to_owned(), Connection::cell)
}

/// One row of the table, as text cells.
fn cells(d: &DeviceView, now: Timestamp) -> [String; 7] {
    let dash = || "-".to_owned();
    let heartbeat = d.heartbeat.as_ref().map_or_else(dash, |h| {
        let a = age(now.since(h.at));
        if h.stopping.is_some() {
            format!("{a} (stopped)")
        } else {
            a
        }
    });
    let upgrade = match (&d.upgrade, &d.refused_intent) {
        (Some(u), _) => {
            let reason = u.reason.map(|r| format!(" ({r})")).unwrap_or_default();
            format!("{}{reason} {}", u.phase, u.target_version)
        }
        (None, Some(r)) => format!("failed ({}) intent: {}", r.reason.reason(), r.rule),
        (None, None) => dash(),
    };
    [
        d.id.to_string(),
        connection_cell(d),
        d.info
            .as_ref()
            .map_or_else(dash, |i| i.agent_version.to_string()),
        d.info
            .as_ref()
            .map_or_else(dash, |i| i.config_state.state.name().to_owned()),
        heartbeat,
        upgrade,
        d.workloads.as_ref().map_or_else(dash, |w| {
            let (ready, total) = w.ready();
            format!("{ready}/{total}")
        }),
    ]
}

/// The table, columns aligned.
pub fn render_table(devices: &[&DeviceView], now: Timestamp) -> String {
    let header = [
        "DEVICE",
        "CONNECTION",
        "AGENT",
        "CONFIG",
        "HEARTBEAT",
        "UPGRADE",
        "WORKLOADS",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 7]> = std::iter::once(header)
        .chain(devices.iter().map(|d| cells(d, now)))
        .collect();
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, (c, w)) in r.iter().zip(widths).enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    // Why some are unknown, once: a server that did not say.
    let mut gaps: Vec<&str> = devices
        .iter()
        .filter_map(|d| match &d.connection {
            Some(Connection::Unknown { why }) => Some(why.as_str()),
            _ => None,
        })
        .collect();
    gaps.sort_unstable();
    gaps.dedup();
    for g in gaps {
        let _ = writeln!(out, "connection unknown: {g}");
    }
    out
}

/// One device as JSON for scripts.
pub fn json_row(d: &DeviceView, now: Timestamp) -> serde_json::Value {
    serde_json::json!({
        "device": d.id,
        "connection": d.connection.as_ref().map(Connection::name),
        "connected": match &d.connection {
            Some(Connection::Online(o)) => serde_json::to_value(o).ok(),
            _ => None,
        },
        "offline-since": match &d.connection {
            Some(Connection::Offline { last_seen }) => Some(*last_seen),
            _ => None,
        },
        "connection-unknown": match &d.connection {
            Some(Connection::Unknown { why }) => Some(why.as_str()),
            _ => None,
        },
        "agent-version": d.info.as_ref().map(|i| i.agent_version.clone()),
        "arch": d.info.as_ref().map(|i| i.arch),
        "config-state": d.info.as_ref().map(|i| i.config_state.state.name()),
        "heartbeat-at": d.heartbeat.as_ref().map(|h| h.at),
        "heartbeat-age-secs": d.heartbeat.as_ref().map(|h| now.since(h.at).as_secs()),
        "stopped": d.heartbeat.as_ref().is_some_and(|h| h.stopping.is_some()),
        "upgrade": match (&d.upgrade, &d.refused_intent) {
            (Some(u), _) => Some(serde_json::json!({
                "phase": u.phase,
                "reason": u.reason,
                "target-version": u.target_version,
                "attempt-uuid": u.attempt_uuid,
                "error": u.error,
            })),
            (None, Some(r)) => Some(serde_json::json!({
                "phase": "failed",
                "reason": r.reason.reason(),
                "target-version": null,
                "attempt-uuid": null,
                "error": r.error,
                "refused-intent": r,
            })),
            (None, None) => None,
        },
        "workloads-ready": d.workloads.as_ref().map(|w| w.ready().0),
        "workloads-total": d.workloads.as_ref().map(|w| w.ready().1),
        "unreadable": d.unreadable,
    })
}

/// One group's summary line: devices, agent versions, upgrading, failed,
/// frozen, stale heartbeats.
pub fn group_line(group: &str, devices: &[&Device], now: Timestamp) -> String {
    let mut versions: BTreeMap<String, usize> = BTreeMap::new();
    let (mut upgrading, mut failed, mut frozen, mut stale) = (0usize, 0usize, 0usize, 0usize);
    for d in devices {
        let v = &d.view;
        *versions
            .entry(
                v.info
                    .as_ref()
                    .map_or("unknown".to_owned(), |i| i.agent_version.to_string()),
            )
            .or_default() += 1;
        match v.upgrade.as_ref().map(|u| u.phase) {
            Some(UpgradePhase::Failed | UpgradePhase::RollbackFailed) => failed += 1,
            Some(p) if !p.is_terminal() => upgrading += 1,
            _ => {}
        }
        if v.info
            .as_ref()
            .is_some_and(|i| i.config_state.state.is_frozen())
        {
            frozen += 1;
        }
        if fleet::heartbeat_stale(v.heartbeat.as_ref(), now) {
            stale += 1;
        }
    }
    let versions: Vec<String> = versions.iter().map(|(v, n)| format!("{v} ({n})")).collect();
    format!(
        "{group}: {} devices, agents {}, {upgrading} upgrading, {failed} failed, {frozen} frozen, {stale} stale heartbeats",
        devices.len(),
        versions.join(" "),
    )
}

/// `fleetctl status [-l SELECTOR] [--group-by LABEL] [--json]`.
pub fn run(
    conn: &nats::Connection,
    json: bool,
    selector: Option<&Selector>,
    group_by: Option<&str>,
) -> Result<String, CtlError> {
    let selected = labels::select(conn, selector, Keys::All)?;
    let now = Timestamp::now();
    let list: Vec<&DeviceView> = selected.iter().map(|d| &d.view).collect();
    if let Some(label) = group_by {
        let mut groups: BTreeMap<String, Vec<&Device>> = BTreeMap::new();
        for d in &selected {
            let g = match d.labels.get(label) {
                Some(v) => format!("{label}={v}"),
                None => format!("no {label}"),
            };
            groups.entry(g).or_default().push(d);
        }
        if json {
            let rows: Vec<serde_json::Value> = groups
                .iter()
                .map(|(g, ds)| {
                    serde_json::json!({
                        "group": g,
                        "summary": group_line(g, ds, now),
                        "devices": ds.iter().map(|d| json_row(&d.view, now)).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let mut s = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
            s.push('\n');
            return Ok(s);
        }
        let mut out = if list.is_empty() {
            "no device matches\n".to_owned()
        } else {
            render_table(&list, now)
        };
        for (g, ds) in &groups {
            let _ = writeln!(out, "{}", group_line(g, ds, now));
        }
        return Ok(out);
    }
    if json {
        let rows: Vec<serde_json::Value> = list.iter().map(|d| json_row(d, now)).collect();
        let mut s = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        s.push('\n');
        return Ok(s);
    }
    if list.is_empty() && selector.is_some() {
        return Ok("no device matches\n".to_owned());
    }
    if list.is_empty() {
        return Ok("no device has reported yet\n".to_owned());
    }
    Ok(render_table(&list, now))
}

/// `fleetctl device status DEVICE`.
pub fn device(conn: &nats::Connection, device: &str) -> Result<String, CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let devices = fleet::read(conn, &Scope::Device(d.clone()), Keys::All)?;
    let v = devices
        .get(&d)
        .cloned()
        .unwrap_or_else(|| DeviceView::new(d.clone()));
    let mut out = String::new();
    match &v.info {
        Some(i) => {
            let _ = writeln!(
                out,
                "device {}: agent {} ({}), {}, kernel {}, podman {}, {}",
                i.device_id,
                i.agent_version,
                i.arch,
                i.os,
                i.kernel,
                i.podman_version.as_ref().map_or("disabled", |v| v.as_str()),
                i.config_state.state.name()
            );
        }
        None => {
            let _ = writeln!(out, "device {d}: no device info yet");
        }
    }
    let _ = writeln!(
        out,
        "connection: {}",
        connection_detail(v.connection.as_ref())
    );
    if let Some(h) = &v.heartbeat {
        let _ = write!(out, "heartbeat {} (up {} s)", h.at, h.uptime_secs);
        if let Some(s) = &h.stopping {
            let _ = write!(
                out,
                ", stopped at {} after draining {} ms",
                s.at, s.drain_duration_ms
            );
        }
        out.push('\n');
    }
    if let Some(u) = &v.upgrade {
        let reason = u.reason.map(|r| format!(" ({r})")).unwrap_or_default();
        let _ = writeln!(
            out,
            "upgrade: {}{reason} to {}, attempt {} since {}",
            u.phase, u.target_version, u.attempt_uuid, u.phase_changed_at
        );
        if let Some(e) = &u.error {
            let _ = writeln!(out, "  error: {e}");
        }
    } else if let Some(r) = &v.refused_intent {
        let _ = writeln!(out, "upgrade: {}", refused_intent_summary(r));
        for f in r.fields.iter() {
            let _ = writeln!(
                out,
                "  field {}: \"{}\" ({} characters)",
                f.field, f.excerpt, f.chars
            );
        }
        let _ = writeln!(out, "  error: {}", r.error);
    }
    match &v.workloads {
        Some(r) => {
            let (running, total) = r.ready();
            let _ = writeln!(
                out,
                "workloads: {running}/{total} running (observed {})",
                r.observed_at
            );
            for (name, w) in &r.workloads {
                let _ = writeln!(
                    out,
                    "  {name}: {}, image {}, container {}, restarts {}{}",
                    w.state.name(),
                    w.image,
                    w.container_id.as_deref().unwrap_or("-"),
                    w.restarts,
                    w.last_error
                        .as_ref()
                        .map(|e| format!(", last error: {e}"))
                        .unwrap_or_default()
                );
            }
        }
        None => out.push_str("workloads: none reported yet\n"),
    }
    for u in &v.unreadable {
        let _ = writeln!(out, "unreadable: {u}");
    }
    Ok(out)
}

/// The `device status` line of a connection.
fn connection_detail(c: Option<&Connection>) -> String {
    match c {
        Some(Connection::Online(o)) => format!(
            "online to server {}{}{}",
            o.server,
            o.since.map(|t| format!(" since {t}")).unwrap_or_default(),
            o.rtt
                .as_ref()
                .map(|r| format!(", rtt {r}"))
                .unwrap_or_default()
        ),
        Some(Connection::Offline { last_seen }) => {
            format!("offline since {last_seen} (its last status write)")
        }
        Some(Connection::NeverSeen) => "never seen".to_owned(),
        Some(Connection::Unknown { why }) => format!("unknown ({why})"),
        None => "- (the cluster gives no presence: judged by heartbeat)".to_owned(),
    }
}

/// One line for an intent the agent refused without a valid attempt
/// identity: which value, the rule, when. (Excerpts are escaped ASCII.)
pub fn refused_intent_summary(r: &RefusedIntent) -> String {
    let which = match r.intent.sequence {
        Some(seq) => format!("sequence {seq}"),
        None => format!("digest {}", r.intent.digest),
    };
    let uuid = r
        .intent
        .uuid
        .map(|u| format!(", attempt {u}"))
        .unwrap_or_default();
    format!(
        "failed ({}): the intent at {which} ({} bytes{uuid}) was refused ({}) at {}; it was not sent to the updater",
        r.reason.reason(),
        r.intent.bytes,
        r.rule,
        r.refused_at
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_an_empty_table() {
        assert_eq!(age(Duration::from_secs(5)), "5s");
        assert_eq!(age(Duration::from_secs(125)), "2m");
        assert_eq!(age(Duration::from_secs(7300)), "2h");
        assert_eq!(age(Duration::from_secs(200_000)), "2d");
        let d = DeviceView::new(DeviceId::parse("dev1").expect("id"));
        assert_eq!(
            render_table(&[&d], Timestamp::now()),
            "DEVICE  CONNECTION  AGENT  CONFIG  HEARTBEAT  UPGRADE  WORKLOADS\ndev1    -           -      -       -          -        -\n"
        );
    }
}
