//! Every limit of the upgrade design (seed 002, "Limits") and of DESIGN.md, as
//! named constants with their unit in the name. Nothing else in the workspace
//! spells these numbers.

use std::time::Duration;

/// HTTPS connect timeout for artifact downloads (seed: 15 s).
pub const HTTPS_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Whole-request bound for one artifact download (seed: 5 min).
pub const HTTPS_REQUEST_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Compiled artifact ceiling; an attempt's own `max-bytes` may only be lower.
pub const MAX_ARTIFACT_BYTES: u64 = 100 * 1024 * 1024;
/// Largest OCI manifest the updater reads (DESIGN.md "Artifacts").
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Largest registry token response read (anonymous Bearer token).
pub const MAX_TOKEN_RESPONSE_BYTES: u64 = 1024 * 1024;
/// Redirects a blob GET may follow (CDNs); manifest and token requests follow none.
pub const MAX_BLOB_REDIRECTS: usize = 5;

/// One NATS connection attempt (seed: 15 s).
pub const NATS_CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// Window over which connection attempts are retried at start (seed: 3 min).
pub const NATS_CONNECT_WINDOW: Duration = Duration::from_secs(3 * 60);
/// Bound on one JetStream API request or publish acknowledgement.
pub const NATS_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one Direct Get of a device's key. Any replica answers it from
/// memory in milliseconds; a request lost with a dying node must be retried
/// well within the 10 s a device has to be back after a node loss (the
/// fleet-scale bench saw a 10 s bound stretch one recovery to 11 s).
pub const DIRECT_GET_TIMEOUT: Duration = Duration::from_secs(3);

/// The complete candidate probe (`--self-test`) (seed: 4 min).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// Output of a probe kept from each of stdout and stderr; the report is one
/// JSON object, far smaller.
pub const MAX_SELF_TEST_OUTPUT_BYTES: usize = 64 * 1024;
/// Checks one self-test report may list.
pub const MAX_SELF_TEST_CHECKS: usize = 32;

/// systemd's stop bound for the agent unit, `TimeoutStopSec` (seed: 60 s).
pub const SYSTEMD_STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The updater's own bound on a service stop (seed: 65 s).
pub const UPDATER_STOP_TIMEOUT: Duration = Duration::from_secs(65);
/// systemd's start bound for the agent unit, `TimeoutStartSec` (seed: 4 min).
pub const SYSTEMD_START_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// The updater's own bound on a service start (seed: 4 min 15 s).
pub const UPDATER_START_TIMEOUT: Duration = Duration::from_secs(4 * 60 + 15);

/// Reading one request from a local socket (seed: 10 s).
pub const SOCKET_REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A `status` request is always answered within this bound (seed: 15 s).
pub const SOCKET_STATUS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(15);
/// An `upgrade` request is answered within this bound (seed: 20 min).
pub const SOCKET_UPGRADE_RESPONSE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Largest request or response on a local socket, newline included (seed: 1 MiB).
pub const MAX_SOCKET_MESSAGE_BYTES: usize = 1024 * 1024;
/// Concurrent mutating socket handlers; one more is answered `busy` (seed: 32).
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

/// Timed transitions retained in a status or journal record (seed: 16).
pub const MAX_TRANSITIONS: usize = 16;
/// Characters in any detail, error or other free text (seed: 1,024).
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
/// never an old binding forgotten (seed 002: reuse of a UUID with other
/// content is rejected, with no window).
pub const MAX_BOUND_ATTEMPTS: usize = 10_000;

/// Heartbeat period; each beat is jittered by up to [`HEARTBEAT_JITTER`].
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
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
