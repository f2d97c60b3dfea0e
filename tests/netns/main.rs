//! Two (or four) hosts and a real network (issue 17): agents in separate network, PID, mount,
//! IPC and UTS namespaces (`nixl_testkit::netns`), so UCX and libfabric can only use
//! tcp over the virtual links between them, and the links can fail.
//!
//! - `faults`: a cable pulled mid-transfer, pulled and plugged back, pulled during a
//!   metadata fetch (side channel and etcd), and a peer host destroyed — each ends in a typed
//!   error within its deadline, measured while the transfer was really in flight;
//! - `rails`: two links between the same hosts carry bytes on both (libfabric striping, UCX
//!   multi-lane), and one of them failing mid-transfer;
//! - `scale`: 4 hosts x 16 agents exchange metadata through etcd and write a block to every
//!   other agent.
//!
//! The agents are this test binary started again inside a host (`netns_child`), driven over
//! the harness's control channel. The main job across the link is `disagg_kv --hosts 2`
//! (scripts/test.sh). Tests skip (Dep::Netns) where namespaces cannot be made.
#![cfg(target_os = "linux")]

mod agent;
mod defaults;
mod faults;
mod rails;
mod scale;
mod silent;

use std::net::SocketAddr;
use std::time::Duration;

use nixl_testkit::netns::{Control, HostProcess, Net};

use agent::AgentCfg;

/// Environment variable: which child role to run.
const ROLE: &str = "NIXL_NETNS_ROLE";
/// The child-role test.
const CHILD: &str = "netns_child";
/// The side-channel port every agent process uses (each host has its own ports).
const PORT: u16 = 5500;
/// How long a command expected to succeed may take.
const T: Duration = Duration::from_secs(60);

#[test]
#[ignore = "child process entry point: spawned inside a netns host by this file's tests"]
fn netns_child() {
    let Some(ctl) = Control::connect() else {
        return;
    };
    let r = match std::env::var(ROLE).as_deref() {
        Ok("agent") => agent::main(ctl),
        Ok("scale") => scale::child(ctl),
        other => Err(format!("unknown role {other:?}")),
    };
    match r {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("netns child failed: {e}");
            std::process::exit(2)
        }
    }
}

/// A failed command: the error's kind, how long the call took, and its message.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) kind: String,
    pub(crate) ms: u64,
    pub(crate) msg: String,
}

/// An agent process in a host.
pub(crate) struct Peer {
    pub(crate) proc: HostProcess,
    pub(crate) name: String,
    pub(crate) listen: SocketAddr,
    pub(crate) addr: u64,
}

impl Peer {
    /// Starts an agent process in `host` and waits for it to be ready.
    pub(crate) fn start(net: &Net, host: usize, cfg: &AgentCfg) -> Peer {
        let mut proc = net
            .spawn_test(
                host,
                CHILD,
                &[(ROLE, "agent".into()), (agent::CFG, cfg.encode())],
            )
            .expect("spawn an agent process");
        let ready = proc
            .expect("ready ", T)
            .unwrap_or_else(|e| panic!("{}: {e}", cfg.name));
        let w: Vec<&str> = ready.split_whitespace().collect();
        Peer {
            proc,
            name: cfg.name.clone(),
            listen: w[0].parse().expect("listen address"),
            addr: w[1].parse().expect("memory address"),
        }
    }

    /// Sends a command; its reply (`Ok` with the text after `ok`, or the [`Failure`]).
    pub(crate) fn cmd(&mut self, line: &str) -> Result<String, Failure> {
        self.proc
            .send(line)
            .unwrap_or_else(|e| panic!("{}: sending {line:?}: {e}", self.name));
        let r = self
            .proc
            .recv(T * 2)
            .unwrap_or_else(|e| panic!("{}: no reply to {line:?}: {e}", self.name));
        if let Some(rest) = r.strip_prefix("err ") {
            let mut w = rest.splitn(3, ' ');
            return Err(Failure {
                kind: w.next().unwrap_or("").to_owned(),
                ms: w.next().and_then(|m| m.parse().ok()).unwrap_or(0),
                msg: w.next().unwrap_or("").to_owned(),
            });
        }
        Ok(r.strip_prefix("ok").unwrap_or(&r).trim().to_owned())
    }

    /// A command that must succeed.
    pub(crate) fn ok(&mut self, line: &str) -> String {
        self.cmd(line)
            .unwrap_or_else(|f| panic!("{}: {line:?} failed: {f:?}", self.name))
    }
}

/// Settings of an agent on `host` with `mem` bytes, on the backend named.
pub(crate) fn cfg(
    net: &Net,
    name: &str,
    host: usize,
    backend: &'static str,
    mem: usize,
) -> AgentCfg {
    AgentCfg {
        name: format!("{name}-{}", std::process::id()),
        backend,
        listen: SocketAddr::from((net.addr(0, host).expect("host on segment 0"), PORT)),
        mem,
        domains: vec![Net::ifname(0)],
        tls: None,
        cancel_ms: 2000,
        keepalive_ms: 500,
        ucx_path: None,
    }
}

/// One row of the fault table (docs/reliability.md), printed by each fault test.
pub(crate) fn report(fault: &str, expected: &str, observed: &str, to_error: Option<Duration>) {
    let t = to_error.map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
    println!("FAULT-TABLE | {fault} | {expected} | {observed} | {t} |");
}
