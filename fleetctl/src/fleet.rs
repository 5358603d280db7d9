//! What fleetctl knows of devices: their `fleet-status` keys and their
//! upgrade intent, read in one pass per bucket ([`crate::js::read_last`])
//! for one device or the whole fleet, sorted by device.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_common::contracts::{
    AgentUpgradeAttempt, DeviceInfo, Heartbeat, RefusedIntent, UpgradeReport, UpgradeStatus,
    WorkloadsReport,
};
use fleet_common::limits::HEARTBEAT_INTERVAL;
use fleet_common::subjects::{StatusKey, BUCKET_CONTROL, BUCKET_STATUS, INTENT_KEY};
use fleet_common::validate::DeviceId;
use serde::de::DeserializeOwned;

use crate::error::CtlError;
use crate::js::{self, KvEntry};

/// A heartbeat older than this counts the device as unavailable (stale
/// in `status`, unavailable to a staged rollout's budget): three missed.
pub const STALE_HEARTBEAT: Duration = Duration::from_secs(HEARTBEAT_INTERVAL.as_secs() * 3);

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
    Ok(devices)
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
