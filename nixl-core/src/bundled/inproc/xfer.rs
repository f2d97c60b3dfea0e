//! INPROC transfers: the copy (checked against the target's registrations under their read
//! lock) and its two completions, inside `post` or later on the completion thread.

// Exception to the crate's `deny(unsafe_code)`: INPROC's copy by address, between ranges inside
// registrations the request holds (SAFETY at the copy).
#![allow(unsafe_code)]

use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Completion, Endpoint};
use crate::backend::{BackendXfer, BlockXferSpec, XferState};
use crate::deferred::Scheduler;
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};

/// How long a cancel waits for a copy that already started (it is a memcpy; past this the
/// cancel is refused and the agent keeps the memory).
const COPY_WAIT: Duration = Duration::from_secs(30);

/// The path report of a completion mode.
pub(super) fn path(c: Completion) -> String {
    match c {
        Completion::Immediate => "in-process memcpy".to_owned(),
        Completion::Deferred(d) => format!("in-process memcpy (deferred {d:?})"),
    }
}

/// What one transfer copies, shared with the completion thread.
pub(super) struct Plan {
    pub agent: String,
    pub remote: String,
    pub op: XferOp,
    pub work: Work,
    pub target: Weak<Endpoint>,
}

/// The copies of a transfer: a segment list, or a block table (whole blocks or tiles) walked
/// on each copy, so nothing is stored per block and the target's regions are checked once
/// per layer.
pub(super) enum Work {
    /// (local addr, remote addr, len, remote region id)
    Segs(Vec<(u64, u64, u64, u64)>),
    /// The table and the target's region id per layer.
    Table {
        spec: BlockXferSpec,
        regions: Vec<u64>,
    },
}

impl Work {
    /// Whether every remote range still lies in its registered region of the target
    /// (`regions`: id -> (addr, len), read-locked by the caller for its copies).
    fn registered(&self, regions: &std::collections::HashMap<u64, (u64, u64)>) -> bool {
        let inside = |addr: u64, len: u64, region: u64| matches!(regions.get(&region), Some(&(a, l)) if addr >= a && addr.saturating_add(len) <= a.saturating_add(l));
        match self {
            Work::Segs(segs) => segs
                .iter()
                .all(|&(_, ra, len, region)| inside(ra, len, region)),
            Work::Table { spec, regions: ids } => {
                crate::work::tick(spec.layers.len());
                spec.layers.iter().zip(ids).all(|(l, &region)| {
                    let end = l.remote.end().unwrap_or(u64::MAX);
                    inside(l.remote.addr, end - l.remote.addr, region)
                })
            }
        }
    }

    /// Calls `f(local addr, remote addr, len)` for every copy, in order.
    fn each(&self, mut f: impl FnMut(u64, u64, u64)) {
        match self {
            Work::Segs(segs) => segs.iter().for_each(|&(la, ra, len, _)| f(la, ra, len)),
            Work::Table { spec, .. } => {
                crate::work::tick(spec.layers.len() * (1 + spec.runs.len()));
                spec.segments().for_each(|(_, la, ra, len)| f(la, ra, len));
            }
        }
    }
}

impl Plan {
    fn gone(&self, op: Op, why: &str) -> Error {
        Error::disconnected(&self.agent, &self.remote, op, why)
    }

    /// The target endpoint, if every remote range still lies in a registered region.
    fn check(&self, op: Op) -> Result<Arc<Endpoint>> {
        let ep = self
            .target
            .upgrade()
            .ok_or_else(|| self.gone(op, "peer endpoint is gone"))?;
        if !self.work.registered(&ep.regions.read()) {
            return Err(self.gone(op, "target region was deregistered"));
        }
        Ok(ep)
    }

    /// Copies every segment, then delivers the notification.
    fn run(&self, notif: Option<&[u8]>, op: Op) -> Result<()> {
        let ep = self
            .target
            .upgrade()
            .ok_or_else(|| self.gone(op, "peer endpoint is gone"))?;
        let regions = ep.regions.read();
        if !self.work.registered(&regions) {
            return Err(self.gone(op, "target region was deregistered"));
        }
        self.work.each(|laddr, raddr, len| {
            let (src, dst) = match self.op {
                XferOp::Write => (laddr, raddr),
                XferOp::Read => (raddr, laddr),
            };
            // SAFETY: the local range lies in a registration the request keeps alive while it
            // is in flight (a deferred copy runs only while the request is in flight: a cancel
            // or drop waits for a running copy and stops a pending one); the remote range lies
            // in a region checked above as still registered, and the read lock held here keeps
            // it registered (its owner cannot deregister and free it) until the copy ends.
            // `copy` tolerates overlap for loopback transfers (the agent refused tile
            // destinations meeting sources on one agent). A table's ranges were checked
            // against their layers (every id, every tile inside its block) by the agent.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        });
        drop(regions);
        if let Some(n) = notif {
            ep.notifs.push(&self.agent, n.to_vec());
        }
        Ok(())
    }
}

/// A deferred post's progress.
enum Phase {
    Waiting,
    Copying,
    Done,
    Failed(Error),
    Canceled,
}

struct Post {
    phase: Mutex<Phase>,
    cv: Condvar,
}

impl Post {
    fn set(&self, p: Phase) {
        *self.phase.lock() = p;
        self.cv.notify_all();
    }
}

pub(super) struct InprocXfer {
    plan: Arc<Plan>,
    notif: Option<Vec<u8>>,
    completion: Completion,
    sched: Arc<Scheduler>,
    wake: crate::backend::Wake,
    cur: Option<Arc<Post>>,
}

impl InprocXfer {
    pub(super) fn new(
        plan: Plan,
        notif: Option<Vec<u8>>,
        completion: Completion,
        sched: Arc<Scheduler>,
        wake: crate::backend::Wake,
    ) -> Self {
        InprocXfer {
            plan: Arc::new(plan),
            notif,
            completion,
            sched,
            wake,
            cur: None,
        }
    }

    fn post_deferred(&mut self, delay: Duration) -> Result<XferState> {
        if let Some(p) = &self.cur {
            if matches!(*p.phase.lock(), Phase::Waiting | Phase::Copying) {
                return Err(Error::RepostActive {
                    agent: self.plan.agent.clone(),
                    op: Op::PostXfer,
                });
            }
        }
        // Refuse now what would fail later (a gone peer, a deregistered region).
        self.plan.check(Op::PostXfer)?;
        let post = Arc::new(Post {
            phase: Mutex::new(Phase::Waiting),
            cv: Condvar::new(),
        });
        let (job_post, plan, notif) = (post.clone(), self.plan.clone(), self.notif.clone());
        let wake = self.wake.clone();
        self.sched
            .schedule(Instant::now() + delay, move || {
                {
                    let mut ph = job_post.phase.lock();
                    if !matches!(*ph, Phase::Waiting) {
                        return;
                    }
                    *ph = Phase::Copying;
                }
                let outcome = plan.run(notif.as_deref(), Op::CheckXfer);
                job_post.set(match outcome {
                    Ok(()) => Phase::Done,
                    Err(e) => Phase::Failed(e),
                });
                wake.wake();
            })
            .map_err(|e| Error::io(&self.plan.agent, Op::PostXfer, e))?;
        self.cur = Some(post);
        Ok(XferState::InProgress)
    }
}

impl BackendXfer for InprocXfer {
    fn post(&mut self) -> Result<XferState> {
        match self.completion {
            Completion::Immediate => {
                self.plan.run(self.notif.as_deref(), Op::PostXfer)?;
                Ok(XferState::Done)
            }
            Completion::Deferred(delay) => self.post_deferred(delay),
        }
    }

    fn check(&mut self) -> Result<XferState> {
        let Some(p) = &self.cur else {
            // Immediate copies finish inside `post`.
            return Ok(XferState::Done);
        };
        let ph = p.phase.lock();
        match &*ph {
            Phase::Waiting | Phase::Copying => Ok(XferState::InProgress),
            Phase::Done => Ok(XferState::Done),
            Phase::Failed(e) => Err(e.clone()),
            Phase::Canceled => Err(Error::Canceled {
                agent: self.plan.agent.clone(),
                op: Op::CheckXfer,
            }),
        }
    }

    fn cancel(&mut self) -> Result<()> {
        let Some(p) = &self.cur else {
            // Immediate copies finish inside `post`: nothing is ever in flight.
            return Ok(());
        };
        let mut ph = p.phase.lock();
        if matches!(*ph, Phase::Waiting) {
            *ph = Phase::Canceled;
            return Ok(());
        }
        let end = Instant::now() + COPY_WAIT;
        while matches!(*ph, Phase::Copying) {
            let now = Instant::now();
            if now >= end {
                return Err(Error::backend(
                    &self.plan.agent,
                    super::INPROC,
                    Op::Cancel,
                    "a copy in progress did not finish",
                ));
            }
            p.cv.wait_for(&mut ph, end - now);
        }
        Ok(())
    }

    fn abandon(&mut self) {
        // A copy still waiting for its time never starts; one already copying finishes and
        // `check` reports it (the request drains until then).
        if let Some(p) = &self.cur {
            let mut ph = p.phase.lock();
            if matches!(*ph, Phase::Waiting) {
                *ph = Phase::Canceled;
            }
        }
    }

    fn path(&self) -> Option<String> {
        Some(path(self.completion))
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
