//! `fleetctl workload apply|rm|ls`: a device's desired workloads. A spec is
//! validated before it is written (a spec the agent would refuse is refused
//! here, naming the field) and written in its canonical form. A spec with
//! a field the device's agent does not read yet (`SPEC_FIELDS_SINCE`:
//! `health` needs agent 0.3.0) is refused for that device, naming it and
//! the version it needs (a device that never reported is written).
//!
//! Generation-2 agents read one document per device, `fleet-workloads`
//! `<device>.desired` (`DesiredWorkloads`): apply and rm read it, change
//! one workload (the others kept as written, an invalid one included) and
//! write it back by compare-and-set (re-read and retried
//! when another operator wrote in between). Agent 0.1.0 reads
//! `fleet-desired` `<device>.<workload>`: as long as that bucket exists (a
//! fleet that may still run 0.1.0, or roll back to it), the same change is
//! written there too, after the document. Deleting the bucket retires it
//! (`docs/operator/mixed-fleets.md`).

use std::fmt::Write;
use std::path::Path;

use std::collections::BTreeMap;

use fleet_common::contracts::{DesiredWorkloadsRaw, WorkloadSpec, WorkloadsReport};
use fleet_common::durable;
use fleet_common::limits::{MAX_DESIRED_DOC_BYTES, MAX_KV_VALUE_BYTES, MAX_WORKLOADS_PER_DEVICE};
use fleet_common::subjects::{
    desired_doc_key, desired_key, status_key, StatusKey, BUCKET_DESIRED, BUCKET_STATUS,
    BUCKET_WORKLOADS,
};
use fleet_common::validate::{DeviceId, WorkloadName};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::error::CtlError;
use crate::js;
use crate::js::{is_wrong_last_sequence, kv};

fn ids(device: &str, workload: &str) -> Result<(DeviceId, WorkloadName), CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let w = WorkloadName::parse(workload).map_err(|e| CtlError::Input(e.to_string()))?;
    Ok((d, w))
}

/// Why `spec` cannot go to an agent of `version`, if it cannot.
pub fn too_old(spec: &WorkloadSpec, version: &fleet_common::validate::Version) -> Option<String> {
    spec.needs_agent(version).err().map(|(field, since)| {
        format!(
            "agent {version} does not read the spec's `{field}` (it needs agent {since} or later): upgrade the device first"
        )
    })
}

/// Reads and validates the spec in `file` (`-`: stdin).
pub fn read_spec(file: &Path) -> Result<WorkloadSpec, CtlError> {
    let bytes = if file == Path::new("-") {
        let mut b = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(std::io::stdin(), MAX_KV_VALUE_BYTES as u64 + 1),
            &mut b,
        )
        .map_err(|e| CtlError::Input(format!("reading the spec from stdin: {e}")))?;
        b
    } else {
        durable::read_bounded(file, MAX_KV_VALUE_BYTES as u64)
            .map_err(|e| CtlError::Input(e.to_string()))?
    };
    WorkloadSpec::from_json(&bytes).map_err(|e| CtlError::Input(format!("{}: {e}", file.display())))
}

/// Validates the spec in `file` (`-`: stdin) and puts it; returns the
/// revision and the spec hash.
pub fn apply(
    conn: &nats::Connection,
    device: &str,
    workload: &str,
    file: &Path,
) -> Result<(u64, String), CtlError> {
    let (d, w) = ids(device, workload)?;
    let spec = read_spec(file)?;
    if !spec.versioned_fields().is_empty() {
        let views = crate::fleet::read(
            conn,
            &crate::fleet::Scope::Device(d.clone()),
            crate::fleet::Keys::Upgrade,
        )?;
        if let Some(why) = views
            .get(&d)
            .and_then(|v| v.info.as_ref())
            .and_then(|i| too_old(&spec, &i.agent_version))
        {
            return Err(CtlError::Refused(format!(
                "device {d}: {why}; nothing written"
            )));
        }
    }
    let rev = put_spec(conn, &d, &w, &spec)?;
    Ok((rev, spec.spec_hash().as_str().to_owned()))
}

/// Puts `spec` as `d`'s workload `w` (document by compare-and-set, then
/// the legacy key while it exists); returns the document's revision.
pub fn put_spec(
    conn: &nats::Connection,
    d: &DeviceId,
    w: &WorkloadName,
    spec: &WorkloadSpec,
) -> Result<u64, CtlError> {
    let canonical = serde_json::to_vec(spec).map_err(|e| CtlError::Input(e.to_string()))?;
    let raw = serde_json::value::to_raw_value(spec).map_err(|e| CtlError::Input(e.to_string()))?;
    let rev = edit_document(conn, d, |doc| {
        if !doc.workloads.contains_key(w.as_str())
            && doc.workloads.len() >= MAX_WORKLOADS_PER_DEVICE
        {
            return Err(CtlError::Input(format!(
                "device {d} already has {MAX_WORKLOADS_PER_DEVICE} workloads, the most one device runs"
            )));
        }
        doc.workloads.insert(w.to_string(), raw.clone());
        Ok(())
    })?;
    if let Some(legacy) = legacy_store(conn)? {
        let key = desired_key(d, w);
        legacy.put(&key, canonical).map_err(CtlError::nats(format!(
            "writing {BUCKET_DESIRED} {key} (for agents 0.1.0)"
        )))?;
    }
    Ok(rev)
}

/// Removes a desired workload (the agent removes its container).
pub fn rm(conn: &nats::Connection, device: &str, workload: &str) -> Result<(), CtlError> {
    let (d, w) = ids(device, workload)?;
    remove_spec(conn, &d, &w)
}

/// Removes `d`'s workload `w` (document, then the legacy key).
pub fn remove_spec(
    conn: &nats::Connection,
    d: &DeviceId,
    w: &WorkloadName,
) -> Result<(), CtlError> {
    edit_document(conn, d, |doc| {
        doc.workloads.remove(w.as_str());
        Ok(())
    })?;
    if let Some(legacy) = legacy_store(conn)? {
        let key = desired_key(d, w);
        legacy.delete(&key).map_err(CtlError::nats(format!(
            "deleting {BUCKET_DESIRED} {key} (for agents 0.1.0)"
        )))?;
    }
    Ok(())
}

/// Empties `d`'s desired workloads: an empty document (by
/// compare-and-set, so that the agent stops and removes every workload it
/// runs through its reconciler, change freeze honoured) and, while
/// `fleet-desired` exists, a deletion of each of its keys there (agent
/// 0.1.0). Returns the document's revision.
pub fn remove_all(conn: &nats::Connection, d: &DeviceId) -> Result<u64, CtlError> {
    let rev = edit_document(conn, d, |doc| {
        doc.workloads.clear();
        Ok(())
    })?;
    if legacy_store(conn)?.is_some() {
        let keys: Vec<String> = js::read_last(
            conn,
            BUCKET_DESIRED,
            &fleet_common::subjects::device_filter(BUCKET_DESIRED, d),
        )?
        .into_iter()
        .filter(|e| e.value.is_some())
        .map(|e| e.key)
        .collect();
        for (key, o) in keys
            .iter()
            .zip(js::delete_all(conn, BUCKET_DESIRED, &keys)?)
        {
            if let js::CasOutcome::Failed(why) | js::CasOutcome::Conflict(why) = o {
                return Err(CtlError::Nats {
                    what: format!("deleting {BUCKET_DESIRED} {key} (for agents 0.1.0)"),
                    detail: why,
                });
            }
        }
    }
    Ok(rev)
}

/// Read-modify-write attempts of one document before giving up (each lost
/// attempt means another operator wrote that device in between).
const CAS_ATTEMPTS: usize = 5;

/// A device's desired-workloads document as stored: each spec kept as
/// its JSON, so that a change to one workload keeps the others as they are
/// (one the agent refuses included: it is reported, not lost).
#[derive(Debug, Default, Serialize)]
pub struct Document {
    pub workloads: BTreeMap<String, Box<RawValue>>,
}

impl Document {
    /// Workload `w`'s spec: `None` when absent, `Some(Err)` when invalid.
    pub fn spec(&self, w: &WorkloadName) -> Option<Result<WorkloadSpec, String>> {
        self.workloads
            .get(w.as_str())
            .map(|raw| WorkloadSpec::from_json(raw.get().as_bytes()).map_err(|e| e.to_string()))
    }
}

/// A device's desired-workloads document and its revision (`None`: never
/// written, or deleted). The document's shape is checked; each spec is
/// kept as written ([`Document`]).
pub fn read_document(
    conn: &nats::Connection,
    device: &DeviceId,
) -> Result<(Document, Option<u64>), CtlError> {
    let key = desired_doc_key(device);
    let entry = kv(conn, BUCKET_WORKLOADS)?
        .entry(&key)
        .map_err(CtlError::nats(format!("reading {BUCKET_WORKLOADS} {key}")))?;
    match entry {
        None => Ok((Document::default(), None)),
        Some(e) if e.value.is_empty() => Ok((Document::default(), Some(e.revision))),
        Some(e) => DesiredWorkloadsRaw::from_json(&e.value)
            .map(|doc| {
                (
                    Document {
                        workloads: doc.workloads,
                    },
                    Some(e.revision),
                )
            })
            .map_err(|err| {
                CtlError::Refused(format!(
                    "{BUCKET_WORKLOADS} {key} (revision {}) is not a valid desired-workloads document: {err}; inspect it with `nats kv get {BUCKET_WORKLOADS} {key}` and rewrite or delete it",
                    e.revision
                ))
            }),
    }
}

/// Changes `device`'s document with `edit` and writes it back by
/// compare-and-set; returns the new revision.
fn edit_document(
    conn: &nats::Connection,
    device: &DeviceId,
    mut edit: impl FnMut(&mut Document) -> Result<(), CtlError>,
) -> Result<u64, CtlError> {
    let store = kv(conn, BUCKET_WORKLOADS)?;
    let key = desired_doc_key(device);
    for _ in 0..CAS_ATTEMPTS {
        let (mut doc, revision) = read_document(conn, device)?;
        edit(&mut doc)?;
        let bytes = serde_json::to_vec(&doc).map_err(|e| CtlError::Input(e.to_string()))?;
        if bytes.len() > MAX_DESIRED_DOC_BYTES {
            return Err(CtlError::Input(format!(
                "device {device}'s desired workloads would take {} bytes, more than the {MAX_DESIRED_DOC_BYTES} one document holds",
                bytes.len()
            )));
        }
        let written = match revision {
            Some(r) => store.update(&key, &bytes, r),
            None => store.create(&key, &bytes),
        };
        match written {
            Ok(rev) => return Ok(rev),
            Err(e) if is_wrong_last_sequence(&e) => continue,
            Err(e) => {
                return Err(CtlError::Nats {
                    what: format!("writing {BUCKET_WORKLOADS} {key}"),
                    detail: e.to_string(),
                })
            }
        }
    }
    Err(CtlError::Conflict(format!(
        "{BUCKET_WORKLOADS} {key} changed under each of {CAS_ATTEMPTS} attempts (other operators are writing it); nothing was written: run the command again"
    )))
}

/// `fleet-desired`, while it exists (generation 1 not yet retired).
pub fn legacy_store(conn: &nats::Connection) -> Result<Option<nats::kv::Store>, CtlError> {
    match nats::jetstream::new(conn.clone()).key_value(BUCKET_DESIRED) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.to_string().contains("not found") => Ok(None),
        Err(e) => Err(CtlError::Nats {
            what: format!("opening bucket {BUCKET_DESIRED} (agents 0.1.0 read it)"),
            detail: e.to_string(),
        }),
    }
}

/// A device's desired workloads, with what the device reports of each.
pub fn ls(conn: &nats::Connection, device: &str) -> Result<String, CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let key = desired_doc_key(&d);
    let raw = kv(conn, BUCKET_WORKLOADS)?
        .get(&key)
        .map_err(CtlError::nats(format!("reading {BUCKET_WORKLOADS} {key}")))?
        .filter(|v| !v.is_empty());
    let doc = match raw {
        None => None,
        Some(bytes) => Some(DesiredWorkloadsRaw::from_json(&bytes).map_err(|e| {
            CtlError::Refused(format!(
                "{BUCKET_WORKLOADS} {key}: {e}; inspect it with `nats kv get {BUCKET_WORKLOADS} {key}` and rewrite or delete it"
            ))
        })?),
    };
    let report: Option<WorkloadsReport> = js::read_last(
        conn,
        BUCKET_STATUS,
        &format!(
            "$KV.{BUCKET_STATUS}.{}",
            status_key(&d, StatusKey::Workloads)
        ),
    )?
    .into_iter()
    .find_map(|e| e.value)
    .and_then(|b| serde_json::from_slice(&b).ok());
    let mut out = String::new();
    for (name, spec) in doc.iter().flat_map(|doc| doc.workloads.iter()) {
        let observed = report
            .as_ref()
            .and_then(|r| {
                WorkloadName::parse(name)
                    .ok()
                    .and_then(|n| r.workloads.get(&n).cloned())
            })
            .map_or("not reported".to_owned(), |w| w.state.name().to_owned());
        match WorkloadSpec::from_json(spec.get().as_bytes()) {
            Ok(spec) => {
                let hash = spec.spec_hash();
                let _ = writeln!(
                    out,
                    "{name}: image {}, spec {}, {observed}",
                    spec.image,
                    &hash.as_str()[..12]
                );
            }
            Err(err) => {
                let _ = writeln!(out, "{name}: invalid spec ({err}), {observed}");
            }
        }
    }
    if out.is_empty() {
        out = format!("device {d} has no desired workloads\n");
    }
    Ok(out)
}
