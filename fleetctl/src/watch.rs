//! `fleetctl watch [--heartbeats] [--no-connections] [-l SELECTOR]`: follows
//! `fleet-status` and prints one line per change until interrupted
//! (Ctrl-C). Heartbeats are printed only with `--heartbeats`. Every read is
//! bounded; a consumer that goes silent (no message, no heartbeat) or a
//! reconnect is replaced by a new one from the next sequence, so nothing is
//! missed or printed twice.
//!
//! Beside the status changes, each device connection the cluster opens or
//! closes is a line (its connect and disconnect events, exported to `FLEET`
//! by the generated server config: docs/design/presence.md), unless
//! `--no-connections`. A server config without presence gives none.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use fleet_common::contracts::{DeviceInfo, Heartbeat, UpgradeReport, WorkloadsReport};
use fleet_common::presence::{connection_event, ConnectionEvent};
use fleet_common::subjects::{BUCKET_STATUS, PRESENCE_EVENTS_PREFIX, SYS_DEVICES_EVENTS};
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::fleet::Keys;
use crate::js::{self, Followed, KvEntry};
use crate::labels;
use crate::selector::Selector;

/// Longest single wait for a change.
const WAIT: Duration = Duration::from_secs(1);
/// Pause before making a new consumer after one was lost.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// The line for one change; `None` for a heartbeat without `--heartbeats`.
pub fn line(e: &KvEntry, heartbeats: bool, now: Timestamp) -> Option<String> {
    let (device, key) = e.key.split_once('.')?;
    let Some(value) = &e.value else {
        return Some(format!("{now} {device} {key}: deleted"));
    };
    let unreadable = |err: serde_json::Error| format!("unreadable ({err})");
    let what = match key {
        "info" => serde_json::from_slice::<DeviceInfo>(value).map_or_else(unreadable, |i| {
            format!(
                "agent {} ({}), {}",
                i.agent_version,
                i.arch,
                i.config_state.state.name()
            )
        }),
        "upgrade" => {
            serde_json::from_slice::<UpgradeReport>(value).map_or_else(unreadable, |report| {
                match report {
                    UpgradeReport::Attempt(u) => {
                        let reason = u.reason.map(|r| format!(" ({r})")).unwrap_or_default();
                        let mut s = format!(
                            "{}{reason} to {}, attempt {}",
                            u.phase, u.target_version, u.attempt_uuid
                        );
                        if let Some(err) = &u.error {
                            s.push_str(&format!("; error: {err}"));
                        }
                        s
                    }
                    UpgradeReport::RefusedIntent(r) => {
                        let mut s = crate::status::refused_intent_summary(&r);
                        for f in r.fields.iter() {
                            s.push_str(&format!("; {} \"{}\"", f.field, f.excerpt));
                        }
                        s.push_str(&format!("; error: {}", r.error));
                        s
                    }
                }
            })
        }
        "workloads" => {
            serde_json::from_slice::<WorkloadsReport>(value).map_or_else(unreadable, |w| {
                let (ready, total) = w.ready();
                format!("{ready}/{total} ready")
            })
        }
        "heartbeat" if !heartbeats => return None,
        "heartbeat" => serde_json::from_slice::<Heartbeat>(value).map_or_else(unreadable, |h| {
            let mut s = format!("up {} s, {}", h.uptime_secs, h.config_state.state.name());
            if let Some(st) = h.stopping {
                s.push_str(&format!(
                    ", stopping (drained in {} ms)",
                    st.drain_duration_ms
                ));
            }
            s
        }),
        _ => format!("{} bytes", value.len()),
    };
    Some(format!("{now} {device} {key}: {what}"))
}

/// The line for a device's connection opened or closed.
pub fn connection_line(e: &ConnectionEvent) -> String {
    if e.connected {
        format!("{} {} connection: online to {}", e.at, e.device, e.server)
    } else if e.reason.is_empty() {
        format!(
            "{} {} connection: offline from {}",
            e.at, e.device, e.server
        )
    } else {
        format!(
            "{} {} connection: offline from {} ({})",
            e.at, e.device, e.server, e.reason
        )
    }
}

/// Runs until the process is interrupted; returns only on a first
/// connection-level failure.
pub fn run(
    conn: &nats::Connection,
    heartbeats: bool,
    connections: bool,
    selector: Option<&Selector>,
) -> Result<(), CtlError> {
    let filter = format!("$KV.{BUCKET_STATUS}.>");
    let mut matching = Matching::new(conn, selector)?;
    let events = if connections {
        let subject = format!("{PRESENCE_EVENTS_PREFIX}.{SYS_DEVICES_EVENTS}");
        Some(
            conn.subscribe(&subject)
                .map_err(CtlError::nats(format!("following {subject}")))?,
        )
    } else {
        None
    };
    let mut follow = js::follow(conn, BUCKET_STATUS, &filter, None)?;
    eprintln!(
        "watching {BUCKET_STATUS}{} (Ctrl-C stops)",
        if connections {
            " and device connections"
        } else {
            ""
        }
    );
    let mut next_seq: Option<u64> = None;
    let stdout = std::io::stdout();
    // False once the reader went away (a closed pipe).
    let print = |l: &str| {
        let mut out = stdout.lock();
        writeln!(out, "{l}").and_then(|()| out.flush()).is_ok()
    };
    loop {
        // Connection events are looked at between status waits (a second
        // at most).
        while let Some(m) = events.as_ref().and_then(nats::Subscription::try_next) {
            let Some(e) = connection_event(&m.subject, &m.data, Timestamp::now()) else {
                continue;
            };
            if matching.contains(conn, e.device.as_str()) && !print(&connection_line(&e)) {
                return Ok(());
            }
        }
        match follow.next(WAIT) {
            Followed::Entry(e) => {
                next_seq = Some(e.seq + 1);
                let device = e.key.split('.').next().unwrap_or_default();
                let printed = line(&e, heartbeats, Timestamp::now());
                if let Some(l) = printed.filter(|_| matching.contains(conn, device)) {
                    if !print(&l) {
                        return Ok(());
                    }
                }
            }
            Followed::Quiet => {}
            Followed::Lost => loop {
                eprintln!("the watch consumer went silent; following again");
                std::thread::sleep(RETRY_DELAY);
                match js::follow(conn, BUCKET_STATUS, &filter, next_seq) {
                    Ok(f) => {
                        follow = f;
                        break;
                    }
                    Err(e) => eprintln!("fleetctl watch: {e}; retrying"),
                }
            },
        }
    }
}

/// The devices a selector matches, read again every [`RESELECT`] and, at
/// most once a second, when a device not among them changes (labels and
/// facts change: a device joins the group).
struct Matching<'a> {
    selector: Option<&'a Selector>,
    devices: BTreeSet<String>,
    read_at: Instant,
}

const RESELECT: Duration = Duration::from_secs(10);

impl<'a> Matching<'a> {
    fn new(conn: &nats::Connection, selector: Option<&'a Selector>) -> Result<Self, CtlError> {
        let mut m = Matching {
            selector,
            devices: BTreeSet::new(),
            read_at: Instant::now(),
        };
        m.read(conn)?;
        Ok(m)
    }

    fn read(&mut self, conn: &nats::Connection) -> Result<(), CtlError> {
        if self.selector.is_some() {
            self.devices = labels::select(conn, self.selector, Keys::Upgrade)?
                .into_iter()
                .map(|d| d.view.id.to_string())
                .collect();
        }
        self.read_at = Instant::now();
        Ok(())
    }

    fn contains(&mut self, conn: &nats::Connection, device: &str) -> bool {
        if self.selector.is_none() {
            return true;
        }
        if self.read_at.elapsed() > RESELECT || !self.devices.contains(device) {
            // A device unknown so far may have joined; at most once per second.
            if self.read_at.elapsed() > Duration::from_secs(1) {
                if let Err(e) = self.read(conn) {
                    eprintln!("fleetctl watch: {e}; using the devices matched before");
                }
            }
        }
        self.devices.contains(device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_only_when_asked_and_deletes_are_said() {
        let now = Timestamp::from_unix_millis(0);
        let hb = KvEntry {
            key: "dev1.heartbeat".into(),
            seq: 3,
            value: Some(br#"{"at":"2026-11-29T13:44:31.000Z","uptime-secs":30,"agent-version":"1.0","config-state":{"state":"configured"}}"#.to_vec()),
        };
        assert_eq!(line(&hb, false, now), None);
        assert_eq!(
            line(&hb, true, now).as_deref(),
            Some("1970-01-01T00:00:00.000Z dev1 heartbeat: up 30 s, configured")
        );
        let gone = KvEntry {
            key: "dev1.upgrade".into(),
            seq: 4,
            value: None,
        };
        assert_eq!(
            line(&gone, false, now).as_deref(),
            Some("1970-01-01T00:00:00.000Z dev1 upgrade: deleted")
        );
        let bad = KvEntry {
            key: "dev1.info".into(),
            seq: 5,
            value: Some(b"{}".to_vec()),
        };
        let online = ConnectionEvent {
            device: fleet_common::validate::DeviceId::parse("dev1").expect("id"),
            connected: true,
            at: now,
            server: "n0".into(),
            reason: String::new(),
        };
        assert_eq!(
            connection_line(&online),
            "1970-01-01T00:00:00.000Z dev1 connection: online to n0"
        );
        let stale = ConnectionEvent {
            connected: false,
            reason: "Stale Connection".into(),
            ..online
        };
        assert_eq!(
            connection_line(&stale),
            "1970-01-01T00:00:00.000Z dev1 connection: offline from n0 (Stale Connection)"
        );
        assert!(line(&bad, false, now)
            .expect("a line")
            .starts_with("1970-01-01T00:00:00.000Z dev1 info: unreadable (missing field"));
    }
}
