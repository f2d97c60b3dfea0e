//! Two processes over UCX for the failure-semantics and stress tests, on the shared harness
//! `crate::two_process`: the test binary spawns itself as the target, the agents
//! exchange metadata over the side channel on 127.0.0.1, and the parent drives the target with
//! notifications. The target answers commands (checks of its memory) and counts stress
//! notifications; it never trusts timing, only what its memory and its notification queue hold.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::two_process::{self, Child, ChildEnv};
use nixl_core::backend::BackendParams;
use nixl_core::{Agent, AgentConfig, Error, HostBuffer};

pub use super::{buf, params, ucx_or_skip, unique, SHM, TCP};

/// The deadline of anything expected to succeed (generous: the machine is small and shared).
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Size of one stress slot in the target's memory (one per initiator thread).
pub const SLOT: usize = 4096;
/// u64 copies of the sequence number a stress write carries.
pub const COPIES: usize = 8;

/// How long a target lives at most (so a crashed parent never leaves it behind for long).
const LIFETIME: Duration = Duration::from_secs(600);

/// Agent config: side channel on 127.0.0.1 port 0, no agent progress thread (UCX runs its own).
pub fn config() -> AgentConfig {
    super::config(true)
}

/// A parent agent with one backend (UCX, or UCX under the fault wrapper).
pub fn parent<P: BackendParams + 'static>(role: &str, backend: P) -> Agent {
    let a = Agent::new(&unique(role), config()).expect("parent agent");
    a.create_backend(backend).expect("parent backend");
    a
}

/// Unix signals the tests send to the target.
pub mod signal {
    use crate::signal::{self as sig, Sig};

    /// Kill.
    pub const KILL: Sig = Sig::Kill;
    /// Continue a stopped process.
    pub const CONT: Sig = Sig::Cont;
    /// Stop (cannot be caught).
    pub const STOP: Sig = Sig::Stop;

    /// Sends `sig` to `pid`; whether it was delivered.
    pub fn send(pid: u32, s: Sig) -> bool {
        sig::send(pid, s).is_ok()
    }
}

/// A spawned target process (continued, killed and reaped on drop) and what its hello said.
#[derive(Debug)]
pub struct Target {
    /// The process.
    pub child: Child,
    /// Its agent's name.
    pub name: String,
    /// Start address of its registered memory.
    pub addr: u64,
    /// Its side channel.
    pub listen: SocketAddr,
    /// Its agent generation.
    pub generation: u64,
}

impl Target {
    /// Spawns `test` (the binary's child-role test) as target agent `name` over `tls` with
    /// `len` bytes of registered memory (zeroed), and waits for its hello.
    pub fn spawn(test: &str, parent: &Agent, name: &str, tls: &str, len: usize) -> Target {
        let child = Child::spawn(
            test,
            parent,
            name,
            &[("tls", tls), ("len", &len.to_string())],
        )
        .expect("spawn target");
        let mut t = Target {
            child,
            name: name.to_owned(),
            addr: 0,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            generation: 0,
        };
        let hello = t.next(parent);
        let parts: Vec<&str> = hello.split('|').collect();
        match parts.as_slice() {
            ["hello", addr, listen, generation] => {
                t.addr = addr.parse().expect("hello: address");
                t.listen = listen.parse().expect("hello: side channel");
                t.generation = generation.parse().expect("hello: generation");
            }
            _ => panic!("expected a hello from {name}, got {hello:?}"),
        }
        assert!(
            parent.check_remote_metadata(name, None),
            "target metadata loaded before its hello"
        );
        t
    }

    /// The next notification from the target (panics past [`DEADLINE`] or when the target died).
    pub fn next(&mut self, parent: &Agent) -> String {
        self.next_within(parent, DEADLINE)
            .unwrap_or_else(|e| panic!("no notification from {}: {e}", self.name))
    }

    /// The next notification from the target within `timeout`.
    pub fn next_within(&mut self, parent: &Agent, timeout: Duration) -> Result<String, String> {
        self.child
            .next(parent, timeout)
            .map(|m| String::from_utf8_lossy(&m).into_owned())
    }

    /// Sends a command and returns the reply.
    pub fn ask(&mut self, parent: &Agent, cmd: &str) -> String {
        parent
            .gen_notif(&self.name, cmd.as_bytes(), &[])
            .unwrap_or_else(|e| panic!("send {cmd:?}: {e}"));
        self.next(parent)
    }

    /// Drops the parent's view of the target and loads its metadata again over the side
    /// channel (after a cancel force-closed the endpoint, or a silent peer woke up).
    pub fn reconnect(&self, parent: &Agent) {
        parent
            .invalidate_remote_metadata(&self.name)
            .expect("invalidate");
        parent
            .fetch_remote_metadata_blocking(&self.name, self.listen, Duration::from_secs(20))
            .expect("reload the target's metadata");
    }

    /// Reconnects only when the parent's endpoint to the target no longer works (a cancel
    /// force-closed it): probes with a notification first.
    pub fn ensure_connected(&mut self, parent: &Agent) {
        match parent.gen_notif(&self.name, b"p:probe", &[]) {
            Ok(()) => assert_eq!(self.next(parent), "p:probe"),
            Err(e) => {
                eprintln!(
                    "{}: endpoint unusable ({}), reloading its metadata",
                    self.name,
                    e.kind().as_str()
                );
                self.reconnect(parent);
            }
        }
    }

    /// Asks the target to exit and waits for its status code.
    pub fn exit(&mut self, parent: &Agent) -> Option<i32> {
        let _ = parent.gen_notif(&self.name, b"exit", &[]);
        self.join(DEADLINE)
    }

    /// Waits for the process to exit; its status code (None: still running or killed).
    pub fn join(&mut self, timeout: Duration) -> Option<i32> {
        self.child.join(timeout).and_then(|st| st.code())
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        self.child.kill();
    }
}

/// Runs the target's side when this process was spawned as one; returns otherwise. Call it
/// from the `#[ignore]`d `#[test]` of the binary whose name is passed to [`Target::spawn`].
pub fn child_entry() {
    two_process::child_main(target_main);
}

/// Per-thread stress bookkeeping at the target.
#[derive(Default)]
struct Stress {
    next: HashMap<u64, u64>,
    requests: u64,
    notifs: u64,
    errors: u64,
    first_error: Option<String>,
    data_checked: u64,
    data_racing: u64,
}

struct TargetSide {
    agent: Agent,
    parent: String,
    parent_addr: SocketAddr,
    mem: Arc<HostBuffer>,
    stress: Stress,
}

impl TargetSide {
    /// Replies to the parent; if the endpoint failed (the parent force-closed or replaced
    /// its side), reloads the parent's metadata once and retries.
    fn reply(&self, msg: &str) -> Result<(), String> {
        if self
            .agent
            .gen_notif(&self.parent, msg.as_bytes(), &[])
            .is_ok()
        {
            return Ok(());
        }
        let _ = self.agent.invalidate_remote_metadata(&self.parent);
        self.agent
            .fetch_remote_metadata_blocking(&self.parent, self.parent_addr, Duration::from_secs(20))
            .map_err(|e| e.to_string())?;
        self.agent
            .gen_notif(&self.parent, msg.as_bytes(), &[])
            .map_err(|e| e.to_string())
    }

    fn range_is(&self, off: usize, len: usize, byte: u8) -> bool {
        let mut v = vec![0u8; len];
        self.mem.read_at(off, &mut v) && v == vec![byte; len]
    }

    fn stress(&mut self, msg: &str) {
        // "SR<t>:<seq>" (a request's notification) or "SN<t>:<seq>" (a standalone one).
        let st = &mut self.stress;
        let parsed = msg
            .get(2..)
            .and_then(|r| r.split_once(':'))
            .and_then(|(t, s)| Some((t.parse::<u64>().ok()?, s.parse::<u64>().ok()?)));
        let Some((t, seq)) = parsed else {
            st.errors += 1;
            st.first_error.get_or_insert(format!("malformed {msg:?}"));
            return;
        };
        let next = st.next.entry(t).or_insert(0);
        if seq != *next {
            st.errors += 1;
            st.first_error.get_or_insert(format!(
                "thread {t}: got {seq}, expected {next} (lost, duplicated or reordered)"
            ));
        }
        *next = seq + 1;
        if msg.as_bytes()[1] == b'R' {
            st.requests += 1;
            // The data arrived before its notification: the slot holds this seq or a later one
            // (the next write may be landing now; copies that disagree are that write, torn).
            let mut raw = [0u8; 8 * COPIES];
            if self.mem.read_at(t as usize * SLOT, &mut raw) {
                let words: Vec<u64> = raw
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                if words.iter().all(|w| *w == words[0]) {
                    st.data_checked += 1;
                    if words[0] < seq {
                        st.errors += 1;
                        st.first_error.get_or_insert(format!(
                            "thread {t}: notification {seq} before its data ({})",
                            words[0]
                        ));
                    }
                } else {
                    st.data_racing += 1;
                }
            }
        } else {
            st.notifs += 1;
        }
    }

    /// Handles one verified message; Ok(false) on "exit".
    fn handle(&mut self, m: &[u8]) -> Result<bool, String> {
        let msg = String::from_utf8_lossy(m);
        if msg.starts_with('S') {
            self.stress(&msg);
            return Ok(true);
        }
        let parts: Vec<&str> = msg.split(':').collect();
        let num = |i: usize| -> Result<usize, String> {
            parts
                .get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad command {msg:?}"))
        };
        match parts[0] {
            "exit" => return Ok(false),
            // Is every one of n equal regions uniform? Its byte, or '?'.
            "uniform" => {
                let n = num(1)?.max(1);
                let len = self.mem.len() / n;
                let mut out = Vec::with_capacity(n);
                for r in 0..n {
                    let mut first = [0u8; 1];
                    self.mem.read_at(r * len, &mut first);
                    out.push(if self.range_is(r * len, len, first[0]) {
                        first[0].to_string()
                    } else {
                        "?".to_owned()
                    });
                }
                self.reply(&format!("uniform:{}", out.join(",")))?;
            }
            // Does any byte of memory equal b?
            "has" => {
                let b = num(1)? as u8;
                let mut found = false;
                let mut chunk = vec![0u8; 16 << 20];
                let mut off = 0;
                while off < self.mem.len() && !found {
                    let n = chunk.len().min(self.mem.len() - off);
                    self.mem.read_at(off, &mut chunk[..n]);
                    found = chunk[..n].contains(&b);
                    off += n;
                }
                self.reply(&format!("has:{b}:{found}"))?;
            }
            // A data notification: the range must hold byte b.
            "d" => {
                let (i, b, off, len) = (num(1)?, num(2)? as u8, num(3)?, num(4)?);
                let ok = if self.range_is(off, len, b) {
                    "intact"
                } else {
                    "bad"
                };
                self.reply(&format!("ok:{i}:{ok}"))?;
            }
            "p" => self.reply(&msg)?,
            "stress-end" => {
                let st = &self.stress;
                let reply = format!(
                    "stress|{}|{}|{}|{}|{}|{}",
                    st.requests,
                    st.notifs,
                    st.errors,
                    st.data_checked,
                    st.data_racing,
                    st.first_error.clone().unwrap_or_default()
                );
                self.stress = Stress::default();
                self.reply(&reply)?;
            }
            _ => self.reply(&format!("echo:{msg}"))?,
        }
        Ok(true)
    }
}

fn target_main(env: ChildEnv) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let (tls, len): (String, usize) = (env.var("tls")?, env.parse("len")?);
    // The target verifies integrity frames (the corruption tests ask for them).
    let agent = Agent::new(&env.name, config().verify_integrity(true)).map_err(e)?;
    agent.create_backend(params(&tls)).map_err(e)?;
    let mem = buf(len);
    let _reg = agent.register_mem(vec![mem.clone()], &[]).map_err(e)?;
    env.connect(&agent, Duration::from_secs(20))?;
    let (parent, parent_addr) = (env.parent.clone(), env.parent_addr);
    let listen = agent.listen_addr().ok_or("no side channel")?;
    let mut side = TargetSide {
        agent,
        parent,
        parent_addr,
        mem,
        stress: Stress::default(),
    };
    side.reply(&format!(
        "hello|{}|{listen}|{}",
        side.mem.addr(),
        side.agent.generation()
    ))?;
    let end = Instant::now() + LIFETIME;
    while Instant::now() < end {
        if !env.parent_alive() {
            return Err("the parent test process died".into());
        }
        let got = side.agent.wait_notifs(Duration::from_millis(200));
        let msgs = match got {
            Ok(mut n) => n.remove(&side.parent).unwrap_or_default(),
            Err(Error::Corrupt { .. }) => Vec::new(),
            Err(other) => return Err(other.to_string()),
        };
        for m in msgs {
            if !side.handle(&m)? {
                return Ok(());
            }
        }
        // Notifications whose integrity check failed: report which ones.
        for (err, msg) in side.agent.take_integrity_failures() {
            if !matches!(err, Error::Corrupt { .. }) {
                return Err(format!("integrity failure is not Corrupt: {err}"));
            }
            let msg = String::from_utf8_lossy(&msg).into_owned();
            let i = msg.split(':').nth(1).unwrap_or("?").to_owned();
            side.reply(&format!("corrupt:{i}"))?;
        }
    }
    Err("no exit message within the target's lifetime".into())
}
