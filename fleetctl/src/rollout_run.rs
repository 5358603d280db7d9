//! Running a staged rollout of either kind: `start` (an agent release) and
//! `launch` write the new state and drive it; `resume` takes a halted or
//! interrupted one up again; `status` judges it as the driver would; `drive` is the loop that reads the fleet each
//! tick, asks the kind's judge ([`staged::Judge`]: the agent's in
//! `staged`, the workload's in `workload_rollout`), writes the state first
//! and then the devices. The policy, the decision and the state's I/O stay
//! in `staged`; this module sits above both kinds.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use fleet_common::contracts::{AgentUpgradeAttempt, RolloutPhase, RolloutState};
use fleet_common::subjects::{rollout_key, BUCKET_CONTROL, BUCKET_OPERATOR};
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::fleet::Keys;
use crate::js::{self, kv, CasOutcome};
use crate::labels;
use crate::selector::Selector;
use crate::staged::{
    create, decide_with, emit, must_read, per_batch, read_fleet, render_status, target_text,
    write_state, AgentJudge, Display, Ended, Event, Judge, Policy, SpecWrite, Write, TICK,
};
use crate::upgrade::{cas_write, read_release};
use crate::workload_rollout::{self, Facts, WorkloadJudge};

/// `fleetctl rollout --release ... --batches ...`: creates the rollout and
/// drives it.
pub fn start(
    conn: &nats::Connection,
    release: &Path,
    selector: Option<&Selector>,
    policy: &Policy,
    display: Display,
) -> Result<Ended, CtlError> {
    let release = read_release(release)?;
    let devices = labels::select(conn, selector, Keys::Rollout)?;
    let id = format!("r-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (state, left_out) = create(id, release, selector, policy, &devices, Timestamp::now())?;
    launch(conn, state, &left_out, devices.len(), display)
}

/// Writes a new rollout's state (refused when it has no device), prints
/// its header and drives it.
pub fn launch(
    conn: &nats::Connection,
    state: RolloutState,
    left_out: &[String],
    selected: usize,
    display: Display,
) -> Result<Ended, CtlError> {
    let store = kv(conn, BUCKET_OPERATOR)?;
    if state.devices.is_empty() {
        for l in left_out {
            println!("{l}");
        }
        return Err(CtlError::Refused(format!(
            "no device to roll out to ({selected} selected): nothing written"
        )));
    }
    write_state(&store, &state, None)?.ok_or_else(|| {
        CtlError::Conflict(format!(
            "rollout id {} taken: run the command again",
            state.id
        ))
    })?;
    let header = format!(
        "rollout {} started: {} to {} devices in {} batches ({}), threshold {}%, batch timeout {} s{}",
        state.id,
        target_text(&state),
        state.devices.len(),
        state.batch_ends.len(),
        state
            .batch_ends
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        state.success_threshold_pct,
        state.batch_timeout_secs,
        match (&state.max_unavailable, &state.group_by) {
            (Some(n), Some(g)) => format!(", at most {n} unavailable per {g}"),
            (Some(n), None) => format!(", at most {n} unavailable"),
            _ => String::new(),
        }
    );
    if display == Display::Json {
        println!(
            "{}",
            serde_json::json!({"event": "started", "rollout": state.id, "kind": state.kind().as_str(), "devices": state.devices.len(), "batch-ends": state.batch_ends, "left-out": left_out})
        );
    } else {
        println!("{header}");
        for l in left_out {
            println!("{l}");
        }
        println!(
            "follow it from anywhere with: fleetctl rollout status {}",
            state.id
        );
    }
    let _ = std::io::stdout().flush();
    emit(
        display,
        &state,
        &[Event::BatchStarted {
            batch: 0,
            devices: state.batch(0).len(),
        }],
    );
    drive(conn, &state.id, display)
}

/// One tick's facts beyond the fleet: what a workload rollout reads.
fn tick_facts(conn: &nats::Connection, state: &RolloutState) -> Result<Option<Facts>, CtlError> {
    match state.workload {
        Some(_) => Ok(Some(workload_rollout::read_facts(conn)?)),
        None => Ok(None),
    }
}

/// Runs `f` with the judge of `state`'s kind.
fn with_judge<T>(
    state: &RolloutState,
    facts: Option<&Facts>,
    f: impl FnOnce(&dyn Judge) -> T,
) -> Result<T, CtlError> {
    let empty = Facts::default();
    match (&state.workload, &state.release) {
        (Some(target), _) => Ok(f(&WorkloadJudge {
            target,
            facts: facts.unwrap_or(&empty),
        })),
        (None, Some(release)) => Ok(f(&AgentJudge(release))),
        (None, None) => Err(CtlError::Refused(format!(
            "{BUCKET_OPERATOR} {}: a rollout state with neither release nor workload; delete it",
            rollout_key(&state.id)
        ))),
    }
}

/// Drives rollout `id` until it is complete, halted or aborted.
pub fn drive(conn: &nats::Connection, id: &str, display: Display) -> Result<Ended, CtlError> {
    let store = kv(conn, BUCKET_OPERATOR)?;
    let mut seen: BTreeMap<DeviceId, String> = BTreeMap::new();
    let mut last_progress = String::new();
    loop {
        let (mut state, rev) = must_read(&store, id)?;
        match state.phase {
            RolloutPhase::Running => {}
            RolloutPhase::Aborted => {
                emit(display, &state, &[Event::Aborted]);
                return Ok(Ended(state.phase));
            }
            phase => return Ok(Ended(phase)),
        }
        let fleet = read_fleet(conn)?;
        let facts = tick_facts(conn, &state)?;
        let judged = state.clone();
        let mut tick = with_judge(&judged, facts.as_ref(), |j| {
            decide_with(&mut state, &fleet, Timestamp::now(), &mut seen, j)
        })?;
        if let Some(w) = state.workload.as_mut() {
            workload_rollout::record_previous(w, &tick.writes);
        }
        if tick.changed || !tick.writes.is_empty() {
            // The state first: a concurrent abort or another driver wins,
            // and this tick issues nothing.
            state.updated_at = Timestamp::now();
            if write_state(&store, &state, Some(rev))?.is_none() {
                continue;
            }
        }
        let intents: Vec<(&AgentUpgradeAttempt, u64)> = tick
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Intent(a, seq) => Some((a, *seq)),
                Write::Spec(_) => None,
            })
            .collect();
        let specs: Vec<&SpecWrite> = tick
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Spec(s) => Some(s),
                Write::Intent(..) => None,
            })
            .collect();
        if let (Some(target), false) = (&state.workload, specs.is_empty()) {
            let outcomes = workload_rollout::write_docs(conn, target, &specs)?;
            let what = format!(
                "{} spec {}",
                target.workload,
                &target.spec_hash.as_str()[..12]
            );
            for (s, o) in specs.iter().zip(outcomes) {
                let e = match o {
                    CasOutcome::Written { seq } => {
                        seen.insert(s.device.clone(), "in flight".into());
                        Event::Wrote {
                            device: s.device.clone(),
                            what: format!("{what} (revision {seq})"),
                        }
                    }
                    CasOutcome::Conflict(why) => Event::Lost {
                        device: s.device.clone(),
                        why: format!(
                            "lost the race for its document ({why}): read again next tick"
                        ),
                    },
                    CasOutcome::Failed(why) => Event::Lost {
                        device: s.device.clone(),
                        why: format!("document write failed ({why}): tried again next tick"),
                    },
                };
                tick.events.push(e);
            }
        }
        if !intents.is_empty() {
            let batch: Vec<_> = intents.iter().map(|(a, seq)| cas_write(a, *seq)).collect();
            let outcomes = js::cas_put_all(conn, BUCKET_CONTROL, &batch)?;
            for ((a, _), o) in intents.iter().zip(outcomes) {
                let e = match o {
                    CasOutcome::Written { .. } => {
                        seen.insert(a.device_id.clone(), "in flight".into());
                        Event::Issued {
                            device: a.device_id.clone(),
                            uuid: a.uuid,
                        }
                    }
                    CasOutcome::Conflict(why) => Event::Lost {
                        device: a.device_id.clone(),
                        why: format!("lost the race for its intent ({why}): read again next tick"),
                    },
                    CasOutcome::Failed(why) => Event::Lost {
                        device: a.device_id.clone(),
                        why: format!("intent write failed ({why}): tried again next tick"),
                    },
                };
                tick.events.push(e);
            }
        }
        // Events of devices first, then the batch's end.
        tick.events.sort_by_key(|e| match e {
            Event::Issued { .. }
            | Event::Wrote { .. }
            | Event::Device { .. }
            | Event::Lost { .. } => 0,
            Event::BatchEnded { .. } => 1,
            _ => 2,
        });
        emit(display, &state, &tick.events);
        if display == Display::Terminal && state.phase == RolloutPhase::Running {
            let c = tick.counts;
            let p = format!(
                "batch {}/{}: {} done, {} failed, {} in flight, {} waiting, {} frozen",
                state.current_batch + 1,
                state.batch_ends.len(),
                c.done,
                c.failed,
                c.in_flight,
                c.waiting,
                c.frozen
            );
            if p != last_progress {
                println!("{p}");
                last_progress = p;
            }
        }
        if state.phase != RolloutPhase::Running {
            return Ok(Ended(state.phase));
        }
        std::thread::sleep(TICK);
    }
}

/// `fleetctl rollout resume ID`: drives it again from wherever it is. A
/// complete rollout whose frozen devices have since been unfrozen runs its
/// last batch again for them.
pub fn resume(conn: &nats::Connection, id: &str, display: Display) -> Result<Ended, CtlError> {
    let store = kv(conn, BUCKET_OPERATOR)?;
    loop {
        let (mut state, rev) = must_read(&store, id)?;
        match state.phase {
            RolloutPhase::Running => break,
            RolloutPhase::Halted => {
                return Err(CtlError::Refused(format!(
                    "rollout {id} halted ({}); it issues nothing more: {}",
                    state
                        .halt_reason
                        .as_deref()
                        .unwrap_or("below the threshold"),
                    if state.workload.is_some() {
                        "put its devices back with fleetctl rollout undo, fix the spec and start a new rollout"
                    } else {
                        "fix the release and start a new rollout"
                    }
                )))
            }
            RolloutPhase::Aborted => {
                return Err(CtlError::Refused(format!(
                    "rollout {id} was aborted; start a new rollout"
                )))
            }
            RolloutPhase::Complete => {
                let frozen: usize = state.results.iter().map(|r| r.frozen.len()).sum();
                if frozen == 0 {
                    println!("rollout {id} is complete; nothing to resume");
                    return Ok(Ended(RolloutPhase::Complete));
                }
                // The last batch again, over every device of the rollout:
                // the ones that run the release are done.
                state.phase = RolloutPhase::Running;
                state.current_batch = (state.batch_ends.len() as u32).saturating_sub(1);
                state.batch_started_at = Timestamp::now();
                if write_state(&store, &state, Some(rev))?.is_some() {
                    break;
                }
            }
        }
    }
    println!("rollout {id} resumed");
    drive(conn, id, display)
}

/// `fleetctl rollout status ID [--json]`.
pub fn status(conn: &nats::Connection, id: &str, json: bool) -> Result<String, CtlError> {
    let store = kv(conn, BUCKET_OPERATOR)?;
    let (state, _) = must_read(&store, id)?;
    let fleet = read_fleet(conn)?;
    let facts = tick_facts(conn, &state)?;
    let per_batch = with_judge(&state, facts.as_ref(), |judge| {
        per_batch(&state, &fleet, judge)
    })?;
    render_status(&state, &per_batch, json)
}
