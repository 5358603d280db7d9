//! The updater's shared state, and the one token that allows changing it.
//!
//! - [`Shared::published`]: what `status` reads — the last journal and the
//!   in-memory sub-steps of the current attempt. Held only to copy.
//! - The [`Mutator`]: owns the [`JournalStore`] while it exists. There is
//!   exactly one; an `upgrade` request or the recovery thread takes it with
//!   [`Shared::try_mutator`] (a second taker is told `busy`), passes it to
//!   the functions that change state, and hands it back on drop. It moves
//!   with the work: from the request thread to the cutover thread.
//!
//! Every change of the published state also updates systemd's `STATUS=`
//! ([`crate::status::status_line`]), so `systemctl status fleet-updater`
//! stays current.

use std::sync::{Arc, Mutex, MutexGuard};

use fleet_common::contracts::{Journal, JournalPhase, Transaction, UpgradeReason};
use fleet_common::Timestamp;

use crate::journal::{JournalStore, JournalWriteError};
use crate::published::{Live, Published, Step};
use crate::status;

#[derive(Debug)]
pub struct Shared {
    published: Mutex<Published>,
    slot: Mutex<Option<JournalStore>>,
    /// The last `STATUS=` sent, so an unchanged line is not sent again.
    status_line: Mutex<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind
    // (no invariant spans the lock), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(store: JournalStore) -> Arc<Self> {
        let published = Published {
            journal: store.journal().clone(),
            unsynced: None,
            live: Live::default(),
        };
        Arc::new(Self {
            published: Mutex::new(published),
            slot: Mutex::new(Some(store)),
            status_line: Mutex::new(String::new()),
        })
    }

    /// Sends the current status line to systemd when it changed (a no-op
    /// outside systemd).
    pub fn notify_status(&self) {
        let line = status::status_line(&self.snapshot());
        let mut last = lock(&self.status_line);
        if *last != line {
            let _ = libsystemd::daemon::notify(
                false,
                &[libsystemd::daemon::NotifyState::Status(line.clone())],
            );
            *last = line;
        }
    }

    /// A copy of the published state.
    pub fn snapshot(&self) -> Published {
        lock(&self.published).clone()
    }

    /// The mutator, unless someone holds it.
    pub fn try_mutator(self: &Arc<Self>) -> Option<Mutator> {
        let store = lock(&self.slot).take()?;
        Some(Mutator {
            store: Some(store),
            shared: Arc::clone(self),
        })
    }
}

/// The right to change the journal, the active link and the service.
#[derive(Debug)]
pub struct Mutator {
    /// INVARIANT: `Some` until drop.
    store: Option<JournalStore>,
    shared: Arc<Shared>,
}

impl Mutator {
    fn store(&self) -> &JournalStore {
        self.store
            .as_ref()
            .expect("INVARIANT: the store is present until drop")
    }

    fn store_mut(&mut self) -> &mut JournalStore {
        self.store
            .as_mut()
            .expect("INVARIANT: the store is present until drop")
    }

    pub fn journal(&self) -> &Journal {
        self.store().journal()
    }

    pub fn transaction(&self) -> Option<&Transaction> {
        self.store().transaction()
    }

    /// Starts and writes a new transaction; on failure nothing started.
    pub fn begin(&mut self, tx: Transaction) -> Result<(), JournalWriteError> {
        let uuid = tx.attempt.uuid;
        let r = self.store_mut().begin(tx);
        if r.is_ok() {
            self.live(|l| {
                *l = Live {
                    attempt: Some(uuid),
                    invocation_id: l.invocation_id.take(),
                    ..Live::default()
                }
            });
        }
        self.publish();
        r
    }

    /// Records `phase` (and `error`), writes the journal, publishes.
    pub fn enter(
        &mut self,
        phase: JournalPhase,
        reason: Option<UpgradeReason>,
        error: Option<(&str, &str)>,
    ) -> Result<(), JournalWriteError> {
        let drain = self.live_drain();
        let now = Timestamp::now();
        let r = self.store_mut().update(phase, |tx| {
            if let Some((step, message)) = error {
                tx.record_error(step, message, now);
            }
            if tx.drain_duration_ms.is_none() {
                tx.drain_duration_ms = drain;
            }
            tx.enter(phase, reason, now);
        });
        if phase != JournalPhase::Activating {
            self.live(|l| l.detail = None);
        }
        self.publish();
        r
    }

    /// Writes again the journal whose write failed, and publishes.
    pub fn retry(&mut self) -> Result<(), JournalWriteError> {
        let r = self.store_mut().retry();
        self.publish();
        r
    }

    /// Why the last journal write failed, while no later one succeeded.
    pub fn unsynced(&self) -> Option<(JournalPhase, String)> {
        let s = self.store();
        Some((s.unsynced_phase()?, s.unsynced()?.to_owned()))
    }

    /// Records an error in the current phase (no transition), writes the
    /// journal, publishes.
    pub fn note(&mut self, step: &str, message: &str) -> Result<(), JournalWriteError> {
        let Some(phase) = self.transaction().map(|t| t.phase) else {
            return Ok(());
        };
        let now = Timestamp::now();
        let r = self
            .store_mut()
            .update(phase, |tx| tx.record_error(step, message, now));
        self.publish();
        r
    }

    fn live_drain(&self) -> Option<u64> {
        let p = lock(&self.shared.published);
        p.live.drain_ms
    }

    /// Changes the in-memory view of the current attempt (never persisted).
    pub fn live(&self, f: impl FnOnce(&mut Live)) {
        f(&mut lock(&self.shared.published).live);
        self.shared.notify_status();
    }

    /// Enters an `activating` sub-step now.
    pub fn step(&self, step: Step) {
        self.live(|l| l.steps.push((step, Timestamp::now())));
    }

    /// Sets the detail a person sees.
    pub fn detail(&self, text: impl Into<String>) {
        let text = text.into();
        self.live(|l| l.detail = Some(text));
    }

    fn publish(&self) {
        let store = self.store();
        {
            let mut p = lock(&self.shared.published);
            p.journal = store.journal().clone();
            p.unsynced = store.unsynced().map(str::to_owned);
        }
        self.shared.notify_status();
    }
}

impl Drop for Mutator {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            *lock(&self.shared.slot) = Some(store);
        }
    }
}
