//! systemd notifications (`sd_notify`): READY=1, STATUS= lines shown by
//! `systemctl status`, STOPPING=1. Without `NOTIFY_SOCKET` (not under
//! systemd) they do nothing; a failed send is logged, never fatal.

use libsystemd::daemon::{self, NotifyState};

fn send(states: &[NotifyState]) {
    if let Err(e) = daemon::notify(false, states) {
        log::warn!("notifying systemd: {e}");
    }
}

/// `STATUS=<text>`.
pub fn status(text: &str) {
    log::debug!("status: {text}");
    send(&[NotifyState::Status(text.to_owned())]);
}

/// `READY=1` with a final `STATUS=`.
pub fn ready(text: &str) {
    log::info!("ready: {text}");
    send(&[NotifyState::Ready, NotifyState::Status(text.to_owned())]);
}

/// `STOPPING=1` with a final `STATUS=`.
pub fn stopping(text: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(text.to_owned())]);
}
