//! Every limit, as named constants with their unit in the name; each one
//! and why: `docs/design/limits.md`. Those marked "binding" are the upgrade
//! design's limits (`docs/design/upgrade.md` "Limits"). Nothing else in the
//! workspace spells these numbers.

use std::time::Duration;

/// HTTPS connect timeout for artifact downloads (binding).
pub const HTTPS_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Whole-request bound for one artifact download (binding).
pub const HTTPS_REQUEST_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Compiled artifact ceiling; an attempt's own `max-bytes` may only be lower.
pub const MAX_ARTIFACT_BYTES: u64 = 100 * 1024 * 1024;
/// Largest OCI manifest the updater reads (`docs/design/upgrade.md` "Artifacts").
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Largest registry token response read (anonymous Bearer token).
pub const MAX_TOKEN_RESPONSE_BYTES: u64 = 1024 * 1024;
/// Redirects a blob GET may follow (CDNs); manifest and token requests follow none.
pub const MAX_BLOB_REDIRECTS: usize = 5;

/// One NATS connection attempt (binding).
pub const NATS_CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// Window over which connection attempts are retried at start (binding).
pub const NATS_CONNECT_WINDOW: Duration = Duration::from_secs(3 * 60);
/// How long fleetctl waits for each round of presence answers (a page from
/// every server asked): a server slower than this makes what only it knows
/// `unknown` (docs/design/presence.md). A page of 1,024 connections is
/// answered in milliseconds on a healthy server.
pub const PRESENCE_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on one JetStream API request or publish acknowledgement.
pub const NATS_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The waits of fleetctl's successive attempts to create a read consumer
/// (each under a new name, on a new inbox, the unanswered one deleted).
/// nats-server before 2.9.12 (Debian's 2.9.10 among them) places an
/// ephemeral consumer of an R3 stream on any of the stream's peers, a dead
/// one too, and then never answers: with a node down one create in three
/// is lost. Eight attempts make a lost read one in 6,561 and take 23 s at
/// most; a live peer answers in milliseconds, seconds on a loaded cluster.
pub const CONSUMER_CREATE_WAITS: [Duration; 8] = [
    Duration::from_secs(2),
    Duration::from_secs(2),
    Duration::from_secs(2),
    Duration::from_secs(2),
    Duration::from_secs(3),
    Duration::from_secs(3),
    Duration::from_secs(4),
    Duration::from_secs(5),
];
/// Bound on one Direct Get of a device's key. Any replica answers it from
/// memory in milliseconds; a request lost with a dying node must be retried
/// well within the 10 s a device has to be back after a node loss (the
/// fleet-scale bench saw a 10 s bound stretch one recovery to 11 s).
pub const DIRECT_GET_TIMEOUT: Duration = Duration::from_secs(3);

/// The complete candidate probe (`--self-test`) (binding).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// Output of a probe kept from each of stdout and stderr; the report is one
/// JSON object, far smaller.
pub const MAX_SELF_TEST_OUTPUT_BYTES: usize = 64 * 1024;
/// Checks one self-test report may list.
pub const MAX_SELF_TEST_CHECKS: usize = 32;

/// systemd's stop bound for the agent unit, `TimeoutStopSec` (binding).
pub const SYSTEMD_STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The updater's own bound on a service stop (binding).
pub const UPDATER_STOP_TIMEOUT: Duration = Duration::from_secs(65);
/// systemd's start bound for the agent unit, `TimeoutStartSec` (binding).
pub const SYSTEMD_START_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// The updater's own bound on a service start (binding).
pub const UPDATER_START_TIMEOUT: Duration = Duration::from_secs(4 * 60 + 15);

/// Reading one request from a local socket (binding).
pub const SOCKET_REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A `status` request is always answered within this bound (binding).
pub const SOCKET_STATUS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(15);
/// An `upgrade` request is answered within this bound (binding).
pub const SOCKET_UPGRADE_RESPONSE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Largest request or response on a local socket, newline included (binding).
pub const MAX_SOCKET_MESSAGE_BYTES: usize = 1024 * 1024;
/// Concurrent mutating socket handlers; one more is answered `busy` (binding).
pub const MAX_SOCKET_HANDLERS: usize = 32;
/// Concurrent read-only (`status`) socket handlers, counted apart from the
/// mutating ones so that those never make `status` busy.
pub const MAX_SOCKET_READ_ONLY_HANDLERS: usize = 8;
/// Connections a socket server holds while they send their request (read
/// by one thread, no handler each); a new one beyond pushes out the oldest.
pub const MAX_SOCKET_PENDING_CONNECTIONS: usize = 256;
/// Request bytes every pending connection may buffer whatever the others
/// hold: a `status` request is some 20 bytes.
pub const SOCKET_SMALL_REQUEST_BYTES: usize = 4 * 1024;
/// Request bytes all pending connections of a socket server buffer together
/// beyond their small share; a larger request waits to be read meanwhile.
pub const MAX_SOCKET_BUFFERED_BYTES: usize = 4 * 1024 * 1024;

/// Timed transitions retained in a status or journal record (binding).
pub const MAX_TRANSITIONS: usize = 16;
/// Characters in any detail, error or other free text (binding).
pub const MAX_TEXT_CHARS: usize = 1024;
/// Characters of an offending intent field quoted in a refused-intent
/// report, before escaping (each escaped character takes at most 10).
pub const MAX_EXCERPT_CHARS: usize = 64;
/// Offending fields quoted in one refused-intent report (an attempt has 7).
pub const MAX_INTENT_EXCERPTS: usize = 8;
/// Errors retained in the updater journal for one attempt.
pub const MAX_JOURNAL_ERRORS: usize = 16;
/// Finished attempts remembered in full (uuid, digest, outcome, time) for
/// their status; the binding of every attempt outlives this window (see
/// [`MAX_BOUND_ATTEMPTS`]).
pub const MAX_REMEMBERED_ATTEMPTS: usize = 64;
/// Attempts whose uuid → digest binding a device keeps, on the agent and on
/// the updater, for its lifetime: one attempt a day for 27 years. About
/// 100 bytes each (1 MiB when full). At the bound a new attempt is refused,
/// never an old binding forgotten (reuse of a UUID with other content is
/// rejected, with no window: `docs/design/security.md` "Attempt identity").
pub const MAX_BOUND_ATTEMPTS: usize = 10_000;

/// Heartbeat period of agents before 0.3.0 (a write every 30 s). Since
/// 0.3.0 the agent writes its heartbeat only when what it carries changes,
/// and every [`KEEPALIVE_INTERVAL`]; this period stays how often it looks
/// for such a change (`intervals.heartbeat-secs`) and the change freeze's
/// disconnect window ([`FREEZE_DISCONNECTED_HEARTBEATS`]).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// How often an idle agent (0.3.0 on) writes its heartbeat anyway
/// (`intervals.keepalive-secs`): the lower bound of a device's "last seen"
/// when nothing better is known. One acknowledged write costs about 1 KiB
/// on the wire; hourly that is about 0.7 MiB a month
/// (docs/operator/traffic.md).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3600);
/// How long the agent's NATS connection may be silent from the server's
/// side before the agent sends a PING (`intervals.ping-secs`), and the
/// delay between unanswered ones. Below the 4-minute idle timeout of
/// common NATs and cloud load balancers; a PING/PONG over TLS costs about
/// 200 bytes on the wire, about 2.6 MiB a month at this interval.
pub const NATS_PING_INTERVAL: Duration = Duration::from_secs(200);
/// PINGs the agent leaves unanswered before it takes the connection as dead
/// and reconnects (`intervals.ping-max-outstanding`): a silent link is
/// detected within (this + 1) × [`NATS_PING_INTERVAL`].
pub const NATS_MAX_PINGS_OUT: u8 = 2;
/// The servers' PING interval in the generated config (`ping_interval`):
/// a little longer than the agent's, so that the agent's PINGs keep the
/// server's from being sent (the server skips its PING when the client sent
/// one within the interval). A dead device is closed by its server within
/// about 4 × this (two unanswered PINGs, `ping_max` 2).
pub const SERVER_PING_INTERVAL: Duration = Duration::from_secs(240);
/// The periodic backstop read of the desired state and the upgrade intent
/// (`intervals.check-secs`), jittered by a fifth. Republished changes
/// arrive at once; this only bounds how long a lost last change can go
/// unseen. Two Direct Gets cost a few KiB on the wire.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(6 * 3600);
/// How often the agent writes its traffic counters, `<device>.traffic`
/// (`intervals.traffic-secs`).
pub const TRAFFIC_REPORT_INTERVAL: Duration = Duration::from_secs(6 * 3600);
/// Largest random delay added to one heartbeat, so a fleet does not beat in step.
pub const HEARTBEAT_JITTER: Duration = Duration::from_secs(3);
/// A device counts as disconnected, for the change freeze, once NATS has
/// been unreachable for this many heartbeat intervals (the heartbeat
/// window: 30 s with the default interval).
pub const FREEZE_DISCONNECTED_HEARTBEATS: u32 = 1;
/// Device state the agent reads from a KV value at most (a `WorkloadSpec`, an attempt).
pub const MAX_KV_VALUE_BYTES: usize = 256 * 1024;
/// Largest desired-workloads document of one device (`fleet-workloads`
/// `<device>.desired`): it must fit nats-server's default `max_payload`
/// (1 MiB) with its headers, so one Direct Get reads it whole.
pub const MAX_DESIRED_DOC_BYTES: usize = 960 * 1024;
/// Workloads one device runs at most.
pub const MAX_WORKLOADS_PER_DEVICE: usize = 256;
/// Restarts of a new spec's container, before it was ever healthy, that
/// revert it at once (without waiting for its health deadline). Podman
/// restarts an exiting container itself and at once (`restart: always`;
/// Podman 4.3 here restarted `false` 22 times in 8 s), and the agent sees
/// a restart per observation, so three are seen within three looks; a
/// spec that exited three times before it ever served is not going to.
/// One exit (a container killed by hand, an OOM kill at start) is not
/// enough to give up on a spec.
pub const MAX_RESTARTS_BEFORE_REVERT: u32 = 3;
/// Bytes kept of each of an exec probe's stdout and stderr (the first of
/// stdout, the last of stderr): a probe says "ok" or why not in a line; a
/// probe that floods output costs at most this much memory.
pub const MAX_PROBE_OUTPUT_BYTES: usize = 4 * 1024;
/// Bytes of an HTTP probe's answer read: enough for its status line and
/// headers; the body is not read.
pub const MAX_HTTP_PROBE_READ_BYTES: usize = 4 * 1024;
/// Largest file read by [`crate::durable::read_bounded`] callers for state files.
pub const MAX_STATE_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Largest identity-provider bearer JWT the auth callout verifies. A Zitadel
/// access token is about 1 KiB; nats-server's CONNECT line bounds it too.
pub const MAX_BEARER_JWT_BYTES: usize = 8 * 1024;
/// nats-server's `max_control_line` in the callout layout: the token rides
/// in the CONNECT line, which the default 4 KiB would cut short.
pub const NATS_MAX_CONTROL_LINE_BYTES: usize = MAX_BEARER_JWT_BYTES + 4096;
/// Largest authorization request (a NATS JWT signed by the server) the auth
/// callout reads; it carries the client's connect options and TLS chain.
pub const MAX_AUTH_REQUEST_BYTES: usize = 64 * 1024;
/// Largest JWKS document the auth callout fetches from the identity provider.
pub const MAX_JWKS_BYTES: u64 = 256 * 1024;
/// Keys kept from one JWKS (an identity provider publishes a handful).
pub const MAX_JWKS_KEYS: usize = 64;
/// Largest OAuth2 token-endpoint response read (client credentials grant).
pub const MAX_OAUTH_TOKEN_RESPONSE_BYTES: u64 = 64 * 1024;
/// Connect timeout towards the identity provider (JWKS, token endpoint).
pub const IDP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Whole-request bound towards the identity provider: a JWKS refetch runs
/// while a client waits for its callout answer.
pub const IDP_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// nats-server's `authorization.timeout` in the callout layout: how long a
/// connecting client waits for the callout's answer (a JWKS refetch may run
/// meanwhile).
pub const NATS_AUTH_CALLOUT_TIMEOUT: Duration = Duration::from_secs(5);
/// An authorization request that waited this long in the callout's queue
/// is dropped unanswered (auth-callout/src/service.rs): with the wait the
/// server had before delivering it and the answer's own time, an answer
/// would come too late for [`NATS_AUTH_CALLOUT_TIMEOUT`] in a storm, and
/// answering it would make the fresh requests behind it late too.
pub const CALLOUT_STALE_AFTER: Duration = Duration::from_millis(2500);

/// A device's traffic budget: 5 MiB on the wire per 30 days
/// (docs/operator/traffic.md), about 175 KiB a day. The metrics exporter
/// gives a device over it a series of its own.
pub const TRAFFIC_BUDGET_BYTES_PER_30_DAYS: u64 = 5 * 1024 * 1024;

/// Bound on the auth callout's read of one registry record: well inside the
/// server's authorization timeout (`NATS_AUTH_CALLOUT_TIMEOUT`), so a slow
/// registry is a refusal the device retries, not a server-side timeout.
pub const REGISTRY_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on one registry write of the enrollment service.
pub const REGISTRY_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Life of a user in `ENROLL`: the server closes the connection then and
/// the device connects again (as itself, once approved). Well over one
/// attempt (connect, request, answer within a few seconds), and short: a
/// device's own connection made just after its approval can be admitted
/// to `ENROLL` when the registry replica that answered the callout had not
/// applied the approval yet; it is closed within this and comes back as
/// itself (seen once in 10,000 devices enrolling on a 3-node cluster).
pub const ENROLL_USER_LIFETIME_SECS: i64 = 60;
/// A device's enrollment requests closer together than this are answered
/// `slow-down` without a registry read or write.
pub const ENROLL_MIN_REQUEST_INTERVAL: Duration = Duration::from_secs(2);
/// New pending records one enrollment service instance writes per minute
/// at most (a leaked enrollment token cannot fill the registry faster).
pub const ENROLL_NEW_PENDING_PER_MINUTE: u32 = 1200;
/// Devices waiting for a decision, cluster-wide: the lobby bucket's
/// `max_msgs` (one ticket per pending record, new ones refused beyond).
/// An operator reviews a lobby this size with selectors; a leaked token
/// fills it and no more, and devices beyond are told `slow-down`.
pub const MAX_PENDING_DEVICES: u64 = 10_000;
/// The largest lobby ticket (a `{"requested-at": ...}` of some 50 bytes).
pub const LOBBY_TICKET_BYTES: usize = 256;
/// A lobby ticket whose device has no record this long after it was taken
/// (the writer died between the two writes) is freed by fleetctl.
pub const LOBBY_ORPHAN_AFTER: Duration = Duration::from_secs(600);
/// The agent's first and longest wait between enrollment requests.
pub const ENROLL_RETRY_FIRST: Duration = Duration::from_secs(5);
pub const ENROLL_RETRY_MAX: Duration = Duration::from_secs(300);
