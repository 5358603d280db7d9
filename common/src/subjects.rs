//! NATS names: buckets, keys, subjects, and the per-device permission
//! template (DESIGN.md "NATS data model"). The static server-config generator
//! and the auth callout both take permissions from [`device_permissions`].

use crate::validate::{DeviceId, WorkloadName};

/// Desired workloads: `<device>.<workload>` → `WorkloadSpec`.
pub const BUCKET_DESIRED: &str = "fleet-desired";
/// Operator control: `<device>.agent-upgrade-intent` → `AgentUpgradeAttempt`.
pub const BUCKET_CONTROL: &str = "fleet-control";
/// Device reports: `<device>.{info,upgrade,workloads,heartbeat}`.
pub const BUCKET_STATUS: &str = "fleet-status";

/// The key of the upgrade intent under a device.
pub const INTENT_KEY: &str = "agent-upgrade-intent";

/// NATS account holding the streams (operator, fleetctl).
pub const ACCOUNT_FLEET: &str = "FLEET";
/// NATS account holding the devices.
pub const ACCOUNT_DEVICES: &str = "DEVICES";
/// Prefix under which `FLEET`'s consumer-create API is imported into `DEVICES`.
pub const DEVICE_API_PREFIX: &str = "fleetapi";
/// NATS account of the auth callout service (callout layout only).
pub const ACCOUNT_AUTH: &str = "AUTH";
/// The subject nats-server (2.10 and later) sends authorization requests to,
/// in the callout's account.
pub const AUTH_CALLOUT_SUBJECT: &str = "$SYS.REQ.USER.AUTH";

/// The keys a device writes in `fleet-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusKey {
    Info,
    Upgrade,
    Workloads,
    Heartbeat,
}

impl StatusKey {
    pub const ALL: [StatusKey; 4] = [Self::Info, Self::Upgrade, Self::Workloads, Self::Heartbeat];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Upgrade => "upgrade",
            Self::Workloads => "workloads",
            Self::Heartbeat => "heartbeat",
        }
    }
}

/// The JetStream stream behind a KV bucket.
pub fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// The subject of one key of a bucket.
pub fn kv_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// `<device>.<workload>` in `fleet-desired`.
pub fn desired_key(device: &DeviceId, workload: &WorkloadName) -> String {
    format!("{device}.{workload}")
}

/// `<device>.agent-upgrade-intent` in `fleet-control`.
pub fn intent_key(device: &DeviceId) -> String {
    format!("{device}.{INTENT_KEY}")
}

/// `<device>.<key>` in `fleet-status`.
pub fn status_key(device: &DeviceId, key: StatusKey) -> String {
    format!("{device}.{}", key.as_str())
}

/// Every key of one device in a bucket: `$KV.<bucket>.<device>.>`.
pub fn device_filter(bucket: &str, device: &DeviceId) -> String {
    format!("$KV.{bucket}.{device}.>")
}

/// The prefix of the device's request inboxes: `_INBOX.<device>.`.
pub fn inbox_prefix(device: &DeviceId) -> String {
    format!("_INBOX.{device}.")
}

/// The prefix of the device's push-consumer deliver subjects: `deliver.<device>.`.
pub fn deliver_prefix(device: &DeviceId) -> String {
    format!("deliver.{device}.")
}

/// The consumer-create subject a device publishes to (in `DEVICES`), scoped
/// to its own keys: `fleetapi.CONSUMER.CREATE.KV_<bucket>.<name>.$KV.<bucket>.<device>.>`.
pub fn device_consumer_create_subject(bucket: &str, consumer: &str, device: &DeviceId) -> String {
    format!(
        "{DEVICE_API_PREFIX}.CONSUMER.CREATE.{}.{consumer}.{}",
        stream_name(bucket),
        device_filter(bucket, device)
    )
}

/// The same API as `FLEET` sees it (for the operator and tests in `FLEET`).
pub fn consumer_create_subject(bucket: &str, consumer: &str, filter: &str) -> String {
    format!(
        "$JS.API.CONSUMER.CREATE.{}.{consumer}.{filter}",
        stream_name(bucket)
    )
}

/// Publish and subscribe permissions of one device in the `DEVICES` account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePermissions {
    pub publish_allow: Vec<String>,
    pub subscribe_allow: Vec<String>,
}

/// The one permission template (DESIGN.md): a device may create consumers on
/// its own desired and control keys, write its own status keys (with a
/// JetStream ack), answer flow control, and receive on its own inbox and
/// deliver subjects. Nothing else.
pub fn device_permissions(device: &DeviceId) -> DevicePermissions {
    DevicePermissions {
        publish_allow: vec![
            format!(
                "{DEVICE_API_PREFIX}.CONSUMER.CREATE.{}.*.{}",
                stream_name(BUCKET_DESIRED),
                device_filter(BUCKET_DESIRED, device)
            ),
            format!(
                "{DEVICE_API_PREFIX}.CONSUMER.CREATE.{}.*.{}",
                stream_name(BUCKET_CONTROL),
                device_filter(BUCKET_CONTROL, device)
            ),
            device_filter(BUCKET_STATUS, device),
            format!("$JS.FC.{}.>", stream_name(BUCKET_DESIRED)),
            format!("$JS.FC.{}.>", stream_name(BUCKET_CONTROL)),
        ],
        subscribe_allow: vec![
            format!("{}>", inbox_prefix(device)),
            format!("{}>", deliver_prefix(device)),
        ],
    }
}

/// Services `FLEET` exports to `DEVICES`, and the subject each is imported
/// as (`None`: the same subject).
pub fn account_service_exports() -> Vec<(String, Option<String>)> {
    let create = |bucket: &str| {
        let s = stream_name(bucket);
        (
            format!("$JS.API.CONSUMER.CREATE.{s}.*.$KV.{bucket}.*.>"),
            Some(format!(
                "{DEVICE_API_PREFIX}.CONSUMER.CREATE.{s}.*.$KV.{bucket}.*.>"
            )),
        )
    };
    vec![
        create(BUCKET_DESIRED),
        create(BUCKET_CONTROL),
        (format!("$KV.{BUCKET_STATUS}.*.>"), None),
        (format!("$JS.FC.{}.>", stream_name(BUCKET_DESIRED)), None),
        (format!("$JS.FC.{}.>", stream_name(BUCKET_CONTROL)), None),
    ]
}

/// The stream `FLEET` exports to `DEVICES` (push deliveries).
pub const DELIVER_STREAM_EXPORT: &str = "deliver.>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_design() {
        let d = DeviceId::parse("dev1").expect("valid");
        let w = WorkloadName::parse("web").expect("valid");
        assert_eq!(
            kv_subject(BUCKET_DESIRED, &desired_key(&d, &w)),
            "$KV.fleet-desired.dev1.web"
        );
        assert_eq!(intent_key(&d), "dev1.agent-upgrade-intent");
        assert_eq!(status_key(&d, StatusKey::Heartbeat), "dev1.heartbeat");
        assert_eq!(
            device_consumer_create_subject(BUCKET_DESIRED, "c1", &d),
            "fleetapi.CONSUMER.CREATE.KV_fleet-desired.c1.$KV.fleet-desired.dev1.>"
        );
        let p = device_permissions(&d);
        assert_eq!(
            p.publish_allow,
            vec![
                "fleetapi.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.dev1.>",
                "fleetapi.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.dev1.>",
                "$KV.fleet-status.dev1.>",
                "$JS.FC.KV_fleet-desired.>",
                "$JS.FC.KV_fleet-control.>",
            ]
        );
        assert_eq!(p.subscribe_allow, vec!["_INBOX.dev1.>", "deliver.dev1.>"]);
    }
}
