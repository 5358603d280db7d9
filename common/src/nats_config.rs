//! The nats-server configurations of the fleet layout
//! (`docs/design/protocol.md`) and the JetStream streams behind the three KV
//! buckets.
//!
//! [`static_server_config`] writes accounts `FLEET` (the streams, the admin
//! user, the exports) and `DEVICES` (one user per device with exactly
//! [`device_permissions`], the imports), all taken from [`crate::subjects`],
//! so the permission template is spelled once; it runs on every supported
//! server (Debian's 2.9.10 included). [`callout_server_config`] is the same
//! layout for servers with auth callout (2.10 and later): `DEVICES` has no
//! users, account `AUTH` holds the callout service, and the callout issues
//! each device a user with the same template. [`kv_stream_config`] is the
//! `$JS.API.STREAM.CREATE` body of a bucket: the same config a KV client
//! creates, plus `allow_rollup_hdrs: false` for `fleet-status` (otherwise one
//! device could roll up, that is purge, every device's status), which the
//! `nats` crate's KV helper cannot express.
//!
//! Leaf nodes (docs/design/leafnodes.md): [`LeafnodeListener`] adds the
//! hub's `leafnodes {}` listener to either layout, with one user per
//! account a leaf binds ([`LEAF_DEVICES_USER`] in `DEVICES`,
//! [`LEAF_SYSTEM_USER`] in the system account, so presence reaches the
//! leaves' connections); [`leaf_server_config`] writes a leaf: no
//! JetStream, the same device users and permissions, and those two
//! accounts bound to the hub's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::limits::MAX_DESIRED_DOC_BYTES;
use crate::limits::{
    LOBBY_TICKET_BYTES, MAX_KV_VALUE_BYTES, MAX_PENDING_DEVICES, NATS_AUTH_CALLOUT_TIMEOUT,
    NATS_MAX_CONTROL_LINE_BYTES,
};
use crate::nkey::PublicNkey;
use crate::subjects::{
    account_service_exports, account_stream_exports, device_permissions, enroll_subjects,
    kv_subject, leaf_device_permissions, leaf_status_import, leaf_status_mapping,
    registry_service_exports, republish_config, stream_name, DeviceProtocols, ACCOUNT_AUTH,
    ACCOUNT_DEVICES, ACCOUNT_ENROLL, ACCOUNT_FLEET, ACCOUNT_SYSTEM, BUCKET_CONTROL, BUCKET_DESIRED,
    BUCKET_LOBBY, BUCKET_OPERATOR, BUCKET_REGISTRY, BUCKET_STATUS, BUCKET_WORKLOADS,
    PRESENCE_CONNZ, PRESENCE_EVENTS_PREFIX, PRESENCE_KICK, SYS_DEVICES_CONNZ, SYS_DEVICES_EVENTS,
    SYS_SERVER_KICK,
};
use crate::validate::DeviceId;

/// The operator's user in `FLEET` (fleetctl, tests).
pub const ADMIN_USER: &str = "admin";

/// Duplicate-detection window of the bucket streams (what KV clients use).
const KV_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Everything [`static_server_config`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticServerConfig {
    /// Client listen address.
    pub listen: SocketAddr,
    /// `server_name` (required for a JetStream cluster; must be unique there).
    pub server_name: Option<String>,
    /// JetStream store directory.
    pub store_dir: PathBuf,
    /// Password of [`ADMIN_USER`] in `FLEET` (plain text or a bcrypt hash).
    pub admin_password: String,
    /// Device users in `DEVICES`: id and password (plain or bcrypt).
    pub devices: Vec<(DeviceId, String)>,
    pub cluster: Option<ClusterConfig>,
    /// Where leaf nodes connect ([`leaf_server_config`]), if anywhere.
    pub leafnodes: Option<LeafnodeListener>,
    /// The device protocols served (generation 1 too, until retired).
    pub protocols: DeviceProtocols,
}

/// The hub's `leafnodes {}` block: its listen address and the password of
/// the two users a leaf connects as ([`LEAF_DEVICES_USER`],
/// [`LEAF_SYSTEM_USER`]). One password: a leaf holds both, and every
/// device's credentials besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafnodeListener {
    pub listen: SocketAddr,
    /// Plain text or a bcrypt hash.
    pub password: String,
}

/// The user a leaf binds its `DEVICES` account to the hub's as.
pub const LEAF_DEVICES_USER: &str = "leaf-devices";
/// The user a leaf binds its system account to the hub's as: the hub's
/// CONNZ requests and the leaf's connect/disconnect events cross it.
pub const LEAF_SYSTEM_USER: &str = "leaf-system";
/// The user a leaf of the callout layout binds its `AUTH` account to the
/// hub's as: its authorization requests reach the callout there.
pub const LEAF_AUTH_USER: &str = "leaf-auth";
/// The user a leaf of the callout layout binds its `ENROLL` account to the
/// hub's as: a pending device's request on the leaf reaches the enrollment
/// service there (the hub's `ENROLL` imports it from `AUTH`).
pub const LEAF_ENROLL_USER: &str = "leaf-enroll";

/// The `cluster {}` block of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub name: String,
    /// Route listen address of this node.
    pub listen: SocketAddr,
    /// Route addresses of every node (a route to itself is ignored by the server).
    pub routes: Vec<SocketAddr>,
}

/// The nats-server config text of the fleet layout.
pub fn static_server_config(c: &StaticServerConfig) -> String {
    let mut o = server_lines(
        "static_server_config",
        c.listen,
        c.server_name.as_deref(),
        &c.store_dir,
        c.cluster.as_ref(),
    );
    o.push(format!("system_account: {ACCOUNT_SYSTEM}"));
    o.push("accounts {".to_owned());
    o.extend(system_account_lines(Layout::Static));
    o.extend(fleet_account_lines(
        &c.admin_password,
        c.protocols,
        Layout::Static,
    ));
    let side = DevicesSide::Hub {
        leaves: c.leafnodes.is_some(),
    };
    o.extend(devices_account_lines(&c.devices, c.protocols, side));
    o.push("}".to_owned());
    o.extend(
        c.leafnodes
            .as_ref()
            .map(|l| leafnode_listener_lines(l, false))
            .unwrap_or_default(),
    );
    o.push(String::new());
    o.join("\n")
}

/// The user of the auth callout service in [`ACCOUNT_AUTH`].
pub const CALLOUT_USER: &str = "auth-callout";

/// Everything [`callout_server_config`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalloutServerConfig {
    pub listen: SocketAddr,
    pub server_name: Option<String>,
    pub store_dir: PathBuf,
    /// Password of [`ADMIN_USER`] in `FLEET` (plain text or a bcrypt hash).
    pub admin_password: String,
    /// Password of [`CALLOUT_USER`] in `AUTH` (plain text or a bcrypt hash).
    pub callout_password: String,
    /// The account nkey whose seed signs the callout's responses and users.
    pub issuer: PublicNkey,
    /// A user nkey nothing holds the seed of ([`NONCE_USER_NOTE`]).
    pub nonce_key: PublicNkey,
    pub cluster: Option<ClusterConfig>,
    /// Where leaf nodes connect, if anywhere.
    pub leafnodes: Option<LeafnodeListener>,
    /// The device protocols whose exports and imports are served (the
    /// callout's own config says which permissions it grants).
    pub protocols: DeviceProtocols,
}

/// The nats-server (2.10 and later) config text of the fleet layout with an
/// auth callout: account `AUTH` holds the callout service's user, `FLEET` and
/// `DEVICES` are as in [`static_server_config`] but `DEVICES` has no users of
/// its own. Every client other than the admin and the callout user is handed
/// to the callout, which places it in `DEVICES` with [`device_permissions`].
pub fn callout_server_config(c: &CalloutServerConfig) -> String {
    let mut o = server_lines(
        "callout_server_config",
        c.listen,
        c.server_name.as_deref(),
        &c.store_dir,
        c.cluster.as_ref(),
    );
    o.extend([
        // The bearer token rides in the CONNECT line.
        format!("max_control_line: {NATS_MAX_CONTROL_LINE_BYTES}"),
        format!("system_account: {ACCOUNT_SYSTEM}"),
        "accounts {".to_owned(),
    ]);
    o.extend(auth_account_lines(&c.callout_password, &c.nonce_key));
    o.extend(enroll_account_lines());
    o.extend(system_account_lines(Layout::Callout));
    o.extend(fleet_account_lines(
        &c.admin_password,
        c.protocols,
        Layout::Callout,
    ));
    let side = DevicesSide::Hub {
        leaves: c.leafnodes.is_some(),
    };
    o.extend(devices_account_lines(&[], c.protocols, side));
    o.push("}".to_owned());
    o.extend(
        c.leafnodes
            .as_ref()
            .map(|l| leafnode_listener_lines(l, true))
            .unwrap_or_default(),
    );
    o.extend(callout_authorization_lines(
        &c.issuer,
        &[CALLOUT_USER, ADMIN_USER],
    ));
    o.push(String::new());
    o.join("\n")
}

/// Everything [`leaf_server_config`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafServerConfig {
    /// Client listen address (the devices').
    pub listen: SocketAddr,
    /// `server_name`: unique among the hub's nodes and every leaf (presence
    /// names a device's server by it).
    pub server_name: String,
    /// The hub's leafnode listeners, `host:port` each (every node of the
    /// cluster: the leaf moves to another when it loses one).
    pub hubs: Vec<String>,
    /// The password of the hub's leaf users ([`LeafnodeListener::password`],
    /// in plain text: the leaf sends it).
    pub leaf_password: String,
    /// The same device users as the hub's static layout: a device may
    /// connect to any leaf. None with `callout`.
    pub devices: Vec<(DeviceId, String)>,
    /// The callout layout: devices are handed to the hub's
    /// `fleet-auth-callout` through the bound `AUTH` account.
    pub callout: Option<LeafCallout>,
    pub protocols: DeviceProtocols,
}

/// A leaf of the callout layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafCallout {
    /// The callout's issuer (as in [`CalloutServerConfig::issuer`]).
    pub issuer: PublicNkey,
    /// The password of the leaf's own [`CALLOUT_USER`] in `AUTH`, which
    /// nothing logs in as (the server requires its `auth_users` to
    /// exist): random, kept nowhere else.
    pub local_password: String,
    /// A user nkey whose seed is never kept ([`NONCE_USER_NOTE`]): without
    /// it the leaf sends no nonce, and a device with its own key (the
    /// enrollment method) cannot prove it.
    pub nonce_key: PublicNkey,
}

/// The nats-server config text of a leaf node: no JetStream; account
/// `DEVICES` with the device users and [`device_permissions`] and no
/// imports (a device's requests cross to the hub's `DEVICES`, which
/// imports from `FLEET`); the system account; both bound to the hub's.
/// Every supported server (2.9.10 included).
pub fn leaf_server_config(c: &LeafServerConfig) -> String {
    let mut o = header_lines("leaf_server_config", c.listen);
    o.push(format!("server_name: {}", quoted(&c.server_name)));
    if c.callout.is_some() {
        o.push(format!("max_control_line: {NATS_MAX_CONTROL_LINE_BYTES}"));
    }
    o.extend([
        format!("system_account: {ACCOUNT_SYSTEM}"),
        "accounts {".to_owned(),
        format!("  {ACCOUNT_SYSTEM} {{ }}"),
    ]);
    if let Some(callout) = &c.callout {
        o.extend([
            format!("  {ACCOUNT_AUTH} {{"),
            "    users: [".to_owned(),
            format!(
                "      {{ user: {}, password: {} }}",
                quoted(CALLOUT_USER),
                quoted(&callout.local_password)
            ),
            format!("      # {NONCE_USER_NOTE}"),
            format!(
                "      {{ nkey: {}, permissions: {{ publish: {{ deny: \">\" }}, subscribe: {{ deny: \">\" }} }} }}",
                quoted(&callout.nonce_key.encode())
            ),
            "    ]".to_owned(),
            "  }".to_owned(),
            // Pending devices: their requests cross to the hub's ENROLL.
            format!("  {ACCOUNT_ENROLL} {{ }}"),
        ]);
    }
    let devices: &[(DeviceId, String)] = if c.callout.is_some() { &[] } else { &c.devices };
    o.extend(devices_account_lines(
        devices,
        c.protocols,
        DevicesSide::Leaf,
    ));
    o.extend([
        "}".to_owned(),
        "leafnodes {".to_owned(),
        "  remotes: [".to_owned(),
    ]);
    let mut links = vec![
        (LEAF_DEVICES_USER, ACCOUNT_DEVICES),
        (LEAF_SYSTEM_USER, ACCOUNT_SYSTEM),
    ];
    if c.callout.is_some() {
        links.push((LEAF_AUTH_USER, ACCOUNT_AUTH));
        links.push((LEAF_ENROLL_USER, ACCOUNT_ENROLL));
    }
    for (user, account) in links {
        let urls: Vec<String> = c
            .hubs
            .iter()
            .map(|h| {
                quoted(&format!(
                    "nats-leaf://{user}:{}@{h}",
                    url_escaped(&c.leaf_password)
                ))
            })
            .collect();
        o.push(format!(
            "    {{ urls: [ {} ], account: {account} }}",
            urls.join(", ")
        ));
    }
    o.extend(["  ]".to_owned(), "}".to_owned()]);
    if let Some(callout) = &c.callout {
        o.extend(callout_authorization_lines(
            &callout.issuer,
            &[CALLOUT_USER],
        ));
    }
    o.push(String::new());
    o.join("\n")
}

/// Why the callout layout lists a user nkey whose seed was never kept: a
/// server sends each client a nonce to sign only when it has an nkey user
/// (`always_enable_nonce` is not a config-file option), and a device proves
/// its own nkey to the callout by signing that nonce
/// (`docs/design/enrollment.md`). The user may neither publish nor
/// subscribe, in case its seed were ever found.
pub const NONCE_USER_NOTE: &str =
    "an nkey user whose seed is never kept: the server then sends every client a nonce to sign";

/// Account `AUTH`: the callout service's user, the nonce user, the
/// enrollment service exported to `ENROLL`, and the registry imported from
/// `FLEET`.
fn auth_account_lines(callout_password: &str, nonce_key: &PublicNkey) -> Vec<String> {
    let mut o = vec![
        format!("  {ACCOUNT_AUTH} {{"),
        "    users: [".to_owned(),
        format!(
            "      {{ user: {}, password: {} }}",
            quoted(CALLOUT_USER),
            quoted(callout_password)
        ),
        format!("      # {NONCE_USER_NOTE}"),
        format!(
            "      {{ nkey: {}, permissions: {{ publish: {{ deny: \">\" }}, subscribe: {{ deny: \">\" }} }} }}",
            quoted(&nonce_key.encode())
        ),
        "    ]".to_owned(),
        format!(
            "    exports: [ {{ service: {}, accounts: [{ACCOUNT_ENROLL}] }} ]",
            quoted(&enroll_subjects())
        ),
        "    imports: [".to_owned(),
    ];
    for (subject, to) in &registry_service_exports() {
        let to = to
            .as_deref()
            .map(|t| format!(", to: {}", quoted(t)))
            .unwrap_or_default();
        o.push(format!(
            "      {{ service: {{ account: {ACCOUNT_FLEET}, subject: {} }}{to} }}",
            quoted(subject)
        ));
    }
    o.extend(["    ]".to_owned(), "  }".to_owned()]);
    o
}

/// Account `ENROLL`: no users of its own (the callout places pending
/// devices in it); the enrollment service imported from `AUTH`.
fn enroll_account_lines() -> Vec<String> {
    vec![
        format!("  {ACCOUNT_ENROLL} {{"),
        format!(
            "    imports: [ {{ service: {{ account: {ACCOUNT_AUTH}, subject: {} }} }} ]",
            quoted(&enroll_subjects())
        ),
        "  }".to_owned(),
    ]
}

/// The `authorization {}` block handing every client but `auth_users` to
/// the callout in [`ACCOUNT_AUTH`].
fn callout_authorization_lines(issuer: &PublicNkey, auth_users: &[&str]) -> Vec<String> {
    let users: Vec<String> = auth_users.iter().map(|u| quoted(u)).collect();
    vec![
        "authorization {".to_owned(),
        format!("  timeout: {}", NATS_AUTH_CALLOUT_TIMEOUT.as_secs()),
        "  auth_callout {".to_owned(),
        format!("    issuer: {}", quoted(&issuer.encode())),
        format!("    auth_users: [ {} ]", users.join(", ")),
        format!("    account: {ACCOUNT_AUTH}"),
        "  }".to_owned(),
        "}".to_owned(),
    ]
}

/// The hub's `leafnodes {}` block: one user per account a leaf binds
/// (`AUTH` too in the callout layout).
fn leafnode_listener_lines(l: &LeafnodeListener, callout: bool) -> Vec<String> {
    let mut o = vec![
        "leafnodes {".to_owned(),
        format!("  listen: {}", quoted(&l.listen.to_string())),
        "  authorization {".to_owned(),
        "    users: [".to_owned(),
    ];
    let mut users = vec![
        (LEAF_DEVICES_USER, ACCOUNT_DEVICES),
        (LEAF_SYSTEM_USER, ACCOUNT_SYSTEM),
    ];
    if callout {
        users.push((LEAF_AUTH_USER, ACCOUNT_AUTH));
        users.push((LEAF_ENROLL_USER, ACCOUNT_ENROLL));
    }
    for (user, account) in users {
        o.push(format!(
            "      {{ user: {}, password: {}, account: {account} }}",
            quoted(user),
            quoted(&l.password)
        ));
    }
    o.extend(["    ]".to_owned(), "  }".to_owned(), "}".to_owned()]);
    o
}

/// `s` percent-encoded for the user-info part of a URL (everything but
/// RFC 3986's unreserved characters).
fn url_escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The generator's header, the listen address and the ping settings.
fn header_lines(generator: &str, listen: SocketAddr) -> Vec<String> {
    vec![
        format!("# Generated by fleet_common::nats_config::{generator}: regenerate, do not edit."),
        format!("listen: {}", quoted(&listen.to_string())),
        // The agents' PINGs keep the server's from being sent
        // (limits::SERVER_PING_INTERVAL): an idle device's only traffic.
        format!(
            "ping_interval: \"{}s\"",
            crate::limits::SERVER_PING_INTERVAL.as_secs()
        ),
        format!("ping_max: {}", crate::limits::NATS_MAX_PINGS_OUT),
    ]
}

/// The header, listen address, JetStream store and cluster block.
fn server_lines(
    generator: &str,
    listen: SocketAddr,
    server_name: Option<&str>,
    store_dir: &Path,
    cluster: Option<&ClusterConfig>,
) -> Vec<String> {
    let mut o = header_lines(generator, listen);
    if let Some(name) = server_name {
        o.push(format!("server_name: {}", quoted(name)));
    }
    o.push(format!(
        "jetstream {{ store_dir: {} }}",
        quoted(&store_dir.to_string_lossy())
    ));
    if let Some(cluster) = cluster {
        let routes: Vec<String> = cluster
            .routes
            .iter()
            .map(|r| quoted(&format!("nats-route://{r}")))
            .collect();
        o.extend([
            "cluster {".to_owned(),
            format!("  name: {}", quoted(&cluster.name)),
            format!("  listen: {}", quoted(&cluster.listen.to_string())),
            format!("  routes: [ {} ]", routes.join(", ")),
            "}".to_owned(),
        ]);
    }
    o
}

/// Which layout an account's lines are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// [`static_server_config`]: every server supported, 2.9 included.
    Static,
    /// [`callout_server_config`]: 2.10 and later, the registry in `FLEET`.
    Callout,
}

/// The system account: no users; it exports to `FLEET` the devices' CONNZ
/// (answered by every server, hence `response_type: stream`) and their
/// connect/disconnect events, and, in the callout layout, every server's
/// kick of a connection (`fleetctl device revoke`: 2.10 and later); nothing
/// else of the system (docs/design/presence.md).
fn system_account_lines(layout: Layout) -> Vec<String> {
    let mut o = vec![
        format!("  {ACCOUNT_SYSTEM} {{"),
        "    exports: [".to_owned(),
        format!(
            "      {{ service: {}, accounts: [{ACCOUNT_FLEET}], response_type: stream }}",
            quoted(SYS_DEVICES_CONNZ)
        ),
        format!(
            "      {{ stream: {}, accounts: [{ACCOUNT_FLEET}] }}",
            quoted(SYS_DEVICES_EVENTS)
        ),
    ];
    if layout == Layout::Callout {
        o.push(format!(
            "      {{ service: {}, accounts: [{ACCOUNT_FLEET}] }}",
            quoted(SYS_SERVER_KICK)
        ));
    }
    o.extend(["    ]".to_owned(), "  }".to_owned()]);
    o
}

/// Account `FLEET`: JetStream, the admin user, the exports to `DEVICES`,
/// the imports of presence (and, in the callout layout, of the kick) from
/// the system account, and in the callout layout the registry exported to
/// `AUTH`.
fn fleet_account_lines(
    admin_password: &str,
    protocols: DeviceProtocols,
    layout: Layout,
) -> Vec<String> {
    let mut o = vec![
        format!("  {ACCOUNT_FLEET} {{"),
        "    jetstream: enabled".to_owned(),
        format!(
            "    users: [ {{ user: {}, password: {} }} ]",
            quoted(ADMIN_USER),
            quoted(admin_password)
        ),
        "    imports: [".to_owned(),
        format!(
            "      {{ service: {{ account: {ACCOUNT_SYSTEM}, subject: {} }}, to: {} }}",
            quoted(SYS_DEVICES_CONNZ),
            quoted(PRESENCE_CONNZ)
        ),
        format!(
            "      {{ stream: {{ account: {ACCOUNT_SYSTEM}, subject: {} }}, prefix: {} }}",
            quoted(SYS_DEVICES_EVENTS),
            quoted(PRESENCE_EVENTS_PREFIX)
        ),
    ];
    if layout == Layout::Callout {
        o.push(format!(
            "      {{ service: {{ account: {ACCOUNT_SYSTEM}, subject: {} }}, to: {} }}",
            quoted(SYS_SERVER_KICK),
            quoted(PRESENCE_KICK)
        ));
    }
    o.extend(["    ]".to_owned(), "    exports: [".to_owned()]);
    for (subject, _) in &account_service_exports(protocols) {
        o.push(format!(
            "      {{ service: {}, accounts: [{ACCOUNT_DEVICES}] }}",
            quoted(subject)
        ));
    }
    for subject in &account_stream_exports(protocols) {
        o.push(format!(
            "      {{ stream: {}, accounts: [{ACCOUNT_DEVICES}] }}",
            quoted(subject)
        ));
    }
    if layout == Layout::Callout {
        for (subject, _) in &registry_service_exports() {
            o.push(format!(
                "      {{ service: {}, accounts: [{ACCOUNT_AUTH}] }}",
                quoted(subject)
            ));
        }
    }
    o.extend(["    ]".to_owned(), "  }".to_owned()]);
    o
}

/// Where a `DEVICES` account is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DevicesSide {
    /// The JetStream server's: the imports from `FLEET` (and, with leaf
    /// nodes, the status service as the leaves send it).
    Hub { leaves: bool },
    /// A leaf node's: no imports; status writes mapped to cross the link.
    Leaf,
}

/// Account `DEVICES`: one user per device (none in the callout layout) with
/// exactly [`device_permissions`] ([`leaf_device_permissions`] on a leaf),
/// and on the hub the imports from `FLEET`.
fn devices_account_lines(
    devices: &[(DeviceId, String)],
    protocols: DeviceProtocols,
    side: DevicesSide,
) -> Vec<String> {
    let mut o = vec![format!("  {ACCOUNT_DEVICES} {{")];
    if side == DevicesSide::Leaf {
        let (from, to) = leaf_status_mapping();
        o.push(format!(
            "    mappings: {{ {}: {} }}",
            quoted(&from),
            quoted(&to)
        ));
    }
    let list = |subjects: &[String]| {
        let quoted: Vec<String> = subjects.iter().map(|s| quoted(s)).collect();
        quoted.join(", ")
    };
    if !devices.is_empty() {
        o.push("    users: [".to_owned());
        for (id, password) in devices {
            let p = match side {
                DevicesSide::Hub { .. } => device_permissions(id, protocols),
                DevicesSide::Leaf => leaf_device_permissions(id, protocols),
            };
            o.extend([
                format!(
                    "      {{ user: {}, password: {}, permissions: {{",
                    quoted(id.as_str()),
                    quoted(password)
                ),
                format!(
                    "          publish: {{ allow: [ {} ] }}",
                    list(&p.publish_allow)
                ),
                format!(
                    "          subscribe: {{ allow: [ {} ] }}",
                    list(&p.subscribe_allow)
                ),
                "      } }".to_owned(),
            ]);
        }
        o.push("    ]".to_owned());
    }
    let leaves = match side {
        DevicesSide::Leaf => {
            o.push("  }".to_owned());
            return o;
        }
        DevicesSide::Hub { leaves } => leaves,
    };
    o.push("    imports: [".to_owned());
    for (subject, to) in &account_service_exports(protocols) {
        let to = to
            .as_ref()
            .map(|t| format!(", to: {}", quoted(t)))
            .unwrap_or_default();
        o.push(format!(
            "      {{ service: {{ account: {ACCOUNT_FLEET}, subject: {} }}{to} }}",
            quoted(subject)
        ));
    }
    if leaves {
        o.push(format!(
            "      {{ service: {{ account: {ACCOUNT_FLEET}, subject: {} }}, to: {} }}",
            quoted(&kv_subject(BUCKET_STATUS, "*.>")),
            quoted(&leaf_status_import())
        ));
    }
    for subject in &account_stream_exports(protocols) {
        o.push(format!(
            "      {{ stream: {{ account: {ACCOUNT_FLEET}, subject: {} }} }}",
            quoted(subject)
        ));
    }
    o.extend(["    ]".to_owned(), "  }".to_owned()]);
    o
}

/// A quoted nats-config string. Inside quotes `$` starts no variable; `"`,
/// `\` and control characters are escaped.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii_control() => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One fleet KV bucket and how its stream differs from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSpec {
    pub bucket: &'static str,
    /// Values kept per key.
    pub history: u32,
    /// Whether `Nats-Rollup` headers are honoured. Off for a bucket devices
    /// write: a rollup of `sub` purges every key.
    pub allow_rollup: bool,
    /// Largest value, or `None` for the server's `max_payload`.
    pub max_value_bytes: Option<usize>,
    /// Whether every key change is republished to `fleetkv.<bucket>.<key>`
    /// (the buckets generation-2 devices read).
    pub republish: bool,
    /// Most keys (the stream's `max_msgs`, new ones refused beyond), or
    /// `None` for no bound.
    pub max_keys: Option<u64>,
}

/// The buckets of the fleet (`docs/design/protocol.md` "Buckets and keys").
/// `fleet-desired` serves generation-1 agents until it is retired;
/// `fleet-operator` holds what only the operator reads (labels, staged
/// rollouts); `fleet-registry` and `fleet-lobby` are enrollment's
/// (`docs/design/enrollment.md`).
pub const FLEET_BUCKETS: [BucketSpec; 7] = [
    BucketSpec {
        bucket: BUCKET_WORKLOADS,
        history: 1,
        allow_rollup: true,
        max_value_bytes: Some(MAX_DESIRED_DOC_BYTES),
        republish: true,
        max_keys: None,
    },
    BucketSpec {
        bucket: BUCKET_CONTROL,
        // A short trail of the attempts written to a device.
        history: 5,
        allow_rollup: true,
        max_value_bytes: Some(MAX_KV_VALUE_BYTES),
        republish: true,
        max_keys: None,
    },
    BucketSpec {
        bucket: BUCKET_STATUS,
        history: 1,
        allow_rollup: false,
        max_value_bytes: None,
        republish: false,
        max_keys: None,
    },
    BucketSpec {
        bucket: BUCKET_DESIRED,
        history: 1,
        allow_rollup: true,
        max_value_bytes: Some(MAX_KV_VALUE_BYTES),
        republish: false,
        max_keys: None,
    },
    BucketSpec {
        bucket: BUCKET_REGISTRY,
        // The last few decisions about a device, for the operator's audit.
        history: 5,
        allow_rollup: false,
        max_value_bytes: Some(MAX_KV_VALUE_BYTES),
        republish: false,
        max_keys: None,
    },
    BucketSpec {
        bucket: BUCKET_OPERATOR,
        history: 1,
        allow_rollup: true,
        // A rollout's state lists its devices: up to the server's max_payload.
        max_value_bytes: None,
        republish: false,
        max_keys: None,
    },
    BucketSpec {
        bucket: BUCKET_LOBBY,
        history: 1,
        allow_rollup: false,
        max_value_bytes: Some(LOBBY_TICKET_BYTES),
        republish: false,
        max_keys: Some(MAX_PENDING_DEVICES),
    },
];

/// The `$JS.API.STREAM.UPDATE.KV_<bucket>` request subject (an existing
/// deployment's bucket brought to [`kv_stream_config`]).
pub fn stream_update_subject(bucket: &str) -> String {
    format!("$JS.API.STREAM.UPDATE.{}", stream_name(bucket))
}

/// The `$JS.API.STREAM.INFO.KV_<bucket>` request subject.
pub fn stream_info_subject(bucket: &str) -> String {
    format!("$JS.API.STREAM.INFO.{}", stream_name(bucket))
}

/// The `$JS.API.STREAM.CREATE.KV_<bucket>` request subject.
pub fn stream_create_subject(bucket: &str) -> String {
    format!("$JS.API.STREAM.CREATE.{}", stream_name(bucket))
}

/// The stream config of a bucket, as a KV client creates it (name
/// `KV_<bucket>`, subjects `$KV.<bucket>.>`, one subject per key kept
/// `history` times, deletes through the API denied, new messages discarded
/// when full, direct gets allowed), with `replicas` copies.
pub fn kv_stream_config(spec: &BucketSpec, replicas: u8) -> serde_json::Value {
    let mut config = json!({
        "name": stream_name(spec.bucket),
        "subjects": [kv_subject(spec.bucket, ">")],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": spec.max_keys.map_or(-1, |n| n as i64),
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": spec.history,
        "max_msg_size": spec.max_value_bytes.map_or(-1, |b| b as i64),
        "discard": "new",
        "storage": "file",
        "num_replicas": replicas,
        "duplicate_window": KV_DUPLICATE_WINDOW.as_nanos() as u64,
        "allow_rollup_hdrs": spec.allow_rollup,
        "deny_delete": true,
        "deny_purge": false,
        "allow_direct": true,
    });
    if spec.republish {
        let (src, dest) = republish_config(spec.bucket);
        config["republish"] = json!({"src": src, "dest": dest});
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cluster: Option<ClusterConfig>) -> StaticServerConfig {
        StaticServerConfig {
            listen: "127.0.0.1:4222".parse().expect("addr"),
            server_name: cluster.as_ref().map(|_| "n1".to_owned()),
            store_dir: PathBuf::from("/var/lib/nats/jetstream"),
            admin_password: "adminpw".to_owned(),
            devices: vec![
                (DeviceId::parse("dev1").expect("valid"), "dev1pw".to_owned()),
                (DeviceId::parse("dev2").expect("valid"), "dev2pw".to_owned()),
            ],
            cluster,
            leafnodes: None,
            protocols: DeviceProtocols::WithLegacy,
        }
    }

    #[test]
    fn single_server_config_has_the_reference_layout() {
        let text = static_server_config(&config(None));
        for line in [
            r#"listen: "127.0.0.1:4222""#,
            r#"jetstream { store_dir: "/var/lib/nats/jetstream" }"#,
            "  FLEET {",
            "    jetstream: enabled",
            r#"    users: [ { user: "admin", password: "adminpw" } ]"#,
            r#"      { service: "$JS.API.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.*.>", accounts: [DEVICES] }"#,
            r#"      { service: "$KV.fleet-status.*.>", accounts: [DEVICES] }"#,
            r#"      { stream: "deliver.>", accounts: [DEVICES] }"#,
            "  DEVICES {",
            r#"      { user: "dev1", password: "dev1pw", permissions: {"#,
            r#"          publish: { allow: [ "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.dev1.desired", "fleetapi.DIRECT.GET.KV_fleet-control.$KV.fleet-control.dev1.agent-upgrade-intent", "$KV.fleet-status.dev1.>", "fleetapi.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.dev1.>", "fleetapi.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.dev1.>", "$JS.FC.KV_fleet-desired.>", "$JS.FC.KV_fleet-control.>" ] }"#,
            r#"          subscribe: { allow: [ "_INBOX.dev2.>", "fleetkv.fleet-workloads.dev2.desired", "fleetkv.fleet-control.dev2.agent-upgrade-intent", "deliver.dev2.>" ] }"#,
            r#"      { service: { account: FLEET, subject: "$JS.API.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.*.>" }, to: "fleetapi.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.*.>" }"#,
            r#"      { service: { account: FLEET, subject: "$JS.FC.KV_fleet-desired.>" } }"#,
            r#"      { stream: { account: FLEET, subject: "deliver.>" } }"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing line {line:?} in:\n{text}"
            );
        }
        assert!(!text.contains("cluster"), "{text}");
        assert!(!text.contains("server_name"), "{text}");
        // Seven service exports and two streams, each exported and imported once.
        assert_eq!(text.matches("accounts: [DEVICES]").count(), 9);
        assert_eq!(text.matches("{ account: FLEET").count(), 9);
        // Braces and brackets balance.
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert_eq!(text.matches('[').count(), text.matches(']').count());
    }

    #[test]
    fn static_config_output_is_unchanged_by_the_callout_variant() {
        // The exact text of a one-device config: a change here is a change
        // of every deployed static config (generation 2 reads were added in
        // front; generation 1's lines are unchanged).
        let mut c = config(None);
        c.devices.truncate(1);
        let expected = [
            "# Generated by fleet_common::nats_config::static_server_config: regenerate, do not edit.",
            r#"listen: "127.0.0.1:4222""#,
            r#"ping_interval: "240s""#,
            "ping_max: 2",
            r#"jetstream { store_dir: "/var/lib/nats/jetstream" }"#,
            "system_account: SYS",
            "accounts {",
            "  SYS {",
            "    exports: [",
            r#"      { service: "$SYS.REQ.ACCOUNT.DEVICES.CONNZ", accounts: [FLEET], response_type: stream }"#,
            r#"      { stream: "$SYS.ACCOUNT.DEVICES.*", accounts: [FLEET] }"#,
            "    ]",
            "  }",
            "  FLEET {",
            "    jetstream: enabled",
            r#"    users: [ { user: "admin", password: "adminpw" } ]"#,
            "    imports: [",
            r#"      { service: { account: SYS, subject: "$SYS.REQ.ACCOUNT.DEVICES.CONNZ" }, to: "fleetpresence.CONNZ" }"#,
            r#"      { stream: { account: SYS, subject: "$SYS.ACCOUNT.DEVICES.*" }, prefix: "fleetpresence" }"#,
            "    ]",
            "    exports: [",
            r#"      { service: "$JS.API.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.*.desired", accounts: [DEVICES] }"#,
            r#"      { service: "$JS.API.DIRECT.GET.KV_fleet-control.$KV.fleet-control.*.agent-upgrade-intent", accounts: [DEVICES] }"#,
            r#"      { service: "$KV.fleet-status.*.>", accounts: [DEVICES] }"#,
            r#"      { service: "$JS.API.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.*.>", accounts: [DEVICES] }"#,
            r#"      { service: "$JS.API.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.*.>", accounts: [DEVICES] }"#,
            r#"      { service: "$JS.FC.KV_fleet-desired.>", accounts: [DEVICES] }"#,
            r#"      { service: "$JS.FC.KV_fleet-control.>", accounts: [DEVICES] }"#,
            r#"      { stream: "fleetkv.>", accounts: [DEVICES] }"#,
            r#"      { stream: "deliver.>", accounts: [DEVICES] }"#,
            "    ]",
            "  }",
            "  DEVICES {",
            "    users: [",
            r#"      { user: "dev1", password: "dev1pw", permissions: {"#,
            r#"          publish: { allow: [ "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.dev1.desired", "fleetapi.DIRECT.GET.KV_fleet-control.$KV.fleet-control.dev1.agent-upgrade-intent", "$KV.fleet-status.dev1.>", "fleetapi.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.dev1.>", "fleetapi.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.dev1.>", "$JS.FC.KV_fleet-desired.>", "$JS.FC.KV_fleet-control.>" ] }"#,
            r#"          subscribe: { allow: [ "_INBOX.dev1.>", "fleetkv.fleet-workloads.dev1.desired", "fleetkv.fleet-control.dev1.agent-upgrade-intent", "deliver.dev1.>" ] }"#,
            "      } }",
            "    ]",
            "    imports: [",
            r#"      { service: { account: FLEET, subject: "$JS.API.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.*.desired" }, to: "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.*.desired" }"#,
            r#"      { service: { account: FLEET, subject: "$JS.API.DIRECT.GET.KV_fleet-control.$KV.fleet-control.*.agent-upgrade-intent" }, to: "fleetapi.DIRECT.GET.KV_fleet-control.$KV.fleet-control.*.agent-upgrade-intent" }"#,
            r#"      { service: { account: FLEET, subject: "$KV.fleet-status.*.>" } }"#,
            r#"      { service: { account: FLEET, subject: "$JS.API.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.*.>" }, to: "fleetapi.CONSUMER.CREATE.KV_fleet-desired.*.$KV.fleet-desired.*.>" }"#,
            r#"      { service: { account: FLEET, subject: "$JS.API.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.*.>" }, to: "fleetapi.CONSUMER.CREATE.KV_fleet-control.*.$KV.fleet-control.*.>" }"#,
            r#"      { service: { account: FLEET, subject: "$JS.FC.KV_fleet-desired.>" } }"#,
            r#"      { service: { account: FLEET, subject: "$JS.FC.KV_fleet-control.>" } }"#,
            r#"      { stream: { account: FLEET, subject: "fleetkv.>" } }"#,
            r#"      { stream: { account: FLEET, subject: "deliver.>" } }"#,
            "    ]",
            "  }",
            "}",
            "",
        ]
        .join("\n");
        assert_eq!(static_server_config(&c), expected);
    }

    #[test]
    fn callout_config_hands_devices_to_the_callout() {
        let issuer = PublicNkey::parse_kind(
            "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2",
            crate::nkey::NkeyKind::Account,
        )
        .expect("published account key");
        let text = callout_server_config(&CalloutServerConfig {
            listen: "127.0.0.1:4222".parse().expect("addr"),
            server_name: None,
            store_dir: PathBuf::from("/var/lib/nats/jetstream"),
            admin_password: "adminpw".to_owned(),
            callout_password: "calloutpw".to_owned(),
            issuer,
            nonce_key: crate::nkey::NkeySeed::generate(crate::nkey::NkeyKind::User)
                .expect("user key")
                .public_key(),
            cluster: None,
            leafnodes: None,
            protocols: DeviceProtocols::WithLegacy,
        });
        for line in [
            "# Generated by fleet_common::nats_config::callout_server_config: regenerate, do not edit.",
            "  AUTH {",
            r#"      { user: "auth-callout", password: "calloutpw" }"#,
            r#"    users: [ { user: "admin", password: "adminpw" } ]"#,
            r#"    exports: [ { service: "fleetenroll.key.*", accounts: [ENROLL] } ]"#,
            r#"      { service: { account: FLEET, subject: "$KV.fleet-registry.>" } }"#,
            r#"      { service: "$KV.fleet-registry.>", accounts: [AUTH] }"#,
            r#"      { service: { account: FLEET, subject: "$KV.fleet-lobby.>" } }"#,
            r#"      { service: "$KV.fleet-lobby.>", accounts: [AUTH] }"#,
            "  ENROLL {",
            r#"    imports: [ { service: { account: AUTH, subject: "fleetenroll.key.*" } } ]"#,
            "  DEVICES {",
            r#"      { stream: { account: FLEET, subject: "deliver.>" } }"#,
            "max_control_line: 12288",
            "authorization {",
            "  timeout: 5",
            "  auth_callout {",
            r#"    issuer: "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2""#,
            r#"    auth_users: [ "auth-callout", "admin" ]"#,
            "    account: AUTH",
            r#"      { service: "$SYS.REQ.SERVER.*.KICK", accounts: [FLEET] }"#,
            r#"      { service: { account: SYS, subject: "$SYS.REQ.SERVER.*.KICK" }, to: "fleetpresence.KICK.*" }"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing line {line:?} in:\n{text}"
            );
        }
        // No static device users, no permissions: the callout issues them.
        // The one nkey user (for the nonce) may do nothing.
        assert_eq!(text.matches("permissions").count(), 1, "{text}");
        assert!(
            text.contains(r#"permissions: { publish: { deny: ">" }, subscribe: { deny: ">" } }"#)
        );
        assert_eq!(text.matches("    users: [").count(), 2, "{text}");
        assert_eq!(text.matches("accounts: [DEVICES]").count(), 9);
        assert_eq!(
            text.matches("{ account: FLEET").count(),
            13,
            "four of them the registry (leader read, Direct Get, writes) and the lobby, imported by AUTH"
        );
        assert!(text.contains(
            r#"{ service: { account: FLEET, subject: "$JS.API.STREAM.MSG.GET.KV_fleet-registry" }, to: "fleetapi.STREAM.MSG.GET.KV_fleet-registry" }"#
        ));
        assert!(text.contains(
            r#"{ service: "$JS.API.STREAM.MSG.GET.KV_fleet-registry", accounts: [AUTH] }"#
        ));
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert_eq!(text.matches('[').count(), text.matches(']').count());
    }

    #[test]
    fn cluster_block_lists_every_route() {
        let text = static_server_config(&config(Some(ClusterConfig {
            name: "fleet".to_owned(),
            listen: "127.0.0.1:6222".parse().expect("addr"),
            routes: vec![
                "127.0.0.1:6222".parse().expect("addr"),
                "127.0.0.1:6223".parse().expect("addr"),
            ],
        })));
        for line in [
            r#"server_name: "n1""#,
            "cluster {",
            r#"  name: "fleet""#,
            r#"  listen: "127.0.0.1:6222""#,
            r#"  routes: [ "nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223" ]"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing line {line:?} in:\n{text}"
            );
        }
    }

    #[test]
    fn a_hub_listens_for_leaves_and_a_leaf_binds_devices_and_system() {
        let mut hub = config(None);
        hub.leafnodes = Some(LeafnodeListener {
            listen: "0.0.0.0:7422".parse().expect("addr"),
            password: "leafpw".to_owned(),
        });
        let text = static_server_config(&hub);
        let listener = [
            "leafnodes {",
            r#"  listen: "0.0.0.0:7422""#,
            "  authorization {",
            "    users: [",
            r#"      { user: "leaf-devices", password: "leafpw", account: DEVICES }"#,
            r#"      { user: "leaf-system", password: "leafpw", account: SYS }"#,
            "    ]",
            "  }",
            "}",
            "",
        ]
        .join("\n");
        assert!(text.ends_with(&listener), "{text}");
        assert!(text.lines().any(|l| l
            == r#"      { service: { account: FLEET, subject: "$KV.fleet-status.*.>" }, to: "fleetstatus.*.>" }"#), "{text}");
        assert!(!static_server_config(&config(None)).contains("leafnodes"));

        let leaf = leaf_server_config(&LeafServerConfig {
            listen: "0.0.0.0:4222".parse().expect("addr"),
            server_name: "leaf-1".to_owned(),
            hubs: vec!["hub1.example:7422".to_owned(), "10.0.0.2:7422".to_owned()],
            leaf_password: "p@ss w/rd".to_owned(),
            devices: config(None).devices,
            callout: None,
            protocols: DeviceProtocols::Current,
        });
        for line in [
            "# Generated by fleet_common::nats_config::leaf_server_config: regenerate, do not edit.",
            r#"listen: "0.0.0.0:4222""#,
            r#"ping_interval: "240s""#,
            r#"server_name: "leaf-1""#,
            "system_account: SYS",
            "  SYS { }",
            "  DEVICES {",
            r#"    mappings: { "$KV.fleet-status.*.>": "fleetstatus.$1.>" }"#,
            r#"          subscribe: { allow: [ "_INBOX.dev2.>", "fleetkv.fleet-workloads.dev2.desired", "fleetkv.fleet-control.dev2.agent-upgrade-intent" ] }"#,
            r#"    { urls: [ "nats-leaf://leaf-devices:p%40ss%20w%2Frd@hub1.example:7422", "nats-leaf://leaf-devices:p%40ss%20w%2Frd@10.0.0.2:7422" ], account: DEVICES }"#,
            r#"    { urls: [ "nats-leaf://leaf-system:p%40ss%20w%2Frd@hub1.example:7422", "nats-leaf://leaf-system:p%40ss%20w%2Frd@10.0.0.2:7422" ], account: SYS }"#,
        ] {
            assert!(
                leaf.lines().any(|l| l == line),
                "missing line {line:?} in:\n{leaf}"
            );
        }
        // A device's status keys as the leaf maps them, its own only.
        assert!(
            leaf.contains(r#""$KV.fleet-status.dev1.>", "fleetstatus.dev1.>""#),
            "{leaf}"
        );
        assert_eq!(leaf.matches("fleetstatus.dev").count(), 2, "{leaf}");
        // No JetStream, no FLEET, no imports: a device's requests cross to
        // the hub's DEVICES.
        for absent in ["jetstream", "FLEET", "imports", "admin"] {
            assert!(!leaf.contains(absent), "{absent} in:\n{leaf}");
        }
        assert_eq!(leaf.matches('{').count(), leaf.matches('}').count());
        assert_eq!(leaf.matches('[').count(), leaf.matches(']').count());
    }

    #[test]
    fn a_callout_hub_and_leaf_bind_auth_too() {
        let issuer = PublicNkey::parse_kind(
            "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2",
            crate::nkey::NkeyKind::Account,
        )
        .expect("published account key");
        let hub = callout_server_config(&CalloutServerConfig {
            listen: "127.0.0.1:4222".parse().expect("addr"),
            server_name: Some("hub".to_owned()),
            store_dir: PathBuf::from("/var/lib/nats/jetstream"),
            admin_password: "adminpw".to_owned(),
            callout_password: "calloutpw".to_owned(),
            issuer: issuer.clone(),
            nonce_key: crate::nkey::NkeySeed::generate(crate::nkey::NkeyKind::User)
                .expect("user key")
                .public_key(),
            cluster: None,
            leafnodes: Some(LeafnodeListener {
                listen: "0.0.0.0:7422".parse().expect("addr"),
                password: "leafpw".to_owned(),
            }),
            protocols: DeviceProtocols::Current,
        });
        // The listener follows the accounts block, before authorization.
        let accounts_end = hub
            .find("\n}\nleafnodes {")
            .expect("listener after the accounts");
        assert!(
            accounts_end < hub.find("authorization {").expect("authorization"),
            "{hub}"
        );
        assert!(
            hub.contains(r#"      { user: "leaf-auth", password: "leafpw", account: AUTH }"#),
            "{hub}"
        );
        assert!(
            hub.contains(r#"      { user: "leaf-enroll", password: "leafpw", account: ENROLL }"#),
            "{hub}"
        );
        assert!(hub.contains(r#"to: "fleetstatus.*.>""#), "{hub}");

        let leaf = leaf_server_config(&LeafServerConfig {
            listen: "0.0.0.0:4222".parse().expect("addr"),
            server_name: "leaf-1".to_owned(),
            hubs: vec!["hub:7422".to_owned()],
            leaf_password: "leafpw".to_owned(),
            devices: config(None).devices,
            callout: Some(LeafCallout {
                issuer,
                local_password: "localpw".to_owned(),
                nonce_key: crate::nkey::NkeySeed::generate(crate::nkey::NkeyKind::User)
                    .expect("nkey")
                    .public_key(),
            }),
            protocols: DeviceProtocols::Current,
        });
        for line in [
            "max_control_line: 12288",
            "  AUTH {",
            r#"      { user: "auth-callout", password: "localpw" }"#,
            "  ENROLL { }",
            r#"    { urls: [ "nats-leaf://leaf-auth:leafpw@hub:7422" ], account: AUTH }"#,
            r#"    { urls: [ "nats-leaf://leaf-enroll:leafpw@hub:7422" ], account: ENROLL }"#,
            "  auth_callout {",
            r#"    auth_users: [ "auth-callout" ]"#,
            "    account: AUTH",
        ] {
            assert!(
                leaf.lines().any(|l| l == line),
                "missing {line:?} in:\n{leaf}"
            );
        }
        // The callout issues the users: none listed, even if given.
        assert_eq!(
            leaf.matches("permissions").count(),
            1,
            "the nonce user's only:\n{leaf}"
        );
        assert!(!leaf.contains("calloutpw"), "{leaf}");
        assert_eq!(leaf.matches('{').count(), leaf.matches('}').count());
    }

    #[test]
    fn strings_are_quoted_and_escaped() {
        assert_eq!(quoted("plain"), r#""plain""#);
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quoted("$VAR"), r#""$VAR""#);
        assert_eq!(quoted("a\nb\x01"), r#""a\nb\x01""#);
        let mut c = config(None);
        c.admin_password = "p\"w".to_owned();
        assert!(static_server_config(&c).contains(r#"password: "p\"w""#));
    }

    #[test]
    fn status_stream_refuses_rollups_and_others_keep_kv_shape() {
        let [workloads, control, status, desired, registry, operator, lobby] = FLEET_BUCKETS;
        assert_eq!(registry.bucket, BUCKET_REGISTRY);
        assert_eq!(kv_stream_config(&registry, 3)["max_msgs"], -1);
        // The lobby holds at most so many tickets and refuses new ones.
        let l = kv_stream_config(&lobby, 3);
        assert_eq!(l["name"], "KV_fleet-lobby");
        assert_eq!(l["max_msgs"], MAX_PENDING_DEVICES as i64);
        assert_eq!(l["max_msgs_per_subject"], 1);
        assert_eq!(l["discard"], "new");
        assert_eq!(l["deny_purge"], false, "fleetctl frees tickets by purging");
        let o = kv_stream_config(&operator, 1);
        assert_eq!(o["name"], "KV_fleet-operator");
        assert!(o.get("republish").is_none(), "{o}");
        assert_eq!(status.bucket, "fleet-status");
        let s = kv_stream_config(&status, 3);
        assert_eq!(s["name"], "KV_fleet-status");
        assert_eq!(s["subjects"], json!(["$KV.fleet-status.>"]));
        assert_eq!(s["allow_rollup_hdrs"], false);
        assert_eq!(s["deny_delete"], true);
        assert_eq!(s["allow_direct"], true);
        assert_eq!(s["num_replicas"], 3);
        assert_eq!(s["max_msgs_per_subject"], 1);
        assert_eq!(s["max_msg_size"], -1);
        assert_eq!(s["discard"], "new");
        assert!(s.get("republish").is_none(), "{s}");
        let w = kv_stream_config(&workloads, 3);
        assert_eq!(w["name"], "KV_fleet-workloads");
        assert_eq!(w["max_msg_size"], MAX_DESIRED_DOC_BYTES as i64);
        assert_eq!(
            w["republish"],
            json!({"src": "$KV.fleet-workloads.>", "dest": "fleetkv.fleet-workloads.>"})
        );
        assert_eq!(
            kv_stream_config(&control, 3)["republish"],
            json!({"src": "$KV.fleet-control.>", "dest": "fleetkv.fleet-control.>"})
        );
        let d = kv_stream_config(&desired, 1);
        assert!(d.get("republish").is_none(), "{d}");
        assert_eq!(d["name"], "KV_fleet-desired");
        assert_eq!(d["allow_rollup_hdrs"], true);
        assert_eq!(d["max_msg_size"], MAX_KV_VALUE_BYTES as i64);
        assert_eq!(control.bucket, "fleet-control");
        assert!(control.history >= 1);
        assert_eq!(
            stream_create_subject(status.bucket),
            "$JS.API.STREAM.CREATE.KV_fleet-status"
        );
    }
}
