//! A two-process test harness: a test binary spawns itself as a child agent (running one
//! `#[ignore]`d entry-point test of the same binary), the two agents exchange metadata over
//! the parent's side channel, and the parent reads the child's notifications. For this
//! crate's tests and for users' own.
//!
//! Parent side: [`Child::spawn`] (the parent agent must listen: `AgentConfig::listen`), then
//! [`Child::next`] / [`Child::ask`] for the child's notifications (each bounded by a timeout,
//! and failing at once when the child exited), [`Child::signal`] to stop, continue or kill it,
//! [`Child::join`] for its exit status. Dropping a [`Child`] continues, kills and reaps it.
//!
//! Child side: the entry-point test calls [`child_main`], which returns at once unless this
//! process was spawned as a child; then it runs the closure with the [`ChildEnv`] (names, the
//! parent's side channel, the variables the parent passed) and exits the process with 0, or 2
//! after printing the closure's error. [`ChildEnv::connect`] loads the parent's metadata and
//! pushes the child's, so the child is known to the parent before its first notification.
//!
//! ```no_run
//! use std::time::Duration;
//! use nixl_testkit::two_process::{child_main, Child};
//! use nixl_core::{Agent, AgentConfig, InprocParams};
//!
//! #[test]
//! #[ignore = "child process entry point: spawned (with --ignored) by a parent test"]
//! fn child_role() {
//!     child_main(|env| {
//!         let a = Agent::new(&env.name, AgentConfig::default().listen(true))
//!             .map_err(|e| e.to_string())?;
//!         // a.create_backend(...) with a backend that crosses processes, register memory ...
//!         env.connect(&a, Duration::from_secs(20))?;
//!         a.gen_notif(&env.parent, format!("hello {}", env.var("greeting")?).as_bytes(), &[])
//!             .map_err(|e| e.to_string())
//!     });
//! }
//!
//! #[test]
//! fn parent() {
//!     let p = Agent::new("parent", AgentConfig::default().listen(true)).unwrap();
//!     let mut c = Child::spawn("child_role", &p, "child-1", &[("greeting", "world")]).unwrap();
//!     assert_eq!(c.next(&p, Duration::from_secs(60)).unwrap(), b"hello world");
//!     assert_eq!(c.join(Duration::from_secs(60)).and_then(|s| s.code()), Some(0));
//! }
//! # fn main() {}
//! ```

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::signal::{self, Sig};
use nixl_core::Agent;

/// Environment variable naming the child agent (set only in a spawned child).
pub const ENV_CHILD: &str = "NIXL_TEST_CHILD";
const ENV_PARENT: &str = "NIXL_TEST_CHILD_PARENT";
const ENV_PARENT_ADDR: &str = "NIXL_TEST_CHILD_PARENT_ADDR";
const ENV_VAR_PREFIX: &str = "NIXL_TEST_CHILD_VAR_";

/// Notifications drained from an agent but not yet consumed, per (agent, sender): one drain
/// may return several messages and messages of several senders; none may be lost.
type Mailbox = HashMap<(String, String), VecDeque<Vec<u8>>>;
static MAILBOX: Mutex<Option<Mailbox>> = Mutex::new(None);

/// The next notification `agent` received from `from`, waiting up to `timeout`; messages
/// from other senders drained meanwhile are kept for them. `alive` is asked between waits and
/// ends the wait with its error (a child that exited).
pub fn next_notif(
    agent: &Agent,
    from: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<Vec<u8>, String> {
    let key = (agent.name().to_owned(), from.to_owned());
    let end = Instant::now() + timeout;
    loop {
        if let Some(m) = MAILBOX
            .lock()
            .as_mut()
            .and_then(|b| b.get_mut(&key))
            .and_then(VecDeque::pop_front)
        {
            return Ok(m);
        }
        if Instant::now() >= end {
            return Err(format!("no notification from {from} within {timeout:?}"));
        }
        alive()?;
        let got = agent
            .wait_notifs(Duration::from_millis(100))
            .map_err(|e| format!("wait_notifs: {e}"))?;
        let mut mb = MAILBOX.lock();
        let mb = mb.get_or_insert_with(HashMap::new);
        for (sender, msgs) in got {
            mb.entry((agent.name().to_owned(), sender))
                .or_default()
                .extend(msgs);
        }
    }
}

/// A spawned child process (continued, killed and reaped on drop).
#[derive(Debug)]
pub struct Child {
    process: std::process::Child,
    name: String,
}

impl Child {
    /// Spawns this test binary again, running only the `#[ignore]`d test `entry` (exact name,
    /// with `--ignored --nocapture --test-threads=1`), as child agent `name` of `parent` (which
    /// must listen on its side channel); `vars` reach it as [`ChildEnv::var`]. The child's
    /// stdout is discarded, its stderr inherited.
    pub fn spawn(
        entry: &str,
        parent: &Agent,
        name: &str,
        vars: &[(&str, &str)],
    ) -> std::io::Result<Child> {
        Self::spawn_as(entry, parent, name, vars, None)
    }

    /// [`Child::spawn`] as user `uid` (with its own group) when given: a process of another
    /// user, which needs this one to be root.
    pub fn spawn_as(
        entry: &str,
        parent: &Agent,
        name: &str,
        vars: &[(&str, &str)],
        uid: Option<u32>,
    ) -> std::io::Result<Child> {
        let addr = parent.listen_addr().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the parent agent does not listen on a side channel",
            )
        })?;
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            entry,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_CHILD, name)
        .env(ENV_PARENT, parent.name())
        .env(ENV_PARENT_ADDR, addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        for (k, v) in vars {
            cmd.env(format!("{ENV_VAR_PREFIX}{k}"), v);
        }
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        Ok(Child {
            process: cmd.spawn()?,
            name: name.to_owned(),
        })
    }

    /// The child's agent name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.process.id()
    }

    /// Whether it is still running; its exit status once it ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.process.try_wait().ok().flatten()
    }

    /// The next notification from the child to `parent` within `timeout`; an error at once
    /// when the child exited.
    pub fn next(&mut self, parent: &Agent, timeout: Duration) -> Result<Vec<u8>, String> {
        let name = self.name.clone();
        next_notif(parent, &name, timeout, || match self.try_wait() {
            Some(st) => Err(format!("{name} exited: {st}")),
            None => Ok(()),
        })
    }

    /// Sends `msg` to the child and returns its next notification (within `timeout`).
    pub fn ask(
        &mut self,
        parent: &Agent,
        msg: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        parent
            .gen_notif(&self.name, msg, &[])
            .map_err(|e| format!("notify {}: {e}", self.name))?;
        self.next(parent, timeout)
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: Sig) -> std::io::Result<()> {
        signal::send(self.process.id(), sig)
    }

    /// Waits up to `timeout` for the child to exit; its status (`None`: still running).
    pub fn join(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the child (SIGKILL, also when stopped) and reaps it, and removes the shm regions
    /// libfabric's shm provider made for it (`/dev/shm/<pid>:<uid>:<n>`, 16 MiB each): a killed
    /// process never closes its endpoint, and its regions would stay until the machine
    /// restarts.
    pub fn kill(&mut self) {
        let pid = self.process.id();
        let _ = self.process.kill();
        let _ = self.process.wait();
        remove_shm_regions(pid);
    }
}

/// Removes the files in `/dev/shm` named as libfabric's shm regions of process `pid`.
fn remove_shm_regions(pid: u32) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let prefix = format!("{pid}:");
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let mut parts = rest.split(':');
        let numeric = |p: Option<&str>| {
            p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        };
        if numeric(parts.next()) && numeric(parts.next()) && parts.next().is_none() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.signal(Sig::Cont);
            self.kill();
        }
    }
}

/// What a spawned child knows from its parent.
#[derive(Debug, Clone)]
pub struct ChildEnv {
    /// The child's agent name.
    pub name: String,
    /// The parent's agent name.
    pub parent: String,
    /// The parent's side channel.
    pub parent_addr: SocketAddr,
    parent_pid: u32,
}

impl ChildEnv {
    /// This process's child environment, if it was spawned by [`Child::spawn`].
    pub fn get() -> Option<Result<ChildEnv, String>> {
        let name = std::env::var(ENV_CHILD).ok()?;
        let read = || -> Result<ChildEnv, String> {
            let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} not set"));
            Ok(ChildEnv {
                name,
                parent: var(ENV_PARENT)?,
                parent_addr: var(ENV_PARENT_ADDR)?
                    .parse()
                    .map_err(|_| format!("bad {ENV_PARENT_ADDR}"))?,
                parent_pid: std::os::unix::process::parent_id(),
            })
        };
        Some(read())
    }

    /// A variable the parent passed to [`Child::spawn`].
    pub fn var(&self, key: &str) -> Result<String, String> {
        std::env::var(format!("{ENV_VAR_PREFIX}{key}"))
            .map_err(|_| format!("the parent passed no {key}"))
    }

    /// A variable the parent passed, parsed.
    pub fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<T, String> {
        self.var(key)?
            .parse()
            .map_err(|_| format!("the parent passed a malformed {key}"))
    }

    /// Loads the parent's metadata over its side channel and pushes this agent's, so the
    /// parent knows the child before its first notification arrives.
    pub fn connect(&self, agent: &Agent, timeout: Duration) -> Result<(), String> {
        agent
            .fetch_remote_metadata_blocking(&self.parent, self.parent_addr, timeout)
            .map_err(|e| format!("fetching the parent's metadata: {e}"))?;
        agent
            .send_local_metadata(self.parent_addr)
            .map_err(|e| format!("sending metadata to the parent: {e}"))
    }

    /// Whether the parent that spawned this process is still alive (a child whose parent
    /// died should exit rather than linger).
    pub fn parent_alive(&self) -> bool {
        std::os::unix::process::parent_id() == self.parent_pid
    }
}

/// The body of a child entry-point test: returns at once unless this process was spawned by
/// [`Child::spawn`]; otherwise runs `f` and exits the process (0 on `Ok`, 2 after printing the
/// error), so the entry point never reports as a test result.
pub fn child_main(f: impl FnOnce(ChildEnv) -> Result<(), String>) {
    let Some(env) = ChildEnv::get() else {
        return;
    };
    let outcome = env.and_then(f);
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("child failed: {e}");
            std::process::exit(2)
        }
    }
}
