//! What fleetctl knows of devices: their `fleet-status` keys and their
//! upgrade intent, read in one pass per bucket ([`crate::js::read_last`])
//! for one device or the whole fleet, sorted by device.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_common::contracts::{
    AgentUpgradeAttempt, DeviceInfo, Heartbeat, RefusedIntent, UpgradeReport, UpgradeStatus,
    WorkloadsReport,
};
use fleet_common::limits::{HEARTBEAT_INTERVAL, KEEPALIVE_INTERVAL};
use fleet_common::subjects::{StatusKey, BUCKET_CONTROL, BUCKET_STATUS, INTENT_KEY};
use fleet_common::validate::{DeviceId, Version};
use fleet_common::Timestamp;
use serde::de::DeserializeOwned;

use fleet_common::presence::Connection;

use crate::error::CtlError;
use crate::js::{self, KvEntry};

/// A heartbeat older than this counts a device whose agent is older than
/// 0.3.0 as unavailable (stale in `status`, unavailable to a staged
/// rollout's budget): such an agent writes one every
/// [`HEARTBEAT_INTERVAL`], so this is three missed.
pub const STALE_HEARTBEAT: Duration = Duration::from_secs(HEARTBEAT_INTERVAL.as_secs() * 3);

/// The same for an agent of 0.3.0 on, which writes its heartbeat only on
/// change and as a keep-alive every [`KEEPALIVE_INTERVAL`] plus a random
/// jitter of up to a tenth of it (agent/src/status.rs): the longest gap
/// between two writes of a healthy idle agent is 1.1 × the keep-alive, and
/// the margin on top is the old rule's three heartbeat intervals (a failed
/// write retried, a loaded device, clock skew). 3600 s × 1.1 + 90 s =
/// 4050 s. An agent configured with a longer `intervals.keepalive-secs`
/// shows stale between its writes: presence from the cluster
/// (docs/design/presence.md) is what tells such a device is there.
pub const STALE_KEEPALIVE: Duration = Duration::from_secs(
    KEEPALIVE_INTERVAL.as_secs() + KEEPALIVE_INTERVAL.as_secs() / 10 + STALE_HEARTBEAT.as_secs(),
);

/// The first agent release that writes its heartbeat only on change and
/// as a slow keep-alive.
const KEEPALIVE_SINCE: (u64, u64, u64) = (0, 3, 0);

/// How old a heartbeat written by agent `version` may be before its device
/// counts as stale. A version that does not start with
/// `MAJOR.MINOR.PATCH` gets the strict (pre-0.3.0) rule: a false "stale"
/// holds a rollout back, a false "fresh" would let it count a dead device
/// as available.
pub fn stale_after(version: &Version) -> Duration {
    match version.release() {
        Some(r) if r >= KEEPALIVE_SINCE => STALE_KEEPALIVE,
        _ => STALE_HEARTBEAT,
    }
}

/// Whether a device's heartbeat says it is not there: none written, the
/// last one of a run (`stopping`), or older than [`stale_after`] its
/// agent's version. The one judgement of heartbeat freshness that
/// `status`, `device status` and the staged rollouts' budget use (when the
/// cluster gives no presence).
pub fn heartbeat_stale(h: Option<&Heartbeat>, now: Timestamp) -> bool {
    h.is_none_or(|h| h.stopping.is_some() || now.since(h.at) > stale_after(&h.agent_version))
}

/// The upgrade intent key of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intent {
    /// The key's last stream sequence (0: never written): a CAS write names it.
    pub seq: u64,
    /// The attempt, when the key holds a valid one.
    pub attempt: Option<AgentUpgradeAttempt>,
    /// The key holds a value (valid or not).
    pub present: bool,
}

/// One device as its keys describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceView {
    pub id: DeviceId,
    pub info: Option<DeviceInfo>,
    pub heartbeat: Option<Heartbeat>,
    /// `<device>.upgrade` when it holds an attempt's status.
    pub upgrade: Option<UpgradeStatus>,
    /// `<device>.upgrade` when it holds an intent the agent refused
    /// without a valid attempt identity.
    pub refused_intent: Option<RefusedIntent>,
    pub workloads: Option<WorkloadsReport>,
    pub intent: Intent,
    /// Keys whose values could not be read, with why.
    pub unreadable: Vec<String>,
    /// Its connection as the cluster sees it; None when the cluster gives
    /// no presence (or it was not read: [`Keys::Upgrade`]).
    pub connection: Option<Connection>,
}

impl DeviceView {
    pub fn new(id: DeviceId) -> Self {
        Self {
            id,
            info: None,
            heartbeat: None,
            upgrade: None,
            refused_intent: None,
            workloads: None,
            intent: Intent::default(),
            unreadable: Vec::new(),
            connection: None,
        }
    }
}

/// Which devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Fleet,
    Device(DeviceId),
}

/// Which status keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// `info`, `heartbeat`, `upgrade`, `workloads`.
    All,
    /// `info` and `upgrade`: what an upgrade decision needs.
    Upgrade,
    /// `info`, `upgrade` and `heartbeat`: a staged rollout's tick.
    Rollout,
}

impl Keys {
    /// Whether presence is read with these keys (not for an upgrade
    /// decision, which does not look at availability).
    fn presence(self) -> bool {
        matches!(self, Keys::All | Keys::Rollout)
    }
}

fn filter(bucket: &str, scope: &Scope, key: &str) -> String {
    match scope {
        Scope::Fleet => format!("$KV.{bucket}.*.{key}"),
        Scope::Device(d) => format!("$KV.{bucket}.{d}.{key}"),
    }
}

/// The devices of `scope` with the `keys` asked for and their intent. A
/// device appears when any of its keys exists; a device of
/// [`Scope::Device`] always appears.
pub fn read(
    conn: &nats::Connection,
    scope: &Scope,
    keys: Keys,
) -> Result<BTreeMap<DeviceId, DeviceView>, CtlError> {
    let mut status: Vec<KvEntry> = Vec::new();
    match keys {
        Keys::All => status.extend(js::read_last(
            conn,
            BUCKET_STATUS,
            &filter(BUCKET_STATUS, scope, ">"),
        )?),
        Keys::Upgrade | Keys::Rollout => {
            let mut wanted = vec![StatusKey::Info, StatusKey::Upgrade];
            if keys == Keys::Rollout {
                wanted.push(StatusKey::Heartbeat);
            }
            for k in wanted {
                status.extend(js::read_last(
                    conn,
                    BUCKET_STATUS,
                    &filter(BUCKET_STATUS, scope, k.as_str()),
                )?);
            }
        }
    }
    let intents = js::read_last(
        conn,
        BUCKET_CONTROL,
        &filter(BUCKET_CONTROL, scope, INTENT_KEY),
    )?;
    let mut devices: BTreeMap<DeviceId, DeviceView> = BTreeMap::new();
    if let Scope::Device(d) = scope {
        devices.insert(d.clone(), DeviceView::new(d.clone()));
    }
    for e in status {
        let Some((id, key)) = split_key(&e.key) else {
            continue;
        };
        let v = devices
            .entry(id.clone())
            .or_insert_with(|| DeviceView::new(id));
        let Some(bytes) = e.value else { continue };
        match key {
            "info" => v.info = parse(&bytes, "info", &mut v.unreadable),
            "heartbeat" => v.heartbeat = parse(&bytes, "heartbeat", &mut v.unreadable),
            "upgrade" => match parse(&bytes, "upgrade", &mut v.unreadable) {
                Some(UpgradeReport::Attempt(s)) => v.upgrade = Some(s),
                Some(UpgradeReport::RefusedIntent(r)) => v.refused_intent = Some(r),
                None => {}
            },
            "workloads" => v.workloads = parse(&bytes, "workloads", &mut v.unreadable),
            _ => {}
        }
    }
    for e in intents {
        let Some((id, _)) = split_key(&e.key) else {
            continue;
        };
        let v = devices
            .entry(id.clone())
            .or_insert_with(|| DeviceView::new(id));
        v.intent.seq = e.seq;
        v.intent.present = e.value.is_some();
        v.intent.attempt = e
            .value
            .and_then(|b| parse(&b, INTENT_KEY, &mut v.unreadable));
    }
    if keys.presence() {
        let presence = crate::presence::read(conn)?;
        let recorded = match scope {
            Scope::Fleet => crate::recorder::read(conn, None),
            Scope::Device(d) => crate::recorder::read(conn, Some(d)),
        };
        for v in devices.values_mut() {
            let seen = last_seen(v).max(recorded.get(&v.id).copied());
            v.connection = presence.connection(&v.id, seen);
        }
    }
    Ok(devices)
}

/// The last status write of a device (heartbeat or info): a lower bound
/// of when it was last there (a recorded disconnect is the exact one).
pub fn last_seen(v: &DeviceView) -> Option<Timestamp> {
    let beat = v.heartbeat.as_ref().map(|h| h.at);
    let info = v.info.as_ref().map(|i| i.updated_at);
    beat.max(info)
}

/// Whether a device counts as not there: by the cluster's presence when
/// there is one (anything but online, `unknown` included: it cannot be
/// counted on), else by its heartbeat ([`heartbeat_stale`]).
pub fn absent(v: &DeviceView, now: Timestamp) -> bool {
    match &v.connection {
        Some(c) => !matches!(c, Connection::Online(_)),
        None => heartbeat_stale(v.heartbeat.as_ref(), now),
    }
}

fn split_key(key: &str) -> Option<(DeviceId, &str)> {
    let (d, k) = key.split_once('.')?;
    Some((DeviceId::parse(d).ok()?, k))
}

fn parse<T: DeserializeOwned>(bytes: &[u8], key: &str, unreadable: &mut Vec<String>) -> Option<T> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            unreadable.push(format!("{key}: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::contracts::{ConfigState, ConfigStateReport, Stopping};

    fn beat(version: &str, at: Timestamp) -> Heartbeat {
        Heartbeat {
            at,
            uptime_secs: 1,
            agent_version: Version::parse(version).expect("version"),
            config_state: ConfigStateReport {
                state: ConfigState::Configured,
                waiting_changes: 0,
                intent_waiting: false,
            },
            stopping: None,
            podman_unreachable: None,
        }
    }

    fn ago(now: Timestamp, secs: u64) -> Timestamp {
        Timestamp::from_unix_millis(now.unix_millis() - secs * 1000)
    }

    #[test]
    fn an_old_agent_is_stale_after_three_missed_heartbeats() {
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        for v in ["0.1.0", "0.2.0", "0.2.9-rc1"] {
            assert!(!heartbeat_stale(Some(&beat(v, ago(now, 90))), now), "{v}");
            assert!(heartbeat_stale(Some(&beat(v, ago(now, 91))), now), "{v}");
        }
    }

    #[test]
    fn an_idle_keepalive_agent_is_fresh_until_its_keepalive_and_margin_pass() {
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        assert_eq!(STALE_KEEPALIVE, Duration::from_secs(4050));
        for v in ["0.3.0", "0.3.0-upgrade-test", "1.4.0+build.1", "0.10.0"] {
            // An idle 0.3 agent's heartbeat is up to 1.1 h old between writes.
            assert!(!heartbeat_stale(Some(&beat(v, ago(now, 3960))), now), "{v}");
            assert!(!heartbeat_stale(Some(&beat(v, ago(now, 4050))), now), "{v}");
            assert!(heartbeat_stale(Some(&beat(v, ago(now, 4051))), now), "{v}");
        }
    }

    #[test]
    fn an_unparseable_version_gets_the_strict_rule() {
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        for v in ["dev", "1.0", "main"] {
            assert_eq!(stale_after(&Version::parse(v).expect("v")), STALE_HEARTBEAT);
            assert!(heartbeat_stale(Some(&beat(v, ago(now, 91))), now), "{v}");
        }
    }

    #[test]
    fn no_heartbeat_or_a_stopping_one_is_stale_at_once() {
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        assert!(heartbeat_stale(None, now));
        let mut b = beat("0.3.0", now);
        b.stopping = Some(Stopping {
            at: now,
            drain_duration_ms: 5,
        });
        assert!(heartbeat_stale(Some(&b), now));
    }

    #[test]
    fn an_idle_keepalive_agent_does_not_count_against_a_rollout_budget() {
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        let mut d = DeviceView::new(DeviceId::parse("dev1").expect("id"));
        d.heartbeat = Some(beat("0.3.0", ago(now, 1800)));
        assert!(!crate::staged::unavailable(&d, now));
        d.heartbeat = Some(beat("0.2.0", ago(now, 1800)));
        assert!(crate::staged::unavailable(&d, now));
    }

    #[test]
    fn presence_decides_absence_and_the_heartbeat_only_without_it() {
        use fleet_common::presence::Online;
        let now = Timestamp::from_unix_millis(1_800_000_000_000);
        let mut d = DeviceView::new(DeviceId::parse("dev1").expect("id"));
        d.heartbeat = Some(beat("0.2.0", ago(now, 1800)));
        assert!(absent(&d, now), "no presence: a stale heartbeat");
        d.connection = Some(Connection::Online(Online {
            server: "n1".to_owned(),
            since: None,
            rtt: None,
        }));
        assert!(!absent(&d, now), "connected, whatever its heartbeat");
        assert!(!crate::staged::unavailable(&d, now));
        d.heartbeat = Some(beat("0.3.0", now));
        for c in [
            Connection::Unknown {
                why: "server n3 did not answer".to_owned(),
            },
            Connection::Offline { last_seen: now },
            Connection::NeverSeen,
        ] {
            d.connection = Some(c.clone());
            assert!(absent(&d, now), "{c:?} with a fresh heartbeat");
        }
    }
}
