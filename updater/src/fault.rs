//! Fault injection for the crash matrix (cargo feature `fault-injection`,
//! never in release builds): `FLEET_UPDATER_FAULT=<point>` aborts the process
//! (`std::process::abort`, as abrupt as a power cut for everything after the
//! last fsync) the first time the named point is reached.
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

/// The environment variable naming the armed point.
pub const FAULT_ENV: &str = "FLEET_UPDATER_FAULT";

/// Aborts the process when `point` is the armed one.
#[cfg(feature = "fault-injection")]
pub fn hit(point: FaultPoint) {
    if armed() == Some(point) {
        log::error!("fault injection: aborting at {point}");
        eprintln!("fleet-updater: fault injection: aborting at {point}");
        std::process::abort();
    }
}

/// Fault injection is compiled out of this build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn hit(_point: FaultPoint) {}

/// The armed point, read once. An unknown name is a test bug: say so loudly
/// rather than run the test without its fault.
#[cfg(feature = "fault-injection")]
pub fn armed() -> Option<FaultPoint> {
    static ARMED: std::sync::OnceLock<Option<FaultPoint>> = std::sync::OnceLock::new();
    *ARMED.get_or_init(|| {
        let v = std::env::var(FAULT_ENV).ok()?;
        match FaultPoint::parse(&v) {
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
}
