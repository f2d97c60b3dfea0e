//! The victim of the hostile-peer tests: this test binary spawned again as a separate
//! process (env `NIXL_HOSTILE_ROLE`), an agent with UCX and a side channel on 127.0.0.1,
//! driven by the parent over its stdin and stdout (one command per line, one answer per
//! line), so the attacks reach it only through its side channel and its UCX worker.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::access::{Auth, Credential};
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
};

const ROLE: &str = "NIXL_HOSTILE_ROLE";
const NAME: &str = "NIXL_HOSTILE_NAME";
const TLS: &str = "NIXL_HOSTILE_TLS";
const CRED: &str = "NIXL_HOSTILE_CREDENTIAL";
const MEM: &str = "NIXL_HOSTILE_MEM";
const MAX_PEERS: &str = "NIXL_HOSTILE_MAX_PEERS";
const NOTIF_BYTES: &str = "NIXL_HOSTILE_NOTIF_BYTES";
const NOFILE: &str = "NIXL_HOSTILE_NOFILE";

/// How long any answer of the victim may take (generous: a shared 2-core machine).
pub const ANSWER: Duration = Duration::from_secs(60);

pub use super::params as ucx;

/// An agent config: side channel on 127.0.0.1, optional credential.
pub fn config(cred: Option<&Credential>) -> AgentConfig {
    AgentConfig::default()
        .listen(true)
        .default_timeout(Duration::from_secs(10))
        .auth(cred.map(|c| Auth::new(c.clone())))
        .plugins(vec![
            Arc::new(nixl_core::backend::inproc::InprocPlugin),
            Arc::new(nixl_mem::CudaIpcPlugin),
            Arc::new(nixl_backend_ucx::UcxPlugin),
        ])
}

pub use crate::unique;

/// An agent in this (the parent) process with UCX over `tls`.
pub fn agent(role: &str, tls: &str, cred: Option<&Credential>) -> Agent {
    let a = Agent::new(&unique(role), config(cred)).expect("agent");
    a.create_backend(ucx(tls)).expect("UCX backend");
    a
}

/// How the victim is set up.
#[derive(Debug, Clone)]
pub struct VictimSpec {
    /// UCX transports.
    pub tls: String,
    /// The cluster credential, if any.
    pub cred: Option<Credential>,
    /// Bytes of registered memory.
    pub mem: usize,
    /// The victim's `Limits::max_peers`.
    pub max_peers: Option<usize>,
    /// The victim's notification byte limit.
    pub notif_bytes: Option<usize>,
    /// `UCX_TCP_USER_TIMEOUT` for the victim (default: derived from [`ucx`]'s 500 ms
    /// keep-alive, 2 s): a longer one keeps a stopped peer alive in UCX's eyes, so that a
    /// deadline, not UCX's failure detection, ends a transfer to it.
    pub tcp_user_timeout: Option<&'static str>,
    /// The victim's open-file limit (`RLIMIT_NOFILE`, soft), set before its agent is made.
    pub nofile: Option<u64>,
}

impl VictimSpec {
    /// 1 MiB of memory over `tls`, the agent's default limits.
    pub fn new(tls: &str, cred: Option<&Credential>) -> Self {
        VictimSpec {
            tls: tls.to_owned(),
            cred: cred.cloned(),
            mem: 1 << 20,
            max_peers: None,
            notif_bytes: None,
            tcp_user_timeout: None,
            nofile: None,
        }
    }
}

/// The victim process (killed on drop) and what it announced.
#[derive(Debug)]
pub struct Victim {
    /// The process.
    pub child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Its agent's name.
    pub name: String,
    /// Its side channel.
    pub listen: SocketAddr,
    /// Its agent's generation.
    pub generation: u64,
    /// Start of its registered memory.
    pub mem_addr: u64,
    /// Length of its registered memory.
    pub mem_len: u64,
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Victim {
    /// Spawns the victim (`test` is this binary's child-role test) and waits for it to be
    /// ready.
    pub fn spawn(test: &str, spec: &VictimSpec) -> Victim {
        let exe = std::env::current_exe().expect("test binary");
        let name = unique("victim");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "victim")
        .env(NAME, &name)
        .env(TLS, &spec.tls)
        .env(MEM, spec.mem.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if let Some(c) = &spec.cred {
            cmd.env(CRED, c.export());
        }
        if let Some(n) = spec.max_peers {
            cmd.env(MAX_PEERS, n.to_string());
        }
        if let Some(n) = spec.notif_bytes {
            cmd.env(NOTIF_BYTES, n.to_string());
        }
        if let Some(t) = spec.tcp_user_timeout {
            cmd.env("UCX_TCP_USER_TIMEOUT", t);
        }
        if let Some(n) = spec.nofile {
            cmd.env(NOFILE, n.to_string());
        }
        let mut child = cmd.spawn().expect("spawn victim");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest's "test victim_role ... " may precede the first answer on its line.
                if let Some(i) = l.find("@@ ") {
                    if tx.send(l[i + 3..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        let mut v = Victim {
            child,
            stdin,
            lines,
            name,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            generation: 0,
            mem_addr: 0,
            mem_len: 0,
        };
        let ready = v.read(ANSWER).expect("victim ready");
        let p: Vec<&str> = ready.split('|').collect();
        match p.as_slice() {
            ["ready", listen, generation, addr, len] => {
                v.listen = listen.parse().expect("listen");
                v.generation = generation.parse().expect("generation");
                v.mem_addr = addr.parse().expect("addr");
                v.mem_len = len.parse().expect("len");
            }
            _ => panic!("victim said {ready:?}"),
        }
        v
    }

    fn read(&mut self, timeout: Duration) -> Result<String, String> {
        self.lines.recv_timeout(timeout).map_err(|e| {
            let status = self.child.try_wait().ok().flatten();
            format!("no answer from the victim ({e}); exit status: {status:?}")
        })
    }

    /// Sends a command and returns the answer.
    pub fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("victim stdin");
        self.stdin.flush().expect("flush");
        self.read(ANSWER).unwrap_or_else(|e| panic!("{cmd}: {e}"))
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Open file descriptors of the victim.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Resident memory of the victim, bytes.
    pub fn rss(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/statm", self.child.id()))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * 4096)
    }
}

/// Runs the victim's side when this process was spawned as one; returns otherwise.
pub fn child_entry() {
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    match victim_main() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("victim failed: {e}");
            std::process::exit(2)
        }
    }
}

fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@ {s}");
    let _ = out.flush();
}

fn env(k: &str) -> Result<String, String> {
    std::env::var(k).map_err(|_| format!("{k} not set"))
}

fn victim_main() -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let name = env(NAME)?;
    let tls = env(TLS)?;
    let mem_len: usize = env(MEM)?.parse().map_err(|_| "bad mem")?;
    let cred = match std::env::var(CRED) {
        Ok(s) => Some(Credential::parse(&s).map_err(e)?),
        Err(_) => None,
    };
    if let Ok(n) = env(NOFILE) {
        let n: u64 = n.parse().map_err(|_| "bad nofile")?;
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let max = getrlimit(Resource::Nofile).maximum;
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(n),
                maximum: max,
            },
        )
        .map_err(|e| format!("setrlimit: {e}"))?;
    }
    // The agent's default limits follow the open-file limit set above.
    let mut cfg = config(cred.as_ref());
    if let Ok(n) = env(MAX_PEERS) {
        cfg.limits.max_peers = n.parse().map_err(|_| "bad max peers")?;
    }
    if let Ok(n) = env(NOTIF_BYTES) {
        let n: usize = n.parse().map_err(|_| "bad notif bytes")?;
        cfg.limits.max_queued_notif_bytes = n;
        cfg.limits.max_queued_notif_bytes_per_sender = n;
    }
    let agent = Agent::new(&name, cfg).map_err(e)?;
    agent.create_backend(ucx(&tls)).map_err(e)?;
    let mem = Arc::new(HostBuffer::new(mem_len).ok_or("cannot allocate the victim's memory")?);
    let reg = agent.register_mem(vec![mem.clone()], &[]).map_err(e)?;
    let listen = agent.listen_addr().ok_or("no side channel")?;
    say(&format!(
        "ready|{listen}|{}|{}|{}",
        agent.generation(),
        mem.addr(),
        mem.len()
    ));
    let mut reqs = Vec::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            w.get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad command {line:?}"))
        };
        let answer = match w.first().copied() {
            Some("exit") => return Ok(()),
            Some("alive") => "alive".to_owned(),
            // fetch <name> <addr> <timeout ms>: elapsed ms and the outcome.
            Some("fetch") => {
                let addr: SocketAddr = w.get(2).and_then(|s| s.parse().ok()).ok_or("addr")?;
                let t = Instant::now();
                let r = agent.fetch_remote_metadata_blocking(
                    w.get(1).copied().unwrap_or(""),
                    addr,
                    Duration::from_millis(num(3)?),
                );
                format!(
                    "{}|{}",
                    t.elapsed().as_millis(),
                    r.map_or_else(|e| e.kind().as_str().to_owned(), |n| format!("ok:{n}"))
                )
            }
            Some("generation") => agent
                .remote_generation(w.get(1).copied().unwrap_or(""))
                .map_or("none".to_owned(), |g| g.to_string()),
            Some("regions") => match agent.remote_regions(w.get(1).copied().unwrap_or("")) {
                Ok(r) => r
                    .iter()
                    .map(|d| format!("{:#x}+{}", d.addr, d.len))
                    .collect::<Vec<_>>()
                    .join(","),
                Err(e) => format!("err:{}", e.kind().as_str()),
            },
            Some("remotes") => agent.remotes().len().to_string(),
            // write <peer> <remote addr> <len> <byte> <timeout ms>: posts a WRITE of `len`
            // bytes of `byte` from the start of our memory and waits; elapsed ms and outcome.
            Some("write") => {
                let (peer, raddr, len, byte, ms) = (
                    w.get(1).copied().unwrap_or(""),
                    num(2)?,
                    num(3)?,
                    num(4)?,
                    num(5)?,
                );
                mem.fill(byte as u8);
                let t = Instant::now();
                let r = agent
                    .create_xfer_req(
                        XferOp::Write,
                        &XferDescList::blocks(MemKind::Dram, mem.addr(), len, 1),
                        &XferDescList::blocks(MemKind::Dram, raddr, len, 1),
                        peer,
                        XferOptions::with_notif(b"written".to_vec()),
                    )
                    .and_then(|req| {
                        agent.post_xfer_req(&req)?;
                        let r = req.wait(Duration::from_millis(ms));
                        reqs.push(req);
                        r
                    });
                format!(
                    "{}|{}",
                    t.elapsed().as_millis(),
                    r.map_or_else(|e| e.kind().as_str().to_owned(), |()| "ok".to_owned())
                )
            }
            // The last write's memory: still held by the backend?
            Some("draining") => reqs
                .last()
                .map_or("none".to_owned(), |r| r.is_draining().to_string()),
            Some("drop_reqs") => {
                reqs.clear();
                agent.draining_requests().to_string()
            }
            Some("draining_count") => agent.draining_requests().to_string(),
            // forget <peer>: invalidates it; "ok" or the error kind.
            Some("forget") => agent
                .invalidate_remote_metadata(w.get(1).copied().unwrap_or(""))
                .map_or_else(|e| e.kind().as_str().to_owned(), |()| "ok".to_owned()),
            // xfer <peer> <read|write> <remote addr> <len> <timeout ms>: one request between
            // the start of our memory and the peer's, posted and waited for; "ok" or the
            // error kind.
            Some("xfer") => {
                let op = match w.get(2).copied() {
                    Some("read") => XferOp::Read,
                    _ => XferOp::Write,
                };
                let (raddr, len, ms) = (num(3)?, num(4)?, num(5)?);
                agent
                    .create_xfer_req(
                        op,
                        &XferDescList::blocks(MemKind::Dram, mem.addr(), len, 1),
                        &XferDescList::blocks(MemKind::Dram, raddr, len, 1),
                        w.get(1).copied().unwrap_or(""),
                        XferOptions::default().timeout(Duration::from_millis(ms)),
                    )
                    .and_then(|req| {
                        agent.post_xfer_req(&req)?;
                        req.wait(Duration::from_millis(ms))
                    })
                    .map_or_else(|e| e.kind().as_str().to_owned(), |()| "ok".to_owned())
            }
            // gen <peer> <count>: standalone notifications; how many returned Ok and the kinds
            // of the errors.
            Some("gen") => {
                let (peer, n) = (w.get(1).copied().unwrap_or(""), num(2)?);
                let mut ok = 0;
                let mut kinds = std::collections::BTreeSet::new();
                for i in 0..n {
                    match agent.gen_notif(peer, format!("n{i}").as_bytes(), &[]) {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            kinds.insert(e.kind().as_str());
                        }
                    }
                }
                format!("{ok}|{}", kinds.into_iter().collect::<Vec<_>>().join(","))
            }
            // wait <ms>: elapsed ms, then the senders and counts or the error kind.
            Some("wait") => {
                let t = Instant::now();
                let r = agent.wait_notifs(Duration::from_millis(num(1)?));
                let el = t.elapsed().as_millis();
                match r {
                    Ok(n) => {
                        let mut s: Vec<String> =
                            n.iter().map(|(k, v)| format!("{k}={}", v.len())).collect();
                        s.sort();
                        format!("{el}|ok|{}", s.join(","))
                    }
                    Err(e) => format!("{el}|{}|", e.kind().as_str()),
                }
            }
            Some("dropped") => agent.dropped_notifs().values().sum::<u64>().to_string(),
            Some("fill") => {
                mem.fill(num(1)? as u8);
                "filled".to_owned()
            }
            // Whether all of our memory holds `byte`.
            Some("holds") => {
                let b = num(1)? as u8;
                (mem.to_vec().iter().all(|x| *x == b)).to_string()
            }
            _ => format!("unknown command {line:?}"),
        };
        say(&answer);
    }
    drop(reg);
    Ok(())
}
