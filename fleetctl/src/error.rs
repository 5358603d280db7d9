//! The error of every NATS command of fleetctl, and the one mapping from
//! error to exit code (listed in `fleetctl --help`).

use std::fmt;

/// A failed operator command.
#[derive(Debug)]
pub enum CtlError {
    /// A bad argument, file or value: nothing was written.
    Input(String),
    /// NATS could not be reached or refused the credentials.
    Connect { servers: String, detail: String },
    /// A NATS or JetStream request failed.
    Nats { what: String, detail: String },
    /// The device's state forbids the write (a failed release without
    /// `--retry`, an updater in `rollback-failed`, an unknown device).
    Refused(String),
    /// Another writer changed the key between the read and the
    /// compare-and-set write: nothing of ours was written.
    Conflict(String),
}

impl CtlError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Input(_) => 3,
            Self::Connect { .. } => 4,
            Self::Nats { .. } => 5,
            Self::Refused(_) => 6,
            Self::Conflict(_) => 7,
        }
    }

    /// A closure turning an I/O error of the `nats` crate into [`CtlError::Nats`].
    pub fn nats(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CtlError {
        let what = what.into();
        move |e| CtlError::Nats {
            what,
            detail: e.to_string(),
        }
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Input(m) | Self::Refused(m) | Self::Conflict(m) => f.write_str(m),
            Self::Connect { servers, detail } => write!(
                f,
                "connecting to NATS at {servers}: {detail}; check --server and the credentials (--user and --password-file, --token-file, --creds, or --config)"
            ),
            Self::Nats { what, detail } => write!(f, "{what}: {detail}"),
        }
    }
}

impl std::error::Error for CtlError {}

/// The exit codes, for the help texts.
pub const EXIT_CODES: &str =
    "Exit codes: 0 done, 2 usage, 3 invalid input, 4 NATS connection, 5 NATS request,
6 refused by the device's state, 7 lost a compare-and-set race (nothing written; re-run),
8 staged rollout halted below its success threshold, 9 staged rollout aborted.
";
