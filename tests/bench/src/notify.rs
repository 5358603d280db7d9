//! A `NOTIFY_SOCKET` standing in for systemd's: it records every datagram
//! agents send (`READY=1\nSTATUS=device <id>, ...`), so the bench knows
//! when each agent is ready. One socket may serve a whole simulated fleet.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Seen {
    messages: Vec<String>,
    ready: usize,
}

#[derive(Debug)]
pub struct Notify {
    path: PathBuf,
    seen: Arc<(Mutex<Seen>, Condvar)>,
}

impl Notify {
    pub fn bind(path: &Path) -> Notify {
        let sock = UnixDatagram::bind(path)
            .unwrap_or_else(|e| panic!("binding the notify socket {}: {e}", path.display()));
        let seen: Arc<(Mutex<Seen>, Condvar)> = Arc::default();
        let shared = Arc::clone(&seen);
        // Detached: it ends when the process does (the socket is never closed
        // before then).
        std::thread::Builder::new()
            .name("bench-notify".into())
            .spawn(move || {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = sock.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let (lock, changed) = &*shared;
                    let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if text.lines().any(|l| l == "READY=1") {
                        s.ready += 1;
                    }
                    s.messages.push(text);
                    changed.notify_all();
                }
            })
            .unwrap_or_else(|e| panic!("spawning the notify reader: {e}"));
        Notify {
            path: path.to_owned(),
            seen,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many `READY=1` datagrams arrived.
    pub fn ready_count(&self) -> usize {
        self.seen.0.lock().unwrap_or_else(|e| e.into_inner()).ready
    }

    /// Waits until `n` agents said `READY=1`; `false` after `timeout`.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, changed) = &*self.seen;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        while s.ready < n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}
