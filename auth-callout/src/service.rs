//! The running service.
//!
//! Steps of [`run`], everything that can fail done before any thread starts:
//! load the issuer seed and the NATS password; build the HTTPS agent and the
//! JWKS cache and fetch the key set once (a failure is logged, not fatal: the
//! first request retries); connect to NATS as the callout user (bounded by
//! [`NATS_CONNECT_ATTEMPT_TIMEOUT`], reconnecting forever afterwards);
//! queue-subscribe to the callout subject (several instances share the
//! load); start the intake thread and [`WORKERS`] named worker threads that
//! take requests from it, decide, answer and log; tell systemd READY=1. `run`
//! returns only when the NATS connection is closed for good, after joining
//! the workers with a time limit.
//!
//! Overload (a reconnect storm faster than this instance answers) must not
//! become collapse: an answer the server no longer waits for is work
//! wasted, and a queue that only grows makes every answer late. The intake
//! thread stamps each request as it arrives and holds at most
//! [`INTAKE_CAPACITY`]; beyond that, and for a request a worker takes after
//! [`CALLOUT_STALE_AFTER`], nothing is answered: the server refuses that
//! client at its `authorization.timeout` and the client connects again
//! after its backoff, while the requests this instance can answer in time
//! are answered. The counts are logged every [`DROP_LOG_INTERVAL`].
//!
//! SIGTERM ends the process at once: the service holds no state worth a
//! drain, and a client whose request was in flight is refused by the server
//! after `authorization.timeout` and connects again.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_common::limits::{CALLOUT_STALE_AFTER, NATS_CONNECT_ATTEMPT_TIMEOUT};
use fleet_common::subjects::AUTH_CALLOUT_SUBJECT;

use fleet_common::contracts::AnswerState;
use fleet_common::subjects::enroll_subjects;
use fleet_common::time::Timestamp;

use crate::callout::{Callout, Decision, EnrollGate, Outcome};
use crate::config::Config;
use crate::enroll::{Enrollment, Handled};
use crate::https::{self, HttpsError};
use crate::jwks::{HttpsJwks, JwksCache};
use crate::nkeys::{AccountSigner, NkeysError};
use crate::registry::{NatsRegistry, Registry};

/// Queue group of every callout instance.
pub const QUEUE_GROUP: &str = "fleet-auth-callout";
/// Worker threads: a JWKS refetch holds one for up to the IdP request
/// timeout while the others keep answering.
pub const WORKERS: usize = 8;
/// Enrollment worker threads (each waits on the registry for a request).
pub const ENROLL_WORKERS: usize = 8;
/// Requests waiting for a worker, at most (a few seconds of answers).
pub const INTAKE_CAPACITY: usize = 4096;
/// How often the intake logs the requests it dropped, when it dropped any.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How often an idle worker checks whether the service is stopping.
const WORKER_POLL: Duration = Duration::from_millis(500);
/// Joining the workers once the connection is closed.
const WORKER_JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest NATS password file read.
const MAX_PASSWORD_FILE_BYTES: u64 = 4096;

/// Why the service could not start or stopped.
#[derive(Debug)]
pub enum ServiceError {
    Seed(NkeysError),
    Password {
        path: PathBuf,
        detail: String,
    },
    Https(HttpsError),
    Connect {
        url: String,
        detail: String,
    },
    ConnectTimeout {
        url: String,
    },
    Subscribe(io::Error),
    Spawn(io::Error),
    /// The NATS connection closed for good.
    Closed,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Seed(e) => e.fmt(f),
            Self::Password { path, detail } => write!(
                f,
                "NATS password file {}: {detail}",
                path.display()
            ),
            Self::Https(e) => e.fmt(f),
            Self::Connect { url, detail } => write!(
                f,
                "cannot connect to NATS at {url}: {detail}; check nats_url, nats_user and the password (the user must be in auth_callout.auth_users)"
            ),
            Self::ConnectTimeout { url } => write!(
                f,
                "connecting to NATS at {url} took longer than {} s; check nats_url and the network",
                NATS_CONNECT_ATTEMPT_TIMEOUT.as_secs()
            ),
            Self::Subscribe(e) => write!(f, "cannot subscribe to {AUTH_CALLOUT_SUBJECT}: {e}"),
            Self::Spawn(e) => write!(f, "cannot start a worker thread: {e}"),
            Self::Closed => f.write_str("the NATS connection closed for good"),
        }
    }
}

impl std::error::Error for ServiceError {}

/// Unix seconds now.
fn unix_now() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// Reads a secret file: bounded, not readable by group or others, surrounding
/// whitespace dropped, not empty.
pub fn read_secret(path: &Path) -> Result<String, ServiceError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |detail: String| ServiceError::Password {
        path: path.to_owned(),
        detail,
    };
    let mode = std::fs::metadata(path)
        .map_err(|e| err(e.to_string()))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(err(format!(
            "mode {mode:04o} lets group or others read it; run chmod 0600 {}",
            path.display()
        )));
    }
    let bytes = fleet_common::durable::read_bounded(path, MAX_PASSWORD_FILE_BYTES)
        .map_err(|e| err(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| err("not UTF-8".to_owned()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(err("empty".to_owned()));
    }
    Ok(secret.to_owned())
}

/// Runs the callout until the NATS connection closes for good.
pub fn run(config: &Config) -> Result<(), ServiceError> {
    let signer = AccountSigner::load(&config.issuer_seed_file).map_err(ServiceError::Seed)?;
    let password = read_secret(&config.nats_password_file)?;
    let jwks = match &config.jwks {
        Some(j) => {
            let agent = https::agent(j.https_ca_file.as_deref()).map_err(ServiceError::Https)?;
            let jwks = JwksCache::new(
                Box::new(HttpsJwks::new(agent, j.url.clone())),
                j.min_refetch,
                j.max_age,
            );
            if let Err(e) = jwks.refresh(Instant::now()) {
                log::warn!("{e}; retrying when the first device connects");
            }
            Some(jwks)
        }
        None => {
            log::info!("no identity provider configured: admitting enrolled devices only");
            None
        }
    };
    let tokens = match &config.enrollment {
        Some(e) => e
            .token_files
            .iter()
            .map(|p| read_secret(p))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };

    let closed = Arc::new(AtomicBool::new(false));
    let nc = connect(config, &password, Arc::clone(&closed))?;
    let registry: Arc<dyn Registry> = Arc::new(NatsRegistry::new(nc.clone()));
    let mut callout = Callout::new(signer, jwks, config.policy.clone());
    if let Some(e) = &config.enrollment {
        callout = callout.with_enrollment(
            EnrollGate {
                tokens,
                idp_requires_approval: e.bearer_requires_approval,
            },
            Arc::clone(&registry),
        );
    }
    let callout = Arc::new(callout);
    log::info!(
        issuer = callout.issuer().as_str();
        "signing as issuer account {}", callout.issuer()
    );
    if let Some(e) = &config.enrollment {
        let sub = nc
            .queue_subscribe(&enroll_subjects(), QUEUE_GROUP)
            .map_err(ServiceError::Subscribe)?;
        let enrollment = Arc::new(Enrollment::new(e.auto_approve.clone()));
        for i in 0..ENROLL_WORKERS {
            let (sub, enrollment, registry, stop) = (
                sub.clone(),
                Arc::clone(&enrollment),
                Arc::clone(&registry),
                Arc::clone(&closed),
            );
            thread::Builder::new()
                .name(format!("enroll-worker-{i}"))
                .spawn(move || enroll_work(&sub, &enrollment, registry.as_ref(), &stop))
                .map_err(ServiceError::Spawn)?;
        }
        log::info!(
            subject = enroll_subjects().as_str(),
            auto_approve = e.auto_approve.as_ref().map_or("", |s| s.as_str());
            "answering enrollment requests"
        );
    }
    let sub = nc
        .queue_subscribe(AUTH_CALLOUT_SUBJECT, QUEUE_GROUP)
        .map_err(ServiceError::Subscribe)?;
    nc.flush().map_err(ServiceError::Subscribe)?;

    let (done_tx, done_rx) = mpsc::channel::<usize>();
    let mut handles = Vec::with_capacity(WORKERS + 1);
    let (queue_tx, queue_rx) = mpsc::sync_channel::<(Instant, nats::Message)>(INTAKE_CAPACITY);
    let queue = Arc::new(Mutex::new(queue_rx));
    let stale = Arc::new(AtomicU64::new(0));
    {
        let stop = Arc::clone(&closed);
        let stale = Arc::clone(&stale);
        let intake = thread::Builder::new()
            .name("auth-callout-intake".into())
            .spawn(move || intake(&sub, &queue_tx, &stale, &stop));
        match intake {
            Ok(h) => handles.push(h),
            Err(e) => {
                closed.store(true, Ordering::SeqCst);
                return Err(ServiceError::Spawn(e));
            }
        }
    }
    for i in 0..WORKERS {
        let queue = Arc::clone(&queue);
        let callout = Arc::clone(&callout);
        let stop = Arc::clone(&closed);
        let stale = Arc::clone(&stale);
        let done = done_tx.clone();
        let handle = thread::Builder::new()
            .name(format!("auth-callout-worker-{i}"))
            .spawn(move || {
                work(&queue, &callout, &stale, &stop);
                let _ = done.send(i);
            });
        match handle {
            Ok(h) => handles.push(h),
            Err(e) => {
                closed.store(true, Ordering::SeqCst);
                return Err(ServiceError::Spawn(e));
            }
        }
    }
    drop(done_tx);
    log::info!(
        subject = AUTH_CALLOUT_SUBJECT, workers = WORKERS;
        "answering authorization requests"
    );
    notify_ready();

    // Block until a worker ends: only a closed connection ends one (the
    // intake ends, and the queue with it).
    let _ = done_rx.recv();
    closed.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WORKER_JOIN_TIMEOUT;
    let mut ended = 1;
    while ended < WORKERS {
        match done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(_) => ended += 1,
            Err(_) => {
                log::error!(
                    "{} worker threads did not stop within {WORKER_JOIN_TIMEOUT:?}",
                    handles.len() - ended
                );
                return Err(ServiceError::Closed);
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    Err(ServiceError::Closed)
}

/// Connects on a helper thread so the attempt is bounded (the nats crate has
/// no connect timeout of its own).
fn connect(
    config: &Config,
    password: &str,
    closed: Arc<AtomicBool>,
) -> Result<nats::Connection, ServiceError> {
    let mut options = nats::Options::with_user_pass(&config.nats_user, password)
        .with_name(QUEUE_GROUP)
        .max_reconnects(None)
        .disconnect_callback(|| log::warn!("NATS connection lost; reconnecting"))
        .reconnect_callback(|| log::info!("NATS connection re-established"))
        .close_callback(move || closed.store(true, Ordering::SeqCst));
    if let Some(ca) = &config.nats_ca_file {
        options = options.add_root_certificate(ca);
    }
    let url = config.nats_url.clone();
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("auth-callout-connect".to_owned())
        .spawn(move || {
            let _ = tx.send(options.connect(url.as_str()));
        })
        .map_err(ServiceError::Spawn)?;
    match rx.recv_timeout(NATS_CONNECT_ATTEMPT_TIMEOUT) {
        Ok(Ok(nc)) => Ok(nc),
        Ok(Err(e)) => Err(ServiceError::Connect {
            url: config.nats_url.clone(),
            detail: e.to_string(),
        }),
        Err(_) => Err(ServiceError::ConnectTimeout {
            url: config.nats_url.clone(),
        }),
    }
}

/// One worker: take a request, decide, answer, log; until closed.
/// The intake: each request stamped as it arrives and queued for the
/// workers, or dropped when [`INTAKE_CAPACITY`] are already waiting; the
/// drops (and the workers' stale ones) logged every [`DROP_LOG_INTERVAL`].
/// Ends when the subscription does, which ends the workers.
fn intake(
    sub: &nats::Subscription,
    queue: &mpsc::SyncSender<(Instant, nats::Message)>,
    stale: &AtomicU64,
    closed: &AtomicBool,
) {
    let mut full = 0u64;
    let mut logged = Instant::now();
    while !closed.load(Ordering::SeqCst) {
        match sub.next_timeout(WORKER_POLL) {
            Ok(m) => match queue.try_send((Instant::now(), m)) {
                Ok(()) => {}
                Err(mpsc::TrySendError::Full(_)) => full += 1,
                Err(mpsc::TrySendError::Disconnected(_)) => return,
            },
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
            Err(e) => {
                if !closed.load(Ordering::SeqCst) {
                    log::error!("subscription ended: {e}");
                }
                return;
            }
        }
        if logged.elapsed() >= DROP_LOG_INTERVAL {
            let late = stale.swap(0, Ordering::Relaxed);
            if full + late > 0 {
                log::warn!(
                    queue_full = full, stale = late;
                    "overloaded: {full} authorization requests dropped with {INTAKE_CAPACITY} waiting, {late} dropped after waiting over {} ms; those clients are refused by the server and connect again (run another instance to answer more)",
                    CALLOUT_STALE_AFTER.as_millis()
                );
            }
            full = 0;
            logged = Instant::now();
        }
    }
}

/// One worker: take a request, answer it unless it waited longer than
/// [`CALLOUT_STALE_AFTER`], log; until closed or the intake ends.
fn work(
    queue: &Mutex<mpsc::Receiver<(Instant, nats::Message)>>,
    callout: &Callout,
    stale: &AtomicU64,
    closed: &AtomicBool,
) {
    while !closed.load(Ordering::SeqCst) {
        let next = match queue.lock() {
            Ok(q) => q.recv_timeout(WORKER_POLL),
            Err(_) => return,
        };
        let (arrived, msg) = match next {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if arrived.elapsed() > CALLOUT_STALE_AFTER {
            stale.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        answer(&msg, callout);
    }
}

/// One enrollment worker: take a request, answer, log; until closed.
fn enroll_work(
    sub: &nats::Subscription,
    enrollment: &Enrollment,
    registry: &dyn Registry,
    closed: &AtomicBool,
) {
    while !closed.load(Ordering::SeqCst) {
        let msg = match sub.next_timeout(WORKER_POLL) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
            Err(e) => {
                if !closed.load(Ordering::SeqCst) {
                    log::error!("enrollment subscription ended: {e}");
                }
                return;
            }
        };
        let handled = enrollment.handle(
            registry,
            &msg.subject,
            &msg.data,
            Instant::now(),
            Timestamp::now(),
        );
        match &handled {
            Handled::Answered { answer, wrote, .. } => {
                match serde_json::to_vec(answer) {
                    Ok(body) => {
                        if let Err(e) = msg.respond(body) {
                            log::warn!("cannot answer an enrollment request: {e}");
                        }
                    }
                    Err(e) => log::error!("cannot encode an enrollment answer: {e}"),
                }
                if wrote.is_some() || answer.state != AnswerState::SlowDown {
                    log::info!("{handled}");
                } else {
                    log::debug!("{handled}");
                }
            }
            Handled::Ignored(_) => log::warn!("{handled}"),
        }
    }
}

fn answer(msg: &nats::Message, callout: &Callout) {
    match callout.handle(&msg.data, unix_now(), Instant::now()) {
        Outcome::Answer {
            response,
            decision,
            requester: r,
        } => {
            // The client chose its name: escaped, so it cannot forge lines.
            let client_name = format!("{:?}", r.client_name);
            match &decision {
                Decision::Authorized {
                    device,
                    expires,
                    subject,
                } => log::info!(
                    device = device.as_str(),
                    subject = subject.as_deref().unwrap_or(""),
                    expires = *expires,
                    client_host = r.client_host.as_str(),
                    client_id = r.client_id,
                    server = r.server.as_str();
                    "authorized device {device}"
                ),
                Decision::Enroll {
                    key,
                    claimed,
                    expires,
                } => log::info!(
                    key = key.as_str(),
                    claimed = format!("{claimed:?}").as_str(),
                    expires = *expires,
                    client_host = r.client_host.as_str(),
                    client_id = r.client_id,
                    server = r.server.as_str();
                    "admitted {claimed:?} (key {key}) to enrollment only"
                ),
                Decision::Refused(why) => log::warn!(
                    client_host = r.client_host.as_str(),
                    client_id = r.client_id,
                    client_name = client_name.as_str(),
                    server = r.server.as_str();
                    "refused: {why}"
                ),
            }
            if let Err(e) = msg.respond(response) {
                log::error!("cannot send the authorization response: {e}");
            }
        }
        Outcome::Unanswerable(e) => log::warn!("authorization request not answered: {e}"),
    }
}

/// READY=1 to systemd when started by it (Type=notify); nothing otherwise.
fn notify_ready() {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        if let Err(e) = libsystemd::daemon::notify(false, &[libsystemd::daemon::NotifyState::Ready])
        {
            log::warn!("cannot notify systemd: {e}");
        }
    }
}
