//! Request/reply inside the device's permissions: one subscription on
//! `_INBOX.<device>.<random>.*` for the life of the connection, and a
//! dispatcher thread (`agent-inbox`) routing each reply, by its last
//! subject token, to the caller waiting for it. The crate's own request
//! helpers use `_INBOX.<random>`, which a device may not subscribe to, and
//! a subscription per request would race its own reply across a cluster.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use fleet_common::subjects::inbox_prefix;
use fleet_common::validate::DeviceId;

use crate::threads;

const DISPATCHER_STACK_BYTES: usize = 128 * 1024;
/// How long closing waits for the dispatcher to notice.
const DISPATCHER_JOIN_TIMEOUT: Duration = Duration::from_secs(2);

type Waiters = Arc<Mutex<HashMap<u64, SyncSender<nats::Message>>>>;

/// The device's reply inbox.
#[derive(Debug)]
pub struct Inbox {
    prefix: String,
    waiters: Waiters,
    next: AtomicU64,
    sub: nats::Subscription,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A request that got no usable reply.
#[derive(Debug)]
pub enum RequestError {
    Publish {
        subject: String,
        source: io::Error,
    },
    Timeout {
        subject: String,
        after: Duration,
        server_error: Option<String>,
    },
    /// No reply, and the connection is down (the client is reconnecting).
    Disconnected {
        subject: String,
    },
    /// Nobody subscribes to the subject: for JetStream, the stream (bucket)
    /// does not exist or the API is not imported for this account.
    NoResponders {
        subject: String,
    },
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Publish { subject, source } => write!(f, "publishing to {subject}: {source}"),
            Self::Timeout {
                subject,
                after,
                server_error,
            } => {
                write!(f, "no reply on {subject} within {} s", after.as_secs())?;
                match server_error {
                    Some(e) => write!(f, "; the server said: {e}"),
                    None => write!(f, "; check the connection and this device's NATS permissions"),
                }
            }
            Self::Disconnected { subject } => {
                write!(f, "no reply on {subject}: NATS is disconnected (reconnecting)")
            }
            Self::NoResponders { subject } => write!(
                f,
                "nothing answers on {subject}: the JetStream bucket is missing or not exported to this device's account"
            ),
        }
    }
}

impl std::error::Error for RequestError {}

/// A NATS status header value (`100`, `503`), if the message has one.
pub fn status_of(m: &nats::Message) -> Option<&str> {
    m.headers.as_ref()?.get("Status").map(String::as_str)
}

impl Inbox {
    /// Subscribes to a fresh inbox and starts the dispatcher.
    pub fn start(conn: &nats::Connection, device: &DeviceId) -> io::Result<Inbox> {
        let prefix = format!("{}{}.", inbox_prefix(device), uuid::Uuid::new_v4().simple());
        let sub = conn.subscribe(&format!("{prefix}*"))?;
        let waiters: Waiters = Arc::default();
        let thread = {
            let sub = sub.clone();
            let waiters = Arc::clone(&waiters);
            thread::Builder::new()
                .name("agent-inbox".into())
                .stack_size(DISPATCHER_STACK_BYTES)
                .spawn(move || dispatch(&sub, &waiters))?
        };
        Ok(Inbox {
            prefix,
            waiters,
            next: AtomicU64::new(1),
            sub,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Publishes `payload` to `subject` with a reply subject on the inbox
    /// and waits up to `timeout` for the reply.
    pub fn request(
        &self,
        conn: &nats::Connection,
        subject: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<nats::Message, RequestError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        self.lock().insert(id, tx);
        let reply = format!("{}{id}", self.prefix);
        if let Err(source) =
            conn.publish_with_reply_or_headers(subject, Some(&reply), None, payload)
        {
            self.lock().remove(&id);
            return Err(RequestError::Publish {
                subject: subject.to_owned(),
                source,
            });
        }
        let got = rx.recv_timeout(timeout);
        self.lock().remove(&id);
        match got {
            Ok(m) if status_of(&m) == Some("503") => Err(RequestError::NoResponders {
                subject: subject.to_owned(),
            }),
            Ok(m) => Ok(m),
            Err(_) => Err(RequestError::Timeout {
                subject: subject.to_owned(),
                after: timeout,
                server_error: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SyncSender<nats::Message>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unsubscribes, which ends the dispatcher, and joins it.
    pub fn stop(&self) {
        let _ = self.sub.clone().unsubscribe();
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            threads::join_within(h, DISPATCHER_JOIN_TIMEOUT, "agent-inbox");
        }
    }
}

fn dispatch(sub: &nats::Subscription, waiters: &Waiters) {
    while let Some(m) = sub.next() {
        let id = m
            .subject
            .rsplit('.')
            .next()
            .and_then(|t| t.parse::<u64>().ok());
        let waiter = id.and_then(|id| {
            waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .cloned()
        });
        match waiter {
            // A full channel means a second reply to one request: dropped.
            Some(tx) => {
                let _ = tx.try_send(m);
            }
            None => log::debug!("late or unknown reply on {}", m.subject),
        }
    }
}
