//! The JetStream requests fleetctl makes beyond the crate's KV helpers,
//! for a fleet of thousands of devices in seconds:
//!
//! - [`read_last`]: the last value of every key matching a filter, through
//!   one ephemeral push consumer (`last_per_subject`, no acks, flow
//!   control): one request and a stream of messages instead of one `get`
//!   per key. The snapshot is complete when the pending count of the
//!   delivery's ack subject reaches 0. A create that goes unanswered (a
//!   server before 2.9.12 may place the consumer on a dead peer) is made
//!   again under a new name ([`CONSUMER_CREATE_WAITS`]).
//! - [`cas_put_all`]: compare-and-set writes, pipelined: each published
//!   with `Nats-Expected-Last-Subject-Sequence` (0: the key must never have
//!   been written) and a reply subject on one inbox, up to
//!   [`MAX_IN_FLIGHT`] unanswered at a time; JetStream refuses a write
//!   whose key moved since it was read (another writer won).
//! - [`follow`]: a consumer from now on (or from a sequence), for `watch`.
//! - [`purge_keys`]: every message of some keys removed (a filtered stream
//!   purge each, pipelined as the writes are): no deletion marker is left
//!   to count against a bounded bucket's `max_msgs`.
//! - [`kv`] and [`is_wrong_last_sequence`]: a bucket through the crate's KV
//!   helper, and whether its compare-and-set write lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fleet_common::jetstream::{
    is_kv_delete, nanos, AckInfo, ConsumerCreateResponse, PubAckResponse, ERR_WRONG_LAST_SEQUENCE,
    HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE, HEADER_KV_OPERATION, HEADER_STATUS, KV_OPERATION_DELETE,
};
use fleet_common::limits::CONSUMER_CREATE_WAITS;
use fleet_common::subjects::{kv_subject, stream_name};

use crate::error::CtlError;

/// A bucket through the crate's KV helper (the operator may use it).
pub fn kv(conn: &nats::Connection, bucket: &str) -> Result<nats::kv::Store, CtlError> {
    nats::jetstream::new(conn.clone())
        .key_value(bucket)
        .map_err(CtlError::nats(format!(
            "opening bucket {bucket} (create it with `fleetctl buckets create`)"
        )))
}

/// Whether a KV write failed the compare-and-set check.
pub fn is_wrong_last_sequence(e: &std::io::Error) -> bool {
    let text = e.to_string();
    text.contains("wrong last sequence") || text.contains("10071") || text.contains("key exists")
}

/// Writes waiting for their ack at most.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Idle heartbeat asked of read consumers; a read that hears nothing, not
/// even a heartbeat, for [`READ_SILENCE`] has lost its consumer.
const READ_HEARTBEAT: Duration = Duration::from_secs(1);
const READ_SILENCE: Duration = Duration::from_secs(5);
/// Bound on a whole snapshot read (10,000 devices take well under a second).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on collecting the answers of a pipelined batch after the last
/// request sent or answer heard.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// The last message of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key (the subject after `$KV.<bucket>.`).
    pub key: String,
    /// Its stream sequence (the revision a CAS write must name).
    pub seq: u64,
    /// `None` when the last operation deleted or purged the key.
    pub value: Option<Vec<u8>>,
}

fn status_of(m: &nats::Message) -> Option<&str> {
    m.headers.as_ref()?.get(HEADER_STATUS).map(String::as_str)
}

fn is_delete(m: &nats::Message) -> bool {
    is_kv_delete(
        m.headers
            .as_ref()
            .and_then(|h| h.get(HEADER_KV_OPERATION))
            .map(String::as_str),
    )
}

/// What one wait on a consumer brought.
enum Delivery {
    /// A key's message and the consumer's pending count after it.
    Entry(KvEntry, u64),
    /// A heartbeat or flow-control request (answered).
    Control,
    Nothing,
}

/// An ephemeral push consumer on `bucket` and its subscription.
struct Consumer {
    conn: nats::Connection,
    bucket: String,
    name: String,
    sub: nats::Subscription,
    pending: u64,
}

impl Consumer {
    /// `deliver`: the consumer config's deliver policy fields.
    fn create(
        conn: &nats::Connection,
        bucket: &str,
        filter: &str,
        deliver: serde_json::Value,
    ) -> Result<Consumer, CtlError> {
        let what = || format!("reading {bucket} ({filter})");
        let stream = stream_name(bucket);
        let mut last_error = String::new();
        for wait in CONSUMER_CREATE_WAITS {
            // A new name and a new inbox each time: a consumer whose create
            // went unanswered but that comes to life later delivers to an
            // inbox nobody listens on, and is deleted.
            let name = format!("fleetctl-{}", uuid::Uuid::new_v4().simple());
            let inbox = conn.new_inbox();
            let sub = conn.subscribe(&inbox).map_err(CtlError::nats(what()))?;
            let mut config = serde_json::json!({
                "name": name,
                "deliver_subject": inbox,
                "ack_policy": "none",
                "replay_policy": "instant",
                "filter_subject": filter,
                "flow_control": true,
                "idle_heartbeat": nanos(READ_HEARTBEAT),
                "mem_storage": true,
            });
            if let (Some(c), Some(d)) = (config.as_object_mut(), deliver.as_object()) {
                c.extend(d.clone());
            }
            let body = serde_json::json!({ "stream_name": stream, "config": config });
            match conn.request_timeout(
                &format!("$JS.API.CONSUMER.CREATE.{stream}.{name}"),
                body.to_string(),
                wait,
            ) {
                Ok(reply) => return Consumer::created(conn, bucket, name, sub, &reply.data, what),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    drop(sub);
                    delete_consumer(conn, bucket, &name);
                    last_error = e.to_string();
                }
                Err(e) => return Err(CtlError::nats(what())(e)),
            }
        }
        Err(CtlError::Nats {
            what: what(),
            detail: format!(
                "{last_error}: {} consumer creates went unanswered (does the bucket exist? fleetctl buckets create)",
                CONSUMER_CREATE_WAITS.len()
            ),
        })
    }

    /// The consumer the create request answered by `data` made.
    fn created(
        conn: &nats::Connection,
        bucket: &str,
        name: String,
        sub: nats::Subscription,
        data: &[u8],
        what: impl Fn() -> String,
    ) -> Result<Consumer, CtlError> {
        let resp: ConsumerCreateResponse =
            serde_json::from_slice(data).map_err(|e| CtlError::Nats {
                what: what(),
                detail: format!("unexpected JetStream answer: {e}"),
            })?;
        if let Some(e) = resp.error {
            return Err(CtlError::Nats {
                what: what(),
                detail: format!(
                    "{} (code {}); create the buckets with fleetctl buckets create",
                    e.description,
                    e.best_code()
                ),
            });
        }
        Ok(Consumer {
            conn: conn.clone(),
            bucket: bucket.to_owned(),
            name: resp.name.unwrap_or(name),
            sub,
            pending: resp.num_pending.unwrap_or(0),
        })
    }

    /// The next delivery, answering flow control.
    fn next(&self, wait: Duration) -> Result<Delivery, std::io::Error> {
        let m = match self.sub.next_timeout(wait) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Ok(Delivery::Nothing),
            Err(e) => return Err(e),
        };
        if status_of(&m).is_some() {
            let fc = m.reply.clone().or_else(|| {
                m.headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Consumer-Stalled"))
                    .cloned()
            });
            if let Some(fc) = fc {
                self.conn.publish(&fc, b"")?;
            }
            return Ok(Delivery::Control);
        }
        let prefix = format!("$KV.{}.", self.bucket);
        let Some(key) = m.subject.strip_prefix(&prefix) else {
            return Ok(Delivery::Control);
        };
        let Some(AckInfo {
            stream_seq: seq,
            pending,
            ..
        }) = m.reply.as_deref().and_then(AckInfo::parse)
        else {
            return Ok(Delivery::Control);
        };
        let value = (!is_delete(&m)).then_some(m.data);
        Ok(Delivery::Entry(
            KvEntry {
                key: key.to_owned(),
                seq,
                value,
            },
            pending,
        ))
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        delete_consumer(&self.conn, &self.bucket, &self.name);
    }
}

/// Best effort: the server removes an ephemeral consumer anyway once its
/// inbox has had no interest for a while.
fn delete_consumer(conn: &nats::Connection, bucket: &str, name: &str) {
    if !name.is_empty() {
        let _ = conn.publish(
            &format!("$JS.API.CONSUMER.DELETE.{}.{name}", stream_name(bucket)),
            b"",
        );
    }
}

/// The last value (or deletion) of every key of `bucket` whose subject
/// matches `filter` (a subject such as `$KV.fleet-status.*.info`).
pub fn read_last(
    conn: &nats::Connection,
    bucket: &str,
    filter: &str,
) -> Result<Vec<KvEntry>, CtlError> {
    let c = Consumer::create(
        conn,
        bucket,
        filter,
        serde_json::json!({"deliver_policy": "last_per_subject"}),
    )?;
    let mut out: HashMap<String, KvEntry> = HashMap::new();
    if c.pending == 0 {
        return Ok(Vec::new());
    }
    let what = || format!("reading {bucket} ({filter})");
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut heard = Instant::now();
    loop {
        if Instant::now() >= deadline {
            return Err(CtlError::Nats {
                what: what(),
                detail: format!("not complete within {} s", READ_TIMEOUT.as_secs()),
            });
        }
        match c.next(READ_HEARTBEAT).map_err(CtlError::nats(what()))? {
            Delivery::Entry(entry, pending) => {
                heard = Instant::now();
                out.insert(entry.key.clone(), entry);
                if pending == 0 {
                    break;
                }
            }
            Delivery::Control => heard = Instant::now(),
            Delivery::Nothing if heard.elapsed() > READ_SILENCE => {
                return Err(CtlError::Nats {
                    what: what(),
                    detail: format!("the server sent nothing for {} s", READ_SILENCE.as_secs()),
                })
            }
            Delivery::Nothing => {}
        }
    }
    let mut v: Vec<KvEntry> = out.into_values().collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(v)
}

/// One compare-and-set write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasWrite {
    pub key: String,
    pub value: Vec<u8>,
    /// The key's last stream sequence as read (0: never written).
    pub expected_seq: u64,
}

/// What became of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    Written {
        seq: u64,
    },
    /// The key moved since it was read: another writer won.
    Conflict(String),
    Failed(String),
}

fn outcome_of(data: &[u8]) -> CasOutcome {
    match serde_json::from_slice::<PubAckResponse>(data) {
        Ok(PubAckResponse { error: Some(e), .. }) if e.err_code == ERR_WRONG_LAST_SEQUENCE => {
            CasOutcome::Conflict(e.description)
        }
        Ok(PubAckResponse { error: Some(e), .. }) => {
            CasOutcome::Failed(format!("{} (code {})", e.description, e.best_code()))
        }
        Ok(PubAckResponse { seq: Some(seq), .. }) => CasOutcome::Written { seq },
        _ => CasOutcome::Failed(format!(
            "unexpected JetStream answer: {}",
            String::from_utf8_lossy(data)
                .chars()
                .take(200)
                .collect::<String>()
        )),
    }
}

/// Writes every `writes[i]` to `bucket`, each only if its key is still at
/// its expected sequence; the outcome of each, in the same order.
pub fn cas_put_all(
    conn: &nats::Connection,
    bucket: &str,
    writes: &[CasWrite],
) -> Result<Vec<CasOutcome>, CtlError> {
    put_pipelined(conn, bucket, writes, Check::Sequence)
}

/// Writes every `writes[i]` to `bucket` whatever its sequence
/// (`expected_seq` is not checked), pipelined as [`cas_put_all`].
pub fn put_all(
    conn: &nats::Connection,
    bucket: &str,
    writes: &[CasWrite],
) -> Result<Vec<CasOutcome>, CtlError> {
    put_pipelined(conn, bucket, writes, Check::None)
}

/// Deletes every `keys[i]` of `bucket` (a `KV-Operation: DEL` marker, as
/// the KV helpers write), pipelined as [`cas_put_all`].
pub fn delete_all(
    conn: &nats::Connection,
    bucket: &str,
    keys: &[String],
) -> Result<Vec<CasOutcome>, CtlError> {
    let writes: Vec<CasWrite> = keys
        .iter()
        .map(|k| CasWrite {
            key: k.clone(),
            value: Vec::new(),
            expected_seq: 0,
        })
        .collect();
    put_pipelined(conn, bucket, &writes, Check::Delete)
}

/// Purges every message of each of `keys` from `bucket`'s stream; the
/// keys purged, or the first refusal.
pub fn purge_keys(
    conn: &nats::Connection,
    bucket: &str,
    keys: &[String],
) -> Result<usize, CtlError> {
    let what = || format!("purging {} keys of {bucket}", keys.len());
    let subject = format!("$JS.API.STREAM.PURGE.{}", stream_name(bucket));
    let answers = pipelined(conn, keys.len(), what, |i, reply| {
        let body = serde_json::json!({ "filter": kv_subject(bucket, &keys[i]) });
        conn.publish_with_reply_or_headers(&subject, Some(reply), None, body.to_string())
    })?;
    let mut purged = 0;
    for answer in answers {
        let Some(m) = answer else {
            return Err(CtlError::Nats {
                what: what(),
                detail: format!(
                    "{purged} answered within {} s of the last answer",
                    ACK_TIMEOUT.as_secs()
                ),
            });
        };
        let v: serde_json::Value = serde_json::from_slice(&m.data).unwrap_or_default();
        if status_of(&m) == Some("503") || v["success"] != true {
            return Err(CtlError::Nats {
                what: what(),
                detail: format!(
                    "refused: {}",
                    v["error"]["description"]
                        .as_str()
                        .unwrap_or("no JetStream stream")
                ),
            });
        }
        purged += 1;
    }
    Ok(purged)
}

/// Sends `n` requests on one inbox, `send(i, reply)` the `i`-th, with at
/// most [`MAX_IN_FLIGHT`] unanswered at a time; the answer to each, in the
/// same order. A request still unanswered [`ACK_TIMEOUT`] after the last
/// send or answer is `None`.
fn pipelined(
    conn: &nats::Connection,
    n: usize,
    what: impl Fn() -> String,
    mut send: impl FnMut(usize, &str) -> std::io::Result<()>,
) -> Result<Vec<Option<nats::Message>>, CtlError> {
    let mut answers: Vec<Option<nats::Message>> = vec![None; n];
    if n == 0 {
        return Ok(answers);
    }
    let inbox = conn.new_inbox();
    let sub = conn
        .subscribe(&format!("{inbox}.*"))
        .map_err(CtlError::nats(what()))?;
    let (mut sent, mut answered) = (0usize, 0usize);
    let mut last = Instant::now();
    while answered < n {
        while sent < n && sent - answered < MAX_IN_FLIGHT {
            send(sent, &format!("{inbox}.{sent}")).map_err(CtlError::nats(what()))?;
            sent += 1;
            last = Instant::now();
        }
        match sub.next_timeout(Duration::from_millis(200)) {
            Ok(m) => {
                let slot = m
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|t| t.parse::<usize>().ok())
                    .and_then(|i| answers.get_mut(i));
                if let Some(slot @ None) = slot {
                    *slot = Some(m);
                    answered += 1;
                    last = Instant::now();
                }
            }
            Err(_) if last.elapsed() > ACK_TIMEOUT => break,
            Err(_) => {}
        }
    }
    Ok(answers)
}

/// What [`put_pipelined`] sends beside each value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing: the write happens whatever the key's sequence.
    None,
    /// `Nats-Expected-Last-Subject-Sequence`: compare-and-set.
    Sequence,
    /// A deletion marker (the value is empty).
    Delete,
}

fn put_pipelined(
    conn: &nats::Connection,
    bucket: &str,
    writes: &[CasWrite],
    check: Check,
) -> Result<Vec<CasOutcome>, CtlError> {
    let what = || format!("writing {} keys of {bucket}", writes.len());
    let answers = pipelined(conn, writes.len(), what, |i, reply| {
        let w = &writes[i];
        let mut headers = nats::header::HeaderMap::new();
        match check {
            Check::None => {}
            Check::Sequence => {
                headers.insert(
                    HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE,
                    w.expected_seq.to_string(),
                );
            }
            Check::Delete => {
                headers.insert(HEADER_KV_OPERATION, KV_OPERATION_DELETE.to_owned());
            }
        }
        conn.publish_with_reply_or_headers(
            &kv_subject(bucket, &w.key),
            Some(reply),
            Some(&headers),
            &w.value,
        )
    })?;
    Ok(answers
        .into_iter()
        .map(|answer| match answer {
            Some(m) if status_of(&m) == Some("503") => CasOutcome::Failed(format!(
                "no JetStream stream for {bucket} (create the buckets with fleetctl buckets create)"
            )),
            Some(m) => outcome_of(&m.data),
            None => CasOutcome::Failed(format!(
                "no JetStream acknowledgement within {} s; the write may or may not have happened: read the key back",
                ACK_TIMEOUT.as_secs()
            )),
        })
        .collect())
}

/// A consumer delivering every change of `filter` from now on
/// (`from_seq`: from that stream sequence instead), for `watch`.
pub struct Follow {
    consumer: Consumer,
    heard: Instant,
    /// Messages the server still had for this consumer after the last
    /// entry (at creation: all it will replay).
    pending: u64,
}

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Follow({})", self.consumer.name)
    }
}

/// What [`Follow::next`] saw.
#[derive(Debug)]
pub enum Followed {
    Entry(KvEntry),
    Quiet,
    /// No message and no heartbeat for a while: make a new consumer.
    Lost,
}

pub fn follow(
    conn: &nats::Connection,
    bucket: &str,
    filter: &str,
    from_seq: Option<u64>,
) -> Result<Follow, CtlError> {
    let deliver = match from_seq {
        Some(seq) => {
            serde_json::json!({"deliver_policy": "by_start_sequence", "opt_start_seq": seq})
        }
        None => serde_json::json!({"deliver_policy": "new"}),
    };
    let consumer = Consumer::create(conn, bucket, filter, deliver)?;
    Ok(Follow {
        pending: consumer.pending,
        consumer,
        heard: Instant::now(),
    })
}

/// A consumer delivering the last value of every key of `filter`, then
/// every change from there on: one consumer keeps a whole view (the
/// metrics exporter), replaying each key once instead of a read per
/// period. [`Follow::caught_up`] says when the replay is done.
pub fn follow_from_last(
    conn: &nats::Connection,
    bucket: &str,
    filter: &str,
) -> Result<Follow, CtlError> {
    let consumer = Consumer::create(
        conn,
        bucket,
        filter,
        serde_json::json!({"deliver_policy": "last_per_subject"}),
    )?;
    Ok(Follow {
        pending: consumer.pending,
        consumer,
        heard: Instant::now(),
    })
}

impl Follow {
    /// Every message the consumer had when it was made has been delivered.
    pub fn caught_up(&self) -> bool {
        self.pending == 0
    }

    /// When the server last sent anything (an entry or a heartbeat).
    pub fn heard(&self) -> Instant {
        self.heard
    }

    pub fn next(&mut self, wait: Duration) -> Followed {
        match self.consumer.next(wait) {
            Ok(Delivery::Entry(entry, pending)) => {
                self.heard = Instant::now();
                self.pending = pending;
                Followed::Entry(entry)
            }
            Ok(Delivery::Control) => {
                self.heard = Instant::now();
                Followed::Quiet
            }
            Ok(Delivery::Nothing) if self.heard.elapsed() > READ_SILENCE => Followed::Lost,
            Ok(Delivery::Nothing) => Followed::Quiet,
            Err(_) => Followed::Lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_subjects_and_write_answers_parse() {
        assert_eq!(
            outcome_of(br#"{"stream":"KV_fleet-control","seq":12}"#),
            CasOutcome::Written { seq: 12 }
        );
        assert_eq!(
            outcome_of(br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}"#),
            CasOutcome::Conflict("wrong last sequence: 5".into())
        );
        assert_eq!(
            outcome_of(br#"{"error":{"code":503,"description":"no leader"}}"#),
            CasOutcome::Failed("no leader (code 503)".into())
        );
    }

    /// The compare-and-set refusal a losing writer meets, on both servers.
    #[test]
    fn a_write_over_a_moved_key_is_a_conflict_and_nothing_is_written() {
        for v in fleet_harness::NatsVersion::all() {
            let server = fleet_harness::NatsServer::start_fleet(v, &[]);
            let conn = server.admin();
            let key = |i: usize| format!("dev{i}.agent-upgrade-intent");
            let writes: Vec<CasWrite> = (0..3000)
                .map(|i| CasWrite {
                    key: key(i),
                    value: format!("first {i}").into_bytes(),
                    expected_seq: 0,
                })
                .collect();
            let first = cas_put_all(&conn, "fleet-control", &writes).expect("first writes");
            assert!(
                first
                    .iter()
                    .all(|o| matches!(o, CasOutcome::Written { .. })),
                "{v:?}: {:?}",
                first
                    .iter()
                    .find(|o| !matches!(o, CasOutcome::Written { .. }))
            );
            let CasOutcome::Written { seq } = first[7] else {
                unreachable!()
            };
            let again = cas_put_all(
                &conn,
                "fleet-control",
                &[
                    // Created meanwhile by another writer.
                    CasWrite {
                        key: key(7),
                        value: b"late create".to_vec(),
                        expected_seq: 0,
                    },
                    // Read before the other writer's update.
                    CasWrite {
                        key: key(7),
                        value: b"update".to_vec(),
                        expected_seq: seq,
                    },
                    CasWrite {
                        key: key(7),
                        value: b"stale update".to_vec(),
                        expected_seq: seq,
                    },
                ],
            )
            .expect("second writes");
            assert!(
                matches!(&again[0], CasOutcome::Conflict(d) if d.contains("wrong last sequence")),
                "{v:?}: {again:?}"
            );
            assert!(
                matches!(again[1], CasOutcome::Written { .. }),
                "{v:?}: {again:?}"
            );
            assert!(
                matches!(&again[2], CasOutcome::Conflict(_)),
                "{v:?}: {again:?}"
            );
            let last = read_last(
                &conn,
                "fleet-control",
                &format!("$KV.fleet-control.{}", key(7)),
            )
            .expect("read");
            assert_eq!(last.len(), 1);
            assert_eq!(last[0].value.as_deref(), Some(b"update".as_slice()));
            let all = read_last(
                &conn,
                "fleet-control",
                "$KV.fleet-control.*.agent-upgrade-intent",
            )
            .expect("read all");
            assert_eq!(all.len(), 3000, "{v:?}");
        }
    }
}
