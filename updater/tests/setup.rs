//! `fleet-updater setup`, the real binary in temp roots: a device set up
//! from a checkout's packaging files (users, directories, ids, the versioned
//! agent, the link, config, drop-ins) and set up again without change; the
//! link to a later agent kept; refused during a transaction and on a corrupt
//! journal; and the root repair of `rollback-failed` under the supervisor,
//! which lifts the quarantine only when the selected agent became ready.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use fleet_common::contracts::{Journal, JournalPhase, UpgradePhase};
use fleet_common::validate::Version;
use fleet_common::Layout;
use fleet_harness::{bin_path, workspace_root, Behavior, HttpsServer, TestCa};
use support::{attempt, Device, Run, SelfTest, StandIn, TEST_BOUNDS};

fn setup(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleet-updater"))
        .arg("setup")
        .arg("--root")
        .arg(root)
        .args(args)
        .env(fleet_updater::TEST_BOUNDS_ENV, TEST_BOUNDS)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("run fleet-updater setup")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A root with a base system's account files: root only.
fn base_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(&etc).expect("mkdir");
    for (f, line) in [
        ("passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("group", "root:x:0:\n"),
        ("shadow", "root:*:19000:0:99999:7:::\n"),
        ("gshadow", "root:*::\n"),
    ] {
        std::fs::write(etc.join(f), line).expect("write");
    }
    dir
}

fn id_of(root: &Path, file: &str, name: &str) -> u32 {
    std::fs::read_to_string(root.join("etc").join(file))
        .expect("read")
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} not in {file}"))
        .split(':')
        .nth(2)
        .expect("id")
        .parse()
        .expect("numeric")
}

/// The golden journal of fleet-common, in `phase`, with its paths under
/// `layout`.
fn journal_in(layout: &Layout, phase: &str) -> String {
    let golden = std::fs::read_to_string(workspace_root().join("common/tests/golden/journal.json"))
        .expect("golden journal");
    golden
        .replace(
            "/usr/lib/harmony-fleet/",
            &format!("{}/", layout.versions_dir().display()),
        )
        .replacen(
            "\"phase\": \"rolling-back\"",
            &format!("\"phase\": \"{phase}\""),
            1,
        )
}

#[test]
fn a_device_is_set_up_from_a_checkout_and_again_without_change() {
    let dir = base_root();
    let root = dir.path();
    let layout = Layout::with_root(root);
    let agent = bin_path("fleet-agent");
    let config = root.join("agent-source.json");
    std::fs::write(&config, "{\"device-id\": \"dev1\"}\n").expect("config");
    let packaging = workspace_root().join("packaging");
    let args = [
        "--units-from",
        packaging.to_str().expect("utf-8"),
        "--agent-binary",
        agent.to_str().expect("utf-8"),
        "--config",
        config.to_str().expect("utf-8"),
    ];
    let out = setup(root, &args);
    assert!(out.status.success(), "{}", text(&out));

    // Users and directories, through the root's own sysusers and tmpfiles.
    let uid = id_of(root, "passwd", "fleet-agent");
    let gid = id_of(root, "group", "fleet-agent");
    id_of(root, "group", "fleet-control");
    for (path, mode, owner, group) in [
        ("var/lib/harmony-fleet/updater", 0o700, 0, 0),
        ("var/lib/harmony-fleet/agent", 0o750, uid, gid),
        ("etc/harmony-fleet", 0o750, 0, gid),
        ("run/harmony-fleet", 0o1771, 0, gid),
    ] {
        let m = std::fs::metadata(root.join(path)).expect(path);
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid()),
            (mode, owner, group),
            "{path}"
        );
    }
    for unit in ["fleet-agent.service", "fleet-updater.service"] {
        assert!(layout.unit_dir().join(unit).is_file(), "{unit}");
        // Enabled offline: WantedBy=multi-user.target.
        let wants = layout.unit_dir().join("multi-user.target.wants").join(unit);
        assert!(
            std::fs::symlink_metadata(&wants).is_ok(),
            "{} missing",
            wants.display()
        );
    }
    for f in ["etc/subuid", "etc/subgid"] {
        assert_eq!(
            std::fs::read_to_string(root.join(f)).expect(f),
            "fleet-agent:100000:65536\n"
        );
    }

    // The agent as a versioned binary, linked; the config; the drop-in.
    let version = Version::parse(env!("CARGO_PKG_VERSION")).expect("version");
    let installed = layout.versioned_agent(&version);
    assert_eq!(
        std::fs::read(&installed).expect("installed"),
        std::fs::read(&agent).expect("agent")
    );
    assert_eq!(
        std::fs::metadata(&installed)
            .expect("m")
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(layout.active_agent_link()).expect("link"),
        installed
    );
    let m = std::fs::metadata(layout.agent_config()).expect("config installed");
    assert_eq!((m.mode() & 0o777, m.uid(), m.gid()), (0o640, 0, gid));
    let dropin = std::fs::read_to_string(
        layout
            .unit_dir()
            .join("fleet-agent.service.d/50-rootless-podman.conf"),
    )
    .expect("drop-in");
    assert!(
        dropin.contains(&format!("XDG_RUNTIME_DIR=/run/user/{uid}\n")),
        "{dropin}"
    );

    // Again: nothing moves. Then with the link on a later agent (what an
    // upgrade leaves): it stays there.
    let out = setup(root, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("active agent kept"), "{}", text(&out));
    assert!(!text(&out).contains("installed agent"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/subuid")).expect("subuid"),
        "fleet-agent:100000:65536\n"
    );
    let later = layout.versioned_agent(&Version::parse("9.9.9").expect("v"));
    std::fs::copy(&agent, &later).expect("later agent");
    fleet_common::durable::switch_symlink(&layout.active_agent_link(), &later).expect("switch");
    let out = setup(root, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_link(layout.active_agent_link()).expect("link"),
        later
    );
}

#[test]
fn setup_refuses_during_a_transaction_and_on_a_corrupt_journal() {
    let dir = base_root();
    let root = dir.path();
    let layout = Layout::with_root(root);
    let agent = bin_path("fleet-agent");
    std::fs::create_dir_all(layout.updater_state_dir()).expect("mkdir");
    for phase in ["preparing", "activating", "rolling-back"] {
        std::fs::write(layout.journal(), journal_in(&layout, phase)).expect("journal");
        let out = setup(root, &["--agent-binary", agent.to_str().expect("utf-8")]);
        assert_eq!(out.status.code(), Some(1), "{phase}: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!(
                "fleet-updater setup: an agent upgrade is in progress (phase {phase} in {}): device setup during a transaction is unsupported; wait until `fleet-updater status` shows it finished, then run setup again\n",
                layout.journal().display()
            )
        );
    }
    std::fs::write(layout.journal(), "{\"format\": 1, \"transaction\": 3}").expect("journal");
    let out = setup(root, &["--agent-binary", agent.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("follow REPAIR.md"), "{}", text(&out));
    // Nothing was done.
    assert!(!layout.versions_dir().exists(), "an agent was installed");
    assert!(std::fs::symlink_metadata(layout.active_agent_link()).is_err());
}

/// A device quarantined after the golden attempt (1.3.2 → 1.4.0), with the
/// stand-ins of `installed` in place and the link on 1.4.0.
fn quarantined(ca: &TestCa, installed: &[StandIn]) -> Device {
    let device = Device::new(ca, &StandIn::good("1.4.0"));
    for s in installed {
        let path = device.binary(&s.version);
        std::fs::write(&path, s.script()).expect("install stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::create_dir_all(device.layout.updater_state_dir()).expect("mkdir");
    std::fs::write(
        device.layout.journal(),
        journal_in(&device.layout, "rollback-failed"),
    )
    .expect("journal");
    // setup reads the updater's config from the root: candidates as nobody.
    std::fs::write(
        device.layout.updater_config(),
        "{\"probe-user\": \"nobody\"}\n",
    )
    .expect("updater config");
    device
}

#[test]
fn without_repair_a_quarantined_device_keeps_its_link_and_quarantine() {
    let ca = TestCa::new();
    let device = quarantined(&ca, &[StandIn::good("1.3.2")]);
    let before = std::fs::read(device.layout.journal()).expect("journal");
    let agent = bin_path("fleet-agent");
    // A package install runs setup without --repair: it succeeds, says how
    // to repair, and moves nothing.
    let out = setup(
        device.root(),
        &["--agent-binary", agent.to_str().expect("utf-8")],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the updater is quarantined (rollback-failed)"),
        "{}",
        text(&out)
    );
    assert_eq!(device.active(), device.binary("1.4.0"));
    assert_eq!(
        std::fs::read(device.layout.journal()).expect("journal"),
        before
    );

    // --repair where there is nothing to repair is refused.
    let fresh = base_root();
    let out = setup(
        fresh.path(),
        &["--repair", "--agent-binary", agent.to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("--repair: the updater is not in rollback-failed"),
        "{}",
        text(&out)
    );
    assert!(
        std::fs::symlink_metadata(Layout::with_root(fresh.path()).active_agent_link()).is_err()
    );
}

#[test]
fn the_repair_lifts_the_quarantine_once_the_selected_agent_is_ready() {
    let ca = TestCa::new();
    let device = quarantined(&ca, &[StandIn::good("1.3.2")]);
    let before = std::fs::read_to_string(device.layout.journal()).expect("journal");

    let out = setup(
        device.root(),
        &[
            "--repair",
            "--select",
            "1.3.2",
            "--service-manager",
            "supervisor",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("quarantine lifted"), "{}", text(&out));
    assert_eq!(device.active(), device.binary("1.3.2"));
    assert!(
        device
            .events()
            .iter()
            .any(|e| e.starts_with("start 1.3.2 ")),
        "{:?}",
        device.events()
    );

    // No transaction; the attempt stays remembered, and the quarantined
    // journal is kept beside it.
    let journal: Journal =
        serde_json::from_str(&std::fs::read_to_string(device.layout.journal()).expect("journal"))
            .expect("valid journal");
    assert!(journal.transaction.is_none(), "{journal:?}");
    assert!(
        journal.finished.iter().any(|f| f.uuid.to_string()
            == "0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10"
            && f.phase == JournalPhase::RollbackFailed),
        "{journal:?}"
    );
    let kept: Vec<_> = std::fs::read_dir(device.layout.updater_state_dir())
        .expect("dir")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("journal.json.repaired-")
        })
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        std::fs::read_to_string(kept[0].path()).expect("kept"),
        format!(
            "{}\n",
            serde_json::to_string_pretty(
                &serde_json::from_str::<Journal>(&before).expect("before")
            )
            .expect("json")
        )
    );

    // The updater starts on it, no longer quarantined: the next attempt
    // goes through.
    let server = HttpsServer::start(&ca);
    let next = StandIn::good("1.5.0");
    server.route("/agent", Behavior::Bytes(next.script()));
    let _updater = device.start_updater();
    device.upgrade_ok(&attempt(&server.url("/agent"), &next));
    let done = device.wait_terminal();
    assert_eq!(done.phase, UpgradePhase::Complete, "{done:?}");
    assert_eq!(device.active(), device.binary("1.5.0"));
}

#[test]
fn a_repair_whose_agent_does_not_start_keeps_the_quarantine() {
    let ca = TestCa::new();
    let device = quarantined(&ca, &[StandIn::with("1.3.2", SelfTest::Pass, Run::Crash)]);
    let before = std::fs::read(device.layout.journal()).expect("journal");
    let out = setup(
        device.root(),
        &[
            "--repair",
            "--select",
            "1.3.2",
            "--service-manager",
            "supervisor",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "repair: {} did not start",
            device.binary("1.3.2").display()
        )),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read(device.layout.journal()).expect("journal"),
        before,
        "the quarantine was touched"
    );
    assert!(
        !std::fs::read_dir(device.layout.updater_state_dir())
            .expect("dir")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("repaired")),
        "a repaired copy exists"
    );

    // Under --root without a supervisor there is no systemd to repair with.
    let out = setup(device.root(), &["--repair", "--select", "1.3.2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("run setup on the device with systemd running"),
        "{}",
        text(&out)
    );
    // An unknown version is named.
    let out = setup(
        device.root(),
        &[
            "--repair",
            "--select",
            "7.7.7",
            "--service-manager",
            "supervisor",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("fleet-agent-v7.7.7 is not installed"),
        "{}",
        text(&out)
    );
}
