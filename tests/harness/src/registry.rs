//! A real OCI registry for tests — Debian's `docker-registry` (distribution
//! 2.8) over TLS with a leaf of the test CA, storage in a temp dir, on a
//! loopback port it picks itself — and [`RegistryFront`], an HTTPS server
//! in front of it that adds what that registry does not do by itself:
//! anonymous Bearer token auth (a 401 challenge, a token endpoint), and
//! routes a test replaces (a blob redirect to a CDN, an oversized manifest).
//!
//! Steps of [`Registry::start`]: write the config (`http.addr
//! 127.0.0.1:0`), start the registry under a [`ChildGuard`], read the port
//! from its `listening on 127.0.0.1:<port>, tls` line, and wait until
//! `GET /v2/` answers 200.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fleet_common::contracts::OCI_MANIFEST_MEDIA_TYPE;
use fleet_common::validate::Sha256Hex;
use tempfile::TempDir;

use crate::https::{Behavior, HttpsServer, Request, ResponseSpec, TestCa};
use crate::proc::ChildGuard;
use crate::{poll_until, require_tool};

/// Start-up of the registry (a Go binary: well under a second here).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// One request of the harness's own client.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest answer the front proxies (test artifacts are small).
const MAX_PROXIED_BYTES: u64 = 128 * 1024 * 1024;
/// The `service` the front's challenge names.
pub const FRONT_SERVICE: &str = "test-registry";

/// Debian's docker-registry on 127.0.0.1:<random>, TLS from the test CA.
#[derive(Debug)]
pub struct Registry {
    child: ChildGuard,
    port: u16,
    client: ureq::Agent,
    _dir: TempDir,
}

impl Registry {
    /// Starts a registry with empty storage, serving a leaf of `ca` for
    /// 127.0.0.1 and localhost. Panics naming the Debian package when the
    /// binary is missing.
    pub fn start(ca: &TestCa) -> Registry {
        let binary = require_tool("docker-registry", "docker-registry");
        let dir = tempfile::Builder::new()
            .prefix("fleet-registry-")
            .tempdir()
            .unwrap_or_else(|e| panic!("registry: cannot create a temp dir: {e}"));
        let (cert, key) = ca.leaf_files(&[]);
        static SECRET: AtomicUsize = AtomicUsize::new(0);
        let config = format!(
            "version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {storage}
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:0
  secret: fleet-test-{pid}-{n}
  tls:
    certificate: {cert}
    key: {key}
",
            storage = dir.path().join("storage").display(),
            pid = std::process::id(),
            n = SECRET.fetch_add(1, Ordering::Relaxed),
            cert = cert.display(),
            key = key.display(),
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)
            .unwrap_or_else(|e| panic!("registry: cannot write {}: {e}", config_path.display()));
        let mut cmd = std::process::Command::new(binary);
        cmd.arg("serve").arg(&config_path);
        let child = ChildGuard::spawn(cmd, "docker-registry");
        let line = child.wait_for_line("listening on 127.0.0.1:", START_TIMEOUT);
        let port = line
            .split("listening on 127.0.0.1:")
            .nth(1)
            .and_then(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u16>().ok()
            })
            .unwrap_or_else(|| panic!("registry: no port in {line:?}"));
        let client = client(ca);
        let registry = Registry {
            child,
            port,
            client,
            _dir: dir,
        };
        poll_until("the registry to answer GET /v2/", START_TIMEOUT, || {
            (registry.get("/v2/", None).status == 200).then_some(())
        });
        registry
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// `oci://127.0.0.1:<port>/<repo>:<tag>`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("oci://{}/{repo}:{tag}", self.host())
    }

    /// The registry's output so far.
    pub fn log(&self) -> String {
        self.child.log()
    }

    /// Uploads `bytes` as a blob of `repo` (POST, then a monolithic PUT);
    /// returns its digest, `sha256:<hex>`.
    pub fn push_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", Sha256Hex::of(bytes));
        let started = self
            .client
            .post(&self.url(&format!("/v2/{repo}/blobs/uploads/")))
            .call()
            .unwrap_or_else(|e| panic!("registry: starting an upload to {repo}: {e}"));
        assert_eq!(started.status(), 202, "upload start");
        let location = started
            .header("location")
            .unwrap_or_else(|| panic!("registry: an upload without a Location"))
            .to_owned();
        let location = if location.starts_with('/') {
            self.url(&location)
        } else {
            location
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let done = self
            .client
            .put(&format!("{location}{separator}digest={digest}"))
            .set("Content-Type", "application/octet-stream")
            .send_bytes(bytes)
            .unwrap_or_else(|e| panic!("registry: uploading {digest} to {repo}: {e}"));
        assert_eq!(done.status(), 201, "upload of {digest}");
        digest
    }

    /// PUTs `manifest` (OCI image manifest) as `repo:reference`; returns
    /// the digest the registry answers. Panics on a refusal, with the
    /// registry's error.
    pub fn push_manifest(&self, repo: &str, reference: &str, manifest: &[u8]) -> String {
        let url = self.url(&format!("/v2/{repo}/manifests/{reference}"));
        match self
            .client
            .put(&url)
            .set("Content-Type", OCI_MANIFEST_MEDIA_TYPE)
            .send_bytes(manifest)
        {
            Ok(r) => r
                .header("docker-content-digest")
                .unwrap_or_else(|| panic!("registry: no Docker-Content-Digest for {url}"))
                .to_owned(),
            Err(ureq::Error::Status(s, r)) => panic!(
                "registry refused the manifest {url}: HTTP {s}: {}",
                r.into_string().unwrap_or_default()
            ),
            Err(e) => panic!("registry: PUT {url}: {e}"),
        }
    }

    /// A GET of `path` (with `accept`), whatever its status.
    pub fn get(&self, path: &str, accept: Option<&str>) -> ResponseSpec {
        let mut request = self.client.get(&self.url(path));
        if let Some(a) = accept {
            request = request.set("Accept", a);
        }
        let response = match request.call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("registry: GET {path}: {e}"),
        };
        to_spec(response)
    }
}

/// A client trusting only the test CA, redirects off.
fn client(ca: &TestCa) -> ureq::Agent {
    fleet_common::https::agent_builder(ca.client_config())
        .redirects(0)
        .timeout(CLIENT_TIMEOUT)
        .build()
}

/// A registry answer as the front passes it on: status, the headers a
/// client reads, the body.
fn to_spec(response: ureq::Response) -> ResponseSpec {
    let status = response.status();
    let headers = ["content-type", "docker-content-digest", "location"]
        .iter()
        .filter_map(|name| {
            response
                .header(name)
                .map(|v| ((*name).to_owned(), v.to_owned()))
        })
        .collect();
    let mut body = Vec::new();
    response
        .into_reader()
        .take(MAX_PROXIED_BYTES)
        .read_to_end(&mut body)
        .unwrap_or_else(|e| panic!("registry: reading an answer: {e}"));
    ResponseSpec {
        status,
        headers,
        body,
    }
}

/// Whether the front asks for a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontAuth {
    /// Passes every request on.
    Anonymous,
    /// Answers `/v2/...` with 401 and a Bearer challenge unless the
    /// request carries the token its `/token` endpoint hands out.
    Token,
}

/// An HTTPS server in front of a [`Registry`]: `/v2/` is proxied (GET),
/// `/token` hands out an anonymous token, and a test's own routes (added
/// with [`RegistryFront::route`]) take precedence over the proxy.
#[derive(Debug)]
pub struct RegistryFront {
    server: HttpsServer,
    auth: FrontAuth,
    token: String,
}

impl RegistryFront {
    pub fn start(ca: &TestCa, registry: &Registry, auth: FrontAuth) -> RegistryFront {
        let server = HttpsServer::start(ca);
        let token = format!("anonymous-pull-{}", server.port());
        let front = RegistryFront {
            server,
            auth,
            token,
        };
        let upstream = Arc::new((client(ca), registry.url("")));
        let guard = front.guard();
        front.server.route_prefix(
            "/v2/",
            Behavior::Handler(Box::new(move |req: &Request| {
                guard.check(req).unwrap_or_else(|| {
                    let (client, base) = upstream.as_ref();
                    if req.method != "GET" {
                        return ResponseSpec {
                            status: 405,
                            headers: Vec::new(),
                            body: b"the front proxies GET only".to_vec(),
                        };
                    }
                    let mut request = client.get(&format!("{base}{}", req.path));
                    if let Some(a) = req.header("accept") {
                        request = request.set("Accept", a);
                    }
                    match request.call() {
                        Ok(r) | Err(ureq::Error::Status(_, r)) => to_spec(r),
                        Err(e) => ResponseSpec {
                            status: 502,
                            headers: Vec::new(),
                            body: format!("front: {e}").into_bytes(),
                        },
                    }
                })
            })),
        );
        let token = front.token.clone();
        front.server.route(
            "/token",
            Behavior::Handler(Box::new(move |req: &Request| {
                let service = format!("service={FRONT_SERVICE}");
                if !req.path.contains(&service) || !req.path.contains("scope=repository%3A") {
                    return ResponseSpec {
                        status: 400,
                        headers: Vec::new(),
                        body: format!("front: the token request lacks {service} or a scope")
                            .into_bytes(),
                    };
                }
                ResponseSpec {
                    status: 200,
                    headers: vec![("Content-Type".into(), "application/json".into())],
                    body: serde_json::json!({"token": token, "expires_in": 300})
                        .to_string()
                        .into_bytes(),
                }
            })),
        );
        front
    }

    /// `oci://127.0.0.1:<front port>/<repo>:<tag>`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("oci://127.0.0.1:{}/{repo}:{tag}", self.server.port())
    }

    /// The token `/token` hands out.
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn server(&self) -> &HttpsServer {
        &self.server
    }

    /// Every request the front read, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.server.requests()
    }

    /// Answers `path` (without its query) from `f` instead of the
    /// registry, behind the same token check.
    pub fn route(&self, path: &str, f: impl Fn(&Request) -> ResponseSpec + Send + Sync + 'static) {
        let guard = self.guard();
        self.server.route(
            path,
            Behavior::Handler(Box::new(move |req: &Request| {
                guard.check(req).unwrap_or_else(|| f(req))
            })),
        );
    }

    fn guard(&self) -> Guard {
        Guard {
            auth: self.auth,
            token: self.token.clone(),
            realm: self.server.url("/token"),
        }
    }
}

/// The front's token check, shared by its routes.
#[derive(Debug, Clone)]
struct Guard {
    auth: FrontAuth,
    token: String,
    realm: String,
}

impl Guard {
    /// `None` to serve the request, or the 401 to answer instead.
    fn check(&self, req: &Request) -> Option<ResponseSpec> {
        if self.auth == FrontAuth::Anonymous
            || req.header("authorization") == Some(&format!("Bearer {}", self.token))
        {
            return None;
        }
        let scope = repository_of(&req.path)
            .map(|repo| format!(",scope=\"repository:{repo}:pull\""))
            .unwrap_or_default();
        Some(ResponseSpec {
            status: 401,
            headers: vec![
                (
                    "WWW-Authenticate".into(),
                    format!(
                        "Bearer realm=\"{}\",service=\"{FRONT_SERVICE}\"{scope}",
                        self.realm
                    ),
                ),
                ("Content-Type".into(), "application/json".into()),
            ],
            body: br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                .to_vec(),
        })
    }
}

/// `<repo>` of `/v2/<repo>/(manifests|blobs)/...`.
fn repository_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/")?;
    let end = rest
        .rfind("/manifests/")
        .or_else(|| rest.rfind("/blobs/"))?;
    Some(&rest[..end])
}
