//! The kernel's counters of this process's TCP connections to given ports,
//! read with netlink `sock_diag` (`INET_DIAG`, what `ss -ti` uses): no
//! `unsafe`, no handle on the `nats` crate's socket (it exposes none), and
//! every kernel since 4.2 has the four counters.
//!
//! Steps of [`tcp_connections`]: list the socket inodes this process holds
//! (`/proc/self/fd`); for each port and address family, dump the TCP
//! sockets whose remote port is that port (a bytecode filter in the
//! request, so a host with many sockets answers with few) with their
//! `tcp_info`; keep those whose inode is ours, and those with no inode (a
//! socket closed by its owner and still finishing: `FIN_WAIT`, its counters
//! still readable) for the caller to match by cookie.

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::time::Duration;

use rustix::net::netlink::{SocketAddrNetlink, SOCK_DIAG};
use rustix::net::sockopt::{self, Timeout};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// Bound on each netlink receive: the kernel answers a local dump at once.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);
/// One receive's buffer; a dump comes in several when it is larger.
const RECV_BUFFER_BYTES: usize = 32 * 1024;
/// Sockets one dump may list before the answer is refused (a filter that
/// failed would otherwise list the whole host).
const MAX_SOCKETS: usize = 4096;

// linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h, linux/tcp.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDR_BYTES: usize = 16;
const INET_DIAG_REQ_V2_BYTES: usize = 56;
const INET_DIAG_MSG_BYTES: usize = 72;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
const INET_DIAG_INFO: u16 = 2;
const INET_DIAG_BC_D_GE: u8 = 4;
const INET_DIAG_BC_D_LE: u8 = 5;
const IPPROTO_TCP: u8 = 6;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// Every TCP state but LISTEN (10) and TIME_WAIT (6, which keeps no counters).
const STATES: u32 = 0xfff & !(1 << 10) & !(1 << 6);
// Offsets in `struct inet_diag_msg` and `struct tcp_info`.
const MSG_COOKIE: usize = 4 + 40;
const MSG_DPORT: usize = 4 + 2;
const MSG_INODE: usize = 68;
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_RECEIVED: usize = 128;
const TCPI_SEGS_OUT: usize = 136;
const TCPI_SEGS_IN: usize = 140;
/// `tcp_info` up to `tcpi_segs_in` (Linux 4.2).
const TCPI_MIN_BYTES: usize = TCPI_SEGS_IN + 4;

/// One TCP connection's counters, as the kernel keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpReading {
    /// The kernel's id of the socket, never reused while it runs.
    pub cookie: u64,
    /// 0 once the process closed it (the kernel is still finishing it).
    pub inode: u32,
    pub remote_port: u16,
    /// `tcpi_bytes_acked`: payload bytes sent and acknowledged, plus one
    /// for the SYN (and one for a FIN).
    pub bytes_acked: u64,
    /// `tcpi_bytes_received`.
    pub bytes_received: u64,
    /// `tcpi_segs_out`: segments sent, pure ACKs and retransmissions included.
    pub segs_out: u32,
    /// `tcpi_segs_in`.
    pub segs_in: u32,
}

/// Reading the counters failed.
#[derive(Debug)]
pub enum DiagError {
    /// `/proc/self/fd` could not be listed.
    Fds(io::Error),
    /// The netlink socket could not be made or used.
    Netlink(io::Error),
    /// The kernel refused the request (errno).
    Refused(i32),
    /// The answer does not parse.
    Malformed(&'static str),
    /// The kernel's `tcp_info` lacks the counters (older than Linux 4.2).
    OldKernel {
        info_bytes: usize,
    },
    TooMany,
}

impl fmt::Display for DiagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fds(e) => write!(f, "listing /proc/self/fd: {e}"),
            Self::Netlink(e) => write!(f, "netlink sock_diag: {e}"),
            Self::Refused(errno) => write!(f, "netlink sock_diag refused the request (errno {errno})"),
            Self::Malformed(what) => write!(f, "netlink sock_diag answer malformed: {what}"),
            Self::OldKernel { info_bytes } => write!(
                f,
                "the kernel's tcp_info has {info_bytes} bytes, without the byte and segment counters (Linux 4.2 or newer has them)"
            ),
            Self::TooMany => write!(f, "netlink sock_diag listed more than {MAX_SOCKETS} sockets"),
        }
    }
}

impl std::error::Error for DiagError {}

/// The inodes of the sockets this process holds.
fn own_socket_inodes() -> Result<HashSet<u32>, DiagError> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").map_err(DiagError::Fds)? {
        let Ok(entry) = entry else { continue };
        // An fd closed since the listing has no link: skipped.
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if let Some(n) = target
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.parse::<u32>().ok())
        {
            inodes.insert(n);
        }
    }
    Ok(inodes)
}

/// The TCP connections of this process to any of `ports`, plus closed ones
/// still finishing (inode 0: the caller keeps those it knew by cookie).
pub fn tcp_connections(ports: &[u16]) -> Result<Vec<TcpReading>, DiagError> {
    let own = own_socket_inodes()?;
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        Some(SOCK_DIAG),
    )
    .map_err(|e| DiagError::Netlink(e.into()))?;
    sockopt::set_socket_timeout(&fd, Timeout::Recv, Some(RECV_TIMEOUT))
        .map_err(|e| DiagError::Netlink(e.into()))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; RECV_BUFFER_BYTES];
    for (seq, (&port, family)) in ports
        .iter()
        .flat_map(|p| [(p, AF_INET), (p, AF_INET6)])
        .enumerate()
    {
        let seq = u32::try_from(seq + 1).unwrap_or(u32::MAX);
        let req = dump_request(family, port, seq);
        rustix::net::sendto(&fd, &req, SendFlags::empty(), &SocketAddrNetlink::new(0, 0))
            .map_err(|e| DiagError::Netlink(e.into()))?;
        'dump: loop {
            let (n, _) = rustix::net::recv(&fd, &mut buf[..], RecvFlags::empty())
                .map_err(|e| DiagError::Netlink(e.into()))?;
            let mut at = 0;
            while at + NLMSG_HDR_BYTES <= n {
                let len = usize::try_from(u32_at(&buf, at)).unwrap_or(usize::MAX);
                if len < NLMSG_HDR_BYTES || at + len > n {
                    return Err(DiagError::Malformed("message length"));
                }
                let kind = u16_at(&buf, at + 4);
                let body = &buf[at + NLMSG_HDR_BYTES..at + len];
                match kind {
                    NLMSG_DONE => break 'dump,
                    NLMSG_ERROR => {
                        let errno = body
                            .get(..4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .unwrap_or(0);
                        return Err(DiagError::Refused(-errno));
                    }
                    SOCK_DIAG_BY_FAMILY => {
                        if let Some(r) = parse_socket(body)? {
                            if r.remote_port == port && (r.inode == 0 || own.contains(&r.inode)) {
                                out.push(r);
                            }
                        }
                        if out.len() > MAX_SOCKETS {
                            return Err(DiagError::TooMany);
                        }
                    }
                    _ => {}
                }
                at += align4(len);
            }
        }
    }
    Ok(out)
}

/// `SOCK_DIAG_BY_FAMILY` dump of `family`'s TCP sockets with remote port
/// `port`, asking for `tcp_info`.
fn dump_request(family: u8, port: u16, seq: u32) -> Vec<u8> {
    // Bytecode "dport >= port && dport <= port": each test is an op
    // {code, yes, no} and an op carrying the port in `no`; a failed test
    // jumps past the end (rejects).
    let mut bc = Vec::with_capacity(16);
    for (code, left) in [(INET_DIAG_BC_D_GE, 16u16), (INET_DIAG_BC_D_LE, 8u16)] {
        bc.push(code);
        bc.push(8);
        bc.extend_from_slice(&(left + 4).to_ne_bytes());
        bc.extend_from_slice(&[0, 0]);
        bc.extend_from_slice(&port.to_ne_bytes());
    }
    let attr_len = 4 + bc.len();
    let total = NLMSG_HDR_BYTES + INET_DIAG_REQ_V2_BYTES + align4(attr_len);
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, ext (1 << (INET_DIAG_INFO - 1)),
    // pad, states, then an all-zero inet_diag_sockid (48 bytes).
    m.extend_from_slice(&[family, IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0]);
    m.extend_from_slice(&STATES.to_ne_bytes());
    m.extend_from_slice(&[0u8; 48]);
    m.extend_from_slice(&u16::try_from(attr_len).unwrap_or(u16::MAX).to_ne_bytes());
    m.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
    m.extend_from_slice(&bc);
    m.resize(total, 0);
    m
}

/// One `inet_diag_msg` and its attributes; `None` without `tcp_info` (a
/// socket in a state that keeps none).
fn parse_socket(body: &[u8]) -> Result<Option<TcpReading>, DiagError> {
    if body.len() < INET_DIAG_MSG_BYTES {
        return Err(DiagError::Malformed("inet_diag_msg too short"));
    }
    let remote_port = u16::from_be_bytes([body[MSG_DPORT], body[MSG_DPORT + 1]]);
    let cookie =
        u64::from(u32_at(body, MSG_COOKIE)) | (u64::from(u32_at(body, MSG_COOKIE + 4)) << 32);
    let inode = u32_at(body, MSG_INODE);
    let mut at = INET_DIAG_MSG_BYTES;
    while at + 4 <= body.len() {
        let len = usize::from(u16_at(body, at));
        let kind = u16_at(body, at + 2);
        if len < 4 || at + len > body.len() {
            return Err(DiagError::Malformed("attribute length"));
        }
        if kind == INET_DIAG_INFO {
            let info = &body[at + 4..at + len];
            if info.len() < TCPI_MIN_BYTES {
                return Err(DiagError::OldKernel {
                    info_bytes: info.len(),
                });
            }
            return Ok(Some(TcpReading {
                cookie,
                inode,
                remote_port,
                bytes_acked: u64_at(info, TCPI_BYTES_ACKED),
                bytes_received: u64_at(info, TCPI_BYTES_RECEIVED),
                segs_out: u32_at(info, TCPI_SEGS_OUT),
                segs_in: u32_at(info, TCPI_SEGS_IN),
            }));
        }
        at += align4(len);
    }
    Ok(None)
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

// Callers check the length first; a short slice reads as zeros.
fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_ne_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_request_filters_on_the_remote_port() {
        let m = dump_request(AF_INET, 4222, 7);
        assert_eq!(m.len(), 16 + 56 + 20);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), SOCK_DIAG_BY_FAMILY);
        assert_eq!(m[16], AF_INET);
        assert_eq!(m[17], IPPROTO_TCP);
        // The bytecode: GE then LE, each carrying the port.
        let bc = &m[16 + 56 + 4..];
        assert_eq!((bc[0], bc[1], u16_at(bc, 2)), (INET_DIAG_BC_D_GE, 8, 20));
        assert_eq!(u16_at(bc, 6), 4222);
        assert_eq!((bc[8], bc[9], u16_at(bc, 10)), (INET_DIAG_BC_D_LE, 8, 12));
        assert_eq!(u16_at(bc, 14), 4222);
    }

    #[test]
    fn a_connection_of_this_process_is_read_with_its_counters() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mut client = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        client.write_all(&[7u8; 1000]).expect("write");
        let mut got = vec![0u8; 1000];
        server.read_exact(&mut got).expect("read");
        server.write_all(&[9u8; 300]).expect("write back");
        let mut back = vec![0u8; 300];
        client.read_exact(&mut back).expect("read back");
        // The ACK of the server's 300 bytes may trail: poll briefly.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let r = loop {
            let all = tcp_connections(&[port]).expect("sock_diag");
            // Only the client side has the remote port `port`.
            assert_eq!(all.len(), 1, "{all:?}");
            let r = all[0];
            if r.bytes_acked >= 1000 || std::time::Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(r.remote_port, port);
        assert_ne!(r.inode, 0);
        // The SYN counts as one byte acknowledged (and a FIN would too).
        assert_eq!(r.bytes_acked, 1001);
        assert_eq!(r.bytes_received, 300);
        assert!(r.segs_out >= 2 && r.segs_in >= 2, "{r:?}");
        // Another port lists nothing of ours.
        assert!(tcp_connections(&[1]).expect("sock_diag").is_empty());
    }
}
