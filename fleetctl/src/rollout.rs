//! `fleetctl rollout --release FILE [--retry] [-l SELECTOR]` (and
//! `fleetctl upgrade -l SELECTOR ...`): a new attempt for every device (of
//! the selector) that needs one, at once (staged: [`crate::staged`]) ([`crate::upgrade::plan`], fleet rules: frozen
//! devices and devices in `rollback-failed` are skipped and say so).
//!
//! Steps: read every device's `info` and `upgrade` and every intent (three
//! consumers, not one request per device); decide per device; write the
//! new attempts as pipelined compare-and-set writes, each over the intent
//! revision just read, so a concurrent writer (another operator's rollout
//! or upgrade) wins or loses per device and never both; print one line
//! per device, sorted by device, and a summary on stderr.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use fleet_common::subjects::BUCKET_CONTROL;
use fleet_common::validate::{AttemptUuid, DeviceId};

use crate::error::CtlError;
use crate::fleet::{self, DeviceView, Keys, Scope};
use crate::js::{self, CasOutcome};
use crate::labels;
use crate::selector::Selector;
use crate::upgrade::{cas_write, plan, read_release, written_line, Mode, Plan};

/// The outcome of a rollout: the lines and the exit decision.
#[derive(Debug)]
pub struct Rollout {
    pub lines: String,
    pub summary: String,
    pub lost: usize,
    pub failed: usize,
}

/// `fleetctl rollout`.
pub fn run(
    conn: &nats::Connection,
    release: &Path,
    retry: bool,
    selector: Option<&Selector>,
) -> Result<Rollout, CtlError> {
    let release = read_release(release)?;
    let devices: BTreeMap<DeviceId, DeviceView> = match selector {
        None => fleet::read(conn, &Scope::Fleet, Keys::Upgrade)?,
        Some(s) => labels::select(conn, Some(s), Keys::Upgrade)?
            .into_iter()
            .map(|d| (d.view.id.clone(), d.view))
            .collect(),
    };
    let mut lines: BTreeMap<DeviceId, String> = BTreeMap::new();
    let mut writes = Vec::new();
    let (mut up_to_date, mut skipped) = (0usize, 0usize);
    for (id, d) in &devices {
        match plan(d, &release, retry, Mode::Fleet, AttemptUuid::new_random()) {
            Plan::Write(a) => writes.push((cas_write(&a, d.intent.seq), a)),
            Plan::UpToDate(v) => {
                up_to_date += 1;
                lines.insert(id.clone(), format!("{id}: up to date ({v})"));
            }
            Plan::Skip(s) => {
                skipped += 1;
                lines.insert(id.clone(), format!("{id}: skipped: {s}"));
            }
        }
    }
    let batch: Vec<_> = writes.iter().map(|(w, _)| w.clone()).collect();
    let outcomes = js::cas_put_all(conn, BUCKET_CONTROL, &batch)?;
    let (mut written, mut lost, mut failed) = (0usize, 0usize, 0usize);
    for ((_, a), outcome) in writes.iter().zip(outcomes) {
        let line = match outcome {
            CasOutcome::Written { seq } => {
                written += 1;
                written_line(a, seq)
            }
            CasOutcome::Conflict(why) => {
                lost += 1;
                format!(
                    "{}: lost the race: another writer changed the intent since it was read ({why}); nothing written",
                    a.device_id
                )
            }
            CasOutcome::Failed(why) => {
                failed += 1;
                format!("{}: write failed: {why}", a.device_id)
            }
        };
        lines.insert(a.device_id.clone(), line);
    }
    let mut out = String::new();
    for line in lines.values() {
        let _ = writeln!(out, "{line}");
    }
    let mut summary = format!(
        "rollout of {} over {} devices: {written} written, {up_to_date} up to date, {skipped} skipped",
        release.version,
        devices.len()
    );
    if lost > 0 {
        let _ = write!(
            summary,
            ", {lost} lost to another writer (re-run to see what won)"
        );
    }
    if failed > 0 {
        let _ = write!(summary, ", {failed} failed to write (re-run)");
    }
    summary.push('\n');
    Ok(Rollout {
        lines: out,
        summary,
        lost,
        failed,
    })
}
