//! The smallest HTTP/1.1 server `/metrics` needs: one connection at a
//! time (a scrape every few seconds), every read and write bounded, the
//! connection closed after each answer.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A client has this long to send its request: a scraper sends it at once.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A client has this long to take each part of the page (megabytes at
/// 100,000 devices only with many `--group-by` values).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head longer than this is refused: a scrape's is a few
/// hundred bytes.
const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// Accepts until the listener fails; `page` writes the page of each
/// scrape.
pub fn serve(listener: &TcpListener, page: &dyn Fn() -> String) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                if let Err(e) = answer(s, page) {
                    log::debug!("metrics: a scrape's connection: {e}");
                }
            }
            Err(e) => log::warn!("metrics: accepting a connection: {e}"),
        }
    }
}

fn answer(mut s: TcpStream, page: &dyn Fn() -> String) -> std::io::Result<()> {
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST_BYTES {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            );
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond(
            &mut s,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &page(),
        ),
        ("GET", "/") => respond(
            &mut s,
            "200 OK",
            "text/plain; charset=utf-8",
            "fleetctl metrics: see /metrics\n",
        ),
        ("GET", _) => respond(&mut s, "404 Not Found", "text/plain", "only /metrics\n"),
        _ => respond(&mut s, "405 Method Not Allowed", "text/plain", "GET only\n"),
    }
}

fn respond(s: &mut TcpStream, status: &str, kind: &str, body: &str) -> std::io::Result<()> {
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body.as_bytes())?;
    s.flush()
}
