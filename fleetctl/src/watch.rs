//! `fleetctl watch [--heartbeats] [-l SELECTOR]`: follows `fleet-status` and prints one
//! line per change until interrupted (Ctrl-C). Heartbeats are printed only
//! with `--heartbeats`. Every read is bounded; a consumer that goes silent
//! (no message, no heartbeat) or a reconnect is replaced by a new one from
//! the next sequence, so nothing is missed or printed twice.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use fleet_common::contracts::{DeviceInfo, Heartbeat, UpgradeReport, WorkloadsReport};
use fleet_common::subjects::BUCKET_STATUS;
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

/// Runs until the process is interrupted; returns only on a first
/// connection-level failure.
pub fn run(
    conn: &nats::Connection,
    heartbeats: bool,
    selector: Option<&Selector>,
) -> Result<(), CtlError> {
    let filter = format!("$KV.{BUCKET_STATUS}.>");
    let mut matching = Matching::new(conn, selector)?;
    let mut follow = js::follow(conn, BUCKET_STATUS, &filter, None)?;
    eprintln!("watching {BUCKET_STATUS} (Ctrl-C stops)");
    let mut next_seq: Option<u64> = None;
    let stdout = std::io::stdout();
    loop {
        match follow.next(WAIT) {
            Followed::Entry(e) => {
                next_seq = Some(e.seq + 1);
                let device = e.key.split('.').next().unwrap_or_default();
                let printed = line(&e, heartbeats, Timestamp::now());
                if let Some(l) = printed.filter(|_| matching.contains(conn, device)) {
                    let mut out = stdout.lock();
                    if writeln!(out, "{l}").and_then(|()| out.flush()).is_err() {
                        // The reader went away (a closed pipe).
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
        assert!(line(&bad, false, now)
            .expect("a line")
            .starts_with("1970-01-01T00:00:00.000Z dev1 info: unreadable (missing field"));
    }
}
