//! `fleetctl buckets create`: the three KV buckets of the fleet, with the
//! stream configs of `fleet_common::nats_config` (`fleet-status` refuses
//! rollup headers, which the crate's KV helper cannot say).

use fleet_common::limits::NATS_REQUEST_TIMEOUT;
use fleet_common::nats_config::{kv_stream_config, stream_create_subject, FLEET_BUCKETS};

use crate::error::CtlError;

/// Creates the three buckets (idempotent: an identical stream is fine).
pub fn create_buckets(conn: &nats::Connection, replicas: u8) -> Result<Vec<String>, CtlError> {
    let mut done = Vec::new();
    for spec in &FLEET_BUCKETS {
        let body = kv_stream_config(spec, replicas).to_string();
        let reply = conn
            .request_timeout(
                &stream_create_subject(spec.bucket),
                body,
                NATS_REQUEST_TIMEOUT,
            )
            .map_err(CtlError::nats(format!("creating bucket {}", spec.bucket)))?;
        let v: serde_json::Value = serde_json::from_slice(&reply.data).unwrap_or_default();
        if let Some(e) = v.get("error") {
            return Err(CtlError::Nats {
                what: format!("creating bucket {}", spec.bucket),
                detail: e["description"].as_str().unwrap_or("refused").to_owned(),
            });
        }
        done.push(spec.bucket.to_owned());
    }
    Ok(done)
}
