//! Writing a KV value the way a device may: publish to
//! `$KV.<bucket>.<key>` with a reply on the device inbox and wait for the
//! JetStream ack (`{"stream":..,"seq":..}`); an `{"error":..}` answer, a
//! missing stream or no answer in time is a failed write.

use std::fmt;
use std::time::Duration;

use fleet_common::jetstream::PubAckResponse;
use fleet_common::subjects::kv_subject;

use super::connection::Nats;
use super::inbox::RequestError;

/// The stream and sequence JetStream stored a write at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubAck {
    pub stream: String,
    pub seq: u64,
}

/// A write that JetStream did not acknowledge.
#[derive(Debug)]
pub enum PublishError {
    Encode {
        subject: String,
        source: serde_json::Error,
    },
    Request(RequestError),
    Refused {
        subject: String,
        code: u64,
        description: String,
    },
    BadAck {
        subject: String,
        detail: String,
    },
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Encode { subject, source } => {
                write!(f, "encoding the value for {subject}: {source}")
            }
            Self::Request(e) => write!(f, "{e}"),
            Self::Refused {
                subject,
                code,
                description,
            } => write!(
                f,
                "JetStream refused the write to {subject}: {description} (code {code})"
            ),
            Self::BadAck { subject, detail } => {
                write!(f, "unexpected JetStream answer for {subject}: {detail}")
            }
        }
    }
}

impl std::error::Error for PublishError {}

/// Puts `value` at `key` of `bucket` and waits up to `timeout` for the ack.
pub fn put(
    nats: &Nats,
    bucket: &str,
    key: &str,
    value: &[u8],
    timeout: Duration,
) -> Result<PubAck, PublishError> {
    let subject = kv_subject(bucket, key);
    let reply = nats
        .request(&subject, value, timeout)
        .map_err(PublishError::Request)?;
    let ack: PubAckResponse =
        serde_json::from_slice(&reply.data).map_err(|e| PublishError::BadAck {
            subject: subject.clone(),
            detail: e.to_string(),
        })?;
    match ack {
        PubAckResponse { error: Some(e), .. } => Err(PublishError::Refused {
            subject,
            code: e.best_code(),
            description: e.description,
        }),
        PubAckResponse {
            stream: Some(stream),
            seq: Some(seq),
            ..
        } => Ok(PubAck { stream, seq }),
        _ => Err(PublishError::BadAck {
            subject,
            detail: format!(
                "neither an ack nor an error: {}",
                String::from_utf8_lossy(&reply.data)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ),
        }),
    }
}

/// [`put`] of a value serialized as JSON.
pub fn put_json<T: serde::Serialize>(
    nats: &Nats,
    bucket: &str,
    key: &str,
    value: &T,
    timeout: Duration,
) -> Result<PubAck, PublishError> {
    let bytes = serde_json::to_vec(value).map_err(|source| PublishError::Encode {
        subject: kv_subject(bucket, key),
        source,
    })?;
    put(nats, bucket, key, &bytes, timeout)
}
