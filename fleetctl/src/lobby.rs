//! The lobby (`fleet-lobby` `<device>` → [`LobbyTicket`]): the bound on the
//! pending list, cluster-wide (`docs/design/enrollment.md` "The lobby").
//!
//! The enrollment service and the callout take a ticket before they write
//! a new pending record; the bucket's stream holds at most
//! [`MAX_PENDING_DEVICES`] keys and refuses new ones beyond, so a flood
//! fills the lobby and no more. fleetctl frees tickets ([`sweep`]): after
//! every decision, and on `fleetctl device pending`. A ticket is freed
//! when its device's record is no longer pending, or when its device has
//! no record [`LOBBY_ORPHAN_AFTER`] after the ticket was taken (the writer
//! died between the two writes). Freeing is a filtered purge
//! ([`js::purge_keys`]), which leaves no deletion marker to count against
//! the bound. A sweep also gives a place to each pending device that has
//! none (recorded before the lobby existed, or by a callout that could
//! not reach it), oldest request first, while places are left: so the
//! bound counts every waiting device once the lobby is there.

use std::collections::BTreeSet;
use std::fmt::Write;

use fleet_common::contracts::{LobbyTicket, RecordState};
use fleet_common::limits::{LOBBY_ORPHAN_AFTER, MAX_PENDING_DEVICES, NATS_REQUEST_TIMEOUT};
use fleet_common::nats_config::stream_info_subject;
use fleet_common::subjects::{kv_subject, BUCKET_LOBBY};
use fleet_common::Timestamp;

use crate::error::CtlError;
use crate::js;

/// The lobby after a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Tickets still held (devices waiting).
    pub held: usize,
    /// Tickets freed by this sweep.
    pub freed: usize,
    /// Pending devices without a ticket given one by this sweep.
    pub placed: usize,
    /// Pending devices left without a ticket: no place was left.
    pub unplaced: usize,
    /// Places: the stream's `max_msgs` ([`MAX_PENDING_DEVICES`] as
    /// `fleetctl buckets create` makes it).
    pub places: u64,
}

impl Swept {
    /// One line for the operator.
    pub fn line(&self) -> String {
        let full = if self.held as u64 >= self.places {
            ": full, new devices are told to slow down until some are approved or rejected"
        } else {
            ""
        };
        let mut now = format!("{} freed now", self.freed);
        if self.placed > 0 {
            let _ = write!(
                now,
                "; {} given to pending devices that had none",
                self.placed
            );
        }
        if self.unplaced > 0 {
            let _ = write!(
                now,
                "; {} pending devices recorded without the lobby have no place",
                self.unplaced
            );
        }
        format!(
            "lobby: {} of {} places taken{full} ({now})",
            self.held, self.places
        )
    }
}

/// The lobby stream's `max_msgs`; [`MAX_PENDING_DEVICES`] when unreadable.
fn places(conn: &nats::Connection) -> u64 {
    conn.request_timeout(
        &stream_info_subject(BUCKET_LOBBY),
        b"",
        NATS_REQUEST_TIMEOUT,
    )
    .ok()
    .and_then(|m| serde_json::from_slice::<serde_json::Value>(&m.data).ok())
    .and_then(|v| v["config"]["max_msgs"].as_u64())
    .unwrap_or(MAX_PENDING_DEVICES)
}

/// Frees every ticket whose device is not waiting any more, and gives one
/// to each of `pending` (the devices recorded pending now, with when they
/// asked) that has none, while places are left. `state_of` gives a
/// device's record state now (`None`: no record).
pub fn sweep(
    conn: &nats::Connection,
    state_of: &dyn Fn(&str) -> Option<RecordState>,
    pending: &[(String, Timestamp)],
    now: Timestamp,
) -> Result<Swept, CtlError> {
    let tickets = js::read_last(conn, BUCKET_LOBBY, &kv_subject(BUCKET_LOBBY, "*"))?;
    let mut free = Vec::new();
    let mut ticketed = BTreeSet::new();
    for t in tickets {
        let Some(value) = t.value else { continue };
        let stale = match state_of(&t.key) {
            Some(RecordState::Pending) => false,
            Some(_) => true,
            // Unreadable: taken by a writer that is not ours; free it too.
            None => serde_json::from_slice::<LobbyTicket>(&value)
                .map_or(true, |l| now.since(l.requested_at) >= LOBBY_ORPHAN_AFTER),
        };
        if stale {
            free.push(t.key);
        } else {
            ticketed.insert(t.key);
        }
    }
    let freed = js::purge_keys(conn, BUCKET_LOBBY, &free)?;
    let places = places(conn);
    let (placed, unplaced) = place(conn, &ticketed, pending, places)?;
    Ok(Swept {
        held: ticketed.len() + placed,
        freed,
        placed,
        unplaced,
        places,
    })
}

/// Tickets for the devices of `pending` not in `ticketed`, oldest request
/// first, as many as places are left: (given, left without one). A ticket
/// another writer took meanwhile counts as given; one the stream refuses
/// (the lobby filled meanwhile) as left without.
fn place(
    conn: &nats::Connection,
    ticketed: &BTreeSet<String>,
    pending: &[(String, Timestamp)],
    places: u64,
) -> Result<(usize, usize), CtlError> {
    let mut unticketed: Vec<&(String, Timestamp)> = pending
        .iter()
        .filter(|(id, _)| !ticketed.contains(id))
        .collect();
    unticketed.sort_by_key(|(id, at)| (*at, id.clone()));
    let room = usize::try_from(places)
        .unwrap_or(usize::MAX)
        .saturating_sub(ticketed.len());
    let mut writes = Vec::new();
    for (id, at) in unticketed.iter().take(room) {
        let ticket = LobbyTicket { requested_at: *at };
        writes.push(js::CasWrite {
            key: id.clone(),
            value: serde_json::to_vec(&ticket).map_err(|e| CtlError::Nats {
                what: format!("a lobby ticket for {id}"),
                detail: e.to_string(),
            })?,
            expected_seq: 0,
        });
    }
    let outcomes = js::cas_put_all(conn, BUCKET_LOBBY, &writes)?;
    let given = outcomes
        .iter()
        .filter(|o| !matches!(o, js::CasOutcome::Failed(_)))
        .count();
    Ok((given, unticketed.len() - given))
}

/// [`sweep`] for a command whose work is done: its outcome as a line, a
/// failure included (the decision stands; the next sweep frees the rest).
pub fn sweep_line(
    conn: &nats::Connection,
    state_of: &dyn Fn(&str) -> Option<RecordState>,
    pending: &[(String, Timestamp)],
    now: Timestamp,
) -> String {
    match sweep(conn, state_of, pending, now) {
        Ok(s) => s.line(),
        Err(e) => format!(
            "lobby: not swept ({e}); fleetctl device pending frees its places later (no lobby at all: run fleetctl buckets create)"
        ),
    }
}
