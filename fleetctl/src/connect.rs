//! How fleetctl reaches NATS: the options (like the agent's) and the
//! bounded connection.
//!
//! Either flags — `--server URL` (repeatable), `--user NAME` with
//! `--password-file PATH`, `--token-file PATH`, `--creds PATH`,
//! `--ca-file PATH`, `--tls-cert PATH` with `--tls-key PATH` — or
//! `--config FILE` holding the same JSON as the agent's `nats` block:
//!
//! ```json
//! { "servers": ["tls://nats1.example.com:4222"],
//!   "auth": {"method": "user-password", "user": "admin", "password-file": "/etc/fleet/admin-pw"},
//!   "tls": {"ca-file": "/etc/fleet/nats-ca.pem"} }
//! ```
//!
//! Defaults: `$FLEET_NATS_URL` or `nats://127.0.0.1:4222`; with a password
//! file (`--password-file` or `$FLEET_NATS_PASSWORD_FILE`) and no `--user`,
//! the user is `admin` (the operator's user in account `FLEET`). Secrets
//! are read from files, never given on the command line.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use fleet_common::durable;
use fleet_common::limits::NATS_CONNECT_ATTEMPT_TIMEOUT;
use fleet_common::nats_config::ADMIN_USER;
use serde::Deserialize;

use crate::error::CtlError;

/// Environment variables for the connection options.
pub const ENV_SERVER: &str = "FLEET_NATS_URL";
pub const ENV_PASSWORD_FILE: &str = "FLEET_NATS_PASSWORD_FILE";
const DEFAULT_SERVER: &str = "nats://127.0.0.1:4222";
/// The largest secret (password, token) or config file read.
const MAX_SECRET_BYTES: u64 = 16 * 1024;
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// Servers one command may list.
const MAX_SERVERS: usize = 16;

/// How fleetctl authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    UserPassword {
        user: String,
        password_file: PathBuf,
    },
    Token {
        token_file: PathBuf,
    },
    Creds {
        creds_file: PathBuf,
    },
    /// The client certificate is the identity.
    TlsCertificate,
}

/// TLS settings; present means TLS is required.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Validated connection options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnOptions {
    pub servers: Vec<String>,
    pub auth: Auth,
    pub tls: Option<Tls>,
}

/// The connection flags as given, before validation: every NATS command
/// takes them, anywhere after its command word.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(
    next_help_heading = "Connection (as the operator, user admin in account FLEET by default)"
)]
pub struct ConnFlags {
    /// nats:// or tls://, repeatable [default: $FLEET_NATS_URL or nats://127.0.0.1:4222]
    #[arg(long = "server", value_name = "URL", global = true, action = clap::ArgAction::Append)]
    servers: Vec<String>,
    /// With --password-file [default: admin]
    #[arg(long, value_name = "NAME", global = true)]
    user: Option<String>,
    /// The user's password [default: $FLEET_NATS_PASSWORD_FILE]
    #[arg(long, value_name = "PATH", global = true)]
    password_file: Option<PathBuf>,
    /// Token authentication
    #[arg(long, value_name = "PATH", global = true)]
    token_file: Option<PathBuf>,
    /// A .creds file (JWT and nkey seed)
    #[arg(long, value_name = "PATH", global = true)]
    creds: Option<PathBuf>,
    /// The only CA trusted for TLS (TLS required)
    #[arg(long, value_name = "PATH", global = true)]
    ca_file: Option<PathBuf>,
    /// A client certificate, with --tls-key (TLS required)
    #[arg(long, value_name = "PATH", global = true)]
    tls_cert: Option<PathBuf>,
    /// The client certificate's key, with --tls-cert
    #[arg(long, value_name = "PATH", global = true)]
    tls_key: Option<PathBuf>,
    /// All of the above as the agent's "nats" JSON block instead
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
}

impl ConnFlags {
    /// Validates the flags (with the environment's defaults) and connects.
    pub fn connect(self, mode: Reconnect) -> Result<nats::Connection, CtlError> {
        connect(&self.resolve()?, mode)
    }

    /// Validates the flags, with the environment's defaults.
    pub fn resolve(self) -> Result<ConnOptions, CtlError> {
        self.resolve_with(
            std::env::var(ENV_SERVER).ok(),
            std::env::var_os(ENV_PASSWORD_FILE).map(PathBuf::from),
        )
    }

    fn resolve_with(
        self,
        env_server: Option<String>,
        env_password_file: Option<PathBuf>,
    ) -> Result<ConnOptions, CtlError> {
        let input = |m: String| CtlError::Input(m);
        if let Some(path) = &self.config {
            let others = self
                != ConnFlags {
                    config: self.config.clone(),
                    ..ConnFlags::default()
                };
            if others {
                return Err(input(
                    "--config holds every connection option: give no other connection flag with it"
                        .into(),
                ));
            }
            return from_config_file(path);
        }
        let servers = if self.servers.is_empty() {
            vec![env_server.unwrap_or_else(|| DEFAULT_SERVER.to_owned())]
        } else {
            self.servers
        };
        let password_file = self.password_file.or_else(|| {
            // The environment's password file applies only when no other
            // method is chosen on the command line.
            (self.token_file.is_none() && self.creds.is_none())
                .then_some(env_password_file)
                .flatten()
        });
        let methods = [
            password_file.is_some(),
            self.token_file.is_some(),
            self.creds.is_some(),
        ]
        .into_iter()
        .filter(|m| *m)
        .count();
        if methods > 1 {
            return Err(input(
                "give one of --password-file, --token-file and --creds".into(),
            ));
        }
        let client_cert = match (self.tls_cert, self.tls_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(input("--tls-cert and --tls-key go together".into())),
        };
        let auth = match (password_file, self.token_file, self.creds) {
            (Some(p), _, _) => Auth::UserPassword {
                user: self.user.unwrap_or_else(|| ADMIN_USER.to_owned()),
                password_file: p,
            },
            (None, Some(t), _) => Auth::Token { token_file: t },
            (None, None, Some(c)) => Auth::Creds { creds_file: c },
            (None, None, None) if self.user.is_some() => {
                return Err(input("--user needs --password-file".into()))
            }
            (None, None, None) if client_cert.is_some() => Auth::TlsCertificate,
            (None, None, None) => Auth::None,
        };
        let tls = (self.ca_file.is_some() || client_cert.is_some()).then_some(Tls {
            ca_file: self.ca_file,
            client_cert,
        });
        let o = ConnOptions { servers, auth, tls };
        o.check().map_err(input)?;
        Ok(o)
    }
}

impl ConnOptions {
    fn check(&self) -> Result<(), String> {
        if self.servers.is_empty() || self.servers.len() > MAX_SERVERS {
            return Err(format!(
                "give 1 to {MAX_SERVERS} servers, not {}",
                self.servers.len()
            ));
        }
        for s in &self.servers {
            let rest = s
                .strip_prefix("nats://")
                .or_else(|| s.strip_prefix("tls://"))
                .ok_or_else(|| format!("server {s:?}: use nats://host:port or tls://host:port"))?;
            if rest.is_empty() || rest.contains(['/', ' ', '@']) {
                return Err(format!(
                    "server {s:?}: use nats://host:port or tls://host:port (credentials go in files)"
                ));
            }
        }
        Ok(())
    }

    /// The servers, for messages.
    pub fn servers(&self) -> String {
        self.servers.join(", ")
    }
}

/// The agent's `nats` block.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct NatsBlock {
    servers: Vec<String>,
    auth: AuthBlock,
    #[serde(default)]
    tls: Option<TlsBlock>,
}

#[derive(Debug, Deserialize)]
#[serde(
    tag = "method",
    rename_all = "kebab-case",
    rename_all_fields = "kebab-case",
    deny_unknown_fields
)]
enum AuthBlock {
    None {},
    UserPassword {
        user: String,
        password_file: PathBuf,
    },
    Token {
        token_file: PathBuf,
    },
    Creds {
        creds_file: PathBuf,
    },
    TlsCertificate {},
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct TlsBlock {
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    client_cert_file: Option<PathBuf>,
    #[serde(default)]
    client_key_file: Option<PathBuf>,
}

fn from_config_file(path: &Path) -> Result<ConnOptions, CtlError> {
    let bad = |m: String| CtlError::Input(format!("--config {}: {m}", path.display()));
    let bytes = durable::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| bad(e.to_string()))?;
    let block: NatsBlock = serde_json::from_slice(&bytes).map_err(|e| {
        bad(format!(
            "{e}; write the agent's \"nats\" block: {{\"servers\": [...], \"auth\": {{\"method\": ...}}, \"tls\": {{...}}}}"
        ))
    })?;
    let tls = match block.tls {
        None => None,
        Some(t) => Some(Tls {
            ca_file: t.ca_file,
            client_cert: match (t.client_cert_file, t.client_key_file) {
                (Some(c), Some(k)) => Some((c, k)),
                (None, None) => None,
                _ => {
                    return Err(bad(
                        "tls.client-cert-file and tls.client-key-file go together".into(),
                    ))
                }
            },
        }),
    };
    let auth = match block.auth {
        AuthBlock::None {} => Auth::None,
        AuthBlock::UserPassword {
            user,
            password_file,
        } => Auth::UserPassword {
            user,
            password_file,
        },
        AuthBlock::Token { token_file } => Auth::Token { token_file },
        AuthBlock::Creds { creds_file } => Auth::Creds { creds_file },
        AuthBlock::TlsCertificate {} => {
            if tls.as_ref().is_none_or(|t| t.client_cert.is_none()) {
                return Err(bad(
                    "auth.method tls-certificate needs tls.client-cert-file and tls.client-key-file"
                        .into(),
                ));
            }
            Auth::TlsCertificate
        }
    };
    let o = ConnOptions {
        servers: block.servers,
        auth,
        tls,
    };
    o.check().map_err(bad)?;
    Ok(o)
}

fn read_secret(path: &Path, flag: &str) -> Result<String, CtlError> {
    let bytes = durable::read_bounded(path, MAX_SECRET_BYTES)
        .map_err(|e| CtlError::Input(format!("{flag}: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes)
        .trim_end_matches(['\n', '\r'])
        .to_owned())
}

/// What the connection does when it drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// A command that ends: one more try, then its request fails.
    Once,
    /// `watch`: reconnect until interrupted.
    Forever,
}

/// Longest delay between reconnect attempts of [`Reconnect::Forever`].
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

/// Connects, one attempt bounded like the agent's (the crate's own connect
/// has no timeout).
pub fn connect(o: &ConnOptions, mode: Reconnect) -> Result<nats::Connection, CtlError> {
    let opts = match &o.auth {
        Auth::None | Auth::TlsCertificate => nats::Options::new(),
        Auth::UserPassword {
            user,
            password_file,
        } => nats::Options::with_user_pass(user, &read_secret(password_file, "--password-file")?),
        Auth::Token { token_file } => {
            nats::Options::with_token(&read_secret(token_file, "--token-file")?)
        }
        Auth::Creds { creds_file } => {
            durable::read_bounded(creds_file, MAX_SECRET_BYTES)
                .map_err(|e| CtlError::Input(format!("--creds: {e}")))?;
            nats::Options::with_credentials(creds_file)
        }
    };
    let mut opts = opts.with_name("fleetctl");
    opts = match mode {
        Reconnect::Once => opts
            .reconnect_delay_callback(|_| Duration::ZERO)
            .max_reconnects(1),
        Reconnect::Forever => opts
            .reconnect_delay_callback(|n| {
                (Duration::from_millis(100) * u32::try_from(n).unwrap_or(u32::MAX))
                    .min(MAX_RECONNECT_DELAY)
            })
            .max_reconnects(None),
    };
    if let Some(tls) = &o.tls {
        opts = opts.tls_required(true);
        if let Some(ca) = &tls.ca_file {
            opts = opts.add_root_certificate(ca);
        }
        if let Some((cert, key)) = &tls.client_cert {
            opts = opts.client_cert(cert, key);
        }
    }
    let servers = o.servers.join(",");
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("fleetctl-connect".into())
        .spawn(move || {
            let _ = tx.send(opts.connect(servers.as_str()));
        })
        .map_err(|e| CtlError::Connect {
            servers: o.servers(),
            detail: format!("starting the connect thread: {e}"),
        })?;
    match rx.recv_timeout(NATS_CONNECT_ATTEMPT_TIMEOUT) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(CtlError::Connect {
            servers: o.servers(),
            detail: e.to_string(),
        }),
        Err(_) => Err(CtlError::Connect {
            servers: o.servers(),
            detail: format!(
                "no answer within {} s",
                NATS_CONNECT_ATTEMPT_TIMEOUT.as_secs()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection flags alone, parsed as a command parses them.
    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[command(flatten)]
        flags: ConnFlags,
    }

    fn flags(a: &[&str]) -> Result<ConnFlags, String> {
        use clap::Parser;
        Flags::try_parse_from(std::iter::once("fleetctl").chain(a.iter().copied()))
            .map(|f| f.flags)
            .map_err(|e| e.to_string())
    }

    fn resolve(a: &[&str]) -> Result<ConnOptions, String> {
        flags(a)?
            .resolve_with(None, None)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_are_taken_out_and_validated() {
        let f = flags(&[
            "--server",
            "nats://a:1",
            "--server",
            "tls://b:2",
            "--password-file",
            "/pw",
        ])
        .expect("flags");
        let o = f.resolve_with(None, None).expect("valid");
        assert_eq!(o.servers, ["nats://a:1", "tls://b:2"]);
        assert_eq!(
            o.auth,
            Auth::UserPassword {
                user: "admin".into(),
                password_file: "/pw".into()
            }
        );
        assert_eq!(o.tls, None);
        let o = resolve(&["--token-file", "/t", "--ca-file", "/ca.pem"]).expect("token");
        assert_eq!(o.servers, [DEFAULT_SERVER]);
        assert_eq!(
            o.auth,
            Auth::Token {
                token_file: "/t".into()
            }
        );
        assert_eq!(
            o.tls,
            Some(Tls {
                ca_file: Some("/ca.pem".into()),
                client_cert: None
            })
        );
        let o = resolve(&["--tls-cert", "/c", "--tls-key", "/k"]).expect("mtls");
        assert_eq!(o.auth, Auth::TlsCertificate);
        let f = flags(&[]).expect("none");
        let o = f
            .resolve_with(Some("nats://env:4222".into()), Some("/env-pw".into()))
            .expect("env");
        assert_eq!(o.servers, ["nats://env:4222"]);
        assert_eq!(
            o.auth,
            Auth::UserPassword {
                user: "admin".into(),
                password_file: "/env-pw".into()
            }
        );
    }

    #[test]
    fn bad_flags_name_the_fix() {
        for (a, says) in [
            (
                &["--server"][..],
                "a value is required for '--server <URL>' but none was supplied",
            ),
            (
                &["--password-file", "/a", "--token-file", "/b"][..],
                "give one of --password-file, --token-file and --creds",
            ),
            (
                &["--tls-cert", "/c"][..],
                "--tls-cert and --tls-key go together",
            ),
            (&["--user", "bob"][..], "--user needs --password-file"),
            (
                &["--server", "http://h:1"][..],
                "server \"http://h:1\": use nats://host:port or tls://host:port",
            ),
            (
                &["--server", "nats://u:p@h:1"][..],
                "(credentials go in files)",
            ),
            (
                &["--config", "/c.json", "--server", "nats://h:1"][..],
                "--config holds every connection option",
            ),
            (
                &["--ca-file", "/a", "--ca-file", "/b"][..],
                "the argument '--ca-file <PATH>' cannot be used multiple times",
            ),
        ] {
            let e = resolve(a).expect_err(&format!("{a:?}"));
            assert!(e.contains(says), "{a:?}: {e}");
        }
    }

    #[test]
    fn the_agents_nats_block_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("nats.json");
        std::fs::write(
            &p,
            r#"{"servers":["tls://n1:4222","tls://n2:4222"],
                "auth":{"method":"user-password","user":"ops","password-file":"/pw"},
                "tls":{"ca-file":"/ca.pem"}}"#,
        )
        .expect("write");
        let o = resolve(&["--config", p.to_str().expect("utf8")]).expect("valid");
        assert_eq!(o.servers, ["tls://n1:4222", "tls://n2:4222"]);
        assert_eq!(
            o.auth,
            Auth::UserPassword {
                user: "ops".into(),
                password_file: "/pw".into()
            }
        );
        assert_eq!(
            o.tls.and_then(|t| t.ca_file),
            Some(PathBuf::from("/ca.pem"))
        );
        for (json, says) in [
            (
                r#"{"servers":["nats://h:1"],"auth":{"method":"oauth2"}}"#,
                "unknown variant `oauth2`",
            ),
            (
                r#"{"servers":["nats://h:1"],"auth":{"method":"token","token":"x"}}"#,
                "unknown field `token`",
            ),
            (
                r#"{"servers":["nats://h:1"],"auth":{"method":"tls-certificate"}}"#,
                "needs tls.client-cert-file and tls.client-key-file",
            ),
            (
                r#"{"servers":[],"auth":{"method":"none"}}"#,
                "give 1 to 16 servers, not 0",
            ),
        ] {
            std::fs::write(&p, json).expect("write");
            let e = resolve(&["--config", p.to_str().expect("utf8")]).expect_err(json);
            assert!(e.contains(says), "{json}: {e}");
            assert!(e.starts_with(&format!("--config {}: ", p.display())), "{e}");
        }
    }
}
