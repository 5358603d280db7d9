//! The local socket protocol against a real Unix socket: limits, deadlines,
//! peer credentials and malformed input.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_common::contracts::{ErrorCode, Response, UpdaterReply, UpdaterRequest};
use fleet_common::limits::{
    MAX_SOCKET_HANDLERS, MAX_SOCKET_MESSAGE_BYTES, MAX_SOCKET_PENDING_CONNECTIONS,
};
use fleet_common::socket::{
    self, Handler, Peer, PeerPolicy, Reply, RequestClass, ServerHandle, SocketServer,
};

/// Answers `status` with no transaction; `upgrade` blocks until released, so
/// tests can hold handlers busy.
struct TestHandler {
    release: Mutex<Option<mpsc::Receiver<()>>>,
    seen: Mutex<Vec<Peer>>,
}

impl Handler for TestHandler {
    type Request = UpdaterRequest;
    fn class(request: &UpdaterRequest) -> RequestClass {
        match request {
            UpdaterRequest::Status {} => RequestClass::ReadOnly,
            UpdaterRequest::Upgrade { .. } => RequestClass::Mutating,
        }
    }
    fn handle(&self, request: UpdaterRequest, peer: &Peer) -> Reply {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(peer.clone());
        }
        if let UpdaterRequest::Upgrade { .. } = request {
            if let Some(rx) = self.release.lock().expect("lock").as_ref() {
                let _ = rx.recv_timeout(Duration::from_secs(30));
            }
        }
        Response::Ok(UpdaterReply { status: None }).into()
    }
}

fn me() -> u32 {
    fleet_common::users::current_ids().0
}

fn start(dir: &Path, policy: PeerPolicy) -> (ServerHandle, PathBuf, Arc<TestHandler>) {
    let path = dir.join("test.sock");
    let handler = Arc::new(TestHandler {
        release: Mutex::new(None),
        seen: Mutex::new(Vec::new()),
    });
    let server = SocketServer::bind("test", &path, 0o660, None, policy).expect("bind");
    let handle = server.spawn(Arc::clone(&handler)).expect("spawn");
    (handle, path, handler)
}

fn allow_me() -> PeerPolicy {
    PeerPolicy {
        uids: vec![me()],
        gids: vec![],
    }
}

/// Sends raw bytes and reads the whole answer until the server closes.
fn raw(path: &Path, bytes: &[u8]) -> String {
    let mut s = UnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    // The server may answer and close before reading everything we send.
    let _ = s.write_all(bytes);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn code_of(answer: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(answer.trim()).expect("answer is JSON");
    assert_eq!(v["ok"], false, "{answer}");
    v["error"]["code"].as_str().expect("code").to_owned()
}

#[test]
fn status_round_trip_and_peer_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, handler) = start(dir.path(), allow_me());
    let r: Response<UpdaterReply> =
        socket::call(&path, &UpdaterRequest::Status {}, Duration::from_secs(5)).expect("call");
    assert_eq!(r, Response::Ok(UpdaterReply { status: None }));
    let seen = handler.seen.lock().expect("lock");
    assert_eq!(seen[0].uid, me());
    assert_eq!(seen[0].pid, std::process::id() as i32);
}

#[test]
fn malformed_json_is_invalid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, handler) = start(dir.path(), allow_me());
    let answer = raw(&path, b"{\"request\": \n");
    assert_eq!(code_of(&answer), "invalid");
    assert!(answer.contains("malformed request"), "{answer}");
    let answer = raw(&path, b"{\"request\":\"reboot\"}\n");
    assert_eq!(code_of(&answer), "invalid");
    assert!(handler.seen.lock().expect("lock").is_empty());
}

#[test]
fn oversize_request_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, handler) = start(dir.path(), allow_me());
    let mut big = vec![b' '; MAX_SOCKET_MESSAGE_BYTES + 10];
    big.push(b'\n');
    let answer = raw(&path, &big);
    assert_eq!(code_of(&answer), "too-large");
    // Without any newline at all, the cap applies too.
    let answer = raw(&path, &vec![b'x'; MAX_SOCKET_MESSAGE_BYTES + 1]);
    assert_eq!(code_of(&answer), "too-large");
    assert!(handler.seen.lock().expect("lock").is_empty());
}

#[test]
fn a_client_that_never_sends_a_newline_is_cut_off_at_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, _handler) = start(dir.path(), allow_me());
    let mut s = UnixStream::connect(&path).expect("connect");
    s.write_all(b"{\"request\":\"status\"}").expect("write");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let started = Instant::now();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let waited = started.elapsed();
    assert_eq!(code_of(&out), "timeout");
    assert!(
        waited >= Duration::from_secs(9) && waited < Duration::from_secs(25),
        "cut off after {waited:?}, expected the 10 s request-read deadline"
    );
}

#[test]
fn a_peer_that_is_not_allowed_is_refused_before_reading() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = PeerPolicy {
        uids: vec![me().wrapping_add(4242)],
        gids: vec![u32::MAX - 7],
    };
    let (_h, path, handler) = start(dir.path(), policy);
    // Connect and send nothing: the refusal arrives without a request.
    let mut s = UnixStream::connect(&path).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert_eq!(code_of(&out), "forbidden");
    assert!(out.contains(&format!("uid {}", me())), "{out}");
    let r: Response<UpdaterReply> =
        socket::call(&path, &UpdaterRequest::Status {}, Duration::from_secs(5)).expect("call");
    assert!(matches!(r, Response::Err(e) if e.code == ErrorCode::Forbidden));
    assert!(handler.seen.lock().expect("lock").is_empty());
}

#[test]
fn a_refusal_before_reading_reaches_a_client_still_writing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = PeerPolicy {
        uids: vec![me().wrapping_add(4242)],
        gids: vec![u32::MAX - 7],
    };
    let (_h, path, _handler) = start(dir.path(), policy);
    // Larger than the socket buffer: the write is still going when the
    // server answers and closes, so it fails (EPIPE); the answer is there.
    let big = serde_json::json!({"request": "status", "pad": "x".repeat(600_000)});
    let r: Response<UpdaterReply> =
        socket::call(&path, &big, Duration::from_secs(5)).expect("the refusal is read");
    assert!(matches!(r, Response::Err(e) if e.code == ErrorCode::Forbidden));
}

#[test]
fn group_membership_admits_a_peer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, gid) = fleet_common::users::current_ids();
    let policy = PeerPolicy {
        uids: vec![],
        gids: vec![gid],
    };
    let (_h, path, _handler) = start(dir.path(), policy);
    let r: Response<UpdaterReply> =
        socket::call(&path, &UpdaterRequest::Status {}, Duration::from_secs(5)).expect("call");
    assert_eq!(r, Response::Ok(UpdaterReply { status: None }));
}

fn upgrade_line() -> Vec<u8> {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/updater-request-upgrade.json"),
    )
    .expect("golden");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut line = serde_json::to_vec(&v).expect("json");
    line.push(b'\n');
    line
}

fn status_ok(path: &Path) {
    let started = Instant::now();
    let r: Response<UpdaterReply> =
        socket::call(path, &UpdaterRequest::Status {}, Duration::from_secs(5)).expect("call");
    assert_eq!(r, Response::Ok(UpdaterReply { status: None }));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn the_33rd_concurrent_mutating_request_is_busy_and_status_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, handler) = start(dir.path(), allow_me());
    let (tx, rx) = mpsc::channel();
    *handler.release.lock().expect("lock") = Some(rx);
    // 32 upgrades, each held by the handler.
    let holders: Vec<UnixStream> = (0..MAX_SOCKET_HANDLERS)
        .map(|_| {
            let mut s = UnixStream::connect(&path).expect("connect");
            s.write_all(&upgrade_line()).expect("write");
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while handler.seen.lock().expect("lock").len() < MAX_SOCKET_HANDLERS {
        assert!(
            Instant::now() < deadline,
            "the upgrades never reached the handler"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let answer = raw(&path, &upgrade_line());
    assert_eq!(code_of(&answer), "busy");
    assert!(
        answer.contains("32 mutating requests are already being handled"),
        "{answer}"
    );
    // `status` does not wait for them.
    status_ok(&path);
    drop(tx);
    drop(holders);
}

/// A group member holding 200 connections open (half of
/// them sending one byte a second, never a newline) does not make `status`
/// busy, nor slow.
#[test]
fn status_stays_answerable_under_200_held_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, _handler) = start(dir.path(), allow_me());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut silent = Vec::new();
    let mut dripping = Vec::new();
    for i in 0..200 {
        let s = UnixStream::connect(&path).expect("connect");
        if i % 2 == 0 {
            silent.push(s);
        } else {
            dripping.push(s);
        }
    }
    let drip = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for s in &mut dripping {
                    let _ = s.write_all(b" ");
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        status_ok(&path);
        std::thread::sleep(Duration::from_millis(100));
    }
    // More connections than the server holds: the oldest are pushed out,
    // the newcomer is still answered.
    let extra: Vec<UnixStream> = (0..MAX_SOCKET_PENDING_CONNECTIONS)
        .map(|_| UnixStream::connect(&path).expect("connect"))
        .collect();
    status_ok(&path);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drip.join().expect("drip");
    drop((silent, extra));
}

/// 200 clients each sending a 1 MiB request at once are
/// all answered (`too-large` or `invalid`), and `status` meanwhile.
#[test]
fn two_hundred_large_requests_are_answered_and_status_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, _handler) = start(dir.path(), allow_me());
    let senders: Vec<_> = (0..200)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut big = format!("{{\"request\":\"status\",\"pad\":\"{i}").into_bytes();
                big.resize(MAX_SOCKET_MESSAGE_BYTES - 3, b'x');
                big.extend_from_slice(b"\"}\n");
                code_of(&raw(&path, &big))
            })
        })
        .collect();
    status_ok(&path);
    let mut codes = std::collections::BTreeMap::new();
    for s in senders {
        let code = s.join().expect("sender");
        // A request the server could not read within the deadline, while
        // it buffered others, is answered `timeout`: abuse costs the
        // abuser, not the server's memory.
        assert!(
            ["invalid", "too-large", "timeout"].contains(&code.as_str()),
            "{code}"
        );
        *codes.entry(code).or_insert(0) += 1;
    }
    eprintln!("answers: {codes:?}");
    // Read four at a time, 200 take some 3 s here, far inside the deadline.
    assert!(
        codes.get("invalid").copied().unwrap_or(0) >= 100,
        "{codes:?}"
    );
    status_ok(&path);
}

#[test]
fn client_gives_up_at_its_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, path, handler) = start(dir.path(), allow_me());
    let (tx, rx) = mpsc::channel();
    *handler.release.lock().expect("lock") = Some(rx);
    let attempt: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden/updater-request-upgrade.json"),
        )
        .expect("golden"),
    )
    .expect("json");
    let started = Instant::now();
    let r = socket::call::<_, UpdaterReply>(&path, &attempt, Duration::from_millis(500));
    let e = r.expect_err("the handler holds the request");
    assert!(e.to_string().contains("no answer from"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let _ = tx.send(());
}

#[test]
fn connecting_to_a_missing_socket_says_what_to_check() {
    let e = socket::call::<_, UpdaterReply>(
        Path::new("/nonexistent/updater.sock"),
        &UpdaterRequest::Status {},
        Duration::from_secs(1),
    )
    .expect_err("no socket");
    assert!(e.is_unreachable());
    assert!(e.to_string().contains("is the daemon running"), "{e}");
}

#[test]
fn a_stale_socket_is_replaced_but_another_file_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.sock");
    {
        let _old = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    }
    let s = SocketServer::bind("t", &path, 0o600, None, allow_me());
    assert!(s.is_ok());
    drop(s);
    let file = dir.path().join("regular");
    std::fs::write(&file, b"keep me").expect("write");
    let e = SocketServer::bind("t", &file, 0o600, None, allow_me()).expect_err("not a socket");
    assert!(e.to_string().contains("is not a socket"), "{e}");
    assert_eq!(std::fs::read(&file).expect("read"), b"keep me");
}
