//! Every bad input gets a clear error and changes nothing: the previous
//! agent stays active and running (the same process), no target binary or
//! temp file is left, and the journal is consistent (`failed` with the
//! typed reason, or no transaction at all for a refused request).

mod support;

use std::os::unix::net::UnixStream;
use std::time::Duration;

use fleet_common::contracts::{ErrorCode, JournalPhase, UpgradePhase, UpgradeReason};
use fleet_harness::{Behavior, HttpsServer, ResponseSpec, TestCa};
use support::{attempt, bench, Device, Run, SelfTest, StandIn};

fn as_json(a: &fleet_common::contracts::AgentUpgradeAttempt) -> serde_json::Value {
    serde_json::to_value(a).expect("json")
}

#[test]
fn wrong_sha256() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    let mut a = attempt(&b.server.url("/agent"), &v2);
    a.sha256 = fleet_common::validate::Sha256Hex::of(b"another build");
    b.assert_failed(
        &a,
        UpgradeReason::Checksum,
        &format!(
            "have sha256 {}, not the attempt's {}",
            v2.sha256(),
            a.sha256
        ),
    );
}

#[test]
fn oversize_declared() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    let mut a = attempt(&b.server.url("/agent"), &v2);
    a.max_bytes = fleet_common::validate::MaxBytes::new(100).expect("max");
    b.assert_failed(
        &a,
        UpgradeReason::TooLarge,
        &format!(
            "the server declares {} bytes, more than the limit of 100",
            v2.script().len()
        ),
    );
}

#[test]
fn oversize_actual_is_stopped_while_streaming() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    let script = v2.script();
    // Chunked: no declared length, only counting finds out.
    let mut chunked = Vec::new();
    for part in script.chunks(64) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    b.server.route(
        "/agent",
        Behavior::Handler(Box::new(move |_| ResponseSpec {
            status: 200,
            headers: vec![("Transfer-Encoding".to_owned(), "chunked".to_owned())],
            body: chunked.clone(),
        })),
    );
    let mut a = attempt(&b.server.url("/agent"), &v2);
    a.max_bytes = fleet_common::validate::MaxBytes::new(300).expect("max");
    b.assert_failed(
        &a,
        UpgradeReason::TooLarge,
        "the body exceeds the limit of 300 bytes; download stopped",
    );
}

#[test]
fn oversize_over_the_ceiling_is_invalid() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    let mut a = as_json(&attempt(&b.server.url("/agent"), &v2));
    a["max-bytes"] = (100u64 * 1024 * 1024 + 1).into();
    b.assert_refused(
        &b.upgrade_json(a),
        ErrorCode::Invalid,
        "invalid max-bytes 104857601: use 1 to 104857600 (100 MiB)",
    );
}

#[test]
fn plain_http_is_invalid() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    let mut a = as_json(&attempt(&b.server.url("/agent"), &v2));
    a["artifact-url"] = "http://127.0.0.1:8080/agent".into();
    b.assert_refused(
        &b.upgrade_json(a),
        ErrorCode::Invalid,
        "the scheme is neither https:// nor oci://",
    );
}

#[test]
fn a_redirect_is_refused() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    b.server.route(
        "/moved",
        Behavior::Redirect {
            status: 302,
            location: b.server.url("/agent"),
        },
    );
    let a = attempt(&b.server.url("/moved"), &v2);
    b.assert_failed(
        &a,
        UpgradeReason::Download,
        &format!(
            "the server redirects (HTTP 302, Location: {}); redirects are refused",
            b.server.url("/agent")
        ),
    );
    assert_eq!(
        b.server
            .requests()
            .iter()
            .filter(|r| r.path == "/agent")
            .count(),
        0,
        "the redirect was not followed"
    );
}

#[test]
fn a_stalled_server_times_out() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    b.server.route("/agent", Behavior::Stall);
    let a = attempt(&b.server.url("/agent"), &v2);
    let (_, took) = support::timed(|| b.assert_failed(&a, UpgradeReason::Download, "timed out"));
    // The test build's request bound is 4 s (production: 5 min).
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_truncated_body_is_refused() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    let body = v2.script();
    b.server.route(
        "/agent",
        Behavior::Truncate {
            body: body[..100].to_vec(),
            declared_len: body.len() as u64,
        },
    );
    let a = attempt(&b.server.url("/agent"), &v2);
    b.assert_failed(
        &a,
        UpgradeReason::Download,
        "the body ended after 100 bytes, before its declared length",
    );
}

#[test]
fn an_untrusted_certificate_is_refused() {
    let b = bench();
    let untrusted = HttpsServer::start_untrusted();
    let v2 = StandIn::good("2.0");
    untrusted.route("/agent", Behavior::Bytes(v2.script()));
    let a = attempt(&untrusted.url("/agent"), &v2);
    b.assert_failed(&a, UpgradeReason::Download, "certificate");
    assert!(
        untrusted.requests().is_empty(),
        "no request went over the untrusted connection"
    );
}

#[test]
fn a_version_with_path_characters_is_invalid() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    for bad in ["../../bin/sh", "2.0/../x", "..", "/etc/passwd", "a\nb"] {
        let mut a = as_json(&attempt(&b.server.url("/agent"), &v2));
        a["target-version"] = bad.into();
        b.assert_refused(&b.upgrade_json(a), ErrorCode::Invalid, "invalid version");
    }
}

#[test]
fn a_failing_probe_is_refused() {
    let b = bench();
    let v2 = StandIn::with("2.0", SelfTest::Fail, Run::Ready);
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    let a = attempt(&b.server.url("/agent"), &v2);
    let s = b.device.upgrade_ok(&a);
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Probe))
    );
    assert_eq!(
        s.error.as_ref().map(|e| e.to_string()),
        Some("probe: candidate self-test failed with exit code 3; failed checks: nats: stand-in told to fail; last output: stand-in self-test failure".to_owned())
    );
    // The verified candidate stays installed (versions are kept); the
    // previous agent never stopped.
    assert!(b.device.binary("2.0").exists());
    b.device.assert_only_agent("1.0");
    assert_eq!(b.device.running_agents(), vec![b.agent_pid]);
}

#[test]
fn a_probe_reporting_another_version_is_refused() {
    let b = bench();
    let v2 = StandIn::with("2.0", SelfTest::Lie, Run::Ready);
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    let s = b.device.upgrade_ok(&attempt(&b.server.url("/agent"), &v2));
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::VersionMismatch))
    );
    assert_eq!(
        s.error.as_ref().map(|e| e.to_string()),
        Some("probe: candidate reports compiled version 2.0-other, not the target 2.0: the artifact is not the release the attempt names".to_owned())
    );
    assert_eq!(b.device.running_agents(), vec![b.agent_pid]);
}

#[test]
fn a_candidate_that_never_becomes_ready_is_rolled_back() {
    let b = bench();
    let v2 = StandIn::with("2.0", SelfTest::Pass, Run::NeverReady);
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    let a = attempt(&b.server.url("/agent"), &v2);
    assert_eq!(b.device.upgrade_ok(&a).phase, UpgradePhase::Stopping);
    let s = b.device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed))
    );
    assert_eq!(
        s.error.as_ref().map(|e| e.to_string()),
        Some("start-target: start fleet-agent.service: the agent did not send READY=1 within 6.0 s; the agent was killed".to_owned())
    );
    let phases: Vec<UpgradePhase> = s.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        [
            UpgradePhase::Preparing,
            UpgradePhase::Stopping,
            UpgradePhase::Starting,
            UpgradePhase::RollingBack,
            UpgradePhase::Failed
        ]
    );
    let journal = b.device.journal();
    let tx = journal.transaction.as_ref().expect("tx");
    let jp: Vec<JournalPhase> = tx.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(
        jp,
        [
            JournalPhase::Preparing,
            JournalPhase::Activating,
            JournalPhase::RollingBack,
            JournalPhase::Failed
        ]
    );
    b.device.assert_only_agent("1.0");
}

#[test]
fn a_candidate_that_crashes_at_start_is_rolled_back() {
    let b = bench();
    let v2 = StandIn::with("2.0", SelfTest::Pass, Run::Crash);
    b.server.route("/agent", Behavior::Bytes(v2.script()));
    b.device.upgrade_ok(&attempt(&b.server.url("/agent"), &v2));
    let s = b.device.wait_terminal();
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed))
    );
    assert!(
        s.error
            .as_ref()
            .expect("error")
            .as_str()
            .ends_with("the agent exited with exit code 1 before sending READY=1"),
        "{s:?}"
    );
    b.device.assert_only_agent("1.0");
}

#[test]
fn held_connections_do_not_make_status_busy() {
    let b = bench();
    let path = b.device.layout.updater_socket();
    // More clients than the server holds while they send their request,
    // each sending nothing (32 were enough to make every
    // `status` busy). The oldest are pushed out; `status` is answered.
    let held: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(&path).expect("connect"))
        .collect();
    let answer = b.device.raw(b"{\"request\":\"status\"}\n");
    assert!(answer.contains("\"ok\":true"), "{answer}");
    drop(held);
    b.device.try_status().expect("status");
}

#[test]
fn a_request_over_one_mebibyte() {
    let b = bench();
    let mut big = b"{\"request\":\"status\",\"pad\":\"".to_vec();
    big.resize(1024 * 1024 + 16, b'x');
    let answer = b.device.raw(&big);
    b.assert_refused(
        &answer,
        ErrorCode::TooLarge,
        "request is larger than 1048576 bytes",
    );
}

#[test]
fn malformed_json_and_unknown_requests() {
    let b = bench();
    b.assert_refused(
        &b.device.raw(b"{\"request\":\"upgrade\",\n"),
        ErrorCode::Invalid,
        "malformed request",
    );
    b.assert_refused(
        &b.device.raw(b"{\"request\":\"reboot\"}\n"),
        ErrorCode::Invalid,
        "malformed request",
    );
    b.assert_refused(
        &b.device
            .raw(b"{\"request\":\"status\",\"path\":\"/etc\"}\n"),
        ErrorCode::Invalid,
        "malformed request",
    );
}

#[test]
fn a_peer_that_is_not_allowed() {
    let b = bench();
    // Open the socket's mode so `nobody` reaches the credential check.
    use std::os::unix::fs::PermissionsExt;
    let path = b.device.layout.updater_socket();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\ntry:\n    s.sendall(b'{{\"request\":\"status\"}}\\n')\nexcept OSError:\n    pass  # refused before reading: the answer is waiting\nprint(s.makefile().readline(), end='')\n",
        path.display().to_string()
    );
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("python as nobody");
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    b.assert_refused(
        &answer,
        ErrorCode::Forbidden,
        "uid 65534 with gid 65534 is not allowed here",
    );
}

#[test]
fn a_corrupt_journal_stops_the_updater_before_its_socket() {
    let ca = TestCa::new();
    let device = Device::new(&ca, &StandIn::good("1.0"));
    std::fs::create_dir_all(device.layout.updater_state_dir()).expect("mkdir");
    std::fs::write(
        device.layout.journal(),
        "{\"format\":1,\"transaction\":{\"phase\":",
    )
    .expect("corrupt");
    let mut cmd = device.updater_command();
    let out = fleet_common::process::run_bounded(&mut cmd, Duration::from_secs(30), 64 * 1024)
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the updater journal {} is corrupt (not a journal:",
            device.layout.journal().display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("then move the journal aside and restart the updater once the active link points at a good agent"), "{stderr}");
    assert!(
        !device.layout.updater_socket().exists(),
        "the socket was opened"
    );
    assert!(device.running_agents().is_empty(), "an agent was started");
    assert_eq!(
        std::fs::read_to_string(device.layout.journal()).expect("journal"),
        "{\"format\":1,\"transaction\":{\"phase\":",
        "the corrupt journal is left for the person repairing"
    );
}
