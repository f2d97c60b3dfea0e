//! Whether a peer on this host is still running, independent of any transport.
//!
//! Metadata carries its agent's [`ProcessId`] (boot id, pid namespace, pid, start time). A
//! loading agent on the same boot and in the same pid namespace opens a pidfd for it (after
//! checking the start time, so a reused pid is not mistaken for the peer) and from then on
//! learns of its exit with one non-blocking poll: shared memory transports, which have no
//! connection to lose, then report a dead peer as `RemoteDisconnect` like tcp does.
//!
//! The hot path (every post, every `gen_notif`) asks [`ProcessWatch::exited_lately`], which
//! polls at most once per [`POLL_EVERY`] and takes the clock reading the post makes anyway: one syscall per post costs as much as a small
//! transfer itself (a 4 KiB READ over CMA is about 1.5 us).

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, Pid, PidfdFlags};

/// Which process an agent runs in, as its metadata announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// `/proc/sys/kernel/random/boot_id`: the host's boot.
    pub boot_id: [u8; 16],
    /// Inode of `/proc/self/ns/pid`: the pid namespace.
    pub pid_ns: u64,
    /// The pid within that namespace.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks after boot): tells a reused pid apart.
    pub start_time: u64,
}

fn boot_id() -> Option<[u8; 16]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = s.trim().bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(std::str::from_utf8(&hex[2 * i..2 * i + 2]).ok()?, 16).ok()?;
    }
    Some(out)
}

/// The start time of `pid` (from `/proc/<pid>/stat`), if it exists.
pub(crate) fn start_time(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields follow the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The thread group (process) `id` belongs to, from `/proc/<id>/status`.
fn tgid(id: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{id}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

impl ProcessId {
    /// This process, when `/proc` tells (`None` otherwise: peers then rely on their
    /// transports alone).
    /// Read from `/proc` once per process (a forked child, whose pid differs, reads again).
    pub fn current() -> Option<Self> {
        static ME: std::sync::OnceLock<Option<ProcessId>> = std::sync::OnceLock::new();
        match *ME.get_or_init(Self::read_current) {
            Some(id) if id.pid == std::process::id() => Some(id),
            _ => Self::read_current(),
        }
    }

    fn read_current() -> Option<Self> {
        Some(ProcessId {
            boot_id: boot_id()?,
            pid_ns: std::fs::metadata("/proc/self/ns/pid").ok()?.ino(),
            pid: std::process::id(),
            start_time: start_time("self")?,
        })
    }
}

impl ProcessId {
    /// The pid of this process on this host, when it runs here: the same boot and pid
    /// namespace as the calling process, and `/proc/<pid>` showing the announced start time
    /// (so an exited peer whose pid was reused is not mistaken for it). `None` otherwise.
    /// Checked once, when asked: a caller keeping the pid must learn of the exit another way
    /// (the agent watches same-host peers with a pidfd).
    pub fn local_pid(&self) -> Option<u32> {
        let me = Self::current()?;
        if self.boot_id != me.boot_id || self.pid_ns != me.pid_ns || self.pid == 0 {
            return None;
        }
        (start_time(&self.pid.to_string())? == self.start_time).then_some(self.pid)
    }
}

/// How stale [`ProcessWatch::exited_lately`] may be: a peer that exited less than this ago
/// may still look alive (its transport then reports the failure, or the next check does).
pub(crate) const POLL_EVERY: Duration = Duration::from_micros(200);

/// Nanoseconds from a process-wide anchor to `now` (never 0).
fn ns_at(now: Instant) -> u64 {
    static ANCHOR: OnceLock<Instant> = OnceLock::new();
    let anchor = *ANCHOR.get_or_init(Instant::now);
    u64::try_from(now.saturating_duration_since(anchor).as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// Why a peer's announced process is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It has exited (or its pid now names another process).
    Exited(&'static str),
    /// The announcement cannot name a process of this host (a thread id, a bad pid).
    Invalid(&'static str),
}

/// A watch on a peer's process (a pidfd).
#[derive(Debug)]
pub(crate) struct ProcessWatch {
    id: ProcessId,
    fd: OwnedFd,
    /// Seen exited (final).
    gone: AtomicBool,
    /// [`now_ns`] of the last poll (0: never polled).
    polled: AtomicU64,
}

impl ProcessWatch {
    /// Watches `peer` when it runs on this boot in this pid namespace (`Ok(None)` when it
    /// does not, or when this process cannot tell). Refused when it has already exited, or
    /// when its pid is not a process's (a thread id: `pidfd_open` takes thread-group leaders
    /// only).
    pub(crate) fn open(peer: &ProcessId, me: Option<&ProcessId>) -> Result<Option<Self>, Refused> {
        let Some(me) = me else { return Ok(None) };
        if peer.boot_id != me.boot_id || peer.pid_ns != me.pid_ns {
            return Ok(None);
        }
        let Some(pid) = i32::try_from(peer.pid).ok().and_then(Pid::from_raw) else {
            return Err(Refused::Invalid("its process id is not valid here"));
        };
        let fd = match pidfd_open(pid, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::SRCH) => return Err(Refused::Exited("its process has exited")),
            // A thread that is not its group's leader: EINVAL before Linux 6.9, ENOENT after.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {
                return Err(Refused::Invalid(
                    "its process id names a thread, not a process",
                ))
            }
            // No pidfd support (old kernel) or not allowed: no watch.
            Err(_) => return Ok(None),
        };
        // Checked after opening: a match means the pidfd refers to the process the metadata
        // names (had the pid been reused in between, the start time would differ).
        if tgid(peer.pid).is_some_and(|t| t != peer.pid) {
            return Err(Refused::Invalid(
                "its process id names a thread, not a process",
            ));
        }
        match start_time(&peer.pid.to_string()) {
            Some(t) if t == peer.start_time => Ok(Some(ProcessWatch {
                id: *peer,
                fd,
                gone: AtomicBool::new(false),
                polled: AtomicU64::new(0),
            })),
            Some(_) => Err(Refused::Exited(
                "its process has exited (the pid now belongs to another process)",
            )),
            None => Err(Refused::Exited("its process has exited")),
        }
    }

    /// Whether the process has exited (a pidfd turns readable then). Never blocks.
    pub(crate) fn exited(&self) -> bool {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let gone = matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0);
        if gone {
            self.gone.store(true, Ordering::Release);
        }
        gone
    }

    /// [`ProcessWatch::exited`], polling at most once per [`POLL_EVERY`] (in between it answers
    /// from the last poll). `now` is the caller's clock reading (a post reads the clock anyway;
    /// this saves reading it again). Never blocks.
    pub(crate) fn exited_lately(&self, now: Instant) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return true;
        }
        let now = ns_at(now);
        let last = self.polled.load(Ordering::Relaxed);
        let every = u64::try_from(POLL_EVERY.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < every {
            return false;
        }
        self.polled.store(now, Ordering::Relaxed);
        self.exited()
    }
}

/// A peer's process on this host, bound once: a pidfd opened for the process the peer's
/// metadata names (its start time checked after opening, so a reused pid is never it; a
/// thread id is refused). The agent opens it when it loads a same-host peer, watches it for
/// the peer's exit, and hands it to backends ([`crate::backend::PeerBackend::connect_peer`]):
/// one that copies into the peer's memory itself (UCX's direct CMA) aims at
/// [`PeerProcess::pid`] only while [`PeerProcess::exited`] says no, so copies to a process
/// that exited fail, whatever reuses its pid.
#[derive(Debug, Clone)]
pub struct PeerProcess(std::sync::Arc<ProcessWatch>);

impl PeerProcess {
    /// Binds the process `id` names, when it runs on this boot in this pid namespace
    /// (`Ok(None)` otherwise, or where pidfds are not available). `Err` with the reason when
    /// it has exited or `id` names no process (a thread id).
    pub fn open(id: &ProcessId) -> std::result::Result<Option<Self>, &'static str> {
        match ProcessWatch::open(id, ProcessId::current().as_ref()) {
            Ok(w) => Ok(w.map(Self::from_watch)),
            Err(Refused::Exited(why) | Refused::Invalid(why)) => Err(why),
        }
    }

    pub(crate) fn from_watch(w: ProcessWatch) -> Self {
        PeerProcess(std::sync::Arc::new(w))
    }

    pub(crate) fn watch(&self) -> &ProcessWatch {
        &self.0
    }

    /// The process as its metadata announced it (start time checked).
    pub fn id(&self) -> &ProcessId {
        &self.0.id
    }

    /// Its pid (a thread-group leader of this pid namespace).
    pub fn pid(&self) -> u32 {
        self.0.id.pid
    }

    /// Whether it is the calling process.
    pub fn is_this_process(&self) -> bool {
        self.0.id.pid == std::process::id()
    }

    /// Whether it has exited (one non-blocking `poll` of the pidfd). Once it has, its pid
    /// may name another process: nothing may be aimed at [`PeerProcess::pid`] any more.
    pub fn exited(&self) -> bool {
        self.0.exited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_a_child_until_it_exits() {
        let me = ProcessId::current().expect("this host has /proc");
        assert!(ProcessWatch::open(&me, Some(&me))
            .unwrap()
            .is_some_and(|w| !w.exited()));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let id = ProcessId {
            pid: child.id(),
            start_time: start_time(&child.id().to_string()).unwrap(),
            ..me
        };
        let w = ProcessWatch::open(&id, Some(&me)).unwrap().unwrap();
        assert!(!w.exited());
        assert!(!w.exited_lately(Instant::now()));
        child.kill().unwrap();
        child.wait().unwrap();
        // The lazy form answers from its last poll for up to POLL_EVERY, then polls.
        std::thread::sleep(POLL_EVERY * 2);
        assert!(w.exited_lately(Instant::now()));
        assert!(w.exited());
        assert!(ProcessWatch::open(&id, Some(&me)).is_err(), "exited");
        // A pid with another start time is not the peer; another boot is not watched.
        let wrong = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(ProcessWatch::open(&wrong, Some(&me)).is_err());
        let elsewhere = ProcessId {
            boot_id: [0; 16],
            ..me
        };
        assert!(ProcessWatch::open(&elsewhere, Some(&me)).unwrap().is_none());
        // Only a live process of this host, with its own start time, has a local pid.
        assert_eq!(me.local_pid(), Some(std::process::id()));
        assert_eq!(id.local_pid(), None, "exited");
        assert_eq!(wrong.local_pid(), None, "another start time");
        assert_eq!(elsewhere.local_pid(), None, "another boot");
        let other_ns = ProcessId {
            pid_ns: me.pid_ns ^ 1,
            ..me
        };
        assert_eq!(other_ns.local_pid(), None, "another pid namespace");
    }
}
