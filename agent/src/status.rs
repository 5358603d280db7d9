//! Status publishing: the thread `agent-status` writes this device's
//! `fleet-status` keys, each write acknowledged by JetStream.
//!
//! Every key is written when what it says changes, never on a timer, except
//! the heartbeat's slow keep-alive: an idle device writes nothing else
//! (docs/operator/traffic.md). Presence comes from the cluster's own
//! connection state, not from these writes.
//!
//! - `<device>.info`: once at start (by [`publish_info`], before READY),
//!   then on change: the Podman version is re-read every
//!   [`INFO_REFRESH_BEATS`] heartbeat intervals and the info republished
//!   when it differs. The read runs on its own thread (`agent-podman-info`,
//!   bounded by the Podman command timeout), never on this one: nothing
//!   here waits for Podman.
//! - `<device>.heartbeat`: at start; when what it carries changes (the
//!   config state, whether Podman answers); and as a keep-alive after
//!   `intervals.keepalive-secs` without one, with a random jitter of up to
//!   a tenth so a fleet started together does not write in step. The last
//!   one of a run carries `stopping` with the drain duration. Every
//!   heartbeat interval (`intervals.heartbeat-secs`) the config state is
//!   looked at again, locally: what waits for an unfreeze may change
//!   without a message.
//! - `<device>.workloads`: each report the reconciler sends (it sends only
//!   changes).
//! - `<device>.health`: the same, for the reconciler's health reports.
//! - `<device>.traffic`: each report of the traffic counter
//!   ([`crate::traffic`]), at its own slow cadence.
//!
//! A failed write is retried every [`RETRY_DELAY`] until it succeeds or a
//! newer value replaces it.
//!
//! Info and heartbeat carry the config state of [`FreezeControl`]; when it
//! changes (a freeze, an unfreeze, the waiting counts) both are published
//! at once ([`StatusMsg::ConfigState`]). The heartbeat also says whether
//! Podman answers, as the last workloads report does; a change of that is
//! written at once.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    ConfigStateReport, DeviceInfo, HealthReport, Heartbeat, PodmanUnreachable, Stopping,
    TrafficReport, WorkloadsReport,
};
use fleet_common::limits::NATS_REQUEST_TIMEOUT;
use fleet_common::subjects::{status_key, StatusKey, BUCKET_STATUS};
use fleet_common::validate::{BoundedText, Version};
use fleet_common::Timestamp;

use crate::freeze::FreezeControl;
use crate::jitter::Jitter;
use crate::nats::{kv, Nats, PublishError};
use crate::podman::Podman;
use crate::threads;

/// How often the Podman version is re-read for `<device>.info`, in
/// heartbeat intervals (10 minutes at the default 30 s; tests with short
/// intervals see it in seconds).
pub const INFO_REFRESH_BEATS: u32 = 20;
/// How long stopping waits for `agent-podman-info`: it may be in a Podman
/// call, which the daemon's exit kills ([`fleet_common::process::kill_live_groups`]).
const INFO_JOIN_TIMEOUT: Duration = Duration::from_millis(500);
/// Delay before retrying a failed write.
const RETRY_DELAY: Duration = Duration::from_secs(5);
/// How long stopping waits for the thread after its last write.
const JOIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes `<device>.info`.
pub fn publish_info(nats: &Nats, info: &DeviceInfo) -> Result<(), PublishError> {
    kv::put_json(
        nats,
        BUCKET_STATUS,
        &status_key(nats.device(), StatusKey::Info),
        info,
        NATS_REQUEST_TIMEOUT,
    )
    .map(drop)
}

/// The delay to the next keep-alive: `interval` plus up to a tenth of it.
fn next_keepalive_in(interval: Duration, jitter: &mut Jitter) -> Duration {
    interval + jitter.up_to(interval / 10)
}

/// What a heartbeat says beyond its time: a change of it is written at once.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BeatContent {
    config_state: ConfigStateReport,
    podman_unreachable: bool,
}

/// Messages to the status thread.
#[derive(Debug)]
pub enum StatusMsg {
    Workloads(WorkloadsReport),
    Health(HealthReport),
    /// `agent-podman-info` re-read the Podman version.
    PodmanVersion(Result<String, String>),
    /// The config state changed: publish info and a heartbeat now.
    ConfigState,
    /// The traffic counters, for `<device>.traffic`.
    Traffic(TrafficReport),
    /// Publish the last heartbeat, with `stopping`, and exit; the result
    /// goes to `done`.
    Stopping {
        drain: Duration,
        done: SyncSender<Result<(), String>>,
    },
}

/// The status publisher's state; moved onto its thread by [`Self::spawn`].
#[derive(Debug)]
pub struct StatusPublisher {
    pub nats: Arc<Nats>,
    pub info: DeviceInfo,
    pub agent_version: Version,
    pub started: Instant,
    /// How often the config state is looked at again (`heartbeat-secs`).
    pub heartbeat: Duration,
    /// The heartbeat written although nothing changed (`keepalive-secs`).
    pub keepalive: Duration,
    /// Re-read for the version in `<device>.info`; `None` when disabled.
    pub podman: Option<Podman>,
    pub freeze: Arc<FreezeControl>,
}

/// The running status thread.
#[derive(Debug)]
pub struct StatusHandle {
    tx: Sender<StatusMsg>,
    thread: JoinHandle<()>,
    /// `agent-podman-info`; dropping the sender stops it.
    info: Option<(Sender<()>, JoinHandle<()>)>,
}

impl StatusHandle {
    pub fn sender(&self) -> Sender<StatusMsg> {
        self.tx.clone()
    }

    /// Publishes the stopping heartbeat (acknowledged, within `timeout`)
    /// and joins the thread.
    pub fn stop(self, drain: Duration, timeout: Duration) -> Result<(), String> {
        let (done, rx) = mpsc::sync_channel(1);
        if self.tx.send(StatusMsg::Stopping { drain, done }).is_err() {
            return Err("the status thread is gone".into());
        }
        let r = rx
            .recv_timeout(timeout)
            .unwrap_or_else(|_| Err(format!("no acknowledgement within {} s", timeout.as_secs())));
        threads::join_within(self.thread, JOIN_TIMEOUT, "agent-status");
        if let Some((stop, thread)) = self.info {
            drop(stop);
            threads::join_within(thread, INFO_JOIN_TIMEOUT, "agent-podman-info");
        }
        r
    }
}

/// `agent-podman-info`: every `every`, reads the Podman version and sends
/// it to the status thread; ends when `stop` is dropped or the status
/// thread is gone.
fn refresh_podman_version(
    podman: &Podman,
    every: Duration,
    stop: &Receiver<()>,
    to_status: &Sender<StatusMsg>,
) {
    loop {
        match stop.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let v = podman.version().map_err(|e| e.to_string());
        if to_status.send(StatusMsg::PodmanVersion(v)).is_err() {
            return;
        }
    }
}

impl StatusPublisher {
    pub fn spawn(mut self) -> std::io::Result<StatusHandle> {
        let (tx, rx) = mpsc::channel();
        let info = match self.podman.take() {
            Some(podman) => {
                let (stop_tx, stop_rx) = mpsc::channel();
                let to_status = tx.clone();
                let every = self.heartbeat * INFO_REFRESH_BEATS;
                let thread = threads::spawn("agent-podman-info", move || {
                    refresh_podman_version(&podman, every, &stop_rx, &to_status)
                })?;
                Some((stop_tx, thread))
            }
            None => None,
        };
        let thread = threads::spawn("agent-status", move || self.run(&rx))?;
        Ok(StatusHandle { tx, thread, info })
    }

    fn heartbeat(
        &self,
        stopping: Option<Stopping>,
        podman_unreachable: Option<PodmanUnreachable>,
    ) -> Heartbeat {
        Heartbeat {
            at: Timestamp::now(),
            uptime_secs: self.started.elapsed().as_secs(),
            agent_version: self.agent_version.clone(),
            config_state: self.freeze.report(),
            stopping,
            podman_unreachable,
        }
    }

    fn put<T: serde::Serialize>(&self, key: StatusKey, value: &T) -> Result<(), PublishError> {
        kv::put_json(
            &self.nats,
            BUCKET_STATUS,
            &status_key(self.nats.device(), key),
            value,
            NATS_REQUEST_TIMEOUT,
        )
        .map(drop)
    }

    fn run(mut self, rx: &Receiver<StatusMsg>) {
        let device = self.nats.device().as_str().to_owned();
        let mut jitter = Jitter::new();
        let mut next_look = Instant::now() + self.heartbeat;
        // When the heartbeat is written next: at once at start, a keep-alive
        // later after each write, at once on a change.
        let mut beat_at = Instant::now();
        // What the last heartbeat written, or tried, said: a change from it
        // is written at once; a failed write is tried again later.
        let mut attempted: Option<BeatContent> = None;
        let mut workloads: Option<WorkloadsReport> = None;
        let mut traffic: Option<TrafficReport> = None;
        let mut health: Option<HealthReport> = None;
        // As the last workloads report said.
        let mut podman_unreachable: Option<PodmanUnreachable> = None;
        let mut info_pending = false;
        let mut retry_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let wake = [Some(next_look), Some(beat_at), retry_at]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(next_look);
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(StatusMsg::Workloads(r)) => {
                    podman_unreachable = r.podman_unreachable.clone();
                    workloads = Some(r);
                    retry_at = Some(Instant::now());
                }
                Ok(StatusMsg::Health(r)) => {
                    health = Some(r);
                    retry_at = Some(Instant::now());
                }
                Ok(StatusMsg::PodmanVersion(Ok(v))) => {
                    let v = Some(BoundedText::truncate(v));
                    if v != self.info.podman_version {
                        log::info!(device = device.as_str(); "Podman version is now {:?}", v);
                        self.info.podman_version = v;
                        self.info.updated_at = Timestamp::now();
                        info_pending = true;
                        retry_at = Some(Instant::now());
                    }
                }
                Ok(StatusMsg::PodmanVersion(Err(e))) => {
                    log::warn!(device = device.as_str(); "re-reading the Podman version: {e}")
                }
                Ok(StatusMsg::ConfigState) => {
                    self.look_at_config_state(&mut info_pending, &mut retry_at);
                    // Written even when the report looks the same: the
                    // freeze's caller waits to see it in NATS.
                    beat_at = Instant::now();
                }
                Ok(StatusMsg::Traffic(r)) => {
                    traffic = Some(r);
                    retry_at = Some(Instant::now());
                }
                Ok(StatusMsg::Stopping { drain, done }) => {
                    let at = Timestamp::now();
                    let hb = self.heartbeat(
                        Some(Stopping {
                            at,
                            drain_duration_ms: u64::try_from(drain.as_millis()).unwrap_or(u64::MAX),
                        }),
                        podman_unreachable.clone(),
                    );
                    let r = self
                        .put(StatusKey::Heartbeat, &hb)
                        .map_err(|e| e.to_string());
                    let _ = done.send(r);
                    return;
                }
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if now >= next_look {
                // What waits for an unfreeze may change without a message
                // (an intent held back): looked at locally, written only
                // when it changed.
                next_look = now + self.heartbeat;
                self.look_at_config_state(&mut info_pending, &mut retry_at);
            }
            let content = BeatContent {
                config_state: self.freeze.report(),
                podman_unreachable: podman_unreachable.is_some(),
            };
            if attempted.as_ref() != Some(&content) {
                beat_at = beat_at.min(now);
            }
            if now >= beat_at {
                let hb = self.heartbeat(None, podman_unreachable.clone());
                attempted = Some(BeatContent {
                    config_state: hb.config_state.clone(),
                    podman_unreachable: hb.podman_unreachable.is_some(),
                });
                match self.put(StatusKey::Heartbeat, &hb) {
                    Ok(()) => {
                        beat_at = Instant::now() + next_keepalive_in(self.keepalive, &mut jitter);
                    }
                    Err(e) => {
                        log::warn!(device = device.as_str(); "heartbeat not published: {e}; retrying in {} s", RETRY_DELAY.as_secs());
                        beat_at = now + RETRY_DELAY;
                    }
                }
            }
            if retry_at.is_some_and(|t| now >= t) {
                retry_at = None;
                if info_pending {
                    match self.put(StatusKey::Info, &self.info) {
                        Ok(()) => info_pending = false,
                        Err(e) => {
                            log::warn!(device = device.as_str(); "device info not published: {e}; retrying");
                            retry_at = Some(now + RETRY_DELAY);
                        }
                    }
                }
                if let Some(r) = &health {
                    match self.put(StatusKey::Health, r) {
                        Ok(()) => health = None,
                        Err(e) => {
                            log::warn!(device = device.as_str(); "workload health not published: {e}; retrying");
                            retry_at = Some(now + RETRY_DELAY);
                        }
                    }
                }
                if let Some(r) = &workloads {
                    match self.put(StatusKey::Workloads, r) {
                        Ok(()) => {
                            let (running, total) = r.ready();
                            crate::notify::status(&format!(
                                "running: {running}/{total} workloads up; NATS {}",
                                if self.nats.is_connected() {
                                    "connected"
                                } else {
                                    "reconnecting"
                                }
                            ));
                            workloads = None;
                        }
                        Err(e) => {
                            log::warn!(device = device.as_str(); "workload status not published: {e}; retrying");
                            retry_at = Some(now + RETRY_DELAY);
                        }
                    }
                }
                if let Some(r) = &traffic {
                    match self.put(StatusKey::Traffic, r) {
                        Ok(()) => traffic = None,
                        Err(e) => {
                            log::warn!(device = device.as_str(); "traffic report not published: {e}; retrying");
                            retry_at = Some(now + RETRY_DELAY);
                        }
                    }
                }
            }
        }
    }

    /// Takes the freeze's current report into the device info; when it
    /// changed, the info is to be written.
    fn look_at_config_state(&mut self, info_pending: &mut bool, retry_at: &mut Option<Instant>) {
        let report = self.freeze.report();
        if report != self.info.config_state {
            self.info.config_state = report;
            self.info.updated_at = Timestamp::now();
            *info_pending = true;
            *retry_at = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_jitter_stays_within_a_tenth() {
        let mut j = Jitter::new();
        let mut spread = Duration::ZERO;
        for _ in 0..1000 {
            let d = next_keepalive_in(Duration::from_secs(3600), &mut j);
            assert!(
                d >= Duration::from_secs(3600) && d <= Duration::from_secs(3960),
                "{d:?}"
            );
            spread = spread.max(d - Duration::from_secs(3600));
            let d = next_keepalive_in(Duration::from_secs(1), &mut j);
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_millis(1100),
                "{d:?}"
            );
        }
        assert!(spread > Duration::from_secs(60), "no jitter: {spread:?}");
    }
}
