//! The client side of the NATS text protocol, as much as a device uses:
//! parsing `INFO`, `MSG`, `HMSG`, `PING`, `PONG`, `+OK`, `-ERR` from a
//! byte buffer, and writing `CONNECT`, `SUB`, `UNSUB`, `PUB`, `PING`,
//! `PONG`.

/// One message from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `INFO`, with the nonce to sign when the server sent one.
    Info {
        nonce: Option<String>,
    },
    Ping,
    Pong,
    Ok,
    Err(String),
    Msg(Msg),
}

/// A delivered message (`MSG` or `HMSG`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub subject: String,
    pub sid: u64,
    pub reply: Option<String>,
    /// The status of the header line (`NATS/1.0 100 Idle Heartbeat` → `100`).
    pub status: Option<String>,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Msg {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A protocol error: the connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

/// Parses the next complete op from `buf`; returns it and the bytes it
/// used, or `None` when more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(Op, usize)>, ProtoError> {
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err(ProtoError("control line longer than 64 KiB".into()));
        }
        return Ok(None);
    };
    let line = std::str::from_utf8(&buf[..eol])
        .map_err(|_| ProtoError("control line is not UTF-8".into()))?;
    let after = eol + 2;
    let mut words = line.split_ascii_whitespace();
    let op = words.next().unwrap_or("").to_ascii_uppercase();
    match op.as_str() {
        "INFO" => {
            let nonce = serde_json::from_str::<serde_json::Value>(line[4..].trim())
                .ok()
                .and_then(|v| v.get("nonce").and_then(|n| n.as_str()).map(str::to_owned));
            Ok(Some((Op::Info { nonce }, after)))
        }
        "PING" => Ok(Some((Op::Ping, after))),
        "PONG" => Ok(Some((Op::Pong, after))),
        "+OK" => Ok(Some((Op::Ok, after))),
        "-ERR" => Ok(Some((
            Op::Err(line[4..].trim().trim_matches('\'').to_owned()),
            after,
        ))),
        "MSG" | "HMSG" => {
            let w: Vec<&str> = words.collect();
            let bad = || ProtoError(format!("malformed {op} line: {line:?}"));
            let num = |s: &str| s.parse::<usize>().map_err(|_| bad());
            let (subject, sid, reply, hlen, total) = match (op.as_str(), w.len()) {
                ("MSG", 3) => (w[0], w[1], None, 0, num(w[2])?),
                ("MSG", 4) => (w[0], w[1], Some(w[2]), 0, num(w[3])?),
                ("HMSG", 4) => (w[0], w[1], None, num(w[2])?, num(w[3])?),
                ("HMSG", 5) => (w[0], w[1], Some(w[2]), num(w[3])?, num(w[4])?),
                _ => return Err(bad()),
            };
            if hlen > total {
                return Err(bad());
            }
            if buf.len() < after + total + 2 {
                return Ok(None);
            }
            let body = &buf[after..after + total];
            let (status, headers) = if hlen > 0 {
                parse_headers(&body[..hlen])
            } else {
                (None, Vec::new())
            };
            let msg = Msg {
                subject: subject.to_owned(),
                sid: sid.parse().map_err(|_| bad())?,
                reply: reply.map(str::to_owned),
                status,
                headers,
                payload: body[hlen..].to_vec(),
            };
            Ok(Some((Op::Msg(msg), after + total + 2)))
        }
        _ => Err(ProtoError(format!("unknown op {line:?}"))),
    }
}

fn parse_headers(h: &[u8]) -> (Option<String>, Vec<(String, String)>) {
    let text = String::from_utf8_lossy(h);
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.strip_prefix("NATS/1.0"))
        .and_then(|rest| rest.split_ascii_whitespace().next())
        .map(str::to_owned);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

/// `CONNECT` with user and password, headers and no-responders on, no
/// echo (as the agent's `nats` client sends it), then `PING`.
pub fn connect(out: &mut Vec<u8>, user: &str, pass: &str, name: &str) {
    connect_as(out, serde_json::json!({"user": user, "pass": pass}), name);
}

/// `CONNECT` with a user nkey and its signature of the nonce (base64url,
/// unpadded, as the `nats` crate sends it), the claimed `user` and a
/// `token` beside them (the agent's patched crate, vendor/nats/PATCHED.md),
/// otherwise as [`connect`]; then `PING`.
pub fn connect_nkey(out: &mut Vec<u8>, user: &str, nkey: &str, sig: &str, token: &str, name: &str) {
    connect_as(
        out,
        serde_json::json!({"nkey": nkey, "sig": sig, "user": user, "auth_token": token}),
        name,
    );
}

/// `CONNECT` with the credential fields `creds` and the options every
/// agent connection sends, then `PING`.
fn connect_as(out: &mut Vec<u8>, mut creds: serde_json::Value, name: &str) {
    let options = serde_json::json!({
        "verbose": false,
        "pedantic": false,
        "name": name,
        "lang": "rust",
        "version": "0.25.0",
        "protocol": 1,
        "echo": false,
        "headers": true,
        "no_responders": true,
        "tls_required": false,
    });
    if let (Some(c), serde_json::Value::Object(o)) = (creds.as_object_mut(), options) {
        c.extend(o);
    }
    out.extend_from_slice(format!("CONNECT {creds}\r\nPING\r\n").as_bytes());
}

pub fn sub(out: &mut Vec<u8>, subject: &str, sid: u64) {
    out.extend_from_slice(format!("SUB {subject} {sid}\r\n").as_bytes());
}

pub fn unsub(out: &mut Vec<u8>, sid: u64) {
    out.extend_from_slice(format!("UNSUB {sid}\r\n").as_bytes());
}

pub fn publish(out: &mut Vec<u8>, subject: &str, reply: Option<&str>, payload: &[u8]) {
    let line = match reply {
        Some(r) => format!("PUB {subject} {r} {}\r\n", payload.len()),
        None => format!("PUB {subject} {}\r\n", payload.len()),
    };
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

pub fn pong(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PONG\r\n");
}

pub fn ping(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PING\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ops_and_waits_for_whole_messages() {
        let b = b"INFO {\"nonce\":\"n1\"}\r\nPING\r\nMSG a.b 3 _INBOX.x 5\r\nhello\r\n";
        let (op, n) = parse(b).expect("ok").expect("op");
        assert_eq!(
            op,
            Op::Info {
                nonce: Some("n1".into())
            }
        );
        let (op, m) = parse(&b[n..]).expect("ok").expect("op");
        assert_eq!(op, Op::Ping);
        let rest = &b[n + m..];
        assert_eq!(parse(&rest[..rest.len() - 3]).expect("ok"), None);
        let (op, used) = parse(rest).expect("ok").expect("op");
        assert_eq!(used, rest.len());
        let Op::Msg(msg) = op else {
            panic!("not a msg")
        };
        assert_eq!(
            (msg.subject.as_str(), msg.sid, msg.reply.as_deref()),
            ("a.b", 3, Some("_INBOX.x"))
        );
        assert_eq!(msg.payload, b"hello");
        let h = b"NATS/1.0 404 Message Not Found\r\nNats-Sequence: 4\r\n\r\n";
        let line = format!("HMSG i 1 {} {}\r\n", h.len(), h.len() + 2);
        let mut buf = line.into_bytes();
        buf.extend_from_slice(h);
        buf.extend_from_slice(b"ok\r\n");
        let Some((Op::Msg(msg), _)) = parse(&buf).expect("ok") else {
            panic!("not a msg")
        };
        assert_eq!(msg.status.as_deref(), Some("404"));
        assert_eq!(msg.header("nats-sequence"), Some("4"));
        assert_eq!(msg.payload, b"ok");
        assert!(parse(b"BOGUS\r\n").is_err());
    }
}
