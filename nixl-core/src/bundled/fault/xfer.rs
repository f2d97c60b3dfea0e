//! A fault-injecting transfer: the wrapped backend's transfer in a slot that a delayed post
//! starts later (on the injector's thread), plus a private copy of the payload for corrupted
//! WRITEs (built on the first one, kept for the request's life).

// Exception to the crate's `deny(unsafe_code)`: the fault injector reads and flips bytes of the
// request's own registered memory (SAFETY at each use).
#![allow(unsafe_code)]

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Core, FaultEvent};
use crate::backend::{BackendMd, BackendXfer, XferSpec, XferState};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::mem::{HostBuffer, MemKind, RegionDesc};

/// Where a slot's transfer is.
enum Phase {
    /// Never posted.
    Idle,
    /// Posted by the caller, held back until the delay is over.
    Held,
    /// Handed to the wrapped backend.
    Posted,
    /// The wrapped backend refused the delayed post.
    Failed(Error),
    /// Canceled while held: nothing moved.
    Canceled,
}

/// One transfer of the wrapped backend.
struct Slot {
    xfer: Box<dyn BackendXfer>,
    phase: Phase,
    /// The wrapped backend could not confirm a cancel: what the slot owns is never freed.
    leaked: bool,
    /// For the private copy: its registration with the wrapped backend and its memory,
    /// released after `xfer` (fields drop in order).
    private: Option<(Arc<Core>, BackendMd)>,
    buf: Option<HostBuffer>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.leaked {
            // The wrapped backend may still read the private copy: keep it forever.
            std::mem::forget(self.private.take());
            std::mem::forget(self.buf.take());
            return;
        }
        if let Some((core, md)) = self.private.take() {
            if let Err(e) = core.inner.deregister(md) {
                tracing::warn!(agent = %core.agent, error = %e, "fault injection: deregistering the private copy failed");
            }
        }
    }
}

fn slot(xfer: Box<dyn BackendXfer>) -> Arc<Mutex<Slot>> {
    Arc::new(Mutex::new(Slot {
        xfer,
        phase: Phase::Idle,
        leaked: false,
        private: None,
        buf: None,
    }))
}

pub(super) struct FaultXfer {
    core: Arc<Core>,
    main: Arc<Mutex<Slot>>,
    /// The private copy's transfer (corrupted WRITEs), once one happened.
    private: Option<Arc<Mutex<Slot>>>,
    /// Whether the current post uses the private copy.
    use_private: bool,
    /// The spec without its notification, to prepare the private copy's transfer.
    spec: XferSpec,
    notif: Option<Vec<u8>>,
    /// Whether the wrapped backend carries a per-post notification (`set_notif` works).
    inner_notif: bool,
    /// (addr, len) of the local segments, in payload order.
    local: Vec<(u64, u64)>,
    post: u64,
    /// READ: the local byte to flip once the data is complete.
    corrupt_after: Option<u64>,
    /// Notifications the wrapper sends itself once the data is complete.
    extra_notifs: u32,
}

impl FaultXfer {
    pub(super) fn prepare(core: Arc<Core>, spec: &XferSpec) -> Result<Self> {
        // The wrapper sends the notification itself, after the data, so it can drop or
        // duplicate it (the wrapped backend gets the spec without it).
        let mut spec = spec.clone();
        let notif = spec.notif.take();
        let local = spec
            .segments
            .iter()
            .map(|s| (s.local_addr, s.len))
            .collect();
        let mut inner = core.inner.prepare_xfer(&spec)?;
        let inner_notif = core.inner.capabilities().notifications && inner.set_notif(None).is_ok();
        Ok(FaultXfer {
            main: slot(inner),
            core,
            private: None,
            use_private: false,
            spec,
            notif,
            inner_notif,
            local,
            post: 0,
            corrupt_after: None,
            extra_notifs: 0,
        })
    }

    fn current(&self) -> &Arc<Mutex<Slot>> {
        match (&self.private, self.use_private) {
            (Some(p), true) => p,
            _ => &self.main,
        }
    }

    /// A payload offset and the local address of that byte.
    fn pick_byte(&self) -> Option<(u64, u64)> {
        let total: u64 = self.local.iter().map(|(_, l)| l).sum();
        if total == 0 {
            return None;
        }
        let offset = ((self.core.unit() * total as f64) as u64).min(total - 1);
        let mut off = offset;
        for &(a, l) in &self.local {
            if off < l {
                return Some((offset, a + off));
            }
            off -= l;
        }
        None
    }

    /// The private copy's transfer: the same segments, the local side in a buffer of the
    /// wrapper's own, registered with the wrapped backend.
    fn private_slot(&mut self) -> Result<Arc<Mutex<Slot>>> {
        if let Some(p) = &self.private {
            return Ok(p.clone());
        }
        let total: u64 = self.local.iter().map(|(_, l)| l).sum();
        let agent = &self.core.agent;
        let buf = usize::try_from(total)
            .ok()
            .and_then(HostBuffer::new)
            .ok_or_else(|| {
                Error::invalid(agent, Op::PostXfer, "fault injection: no memory for a copy")
            })?;
        let md = self
            .core
            .inner
            .register(&RegionDesc::dram(buf.addr(), total))?;
        let mut spec = self.spec.clone();
        // The copy's metadata goes last in the spec's list; every segment's local side names it.
        let md_index = spec.mds.len();
        spec.mds.push(md.clone());
        let mut off = 0;
        for s in &mut spec.segments {
            s.local_addr = buf.addr() + off;
            s.local_dev = 0;
            s.local_md = md_index;
            off += s.len;
        }
        let xfer = match self.core.inner.prepare_xfer(&spec) {
            Ok(x) => x,
            Err(e) => {
                let _ = self.core.inner.deregister(md);
                return Err(e);
            }
        };
        let s = slot(xfer);
        {
            let mut g = s.lock();
            g.private = Some((self.core.clone(), md));
            g.buf = Some(buf);
        }
        self.private = Some(s.clone());
        Ok(s)
    }

    /// Copies the caller's payload into the private buffer and flips the byte at `offset`.
    fn fill_private(&self, s: &Arc<Mutex<Slot>>, offset: u64) {
        let g = s.lock();
        let Some(buf) = &g.buf else { return };
        let mut at = 0usize;
        for &(addr, len) in &self.local {
            // SAFETY: `addr..addr + len` lies in the request's local DRAM registration, which
            // the request keeps alive; it is only read.
            let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
            buf.write_at(at, src);
            at += len as usize;
        }
        let mut b = [0u8; 1];
        if buf.read_at(offset as usize, &mut b) {
            buf.write_at(offset as usize, &[b[0] ^ 0xA5]);
        }
    }

    /// The data is complete: flip a READ's byte, send the wrapper's notifications.
    fn finish(&mut self) -> Result<XferState> {
        if let Some(addr) = self.corrupt_after.take() {
            // SAFETY: `addr` lies in the request's local DRAM registration, alive for the
            // request; the READ is complete, so nothing else writes this byte now.
            unsafe {
                let p = addr as *mut u8;
                std::ptr::write_volatile(p, std::ptr::read_volatile(p) ^ 0xA5);
            }
        }
        // Duplicates of the notification (a backend without peers has no notifications).
        if let (Some(n), Some(p)) = (&self.notif, self.core.inner.peers()) {
            for _ in 0..self.extra_notifs {
                p.gen_notif(&self.spec.remote, n)?;
            }
        }
        self.extra_notifs = 0;
        Ok(XferState::Done)
    }

    /// Draws this post's faults; returns its delay.
    fn draw(&mut self, post: u64) -> Result<Option<Duration>> {
        let core = self.core.clone();
        let mut delay = None;
        if core.roll(core.plan.delay_prob) {
            let (lo, hi) = core.plan.delay;
            let d = lo + hi.saturating_sub(lo).mul_f64(core.unit());
            core.log.push(FaultEvent::Delay { post, delay: d });
            delay = Some(d);
        }
        let mut copies = 1;
        if self.notif.is_some() {
            if core.roll(core.plan.drop_notif_prob) {
                core.log.push(FaultEvent::DropNotif { post });
                copies = 0;
            } else if core.roll(core.plan.dup_notif_prob) {
                core.log.push(FaultEvent::DupNotif { post });
                copies = 2;
            }
        }
        self.use_private = false;
        self.corrupt_after = None;
        if self.spec.local_kind == MemKind::Dram && core.roll(core.plan.corrupt_prob) {
            if let Some((offset, addr)) = self.pick_byte() {
                core.log.push(FaultEvent::Corrupt { post, offset });
                match self.spec.op {
                    XferOp::Write => {
                        let s = self.private_slot()?;
                        self.fill_private(&s, offset);
                        self.use_private = true;
                    }
                    XferOp::Read => self.corrupt_after = Some(addr),
                }
            }
        }
        // The notification: carried by the wrapped backend when it can (after its data,
        // without polling), the rest sent by the wrapper once the data is complete.
        self.extra_notifs = 0;
        if self.inner_notif {
            let msg = self.notif.as_deref().filter(|_| copies > 0);
            self.current().lock().xfer.set_notif(msg)?;
            self.extra_notifs = if msg.is_some() { copies - 1 } else { 0 };
        } else if self.notif.is_some() {
            self.extra_notifs = copies;
        }
        Ok(delay)
    }
}

impl BackendXfer for FaultXfer {
    fn post(&mut self) -> Result<XferState> {
        let core = self.core.clone();
        if core.dead.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(core.dead_error(&self.spec.remote, Op::PostXfer));
        }
        let post = core.posts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        self.post = post;
        if core.plan.kill_after_posts.is_some_and(|k| post > k) {
            core.dead.store(true, std::sync::atomic::Ordering::SeqCst);
            core.log.push(FaultEvent::Kill { post });
            return Err(core.dead_error(&self.spec.remote, Op::PostXfer));
        }
        if core.roll(core.plan.error_prob) {
            core.log.push(FaultEvent::Error { post });
            return Err(Error::backend(
                &core.agent,
                core.inner.name(),
                Op::PostXfer,
                "injected fault",
            ));
        }
        let delay = self.draw(post)?;
        let s = self.current().clone();
        if let Some(d) = delay {
            s.lock().phase = Phase::Held;
            // Weak: a request dropped (and so canceled) meanwhile is not kept alive by its job.
            let job = Arc::downgrade(&s);
            let started = core.sched.schedule(Instant::now() + d, move || {
                let Some(job) = job.upgrade() else { return };
                let mut g = job.lock();
                if matches!(g.phase, Phase::Held) {
                    g.phase = match g.xfer.post() {
                        Ok(_) => Phase::Posted,
                        Err(e) => Phase::Failed(e),
                    };
                }
            });
            if let Err(e) = started {
                s.lock().phase = Phase::Idle;
                return Err(Error::io(&core.agent, Op::PostXfer, e));
            }
            return Ok(XferState::InProgress);
        }
        let mut g = s.lock();
        let r = g.xfer.post();
        g.phase = match &r {
            Ok(_) => Phase::Posted,
            Err(e) => Phase::Failed(e.clone()),
        };
        drop(g);
        match r? {
            XferState::Done => self.finish(),
            XferState::InProgress => Ok(XferState::InProgress),
        }
    }

    fn check(&mut self) -> Result<XferState> {
        let s = self.current().clone();
        if self.core.dead.load(std::sync::atomic::Ordering::SeqCst) {
            self.cancel()?;
            return Err(self.core.dead_error(&self.spec.remote, Op::CheckXfer));
        }
        let mut g = s.lock();
        let state = match &g.phase {
            Phase::Idle => {
                return Err(Error::not_allowed(
                    &self.core.agent,
                    Op::CheckXfer,
                    "never posted",
                ))
            }
            Phase::Held => return Ok(XferState::InProgress),
            Phase::Failed(e) => return Err(e.clone()),
            Phase::Canceled => {
                return Err(Error::Canceled {
                    agent: self.core.agent.clone(),
                    op: Op::CheckXfer,
                })
            }
            Phase::Posted => g.xfer.check()?,
        };
        drop(g);
        match state {
            XferState::InProgress => Ok(XferState::InProgress),
            XferState::Done => self.finish(),
        }
    }

    fn cancel(&mut self) -> Result<()> {
        let s = self.current().clone();
        let mut g = s.lock();
        match g.phase {
            Phase::Held => g.phase = Phase::Canceled,
            Phase::Posted => {
                if let Err(e) = g.xfer.cancel() {
                    g.leaked = true;
                    return Err(e);
                }
            }
            _ => {}
        }
        self.corrupt_after = None;
        self.extra_notifs = 0;
        Ok(())
    }

    fn abandon(&mut self) {
        // Held back: it never reaches the wrapped backend. Already posted: the wrapped
        // backend is asked to stop in turn.
        let s = self.current().clone();
        let mut g = s.lock();
        match g.phase {
            Phase::Held => g.phase = Phase::Canceled,
            Phase::Posted => g.xfer.abandon(),
            _ => {}
        }
        self.corrupt_after = None;
        self.extra_notifs = 0;
    }

    fn path(&self) -> Option<String> {
        self.main
            .lock()
            .xfer
            .path()
            .map(|p| format!("{p} (fault injection)"))
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        // Applied to the wrapped transfer at each post (see `draw`).
        self.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
