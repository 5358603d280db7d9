//! From JSON to the validated configuration, one function per object
//! (`nats`, `nats.tls`, `nats.auth`, `podman`, `intervals`), with the
//! bounds of each value.

use std::path::{Path, PathBuf};

use fleet_common::durable;
use fleet_common::validate::{DeviceId, HttpsUrl, ValidationError};
use serde_json::{Map, Value};

use super::model::{
    ClientCert, ClientCredentials, Config, Intervals, NatsAuth, NatsConfig, PodmanMode,
    PodmanSettings, Secret, Tls,
};
use super::obj::{KeyError, Obj};

/// The largest secret (password, token) file read.
const MAX_SECRET_BYTES: u64 = 16 * 1024;
/// Longest OAuth2 client ID, scope or audience accepted.
const MAX_OAUTH_PARAM_BYTES: usize = 1024;
/// NATS servers one config may list (a cluster and its gateways).
const MAX_SERVERS: usize = 16;
/// Extra arguments to podman (storage options).
const MAX_PODMAN_ARGS: usize = 32;

pub(super) fn parse_root(value: Value) -> Result<Config, KeyError> {
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

pub(super) fn parse_nats(mut o: Obj) -> Result<NatsConfig, KeyError> {
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

pub(super) fn parse_tls(mut o: Obj) -> Result<Tls, KeyError> {
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
pub(super) fn readable(o: &Obj, key: &str, path: &Path) -> Result<(), KeyError> {
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

pub(super) fn read_secret(o: &Obj, key: &str, path: &Path) -> Result<Secret, KeyError> {
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

pub(super) fn parse_auth(mut o: Obj, tls: Option<&Tls>) -> Result<NatsAuth, KeyError> {
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
        "enrollment" => {
            let file = o.req_path("token-file")?;
            NatsAuth::Enrollment {
                token: read_secret(&o, "token-file", &file)?,
                seed: None,
            }
        }
        other => {
            return Err(o.err(
                "method",
                format!(
                    "unknown method {:?}: use none, user-password, token, creds, tls-certificate, oauth2-client-credentials or enrollment",
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
pub(super) fn parse_client_credentials(o: &mut Obj) -> Result<ClientCredentials, KeyError> {
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
pub(super) fn oauth_param(o: &Obj, key: &str, v: &str) -> Result<(), KeyError> {
    if v.len() > MAX_OAUTH_PARAM_BYTES || v.chars().any(char::is_control) {
        return Err(o.err(
            key,
            format!("use at most {MAX_OAUTH_PARAM_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

pub(super) fn parse_podman(mut o: Obj) -> Result<PodmanMode, KeyError> {
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

pub(super) fn parse_intervals(mut o: Obj) -> Result<Intervals, KeyError> {
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
