//! The validated configuration: what the rest of the agent reads.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use fleet_common::limits::{
    CHECK_INTERVAL, HEARTBEAT_INTERVAL, KEEPALIVE_INTERVAL, NATS_MAX_PINGS_OUT, NATS_PING_INTERVAL,
    TRAFFIC_REPORT_INTERVAL,
};
use fleet_common::validate::{DeviceId, HttpsUrl};

/// A secret read from a file. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(super) String);

impl Secret {
    /// Wraps a secret that did not come from a file (a bearer token).
    pub fn new(s: String) -> Self {
        Self(s)
    }

    /// The secret itself, to send it; never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// How the agent authenticates to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A `.creds` file (JWT and nkey seed), read by the NATS client.
    Creds(PathBuf),
    /// The TLS client certificate in `nats.tls` is the identity.
    TlsCertificate,
    /// A bearer token from the identity provider, presented as the NATS
    /// token to the auth callout and renewed before it expires.
    OAuth2(ClientCredentials),
    /// The device's own nkey (generated on first boot in the state
    /// directory) and the fleet's enrollment token: the auth callout admits
    /// the key once the fleet approved it (`docs/design/enrollment.md`).
    Enrollment {
        token: Secret,
        /// The identity seed, set by the daemon once loaded or generated
        /// (`crate::enroll`); `None` straight from the config file.
        seed: Option<Secret>,
    },
}

/// `oauth2-client-credentials`: what identifies the device to the identity
/// provider's token endpoint (RFC 6749 section 4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCredentials {
    /// The token endpoint (Zitadel: `<issuer>/oauth/v2/token`).
    pub token_url: HttpsUrl,
    pub client_id: String,
    pub client_secret: Secret,
    /// Space-separated scopes, if any.
    pub scope: Option<String>,
    /// Sent as the `audience` form parameter, if any.
    pub audience: Option<String>,
    /// The only CA trusted for the token endpoint; absent: the system roots.
    pub ca_file: Option<PathBuf>,
}

impl NatsAuth {
    pub fn method(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::UserPassword { .. } => "user-password",
            Self::Token(_) => "token",
            Self::Creds(_) => "creds",
            Self::TlsCertificate => "tls-certificate",
            Self::OAuth2(_) => "oauth2-client-credentials",
            Self::Enrollment { .. } => "enrollment",
        }
    }
}

/// A client certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `nats.tls`: present means TLS is required on every server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// The CA the servers' certificates must chain to; when set, it is the
    /// only one trusted (absent: the system's roots).
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<ClientCert>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port` or `tls://host:port`, tried in random order.
    pub servers: Vec<String>,
    pub auth: NatsAuth,
    pub tls: Option<Tls>,
}

/// How podman is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodmanSettings {
    pub binary: PathBuf,
    pub global_args: Vec<String>,
    pub containers_conf: Option<PathBuf>,
    pub pull_timeout: Duration,
    pub command_timeout: Duration,
}

/// Whether this device runs workloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodmanMode {
    Enabled(PodmanSettings),
    /// The agent reports and forwards upgrades but runs no containers.
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intervals {
    /// How often the status thread looks for a change in what the heartbeat
    /// carries; the change freeze's disconnect window.
    pub heartbeat: Duration,
    /// The heartbeat written although nothing changed.
    pub keepalive: Duration,
    /// The NATS client's PING after this long without a word from the server.
    pub ping: Duration,
    /// Unanswered PINGs before the connection is taken as dead.
    pub max_pings_out: u8,
    pub resync: Duration,
    /// The periodic backstop read of the keys the agent follows.
    pub check: Duration,
    /// How often the traffic counters are written.
    pub traffic: Duration,
}

impl Default for Intervals {
    fn default() -> Self {
        Self {
            heartbeat: HEARTBEAT_INTERVAL,
            keepalive: KEEPALIVE_INTERVAL,
            ping: NATS_PING_INTERVAL,
            max_pings_out: NATS_MAX_PINGS_OUT,
            resync: Duration::from_secs(30),
            check: CHECK_INTERVAL,
            traffic: TRAFFIC_REPORT_INTERVAL,
        }
    }
}

/// The whole validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub device_id: DeviceId,
    pub nats: NatsConfig,
    pub podman: PodmanMode,
    pub intervals: Intervals,
    pub root: PathBuf,
}
