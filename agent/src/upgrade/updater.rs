//! The agent's side of the updater socket (`/run/harmony-fleet/updater.sock`):
//! `status` (bounded by the caller, at most
//! [`SOCKET_STATUS_RESPONSE_TIMEOUT`]) and `upgrade` (blocks up to
//! [`SOCKET_UPGRADE_RESPONSE_TIMEOUT`], so it runs on its own thread), and
//! the mapping from the updater's refusals to public reasons.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use fleet_common::contracts::{
    AgentUpgradeAttempt, ErrorBody, ErrorCode, Response, UpdaterReply, UpdaterRequest,
    UpgradeReason, UpgradeStatus,
};
use fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT;
use fleet_common::socket::{self, ClientError};

/// A `status` request that got no status.
#[derive(Debug)]
pub enum StatusError {
    /// No answer (not running, not allowed, timed out, malformed answer).
    Unreachable(ClientError),
    /// The updater answered with an error.
    Refused(ErrorBody),
}

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable(e) => write!(f, "the updater did not answer status: {e}"),
            Self::Refused(e) => write!(f, "the updater refused status: {e}"),
        }
    }
}

impl std::error::Error for StatusError {}

/// The updater's current or last transaction.
pub fn status(socket_path: &Path, timeout: Duration) -> Result<Option<UpgradeStatus>, StatusError> {
    match socket::call::<_, UpdaterReply>(socket_path, &UpdaterRequest::Status {}, timeout) {
        Ok(Response::Ok(reply)) => Ok(reply.status),
        Ok(Response::Err(e)) => Err(StatusError::Refused(e)),
        Err(e) => Err(StatusError::Unreachable(e)),
    }
}

/// Sends one `upgrade` request and waits for its answer (preparation and
/// probe), at most [`SOCKET_UPGRADE_RESPONSE_TIMEOUT`].
pub fn upgrade(
    socket_path: &Path,
    attempt: &AgentUpgradeAttempt,
) -> Result<Response<UpdaterReply>, ClientError> {
    socket::call(
        socket_path,
        &UpdaterRequest::Upgrade {
            attempt: attempt.clone(),
        },
        SOCKET_UPGRADE_RESPONSE_TIMEOUT,
    )
}

/// The public reason of a failed attempt the updater refused with `code`.
pub fn refusal_reason(code: ErrorCode) -> UpgradeReason {
    match code {
        ErrorCode::Quarantined => UpgradeReason::Quarantined,
        ErrorCode::Frozen => UpgradeReason::Frozen,
        ErrorCode::Conflict => UpgradeReason::Conflict,
        ErrorCode::Invalid | ErrorCode::TooLarge => UpgradeReason::Rejected,
        ErrorCode::Busy
        | ErrorCode::Refused
        | ErrorCode::Forbidden
        | ErrorCode::Timeout
        | ErrorCode::Internal => UpgradeReason::UpdaterUnavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_their_public_reasons() {
        use ErrorCode as C;
        use UpgradeReason as R;
        for (code, reason) in [
            (C::Quarantined, R::Quarantined),
            (C::Frozen, R::Frozen),
            (C::Conflict, R::Conflict),
            (C::Invalid, R::Rejected),
            (C::Busy, R::UpdaterUnavailable),
            (C::Refused, R::UpdaterUnavailable),
            (C::Forbidden, R::UpdaterUnavailable),
            (C::Internal, R::UpdaterUnavailable),
        ] {
            assert_eq!(refusal_reason(code), reason, "{code}");
        }
    }

    #[test]
    fn no_updater_is_unreachable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = status(&dir.path().join("updater.sock"), Duration::from_secs(1))
            .expect_err("no socket");
        assert!(
            matches!(&e, StatusError::Unreachable(c) if c.is_unreachable()),
            "{e}"
        );
    }
}
