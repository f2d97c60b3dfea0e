//! Posts to shm peers that die: never post to a peer whose process exited, and free a post
//! that spins on the lock a dead peer left held.
//!
//! libfabric's shm provider queues a command to a peer under the lock in the peer's region,
//! which the peer holds while it copies RMA data (see `crate::sys::region_lock`). A peer killed
//! inside that leaves the lock held for good; a post already spinning on it, or made before
//! the exit shows, never returns and holds the rail's endpoint lock. Each post to an shm peer
//! goes through its [`ShmGuard`]: refused once the peer's process has exited (the process the
//! agent bound from its metadata), and marked while it runs; the backend's watchdog thread
//! releases the lock of a peer whose process has exited when a marked post has lasted
//! [`STUCK`]. The post then queues its command into the dead region and returns; the operation
//! never completes and is orphaned (`XferCore::orphaned`).
//!
//! What is left: a peer that dies while it holds *this* agent's region lock (it takes it only
//! to queue a command to this agent: a notification or a hello, microseconds) stops this
//! agent's shm progress: nothing tells which peer holds it. And a third process preempted for
//! [`STUCK`] inside its own post to the dead peer may share the dead region's queue with the
//! post the watchdog freed (only the dead region's structures are at stake).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use nixl_core::backend::PeerProcess;

use crate::rail::RailCounters;
use crate::sys::region_lock::RegionLock;

/// How long a post to a peer whose process exited may spin before its lock is released.
pub(crate) const STUCK: Duration = Duration::from_millis(50);
/// How often the watchdog looks.
const EVERY: Duration = Duration::from_millis(10);

/// One shm peer endpoint's region lock, its owner's process and the posts in progress to it.
pub(crate) struct ShmGuard {
    lock: Option<RegionLock>,
    process: PeerProcess,
    /// Odd while a post runs (posts to one endpoint are serialized by the rail's lock).
    posting: AtomicU64,
    /// Set by the watchdog once the owner's process has exited: what a post reads (one load,
    /// not a `poll` of the pidfd per operation).
    dead: AtomicBool,
    /// The post the watchdog saw running: its mark and since when.
    seen: Mutex<Option<(u64, Instant)>>,
    /// The rail's counters (releases are counted there).
    counters: Arc<RailCounters>,
}

/// Marks a post to a peer as running while it lives.
pub(crate) struct Posting<'a>(&'a ShmGuard);

impl Drop for Posting<'_> {
    fn drop(&mut self) {
        self.0.posting.fetch_add(1, Ordering::SeqCst);
    }
}

impl ShmGuard {
    pub(crate) fn new(
        lock: Option<RegionLock>,
        process: PeerProcess,
        counters: Arc<RailCounters>,
    ) -> Self {
        ShmGuard {
            lock,
            process,
            posting: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            seen: Mutex::new(None),
            counters,
        }
    }

    /// Marks a post as running; `None` (post nothing) once the watchdog saw the peer's process
    /// exit (within [`EVERY`] of it; a post in between that spins is freed as below).
    pub(crate) fn enter(&self) -> Option<Posting<'_>> {
        if self.dead.load(Ordering::SeqCst) {
            return None;
        }
        self.posting.fetch_add(1, Ordering::SeqCst);
        Some(Posting(self))
    }

    /// Whether a post now would spin on the peer's region lock inside libfabric: the lock is
    /// held and its holder's process is alive (a stopped or stalled peer holds it as long as
    /// it is stopped; a dead holder's lock is the watchdog's). The post waits outside instead:
    /// its caller retries, bounded by `op_timeout` (a send) or the request's deadline (RMA).
    /// A holder that takes the lock between this look and the post still makes the post wait
    /// for it, as before.
    pub(crate) fn held_by_live_peer(&self) -> bool {
        !self.dead.load(Ordering::SeqCst) && self.lock.as_ref().is_some_and(RegionLock::is_held)
    }

    /// One look of the watchdog: releases the lock for a post that has run [`STUCK`] to a
    /// peer whose process exited.
    fn look(&self, now: Instant) {
        if !self.dead.load(Ordering::SeqCst) && self.process.exited() {
            self.dead.store(true, Ordering::SeqCst);
        }
        let mark = self.posting.load(Ordering::SeqCst);
        let mut seen = self.seen.lock();
        if mark.is_multiple_of(2) {
            *seen = None;
            return;
        }
        match *seen {
            Some((m, since)) if m == mark => {
                if now.duration_since(since) < STUCK || !self.dead.load(Ordering::SeqCst) {
                    return;
                }
                let Some(lock) = &self.lock else {
                    return;
                };
                tracing::warn!(
                    pid = self.process.pid(),
                    "a post spins on the shm region lock of a peer that exited holding it; releasing it"
                );
                lock.release_for_dead_holder();
                self.counters
                    .dead_locks_released
                    .fetch_add(1, Ordering::Relaxed);
                // Looked at afresh: the same post is released again only after another STUCK.
                *seen = Some((mark, now));
            }
            _ => *seen = Some((mark, now)),
        }
    }
}

/// The backend's shm guards and the thread that watches them.
#[derive(Default)]
pub(crate) struct Watchdog {
    guards: Mutex<Vec<Weak<ShmGuard>>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Watchdog {
    /// Watches `guard` from now on (the thread starts with the first).
    pub(crate) fn watch(self: &Arc<Self>, agent: &str, guard: &Arc<ShmGuard>) {
        {
            let mut g = self.guards.lock();
            g.retain(|w| w.strong_count() > 0);
            g.push(Arc::downgrade(guard));
        }
        let mut t = self.thread.lock();
        if t.is_none() {
            let me = Arc::downgrade(self);
            let stop = self.stop.clone();
            *t = std::thread::Builder::new()
                .name(format!("nixl-lf-watch-{agent}"))
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(EVERY);
                        let Some(w) = me.upgrade() else { return };
                        w.look_all();
                    }
                })
                .map_err(|e| tracing::warn!(error = %e, "no watchdog thread for shm peers"))
                .ok();
        }
    }

    fn look_all(&self) {
        let guards: Vec<Arc<ShmGuard>> = self
            .guards
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let now = Instant::now();
        for g in guards {
            g.look(now);
        }
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// Over shm, with the peer's process bound: a guard per rail for the posts to the peer whose
/// endpoint `names` gives, each watched. Refused where a region cannot be mapped or names
/// another process.
pub(crate) fn guards(
    inner: &crate::backend::Inner,
    remote: &str,
    names: &[Vec<u8>],
    process: Option<&PeerProcess>,
) -> nixl_core::Result<Vec<Option<Arc<ShmGuard>>>> {
    let Some(process) = process.filter(|_| crate::validate::is_shm(&inner.provider)) else {
        return Ok(Vec::new());
    };
    let mut guards = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let lock = crate::validate::shm_region_path(name)
            .and_then(|path| RegionLock::open(&path, process.pid()))
            .map_err(|e| {
                nixl_core::Error::invalid(
                    &inner.agent,
                    nixl_core::Op::LoadMetadata,
                    format!("refused an endpoint name of {remote} (rail {i}): {e}"),
                )
            })?;
        let guard = Arc::new(ShmGuard::new(
            lock,
            process.clone(),
            inner.rails[i].counters.clone(),
        ));
        inner.watchdog.watch(&inner.agent, &guard);
        guards.push(Some(guard));
    }
    Ok(guards)
}

/// Removes, the first time this process opens an shm rail, the region files of libfabric's
/// shm provider (`/dev/shm/<pid>:<uid>:<n>`) named for this process's pid: a dead process's
/// whose pid this one reuses (a process killed before it closed its endpoint leaves its region
/// for good), and the provider refuses to create a region whose name exists (the rail failed
/// with `fi_enable` EBUSY). This process has made none yet, so every such file is a dead one's.
/// Only files whose header names that pid (libfabric's regions) are removed. Regions of other
/// pids stay: a pid this process cannot see may be a live process of another pid namespace
/// sharing `/dev/shm`. Returns how many it removed.
pub(crate) fn reap_reused_pid_regions() -> usize {
    static OWN: std::sync::Once = std::sync::Once::new();
    let mut n = 0;
    OWN.call_once(|| n = reap_in(std::path::Path::new(SHM_DIR), std::process::id()));
    n
}

const SHM_DIR: &str = "/dev/shm";

/// Removes libfabric's shm region files in `dir` named for `pid` (and whose header says so).
fn reap_in(dir: &std::path::Path, pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    // Bounded: a directory listing ends.
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_str().and_then(region_pid) != Some(pid) {
            continue;
        }
        if header_pid(&e.path()) == Some(pid) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, pid, "removed shm regions a dead process left");
    }
    removed
}

/// The pid of a name of libfabric's shm regions (`<pid>:<uid>:<n>`, decimal).
fn region_pid(name: &str) -> Option<u32> {
    let mut parts = name.split(':');
    let pid = parts.next()?.parse().ok()?;
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let (a, b) = (parts.next()?, parts.next()?);
    (digits(a) && digits(b) && parts.next().is_none()).then_some(pid)
}

/// The owner pid a region's header names (`int pid` at byte 4).
fn header_pid(path: &std::path::Path) -> Option<u32> {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    u32::try_from(i32::from_ne_bytes(head[4..8].try_into().ok()?)).ok()
}

#[cfg(test)]
mod reap_tests {
    use super::*;

    fn region(dir: &std::path::Path, name: &str, pid: u32) -> std::path::PathBuf {
        let mut head = vec![0u8; 64];
        head[0] = 3;
        head[4..8].copy_from_slice(&(pid as i32).to_ne_bytes());
        let p = dir.join(name);
        std::fs::write(&p, head).unwrap();
        p
    }

    #[test]
    fn only_regions_named_and_headed_for_the_pid_are_removed() {
        let dir = std::env::temp_dir().join(format!("nixl-reap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid = 4_000_001;
        let stale = [
            region(&dir, &format!("{pid}:0:0"), pid),
            region(&dir, &format!("{pid}:0:3"), pid),
        ];
        let other = region(&dir, &format!("{}:0:0", pid + 1), pid + 1);
        let headed_else = region(&dir, &format!("{pid}:0:1"), pid + 1);
        let odd = region(&dir, &format!("{pid}:x:1"), pid);
        assert_eq!(reap_in(&dir, pid), 2);
        assert!(stale.iter().all(|p| !p.exists()));
        assert!(other.exists() && headed_else.exists() && odd.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
