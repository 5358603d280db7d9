//! What the fleetctl tests share: a watcher of the disruption budget.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use fleet_common::contracts::{AgentUpgradeAttempt, UpgradeStatus};

/// Follows every intent and upgrade status change and keeps, per group,
/// the most devices upgrading at once (an intent not yet terminal).
pub struct BudgetWatch {
    max: Arc<Mutex<BTreeMap<String, usize>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl BudgetWatch {
    /// `conn`: an admin connection; `groups`: each device's group.
    pub fn start(conn: nats::Connection, groups: BTreeMap<String, String>) -> BudgetWatch {
        let sub = conn.subscribe("$KV.>").expect("subscribe");
        conn.flush().expect("flush");
        let max = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, stopped) = (Arc::clone(&max), Arc::clone(&stop));
        let handle = thread::spawn(move || {
            let _conn = conn;
            let mut intent: BTreeMap<String, String> = BTreeMap::new();
            let mut status: BTreeMap<String, (String, bool)> = BTreeMap::new();
            while !stopped.load(Ordering::Relaxed) {
                let Ok(msg) = sub.next_timeout(Duration::from_millis(100)) else {
                    continue;
                };
                let parts: Vec<&str> = msg.subject.splitn(4, '.').collect();
                let [_, bucket, device, key] = parts[..] else {
                    continue;
                };
                match (bucket, key) {
                    ("fleet-control", "agent-upgrade-intent") => {
                        if let Ok(a) = serde_json::from_slice::<AgentUpgradeAttempt>(&msg.data) {
                            intent.insert(device.to_owned(), a.uuid.to_string());
                        }
                    }
                    ("fleet-status", "upgrade") => {
                        if let Ok(s) = serde_json::from_slice::<UpgradeStatus>(&msg.data) {
                            status.insert(
                                device.to_owned(),
                                (s.attempt_uuid.to_string(), s.phase.is_terminal()),
                            );
                        }
                    }
                    _ => continue,
                }
                // At every status change: devices upgrading, per group.
                let mut now: BTreeMap<String, usize> = BTreeMap::new();
                for (d, uuid) in &intent {
                    let done = status.get(d).is_some_and(|(u, t)| u == uuid && *t);
                    if !done {
                        let g = groups.get(d).cloned().unwrap_or_default();
                        *now.entry(g).or_default() += 1;
                    }
                }
                let mut max: std::sync::MutexGuard<BTreeMap<String, usize>> =
                    m.lock().expect("lock");
                for (g, n) in now {
                    let e = max.entry(g).or_default();
                    *e = (*e).max(n);
                }
            }
        });
        BudgetWatch {
            max,
            stop,
            handle: Some(handle),
        }
    }

    /// The most devices of each group upgrading at once.
    pub fn max(&self) -> BTreeMap<String, usize> {
        self.max.lock().expect("lock").clone()
    }
}

impl Drop for BudgetWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Intents ever written to `device` (the bucket keeps 5). The `nats`
/// crate's history of a key never written waits forever: such a key is
/// looked up first.
pub fn intent_revisions(admin: &nats::Connection, device: &str) -> usize {
    let store = nats::jetstream::new(admin.clone())
        .key_value("fleet-control")
        .expect("bucket");
    let key = format!("{device}.agent-upgrade-intent");
    match store.entry(&key).expect("entry") {
        None => 0,
        Some(_) => store.history(&key).map(|h| h.count()).unwrap_or(0),
    }
}
