//! Fault injection for the crash matrix (cargo feature `fault-injection`,
//! never in release builds), armed by `FLEET_UPDATER_FAULT`:
//!
//! - `<point>` aborts the process (`std::process::abort`, as abrupt as a
//!   power cut for everything after the last fsync) the first time the named
//!   point is reached;
//! - `<point>:stop` stops it there instead (SIGSTOP to itself), frozen with
//!   the durable state the point left, so a test can look at that state and
//!   then end the process the way it needs: `kill -9` (the updater killed),
//!   or the whole machine killed at that instant (power loss), which an
//!   abort cannot give (systemd would restart the updater first). Resumed
//!   with SIGCONT, it goes on as if nothing happened.
//!
//! Points sit after every journal write, and before and after every symlink
//! switch and service call. Without the feature, [`hit`] compiles to nothing.

/// Every named point, in the order a transaction meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    AfterWritePreparing,
    AfterWriteActivating,
    BeforeStopPrevious,
    AfterStopPrevious,
    BeforeSwitchToTarget,
    AfterSwitchToTarget,
    BeforeStartTarget,
    AfterStartTarget,
    AfterWriteCommitted,
    AfterWriteRollingBack,
    BeforeRestorePrevious,
    AfterRestorePrevious,
    BeforeStopForRollback,
    AfterStopForRollback,
    BeforeStartPrevious,
    AfterStartPrevious,
    AfterWriteFailed,
    AfterWriteRollbackFailed,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 18] = [
        Self::AfterWritePreparing,
        Self::AfterWriteActivating,
        Self::BeforeStopPrevious,
        Self::AfterStopPrevious,
        Self::BeforeSwitchToTarget,
        Self::AfterSwitchToTarget,
        Self::BeforeStartTarget,
        Self::AfterStartTarget,
        Self::AfterWriteCommitted,
        Self::AfterWriteRollingBack,
        Self::BeforeRestorePrevious,
        Self::AfterRestorePrevious,
        Self::BeforeStopForRollback,
        Self::AfterStopForRollback,
        Self::BeforeStartPrevious,
        Self::AfterStartPrevious,
        Self::AfterWriteFailed,
        Self::AfterWriteRollbackFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterWritePreparing => "after-write-preparing",
            Self::AfterWriteActivating => "after-write-activating",
            Self::BeforeStopPrevious => "before-stop-previous",
            Self::AfterStopPrevious => "after-stop-previous",
            Self::BeforeSwitchToTarget => "before-switch-to-target",
            Self::AfterSwitchToTarget => "after-switch-to-target",
            Self::BeforeStartTarget => "before-start-target",
            Self::AfterStartTarget => "after-start-target",
            Self::AfterWriteCommitted => "after-write-committed",
            Self::AfterWriteRollingBack => "after-write-rolling-back",
            Self::BeforeRestorePrevious => "before-restore-previous",
            Self::AfterRestorePrevious => "after-restore-previous",
            Self::BeforeStopForRollback => "before-stop-for-rollback",
            Self::AfterStopForRollback => "after-stop-for-rollback",
            Self::BeforeStartPrevious => "before-start-previous",
            Self::AfterStartPrevious => "after-start-previous",
            Self::AfterWriteFailed => "after-write-failed",
            Self::AfterWriteRollbackFailed => "after-write-rollback-failed",
        }
    }

    pub fn parse(v: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == v)
    }

    /// The point reached right after the journal records `phase`.
    pub fn after_write(phase: fleet_common::contracts::JournalPhase) -> Self {
        use fleet_common::contracts::JournalPhase as P;
        match phase {
            P::Preparing => Self::AfterWritePreparing,
            P::Activating => Self::AfterWriteActivating,
            P::Committed => Self::AfterWriteCommitted,
            P::RollingBack => Self::AfterWriteRollingBack,
            P::Failed => Self::AfterWriteFailed,
            P::RollbackFailed => Self::AfterWriteRollbackFailed,
        }
    }
}

impl std::fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The environment variable naming the armed point (and its action).
pub const FAULT_ENV: &str = "FLEET_UPDATER_FAULT";

/// What the process does at the armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// `std::process::abort`.
    Abort,
    /// SIGSTOP to itself: frozen until killed (or resumed).
    Stop,
}

/// An armed fault: `<point>` or `<point>:stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub point: FaultPoint,
    pub action: FaultAction,
}

impl Fault {
    /// The value of [`FAULT_ENV`]; `None` when it names no point or action.
    pub fn parse(v: &str) -> Option<Self> {
        let (point, action) = match v.split_once(':') {
            None => (v, FaultAction::Abort),
            Some((point, "stop")) => (point, FaultAction::Stop),
            Some(_) => return None,
        };
        Some(Self {
            point: FaultPoint::parse(point)?,
            action,
        })
    }

    /// The value of [`FAULT_ENV`] that arms this fault.
    pub fn env_value(self) -> String {
        match self.action {
            FaultAction::Abort => self.point.as_str().to_owned(),
            FaultAction::Stop => format!("{}:stop", self.point),
        }
    }
}

/// Aborts or stops the process when `point` is the armed one.
#[cfg(feature = "fault-injection")]
pub fn hit(point: FaultPoint) {
    let Some(fault) = armed().filter(|f| f.point == point) else {
        return;
    };
    match fault.action {
        FaultAction::Abort => {
            log::error!("fault injection: aborting at {point}");
            eprintln!("fleet-updater: fault injection: aborting at {point}");
            std::process::abort();
        }
        FaultAction::Stop => {
            log::error!("fault injection: stopping at {point}");
            eprintln!("fleet-updater: fault injection: stopping at {point}");
            use rustix::process::{getpid, kill_process, Signal};
            if let Err(e) = kill_process(getpid(), Signal::STOP) {
                eprintln!("fleet-updater: fault injection: cannot stop at {point} ({e}); aborting");
                std::process::abort();
            }
        }
    }
}

/// Fault injection is compiled out of this build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn hit(_point: FaultPoint) {}

/// The armed fault, read once. An unknown name is a test bug: say so loudly
/// rather than run the test without its fault.
#[cfg(feature = "fault-injection")]
pub fn armed() -> Option<Fault> {
    static ARMED: std::sync::OnceLock<Option<Fault>> = std::sync::OnceLock::new();
    *ARMED.get_or_init(|| {
        let v = std::env::var(FAULT_ENV).ok()?;
        match Fault::parse(&v) {
            Some(p) => Some(p),
            None => {
                eprintln!("fleet-updater: unknown {FAULT_ENV}={v:?}; aborting");
                std::process::abort();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut names: Vec<&str> = FaultPoint::ALL.iter().map(|p| p.as_str()).collect();
        for p in FaultPoint::ALL {
            assert_eq!(FaultPoint::parse(p.as_str()), Some(p));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FaultPoint::ALL.len());
        assert_eq!(FaultPoint::parse("after-write-nothing"), None);
    }

    #[test]
    fn a_fault_aborts_or_stops() {
        for p in FaultPoint::ALL {
            for action in [FaultAction::Abort, FaultAction::Stop] {
                let f = Fault { point: p, action };
                assert_eq!(Fault::parse(&f.env_value()), Some(f));
            }
        }
        assert_eq!(
            Fault::parse("before-start-target"),
            Some(Fault {
                point: FaultPoint::BeforeStartTarget,
                action: FaultAction::Abort
            })
        );
        assert_eq!(
            Fault::parse("before-start-target:stop"),
            Some(Fault {
                point: FaultPoint::BeforeStartTarget,
                action: FaultAction::Stop
            })
        );
        for bad in [
            "before-start-target:",
            "before-start-target:pause",
            "nowhere:stop",
            ":stop",
        ] {
            assert_eq!(Fault::parse(bad), None, "{bad}");
        }
    }
}
