//! The copy of the updater's state that `status` reads: the last journal
//! and the in-memory sub-steps of the current attempt. [`crate::state`]
//! keeps it current; [`crate::status`] turns it into the public status and
//! systemd's `STATUS=` line.

use fleet_common::contracts::Journal;
use fleet_common::validate::AttemptUuid;
use fleet_common::Timestamp;

/// The sub-steps of the durable phase `activating`, kept in memory only:
/// after a crash, recovery takes over from the durable phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Stopping,
    Starting,
}

/// What the running updater knows beyond the journal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    /// The attempt the fields below belong to.
    pub attempt: Option<AttemptUuid>,
    /// Sub-steps of `activating`, with their times.
    pub steps: Vec<(Step, Timestamp)>,
    /// What is happening now, for a person.
    pub detail: Option<String>,
    /// Drain of the old agent, known before it is written with the next phase.
    pub drain_ms: Option<u64>,
    /// systemd invocation id of the agent run this status concerns.
    pub invocation_id: Option<String>,
}

/// A consistent copy for `status`.
#[derive(Debug, Clone)]
pub struct Published {
    pub journal: Journal,
    pub unsynced: Option<String>,
    pub live: Live,
}
