//! The callout's config file: JSON, unknown keys rejected, every value
//! checked before anything starts.
//!
//! ```json
//! {
//!   "issuer": "https://fleet-idp.example.com",
//!   "audience": "312909075212468632",
//!   "jwks_url": "https://fleet-idp.example.com/oauth/v2/keys",
//!   "device_claim": "device_id",
//!   "clock_skew_secs": 60,
//!   "jwks_min_refetch_secs": 30,
//!   "jwks_max_age_secs": 3600,
//!   "max_user_lifetime_secs": 86400,
//!   "legacy_devices": true,
//!   "https_ca_file": null,
//!   "nats_url": "nats://127.0.0.1:4222",
//!   "nats_user": "auth-callout",
//!   "nats_password_file": "/etc/harmony-fleet/auth-callout/nats-password",
//!   "nats_ca_file": null,
//!   "issuer_seed_file": "/etc/harmony-fleet/auth-callout/issuer.nk",
//!   "enrollment": {
//!     "token_files": ["/etc/harmony-fleet/auth-callout/enrollment-token"],
//!     "auto_approve": "arch=arm64",
//!     "bearer_requires_approval": false
//!   }
//! }
//! ```
//!
//! `enrollment` (absent: none) turns on device enrollment
//! (`docs/design/enrollment.md`): devices connecting with their own nkey are
//! decided by the registry, and those not yet approved that show one of the
//! tokens may ask to join. `auto_approve` (absent: none) is a selector over
//! the request's facts; `bearer_requires_approval` gates identity-provider
//! devices on the registry too.
//!
//! The identity provider is `issuer`, `audience` and `jwks_url`, all three
//! or none. A callout without one admits enrolled devices only (it refuses
//! bearer tokens, saying why), and then needs `enrollment`; `device_claim`,
//! `jwks_*` and `https_ca_file` belong to the provider and are refused
//! without it. The NATS and seed entries are required; the rest have the
//! defaults shown (`https_ca_file` absent: the system trust store;
//! `nats_ca_file` absent: the nats crate's system roots when the URL is
//! `tls://`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_common::subjects::DeviceProtocols;

use fleet_common::callout::DEFAULT_DEVICE_CLAIM;
use fleet_common::nats_config::CALLOUT_USER;
use serde::Deserialize;

use fleet_common::selector::Selector;

use crate::jwt::BearerPolicy;

/// Where the config is read when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/harmony-fleet/auth-callout.json";
/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Default and largest tolerated clock difference with the provider.
const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
const MAX_CLOCK_SKEW_SECS: u64 = 300;
/// Default, smallest and largest interval between JWKS refetches: the
/// smallest still keeps a flood of unknown `kid`s from hammering the provider.
const DEFAULT_JWKS_MIN_REFETCH_SECS: u64 = 30;
const MIN_JWKS_MIN_REFETCH_SECS: u64 = 1;
const MAX_JWKS_MIN_REFETCH_SECS: u64 = 3600;
/// Default, smallest and largest age after which the key set is refetched
/// (so a key the provider withdrew stops verifying).
const DEFAULT_JWKS_MAX_AGE_SECS: u64 = 3600;
const MIN_JWKS_MAX_AGE_SECS: u64 = 60;
const MAX_JWKS_MAX_AGE_SECS: u64 = 86_400;
/// Default, smallest and largest life of a granted NATS user: a token that
/// expires later is admitted for this long only, then the device connects
/// again and its token is verified again (so a withdrawn key or a disabled
/// device loses access within a day by default).
const DEFAULT_MAX_USER_LIFETIME_SECS: u64 = 86_400;
const MIN_MAX_USER_LIFETIME_SECS: u64 = 60;
const MAX_MAX_USER_LIFETIME_SECS: u64 = 30 * 86_400;
/// Longest audience, issuer or URL accepted.
const MAX_TEXT_CHARS: usize = 2048;
/// Longest device claim name.
const MAX_CLAIM_CHARS: usize = 128;
/// Registered claims that cannot carry a device ID (`sub` can: a machine
/// user's ID is a valid device ID).
const RESERVED_CLAIMS: [&str; 6] = ["iss", "aud", "exp", "nbf", "iat", "jti"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    issuer: Option<String>,
    #[serde(default)]
    audience: Option<String>,
    #[serde(default)]
    jwks_url: Option<String>,
    #[serde(default)]
    device_claim: Option<String>,
    #[serde(default)]
    clock_skew_secs: Option<u64>,
    #[serde(default)]
    jwks_min_refetch_secs: Option<u64>,
    #[serde(default)]
    jwks_max_age_secs: Option<u64>,
    #[serde(default)]
    max_user_lifetime_secs: Option<u64>,
    #[serde(default)]
    legacy_devices: Option<bool>,
    #[serde(default)]
    https_ca_file: Option<PathBuf>,
    nats_url: String,
    #[serde(default)]
    nats_user: Option<String>,
    nats_password_file: PathBuf,
    #[serde(default)]
    nats_ca_file: Option<PathBuf>,
    issuer_seed_file: PathBuf,
    #[serde(default)]
    enrollment: Option<RawEnrollment>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnrollment {
    token_files: Vec<PathBuf>,
    #[serde(default)]
    auto_approve: Option<String>,
    #[serde(default)]
    bearer_requires_approval: Option<bool>,
}

/// Enrollment, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollmentConfig {
    /// Files holding the enrollment tokens devices may show (one each; an
    /// old and a new one while a token is rotated).
    pub token_files: Vec<PathBuf>,
    pub auto_approve: Option<Selector>,
    pub bearer_requires_approval: bool,
}

/// Enrollment token files accepted at most.
const MAX_ENROLLMENT_TOKENS: usize = 8;

/// Where the identity provider's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksConfig {
    pub url: String,
    pub min_refetch: Duration,
    pub max_age: Duration,
    pub https_ca_file: Option<PathBuf>,
}

/// A validated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The bearer policy; its `issuer`, `audience` and `device_claim` are
    /// empty when there is no identity provider (`jwks` is `None`), and
    /// then never used: bearer tokens are refused before verification.
    pub policy: BearerPolicy,
    /// The identity provider's key set; `None`: enrolled devices only.
    pub jwks: Option<JwksConfig>,
    pub nats_url: String,
    pub nats_user: String,
    pub nats_password_file: PathBuf,
    pub nats_ca_file: Option<PathBuf>,
    pub issuer_seed_file: PathBuf,
    pub enrollment: Option<EnrollmentConfig>,
}

/// Why the config was refused.
#[derive(Debug)]
pub enum ConfigError {
    Read { path: PathBuf, detail: String },
    Parse { path: PathBuf, detail: String },
    Invalid { field: &'static str, why: String },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, detail } => write!(
                f,
                "cannot read the config {}: {detail}; pass --config <file>",
                path.display()
            ),
            Self::Parse { path, detail } => write!(
                f,
                "config {} is not valid: {detail}; see fleet-auth-callout --help for the keys",
                path.display()
            ),
            Self::Invalid { field, why } => write!(f, "config {field}: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = fleet_common::durable::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| {
            ConfigError::Read {
                path: path.to_owned(),
                detail: e.to_string(),
            }
        })?;
        let raw: RawConfig = serde_json::from_slice(&bytes).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
        Self::validate(raw)
    }

    /// Parses config JSON text (for tests and `load`).
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            detail: e.to_string(),
        })?;
        Self::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        let invalid = |field, why: &str| ConfigError::Invalid {
            field,
            why: why.to_owned(),
        };
        let https = |field, v: &str| {
            if v.chars().count() > MAX_TEXT_CHARS {
                return Err(invalid(field, "too long"));
            }
            let host = v.strip_prefix("https://").unwrap_or_default();
            if host.is_empty()
                || host.starts_with('/')
                || v.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(ConfigError::Invalid {
                    field,
                    why: format!("{v:?} is not an https:// URL; the identity provider is reached over HTTPS only"),
                });
            }
            Ok(())
        };
        let idp = match (&raw.issuer, &raw.audience, &raw.jwks_url) {
            (Some(issuer), Some(audience), Some(jwks_url)) => Some((issuer, audience, jwks_url)),
            (None, None, None) => None,
            _ => {
                return Err(invalid(
                    "issuer",
                    "issuer, audience and jwks_url go together: give all three for identity-provider devices, or none for a callout that admits enrolled devices only",
                ))
            }
        };
        if let Some((issuer, audience, jwks_url)) = idp {
            https("issuer", issuer)?;
            https("jwks_url", jwks_url)?;
            if audience.is_empty() || audience.chars().count() > MAX_TEXT_CHARS {
                return Err(invalid(
                    "audience",
                    "must be the audience the provider puts in device tokens (for Zitadel, the project ID)",
                ));
            }
        } else {
            let provider_only = [
                ("device_claim", raw.device_claim.is_some()),
                ("jwks_min_refetch_secs", raw.jwks_min_refetch_secs.is_some()),
                ("jwks_max_age_secs", raw.jwks_max_age_secs.is_some()),
                ("https_ca_file", raw.https_ca_file.is_some()),
            ];
            if let Some((field, _)) = provider_only.into_iter().find(|(_, set)| *set) {
                return Err(invalid(
                    field,
                    "belongs to the identity provider, and there is none (issuer, audience and jwks_url are absent): remove it, or configure the provider",
                ));
            }
            if raw.enrollment.is_none() {
                return Err(invalid(
                    "enrollment",
                    "absent, and so is the identity provider: this callout would admit no device; configure enrollment, the provider (issuer, audience, jwks_url), or both",
                ));
            }
        }
        let device_claim = match idp {
            None => String::new(),
            Some(_) => raw
                .device_claim
                .unwrap_or_else(|| DEFAULT_DEVICE_CLAIM.to_owned()),
        };
        if (idp.is_some() && device_claim.is_empty())
            || device_claim.chars().count() > MAX_CLAIM_CHARS
            || RESERVED_CLAIMS.contains(&device_claim.as_str())
        {
            return Err(ConfigError::Invalid {
                field: "device_claim",
                why: format!(
                    "{device_claim:?}: name the claim holding the device ID (1 to {MAX_CLAIM_CHARS} characters, not one of {RESERVED_CLAIMS:?})"
                ),
            });
        }
        let ranged = |field, v: Option<u64>, default, min, max| match v {
            None => Ok(default),
            Some(v) if (min..=max).contains(&v) => Ok(v),
            Some(v) => Err(ConfigError::Invalid {
                field,
                why: format!("{v} is outside {min}..={max}"),
            }),
        };
        let skew = ranged(
            "clock_skew_secs",
            raw.clock_skew_secs,
            DEFAULT_CLOCK_SKEW_SECS,
            0,
            MAX_CLOCK_SKEW_SECS,
        )?;
        let min_refetch = ranged(
            "jwks_min_refetch_secs",
            raw.jwks_min_refetch_secs,
            DEFAULT_JWKS_MIN_REFETCH_SECS,
            MIN_JWKS_MIN_REFETCH_SECS,
            MAX_JWKS_MIN_REFETCH_SECS,
        )?;
        let max_age = ranged(
            "jwks_max_age_secs",
            raw.jwks_max_age_secs,
            DEFAULT_JWKS_MAX_AGE_SECS,
            MIN_JWKS_MAX_AGE_SECS,
            MAX_JWKS_MAX_AGE_SECS,
        )?;
        let max_user_lifetime = ranged(
            "max_user_lifetime_secs",
            raw.max_user_lifetime_secs,
            DEFAULT_MAX_USER_LIFETIME_SECS,
            MIN_MAX_USER_LIFETIME_SECS,
            MAX_MAX_USER_LIFETIME_SECS,
        )?;
        let url_ok = ["nats://", "tls://"].iter().any(|s| {
            raw.nats_url
                .strip_prefix(s)
                .is_some_and(|rest| !rest.is_empty())
        });
        if !url_ok || raw.nats_url.chars().any(char::is_whitespace) {
            return Err(ConfigError::Invalid {
                field: "nats_url",
                why: format!(
                    "{:?} is not a nats:// or tls:// URL (several servers: separate with commas)",
                    raw.nats_url
                ),
            });
        }
        let nats_user = raw.nats_user.unwrap_or_else(|| CALLOUT_USER.to_owned());
        if nats_user.is_empty() {
            return Err(invalid("nats_user", "must not be empty"));
        }
        let absolute = |field, p: &Path| {
            if p.is_absolute() {
                Ok(())
            } else {
                Err(ConfigError::Invalid {
                    field,
                    why: format!("{} is not an absolute path", p.display()),
                })
            }
        };
        absolute("nats_password_file", &raw.nats_password_file)?;
        absolute("issuer_seed_file", &raw.issuer_seed_file)?;
        if let Some(p) = &raw.https_ca_file {
            absolute("https_ca_file", p)?;
        }
        if let Some(p) = &raw.nats_ca_file {
            absolute("nats_ca_file", p)?;
        }
        let enrollment = match raw.enrollment {
            None => None,
            Some(e) => {
                if e.token_files.is_empty() || e.token_files.len() > MAX_ENROLLMENT_TOKENS {
                    return Err(invalid(
                        "enrollment.token_files",
                        "name 1 to 8 files, each holding one enrollment token",
                    ));
                }
                for p in &e.token_files {
                    absolute("enrollment.token_files", p)?;
                }
                let auto_approve = e
                    .auto_approve
                    .as_deref()
                    .map(Selector::parse)
                    .transpose()
                    .map_err(|err| ConfigError::Invalid {
                        field: "enrollment.auto_approve",
                        why: err.to_string(),
                    })?;
                let bearer_requires_approval = e.bearer_requires_approval.unwrap_or(false);
                if bearer_requires_approval && idp.is_none() {
                    return Err(invalid(
                        "enrollment.bearer_requires_approval",
                        "gates identity-provider devices, and there is no identity provider (issuer, audience, jwks_url)",
                    ));
                }
                Some(EnrollmentConfig {
                    token_files: e.token_files,
                    auto_approve,
                    bearer_requires_approval,
                })
            }
        };
        let jwks = idp.map(|(_, _, url)| JwksConfig {
            url: url.clone(),
            min_refetch: Duration::from_secs(min_refetch),
            max_age: Duration::from_secs(max_age),
            https_ca_file: raw.https_ca_file.clone(),
        });
        Ok(Config {
            policy: BearerPolicy {
                issuer: raw.issuer.unwrap_or_default(),
                audience: raw.audience.unwrap_or_default(),
                device_claim,
                clock_skew_secs: i64::try_from(skew).unwrap_or(0),
                max_user_lifetime_secs: i64::try_from(max_user_lifetime)
                    .unwrap_or(DEFAULT_MAX_USER_LIFETIME_SECS as i64),
                device_protocols: if raw.legacy_devices.unwrap_or(true) {
                    DeviceProtocols::WithLegacy
                } else {
                    DeviceProtocols::Current
                },
            },
            jwks,
            nats_url: raw.nats_url,
            nats_user,
            nats_password_file: raw.nats_password_file,
            nats_ca_file: raw.nats_ca_file,
            issuer_seed_file: raw.issuer_seed_file,
            enrollment,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn minimal() -> Value {
        json!({
            "issuer": "https://idp.example.com",
            "audience": "fleet",
            "jwks_url": "https://idp.example.com/oauth/v2/keys",
            "nats_url": "nats://127.0.0.1:4222",
            "nats_password_file": "/etc/harmony-fleet/auth-callout/nats-password",
            "issuer_seed_file": "/etc/harmony-fleet/auth-callout/issuer.nk"
        })
    }

    #[test]
    fn enrollment_is_checked() {
        let mut v = minimal();
        v["enrollment"] = json!({"token_files": ["/etc/t"], "auto_approve": "arch=arm64"});
        let c = Config::from_json(&v.to_string()).expect("valid");
        let e = c.enrollment.expect("enrollment");
        assert_eq!(
            e.auto_approve.map(|s| s.as_str().to_owned()).as_deref(),
            Some("arch=arm64")
        );
        assert!(!e.bearer_requires_approval);
        for bad in [
            json!({"token_files": []}),
            json!({"token_files": ["relative"]}),
            json!({"token_files": ["/etc/t"], "auto_approve": "arch in ("}),
            json!({"token_files": ["/etc/t"], "other": 1}),
        ] {
            let mut v = minimal();
            v["enrollment"] = bad.clone();
            assert!(Config::from_json(&v.to_string()).is_err(), "{bad}");
        }
    }

    fn refuse(f: impl Fn(&mut Value)) -> String {
        let mut v = minimal();
        f(&mut v);
        Config::from_json(&v.to_string())
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn legacy_devices_are_served_until_turned_off() {
        let c = Config::from_json(&minimal().to_string()).expect("valid");
        assert_eq!(c.policy.device_protocols, DeviceProtocols::WithLegacy);
        let mut v = minimal();
        v["legacy_devices"] = json!(false);
        let c = Config::from_json(&v.to_string()).expect("valid");
        assert_eq!(c.policy.device_protocols, DeviceProtocols::Current);
        let e = refuse(|v| v["legacy_devices"] = json!("no"));
        assert!(e.contains("expected a boolean"), "{e}");
    }

    #[test]
    fn minimal_config_takes_the_defaults() {
        let c = Config::from_json(&minimal().to_string()).expect("valid");
        assert_eq!(c.policy.device_claim, "device_id");
        assert_eq!(c.policy.clock_skew_secs, 60);
        let jwks = c.jwks.expect("an identity provider");
        assert_eq!(jwks.min_refetch, Duration::from_secs(30));
        assert_eq!(jwks.max_age, Duration::from_secs(3600));
        assert_eq!(jwks.https_ca_file, None);
        assert_eq!(c.policy.max_user_lifetime_secs, 86_400);
        assert_eq!(c.nats_user, "auth-callout");
    }

    #[test]
    fn enrollment_alone_needs_no_identity_provider() {
        let enrollment_only = |f: &dyn Fn(&mut Value)| {
            let mut v = minimal();
            let o = v.as_object_mut().expect("object");
            for k in ["issuer", "audience", "jwks_url"] {
                o.remove(k);
            }
            v["enrollment"] = json!({"token_files": ["/etc/t"]});
            f(&mut v);
            Config::from_json(&v.to_string()).map_err(|e| e.to_string())
        };
        let c = enrollment_only(&|_| {}).expect("valid");
        assert_eq!(c.jwks, None);
        assert!(c.enrollment.is_some());
        assert_eq!(c.policy.max_user_lifetime_secs, 86_400);

        let e = enrollment_only(&|v| {
            v.as_object_mut().expect("object").remove("enrollment");
        })
        .expect_err("admits nothing");
        assert!(
            e.starts_with("config enrollment: absent, and so is the identity provider"),
            "{e}"
        );
        let e = enrollment_only(&|v| v["audience"] = json!("fleet")).expect_err("partial");
        assert!(
            e.contains("issuer, audience and jwks_url go together"),
            "{e}"
        );
        for field in [
            "device_claim",
            "jwks_min_refetch_secs",
            "jwks_max_age_secs",
            "https_ca_file",
        ] {
            let e = enrollment_only(&|v| {
                v[field] = if field == "device_claim" || field == "https_ca_file" {
                    json!("/x")
                } else {
                    json!(60)
                }
            })
            .expect_err("provider-only key");
            assert!(
                e.starts_with(&format!("config {field}: belongs to the identity provider")),
                "{e}"
            );
        }
        let e = enrollment_only(&|v| v["enrollment"]["bearer_requires_approval"] = json!(true))
            .expect_err("gates nothing");
        assert!(
            e.starts_with("config enrollment.bearer_requires_approval:"),
            "{e}"
        );
    }

    #[test]
    fn every_bad_value_is_refused_with_its_field() {
        assert!(refuse(|v| v["extra"] = json!(1)).contains("unknown field `extra`"));
        assert_eq!(
            refuse(|v| v["issuer"] = json!("http://idp.example.com")),
            "config issuer: \"http://idp.example.com\" is not an https:// URL; the identity provider is reached over HTTPS only"
        );
        assert!(refuse(|v| v["jwks_url"] = json!("https://")).starts_with("config jwks_url:"));
        assert!(refuse(|v| v["audience"] = json!("")).starts_with("config audience:"));
        assert!(refuse(|v| v["device_claim"] = json!("exp")).starts_with("config device_claim:"));
        assert_eq!(
            refuse(|v| v["clock_skew_secs"] = json!(301)),
            "config clock_skew_secs: 301 is outside 0..=300"
        );
        assert!(refuse(|v| v["jwks_min_refetch_secs"] = json!(0)).contains("outside 1..=3600"));
        assert!(refuse(|v| v["jwks_max_age_secs"] = json!(10)).contains("outside 60..=86400"));
        assert_eq!(
            refuse(|v| v["max_user_lifetime_secs"] = json!(59)),
            "config max_user_lifetime_secs: 59 is outside 60..=2592000"
        );
        assert!(refuse(|v| v["max_user_lifetime_secs"] = json!(2_592_001))
            .contains("outside 60..=2592000"));
        assert!(refuse(|v| v["nats_url"] = json!("http://x")).starts_with("config nats_url:"));
        assert_eq!(
            refuse(|v| v["issuer_seed_file"] = json!("issuer.nk")),
            "config issuer_seed_file: issuer.nk is not an absolute path"
        );
        assert!(refuse(|v| {
            v.as_object_mut().expect("obj").remove("audience");
        })
        .contains("issuer, audience and jwks_url go together"));
        assert!(refuse(|v| {
            v.as_object_mut().expect("obj").remove("nats_url");
        })
        .contains("missing field `nats_url`"));
    }

    #[test]
    fn sub_may_carry_the_device_id() {
        let mut v = minimal();
        v["device_claim"] = json!("sub");
        v["clock_skew_secs"] = json!(0);
        let c = Config::from_json(&v.to_string()).expect("valid");
        assert_eq!(c.policy.device_claim, "sub");
        assert_eq!(c.policy.clock_skew_secs, 0);
    }

    /// The config names no key twice either (serde's
    /// derive refuses a duplicate field; this keeps it so).
    #[test]
    fn a_duplicate_key_is_refused() {
        let text = minimal().to_string();
        let twice = text.replacen('{', r#"{"audience":"other","#, 1);
        let e = Config::from_json(&twice).expect_err("refused").to_string();
        assert!(e.contains("duplicate field `audience`"), "{e}");
    }
}
