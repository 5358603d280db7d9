//! Device isolation as `docs/design/security.md` promises it, checked against
//! any server that places devices in `DEVICES` with `fleet_common`'s permission
//! template (static users or users issued by the auth callout).
//!
//! A [`DeviceClient`] is a device connection whose server-side errors
//! (permission violations arrive as `-ERR` lines, reported only to the error
//! callback) land in a channel. [`assert_device_isolation`] writes desired
//! state and intents for two devices as admin, then checks that device A
//! reads its own keys through a subject-scoped consumer, writes its own
//! status with a JetStream ack, and cannot: create a consumer on B's keys
//! (desired or control), smuggle B's filter into its own create request,
//! write B's status, or listen on B's inbox or deliver subjects.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fleet_common::subjects::{
    device_consumer_create_subject, device_filter, intent_key, kv_subject, stream_name,
    BUCKET_CONTROL, BUCKET_DESIRED, BUCKET_STATUS, LEAF_STATUS_PREFIX,
};
use fleet_common::validate::DeviceId;
use serde_json::{json, Value};

/// Bound on every wait for a reply, a delivery or an error.
const WAIT: Duration = Duration::from_secs(5);
/// A refused request gets no reply: how long to wait before concluding so.
const NO_REPLY_WAIT: Duration = Duration::from_millis(500);
/// Deliveries stop for this long: the snapshot is complete.
const DELIVERY_PAUSE: Duration = Duration::from_millis(300);
/// How long a consumer outlives its device's interest.
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(30);

/// A connected device and the server's errors to it.
#[derive(Debug)]
pub struct DeviceClient {
    pub id: String,
    pub conn: nats::Connection,
    errors: mpsc::Receiver<String>,
}

impl DeviceClient {
    /// Connects `options` (already carrying the device's credentials) to
    /// `url`, collecting server errors.
    pub fn connect(options: nats::Options, url: &str, id: &str) -> io::Result<DeviceClient> {
        let (tx, errors) = mpsc::channel();
        let conn = options
            .error_callback(move |e| {
                let _ = tx.send(e.to_string());
            })
            .connect(url)?;
        Ok(DeviceClient {
            id: id.to_owned(),
            conn,
            errors,
        })
    }

    /// The next server error within `wait`.
    pub fn next_error(&self, wait: Duration) -> Option<String> {
        self.errors.recv_timeout(wait).ok()
    }

    /// Publishes `value` to its own status key `key` with a reply on its own
    /// inbox; the JetStream ack, or `None` without one within `WAIT`.
    pub fn put_status(&self, key: &str, value: &[u8]) -> Option<Value> {
        let inbox = format!("_INBOX.{}.{}", self.id, unique());
        let sub = self.conn.subscribe(&inbox).ok()?;
        self.conn
            .publish_with_reply_or_headers(
                &kv_subject(BUCKET_STATUS, &format!("{}.{key}", self.id)),
                Some(&inbox),
                None,
                value,
            )
            .ok()?;
        let ack = sub.next_timeout(WAIT).ok()?;
        serde_json::from_slice(&ack.data).ok()
    }

    /// Creates a push consumer the way the agent does (subject-scoped,
    /// delivering to `deliver.<id>.<name>`) on `subject_device`'s keys in
    /// `bucket`, with `body_device`'s filter in the body; returns the create
    /// response (`None`: none within `reply_wait`) and the subjects and
    /// values delivered.
    pub fn read_keys(
        &self,
        bucket: &str,
        subject_device: &str,
        body_device: &str,
        reply_wait: Duration,
    ) -> (Option<Value>, Vec<(String, Vec<u8>)>) {
        let name = format!("c{}", unique());
        let device = DeviceId::parse(subject_device).expect("valid device id");
        let body_dev = DeviceId::parse(body_device).expect("valid device id");
        let deliver = format!("deliver.{}.{name}", self.id);
        let inbox = format!("_INBOX.{}.{name}", self.id);
        let deliveries = self.conn.subscribe(&deliver).expect("subscribe deliver");
        let replies = self.conn.subscribe(&inbox).expect("subscribe inbox");
        let body = json!({
            "stream_name": stream_name(bucket),
            "config": {
                "name": name,
                "deliver_subject": deliver,
                "filter_subject": device_filter(bucket, &body_dev),
                "deliver_policy": "last_per_subject",
                "ack_policy": "none",
                "inactive_threshold": INACTIVE_THRESHOLD.as_nanos() as u64,
            }
        });
        self.conn
            .publish_with_reply_or_headers(
                &device_consumer_create_subject(bucket, &name, &device),
                Some(&inbox),
                None,
                body.to_string(),
            )
            .expect("publish is buffered");
        let response = replies
            .next_timeout(reply_wait)
            .ok()
            .and_then(|m| serde_json::from_slice::<Value>(&m.data).ok());
        let mut got = Vec::new();
        // A consumer delivers its snapshot right after the create response;
        // collect until the deliveries pause.
        let deadline = Instant::now() + WAIT;
        let created = response.as_ref().is_some_and(|r| r.get("error").is_none());
        if created {
            loop {
                match deliveries.next_timeout(DELIVERY_PAUSE) {
                    Ok(m) => got.push((m.subject.clone(), m.data.clone())),
                    Err(_) if !got.is_empty() || Instant::now() >= deadline => break,
                    Err(_) => {}
                }
            }
        }
        self.conn.flush_timeout(WAIT).expect("flush");
        while let Some(m) = deliveries.try_next() {
            got.push((m.subject.clone(), m.data.clone()));
        }
        (response, got)
    }
}

fn unique() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Puts `value` at `key` of `bucket` as admin (plain publish with an ack).
fn admin_put(admin: &nats::Connection, bucket: &str, key: &str, value: &str) {
    let ack = admin
        .request_timeout(&kv_subject(bucket, key), value, WAIT)
        .expect("admin put acked");
    let ack: Value = serde_json::from_slice(&ack.data).expect("ack JSON");
    assert!(
        ack.get("error").is_none(),
        "admin put {bucket}/{key}: {ack}"
    );
}

/// The value of `key` in `bucket`, read by admin (direct get).
pub fn admin_get(admin: &nats::Connection, bucket: &str, key: &str) -> Option<Vec<u8>> {
    let js = nats::jetstream::new(admin.clone());
    js.key_value(bucket).expect("bucket").get(key).expect("get")
}

fn expect_violation(c: &DeviceClient, kind: &str, needle: &str) {
    let err = c
        .next_error(WAIT)
        .unwrap_or_else(|| panic!("{}: no permission error for {kind} {needle}", c.id));
    assert!(
        err.contains(&format!("Permissions Violation for {kind}")) && err.contains(needle),
        "{}: expected a {kind} violation on {needle}, got {err}",
        c.id
    );
}

/// The isolation checks of the module comment, `a` against `b`.
pub fn assert_device_isolation(admin: &nats::Connection, a: &DeviceClient, b: &DeviceClient) {
    let (ida, idb) = (a.id.as_str(), b.id.as_str());
    let da = DeviceId::parse(ida).expect("valid");
    let db = DeviceId::parse(idb).expect("valid");
    admin_put(admin, BUCKET_DESIRED, &format!("{ida}.web"), "spec-a");
    admin_put(admin, BUCKET_DESIRED, &format!("{idb}.web"), "spec-b");
    admin_put(admin, BUCKET_CONTROL, &intent_key(&da), "intent-a");
    admin_put(admin, BUCKET_CONTROL, &intent_key(&db), "intent-b");

    // Own status: acked and stored.
    let ack = a
        .put_status("heartbeat", b"beat-a")
        .expect("own status acked");
    assert!(ack.get("error").is_none(), "{ida} status ack: {ack}");
    assert_eq!(
        admin_get(admin, BUCKET_STATUS, &format!("{ida}.heartbeat")),
        Some(b"beat-a".to_vec())
    );

    // Own desired state and intent: exactly its own keys.
    for (bucket, key, value) in [
        (BUCKET_DESIRED, format!("{ida}.web"), "spec-a"),
        (BUCKET_CONTROL, intent_key(&da), "intent-a"),
    ] {
        let (resp, got) = a.read_keys(bucket, ida, ida, WAIT);
        let resp = resp.unwrap_or_else(|| panic!("{ida}: no consumer-create response on {bucket}"));
        assert!(resp.get("error").is_none(), "{ida} own {bucket}: {resp}");
        assert_eq!(
            got,
            vec![(kv_subject(bucket, &key), value.as_bytes().to_vec())],
            "{ida} reads exactly its own {bucket} keys"
        );
    }

    // B's desired state and intent: the create is refused, nothing delivered.
    for bucket in [BUCKET_DESIRED, BUCKET_CONTROL] {
        let (resp, got) = a.read_keys(bucket, idb, idb, NO_REPLY_WAIT);
        expect_violation(a, "Publish", &device_filter(bucket, &db));
        assert!(
            resp.is_none(),
            "{ida} got a response creating on {idb}'s {bucket}"
        );
        assert!(got.is_empty(), "{ida} received {idb}'s {bucket}: {got:?}");
    }
    // Its own create subject with B's filter in the body: JetStream refuses.
    let (resp, got) = a.read_keys(BUCKET_DESIRED, ida, idb, WAIT);
    let resp = resp.expect("create response");
    assert!(
        resp.get("error").is_some(),
        "{ida} smuggled {idb}'s filter: {resp}"
    );
    assert!(
        got.is_empty(),
        "{ida} received {idb}'s desired state: {got:?}"
    );

    // B's status: refused, nothing lands.
    a.conn
        .publish_with_reply_or_headers(
            &kv_subject(BUCKET_STATUS, &format!("{idb}.x")),
            Some(&format!("_INBOX.{ida}.forged")),
            None,
            b"forged",
        )
        .expect("publish is buffered");
    // A leaf node names the subject it maps the write to
    // (`fleet_common::subjects::leaf_status_mapping`).
    let err = a
        .next_error(WAIT)
        .unwrap_or_else(|| panic!("{ida}: no permission error for B's status"));
    let leaf_subject = format!("{LEAF_STATUS_PREFIX}.{idb}.x\"");
    assert!(
        err.contains("Permissions Violation for Publish")
            && (err.contains(&format!("$KV.fleet-status.{idb}.x\""))
                || err.contains(&leaf_subject)),
        "{ida}: expected a Publish violation on B's status, got {err}"
    );
    assert_eq!(admin_get(admin, BUCKET_STATUS, &format!("{idb}.x")), None);

    // B's inbox and deliver subjects: subscriptions refused, B's ack unseen.
    let spy = a
        .conn
        .subscribe(&format!("_INBOX.{idb}.>"))
        .expect("subscribe is buffered");
    expect_violation(a, "Subscription", &format!("_INBOX.{idb}.>"));
    let _deliver_spy = a
        .conn
        .subscribe(&format!("deliver.{idb}.>"))
        .expect("subscribe is buffered");
    expect_violation(a, "Subscription", &format!("deliver.{idb}.>"));
    let ack = b.put_status("x", b"from-b").expect("B's own status acked");
    assert!(ack.get("error").is_none(), "{idb} status ack: {ack}");
    a.conn.flush_timeout(WAIT).expect("flush");
    assert!(spy.try_next().is_none(), "{ida} received {idb}'s ack");
    assert_eq!(
        admin_get(admin, BUCKET_STATUS, &format!("{idb}.x")),
        Some(b"from-b".to_vec())
    );
    assert!(
        a.next_error(Duration::from_millis(100)).is_none(),
        "{ida}: no further errors"
    );
}
