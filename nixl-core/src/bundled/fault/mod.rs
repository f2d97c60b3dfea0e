//! Deterministic fault injection around any backend: a tool for users' own tests.
//!
//! [`FaultParams`] wraps another backend's params; the agent then uses the wrapped backend
//! under the same name, and every post draws from a seeded generator whether to delay, fail,
//! drop or duplicate the notification, corrupt a byte, or act as if the peer died. The same
//! seed and the same sequence of calls give the same faults. Every injected fault is recorded
//! in a [`FaultLog`] the test keeps.
//!
//! The faults are real, not reported: a delayed post really holds its data back (the wrapped
//! backend's post starts on the injector's thread when the delay is over, so the destination
//! is unchanged and the request `InProgress` until then, and a cancel before then stops it
//! before anything moved); a corrupted WRITE sends a private copy of the payload with one
//! byte flipped (the caller's registered source is never written); a corrupted READ flips one
//! byte of the data that arrived. The notification travels with the wrapped backend's own
//! (after the data, whether or not anyone polls) when that backend can carry a per-post
//! message; a duplicate is sent by the wrapper once the data is complete.

mod xfer;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{
    Backend, BackendContext, BackendMd, BackendParams, BackendXfer, Capabilities, CostEstimate,
    PeerBackend, QueryResult, XferSpec,
};
use crate::deferred::Scheduler;
use crate::error::{Error, Op, Result};
use crate::mem::RegionDesc;
use xfer::FaultXfer;

/// What to inject, with probabilities per post (0.0 to 1.0).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FaultPlan {
    /// Seed of the generator.
    pub seed: u64,
    /// Probability that a post's data is held back for a delay before it starts moving.
    pub delay_prob: f64,
    /// The delay's range.
    pub delay: (Duration, Duration),
    /// Probability that a post fails with a backend error (nothing is transferred).
    pub error_prob: f64,
    /// Probability that a request's notification is dropped.
    pub drop_notif_prob: f64,
    /// Probability that a request's notification is delivered twice.
    pub dup_notif_prob: f64,
    /// Probability that one byte of the payload arrives flipped (DRAM on the local side).
    pub corrupt_prob: f64,
    /// After this many posts the peer "dies": in-flight and later requests end in
    /// `RemoteDisconnect`, notifications stop.
    pub kill_after_posts: Option<u64>,
}

crate::__setters!(FaultPlan {
    seed: u64,
    delay_prob: f64,
    delay: (Duration, Duration),
    error_prob: f64,
    drop_notif_prob: f64,
    dup_notif_prob: f64,
    corrupt_prob: f64,
} some {
    kill_after_posts: u64,
});

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
    /// Post number `post` was held back before its data started moving.
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
        self.events.lock().clone()
    }

    fn push(&self, e: FaultEvent) {
        tracing::debug!(event = ?e, "fault injected");
        self.events.lock().push(e);
    }
}

/// Params that wrap another backend's params with a fault plan ([`FaultParams::new`]).
#[non_exhaustive]
pub struct FaultParams {
    /// The backend to wrap.
    pub inner: Box<dyn BackendParams>,
    /// What to inject.
    pub plan: FaultPlan,
    /// Where to record it.
    pub log: Arc<FaultLog>,
}

impl std::fmt::Debug for FaultParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultParams")
            .field("inner", &self.inner.backend_name())
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
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
            sched: Scheduler::new(&format!("nixl-fault-{agent}")),
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
    /// Starts delayed posts.
    sched: Scheduler,
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
        let mut s = self.rng.lock();
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
    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        self.0.inner.register(region)
    }
    fn deregister(&self, md: BackendMd) -> Result<()> {
        self.0.inner.deregister(md)
    }
    fn load_local(&self, region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        self.0.inner.load_local(region, md)
    }
    fn unload(&self, md: BackendMd) -> Result<()> {
        self.0.inner.unload(md)
    }
    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        Ok(Box::new(FaultXfer::prepare(self.0.clone(), spec)?))
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
    fn peers(&self) -> Option<&dyn PeerBackend> {
        // Peer-facing exactly when the wrapped backend is.
        self.0.inner.peers().map(|_| self as &dyn PeerBackend)
    }
}

impl FaultInjector {
    /// The wrapped backend's peer-facing half (there whenever [`Backend::peers`] gave this
    /// wrapper out).
    fn inner_peers(&self, op: Op) -> Result<&dyn PeerBackend> {
        self.0.inner.peers().ok_or_else(|| {
            Error::not_supported(
                &self.0.agent,
                op,
                format!("{} does not reach peers", self.0.inner.name()),
            )
        })
    }
}

impl PeerBackend for FaultInjector {
    fn connection_info(&self) -> Result<Vec<u8>> {
        self.inner_peers(Op::LocalMetadata)?.connection_info()
    }
    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.inner_peers(Op::LoadMetadata)?.connect(remote, info)
    }
    fn connect_peer(
        &self,
        remote: &str,
        info: &[u8],
        process: Option<&crate::liveness::PeerProcess>,
    ) -> Result<()> {
        self.inner_peers(Op::LoadMetadata)?
            .connect_peer(remote, info, process)
    }
    fn disconnect(&self, remote: &str) -> Result<()> {
        self.inner_peers(Op::Invalidate)?.disconnect(remote)
    }
    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        self.inner_peers(Op::LocalMetadata)?.public_metadata(md)
    }
    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        self.inner_peers(Op::LoadMetadata)?
            .load_remote(remote, region, public)
    }
    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        if self.0.dead.load(Ordering::SeqCst) {
            return Err(self.0.dead_error(remote, Op::GenNotif));
        }
        self.inner_peers(Op::GenNotif)?.gen_notif(remote, msg)
    }
}
