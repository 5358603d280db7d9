//! `fleetctl buckets create`: the KV buckets of the fleet, with the stream
//! configs of `fleet_common::nats_config` (`fleet-status` refuses rollup
//! headers, which the crate's KV helper cannot say; `fleet-workloads` and
//! `fleet-control` republish every key change for generation-2 devices).
//!
//! Steps per bucket: create the stream; when one of that name exists with
//! another config (an older deployment: no republish, another size limit or
//! replica count), update it in place to this config. Running it again is a
//! no-op. nats-server 2.9 cannot add `republish` to an existing stream
//! (error 10052): with `--recreate` the bucket is then read whole (every
//! key's last value), deleted, created anew and written back; without it,
//! the refusal says so. Agents 0.1.0 lose their consumers on that bucket
//! and make new ones (within three idle heartbeats); newer agents read the
//! keys again on the next change or check.

use fleet_common::limits::NATS_REQUEST_TIMEOUT;
use fleet_common::nats_config::{
    kv_stream_config, stream_create_subject, stream_update_subject, FLEET_BUCKETS,
};
use fleet_common::subjects::{kv_subject, stream_name};

use crate::error::CtlError;
use crate::js;

/// JetStream's error code for "stream name already in use with a
/// different configuration".
const ERR_STREAM_NAME_IN_USE: u64 = 10058;
/// JetStream's error code for an update the server cannot make in place
/// (2.9: "stream configuration update can not change RePublish").
const ERR_STREAM_UPDATE_REFUSED: u64 = 10052;

/// What `buckets create` did to one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketOutcome {
    /// Created, or already exactly so.
    Ready,
    /// Existed with another config; updated in place.
    Updated,
    /// Existed with a config the server cannot change in place; recreated
    /// with every key's last value copied.
    Recreated { keys: usize },
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
    recreate: bool,
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
                    Some((ERR_STREAM_UPDATE_REFUSED, _)) if recreate => {
                        recreate_bucket(conn, spec.bucket, &body)?
                    }
                    Some((ERR_STREAM_UPDATE_REFUSED, detail)) => {
                        return Err(CtlError::Refused(format!(
                            "bucket {} cannot be updated in place by this nats-server ({detail}); run `fleetctl buckets create --recreate` to recreate it with every key's last value copied (agents 0.1.0 make new consumers), or upgrade nats-server to 2.10 or later first",
                            spec.bucket
                        )))
                    }
                    Some((_, detail)) => return Err(CtlError::Nats { what, detail }),
                }
            }
            Some((_, detail)) => return Err(CtlError::Nats { what, detail }),
        };
        done.push((spec.bucket, outcome));
    }
    Ok(done)
}

/// Reads every key's last value of `bucket`, deletes its stream, creates it
/// with `body` and writes the values back (deleted keys stay absent).
fn recreate_bucket(
    conn: &nats::Connection,
    bucket: &str,
    body: &str,
) -> Result<BucketOutcome, CtlError> {
    let entries = js::read_last(conn, bucket, &kv_subject(bucket, ">"))?;
    let what = format!("recreating bucket {bucket}");
    let delete = format!("$JS.API.STREAM.DELETE.{}", stream_name(bucket));
    if let Some((_, detail)) = stream_request(conn, &delete, "", &what)? {
        return Err(CtlError::Nats { what, detail });
    }
    if let Some((_, detail)) = stream_request(conn, &stream_create_subject(bucket), body, &what)? {
        return Err(CtlError::Nats {
            what: format!("{what} (deleted, not created again: run the command again to create it empty, then restore its keys)"),
            detail,
        });
    }
    let mut keys = 0;
    for e in entries {
        let Some(value) = e.value else { continue };
        let subject = kv_subject(bucket, &e.key);
        let reply = conn
            .request_timeout(&subject, value, NATS_REQUEST_TIMEOUT)
            .map_err(CtlError::nats(format!("{what}: writing {}", e.key)))?;
        let v: serde_json::Value = serde_json::from_slice(&reply.data).unwrap_or_default();
        if let Some(err) = v.get("error") {
            return Err(CtlError::Nats {
                what: format!("{what}: writing {}", e.key),
                detail: err.to_string(),
            });
        }
        keys += 1;
    }
    Ok(BucketOutcome::Recreated { keys })
}
