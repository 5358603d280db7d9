//! One JetStream push consumer on a KV bucket, scoped to this device's
//! keys (DESIGN.md "How a device talks to JetStream").
//!
//! Steps of [`KvConsumer::create`]: subscribe to the exact deliver subject
//! `deliver.<device>.<random>` first (a wildcard subscription does not count
//! as interest); then ask for the consumer on the subject-scoped create API
//! `fleetapi.CONSUMER.CREATE.KV_<bucket>.<random>.$KV.<bucket>.<device>.>`
//! with the same filter in the body: last value per key, no acks, flow
//! control, idle heartbeats, in memory, removed by the server when nobody
//! listens for a while (devices cannot delete consumers).
//!
//! [`KvConsumer::next`] answers flow-control requests, notes idle
//! heartbeats, drops (and logs) any delivery that is not one of this
//! device's keys, and reads the pending count and consumer sequence from
//! the `$JS.ACK...` reply subject. A gap in the consumer sequence or three
//! missed heartbeats is an error: the caller creates a new consumer.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use fleet_common::jetstream::{
    is_kv_delete, nanos, AckInfo, ConsumerCreateResponse, HEADER_KV_OPERATION,
};
use fleet_common::limits::NATS_REQUEST_TIMEOUT;
use fleet_common::subjects::{
    deliver_prefix, device_consumer_create_subject, device_filter, stream_name,
};

use super::connection::Nats;
use super::inbox::{status_of, RequestError};

/// Heartbeats missed before a consumer counts as lost (DESIGN.md).
pub const MISSED_HEARTBEATS: u32 = 3;
/// The server deletes a consumer nobody has listened to for this long.
/// The agent replaces its consumer after every reconnect, so a short
/// threshold only cleans up sooner.
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(30);

/// Longest wait for one message while reading a snapshot.
const SNAPSHOT_TICK: Duration = Duration::from_secs(1);

/// A complete view of the device's keys in a bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub keys: BTreeMap<String, Vec<u8>>,
    /// Keys beyond the limit, ignored.
    pub dropped: usize,
}

/// Reading a snapshot ended early.
#[derive(Debug)]
pub enum SnapshotError {
    Consumer(ConsumerError),
    Stopped(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Consumer(e) => write!(f, "{e}"),
            Self::Stopped(why) => write!(f, "snapshot interrupted: {why}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// A key's new state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    Put(Vec<u8>),
    /// A KV delete or purge: the key is absent.
    Delete,
}

/// One delivered key of this device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key below `<device>.` (for `fleet-desired`, the workload name).
    pub key: String,
    pub op: KvOp,
    /// Messages the consumer still has to deliver; 0 ends a snapshot.
    pub pending: u64,
}

/// The consumer failed or must be replaced.
#[derive(Debug)]
pub enum ConsumerError {
    Subscribe {
        subject: String,
        source: io::Error,
    },
    Create {
        bucket: &'static str,
        source: RequestError,
    },
    /// The JetStream API refused the request.
    Refused {
        bucket: &'static str,
        code: u64,
        description: String,
    },
    BadResponse {
        bucket: &'static str,
        detail: String,
    },
    /// No message and no heartbeat for [`MISSED_HEARTBEATS`] intervals.
    Stale {
        bucket: &'static str,
        silent_for: Duration,
    },
    /// A delivery was skipped (the server dropped messages for us).
    Gap {
        bucket: &'static str,
        expected: u64,
        got: u64,
    },
    /// The server ended the consumer (a status other than 100).
    Ended {
        bucket: &'static str,
        status: String,
    },
    /// The subscription closed with the connection.
    Closed {
        bucket: &'static str,
    },
}

impl fmt::Display for ConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Subscribe { subject, source } => write!(f, "subscribing to {subject}: {source}"),
            Self::Create { bucket, source } => write!(f, "creating a consumer on {bucket}: {source}"),
            Self::Refused {
                bucket,
                code,
                description,
            } => write!(
                f,
                "JetStream refused a consumer on {bucket}: {description} (code {code}); check the bucket exists and this device may read it"
            ),
            Self::BadResponse { bucket, detail } => write!(f, "unexpected JetStream answer for {bucket}: {detail}"),
            Self::Stale { bucket, silent_for } => write!(
                f,
                "the consumer on {bucket} sent nothing, not even a heartbeat, for {} s",
                silent_for.as_secs()
            ),
            Self::Gap {
                bucket,
                expected,
                got,
            } => write!(
                f,
                "the consumer on {bucket} skipped deliveries (expected sequence {expected}, got {got})"
            ),
            Self::Ended { bucket, status } => write!(f, "the server ended the consumer on {bucket}: {status}"),
            Self::Closed { bucket } => write!(f, "the subscription for {bucket} closed with the connection"),
        }
    }
}

impl std::error::Error for ConsumerError {}

/// A live consumer and its deliver subscription. Dropping it unsubscribes;
/// the server then removes the consumer after [`INACTIVE_THRESHOLD`].
#[derive(Debug)]
pub struct KvConsumer {
    bucket: &'static str,
    name: String,
    sub: nats::Subscription,
    key_prefix: String,
    idle_heartbeat: Duration,
    last_activity: Instant,
    last_consumer_seq: u64,
    initial_pending: u64,
    nats_publish: NatsPublish,
}

/// What `next` needs from the connection: answering flow control.
#[derive(Debug)]
struct NatsPublish(std::sync::Arc<Nats>);

impl KvConsumer {
    /// Creates a consumer on `bucket` for this device's keys; see the
    /// module documentation.
    pub fn create(
        nats: &std::sync::Arc<Nats>,
        bucket: &'static str,
        idle_heartbeat: Duration,
    ) -> Result<KvConsumer, ConsumerError> {
        let device = nats.device();
        let name = uuid::Uuid::new_v4().simple().to_string();
        let deliver = format!("{}{name}", deliver_prefix(device));
        let sub = nats
            .subscribe(&deliver)
            .map_err(|source| ConsumerError::Subscribe {
                subject: deliver.clone(),
                source,
            })?;
        let filter = device_filter(bucket, device);
        let body = serde_json::json!({
            "stream_name": stream_name(bucket),
            "config": {
                "name": name,
                "deliver_subject": deliver,
                "deliver_policy": "last_per_subject",
                "ack_policy": "none",
                "replay_policy": "instant",
                "filter_subject": filter,
                "flow_control": true,
                "idle_heartbeat": nanos(idle_heartbeat),
                "inactive_threshold": nanos(INACTIVE_THRESHOLD),
                "mem_storage": true,
            }
        });
        let subject = device_consumer_create_subject(bucket, &name, device);
        let reply = nats
            .request(&subject, body.to_string().as_bytes(), NATS_REQUEST_TIMEOUT)
            .map_err(|source| ConsumerError::Create { bucket, source })?;
        let resp: ConsumerCreateResponse =
            serde_json::from_slice(&reply.data).map_err(|e| ConsumerError::BadResponse {
                bucket,
                detail: format!("{e}"),
            })?;
        if let Some(e) = resp.error {
            return Err(ConsumerError::Refused {
                bucket,
                code: e.best_code(),
                description: e.description,
            });
        }
        let initial_pending = resp.num_pending.ok_or_else(|| ConsumerError::BadResponse {
            bucket,
            detail: "no num_pending in the create response".into(),
        })?;
        if resp.name.as_deref() != Some(name.as_str()) {
            return Err(ConsumerError::BadResponse {
                bucket,
                detail: format!("the server named the consumer {:?}, not {name}", resp.name),
            });
        }
        Ok(KvConsumer {
            bucket,
            name,
            sub,
            key_prefix: format!("$KV.{bucket}.{device}."),
            idle_heartbeat,
            last_activity: Instant::now(),
            last_consumer_seq: 0,
            initial_pending,
            nats_publish: NatsPublish(std::sync::Arc::clone(nats)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Another handle on the deliver subscription: unsubscribing it ends a
    /// [`next`](Self::next) waiting on another thread at once (the
    /// watcher's stop, so a drain does not wait out the wait).
    pub fn interrupter(&self) -> nats::Subscription {
        self.sub.clone()
    }

    /// Messages pending when the consumer was created; 0 means the snapshot
    /// is already complete (a device with no keys).
    pub fn initial_pending(&self) -> u64 {
        self.initial_pending
    }

    /// Waits up to `wait` for the next entry of this device. `Ok(None)`
    /// when nothing usable arrived (a timeout, a heartbeat, flow control or
    /// a dropped foreign delivery).
    pub fn next(&mut self, wait: Duration) -> Result<Option<KvEntry>, ConsumerError> {
        let bucket = self.bucket;
        let m = match self.sub.next_timeout(wait) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                let silent_for = self.last_activity.elapsed();
                if silent_for > self.idle_heartbeat * MISSED_HEARTBEATS {
                    return Err(ConsumerError::Stale { bucket, silent_for });
                }
                return Ok(None);
            }
            Err(_) => return Err(ConsumerError::Closed { bucket }),
        };
        self.last_activity = Instant::now();
        if let Some(status) = status_of(&m) {
            return self.on_status(status, &m).map(|()| None);
        }
        let Some(key) = m.subject.strip_prefix(&self.key_prefix) else {
            log::warn!(bucket = bucket; "dropping a delivery for {}: not a key of this device", m.subject);
            return Ok(None);
        };
        if key.is_empty() {
            log::warn!(bucket = bucket; "dropping a delivery for {}: empty key", m.subject);
            return Ok(None);
        }
        let ack = m.reply.as_deref().and_then(AckInfo::parse).ok_or_else(|| {
            ConsumerError::BadResponse {
                bucket,
                detail: format!(
                    "delivery of {} has no JetStream ack subject ({:?})",
                    m.subject, m.reply
                ),
            }
        })?;
        let expected = self.last_consumer_seq + 1;
        if ack.consumer_seq != expected {
            return Err(ConsumerError::Gap {
                bucket,
                expected,
                got: ack.consumer_seq,
            });
        }
        self.last_consumer_seq = ack.consumer_seq;
        let operation = m.headers.as_ref().and_then(|h| h.get(HEADER_KV_OPERATION));
        let op = if is_kv_delete(operation.map(String::as_str)) {
            KvOp::Delete
        } else {
            KvOp::Put(m.data)
        };
        Ok(Some(KvEntry {
            key: key.to_owned(),
            op,
            pending: ack.pending,
        }))
    }

    /// Reads until the snapshot is complete: the keys present (deletes
    /// applied), at most `max_keys` of them, and how many more were
    /// dropped. `stop` is asked between messages; when it answers, the read
    /// ends with that reason as [`SnapshotError::Stopped`].
    pub fn read_snapshot(
        &mut self,
        max_keys: usize,
        stop: &mut dyn FnMut() -> Option<String>,
    ) -> Result<Snapshot, SnapshotError> {
        let tick = self.idle_heartbeat.min(SNAPSHOT_TICK);
        let mut snap = Snapshot::default();
        let mut complete = self.initial_pending == 0;
        while !complete {
            if let Some(why) = stop() {
                return Err(SnapshotError::Stopped(why));
            }
            let Some(entry) = self.next(tick).map_err(SnapshotError::Consumer)? else {
                continue;
            };
            match entry.op {
                KvOp::Put(v) => {
                    if snap.keys.len() < max_keys || snap.keys.contains_key(&entry.key) {
                        snap.keys.insert(entry.key, v);
                    } else {
                        snap.dropped += 1;
                    }
                }
                KvOp::Delete => {
                    snap.keys.remove(&entry.key);
                }
            }
            complete = entry.pending == 0;
        }
        Ok(snap)
    }

    /// Status 100 is a heartbeat or a flow-control request; anything else
    /// ends the consumer.
    fn on_status(&mut self, status: &str, m: &nats::Message) -> Result<(), ConsumerError> {
        let bucket = self.bucket;
        if status != "100" {
            let description = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Description"))
                .cloned()
                .unwrap_or_default();
            return Err(ConsumerError::Ended {
                bucket,
                status: format!("{status} {description}"),
            });
        }
        // A flow-control request carries its reply subject; an idle
        // heartbeat may name a stalled flow-control subject to answer.
        let headers = m.headers.as_ref();
        let answer = m.reply.clone().or_else(|| {
            headers
                .and_then(|h| h.get("Nats-Consumer-Stalled"))
                .cloned()
        });
        if let Some(fc) = answer {
            if let Err(e) = self.nats_publish.0.publish(&fc, b"") {
                log::warn!(bucket = bucket; "answering flow control on {fc}: {e}");
            }
        }
        if let Some(last) = headers
            .and_then(|h| h.get("Nats-Last-Consumer"))
            .and_then(|v| v.parse::<u64>().ok())
        {
            if last > self.last_consumer_seq {
                return Err(ConsumerError::Gap {
                    bucket,
                    expected: self.last_consumer_seq + 1,
                    got: last,
                });
            }
        }
        Ok(())
    }
}
