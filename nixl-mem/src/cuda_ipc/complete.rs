//! Notification delivery of `CUDA_IPC`, independent of the initiator's polling.
//!
//! A posted request that carries a notification hands a [`Ticket`] to the backend's
//! [`Completer`]: one thread per backend, with the backend's CUDA context current, that polls
//! the front ticket of every peer's queue (`cuEventQuery`, with backoff) and sends each
//! notification as soon as its request's event has completed, in per-peer post order. `check`
//! on the initiator may pump the same queue (so a polling initiator sees no extra latency); the
//! queue lock and the ticket's state make the notification go out exactly once. A canceled
//! ticket is never sent: `cancel` marks it first, under the same lock a sender holds.
//!
//! Ownership: the request owns its event (`Arc`, shared with its ticket so the completer can
//! query it); the backend owns the [`Completer`], whose `Drop` stops and joins the thread.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::CudaContext;
use nixl_core::backend::NotifQueue;
use nixl_core::{Error, Op, Result};

use super::notif::NotifSenders;
use crate::cuda::{self, CudaError, Event};

/// How long the idle completer sleeps before looking again (a submission wakes it at once).
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// Busy rounds (yielding) before the completer starts sleeping between polls.
const SPIN_ROUNDS: u32 = 64;
/// The longest sleep between two polls while a notification is pending: the worst extra
/// latency of a notification after its data completed, when nobody polls.
const MAX_BACKOFF: Duration = Duration::from_micros(50);

/// Where a notification goes once the data is complete.
#[derive(Clone)]
pub(crate) enum NotifRoute {
    /// A peer's notification server.
    Remote {
        senders: Arc<NotifSenders>,
        server: Vec<u8>,
    },
    /// The agent itself (loopback).
    Local(Arc<NotifQueue>),
}

impl NotifRoute {
    /// The ordering domain: one queue per destination (the loopback has the empty key; server
    /// names are never empty).
    fn key(&self) -> Vec<u8> {
        match self {
            NotifRoute::Remote { server, .. } => server.clone(),
            NotifRoute::Local(_) => Vec::new(),
        }
    }
}

/// A request's notification: the message, its destination, and who sends it to whom.
pub(crate) struct Notif {
    pub agent: String,
    pub remote: String,
    pub msg: Vec<u8>,
    pub route: NotifRoute,
}

impl Notif {
    /// A notification of `msg` from `agent` to `remote` along `route`; refused when larger
    /// than a notification frame carries.
    pub(super) fn new(
        agent: &str,
        remote: &str,
        msg: Vec<u8>,
        route: NotifRoute,
        op: Op,
    ) -> Result<Arc<Notif>> {
        if msg.len() > super::MAX_NOTIF {
            return Err(Error::invalid(
                agent,
                op,
                format!(
                    "notification of {} bytes exceeds {}",
                    msg.len(),
                    super::MAX_NOTIF
                ),
            ));
        }
        Ok(Arc::new(Notif {
            agent: agent.to_owned(),
            remote: remote.to_owned(),
            msg,
            route,
        }))
    }

    fn deliver(&self) -> Result<()> {
        match &self.route {
            NotifRoute::Remote { senders, server } => {
                senders.send(&self.agent, &self.remote, server, &self.msg)
            }
            NotifRoute::Local(q) => {
                q.push(&self.agent, self.msg.clone());
                Ok(())
            }
        }
    }
}

/// Why a ticket's notification was not sent.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The request's event reported an error.
    Cuda(CudaError),
    /// The notification channel failed.
    Channel(String),
}

/// Where a ticket stands.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Data still moving, or an earlier notification to the same peer not yet sent.
    Pending,
    /// Data complete and notification sent.
    Sent,
    /// Not sent; why.
    Failed(Failure),
    /// Canceled before it was sent; it never will be.
    Canceled,
}

/// Something a ticket waits for: the request's CUDA event (`Ok(true)` once the work it
/// captured is complete).
pub(crate) trait Completion: Send + Sync {
    fn query(&self) -> std::result::Result<bool, CudaError>;
}

impl Completion for Event {
    fn query(&self) -> std::result::Result<bool, CudaError> {
        Event::query(self)
    }
}

/// One post's notification, waiting for the post's event.
pub(crate) struct Ticket {
    event: Arc<dyn Completion>,
    notif: Arc<Notif>,
    state: Mutex<Outcome>,
    /// Woken once the outcome is decided (the agent's futures).
    wake: Mutex<Option<nixl_core::backend::Wake>>,
}

impl Ticket {
    pub(super) fn new(event: Arc<dyn Completion>, notif: Arc<Notif>) -> Self {
        Ticket {
            event,
            notif,
            state: Mutex::new(Outcome::Pending),
            wake: Mutex::new(None),
        }
    }

    /// Wakes `w` once the ticket's outcome is decided (sent, failed).
    pub(super) fn wake_when_sent(&self, w: nixl_core::backend::Wake) {
        *self.wake.lock() = Some(w);
    }

    pub(super) fn outcome(&self) -> Outcome {
        self.state.lock().clone()
    }

    /// Makes sure the notification is never sent, unless it already was. Waits for a send in
    /// progress (it holds the state lock) and returns whether it had been sent.
    pub(super) fn cancel(&self) -> bool {
        let mut st = self.state.lock();
        match *st {
            Outcome::Pending => {
                *st = Outcome::Canceled;
                false
            }
            Outcome::Sent => true,
            _ => false,
        }
    }

    pub(super) fn route_key(&self) -> Vec<u8> {
        self.notif.route.key()
    }

    /// Turns a failure into the request's error.
    pub(super) fn error(&self, f: Failure) -> Error {
        match f {
            Failure::Cuda(e) => cuda::to_error(&self.notif.agent, Op::CheckXfer, e),
            Failure::Channel(why) => Error::disconnected(
                &self.notif.agent,
                &self.notif.remote,
                Op::CheckXfer,
                format!("the notification could not be sent: {why}"),
            ),
        }
    }
}

type PeerQueue = Mutex<VecDeque<Arc<Ticket>>>;

/// What the completer thread and the requests share.
pub(crate) struct Shared {
    queues: Mutex<HashMap<Vec<u8>, Arc<PeerQueue>>>,
    /// Submissions counter: the thread sleeps while it is unchanged and nothing is pending.
    submitted: Mutex<u64>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn new() -> Self {
        Shared {
            queues: Mutex::new(HashMap::new()),
            submitted: Mutex::new(0),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// Queues a ticket behind the earlier ones of the same destination and wakes the thread.
    pub(super) fn submit(&self, t: Arc<Ticket>) {
        let q = self.queues.lock().entry(t.route_key()).or_default().clone();
        q.lock().push_back(t);
        *self.submitted.lock() += 1;
        self.wake.notify_one();
    }

    /// Sends the notifications of one destination whose data is complete, in order, stopping
    /// at the first still in flight. Called by the thread and by `check`.
    pub(super) fn pump_key(&self, key: &[u8]) {
        let q = self.queues.lock().get(key).cloned();
        if let Some(q) = q {
            pump(&q);
        }
    }

    fn queues(&self) -> Vec<Arc<PeerQueue>> {
        self.queues.lock().values().cloned().collect()
    }

    /// Forgets empty queues nobody is about to use (destinations come and go with peers).
    /// Lock order: the map, then a queue (nothing takes them the other way round).
    fn prune(&self) {
        self.queues
            .lock()
            .retain(|_, q| Arc::strong_count(q) > 1 || !q.lock().is_empty());
    }
}

/// Returns (whether any ticket was resolved, whether any is still pending).
fn pump(q: &PeerQueue) -> (bool, bool) {
    let mut q = q.lock();
    let mut progressed = false;
    while let Some(t) = q.front().cloned() {
        let mut st = t.state.lock();
        if matches!(*st, Outcome::Pending) {
            match t.event.query() {
                Ok(false) => return (progressed, true),
                Ok(true) => {
                    *st = match t.notif.deliver() {
                        Ok(()) => Outcome::Sent,
                        Err(e) => {
                            tracing::warn!(agent = %t.notif.agent, remote = %t.notif.remote, error = %e, "CUDA_IPC notification not delivered");
                            Outcome::Failed(Failure::Channel(e.to_string()))
                        }
                    }
                }
                Err(e) => *st = Outcome::Failed(Failure::Cuda(e)),
            }
            progressed = true;
            if let Some(w) = t.wake.lock().take() {
                w.wake();
            }
        }
        drop(st);
        q.pop_front();
    }
    (progressed, false)
}

/// The completion thread of one backend; `Drop` stops and joins it.
pub(crate) struct Completer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Completer {
    /// Starts the thread, which binds `ctx` (events are queried with it current).
    pub(super) fn start(agent: &str, ctx: Option<Arc<CudaContext>>) -> Result<Self> {
        let shared = Arc::new(Shared::new());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nixl-cuda-ipc-done-{agent}"))
            .spawn(move || run(&s, ctx.as_deref()))
            .map_err(|e| Error::io(agent, Op::CreateBackend, e))?;
        Ok(Completer {
            shared,
            thread: Some(thread),
        })
    }

    /// What requests keep to submit and pump tickets.
    pub(super) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.submitted.lock();
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() && t.join().is_err() {
                tracing::error!("the CUDA_IPC completion thread panicked");
            }
        }
    }
}

fn run(s: &Shared, ctx: Option<&CudaContext>) {
    if let Some(Err(e)) = ctx.map(cuda::bind) {
        tracing::warn!(error = %e, "the CUDA_IPC completion thread could not bind its context");
    }
    let mut idle = 0u32;
    loop {
        let seen = *s.submitted.lock();
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        let (mut progressed, mut pending) = (false, false);
        for q in s.queues() {
            let (p, left) = pump(&q);
            progressed |= p;
            pending |= left;
        }
        if !pending {
            idle = 0;
            s.prune();
            let mut g = s.submitted.lock();
            if *g == seen && !s.stop.load(Ordering::SeqCst) {
                s.wake.wait_for(&mut g, IDLE_WAIT);
            }
            continue;
        }
        if progressed {
            idle = 0;
        }
        idle = idle.saturating_add(1);
        if idle <= SPIN_ROUNDS {
            std::thread::yield_now();
        } else {
            let steps = (idle - SPIN_ROUNDS).min(10);
            std::thread::sleep((Duration::from_micros(5) * steps).min(MAX_BACKOFF));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_notif(q: &Arc<NotifQueue>, msg: &[u8]) -> Arc<Notif> {
        Arc::new(Notif {
            agent: "a".into(),
            remote: "a".into(),
            msg: msg.to_vec(),
            route: NotifRoute::Local(q.clone()),
        })
    }

    #[test]
    fn route_keys_separate_destinations() {
        let q = Arc::new(NotifQueue::new());
        let senders = Arc::new(NotifSenders::new(
            nixl_core::backend::PeerAuth::unauthenticated("a"),
        ));
        let local = NotifRoute::Local(q);
        let remote = NotifRoute::Remote {
            senders,
            server: b"srv".to_vec(),
        };
        assert!(local.key().is_empty());
        assert_eq!(remote.key(), b"srv");
    }

    #[test]
    fn local_delivery_and_channel_failure_are_typed() {
        let q = Arc::new(NotifQueue::new());
        local_notif(&q, b"x").deliver().unwrap();
        let mut got = nixl_core::Notifs::new();
        q.drain_into(&mut got);
        assert_eq!(got["a"], vec![b"x".to_vec()]);
        let gone = Notif {
            agent: "a".into(),
            remote: "b".into(),
            msg: b"y".to_vec(),
            route: NotifRoute::Remote {
                senders: Arc::new(NotifSenders::new(
                    nixl_core::backend::PeerAuth::unauthenticated("a"),
                )),
                server: b"nixl-cuda-ipc-test-no-such-server".to_vec(),
            },
        };
        assert_eq!(
            gone.deliver().unwrap_err().kind().as_str(),
            "remote_disconnect"
        );
    }

    /// A completion flag set by the test: the host-side stand-in for a CUDA event, so the
    /// queueing logic (order, exactly once, cancel) runs without a GPU. The real event path is
    /// covered by `gpu_agent_notification_without_initiator_polling` in tests/gpu_agent.rs.
    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Completion for Flag {
        fn query(&self) -> std::result::Result<bool, CudaError> {
            Ok(self.0.load(Ordering::SeqCst))
        }
    }

    fn ticket(q: &Arc<NotifQueue>, msg: &[u8], done: bool) -> (Arc<Flag>, Arc<Ticket>) {
        let f = Arc::new(Flag(AtomicBool::new(done)));
        let t = Arc::new(Ticket::new(f.clone(), local_notif(q, msg)));
        (f, t)
    }

    fn received(q: &NotifQueue, n: usize) -> Vec<Vec<u8>> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut all = nixl_core::Notifs::new();
        while all.values().map(Vec::len).sum::<usize>() < n && std::time::Instant::now() < deadline
        {
            q.wait_nonempty(std::time::Instant::now() + Duration::from_millis(20));
            q.drain_into(&mut all);
        }
        all.remove("a").unwrap_or_default()
    }

    #[test]
    fn the_thread_sends_without_polling_in_post_order() {
        let c = Completer::start("t", None).unwrap();
        let q = Arc::new(NotifQueue::new());
        let (fa, a) = ticket(&q, b"first", false);
        let (_fb, b) = ticket(&q, b"second", true);
        c.shared().submit(a.clone());
        c.shared().submit(b.clone());
        // The second's data is complete, but it waits for the first (same destination).
        std::thread::sleep(Duration::from_millis(20));
        assert!(matches!(b.outcome(), Outcome::Pending));
        assert!(q.is_empty());
        fa.0.store(true, Ordering::SeqCst);
        assert_eq!(received(&q, 2), vec![b"first".to_vec(), b"second".to_vec()]);
        assert!(matches!(a.outcome(), Outcome::Sent));
        assert!(matches!(b.outcome(), Outcome::Sent));
        // Empty queues are forgotten once idle.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !c.shared().queues().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(c.shared().queues().is_empty());
    }

    #[test]
    fn destinations_do_not_wait_for_each_other() {
        let c = Completer::start("t", None).unwrap();
        let q = Arc::new(NotifQueue::new());
        let (_fa, a) = ticket(&q, b"slow", false);
        c.shared().submit(a.clone());
        let b = Arc::new(Ticket::new(
            Arc::new(Flag(AtomicBool::new(true))),
            Arc::new(Notif {
                agent: "a".into(),
                remote: "b".into(),
                msg: b"fast".to_vec(),
                route: NotifRoute::Remote {
                    senders: Arc::new(NotifSenders::new(
                        nixl_core::backend::PeerAuth::unauthenticated("a"),
                    )),
                    server: b"nixl-cuda-ipc-test-absent".to_vec(),
                },
            }),
        ));
        c.shared().submit(b.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(b.outcome(), Outcome::Pending) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Delivered (here: failed, no server) while the other destination is still waiting.
        match b.outcome() {
            Outcome::Failed(f) => assert_eq!(b.error(f).kind().as_str(), "remote_disconnect"),
            o => panic!("{o:?}"),
        }
        assert!(matches!(a.outcome(), Outcome::Pending));
        assert!(q.is_empty());
    }

    #[test]
    fn a_canceled_ticket_is_never_sent_and_does_not_block_the_next() {
        let c = Completer::start("t", None).unwrap();
        let q = Arc::new(NotifQueue::new());
        let (fa, a) = ticket(&q, b"canceled", false);
        let (_fb, b) = ticket(&q, b"kept", true);
        c.shared().submit(a.clone());
        c.shared().submit(b.clone());
        assert!(!a.cancel(), "not sent yet");
        fa.0.store(true, Ordering::SeqCst);
        assert_eq!(received(&q, 1), vec![b"kept".to_vec()]);
        std::thread::sleep(Duration::from_millis(20));
        assert!(q.is_empty());
        assert!(matches!(a.outcome(), Outcome::Canceled));
    }

    #[test]
    fn concurrent_pumps_send_each_notification_once() {
        let c = Completer::start("t", None).unwrap();
        let s = c.shared();
        let q = Arc::new(NotifQueue::new());
        let flags: Vec<_> = (0..200u32)
            .map(|i| {
                let (f, t) = ticket(&q, &i.to_le_bytes(), false);
                s.submit(t);
                f
            })
            .collect();
        let pumpers: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        s.pump_key(b"");
                    }
                })
            })
            .collect();
        for f in &flags {
            f.0.store(true, Ordering::SeqCst);
        }
        for p in pumpers {
            p.join().unwrap();
        }
        let want: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_le_bytes().to_vec()).collect();
        assert_eq!(received(&q, 200), want);
        std::thread::sleep(Duration::from_millis(20));
        assert!(q.is_empty(), "nothing sent twice");
    }

    #[test]
    fn drop_joins_the_thread_with_tickets_pending() {
        let c = Completer::start("t", None).unwrap();
        let q = Arc::new(NotifQueue::new());
        let (_f, t) = ticket(&q, b"never", false);
        c.shared().submit(t.clone());
        let shared = c.shared();
        drop(c);
        assert_eq!(shared.queues().len(), 1, "a queue with a ticket is kept");
        // The thread is gone; a pump from a late `check` still works.
        shared.pump_key(b"");
        assert!(matches!(t.outcome(), Outcome::Pending));
        assert!(q.is_empty());
    }

    /// With a real event (GPU machine only): an event recorded on no work is complete.
    #[test]
    fn a_real_event_ticket_is_sent_by_the_thread() {
        if !cuda::is_available() {
            eprintln!("skipping a_real_event_ticket_is_sent_by_the_thread: no CUDA here");
            return;
        }
        let ctx = cuda::context(0).unwrap();
        let c = Completer::start("t", Some(ctx.clone())).unwrap();
        let q = Arc::new(NotifQueue::new());
        let ev: Arc<dyn Completion> = Arc::new(Event::create(ctx).unwrap());
        let t = Arc::new(Ticket::new(ev, local_notif(&q, b"done")));
        c.shared().submit(t.clone());
        assert_eq!(received(&q, 1), vec![b"done".to_vec()]);
        assert!(matches!(t.outcome(), Outcome::Sent));
        assert!(t.cancel(), "a sent ticket reports it was sent");
    }
}
