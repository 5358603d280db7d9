//! `fleetctl workload apply|rm|ls`: a device's desired workloads in
//! `fleet-desired`. A spec is validated before it is written (a spec the
//! agent would refuse is refused here, naming the field) and written in
//! its canonical form.

use std::fmt::Write;
use std::path::Path;

use fleet_common::contracts::{WorkloadSpec, WorkloadsReport};
use fleet_common::durable;
use fleet_common::limits::MAX_KV_VALUE_BYTES;
use fleet_common::subjects::{desired_key, status_key, StatusKey, BUCKET_DESIRED, BUCKET_STATUS};
use fleet_common::validate::{DeviceId, WorkloadName};

use crate::error::CtlError;
use crate::js;
use crate::status::state_name;

fn ids(device: &str, workload: &str) -> Result<(DeviceId, WorkloadName), CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let w = WorkloadName::parse(workload).map_err(|e| CtlError::Input(e.to_string()))?;
    Ok((d, w))
}

/// A bucket through the crate's KV helper (the operator may use it).
pub fn kv(conn: &nats::Connection, bucket: &str) -> Result<nats::kv::Store, CtlError> {
    nats::jetstream::new(conn.clone())
        .key_value(bucket)
        .map_err(CtlError::nats(format!(
            "opening bucket {bucket} (create it with `fleetctl buckets create`)"
        )))
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
    let spec = WorkloadSpec::from_json(&bytes)
        .map_err(|e| CtlError::Input(format!("{}: {e}", file.display())))?;
    let canonical = serde_json::to_vec(&spec).map_err(|e| CtlError::Input(e.to_string()))?;
    let key = desired_key(&d, &w);
    let rev = kv(conn, BUCKET_DESIRED)?
        .put(&key, canonical)
        .map_err(CtlError::nats(format!("writing {BUCKET_DESIRED} {key}")))?;
    Ok((rev, spec.spec_hash().as_str().to_owned()))
}

/// Removes a desired workload (the agent removes its container).
pub fn rm(conn: &nats::Connection, device: &str, workload: &str) -> Result<(), CtlError> {
    let (d, w) = ids(device, workload)?;
    let key = desired_key(&d, &w);
    kv(conn, BUCKET_DESIRED)?
        .delete(&key)
        .map_err(CtlError::nats(format!("deleting {BUCKET_DESIRED} {key}")))
}

/// A device's desired workloads, with what the device reports of each.
pub fn ls(conn: &nats::Connection, device: &str) -> Result<String, CtlError> {
    let d = DeviceId::parse(device).map_err(|e| CtlError::Input(e.to_string()))?;
    let desired = js::read_last(conn, BUCKET_DESIRED, &format!("$KV.{BUCKET_DESIRED}.{d}.*"))?;
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
    let prefix = format!("{d}.");
    for e in desired {
        let (Some(name), Some(value)) = (e.key.strip_prefix(&prefix), e.value) else {
            continue;
        };
        let observed = report
            .as_ref()
            .and_then(|r| {
                WorkloadName::parse(name)
                    .ok()
                    .and_then(|n| r.workloads.get(&n).cloned())
            })
            .map_or("not reported".to_owned(), |w| {
                state_name(w.state).to_owned()
            });
        match WorkloadSpec::from_json(&value) {
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
