//! The device registry (`fleet-registry`, owned by `FLEET`), as the callout
//! and the enrollment service reach it from `AUTH`: Direct Get of one record
//! (any replica answers) and compare-and-set writes, both through the
//! service imports of the callout layout (`common/src/nats_config.rs`).
//!
//! [`Registry`] is the seam the decisions are tested through; [`NatsRegistry`]
//! is the real one.

use std::fmt;
use std::time::Duration;

use fleet_common::contracts::DeviceRecord;
use fleet_common::jetstream::{
    KeyVersion, PubAckResponse, ERR_WRONG_LAST_SEQUENCE, HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE,
    HEADER_STATUS,
};
use fleet_common::limits::{REGISTRY_READ_TIMEOUT, REGISTRY_WRITE_TIMEOUT};
use fleet_common::subjects::{direct_get_subject, kv_subject, BUCKET_REGISTRY};
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

/// Reads and writes of registry records.
pub trait Registry: Send + Sync {
    fn read(&self, device: &DeviceId) -> Result<Read, RegistryError>;
    /// Writes `record` if the key is still at `revision` (0: absent).
    fn write(&self, record: &DeviceRecord, revision: u64) -> Result<u64, RegistryError>;
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
        self.nc
            .request_with_headers_or_timeout(subject, headers, Some(timeout), body)
            .map_err(|e| RegistryError::Unavailable(e.to_string()))
    }
}

impl Registry for NatsRegistry {
    fn read(&self, device: &DeviceId) -> Result<Read, RegistryError> {
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
        let record: DeviceRecord =
            serde_json::from_slice(&m.data).map_err(|e| RegistryError::Bad(e.to_string()))?;
        if record.device_id != *device {
            return Err(RegistryError::Bad(format!(
                "key {device} holds the record of {}",
                record.device_id
            )));
        }
        Ok(Read {
            record: Some(record),
            revision: version.seq,
        })
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
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// An in-memory registry with the same compare-and-set rule.
    #[derive(Debug, Default)]
    pub struct MemRegistry {
        pub records: Mutex<HashMap<String, (DeviceRecord, u64)>>,
        pub seq: Mutex<u64>,
        pub down: std::sync::atomic::AtomicBool,
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
    }
}
