//! Debian's Prometheus and Alertmanager, each in a temp dir on a free
//! loopback port: Prometheus scrapes the targets a test names, evaluates
//! its rule files and sends alerts to an Alertmanager, which posts them
//! to a webhook (a receiver of the test's own: [`WebhookReceiver`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tempfile::TempDir;

use crate::{poll_until, require_tool, ChildGuard};

/// Prometheus opens its TSDB and web server in about a second; a loaded
/// machine takes longer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// One HTTP request to either server.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot pick a free loopback port: {e}"))
}

fn get(url: &str) -> Option<String> {
    ureq::get(url)
        .timeout(HTTP_TIMEOUT)
        .call()
        .ok()?
        .into_string()
        .ok()
}

fn wait_ready(child: &ChildGuard, base: &str) {
    let url = format!("{base}/-/ready");
    poll_until(
        &format!("{} ready at {url}", child.name()),
        READY_TIMEOUT,
        || get(&url).map(|_| ()),
    );
}

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    child: ChildGuard,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Prometheus {
    /// Scrapes `targets` (job `harmony-fleet`) and evaluates `rule_files`
    /// every `interval`, alerting `alertmanager` when given.
    pub fn start(
        targets: &[SocketAddr],
        rule_files: &[PathBuf],
        alertmanager: Option<SocketAddr>,
        interval: Duration,
    ) -> Prometheus {
        let bin = require_tool("/usr/bin/prometheus", "prometheus");
        let dir = tempfile::Builder::new()
            .prefix("fleet-prometheus-")
            .tempdir()
            .expect("tempdir");
        let secs = interval.as_secs().max(1);
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let rules: Vec<String> = rule_files
            .iter()
            .map(|r| format!("  - '{}'", r.display()))
            .collect();
        let alerting = alertmanager.map_or_else(String::new, |a| {
            format!(
                "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{a}']\n"
            )
        });
        let config = format!(
            "global:\n  scrape_interval: {secs}s\n  evaluation_interval: {secs}s\n  scrape_timeout: {secs}s\n\
rule_files:\n{}\n{alerting}scrape_configs:\n  - job_name: harmony-fleet\n    static_configs:\n      - targets: [{}]\n",
            rules.join("\n"),
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--web.enable-lifecycle");
        let child = ChildGuard::spawn(cmd, "prometheus");
        let p = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        wait_ready(&p.child, &p.url());
        p
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `GET /api/v1/<path>` as JSON (`None` when it does not answer).
    pub fn api(&self, path: &str) -> Option<serde_json::Value> {
        serde_json::from_str(&get(&format!("{}/api/v1/{path}", self.url()))?).ok()
    }

    /// The alerts firing now, each as Prometheus gives it.
    pub fn firing(&self) -> Vec<serde_json::Value> {
        self.api("alerts")
            .and_then(|v| v["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .collect()
    }

    pub fn log(&self) -> String {
        self.child.log()
    }
}

/// A running Alertmanager posting every alert to `webhook`.
#[derive(Debug)]
pub struct Alertmanager {
    child: ChildGuard,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Alertmanager {
    /// Groups nothing and waits a second before the first notification, so
    /// a test sees each alert at once.
    pub fn start(webhook: &str) -> Alertmanager {
        let bin = require_tool(
            "/usr/bin/prometheus-alertmanager",
            "prometheus-alertmanager",
        );
        let dir = tempfile::Builder::new()
            .prefix("fleet-alertmanager-")
            .tempdir()
            .expect("tempdir");
        let config = format!(
            "route:\n  receiver: test\n  group_by: ['...']\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n\
receivers:\n  - name: test\n    webhook_configs:\n      - url: '{webhook}'\n        send_resolved: true\n"
        );
        let config_path = dir.path().join("alertmanager.yml");
        std::fs::write(&config_path, config).expect("write alertmanager.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            // No peers: a cluster listener would need a port of its own.
            .arg("--cluster.listen-address=");
        let child = ChildGuard::spawn(cmd, "alertmanager");
        let a = Alertmanager {
            child,
            addr,
            _dir: dir,
        };
        wait_ready(&a.child, &format!("http://{addr}"));
        a
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn log(&self) -> String {
        self.child.log()
    }
}

/// An HTTP server of the test's own that keeps the body of every POST
/// (Alertmanager's webhook notifications, JSON).
#[derive(Debug)]
pub struct WebhookReceiver {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl WebhookReceiver {
    pub fn start() -> WebhookReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (Arc::clone(&bodies), Arc::clone(&stop));
        let handle = thread::Builder::new()
            .name("harness-webhook".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if let Some(v) = read_post(stream) {
                                b.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                            }
                        }
                        Err(_) => thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .expect("spawn the webhook receiver");
        WebhookReceiver {
            addr,
            bodies,
            stop,
            handle: Some(handle),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/alerts", self.addr)
    }

    /// Every notification received so far.
    pub fn notifications(&self) -> Vec<serde_json::Value> {
        self.bodies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The alerts of every notification whose status is `firing`, as
    /// `(alertname, labels)`.
    pub fn firing(&self) -> Vec<(String, serde_json::Value)> {
        self.notifications()
            .iter()
            .flat_map(|n| n["alerts"].as_array().cloned().unwrap_or_default())
            .filter(|a| a["status"] == "firing")
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn read_post(stream: TcpStream) -> Option<serde_json::Value> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    let mut s = stream;
    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    serde_json::from_slice(&body).ok()
}

/// `promtool` (Debian's package prometheus), for `check rules`, `test
/// rules` and `check metrics`.
pub fn promtool() -> PathBuf {
    require_tool("promtool", "prometheus")
}

/// Runs `promtool ARGS` in `dir` with `stdin`; panics with its output
/// when it fails.
pub fn promtool_ok(dir: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut cmd = Command::new(promtool());
    cmd.args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn promtool");
    if let Some(mut si) = child.stdin.take() {
        if let Some(text) = stdin {
            si.write_all(text.as_bytes()).expect("write promtool stdin");
        }
    }
    let out = child.wait_with_output().expect("wait promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}
