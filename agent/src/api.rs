//! The agent's local API on `agent.sock` (`docs/design/protocol.md` "The
//! local sockets"): `status` (the agent's view) and `configstate` (read, or set
//! `changefreeze` / `configured`).
//!
//! Who may call: root, members of group `fleet-control`, and the agent's
//! own user (so the agent's account can inspect it, and tests run without
//! root). The socket is mode 0660, owned by the agent's user, group
//! `fleet-control` when that group exists and the agent may give it (root,
//! or a member: device setup makes `fleet-agent` one); otherwise only the
//! agent's user and root can reach it, and a warning says so. Peer
//! credentials are checked before a byte is read; anyone else is answered
//! `forbidden`.
//!
//! The socket opens right after the lock is taken, before Podman and NATS
//! are reached and long before READY=1: a safety controller can ask during
//! a slow start and is told why a freeze is refused (`no-snapshot`,
//! `disconnected`). It closes when the process exits, after the drain, so
//! `draining` is answered while a mutation finishes.
//!
//! A freeze request gathers what lies outside the agent (the connection,
//! the snapshot, the updater's transaction: one bounded call) and then
//! decides and enters under the mutation gate's lock ([`FreezeControl`]).
//! An unfreeze asks every registered watcher for a new complete snapshot,
//! so missed changes are read again and reconciled.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AgentRequest, AgentStatusReply, ConfigStateName, ConfigStateReply, ErrorBody, ErrorCode,
    MutationAdmission, MutationsView, NatsView, Response,
};
use fleet_common::layout::CONTROL_GROUP;
use fleet_common::limits::FREEZE_DISCONNECTED_HEARTBEATS;
use fleet_common::socket::{
    Handler, Peer, PeerPolicy, Reply, RequestClass, ServerHandle, SocketError, SocketServer,
};
use fleet_common::validate::{BoundedText, DeviceId, Version};
use fleet_common::{users, Layout};

use crate::freeze::{self, Change, Conditions, FreezeControl, FreezeError, Upgrades};
use crate::gate::{Admission, MutationGate};
use crate::nats::watch::WatchStatus;
use crate::nats::Nats;

/// Mode of the socket: owner (the agent) and group (`fleet-control`).
const SOCKET_MODE: u32 = 0o660;

/// The handler of the agent socket. Parts that exist only later in the
/// start (the NATS connection, the desired-state watcher) are set when
/// they do; until then the API answers from what exists.
pub struct AgentApi {
    device: DeviceId,
    version: Version,
    freeze: Arc<FreezeControl>,
    gate: Arc<MutationGate>,
    upgrades: Arc<dyn Upgrades>,
    started: Instant,
    disconnect_window: Duration,
    nats: OnceLock<Arc<Nats>>,
    desired: OnceLock<Arc<WatchStatus>>,
    /// Watchers asked for a new snapshot at unfreeze.
    resync: Mutex<Vec<Arc<WatchStatus>>>,
}

impl std::fmt::Debug for AgentApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentApi")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl AgentApi {
    /// `heartbeat`: the configured interval; NATS unreachable for longer
    /// than [`FREEZE_DISCONNECTED_HEARTBEATS`] of them refuses a freeze.
    pub fn new(
        device: DeviceId,
        version: Version,
        freeze: Arc<FreezeControl>,
        gate: Arc<MutationGate>,
        upgrades: Arc<dyn Upgrades>,
        heartbeat: Duration,
    ) -> Self {
        Self {
            device,
            version,
            freeze,
            gate,
            upgrades,
            started: Instant::now(),
            disconnect_window: heartbeat * FREEZE_DISCONNECTED_HEARTBEATS,
            nats: OnceLock::new(),
            desired: OnceLock::new(),
            resync: Mutex::new(Vec::new()),
        }
    }

    /// The connection, once made.
    pub fn set_nats(&self, nats: Arc<Nats>) {
        let _ = self.nats.set(nats);
    }

    /// The desired-state watcher: its snapshot gates a freeze, and it reads
    /// a new one at unfreeze.
    pub fn set_desired(&self, status: Arc<WatchStatus>) {
        self.resync_on_unfreeze(Arc::clone(&status));
        let _ = self.desired.set(status);
    }

    /// Another watcher to read a new snapshot at unfreeze.
    pub fn resync_on_unfreeze(&self, status: Arc<WatchStatus>) {
        self.resync
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(status);
    }

    fn disconnected_for(&self) -> Option<Duration> {
        match self.nats.get() {
            Some(n) => n.disconnected_for(),
            // Never connected yet: disconnected since the start.
            None => Some(self.started.elapsed()),
        }
    }

    /// Everything a freeze decision needs besides the gate; asks the
    /// updater (bounded).
    fn conditions(&self) -> Conditions {
        Conditions {
            snapshot_complete: self.desired.get().is_some_and(|w| w.in_sync()),
            disconnected_for: self.disconnected_for(),
            disconnect_window: self.disconnect_window,
            upgrade: self.upgrades.view(),
        }
    }

    fn status(&self) -> Reply {
        let conditions = self.conditions();
        let gate = self.gate.view();
        let config_state = self.freeze.report();
        let freeze_blockers = if config_state.state.is_frozen() {
            Vec::new()
        } else {
            freeze::refusals(&conditions, &gate)
                .into_iter()
                .map(|b| b.reason)
                .collect()
        };
        let nats = match conditions.disconnected_for {
            None => NatsView::Connected {},
            Some(d) => NatsView::Disconnected {
                for_secs: d.as_secs(),
            },
        };
        Response::Ok(AgentStatusReply {
            device_id: self.device.clone(),
            agent_version: self.version.clone(),
            config_state,
            nats,
            snapshot_complete: conditions.snapshot_complete,
            mutations: MutationsView {
                admission: match gate.admission {
                    Admission::Open => MutationAdmission::Open,
                    Admission::Frozen => MutationAdmission::Frozen,
                    Admission::Closed(_) => MutationAdmission::Draining,
                },
                in_flight: gate.in_flight.map(BoundedText::truncate),
                pending: u32::try_from(gate.pending).unwrap_or(u32::MAX),
                pulling: gate.pulling.map(BoundedText::truncate),
            },
            upgrade: conditions.upgrade,
            freeze_blockers,
        })
        .into()
    }

    fn current(&self) -> Reply {
        Response::Ok(ConfigStateReply {
            config_state: self.freeze.report(),
        })
        .into()
    }

    fn freeze(&self, reason: Option<BoundedText>, peer: &Peer) -> Reply {
        let conditions = self.conditions();
        match self.freeze.freeze(peer.uid, reason, &conditions) {
            Ok(Change::Done) => {
                log::info!(
                    "changefreeze asked by uid {} (pid {}): entered",
                    peer.uid,
                    peer.pid
                );
                self.current()
            }
            Ok(Change::Already) => self.current(),
            Err(e) => {
                log::warn!(
                    "changefreeze asked by uid {} (pid {}): {e}",
                    peer.uid,
                    peer.pid
                );
                failure(&e)
            }
        }
    }

    fn unfreeze(&self, peer: &Peer) -> Reply {
        match self.freeze.unfreeze(peer.uid) {
            Ok(Change::Done) => {
                for w in self.resync.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    w.request_resync();
                }
                log::info!(
                    "configured asked by uid {} (pid {}): change freeze ended; reading a new snapshot",
                    peer.uid,
                    peer.pid
                );
                self.current()
            }
            Ok(Change::Already) => self.current(),
            Err(e) => {
                log::error!(
                    "configured asked by uid {} (pid {}): {e}",
                    peer.uid,
                    peer.pid
                );
                failure(&e)
            }
        }
    }
}

/// The one mapping from a failed change to the wire.
fn failure(e: &FreezeError) -> Reply {
    let code = match e {
        FreezeError::Refused(_) => ErrorCode::Refused,
        FreezeError::Persist { .. } => ErrorCode::Internal,
    };
    let mut body = ErrorBody::new(code, e.to_string());
    body.reasons = e.reasons();
    if !body.reasons.is_empty() {
        body.retry_after_secs = Some(freeze::retry_after(&body.reasons).as_secs());
    }
    Response::<()>::Err(body).into()
}

impl Handler for AgentApi {
    type Request = AgentRequest;

    fn class(request: &AgentRequest) -> RequestClass {
        match request {
            AgentRequest::Status {}
            | AgentRequest::Configstate {
                set: None,
                reason: None,
            } => RequestClass::ReadOnly,
            AgentRequest::Configstate { .. } => RequestClass::Mutating,
        }
    }

    fn handle(&self, request: AgentRequest, peer: &Peer) -> Reply {
        match request {
            AgentRequest::Status {} => self.status(),
            AgentRequest::Configstate {
                set: None,
                reason: None,
            } => self.current(),
            AgentRequest::Configstate {
                set: Some(ConfigStateName::Changefreeze),
                reason,
            } => self.freeze(reason, peer),
            AgentRequest::Configstate {
                set: Some(ConfigStateName::Configured),
                reason: None,
            } => self.unfreeze(peer),
            AgentRequest::Configstate {
                reason: Some(_), ..
            } => Reply::error(
                ErrorCode::Invalid,
                "a reason goes only with \"set\": \"changefreeze\"",
            ),
        }
    }
}

/// Who may call: root, the agent's own user, group `fleet-control`.
pub fn peer_policy(own_uid: u32, control_gid: Option<u32>) -> PeerPolicy {
    let mut uids = vec![0, own_uid];
    uids.dedup();
    PeerPolicy {
        uids,
        gids: control_gid.into_iter().collect(),
    }
}

/// The group the socket can be given: `control` when this process is
/// root or a member (only then may it `chown` to it).
fn socket_group(control: Option<u32>, uid: u32, gid: u32, groups: &[u32]) -> Option<u32> {
    control.filter(|g| uid == 0 || gid == *g || groups.contains(g))
}

/// Binds `agent.sock` and starts answering.
pub fn serve(layout: &Layout, api: Arc<AgentApi>) -> Result<ServerHandle, SocketError> {
    let control = users::lookup_group(CONTROL_GROUP);
    let (uid, gid) = users::current_ids();
    let own_groups =
        users::supplementary_groups(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
            .unwrap_or_default();
    let group = socket_group(control, uid, gid, &own_groups);
    match (control, group) {
        (None, _) => log::warn!("group {CONTROL_GROUP} does not exist: only root and this agent's user may use the agent socket"),
        (Some(_), None) => log::warn!("this agent's user is not in group {CONTROL_GROUP}, so the agent socket cannot be given to it: only root and this agent's user may use it; add the user to the group (device setup does)"),
        (Some(_), Some(_)) => {}
    }
    SocketServer::bind(
        "agent-api",
        &layout.agent_socket(),
        SOCKET_MODE,
        group,
        peer_policy(uid, control),
    )?
    .spawn(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            pid: 1,
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn root_the_agent_and_fleet_control_only() {
        let p = peer_policy(998, Some(996));
        assert!(p.allows(&peer(0, 0, &[])));
        assert!(p.allows(&peer(998, 997, &[])));
        assert!(p.allows(&peer(1000, 1000, &[996])));
        assert!(p.allows(&peer(1001, 996, &[])));
        assert!(!p.allows(&peer(1000, 1000, &[24, 27])));
        assert_eq!(socket_group(Some(996), 0, 0, &[]), Some(996));
        assert_eq!(socket_group(Some(996), 998, 997, &[996]), Some(996));
        assert_eq!(socket_group(Some(996), 998, 996, &[]), Some(996));
        assert_eq!(socket_group(Some(996), 998, 997, &[4]), None);
        assert_eq!(socket_group(None, 0, 0, &[]), None);
        let root_agent = peer_policy(0, None);
        assert_eq!(root_agent.uids, vec![0]);
        assert!(!root_agent.allows(&peer(65534, 65534, &[])));
    }
}
