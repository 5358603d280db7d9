//! Full disks: the updater under the supervisor with its state
//! directory (and, for reclaim, its versions directory) on a small tmpfs,
//! which the test fills and frees.
//!
//! - A failed `committed` write is never published: a tight status poll
//!   across it sees only phases the journal on disk holds, never
//!   `complete`; the rollback that follows ends recorded once space is
//!   freed, on the previous agent.
//! - A restart on a still-full disk mid-transaction does not exit: the
//!   previous agent is selected and started, status says what is not
//!   recorded, and the journal is written once space is freed.
//! - A failed preparation whose `failed` cannot be written: status stays
//!   on `preparing` with the reason, new attempts are `busy`, and `failed`
//!   is written once space is freed.
//! - A journal write or a download refused for space removes unused
//!   versioned agents (never the active, previous or target; oldest
//!   first) and is retried.
//! - Restoring the previous link at a restart with no space left removes
//!   unused agents and runs again, rather than quarantining the device.
//! - Temp files a kill left behind are removed at start.
//!
//! Needs root (mount) and `mount`/`umount` (Debian package `mount`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_common::contracts::{JournalPhase, UpgradePhase, UpgradeReason};
use fleet_harness::{poll_until, Behavior, HttpsServer, TestCa};
use fleet_updater::{Fault, FaultAction, FaultPoint, FAULT_ENV};
use support::{attempt, Device, Run, SelfTest, StandIn, SETTLE};

/// A tmpfs mounted on a directory of a test device; unmounted on drop
/// (before the device's temp root is removed: declare it after the device).
struct Tmpfs {
    at: Vec<PathBuf>,
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}: install the Debian package mount"));
    assert!(
        out.status.success(),
        "{cmd:?}: {} (these tests need root)",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Tmpfs {
    /// A tmpfs of `kib` KiB at `dir`.
    fn mount(dir: &Path, kib: u64) -> Self {
        Self::mount_with(dir, &format!("size={kib}k"))
    }

    /// A tmpfs with mount options `opts` at `dir`.
    fn mount_with(dir: &Path, opts: &str) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("{opts},mode=0755"))
            .arg("tmpfs")
            .arg(dir));
        Self {
            at: vec![dir.to_owned()],
        }
    }

    /// One tmpfs of `kib` KiB shown at every directory of `dirs`
    /// (bind mounts of sub-directories), so they share its space.
    fn shared(dirs: &[PathBuf], kib: u64, base: &Path) -> Self {
        Self::shared_with(dirs, &format!("size={kib}k"), base)
    }

    /// [`Self::shared`] with mount options `opts`.
    fn shared_with(dirs: &[PathBuf], opts: &str, base: &Path) -> Self {
        let mut t = Self::mount_with(base, opts);
        for (i, d) in dirs.iter().enumerate() {
            let sub = base.join(format!("d{i}"));
            std::fs::create_dir_all(&sub).expect("sub");
            std::fs::create_dir_all(d).expect("mount point");
            run(Command::new("mount").arg("--bind").arg(&sub).arg(d));
            t.at.insert(0, d.clone());
        }
        t
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for d in &self.at {
            let _ = Command::new("umount").arg("-l").arg(d).status();
        }
    }
}

/// Fills the file system of `dir` with `dir/filler` until a write fails.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    // Small writes too, until nothing fits.
    while f.write_all(&[0]).is_ok() {}
    path
}

fn updater_with_stop_fault(device: &Device, point: FaultPoint) -> fleet_harness::ChildGuard {
    let fault = Fault {
        point,
        action: FaultAction::Stop,
    };
    let mut cmd = device.updater_command();
    cmd.env(FAULT_ENV, fault.env_value());
    let guard = fleet_harness::ChildGuard::spawn(cmd, "fleet-updater");
    guard.wait_for_line("recovery complete", SETTLE);
    guard
}

fn wait_stopped(pid: u32) {
    let stat = format!("/proc/{pid}/stat");
    poll_until("the updater stopped at its fault point", SETTLE, || {
        let s = std::fs::read_to_string(&stat).ok()?;
        let state = s[s.rfind(')')? + 1..].split_whitespace().next()?.to_owned();
        (state == "T").then_some(())
    });
}

fn send_upgrade(device: &Device, a: &fleet_common::contracts::AgentUpgradeAttempt) {
    let socket = device.layout.updater_socket();
    let req = a.clone();
    std::thread::spawn(move || {
        fleet_common::socket::call::<_, fleet_common::contracts::UpdaterReply>(
            &socket,
            &fleet_common::contracts::UpdaterRequest::Upgrade { attempt: req },
            fleet_common::limits::SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
    });
}

/// The public phases a journal phase may be shown as.
fn shows(phase: JournalPhase, public: UpgradePhase) -> bool {
    use JournalPhase as J;
    use UpgradePhase as U;
    matches!(
        (phase, public),
        (J::Preparing, U::Preparing)
            | (J::Activating, U::Stopping | U::Starting)
            | (J::Committed, U::Complete)
            | (J::RollingBack, U::RollingBack)
            | (J::Failed, U::Failed)
            | (J::RollbackFailed, U::RollbackFailed)
    )
}

#[test]
fn a_committed_write_that_fails_is_never_reported_complete() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::good("2.0");
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let state = device.layout.updater_state_dir();
    let _tmpfs = Tmpfs::mount(&state, 256);
    let a = attempt(&server.url("/agent"), &v2);

    let updater = updater_with_stop_fault(&device, FaultPoint::BeforeStartTarget);
    send_upgrade(&device, &a);
    wait_stopped(updater.pid());
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Activating
    );
    let filler = fill(&state);

    // Tight poll: every answer is a phase the journal on disk holds (read
    // before and after the answer, the journal can only have been one of
    // the two), never `complete`, until the rollback has run in memory and
    // the previous agent is back.
    updater.signal(rustix::process::Signal::CONT);
    let deadline = Instant::now() + SETTLE;
    let mut seen = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "no rollback; seen {seen:?}\n{}",
            updater.log()
        );
        let before = device.journal().transaction.expect("tx").phase;
        let Ok(Some(s)) = device.try_status() else {
            continue;
        };
        let after = device.journal().transaction.expect("tx").phase;
        assert_ne!(
            s.phase,
            UpgradePhase::Complete,
            "complete while the disk says {after}"
        );
        assert!(
            shows(before, s.phase) || shows(after, s.phase),
            "status {} while the journal went from {before} to {after}",
            s.phase
        );
        if seen.last() != Some(&s.phase) {
            seen.push(s.phase);
        }
        let error = s
            .error
            .as_ref()
            .map(|e| e.as_str().to_owned())
            .unwrap_or_default();
        let rolled_back_in_memory = error.starts_with("not recorded: recording phase failed")
            || error.starts_with("not recorded: recording phase rolling-back");
        if rolled_back_in_memory
            && device.running_agents().len() == 1
            && device.active() == device.binary("1.0")
        {
            break;
        }
    }
    let s = device.status().expect("status");
    assert_eq!(
        s.phase,
        UpgradePhase::Stopping,
        "activating on disk, not starting the target"
    );
    assert!(
        s.error
            .as_ref()
            .is_some_and(|e| e.as_str().contains("No space left on device")),
        "{s:?}"
    );
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Activating
    );
    device.assert_only_agent("1.0");
    let log = updater.log();
    assert!(log.contains("bytes free on"), "{log}");

    // Space freed: the rollback's end is written, with backoff.
    std::fs::remove_file(filler).expect("free space");
    let s = device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed))
    );
    assert_eq!(
        s.error
            .as_ref()
            .map(|e| e.as_str())
            .filter(|e| e.starts_with("not recorded")),
        None
    );
    let journal = device.journal();
    let tx = journal.transaction.as_ref().expect("tx");
    assert_eq!(tx.phase, JournalPhase::Failed);
    assert!(
        !tx.transitions
            .iter()
            .any(|t| t.phase == JournalPhase::Committed),
        "{journal:#?}"
    );
    assert!(
        tx.errors.iter().any(|e| e.step.as_str() == "commit"),
        "the commit failure is on record: {journal:#?}"
    );
    device.assert_only_agent("1.0");
    eprintln!("public phases seen: {seen:?}");
}

#[test]
fn a_full_disk_at_start_mid_transaction_ends_on_the_previous_agent() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::good("2.0");
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let state = device.layout.updater_state_dir();
    let _tmpfs = Tmpfs::mount(&state, 256);
    let a = attempt(&server.url("/agent"), &v2);

    // Killed with the target selected and `activating` on disk.
    let mut first = device.start_updater_with_fault(FaultPoint::AfterSwitchToTarget);
    send_upgrade(&device, &a);
    first.wait_aborted();
    support::poll_agents_gone(&device);
    assert_eq!(device.active(), device.binary("2.0"));
    let filler = fill(&state);

    // Restarted on the full disk: no exit, the previous agent runs, and
    // status says the phase on disk and what is not recorded.
    let mut second = device.start_updater();
    device.assert_only_agent("1.0");
    let s = device.status().expect("status");
    assert_eq!(s.phase, UpgradePhase::Stopping, "{s:?}");
    let error = s
        .error
        .as_ref()
        .map(|e| e.as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        error.starts_with("not recorded: recording phase "),
        "{error}"
    );
    assert!(error.contains("No space left on device"), "{error}");
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Activating
    );
    assert!(
        second.guard.try_wait().is_none(),
        "the updater keeps running"
    );
    let log = second.log();
    assert!(log.contains("journal phase at start: activating;"), "{log}");
    assert!(log.contains("is not recorded ("), "{log}");
    assert!(log.contains("bytes free on"), "{log}");

    std::fs::remove_file(filler).expect("free space");
    let s = device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Interrupted))
    );
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Failed
    );
    device.assert_only_agent("1.0");
    second.guard.wait_for_line("recorded after", SETTLE);
    // The journal keeps that it could not be written, and why.
    let tx = device.journal().transaction.expect("tx");
    assert!(
        tx.errors.iter().any(|e| e.step.as_str() == "journal"
            && e.message.as_str().contains("could not be written from")
            && e.message.as_str().contains("No space left on device")),
        "{:?}",
        tx.errors
    );
}

#[test]
fn a_journal_write_without_space_reclaims_unused_agents_and_is_retried() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::good("2.0");
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let base = device.root().join("shared-tmpfs");
    let v1_script = StandIn::good("1.0").script();
    let _tmpfs = Tmpfs::shared(
        &[
            device.layout.versions_dir(),
            device.layout.updater_state_dir(),
        ],
        512,
        &base,
    );
    // The versions directory is now the tmpfs: install 1.0 again, and three
    // old agents, oldest first.
    let install = |v: &str, bytes: &[u8], age: u64| {
        let p = device.binary(v);
        std::fs::write(&p, bytes).expect("install");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let f = std::fs::File::options().write(true).open(&p).expect("open");
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(age))
            .expect("mtime");
        p
    };
    let v1 = install("1.0", &v1_script, 10);
    let old = [
        install("0.1", &[b'a'; 40_000], 300),
        install("0.3", &[b'c'; 40_000], 100),
        install("0.2", &[b'b'; 40_000], 200),
    ];
    let _updater = device.start_updater();
    device.assert_only_agent("1.0");
    let filler = fill(&device.layout.updater_state_dir());

    // `preparing` cannot be written until the old agents go; then the
    // download fits too.
    let s = device.upgrade_ok(&attempt(&server.url("/agent"), &v2));
    assert_ne!(s.phase, UpgradePhase::Failed, "{s:?}");
    let s = device.wait_terminal();
    assert_eq!(s.phase, UpgradePhase::Complete, "{s:?}\n{}", _updater.log());
    device.assert_only_agent("2.0");
    for p in &old {
        assert!(!p.exists(), "{} removed", p.display());
    }
    assert!(v1.exists(), "the previous agent is kept");
    let log = _updater.log();
    let order: Vec<usize> = ["0.1", "0.2", "0.3"]
        .iter()
        .map(|v| {
            log.find(&format!(
                "removed the unused agent {} (40000 bytes)",
                device.binary(v).display()
            ))
            .unwrap_or_else(|| panic!("{v} removal logged: {log}"))
        })
        .collect();
    assert!(
        order[0] < order[1] && order[1] < order[2],
        "oldest first: {log}"
    );
    assert!(
        log.contains("removed 3 unused agent(s), 120000 bytes freed"),
        "{log}"
    );
    drop(filler);
}

#[test]
fn a_download_without_space_reclaims_unused_agents_and_runs_again() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::good("2.0");
    // 60 kB more than the script (a comment), more than the space left.
    let mut artifact = v2.script();
    artifact.extend_from_slice(b"\n# ");
    artifact.extend(vec![b'x'; 60_000]);
    artifact.push(b'\n');
    server.route("/agent", Behavior::Bytes(artifact.clone()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let base = device.root().join("shared-tmpfs");
    let v1_script = StandIn::good("1.0").script();
    let _tmpfs = Tmpfs::shared(
        &[
            device.layout.versions_dir(),
            device.layout.updater_state_dir(),
        ],
        512,
        &base,
    );
    let install = |v: &str, bytes: &[u8], age: u64| {
        let p = device.binary(v);
        std::fs::write(&p, bytes).expect("install");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let f = std::fs::File::options().write(true).open(&p).expect("open");
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(age))
            .expect("mtime");
        p
    };
    let v1 = install("1.0", &v1_script, 10);
    let old = install("0.1", &[b'a'; 100_000], 300);
    let updater = device.start_updater();
    device.assert_only_agent("1.0");
    // Full but for 16 KiB: journal writes fit, the download does not.
    let filler = fill(&device.layout.updater_state_dir());
    let f = std::fs::File::options()
        .write(true)
        .open(&filler)
        .expect("filler");
    let len = f.metadata().expect("meta").len();
    f.set_len(len.saturating_sub(16 * 1024)).expect("truncate");
    drop(f);

    let mut a = attempt(&server.url("/agent"), &v2);
    a.sha256 = fleet_common::validate::Sha256Hex::of(&artifact);
    device.upgrade_ok(&a);
    let s = device.wait_terminal();
    assert_eq!(s.phase, UpgradePhase::Complete, "{s:?}\n{}", updater.log());
    device.assert_only_agent("2.0");
    assert!(!old.exists());
    assert!(v1.exists(), "the previous agent is kept");
    let log = updater.log();
    assert!(log.contains("No space left on device"), "{log}");
    assert!(
        log.contains(&format!(
            "disk full: removed the unused agent {} (100000 bytes)",
            old.display()
        )),
        "{log}"
    );
    assert!(
        log.contains("removed 1 unused agent(s), 100000 bytes freed"),
        "{log}"
    );
}

#[test]
fn a_failed_preparation_that_cannot_be_recorded_is_written_once_space_is_freed() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::with("2.0", SelfTest::Fail, Run::Ready);
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let state = device.layout.updater_state_dir();
    let _tmpfs = Tmpfs::mount(&state, 256);
    let a = attempt(&server.url("/agent"), &v2);

    let updater = updater_with_stop_fault(&device, FaultPoint::AfterWritePreparing);
    send_upgrade(&device, &a);
    wait_stopped(updater.pid());
    let filler = fill(&state);
    updater.signal(rustix::process::Signal::CONT);

    // The probe fails; `failed` cannot be written: status stays on the
    // `preparing` on disk, says why, and a new attempt is told busy.
    let s = poll_until("the unrecorded failure in status", SETTLE, || {
        device.try_status().ok().flatten().filter(|s| {
            s.error.as_ref().is_some_and(|e| {
                e.as_str()
                    .starts_with("not recorded: recording phase failed")
            })
        })
    });
    assert_eq!(s.phase, UpgradePhase::Preparing, "{s:?}");
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Preparing
    );
    device.assert_only_agent("1.0");
    let other = attempt(&server.url("/agent"), &StandIn::good("3.0"));
    match device.upgrade(&other) {
        fleet_common::contracts::Response::Err(e) => {
            assert_eq!(e.code, fleet_common::contracts::ErrorCode::Busy, "{e}")
        }
        fleet_common::contracts::Response::Ok(r) => panic!("accepted on a full disk: {r:?}"),
    }

    std::fs::remove_file(filler).expect("free space");
    let s = device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Probe))
    );
    assert_eq!(
        device.journal().transaction.expect("tx").phase,
        JournalPhase::Failed
    );
    device.assert_only_agent("1.0");
    updater.wait_for_line("phase failed recorded after", SETTLE);
}

/// The link's directory and the versions directory share a tmpfs with
/// no inode left at restart: restoring the previous link fails for space,
/// unused agents are removed, and the restore runs again (a full disk
/// does not end in `rollback-failed`).
#[test]
fn restoring_the_previous_link_without_space_reclaims_and_runs_again() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let v2 = StandIn::good("2.0");
    server.route("/agent", Behavior::Bytes(v2.script()));
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let base = device.root().join("shared-tmpfs");
    let bin = device
        .layout
        .active_agent_link()
        .parent()
        .expect("bin")
        .to_owned();
    let _tmpfs = Tmpfs::shared_with(
        &[device.layout.versions_dir(), bin],
        "size=1m,nr_inodes=64",
        &base,
    );
    let v1 = device.binary("1.0");
    std::fs::write(&v1, StandIn::good("1.0").script()).expect("install");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&v1, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::symlink(&v1, device.layout.active_agent_link()).expect("link");
    let old = device.binary("0.1");
    std::fs::write(&old, b"old").expect("old agent");
    let a = attempt(&server.url("/agent"), &v2);

    let mut first = device.start_updater_with_fault(FaultPoint::AfterSwitchToTarget);
    send_upgrade(&device, &a);
    first.wait_aborted();
    support::poll_agents_gone(&device);
    assert_eq!(device.active(), device.binary("2.0"));
    // No inode left on the shared tmpfs.
    let mut n = 0;
    while std::fs::write(base.join(format!("inode-{n}")), b"").is_ok() {
        n += 1;
    }
    assert!(n > 0);

    let second = device.start_updater();
    let s = device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Interrupted))
    );
    device.assert_only_agent("1.0");
    assert!(!old.exists(), "the unused agent was removed");
    assert!(device.binary("2.0").exists(), "the target is kept");
    let log = second.log();
    assert!(log.contains("creating a symlink beside"), "{log}");
    assert!(log.contains("No space left on device"), "{log}");
    assert!(
        log.contains(&format!(
            "disk full: removed the unused agent {}",
            old.display()
        )),
        "{log}"
    );
}

#[test]
fn temp_files_left_by_a_kill_are_removed_at_start() {
    let ca = TestCa::new();
    let device = Device::new(&ca, &StandIn::with("1.0", SelfTest::Pass, Run::Ready));
    let state = device.layout.updater_state_dir();
    std::fs::create_dir_all(&state).expect("state dir");
    let bin = device
        .layout
        .active_agent_link()
        .parent()
        .expect("bin")
        .to_owned();
    let journal_tmp = state.join(".journal.json.tmp.4242.0123456789ab");
    let link_tmp = bin.join(".fleet-agent.tmp.4242.0123456789ab");
    let download_tmp = device
        .layout
        .versions_dir()
        .join(".fleet-agent-v2.0.tmp.4242.abcdefabcdef");
    std::fs::write(&journal_tmp, b"{\"format\":1,").expect("journal temp");
    std::os::unix::fs::symlink(device.binary("1.0"), &link_tmp).expect("link temp");
    std::fs::write(&download_tmp, b"half").expect("download temp");
    // Not ours: kept.
    let other = bin.join(".other.tmp.4242.0123456789ab");
    std::fs::write(&other, b"x").expect("other");

    let updater = device.start_updater();
    for p in [&journal_tmp, &link_tmp, &download_tmp] {
        assert!(
            std::fs::symlink_metadata(p).is_err(),
            "{} removed",
            p.display()
        );
    }
    assert!(other.exists());
    let log = updater.log();
    assert!(
        log.contains(&format!(
            "removed the stale temp file {}",
            journal_tmp.display()
        )),
        "{log}"
    );
}
