//! The agent's configuration: one JSON file (default
//! `/etc/harmony-fleet/agent.json`), parsed once at start into validated
//! types. Unknown keys are refused at every level, and every error names the
//! key by its path (`nats.auth.password-file`) and says what to write
//! instead. Secrets are read from files named in the config, never written
//! inline, and never logged.
//!
//! ```json
//! {
//!   "device-id": "dev1",
//!   "nats": {
//!     "servers": ["tls://nats1.example.com:4222", "tls://nats2.example.com:4222"],
//!     "auth": {"method": "user-password", "user": "dev1",
//!              "password-file": "/etc/harmony-fleet/nats-password"},
//!     "tls": {"ca-file": "/etc/harmony-fleet/nats-ca.pem"}
//!   },
//!   "podman": {"enabled": true, "binary": "podman"},
//!   "intervals": {"keepalive-secs": 3600, "ping-secs": 200, "check-secs": 21600},
//!   "root": "/"
//! }
//! ```
//!
//! `nats.auth.method` is one of `none`, `user-password` (`user`,
//! `password-file`), `token` (`token-file`), `creds` (`creds-file`),
//! `tls-certificate` (needs `nats.tls.client-cert-file` and
//! `client-key-file`) or `oauth2-client-credentials` (`token-url`,
//! `client-id`, `client-secret-file`, optional `scope`, `audience`,
//! `ca-file`: the agent gets a bearer token from the identity provider and
//! presents it to the NATS auth callout, see [`crate::oauth`]). See
//! [`DEFAULTS`] for every optional key.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_common::durable::{self, DurableError};
use fleet_common::limits::{
    CHECK_INTERVAL, HEARTBEAT_INTERVAL, KEEPALIVE_INTERVAL, NATS_MAX_PINGS_OUT, NATS_PING_INTERVAL,
    TRAFFIC_REPORT_INTERVAL,
};
use fleet_common::validate::{DeviceId, HttpsUrl, ValidationError};
use fleet_common::Layout;
use serde_json::{Map, Value};

/// The largest config file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// The largest secret (password, token) file read.
const MAX_SECRET_BYTES: u64 = 16 * 1024;
/// Longest OAuth2 client ID, scope or audience accepted.
const MAX_OAUTH_PARAM_BYTES: usize = 1024;
/// NATS servers one config may list (a cluster and its gateways).
const MAX_SERVERS: usize = 16;
/// Extra arguments to podman (storage options).
const MAX_PODMAN_ARGS: usize = 32;

/// Optional keys and their defaults, for `--help` and the README.
pub const DEFAULTS: &str = "\
  nats.auth.scope             absent (oauth2-client-credentials: space-separated scopes;
                              Zitadel: \"openid urn:zitadel:iam:org:project:id:<id>:aud\")
  nats.auth.audience          absent (oauth2-client-credentials: sent as the audience
                              form parameter)
  nats.auth.ca-file           absent (oauth2-client-credentials: the only CA trusted for
                              the token endpoint; else the system roots)
  nats.tls                    absent (plain nats:// unless a server URL is tls://);
                              present: TLS required; ca-file, when given, is the only
                              CA trusted (else the system roots)
  podman.enabled              true
  podman.binary               \"podman\"
  podman.global-args          []  (e.g. [\"--root\", \"/var/lib/containers/storage\"])
  podman.containers-conf      absent (CONTAINERS_CONF for every podman call)
  podman.pull-timeout-secs    300
  podman.command-timeout-secs 60
  intervals.heartbeat-secs    30  (how often the agent looks for a change in what its
                              heartbeat carries, written at once when it changed; also
                              the change freeze's disconnect window. Writes nothing by
                              itself: agents before 0.3.0 wrote the heartbeat this often)
  intervals.keepalive-secs    3600 (the heartbeat written anyway when nothing changed)
  intervals.ping-secs         200 (NATS PING after this long without a word from the
                              server, and between unanswered ones: keeps NAT mappings
                              alive; the server's ping_interval should not be shorter)
  intervals.ping-max-outstanding 2 (unanswered PINGs before the link is taken as dead:
                              a silent link is detected within (this + 1) × ping-secs)
  intervals.resync-secs       30  (live containers checked: re-read when one's
                              process changed, and in full every 10th interval)
  intervals.check-secs        21600 (desired state and upgrade intent read again, ± a
                              fifth, besides every republished change: bounds how long a
                              lost last change can go unseen)
  intervals.traffic-secs      21600 (the traffic counters written, <device>.traffic)
  intervals.idle-heartbeat-secs accepted and ignored (agent 0.1.0's consumer heartbeat)
  root                        \"/\" (prefix of every managed path)";

/// A secret read from a file. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

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

impl Config {
    pub fn layout(&self) -> Layout {
        Layout::with_root(&self.root)
    }

    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes =
            durable::read_bounded(path, MAX_CONFIG_BYTES).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
        Self::parse(path, &bytes)
    }

    /// Validates config bytes; `path` is only named in errors and used to
    /// resolve nothing (every path in the file must be absolute).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|source| ConfigError::Json {
            path: path.to_owned(),
            source,
        })?;
        parse_root(value).map_err(|e| ConfigError::Key {
            path: path.to_owned(),
            key: e.key,
            problem: e.problem,
        })
    }
}

/// A config that cannot be used.
#[derive(Debug)]
pub enum ConfigError {
    Read {
        path: PathBuf,
        source: DurableError,
    },
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    Key {
        path: PathBuf,
        key: String,
        problem: String,
    },
}

impl ConfigError {
    /// The dotted key the error is about, when it is about one.
    #[cfg(test)]
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Key { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => write!(
                f,
                "reading config {}: {source}; pass another file with --config",
                path.display()
            ),
            Self::Json { path, source } => {
                write!(f, "config {} is not valid JSON: {source}", path.display())
            }
            Self::Key { path, key, problem } => {
                write!(f, "config {}: {key}: {problem}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// A problem with one key, before the file path is attached.
#[derive(Debug)]
struct KeyError {
    key: String,
    problem: String,
}

/// One JSON object of the config, consumed key by key; [`Obj::finish`]
/// refuses whatever is left.
struct Obj {
    prefix: String,
    map: Map<String, Value>,
    known: Vec<&'static str>,
}

impl Obj {
    fn new(prefix: &str, value: Value) -> Result<Obj, KeyError> {
        match value {
            Value::Object(map) => Ok(Obj {
                prefix: prefix.to_owned(),
                map,
                known: Vec::new(),
            }),
            other => Err(KeyError {
                key: if prefix.is_empty() {
                    "(top level)".to_owned()
                } else {
                    prefix.to_owned()
                },
                problem: format!("expected an object {{...}}, found {}", kind(&other)),
            }),
        }
    }

    fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    fn err(&self, key: &str, problem: impl Into<String>) -> KeyError {
        KeyError {
            key: self.path(key),
            problem: problem.into(),
        }
    }

    fn take(&mut self, key: &'static str) -> Option<Value> {
        self.known.push(key);
        self.map.remove(key)
    }

    fn required(&mut self, key: &'static str) -> Result<Value, KeyError> {
        self.take(key)
            .ok_or_else(|| self.err(key, "missing: this key is required"))
    }

    fn string(&mut self, key: &'static str, v: Value) -> Result<String, KeyError> {
        match v {
            Value::String(s) if !s.is_empty() => Ok(s),
            Value::String(_) => Err(self.err(key, "must not be empty")),
            other => Err(self.err(key, format!("expected a string, found {}", kind(&other)))),
        }
    }

    fn req_string(&mut self, key: &'static str) -> Result<String, KeyError> {
        let v = self.required(key)?;
        self.string(key, v)
    }

    fn opt_string(&mut self, key: &'static str) -> Result<Option<String>, KeyError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => self.string(key, v).map(Some),
        }
    }

    fn abs_path(&mut self, key: &'static str, v: String) -> Result<PathBuf, KeyError> {
        if v.starts_with('/') && !v.contains('\0') {
            Ok(PathBuf::from(v))
        } else {
            Err(self.err(
                key,
                format!("{v:?} is not an absolute path: write it starting with '/'"),
            ))
        }
    }

    fn req_path(&mut self, key: &'static str) -> Result<PathBuf, KeyError> {
        let v = self.req_string(key)?;
        self.abs_path(key, v)
    }

    fn opt_path(&mut self, key: &'static str) -> Result<Option<PathBuf>, KeyError> {
        match self.opt_string(key)? {
            None => Ok(None),
            Some(v) => self.abs_path(key, v).map(Some),
        }
    }

    fn opt_bool(&mut self, key: &'static str, default: bool) -> Result<bool, KeyError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(other) => Err(self.err(
                key,
                format!("expected true or false, found {}", kind(&other)),
            )),
        }
    }

    /// Whole seconds within `min..=max`.
    fn secs(
        &mut self,
        key: &'static str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<Duration, KeyError> {
        self.whole(key, default, min, max, "seconds")
            .map(Duration::from_secs)
    }

    /// A whole number of `unit` in `min..=max`.
    fn whole(
        &mut self,
        key: &'static str,
        default: u64,
        min: u64,
        max: u64,
        unit: &str,
    ) -> Result<u64, KeyError> {
        let n = match self.take(key) {
            None => default,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(n) => n,
                None => {
                    return Err(self.err(key, format!("expected whole {unit}, found {n}")));
                }
            },
            Some(other) => {
                return Err(self.err(
                    key,
                    format!("expected a number of {unit}, found {}", kind(&other)),
                ));
            }
        };
        if n < min || n > max {
            return Err(self.err(
                key,
                format!("{n} is out of range: use {min} to {max} {unit}"),
            ));
        }
        Ok(n)
    }

    fn strings(
        &mut self,
        key: &'static str,
        v: Value,
        max: usize,
    ) -> Result<Vec<String>, KeyError> {
        let Value::Array(items) = v else {
            return Err(self.err(
                key,
                format!("expected a list of strings, found {}", kind(&v)),
            ));
        };
        if items.len() > max {
            return Err(self.err(key, format!("{} entries: at most {max}", items.len())));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Value::String(s) if !s.is_empty() && !s.contains('\0') && s.len() <= 4096 => {
                    out.push(s)
                }
                other => {
                    return Err(self.err(
                        key,
                        format!(
                            "entry {i} must be a non-empty string of at most 4096 bytes, found {}",
                            kind(&other)
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }

    fn object(&mut self, key: &'static str, v: Value) -> Result<Obj, KeyError> {
        Obj::new(&self.path(key), v)
    }

    /// Refuses keys nobody took.
    fn finish(self) -> Result<(), KeyError> {
        let mut unknown: Vec<&String> = self.map.keys().collect();
        unknown.sort();
        match unknown.first() {
            None => Ok(()),
            Some(k) => Err(KeyError {
                key: self.path(k),
                problem: format!(
                    "unknown key: the keys allowed here are {}",
                    self.known.join(", ")
                ),
            }),
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn parse_root(value: Value) -> Result<Config, KeyError> {
    let mut top = Obj::new("", value)?;
    let device = top.req_string("device-id")?;
    let device_id = DeviceId::parse(&device).map_err(|e| top.err("device-id", e.to_string()))?;
    let nats_v = top.required("nats")?;
    let nats = parse_nats(top.object("nats", nats_v)?)?;
    let podman = match top.take("podman") {
        None => parse_podman(Obj::new("podman", Value::Object(Map::new()))?)?,
        Some(v) => parse_podman(top.object("podman", v)?)?,
    };
    let intervals = match top.take("intervals") {
        None => parse_intervals(Obj::new("intervals", Value::Object(Map::new()))?)?,
        Some(v) => parse_intervals(top.object("intervals", v)?)?,
    };
    let root = top.opt_path("root")?.unwrap_or_else(|| PathBuf::from("/"));
    top.finish()?;
    Ok(Config {
        device_id,
        nats,
        podman,
        intervals,
        root,
    })
}

fn parse_nats(mut o: Obj) -> Result<NatsConfig, KeyError> {
    let servers_v = o.required("servers")?;
    let servers = o.strings("servers", servers_v, MAX_SERVERS)?;
    if servers.is_empty() {
        return Err(o.err(
            "servers",
            "list at least one server, e.g. \"nats://10.0.0.1:4222\"",
        ));
    }
    for s in &servers {
        let rest = s
            .strip_prefix("nats://")
            .or_else(|| s.strip_prefix("tls://"));
        let ok = rest.is_some_and(|r| {
            !r.is_empty()
                && !r.contains('@')
                && r.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                })
        });
        if !ok {
            return Err(o.err(
                "servers",
                format!(
                    "{:?} is not a server URL: use nats://host:port or tls://host:port, without credentials",
                    s.chars().take(80).collect::<String>()
                ),
            ));
        }
    }
    let tls = match o.take("tls") {
        None => None,
        Some(v) => Some(parse_tls(o.object("tls", v)?)?),
    };
    let auth_v = o.required("auth")?;
    let auth = parse_auth(o.object("auth", auth_v)?, tls.as_ref())?;
    o.finish()?;
    Ok(NatsConfig { servers, auth, tls })
}

fn parse_tls(mut o: Obj) -> Result<Tls, KeyError> {
    let ca_file = o.opt_path("ca-file")?;
    let cert = o.opt_path("client-cert-file")?;
    let key = o.opt_path("client-key-file")?;
    let client_cert = match (cert, key) {
        (None, None) => None,
        (Some(cert_file), Some(key_file)) => Some(ClientCert {
            cert_file,
            key_file,
        }),
        (Some(_), None) => {
            return Err(o.err(
                "client-key-file",
                "missing: a client certificate needs its key",
            ))
        }
        (None, Some(_)) => {
            return Err(o.err(
                "client-cert-file",
                "missing: a client key needs its certificate",
            ))
        }
    };
    for (k, p) in [
        ("ca-file", ca_file.as_deref()),
        (
            "client-cert-file",
            client_cert.as_ref().map(|c| c.cert_file.as_path()),
        ),
        (
            "client-key-file",
            client_cert.as_ref().map(|c| c.key_file.as_path()),
        ),
    ] {
        if let Some(p) = p {
            readable(&o, k, p)?;
        }
    }
    o.finish()?;
    Ok(Tls {
        ca_file,
        client_cert,
    })
}

/// Checks a file named by the config can be opened now, so the error names
/// the key rather than surfacing later from the NATS client.
fn readable(o: &Obj, key: &str, path: &Path) -> Result<(), KeyError> {
    std::fs::File::open(path).map(drop).map_err(|e| {
        o.err(
            key,
            format!(
                "cannot read {}: {e}; check the path and that the agent's user may read it",
                path.display()
            ),
        )
    })
}

fn read_secret(o: &Obj, key: &str, path: &Path) -> Result<Secret, KeyError> {
    let bytes = durable::read_bounded(path, MAX_SECRET_BYTES).map_err(|e| {
        o.err(
            key,
            format!("{e}; check the path and that the agent's user may read it"),
        )
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| o.err(key, format!("{} is not UTF-8 text", path.display())))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() || secret.contains(['\n', '\r', '\0']) {
        return Err(o.err(
            key,
            format!(
                "{} must hold the secret on one line, nothing else",
                path.display()
            ),
        ));
    }
    Ok(Secret(secret.to_owned()))
}

fn parse_auth(mut o: Obj, tls: Option<&Tls>) -> Result<NatsAuth, KeyError> {
    let method = o.req_string("method")?;
    let auth = match method.as_str() {
        "none" => NatsAuth::None,
        "user-password" => {
            let user = o.req_string("user")?;
            if user.contains(char::is_whitespace) || user.len() > 256 {
                return Err(o.err("user", "use a NATS user name without whitespace"));
            }
            let file = o.req_path("password-file")?;
            let password = read_secret(&o, "password-file", &file)?;
            NatsAuth::UserPassword { user, password }
        }
        "token" => {
            let file = o.req_path("token-file")?;
            NatsAuth::Token(read_secret(&o, "token-file", &file)?)
        }
        "creds" => {
            let file = o.req_path("creds-file")?;
            readable(&o, "creds-file", &file)?;
            NatsAuth::Creds(file)
        }
        "tls-certificate" => {
            if tls.and_then(|t| t.client_cert.as_ref()).is_none() {
                return Err(o.err(
                    "method",
                    "tls-certificate needs nats.tls.client-cert-file and nats.tls.client-key-file",
                ));
            }
            NatsAuth::TlsCertificate
        }
        "oauth2-client-credentials" => NatsAuth::OAuth2(parse_client_credentials(&mut o)?),
        other => {
            return Err(o.err(
                "method",
                format!(
                    "unknown method {:?}: use none, user-password, token, creds, tls-certificate or oauth2-client-credentials",
                    other.chars().take(40).collect::<String>()
                ),
            ))
        }
    };
    o.finish()?;
    Ok(auth)
}

/// `token-url` (https), `client-id`, `client-secret-file`, and optionally
/// `scope`, `audience` and `ca-file`.
fn parse_client_credentials(o: &mut Obj) -> Result<ClientCredentials, KeyError> {
    let url = o.req_string("token-url")?;
    let token_url = HttpsUrl::parse(&url).map_err(|e| {
        let why = match &e {
            _ if !url.starts_with("https://") => "the token is only ever sent over https://".into(),
            ValidationError::ArtifactUrl { why, .. } => (*why).to_owned(),
            other => other.to_string(),
        };
        o.err(
            "token-url",
            format!(
                "{:?} is not a usable token endpoint: {why}; use https://host[:port]/path",
                url.chars().take(80).collect::<String>()
            ),
        )
    })?;
    let client_id = o.req_string("client-id")?;
    oauth_param(o, "client-id", &client_id)?;
    let file = o.req_path("client-secret-file")?;
    let client_secret = read_secret(o, "client-secret-file", &file)?;
    let scope = o.opt_string("scope")?;
    if let Some(scope) = &scope {
        // RFC 6749 section 3.3: scope tokens of printable ASCII but " and \,
        // separated by single spaces.
        let ok = scope.len() <= MAX_OAUTH_PARAM_BYTES
            && scope.split(' ').all(|t| {
                !t.is_empty()
                    && t.bytes()
                        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            });
        if !ok {
            return Err(o.err(
                "scope",
                format!("use scope tokens of printable ASCII (no \" or \\) separated by single spaces, at most {MAX_OAUTH_PARAM_BYTES} bytes"),
            ));
        }
    }
    let audience = o.opt_string("audience")?;
    if let Some(audience) = &audience {
        oauth_param(o, "audience", audience)?;
    }
    let ca_file = o.opt_path("ca-file")?;
    if let Some(p) = &ca_file {
        readable(o, "ca-file", p)?;
    }
    Ok(ClientCredentials {
        token_url,
        client_id,
        client_secret,
        scope,
        audience,
        ca_file,
    })
}

/// A client ID or audience: text without control characters, bounded.
fn oauth_param(o: &Obj, key: &str, v: &str) -> Result<(), KeyError> {
    if v.len() > MAX_OAUTH_PARAM_BYTES || v.chars().any(char::is_control) {
        return Err(o.err(
            key,
            format!("use at most {MAX_OAUTH_PARAM_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

fn parse_podman(mut o: Obj) -> Result<PodmanMode, KeyError> {
    let enabled = o.opt_bool("enabled", true)?;
    let binary = PathBuf::from(o.opt_string("binary")?.unwrap_or_else(|| "podman".into()));
    let global_args = match o.take("global-args") {
        None => Vec::new(),
        Some(v) => o.strings("global-args", v, MAX_PODMAN_ARGS)?,
    };
    let containers_conf = o.opt_path("containers-conf")?;
    let pull_timeout = o.secs("pull-timeout-secs", 300, 1, 3600)?;
    let command_timeout = o.secs("command-timeout-secs", 60, 1, 600)?;
    o.finish()?;
    Ok(if enabled {
        PodmanMode::Enabled(PodmanSettings {
            binary,
            global_args,
            containers_conf,
            pull_timeout,
            command_timeout,
        })
    } else {
        PodmanMode::Disabled
    })
}

/// The longest slow interval accepted (keep-alive, check, traffic): a week.
const MAX_SLOW_INTERVAL_SECS: u64 = 7 * 86_400;

fn parse_intervals(mut o: Obj) -> Result<Intervals, KeyError> {
    let d = Intervals::default();
    let heartbeat = o.secs("heartbeat-secs", d.heartbeat.as_secs(), 1, 3600)?;
    let keepalive = o.secs(
        "keepalive-secs",
        d.keepalive.as_secs(),
        1,
        MAX_SLOW_INTERVAL_SECS,
    )?;
    let ping = o.secs("ping-secs", d.ping.as_secs(), 1, 3600)?;
    let max_pings_out = o.whole(
        "ping-max-outstanding",
        u64::from(d.max_pings_out),
        1,
        10,
        "PINGs",
    )?;
    let resync = o.secs("resync-secs", d.resync.as_secs(), 1, 3600)?;
    let check = o.secs("check-secs", d.check.as_secs(), 1, MAX_SLOW_INTERVAL_SECS)?;
    let traffic = o.secs(
        "traffic-secs",
        d.traffic.as_secs(),
        1,
        MAX_SLOW_INTERVAL_SECS,
    )?;
    // Agent 0.1.0's consumer heartbeat: configs written for it stay valid.
    let _ = o.secs("idle-heartbeat-secs", 5, 1, 60)?;
    o.finish()?;
    Ok(Intervals {
        heartbeat,
        keepalive,
        ping,
        // INVARIANT: at most 10 by the range above.
        max_pings_out: u8::try_from(max_pings_out).unwrap_or(u8::MAX),
        resync,
        check,
        traffic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/harmony-fleet/agent.json"), json.as_bytes())
    }

    fn key_err(json: &str) -> (String, String) {
        let e = parse(json).expect_err("must be refused");
        (e.key().unwrap_or("").to_owned(), e.to_string())
    }

    const MINIMAL: &str = r#"{"device-id":"dev1","nats":{"servers":["nats://127.0.0.1:4222"],"auth":{"method":"none"}}}"#;

    #[test]
    fn minimal_config_takes_the_defaults() {
        let c = parse(MINIMAL).expect("valid");
        assert_eq!(c.device_id.as_str(), "dev1");
        assert_eq!(c.nats.auth, NatsAuth::None);
        assert_eq!(c.nats.tls, None);
        assert_eq!(c.root, PathBuf::from("/"));
        assert_eq!(
            c.podman,
            PodmanMode::Enabled(PodmanSettings {
                binary: PathBuf::from("podman"),
                global_args: vec![],
                containers_conf: None,
                pull_timeout: Duration::from_secs(300),
                command_timeout: Duration::from_secs(60),
            })
        );
        assert_eq!(
            c.intervals,
            Intervals {
                heartbeat: Duration::from_secs(30),
                keepalive: Duration::from_secs(3600),
                ping: Duration::from_secs(200),
                max_pings_out: 2,
                resync: Duration::from_secs(30),
                check: Duration::from_secs(21_600),
                traffic: Duration::from_secs(21_600),
            }
        );
    }

    #[test]
    fn every_interval_is_a_knob_and_older_configs_still_parse() {
        // The interval keys of 0.1.0 and 0.2.0 configs (README examples).
        let old = MINIMAL.replace(
            "}}}",
            r#"}},"intervals":{"heartbeat-secs":30,"resync-secs":30,"check-secs":300,"idle-heartbeat-secs":5}}"#,
        );
        let c = parse(&old).expect("a 0.2 config parses");
        assert_eq!(c.intervals.heartbeat, Duration::from_secs(30));
        assert_eq!(c.intervals.check, Duration::from_secs(300));
        assert_eq!(c.intervals.keepalive, KEEPALIVE_INTERVAL);
        let new = MINIMAL.replace(
            "}}}",
            r#"}},"intervals":{"keepalive-secs":7200,"ping-secs":120,"ping-max-outstanding":3,"check-secs":86400,"traffic-secs":3600}}"#,
        );
        let c = parse(&new).expect("valid");
        assert_eq!(c.intervals.keepalive, Duration::from_secs(7200));
        assert_eq!(c.intervals.ping, Duration::from_secs(120));
        assert_eq!(c.intervals.max_pings_out, 3);
        assert_eq!(c.intervals.check, Duration::from_secs(86_400));
        assert_eq!(c.intervals.traffic, Duration::from_secs(3600));
        let (k, m) =
            key_err(&MINIMAL.replace("}}}", r#"}},"intervals":{"ping-max-outstanding":0}}"#));
        assert_eq!(k, "intervals.ping-max-outstanding");
        assert!(m.contains("use 1 to 10 PINGs"), "{m}");
    }

    #[test]
    fn full_config_with_secrets_from_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").expect("write");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "pem").expect("write");
        let json = format!(
            r#"{{"device-id":"truck-7","nats":{{"servers":["tls://a:4222","tls://b:4222"],
            "auth":{{"method":"user-password","user":"truck-7","password-file":"{}"}},
            "tls":{{"ca-file":"{}"}}}},
            "podman":{{"enabled":false}},"intervals":{{"heartbeat-secs":5}},"root":"/tmp/x"}}"#,
            pw.display(),
            ca.display()
        );
        let c = parse(&json).expect("valid");
        match &c.nats.auth {
            NatsAuth::UserPassword { user, password } => {
                assert_eq!(user, "truck-7");
                assert_eq!(password.expose(), "s3cret");
            }
            other => panic!("wrong auth {other:?}"),
        }
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "Debug leaks the secret"
        );
        assert_eq!(c.podman, PodmanMode::Disabled);
        assert_eq!(c.intervals.heartbeat, Duration::from_secs(5));
        assert_eq!(
            c.layout().agent_lock(),
            Path::new("/tmp/x/run/harmony-fleet/agent.lock")
        );
    }

    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        let (k, m) = key_err(&MINIMAL.replace(r#""device-id""#, r#""colour":1,"device-id""#));
        assert_eq!(k, "colour");
        assert!(m.contains("unknown key"), "{m}");
        let (k, _) = key_err(&MINIMAL.replace(r#""servers""#, r#""server":1,"servers""#));
        assert_eq!(k, "nats.server");
        let (k, m) =
            key_err(&MINIMAL.replace(r#""method":"none""#, r#""method":"none","token-file":"/x""#));
        assert_eq!(k, "nats.auth.token-file");
        assert!(
            m.ends_with("unknown key: the keys allowed here are method"),
            "{m}"
        );
        let (k, _) = key_err(&MINIMAL.replace("}}}", r#"}},"podman":{"pull-timeout":3}}"#));
        assert_eq!(k, "podman.pull-timeout");
        let (k, _) = key_err(&MINIMAL.replace("}}}", r#"}},"intervals":{"beat":3}}"#));
        assert_eq!(k, "intervals.beat");
    }

    #[test]
    fn every_error_names_its_key() {
        let cases: &[(&str, &str, &str)] = &[
            (
                r#"{"nats":{}}"#,
                "device-id",
                "missing: this key is required",
            ),
            (
                r#"{"device-id":"a.b","nats":{}}"#,
                "device-id",
                "invalid device id \"a.b\"",
            ),
            (r#"{"device-id":"d"}"#, "nats", "missing"),
            (
                r#"{"device-id":"d","nats":[]}"#,
                "nats",
                "expected an object {...}, found a list",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":[],"auth":{"method":"none"}}}"#,
                "nats.servers",
                "list at least one server",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["http://x"],"auth":{"method":"none"}}}"#,
                "nats.servers",
                "\"http://x\" is not a server URL",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://u:p@x"],"auth":{"method":"none"}}}"#,
                "nats.servers",
                "without credentials",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"]}}"#,
                "nats.auth",
                "missing",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"magic"}}}"#,
                "nats.auth.method",
                "unknown method \"magic\"",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"token"}}}"#,
                "nats.auth.token-file",
                "missing",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"token","token-file":"rel/path"}}}"#,
                "nats.auth.token-file",
                "\"rel/path\" is not an absolute path",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"token","token-file":"/nonexistent/t"}}}"#,
                "nats.auth.token-file",
                "opening /nonexistent/t",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"creds","creds-file":"/nonexistent/c"}}}"#,
                "nats.auth.creds-file",
                "cannot read /nonexistent/c",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"tls-certificate"}}}"#,
                "nats.auth.method",
                "tls-certificate needs nats.tls.client-cert-file",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"},"tls":{"client-cert-file":"/c"}}}"#,
                "nats.tls.client-key-file",
                "missing: a client certificate needs its key",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"},"tls":{"ca-file":"/nonexistent/ca"}}}"#,
                "nats.tls.ca-file",
                "cannot read /nonexistent/ca",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"}},"podman":{"enabled":"yes"}}"#,
                "podman.enabled",
                "expected true or false, found a string",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"}},"podman":{"pull-timeout-secs":0}}"#,
                "podman.pull-timeout-secs",
                "0 is out of range: use 1 to 3600 seconds",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"}},"podman":{"global-args":["--root",""]}}"#,
                "podman.global-args",
                "entry 1 must be a non-empty string",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"}},"intervals":{"resync-secs":1.5}}"#,
                "intervals.resync-secs",
                "expected whole seconds, found 1.5",
            ),
            (
                r#"{"device-id":"d","nats":{"servers":["nats://x"],"auth":{"method":"none"}},"root":"tmp"}"#,
                "root",
                "\"tmp\" is not an absolute path",
            ),
        ];
        for (json, key, problem) in cases {
            let (k, m) = key_err(json);
            assert_eq!(&k, key, "for {json}: {m}");
            assert!(
                m.starts_with(&format!("config /etc/harmony-fleet/agent.json: {key}: ")),
                "{m}"
            );
            assert!(m.contains(problem), "for {json}: {m:?} lacks {problem:?}");
        }
    }

    #[test]
    fn secret_files_must_hold_one_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tok = dir.path().join("tok");
        std::fs::write(&tok, "a\nb\n").expect("write");
        let json = MINIMAL.replace(
            r#""method":"none""#,
            &format!(r#""method":"token","token-file":"{}""#, tok.display()),
        );
        let (k, m) = key_err(&json);
        assert_eq!(k, "nats.auth.token-file");
        assert!(m.contains("must hold the secret on one line"), "{m}");
        std::fs::write(&tok, "tok123\n").expect("write");
        let c = parse(&json).expect("valid");
        assert_eq!(c.nats.auth, NatsAuth::Token(Secret("tok123".into())));
    }

    /// An `oauth2-client-credentials` auth object with a secret file in `dir`
    /// and `extra` keys.
    fn oauth_json(dir: &Path, extra: &str) -> String {
        let secret = dir.join("client-secret");
        std::fs::write(&secret, "s3cr3t-value\n").expect("write");
        MINIMAL.replace(
            r#""method":"none""#,
            &format!(
                r#""method":"oauth2-client-credentials","token-url":"https://idp.example.com:8443/oauth/v2/token","client-id":"dev1-client","client-secret-file":"{}"{extra}"#,
                secret.display()
            ),
        )
    }

    #[test]
    fn oauth2_client_credentials_with_every_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("idp-ca.pem");
        std::fs::write(&ca, "pem").expect("write");
        let c = parse(&oauth_json(
            dir.path(),
            &format!(
                r#","scope":"openid urn:zitadel:iam:org:project:id:42:aud","audience":"fleet","ca-file":"{}""#,
                ca.display()
            ),
        ))
        .expect("valid");
        let NatsAuth::OAuth2(cc) = &c.nats.auth else {
            panic!("wrong auth {:?}", c.nats.auth);
        };
        assert_eq!(
            cc.token_url.to_string(),
            "https://idp.example.com:8443/oauth/v2/token"
        );
        assert_eq!(cc.client_id, "dev1-client");
        assert_eq!(cc.client_secret.expose(), "s3cr3t-value");
        assert_eq!(
            cc.scope.as_deref(),
            Some("openid urn:zitadel:iam:org:project:id:42:aud")
        );
        assert_eq!(cc.audience.as_deref(), Some("fleet"));
        assert_eq!(cc.ca_file.as_deref(), Some(ca.as_path()));
        assert_eq!(c.nats.auth.method(), "oauth2-client-credentials");
        assert!(
            !format!("{c:?}").contains("s3cr3t"),
            "Debug leaks the secret"
        );
        // The optional keys may be left out.
        let c = parse(&oauth_json(dir.path(), "")).expect("valid");
        let NatsAuth::OAuth2(cc) = &c.nats.auth else {
            panic!("wrong auth");
        };
        assert_eq!(
            (&cc.scope, &cc.audience, &cc.ca_file),
            (&None, &None, &None)
        );
    }

    #[test]
    fn oauth2_errors_name_their_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = oauth_json(dir.path(), "");
        let cases: Vec<(String, &str, &str)> = vec![
            (
                base.replace(r#""method""#, r#""colour":1,"method""#),
                "nats.auth.colour",
                "unknown key: the keys allowed here are method, token-url, client-id, client-secret-file, scope, audience, ca-file",
            ),
            (
                base.replace("https://idp.example.com:8443", "http://idp.example.com"),
                "nats.auth.token-url",
                "\"http://idp.example.com/oauth/v2/token\" is not a usable token endpoint: the token is only ever sent over https://; use https://host[:port]/path",
            ),
            (
                base.replace("https://idp.example.com:8443", "https://u:p@idp.example.com"),
                "nats.auth.token-url",
                "credentials in the URL are not allowed",
            ),
            (
                base.replace("/oauth/v2/token", "/t#frag"),
                "nats.auth.token-url",
                "the URL has a fragment",
            ),
            (
                base.replace(r#""client-id":"dev1-client","#, ""),
                "nats.auth.client-id",
                "missing: this key is required",
            ),
            (
                base.replace("dev1-client", "dev1\\u0007"),
                "nats.auth.client-id",
                "without control characters",
            ),
            (
                base.replace(r#""client-secret-file":"#, r#""client-secret-file":"/nonexistent/s","x":"#),
                "nats.auth.client-secret-file",
                "opening /nonexistent/s",
            ),
            (
                oauth_json(dir.path(), r#","scope":"openid  two""#),
                "nats.auth.scope",
                "separated by single spaces",
            ),
            (
                oauth_json(dir.path(), r#","scope":"a\"b""#),
                "nats.auth.scope",
                "printable ASCII",
            ),
            (
                oauth_json(dir.path(), r#","audience":"""#),
                "nats.auth.audience",
                "must not be empty",
            ),
            (
                oauth_json(dir.path(), r#","ca-file":"/nonexistent/ca.pem""#),
                "nats.auth.ca-file",
                "cannot read /nonexistent/ca.pem",
            ),
            (
                oauth_json(dir.path(), r#","ca-file":"ca.pem""#),
                "nats.auth.ca-file",
                "\"ca.pem\" is not an absolute path",
            ),
        ];
        for (json, key, problem) in &cases {
            let (k, m) = key_err(json);
            assert_eq!(&k, key, "for {json}: {m}");
            assert!(m.contains(problem), "for {json}: {m:?} lacks {problem:?}");
            assert!(!m.contains("s3cr3t"), "{m}");
        }
    }

    #[test]
    fn bad_json_and_missing_file() {
        let e = parse("{").expect_err("bad json");
        assert!(e
            .to_string()
            .starts_with("config /etc/harmony-fleet/agent.json is not valid JSON"));
        let e = Config::load(Path::new("/nonexistent/agent.json")).expect_err("missing");
        assert!(
            e.to_string().starts_with(
                "reading config /nonexistent/agent.json: opening /nonexistent/agent.json"
            ),
            "{e}"
        );
        assert!(
            e.to_string().ends_with("pass another file with --config"),
            "{e}"
        );
    }
}
