//! Presence from the cluster for fleetctl (and the metrics exporter): one
//! read of who is connected, from every server's own connection state
//! (docs/design/presence.md). The paging and the judgement are
//! [`fleet_common::presence`]; this module sends the requests and waits.
//!
//! Steps: the servers expected are the peers of the `fleet-status` stream
//! (leader and replicas, down ones included; a stream without a cluster:
//! the one server), and every leaf node they list a link of; round 0 asks every server on
//! [`PRESENCE_CONNZ`] at once; each server's further pages are asked of it
//! alone, a window at a time; each round waits at most
//! [`PRESENCE_TIMEOUT`]. No responder on the subject means the server
//! config predates presence: [`Read::Unavailable`], and the callers fall
//! back to the heartbeat judgement ([`crate::fleet::heartbeat_stale`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use fleet_common::limits::{NATS_REQUEST_TIMEOUT, PRESENCE_TIMEOUT};
use fleet_common::nats_config::stream_info_subject;
use fleet_common::presence::{Collector, Connection, Presence};
use fleet_common::subjects::{BUCKET_STATUS, PRESENCE_CONNZ};
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;
use serde::Deserialize;

use crate::error::CtlError;

/// The least time round 0 waits for servers outside the expected peers
/// after the last peer answered: a round trip within a cluster.
const GRACE: Duration = Duration::from_millis(100);

/// One read of the cluster's presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Known(Presence),
    /// The cluster gives no presence (why): a server config that predates it.
    Unavailable(String),
}

impl Read {
    /// The connection state of `device` (None: no presence, judge by
    /// heartbeat).
    pub fn connection(
        &self,
        device: &DeviceId,
        last_seen: Option<Timestamp>,
    ) -> Option<Connection> {
        match self {
            Read::Known(p) => Some(p.connection(device, last_seen)),
            Read::Unavailable(_) => None,
        }
    }
}

/// The per-device connection state of `devices` (with the best known time
/// each was last there), from one read: the function a metrics exporter
/// calls. `Err`: the connection to NATS failed; `Ok(None)`: the cluster
/// gives no presence.
pub fn connections(
    conn: &nats::Connection,
    devices: &[(DeviceId, Option<Timestamp>)],
) -> Result<Option<BTreeMap<DeviceId, Connection>>, CtlError> {
    Ok(match read(conn)? {
        Read::Known(p) => Some(
            devices
                .iter()
                .map(|(d, seen)| (d.clone(), p.connection(d, *seen)))
                .collect(),
        ),
        Read::Unavailable(_) => None,
    })
}

#[derive(Deserialize)]
struct StreamInfo {
    #[serde(default)]
    cluster: Option<StreamCluster>,
}

#[derive(Deserialize)]
struct StreamCluster {
    #[serde(default)]
    leader: Option<String>,
    #[serde(default)]
    replicas: Vec<Peer>,
}

#[derive(Deserialize)]
struct Peer {
    name: String,
}

/// Which servers must answer.
enum Expected {
    /// The peers of the `fleet-status` stream (JetStream lists a replica
    /// it cannot reach as offline: a down one is among them).
    Peers(Vec<String>),
    /// The stream has no cluster: one server, the first to answer.
    Single,
    /// The stream could not be read: wait out the bound for answers.
    Unknown,
}

fn expected_servers(conn: &nats::Connection) -> Expected {
    let Ok(m) = conn.request_timeout(
        &stream_info_subject(BUCKET_STATUS),
        "",
        NATS_REQUEST_TIMEOUT,
    ) else {
        return Expected::Unknown;
    };
    let Ok(info) = serde_json::from_slice::<StreamInfo>(&m.data) else {
        return Expected::Unknown;
    };
    let Some(c) = info.cluster else {
        return Expected::Single;
    };
    let peers: Vec<String> = c
        .leader
        .into_iter()
        .chain(c.replicas.into_iter().map(|p| p.name))
        .filter(|n| !n.is_empty())
        .collect();
    if peers.is_empty() {
        Expected::Unknown
    } else {
        Expected::Peers(peers)
    }
}

/// Reads presence from every server (see the module documentation).
pub fn read(conn: &nats::Connection) -> Result<Read, CtlError> {
    let what = || "reading presence from the cluster".to_owned();
    let expected = expected_servers(conn);
    let single = matches!(expected, Expected::Single);
    let mut c = Collector::new(match expected {
        Expected::Peers(p) => p,
        Expected::Single | Expected::Unknown => Vec::new(),
    });
    let inbox = conn.new_inbox();
    let sub = conn
        .subscribe(&format!("{inbox}.>"))
        .map_err(CtlError::nats(what()))?;
    conn.publish_request(PRESENCE_CONNZ, &format!("{inbox}.0"), c.first_page())
        .map_err(CtlError::nats(what()))?;
    // Round 0: every expected server, or the whole bound when the set is
    // not known. A cluster larger than the stream's replicas has servers
    // not among its peers: after the last peer, the others get as long
    // again as the peers took (at least GRACE), within the bound.
    let started = Instant::now();
    let deadline = started + PRESENCE_TIMEOUT;
    let mut any = false;
    let mut until = deadline;
    loop {
        // One JetStream server: it, and the leaf nodes it links.
        if single && any && c.first_round_done() {
            break;
        }
        if until == deadline && c.first_round_done() {
            until = deadline.min(Instant::now() + started.elapsed().max(GRACE));
        }
        let Some(wait) = until.checked_duration_since(Instant::now()) else {
            break;
        };
        let Ok(m) = sub.next_timeout(wait.max(Duration::from_millis(1))) else {
            if Instant::now() >= until {
                break;
            }
            continue;
        };
        if m.is_no_responders() {
            return Ok(Read::Unavailable(format!(
                "no server answers {PRESENCE_CONNZ}: the server config predates presence (regenerate it with fleetctl nats-config)"
            )));
        }
        c.answer(None, &m.data);
        if single && !any {
            c.expect_answered();
        }
        any = true;
    }
    if !any {
        return Ok(Read::Unavailable(format!(
            "no server answered {PRESENCE_CONNZ} within {} s",
            PRESENCE_TIMEOUT.as_secs()
        )));
    }
    // Later rounds: each server's further pages, asked of it alone.
    let mut asked: HashMap<String, (String, usize)> = HashMap::new();
    let mut n = 0usize;
    loop {
        let pages = c.next_pages();
        if pages.is_empty() && !c.waiting() {
            break;
        }
        for (server, offset, body) in pages {
            n += 1;
            let reply = format!("{inbox}.p{n}");
            conn.publish_request(PRESENCE_CONNZ, &reply, body)
                .map_err(CtlError::nats(what()))?;
            asked.insert(reply, (server, offset));
        }
        let deadline = Instant::now() + PRESENCE_TIMEOUT;
        while c.waiting() {
            let Some(wait) = deadline.checked_duration_since(Instant::now()) else {
                c.timed_out();
                break;
            };
            match sub.next_timeout(wait.max(Duration::from_millis(1))) {
                Ok(m) => {
                    if let Some((s, o)) = asked.get(&m.subject) {
                        c.answer(Some((s.as_str(), *o)), &m.data);
                    }
                }
                Err(_) => {
                    c.timed_out();
                    break;
                }
            }
        }
    }
    Ok(Read::Known(c.finish()))
}
