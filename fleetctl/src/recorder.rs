//! `fleetctl presence record`: keeps each device's last-seen across server
//! restarts and for every fleetctl, from the cluster's disconnect events
//! (docs/design/presence.md "Last seen").
//!
//! Steps: subscribe to `$SYS.ACCOUNT.DEVICES.DISCONNECT` as imported into
//! `FLEET`; keep the newest last-seen per device in memory; every `batch`
//! write each changed device's `presence.<device>` in `fleet-operator`
//! once (a device that flaps a hundred times in a batch costs one write);
//! on SIGTERM or SIGINT write what is pending and stop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_common::presence::{disconnect_event, LastSeen};
use fleet_common::subjects::{BUCKET_OPERATOR, LAST_SEEN_PREFIX, PRESENCE_EVENTS_PREFIX};
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::js;

/// How often the loop looks at the stop flag while no event comes.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// The key of a device's last-seen in `fleet-operator`.
pub fn key(device: &DeviceId) -> String {
    format!("{LAST_SEEN_PREFIX}.{device}")
}

/// Records until `stop` is set; returns the number of writes.
pub fn run(
    conn: &nats::Connection,
    batch: Duration,
    stop: &Arc<AtomicBool>,
) -> Result<u64, CtlError> {
    let subject = format!("{PRESENCE_EVENTS_PREFIX}.$SYS.ACCOUNT.DEVICES.DISCONNECT");
    let what = || format!("recording last-seen from {subject}");
    let sub = conn.subscribe(&subject).map_err(CtlError::nats(what()))?;
    let kv = js::kv(conn, BUCKET_OPERATOR)?;
    conn.flush().map_err(CtlError::nats(what()))?;
    eprintln!(
        "recording last-seen into {BUCKET_OPERATOR} {LAST_SEEN_PREFIX}.<device> every {} s (Ctrl-C stops)",
        batch.as_secs()
    );
    let mut pending: BTreeMap<DeviceId, LastSeen> = BTreeMap::new();
    let mut flush_at = Instant::now() + batch;
    let mut written = 0u64;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if stopping || Instant::now() >= flush_at {
            for (device, seen) in std::mem::take(&mut pending) {
                let body = serde_json::to_vec(&seen).map_err(|e| CtlError::Input(e.to_string()))?;
                kv.put(&key(&device), body)
                    .map_err(CtlError::nats(format!("writing {}", key(&device))))?;
                written += 1;
            }
            flush_at = Instant::now() + batch;
            if stopping {
                return Ok(written);
            }
        }
        let wait = flush_at
            .saturating_duration_since(Instant::now())
            .min(STOP_CHECK);
        if let Ok(m) = sub.next_timeout(wait) {
            if let Some((device, seen)) = disconnect_event(&m.data, Timestamp::now()) {
                let newer = pending.get(&device).is_none_or(|old| seen.at >= old.at);
                if newer {
                    pending.insert(device, seen);
                }
            }
        }
    }
}

/// Every recorded last-seen (none when the bucket or the keys do not
/// exist, or cannot be read: last-seen is a refinement, never a reason for
/// `status` to fail).
pub fn read(conn: &nats::Connection, device: Option<&DeviceId>) -> BTreeMap<DeviceId, Timestamp> {
    let filter = match device {
        Some(d) => format!("$KV.{BUCKET_OPERATOR}.{}", key(d)),
        None => format!("$KV.{BUCKET_OPERATOR}.{LAST_SEEN_PREFIX}.*"),
    };
    let Ok(entries) = js::read_last(conn, BUCKET_OPERATOR, &filter) else {
        return BTreeMap::new();
    };
    entries
        .into_iter()
        .filter_map(|e| {
            let id = e
                .key
                .strip_prefix(&format!("{LAST_SEEN_PREFIX}."))
                .and_then(|d| DeviceId::parse(d).ok())?;
            let seen: LastSeen = serde_json::from_slice(&e.value?).ok()?;
            Some((id, seen.at))
        })
        .collect()
}
