//! The updater's settings: the optional JSON config file
//! (`/etc/harmony-fleet/updater.json`, unknown keys refused, every error
//! naming its key) and the time bounds of every step.
//!
//! ```json
//! { "ca-file": "/etc/harmony-fleet/artifact-ca.pem",
//!   "agent-unit": "fleet-agent.service",
//!   "probe-user": "fleet-agent" }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_common::durable::read_bounded;
use fleet_common::layout::{AGENT_UNIT, AGENT_USER};
use fleet_common::limits;

/// A config file larger than this is not one a person wrote.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The validated config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdaterConfig {
    /// Extra PEM trust anchors for artifact HTTPS, besides the system store.
    pub ca_file: Option<PathBuf>,
    /// The agent's systemd unit.
    pub agent_unit: String,
    /// The user candidates are probed and (under the supervisor) run as,
    /// when the updater is root.
    pub probe_user: String,
}

impl Default for UpdaterConfig {
    fn default() -> Self {
        Self {
            ca_file: None,
            agent_unit: AGENT_UNIT.to_owned(),
            probe_user: AGENT_USER.to_owned(),
        }
    }
}

/// A config file that cannot be used.
#[derive(Debug)]
pub enum ConfigError {
    Read {
        path: PathBuf,
        message: String,
    },
    NotJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    NotObject {
        path: PathBuf,
    },
    UnknownKey {
        path: PathBuf,
        key: String,
    },
    BadValue {
        path: PathBuf,
        key: &'static str,
        why: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, message } => {
                write!(f, "reading updater config {}: {message}", path.display())
            }
            Self::NotJson { path, source } => write!(
                f,
                "updater config {} is not valid JSON: {source}: fix the file",
                path.display()
            ),
            Self::NotObject { path } => write!(
                f,
                "updater config {} must be one JSON object with the keys ca-file, agent-unit, probe-user",
                path.display()
            ),
            Self::UnknownKey { path, key } => write!(
                f,
                "updater config {}: unknown key {key:?}: the known keys are ca-file, agent-unit, probe-user",
                path.display()
            ),
            Self::BadValue { path, key, why } => {
                write!(f, "updater config {}: key {key:?}: {why}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl UpdaterConfig {
    /// Reads `path`. A missing file gives the defaults when `required` is
    /// false (the default path); an explicitly named file must exist.
    pub fn load(path: &Path, required: bool) -> Result<Self, ConfigError> {
        match read_bounded(path, MAX_CONFIG_BYTES) {
            Ok(bytes) => Self::parse(path, &bytes),
            Err(e) if e.is_not_found() && !required => Ok(Self::default()),
            Err(e) => Err(ConfigError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            }),
        }
    }

    /// Parses the file's bytes; `path` only names the file in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, ConfigError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|source| ConfigError::NotJson {
                path: path.to_owned(),
                source,
            })?;
        let serde_json::Value::Object(map) = value else {
            return Err(ConfigError::NotObject {
                path: path.to_owned(),
            });
        };
        let bad = |key: &'static str, why: String| ConfigError::BadValue {
            path: path.to_owned(),
            key,
            why,
        };
        let mut config = Self::default();
        for (key, value) in map {
            match key.as_str() {
                "ca-file" => {
                    let s = as_string("ca-file", &value).map_err(|w| bad("ca-file", w))?;
                    let p = PathBuf::from(s);
                    if !p.is_absolute() {
                        return Err(bad("ca-file", format!("{s:?} is not an absolute path")));
                    }
                    config.ca_file = Some(p);
                }
                "agent-unit" => {
                    let s = as_string("agent-unit", &value).map_err(|w| bad("agent-unit", w))?;
                    if !valid_unit(s) {
                        return Err(bad(
                            "agent-unit",
                            format!(
                                "{s:?} is not a systemd service name such as fleet-agent.service"
                            ),
                        ));
                    }
                    config.agent_unit = s.to_owned();
                }
                "probe-user" => {
                    let s = as_string("probe-user", &value).map_err(|w| bad("probe-user", w))?;
                    if !valid_user(s) {
                        return Err(bad(
                            "probe-user",
                            format!("{s:?} is not a user name: use 1 to 32 characters from a-z, 0-9, '_' and '-', starting with a letter or '_'"),
                        ));
                    }
                    config.probe_user = s.to_owned();
                }
                _ => {
                    return Err(ConfigError::UnknownKey {
                        path: path.to_owned(),
                        key: key.chars().take(80).collect(),
                    })
                }
            }
        }
        Ok(config)
    }
}

fn as_string<'a>(_key: &str, v: &'a serde_json::Value) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("expected a string, found {}", json_kind(v)))
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `name.service` with systemd's unit-name characters.
fn valid_unit(s: &str) -> bool {
    s.len() <= 256
        && s.strip_suffix(".service").is_some_and(|stem| {
            !stem.is_empty()
                && !stem.starts_with('-')
                && stem.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'@' | b'-')
                })
        })
}

/// A conservative POSIX user name.
fn valid_user(s: &str) -> bool {
    match s.as_bytes().first() {
        Some(&b) => {
            (b.is_ascii_lowercase() || b == b'_')
                && s.len() <= 32
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        }
        None => false,
    }
}

/// The time bound of every step that waits on something outside the updater.
/// Production uses the binding limits (`docs/design/limits.md`); test builds
/// (feature `fault-injection`) may shorten them through [`TEST_BOUNDS_ENV`] so
/// a stalled server or a candidate that never becomes ready fails in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub https_connect: Duration,
    pub https_request: Duration,
    pub probe: Duration,
    pub stop: Duration,
    pub start: Duration,
}

/// `https-connect=MS,https-request=MS,probe=MS,stop=MS,start=MS` (any subset).
pub const TEST_BOUNDS_ENV: &str = "FLEET_UPDATER_TEST_BOUNDS";

impl Default for Bounds {
    fn default() -> Self {
        Self {
            https_connect: limits::HTTPS_CONNECT_TIMEOUT,
            https_request: limits::HTTPS_REQUEST_TIMEOUT,
            probe: limits::PROBE_TIMEOUT,
            stop: limits::UPDATER_STOP_TIMEOUT,
            start: limits::UPDATER_START_TIMEOUT,
        }
    }
}

impl Bounds {
    /// The binding bounds, shortened by [`TEST_BOUNDS_ENV`] in test builds.
    pub fn from_env() -> Result<Self, String> {
        #[cfg(feature = "fault-injection")]
        if let Ok(v) = std::env::var(TEST_BOUNDS_ENV) {
            return Self::default().with_overrides(&v);
        }
        Ok(Self::default())
    }

    /// Applies `name=milliseconds` pairs.
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub fn with_overrides(mut self, spec: &str) -> Result<Self, String> {
        for pair in spec.split(',').filter(|p| !p.is_empty()) {
            let (name, ms) = pair
                .split_once('=')
                .ok_or_else(|| format!("{TEST_BOUNDS_ENV}: {pair:?} is not name=milliseconds"))?;
            let ms: u64 = ms.parse().map_err(|_| {
                format!("{TEST_BOUNDS_ENV}: {ms:?} is not a number of milliseconds")
            })?;
            let d = Duration::from_millis(ms);
            match name {
                "https-connect" => self.https_connect = d,
                "https-request" => self.https_request = d,
                "probe" => self.probe = d,
                "stop" => self.stop = d,
                "start" => self.start = d,
                _ => return Err(format!("{TEST_BOUNDS_ENV}: unknown bound {name:?}")),
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<UpdaterConfig, String> {
        UpdaterConfig::parse(
            Path::new("/etc/harmony-fleet/updater.json"),
            json.as_bytes(),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_full_config() {
        assert_eq!(parse("{}"), Ok(UpdaterConfig::default()));
        let c = parse(
            r#"{"ca-file":"/etc/ca.pem","agent-unit":"agent@x.service","probe-user":"nobody"}"#,
        )
        .expect("valid");
        assert_eq!(c.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(c.agent_unit, "agent@x.service");
        assert_eq!(c.probe_user, "nobody");
    }

    #[test]
    fn every_error_names_its_key() {
        let p = "updater config /etc/harmony-fleet/updater.json";
        let cases = [
            (r#"{"ca-fil":"/x"}"#, format!("{p}: unknown key \"ca-fil\": the known keys are ca-file, agent-unit, probe-user")),
            (r#"{"ca-file":3}"#, format!("{p}: key \"ca-file\": expected a string, found a number")),
            (r#"{"ca-file":"rel.pem"}"#, format!("{p}: key \"ca-file\": \"rel.pem\" is not an absolute path")),
            (r#"{"agent-unit":"x.timer"}"#, format!("{p}: key \"agent-unit\": \"x.timer\" is not a systemd service name such as fleet-agent.service")),
            (r#"{"agent-unit":"a b.service"}"#, format!("{p}: key \"agent-unit\": \"a b.service\" is not a systemd service name such as fleet-agent.service")),
            (r#"{"probe-user":"Root"}"#, format!("{p}: key \"probe-user\": \"Root\" is not a user name: use 1 to 32 characters from a-z, 0-9, '_' and '-', starting with a letter or '_'")),
            (r#"[]"#, format!("{p} must be one JSON object with the keys ca-file, agent-unit, probe-user")),
        ];
        for (json, want) in cases {
            assert_eq!(parse(json), Err(want), "{json}");
        }
        assert!(parse("{")
            .expect_err("not json")
            .starts_with(&format!("{p} is not valid JSON")));
    }

    #[test]
    fn missing_default_file_is_fine_missing_named_file_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("updater.json");
        assert_eq!(
            UpdaterConfig::load(&missing, false).expect("defaults"),
            UpdaterConfig::default()
        );
        let e = UpdaterConfig::load(&missing, true).expect_err("required");
        assert!(e.to_string().starts_with(&format!(
            "reading updater config {}: opening {}",
            missing.display(),
            missing.display()
        )));
    }

    #[test]
    fn bound_overrides() {
        let b = Bounds::default()
            .with_overrides("start=1500,probe=200")
            .expect("valid");
        assert_eq!(b.start, Duration::from_millis(1500));
        assert_eq!(b.probe, Duration::from_millis(200));
        assert_eq!(b.stop, limits::UPDATER_STOP_TIMEOUT);
        assert!(Bounds::default().with_overrides("nap=1").is_err());
        assert!(Bounds::default().with_overrides("start=soon").is_err());
    }
}
