//! Run mode, `fleet-agent run`: start up to readiness, run until SIGTERM,
//! drain, exit.
//!
//! Startup, each step reported as a systemd `STATUS=` line; `READY=1` only
//! when all are done:
//! 1. read the config; take the one-mutator lock; make the state directory;
//!    read the persisted change freeze (a frozen agent applies nothing
//!    newer than its last applied specs); open the agent socket;
//! 2. reach Podman (when enabled);
//! 3. connect to NATS (15 s per attempt, over a 3-minute window);
//! 4. publish device info, acknowledged; read the updater's transaction
//!    and, when it is starting its upgrade target, check this binary is
//!    that version (exit 22 without READY otherwise, so it rolls back);
//! 5. start the status publisher (status on change, a slow keep-alive), the
//!    traffic counter, the reconciler and the desired-state watcher, and
//!    wait for a complete desired snapshot;
//! 6. publish the updater's transaction status, acknowledged, and start
//!    following upgrade intents ([`crate::upgrade`]).
//!
//! Steps 4 to 6 are retried until the window that started with the
//! connection ends. A SIGTERM during startup ends the process cleanly.
//! Each step that blocks (Podman, the NATS connection, the device info
//! ack, the updater's transaction, the desired snapshot, the transaction
//! status ack, and after readiness the first intent snapshot) is logged
//! every 10 s while it is waited on (before READY also as `STATUS=`;
//! [`crate::startup`]), so a stall names itself.
//!
//! Drain on SIGTERM or SIGINT (`docs/design/upgrade.md` "Stop, switch, start"):
//! close the mutation gate, wait for the mutation in flight, stop the threads,
//! publish the acknowledged `stopping` heartbeat with the drain duration (and,
//! when the updater is stopping this agent for a cutover, the upgrade status
//! `stopping` with reason `updater`, side by side), flush NATS, close the agent
//! socket, send STOPPING=1, exit — within systemd's 60 s. The socket answers
//! (`draining`) until then.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_common::limits::{NATS_CONNECT_WINDOW, SYSTEMD_STOP_TIMEOUT};
use fleet_common::signals::{SignalError, TermSignal, TerminationSignals};
use fleet_common::validate::{Arch, Version};
use fleet_common::Timestamp;

use crate::api::{self, AgentApi};
use crate::config::{Config, ConfigError, PodmanMode};
use crate::desired;
use crate::disabled::DisabledReporter;
use crate::freeze::{AgentUpgrades, FreezeControl, Upgrades, UPDATER_STATUS_TIMEOUT};
use crate::gate::{ClosedBy, MutationGate};
use crate::lock::{AgentLock, LockError};
use crate::nats::{self, NatsError, PublishError, Reconnect};
use crate::notify;
use crate::podman::{Podman, PodmanError};
use crate::reconciler::{Reconciler, ReconcilerMsg, Report};
use crate::shutdown::Shutdown;
use crate::startup::StartupSteps;
use crate::status::{self, StatusMsg, StatusPublisher};
use crate::sysinfo;
use crate::traffic::{self, TrafficCounter};
use crate::upgrade::{self, StartupError, UpgradeState};

/// Part of systemd's stop bound spent waiting for the mutation in flight.
/// The rest covers, at worst: joining the reconciler (5 s) and the watcher
/// (3 s), the stopping heartbeat's and upgrade status's acks, written side
/// by side ([`STOPPING_ACK_TIMEOUT`]), the flush
/// ([`FLUSH_TIMEOUT`]) and closing (1 s): 40 + 5 + 3 + 8 + 2 + 1 = 59 s.
const DRAIN_BUDGET: Duration = Duration::from_secs(40);
/// Bound on the acknowledged stopping heartbeat and upgrade status.
const STOPPING_ACK_TIMEOUT: Duration = Duration::from_secs(8);
/// Bound on the final flush.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
const _: () = assert!(
    DRAIN_BUDGET.as_secs() + 5 + 3 + STOPPING_ACK_TIMEOUT.as_secs() + FLUSH_TIMEOUT.as_secs() + 1
        < SYSTEMD_STOP_TIMEOUT.as_secs()
);
/// Delay between startup retries of the device-info write.
const STARTUP_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Run mode failed; [`RunError::exit_code`] maps each to the exit status.
#[derive(Debug)]
pub enum RunError {
    Signals(SignalError),
    Config(ConfigError),
    Lock(LockError),
    /// The identity key or the enrollment record cannot be used.
    Enroll(crate::enroll::EnrollError),
    StateDir {
        path: PathBuf,
        source: io::Error,
    },
    UnsupportedArch,
    Version(String),
    Podman(PodmanError),
    Nats(NatsError),
    DeviceInfo {
        window: Duration,
        last: PublishError,
    },
    Snapshot {
        window: Duration,
        last: Option<String>,
    },
    Thread {
        name: &'static str,
        source: io::Error,
    },
    Socket(fleet_common::socket::SocketError),
    Upgrade(StartupError),
    /// The fleet no longer approves this device (decommissioned, rejected
    /// or pending again), learnt while running: what it said.
    Unenrolled(String),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Signals(e) => write!(f, "{e}"),
            Self::Config(e) => write!(f, "{e}"),
            Self::Lock(e) => write!(f, "{e}"),
            Self::Enroll(e) => write!(f, "{e}"),
            Self::StateDir { path, source } => write!(
                f,
                "creating the state directory {}: {source}; it is normally created by systemd-tmpfiles",
                path.display()
            ),
            Self::UnsupportedArch => write!(f, "this binary was built for an architecture the fleet does not ship (x86_64, aarch64, armv7)"),
            Self::Version(e) => write!(f, "the compiled version is invalid: {e}; rebuild with a valid FLEET_AGENT_VERSION"),
            Self::Podman(e) => write!(f, "Podman is not reachable: {e}; set podman.enabled to false if this device runs no containers"),
            Self::Nats(e) => write!(f, "{e}"),
            Self::DeviceInfo { window, last } => write!(
                f,
                "device info not acknowledged within {} s of connecting: {last}; check the fleet-status bucket exists and this device may write its keys",
                window.as_secs()
            ),
            Self::Snapshot { window, last } => {
                write!(f, "no complete desired-state snapshot within {} s of connecting", window.as_secs())?;
                match last {
                    Some(e) => write!(f, ": {e}"),
                    None => write!(f, "; check the fleet-desired bucket exists and this device may read it"),
                }
            }
            Self::Thread { name, source } => write!(f, "starting thread {name}: {source}"),
            Self::Socket(e) => write!(f, "the agent socket: {e}"),
            Self::Upgrade(e) => write!(f, "{e}"),
            Self::Unenrolled(what) => write!(
                f,
                "{what}; stopped with the workloads left running, so that the next start (systemd restarts the agent) waits for approval"
            ),
        }
    }
}

impl std::error::Error for RunError {}

impl RunError {
    /// The one mapping from failure to exit status (documented in `--help`;
    /// the shared codes match the probe's steps).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Signals(_) | Self::Thread { .. } | Self::UnsupportedArch | Self::Version(_) => 1,
            Self::Config(_) => 10,
            Self::Podman(_) => 11,
            Self::Nats(_) => 12,
            Self::Snapshot { .. } => 17,
            Self::Lock(_) => 20,
            Self::StateDir { .. } => 20,
            Self::Enroll(_) => 20,
            Self::DeviceInfo { .. } => 21,
            Self::Socket(_) => 23,
            Self::Unenrolled(_) => 24,
            Self::Upgrade(StartupError::NotPublished { .. }) => 21,
            Self::Upgrade(StartupError::NotTheTarget { .. }) => 22,
            Self::Upgrade(StartupError::Thread { .. } | StartupError::AlreadyStarted) => 1,
        }
    }
}

fn thread_err(name: &'static str) -> impl FnOnce(io::Error) -> RunError {
    move |source| RunError::Thread { name, source }
}

/// Runs the agent until a termination signal. `signals` must have been
/// blocked before any thread started.
pub fn run(config_path: &Path, signals: TerminationSignals, version: &str) -> Result<(), RunError> {
    let unenrolled = Arc::new(std::sync::Mutex::new(None));
    let ran = run_until(config_path, signals, version, &unenrolled);
    let told = unenrolled.lock().unwrap_or_else(|p| p.into_inner()).take();
    match told {
        // Whatever else failed after it (a start-up step denied, say),
        // this is why.
        Some(what) => Err(RunError::Unenrolled(what)),
        None => ran,
    }
}

/// [`run`], until a signal or until the enrollment recheck finds the
/// device no longer approved (then `unenrolled` holds what the fleet said).
fn run_until(
    config_path: &Path,
    signals: TerminationSignals,
    version: &str,
    unenrolled: &Arc<std::sync::Mutex<Option<String>>>,
) -> Result<(), RunError> {
    let started = Instant::now();
    let started_at = Timestamp::now();
    let version = Version::parse(version).map_err(|e| RunError::Version(e.to_string()))?;
    let arch = Arch::current().ok_or(RunError::UnsupportedArch)?;
    let shutdown = Arc::new(Shutdown::new());
    let gate = Arc::new(MutationGate::new());
    // A signal, or `None`: the agent stops itself (see `Recheck` below).
    let (sig_tx, sig_rx) = mpsc::channel::<Option<TermSignal>>();
    let stop_tx = sig_tx.clone();
    {
        let shutdown = Arc::clone(&shutdown);
        let gate = Arc::clone(&gate);
        signals
            .spawn_waiter("agent-signals", move |sig| {
                // Refuse new mutations at once, on this thread; the main
                // thread then waits for the one in flight.
                gate.close(ClosedBy::Shutdown);
                log::info!("{sig} received; draining");
                shutdown.request();
                let _ = sig_tx.send(Some(sig));
            })
            .map_err(RunError::Signals)?;
    }
    let steps = StartupSteps::spawn(Arc::clone(&shutdown)).map_err(thread_err("agent-startup"))?;

    // 1. Config, lock, state directory.
    let config = Config::load(config_path).map_err(RunError::Config)?;
    let layout = config.layout();
    let device = config.device_id.clone();
    let lock = Arc::new(AgentLock::acquire(&layout.agent_lock()).map_err(RunError::Lock)?);
    let state_dir = layout.agent_state_dir();
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&state_dir)
            .map_err(|source| RunError::StateDir {
                path: state_dir.clone(),
                source,
            })?;
    }
    log::info!(device = device.as_str(), version = version.as_str(); "config {} read, lock {} taken", config_path.display(), lock.path().display());
    // Temp files of a write a kill or power loss interrupted (freeze
    // state, seen attempts, applied specs): only this agent, holding the
    // lock, writes here.
    for t in fleet_common::durable::remove_stale_temps(&state_dir, "") {
        match t.removed {
            Ok(()) => log::info!(
                "removed the stale temp file {} ({} bytes) of an interrupted write",
                t.path.display(),
                t.bytes
            ),
            Err(e) => log::warn!("removing the stale temp file {}: {e}", t.path.display()),
        }
    }
    // The `enrollment` method: this device's own key, approved before
    // anything connects as the device (docs/design/enrollment.md).
    let mut config = config;
    match crate::enroll::ensure_enrolled(
        &mut config.nats,
        &device,
        &state_dir,
        version.as_str(),
        &shutdown,
    ) {
        Ok(()) => {}
        Err(crate::enroll::EnrollError::Interrupted) => return stopped_during_startup(),
        Err(e) => return Err(RunError::Enroll(e)),
    }
    // Before the freeze is read: a frozen agent holds forwarding from the start.
    let upgrade_state = UpgradeState::new();
    let upgrades: Arc<dyn Upgrades> = Arc::new(AgentUpgrades {
        updater_socket: layout.updater_socket(),
        timeout: UPDATER_STATUS_TIMEOUT,
        state: upgrade_state.clone(),
    });
    let freeze = Arc::new(FreezeControl::load(
        &layout,
        Arc::clone(&gate),
        Arc::clone(&upgrades),
    ));
    let api = Arc::new(AgentApi::new(
        device.clone(),
        version.clone(),
        Arc::clone(&freeze),
        Arc::clone(&gate),
        upgrades,
        config.intervals.heartbeat,
    ));
    let api_server = api::serve(&layout, Arc::clone(&api)).map_err(RunError::Socket)?;
    log::info!(device = device.as_str(); "agent socket {} open", layout.agent_socket().display());
    notify::status("config read, lock taken");

    // 2. Podman.
    let podman = match &config.podman {
        PodmanMode::Enabled(s) => {
            let p = Podman::new(s.clone());
            let v = {
                let _step = steps.begin("Podman (podman version)");
                p.version().map_err(RunError::Podman)?
            };
            log::info!(device = device.as_str(); "podman {v} reachable");
            notify::status(&format!("podman {v} reachable; connecting to NATS"));
            Some((p, v))
        }
        PodmanMode::Disabled => {
            notify::status("podman disabled; connecting to NATS");
            None
        }
    };

    // 3. NATS.
    let connecting = steps.begin(&format!(
        "the NATS connection ({})",
        config.nats.servers.join(", ")
    ));
    let nats = match nats::connect(
        &config.nats,
        &device,
        Reconnect::Forever,
        nats::Pings {
            interval: config.intervals.ping,
            max_out: config.intervals.max_pings_out,
        },
        NATS_CONNECT_WINDOW,
        &shutdown,
    ) {
        Ok(n) => Arc::new(n),
        Err(NatsError::Interrupted) => return stopped_during_startup(),
        Err(e) => return Err(RunError::Nats(e)),
    };
    drop(connecting);
    api.set_nats(Arc::clone(&nats));
    // The `enrollment` method: asked again when the server denies this
    // device what an approved one may do (`crate::enroll`, "While the
    // agent runs"). Left to process exit when stopping: it sees the
    // shutdown within a second, or its one bounded attempt ends.
    {
        let unenrolled = Arc::clone(unenrolled);
        let stopping = Arc::clone(&shutdown);
        let gate = Arc::clone(&gate);
        crate::enroll::Recheck {
            cfg: config.nats.clone(),
            device: device.clone(),
            state_dir: state_dir.clone(),
            version: version.as_str().to_owned(),
            nats: Arc::clone(&nats),
            shutdown: Arc::clone(&shutdown),
        }
        .spawn(move |what| {
            *unenrolled.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
            gate.close(ClosedBy::Shutdown);
            stopping.request();
            let _ = stop_tx.send(None);
        })
        .map_err(thread_err("agent-enroll-recheck"))?;
    }
    let window_end = Instant::now() + NATS_CONNECT_WINDOW;
    notify::status(&format!(
        "connected to NATS at {}; publishing device info",
        nats.servers()
    ));

    // 4. Device info, acknowledged.
    let info = sysinfo::device_info(
        &device,
        &version,
        arch,
        podman.as_ref().map(|(_, v)| v.as_str()),
        freeze.report(),
        started_at,
    );
    let acking = steps.begin("the device info acknowledgement (fleet-status)");
    loop {
        match status::publish_info(&nats, &info) {
            Ok(()) => break,
            Err(last) if Instant::now() + STARTUP_RETRY_DELAY >= window_end => {
                return Err(RunError::DeviceInfo {
                    window: NATS_CONNECT_WINDOW,
                    last,
                })
            }
            Err(e) => {
                log::warn!(device = device.as_str(); "publishing device info: {e}; retrying");
                if shutdown.sleep(STARTUP_RETRY_DELAY) {
                    return stopped_during_startup();
                }
            }
        }
    }
    drop(acking);
    // The updater's transaction, before anything mutates: after a cutover
    // this binary must be the target it is starting.
    let recovered = {
        let _step = steps.begin(&format!(
            "the updater's transaction (status on {})",
            layout.updater_socket().display()
        ));
        upgrade::recovered_transaction(&upgrade_state, &layout, &version)
            .map_err(RunError::Upgrade)?
    };
    notify::status("device info published; reading the desired state");

    // 5. Status publisher, reconciler, desired-state watcher, snapshot.
    let status = StatusPublisher {
        nats: Arc::clone(&nats),
        info,
        agent_version: version.clone(),
        started,
        heartbeat: config.intervals.heartbeat,
        keepalive: config.intervals.keepalive,
        podman: podman.as_ref().map(|(p, _)| p.clone()),
        freeze: Arc::clone(&freeze),
    }
    .spawn()
    .map_err(thread_err("agent-status"))?;
    {
        let to_status = status.sender();
        freeze.on_change(move || {
            let _ = to_status.send(StatusMsg::ConfigState);
        });
        // A change made before this point (by an early caller) is published too.
        let _ = status.sender().send(StatusMsg::ConfigState);
    }
    let traffic = TrafficCounter {
        nats: Arc::clone(&nats),
        ports: traffic::server_ports(&config.nats.servers),
        report_every: config.intervals.traffic,
        to_status: status.sender(),
        shutdown: Arc::clone(&shutdown),
    }
    .spawn()
    .map_err(thread_err("agent-traffic"))?;
    let reconciler = match podman {
        Some((p, _)) => {
            let to_status = status.sender();
            let r = Reconciler::new(
                device.clone(),
                p,
                Arc::clone(&gate),
                Arc::clone(&freeze),
                Arc::clone(&lock),
                &layout,
                config.intervals.resync,
                Box::new(move |report| {
                    let _ = to_status.send(match report {
                        Report::Workloads(r) => StatusMsg::Workloads(r),
                        Report::Health(r) => StatusMsg::Health(r),
                    });
                }),
            );
            Some(
                r.spawn(Arc::clone(&shutdown))
                    .map_err(thread_err("agent-reconcile"))?,
            )
        }
        None => None,
    };
    let watcher = {
        let to_reconciler = reconciler.as_ref().map(|r| r.sender());
        // Without Podman, the desired state is reported, never run.
        let mut disabled = match &to_reconciler {
            Some(_) => None,
            None => {
                let to_status = status.sender();
                Some(DisabledReporter::new(Box::new(move |report| {
                    let _ = to_status.send(StatusMsg::Workloads(report));
                })))
            }
        };
        desired::spawn(
            Arc::clone(&nats),
            config.intervals.check,
            Arc::clone(&shutdown),
            move |change| match (&to_reconciler, &mut disabled) {
                (Some(tx), _) => tx.send(ReconcilerMsg::Desired(Box::new(change))).is_ok(),
                (None, Some(d)) => {
                    d.apply(change);
                    true
                }
                (None, None) => true,
            },
        )
        .map_err(thread_err("agent-desired"))?
    };
    api.set_desired(Arc::clone(&watcher.status));
    let snapshot = steps.begin("the desired-state snapshot (fleet-workloads)");
    let keys = loop {
        if shutdown.is_requested() {
            break None;
        }
        let left = window_end.saturating_duration_since(Instant::now());
        match watcher
            .status
            .wait_first_snapshot(left.min(Duration::from_secs(1)))
        {
            Ok(n) => break Some(n),
            Err(last) if Instant::now() >= window_end => {
                return Err(RunError::Snapshot {
                    window: NATS_CONNECT_WINDOW,
                    last,
                })
            }
            Err(_) => {}
        }
    };
    drop(snapshot);
    let publishing = steps.begin("the updater's transaction status acknowledgement (fleet-status)");
    let upgrade = match keys {
        Some(_) => upgrade_state
            .start(upgrade::Start {
                nats: Arc::clone(&nats),
                layout: layout.clone(),
                arch,
                check: config.intervals.check,
                shutdown: Arc::clone(&shutdown),
                recovered,
                publish_until: window_end,
            })
            .map_err(RunError::Upgrade)?,
        None => None,
    };
    drop(publishing);
    if let Some(u) = &upgrade {
        api.resync_on_unfreeze(u.intents_status());
        let intents = u.intents_status();
        steps.until(
            "the first upgrade intent snapshot (fleet-control)",
            move || intents.in_sync(),
        );
    }
    steps.close();
    match (keys, &upgrade) {
        (Some(n), Some(_)) => notify::ready(&format!(
            "device {device}, {n} workloads desired, NATS connected"
        )),
        _ => log::info!("stopping before readiness"),
    }

    // Run until a signal.
    let sig = sig_rx.recv().ok().flatten();
    let drain_start = Instant::now();
    let in_flight = gate.close(ClosedBy::Shutdown);
    shutdown.request();
    match &in_flight {
        Some(what) => {
            notify::status(&format!("stopping: waiting for {what}"));
            log::info!(device = device.as_str(); "waiting for the mutation in flight: {what}");
        }
        None => notify::status("stopping"),
    }
    if !gate.wait_idle(DRAIN_BUDGET) {
        log::error!(device = device.as_str(); "{} still in flight after {} s; exiting without it", in_flight.unwrap_or_default(), DRAIN_BUDGET.as_secs());
    }
    // The drain is the wait for the mutation in flight
    // (`docs/design/upgrade.md` "Stop, switch, start").
    let drain = drain_start.elapsed();
    if let Some(r) = reconciler {
        r.stop();
    }
    watcher.join();
    traffic.join();
    // Woken by the drop, the start-up reporter exits at once.
    drop(steps);
    let acks_until = Instant::now() + STOPPING_ACK_TIMEOUT;
    let upgrade_stop = upgrade.map(|u| u.begin_stop(drain, acks_until));
    match status.stop(drain, STOPPING_ACK_TIMEOUT) {
        Ok(()) => {
            log::info!(device = device.as_str(); "stopping status acknowledged; drained in {} ms", drain.as_millis())
        }
        Err(e) => log::warn!(device = device.as_str(); "stopping status not acknowledged: {e}"),
    }
    if let Some(u) = upgrade_stop {
        u.wait();
    }
    if let Err(e) = nats.flush(FLUSH_TIMEOUT) {
        log::warn!("flushing NATS: {e}");
    }
    api_server.stop();
    // A Podman call still hung must not outlive the agent.
    let hung = fleet_common::process::kill_live_groups();
    if hung > 0 {
        log::warn!(device = device.as_str(); "killed {hung} Podman calls still running");
    }
    notify::stopping(&format!(
        "stopped on {}; drained in {} ms",
        sig.map_or("request", TermSignal::name),
        drain.as_millis()
    ));
    nats.close();
    Ok(())
}

fn stopped_during_startup() -> Result<(), RunError> {
    log::info!("stopped during startup");
    notify::stopping("stopped during startup");
    Ok(())
}
