//! The device registry (`fleet-registry`, owned by `FLEET`), as the callout
//! and the enrollment service reach it from `AUTH`: a read of one record
//! from the registry stream's leader, and compare-and-set writes, both
//! through the service imports of the callout layout
//! (`common/src/nats_config.rs`).
//!
//! Reads go to the leader, not to any replica as a Direct Get would: a
//! replica cut off from the leader keeps answering Direct Gets from what it
//! last held, so a device revoked meanwhile would be admitted again through
//! it. The leader answers with every acknowledged write; with no leader
//! reachable the read times out and the device is refused, and connects
//! again. A server config from before leader reads has no import of them:
//! then (no responders) the read falls back to Direct Get and says, once,
//! to regenerate the config (`docs/design/enrollment.md`).
//!
//! [`Registry`] is the seam the decisions are tested through; [`NatsRegistry`]
//! is the real one.

use std::fmt;
use std::time::Duration;

use fleet_common::contracts::{DeviceRecord, LobbyTicket};
use fleet_common::jetstream::{
    KeyVersion, LastBySubject, LastVersion, MsgGetFailure, MsgGetResponse, PubAckResponse,
    ERR_WRONG_LAST_SEQUENCE, HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE, HEADER_STATUS,
    MAX_MSGS_EXCEEDED,
};
use fleet_common::limits::{REGISTRY_READ_TIMEOUT, REGISTRY_WRITE_TIMEOUT};
use fleet_common::subjects::{
    auth_registry_read_subject, direct_get_subject, kv_subject, BUCKET_LOBBY, BUCKET_REGISTRY,
};
use fleet_common::time::Timestamp;
use fleet_common::validate::DeviceId;

/// A record and the revision (stream sequence) it was read at; 0: absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub record: Option<DeviceRecord>,
    pub revision: u64,
}

/// Why the registry could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// No answer within the bound, or no connection.
    Unavailable(String),
    /// An answer that is not a record.
    Bad(String),
    /// A compare-and-set write lost: the record moved since it was read.
    Moved,
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(e) => write!(
                f,
                "the device registry ({BUCKET_REGISTRY}) did not answer: {e}; the device is refused and connects again"
            ),
            Self::Bad(e) => write!(f, "the device registry's answer is not a record: {e}"),
            Self::Moved => f.write_str("the registry record changed while it was being written"),
        }
    }
}

impl std::error::Error for RegistryError {}

/// The lobby's answer to a device about to be recorded pending
/// (`fleet-lobby`, [`BUCKET_LOBBY`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    /// The device holds a place: taken now, or already (a retry after a
    /// lost write).
    Held,
    /// Every place is taken: no new pending record may be written.
    Full,
    /// No lobby answered (its bucket, or the server config's import of it,
    /// predates it): the per-instance rate is the only bound.
    NoLobby(String),
}

/// Logs, once per process, that there is no lobby to bound the pending
/// list by.
pub fn warn_no_lobby(why: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "no lobby ({BUCKET_LOBBY}: {why}): the pending list is bounded only by each instance's rate of new pending records; run `fleetctl buckets create` and regenerate the server config with `fleetctl nats-config` to bound it"
        );
    }
}

/// Logs, once per process, that registry reads come from any replica.
fn warn_no_leader_read(why: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "no leader read of the device registry ({}: {why}): records are read by Direct Get, which a replica cut off from the leader answers from what it last held, so a device revoked meanwhile could be admitted through it; regenerate the server config with `fleetctl nats-config` to read from the leader",
            auth_registry_read_subject()
        );
    }
}

/// `body` as the record of `device` at `revision`.
fn parse_record(device: &DeviceId, body: &[u8], revision: u64) -> Result<Read, RegistryError> {
    let record: DeviceRecord =
        serde_json::from_slice(body).map_err(|e| RegistryError::Bad(e.to_string()))?;
    if record.device_id != *device {
        return Err(RegistryError::Bad(format!(
            "key {device} holds the record of {}",
            record.device_id
        )));
    }
    Ok(Read {
        record: Some(record),
        revision,
    })
}

/// The registry stream leader's answer about `device`.
fn parse_leader_read(device: &DeviceId, body: &[u8]) -> Result<Read, RegistryError> {
    match MsgGetResponse::last_version(body) {
        Ok(LastVersion::Absent) => Ok(Read {
            record: None,
            revision: 0,
        }),
        Ok(LastVersion::Present { version, .. }) if version.deleted => Ok(Read {
            record: None,
            revision: version.seq,
        }),
        Ok(LastVersion::Present { version, value }) => parse_record(device, &value, version.seq),
        Err(MsgGetFailure::Api(e)) => Err(RegistryError::Unavailable(format!(
            "{} (code {})",
            e.description,
            e.best_code()
        ))),
        Err(MsgGetFailure::Malformed(e)) => Err(RegistryError::Bad(e)),
    }
}

/// Reads and writes of registry records.
pub trait Registry: Send + Sync {
    fn read(&self, device: &DeviceId) -> Result<Read, RegistryError>;
    /// Writes `record` if the key is still at `revision` (0: absent).
    fn write(&self, record: &DeviceRecord, revision: u64) -> Result<u64, RegistryError>;
    /// Takes a place in the lobby for `device` (created only if absent).
    fn take_ticket(&self, device: &DeviceId, at: Timestamp) -> Result<Ticket, RegistryError>;
}

/// The registry over the callout's NATS connection in `AUTH`.
#[derive(Debug, Clone)]
pub struct NatsRegistry {
    nc: nats::Connection,
}

impl NatsRegistry {
    pub fn new(nc: nats::Connection) -> Self {
        Self { nc }
    }

    fn request(
        &self,
        subject: &str,
        headers: Option<&nats::header::HeaderMap>,
        body: &[u8],
        timeout: Duration,
    ) -> Result<nats::Message, RegistryError> {
        self.request_raw(subject, headers, body, timeout)
            .map_err(|e| RegistryError::Unavailable(e.to_string()))
    }

    fn request_raw(
        &self,
        subject: &str,
        headers: Option<&nats::header::HeaderMap>,
        body: &[u8],
        timeout: Duration,
    ) -> std::io::Result<nats::Message> {
        self.nc
            .request_with_headers_or_timeout(subject, headers, Some(timeout), body)
    }
}

impl NatsRegistry {
    /// The record as any replica holds it: only where the server config
    /// has no leader read to import.
    fn read_direct(&self, device: &DeviceId) -> Result<Read, RegistryError> {
        let subject = direct_get_subject(BUCKET_REGISTRY, device.as_str());
        let m = self.request(&subject, None, b"", REGISTRY_READ_TIMEOUT)?;
        let header = |name: &str| m.headers.as_ref().and_then(|h| h.get(name)).cloned();
        if let Some(status) = header(HEADER_STATUS) {
            if status == "404" {
                return Ok(Read {
                    record: None,
                    revision: 0,
                });
            }
            return Err(RegistryError::Unavailable(format!("status {status}")));
        }
        let headers = m.headers.as_ref();
        let version =
            KeyVersion::from_headers(|n| headers.and_then(|h| h.get(n)).map(String::as_str))
                .map_err(RegistryError::Bad)?;
        if version.deleted {
            return Ok(Read {
                record: None,
                revision: version.seq,
            });
        }
        parse_record(device, &m.data, version.seq)
    }
}

impl Registry for NatsRegistry {
    fn read(&self, device: &DeviceId) -> Result<Read, RegistryError> {
        let key = kv_subject(BUCKET_REGISTRY, device.as_str());
        let body = serde_json::to_vec(&LastBySubject { last_by_subj: &key })
            .map_err(|e| RegistryError::Bad(e.to_string()))?;
        let subject = auth_registry_read_subject();
        match self.request_raw(&subject, None, &body, REGISTRY_READ_TIMEOUT) {
            Ok(m) => parse_leader_read(device, &m.data),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                warn_no_leader_read(&e.to_string());
                self.read_direct(device)
            }
            Err(e) => Err(RegistryError::Unavailable(format!(
                "{e} (no answer from the registry stream's leader: none elected, or none reachable from this server)"
            ))),
        }
    }

    fn write(&self, record: &DeviceRecord, revision: u64) -> Result<u64, RegistryError> {
        let body = serde_json::to_vec(record).map_err(|e| RegistryError::Bad(e.to_string()))?;
        let mut headers = nats::header::HeaderMap::new();
        headers.insert(HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE, revision.to_string());
        let subject = kv_subject(BUCKET_REGISTRY, record.device_id.as_str());
        let m = self.request(&subject, Some(&headers), &body, REGISTRY_WRITE_TIMEOUT)?;
        let ack: PubAckResponse =
            serde_json::from_slice(&m.data).map_err(|e| RegistryError::Bad(e.to_string()))?;
        match (ack.error, ack.seq) {
            (Some(e), _) if e.best_code() == ERR_WRONG_LAST_SEQUENCE => Err(RegistryError::Moved),
            (Some(e), _) => Err(RegistryError::Unavailable(e.description)),
            (None, Some(seq)) => Ok(seq),
            (None, None) => Err(RegistryError::Bad("an ack without a sequence".to_owned())),
        }
    }

    fn take_ticket(&self, device: &DeviceId, at: Timestamp) -> Result<Ticket, RegistryError> {
        let body = serde_json::to_vec(&LobbyTicket { requested_at: at })
            .map_err(|e| RegistryError::Bad(e.to_string()))?;
        let mut headers = nats::header::HeaderMap::new();
        headers.insert(HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE, "0".to_owned());
        let subject = kv_subject(BUCKET_LOBBY, device.as_str());
        let m = match self.request_raw(&subject, Some(&headers), &body, REGISTRY_WRITE_TIMEOUT) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Ticket::NoLobby(e.to_string()))
            }
            Err(e) => return Err(RegistryError::Unavailable(e.to_string())),
        };
        let ack: PubAckResponse =
            serde_json::from_slice(&m.data).map_err(|e| RegistryError::Bad(e.to_string()))?;
        match (ack.error, ack.seq) {
            (Some(e), _) if e.best_code() == ERR_WRONG_LAST_SEQUENCE => Ok(Ticket::Held),
            (Some(e), _) if e.description.contains(MAX_MSGS_EXCEEDED) => Ok(Ticket::Full),
            (Some(e), _) => Err(RegistryError::Unavailable(e.description)),
            (None, Some(_)) => Ok(Ticket::Held),
            (None, None) => Err(RegistryError::Bad("an ack without a sequence".to_owned())),
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[test]
    fn a_leader_read_gives_the_record_its_revision_or_why_not() {
        let dev = DeviceId::parse("dev-a").expect("id");
        let record = |id: &str| {
            fleet_common::b64::encode_std(
                format!(r#"{{"device-id":"{id}","state":"revoked"}}"#).as_bytes(),
            )
        };
        let answer = |data: String| {
            format!(
                r#"{{"message":{{"subject":"$KV.fleet-registry.dev-a","seq":12,"data":"{data}"}}}}"#
            )
        };
        let read = parse_leader_read(&dev, answer(record("dev-a")).as_bytes()).expect("read");
        assert_eq!(read.revision, 12);
        assert_eq!(
            read.record.map(|r| r.state),
            Some(fleet_common::contracts::RecordState::Revoked)
        );
        assert!(matches!(
            parse_leader_read(&dev, answer(record("dev-b")).as_bytes()),
            Err(RegistryError::Bad(e)) if e.contains("dev-b")
        ));
        let absent = br#"{"error":{"code":404,"err_code":10037,"description":"no message found"}}"#;
        assert_eq!(
            parse_leader_read(&dev, absent),
            Ok(Read {
                record: None,
                revision: 0
            })
        );
        // Any other error refuses: the leader did not say the key is absent.
        let no_stream =
            br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#;
        assert!(matches!(
            parse_leader_read(&dev, no_stream),
            Err(RegistryError::Unavailable(e)) if e.contains("stream not found")
        ));
    }

    /// An in-memory registry with the same compare-and-set rule.
    #[derive(Debug, Default)]
    pub struct MemRegistry {
        pub records: Mutex<HashMap<String, (DeviceRecord, u64)>>,
        pub seq: Mutex<u64>,
        pub down: std::sync::atomic::AtomicBool,
        /// Lobby tickets held, and how many the lobby takes (`None`: no
        /// lobby at all).
        pub tickets: Mutex<std::collections::BTreeSet<String>>,
        pub lobby_places: Option<usize>,
    }

    impl MemRegistry {
        pub fn with_lobby(places: usize) -> Self {
            Self {
                lobby_places: Some(places),
                ..Self::default()
            }
        }
    }

    impl Registry for MemRegistry {
        fn read(&self, device: &DeviceId) -> Result<Read, RegistryError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(RegistryError::Unavailable("down".to_owned()));
            }
            let r = self.records.lock().expect("lock");
            Ok(match r.get(device.as_str()) {
                Some((rec, rev)) => Read {
                    record: Some(rec.clone()),
                    revision: *rev,
                },
                None => Read {
                    record: None,
                    revision: 0,
                },
            })
        }
        fn write(&self, record: &DeviceRecord, revision: u64) -> Result<u64, RegistryError> {
            let mut r = self.records.lock().expect("lock");
            let now = r.get(record.device_id.as_str()).map_or(0, |(_, rev)| *rev);
            if now != revision {
                return Err(RegistryError::Moved);
            }
            let mut seq = self.seq.lock().expect("lock");
            *seq += 1;
            r.insert(record.device_id.to_string(), (record.clone(), *seq));
            Ok(*seq)
        }
        fn take_ticket(&self, device: &DeviceId, _at: Timestamp) -> Result<Ticket, RegistryError> {
            let Some(places) = self.lobby_places else {
                return Ok(Ticket::NoLobby("no responders".to_owned()));
            };
            let mut t = self.tickets.lock().expect("lock");
            if t.contains(device.as_str()) {
                return Ok(Ticket::Held);
            }
            if t.len() >= places {
                return Ok(Ticket::Full);
            }
            t.insert(device.to_string());
            Ok(Ticket::Held)
        }
    }
}
