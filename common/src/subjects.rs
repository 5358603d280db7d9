//! NATS names: buckets, keys, subjects, and the per-device permission
//! template (`docs/design/protocol.md`). The static server-config generator
//! and the auth callout both take permissions from [`device_permissions`].

use crate::validate::{DeviceId, WorkloadName};

/// Desired workloads, generation 1 (agent 0.1.0): `<device>.<workload>` →
/// `WorkloadSpec`, read through a consumer per device. Written beside
/// [`BUCKET_WORKLOADS`] while the bucket exists
/// (`docs/operator/mixed-fleets.md`); retired with it.
pub const BUCKET_DESIRED: &str = "fleet-desired";
/// Desired workloads, generation 2: one document per device,
/// `<device>.desired` → `DesiredWorkloads`, so that one Direct Get reads a
/// complete snapshot.
pub const BUCKET_WORKLOADS: &str = "fleet-workloads";
/// The key of a device's desired-workloads document under the device.
pub const DESIRED_DOC_KEY: &str = "desired";
/// Core subject namespace the buckets a device reads republish every key
/// change to: `$KV.<bucket>.<key>` → `fleetkv.<bucket>.<key>`.
pub const REPUBLISH_PREFIX: &str = "fleetkv";
/// Operator control: `<device>.agent-upgrade-intent` → `AgentUpgradeAttempt`.
pub const BUCKET_CONTROL: &str = "fleet-control";
/// Device reports: `<device>.{info,upgrade,workloads,heartbeat,health,traffic}`.
pub const BUCKET_STATUS: &str = "fleet-status";

/// Operator-only state, never exported to `DEVICES` nor republished (a
/// device never sees it): `labels.<device>` → `DeviceLabels`,
/// `rollouts.<id>` → `RolloutState`.
pub const BUCKET_OPERATOR: &str = "fleet-operator";
/// The key prefix of device labels in [`BUCKET_OPERATOR`].
pub const LABELS_PREFIX: &str = "labels";
/// The key prefix of staged rollouts in [`BUCKET_OPERATOR`].
pub const ROLLOUTS_PREFIX: &str = "rollouts";

/// The key prefix of devices' recorded last-seen in [`BUCKET_OPERATOR`]
/// (`presence.<device>`, written by `fleetctl presence record`).
pub const LAST_SEEN_PREFIX: &str = "presence";

/// The key of the upgrade intent under a device.
pub const INTENT_KEY: &str = "agent-upgrade-intent";

/// NATS account holding the streams (operator, fleetctl).
pub const ACCOUNT_FLEET: &str = "FLEET";
/// NATS account holding the devices.
pub const ACCOUNT_DEVICES: &str = "DEVICES";
/// Prefix under which `FLEET`'s JetStream API (consumer create, generation
/// 1; Direct Get, generation 2) is imported into `DEVICES`, and the
/// registry's leader read into `AUTH`.
pub const DEVICE_API_PREFIX: &str = "fleetapi";
/// The system account of the generated server configs (`system_account`).
/// It has no users: what fleetctl reads of it (presence) is exported to
/// [`ACCOUNT_FLEET`] (docs/design/presence.md).
pub const ACCOUNT_SYSTEM: &str = "SYS";
/// The system account's CONNZ request scoped to [`ACCOUNT_DEVICES`]: every
/// server answers with its own device connections, paged.
pub const SYS_DEVICES_CONNZ: &str = "$SYS.REQ.ACCOUNT.DEVICES.CONNZ";
/// The system account's connect and disconnect events of
/// [`ACCOUNT_DEVICES`] (`.CONNECT`, `.DISCONNECT`).
pub const SYS_DEVICES_EVENTS: &str = "$SYS.ACCOUNT.DEVICES.*";
/// [`SYS_DEVICES_CONNZ`] as imported into [`ACCOUNT_FLEET`]: the subject
/// fleetctl's presence requests go to.
pub const PRESENCE_CONNZ: &str = "fleetpresence.CONNZ";
/// The prefix under which [`SYS_DEVICES_EVENTS`] arrive in
/// [`ACCOUNT_FLEET`]: `fleetpresence.$SYS.ACCOUNT.DEVICES.DISCONNECT`.
pub const PRESENCE_EVENTS_PREFIX: &str = "fleetpresence";
/// Every server's kick of one of its connections (body `{"cid": N}`;
/// nats-server 2.10 and later), exported by the system account to
/// [`ACCOUNT_FLEET`] in the callout layout: `fleetctl device revoke` and
/// `decommission` close a device's live connections with it.
pub const SYS_SERVER_KICK: &str = "$SYS.REQ.SERVER.*.KICK";
/// [`SYS_SERVER_KICK`] as imported into [`ACCOUNT_FLEET`]: the wildcard is
/// the server's id ([`presence_kick_subject`]).
pub const PRESENCE_KICK: &str = "fleetpresence.KICK.*";

/// The subject fleetctl kicks a connection of server `server_id` on.
pub fn presence_kick_subject(server_id: &str) -> String {
    format!("fleetpresence.KICK.{server_id}")
}
/// NATS account of the auth callout service (callout layout only).
pub const ACCOUNT_AUTH: &str = "AUTH";
/// The subject nats-server (2.10 and later) sends authorization requests to,
/// in the callout's account.
pub const AUTH_CALLOUT_SUBJECT: &str = "$SYS.REQ.USER.AUTH";

/// The keys a device writes in `fleet-status`. The first four keep the
/// shape agent 0.2.0 wrote (fleetctl 0.2 reads them refusing unknown
/// fields); what later agents add goes into keys of its own, read
/// tolerantly (`docs/design/protocol.md`, "Evolution rules").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusKey {
    Info,
    Upgrade,
    Workloads,
    Heartbeat,
    /// `HealthReport`: per-workload health and reverts (agent 0.3.0 on).
    Health,
    /// `TrafficReport`: the agent's own NATS traffic (agent 0.3.0 on).
    Traffic,
}

impl StatusKey {
    pub const ALL: [StatusKey; 6] = [
        Self::Info,
        Self::Upgrade,
        Self::Workloads,
        Self::Heartbeat,
        Self::Health,
        Self::Traffic,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Upgrade => "upgrade",
            Self::Workloads => "workloads",
            Self::Heartbeat => "heartbeat",
            Self::Health => "health",
            Self::Traffic => "traffic",
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

/// `<device>.desired` in `fleet-workloads`.
pub fn desired_doc_key(device: &DeviceId) -> String {
    format!("{device}.{DESIRED_DOC_KEY}")
}

/// `<device>.agent-upgrade-intent` in `fleet-control`.
pub fn intent_key(device: &DeviceId) -> String {
    format!("{device}.{INTENT_KEY}")
}

/// `labels.<device>` in `fleet-operator`.
pub fn labels_key(device: &DeviceId) -> String {
    format!("{LABELS_PREFIX}.{device}")
}

/// `rollouts.<id>` in `fleet-operator`.
pub fn rollout_key(id: &str) -> String {
    format!("{ROLLOUTS_PREFIX}.{id}")
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

/// Where a bucket's key changes are republished: `fleetkv.<bucket>.<key>`.
pub fn republish_subject(bucket: &str, key: &str) -> String {
    format!("{REPUBLISH_PREFIX}.{bucket}.{key}")
}

/// The stream `republish` block of a bucket devices read: every key change,
/// with its headers (`Nats-Sequence`, `Nats-Last-Sequence`, `KV-Operation`).
pub fn republish_config(bucket: &str) -> (String, String) {
    (kv_subject(bucket, ">"), republish_subject(bucket, ">"))
}

/// The Direct Get of one key as `FLEET` sees it, in the subject-appended
/// form (`$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`).
pub fn direct_get_subject(bucket: &str, key: &str) -> String {
    format!(
        "$JS.API.DIRECT.GET.{}.{}",
        stream_name(bucket),
        kv_subject(bucket, key)
    )
}

/// The stream-leader read of one message (`$JS.API.STREAM.MSG.GET.KV_<bucket>`):
/// unlike Direct Get, which any replica answers from what it holds, only the
/// stream's leader answers, so the answer holds every acknowledged write.
pub fn stream_msg_get_subject(bucket: &str) -> String {
    format!("$JS.API.STREAM.MSG.GET.{}", stream_name(bucket))
}

/// The same Direct Get as a device publishes it in `DEVICES`:
/// `fleetapi.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`.
pub fn device_direct_get_subject(bucket: &str, key: &str) -> String {
    format!(
        "{DEVICE_API_PREFIX}.DIRECT.GET.{}.{}",
        stream_name(bucket),
        kv_subject(bucket, key)
    )
}

/// The keys a generation-2 device reads, each one Direct Get and one
/// republished subject: its desired-workloads document and its upgrade
/// intent.
pub fn device_read_keys(device: &DeviceId) -> [(&'static str, String); 2] {
    [
        (BUCKET_WORKLOADS, desired_doc_key(device)),
        (BUCKET_CONTROL, intent_key(device)),
    ]
}

/// The fleet's device registry: key `<device>` → [`DeviceRecord`](crate::contracts::DeviceRecord)
/// (`docs/design/enrollment.md`). Written by fleetctl and the enrollment
/// service; read by the auth callout; never by a device.
pub const BUCKET_REGISTRY: &str = "fleet-registry";
/// The lobby: key `<device>` → [`LobbyTicket`](crate::contracts::LobbyTicket),
/// one per device whose pending record the enrollment service or the
/// callout wrote. Its stream holds at most
/// [`MAX_PENDING_DEVICES`](crate::limits::MAX_PENDING_DEVICES) keys and
/// refuses new ones beyond: the bound on the pending list, cluster-wide.
/// fleetctl frees a ticket when its device is decided (a filtered purge).
pub const BUCKET_LOBBY: &str = "fleet-lobby";
/// The account of devices not yet approved: they can publish their own
/// enrollment request and read its answer, nothing else.
pub const ACCOUNT_ENROLL: &str = "ENROLL";
/// Prefix of enrollment requests: `fleetenroll.key.<public key>`.
pub const ENROLL_PREFIX: &str = "fleetenroll";

/// The subject a device holding `key` sends its enrollment request on.
pub fn enroll_subject(key: &str) -> String {
    format!("{ENROLL_PREFIX}.key.{key}")
}

/// Every enrollment request (the enrollment service's subscription, and
/// the service `AUTH` exports to `ENROLL`).
pub fn enroll_subjects() -> String {
    format!("{ENROLL_PREFIX}.key.*")
}

/// The prefix of a pending device's request inboxes: `_INBOX.<key>.`.
pub fn enroll_inbox_prefix(key: &str) -> String {
    format!("_INBOX.{key}.")
}

/// Permissions of a device in `ENROLL`: its own request subject and its
/// own inbox.
pub fn enroll_permissions(key: &str) -> DevicePermissions {
    DevicePermissions {
        publish_allow: vec![enroll_subject(key)],
        subscribe_allow: vec![format!("{}>", enroll_inbox_prefix(key))],
    }
}

/// The registry stream leader's read as `AUTH` publishes it:
/// `fleetapi.STREAM.MSG.GET.KV_fleet-registry`. It is imported under
/// [`DEVICE_API_PREFIX`], not as itself: in an account without JetStream
/// the server answers `$JS.API.STREAM.…` itself ("JetStream not enabled
/// for account"), and that answer would win.
pub fn auth_registry_read_subject() -> String {
    format!(
        "{DEVICE_API_PREFIX}.STREAM.MSG.GET.{}",
        stream_name(BUCKET_REGISTRY)
    )
}

/// What `FLEET` exports to `AUTH` for the callout and the enrollment
/// service, each with the subject `AUTH` imports it under when that
/// differs: the leader's read of registry records, their Direct Get (which
/// callouts that predate leader reads use), writes to them, and writes of
/// lobby tickets.
pub fn registry_service_exports() -> [(String, Option<String>); 4] {
    [
        (
            stream_msg_get_subject(BUCKET_REGISTRY),
            Some(auth_registry_read_subject()),
        ),
        (
            format!("$JS.API.DIRECT.GET.{}.>", stream_name(BUCKET_REGISTRY)),
            None,
        ),
        (kv_subject(BUCKET_REGISTRY, ">"), None),
        (kv_subject(BUCKET_LOBBY, ">"), None),
    ]
}

/// Which device protocols the permission template and the server config
/// serve (`docs/operator/mixed-fleets.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceProtocols {
    /// Generation 2 (consumer-free reads) and generation 1 (agent 0.1.0:
    /// a consumer per device): the default until no device runs 0.1.0.
    WithLegacy,
    /// Generation 2 only.
    Current,
}

impl DeviceProtocols {
    pub fn serves_legacy(self) -> bool {
        matches!(self, Self::WithLegacy)
    }
}

/// Publish and subscribe permissions of one device in the `DEVICES` account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePermissions {
    pub publish_allow: Vec<String>,
    pub subscribe_allow: Vec<String>,
}

/// The one permission template (`docs/design/protocol.md` "Permissions").
/// Generation 2: Direct Get of
/// exactly its own two keys (literal subjects: no wildcard a device could
/// widen), its own republished subjects, its own status keys (with a
/// JetStream ack) and its inbox. Generation 1 adds creating consumers on its
/// own desired and control keys, answering flow control and its deliver
/// subjects. Nothing else.
pub fn device_permissions(device: &DeviceId, protocols: DeviceProtocols) -> DevicePermissions {
    let reads = device_read_keys(device);
    let mut publish_allow: Vec<String> = reads
        .iter()
        .map(|(bucket, key)| device_direct_get_subject(bucket, key))
        .collect();
    publish_allow.push(device_filter(BUCKET_STATUS, device));
    let mut subscribe_allow = vec![format!("{}>", inbox_prefix(device))];
    subscribe_allow.extend(
        reads
            .iter()
            .map(|(bucket, key)| republish_subject(bucket, key)),
    );
    if protocols.serves_legacy() {
        publish_allow.extend([
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
            format!("$JS.FC.{}.>", stream_name(BUCKET_DESIRED)),
            format!("$JS.FC.{}.>", stream_name(BUCKET_CONTROL)),
        ]);
        subscribe_allow.push(format!("{}>", deliver_prefix(device)));
    }
    DevicePermissions {
        publish_allow,
        subscribe_allow,
    }
}

/// The subjects a leaf node's devices' status writes cross to the hub on:
/// `fleetstatus.<device>.<key>`. A leaf node's link carries no `$KV.>`
/// (nats-server denies it on every leafnode connection of an account
/// other than the system account), so the leaf maps a device's
/// `$KV.fleet-status.<device>.<key>` there ([`leaf_status_mapping`]) and
/// the hub's `DEVICES` imports the status service under it
/// ([`leaf_status_import`]) (docs/design/leafnodes.md).
pub const LEAF_STATUS_PREFIX: &str = "fleetstatus";

/// A leaf's `DEVICES` mapping of status writes: (from, to).
pub fn leaf_status_mapping() -> (String, String) {
    (
        format!("$KV.{BUCKET_STATUS}.*.>"),
        format!("{LEAF_STATUS_PREFIX}.$1.>"),
    )
}

/// The subject the hub's `DEVICES` imports `FLEET`'s status service as,
/// for the leaves' devices.
pub fn leaf_status_import() -> String {
    format!("{LEAF_STATUS_PREFIX}.*.>")
}

/// A device's permissions on a leaf node: [`device_permissions`] and its
/// own status keys as the leaf maps them (the server checks a publish
/// against the mapped subject).
pub fn leaf_device_permissions(device: &DeviceId, protocols: DeviceProtocols) -> DevicePermissions {
    let mut p = device_permissions(device, protocols);
    p.publish_allow
        .push(format!("{LEAF_STATUS_PREFIX}.{device}.>"));
    p
}

/// Services `FLEET` exports to `DEVICES`, and the subject each is imported
/// as (`None`: the same subject). Direct Get is exported per key shape
/// (`*.desired`, `*.agent-upgrade-intent`), never the batch or wildcard forms.
pub fn account_service_exports(protocols: DeviceProtocols) -> Vec<(String, Option<String>)> {
    let direct = |bucket: &str, key: &str| {
        let s = stream_name(bucket);
        (
            format!("$JS.API.DIRECT.GET.{s}.$KV.{bucket}.*.{key}"),
            Some(format!(
                "{DEVICE_API_PREFIX}.DIRECT.GET.{s}.$KV.{bucket}.*.{key}"
            )),
        )
    };
    let mut v = vec![
        direct(BUCKET_WORKLOADS, DESIRED_DOC_KEY),
        direct(BUCKET_CONTROL, INTENT_KEY),
        (format!("$KV.{BUCKET_STATUS}.*.>"), None),
    ];
    if protocols.serves_legacy() {
        let create = |bucket: &str| {
            let s = stream_name(bucket);
            (
                format!("$JS.API.CONSUMER.CREATE.{s}.*.$KV.{bucket}.*.>"),
                Some(format!(
                    "{DEVICE_API_PREFIX}.CONSUMER.CREATE.{s}.*.$KV.{bucket}.*.>"
                )),
            )
        };
        v.extend([
            create(BUCKET_DESIRED),
            create(BUCKET_CONTROL),
            (format!("$JS.FC.{}.>", stream_name(BUCKET_DESIRED)), None),
            (format!("$JS.FC.{}.>", stream_name(BUCKET_CONTROL)), None),
        ]);
    }
    v
}

/// Streams `FLEET` exports to `DEVICES`: the republished key changes and,
/// for generation 1, the push deliveries.
pub fn account_stream_exports(protocols: DeviceProtocols) -> Vec<String> {
    let mut v = vec![format!("{REPUBLISH_PREFIX}.>")];
    if protocols.serves_legacy() {
        v.push(DELIVER_STREAM_EXPORT.to_owned());
    }
    v
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
        assert_eq!(
            kv_subject(BUCKET_OPERATOR, &labels_key(&d)),
            "$KV.fleet-operator.labels.dev1"
        );
        assert_eq!(rollout_key("r-1"), "rollouts.r-1");
        // Nothing of the operator bucket is exported to devices.
        for p in [DeviceProtocols::Current, DeviceProtocols::WithLegacy] {
            assert!(account_service_exports(p)
                .iter()
                .all(|(s, i)| !s.contains(BUCKET_OPERATOR)
                    && !i.as_deref().unwrap_or("").contains(BUCKET_OPERATOR)));
        }
        assert_eq!(status_key(&d, StatusKey::Heartbeat), "dev1.heartbeat");
        assert_eq!(
            device_consumer_create_subject(BUCKET_DESIRED, "c1", &d),
            "fleetapi.CONSUMER.CREATE.KV_fleet-desired.c1.$KV.fleet-desired.dev1.>"
        );
        assert_eq!(
            device_direct_get_subject(BUCKET_WORKLOADS, &desired_doc_key(&d)),
            "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.dev1.desired"
        );
        assert_eq!(
            republish_subject(BUCKET_CONTROL, &intent_key(&d)),
            "fleetkv.fleet-control.dev1.agent-upgrade-intent"
        );
        let p = device_permissions(&d, DeviceProtocols::Current);
        assert_eq!(
            p.publish_allow,
            vec![
                "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.dev1.desired",
                "fleetapi.DIRECT.GET.KV_fleet-control.$KV.fleet-control.dev1.agent-upgrade-intent",
                "$KV.fleet-status.dev1.>",
            ]
        );
        assert_eq!(
            p.subscribe_allow,
            vec![
                "_INBOX.dev1.>",
                "fleetkv.fleet-workloads.dev1.desired",
                "fleetkv.fleet-control.dev1.agent-upgrade-intent",
            ]
        );
        let legacy = device_permissions(&d, DeviceProtocols::WithLegacy);
        assert_eq!(
            legacy.publish_allow[3..],
            [
                "fleetapi.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.dev1.>",
                "fleetapi.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.dev1.>",
                "$JS.FC.KV_fleet-desired.>",
                "$JS.FC.KV_fleet-control.>",
            ]
        );
        assert_eq!(legacy.subscribe_allow[3..], ["deliver.dev1.>"]);
    }
}
