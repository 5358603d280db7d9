//! Presence from the cluster: which devices are connected, since when, to
//! which server, with what RTT, from the servers' own connection state
//! (docs/design/presence.md). No NATS here: this module owns the wire
//! shape of a CONNZ answer, the paging plan and the judgement; the caller
//! (fleetctl's `presence` module) sends the requests.
//!
//! Steps of one read:
//! 1. [`Collector::new`] with the servers expected (the peers of the
//!    status stream; more appear as they answer). A leaf node a server
//!    lists a link of (`kind` `Leafnode`, its `server_name`) is expected
//!    too: its devices are on it; a link is never a device.
//! 2. Round 0 goes to every server at once ([`Collector::first_page`]):
//!    each answers with the first page of its own device connections.
//! 3. While a server has more ([`Collector::next_pages`]), its next pages
//!    are asked of it alone, a window at a time (and the first page of an
//!    expected server that did not answer round 0). Pages overlap by
//!    [`PAGE_OVERLAP`] connections: the server lists them by connection id,
//!    a connection closed meanwhile shifts the rest left, and the overlap
//!    must still hold the previous page's last id, or the server's list is
//!    marked incomplete (never guessed over).
//! 4. Each answer goes to [`Collector::answer`]; a server that has not
//!    answered a page by the caller's deadline is [`Collector::timed_out`]:
//!    its late pages are asked once more (a busy server's page may take
//!    longer than one round), and a page late twice marks its list
//!    incomplete.
//! 5. [`Collector::finish`] gives a [`Presence`]; [`Presence::connection`]
//!    says per device: online, offline, never seen, or unknown. A device not
//!    found is offline only when every expected server answered completely;
//!    otherwise it is unknown (it may be on the server that did not say).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;

use crate::validate::DeviceId;
use crate::Timestamp;

/// Connections asked of a server in one page. About 420 bytes each in the
/// answer (with `auth`): 1024 make about 430 KiB, under the servers'
/// default 1 MiB max payload.
pub const PAGE_LIMIT: usize = 1024;
/// Connections each page repeats of the one before it (see the module
/// documentation): this many may close on a server between two of its pages
/// before its list is marked incomplete.
pub const PAGE_OVERLAP: usize = 64;
/// Pages asked of one server before waiting for their answers.
pub const PAGE_WINDOW: usize = 8;

/// The request body of one page.
pub fn page_request(offset: usize, server: Option<&str>) -> String {
    let mut body = serde_json::json!({
        "offset": offset,
        "limit": PAGE_LIMIT,
        "sort": "cid",
        "auth": true,
    });
    if let Some(name) = server {
        // 2.10 on match exactly; 2.9 matches a substring, and an answer from
        // a server other than the one asked is dropped by its name.
        body["server_name"] = serde_json::json!(name);
        body["exact_match"] = serde_json::json!(true);
    }
    body.to_string()
}

/// One server's answer to a CONNZ request (tolerant: unknown fields are
/// ignored, as the servers add them).
#[derive(Debug, Clone, Deserialize)]
pub struct ConnzAnswer {
    pub server: AnswerServer,
    #[serde(default)]
    pub data: Option<ConnzPage>,
    #[serde(default)]
    pub error: Option<AnswerError>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AnswerServer {
    pub name: String,
    /// The server's id (the `<id>` of its `$SYS.REQ.SERVER.<id>.*`
    /// requests, such as the kick of a connection).
    #[serde(default)]
    pub id: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AnswerError {
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub description: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConnzPage {
    #[serde(default)]
    pub total: usize,
    #[serde(default)]
    pub offset: usize,
    #[serde(default)]
    pub connections: Vec<ConnzConnection>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConnzConnection {
    pub cid: u64,
    #[serde(default)]
    pub start: Option<String>,
    #[serde(default)]
    pub rtt: Option<String>,
    /// The user the server authenticated: the device id of a static user.
    #[serde(default)]
    pub authorized_user: Option<String>,
    /// The `name` of a user JWT: the device id the auth callout issued.
    #[serde(default)]
    pub name_tag: Option<String>,
    /// `Client` for a device; `Leafnode` for a leaf node's link into
    /// `DEVICES` (absent before servers said it: a client).
    #[serde(default)]
    pub kind: Option<String>,
    /// The client's own name; for a leaf node's link as the hub lists it,
    /// the leaf's `server_name`.
    #[serde(default)]
    pub name: Option<String>,
}

impl ConnzConnection {
    /// The device this connection authenticated as: the static user, or,
    /// when the server names a user key there (a JWT user, as the auth
    /// callout issues), the JWT's `name` (2.14 fills `name_tag` with the
    /// account's name for a static user: never taken then). Never the
    /// client's own `name`: a device chooses that.
    fn device(&self) -> Option<DeviceId> {
        if self.kind.as_deref().is_some_and(|k| k != KIND_CLIENT) {
            return None; // a leaf node's link, not a device
        }
        match self.authorized_user.as_deref() {
            Some(u) if !is_user_nkey(u) => DeviceId::parse(u).ok(),
            _ => self
                .name_tag
                .as_deref()
                .filter(|n| *n != crate::subjects::ACCOUNT_DEVICES)
                .and_then(|n| DeviceId::parse(n).ok()),
        }
    }
}

/// A user public nkey as the server prints it: `U` and 55 more base32.
fn is_user_nkey(s: &str) -> bool {
    s.len() == 56
        && s.starts_with('U')
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
}

/// `fleet-operator` `presence.<device>`: when the cluster last saw the
/// device's connection close, from its disconnect event (written by
/// `fleetctl presence record`). Read tolerantly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LastSeen {
    pub at: Timestamp,
    #[serde(default)]
    pub server: String,
    #[serde(default)]
    pub reason: String,
}

#[derive(Deserialize)]
struct ClientEvent {
    #[serde(default)]
    timestamp: Option<String>,
    server: AnswerServer,
    client: EventClient,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct EventClient {
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    stop: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    name_tag: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// A device's connection opened or closed, as the cluster's connect and
/// disconnect events of `DEVICES` tell it (`fleetctl watch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionEvent {
    pub device: DeviceId,
    /// Opened (a CONNECT event) or closed (a DISCONNECT event).
    pub connected: bool,
    /// The connection's start or stop, else the event's time, else `now`.
    pub at: Timestamp,
    /// The server that held it.
    pub server: String,
    /// Why it closed, in the server's words ("Client Closed", "Stale
    /// Connection", ...); empty for a connect.
    pub reason: String,
}

/// The event on `subject` (its last token `CONNECT` or `DISCONNECT`, under
/// any prefix); None for anything else, or a connection of no device.
pub fn connection_event(subject: &str, bytes: &[u8], now: Timestamp) -> Option<ConnectionEvent> {
    let connected = match subject.rsplit('.').next() {
        Some("CONNECT") => true,
        Some("DISCONNECT") => false,
        _ => return None,
    };
    let e: ClientEvent = serde_json::from_slice(bytes).ok()?;
    let device = ConnzConnection {
        cid: 0,
        start: None,
        rtt: None,
        authorized_user: e.client.user,
        name_tag: e.client.name_tag,
        kind: e.client.kind,
        name: None,
    }
    .device()?;
    let own = if connected {
        e.client.start
    } else {
        e.client.stop
    };
    let at = [own, e.timestamp]
        .into_iter()
        .flatten()
        .find_map(|t| Timestamp::parse(&t).ok())
        .unwrap_or(now);
    Some(ConnectionEvent {
        device,
        connected,
        at,
        server: e.server.name,
        reason: if connected { String::new() } else { e.reason },
    })
}

/// The device and its last-seen of a `$SYS.ACCOUNT.DEVICES.DISCONNECT`
/// event; None for anything else (or a connection of no device). The time
/// is the connection's stop, else the event's, else `now`.
pub fn disconnect_event(bytes: &[u8], now: Timestamp) -> Option<(DeviceId, LastSeen)> {
    let e = connection_event("DISCONNECT", bytes, now)?;
    Some((
        e.device,
        LastSeen {
            at: e.at,
            server: e.server,
            reason: e.reason,
        },
    ))
}

/// A device connected now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Online {
    pub server: String,
    /// When the connection started (the server's clock), when readable.
    pub since: Option<Timestamp>,
    /// The server's last measured round trip, as it prints it (`1.2ms`).
    pub rtt: Option<String>,
}

/// What fleetctl can say about one device's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    Online(Online),
    /// Every server answered and none has it; `last_seen` is the best known
    /// time it was there (a recorded disconnect or its last status write).
    Offline {
        last_seen: Timestamp,
    },
    /// Every server answered, none has it, and nothing says it ever was.
    NeverSeen,
    /// Not found, but a server did not answer completely: it may be there.
    Unknown {
        why: String,
    },
}

impl Connection {
    /// The table cell: `online`, `offline since T`, `never seen`, `unknown`.
    pub fn cell(&self) -> String {
        match self {
            Connection::Online(_) => "online".to_owned(),
            Connection::Offline { last_seen } => format!("offline since {last_seen}"),
            Connection::NeverSeen => "never seen".to_owned(),
            Connection::Unknown { .. } => "unknown".to_owned(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Connection::Online(_) => "online",
            Connection::Offline { .. } => "offline",
            Connection::NeverSeen => "never-seen",
            Connection::Unknown { .. } => "unknown",
        }
    }
}

/// What one server told, in the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAnswer {
    /// Every page, consistent: `connections` device connections.
    Complete { connections: usize },
    /// It answered, but not all of it can be trusted: why.
    Incomplete { why: String },
    /// Expected (a peer of the cluster) and silent.
    NoAnswer,
}

/// One connection of a device as a server listed it: what closing it
/// (`$SYS.REQ.SERVER.<server_id>.KICK`, body `{"cid": N}`) names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceConnection {
    /// The server's name.
    pub server: String,
    /// The server's id ([`AnswerServer::id`]).
    pub server_id: String,
    /// The connection's id on that server.
    pub cid: u64,
}

/// The cluster's view at one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presence {
    pub servers: BTreeMap<String, ServerAnswer>,
    /// Per device, its newest connection.
    pub online: HashMap<DeviceId, Online>,
    /// Per device, every connection found (an old one may linger on
    /// another server until its ping fails).
    pub connections: HashMap<DeviceId, BTreeSet<DeviceConnection>>,
    /// Each server that answered: its name → its id.
    pub server_ids: BTreeMap<String, String>,
}

impl Presence {
    /// Every expected server answered completely: a device not found is
    /// offline.
    pub fn complete(&self) -> bool {
        !self.servers.is_empty()
            && self
                .servers
                .values()
                .all(|s| matches!(s, ServerAnswer::Complete { .. }))
    }

    /// Why the read is not complete, one phrase per server.
    pub fn gaps(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter_map(|(name, s)| match s {
                ServerAnswer::Complete { .. } => None,
                ServerAnswer::Incomplete { why } => Some(format!("server {name}: {why}")),
                ServerAnswer::NoAnswer => Some(format!("server {name} did not answer")),
            })
            .collect()
    }

    /// The connection state of `device`, `last_seen` being the best known
    /// time it was there (None: nothing says it ever was).
    pub fn connection(&self, device: &DeviceId, last_seen: Option<Timestamp>) -> Connection {
        if let Some(o) = self.online.get(device) {
            return Connection::Online(o.clone());
        }
        if !self.complete() {
            let gaps = self.gaps();
            return Connection::Unknown {
                why: if gaps.is_empty() {
                    "no server answered".to_owned()
                } else {
                    gaps.join("; ")
                },
            };
        }
        match last_seen {
            Some(t) => Connection::Offline { last_seen: t },
            None => Connection::NeverSeen,
        }
    }
}

/// One server's paging.
#[derive(Debug)]
struct Paging {
    /// Offsets asked and not answered.
    waiting: BTreeSet<usize>,
    /// Offsets late once, to be asked again ([`Collector::next_pages`]).
    again: BTreeSet<usize>,
    /// Offsets already asked again: late twice, the list is incomplete.
    retried: BTreeSet<usize>,
    /// Answered pages by offset: (first cid, last cid, count).
    pages: BTreeMap<usize, (u64, u64, usize)>,
    /// The largest total a page reported.
    total: usize,
    /// Offset of the next page not yet asked.
    next: usize,
    broken: Option<String>,
    connections: usize,
}

impl Paging {
    fn new() -> Self {
        Paging {
            waiting: BTreeSet::new(),
            again: BTreeSet::new(),
            retried: BTreeSet::new(),
            pages: BTreeMap::new(),
            total: 0,
            next: 0,
            broken: None,
            connections: 0,
        }
    }
}

/// The `kind` CONNZ gives a client connection (a device); a leaf node's
/// link is `Leafnode`.
const KIND_CLIENT: &str = "Client";
const KIND_LEAFNODE: &str = "Leafnode";

/// Step of a page: each repeats [`PAGE_OVERLAP`] of the one before.
const PAGE_STEP: usize = PAGE_LIMIT - PAGE_OVERLAP;

/// Collects the answers of one read (see the module documentation).
#[derive(Debug)]
pub struct Collector {
    expected: BTreeSet<String>,
    servers: BTreeMap<String, Paging>,
    online: HashMap<DeviceId, Online>,
    /// Per device, the start of the connection kept (the newest wins: an
    /// old one may linger on another server until its ping fails).
    online_start: HashMap<DeviceId, (Option<Timestamp>, u64)>,
    /// Per device, every connection listed (pages overlap: a set).
    connections: HashMap<DeviceId, BTreeSet<DeviceConnection>>,
    server_ids: BTreeMap<String, String>,
    /// Round 0 was answered by someone.
    first_answered: bool,
    /// The servers expected when round 0 ended (set by the first
    /// [`Collector::next_pages`]), and those asked alone since.
    round0_expected: Option<BTreeSet<String>>,
}

impl Collector {
    /// Every server that has answered becomes expected (a stream without a
    /// cluster: the one server that answered first), as do the leaves it
    /// named.
    pub fn expect_answered(&mut self) {
        self.expected.extend(self.servers.keys().cloned());
    }

    pub fn new(expected: impl IntoIterator<Item = String>) -> Self {
        Collector {
            expected: expected.into_iter().collect(),
            servers: BTreeMap::new(),
            online: HashMap::new(),
            online_start: HashMap::new(),
            connections: HashMap::new(),
            server_ids: BTreeMap::new(),
            first_answered: false,
            round0_expected: None,
        }
    }

    /// The body of round 0, asked of every server.
    pub fn first_page(&self) -> String {
        page_request(0, None)
    }

    /// Whether every expected server has answered round 0 (the caller may
    /// stop waiting for it). Expected are the servers given to
    /// [`new`](Self::new) and every leaf node a server lists a link of:
    /// the leaf's devices are on it. With no expected set, never: the caller
    /// waits its deadline.
    pub fn first_round_done(&self) -> bool {
        !self.expected.is_empty() && self.expected.iter().all(|s| self.servers.contains_key(s))
    }

    /// Whether a page is still awaited.
    pub fn waiting(&self) -> bool {
        self.servers.values().any(|p| !p.waiting.is_empty())
    }

    /// The pages to ask next: (server, offset, body). Marks them awaited.
    pub fn next_pages(&mut self) -> Vec<(String, usize, String)> {
        let mut out = Vec::new();
        // A leaf named only by a page after round 0: its first page, asked
        // of it alone (a server silent in round 0 is not asked again).
        let round0 = self
            .round0_expected
            .get_or_insert_with(|| self.expected.clone());
        let unasked: Vec<String> = self
            .expected
            .iter()
            .filter(|e| !self.servers.contains_key(*e) && !round0.contains(*e))
            .cloned()
            .collect();
        for name in unasked {
            round0.insert(name.clone());
            let mut p = Paging::new();
            p.waiting.insert(0);
            p.next = PAGE_STEP;
            out.push((name.clone(), 0, page_request(0, Some(&name))));
            self.servers.insert(name, p);
        }
        for (name, p) in &mut self.servers {
            if out.iter().any(|(n, _, _)| n == name) {
                continue;
            }
            // Late pages, once more, before anything new of this server.
            if p.broken.is_none() && !p.again.is_empty() {
                for offset in std::mem::take(&mut p.again) {
                    p.waiting.insert(offset);
                    p.retried.insert(offset);
                    out.push((name.clone(), offset, page_request(offset, Some(name))));
                }
                continue;
            }
            if p.broken.is_some() || !p.waiting.is_empty() {
                continue;
            }
            let mut asked = 0;
            while p.next < p.total && asked < PAGE_WINDOW {
                p.waiting.insert(p.next);
                out.push((name.clone(), p.next, page_request(p.next, Some(name))));
                p.next += PAGE_STEP;
                asked += 1;
            }
        }
        out
    }

    /// One answer. `asked`: the server and offset the request named (None
    /// for round 0, asked of all). Returns false when the answer was not
    /// for this read's request (dropped).
    pub fn answer(&mut self, asked: Option<(&str, usize)>, bytes: &[u8]) -> bool {
        let a: ConnzAnswer = match serde_json::from_slice(bytes) {
            Ok(a) => a,
            Err(e) => {
                // Whose it is cannot be read: the server asked, if named.
                let why = format!("malformed answer ({e})");
                match asked {
                    Some((s, _)) => self.break_server(s, why),
                    None => {
                        // A round-0 answer nobody can attribute: keep the
                        // read from being called complete.
                        self.break_server("(an unreadable answer)", why)
                    }
                }
                return true;
            }
        };
        let name = a.server.name.clone();
        if let Some((s, _)) = asked {
            if s != name {
                // 2.9's substring match: another server answered.
                return false;
            }
        }
        if !a.server.id.is_empty() {
            self.server_ids.insert(name.clone(), a.server.id.clone());
        }
        let offset = asked.map_or(0, |(_, o)| o);
        let p = self.servers.entry(name.clone()).or_insert_with(Paging::new);
        if asked.is_none() {
            self.first_answered = true;
            if !p.pages.is_empty() || p.broken.is_some() {
                return false; // a duplicate round-0 answer
            }
            p.next = PAGE_STEP;
        }
        p.waiting.remove(&offset);
        if let Some(e) = a.error {
            let why = format!("answered error {} ({})", e.code, e.description);
            self.break_server(&name, why);
            return true;
        }
        let Some(data) = a.data else {
            self.break_server(&name, "answered without data".to_owned());
            return true;
        };
        if data.offset != offset {
            let why = format!("answered offset {} for {offset}", data.offset);
            self.break_server(&name, why);
            return true;
        }
        let first = data.connections.first().map_or(0, |c| c.cid);
        let last = data.connections.last().map_or(0, |c| c.cid);
        p.total = p.total.max(data.total);
        p.pages
            .insert(offset, (first, last, data.connections.len()));
        let mut leaves = Vec::new();
        for c in &data.connections {
            if c.kind.as_deref() == Some(KIND_LEAFNODE) {
                if let Some(leaf) = c.name.as_deref().filter(|l| !l.is_empty() && *l != name) {
                    leaves.push(leaf.to_owned());
                }
            }
            let Some(id) = c.device() else { continue };
            self.connections
                .entry(id.clone())
                .or_default()
                .insert(DeviceConnection {
                    server: name.clone(),
                    server_id: a.server.id.clone(),
                    cid: c.cid,
                });
            let since = c.start.as_deref().and_then(|s| Timestamp::parse(s).ok());
            let key = (since, c.cid);
            let newer = self
                .online_start
                .get(&id)
                .is_none_or(|old| (key.0, key.1) > (old.0, old.1));
            if newer {
                self.online_start.insert(id.clone(), key);
                self.online.insert(
                    id,
                    Online {
                        server: name.clone(),
                        since,
                        rtt: c.rtt.clone(),
                    },
                );
            }
        }
        self.expected.extend(leaves);
        true
    }

    /// The pages awaited of `server` did not come by the deadline.
    pub fn timed_out(&mut self) {
        let late: Vec<String> = self
            .servers
            .iter()
            .filter(|(_, p)| !p.waiting.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        for n in late {
            if let Some(p) = self.servers.get_mut(&n) {
                if p.waiting.iter().all(|o| !p.retried.contains(o)) {
                    // Late once: asked again by the next `next_pages`.
                    let late = std::mem::take(&mut p.waiting);
                    p.again.extend(late);
                    continue;
                }
            }
            if self.servers.get(&n).is_some_and(|p| p.pages.is_empty()) {
                // Asked alone and silent: as if never heard from.
                self.servers.remove(&n);
                continue;
            }
            self.break_server(&n, "did not answer every page in time".to_owned());
        }
    }

    fn break_server(&mut self, name: &str, why: String) {
        let p = self
            .servers
            .entry(name.to_owned())
            .or_insert_with(Paging::new);
        p.waiting.clear();
        if p.broken.is_none() {
            p.broken = Some(why);
        }
    }

    /// Checks each server's pages for gaps and gives the view.
    pub fn finish(mut self) -> Presence {
        // Pages still late (the caller stopped before asking them again):
        // a server heard from is incomplete, one never heard from silent.
        self.servers.retain(|_, p| {
            let late = !p.again.is_empty() || !p.waiting.is_empty();
            !(late && p.pages.is_empty() && p.broken.is_none())
        });
        let mut servers = BTreeMap::new();
        for (name, p) in &mut self.servers {
            if p.broken.is_none() && (!p.again.is_empty() || !p.waiting.is_empty()) {
                p.broken = Some("did not answer every page in time".to_owned());
            }
            if p.broken.is_none() {
                let mut prev: Option<(u64, usize)> = None; // last cid, end offset
                let mut covered = 0usize;
                for (&off, &(first, last, n)) in &p.pages {
                    if let Some((prev_last, prev_end)) = prev {
                        if n > 0 && (off > prev_end || first > prev_last) {
                            p.broken = Some(format!(
                                "its connections changed while paging (more than {PAGE_OVERLAP} closed between two pages)"
                            ));
                            break;
                        }
                    }
                    if n > 0 {
                        prev = Some((last, off + n));
                        covered = covered.max(off + n);
                    }
                }
                if p.broken.is_none() && covered < p.total {
                    p.broken = Some(format!(
                        "listed {covered} of {} connections (more connected while paging)",
                        p.total
                    ));
                }
                p.connections = p.total;
            }
            let answer = match &p.broken {
                Some(why) => ServerAnswer::Incomplete { why: why.clone() },
                None => ServerAnswer::Complete {
                    connections: p.connections,
                },
            };
            servers.insert(name.clone(), answer);
        }
        for e in &self.expected {
            servers.entry(e.clone()).or_insert(ServerAnswer::NoAnswer);
        }
        Presence {
            servers,
            online: self.online,
            connections: self.connections,
            server_ids: self.server_ids,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(server: &str, total: usize, offset: usize, conns: &[(u64, &str)]) -> Vec<u8> {
        let connections: Vec<serde_json::Value> = conns
            .iter()
            .map(|(cid, user)| {
                serde_json::json!({
                    "cid": cid, "start": "2026-12-02T05:52:23.054083798Z", "rtt": "1.2ms",
                    "authorized_user": user, "account": "DEVICES", "new-field": 1
                })
            })
            .collect();
        serde_json::json!({
            "server": {"name": server, "id": "NX", "ver": "2.9.10"},
            "data": {"total": total, "offset": offset, "limit": PAGE_LIMIT, "connections": connections}
        })
        .to_string()
        .into_bytes()
    }

    fn id(s: &str) -> DeviceId {
        DeviceId::parse(s).expect("id")
    }

    #[test]
    fn every_connection_of_a_device_is_kept_with_its_server_id() {
        let mut c = Collector::new(["n1".to_owned(), "n2".to_owned()]);
        assert!(c.answer(None, &answer("n1", 2, 0, &[(5, "dev1"), (9, "dev2")])));
        assert!(c.answer(None, &answer("n2", 1, 0, &[(3, "dev1")])));
        let p = c.finish();
        let conns: Vec<(String, String, u64)> = p.connections[&id("dev1")]
            .iter()
            .map(|c| (c.server.clone(), c.server_id.clone(), c.cid))
            .collect();
        assert_eq!(
            conns,
            [("n1".into(), "NX".into(), 5), ("n2".into(), "NX".into(), 3)]
        );
        assert_eq!(p.connections[&id("dev2")].len(), 1);
        assert!(!p.connections.contains_key(&id("dev3")));
        assert_eq!(p.server_ids["n2"], "NX");
    }

    #[test]
    fn every_server_answering_makes_a_missing_device_offline_or_never_seen() {
        let mut c = Collector::new(["n1".to_owned(), "n2".to_owned()]);
        assert!(!c.first_round_done());
        assert!(c.answer(None, &answer("n1", 1, 0, &[(5, "dev1")])));
        assert!(c.answer(None, &answer("n2", 0, 0, &[])));
        assert!(c.first_round_done());
        assert!(c.next_pages().is_empty());
        let p = c.finish();
        assert!(p.complete());
        match p.connection(&id("dev1"), None) {
            Connection::Online(o) => {
                assert_eq!(o.server, "n1");
                assert_eq!(o.rtt.as_deref(), Some("1.2ms"));
                assert_eq!(
                    o.since,
                    Some(Timestamp::parse("2026-12-02T05:52:23.054Z").expect("t"))
                );
            }
            other => panic!("{other:?}"),
        }
        let t = Timestamp::from_unix_millis(1_800_000_000_000);
        assert_eq!(
            p.connection(&id("dev2"), Some(t)),
            Connection::Offline { last_seen: t }
        );
        assert_eq!(p.connection(&id("dev3"), None), Connection::NeverSeen);
    }

    /// A page of `server` with leaf links (as a hub lists them: the
    /// leaf's name, the hub's leaf user, which is a valid device id) and
    /// devices.
    fn answer_with_leaves(
        server: &str,
        leaves: &[(u64, &str)],
        devices: &[(u64, &str)],
    ) -> Vec<u8> {
        let mut connections: Vec<serde_json::Value> = leaves
            .iter()
            .map(|(cid, leaf)| {
                serde_json::json!({
                    "cid": cid, "kind": "Leafnode", "name": leaf,
                    "authorized_user": "leaf-devices", "account": "DEVICES"
                })
            })
            .collect();
        connections.extend(devices.iter().map(|(cid, user)| {
            serde_json::json!({
                "cid": cid, "kind": "Client", "type": "nats", "authorized_user": user,
                "account": "DEVICES", "name_tag": "DEVICES"
            })
        }));
        let total = connections.len();
        serde_json::json!({
            "server": {"name": server},
            "data": {"total": total, "offset": 0, "connections": connections}
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn the_leaves_a_server_links_must_answer_and_their_links_are_no_devices() {
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(
            None,
            &answer_with_leaves("n1", &[(3, "leaf1"), (4, "leaf2")], &[(9, "dev9")]),
        );
        // n1 answered, but its leaves have not: round 0 goes on.
        assert!(!c.first_round_done());
        // A leaf lists its own link to the hub without a name.
        c.answer(
            None,
            &answer_with_leaves("leaf1", &[(1, "")], &[(7, "dev1")]),
        );
        assert!(!c.first_round_done());
        // leaf2 was silent in round 0: not asked again.
        assert!(c.next_pages().is_empty());
        let p = c.finish();
        assert!(
            matches!(p.connection(&id("dev1"), None), Connection::Online(o) if o.server == "leaf1")
        );
        assert!(
            matches!(p.connection(&id("dev9"), None), Connection::Online(o) if o.server == "n1")
        );
        // The hub's leaf user is never taken for a device.
        assert!(!p.online.contains_key(&id("leaf-devices")));
        assert_eq!(
            p.connection(&id("dev2"), None),
            Connection::Unknown {
                why: "server leaf2 did not answer".to_owned()
            }
        );

        // A leaf named only by a page after round 0 is asked alone; silent,
        // it is a server that did not answer.
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(None, &answer("n1", 2000, 0, &[(1, "dev1")]));
        assert!(c.first_round_done());
        let pages = c.next_pages();
        assert_eq!(pages.len(), 2, "{pages:?}");
        let later = serde_json::json!({
            "server": {"name": "n1"},
            "data": {"total": 2000, "offset": PAGE_STEP, "connections": [
                {"cid": 1, "kind": "Client", "authorized_user": "dev1"},
                {"cid": 900, "kind": "Leafnode", "name": "leaf3", "authorized_user": "leaf-devices"}
            ]}
        })
        .to_string();
        c.answer(Some(("n1", PAGE_STEP)), later.as_bytes());
        c.answer(
            Some(("n1", 2 * PAGE_STEP)),
            &answer("n1", 2000, 2 * PAGE_STEP, &[(950, "dev5")]),
        );
        let pages = c.next_pages();
        assert_eq!(pages.len(), 1, "{pages:?}");
        assert_eq!((pages[0].0.as_str(), pages[0].1), ("leaf3", 0));
        assert!(
            pages[0].2.contains(r#""server_name":"leaf3""#),
            "{}",
            pages[0].2
        );
        c.timed_out();
        let p = c.finish();
        assert_eq!(p.servers["leaf3"], ServerAnswer::NoAnswer);

        // Every leaf answering: a device on none is offline.
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(None, &answer_with_leaves("n1", &[(3, "leaf1")], &[]));
        c.answer(
            None,
            &answer_with_leaves("leaf1", &[(1, "")], &[(7, "dev1")]),
        );
        assert!(c.first_round_done());
        assert!(c.next_pages().is_empty());
        let p = c.finish();
        assert!(p.complete(), "{:?}", p.servers);
        assert_eq!(p.connection(&id("dev2"), None), Connection::NeverSeen);

        // A single JetStream server: the first to answer, and its leaves.
        let mut c = Collector::new(Vec::new());
        c.answer(None, &answer_with_leaves("hub", &[(3, "leaf1")], &[]));
        c.expect_answered();
        assert!(!c.first_round_done());
        c.answer(None, &answer_with_leaves("leaf1", &[(1, "")], &[]));
        assert!(c.first_round_done());
    }

    #[test]
    fn a_silent_server_makes_a_missing_device_unknown_never_offline() {
        let mut c = Collector::new(["n1".to_owned(), "n2".to_owned(), "n3".to_owned()]);
        c.answer(None, &answer("n1", 1, 0, &[(5, "dev1")]));
        c.answer(None, &answer("n2", 0, 0, &[]));
        let p = c.finish();
        assert!(!p.complete());
        assert_eq!(p.servers["n3"], ServerAnswer::NoAnswer);
        assert!(matches!(
            p.connection(&id("dev1"), None),
            Connection::Online(_)
        ));
        assert_eq!(
            p.connection(
                &id("dev2"),
                Some(Timestamp::from_unix_millis(1_800_000_000_000))
            ),
            Connection::Unknown {
                why: "server n3 did not answer".to_owned()
            }
        );
    }

    #[test]
    fn a_malformed_or_error_answer_is_said_not_guessed_over() {
        let mut c = Collector::new(["n1".to_owned(), "n2".to_owned()]);
        c.answer(None, &answer("n1", 0, 0, &[]));
        c.answer(
            None,
            br#"{"server":{"name":"n2"},"data":{"connections":[{"cid":"x"}]}}"#,
        );
        c.answer(
            None,
            br#"{"server":{"name":"n3"},"error":{"code":500,"description":"boom"}}"#,
        );
        let p = c.finish();
        assert!(!p.complete());
        let gaps = p.gaps();
        assert!(
            gaps.iter().any(|g| g.contains("malformed answer")),
            "{gaps:?}"
        );
        assert!(
            gaps.contains(&"server n3: answered error 500 (boom)".to_owned()),
            "{gaps:?}"
        );
        assert!(matches!(
            p.connection(&id("dev9"), None),
            Connection::Unknown { .. }
        ));
    }

    #[test]
    fn pages_overlap_and_a_gap_marks_the_server_incomplete() {
        // 2,000 connections on n1: round 0 has 1,024, the next page is asked
        // at 960 and must repeat the last cid of the first.
        let first: Vec<(u64, String)> = (0..1024u64).map(|i| (i, format!("d{i}"))).collect();
        let firstr: Vec<(u64, &str)> = first.iter().map(|(c, u)| (*c, u.as_str())).collect();
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(None, &answer("n1", 2000, 0, &firstr));
        let pages = c.next_pages();
        assert_eq!(pages.len(), 2);
        assert_eq!(pages[0].0, "n1");
        assert_eq!(pages[0].1, PAGE_STEP);
        assert!(
            pages[0].2.contains("\"server_name\":\"n1\""),
            "{}",
            pages[0].2
        );
        assert_eq!(pages[1].1, 2 * PAGE_STEP);
        // An answer from n10 to a request for n1 (2.9 substring) is dropped.
        assert!(!c.answer(Some(("n1", PAGE_STEP)), &answer("n10", 5, PAGE_STEP, &[])));
        let second: Vec<(u64, String)> = (960..1984u64).map(|i| (i, format!("d{i}"))).collect();
        let secondr: Vec<(u64, &str)> = second.iter().map(|(c, u)| (*c, u.as_str())).collect();
        c.answer(
            Some(("n1", PAGE_STEP)),
            &answer("n1", 2000, PAGE_STEP, &secondr),
        );
        let third: Vec<(u64, String)> = (1920..2000u64).map(|i| (i, format!("d{i}"))).collect();
        let thirdr: Vec<(u64, &str)> = third.iter().map(|(c, u)| (*c, u.as_str())).collect();
        c.answer(
            Some(("n1", 2 * PAGE_STEP)),
            &answer("n1", 2000, 2 * PAGE_STEP, &thirdr),
        );
        assert!(!c.waiting());
        assert!(c.next_pages().is_empty());
        let p = c.finish();
        assert!(p.complete(), "{:?}", p.gaps());
        assert_eq!(p.online.len(), 2000);

        // The same, but 100 connections closed before the second page: it
        // starts past the first page's last cid.
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(None, &answer("n1", 2000, 0, &firstr));
        c.next_pages();
        let shifted: Vec<(u64, String)> = (1060..1900u64).map(|i| (i, format!("d{i}"))).collect();
        let shiftedr: Vec<(u64, &str)> = shifted.iter().map(|(c, u)| (*c, u.as_str())).collect();
        c.answer(
            Some(("n1", PAGE_STEP)),
            &answer("n1", 1900, PAGE_STEP, &shiftedr),
        );
        c.answer(
            Some(("n1", 2 * PAGE_STEP)),
            &answer("n1", 1900, 2 * PAGE_STEP, &[]),
        );
        let p = c.finish();
        assert!(!p.complete());
        assert!(
            p.gaps()[0].contains("changed while paging"),
            "{:?}",
            p.gaps()
        );
    }

    #[test]
    fn a_late_page_marks_its_server_incomplete() {
        let conns: Vec<(u64, String)> = (0..1024u64).map(|i| (i, format!("d{i}"))).collect();
        let r: Vec<(u64, &str)> = conns.iter().map(|(c, u)| (*c, u.as_str())).collect();
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(None, &answer("n1", 1500, 0, &r));
        assert_eq!(c.next_pages().len(), 1);
        assert!(c.waiting());
        // Late once: asked again, alone.
        c.timed_out();
        assert!(!c.waiting());
        let again = c.next_pages();
        assert_eq!(
            again
                .iter()
                .map(|(s, o, _)| (s.as_str(), *o))
                .collect::<Vec<_>>(),
            vec![("n1", PAGE_STEP)]
        );
        assert!(c.waiting());
        // Late twice: incomplete.
        c.timed_out();
        assert!(c.next_pages().is_empty());
        let p = c.finish();
        assert_eq!(
            p.gaps(),
            vec!["server n1: did not answer every page in time".to_owned()]
        );
    }

    #[test]
    fn a_page_late_once_and_answered_when_asked_again_completes_the_list() {
        let conns: Vec<(u64, String)> = (0..1024u64).map(|i| (i, format!("d{i}"))).collect();
        let r: Vec<(u64, &str)> = conns.iter().map(|(c, u)| (*c, u.as_str())).collect();
        let mut c = Collector::new(["n1".to_owned()]);
        c.answer(None, &answer("n1", 1100, 0, &r));
        assert_eq!(c.next_pages().len(), 1);
        c.timed_out();
        assert_eq!(c.next_pages().len(), 1);
        // The second page repeats the first's last PAGE_OVERLAP and ends
        // with a device only it lists.
        let mut second: Vec<(u64, String)> = (PAGE_STEP as u64..1099)
            .map(|i| (i, format!("d{i}")))
            .collect();
        second.push((1099, "late".to_owned()));
        let second: Vec<(u64, &str)> = second.iter().map(|(c, u)| (*c, u.as_str())).collect();
        c.answer(
            Some(("n1", PAGE_STEP)),
            &answer("n1", 1100, PAGE_STEP, &second),
        );
        assert!(!c.waiting());
        assert!(c.next_pages().is_empty());
        let p = c.finish();
        assert!(p.complete(), "{:?}", p.gaps());
        assert!(matches!(
            p.connection(&id("late"), None),
            Connection::Online(_)
        ));
    }

    #[test]
    fn a_disconnect_event_gives_the_device_and_its_stop() {
        let ev = br#"{"type":"io.nats.server.advisory.v1.client_disconnect","timestamp":"2026-12-02T05:51:52.681670604Z",
            "server":{"name":"n1","id":"NX"},"client":{"start":"2026-12-02T05:51:50.875757128Z","id":6,"acc":"DEVICES",
            "user":"dev1","stop":"2026-12-02T05:51:52.681Z","kind":"Client"},"sent":{"msgs":0,"bytes":0},"reason":"Client Closed"}"#;
        let now = Timestamp::from_unix_millis(1);
        let (d, seen) = disconnect_event(ev, now).expect("event");
        assert_eq!(d, id("dev1"));
        assert_eq!(
            seen.at,
            Timestamp::parse("2026-12-02T05:51:52.681Z").expect("t")
        );
        assert_eq!(seen.server, "n1");
        assert_eq!(seen.reason, "Client Closed");
        assert!(disconnect_event(b"{}", now).is_none());
        assert!(disconnect_event(
            br#"{"server":{"name":"n1"},"client":{"user":"$G bad"}}"#,
            now
        )
        .is_none());
    }

    #[test]
    fn connect_and_disconnect_events_say_which_and_when() {
        let connect = br#"{"type":"io.nats.server.advisory.v1.client_connect","timestamp":"2026-12-02T05:51:50.9Z",
            "server":{"name":"n0","id":"NX"},"client":{"start":"2026-12-02T05:51:50.875Z","id":6,"acc":"DEVICES",
            "user":"dev1","kind":"Client"}}"#;
        let now = Timestamp::from_unix_millis(1);
        let e = connection_event("fleetpresence.$SYS.ACCOUNT.DEVICES.CONNECT", connect, now)
            .expect("a connect");
        assert_eq!(e.device, id("dev1"));
        assert!(e.connected);
        assert_eq!(
            e.at,
            Timestamp::parse("2026-12-02T05:51:50.875Z").expect("t")
        );
        assert_eq!((e.server.as_str(), e.reason.as_str()), ("n0", ""));
        let disconnect = br#"{"timestamp":"2026-12-02T05:51:53Z","server":{"name":"n0"},
            "client":{"start":"2026-12-02T05:51:50.875Z","stop":"2026-12-02T05:51:52.681Z","user":"dev1"},
            "reason":"Stale Connection"}"#;
        let e = connection_event("$SYS.ACCOUNT.DEVICES.DISCONNECT", disconnect, now)
            .expect("a disconnect");
        assert!(!e.connected);
        assert_eq!(
            e.at,
            Timestamp::parse("2026-12-02T05:51:52.681Z").expect("t")
        );
        assert_eq!(e.reason, "Stale Connection");
        // Another subject, or a connection that is no device's: nothing.
        assert!(
            connection_event("$SYS.ACCOUNT.DEVICES.LEAFNODE.CONNECT.x", connect, now).is_none()
        );
        assert!(connection_event(
            "$SYS.ACCOUNT.DEVICES.CONNECT",
            br#"{"server":{"name":"n1"},"client":{"user":"$G bad"}}"#,
            now
        )
        .is_none());
    }

    #[test]
    fn the_device_is_who_authenticated_and_the_newest_connection_wins() {
        let mut c = Collector::new(["n1".to_owned(), "n2".to_owned()]);
        c.answer(
            None,
            br#"{"server":{"name":"n1"},"data":{"total":3,"offset":0,"connections":[
                {"cid":1,"start":"2026-12-02T05:00:00Z","authorized_user":"UCWBC5NBJIPCU5IGRQ2YTF4CJPSDW2OSWKCDJZCOZ7GIHCQGNZRTKHZ3","name_tag":"dev1"},
                {"cid":2,"start":"2026-12-02T05:00:00Z","name":"fleet-agent dev2"},
                {"cid":3,"start":"2026-12-02T05:00:00Z","authorized_user":"dev3","name_tag":"DEVICES"}]}}"#,
        );
        c.answer(
            None,
            br#"{"server":{"name":"n2"},"data":{"total":1,"offset":0,"connections":[
                {"cid":9,"start":"2026-12-02T05:10:00Z","authorized_user":"dev1"}]}}"#,
        );
        let p = c.finish();
        assert_eq!(p.online.len(), 2, "a client's own name is no identity");
        assert_eq!(p.online[&id("dev1")].server, "n2");
        assert_eq!(p.online[&id("dev3")].server, "n1");
    }
}
