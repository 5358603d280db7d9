//! A network namespace joined to the host by a veth pair: a device behind a
//! link the test can cut without either end seeing a FIN or a reset, as a
//! cellular link or a pulled cable does.
//!
//! The host side of the pair is `10.231.X.1`, the namespace side
//! `10.231.X.2` (a /30 of its own per namespace). A process started with
//! [`NetNs::command`] sees only the namespace's loopback and that link;
//! [`NetNs::cut`] drops every packet in the namespace in both directions
//! (iptables in the namespace: nothing on the host changes), [`NetNs::restore`]
//! lets them through again. Needs root and the Debian packages `iproute2`
//! and `iptables`. `Drop` deletes the namespace and with it the pair.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

#[derive(Debug)]
pub struct NetNs {
    name: String,
    subnet: u8,
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (install the Debian packages iproute2 and iptables; network namespaces need root)",
                args[0]
            )
        });
    assert!(
        out.status.success(),
        "{}: {}{} (network namespaces need root and the Debian packages iproute2 and iptables)",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetNs {
    /// A new namespace with its link up.
    pub fn new() -> NetNs {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        // Distinct per process and per namespace within it: test binaries
        // run one after another, but threads of one run in parallel.
        let subnet = ((std::process::id().wrapping_mul(7) + n * 13) % 250) as u8 + 1;
        let name = format!("fleet-{}-{n}", std::process::id());
        let ns = NetNs { name, subnet };
        let (host, inner) = (ns.host_if(), ns.inner_if());
        run(&["ip", "netns", "add", &ns.name]);
        run(&[
            "ip", "link", "add", &host, "type", "veth", "peer", "name", &inner,
        ]);
        run(&["ip", "link", "set", &inner, "netns", &ns.name]);
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", ns.host_addr()),
            "dev",
            &host,
        ]);
        run(&["ip", "link", "set", &host, "up"]);
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", ns.inner_addr()),
            "dev",
            &inner,
        ]);
        ns.exec(&["ip", "link", "set", &inner, "up"]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn host_if(&self) -> String {
        format!("vfh{}", self.suffix())
    }

    fn inner_if(&self) -> String {
        format!("vfn{}", self.suffix())
    }

    /// Interface names are at most 15 bytes.
    fn suffix(&self) -> String {
        self.name
            .trim_start_matches("fleet-")
            .replace('-', "x")
            .chars()
            .take(11)
            .collect()
    }

    /// The host's address on the link: what a process in the namespace
    /// connects to (a server must listen on it or on 0.0.0.0).
    pub fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.subnet, 1)
    }

    /// The namespace's address on the link.
    pub fn inner_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.subnet, 2)
    }

    fn exec(&self, args: &[&str]) {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend_from_slice(args);
        run(&all);
    }

    /// `cmd` run inside the namespace: its program, arguments,
    /// environment and working directory.
    pub fn command(&self, cmd: &Command) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(cmd.get_program());
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            c.current_dir(dir);
        }
        c
    }

    /// Every packet in or out of the namespace dropped: open connections
    /// stay open at both ends, silent.
    pub fn cut(&self) {
        self.exec(&["iptables", "-w", "-I", "INPUT", "-j", "DROP"]);
        self.exec(&["iptables", "-w", "-I", "OUTPUT", "-j", "DROP"]);
    }

    /// The link working again.
    pub fn restore(&self) {
        self.exec(&["iptables", "-w", "-D", "INPUT", "-j", "DROP"]);
        self.exec(&["iptables", "-w", "-D", "OUTPUT", "-j", "DROP"]);
    }

    /// Every TCP packet in or out of the namespace with one of `ports` at
    /// either end dropped; other traffic passes.
    pub fn drop_tcp_ports(&self, ports: &[u16]) {
        self.tcp_port_rules("-I", ports);
    }

    /// Undoes [`drop_tcp_ports`](Self::drop_tcp_ports) with the same `ports`.
    pub fn pass_tcp_ports(&self, ports: &[u16]) {
        self.tcp_port_rules("-D", ports);
    }

    fn tcp_port_rules(&self, op: &str, ports: &[u16]) {
        for port in ports {
            let port = port.to_string();
            for chain in ["INPUT", "OUTPUT"] {
                for end in ["--sport", "--dport"] {
                    self.exec(&[
                        "iptables", "-w", op, chain, "-p", "tcp", end, &port, "-j", "DROP",
                    ]);
                }
            }
        }
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The veth pair goes with the namespace its inner end is in.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if()])
            .output();
    }
}
