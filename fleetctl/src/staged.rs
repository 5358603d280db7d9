//! Staged rollouts: `fleetctl rollout --release R.json [-l SELECTOR]
//! --batches 1,5%,25%,100% --success-threshold 95% --batch-timeout 30m
//! [--max-unavailable N [--group-by LABEL]]`, and `rollout status|resume|
//! abort ID`.
//!
//! The rollout's state is one key, `fleet-operator` `rollouts.<id>`
//! ([`RolloutState`]): its release, policy, devices in batch order and the
//! batch under way, written by compare-and-set so that two `fleetctl`s
//! never both move it. Each device's progress is not kept there but read
//! from NATS every tick: its intent (`fleet-control`) and its upgrade
//! status and heartbeat (`fleet-status`). A device whose intent already
//! carries this release is in flight, so a `fleetctl` killed mid-batch and
//! resumed from another machine issues nothing twice (and every intent is
//! itself a compare-and-set over the revision just read).
//!
//! One tick ([`decide`], pure, timed by `make bench`'s caller too):
//! classify every device of the batches so far (done, failed, in flight,
//! frozen, waiting); issue intents to waiting devices of those batches as
//! far as the disruption budget allows (per group of `--group-by`'s label,
//! or the whole fleet: devices upgrading or without a fresh heartbeat, at
//! most `--max-unavailable`); end the current batch once each of its
//! devices is done, failed or frozen, or its timeout passed; then start the
//! next batch if the batch's success rate meets the threshold, or halt
//! (nothing more is issued) naming the failed devices and why. Frozen
//! devices are skipped and reported; a `resume` issues them once unfrozen.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use fleet_common::contracts::{
    AgentUpgradeAttempt, BatchResult, PreviousSpec, Release, RolloutFailure, RolloutKind,
    RolloutPhase, RolloutState, UpgradePhase, WorkloadRollout, WorkloadSpec,
};
use fleet_common::subjects::{rollout_key, BUCKET_OPERATOR, ROLLOUTS_PREFIX};
use fleet_common::validate::{AttemptUuid, DeviceId};
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::fleet::{DeviceView, Keys};
use crate::js::{self, is_wrong_last_sequence, kv};
use crate::labels::{self, Device};
use crate::selector::Selector;
use crate::upgrade::{plan, Mode, Plan, Skip};

/// Between two ticks of a running rollout.
pub(crate) const TICK: Duration = Duration::from_millis(500);

/// The staging flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub batches: Vec<String>,
    pub success_threshold_pct: u8,
    pub batch_timeout: Duration,
    pub max_unavailable: Option<u32>,
    pub group_by: Option<String>,
}

/// One `--batches` entry: a device count or a percentage of the devices,
/// each the cumulative size reached at the end of that batch.
fn batch_target(entry: &str, total: u32) -> Result<u32, String> {
    if let Some(p) = entry.strip_suffix('%') {
        let p: u32 = p
            .parse()
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| format!("--batches {entry:?}: a percentage is 1% to 100%"))?;
        Ok((u64::from(total) * u64::from(p)).div_ceil(100) as u32)
    } else {
        entry
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                format!("--batches {entry:?}: give a device count (1 or more) or a percentage (5%)")
            })
    }
}

/// Parses `--batches` (validated against a fleet of 100 devices: any
/// fleet works the same).
pub fn parse_batches(s: &str) -> Result<Vec<String>, String> {
    let v: Vec<String> = s.split(',').map(|e| e.trim().to_owned()).collect();
    if v.iter().any(String::is_empty) {
        return Err(format!("--batches {s:?}: an empty entry"));
    }
    for e in &v {
        batch_target(e, 100)?;
    }
    if v.last().map(String::as_str) != Some("100%") {
        return Err(format!(
            "--batches {s:?}: end with 100% so that every selected device is covered"
        ));
    }
    Ok(v)
}

/// The cumulative end of each non-empty batch over `total` devices.
pub fn batch_ends(batches: &[String], total: u32) -> Result<Vec<u32>, String> {
    let mut ends = Vec::new();
    let mut prev = 0u32;
    for e in batches {
        let end = batch_target(e, total)?.min(total);
        if end > prev {
            ends.push(end);
            prev = end;
        }
    }
    Ok(ends)
}

/// `95%` or `95`.
pub fn parse_percent(s: &str) -> Result<u8, String> {
    s.strip_suffix('%')
        .unwrap_or(s)
        .parse::<u8>()
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| format!("--success-threshold {s:?}: give 0% to 100%"))
}

/// `90s`, `30m`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("{s:?}: give a duration such as 90s, 30m or 2h");
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?);
    let n: u64 = n.parse().map_err(|_| err())?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(err()),
    };
    if secs == 0 || secs > 7 * 86_400 {
        return Err(format!("{s:?}: give 1s to 7 days"));
    }
    Ok(Duration::from_secs(secs))
}

/// What a device of a rollout is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// Runs the release.
    Done,
    Failed(String),
    /// Its intent carries this release; not yet terminal.
    InFlight,
    Frozen,
    /// Needs a write (an intent, or a desired document).
    Waiting(Box<Write>),
}

/// What a rollout writes to one device: an upgrade intent over the
/// intent's revision, or a desired-workloads document over its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Intent(AgentUpgradeAttempt, u64),
    Spec(SpecWrite),
}

/// A device's desired document with the rollout's spec in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecWrite {
    pub device: DeviceId,
    /// The document's last stream sequence as read (0: never written).
    pub seq: u64,
    /// The whole document to write (the other workloads as they were).
    pub doc: Vec<u8>,
    /// What the document held for the workload: kept in the rollout's
    /// state before the write, for `rollout undo`.
    pub previous: PreviousSpec,
    pub previous_spec: Option<WorkloadSpec>,
}

impl Write {
    pub fn device(&self) -> &DeviceId {
        match self {
            Self::Intent(a, _) => &a.device_id,
            Self::Spec(s) => &s.device,
        }
    }
}

/// How a rollout's kind judges a device: its class, and whether it counts
/// against the disruption budget.
pub trait Judge {
    fn classify(&self, d: &Device) -> Class;
    fn unavailable(&self, d: &Device, now: Timestamp) -> bool;
    /// What is rolled out, for the lines (`2.0`, `web spec 1a2b3c4d5e6f`).
    fn target(&self) -> String;
}

/// An agent release's judge.
pub struct AgentJudge<'a>(pub &'a Release);

impl Judge for AgentJudge<'_> {
    fn classify(&self, d: &Device) -> Class {
        classify(&d.view, self.0, AttemptUuid::new_random())
    }
    fn unavailable(&self, d: &Device, now: Timestamp) -> bool {
        unavailable(&d.view, now)
    }
    fn target(&self) -> String {
        self.0.version.to_string()
    }
}

impl Class {
    fn name(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed(_) => "failed",
            Self::InFlight => "in flight",
            Self::Frozen => "frozen",
            Self::Waiting(..) => "waiting",
        }
    }
}

/// Where device `d` is with `release`; `uuid` names a new attempt.
pub fn classify(d: &DeviceView, release: &Release, uuid: AttemptUuid) -> Class {
    let Some(info) = &d.info else {
        return Class::Failed("no device info: the device never reported".into());
    };
    if info.agent_version == release.version {
        return Class::Done;
    }
    if let Some(a) = d
        .intent
        .attempt
        .as_ref()
        .filter(|a| a.device_id == d.id && release.is_release_of(a))
    {
        let status = d
            .upgrade
            .as_ref()
            .filter(|s| s.attempt_uuid == a.uuid && s.attempt_digest == a.digest());
        if let Some(s) = status.filter(|s| s.phase.is_terminal()) {
            return match s.phase {
                UpgradePhase::Complete => Class::Done,
                phase => {
                    let mut why = phase.to_string();
                    if let Some(r) = s.reason {
                        let _ = write!(why, " ({r})");
                    }
                    if let Some(e) = &s.error {
                        let _ = write!(why, ": {e}");
                    }
                    Class::Failed(why)
                }
            };
        }
        return Class::InFlight;
    }
    match plan(d, release, false, Mode::Fleet, uuid) {
        Plan::Write(a) => Class::Waiting(Box::new(Write::Intent(a, d.intent.seq))),
        Plan::UpToDate(_) => Class::Done,
        Plan::Skip(Skip::Frozen) => Class::Frozen,
        Plan::Skip(s) => Class::Failed(s.to_string()),
    }
}

/// Whether `d` counts against the disruption budget: an upgrade under way
/// (any attempt, picked up or not) or not there: not connected by the
/// cluster's presence, or with no fresh heartbeat when there is none.
pub fn unavailable(d: &DeviceView, now: Timestamp) -> bool {
    let upgrading = match (&d.intent.attempt, &d.upgrade) {
        (Some(a), Some(s)) => s.attempt_uuid != a.uuid || !s.phase.is_terminal(),
        (Some(_), None) => true,
        (None, Some(s)) => !s.phase.is_terminal(),
        (None, None) => false,
    };
    let stale = crate::fleet::absent(d, now);
    upgrading || stale
}

/// Something that happened, for the event lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    BatchStarted {
        batch: usize,
        devices: usize,
    },
    Issued {
        device: DeviceId,
        uuid: AttemptUuid,
    },
    /// A workload rollout wrote the device's document.
    Wrote {
        device: DeviceId,
        what: String,
    },
    Device {
        device: DeviceId,
        class: String,
        why: Option<String>,
    },
    Lost {
        device: DeviceId,
        why: String,
    },
    BatchEnded {
        batch: usize,
        result: BatchResult,
    },
    Halted {
        why: String,
    },
    Complete,
    Aborted,
}

/// Counts of one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub done: usize,
    pub failed: usize,
    pub in_flight: usize,
    pub waiting: usize,
    pub frozen: usize,
}

/// What one tick decided.
#[derive(Debug, Default)]
pub struct Tick {
    /// What to write (each over the revision read).
    pub writes: Vec<Write>,
    pub events: Vec<Event>,
    /// The state changed (batch ended, halted, complete).
    pub changed: bool,
    /// Counts of the current batch, after this tick's writes.
    pub counts: Counts,
}

fn group_of<'a>(d: &'a Device, group_by: Option<&str>) -> Option<&'a str> {
    match group_by {
        Some(l) => d.labels.get(l).map(String::as_str),
        None => Some(""),
    }
}

/// One tick of an agent rollout over `fleet` (every device, for the
/// budget); `seen` holds each device's class name of the last tick (events
/// are changes).
#[cfg(test)]
pub fn decide(
    state: &mut RolloutState,
    fleet: &BTreeMap<DeviceId, Device>,
    now: Timestamp,
    seen: &mut BTreeMap<DeviceId, String>,
) -> Tick {
    let Some(release) = state.release.clone() else {
        return Tick::default();
    };
    decide_with(state, fleet, now, seen, &AgentJudge(&release))
}

/// One tick of a rollout of any kind, devices judged by `judge`.
pub fn decide_with(
    state: &mut RolloutState,
    fleet: &BTreeMap<DeviceId, Device>,
    now: Timestamp,
    seen: &mut BTreeMap<DeviceId, String>,
    judge: &dyn Judge,
) -> Tick {
    let mut tick = Tick::default();
    if state.phase != RolloutPhase::Running {
        return tick;
    }
    let cur = state.current_batch as usize;
    let upto = state.batch_ends.get(cur).map_or(0, |e| *e as usize);
    // The budget: unavailable devices per group.
    let group_by = state.group_by.as_deref();
    let mut budget: BTreeMap<&str, u32> = BTreeMap::new();
    if state.max_unavailable.is_some() {
        for d in fleet.values() {
            if let Some(g) = group_of(d, group_by) {
                if judge.unavailable(d, now) {
                    *budget.entry(g).or_default() += 1;
                }
            }
        }
    }
    let mut classes: Vec<Class> = Vec::with_capacity(upto);
    for id in state.devices.iter().take(upto) {
        let (class, issued) = match fleet.get(id) {
            None => (Class::Failed("no longer known to NATS".into()), false),
            Some(d) => match judge.classify(d) {
                Class::Waiting(w) => {
                    // Devices outside every group of --group-by are not limited.
                    let allowed = match (state.max_unavailable, group_of(d, group_by)) {
                        (Some(max), Some(g)) => {
                            let used = budget.entry(g).or_default();
                            let ok = *used < max;
                            if ok {
                                *used += 1;
                            }
                            ok
                        }
                        _ => true,
                    };
                    if allowed {
                        tick.writes.push(*w);
                        (Class::InFlight, true)
                    } else {
                        (Class::Waiting(w), false)
                    }
                }
                c => (c, false),
            },
        };
        if !issued && !matches!(class, Class::Waiting(..)) {
            let name = class.name();
            if seen.get(id).map(String::as_str) != Some(name) {
                tick.events.push(Event::Device {
                    device: id.clone(),
                    class: name.to_owned(),
                    why: match &class {
                        Class::Failed(w) => Some(w.clone()),
                        Class::Frozen => Some(
                            "frozen (changefreeze): skipped; issued once unfrozen (rollout resume)"
                                .into(),
                        ),
                        _ => None,
                    },
                });
                seen.insert(id.clone(), name.to_owned());
            }
        }
        classes.push(class);
    }
    // The current batch.
    let start = if cur == 0 {
        0
    } else {
        state.batch_ends[cur - 1] as usize
    };
    let mut counts = Counts::default();
    for c in classes.get(start..).unwrap_or(&[]) {
        match c {
            Class::Done => counts.done += 1,
            Class::Failed(_) => counts.failed += 1,
            Class::InFlight => counts.in_flight += 1,
            Class::Frozen => counts.frozen += 1,
            Class::Waiting(..) => counts.waiting += 1,
        }
    }
    tick.counts = counts;
    let settled = counts.in_flight == 0 && counts.waiting == 0;
    // Devices of earlier batches still under way (frozen ones issued
    // since): the rollout is complete only once they are done too.
    let stragglers = cur + 1 == state.batch_ends.len()
        && classes[..start]
            .iter()
            .any(|c| matches!(c, Class::InFlight | Class::Waiting(..)));
    let timed_out =
        now.since(state.batch_started_at) >= Duration::from_secs(state.batch_timeout_secs);
    if !settled && !timed_out {
        return tick;
    }
    // The batch ended: nothing issued this tick to it counts any more.
    let ids = &state.devices[start..upto];
    let mut failed: Vec<RolloutFailure> = Vec::new();
    let mut frozen = Vec::new();
    for (id, c) in ids.iter().zip(&classes[start..]) {
        match c {
            Class::Failed(why) => failed.push(RolloutFailure {
                device: id.clone(),
                reason: why.clone(),
            }),
            Class::InFlight | Class::Waiting(..) => failed.push(RolloutFailure {
                device: id.clone(),
                reason: format!(
                    "not complete within the batch timeout ({} s)",
                    state.batch_timeout_secs
                ),
            }),
            Class::Frozen => frozen.push(id.clone()),
            Class::Done => {}
        }
    }
    if timed_out && !settled {
        // Intents decided this tick for the ended batch are not issued.
        let late: Vec<&DeviceId> = ids.iter().collect();
        tick.writes.retain(|w| !late.contains(&w.device()));
    }
    let judged = counts.done + failed.len();
    let pass =
        judged == 0 || counts.done * 100 >= usize::from(state.success_threshold_pct) * judged;
    if pass && stragglers && !timed_out {
        return tick;
    }
    let result = BatchResult {
        succeeded: counts.done as u32,
        failed: failed.clone(),
        frozen,
        timed_out: timed_out && !settled,
        ended_at: now,
    };
    tick.events.push(Event::BatchEnded {
        batch: cur,
        result: result.clone(),
    });
    state.results.push(result);
    tick.changed = true;
    state.updated_at = now;
    if !pass {
        let pct = (counts.done * 100).checked_div(judged).unwrap_or(100);
        let names: Vec<String> = failed
            .iter()
            .map(|f| format!("{}: {}", f.device, f.reason))
            .collect();
        let why = format!(
            "batch {} of {}: {} of {judged} devices succeeded ({pct}%), below the {}% threshold; failed: {}",
            cur + 1,
            state.batch_ends.len(),
            counts.done,
            state.success_threshold_pct,
            names.join("; ")
        );
        state.phase = RolloutPhase::Halted;
        state.halt_reason = Some(why.clone());
        tick.events.push(Event::Halted { why });
        // A halted rollout issues nothing more, not even in earlier batches.
        tick.writes.clear();
        return tick;
    }
    if cur + 1 < state.batch_ends.len() {
        state.current_batch += 1;
        state.batch_started_at = now;
        tick.events.push(Event::BatchStarted {
            batch: cur + 1,
            devices: state.batch(cur + 1).len(),
        });
    } else {
        state.phase = RolloutPhase::Complete;
        tick.events.push(Event::Complete);
    }
    tick
}

/// A new rollout's state: the selected devices that do not run the
/// release yet and can take it (frozen ones included), in device order,
/// cut into batches; and the lines for the devices left out.
pub fn create(
    id: String,
    release: Release,
    selector: Option<&Selector>,
    policy: &Policy,
    devices: &[Device],
    now: Timestamp,
) -> Result<(RolloutState, Vec<String>), CtlError> {
    let (chosen, left_out) = choose(&AgentJudge(&release), devices);
    let state = new_state(id, Some(release), None, selector, policy, chosen, now)?;
    Ok((state, left_out))
}

/// The devices a new rollout takes (frozen ones included), in device
/// order, and the lines for the devices left out.
pub fn choose(judge: &dyn Judge, devices: &[Device]) -> (Vec<DeviceId>, Vec<String>) {
    let mut chosen = Vec::new();
    let mut left_out = Vec::new();
    for d in devices {
        match judge.classify(d) {
            Class::Done => left_out.push(format!("{}: already runs {}", d.view.id, judge.target())),
            // No info, no artifact for its architecture, rollback-failed,
            // an agent too old for the spec, this release or spec already
            // failed there: never counted in a batch.
            Class::Failed(why) => left_out.push(format!("{}: left out: {why}", d.view.id)),
            _ => chosen.push(d.view.id.clone()),
        }
    }
    (chosen, left_out)
}

/// A new rollout's state over `chosen`, cut into batches.
pub fn new_state(
    id: String,
    release: Option<Release>,
    workload: Option<WorkloadRollout>,
    selector: Option<&Selector>,
    policy: &Policy,
    chosen: Vec<DeviceId>,
    now: Timestamp,
) -> Result<RolloutState, CtlError> {
    let ends = batch_ends(&policy.batches, chosen.len() as u32).map_err(CtlError::Input)?;
    Ok(RolloutState {
        id,
        release,
        workload,
        selector: selector.map(|s| s.as_str().to_owned()),
        batches: policy.batches.clone(),
        success_threshold_pct: policy.success_threshold_pct,
        batch_timeout_secs: policy.batch_timeout.as_secs(),
        max_unavailable: policy.max_unavailable,
        group_by: policy.group_by.clone(),
        devices: chosen,
        batch_ends: ends,
        phase: RolloutPhase::Running,
        current_batch: 0,
        batch_started_at: now,
        results: Vec::new(),
        halt_reason: None,
        created_at: now,
        updated_at: now,
    })
}

/// How the events are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// One line per event.
    Lines,
    /// JSON lines.
    Json,
    /// A terminal: the events, and a progress line per batch on change.
    Terminal,
}

impl Display {
    pub fn pick(json: bool) -> Display {
        if json {
            Display::Json
        } else if std::io::stdout().is_terminal() {
            Display::Terminal
        } else {
            Display::Lines
        }
    }
}

fn event_line(id: &str, e: &Event, now: Timestamp, state: &RolloutState) -> String {
    let n = state.batch_ends.len();
    let what = match e {
        Event::BatchStarted { batch, devices } => {
            format!("batch {}/{n} started: {devices} devices", batch + 1)
        }
        Event::Issued { device, uuid } => format!("{device}: issued attempt {uuid}"),
        Event::Wrote { device, what } => format!("{device}: wrote {what}"),
        Event::Device { device, class, why } => match why {
            Some(w) => format!("{device}: {class}: {w}"),
            None => format!("{device}: {class}"),
        },
        Event::Lost { device, why } => format!("{device}: {why}"),
        Event::BatchEnded { batch, result } => format!(
            "batch {}/{n} ended: {} succeeded, {} failed, {} frozen{}",
            batch + 1,
            result.succeeded,
            result.failed.len(),
            result.frozen.len(),
            if result.timed_out { " (timed out)" } else { "" }
        ),
        Event::Halted { why } => format!("halted: {why}"),
        Event::Complete => "complete".to_owned(),
        Event::Aborted => "aborted".to_owned(),
    };
    format!("{now} rollout {id}: {what}")
}

fn event_json(id: &str, e: &Event, now: Timestamp) -> serde_json::Value {
    let mut v = match e {
        Event::BatchStarted { batch, devices } => {
            serde_json::json!({"event": "batch-started", "batch": batch + 1, "devices": devices})
        }
        Event::Issued { device, uuid } => {
            serde_json::json!({"event": "issued", "device": device, "attempt-uuid": uuid})
        }
        Event::Wrote { device, what } => {
            serde_json::json!({"event": "wrote", "device": device, "what": what})
        }
        Event::Device { device, class, why } => {
            serde_json::json!({"event": "device", "device": device, "state": class, "why": why})
        }
        Event::Lost { device, why } => {
            serde_json::json!({"event": "lost", "device": device, "why": why})
        }
        Event::BatchEnded { batch, result } => {
            serde_json::json!({"event": "batch-ended", "batch": batch + 1, "result": result})
        }
        Event::Halted { why } => serde_json::json!({"event": "halted", "why": why}),
        Event::Complete => serde_json::json!({"event": "complete"}),
        Event::Aborted => serde_json::json!({"event": "aborted"}),
    };
    v["rollout"] = serde_json::json!(id);
    v["at"] = serde_json::json!(now);
    v
}

pub(crate) fn emit(display: Display, state: &RolloutState, events: &[Event]) {
    let now = Timestamp::now();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for e in events {
        let line = match display {
            Display::Json => event_json(&state.id, e, now).to_string(),
            _ => event_line(&state.id, e, now, state),
        };
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}

/// Reads a rollout and its revision.
pub fn read_state(
    store: &nats::kv::Store,
    id: &str,
) -> Result<Option<(RolloutState, u64)>, CtlError> {
    let key = rollout_key(id);
    let Some(e) = store
        .entry(&key)
        .map_err(CtlError::nats(format!("reading {BUCKET_OPERATOR} {key}")))?
    else {
        return Ok(None);
    };
    if e.value.is_empty() {
        return Ok(None);
    }
    let s = serde_json::from_slice(&e.value).map_err(|err| {
        CtlError::Refused(format!(
            "{BUCKET_OPERATOR} {key} is not a rollout state: {err}; delete it with `nats kv del {BUCKET_OPERATOR} {key}`"
        ))
    })?;
    Ok(Some((s, e.revision)))
}

pub(crate) fn must_read(
    store: &nats::kv::Store,
    id: &str,
) -> Result<(RolloutState, u64), CtlError> {
    read_state(store, id)?.ok_or_else(|| {
        CtlError::Refused(format!(
            "no rollout {id:?} in {BUCKET_OPERATOR}: list them with fleetctl rollout ls"
        ))
    })
}

/// Writes `state` over `revision` (`None`: must be new); `Ok(None)`:
/// another writer moved it.
pub(crate) fn write_state(
    store: &nats::kv::Store,
    state: &RolloutState,
    revision: Option<u64>,
) -> Result<Option<u64>, CtlError> {
    let key = rollout_key(&state.id);
    let bytes = serde_json::to_vec(state).map_err(|e| CtlError::Input(e.to_string()))?;
    let r = match revision {
        Some(r) => store.update(&key, &bytes, r),
        None => store.create(&key, &bytes),
    };
    match r {
        Ok(rev) => Ok(Some(rev)),
        Err(e) if is_wrong_last_sequence(&e) => Ok(None),
        Err(e) => Err(CtlError::Nats {
            what: format!("writing {BUCKET_OPERATOR} {key}"),
            detail: e.to_string(),
        }),
    }
}

/// Every device with its labels, by id.
pub(crate) fn read_fleet(conn: &nats::Connection) -> Result<BTreeMap<DeviceId, Device>, CtlError> {
    Ok(labels::select(conn, None, Keys::Rollout)?
        .into_iter()
        .map(|d| (d.view.id.clone(), d))
        .collect())
}

/// How a driven rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended(pub RolloutPhase);

/// What a rollout rolls out, for its lines: an agent release's version
/// (`2.0`), or `workload web spec 1a2b3c4d5e6f`.
pub fn target_text(state: &RolloutState) -> String {
    match (&state.workload, &state.release) {
        (None, Some(r)) => r.version.to_string(),
        _ => state.target(),
    }
}

/// `fleetctl rollout abort ID`.
pub fn abort(conn: &nats::Connection, id: &str) -> Result<String, CtlError> {
    let store = kv(conn, BUCKET_OPERATOR)?;
    loop {
        let (mut state, rev) = must_read(&store, id)?;
        if state.phase == RolloutPhase::Aborted {
            return Ok(format!("rollout {id} was already aborted\n"));
        }
        let was = state.phase;
        state.phase = RolloutPhase::Aborted;
        state.updated_at = Timestamp::now();
        if write_state(&store, &state, Some(rev))?.is_some() {
            let left = if state.workload.is_some() {
                "documents already written stay (fleetctl rollout undo puts them back)"
            } else {
                "attempts already issued run to their end"
            };
            return Ok(format!(
                "rollout {id} aborted (was {was}): nothing more is issued; {left}\n"
            ));
        }
    }
}

pub(crate) type BatchCounts = Vec<(Counts, Vec<(DeviceId, String)>)>;

pub(crate) fn per_batch(
    state: &RolloutState,
    fleet: &BTreeMap<DeviceId, Device>,
    judge: &dyn Judge,
) -> BatchCounts {
    let mut per_batch = Vec::new();
    for b in 0..state.batch_ends.len() {
        let mut c = Counts::default();
        let mut failed = Vec::new();
        for id in state.batch(b) {
            match fleet.get(id).map(|d| judge.classify(d)) {
                Some(Class::Done) => c.done += 1,
                Some(Class::InFlight) => c.in_flight += 1,
                Some(Class::Frozen) => c.frozen += 1,
                Some(Class::Waiting(..)) => c.waiting += 1,
                Some(Class::Failed(w)) => {
                    c.failed += 1;
                    failed.push((id.clone(), w));
                }
                None => {
                    c.failed += 1;
                    failed.push((id.clone(), "no longer known to NATS".into()));
                }
            }
        }
        per_batch.push((c, failed));
    }
    per_batch
}

pub(crate) fn render_status(
    state: &RolloutState,
    per_batch: &BatchCounts,
    json: bool,
) -> Result<String, CtlError> {
    if json {
        let batches: Vec<serde_json::Value> = per_batch
            .iter()
            .enumerate()
            .map(|(i, (c, failed))| {
                serde_json::json!({
                    "batch": i + 1,
                    "devices": state.batch(i).len(),
                    "done": c.done, "failed": c.failed, "in-flight": c.in_flight,
                    "waiting": c.waiting, "frozen": c.frozen,
                    "failures": failed.iter().map(|(d, w)| serde_json::json!({"device": d, "reason": w})).collect::<Vec<_>>(),
                })
            })
            .collect();
        let v = serde_json::json!({"state": state, "batches": batches});
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        ));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rollout {} ({}): {} to {} devices{}, {}; batch {}/{} since {}",
        state.id,
        state.phase,
        target_text(state),
        state.devices.len(),
        state
            .selector
            .as_ref()
            .map(|s| format!(" matching {s:?}"))
            .unwrap_or_default(),
        policy_text(state),
        state.current_batch + 1,
        state.batch_ends.len(),
        state.batch_started_at
    );
    for (i, (c, failed)) in per_batch.iter().enumerate() {
        let _ = writeln!(
            out,
            "  batch {}/{} ({} devices): {} done, {} failed, {} in flight, {} waiting, {} frozen",
            i + 1,
            state.batch_ends.len(),
            state.batch(i).len(),
            c.done,
            c.failed,
            c.in_flight,
            c.waiting,
            c.frozen
        );
        for (d, w) in failed {
            let _ = writeln!(out, "    {d}: {w}");
        }
    }
    if let Some(h) = &state.halt_reason {
        let _ = writeln!(out, "halted: {h}");
    }
    Ok(out)
}

fn policy_text(s: &RolloutState) -> String {
    let mut t = format!(
        "batches {}, threshold {}%, batch timeout {} s",
        s.batches.join(","),
        s.success_threshold_pct,
        s.batch_timeout_secs
    );
    match (&s.max_unavailable, &s.group_by) {
        (Some(n), Some(g)) => {
            let _ = write!(t, ", at most {n} unavailable per {g}");
        }
        (Some(n), None) => {
            let _ = write!(t, ", at most {n} unavailable");
        }
        _ => {}
    }
    t
}

/// One rollout as `rollout ls` (and the metrics) see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub id: String,
    pub kind: RolloutKind,
    pub phase: RolloutPhase,
    /// [`target_text`].
    pub target: String,
    pub devices: usize,
    /// 0-based; with `batches`, the progress.
    pub current_batch: u32,
    pub batches: usize,
    /// Devices counted succeeded and failed in the batches ended so far.
    pub succeeded: u32,
    pub failed: usize,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Summary {
    pub fn of(s: &RolloutState) -> Self {
        Self {
            id: s.id.clone(),
            kind: s.kind(),
            phase: s.phase,
            target: target_text(s),
            devices: s.devices.len(),
            current_batch: s.current_batch,
            batches: s.batch_ends.len(),
            succeeded: s.results.iter().map(|r| r.succeeded).sum(),
            failed: s.results.iter().map(|r| r.failed.len()).sum(),
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// One rollout key: its state, or why its value is not one.
pub type Listed = (String, Result<RolloutState, String>);

/// Every rollout in `fleet-operator` by key, each its state or why its
/// value is not one (deleted keys left out), in one read.
pub fn list(conn: &nats::Connection) -> Result<Vec<Listed>, CtlError> {
    Ok(js::read_last(
        conn,
        BUCKET_OPERATOR,
        &format!("$KV.{BUCKET_OPERATOR}.{ROLLOUTS_PREFIX}.*"),
    )?
    .into_iter()
    .filter_map(|e| {
        let v = e.value?;
        Some((
            e.key,
            serde_json::from_slice::<RolloutState>(&v).map_err(|err| err.to_string()),
        ))
    })
    .collect())
}

/// `fleetctl rollout ls`: every rollout, one line each.
pub fn ls(conn: &nats::Connection) -> Result<String, CtlError> {
    let mut out = String::new();
    for (key, state) in list(conn)? {
        match state.as_ref().map(Summary::of) {
            Ok(s) => {
                let _ = writeln!(
                    out,
                    "{} ({}): {} to {} devices, batch {}/{}, created {}",
                    s.id,
                    s.phase,
                    s.target,
                    s.devices,
                    s.current_batch + 1,
                    s.batches,
                    s.created_at
                );
            }
            Err(err) => {
                let _ = writeln!(out, "{key}: unreadable ({err})");
            }
        }
    }
    if out.is_empty() {
        out = "no rollouts\n".into();
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fleet_common::contracts::{
        ConfigState, ConfigStateReport, DeviceInfo, Heartbeat, UpgradeReason, UpgradeStatus,
    };
    use fleet_common::validate::{Arch, BoundedText, Version};
    use std::time::Instant;

    fn release() -> Release {
        Release::from_json(
            br#"{"version":"2.0","artifacts":{"x86_64":{"artifact-url":"https://r.example.com/a","sha256":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","max-bytes":1000}}}"#,
        )
        .expect("release")
    }

    /// Device `dev<i>` on agent 1.0, configured, with a fresh heartbeat.
    pub(crate) fn device(i: usize, now: Timestamp) -> Device {
        let id = DeviceId::parse(&format!("dev{i:05}")).expect("id");
        let mut view = DeviceView::new(id.clone());
        let state = ConfigStateReport {
            state: ConfigState::Configured,
            waiting_changes: 0,
            intent_waiting: false,
        };
        view.info = Some(DeviceInfo {
            device_id: id,
            agent_version: Version::parse("1.0").expect("v"),
            arch: Arch::X86_64,
            os: BoundedText::truncate("Debian"),
            kernel: BoundedText::truncate("6.1"),
            podman_version: None,
            boot_id: BoundedText::truncate("b"),
            config_state: state.clone(),
            agent_started_at: now,
            updated_at: now,
        });
        view.heartbeat = Some(Heartbeat {
            at: now,
            uptime_secs: 1,
            agent_version: Version::parse("1.0").expect("v"),
            config_state: state,
            stopping: None,
            podman_unreachable: None,
        });
        Device {
            view,
            labels: BTreeMap::from([("site".to_owned(), format!("site{}", i % 10))]),
        }
    }

    /// Writes what `decide` issued as the intents NATS now holds, and has
    /// each device report `outcome` for it.
    fn answer(
        fleet: &mut BTreeMap<DeviceId, Device>,
        tick: &Tick,
        outcome: Option<UpgradePhase>,
        now: Timestamp,
    ) {
        for w in &tick.writes {
            let Write::Intent(a, seq) = w else {
                continue;
            };
            let d = fleet.get_mut(&a.device_id).expect("device");
            d.view.intent.seq = seq + 1;
            d.view.intent.present = true;
            d.view.intent.attempt = Some(a.clone());
            if let Some(phase) = outcome {
                d.view.upgrade = Some(UpgradeStatus::begin(
                    a.uuid,
                    a.digest(),
                    a.target_version.clone(),
                    phase,
                    (phase == UpgradePhase::Failed).then_some(UpgradeReason::Probe),
                    now,
                ));
                if phase == UpgradePhase::Complete {
                    if let Some(i) = d.view.info.as_mut() {
                        i.agent_version = a.target_version.clone();
                    }
                }
            }
        }
    }

    /// The bookkeeping of a staged rollout over 10,000 devices, one tick at
    /// a time (what a running rollout does every half second besides
    /// reading NATS): its time is printed, and bounded with a margin for a
    /// loaded debug build.
    #[test]
    fn ten_thousand_devices_batch_by_batch_within_the_budget() {
        let now = Timestamp::now();
        let devices: Vec<Device> = (0..10_000).map(|i| device(i, now)).collect();
        let policy = Policy {
            batches: parse_batches("1,1%,10%,100%").expect("batches"),
            success_threshold_pct: 95,
            batch_timeout: Duration::from_secs(1800),
            max_unavailable: Some(500),
            group_by: Some("site".to_owned()),
        };
        let started = Instant::now();
        let (mut state, left_out) =
            create("r-bench".into(), release(), None, &policy, &devices, now).expect("create");
        let created = started.elapsed();
        assert!(left_out.is_empty());
        assert_eq!(state.batch_ends, [1, 100, 1000, 10_000]);
        let mut fleet: BTreeMap<DeviceId, Device> = devices
            .into_iter()
            .map(|d| (d.view.id.clone(), d))
            .collect();
        let mut seen = BTreeMap::new();
        let mut ticks = Vec::new();
        let mut issued = 0usize;
        while state.phase == RolloutPhase::Running {
            let t = Instant::now();
            let tick = decide(&mut state, &fleet, now, &mut seen);
            ticks.push(t.elapsed());
            // Never more than 500 per site upgrading.
            let mut per_site: BTreeMap<&str, usize> = BTreeMap::new();
            for d in fleet.values() {
                if unavailable(&d.view, now) {
                    *per_site.entry(d.labels["site"].as_str()).or_default() += 1;
                }
            }
            for w in &tick.writes {
                *per_site
                    .entry(fleet[w.device()].labels["site"].as_str())
                    .or_default() += 1;
            }
            assert!(per_site.values().all(|n| *n <= 500), "{per_site:?}");
            issued += tick.writes.len();
            // Issued this tick, complete by the next.
            answer(&mut fleet, &tick, Some(UpgradePhase::Complete), now);
            assert!(ticks.len() < 100, "no progress: {state:?}");
        }
        assert_eq!(state.phase, RolloutPhase::Complete);
        assert_eq!(issued, 10_000);
        let slowest = ticks.iter().max().copied().unwrap_or_default();
        eprintln!(
            "staged rollout bookkeeping, 10,000 devices: created in {created:?}, {} ticks, slowest {slowest:?}",
            ticks.len()
        );
        assert!(slowest < Duration::from_secs(5), "{slowest:?}");
    }

    #[test]
    fn a_device_without_a_fresh_heartbeat_takes_its_groups_budget() {
        let now = Timestamp::now();
        // dev00000 and dev00010 are site0, dev00001 site1; dev00010 is
        // silent for 91 s (not in the rollout's selection).
        let mut devices: Vec<Device> = [0, 1, 10].iter().map(|i| device(*i, now)).collect();
        if let Some(h) = devices[2].view.heartbeat.as_mut() {
            h.at = Timestamp::from_unix_millis(now.unix_millis() - 91_000);
        }
        let policy = Policy {
            batches: parse_batches("100%").expect("batches"),
            success_threshold_pct: 100,
            batch_timeout: Duration::from_secs(60),
            max_unavailable: Some(1),
            group_by: Some("site".to_owned()),
        };
        let (mut state, _) =
            create("r-hb".into(), release(), None, &policy, &devices[..2], now).expect("create");
        let fleet: BTreeMap<DeviceId, Device> = devices
            .into_iter()
            .map(|d| (d.view.id.clone(), d))
            .collect();
        let tick = decide(&mut state, &fleet, now, &mut BTreeMap::new());
        let issued: Vec<&str> = tick.writes.iter().map(|w| w.device().as_str()).collect();
        assert_eq!(issued, ["dev00001"]);
        assert_eq!(tick.counts.waiting, 1);
    }

    #[test]
    fn a_failing_batch_halts_and_nothing_more_is_issued() {
        let now = Timestamp::now();
        let devices: Vec<Device> = (0..20).map(|i| device(i, now)).collect();
        let policy = Policy {
            batches: parse_batches("2,100%").expect("batches"),
            success_threshold_pct: 50,
            batch_timeout: Duration::from_secs(60),
            max_unavailable: None,
            group_by: None,
        };
        let (mut state, _) =
            create("r-t".into(), release(), None, &policy, &devices, now).expect("create");
        let mut fleet: BTreeMap<DeviceId, Device> = devices
            .into_iter()
            .map(|d| (d.view.id.clone(), d))
            .collect();
        let mut seen = BTreeMap::new();
        let tick = decide(&mut state, &fleet, now, &mut seen);
        assert_eq!(tick.writes.len(), 2);
        // One complete, one still under way: the batch waits.
        let (first, second) = (tick.writes[..1].to_vec(), tick.writes[1..].to_vec());
        let one = Tick {
            writes: first,
            ..Tick::default()
        };
        answer(&mut fleet, &one, Some(UpgradePhase::Complete), now);
        let other = Tick {
            writes: second,
            ..Tick::default()
        };
        answer(&mut fleet, &other, Some(UpgradePhase::Preparing), now);
        let tick = decide(&mut state, &fleet, now, &mut seen);
        assert!(tick.writes.is_empty() && state.phase == RolloutPhase::Running);
        // The timeout ends it: 1 of 2 is 50%, at the threshold: next batch.
        let later = Timestamp::from_unix_millis(now.unix_millis() + 61_000);
        let tick = decide(&mut state, &fleet, later, &mut seen);
        assert!(state.results[0].timed_out);
        assert_eq!(state.results[0].failed.len(), 1);
        assert!(state.results[0].failed[0]
            .reason
            .starts_with("not complete within the batch timeout"));
        assert_eq!(state.current_batch, 1);
        assert!(tick.writes.is_empty());
        // Batch 2: every device fails its probe: halted, nothing more.
        let tick = decide(&mut state, &fleet, later, &mut seen);
        assert_eq!(tick.writes.len(), 18);
        answer(&mut fleet, &tick, Some(UpgradePhase::Failed), later);
        let tick = decide(&mut state, &fleet, later, &mut seen);
        assert_eq!(state.phase, RolloutPhase::Halted);
        assert!(tick.writes.is_empty());
        assert!(
            matches!(tick.events.last(), Some(Event::Halted { why }) if why.starts_with("batch 2 of 2: 0 of 18 devices succeeded (0%), below the 50% threshold; failed: dev00002: failed (probe); dev00003: failed (probe)"))
        );
        let tick = decide(&mut state, &fleet, later, &mut seen);
        assert!(tick.writes.is_empty() && tick.events.is_empty());
    }

    #[test]
    fn policy_flags_parse_and_refuse() {
        let b = parse_batches("1, 5%,25%,100%").expect("batches");
        assert_eq!(b, ["1", "5%", "25%", "100%"]);
        assert_eq!(batch_ends(&b, 1000), Ok(vec![1, 50, 250, 1000]));
        // Small fleets: empty batches fall away, percentages round up.
        assert_eq!(batch_ends(&b, 3), Ok(vec![1, 3]));
        assert_eq!(batch_ends(&b, 10), Ok(vec![1, 3, 10]));
        assert_eq!(
            batch_ends(&["2".to_owned(), "100%".to_owned()], 1),
            Ok(vec![1])
        );
        for (s, says) in [
            ("1,50%", "end with 100%"),
            ("0,100%", "a device count (1 or more)"),
            ("1,150%,100%", "1% to 100%"),
            ("1,,100%", "an empty entry"),
            ("x,100%", "a device count"),
        ] {
            assert!(parse_batches(s).expect_err(s).contains(says), "{s}");
        }
        assert_eq!(parse_percent("95%"), Ok(95));
        assert_eq!(parse_percent("100"), Ok(100));
        assert!(parse_percent("101%").is_err());
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["30", "m", "0s", "5d", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
