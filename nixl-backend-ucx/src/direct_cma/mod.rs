//! Direct CMA: same-host copies without UCX's per-operation layers.
//!
//! Between two processes of one host UCX moves host memory with its `cma` transport: one
//! `process_vm_writev` (or `process_vm_readv`) system call per put or get. Where UCX chose
//! that transport for a peer's endpoint (its lanes name `cma/`), the peer announced its
//! process in its connection info, and that process is alive on this host
//! ([`nixl_core::backend::ProcessId::local_pid`]), the backend issues the same copies itself, up to
//! [`IOV_MAX`] segments per call: a request of 32 blocks of 4 KiB costs one system call
//! instead of 32. Nothing else changes: the copies are complete when the call returns, and the
//! notification then goes out on the peer's endpoint as before, so it still follows its data.
//! [`UcxParams::direct_cma`](crate::UcxParams::direct_cma) turns it off; the path report says
//! which was used (`direct CMA`).
//!
//! Trust: the target is the process the agent bound when it loaded the peer
//! ([`nixl_core::backend::PeerProcess`]: a pidfd of the thread-group leader its metadata names, start
//! time checked, never this process unless the caller allows it), and the peer's UCX connection
//! info must name the same one. Every system call is preceded by a check of that pidfd: once the
//! process has exited, copies fail with `ESRCH` (`RemoteDisconnect`) whatever reuses its pid.
//! The remote ranges are the ones the agent checked against the peer's regions. A range the
//! peer does not have mapped is an error (`EFAULT`), never a fault here.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use nixl_core::{Error, Op};

use crate::sys::cma::{copy, IoVec, IOV_MAX};
use crate::work::Work;

mod flight;
mod pool;

pub(crate) use flight::{Flight, CHECK_PIECES};
pub(crate) use pool::{split, CopyPool, INLINE_BYTES};

/// The peer's process, bound: copies go to it only while it has not exited and the peer was
/// not forgotten. Shared by every request to the peer.
#[derive(Debug, Clone)]
pub(crate) struct Target(Arc<Gate>);

#[derive(Debug)]
struct Gate {
    process: nixl_core::backend::PeerProcess,
    /// Set when the peer is forgotten (disconnect): no copy starts any more.
    revoked: AtomicBool,
    /// System calls to the process under way.
    active: AtomicUsize,
}

/// `ECANCELED`: the copy was not made because the peer was forgotten.
pub(crate) const REVOKED: i32 = 125;

impl Target {
    /// Copies go to `process`.
    pub(crate) fn new(process: nixl_core::backend::PeerProcess) -> Self {
        Target(Arc::new(Gate {
            process,
            revoked: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        }))
    }

    /// [`copy`] to the bound process: refused with `ESRCH` once it has exited (its pid may
    /// then name another process) and with `ECANCELED` once the peer was forgotten
    /// ([`Target::revoke`]).
    pub(crate) fn copy(&self, write: bool, local: &[IoVec], remote: &[IoVec]) -> io::Result<()> {
        let g = &self.0;
        // Counted before the check: `revoke` sets the flag, then waits for the count, so a
        // copy either sees the flag or is waited for (both SeqCst).
        g.active.fetch_add(1, Ordering::SeqCst);
        let r = if g.revoked.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(REVOKED))
        } else if g.process.exited() {
            Err(io::Error::from_raw_os_error(3)) // ESRCH
        } else {
            copy(g.process.pid(), write, local, remote)
        };
        g.active.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// No copy starts from now on, and the ones under way have ended when this returns (each
    /// is one system call over at most a piece, or a request of up to [`INLINE_BYTES`]):
    /// once a forgotten peer's disconnect returns, no byte of its requests lands.
    pub(crate) fn revoke(&self) {
        let g = &self.0;
        g.revoked.store(true, Ordering::SeqCst);
        let start = std::time::Instant::now();
        while g.active.load(Ordering::SeqCst) > 0 {
            if start.elapsed() > std::time::Duration::from_secs(5) {
                tracing::error!("a direct CMA copy to a forgotten peer has not ended after 5 s");
                return;
            }
            std::thread::yield_now();
        }
    }
}

/// A request's direct copies: the peer's process and reused range lists.
pub(crate) struct Direct {
    target: Target,
    local: Vec<IoVec>,
    remote: Vec<IoVec>,
    /// System calls one post makes (for the path).
    pub calls: usize,
}

impl Direct {
    /// Direct copies to `target` for a request of `work`.
    pub(crate) fn new(target: Target, work: &Work) -> Self {
        let n = work.len().min(IOV_MAX);
        Direct {
            target,
            local: Vec::with_capacity(n),
            remote: Vec::with_capacity(n),
            calls: work.len().div_ceil(IOV_MAX).max(1),
        }
    }

    /// The peer's process.
    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// Copies every segment of `work` (local to remote for a WRITE, back for a READ), at most
    /// [`IOV_MAX`] per system call; complete when it returns.
    ///
    /// Crate invariant (the request's): every local range lies in a registration the request
    /// keeps alive, and for a READ nothing else uses it while the request is in flight (the
    /// agent's rule for every backend).
    pub(crate) fn run(&mut self, write: bool, work: &Work) -> io::Result<()> {
        self.local.clear();
        self.remote.clear();
        let mut failed = None;
        let target = &self.target;
        let (local, remote) = (&mut self.local, &mut self.remote);
        work.each(|s| {
            let (Ok(l), Ok(r), Ok(n)) = (
                usize::try_from(s.local),
                usize::try_from(s.remote),
                usize::try_from(s.len),
            ) else {
                failed = Some(io::Error::from(io::ErrorKind::InvalidInput));
                return false;
            };
            local.push(IoVec { base: l, len: n });
            remote.push(IoVec { base: r, len: n });
            if local.len() == IOV_MAX {
                if let Err(e) = target.copy(write, local, remote) {
                    failed = Some(e);
                    return false;
                }
                local.clear();
                remote.clear();
            }
            true
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if !local.is_empty() {
            target.copy(write, local, remote)?;
        }
        Ok(())
    }
}

/// The typed error for a failed direct copy to `remote`.
pub(crate) fn error(agent: &str, remote: &str, op: Op, e: &io::Error) -> Error {
    match e.raw_os_error() {
        // ESRCH: the peer's process is gone.
        Some(3) => Error::disconnected(agent, remote, op, "its process has exited (CMA: ESRCH)"),
        Some(REVOKED) => Error::disconnected(
            agent,
            remote,
            op,
            "the peer was forgotten (invalidated or reloaded): no more direct copies to it",
        ),
        // EPERM: no ptrace permission over the peer's process (another user, Yama).
        Some(1) => Error::backend(
            agent,
            crate::UCX,
            op,
            format!(
                "CMA to {remote} not permitted (EPERM: no ptrace permission over its process); \
                 UcxParams::direct_cma = false leaves the copies to UCX"
            ),
        ),
        Some(14) => Error::backend(
            agent,
            crate::UCX,
            op,
            format!("CMA: a range of {remote}'s region is not mapped in its process (EFAULT)"),
        ),
        _ => Error::backend(agent, crate::UCX, op, format!("CMA copy to {remote}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::pool::MIN_PIECE;
    use super::*;

    /// This process as a copy target (a process may attach to itself).
    fn this_process() -> Target {
        let id = nixl_core::backend::ProcessId::current().expect("/proc");
        Target::new(
            nixl_core::backend::PeerProcess::open(&id)
                .expect("alive")
                .expect("pidfds"),
        )
    }

    fn r(base: usize, len: usize) -> (IoVec, IoVec) {
        (
            IoVec { base, len },
            IoVec {
                base: base + (1 << 40),
                len,
            },
        )
    }

    /// Pieces cover every byte once, in order, remote offsets following local ones, with at
    /// most the asked number of pieces (fewer when small) and IOV_MAX ranges each.
    #[test]
    fn split_covers_every_byte_once() {
        let cases: Vec<(Vec<(IoVec, IoVec)>, usize)> = vec![
            (vec![r(0x1000, 64 << 20)], 4),
            (vec![r(0x1000, 4096)], 4),
            ((0..32).map(|i| r(i * (2 << 20), 1 << 20)).collect(), 4),
            ((0..3000).map(|i| r(i * 8192, 4096)).collect(), 3),
            (
                (0..5)
                    .map(|i| r(i * (8 << 20), (i + 1) * 777_777))
                    .collect(),
                7,
            ),
            (vec![r(0x1000, 3 << 20)], 1),
        ];
        for (ranges, n) in cases {
            let total: usize = ranges.iter().map(|(l, _)| l.len).sum();
            let pieces = split(&ranges, n);
            assert!(pieces.len() <= n.max(total.div_ceil(IOV_MAX * 4096)));
            if total < MIN_PIECE {
                assert_eq!(pieces.len(), 1);
            }
            let flat: Vec<(IoVec, IoVec)> = pieces
                .iter()
                .flat_map(|(l, r)| {
                    assert_eq!(l.len(), r.len());
                    assert!(l.len() <= IOV_MAX && !l.is_empty());
                    l.iter().copied().zip(r.iter().copied())
                })
                .collect();
            // Re-join consecutive cuts and compare with the input.
            let mut joined: Vec<(IoVec, IoVec)> = Vec::new();
            for (l, rr) in flat {
                assert_eq!(rr.base - l.base, 1 << 40);
                assert_eq!(l.len, rr.len);
                match joined.last_mut() {
                    Some((pl, pr)) if pl.base + pl.len == l.base => {
                        pl.len += l.len;
                        pr.len += rr.len;
                    }
                    _ => joined.push((l, rr)),
                }
            }
            let mut want: Vec<(IoVec, IoVec)> = Vec::new();
            for &(l, rr) in &ranges {
                match want.last_mut() {
                    Some((pl, pr)) if pl.base + pl.len == l.base => {
                        pl.len += l.len;
                        pr.len += rr.len;
                    }
                    _ => want.push((l, rr)),
                }
            }
            assert_eq!(joined, want);
        }
    }

    #[test]
    fn a_pool_runs_jobs_and_stops() {
        let pool = CopyPool::start("t", 3).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            assert!(pool
                .run_all(vec![Box::new(move || tx.send(i).unwrap())])
                .is_empty());
        }
        let mut got: Vec<i32> = (0..10).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        drop(pool);
    }

    /// Every piece is copied once, by whichever thread takes it; the finisher runs once,
    /// after the last; a failure is kept; a stopped flight copies nothing more.
    #[test]
    fn a_flight_copies_each_piece_once_and_finishes_once() {
        use std::sync::Arc;
        let me = this_process();
        let src: Vec<u8> = (0..(8 << 20)).map(|i: u32| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let ranges = [(
            IoVec {
                base: src.as_ptr() as usize,
                len: src.len(),
            },
            IoVec {
                base: dst.as_mut_ptr() as usize,
                len: dst.len(),
            },
        )];
        let finished = Arc::new(AtomicUsize::new(0));
        let f2 = finished.clone();
        let flight = Flight::new(
            me.clone(),
            true,
            split(&ranges, usize::MAX),
            Box::new(move |f| {
                assert!(f.error().is_none());
                f2.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(flight.len(), 32, "pieces of MIN_PIECE");
        let pool = CopyPool::start("t", 2).unwrap();
        for _ in 0..2 {
            let f = flight.clone();
            assert!(pool.run_all(vec![Box::new(move || f.work())]).is_empty());
        }
        flight.work();
        drop(pool);
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        assert_eq!(dst, src);
        // A failing piece is kept; a stopped flight copies nothing.
        let bad = [(
            IoVec {
                base: src.as_ptr() as usize,
                len: 4096,
            },
            IoVec { base: 8, len: 4096 },
        )];
        let f = Flight::new(
            me.clone(),
            true,
            split(&bad, 1),
            Box::new(|f| assert!(f.error().is_some())),
        );
        f.work();
        assert_eq!(f.error().and_then(|e| e.raw_os_error()), Some(14));
        let mut out = vec![0u8; 4096];
        let stopped = [(
            IoVec {
                base: src.as_ptr() as usize,
                len: 4096,
            },
            IoVec {
                base: out.as_mut_ptr() as usize,
                len: 4096,
            },
        )];
        let f = Flight::new(
            me,
            true,
            split(&stopped, 1),
            Box::new(|f| assert!(f.stopped())),
        );
        f.stop();
        f.work();
        assert_eq!(out, vec![0u8; 4096]);
    }
}
