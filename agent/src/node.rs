//! `fleet-agent node freeze|unfreeze|status`: a client of the running agent's
//! local API, for a technician or a script (what `hzn node freeze` is in the
//! design it comes from: `docs/design/freeze.md`). One request, bounded in
//! time, one answer printed as a human line or (`--json`) as the agent's JSON
//! response, and an exit code that says which way it went ([`EXIT_REFUSED`],
//! [`EXIT_FORBIDDEN`], [`EXIT_UNREACHABLE`]).
//!
//! The socket is the production one, or the one under the `root` of the
//! config given with `--config` (only that key is read: the rest of the
//! config, and its secrets, are not the caller's business).

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_common::contracts::{
    AgentRequest, AgentStatusReply, ConfigState, ConfigStateName, ConfigStateReply,
    ConfigStateReport, ErrorBody, ErrorCode, MutationAdmission, NatsView, Response, UpdaterView,
};
use fleet_common::durable;
use fleet_common::limits::SOCKET_STATUS_RESPONSE_TIMEOUT;
use fleet_common::socket::{self, ClientError};
use fleet_common::validate::BoundedText;
use fleet_common::Layout;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub const EXIT_OK: u8 = 0;
/// The agent answered with another error (invalid, internal, timeout).
pub const EXIT_FAILED: u8 = 1;
/// The freeze was refused; every reason and the retry hint are printed.
pub const EXIT_REFUSED: u8 = 3;
/// The caller is not root, the agent's user or in `fleet-control`.
pub const EXIT_FORBIDDEN: u8 = 4;
/// No agent answers on the socket (not running, or no answer in time).
pub const EXIT_UNREACHABLE: u8 = 5;
/// The config named by `--config` cannot be read (as `run`'s code).
pub const EXIT_CONFIG: u8 = 10;

/// The agent answers within its status bound (a freeze asks the updater
/// for at most 5 s of it); a little more covers a loaded device.
const CALL_TIMEOUT: Duration = Duration::from_secs(SOCKET_STATUS_RESPONSE_TIMEOUT.as_secs() + 5);
/// A config file larger than this is not one.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// What to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCommand {
    Freeze { reason: Option<BoundedText> },
    Unfreeze,
    Status,
}

/// `fleet-agent node ...`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeArgs {
    pub command: NodeCommand,
    pub json: bool,
    pub config: Option<PathBuf>,
}

/// Parses the arguments after `node`; `Err` is a usage message.
pub fn parse(args: &[String]) -> Result<NodeArgs, String> {
    let mut it = args.iter();
    let verb = it
        .next()
        .ok_or("say `node freeze`, `node unfreeze` or `node status`")?;
    let mut reason: Option<BoundedText> = None;
    let mut json = false;
    let mut config = None;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" if !json => json = true,
            "--config" if config.is_none() => match it.next() {
                Some(p) => config = Some(PathBuf::from(p)),
                None => return Err("--config needs a path".into()),
            },
            "--reason" if verb == "freeze" && reason.is_none() => match it.next() {
                Some(r) => {
                    reason = Some(BoundedText::parse(r).map_err(|e| format!("--reason: {e}"))?)
                }
                None => return Err("--reason needs a text".into()),
            },
            other => return Err(format!("unexpected argument {other:?} for node {verb}")),
        }
    }
    let command = match verb.as_str() {
        "freeze" => NodeCommand::Freeze { reason },
        "unfreeze" => NodeCommand::Unfreeze,
        "status" => NodeCommand::Status,
        other => {
            return Err(format!(
                "unknown node command {other:?}: use freeze, unfreeze or status"
            ))
        }
    };
    Ok(NodeArgs {
        command,
        json,
        config,
    })
}

/// The agent socket: under the config's `root`, or the production one.
pub fn socket_path(config: Option<&Path>) -> Result<PathBuf, String> {
    let Some(path) = config else {
        return Ok(Layout::production().agent_socket());
    };
    let bytes = durable::read_bounded(path, MAX_CONFIG_BYTES)
        .map_err(|e| format!("reading config {}: {e}", path.display()))?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("config {} is not valid JSON: {e}", path.display()))?;
    let root = match value.get("root") {
        None => "/",
        Some(serde_json::Value::String(r)) if r.starts_with('/') => r.as_str(),
        Some(_) => {
            return Err(format!(
                "config {}: root: expected an absolute path",
                path.display()
            ))
        }
    };
    Ok(Layout::with_root(root).agent_socket())
}

/// What one call printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub code: u8,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    fn ok(stdout: String) -> Self {
        Self {
            code: EXIT_OK,
            stdout,
            stderr: String::new(),
        }
    }
    fn err(code: u8, stderr: String) -> Self {
        Self {
            code,
            stdout: String::new(),
            stderr,
        }
    }
}

/// Runs one node command.
pub fn run(args: &NodeArgs) -> Outcome {
    let path = match socket_path(args.config.as_deref()) {
        Ok(p) => p,
        Err(e) => return Outcome::err(EXIT_CONFIG, format!("fleet-agent: {e}\n")),
    };
    match &args.command {
        NodeCommand::Status => call(&path, &AgentRequest::Status {}, args.json, status_text),
        NodeCommand::Freeze { reason } => call(
            &path,
            &AgentRequest::Configstate {
                set: Some(ConfigStateName::Changefreeze),
                reason: reason.clone(),
            },
            args.json,
            |r: &ConfigStateReply| config_state_text(&r.config_state),
        ),
        NodeCommand::Unfreeze => call(
            &path,
            &AgentRequest::Configstate {
                set: Some(ConfigStateName::Configured),
                reason: None,
            },
            args.json,
            |r: &ConfigStateReply| config_state_text(&r.config_state),
        ),
    }
}

fn call<T: Serialize + DeserializeOwned>(
    path: &Path,
    request: &AgentRequest,
    json: bool,
    text: impl Fn(&T) -> String,
) -> Outcome {
    let response = match socket::call::<_, T>(path, request, CALL_TIMEOUT) {
        Ok(r) => r,
        Err(e) => return client_failure(&e),
    };
    let line = String::from_utf8_lossy(&response.to_line()).into_owned();
    match response {
        Response::Ok(body) => Outcome::ok(if json { line } else { text(&body) }),
        Response::Err(e) => {
            let mut out = Outcome::err(error_code(&e), error_text(&e));
            if json {
                out.stdout = line;
            }
            out
        }
    }
}

/// The one mapping from an error answer to an exit code.
fn error_code(e: &ErrorBody) -> u8 {
    match e.code {
        ErrorCode::Refused => EXIT_REFUSED,
        ErrorCode::Forbidden => EXIT_FORBIDDEN,
        _ => EXIT_FAILED,
    }
}

fn client_failure(e: &ClientError) -> Outcome {
    let code = match e {
        ClientError::Connect { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
            EXIT_FORBIDDEN
        }
        ClientError::Connect { .. } | ClientError::Timeout { .. } => EXIT_UNREACHABLE,
        _ => EXIT_FAILED,
    };
    Outcome::err(code, format!("fleet-agent: {e}\n"))
}

fn error_text(e: &ErrorBody) -> String {
    let mut s = format!(
        "fleet-agent: the agent answered {}: {}\n",
        e.code, e.message
    );
    if !e.reasons.is_empty() {
        let r: Vec<&str> = e.reasons.iter().map(|r| r.as_str()).collect();
        let _ = writeln!(s, "reasons: {}", r.join(", "));
    }
    if let Some(secs) = e.retry_after_secs {
        let _ = writeln!(s, "retry in {secs} s");
    }
    s
}

fn config_state_text(r: &ConfigStateReport) -> String {
    match &r.state {
        ConfigState::Configured => "configured\n".to_owned(),
        ConfigState::Changefreeze(f) => {
            let mut s = format!("changefreeze since {} by uid {}", f.since, f.caller_uid);
            if let Some(reason) = &f.reason {
                let _ = write!(s, ": {reason}");
            }
            let _ = writeln!(
                s,
                "\nwaiting: {} desired changes, {} upgrade intent",
                r.waiting_changes,
                if r.intent_waiting { "an" } else { "no" }
            );
            s
        }
    }
}

fn status_text(r: &AgentStatusReply) -> String {
    let mut s = format!("device:     {} (agent {})\n", r.device_id, r.agent_version);
    let _ = write!(s, "state:      {}", config_state_text(&r.config_state));
    let _ = writeln!(
        s,
        "nats:       {}",
        match &r.nats {
            NatsView::Connected {} => "connected".to_owned(),
            NatsView::Disconnected { for_secs } => format!("disconnected for {for_secs} s"),
        }
    );
    let _ = writeln!(
        s,
        "snapshot:   {}",
        if r.snapshot_complete {
            "complete"
        } else {
            "not complete"
        }
    );
    let m = &r.mutations;
    let _ = writeln!(
        s,
        "mutations:  {}; in flight: {}; pending: {}; pulling: {}",
        match m.admission {
            MutationAdmission::Open => "open",
            MutationAdmission::Frozen => "frozen (local restores only)",
            MutationAdmission::Draining => "draining",
        },
        m.in_flight.as_ref().map_or("none", |w| w.as_str()),
        m.pending,
        m.pulling.as_ref().map_or("none", |w| w.as_str()),
    );
    let _ = writeln!(
        s,
        "updater:    {}",
        match &r.upgrade.updater {
            UpdaterView::Absent {} => "not running".to_owned(),
            UpdaterView::Idle {} => "no upgrade yet".to_owned(),
            UpdaterView::Transaction {
                phase,
                attempt,
                target_version,
            } => format!("attempt {attempt} to {target_version}: {phase}"),
            UpdaterView::Unknown { error } => format!("unknown ({error})"),
        }
    );
    let _ = writeln!(
        s,
        "intent:     {}",
        if r.upgrade.intent_pending {
            "pending"
        } else {
            "none pending"
        }
    );
    if !r.config_state.state.is_frozen() {
        if r.freeze_blockers.is_empty() {
            s.push_str("freeze now: would be accepted\n");
        } else {
            let b: Vec<&str> = r.freeze_blockers.iter().map(|r| r.as_str()).collect();
            let _ = writeln!(s, "freeze now: would be refused: {}", b.join(", "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::contracts::Refusal;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_and_refusals() {
        assert_eq!(
            parse(&args(&["freeze", "--reason", "in motion", "--json"])),
            Ok(NodeArgs {
                command: NodeCommand::Freeze {
                    reason: Some(BoundedText::truncate("in motion"))
                },
                json: true,
                config: None
            })
        );
        assert_eq!(
            parse(&args(&["status", "--config", "/x.json"])),
            Ok(NodeArgs {
                command: NodeCommand::Status,
                json: false,
                config: Some("/x.json".into())
            })
        );
        assert_eq!(
            parse(&args(&["unfreeze", "--reason", "x"])),
            Err("unexpected argument \"--reason\" for node unfreeze".into())
        );
        assert_eq!(
            parse(&args(&["thaw"])),
            Err("unknown node command \"thaw\": use freeze, unfreeze or status".into())
        );
        assert_eq!(
            parse(&args(&[])),
            Err("say `node freeze`, `node unfreeze` or `node status`".into())
        );
        assert_eq!(
            parse(&args(&["freeze", "--reason"])),
            Err("--reason needs a text".into())
        );
        let long = "x".repeat(2000);
        assert!(parse(&args(&["freeze", "--reason", &long]))
            .expect_err("too long")
            .starts_with("--reason: "));
    }

    #[test]
    fn socket_from_the_configs_root() {
        assert_eq!(
            socket_path(None),
            Ok(PathBuf::from("/run/harmony-fleet/agent.sock"))
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let c = dir.path().join("agent.json");
        std::fs::write(&c, r#"{"device-id":"d","root":"/tmp/r"}"#).expect("write");
        assert_eq!(
            socket_path(Some(&c)),
            Ok(PathBuf::from("/tmp/r/run/harmony-fleet/agent.sock"))
        );
        std::fs::write(&c, r#"{"device-id":"d"}"#).expect("write");
        assert_eq!(
            socket_path(Some(&c)),
            Ok(PathBuf::from("/run/harmony-fleet/agent.sock"))
        );
        std::fs::write(&c, r#"{"root":"tmp"}"#).expect("write");
        assert!(socket_path(Some(&c))
            .expect_err("relative")
            .ends_with("root: expected an absolute path"));
        let out = run(&NodeArgs {
            command: NodeCommand::Status,
            json: false,
            config: Some(dir.path().join("missing.json")),
        });
        assert_eq!(out.code, EXIT_CONFIG);
    }

    #[test]
    fn no_agent_is_unreachable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = dir.path().join("agent.json");
        std::fs::write(&c, format!(r#"{{"root":"{}"}}"#, dir.path().display())).expect("write");
        let out = run(&NodeArgs {
            command: NodeCommand::Freeze { reason: None },
            json: false,
            config: Some(c),
        });
        assert_eq!(out.code, EXIT_UNREACHABLE, "{out:?}");
        assert!(out.stderr.contains("is the daemon running"), "{out:?}");
    }

    #[test]
    fn a_refusal_prints_every_reason_and_the_retry_hint() {
        let e = ErrorBody {
            code: ErrorCode::Refused,
            message: BoundedText::truncate("cannot enter changefreeze now: x; y"),
            reasons: vec![Refusal::ReconcilerBusy, Refusal::DownloadInProgress],
            retry_after_secs: Some(30),
        };
        assert_eq!(error_code(&e), EXIT_REFUSED);
        assert_eq!(
            error_text(&e),
            "fleet-agent: the agent answered refused: cannot enter changefreeze now: x; y\nreasons: reconciler-busy, download-in-progress\nretry in 30 s\n"
        );
    }
}
