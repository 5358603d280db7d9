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
//!
//! | module | holds |
//! |---|---|
//! | this one | [`Config::load`], [`ConfigError`], [`DEFAULTS`] |
//! | `model` | the validated types |
//! | `parse` | JSON to those types, with the bounds of each value |
//! | `obj` | reading one JSON object key by key, refusing unknown keys |

mod model;
mod obj;
mod parse;

use std::fmt;
use std::path::{Path, PathBuf};

use fleet_common::durable::{self, DurableError};
use fleet_common::Layout;
use serde_json::Value;

pub use model::{
    ClientCredentials, Config, NatsAuth, NatsConfig, PodmanMode, PodmanSettings, Secret,
};
use parse::parse_root;

/// The largest config file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fleet_common::limits::KEEPALIVE_INTERVAL;

    use super::model::Intervals;
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
