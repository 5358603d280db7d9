//! `fleetctl workload apply|rm|ls -l SELECTOR ...`: one workload on every
//! device a selector matches. Each device's document is written on its own
//! by compare-and-set ([`crate::workload::put_spec`]); a device whose
//! document already holds this very spec is left alone and says so, so a
//! re-run is idempotent and only reaches devices that joined the group (or
//! whose spec differs) since. `--dry-run` reads and says what would change.
//! A device whose agent is too old for a field of the spec is refused and
//! says which version it needs; the others are written.

use std::fmt::Write;
use std::path::Path;

use fleet_common::contracts::WorkloadSpec;
use fleet_common::validate::WorkloadName;

use crate::error::CtlError;
use crate::fleet::Keys;
use crate::labels::select;
use crate::selector::Selector;
use crate::workload::{put_spec, read_document, read_spec, remove_spec};

/// Lines (stdout), a summary (stderr) and whether any device failed.
#[derive(Debug)]
pub struct GroupOutcome {
    pub lines: String,
    pub summary: String,
    pub failed: usize,
}

fn name(workload: &str) -> Result<WorkloadName, CtlError> {
    WorkloadName::parse(workload).map_err(|e| CtlError::Input(e.to_string()))
}

/// `fleetctl workload apply -l SELECTOR NAME SPEC.json [--dry-run]`.
pub fn apply(
    conn: &nats::Connection,
    sel: &Selector,
    workload: &str,
    file: &Path,
    dry_run: bool,
) -> Result<GroupOutcome, CtlError> {
    let w = name(workload)?;
    let spec = read_spec(file)?;
    let hash = spec.spec_hash();
    let short = &hash.as_str()[..12];
    let devices = select(conn, Some(sel), Keys::Upgrade)?;
    let (mut added, mut changed, mut unchanged, mut failed) = (0usize, 0usize, 0usize, 0usize);
    let mut refused = 0usize;
    let mut lines = String::new();
    for d in &devices {
        let id = &d.view.id;
        if let Some(why) = d
            .view
            .info
            .as_ref()
            .and_then(|i| crate::workload::too_old(&spec, &i.agent_version))
        {
            refused += 1;
            let _ = writeln!(lines, "{id}: refused: {why}");
            continue;
        }
        let line = match read_document(conn, id) {
            Err(e) => {
                failed += 1;
                format!("{id}: failed: {e}")
            }
            Ok((doc, _)) => match doc.spec(&w) {
                Some(Ok(current)) if current == spec => {
                    unchanged += 1;
                    format!("{id}: unchanged ({w} spec {short})")
                }
                current => {
                    let verb = if current.is_some() {
                        "changed"
                    } else {
                        "added"
                    };
                    if dry_run {
                        if current.is_some() {
                            changed += 1;
                        } else {
                            added += 1;
                        }
                        format!("{id}: would be {verb} ({w} spec {short})")
                    } else {
                        match put_spec(conn, id, &w, &spec) {
                            Ok(rev) => {
                                if current.is_some() {
                                    changed += 1;
                                } else {
                                    added += 1;
                                }
                                format!("{id}: {verb} ({w} spec {short}, revision {rev})")
                            }
                            Err(e) => {
                                failed += 1;
                                format!("{id}: failed: {e}")
                            }
                        }
                    }
                }
            },
        };
        let _ = writeln!(lines, "{line}");
    }
    let mut summary = format!(
        "{}{w} on {} devices matching {:?}: {added} added, {changed} changed, {unchanged} unchanged",
        if dry_run { "dry run: " } else { "" },
        devices.len(),
        sel.as_str()
    );
    if refused > 0 {
        let _ = write!(
            summary,
            ", {refused} refused (their agent does not read the spec: upgrade them first)"
        );
    }
    if failed > 0 {
        let _ = write!(summary, ", {failed} failed (re-run to retry them)");
    }
    summary.push('\n');
    Ok(GroupOutcome {
        lines,
        summary,
        failed: failed + refused,
    })
}

/// `fleetctl workload rm -l SELECTOR NAME`.
pub fn rm(
    conn: &nats::Connection,
    sel: &Selector,
    workload: &str,
) -> Result<GroupOutcome, CtlError> {
    let w = name(workload)?;
    let devices = select(conn, Some(sel), Keys::Upgrade)?;
    let (mut removed, mut absent, mut failed) = (0usize, 0usize, 0usize);
    let mut lines = String::new();
    for d in &devices {
        let id = &d.view.id;
        let line = match read_document(conn, id) {
            Ok((doc, _)) if doc.spec(&w).is_none() => {
                absent += 1;
                format!("{id}: has no {w}")
            }
            Ok(_) => match remove_spec(conn, id, &w) {
                Ok(()) => {
                    removed += 1;
                    format!("{id}: removed {w}")
                }
                Err(e) => {
                    failed += 1;
                    format!("{id}: failed: {e}")
                }
            },
            Err(e) => {
                failed += 1;
                format!("{id}: failed: {e}")
            }
        };
        let _ = writeln!(lines, "{line}");
    }
    let mut summary = format!(
        "{w} on {} devices matching {:?}: {removed} removed, {absent} had none",
        devices.len(),
        sel.as_str()
    );
    if failed > 0 {
        let _ = write!(summary, ", {failed} failed (re-run to retry them)");
    }
    summary.push('\n');
    Ok(GroupOutcome {
        lines,
        summary,
        failed,
    })
}

/// `fleetctl workload ls -l SELECTOR`: each matching device's workloads.
pub fn ls(conn: &nats::Connection, sel: &Selector) -> Result<String, CtlError> {
    let devices = select(conn, Some(sel), Keys::Upgrade)?;
    let mut out = String::new();
    for d in &devices {
        let id = &d.view.id;
        let (doc, _) = read_document(conn, id)?;
        if doc.workloads.is_empty() {
            let _ = writeln!(out, "{id}: no desired workloads");
        }
        for (w, raw) in &doc.workloads {
            match WorkloadSpec::from_json(raw.get().as_bytes()) {
                Ok(spec) => {
                    let _ = writeln!(
                        out,
                        "{id}: {w}: image {}, spec {}",
                        spec.image,
                        &spec.spec_hash().as_str()[..12]
                    );
                }
                Err(e) => {
                    let _ = writeln!(out, "{id}: {w}: invalid spec ({e})");
                }
            }
        }
    }
    if devices.is_empty() {
        let _ = writeln!(out, "no device matches {:?}", sel.as_str());
    }
    Ok(out)
}
