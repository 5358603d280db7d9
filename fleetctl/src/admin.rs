//! `fleetctl buckets create`: the KV buckets of the fleet, with the stream
//! configs of `fleet_common::nats_config` (`fleet-status` refuses rollup
//! headers, which the crate's KV helper cannot say; `fleet-workloads` and
//! `fleet-control` republish every key change for generation-2 devices).
//!
//! Steps per bucket: create the stream; when one of that name exists with
//! another config (an older deployment: no republish, another size limit or
//! replica count), update it in place to this config. Running it again is a
//! no-op.

use fleet_common::limits::NATS_REQUEST_TIMEOUT;
use fleet_common::nats_config::{
    kv_stream_config, stream_create_subject, stream_update_subject, FLEET_BUCKETS,
};

use crate::error::CtlError;

/// JetStream's error code for "stream name already in use with a
/// different configuration".
const ERR_STREAM_NAME_IN_USE: u64 = 10058;

/// What `buckets create` did to one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketOutcome {
    /// Created, or already exactly so.
    Ready,
    /// Existed with another config; updated in place.
    Updated,
}

/// Sends one stream API request; the JetStream error, if any, as
/// (code, description).
fn stream_request(
    conn: &nats::Connection,
    subject: &str,
    body: &str,
    what: &str,
) -> Result<Option<(u64, String)>, CtlError> {
    let reply = conn
        .request_timeout(subject, body, NATS_REQUEST_TIMEOUT)
        .map_err(CtlError::nats(what.to_owned()))?;
    let v: serde_json::Value = serde_json::from_slice(&reply.data).map_err(|e| CtlError::Nats {
        what: what.to_owned(),
        detail: format!("unreadable JetStream answer: {e}"),
    })?;
    Ok(v.get("error").map(|e| {
        let code = e["err_code"]
            .as_u64()
            .filter(|c| *c != 0)
            .or_else(|| e["code"].as_u64())
            .unwrap_or(0);
        (
            code,
            e["description"].as_str().unwrap_or("refused").to_owned(),
        )
    }))
}

/// Creates the buckets, updating existing ones in place (idempotent).
pub fn create_buckets(
    conn: &nats::Connection,
    replicas: u8,
) -> Result<Vec<(&'static str, BucketOutcome)>, CtlError> {
    let mut done = Vec::new();
    for spec in &FLEET_BUCKETS {
        let body = kv_stream_config(spec, replicas).to_string();
        let what = format!("creating bucket {}", spec.bucket);
        let outcome = match stream_request(conn, &stream_create_subject(spec.bucket), &body, &what)?
        {
            None => BucketOutcome::Ready,
            Some((ERR_STREAM_NAME_IN_USE, _)) => {
                let what = format!(
                    "updating bucket {} in place (it exists with another config)",
                    spec.bucket
                );
                match stream_request(conn, &stream_update_subject(spec.bucket), &body, &what)? {
                    None => BucketOutcome::Updated,
                    Some((_, detail)) => return Err(CtlError::Nats { what, detail }),
                }
            }
            Some((_, detail)) => return Err(CtlError::Nats { what, detail }),
        };
        done.push((spec.bucket, outcome));
    }
    Ok(done)
}
