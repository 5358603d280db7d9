//! The `nats` crate's options for one link: authentication, TLS, the
//! reconnect buffer and delays, the client's PINGs, and the callbacks that
//! keep [`ConnState`] current (only the current link's callbacks count).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::state::{ConnState, Params, Reconnect, BEARER_CRATE_RECONNECTS};
use fleet_common::nkey::{NkeyKind, NkeySeed};

use crate::config::{NatsAuth, NatsConfig, Secret};
use crate::oauth::AccessToken;

/// Bytes of publishes the client buffers while disconnected. The agent
/// waits for an ack on every write, so little needs buffering; the
/// crate's default (8 MiB) would be most of the memory budget.
const RECONNECT_BUFFER_BYTES: usize = 64 * 1024;
/// The trust list given to the crate when TLS is not used: empty.
const NO_TLS_ROOTS: &str = "/dev/null";
/// First and longest delay between reconnect attempts to one server.
const RECONNECT_FIRST_DELAY: Duration = Duration::from_millis(100);
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);

/// The client options of link `link`; `token` is the bearer token of the
/// `oauth2-client-credentials` method.
pub(super) fn options(
    p: &Params,
    state: &Arc<ConnState>,
    token: Option<&AccessToken>,
    link: u64,
) -> nats::Options {
    let cfg = &p.cfg;
    let o = match (&cfg.auth, token) {
        (NatsAuth::UserPassword { user, password }, _) => {
            nats::Options::with_user_pass(user, password.expose())
        }
        (NatsAuth::Token(t), _) => nats::Options::with_token(t.expose()),
        (NatsAuth::Creds(path), _) => nats::Options::with_credentials(path),
        (NatsAuth::OAuth2(_), Some(t)) => nats::Options::with_token(t.token.expose()),
        (NatsAuth::Enrollment { token, seed }, _) => {
            nkey_options(seed.as_ref(), p.device.as_str(), token.expose())
        }
        // `OAuth2` without a token is not reached: every link of that
        // method is made with one (and the server would refuse none).
        (NatsAuth::None | NatsAuth::TlsCertificate | NatsAuth::OAuth2(_), _) => {
            nats::Options::new()
        }
    };
    // A bearer-token link gives up after a few reconnects and the renewer
    // makes the next one (see the module documentation).
    let renewed = matches!(cfg.auth, NatsAuth::OAuth2(_)) && p.mode == Reconnect::Forever;
    let mut o = o
        .with_name(&format!("fleet-agent {}", p.device))
        .no_echo()
        .reconnect_buffer_size(RECONNECT_BUFFER_BYTES)
        .ping_interval(p.pings.interval)
        .max_pings_out(p.pings.max_out)
        .max_reconnects(match p.mode {
            Reconnect::Forever if renewed => Some(BEARER_CRATE_RECONNECTS),
            Reconnect::Forever => None,
            Reconnect::Once => Some(1),
        });
    o = with_tls(o, cfg);
    let s = Arc::clone(state);
    let o = o.disconnect_callback(move || {
        if !s.is_current(link) {
            return;
        }
        s.set_connected(false);
        if !s.closing.load(Ordering::SeqCst) {
            log::warn!("NATS connection lost; reconnecting");
        }
    });
    let s = Arc::clone(state);
    let o = o.reconnect_callback(move || {
        if !s.is_current(link) {
            return;
        }
        s.set_connected(true);
        let g = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        log::info!(reconnect = g; "NATS reconnected; the watchers subscribe again and read their keys");
    });
    let s = Arc::clone(state);
    let o = o.error_callback(move |e| {
        let e = e.to_string();
        if !s.is_current(link) {
            log::debug!("NATS server error on a replaced connection: {e}");
            return;
        }
        log::warn!("NATS server error: {e}");
        if is_auth_message(&e) {
            s.signal(|ev| ev.refused = true);
        } else if e.to_ascii_lowercase().contains("permissions violation") {
            s.signal(|ev| ev.denied = true);
        }
        s.set_error(e);
    });
    let s = Arc::clone(state);
    o.close_callback(move || {
        if s.closing.load(Ordering::SeqCst) {
            log::debug!("NATS connection closed");
            return;
        }
        // Recorded for links not yet current too: the renewer checks the
        // link it just made.
        s.signal(|ev| ev.lost = ev.lost.max(link));
        if s.is_current(link) {
            s.set_connected(false);
            if renewed {
                log::warn!("NATS connection closed after {BEARER_CRATE_RECONNECTS} reconnect attempts per server; connecting anew");
            }
        }
    })
    .reconnect_delay_callback(reconnect_delay)
}

/// The TLS settings of `cfg`.
fn with_tls(mut o: nats::Options, cfg: &NatsConfig) -> nats::Options {
    let tls_urls = cfg.servers.iter().any(|s| s.starts_with("tls://"));
    if cfg.tls.is_none() && !tls_urls {
        // No TLS at all: an empty trust list, so the crate does not parse
        // every system CA (about 150) into memory at each connection.
        o = o.add_root_certificate(NO_TLS_ROOTS);
    }
    if let Some(tls) = &cfg.tls {
        o = o.tls_required(true);
        if let Some(ca) = &tls.ca_file {
            o = o.add_root_certificate(ca);
        }
        if let Some(c) = &tls.client_cert {
            o = o.client_cert(&c.cert_file, &c.key_file);
        }
    }
    o
}

/// Authentication by the device's own nkey: the server's nonce signed,
/// the device id as the user, the enrollment token beside them. Without a
/// usable seed (not reached: the daemon sets it before connecting), no
/// signature the callout would accept.
fn nkey_options(seed: Option<&Secret>, device: &str, token: &str) -> nats::Options {
    let seed = seed.and_then(|s| NkeySeed::parse_kind(s.expose(), NkeyKind::User).ok());
    let public = seed
        .as_ref()
        .map(|s| s.public_key().encode())
        .unwrap_or_default();
    let seed = Arc::new(seed);
    nats::Options::with_nkey(&public, move |nonce| {
        seed.as_ref()
            .as_ref()
            .and_then(|s| s.key_pair().sign(nonce).ok())
            .unwrap_or_default()
    })
    .nkey_extras(Some(device), Some(token))
}

/// The options of an enrollment connection (`crate::enroll`): the nkey
/// authentication and TLS of `cfg`, one connection attempt per server (the
/// crate counts the first attempt as a reconnect).
pub fn enrollment_options(cfg: &NatsConfig, device: &str) -> nats::Options {
    let o = match &cfg.auth {
        NatsAuth::Enrollment { token, seed } => nkey_options(seed.as_ref(), device, token.expose()),
        _ => nats::Options::new(),
    };
    with_tls(
        o.with_name(&format!("fleet-agent {device} (enrolling)"))
            .no_echo()
            // One of the two requests of an attempt is always refused (the
            // account the callout placed this connection in allows only the
            // other): expected, not worth a warning.
            .error_callback(|e| log::debug!("NATS server error while enrolling: {e}"))
            .max_reconnects(Some(1)),
        cfg,
    )
}

/// Delay before a connection attempt to a server that already failed
/// `attempts` times in a row: none for the first (the crate's default
/// sleeps up to 1 s even then), then 100 ms doubling to 5 s, plus up to a
/// quarter more at random so a fleet does not reconnect in step.
pub fn reconnect_delay(attempts: usize) -> Duration {
    if attempts == 0 {
        return Duration::ZERO;
    }
    let doublings = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(6);
    let base = (RECONNECT_FIRST_DELAY * 2u32.pow(doublings)).min(RECONNECT_MAX_DELAY);
    with_jitter(base)
}

/// `base` plus up to a quarter more, at random.
pub(super) fn with_jitter(base: Duration) -> Duration {
    let quarter = u64::try_from(base.as_millis() / 4).unwrap_or(0);
    let jitter = uuid::Uuid::new_v4().as_u64_pair().0 % quarter.saturating_add(1);
    base + Duration::from_millis(jitter)
}

pub(super) fn is_auth_message(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    m.contains("authorization violation")
        || m.contains("authentication")
        || m.contains("user authentication expired")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_grow_to_five_seconds_with_jitter() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        let first = reconnect_delay(1);
        assert!(
            first >= Duration::from_millis(100) && first <= Duration::from_millis(125),
            "{first:?}"
        );
        let late = reconnect_delay(50);
        assert!(
            late >= Duration::from_secs(5) && late <= Duration::from_millis(6250),
            "{late:?}"
        );
    }
}
