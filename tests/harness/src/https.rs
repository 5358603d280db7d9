//! A test CA and small HTTP/1.1 servers (TLS with rustls, and plain) whose
//! routes misbehave on request: stall, truncate, lie about the length,
//! redirect, or answer from a closure.
//!
//! Each server owns a loopback listener on a random port and an acceptor
//! thread; every connection gets its own thread, reads one request (request
//! line, headers, a `Content-Length` body), records it, answers with
//! `Connection: close` and closes. Stalled connections wait on the server's
//! shutdown signal, so dropping the server releases them; the acceptor is
//! woken by a connection to itself and joined with a time limit.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown as NetShutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tempfile::TempDir;

/// The names every default leaf is valid for.
pub const DEFAULT_LEAF_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// Reading one request (headers and body) from a client.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// One write to a client that stopped reading.
const RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a stalled connection is held if the server is never dropped.
const MAX_STALL: Duration = Duration::from_secs(15 * 60);
/// Joining the acceptor thread on drop.
const ACCEPTOR_JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest request body read.
const MAX_BODY_BYTES: u64 = 128 * 1024 * 1024;
/// Chunk in which `Behavior::File` streams.
const FILE_CHUNK_BYTES: usize = 256 * 1024;
/// What `Behavior::Stall` declares before sending nothing.
const STALL_DECLARED_BYTES: u64 = 1024 * 1024;

/// A CA for tests: a self-signed ECDSA P-256 root that issues server leafs
/// (CA:FALSE, extended key usage serverAuth, the SANs asked for).
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
    dir: TempDir,
    issued: AtomicUsize,
}

impl fmt::Debug for TestCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCa")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestCa {
    pub fn new() -> TestCa {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let mut params =
            CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        // A name of its own: two CAs with one name make OpenSSL try the wrong
        // key instead of reporting an unknown issuer.
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "fleet test CA {}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("CA cert: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("fleet-ca-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir: {e}"));
        write_file(&dir.path().join("ca.pem"), cert.pem().as_bytes());
        TestCa {
            cert,
            key,
            dir,
            issued: AtomicUsize::new(0),
        }
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA certificate, DER.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// The CA certificate as a PEM file (in the CA's TempDir).
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A rustls client config (ring) trusting only this CA.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der())
            .unwrap_or_else(|e| panic!("CA into a root store: {e}"));
        let config = rustls::ClientConfig::builder_with_provider(
            rustls::crypto::ring::default_provider().into(),
        )
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("rustls client config: {e}"))
        .with_root_certificates(roots)
        .with_no_client_auth();
        Arc::new(config)
    }

    /// A leaf for `names` (IP literals become IP SANs, the rest DNS SANs;
    /// empty means [`DEFAULT_LEAF_NAMES`]): (certificate PEM, PKCS#8 key PEM).
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let (cert, key) = self.issue(names);
        (cert.pem(), key.serialize_pem())
    }

    /// [`leaf`](Self::leaf) written to files in the CA's TempDir: (cert, key).
    pub fn leaf_files(&self, names: &[&str]) -> (PathBuf, PathBuf) {
        let (cert, key) = self.leaf(names);
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        let cert_path = self.dir.path().join(format!("leaf{n}.pem"));
        let key_path = self.dir.path().join(format!("leaf{n}.key"));
        write_file(&cert_path, cert.as_bytes());
        write_file(&key_path, key.as_bytes());
        (cert_path, key_path)
    }

    fn issue(&self, names: &[&str]) -> (rcgen::Certificate, KeyPair) {
        let names: Vec<String> = if names.is_empty() {
            DEFAULT_LEAF_NAMES.iter().map(|s| (*s).to_owned()).collect()
        } else {
            names.iter().map(|s| (*s).to_owned()).collect()
        };
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("leaf key: {e}"));
        let mut params =
            CertificateParams::new(names.clone()).unwrap_or_else(|e| panic!("leaf {names:?}: {e}"));
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .unwrap_or_else(|e| panic!("leaf {names:?}: {e}"));
        (cert, key)
    }

    fn server_config(&self) -> Arc<ServerConfig> {
        let (cert, key) = self.issue(&[]);
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let config =
            ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
                .with_safe_default_protocol_versions()
                .unwrap_or_else(|e| panic!("rustls server config: {e}"))
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key)
                .unwrap_or_else(|e| panic!("rustls server cert: {e}"));
        Arc::new(config)
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// What a route answers.
pub enum Behavior {
    /// 200 with an exact `Content-Length`.
    Bytes(Vec<u8>),
    /// 200, streamed from disk in chunks, `Content-Length` from its size.
    File(PathBuf),
    /// `status` with `Location`.
    Redirect { status: u16, location: String },
    /// That status, empty body.
    Status(u16),
    /// 200 headers declaring 1 MiB, then nothing; the connection is held
    /// until the server drops.
    Stall,
    /// Nothing at all (after reading the request); held until the server drops.
    StallBeforeHeaders,
    /// Declares `declared_len` (more than `body`), sends `body`, then closes
    /// cleanly (TLS close_notify): only a length check catches it.
    Truncate { body: Vec<u8>, declared_len: u64 },
    /// Declares `declared_len`, sends all of `body` whatever its length,
    /// then closes cleanly.
    WrongLength { body: Vec<u8>, declared_len: u64 },
    /// Answers from a closure (registries, token endpoints).
    Handler(Box<dyn Fn(&Request) -> ResponseSpec + Send + Sync>),
}

impl fmt::Debug for Behavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Self::File(p) => write!(f, "File({})", p.display()),
            Self::Redirect { status, location } => write!(f, "Redirect({status} {location})"),
            Self::Status(s) => write!(f, "Status({s})"),
            Self::Stall => f.write_str("Stall"),
            Self::StallBeforeHeaders => f.write_str("StallBeforeHeaders"),
            Self::Truncate { body, declared_len } => {
                write!(f, "Truncate({} of {declared_len})", body.len())
            }
            Self::WrongLength { body, declared_len } => {
                write!(f, "WrongLength({} declared {declared_len})", body.len())
            }
            Self::Handler(_) => f.write_str("Handler"),
        }
    }
}

/// One request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The request target as sent, query included.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What a [`Behavior::Handler`] answers. `Content-Length` is added from
/// `body` unless `headers` has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSpec {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// An HTTPS server on 127.0.0.1:<random>, a thread per connection.
#[derive(Debug)]
pub struct HttpsServer {
    server: Server,
    /// The CA of [`HttpsServer::start_untrusted`], kept for its lifetime.
    _own_ca: Option<TestCa>,
}

impl HttpsServer {
    /// Serves with a leaf from `ca` (127.0.0.1 and localhost).
    pub fn start(ca: &TestCa) -> HttpsServer {
        HttpsServer {
            server: Server::start(Some(ca.server_config()), "https"),
            _own_ca: None,
        }
    }

    /// Serves with a leaf from a CA nobody trusts.
    pub fn start_untrusted() -> HttpsServer {
        let ca = TestCa::new();
        HttpsServer {
            server: Server::start(Some(ca.server_config()), "https"),
            _own_ca: Some(ca),
        }
    }

    /// Adds or replaces the route for `path` (matched against the full
    /// request target first, then against it without its query).
    pub fn route(&self, path: &str, b: Behavior) {
        self.server.route(path, b);
    }

    /// Adds or replaces a route for every target starting with `prefix`,
    /// used when no exact route matches; the longest prefix wins.
    pub fn route_prefix(&self, prefix: &str, b: Behavior) {
        self.server.route_prefix(prefix, b);
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.server.port)
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// Every request read so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.server.requests()
    }
}

/// A plain-HTTP server with the same routes (for "http:// refused" tests).
#[derive(Debug)]
pub struct HttpServer {
    server: Server,
}

impl HttpServer {
    pub fn start() -> HttpServer {
        HttpServer {
            server: Server::start(None, "http"),
        }
    }

    pub fn route(&self, path: &str, b: Behavior) {
        self.server.route(path, b);
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.server.port)
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    pub fn requests(&self) -> Vec<Request> {
        self.server.requests()
    }
}

/// The shutdown signal stalled connections wait on.
#[derive(Debug, Default)]
struct Shutdown {
    set: Mutex<bool>,
    changed: Condvar,
}

impl Shutdown {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.set.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn trigger(&self) {
        *self.lock() = true;
        self.changed.notify_all();
    }
    fn is_set(&self) -> bool {
        *self.lock()
    }
    /// Blocks until triggered, or `MAX_STALL`.
    fn wait(&self) {
        let deadline = Instant::now() + MAX_STALL;
        let mut set = self.lock();
        while !*set {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            set = self
                .changed
                .wait_timeout(set, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// State shared by the acceptor and the connections.
#[derive(Debug, Default)]
struct Core {
    routes: Mutex<HashMap<String, Arc<Behavior>>>,
    prefix_routes: Mutex<Vec<(String, Arc<Behavior>)>>,
    requests: Mutex<Vec<Request>>,
    shutdown: Shutdown,
}

#[derive(Debug)]
struct Server {
    core: Arc<Core>,
    port: u16,
    acceptor: Option<(JoinHandle<()>, mpsc::Receiver<()>)>,
}

impl Server {
    fn start(tls: Option<Arc<ServerConfig>>, kind: &str) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("{kind} server: cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{kind} server: {e}"))
            .port();
        let core = Arc::new(Core::default());
        let (done_tx, done_rx) = mpsc::channel();
        let acceptor_core = Arc::clone(&core);
        let conn_name = format!("harness-{kind}-conn");
        let acceptor = thread::Builder::new()
            .name(format!("harness-{kind}-accept"))
            .spawn(move || {
                accept_loop(&listener, &acceptor_core, tls, &conn_name);
                let _ = done_tx.send(());
            })
            .unwrap_or_else(|e| panic!("{kind} server: cannot spawn the acceptor: {e}"));
        Server {
            core,
            port,
            acceptor: Some((acceptor, done_rx)),
        }
    }

    fn route(&self, path: &str, b: Behavior) {
        if let Behavior::Truncate { body, declared_len } = &b {
            assert!(
                *declared_len > body.len() as u64,
                "Behavior::Truncate must declare more than its {} bytes",
                body.len()
            );
        }
        self.core
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.to_owned(), Arc::new(b));
    }

    fn route_prefix(&self, prefix: &str, b: Behavior) {
        let mut routes = self
            .core
            .prefix_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        routes.retain(|(p, _)| p != prefix);
        routes.push((prefix.to_owned(), Arc::new(b)));
        // Longest first, so the first match is the most specific.
        routes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    }

    fn requests(&self) -> Vec<Request> {
        self.core
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.core.shutdown.trigger();
        // Wake the blocking accept; the acceptor sees the flag and returns.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some((handle, done)) = self.acceptor.take() {
            match done.recv_timeout(ACCEPTOR_JOIN_TIMEOUT) {
                Ok(()) => {
                    let _ = handle.join();
                }
                Err(_) => eprintln!(
                    "harness: acceptor thread of port {} did not exit within {ACCEPTOR_JOIN_TIMEOUT:?}",
                    self.port
                ),
            }
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    core: &Arc<Core>,
    tls: Option<Arc<ServerConfig>>,
    conn_name: &str,
) {
    for stream in listener.incoming() {
        if core.shutdown.is_set() {
            return;
        }
        let Ok(tcp) = stream else { continue };
        let core = Arc::clone(core);
        let tls = tls.clone();
        // Detached: a connection ends on its own timeouts or on shutdown.
        let spawned = thread::Builder::new()
            .name(conn_name.to_owned())
            .spawn(move || serve_connection(tcp, &core, tls));
        if let Err(e) = spawned {
            eprintln!("harness: cannot spawn a connection thread: {e}");
        }
    }
}

/// A connection, plain or TLS, that can be closed cleanly.
trait Transport: Read + Write {
    /// Flushes, sends TLS close_notify if any, and shuts the socket's write side.
    fn finish(&mut self);
}

impl Transport for TcpStream {
    fn finish(&mut self) {
        let _ = self.flush();
        let _ = self.shutdown(NetShutdown::Write);
    }
}

impl Transport for StreamOwned<ServerConnection, TcpStream> {
    fn finish(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
        let _ = self.sock.shutdown(NetShutdown::Write);
    }
}

fn serve_connection(tcp: TcpStream, core: &Core, tls: Option<Arc<ServerConfig>>) {
    let _ = tcp.set_read_timeout(Some(REQUEST_READ_TIMEOUT));
    let _ = tcp.set_write_timeout(Some(RESPONSE_WRITE_TIMEOUT));
    let _ = tcp.set_nodelay(true);
    let mut transport: Box<dyn Transport> = match tls {
        None => Box::new(tcp),
        Some(config) => match ServerConnection::new(config) {
            Ok(conn) => Box::new(StreamOwned::new(conn, tcp)),
            Err(e) => {
                eprintln!("harness: TLS session: {e}");
                return;
            }
        },
    };
    // A failed handshake or a client gone mid-way is the client's business.
    let _ = serve_request(transport.as_mut(), core);
}

fn serve_request(t: &mut dyn Transport, core: &Core) -> io::Result<()> {
    let request = match read_request(t)? {
        Ok(r) => r,
        Err(why) => {
            write_head(t, 400, &[], 0)?;
            t.write_all(why.as_bytes())?;
            t.finish();
            return Ok(());
        }
    };
    core.requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(request.clone());
    let behavior = {
        let routes = core.routes.lock().unwrap_or_else(|e| e.into_inner());
        let bare = request.path.split('?').next().unwrap_or_default();
        routes
            .get(&request.path)
            .or_else(|| routes.get(bare))
            .cloned()
            .or_else(|| {
                core.prefix_routes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .find(|(p, _)| request.path.starts_with(p.as_str()))
                    .map(|(_, b)| Arc::clone(b))
            })
    };
    let head_only = request.method.eq_ignore_ascii_case("HEAD");
    let Some(behavior) = behavior else {
        write_head(t, 404, &[], 0)?;
        t.finish();
        return Ok(());
    };
    match behavior.as_ref() {
        Behavior::Bytes(body) => {
            write_head(t, 200, &[], body.len() as u64)?;
            if !head_only {
                t.write_all(body)?;
            }
        }
        Behavior::File(path) => serve_file(t, path, head_only)?,
        Behavior::Redirect { status, location } => {
            write_head(t, *status, &[("Location".to_owned(), location.clone())], 0)?;
        }
        Behavior::Status(status) => write_head(t, *status, &[], 0)?,
        Behavior::Stall => {
            write_head(t, 200, &[], STALL_DECLARED_BYTES)?;
            t.flush()?;
            core.shutdown.wait();
            return Ok(());
        }
        Behavior::StallBeforeHeaders => {
            core.shutdown.wait();
            return Ok(());
        }
        Behavior::Truncate { body, declared_len }
        | Behavior::WrongLength { body, declared_len } => {
            write_head(t, 200, &[], *declared_len)?;
            if !head_only {
                t.write_all(body)?;
            }
        }
        Behavior::Handler(f) => {
            let spec = f(&request);
            let has_length = spec
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
            let mut headers = spec.headers.clone();
            if !has_length {
                headers.push(("Content-Length".to_owned(), spec.body.len().to_string()));
            }
            write_head_raw(t, spec.status, &headers)?;
            if !head_only {
                t.write_all(&spec.body)?;
            }
        }
    }
    t.finish();
    Ok(())
}

fn serve_file(t: &mut dyn Transport, path: &Path, head_only: bool) -> io::Result<()> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => {
            let body = format!("harness: cannot open {}: {e}", path.display());
            write_head(t, 500, &[], body.len() as u64)?;
            return t.write_all(body.as_bytes());
        }
    };
    let len = file.metadata()?.len();
    write_head(t, 200, &[], len)?;
    if head_only {
        return Ok(());
    }
    let mut buf = vec![0u8; FILE_CHUNK_BYTES];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        t.write_all(&buf[..n])?;
    }
}

fn write_head(
    t: &mut dyn Transport,
    status: u16,
    extra: &[(String, String)],
    content_length: u64,
) -> io::Result<()> {
    let mut headers = extra.to_vec();
    headers.push(("Content-Length".to_owned(), content_length.to_string()));
    write_head_raw(t, status, &headers)
}

fn write_head_raw(
    t: &mut dyn Transport,
    status: u16,
    headers: &[(String, String)],
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    t.write_all(head.as_bytes())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Reads one request. The outer error is I/O (give up silently); the inner
/// one a malformed request (answer 400 with it).
fn read_request(t: &mut dyn Transport) -> io::Result<Result<Request, String>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(Err(format!("request head over {MAX_HEAD_BYTES} bytes")));
        }
        let n = t.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(path), Some(version)) = (first.next(), first.next(), first.next())
    else {
        return Ok(Err(format!("bad request line in {head:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Ok(Err(format!("unsupported version {version:?}")));
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Ok(Err(format!("bad header line {line:?}")));
        };
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    if header("transfer-encoding").is_some() {
        return Ok(Err("chunked request bodies are not supported".to_owned()));
    }
    let length = match header("content-length").map(|v| v.parse::<u64>()) {
        None => 0,
        Some(Ok(n)) if n <= MAX_BODY_BYTES => n,
        Some(_) => return Ok(Err("bad or oversized Content-Length".to_owned())),
    };
    let mut body = buf.split_off(head_end + 4);
    // The length is bounded by MAX_BODY_BYTES, which fits in usize.
    let length = length as usize;
    while body.len() < length {
        let n = t.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok(Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        body,
    }))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
