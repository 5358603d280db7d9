//! The JetStream API as it appears on the wire, for the thin JetStream layers
//! of the agent (device-scoped, `docs/design/protocol.md`)
//! and fleetctl (admin, pipelined): response bodies, the `$JS.ACK` reply
//! subject of a push delivery, and the headers both read. No connection
//! here: callers publish and subscribe with the `nats` crate.

use serde::{Deserialize, Serialize};

/// Header JetStream sets on KV delete and purge markers (`DEL`, `PURGE`).
pub const HEADER_KV_OPERATION: &str = "KV-Operation";
/// The [`HEADER_KV_OPERATION`] value of a key's deletion (its history kept).
pub const KV_OPERATION_DELETE: &str = "DEL";
/// Header carrying a status line (`100` heartbeat or flow control, `503`).
pub const HEADER_STATUS: &str = "Status";
/// Header of a compare-and-set write: the subject's last sequence must be
/// this (0: the key must never have been written).
pub const HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
/// JetStream's error code for a failed expected-last-sequence check.
pub const ERR_WRONG_LAST_SEQUENCE: u64 = 10071;
/// The description of a write refused by a full `discard: new` stream
/// (nats-server 2.9 and 2.14 alike).
pub const MAX_MSGS_EXCEEDED: &str = "maximum messages exceeded";

/// Headers of a republished key change and of a Direct Get answer: the
/// stream sequence of this value, the previous sequence of the same subject
/// (republish only; 0 when the key had none) and the key's subject.
pub const HEADER_SEQUENCE: &str = "Nats-Sequence";
pub const HEADER_LAST_SEQUENCE: &str = "Nats-Last-Sequence";
pub const HEADER_SUBJECT: &str = "Nats-Subject";

/// Whether a `KV-Operation` header value marks a deleted key.
pub fn is_kv_delete(operation: Option<&str>) -> bool {
    matches!(operation, Some(KV_OPERATION_DELETE) | Some("PURGE"))
}

/// An `error` object of any JetStream API response.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ApiError {
    #[serde(default)]
    pub code: u64,
    #[serde(default)]
    pub err_code: u64,
    #[serde(default)]
    pub description: String,
}

impl ApiError {
    /// The most specific code: JetStream's `err_code`, else the HTTP-like `code`.
    pub fn best_code(&self) -> u64 {
        if self.err_code != 0 {
            self.err_code
        } else {
            self.code
        }
    }
}

/// The answer to `$JS.API.CONSUMER.CREATE...`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConsumerCreateResponse {
    #[serde(default)]
    pub error: Option<ApiError>,
    #[serde(default)]
    pub name: Option<String>,
    /// Messages the new consumer will deliver; 0 means an empty snapshot.
    #[serde(default)]
    pub num_pending: Option<u64>,
}

/// The answer to a publish into a stream (a KV put).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PubAckResponse {
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub error: Option<ApiError>,
}

/// The body of `$JS.API.STREAM.MSG.GET.<stream>`
/// ([`stream_msg_get_subject`](crate::subjects::stream_msg_get_subject))
/// asking for the last message of one subject: one key's current version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastBySubject<'a> {
    pub last_by_subj: &'a str,
}

/// JetStream's `err_code` when no message matches a `STREAM.MSG.GET`.
pub const ERR_NO_MESSAGE_FOUND: u64 = 10037;

/// The answer to `$JS.API.STREAM.MSG.GET.<stream>`: the stored message
/// (headers and body in standard base64), or an error.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MsgGetResponse {
    #[serde(default)]
    pub message: Option<StoredMessage>,
    #[serde(default)]
    pub error: Option<ApiError>,
}

/// A message as `STREAM.MSG.GET` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StoredMessage {
    pub subject: String,
    pub seq: u64,
    /// The header block (`NATS/1.0\r\nName: value\r\n...`), base64.
    #[serde(default)]
    pub hdrs: Option<String>,
    /// The body, base64; absent when empty.
    #[serde(default)]
    pub data: Option<String>,
}

/// One key's last version as a `STREAM.MSG.GET` answer gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastVersion {
    /// The key was never written (or its history is gone).
    Absent,
    /// Its last version: a value, or a delete marker
    /// ([`KeyVersion::deleted`], with an empty value).
    Present { version: KeyVersion, value: Vec<u8> },
}

/// Why a `STREAM.MSG.GET` answer gives no version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsgGetFailure {
    /// The server answered with an error other than "no message found"
    /// (no such stream, no leader yet, ...).
    Api(ApiError),
    /// The answer is not a `STREAM.MSG.GET` answer.
    Malformed(String),
}

impl std::fmt::Display for MsgGetFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api(e) => write!(f, "{} (code {})", e.description, e.best_code()),
            Self::Malformed(e) => f.write_str(e),
        }
    }
}

impl MsgGetResponse {
    /// The key's last version from the raw answer `body`.
    pub fn last_version(body: &[u8]) -> Result<LastVersion, MsgGetFailure> {
        let r: MsgGetResponse = serde_json::from_slice(body)
            .map_err(|e| MsgGetFailure::Malformed(format!("not a STREAM.MSG.GET answer: {e}")))?;
        match (r.error, r.message) {
            (Some(e), _) if e.err_code == ERR_NO_MESSAGE_FOUND => Ok(LastVersion::Absent),
            (Some(e), _) => Err(MsgGetFailure::Api(e)),
            (None, None) => Err(MsgGetFailure::Malformed(
                "a STREAM.MSG.GET answer with neither message nor error".to_owned(),
            )),
            (None, Some(m)) => {
                let decode = |field: &str, text: Option<&str>| -> Result<Vec<u8>, MsgGetFailure> {
                    match text {
                        None => Ok(Vec::new()),
                        Some(t) => crate::b64::decode_std(t).ok_or_else(|| {
                            MsgGetFailure::Malformed(format!("its {field} are not base64"))
                        }),
                    }
                };
                let hdrs = decode("headers", m.hdrs.as_deref())?;
                let value = decode("data", m.data.as_deref())?;
                let operation = header_block_value(&hdrs, HEADER_KV_OPERATION);
                Ok(LastVersion::Present {
                    version: KeyVersion {
                        subject: m.subject,
                        seq: m.seq,
                        last_seq: None,
                        deleted: is_kv_delete(operation.as_deref()),
                    },
                    value,
                })
            }
        }
    }
}

/// The value of header `name` (case-insensitive) in a NATS header block
/// (`NATS/1.0` status line, then `Name: value` lines).
pub fn header_block_value(block: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(block).ok()?;
    text.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// Sequence numbers and pending count of a push delivery, read from its
/// `$JS.ACK` reply subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckInfo {
    pub stream_seq: u64,
    pub consumer_seq: u64,
    /// Messages still to come; 0 on the last message of a snapshot.
    pub pending: u64,
}

impl AckInfo {
    /// Parses both forms of the ack subject:
    /// `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>`
    /// and the newer
    /// `$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>[.<token>]`.
    pub fn parse(reply: &str) -> Option<AckInfo> {
        let t: Vec<&str> = reply.split('.').collect();
        if t.len() < 9 || t[0] != "$JS" || t[1] != "ACK" {
            return None;
        }
        let (s, c, p) = match t.len() {
            9 => (5, 6, 8),
            11 | 12 => (7, 8, 10),
            _ => return None,
        };
        Some(AckInfo {
            stream_seq: t[s].parse().ok()?,
            consumer_seq: t[c].parse().ok()?,
            pending: t[p].parse().ok()?,
        })
    }
}

/// One version of a key as a republished message or a Direct Get answer
/// describes it in its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyVersion {
    /// The subject the value was stored at (`$KV.<bucket>.<key>`).
    pub subject: String,
    /// Its stream sequence.
    pub seq: u64,
    /// The previous sequence of the same subject (republish only).
    pub last_seq: Option<u64>,
    /// A delete or purge marker: the key is absent.
    pub deleted: bool,
}

impl KeyVersion {
    /// Reads the version from a message's headers (`header` looks one up by
    /// name). A missing or malformed sequence or subject is an error naming
    /// the header.
    pub fn from_headers<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Result<Self, String> {
        let number = |name: &str| -> Result<Option<u64>, String> {
            header(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("header {name} is not a sequence number: {v:?}"))
                })
                .transpose()
        };
        let seq = number(HEADER_SEQUENCE)?.ok_or_else(|| format!("no {HEADER_SEQUENCE} header"))?;
        let subject = header(HEADER_SUBJECT)
            .ok_or_else(|| format!("no {HEADER_SUBJECT} header"))?
            .to_owned();
        Ok(KeyVersion {
            subject,
            seq,
            last_seq: number(HEADER_LAST_SEQUENCE)?,
            deleted: is_kv_delete(header(HEADER_KV_OPERATION)),
        })
    }
}

/// What to do with a version of a key, given the sequence held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Newer than what is held, and nothing was missed in between.
    Apply,
    /// Newer, but the republish chain shows versions that never arrived
    /// (republish is at-most-once): apply it and re-read to be sure.
    ApplyAfterGap { missed_after: u64 },
    /// Not newer than what is held (a duplicate, or a lagging replica).
    Stale,
}

/// The sequence of the value of one key a device holds, and the rule for
/// what replaces it: only a newer sequence (`docs/design/protocol.md`
/// "Generation 2: reads without a consumer"). Shared by the agent and the fleet
/// simulator so both decide alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyTracker {
    /// 0 before anything was read, and for a key never written.
    held: u64,
}

impl KeyTracker {
    pub fn held(&self) -> u64 {
        self.held
    }

    /// A republished change: newer ones are taken; the previous-sequence
    /// header tells whether one was missed.
    pub fn on_change(&mut self, v: &KeyVersion) -> Verdict {
        if v.seq <= self.held {
            return Verdict::Stale;
        }
        let missed = matches!(v.last_seq, Some(last) if last > self.held);
        let held = self.held;
        self.held = v.seq;
        if missed {
            Verdict::ApplyAfterGap { missed_after: held }
        } else {
            Verdict::Apply
        }
    }

    /// A read (Direct Get): `seq` 0 is a key never written. Returns whether
    /// the value is newer than the one held (a read answered by a lagging
    /// replica can be older than a change already applied).
    pub fn on_read(&mut self, seq: u64) -> bool {
        if seq > self.held || (seq == 0 && self.held == 0) {
            self.held = seq;
            true
        } else {
            false
        }
    }
}

/// A `Duration` as the nanoseconds JetStream configs take.
pub fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_msg_get_answer_gives_the_last_version_a_delete_or_absence() {
        let value = crate::b64::encode_std(br#"{"a":1}"#);
        let body = format!(
            r#"{{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{{"subject":"$KV.b.k","seq":7,"data":"{value}","time":"2026-12-06T20:00:00Z"}}}}"#
        );
        assert_eq!(
            MsgGetResponse::last_version(body.as_bytes()),
            Ok(LastVersion::Present {
                version: KeyVersion {
                    subject: "$KV.b.k".to_owned(),
                    seq: 7,
                    last_seq: None,
                    deleted: false
                },
                value: br#"{"a":1}"#.to_vec()
            })
        );
        for op in ["DEL", "PURGE"] {
            let hdrs = crate::b64::encode_std(
                format!("NATS/1.0\r\nkv-operation: {op}\r\n\r\n").as_bytes(),
            );
            let body = format!(r#"{{"message":{{"subject":"$KV.b.k","seq":9,"hdrs":"{hdrs}"}}}}"#);
            match MsgGetResponse::last_version(body.as_bytes()) {
                Ok(LastVersion::Present { version, value }) => {
                    assert!(version.deleted, "{op}");
                    assert_eq!(version.seq, 9);
                    assert!(value.is_empty());
                }
                other => panic!("{op}: {other:?}"),
            }
        }
        assert_eq!(
            MsgGetResponse::last_version(
                br#"{"error":{"code":404,"err_code":10037,"description":"no message found"}}"#
            ),
            Ok(LastVersion::Absent)
        );
        // No such stream, or no leader: not an absent key.
        assert!(matches!(
            MsgGetResponse::last_version(
                br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#
            ),
            Err(MsgGetFailure::Api(e)) if e.err_code == 10059
        ));
        assert!(matches!(
            MsgGetResponse::last_version(br#"{"message":{"subject":"s","seq":1,"data":"%%"}}"#),
            Err(MsgGetFailure::Malformed(_))
        ));
        assert!(matches!(
            MsgGetResponse::last_version(b"{}"),
            Err(MsgGetFailure::Malformed(_))
        ));
    }

    #[test]
    fn parses_both_ack_subject_forms() {
        assert_eq!(
            AckInfo::parse("$JS.ACK.KV_fleet-desired.c1.1.42.7.1700000000000000000.3"),
            Some(AckInfo {
                stream_seq: 42,
                consumer_seq: 7,
                pending: 3
            })
        );
        assert_eq!(
            AckInfo::parse(
                "$JS.ACK.hub.ACCHASH.KV_fleet-desired.c1.1.42.7.1700000000000000000.0.rnd"
            ),
            Some(AckInfo {
                stream_seq: 42,
                consumer_seq: 7,
                pending: 0
            })
        );
        assert_eq!(AckInfo::parse("$JS.ACK.KV_x.c.1.2.3.4"), None);
        assert_eq!(AckInfo::parse("$JS.NAK.KV_x.c.1.2.3.4.5"), None);
        assert_eq!(AckInfo::parse("$JS.ACK.KV_x.c.1.2.x.4.5"), None);
        assert_eq!(AckInfo::parse("_INBOX.dev1.a.1"), None);
    }

    #[test]
    fn a_key_takes_only_newer_versions_and_names_a_gap() {
        let v = |seq, last| KeyVersion {
            subject: "$KV.fleet-workloads.dev1.desired".into(),
            seq,
            last_seq: Some(last),
            deleted: false,
        };
        let mut t = KeyTracker::default();
        assert!(t.on_read(0), "a key never written is a complete read");
        assert_eq!(t.on_change(&v(5, 0)), Verdict::Apply);
        assert_eq!(t.on_change(&v(5, 0)), Verdict::Stale);
        assert_eq!(t.on_change(&v(4, 0)), Verdict::Stale);
        assert_eq!(
            t.on_change(&v(9, 7)),
            Verdict::ApplyAfterGap { missed_after: 5 }
        );
        assert!(!t.on_read(7), "a lagging replica's answer is older");
        assert!(!t.on_read(9));
        assert!(t.on_read(12));
        assert_eq!(t.held(), 12);
        let headers = [
            ("Nats-Sequence", "12"),
            ("Nats-Last-Sequence", "9"),
            (
                "Nats-Subject",
                "$KV.fleet-control.dev1.agent-upgrade-intent",
            ),
            ("KV-Operation", "DEL"),
        ];
        let get = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(
            KeyVersion::from_headers(get),
            Ok(KeyVersion {
                subject: "$KV.fleet-control.dev1.agent-upgrade-intent".into(),
                seq: 12,
                last_seq: Some(9),
                deleted: true
            })
        );
        assert_eq!(
            KeyVersion::from_headers(|n| (n == "Nats-Sequence").then_some("x")),
            Err("header Nats-Sequence is not a sequence number: \"x\"".into())
        );
        assert_eq!(
            KeyVersion::from_headers(|_| None),
            Err("no Nats-Sequence header".into())
        );
    }

    #[test]
    fn parses_responses() {
        let ack: PubAckResponse =
            serde_json::from_str(r#"{"stream":"KV_fleet-status","seq":9}"#).expect("ack");
        assert_eq!(
            (ack.stream.as_deref(), ack.seq, ack.error),
            (Some("KV_fleet-status"), Some(9), None)
        );
        let refused: PubAckResponse = serde_json::from_str(
            r#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}"#,
        )
        .expect("error");
        assert_eq!(
            refused.error.map(|e| e.best_code()),
            Some(ERR_WRONG_LAST_SEQUENCE)
        );
        let created: ConsumerCreateResponse = serde_json::from_str(
            r#"{"type":"io.nats.jetstream.api.v1.consumer_create_response","name":"c1","num_pending":0,"config":{}}"#,
        )
        .expect("create");
        assert_eq!(
            (created.name.as_deref(), created.num_pending),
            (Some("c1"), Some(0))
        );
        assert!(is_kv_delete(Some("PURGE")) && is_kv_delete(Some("DEL")) && !is_kv_delete(None));
        assert_eq!(
            ApiError {
                code: 503,
                err_code: 0,
                description: String::new()
            }
            .best_code(),
            503
        );
    }
}
