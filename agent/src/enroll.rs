//! First boot with the `enrollment` method (`docs/design/enrollment.md`):
//! the device's own identity key, and waiting until the fleet approves it.
//!
//! Steps of [`ensure_enrolled`]: load `identity.nk` from the state
//! directory, or generate a user nkey and write it there (mode 0600,
//! durably: it never leaves the device); put its seed in the NATS config.
//! Then, at every start, until approved: connect once with the key, the device id and the enrollment
//! token; send the enrollment request (id, key, facts) on the key's own
//! subject and, beside it, a Direct Get of the device's own desired
//! document; whichever answers decides. A Direct Get answer means the
//! callout placed this connection in `DEVICES`: the key is approved (a
//! device preauthorized at the factory never asks). An enrollment answer
//! says `pending`, `approved`, `rejected`, `decommissioned` or `slow-down`.
//! Between attempts the agent waits (5 s doubling to 5 min, each ± a
//! fifth, at least what the answer asks), saying in its log and `STATUS=`
//! what it waits for.
//! With `enrolled.json` recording this device and key, an attempt that
//! cannot reach the fleet is enough to go on (the start-up's own connection
//! retries); an answer other than approved (a decommissioned, rejected or
//! re-pending device) removes it.
//!
//! While the agent runs, [`Recheck`] asks again when the server denies the
//! device's own subscriptions or reads: a decommissioned (or rejected, or
//! re-pended) device's connection is closed, and the callout places its
//! reconnects in `ENROLL`, where everything the agent subscribes to is
//! denied. Told so, the agent removes `enrolled.json` and stops with an
//! error; its workloads keep running, and its next start (systemd's
//! restart) waits for an operator's approval.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AnswerState, EnrollAnswer, EnrollRequest, Enrolled, FACT_AGENT_VERSION, FACT_ARCH,
    FACT_MACHINE_ID, FACT_OS, FACT_SERIAL, MAX_FACT_CHARS,
};
use fleet_common::durable::{read_bounded, write_atomic};
use fleet_common::limits::{ENROLL_RETRY_FIRST, ENROLL_RETRY_MAX, NATS_CONNECT_ATTEMPT_TIMEOUT};
use fleet_common::nkey::{NkeyKind, NkeySeed};
use fleet_common::subjects::{
    desired_doc_key, device_direct_get_subject, enroll_inbox_prefix, enroll_subject, inbox_prefix,
    BUCKET_WORKLOADS,
};
use fleet_common::time::Timestamp;
use fleet_common::validate::{Arch, DeviceId};

use crate::config::{NatsAuth, NatsConfig, Secret};
use crate::jitter::Jitter;
use crate::notify;
use crate::shutdown::Shutdown;

/// The identity key's file in the state directory.
pub const IDENTITY_FILE: &str = "identity.nk";
/// The record of this device's approval in the state directory.
pub const ENROLLED_FILE: &str = "enrolled.json";
/// How long one attempt waits for either answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest identity or marker file read.
const MAX_FILE_BYTES: u64 = 4096;

/// Why enrollment could not go on.
#[derive(Debug)]
pub enum EnrollError {
    Identity {
        path: PathBuf,
        detail: String,
    },
    Marker {
        path: PathBuf,
        detail: String,
    },
    /// SIGTERM while waiting.
    Interrupted,
}

impl fmt::Display for EnrollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Identity { path, detail } => write!(
                f,
                "identity key {}: {detail}; remove it only to enroll this device anew (an operator must approve the new key)",
                path.display()
            ),
            Self::Marker { path, detail } => write!(f, "enrollment record {}: {detail}", path.display()),
            Self::Interrupted => f.write_str("stopped while waiting for enrollment"),
        }
    }
}

impl std::error::Error for EnrollError {}

/// Loads or makes the identity, then waits until the fleet approves it.
/// Does nothing for another authentication method.
pub fn ensure_enrolled(
    cfg: &mut NatsConfig,
    device: &DeviceId,
    state_dir: &Path,
    version: &str,
    shutdown: &Shutdown,
) -> Result<(), EnrollError> {
    let NatsAuth::Enrollment { seed, .. } = &mut cfg.auth else {
        return Ok(());
    };
    let identity = load_or_create(&state_dir.join(IDENTITY_FILE))?;
    let key = identity.public_key().encode();
    *seed = Some(Secret::new(identity.encode()));
    let marker = state_dir.join(ENROLLED_FILE);
    let mut enrolled = match read_marker(&marker)? {
        Some(m) if m.device_id == *device && m.public_key == key => true,
        Some(_) => {
            log::warn!(
                "{} names another device or key; enrolling again",
                marker.display()
            );
            false
        }
        None => false,
    };
    let request = EnrollRequest {
        device_id: device.clone(),
        public_key: key.clone(),
        facts: facts(version),
    };
    let mut wait = ENROLL_RETRY_FIRST;
    let mut jitter = Jitter::new();
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        let outcome = ask(cfg, device, &key, &request);
        let (what, asked) = match &outcome {
            Asked::Approved { how } => {
                if !enrolled {
                    let m = Enrolled {
                        device_id: device.clone(),
                        public_key: key.clone(),
                        approved_at: Timestamp::now(),
                    };
                    write_marker(&marker, &m)?;
                }
                log::info!(device = device.as_str(), key = key.as_str(); "approved ({how}): connecting as {device}");
                notify::status(&format!("approved as {device}; connecting"));
                return Ok(());
            }
            // Enrolled before and the fleet not reachable now: the normal
            // start-up retries its connection (a device must start with its
            // workloads whatever the network does).
            Asked::Failed(e) if enrolled => {
                log::info!(device = device.as_str(), key = key.as_str(); "enrolled as {device} (key {key}); not checked now: {e}");
                return Ok(());
            }
            Asked::Answer(a) => {
                if a.state != AnswerState::SlowDown {
                    enrolled = false;
                }
                (
                    match a.state {
                        AnswerState::Pending => format!(
                            "waiting for approval of {device} (key {key}): fleetctl device approve {device}"
                        ),
                        AnswerState::Rejected => format!(
                            "enrollment of {device} refused: {}",
                            a.reason.as_deref().unwrap_or("no reason given")
                        ),
                        AnswerState::Decommissioned => {
                            remove_marker(&marker);
                            format!(
                                "{device} was decommissioned: an operator must approve it again"
                            )
                        }
                        AnswerState::SlowDown => format!(
                            "the enrollment service asks to wait: {}",
                            a.reason.as_deref().unwrap_or("")
                        ),
                        // Returned as `Asked::Approved` by `ask_on`.
                        AnswerState::Approved => String::from("approved"),
                    },
                    a.retry_after_secs.map(Duration::from_secs),
                )
            }
            Asked::Failed(e) => (format!("cannot ask to join: {e}"), None),
        };
        if !enrolled {
            remove_marker(&marker);
        }
        // ± a fifth: a batch of devices refused together (a callout
        // overloaded by their first burst) does not come back in step.
        let pause = jitter
            .around(wait)
            .max(asked.unwrap_or_default().min(ENROLL_RETRY_MAX));
        log::warn!(device = device.as_str(), attempt = attempt; "{what}; asking again in {} s", pause.as_secs());
        notify::status(&what);
        if shutdown.sleep(pause) {
            return Err(EnrollError::Interrupted);
        }
        wait = (wait * 2).min(ENROLL_RETRY_MAX);
    }
}

/// Puts the existing identity's seed in `cfg` (the `enrollment` method
/// only), making none: the candidate probe of an upgrade connects as the
/// enrolled device it will run on.
pub fn use_identity(cfg: &mut NatsConfig, state_dir: &Path) -> Result<(), EnrollError> {
    let NatsAuth::Enrollment { seed, .. } = &mut cfg.auth else {
        return Ok(());
    };
    let path = state_dir.join(IDENTITY_FILE);
    if !path.exists() {
        return Err(EnrollError::Identity {
            path,
            detail: "absent: this device has not enrolled yet (start the agent first)".to_owned(),
        });
    }
    *seed = Some(Secret::new(load_or_create(&path)?.encode()));
    Ok(())
}

/// The thread (`agent-enroll-recheck`, the `enrollment` method only) that
/// asks the fleet again when the running agent's connection is denied
/// what an approved device may do; see the module documentation.
pub struct Recheck {
    pub cfg: NatsConfig,
    pub device: DeviceId,
    pub state_dir: PathBuf,
    pub version: String,
    pub nats: std::sync::Arc<crate::nats::Nats>,
    pub shutdown: std::sync::Arc<Shutdown>,
}

/// Longest sleep of the recheck thread with nothing to check (it wakes at
/// once on a denial, or when the connection closes).
const RECHECK_IDLE_WAIT: Duration = Duration::from_secs(60);
/// Least time between two checks after one that found the device approved
/// (the denial has another cause: asking again would not change it).
const RECHECK_AFTER_APPROVED: Duration = ENROLL_RETRY_MAX;

impl Recheck {
    /// Spawns the thread; `None` for another authentication method.
    /// `unenrolled` is called once, with what the fleet said, when the
    /// device is no longer approved (the marker is removed by then).
    pub fn spawn(
        self,
        unenrolled: impl FnOnce(String) + Send + 'static,
    ) -> std::io::Result<Option<thread::JoinHandle<()>>> {
        let NatsAuth::Enrollment {
            seed: Some(seed), ..
        } = &self.cfg.auth
        else {
            return Ok(None);
        };
        let Ok(identity) = NkeySeed::parse_kind(seed.expose(), NkeyKind::User) else {
            return Ok(None);
        };
        let key = identity.public_key().encode();
        crate::threads::spawn("agent-enroll-recheck", move || {
            if let Some(what) = self.run(&key) {
                unenrolled(what);
            }
        })
        .map(Some)
    }

    /// Until shutdown, or until the fleet says the device is no longer
    /// approved: then what it said.
    fn run(&self, key: &str) -> Option<String> {
        let device = &self.device;
        let request = EnrollRequest {
            device_id: device.clone(),
            public_key: key.to_owned(),
            facts: facts(&self.version),
        };
        let marker = self.state_dir.join(ENROLLED_FILE);
        let mut jitter = Jitter::new();
        let mut wait = ENROLL_RETRY_FIRST;
        // When a denial may be checked, and whether one waits for it.
        let mut next = Instant::now();
        let mut due = false;
        while !self.shutdown.is_requested() {
            // Asleep until a denial (or the time to ask again): the
            // connection's callbacks wake it.
            let asleep = if due {
                next.saturating_duration_since(Instant::now())
            } else {
                RECHECK_IDLE_WAIT
            };
            match self.nats.wait_denied(asleep) {
                crate::nats::Denial::Denied => due = true,
                crate::nats::Denial::Quiet => {}
                crate::nats::Denial::Closing => return None,
            }
            if !due || Instant::now() < next {
                continue;
            }
            due = false;
            let what = match ask(&self.cfg, device, key, &request) {
                Asked::Approved { .. } => {
                    log::debug!("a permissions violation, and {device} is still approved");
                    wait = ENROLL_RETRY_FIRST;
                    next = Instant::now() + RECHECK_AFTER_APPROVED;
                    continue;
                }
                Asked::Answer(a) => match a.state {
                    AnswerState::Pending => format!(
                        "{device} is pending again (its approval was withdrawn): fleetctl device approve {device}"
                    ),
                    AnswerState::Rejected => format!(
                        "enrollment of {device} refused: {}",
                        a.reason.as_deref().unwrap_or("no reason given")
                    ),
                    AnswerState::Decommissioned => format!(
                        "{device} was decommissioned: an operator must approve it again"
                    ),
                    AnswerState::SlowDown | AnswerState::Approved => {
                        let asked = a.retry_after_secs.map(Duration::from_secs);
                        next = Instant::now() + jitter.around(wait).max(asked.unwrap_or_default().min(ENROLL_RETRY_MAX));
                        wait = (wait * 2).min(ENROLL_RETRY_MAX);
                        due = true;
                        continue;
                    }
                },
                Asked::Failed(e) => {
                    let pause = jitter.around(wait);
                    log::warn!(device = device.as_str(); "the server denies {device} what an approved device may do, and the enrollment service cannot say why: {e}; asking again in {} s", pause.as_secs());
                    next = Instant::now() + pause;
                    wait = (wait * 2).min(ENROLL_RETRY_MAX);
                    due = true;
                    continue;
                }
            };
            remove_marker(&marker);
            // The stop's own error line (`RunError::Unenrolled`) says the rest.
            log::warn!(device = device.as_str(), key = key; "the server denied a subscription; the enrollment service says: {what}");
            notify::status(&what);
            return Some(what);
        }
        None
    }
}

/// What one attempt learned.
#[derive(Debug)]
enum Asked {
    Approved { how: &'static str },
    Answer(EnrollAnswer),
    Failed(String),
}

/// One connection, the two requests, the first answer.
fn ask(cfg: &NatsConfig, device: &DeviceId, key: &str, request: &EnrollRequest) -> Asked {
    let options = crate::nats::enrollment_options(cfg, device.as_str());
    let servers = cfg.servers.join(",");
    let (tx, rx) = mpsc::channel();
    let spawned = thread::Builder::new()
        .name("agent-enroll-connect".into())
        .spawn(move || {
            let _ = tx.send(options.connect(servers.as_str()));
        });
    if let Err(e) = spawned {
        return Asked::Failed(format!("cannot start a thread: {e}"));
    }
    let nc = match rx.recv_timeout(NATS_CONNECT_ATTEMPT_TIMEOUT) {
        Ok(Ok(nc)) => nc,
        Ok(Err(e)) => return Asked::Failed(format!("connecting: {e}")),
        Err(_) => return Asked::Failed("connecting timed out".to_owned()),
    };
    let asked = ask_on(&nc, device, key, request);
    nc.close();
    asked
}

fn ask_on(nc: &nats::Connection, device: &DeviceId, key: &str, request: &EnrollRequest) -> Asked {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let enroll_inbox = format!("{}{id}", enroll_inbox_prefix(key));
    let device_inbox = format!("{}{id}", inbox_prefix(device));
    let body = match serde_json::to_vec(request) {
        Ok(b) => b,
        Err(e) => return Asked::Failed(e.to_string()),
    };
    // In ENROLL the second subscription and publish are denied, in DEVICES
    // the first: the server says so and the connection stays.
    let subs = (nc.subscribe(&enroll_inbox), nc.subscribe(&device_inbox));
    let (Ok(enroll_sub), Ok(device_sub)) = subs else {
        return Asked::Failed("cannot subscribe".to_owned());
    };
    let sent = nc
        .publish_with_reply_or_headers(&enroll_subject(key), Some(&enroll_inbox), None, &body)
        .and_then(|()| {
            nc.publish_with_reply_or_headers(
                &device_direct_get_subject(BUCKET_WORKLOADS, &desired_doc_key(device)),
                Some(&device_inbox),
                None,
                b"",
            )
        })
        .and_then(|()| nc.flush_timeout(ANSWER_TIMEOUT));
    if let Err(e) = sent {
        return Asked::Failed(format!("sending: {e}"));
    }
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(m) = enroll_sub.next_timeout(Duration::from_millis(50)) {
            if m.is_no_responders() {
                return Asked::Failed("no enrollment service answers".to_owned());
            }
            return match serde_json::from_slice::<EnrollAnswer>(&m.data) {
                Ok(a) if a.state == AnswerState::Approved => Asked::Approved {
                    how: "the enrollment service says so",
                },
                Ok(a) => Asked::Answer(a),
                Err(e) => Asked::Failed(format!("unreadable answer: {e}")),
            };
        }
        if let Ok(m) = device_sub.next_timeout(Duration::from_millis(50)) {
            if !m.is_no_responders() {
                return Asked::Approved {
                    how: "connected as the device",
                };
            }
        }
    }
    Asked::Failed(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()))
}

/// What the device says about itself: arch, OS, machine id, hardware
/// serial where one is readable, agent version; each bounded.
fn facts(version: &str) -> BTreeMap<String, String> {
    let mut f = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        let v: String = v
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_FACT_CHARS)
            .collect();
        if !v.is_empty() {
            f.insert(k.to_owned(), v);
        }
    };
    if let Some(a) = Arch::current() {
        put(FACT_ARCH, a.as_str().to_owned());
    }
    put(FACT_OS, crate::sysinfo::os_pretty_name());
    put(FACT_AGENT_VERSION, version.to_owned());
    let read = |p: &str| {
        read_bounded(Path::new(p), 256)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    if let Some(m) = read("/etc/machine-id") {
        put(FACT_MACHINE_ID, m);
    }
    for p in [
        "/sys/class/dmi/id/product_serial",
        "/proc/device-tree/serial-number",
    ] {
        if let Some(s) = read(p) {
            put(FACT_SERIAL, s);
            break;
        }
    }
    f
}

fn load_or_create(path: &Path) -> Result<NkeySeed, EnrollError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |detail: String| EnrollError::Identity {
        path: path.to_owned(),
        detail,
    };
    match std::fs::metadata(path) {
        Ok(m) => {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(err(format!(
                    "mode {mode:04o} lets group or others read it; run chmod 0600"
                )));
            }
            let bytes = read_bounded(path, MAX_FILE_BYTES).map_err(|e| err(e.to_string()))?;
            let text = String::from_utf8(bytes).map_err(|_| err("not UTF-8".to_owned()))?;
            NkeySeed::parse_kind(text.trim(), NkeyKind::User).map_err(|e| err(e.to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let seed = NkeySeed::generate(NkeyKind::User).map_err(|e| err(e.to_string()))?;
            write_atomic(path, format!("{}\n", seed.encode()).as_bytes(), 0o600)
                .map_err(|e| err(e.to_string()))?;
            log::info!(key = seed.public_key().encode().as_str(); "generated this device's identity key {}", path.display());
            Ok(seed)
        }
        Err(e) => Err(err(e.to_string())),
    }
}

fn read_marker(path: &Path) -> Result<Option<Enrolled>, EnrollError> {
    match read_bounded(path, MAX_FILE_BYTES) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| EnrollError::Marker {
                path: path.to_owned(),
                detail: e.to_string(),
            }),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(EnrollError::Marker {
            path: path.to_owned(),
            detail: e.to_string(),
        }),
    }
}

fn write_marker(path: &Path, m: &Enrolled) -> Result<(), EnrollError> {
    let err = |detail: String| EnrollError::Marker {
        path: path.to_owned(),
        detail,
    };
    let body = serde_json::to_vec_pretty(m).map_err(|e| err(e.to_string()))?;
    write_atomic(path, &body, 0o640).map_err(|e| err(e.to_string()))
}

fn remove_marker(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => log::info!("removed {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("removing {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_made_once_private_and_refused_when_readable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("enroll-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(IDENTITY_FILE);
        let a = load_or_create(&path).expect("made");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = load_or_create(&path).expect("loaded");
        assert_eq!(a.public_key(), b.public_key());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(load_or_create(&path).is_err());
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    #[test]
    fn facts_are_within_the_contract() {
        let f = facts("0.3.0");
        assert_eq!(f.get(FACT_AGENT_VERSION).map(String::as_str), Some("0.3.0"));
        fleet_common::contracts::check_facts(&f).expect("within limits");
    }
}
