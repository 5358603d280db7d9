//! Reading one key of this device with Direct Get, in the subject-appended
//! form a per-device permission can scope
//! (`fleetapi.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<device>.<key>`, empty
//! body; `docs/design/protocol.md` "Generation 2: reads without a consumer"). Any
//! replica of the stream may answer.
//!
//! The answer is the key's last message with `Nats-Sequence` and
//! `Nats-Subject` headers (a delete marker carries `KV-Operation`), or a
//! status: `404` when the key was never written, `408` for a request the
//! server refuses, anything else an error.

use std::fmt;

use fleet_common::jetstream::KeyVersion;
use fleet_common::limits::DIRECT_GET_TIMEOUT;
use fleet_common::subjects::{device_direct_get_subject, kv_subject};

use super::connection::Nats;
use super::inbox::{status_of, RequestError};

/// One read of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRead {
    /// The stream sequence of the value read; 0 for a key never written.
    pub seq: u64,
    /// The value; `None` when the key is absent (never written, deleted or
    /// purged).
    pub value: Option<Vec<u8>>,
}

/// A read that did not produce the key's state.
#[derive(Debug)]
pub enum ReadError {
    Request(RequestError),
    /// The server answered with a status other than 404.
    Status {
        subject: String,
        status: String,
        description: String,
    },
    /// The answer's headers are missing or name another key.
    BadAnswer {
        subject: String,
        detail: String,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(e) => write!(f, "{e}"),
            Self::Status {
                subject,
                status,
                description,
            } => write!(
                f,
                "Direct Get {subject} answered {status} {description}; check the bucket exists with allow_direct (fleetctl buckets create) and this device may read the key"
            ),
            Self::BadAnswer { subject, detail } => {
                write!(f, "unexpected Direct Get answer for {subject}: {detail}")
            }
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads `<device>.<key>` of `bucket`.
pub fn read_key(nats: &Nats, bucket: &str, key: &str) -> Result<KeyRead, ReadError> {
    let full_key = format!("{}.{key}", nats.device());
    let subject = device_direct_get_subject(bucket, &full_key);
    let m = nats
        .request(&subject, b"", DIRECT_GET_TIMEOUT)
        .map_err(ReadError::Request)?;
    if let Some(status) = status_of(&m) {
        if status == "404" {
            return Ok(KeyRead {
                seq: 0,
                value: None,
            });
        }
        let description = m
            .headers
            .as_ref()
            .and_then(|h| h.get("Description"))
            .cloned()
            .unwrap_or_default();
        return Err(ReadError::Status {
            subject,
            status: status.to_owned(),
            description,
        });
    }
    let headers = m.headers.as_ref();
    let version =
        KeyVersion::from_headers(|name| headers.and_then(|h| h.get(name)).map(String::as_str))
            .map_err(|detail| ReadError::BadAnswer {
                subject: subject.clone(),
                detail,
            })?;
    let expected = kv_subject(bucket, &full_key);
    if version.subject != expected {
        return Err(ReadError::BadAnswer {
            subject,
            detail: format!("the answer is for {}, not {expected}", version.subject),
        });
    }
    Ok(KeyRead {
        seq: version.seq,
        value: (!version.deleted).then_some(m.data),
    })
}
