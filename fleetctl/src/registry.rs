//! The operator's side of enrollment: `fleetctl device pending|registry|
//! approve|reject|preauthorize|revoke|decommission` over the device
//! registry (`fleet-registry` `<device>` → [`DeviceRecord`], callout layout
//! only; the device's side and the design: `docs/design/enrollment.md`).
//!
//! Steps every decision takes:
//! 1. The whole bucket is read once ([`read_all`]: one consumer, the last
//!    value of every key, with its revision).
//! 2. Every device named is checked against its record ([`step`]: one
//!    `match` on (decision, state)); one refusal refuses the command and
//!    nothing is written.
//! 3. The new records are written by compare-and-set on the revision read
//!    (`Nats-Expected-Last-Subject-Sequence`; 0 for a record created), so
//!    a decision racing with a new enrollment request never overwrites it
//!    silently: approve, reject and preauthorize report the lost race (exit
//!    7); revoke and decommission read again and retry, since they must
//!    win.
//!
//! Revoke and decommission then close the device's live connections:
//! presence finds them (every server's CONNZ of `DEVICES`), and each is
//! closed with its server's kick (`$SYS.REQ.SERVER.<id>.KICK`, imported
//! into `FLEET` as `fleetpresence.KICK.<id>`: callout layout, nats-server
//! 2.10 and later). A server that does not answer leaves the device's
//! connection there until its callout-issued user expires; it is refused
//! at its next connect.
//!
//! Decommission first empties the device's desired workloads (the agent
//! stops and removes them through its reconciler, which honours change
//! freeze), waits until the device reports none (unless forced), marks the
//! record decommissioned, kicks, then deletes the device's keys from every
//! bucket. The record stays, as the archive (state, key, facts).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use fleet_common::contracts::{DeviceRecord, Preauthorized, RecordState, MAX_REASON_CHARS};
use fleet_common::durable;
use fleet_common::limits::NATS_REQUEST_TIMEOUT;
use fleet_common::presence::Presence;
use fleet_common::subjects::{
    device_filter, labels_key, presence_kick_subject, status_key, StatusKey, BUCKET_CONTROL,
    BUCKET_DESIRED, BUCKET_OPERATOR, BUCKET_REGISTRY, BUCKET_STATUS, BUCKET_WORKLOADS,
    LAST_SEEN_PREFIX, PRESENCE_KICK,
};
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::js::{self, CasOutcome, CasWrite};
use crate::labels::table;
use crate::lobby;
use crate::presence::{self, Read};
use crate::selector::Selector;

/// Who an operator's decision is recorded as (`decided_by`).
pub const BY_OPERATOR: &str = "operator";
/// Who a factory-provisioned record is recorded as.
pub const BY_PREAUTHORIZED: &str = "preauthorized";
/// Characters of the public key shown in a table.
const KEY_PREFIX_CHARS: usize = 12;
/// Largest preauthorization file read (about 250,000 lines).
pub const MAX_PREAUTHORIZE_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Rounds of read and compare-and-set a revoke or decommission makes
/// before giving up (each lost one means the record changed meanwhile).
const CAS_ATTEMPTS: usize = 5;
/// How often decommission reads the device's workloads report while it
/// waits (the agent writes it as soon as a removal is done).
const WAIT_POLL: Duration = Duration::from_millis(500);

/// One record and the revision it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub record: DeviceRecord,
    pub seq: u64,
}

/// Every record of the registry, by device.
pub fn read_all(conn: &nats::Connection) -> Result<BTreeMap<DeviceId, Recorded>, CtlError> {
    let entries = js::read_last(conn, BUCKET_REGISTRY, &format!("$KV.{BUCKET_REGISTRY}.*"))?;
    let mut out = BTreeMap::new();
    for e in entries {
        let Some(bytes) = e.value.filter(|v| !v.is_empty()) else {
            continue; // deleted: no record
        };
        let record: DeviceRecord = serde_json::from_slice(&bytes).map_err(|err| {
            CtlError::Refused(format!(
                "{BUCKET_REGISTRY} {} (revision {}) is not a device record: {err}; inspect it with `nats kv get {BUCKET_REGISTRY} {}`",
                e.key, e.seq, e.key
            ))
        })?;
        if record.device_id.as_str() != e.key {
            return Err(CtlError::Refused(format!(
                "{BUCKET_REGISTRY} {} holds the record of device {}: inspect it with `nats kv get {BUCKET_REGISTRY} {}`",
                e.key, record.device_id, e.key
            )));
        }
        out.insert(record.device_id.clone(), Recorded { record, seq: e.seq });
    }
    Ok(out)
}

/// An operator's note on a rejection: at most [`MAX_REASON_CHARS`]
/// characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    pub fn parse(s: &str) -> Result<Reason, String> {
        let n = s.chars().count();
        if n == 0 || s.trim().is_empty() {
            return Err("the reason is empty: say why, or leave --reason out".to_owned());
        }
        if n > MAX_REASON_CHARS {
            return Err(format!(
                "the reason has {n} characters, more than the {MAX_REASON_CHARS} a record keeps"
            ));
        }
        if s.chars().any(char::is_control) {
            return Err("the reason has control characters (a newline?): give one line".to_owned());
        }
        Ok(Reason(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What an operator decides about a recorded device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject(Option<Reason>),
    Revoke,
    Decommission,
}

impl Decision {
    fn verb(&self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject(_) => "reject",
            Self::Revoke => "revoke",
            Self::Decommission => "decommission",
        }
    }

    /// `decided_by` of the record it writes: a rejection's reason rides
    /// there (`operator: <reason>`), so that the record's shape is
    /// unchanged.
    fn decided_by(&self) -> String {
        match self {
            Self::Reject(Some(r)) => format!("{BY_OPERATOR}: {}", r.as_str()),
            _ => BY_OPERATOR.to_owned(),
        }
    }
}

/// What a decision does to a record in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Write the record in this state.
    Write(RecordState),
    /// The record is there already: nothing to write.
    Already,
}

/// The one table of what each decision may do in each state.
pub fn step(d: &Decision, from: RecordState) -> Result<Step, String> {
    use RecordState::{Approved, Decommissioned, Pending, Rejected, Revoked};
    match (d, from) {
        // Re-enrolling a refused, revoked or decommissioned device is this
        // explicit approval.
        (Decision::Approve, Pending | Rejected | Revoked | Decommissioned) => {
            Ok(Step::Write(Approved))
        }
        (Decision::Approve, Approved) => Ok(Step::Already),
        // Rejecting again records the new reason.
        (Decision::Reject(_), Pending | Rejected) => Ok(Step::Write(Rejected)),
        (Decision::Revoke, Approved) => Ok(Step::Write(Revoked)),
        // Revoked already: its connections are closed again.
        (Decision::Revoke, Revoked | Decommissioned) => Ok(Step::Already),
        (Decision::Decommission, Pending | Approved | Rejected | Revoked) => {
            Ok(Step::Write(Decommissioned))
        }
        // Decommissioned already: its keys are deleted again.
        (Decision::Decommission, Decommissioned) => Ok(Step::Already),
        (d, s) => {
            let what_instead = match (d, s) {
                (Decision::Reject(_), Approved) => {
                    "it may connect: revoke it instead (fleetctl device revoke)"
                }
                (Decision::Revoke, Pending) => {
                    "it never joined: reject it instead (fleetctl device reject)"
                }
                _ => "it may not connect already",
            };
            Err(format!(
                "cannot {} a device in state {}: {what_instead}",
                d.verb(),
                s.as_str()
            ))
        }
    }
}

/// `record` after `d` took it to `state` at `now`. Nothing else changes
/// (the key, the facts, a recorded conflict stay).
fn decided(
    record: &DeviceRecord,
    state: RecordState,
    d: &Decision,
    now: Timestamp,
) -> DeviceRecord {
    let mut r = record.clone();
    r.state = state;
    r.decided_at = Some(now);
    r.decided_by = Some(d.decided_by());
    r
}

fn encode(record: &DeviceRecord) -> Result<Vec<u8>, CtlError> {
    serde_json::to_vec(record).map_err(|e| CtlError::Input(format!("encoding a record: {e}")))
}

/// What became of one device's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub device: DeviceId,
    /// Its state now.
    pub state: RecordState,
    /// Whether this command wrote it (false: it was there already).
    pub written: bool,
}

/// Whether a decision that lost a compare-and-set reads again and retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnConflict {
    /// Report it (exit 7): the operator looks at the new record.
    Report,
    /// Read again and decide again (the decision must win: revoke).
    Retry,
}

/// Takes `d` for every device of `ids` (see the module documentation).
fn decide(
    conn: &nats::Connection,
    ids: &[DeviceId],
    d: &Decision,
    now: Timestamp,
    on_conflict: OnConflict,
) -> Result<Vec<Decided>, CtlError> {
    let attempts = match on_conflict {
        OnConflict::Report => 1,
        OnConflict::Retry => CAS_ATTEMPTS,
    };
    let mut done: BTreeMap<DeviceId, Decided> = BTreeMap::new();
    let mut todo: Vec<DeviceId> = ids.to_vec();
    for attempt in 0..attempts {
        let records = read_all(conn)?;
        let mut refusals = Vec::new();
        let mut writes = Vec::new();
        for id in &todo {
            let Some(r) = records.get(id) else {
                refusals.push(no_record(id));
                continue;
            };
            match step(d, r.record.state) {
                Err(why) => refusals.push(format!("device {id}: {why}")),
                Ok(Step::Already) => {
                    done.insert(
                        id.clone(),
                        Decided {
                            device: id.clone(),
                            state: r.record.state,
                            written: false,
                        },
                    );
                }
                Ok(Step::Write(state)) => writes.push((
                    id.clone(),
                    state,
                    CasWrite {
                        key: id.to_string(),
                        value: encode(&decided(&r.record, state, d, now))?,
                        expected_seq: r.seq,
                    },
                )),
            }
        }
        if !refusals.is_empty() {
            let written = if attempt == 0 {
                "nothing was written".to_owned()
            } else {
                format!("written before the record changed: {}", summary(&done))
            };
            return Err(CtlError::Refused(format!(
                "{}; {written}",
                refusals.join("; ")
            )));
        }
        let cas: Vec<CasWrite> = writes.iter().map(|(_, _, w)| w.clone()).collect();
        let outcomes = js::cas_put_all(conn, BUCKET_REGISTRY, &cas)?;
        let mut lost = Vec::new();
        for ((id, state, _), outcome) in writes.into_iter().zip(outcomes) {
            match outcome {
                CasOutcome::Written { .. } => {
                    done.insert(
                        id.clone(),
                        Decided {
                            device: id,
                            state,
                            written: true,
                        },
                    );
                }
                CasOutcome::Conflict(_) => lost.push(id),
                CasOutcome::Failed(why) => {
                    return Err(CtlError::Nats {
                        what: format!("writing {BUCKET_REGISTRY} {id}"),
                        detail: format!("{why}; written before it: {}", summary(&done)),
                    })
                }
            }
        }
        if lost.is_empty() {
            let decided: BTreeMap<DeviceId, RecordState> = done
                .values()
                .filter(|x| x.written)
                .map(|x| (x.device.clone(), x.state))
                .collect();
            free_lobby(conn, &records, &decided, now);
            return Ok(ids.iter().filter_map(|id| done.remove(id)).collect());
        }
        todo = lost;
    }
    let lost: Vec<String> = todo.iter().map(ToString::to_string).collect();
    Err(CtlError::Conflict(format!(
        "the record of {} changed between the read and the write (a new enrollment request?): not written; written: {}; look at it (fleetctl device registry) and run the command again",
        lost.join(", "),
        summary(&done)
    )))
}

/// Frees the lobby places of devices this command took out of pending
/// (`decided`: their states now; `records`: every record as read before),
/// saying so on stderr. Nothing to do when none of them was pending.
fn free_lobby(
    conn: &nats::Connection,
    records: &BTreeMap<DeviceId, Recorded>,
    decided: &BTreeMap<DeviceId, RecordState>,
    now: Timestamp,
) {
    let was_pending = decided.keys().any(|id| {
        records
            .get(id)
            .is_some_and(|r| r.record.state == RecordState::Pending)
    });
    if !was_pending {
        return;
    }
    eprintln!(
        "{}",
        lobby::sweep_line(
            conn,
            &state_now(records, decided),
            &still_pending(records, decided, now),
            now
        )
    );
}

/// The devices whose record is pending now, with when each asked (`now`
/// for a record that does not say).
fn still_pending(
    records: &BTreeMap<DeviceId, Recorded>,
    decided: &BTreeMap<DeviceId, RecordState>,
    now: Timestamp,
) -> Vec<(String, Timestamp)> {
    records
        .iter()
        .filter(|(id, r)| {
            decided.get(*id).copied().unwrap_or(r.record.state) == RecordState::Pending
        })
        .map(|(id, r)| (id.as_str().to_owned(), r.record.requested_at.unwrap_or(now)))
        .collect()
}

/// A device's record state now, from the records read and what was
/// written since.
fn state_now<'a>(
    records: &'a BTreeMap<DeviceId, Recorded>,
    decided: &'a BTreeMap<DeviceId, RecordState>,
) -> impl Fn(&str) -> Option<RecordState> + 'a {
    move |id| {
        let id = DeviceId::parse(id).ok()?;
        decided
            .get(&id)
            .copied()
            .or_else(|| records.get(&id).map(|r| r.record.state))
    }
}

fn summary(done: &BTreeMap<DeviceId, Decided>) -> String {
    let v: Vec<String> = done
        .values()
        .filter(|d| d.written)
        .map(|d| d.device.to_string())
        .collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

fn no_record(id: &DeviceId) -> String {
    format!(
        "no enrollment request from {id}: use `fleetctl device preauthorize` (a device with a key) or `fleetctl device approve --id-only {id}` (a device with an identity-provider token)"
    )
}

/// The first characters of a public key, for a table.
fn key_prefix(key: Option<&str>) -> String {
    key.map_or_else(
        || "-".to_owned(),
        |k| k.chars().take(KEY_PREFIX_CHARS).collect(),
    )
}

fn facts_cell(facts: &BTreeMap<String, String>) -> String {
    if facts.is_empty() {
        return "-".to_owned();
    }
    facts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn conflict_cell(r: &DeviceRecord) -> String {
    r.conflict.as_ref().map_or_else(
        || "-".to_owned(),
        |c| {
            format!(
                "{} asked {}x, last {}",
                key_prefix(Some(&c.public_key)),
                c.count,
                c.at
            )
        },
    )
}

fn time_cell(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_string())
}

/// A record's attributes for a selector: its facts, `device` and `state`.
fn attributes(r: &DeviceRecord) -> BTreeMap<String, String> {
    let mut a = r.facts.clone();
    a.insert("device".into(), r.device_id.to_string());
    a.insert("state".into(), r.state.as_str().to_owned());
    a
}

fn matches(r: &DeviceRecord, sel: &Selector) -> bool {
    let a = attributes(r);
    sel.matches(|k| a.get(k).map(String::as_str))
}

fn json_lines(records: &[&DeviceRecord]) -> Result<String, CtlError> {
    let mut s = serde_json::to_string_pretty(records)
        .map_err(|e| CtlError::Input(format!("encoding records: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// `fleetctl device pending`: every pending record, and every record (any
/// state) carrying a conflicting request.
pub fn pending(conn: &nats::Connection, json: bool) -> Result<String, CtlError> {
    let records = read_all(conn)?;
    let now = Timestamp::now();
    let lobby = lobby::sweep_line(
        conn,
        &state_now(&records, &BTreeMap::new()),
        &still_pending(&records, &BTreeMap::new(), now),
        now,
    );
    let rows: Vec<&DeviceRecord> = records
        .values()
        .map(|r| &r.record)
        .filter(|r| r.state == RecordState::Pending || r.conflict.is_some())
        .collect();
    if json {
        return json_lines(&rows);
    }
    let mut table_rows = vec![[
        "DEVICE".to_owned(),
        "STATE".to_owned(),
        "KEY".to_owned(),
        "REQUESTED".to_owned(),
        "CONFLICT".to_owned(),
        "FACTS".to_owned(),
    ]];
    for r in &rows {
        table_rows.push([
            r.device_id.to_string(),
            r.state.as_str().to_owned(),
            key_prefix(r.public_key.as_deref()),
            time_cell(r.requested_at),
            conflict_cell(r),
            facts_cell(&r.facts),
        ]);
    }
    let mut out = table(&table_rows);
    let conflicts = rows.iter().filter(|r| r.conflict.is_some()).count();
    let _ = writeln!(
        out,
        "{} pending, {conflicts} with a conflicting request (another key asked for the id: approve the pending key only if it is the device's)",
        rows.iter()
            .filter(|r| r.state == RecordState::Pending)
            .count()
    );
    let _ = writeln!(out, "{lobby}");
    Ok(out)
}

/// `fleetctl device registry [-l SELECTOR]`: every record with its state.
pub fn registry(
    conn: &nats::Connection,
    sel: Option<&Selector>,
    json: bool,
) -> Result<String, CtlError> {
    let records = read_all(conn)?;
    let rows: Vec<&DeviceRecord> = records
        .values()
        .map(|r| &r.record)
        .filter(|r| sel.is_none_or(|s| matches(r, s)))
        .collect();
    if json {
        return json_lines(&rows);
    }
    let mut table_rows = vec![[
        "DEVICE".to_owned(),
        "STATE".to_owned(),
        "KEY".to_owned(),
        "DECIDED".to_owned(),
        "BY".to_owned(),
        "CONFLICT".to_owned(),
        "FACTS".to_owned(),
    ]];
    for r in &rows {
        table_rows.push([
            r.device_id.to_string(),
            r.state.as_str().to_owned(),
            key_prefix(r.public_key.as_deref()),
            time_cell(r.decided_at),
            r.decided_by.clone().unwrap_or_else(|| "-".to_owned()),
            conflict_cell(r),
            facts_cell(&r.facts),
        ]);
    }
    let mut out = table(&table_rows);
    let _ = writeln!(out, "{} records", rows.len());
    Ok(out)
}

/// Which devices an approval names.
#[derive(Debug, Clone)]
pub enum Approval {
    /// These recorded devices.
    Ids(Vec<DeviceId>),
    /// The pending records whose facts match.
    Selector(Selector),
    /// New records, approved without a key (devices that authenticate
    /// with an identity-provider token and have not asked).
    IdOnly(Vec<DeviceId>),
}

fn decided_lines(decided: &[Decided], verb: &str) -> String {
    let mut out = String::new();
    for d in decided {
        if d.written {
            let _ = writeln!(out, "{}: {verb}", d.device);
        } else {
            let _ = writeln!(out, "{}: {} already", d.device, d.state.as_str());
        }
    }
    out
}

/// `fleetctl device approve`.
pub fn approve(
    conn: &nats::Connection,
    which: &Approval,
    now: Timestamp,
) -> Result<String, CtlError> {
    match which {
        Approval::Ids(ids) => {
            let d = decide(conn, ids, &Decision::Approve, now, OnConflict::Report)?;
            Ok(decided_lines(&d, "approved"))
        }
        Approval::Selector(sel) => {
            let ids: Vec<DeviceId> = read_all(conn)?
                .into_values()
                .map(|r| r.record)
                .filter(|r| r.state == RecordState::Pending && matches(r, sel))
                .map(|r| r.device_id)
                .collect();
            if ids.is_empty() {
                return Ok(format!(
                    "no pending record matches {}: nothing approved\n",
                    sel.as_str()
                ));
            }
            let d = decide(conn, &ids, &Decision::Approve, now, OnConflict::Report)?;
            Ok(decided_lines(&d, "approved"))
        }
        Approval::IdOnly(ids) => approve_id_only(conn, ids, now),
    }
}

fn approve_id_only(
    conn: &nats::Connection,
    ids: &[DeviceId],
    now: Timestamp,
) -> Result<String, CtlError> {
    let records = read_all(conn)?;
    let recorded: Vec<String> = ids
        .iter()
        .filter_map(|id| records.get(id).map(|r| (id, r.record.state)))
        .map(|(id, s)| {
            format!(
                "device {id} has a record (state {}): approve it without --id-only",
                s.as_str()
            )
        })
        .collect();
    if !recorded.is_empty() {
        return Err(CtlError::Refused(format!(
            "{}; nothing was written",
            recorded.join("; ")
        )));
    }
    let mut writes = Vec::new();
    for id in ids {
        writes.push(CasWrite {
            key: id.to_string(),
            value: encode(&DeviceRecord {
                device_id: id.clone(),
                state: RecordState::Approved,
                public_key: None,
                facts: BTreeMap::new(),
                requested_at: None,
                decided_at: Some(now),
                decided_by: Some(BY_OPERATOR.to_owned()),
                conflict: None,
            })?,
            expected_seq: 0,
        });
    }
    let outcomes = js::cas_put_all(conn, BUCKET_REGISTRY, &writes)?;
    created_lines(ids, outcomes, "approved by id alone")
}

/// One line per created record; a lost create (the device asked
/// meanwhile) or a failure is the command's error.
fn created_lines(
    ids: &[DeviceId],
    outcomes: Vec<CasOutcome>,
    verb: &str,
) -> Result<String, CtlError> {
    let mut out = String::new();
    let mut lost = Vec::new();
    let mut failed = Vec::new();
    for (id, o) in ids.iter().zip(outcomes) {
        match o {
            CasOutcome::Written { .. } => {
                let _ = writeln!(out, "{id}: {verb}");
            }
            CasOutcome::Conflict(_) => lost.push(id.to_string()),
            CasOutcome::Failed(why) => failed.push(format!("{id}: {why}")),
        }
    }
    if !failed.is_empty() {
        return Err(CtlError::Nats {
            what: format!("writing {BUCKET_REGISTRY}"),
            detail: format!("{}; written:\n{out}", failed.join("; ")),
        });
    }
    if !lost.is_empty() {
        return Err(CtlError::Conflict(format!(
            "{} got a record between the read and the write (the device asked meanwhile): not written; look at it (fleetctl device pending) and run the command again; written:\n{out}",
            lost.join(", ")
        )));
    }
    Ok(out)
}

/// `fleetctl device reject`.
pub fn reject(
    conn: &nats::Connection,
    ids: &[DeviceId],
    reason: Option<Reason>,
    now: Timestamp,
) -> Result<String, CtlError> {
    let d = decide(
        conn,
        ids,
        &Decision::Reject(reason),
        now,
        OnConflict::Report,
    )?;
    Ok(decided_lines(&d, "rejected"))
}

/// The lines of a preauthorization file, checked: each a [`Preauthorized`]
/// with a user key, no device twice. Errors name the line.
pub fn parse_preauthorized(text: &str) -> Result<Vec<Preauthorized>, String> {
    let mut out: Vec<Preauthorized> = Vec::new();
    let mut seen: BTreeMap<DeviceId, usize> = BTreeMap::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let p: Preauthorized = match serde_json::from_str(line) {
            Ok(p) => p,
            Err(e) => {
                errors.push(format!("line {n}: {e}"));
                continue;
            }
        };
        if let Err(e) = p.check() {
            errors.push(format!("line {n}: {e}"));
            continue;
        }
        if let Some(first) = seen.insert(p.device_id.clone(), n) {
            errors.push(format!(
                "line {n}: device {} is on line {first} too",
                p.device_id
            ));
            continue;
        }
        out.push(p);
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    if out.is_empty() {
        return Err("no device in the file (one JSON object per line: {\"device-id\": ..., \"public-key\": ...})".to_owned());
    }
    Ok(out)
}

/// What preauthorizing one line does to its device's record.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Preauth {
    /// No record: created, approved.
    Create,
    /// A pending request with this key: approved.
    ApprovePending(Box<Recorded>),
    /// Approved with this key already.
    Already,
}

fn preauth_plan(p: &Preauthorized, r: Option<&Recorded>) -> Result<Preauth, String> {
    let Some(r) = r else {
        return Ok(Preauth::Create);
    };
    let id = &p.device_id;
    match r.record.public_key.as_deref() {
        Some(k) if k == p.public_key => match r.record.state {
            RecordState::Approved => Ok(Preauth::Already),
            RecordState::Pending => Ok(Preauth::ApprovePending(Box::new(r.clone()))),
            s => Err(format!(
                "device {id} is {} with this key: approve it explicitly (fleetctl device approve {id})",
                s.as_str()
            )),
        },
        Some(k) => Err(format!(
            "device {id} is recorded with another key ({}, state {}): a second device may claim the id; decide it with fleetctl device registry and approve or reject",
            key_prefix(Some(k)),
            r.record.state.as_str()
        )),
        None => Err(format!(
            "device {id} is recorded without a key (state {}, an identity-provider device): leave it out of the file",
            r.record.state.as_str()
        )),
    }
}

/// `fleetctl device preauthorize --file F`.
pub fn preauthorize(
    conn: &nats::Connection,
    file: &Path,
    now: Timestamp,
) -> Result<String, CtlError> {
    let bytes = durable::read_bounded(file, MAX_PREAUTHORIZE_FILE_BYTES)
        .map_err(|e| CtlError::Input(format!("{e}; nothing was written")))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        CtlError::Input(format!(
            "{}: not UTF-8 text; nothing was written",
            file.display()
        ))
    })?;
    let lines = parse_preauthorized(&text)
        .map_err(|e| CtlError::Input(format!("{}:\n{e}\nnothing was written", file.display())))?;
    let records = read_all(conn)?;
    let mut refusals = Vec::new();
    let mut plans = Vec::new();
    for p in &lines {
        match preauth_plan(p, records.get(&p.device_id)) {
            Ok(plan) => plans.push((p, plan)),
            Err(e) => refusals.push(e),
        }
    }
    if !refusals.is_empty() {
        return Err(CtlError::Refused(format!(
            "{}:\n{}\nnothing was written",
            file.display(),
            refusals.join("\n")
        )));
    }
    let mut ids = Vec::new();
    let mut writes = Vec::new();
    let mut already = 0usize;
    for (p, plan) in plans {
        let (record, expected_seq) = match plan {
            Preauth::Already => {
                already += 1;
                continue;
            }
            Preauth::Create => (
                DeviceRecord {
                    device_id: p.device_id.clone(),
                    state: RecordState::Approved,
                    public_key: Some(p.public_key.clone()),
                    facts: BTreeMap::new(),
                    requested_at: None,
                    decided_at: Some(now),
                    decided_by: Some(BY_PREAUTHORIZED.to_owned()),
                    conflict: None,
                },
                0,
            ),
            Preauth::ApprovePending(r) => {
                let mut rec = r.record;
                rec.state = RecordState::Approved;
                rec.decided_at = Some(now);
                rec.decided_by = Some(BY_PREAUTHORIZED.to_owned());
                (rec, r.seq)
            }
        };
        ids.push(p.device_id.clone());
        writes.push(CasWrite {
            key: p.device_id.to_string(),
            value: encode(&record)?,
            expected_seq,
        });
    }
    let outcomes = js::cas_put_all(conn, BUCKET_REGISTRY, &writes)?;
    let mut out = created_lines(&ids, outcomes, "preauthorized")?;
    let decided: BTreeMap<DeviceId, RecordState> = ids
        .iter()
        .map(|id| (id.clone(), RecordState::Approved))
        .collect();
    free_lobby(conn, &records, &decided, now);
    let _ = writeln!(
        out,
        "{} preauthorized, {already} already approved with the same key",
        ids.len()
    );
    Ok(out)
}

/// The connections closed of one device, and what may remain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kicked {
    pub closed: usize,
    /// Why a connection may remain (a server that did not answer).
    pub gaps: Vec<String>,
}

impl Kicked {
    fn line(&self) -> String {
        let n = self.closed;
        let s = if n == 1 { "" } else { "s" };
        let mut line = format!("{n} connection{s} closed");
        if !self.gaps.is_empty() {
            let _ = write!(
                line,
                " ({}): the device is refused at its next connect, and a connection it holds there ends when its callout-issued user expires (the callout's max_user_lifetime_secs)",
                self.gaps.join("; ")
            );
        }
        line
    }
}

/// The kick's answer: `error` set when it failed.
#[derive(serde::Deserialize)]
struct KickAnswer {
    #[serde(default)]
    error: Option<fleet_common::presence::AnswerError>,
}

/// Kicks connection `cid` of server `server_id`: Ok(true) closed, Ok(false)
/// not there (closed meanwhile), Err(why) unanswered or refused.
fn kick(conn: &nats::Connection, server_id: &str, cid: u64) -> Result<bool, String> {
    let body = serde_json::json!({ "cid": cid }).to_string();
    match conn.request_timeout(
        &presence_kick_subject(server_id),
        body,
        NATS_REQUEST_TIMEOUT,
    ) {
        Ok(m) => match serde_json::from_slice::<KickAnswer>(&m.data) {
            Ok(KickAnswer { error: None }) => Ok(true),
            // Closed meanwhile (the server's words: "no such client or
            // leafnode id").
            Ok(KickAnswer { error: Some(e) }) if e.description.contains("no such client") => {
                Ok(false)
            }
            Ok(KickAnswer { error: Some(e) }) => Err(format!(
                "server {server_id} refused the kick: {} ({})",
                e.description, e.code
            )),
            Err(e) => Err(format!("server {server_id} answered the kick oddly: {e}")),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("no server {server_id} answers {PRESENCE_KICK}"))
        }
        Err(e) => Err(format!("server {server_id} did not answer the kick: {e}")),
    }
}

/// Refuses (before anything is written) on a server config that gives
/// fleetctl no kick: the static layout, a config from before revoke, or
/// a server before 2.10. `command`: the command's name, for the message.
pub fn require_kick(conn: &nats::Connection, command: &str) -> Result<(), CtlError> {
    let refuse = |why: String| {
        CtlError::Refused(format!(
            "fleetctl device {command} needs the auth-callout layout on nats-server 2.10 or later (fleetctl nats-config --auth-callout): {why}; nothing was written"
        ))
    };
    let p = match presence::read(conn)? {
        Read::Known(p) => p,
        Read::Unavailable(why) => return Err(refuse(why)),
    };
    let Some(id) = p.server_ids.values().next() else {
        return Err(refuse("no server said its id".to_owned()));
    };
    // No connection has id 0: a server with the kick answers "no such
    // client"; any answer says the kick is there.
    let body = serde_json::json!({ "cid": 0 }).to_string();
    match conn.request_timeout(&presence_kick_subject(id), body, NATS_REQUEST_TIMEOUT) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(refuse(format!(
            "no server answers {PRESENCE_KICK} (a static config, a callout config from before revoke, or a server before 2.10: regenerate the config)"
        ))),
        Err(e) => Err(refuse(format!("server {id} did not answer the kick: {e}"))),
    }
}

/// Closes every live connection of each of `ids`.
pub fn kick_all(
    conn: &nats::Connection,
    ids: &[DeviceId],
) -> Result<BTreeMap<DeviceId, Kicked>, CtlError> {
    let p: Presence = match presence::read(conn)? {
        Read::Known(p) => p,
        Read::Unavailable(why) => {
            return Ok(ids
                .iter()
                .map(|id| {
                    (
                        id.clone(),
                        Kicked {
                            closed: 0,
                            gaps: vec![why.clone()],
                        },
                    )
                })
                .collect())
        }
    };
    let cluster_gaps = p.gaps();
    let mut out = BTreeMap::new();
    for id in ids {
        let mut k = Kicked {
            closed: 0,
            gaps: cluster_gaps.clone(),
        };
        let conns: BTreeSet<_> = p.connections.get(id).cloned().unwrap_or_default();
        for c in conns {
            match kick(conn, &c.server_id, c.cid) {
                Ok(true) => k.closed += 1,
                Ok(false) => {}
                Err(why) => k.gaps.push(format!("server {}: {why}", c.server)),
            }
        }
        out.insert(id.clone(), k);
    }
    Ok(out)
}

/// `fleetctl device revoke`.
pub fn revoke(
    conn: &nats::Connection,
    ids: &[DeviceId],
    now: Timestamp,
) -> Result<String, CtlError> {
    require_kick(conn, "revoke")?;
    let decided = decide(conn, ids, &Decision::Revoke, now, OnConflict::Retry)?;
    let kicked = kick_all(conn, ids)?;
    let mut out = String::new();
    for d in &decided {
        let state = if d.written {
            "revoked".to_owned()
        } else {
            format!("{} already", d.state.as_str())
        };
        let k = kicked.get(&d.device).cloned().unwrap_or_default();
        let _ = writeln!(out, "{}: {state}; {}", d.device, k.line());
    }
    Ok(out)
}

/// How decommission waits for the device to remove its workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Until it reports none, at most this long.
    Wait(Duration),
    /// Not at all (an offline or broken device).
    Force,
}

/// `fleetctl device decommission`.
pub fn decommission(
    conn: &nats::Connection,
    id: &DeviceId,
    drain: Drain,
    now: impl Fn() -> Timestamp,
) -> Result<String, CtlError> {
    let records = read_all(conn)?;
    let Some(r) = records.get(id) else {
        return Err(CtlError::Refused(format!(
            "no record of device {id} in {BUCKET_REGISTRY}: nothing to decommission (fleetctl device registry lists them); nothing was written"
        )));
    };
    // Every state may be decommissioned; the table says so.
    step(&Decision::Decommission, r.record.state).map_err(CtlError::Refused)?;
    require_kick(conn, "decommission")?;
    let mut out = String::new();
    crate::workload::remove_all(conn, id)?;
    let _ = writeln!(out, "{id}: desired workloads emptied");
    match drain {
        Drain::Force => {
            let _ = writeln!(out, "{id}: not waiting for its workloads to go (--force)");
        }
        Drain::Wait(wait) => {
            wait_for_no_workloads(conn, id, wait)?;
            let _ = writeln!(out, "{id}: reports no workloads");
        }
    }
    decide(
        conn,
        std::slice::from_ref(id),
        &Decision::Decommission,
        now(),
        OnConflict::Retry,
    )?;
    let _ = writeln!(out, "{id}: decommissioned");
    let kicked = kick_all(conn, std::slice::from_ref(id))?;
    let k = kicked.get(id).cloned().unwrap_or_default();
    let _ = writeln!(out, "{id}: {}", k.line());
    let deleted = delete_device_keys(conn, id)?;
    let _ = writeln!(
        out,
        "{id}: {deleted} keys deleted; its record stays in {BUCKET_REGISTRY} (state decommissioned, key and facts kept): re-enrolling needs fleetctl device approve {id}"
    );
    Ok(out)
}

/// The workloads a `fleet-status` `<device>.workloads` report lists.
#[derive(serde::Deserialize)]
struct Listed {
    workloads: BTreeMap<String, serde::de::IgnoredAny>,
}

/// Polls `<device>.workloads` of `fleet-status` until it lists none, at
/// most `wait`.
fn wait_for_no_workloads(
    conn: &nats::Connection,
    id: &DeviceId,
    wait: Duration,
) -> Result<(), CtlError> {
    let store = js::kv(conn, BUCKET_STATUS)?;
    let key = status_key(id, StatusKey::Workloads);
    let deadline = Instant::now() + wait;
    let mut last: Option<Vec<String>> = None;
    loop {
        let value = store
            .get(&key)
            .map_err(CtlError::nats(format!("reading {BUCKET_STATUS} {key}")))?;
        if let Some(bytes) = value.filter(|v| !v.is_empty()) {
            // Read tolerantly: only which workloads it lists matters.
            if let Ok(report) = serde_json::from_slice::<Listed>(&bytes) {
                if report.workloads.is_empty() {
                    return Ok(());
                }
                last = Some(report.workloads.into_keys().collect());
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(WAIT_POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    let frozen = crate::fleet::read(
        conn,
        &crate::fleet::Scope::Device(id.clone()),
        crate::fleet::Keys::Upgrade,
    )
    .ok()
    .and_then(|v| v.get(id).and_then(|d| d.info.clone()))
    .is_some_and(|i| i.config_state.state.is_frozen());
    let what = match last {
        Some(w) => format!("still reports workloads {}", w.join(", ")),
        None => "has not reported its workloads".to_owned(),
    };
    let why = if frozen {
        "it is in change freeze (its workloads stay until someone on the device unfreezes it)"
    } else {
        "it is offline, or still removing them"
    };
    Err(CtlError::Refused(format!(
        "device {id} {what} after {} s: {why}. Its desired workloads are empty now (the agent removes them when it can); nothing else was changed: run the command again later, or with --force to decommission it without waiting",
        wait.as_secs()
    )))
}

/// Deletes every key of `id` in the device buckets and its labels and
/// last-seen in `fleet-operator`; the number deleted.
fn delete_device_keys(conn: &nats::Connection, id: &DeviceId) -> Result<usize, CtlError> {
    let operator_keys = [labels_key(id), format!("{LAST_SEEN_PREFIX}.{id}")];
    let mut targets: Vec<(&str, String)> = [
        BUCKET_WORKLOADS,
        BUCKET_CONTROL,
        BUCKET_DESIRED,
        BUCKET_STATUS,
    ]
    .into_iter()
    .map(|b| (b, device_filter(b, id)))
    .collect();
    targets.extend(
        operator_keys
            .iter()
            .map(|k| (BUCKET_OPERATOR, format!("$KV.{BUCKET_OPERATOR}.{k}"))),
    );
    let mut deleted = 0usize;
    for (bucket, filter) in targets {
        let entries = match js::read_last(conn, bucket, &filter) {
            Ok(e) => e,
            // fleet-desired retired (no agent 0.1.0 left): nothing there.
            Err(CtlError::Nats { detail, .. })
                if bucket == BUCKET_DESIRED && detail.contains("(code 10059)") =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        let keys: Vec<String> = entries
            .into_iter()
            .filter(|e| e.value.is_some())
            .map(|e| e.key)
            .collect();
        for (key, o) in keys.iter().zip(js::delete_all(conn, bucket, &keys)?) {
            match o {
                CasOutcome::Written { .. } => deleted += 1,
                CasOutcome::Conflict(why) | CasOutcome::Failed(why) => {
                    return Err(CtlError::Nats {
                        what: format!("deleting {bucket} {key} of decommissioned device {id}"),
                        detail: format!(
                            "{why}; {deleted} keys deleted before it: run fleetctl device decommission {id} --force again to delete the rest"
                        ),
                    })
                }
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> String {
        nkeys::KeyPair::new_user().public_key()
    }

    #[test]
    fn every_decision_has_one_step_per_state() {
        use RecordState::*;
        let all = [Pending, Approved, Rejected, Revoked, Decommissioned];
        let table = [
            (Decision::Approve, [Step::Write(Approved), Step::Already, Step::Write(Approved), Step::Write(Approved), Step::Write(Approved)].map(Ok)),
            (
                Decision::Reject(None),
                [
                    Ok(Step::Write(Rejected)),
                    Err("cannot reject a device in state approved: it may connect: revoke it instead (fleetctl device revoke)".to_owned()),
                    Ok(Step::Write(Rejected)),
                    Err("cannot reject a device in state revoked: it may not connect already".to_owned()),
                    Err("cannot reject a device in state decommissioned: it may not connect already".to_owned()),
                ],
            ),
            (
                Decision::Revoke,
                [
                    Err("cannot revoke a device in state pending: it never joined: reject it instead (fleetctl device reject)".to_owned()),
                    Ok(Step::Write(Revoked)),
                    Err("cannot revoke a device in state rejected: it may not connect already".to_owned()),
                    Ok(Step::Already),
                    Ok(Step::Already),
                ],
            ),
            (Decision::Decommission, [Step::Write(Decommissioned), Step::Write(Decommissioned), Step::Write(Decommissioned), Step::Write(Decommissioned), Step::Already].map(Ok)),
        ];
        for (d, want) in table {
            for (s, w) in all.iter().zip(want) {
                assert_eq!(step(&d, *s), w, "{d:?} from {s:?}");
            }
        }
    }

    #[test]
    fn a_decision_changes_only_state_and_who_decided() {
        let record = DeviceRecord {
            device_id: DeviceId::parse("dev-a").expect("id"),
            state: RecordState::Rejected,
            public_key: Some(key()),
            facts: [("arch".to_owned(), "arm64".to_owned())].into(),
            requested_at: Some(Timestamp::from_unix_millis(1_000)),
            decided_at: Some(Timestamp::from_unix_millis(2_000)),
            decided_by: Some("operator: no".to_owned()),
            conflict: Some(fleet_common::contracts::Conflict {
                public_key: key(),
                facts: BTreeMap::new(),
                at: Timestamp::from_unix_millis(1_500),
                count: 2,
            }),
        };
        let now = Timestamp::from_unix_millis(3_000);
        let r = decided(&record, RecordState::Approved, &Decision::Approve, now);
        assert_eq!(r.state, RecordState::Approved);
        assert_eq!(r.decided_at, Some(now));
        assert_eq!(r.decided_by.as_deref(), Some("operator"));
        assert_eq!(
            (&r.public_key, &r.facts, r.requested_at, &r.conflict),
            (
                &record.public_key,
                &record.facts,
                record.requested_at,
                &record.conflict
            )
        );
        let reason = Reason::parse("not ours").expect("reason");
        let r = decided(
            &record,
            RecordState::Rejected,
            &Decision::Reject(Some(reason)),
            now,
        );
        assert_eq!(r.decided_by.as_deref(), Some("operator: not ours"));
    }

    #[test]
    fn reasons_are_bounded_single_lines() {
        assert_eq!(
            Reason::parse("unknown serial").map(|r| r.0),
            Ok("unknown serial".to_owned())
        );
        assert_eq!(
            Reason::parse(&"x".repeat(MAX_REASON_CHARS + 1)),
            Err(format!(
                "the reason has {} characters, more than the {MAX_REASON_CHARS} a record keeps",
                MAX_REASON_CHARS + 1
            ))
        );
        assert!(Reason::parse(&"é".repeat(MAX_REASON_CHARS)).is_ok());
        assert_eq!(
            Reason::parse("a\nb"),
            Err("the reason has control characters (a newline?): give one line".to_owned())
        );
        assert_eq!(
            Reason::parse("  "),
            Err("the reason is empty: say why, or leave --reason out".to_owned())
        );
    }

    #[test]
    fn a_preauthorization_file_is_checked_whole_with_line_numbers() {
        let (a, b) = (key(), key());
        let good = format!(
            "{{\"device-id\":\"dev-a\",\"public-key\":\"{a}\"}}\n\n{{\"device-id\":\"dev-b\",\"public-key\":\"{b}\"}}\n"
        );
        let p = parse_preauthorized(&good).expect("good");
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].device_id.as_str(), "dev-b");

        let account = nkeys::KeyPair::new_account().public_key();
        let bad = format!(
            "{{\"device-id\":\"dev-a\",\"public-key\":\"{a}\"}}\n{{\"device-id\":\"dev-b\",\"public-key\":\"{account}\"}}\n{{\"device-id\":\"dev-a\",\"public-key\":\"{b}\"}}\n{{\"device-id\":\"dev.c\",\"public-key\":\"{b}\"}}\nnot json\n{{\"device-id\":\"dev-d\",\"public-key\":\"{b}\",\"x\":1}}\n"
        );
        let e = parse_preauthorized(&bad).expect_err("bad");
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 5, "{e}");
        assert!(
            lines[0].starts_with("line 2: device dev-b: public key:"),
            "{e}"
        );
        assert_eq!(lines[1], "line 3: device dev-a is on line 1 too");
        assert!(
            lines[2].starts_with("line 4: invalid device id \"dev.c\""),
            "{e}"
        );
        assert!(lines[3].starts_with("line 5: expected"), "{e}");
        assert!(lines[4].starts_with("line 6: unknown field `x`"), "{e}");
        assert_eq!(
            parse_preauthorized("\n \n"),
            Err("no device in the file (one JSON object per line: {\"device-id\": ..., \"public-key\": ...})".to_owned())
        );
    }

    #[test]
    fn preauthorizing_a_recorded_id_depends_on_its_key_and_state() {
        let k = key();
        let p = Preauthorized {
            device_id: DeviceId::parse("dev-a").expect("id"),
            public_key: k.clone(),
        };
        let rec = |state, public_key: Option<String>| Recorded {
            record: DeviceRecord {
                device_id: p.device_id.clone(),
                state,
                public_key,
                facts: BTreeMap::new(),
                requested_at: None,
                decided_at: None,
                decided_by: None,
                conflict: None,
            },
            seq: 4,
        };
        assert_eq!(preauth_plan(&p, None), Ok(Preauth::Create));
        assert_eq!(
            preauth_plan(&p, Some(&rec(RecordState::Approved, Some(k.clone())))),
            Ok(Preauth::Already)
        );
        let pending = rec(RecordState::Pending, Some(k.clone()));
        assert_eq!(
            preauth_plan(&p, Some(&pending)),
            Ok(Preauth::ApprovePending(Box::new(pending.clone())))
        );
        assert_eq!(
            preauth_plan(&p, Some(&rec(RecordState::Revoked, Some(k.clone())))),
            Err("device dev-a is revoked with this key: approve it explicitly (fleetctl device approve dev-a)".to_owned())
        );
        let other = key();
        let e = preauth_plan(&p, Some(&rec(RecordState::Pending, Some(other.clone()))))
            .expect_err("another key");
        assert!(
            e.starts_with(&format!(
                "device dev-a is recorded with another key ({}, state pending)",
                &other[..12]
            )),
            "{e}"
        );
        assert!(preauth_plan(&p, Some(&rec(RecordState::Approved, None)))
            .expect_err("no key")
            .contains("recorded without a key"));
    }
}
