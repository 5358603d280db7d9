//! Desired state: this device's desired-workloads document, validated.
//!
//! A [`Watcher`] on `fleet-workloads` `<device>.desired` (one document per
//! device, [`DesiredWorkloadsRaw`]) yields the document's workloads as raw
//! snapshots and deltas; this module turns each name into a
//! [`WorkloadName`] and each spec into a
//! [`DesiredEntry`] — a valid [`WorkloadSpec`], or the reason it is not
//! (reported as `invalid`; the running container, if any, is kept) — and
//! hands them to the reconciler as [`DesiredChange`]s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_common::contracts::{DesiredWorkloadsRaw, ImageRef, WorkloadSpec};
use fleet_common::limits::{MAX_KV_VALUE_BYTES, MAX_WORKLOADS_PER_DEVICE};
use fleet_common::subjects::{BUCKET_WORKLOADS, DESIRED_DOC_KEY};
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
            let key = fleet_common::process::bounded_text(key.as_bytes(), 256);
            log::error!(bucket = BUCKET_WORKLOADS; "ignoring workload \"{key}\" of this device's document: not a workload name ({})", fleet_common::process::bounded_text(e.to_string().as_bytes(), 512));
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

/// Expands the desired-workloads document into its workloads (raw specs,
/// validated one by one by [`decode`]); an absent document is no workloads.
/// A document that is not one is refused whole (the watcher keeps the last
/// good one). Workloads beyond [`MAX_WORKLOADS_PER_DEVICE`] are dropped
/// with an error.
pub fn expand_document(value: Option<Vec<u8>>) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let Some(bytes) = value else {
        return Ok(BTreeMap::new());
    };
    let doc = DesiredWorkloadsRaw::from_json(&bytes)?;
    let total = doc.workloads.len();
    let keys: BTreeMap<String, Vec<u8>> = doc
        .workloads
        .into_iter()
        .take(MAX_WORKLOADS_PER_DEVICE)
        .map(|(k, v)| (k, v.get().as_bytes().to_vec()))
        .collect();
    if total > keys.len() {
        log::error!(bucket = BUCKET_WORKLOADS; "the document names {total} workloads, more than {MAX_WORKLOADS_PER_DEVICE}; {} were ignored", total - keys.len());
    }
    Ok(keys)
}

/// Starts the `agent-desired` watcher; every change goes to `sink` until
/// it returns false or shutdown is requested. `check` is the periodic
/// backstop read.
pub fn spawn(
    nats: Arc<Nats>,
    check: Duration,
    shutdown: Arc<Shutdown>,
    mut sink: impl FnMut(DesiredChange) -> bool + Send + 'static,
) -> std::io::Result<WatchHandle> {
    Watcher {
        bucket: BUCKET_WORKLOADS,
        key: DESIRED_DOC_KEY,
        expand: expand_document,
        nats,
        check,
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
