//! Deterministic fault injection around any backend: a tool for users' own tests.
//!
//! [`FaultParams`] wraps another backend's params; the agent then uses the wrapped backend
//! under the same name, and every post draws from a seeded generator whether to delay, fail,
//! drop or duplicate the notification, corrupt a byte, or act as if the peer died. The same
//! seed and the same sequence of calls give the same faults. Every injected fault is recorded
//! in a [`FaultLog`] the test keeps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::lock;
use crate::backend::{
    Backend, BackendContext, BackendMd, BackendParams, BackendXfer, Capabilities, CostEstimate,
    QueryResult, XferSpec, XferState,
};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::mem::{MemKind, RegionDesc};

/// What to inject, with probabilities per post (0.0 to 1.0).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    /// Seed of the generator.
    pub seed: u64,
    /// Probability that a post completes only after a delay.
    pub delay_prob: f64,
    /// The delay's range.
    pub delay: (Duration, Duration),
    /// Probability that a post fails with a backend error (nothing is transferred).
    pub error_prob: f64,
    /// Probability that a request's notification is dropped.
    pub drop_notif_prob: f64,
    /// Probability that a request's notification is delivered twice.
    pub dup_notif_prob: f64,
    /// Probability that one byte of the payload arrives flipped.
    pub corrupt_prob: f64,
    /// After this many posts the peer "dies": in-flight and later requests end in
    /// `RemoteDisconnect`, notifications stop.
    pub kill_after_posts: Option<u64>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            seed: 0,
            delay_prob: 0.0,
            delay: (Duration::from_millis(1), Duration::from_millis(5)),
            error_prob: 0.0,
            drop_notif_prob: 0.0,
            dup_notif_prob: 0.0,
            corrupt_prob: 0.0,
            kill_after_posts: None,
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultEvent {
    /// Post number `post` was delayed.
    Delay {
        /// Post number (from 1).
        post: u64,
        /// How long.
        delay: Duration,
    },
    /// Post number `post` failed.
    Error {
        /// Post number.
        post: u64,
    },
    /// Its notification was dropped.
    DropNotif {
        /// Post number.
        post: u64,
    },
    /// Its notification was duplicated.
    DupNotif {
        /// Post number.
        post: u64,
    },
    /// One byte of the data that moved was flipped.
    Corrupt {
        /// Post number.
        post: u64,
        /// The byte's offset in the request's payload (segments in order).
        offset: u64,
    },
    /// The peer died at this post.
    Kill {
        /// Post number.
        post: u64,
    },
}

/// The record of injected faults, shared between the wrapper and the test.
#[derive(Debug, Default)]
pub struct FaultLog {
    events: Mutex<Vec<FaultEvent>>,
}

impl FaultLog {
    /// A new empty log.
    pub fn new() -> Arc<Self> {
        Arc::new(FaultLog::default())
    }

    /// The events so far.
    pub fn events(&self) -> Vec<FaultEvent> {
        lock(&self.events).clone()
    }

    fn push(&self, e: FaultEvent) {
        tracing::debug!(event = ?e, "fault injected");
        lock(&self.events).push(e);
    }
}

/// Params that wrap another backend's params with a fault plan.
pub struct FaultParams {
    /// The backend to wrap.
    pub inner: Box<dyn BackendParams>,
    /// What to inject.
    pub plan: FaultPlan,
    /// Where to record it.
    pub log: Arc<FaultLog>,
}

impl FaultParams {
    /// Wraps `inner` with `plan`, recording into `log`.
    pub fn new<P: BackendParams + 'static>(inner: P, plan: FaultPlan, log: Arc<FaultLog>) -> Self {
        FaultParams {
            inner: Box::new(inner),
            plan,
            log,
        }
    }
}

impl BackendParams for FaultParams {
    fn backend_name(&self) -> &str {
        self.inner.backend_name()
    }

    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        let agent = ctx.agent.clone();
        let inner = self.inner.create(ctx)?;
        Ok(Arc::new(FaultInjector(Arc::new(Core {
            agent,
            inner,
            rng: Mutex::new(self.plan.seed ^ 0x5DEE_CE66_D1CE_4E5B),
            plan: self.plan,
            log: self.log,
            posts: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        }))))
    }
}

struct Core {
    agent: String,
    inner: Arc<dyn Backend>,
    plan: FaultPlan,
    rng: Mutex<u64>,
    log: Arc<FaultLog>,
    posts: AtomicU64,
    dead: AtomicBool,
}

impl Core {
    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    fn unit(&self) -> f64 {
        // splitmix64
        let mut s = lock(&self.rng);
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn dead_error(&self, remote: &str, op: Op) -> Error {
        Error::disconnected(&self.agent, remote, op, "peer killed by fault injection")
    }
}

struct FaultInjector(Arc<Core>);

impl Backend for FaultInjector {
    fn name(&self) -> &str {
        self.0.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.inner.capabilities()
    }
    fn connection_info(&self) -> Result<Vec<u8>> {
        self.0.inner.connection_info()
    }
    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.0.inner.connect(remote, info)
    }
    fn disconnect(&self, remote: &str) -> Result<()> {
        self.0.inner.disconnect(remote)
    }
    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        self.0.inner.register(region)
    }
    fn deregister(&self, md: BackendMd) -> Result<()> {
        self.0.inner.deregister(md)
    }
    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        self.0.inner.public_metadata(md)
    }
    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        self.0.inner.load_remote(remote, region, public)
    }
    fn load_local(&self, region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        self.0.inner.load_local(region, md)
    }
    fn unload(&self, md: BackendMd) -> Result<()> {
        self.0.inner.unload(md)
    }
    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        // The wrapper sends the notification itself, after the data, so it can drop or
        // duplicate it (the wrapped backend gets the spec without it).
        let notif = spec.notif.clone();
        let local: Vec<(u64, u64)> = spec
            .segments
            .iter()
            .map(|s| (s.local_addr, s.len))
            .collect();
        let remote = spec.remote.clone();
        let op = spec.op;
        let corruptible = spec.local_kind == MemKind::Dram;
        let inner = if notif.is_some() {
            let mut quiet = spec.clone();
            quiet.notif = None;
            self.0.inner.prepare_xfer(&quiet)?
        } else {
            self.0.inner.prepare_xfer(spec)?
        };
        Ok(Box::new(FaultXfer {
            core: self.0.clone(),
            inner,
            notif,
            local,
            remote,
            op,
            corruptible,
            post: 0,
            ready_at: None,
            restore: None,
            corrupt_after: None,
            notif_copies: 1,
        }))
    }
    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        if self.0.dead.load(Ordering::SeqCst) {
            return Err(self.0.dead_error(remote, Op::GenNotif));
        }
        self.0.inner.gen_notif(remote, msg)
    }
    fn progress(&self) -> Result<bool> {
        self.0.inner.progress()
    }
    fn estimate_cost(&self, spec: &XferSpec) -> Result<Option<CostEstimate>> {
        self.0.inner.estimate_cost(spec)
    }
    fn path_report(&self, remote: &str) -> Option<String> {
        self.0
            .inner
            .path_report(remote)
            .map(|p| format!("{p} (fault injection)"))
    }
    fn query(&self, region: &RegionDesc) -> Result<Option<QueryResult>> {
        self.0.inner.query(region)
    }
}

struct FaultXfer {
    core: Arc<Core>,
    inner: Box<dyn BackendXfer>,
    notif: Option<Vec<u8>>,
    local: Vec<(u64, u64)>,
    remote: String,
    op: XferOp,
    corruptible: bool,
    post: u64,
    ready_at: Option<Instant>,
    /// (addr, original byte) to restore in the source after a corrupted WRITE.
    restore: Option<(u64, u8)>,
    /// Address to flip in the destination after a READ completes.
    corrupt_after: Option<u64>,
    notif_copies: u32,
}

impl FaultXfer {
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

    fn finish(&mut self) -> Result<XferState> {
        if let Some((addr, orig)) = self.restore.take() {
            // SAFETY: `addr` lies in the request's local DRAM registration, which the request
            // keeps alive; the transfer is complete so the backend no longer reads it.
            unsafe { std::ptr::write_volatile(addr as *mut u8, orig) };
        }
        if let Some(addr) = self.corrupt_after.take() {
            // SAFETY: as above; the READ is complete so nothing else writes this byte now.
            unsafe {
                let p = addr as *mut u8;
                std::ptr::write_volatile(p, std::ptr::read_volatile(p) ^ 0xA5);
            }
        }
        if let Some(n) = &self.notif {
            for _ in 0..self.notif_copies {
                self.core.inner.gen_notif(&self.remote, n)?;
            }
        }
        Ok(XferState::Done)
    }
}

impl BackendXfer for FaultXfer {
    fn post(&mut self) -> Result<XferState> {
        let core = self.core.clone();
        if core.dead.load(Ordering::SeqCst) {
            return Err(core.dead_error(&self.remote, Op::PostXfer));
        }
        let post = core.posts.fetch_add(1, Ordering::SeqCst) + 1;
        self.post = post;
        if core.plan.kill_after_posts.is_some_and(|k| post > k) {
            core.dead.store(true, Ordering::SeqCst);
            core.log.push(FaultEvent::Kill { post });
            return Err(core.dead_error(&self.remote, Op::PostXfer));
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
        self.ready_at = None;
        if core.roll(core.plan.delay_prob) {
            let (lo, hi) = core.plan.delay;
            let span = hi.saturating_sub(lo);
            let delay = lo + span.mul_f64(core.unit());
            core.log.push(FaultEvent::Delay { post, delay });
            self.ready_at = Some(Instant::now() + delay);
        }
        self.notif_copies = 1;
        if self.notif.is_some() {
            if core.roll(core.plan.drop_notif_prob) {
                core.log.push(FaultEvent::DropNotif { post });
                self.notif_copies = 0;
            } else if core.roll(core.plan.dup_notif_prob) {
                core.log.push(FaultEvent::DupNotif { post });
                self.notif_copies = 2;
            }
        }
        if self.corruptible && core.roll(core.plan.corrupt_prob) {
            if let Some((offset, addr)) = self.pick_byte() {
                core.log.push(FaultEvent::Corrupt { post, offset });
                match self.op {
                    XferOp::Write => {
                        // SAFETY: `addr` lies in the request's local DRAM registration, alive
                        // for the request; the transfer has not started, so only this thread
                        // touches it now. It is restored once the transfer completes.
                        let orig = unsafe { std::ptr::read_volatile(addr as *const u8) };
                        // SAFETY: as above.
                        unsafe { std::ptr::write_volatile(addr as *mut u8, orig ^ 0xA5) };
                        self.restore = Some((addr, orig));
                    }
                    XferOp::Read => self.corrupt_after = Some(addr),
                }
            }
        }
        match self.inner.post() {
            Ok(XferState::Done) if self.ready_at.is_none() => self.finish(),
            Ok(_) => Ok(XferState::InProgress),
            Err(e) => {
                if let Some((addr, orig)) = self.restore.take() {
                    // SAFETY: the post failed, so the backend does not read the source.
                    unsafe { std::ptr::write_volatile(addr as *mut u8, orig) };
                }
                Err(e)
            }
        }
    }

    fn check(&mut self) -> Result<XferState> {
        if self.core.dead.load(Ordering::SeqCst) {
            self.inner.cancel()?;
            if let Some((addr, orig)) = self.restore.take() {
                // SAFETY: canceled: the backend no longer reads the source.
                unsafe { std::ptr::write_volatile(addr as *mut u8, orig) };
            }
            return Err(self.core.dead_error(&self.remote, Op::CheckXfer));
        }
        match self.inner.check()? {
            XferState::InProgress => Ok(XferState::InProgress),
            XferState::Done => match self.ready_at {
                Some(t) if Instant::now() < t => Ok(XferState::InProgress),
                _ => {
                    self.ready_at = None;
                    self.finish()
                }
            },
        }
    }

    fn cancel(&mut self) -> Result<()> {
        self.inner.cancel()?;
        if let Some((addr, orig)) = self.restore.take() {
            // SAFETY: canceled: the backend no longer reads the source.
            unsafe { std::ptr::write_volatile(addr as *mut u8, orig) };
        }
        self.corrupt_after = None;
        Ok(())
    }

    fn path(&self) -> Option<String> {
        self.inner.path().map(|p| format!("{p} (fault injection)"))
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        // The wrapper sends the notification itself (see `prepare_xfer`).
        self.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
