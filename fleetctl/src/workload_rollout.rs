//! Staged workload rollouts: `fleetctl workload rollout [-l SELECTOR] NAME
//! SPEC.json --batches ...`, and `fleetctl rollout undo ID`.
//!
//! The engine is the one of agent rollouts ([`crate::staged`]): the same
//! state key (`fleet-operator` `rollouts.<id>`, with a `workload` target
//! instead of a `release`), batches, threshold, budget, halt, and
//! `rollout status|resume|abort|ls`. What differs is how a device is judged
//! ([`WorkloadJudge`]), read every tick from NATS:
//!
//! - done: its `<device>.health` report has the workload `healthy` on the
//!   rollout's spec hash and no `reverted`;
//! - failed: that report says the spec was reverted (`reverted.failed-spec-
//!   hash`), or `unhealthy` on the spec hash; or `<device>.workloads` says
//!   `invalid` for it; or the batch timeout passed;
//! - in flight: its desired document (`fleet-workloads` `<device>.desired`)
//!   holds the spec: a `fleetctl` killed mid-batch and resumed from
//!   another process writes no device twice;
//! - left out when the rollout starts: no device info, or an agent older
//!   than a field of the spec needs ([`WorkloadSpec::needs_agent`]);
//! - otherwise it waits for its write: the whole document, the other
//!   workloads kept as written, by compare-and-set over the revision read.
//!
//! Before a device's document is written, what it held for the workload is
//! recorded in the rollout's state (itself written by compare-and-set
//! first), so `rollout undo` can write each device's previous spec back,
//! by compare-and-set, for every device that still holds this rollout's
//! spec.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use fleet_common::contracts::{
    DesiredWorkloadsRaw, HealthReport, HealthState, PreviousSpec, PreviousSpecs, RolloutPhase,
    WorkloadRollout, WorkloadSpec, WorkloadState, WorkloadsReport,
};
use fleet_common::limits::{MAX_DESIRED_DOC_BYTES, MAX_WORKLOADS_PER_DEVICE};
use fleet_common::subjects::{desired_doc_key, desired_key, BUCKET_STATUS, BUCKET_WORKLOADS};
use fleet_common::validate::{DeviceId, Sha256Hex, WorkloadName};
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::js::{self, CasOutcome, CasWrite};
use crate::labels::{self, Device};
use crate::selector::Selector;
use crate::staged::{self, Class, Judge, Policy, SpecWrite, Write};
use crate::workload::{legacy_store, read_spec, too_old, Document};

fn short(h: &Sha256Hex) -> &str {
    &h.as_str()[..12]
}

/// What the devices say about workloads, read once per tick: every
/// desired document with its revision, every health and workloads report.
#[derive(Debug, Default)]
pub struct Facts {
    /// The document (or why it is unreadable) and its last sequence (0:
    /// never written).
    pub docs: BTreeMap<DeviceId, (Result<Document, String>, u64)>,
    pub health: BTreeMap<DeviceId, HealthReport>,
    pub reports: BTreeMap<DeviceId, WorkloadsReport>,
}

fn device_of(key: &str) -> Option<DeviceId> {
    DeviceId::parse(key.split_once('.')?.0).ok()
}

/// Reads [`Facts`] for the whole fleet (three consumers).
pub fn read_facts(conn: &nats::Connection) -> Result<Facts, CtlError> {
    let mut f = Facts::default();
    for e in js::read_last(
        conn,
        BUCKET_WORKLOADS,
        &format!("$KV.{BUCKET_WORKLOADS}.*.desired"),
    )? {
        let Some(id) = device_of(&e.key) else {
            continue;
        };
        let doc = match e.value.filter(|v| !v.is_empty()) {
            None => Ok(Document::default()),
            Some(v) => DesiredWorkloadsRaw::from_json(&v)
                .map(|d| Document {
                    workloads: d.workloads,
                })
                .map_err(|err| {
                    format!(
                        "{BUCKET_WORKLOADS} {} is not a valid desired-workloads document ({err}): rewrite or delete it",
                        e.key
                    )
                }),
        };
        f.docs.insert(id, (doc, e.seq));
    }
    for e in js::read_last(
        conn,
        BUCKET_STATUS,
        &format!("$KV.{BUCKET_STATUS}.*.health"),
    )? {
        if let (Some(id), Some(v)) = (device_of(&e.key), e.value) {
            if let Ok(r) = serde_json::from_slice::<HealthReport>(&v) {
                f.health.insert(id, r);
            }
        }
    }
    for e in js::read_last(
        conn,
        BUCKET_STATUS,
        &format!("$KV.{BUCKET_STATUS}.*.workloads"),
    )? {
        if let (Some(id), Some(v)) = (device_of(&e.key), e.value) {
            if let Ok(r) = serde_json::from_slice::<WorkloadsReport>(&v) {
                f.reports.insert(id, r);
            }
        }
    }
    Ok(f)
}

/// A workload rollout's judge: the target and the facts of this tick.
pub struct WorkloadJudge<'a> {
    pub target: &'a WorkloadRollout,
    pub facts: &'a Facts,
}

impl WorkloadJudge<'_> {
    /// Done, failed, or `None`: the reports do not settle it.
    fn reported(&self, id: &DeviceId) -> Option<Class> {
        let t = self.target;
        let h = &t.spec_hash;
        if let Some(w) = self
            .facts
            .health
            .get(id)
            .and_then(|r| r.workloads.get(&t.workload))
        {
            if let Some(r) = w.reverted.as_ref().filter(|r| &r.failed_spec_hash == h) {
                let mut why = format!(
                    "reverted to spec {} ({})",
                    short(&r.restored_spec_hash),
                    r.reason.as_str()
                );
                if let Some(d) = &r.detail {
                    let _ = write!(why, ": {}", d.as_str());
                }
                return Some(Class::Failed(why));
            }
            if &w.spec_hash == h {
                match w.health {
                    HealthState::Healthy if w.reverted.is_none() => return Some(Class::Done),
                    HealthState::Unhealthy => {
                        let mut why = format!("unhealthy on spec {}", short(h));
                        if let Some(d) = w.last_probe.as_ref().and_then(|p| p.detail.as_ref()) {
                            let _ = write!(why, ": {}", d.as_str());
                        }
                        return Some(Class::Failed(why));
                    }
                    _ => {}
                }
            }
        }
        if let Some(s) = self
            .facts
            .reports
            .get(id)
            .and_then(|r| r.workloads.get(&t.workload))
            .filter(|s| s.state == WorkloadState::Invalid && &s.spec_hash == h)
        {
            let why = s
                .last_error
                .as_ref()
                .map(|e| e.as_str().to_owned())
                .unwrap_or_default();
            return Some(Class::Failed(format!(
                "the agent refused the spec as invalid: {why}"
            )));
        }
        None
    }
}

impl Judge for WorkloadJudge<'_> {
    fn classify(&self, d: &Device) -> Class {
        let t = self.target;
        let id = &d.view.id;
        let Some(info) = &d.view.info else {
            return Class::Failed("no device info: the device never reported".into());
        };
        if let Some(why) = too_old(&t.spec, &info.agent_version) {
            return Class::Failed(why);
        }
        if let Some(c) = self.reported(id) {
            return c;
        }
        let (doc, seq) = match self.facts.docs.get(id) {
            None => (&Ok(Document::default()), 0),
            Some((doc, seq)) => (doc, *seq),
        };
        let doc = match doc {
            Ok(doc) => doc,
            Err(why) => return Class::Failed(why.clone()),
        };
        let previous = doc.spec(&t.workload);
        if matches!(&previous, Some(Ok(s)) if s.spec_hash() == t.spec_hash) {
            return Class::InFlight;
        }
        if info.config_state.state.is_frozen() {
            return Class::Frozen;
        }
        let mut workloads = doc.workloads.clone();
        if !workloads.contains_key(t.workload.as_str())
            && workloads.len() >= MAX_WORKLOADS_PER_DEVICE
        {
            return Class::Failed(format!(
                "already has {MAX_WORKLOADS_PER_DEVICE} workloads, the most one device runs"
            ));
        }
        let Ok(raw) = serde_json::value::to_raw_value(&t.spec) else {
            return Class::Failed("the spec does not serialize".into());
        };
        workloads.insert(t.workload.to_string(), raw);
        let Ok(bytes) = serde_json::to_vec(&Document { workloads }) else {
            return Class::Failed("the document does not serialize".into());
        };
        if bytes.len() > MAX_DESIRED_DOC_BYTES {
            return Class::Failed(format!(
                "its desired workloads would take {} bytes, more than the {MAX_DESIRED_DOC_BYTES} one document holds",
                bytes.len()
            ));
        }
        let (previous, previous_spec) = match previous {
            None => (PreviousSpec::Absent, None),
            Some(Ok(s)) => (PreviousSpec::Spec(s.spec_hash()), Some(s)),
            Some(Err(_)) => (PreviousSpec::Invalid, None),
        };
        Class::Waiting(Box::new(Write::Spec(SpecWrite {
            device: id.clone(),
            seq,
            doc: bytes,
            previous,
            previous_spec,
        })))
    }

    /// Unavailable as for an agent rollout (an upgrade under way, no fresh
    /// heartbeat), or written and not yet done or failed.
    fn unavailable(&self, d: &Device, now: Timestamp) -> bool {
        staged::unavailable(&d.view, now) || matches!(self.classify(d), Class::InFlight)
    }

    fn target(&self) -> String {
        format!(
            "{} spec {}",
            self.target.workload,
            short(&self.target.spec_hash)
        )
    }
}

/// Keeps what each device about to be written held (in the state, which
/// is written before the devices). A device written again (its write lost
/// a race, or another operator replaced the spec since) gets what it holds
/// now: undo puts back what the rollout's last write replaced.
pub fn record_previous(target: &mut WorkloadRollout, writes: &[Write]) {
    let specs: Vec<&SpecWrite> = writes
        .iter()
        .filter_map(|w| match w {
            Write::Spec(s) => Some(s),
            Write::Intent(..) => None,
        })
        .collect();
    if specs.is_empty() {
        return;
    }
    let mut by_device = target.previous.by_device();
    let mut spec_of: BTreeMap<Sha256Hex, WorkloadSpec> = target
        .previous
        .specs
        .iter()
        .map(|(h, g)| (h.clone(), g.spec.clone()))
        .collect();
    for s in specs {
        by_device.insert(s.device.clone(), s.previous.clone());
        if let (PreviousSpec::Spec(h), Some(spec)) = (&s.previous, &s.previous_spec) {
            spec_of.entry(h.clone()).or_insert_with(|| spec.clone());
        }
    }
    let mut previous = PreviousSpecs::default();
    for (d, p) in by_device {
        let spec = match &p {
            PreviousSpec::Spec(h) => spec_of.get(h),
            _ => None,
        };
        previous.record(d, &p, spec);
    }
    target.previous = previous;
}

/// Each write's desired document by compare-and-set, pipelined.
fn cas_docs<'a>(
    conn: &nats::Connection,
    writes: impl Iterator<Item = &'a SpecWrite>,
) -> Result<Vec<CasOutcome>, CtlError> {
    let batch: Vec<CasWrite> = writes
        .map(|s| CasWrite {
            key: desired_doc_key(&s.device),
            value: s.doc.clone(),
            expected_seq: s.seq,
        })
        .collect();
    js::cas_put_all(conn, BUCKET_WORKLOADS, &batch)
}

/// The CAS writes of the documents, and after them the legacy keys for
/// agents 0.1.0 (while `fleet-desired` exists) of those written.
pub fn write_docs(
    conn: &nats::Connection,
    target: &WorkloadRollout,
    writes: &[&SpecWrite],
) -> Result<Vec<CasOutcome>, CtlError> {
    let outcomes = cas_docs(conn, writes.iter().map(|s| &**s))?;
    if legacy_store(conn)?.is_some() {
        let canonical =
            serde_json::to_vec(&target.spec).map_err(|e| CtlError::Input(e.to_string()))?;
        let legacy: Vec<CasWrite> = writes
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| matches!(o, CasOutcome::Written { .. }))
            .map(|(s, _)| CasWrite {
                key: desired_key(&s.device, &target.workload),
                value: canonical.clone(),
                expected_seq: 0,
            })
            .collect();
        let bucket = fleet_common::subjects::BUCKET_DESIRED;
        for (w, o) in legacy.iter().zip(js::put_all(conn, bucket, &legacy)?) {
            if let CasOutcome::Failed(why) | CasOutcome::Conflict(why) = o {
                return Err(CtlError::Nats {
                    what: format!("writing {bucket} {} (for agents 0.1.0)", w.key),
                    detail: why,
                });
            }
        }
    }
    Ok(outcomes)
}

/// `fleetctl workload rollout [-l SELECTOR] NAME SPEC.json --batches ...
/// [--dry-run]`: validates the spec (nothing is written when it fails),
/// creates the rollout and drives it.
/// The workload name and the spec in `file`, validated (before fleetctl
/// connects: bad input changes nothing).
pub fn read_target(workload: &str, file: &Path) -> Result<(WorkloadName, WorkloadSpec), CtlError> {
    let name = WorkloadName::parse(workload).map_err(|e| CtlError::Input(e.to_string()))?;
    Ok((name, read_spec(file)?))
}

/// What [`plan`] prepared: a dry run (printed, nothing written), or a new
/// rollout for [`crate::rollout_run::launch`] to write and drive.
pub enum Planned {
    DryRun,
    Launch {
        state: Box<fleet_common::contracts::RolloutState>,
        left_out: Vec<String>,
        selected: usize,
    },
}

pub fn plan(
    conn: &nats::Connection,
    (name, spec): (WorkloadName, WorkloadSpec),
    selector: Option<&Selector>,
    policy: &Policy,
    dry_run: bool,
) -> Result<Planned, CtlError> {
    let target = WorkloadRollout {
        workload: name,
        spec_hash: spec.spec_hash(),
        spec,
        previous: Default::default(),
        undone_at: None,
    };
    let devices = labels::select(conn, selector, crate::fleet::Keys::Rollout)?;
    let facts = read_facts(conn)?;
    let judge = WorkloadJudge {
        target: &target,
        facts: &facts,
    };
    let (chosen, left_out) = staged::choose(&judge, &devices);
    let id = format!("r-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let state = staged::new_state(
        id,
        None,
        Some(target.clone()),
        selector,
        policy,
        chosen,
        Timestamp::now(),
    )?;
    if dry_run {
        println!(
            "dry run: {} to {} of {} selected devices in {} batches; nothing written",
            staged::target_text(&state),
            state.devices.len(),
            devices.len(),
            state.batch_ends.len()
        );
        for b in 0..state.batch_ends.len() {
            let ids: Vec<&str> = state.batch(b).iter().map(DeviceId::as_str).collect();
            println!(
                "batch {}/{}: {}",
                b + 1,
                state.batch_ends.len(),
                ids.join(" ")
            );
        }
        for l in &left_out {
            println!("{l}");
        }
        return Ok(Planned::DryRun);
    }
    Ok(Planned::Launch {
        state: Box::new(state),
        left_out,
        selected: devices.len(),
    })
}

/// What `rollout undo` did.
#[derive(Debug)]
pub struct Undo {
    pub lines: String,
    pub summary: String,
    /// Devices not put back (a lost race, a failed write, an invalid
    /// previous spec).
    pub failed: usize,
}

/// `fleetctl rollout undo ID`: a running rollout is aborted first (nothing
/// more is written); then every device whose document still holds this
/// rollout's spec gets the spec it had before (or loses the workload it
/// did not have), by compare-and-set. A device changed since by someone
/// else is left alone and said so. Running it again is harmless.
pub fn undo(conn: &nats::Connection, id: &str) -> Result<Undo, CtlError> {
    let store = js::kv(conn, fleet_common::subjects::BUCKET_OPERATOR)?;
    let mut aborted = false;
    let (state, rev) = loop {
        let (mut state, rev) = staged::must_read(&store, id)?;
        if state.workload.is_none() {
            return Err(CtlError::Refused(format!(
                "rollout {id} rolls out {}, not a workload: undo is for workload rollouts (roll an agent back with a rollout of the older release)",
                staged::target_text(&state)
            )));
        }
        if state.phase != RolloutPhase::Running {
            break (state, rev);
        }
        state.phase = RolloutPhase::Aborted;
        state.updated_at = Timestamp::now();
        if let Some(r) = staged::write_state(&store, &state, Some(rev))? {
            aborted = true;
            break (state, r);
        }
    };
    let Some(target) = state.workload.as_ref() else {
        return Err(CtlError::Refused(format!(
            "rollout {id} is not a workload rollout"
        )));
    };
    let facts = read_facts(conn)?;
    let mut lines: BTreeMap<DeviceId, String> = BTreeMap::new();
    let mut writes: Vec<SpecWrite> = Vec::new();
    let mut failed = 0usize;
    let (mut already, mut changed) = (0usize, 0usize);
    for (dev, prev) in &target.previous.by_device() {
        let (doc, seq) = match facts.docs.get(dev) {
            None => (&Ok(Document::default()), 0),
            Some((d, s)) => (d, *s),
        };
        let doc = match doc {
            Ok(d) => d,
            Err(why) => {
                failed += 1;
                lines.insert(dev.clone(), format!("{dev}: not put back: {why}"));
                continue;
            }
        };
        let current = doc.spec(&target.workload);
        let holds = |h: &Sha256Hex| matches!(&current, Some(Ok(s)) if &s.spec_hash() == h);
        if !holds(&target.spec_hash) {
            let back = match prev {
                PreviousSpec::Absent => current.is_none(),
                PreviousSpec::Spec(h) => holds(h),
                PreviousSpec::Invalid => false,
            };
            let line = if back {
                already += 1;
                format!("{dev}: already on its previous spec")
            } else {
                changed += 1;
                format!(
                    "{dev}: left alone: its document no longer holds this rollout's spec (changed since)"
                )
            };
            lines.insert(dev.clone(), line);
            continue;
        }
        let mut workloads = doc.workloads.clone();
        match prev {
            PreviousSpec::Absent => {
                workloads.remove(target.workload.as_str());
            }
            PreviousSpec::Spec(h) => {
                let Some(raw) = target
                    .previous
                    .spec(h)
                    .and_then(|s| serde_json::value::to_raw_value(s).ok())
                else {
                    failed += 1;
                    lines.insert(
                        dev.clone(),
                        format!(
                            "{dev}: not put back: spec {} is missing from the rollout's state",
                            short(h)
                        ),
                    );
                    continue;
                };
                workloads.insert(target.workload.to_string(), raw);
            }
            PreviousSpec::Invalid => {
                failed += 1;
                lines.insert(
                    dev.clone(),
                    format!("{dev}: not put back: its previous spec was invalid; write one with fleetctl workload apply"),
                );
                continue;
            }
        }
        let bytes = serde_json::to_vec(&Document { workloads })
            .map_err(|e| CtlError::Input(e.to_string()))?;
        writes.push(SpecWrite {
            device: dev.clone(),
            seq,
            doc: bytes,
            previous: prev.clone(),
            previous_spec: None,
        });
    }
    let outcomes = cas_docs(conn, writes.iter())?;
    let legacy = legacy_store(conn)?.is_some();
    // The legacy keys of the devices put back, written after them in one
    // pipelined batch each (agents 0.1.0 read them).
    let mut legacy_puts: Vec<CasWrite> = Vec::new();
    let mut legacy_deletes: Vec<String> = Vec::new();
    let mut put_back = 0usize;
    for (s, o) in writes.iter().zip(outcomes) {
        let what = match &s.previous {
            PreviousSpec::Spec(h) => format!("{} spec {}", target.workload, short(h)),
            _ => format!("{} removed (it did not have it)", target.workload),
        };
        let line = match o {
            CasOutcome::Written { seq } => {
                put_back += 1;
                if legacy {
                    let key = desired_key(&s.device, &target.workload);
                    let spec = match &s.previous {
                        PreviousSpec::Spec(h) => target.previous.spec(h),
                        _ => None,
                    };
                    match spec {
                        Some(spec) => legacy_puts.push(CasWrite {
                            key,
                            value: serde_json::to_vec(spec)
                                .map_err(|e| CtlError::Input(e.to_string()))?,
                            expected_seq: 0,
                        }),
                        None => legacy_deletes.push(key),
                    }
                }
                format!("{}: put back: {what} (revision {seq})", s.device)
            }
            CasOutcome::Conflict(why) => {
                failed += 1;
                format!(
                    "{}: not put back: its document changed meanwhile ({why}): run undo again",
                    s.device
                )
            }
            CasOutcome::Failed(why) => {
                failed += 1;
                format!(
                    "{}: not put back: the write failed ({why}): run undo again",
                    s.device
                )
            }
        };
        lines.insert(s.device.clone(), line);
    }
    let bucket = fleet_common::subjects::BUCKET_DESIRED;
    let puts = js::put_all(conn, bucket, &legacy_puts)?;
    let deletes = js::delete_all(conn, bucket, &legacy_deletes)?;
    let keys = legacy_puts.iter().map(|w| &w.key).chain(&legacy_deletes);
    for (key, o) in keys.zip(puts.into_iter().chain(deletes)) {
        if let CasOutcome::Failed(why) | CasOutcome::Conflict(why) = o {
            return Err(CtlError::Nats {
                what: format!("writing {bucket} {key} (for agents 0.1.0)"),
                detail: why,
            });
        }
    }
    // The time of the undo, on the state (best effort: the devices are
    // what counts, and a re-run is harmless).
    let mut st = state.clone();
    if let Some(w) = st.workload.as_mut() {
        w.undone_at = Some(Timestamp::now());
    }
    st.updated_at = Timestamp::now();
    let _ = staged::write_state(&store, &st, Some(rev))?;
    let mut out = String::new();
    if aborted {
        let _ = writeln!(out, "rollout {id} aborted: nothing more is written");
    }
    for l in lines.values() {
        let _ = writeln!(out, "{l}");
    }
    let summary = format!(
        "rollout {id} undone: {put_back} devices put back, {already} already back, {changed} changed since (left alone), {failed} not put back\n"
    );
    Ok(Undo {
        lines: out,
        summary,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staged::tests::device as staged_device;
    use crate::staged::{decide_with, new_state, parse_batches, Policy};
    use fleet_common::contracts::{
        ConfigState, Freeze, Revert, RevertReason, RolloutState, WorkloadHealth,
    };
    use fleet_common::validate::Version;
    use std::time::Duration;

    /// Device `dev<i>` on agent 0.3.0.
    fn device(i: usize, now: Timestamp) -> Device {
        let mut d = staged_device(i, now);
        if let Some(info) = d.view.info.as_mut() {
            info.agent_version = Version::parse("0.3.0").expect("v");
        }
        d
    }

    fn spec(tag: &str) -> WorkloadSpec {
        WorkloadSpec::from_json(
            format!(
                r#"{{"image":"localhost/app:1","env":{{"TAG":"{tag}"}},"health":{{"healthy-after-secs":1}}}}"#
            )
            .as_bytes(),
        )
        .expect("spec")
    }

    fn target(s: WorkloadSpec) -> WorkloadRollout {
        WorkloadRollout {
            workload: WorkloadName::parse("web").expect("name"),
            spec_hash: s.spec_hash(),
            spec: s,
            previous: Default::default(),
            undone_at: None,
        }
    }

    fn policy(batches: &str) -> Policy {
        Policy {
            batches: parse_batches(batches).expect("batches"),
            success_threshold_pct: 100,
            batch_timeout: Duration::from_secs(60),
            max_unavailable: None,
            group_by: None,
        }
    }

    /// What NATS holds once `writes` are written: each document, at a
    /// new revision.
    fn apply(facts: &mut Facts, writes: &[Write]) {
        for w in writes {
            let Write::Spec(s) = w else {
                panic!("a spec write")
            };
            let doc = DesiredWorkloadsRaw::from_json(&s.doc).expect("document");
            facts.docs.insert(
                s.device.clone(),
                (
                    Ok(Document {
                        workloads: doc.workloads,
                    }),
                    s.seq + 1,
                ),
            );
        }
    }

    fn healthy(facts: &mut Facts, id: &DeviceId, h: &Sha256Hex, now: Timestamp) {
        let w = WorkloadHealth {
            health: HealthState::Healthy,
            spec_hash: h.clone(),
            last_probe: None,
            restarts_last_hour: 0,
            reverted: None,
            since: now,
        };
        facts.health.insert(
            id.clone(),
            HealthReport {
                workloads: BTreeMap::from([(WorkloadName::parse("web").expect("name"), w)]),
                observed_at: now,
            },
        );
    }

    #[test]
    fn a_resumed_driver_writes_no_device_twice_and_frozen_devices_wait() {
        let now = Timestamp::now();
        let mut devices: Vec<Device> = (0..5).map(|i| device(i, now)).collect();
        if let Some(i) = devices[3].view.info.as_mut() {
            i.config_state.state = ConfigState::Changefreeze(Freeze {
                since: now,
                reason: None,
                caller_uid: 0,
            });
        }
        let old = spec("v1");
        let mut facts = Facts::default();
        // dev00000 runs v1; the others do not have the workload.
        apply(
            &mut facts,
            &[Write::Spec(SpecWrite {
                device: devices[0].view.id.clone(),
                seq: 0,
                doc: serde_json::to_vec(&Document {
                    workloads: BTreeMap::from([(
                        "web".to_owned(),
                        serde_json::value::to_raw_value(&old).expect("raw"),
                    )]),
                })
                .expect("doc"),
                previous: PreviousSpec::Absent,
                previous_spec: None,
            })],
        );
        let t = target(spec("v2"));
        let h = t.spec_hash.clone();
        let (chosen, left_out) = staged::choose(
            &WorkloadJudge {
                target: &t,
                facts: &facts,
            },
            &devices,
        );
        assert!(left_out.is_empty(), "{left_out:?}");
        let mut state: RolloutState = new_state(
            "r-w".into(),
            None,
            Some(t),
            None,
            &policy("2,100%"),
            chosen,
            now,
        )
        .expect("state");
        let fleet: BTreeMap<DeviceId, Device> = devices
            .into_iter()
            .map(|d| (d.view.id.clone(), d))
            .collect();
        let tick = |state: &mut RolloutState, facts: &Facts, seen: &mut BTreeMap<_, _>| {
            let target = state.workload.clone().expect("workload");
            let judge = WorkloadJudge {
                target: &target,
                facts,
            };
            let t = decide_with(state, &fleet, now, seen, &judge);
            if let Some(w) = state.workload.as_mut() {
                record_previous(w, &t.writes);
            }
            t
        };
        let t1 = tick(&mut state, &facts, &mut BTreeMap::new());
        let written: Vec<&str> = t1.writes.iter().map(|w| w.device().as_str()).collect();
        assert_eq!(written, ["dev00000", "dev00001"]);
        apply(&mut facts, &t1.writes);
        // Killed here; another driver (nothing seen) writes nothing again.
        let t2 = tick(&mut state, &facts, &mut BTreeMap::new());
        assert!(t2.writes.is_empty(), "{:?}", t2.writes);
        assert_eq!(t2.counts.in_flight, 2);
        let w = state.workload.as_ref().expect("workload");
        assert_eq!(
            w.previous
                .by_device()
                .get(&fleet.keys().next().cloned().expect("id")),
            Some(&PreviousSpec::Spec(old.spec_hash()))
        );
        assert_eq!(w.previous.spec(&old.spec_hash()), Some(&old));
        assert_eq!(w.previous.absent.len(), 1);
        for id in ["dev00000", "dev00001"] {
            healthy(&mut facts, &DeviceId::parse(id).expect("id"), &h, now);
        }
        let mut seen = BTreeMap::new();
        let t3 = tick(&mut state, &facts, &mut seen);
        assert!(t3.writes.is_empty());
        assert_eq!(state.current_batch, 1);
        let t4 = tick(&mut state, &facts, &mut seen);
        let written: Vec<&str> = t4.writes.iter().map(|w| w.device().as_str()).collect();
        assert_eq!(written, ["dev00002", "dev00004"], "dev00003 is frozen");
        apply(&mut facts, &t4.writes);
        for id in ["dev00002", "dev00004"] {
            healthy(&mut facts, &DeviceId::parse(id).expect("id"), &h, now);
        }
        tick(&mut state, &facts, &mut seen);
        assert_eq!(state.phase, RolloutPhase::Complete);
        assert_eq!(state.results[1].frozen.len(), 1);
        // The state round-trips (what a resuming fleetctl reads).
        let back: RolloutState =
            serde_json::from_slice(&serde_json::to_vec(&state).expect("json")).expect("parse");
        assert_eq!(back, state);
    }

    #[test]
    fn devices_that_cannot_take_the_spec_are_left_out_and_reports_fail_the_others() {
        let now = Timestamp::now();
        let mut devices: Vec<Device> = (0..3).map(|i| device(i, now)).collect();
        if let Some(i) = devices[0].view.info.as_mut() {
            i.agent_version = Version::parse("0.2.0").expect("v");
        }
        let t = target(spec("v2"));
        let mut facts = Facts::default();
        let judge = WorkloadJudge {
            target: &t,
            facts: &facts,
        };
        let (chosen, left_out) = staged::choose(&judge, &devices);
        assert_eq!(chosen.len(), 2);
        assert_eq!(
            left_out,
            ["dev00000: left out: agent 0.2.0 does not read the spec's `health` (it needs agent 0.3.0 or later): upgrade the device first"]
        );
        // Reverted on dev00001; healthy elsewhere on another spec: not done.
        let restored = spec("v1").spec_hash();
        healthy(&mut facts, &devices[1].view.id, &restored, now);
        if let Some(w) = facts
            .health
            .get_mut(&devices[1].view.id)
            .and_then(|r| r.workloads.values_mut().next())
        {
            w.reverted = Some(Revert {
                failed_spec_hash: t.spec_hash.clone(),
                restored_spec_hash: restored.clone(),
                reason: RevertReason::CrashLoop,
                detail: None,
                at: now,
            });
        }
        healthy(&mut facts, &devices[2].view.id, &restored, now);
        let judge = WorkloadJudge {
            target: &t,
            facts: &facts,
        };
        assert_eq!(
            judge.classify(&devices[1]),
            Class::Failed(format!(
                "reverted to spec {} (crash-loop)",
                &restored.as_str()[..12]
            ))
        );
        assert!(matches!(judge.classify(&devices[2]), Class::Waiting(_)));
    }

    #[test]
    fn a_device_written_again_keeps_what_the_last_write_replaced() {
        let mut t = target(spec("v2"));
        let (v0, v1) = (spec("v0"), spec("v1"));
        let d = DeviceId::parse("dev1").expect("id");
        let write = |prev: &WorkloadSpec| {
            Write::Spec(SpecWrite {
                device: d.clone(),
                seq: 1,
                doc: Vec::new(),
                previous: PreviousSpec::Spec(prev.spec_hash()),
                previous_spec: Some(prev.clone()),
            })
        };
        record_previous(&mut t, &[write(&v0)]);
        record_previous(&mut t, &[write(&v1)]);
        assert_eq!(
            t.previous.by_device().get(&d),
            Some(&PreviousSpec::Spec(v1.spec_hash()))
        );
        assert_eq!(t.previous.specs.len(), 1, "{:?}", t.previous);
        assert_eq!(t.previous.spec(&v1.spec_hash()), Some(&v1));
    }

    /// A workload rollout's bookkeeping over 10,000 simulated devices that
    /// report healthy as soon as written, one tick at a time: the slowest
    /// tick and the size of the state (one `fleet-operator` value, bounded
    /// by the server's max_payload) are printed.
    #[test]
    fn ten_thousand_devices_and_the_size_of_their_state() {
        let now = Timestamp::now();
        let devices: Vec<Device> = (0..10_000).map(|i| device(i, now)).collect();
        let old = spec("v1");
        let raw = serde_json::to_vec(&Document {
            workloads: BTreeMap::from([(
                "web".to_owned(),
                serde_json::value::to_raw_value(&old).expect("raw"),
            )]),
        })
        .expect("doc");
        let mut facts = Facts::default();
        for d in &devices {
            let doc = DesiredWorkloadsRaw::from_json(&raw).expect("doc");
            facts.docs.insert(
                d.view.id.clone(),
                (
                    Ok(Document {
                        workloads: doc.workloads,
                    }),
                    7,
                ),
            );
        }
        let t = target(spec("v2"));
        let h = t.spec_hash.clone();
        let started = std::time::Instant::now();
        let (chosen, _) = staged::choose(
            &WorkloadJudge {
                target: &t,
                facts: &facts,
            },
            &devices,
        );
        let mut state = new_state(
            "r-bench".into(),
            None,
            Some(t),
            None,
            &policy("1,1%,10%,100%"),
            chosen,
            now,
        )
        .expect("state");
        let created = started.elapsed();
        let fleet: BTreeMap<DeviceId, Device> = devices
            .into_iter()
            .map(|d| (d.view.id.clone(), d))
            .collect();
        let mut seen = BTreeMap::new();
        let (mut ticks, mut written) = (Vec::new(), 0usize);
        while state.phase == RolloutPhase::Running {
            let started = std::time::Instant::now();
            let target = state.workload.clone().expect("workload");
            let tick = decide_with(
                &mut state,
                &fleet,
                now,
                &mut seen,
                &WorkloadJudge {
                    target: &target,
                    facts: &facts,
                },
            );
            if let Some(w) = state.workload.as_mut() {
                record_previous(w, &tick.writes);
            }
            ticks.push(started.elapsed());
            written += tick.writes.len();
            apply(&mut facts, &tick.writes);
            for w in &tick.writes {
                healthy(&mut facts, w.device(), &h, now);
            }
            assert!(ticks.len() < 100, "no progress");
        }
        assert_eq!(state.phase, RolloutPhase::Complete);
        assert_eq!(written, 10_000);
        let bytes = serde_json::to_vec(&state).expect("json").len();
        let slowest = ticks.iter().max().copied().unwrap_or_default();
        eprintln!(
            "workload rollout bookkeeping, 10,000 devices: created in {created:?}, {} ticks, slowest {slowest:?}, state {bytes} bytes",
            ticks.len()
        );
        assert!(slowest < Duration::from_secs(10), "{slowest:?}");
        assert_eq!(state.workload.map(|w| w.previous.specs.len()), Some(1));
    }
}
