//! Desired state: the `fleet-desired` keys of this device, validated.
//!
//! A [`Watcher`] on `fleet-desired` yields raw snapshots and deltas; this
//! module turns each key into a [`WorkloadName`] and each value into a
//! [`DesiredEntry`] — a valid [`WorkloadSpec`], or the reason it is not
//! (reported as `invalid`; the running container, if any, is kept) — and
//! hands them to the reconciler as [`DesiredChange`]s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_common::contracts::{ImageRef, WorkloadSpec};
use fleet_common::limits::{MAX_KV_VALUE_BYTES, MAX_WORKLOADS_PER_DEVICE};
use fleet_common::subjects::BUCKET_DESIRED;
use fleet_common::validate::{Sha256Hex, WorkloadName};

use crate::nats::{Nats, WatchEvent, WatchHandle, Watcher};
use crate::shutdown::Shutdown;

/// One desired workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DesiredEntry {
    Valid(WorkloadSpec),
    Invalid {
        error: String,
        /// SHA-256 of the value as stored, so an operator can tell which
        /// write is refused.
        value_hash: Sha256Hex,
        /// The image named in the value, when it could be read.
        image: Option<ImageRef>,
    },
}

pub type DesiredMap = BTreeMap<WorkloadName, DesiredEntry>;

/// What changed in the desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DesiredChange {
    /// The complete desired state; workloads absent here are not desired.
    Snapshot(DesiredMap),
    Put(WorkloadName, DesiredEntry),
    Delete(WorkloadName),
}

/// Validates one value.
pub fn decode_value(value: &[u8]) -> DesiredEntry {
    let invalid = |error: String| DesiredEntry::Invalid {
        error,
        value_hash: Sha256Hex::of(value),
        image: serde_json::from_slice::<serde_json::Value>(value)
            .ok()
            .and_then(|v| v.get("image")?.as_str().map(str::to_owned))
            .and_then(|s| ImageRef::parse(&s).ok()),
    };
    if value.len() > MAX_KV_VALUE_BYTES {
        return invalid(format!(
            "the value is {} bytes, more than the limit of {MAX_KV_VALUE_BYTES}",
            value.len()
        ));
    }
    match WorkloadSpec::from_json(value) {
        Ok(spec) => DesiredEntry::Valid(spec),
        Err(e) => invalid(e.to_string()),
    }
}

/// Validates one key; `None` (logged) for a key that is not a workload name.
fn decode_key(key: &str) -> Option<WorkloadName> {
    match WorkloadName::parse(key) {
        Ok(w) => Some(w),
        Err(e) => {
            log::error!(bucket = BUCKET_DESIRED; "ignoring key {key:?} of this device: {e}");
            None
        }
    }
}

/// Turns a raw watch event into a desired-state change.
pub fn decode(event: WatchEvent) -> Option<DesiredChange> {
    match event {
        WatchEvent::Snapshot(keys) => Some(DesiredChange::Snapshot(
            keys.into_iter()
                .filter_map(|(k, v)| Some((decode_key(&k)?, decode_value(&v))))
                .collect(),
        )),
        WatchEvent::Put(k, v) => Some(DesiredChange::Put(decode_key(&k)?, decode_value(&v))),
        WatchEvent::Delete(k) => Some(DesiredChange::Delete(decode_key(&k)?)),
    }
}

/// Starts the `agent-desired` watcher; every change goes to `sink` until
/// it returns false or shutdown is requested.
pub fn spawn(
    nats: Arc<Nats>,
    idle_heartbeat: Duration,
    shutdown: Arc<Shutdown>,
    mut sink: impl FnMut(DesiredChange) -> bool + Send + 'static,
) -> std::io::Result<WatchHandle> {
    Watcher {
        bucket: BUCKET_DESIRED,
        nats,
        idle_heartbeat,
        max_keys: MAX_WORKLOADS_PER_DEVICE,
        shutdown,
    }
    .spawn("agent-desired", move |event| match decode(event) {
        Some(change) => sink(change),
        None => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_keys_are_validated() {
        assert!(matches!(
            decode_value(br#"{"image":"localhost/web:1"}"#),
            DesiredEntry::Valid(_)
        ));
        match decode_value(br#"{"image":"localhost/web:1","colour":"red"}"#) {
            DesiredEntry::Invalid {
                error,
                value_hash,
                image,
            } => {
                assert!(error.starts_with("workload spec is not valid JSON of the expected shape: unknown field `colour`"), "{error}");
                assert_eq!(
                    value_hash,
                    Sha256Hex::of(br#"{"image":"localhost/web:1","colour":"red"}"#)
                );
                assert_eq!(image.map(String::from).as_deref(), Some("localhost/web:1"));
            }
            other => panic!("{other:?}"),
        }
        match decode_value(b"not json") {
            DesiredEntry::Invalid { image, .. } => assert_eq!(image, None),
            other => panic!("{other:?}"),
        }
        let big = vec![b' '; MAX_KV_VALUE_BYTES + 1];
        match decode_value(&big) {
            DesiredEntry::Invalid { error, .. } => {
                assert!(error.contains("more than the limit"), "{error}")
            }
            other => panic!("{other:?}"),
        }
        let snap = decode(WatchEvent::Snapshot(BTreeMap::from([
            ("web".to_owned(), br#"{"image":"a"}"#.to_vec()),
            ("Bad.Key".to_owned(), br#"{"image":"a"}"#.to_vec()),
        ])));
        match snap {
            Some(DesiredChange::Snapshot(m)) => {
                assert_eq!(
                    m.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
                    vec!["web"]
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(decode(WatchEvent::Delete("x.y".into())), None);
        assert_eq!(
            decode(WatchEvent::Delete("web".into())),
            Some(DesiredChange::Delete(
                WorkloadName::parse("web").expect("name")
            ))
        );
    }
}
