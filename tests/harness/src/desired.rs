//! Writing a device's desired workloads the way `fleetctl workload` does:
//! the `fleet-workloads` `<device>.desired` document, read-modify-written by
//! compare-and-set (generation 2), beside the per-workload key in
//! `fleet-desired` for agent 0.1.0 (generation 1). For tests and benches.
//!
//! A spec that is not JSON is stored as a JSON string in the document, so a
//! test can still hand the agent something it must refuse.

use fleet_common::subjects::{desired_doc_key, BUCKET_DESIRED, BUCKET_WORKLOADS};
use fleet_common::validate::DeviceId;
use serde_json::{Map, Value};

/// Compare-and-set attempts before a test gives up (tests race only with
/// themselves).
const CAS_ATTEMPTS: usize = 20;

fn store(admin: &nats::Connection, bucket: &str) -> nats::kv::Store {
    nats::jetstream::new(admin.clone())
        .key_value(bucket)
        .unwrap_or_else(|e| panic!("open bucket {bucket}: {e}"))
}

fn doc_key(device: &str) -> String {
    desired_doc_key(&DeviceId::parse(device).unwrap_or_else(|e| panic!("device {device}: {e}")))
}

/// Changes `device`'s document with `edit` by compare-and-set; returns the
/// new revision.
pub fn edit_document(
    admin: &nats::Connection,
    device: &str,
    mut edit: impl FnMut(&mut Map<String, Value>),
) -> u64 {
    let kv = store(admin, BUCKET_WORKLOADS);
    let key = doc_key(device);
    for _ in 0..CAS_ATTEMPTS {
        let entry = kv
            .entry(&key)
            .unwrap_or_else(|e| panic!("read {BUCKET_WORKLOADS} {key}: {e}"));
        let (mut doc, revision) = match &entry {
            Some(e) if !e.value.is_empty() => (
                serde_json::from_slice::<Map<String, Value>>(&e.value)
                    .unwrap_or_else(|err| panic!("{key} is not a JSON object: {err}")),
                Some(e.revision),
            ),
            Some(e) => (Map::new(), Some(e.revision)),
            None => (Map::new(), None),
        };
        let workloads = doc
            .entry("workloads")
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(w) = workloads else {
            panic!("{key}: workloads is not an object");
        };
        edit(w);
        let bytes = serde_json::to_vec(&doc).expect("a JSON object serializes");
        let written = match revision {
            Some(r) => kv.update(&key, &bytes, r),
            None => kv.create(&key, &bytes),
        };
        if let Ok(rev) = written {
            return rev;
        }
    }
    panic!("{BUCKET_WORKLOADS} {key}: compare-and-set lost {CAS_ATTEMPTS} times");
}

/// Puts `spec` (raw text) as workload `workload` of `device`, in both
/// forms; returns the document's revision.
pub fn put_workload(admin: &nats::Connection, device: &str, workload: &str, spec: &str) -> u64 {
    let value: Value =
        serde_json::from_str(spec).unwrap_or_else(|_| Value::String(spec.to_owned()));
    let rev = edit_document(admin, device, |w| {
        w.insert(workload.to_owned(), value.clone());
    });
    store(admin, BUCKET_DESIRED)
        .put(&format!("{device}.{workload}"), spec.as_bytes())
        .unwrap_or_else(|e| panic!("put {BUCKET_DESIRED} {device}.{workload}: {e}"));
    rev
}

/// Removes workload `workload` of `device`, in both forms.
pub fn delete_workload(admin: &nats::Connection, device: &str, workload: &str) {
    edit_document(admin, device, |w| {
        w.remove(workload);
    });
    store(admin, BUCKET_DESIRED)
        .delete(&format!("{device}.{workload}"))
        .unwrap_or_else(|e| panic!("delete {BUCKET_DESIRED} {device}.{workload}: {e}"));
}
