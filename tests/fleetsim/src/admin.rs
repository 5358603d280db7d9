//! The operator's side of a fan-out: one desired change per device,
//! written by an admin connection as fleetctl writes them (every put
//! pipelined, at most [`MAX_IN_FLIGHT`] unanswered, each acknowledged by
//! JetStream; generation 2 by compare-and-set).

use std::time::{Duration, Instant};

use fleet_common::jetstream::{PubAckResponse, HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE};
use fleet_common::subjects::{
    desired_doc_key, kv_subject, BUCKET_DESIRED, BUCKET_REGISTRY, BUCKET_WORKLOADS,
};
use fleet_common::validate::DeviceId;

use crate::Generation;

/// Unanswered puts at a time (fleetctl's `MAX_IN_FLIGHT`).
pub const MAX_IN_FLIGHT: usize = 1024;
/// No ack for this long after the last publish: the write failed.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// The workload every device is given; `marker` makes each change new.
fn spec(marker: &str) -> serde_json::Value {
    serde_json::json!({
        "image": "localhost/fleet-bench/app:2",
        "command": ["sleep", marker],
    })
}

/// One device's write: subject, value and (generation 2) expected last sequence.
fn write_for(
    generation: Generation,
    device: &str,
    marker: &str,
    expected: u64,
) -> Result<(String, Vec<u8>, Option<u64>), String> {
    let id = DeviceId::parse(device).map_err(|e| e.to_string())?;
    Ok(match generation {
        Generation::One => (
            kv_subject(BUCKET_DESIRED, &format!("{id}.web")),
            spec(marker).to_string().into_bytes(),
            None,
        ),
        Generation::Two => (
            kv_subject(BUCKET_WORKLOADS, &desired_doc_key(&id)),
            serde_json::json!({"workloads": {"web": spec(marker)}})
                .to_string()
                .into_bytes(),
            Some(expected),
        ),
    })
}

/// The outcome of [`put_desired_all`].
#[derive(Debug, Clone)]
pub struct Written {
    /// Stream sequence of each device's new value (same order as `devices`).
    pub seqs: Vec<u64>,
    /// When each device's put was sent (same order as `devices`).
    pub sent: Vec<Instant>,
    /// When the first put was sent and when the last ack arrived.
    pub started: Instant,
    pub acked: Instant,
}

/// Writes one desired change per device (`expected[i]`: the sequence the
/// device's generation-2 document has now, 0 for none).
pub fn put_desired_all(
    conn: &nats::Connection,
    generation: Generation,
    devices: &[String],
    expected: &[u64],
    marker: &str,
) -> Result<Written, String> {
    let writes: Vec<_> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| write_for(generation, d, marker, expected.get(i).copied().unwrap_or(0)))
        .collect::<Result<_, _>>()?;
    put_all(conn, &writes)
}

/// Writes each device an `approved` record with its own key
/// ([`crate::device_key`]) in `fleet-registry`, as `fleetctl device
/// preauthorize` does: [`crate::SimAuth::Enrollment`] devices then connect
/// as themselves at once.
pub fn preauthorize_all(conn: &nats::Connection, devices: &[String]) -> Result<Written, String> {
    use fleet_common::contracts::{DeviceRecord, RecordState};
    let now = fleet_common::time::Timestamp::now();
    let writes: Vec<_> = devices
        .iter()
        .map(|d| {
            let id = DeviceId::parse(d).map_err(|e| e.to_string())?;
            let record = DeviceRecord {
                device_id: id.clone(),
                state: RecordState::Approved,
                public_key: Some(crate::device_key(d).public_key()),
                facts: Default::default(),
                requested_at: None,
                decided_at: Some(now),
                decided_by: Some("preauthorized".to_owned()),
                conflict: None,
            };
            let value = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
            Ok((kv_subject(BUCKET_REGISTRY, id.as_str()), value, None))
        })
        .collect::<Result<_, String>>()?;
    put_all(conn, &writes)
}

/// Puts every `(subject, value, expected last sequence)`, pipelined.
fn put_all(
    conn: &nats::Connection,
    writes: &[(String, Vec<u8>, Option<u64>)],
) -> Result<Written, String> {
    let inbox = conn.new_inbox();
    let sub = conn
        .subscribe(&format!("{inbox}.*"))
        .map_err(|e| format!("subscribing to the ack inbox: {e}"))?;
    let mut seqs: Vec<Option<u64>> = vec![None; writes.len()];
    let (mut sent, mut answered) = (0usize, 0usize);
    let started = Instant::now();
    let mut sent_at = vec![started; writes.len()];
    let mut last_send = started;
    while answered < writes.len() {
        while sent < writes.len() && sent - answered < MAX_IN_FLIGHT {
            let (subject, value, cas) = &writes[sent];
            let headers = cas.map(|seq| {
                let mut h = nats::header::HeaderMap::new();
                h.insert(HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE, seq.to_string());
                h
            });
            conn.publish_with_reply_or_headers(
                subject,
                Some(&format!("{inbox}.{sent}")),
                headers.as_ref(),
                value,
            )
            .map_err(|e| format!("publishing {subject}: {e}"))?;
            last_send = Instant::now();
            sent_at[sent] = last_send;
            sent += 1;
        }
        match sub.next_timeout(Duration::from_millis(200)) {
            Ok(m) => {
                let Some(i) = m
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|t| t.parse::<usize>().ok())
                else {
                    continue;
                };
                let ack: PubAckResponse = serde_json::from_slice(&m.data).map_err(|e| {
                    format!(
                        "ack of {}: {e}: {}",
                        writes[i].0,
                        String::from_utf8_lossy(&m.data)
                    )
                })?;
                match (ack.error, ack.seq) {
                    (None, Some(seq)) => {
                        if seqs[i].replace(seq).is_none() {
                            answered += 1;
                        }
                    }
                    (e, _) => return Err(format!("put of {} refused: {e:?}", writes[i].0)),
                }
            }
            Err(_) if last_send.elapsed() > ACK_TIMEOUT => {
                return Err(format!(
                    "{} of {} puts unacknowledged after {} s",
                    writes.len() - answered,
                    writes.len(),
                    ACK_TIMEOUT.as_secs()
                ))
            }
            Err(_) => {}
        }
    }
    Ok(Written {
        seqs: seqs.into_iter().map(|s| s.unwrap_or(0)).collect(),
        sent: sent_at,
        started,
        acked: Instant::now(),
    })
}
