//! Completion without polling (issue 27, part 1): a request's completion as a `Future` and
//! notifications as a `Stream`, under tokio and under a minimal executor written here (a
//! thread that parks until woken, counting its polls): a future is woken by the backend's
//! completion (INPROC's completion thread), not by a timer; deadlines end it `TimedOut`;
//! dropping an owning future cancels its request; a backend that cannot signal completions
//! (the fault injector wrapping INPROC) is still finished, by re-checks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nixl_core::backend::fault::{FaultLog, FaultParams, FaultPlan};
use nixl_core::backend::inproc::Completion;
use nixl_core::{
    Agent, AgentConfig, Desc, ErrorKind, HostBuffer, InprocParams, MemKind, Registration,
    XferDescList, XferOp, XferOptions, XferReq,
};
use nixl_testkit::executor::{block_on, next};

struct Pair {
    a: Agent,
    b: Agent,
    src: Arc<HostBuffer>,
    dst: Arc<HostBuffer>,
    _regs: (Registration, Registration),
}

const LEN: usize = 1 << 16;

fn pair(tag: &str, completion: Completion, fault: bool) -> Pair {
    let pid = std::process::id();
    let (an, bn) = (format!("{tag}-a-{pid}"), format!("{tag}-b-{pid}"));
    let a = Agent::new(&an, AgentConfig::default()).unwrap();
    let b = Agent::new(&bn, AgentConfig::default()).unwrap();
    let params = InprocParams::default().completion(completion);
    if fault {
        a.create_backend(FaultParams::new(
            params.clone(),
            FaultPlan::default(),
            Arc::new(FaultLog::default()),
        ))
        .unwrap();
    } else {
        a.create_backend(params.clone()).unwrap();
    }
    b.create_backend(params).unwrap();
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let dst = Arc::new(HostBuffer::new(LEN).unwrap());
    src.fill(0xA5);
    dst.fill(0);
    let ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    b.load_remote_metadata(&a.local_metadata().unwrap())
        .unwrap();
    Pair {
        a,
        b,
        src,
        dst,
        _regs: (ra, rb),
    }
}

fn write(p: &Pair, notif: Option<&[u8]>) -> XferReq {
    let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(p.src.addr(), LEN as u64)]);
    let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(p.dst.addr(), LEN as u64)]);
    let opts = XferOptions::default().notif(notif.map(<[u8]>::to_vec));
    p.a.create_xfer_req(XferOp::Write, &l, &r, p.b.name(), opts)
        .unwrap()
}

fn landed(p: &Pair) -> bool {
    p.dst.to_vec().iter().all(|&b| b == 0xA5)
}

const LATER: Duration = Duration::from_millis(60);

#[test]
fn the_future_is_woken_by_the_completion_not_by_a_timer() {
    let p = pair("wk", Completion::Deferred(LATER), false);
    let req = write(&p, None);
    let t = Instant::now();
    p.a.post_xfer_req(&req).unwrap();
    let (r, polls) = block_on(req.completion());
    r.unwrap();
    assert!(t.elapsed() >= LATER);
    assert!(landed(&p));
    // Polled at the start and once per wake: a timer-driven future would poll every few
    // microseconds over the 60 ms.
    assert!(polls <= 3, "{polls} polls");
}

#[test]
fn a_deadline_ends_the_future_timed_out() {
    let p = pair("dl", Completion::Deferred(Duration::from_secs(20)), false);
    let req = write(&p, None);
    p.a.post_xfer_req(&req).unwrap();
    let t = Instant::now();
    let (r, polls) = block_on(req.completion_within(Duration::from_millis(80)));
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(t.elapsed() >= Duration::from_millis(80));
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(polls <= 3, "{polls} polls");
    // The request's state says so too.
    assert_eq!(
        p.a.check_xfer_state(&req).unwrap_err().kind(),
        ErrorKind::TimedOut
    );
    drop(req);
    assert!(!landed(&p), "a timed-out request moved nothing");
}

#[test]
fn dropping_an_owning_future_cancels_its_request() {
    let p = pair("dr", Completion::Deferred(LATER), false);
    let req = write(&p, Some(b"never"));
    p.a.post_xfer_req(&req).unwrap();
    let mut fut = req.into_completion();
    let waker = Waker::noop();
    assert!(Pin::new(&mut fut)
        .poll(&mut Context::from_waker(waker))
        .is_pending());
    drop(fut);
    std::thread::sleep(LATER * 3);
    assert!(!landed(&p), "the canceled copy never ran");
    assert!(p.b.get_notifs().unwrap().is_empty(), "no notification");
}

#[test]
fn dropping_a_borrowing_future_leaves_the_request_running() {
    let p = pair("db", Completion::Deferred(LATER), false);
    let req = write(&p, None);
    p.a.post_xfer_req(&req).unwrap();
    let mut fut = req.completion();
    assert!(Pin::new(&mut fut)
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    drop(fut);
    req.wait(Duration::from_secs(10)).unwrap();
    assert!(landed(&p));
}

#[test]
fn a_cancel_from_another_thread_wakes_the_future() {
    let p = pair("cx", Completion::Deferred(Duration::from_secs(20)), false);
    let req = Arc::new(write(&p, None));
    p.a.post_xfer_req(&req).unwrap();
    let r2 = req.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        r2.cancel().unwrap();
    });
    let t = Instant::now();
    let (r, polls) = block_on(req.completion());
    canceller.join().unwrap();
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Canceled);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(polls <= 3, "{polls} polls");
}

#[test]
fn misuse_is_typed() {
    let p = pair("mu", Completion::Immediate, false);
    let req = write(&p, None);
    // Never posted.
    let (r, _) = block_on(req.completion());
    assert_eq!(r.unwrap_err().kind(), ErrorKind::NotAllowed);
    // Polled after it finished.
    p.a.post_xfer_req(&req).unwrap();
    let mut fut = req.completion();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(
        Pin::new(&mut fut).poll(&mut cx),
        Poll::Ready(Ok(()))
    ));
    assert!(
        matches!(Pin::new(&mut fut).poll(&mut cx), Poll::Ready(Err(e)) if e.kind() == ErrorKind::NotAllowed)
    );
}

#[test]
fn a_backend_that_cannot_signal_is_finished_by_rechecks() {
    // The fault injector wraps INPROC and does not say it wakes: its futures are re-checked
    // on the timer (more polls, still done).
    let p = pair("fb", Completion::Deferred(LATER), true);
    let req = write(&p, None);
    p.a.post_xfer_req(&req).unwrap();
    let (r, polls) = block_on(req.completion());
    r.unwrap();
    assert!(landed(&p));
    assert!(polls > 3, "re-checked: {polls} polls");
}

#[test]
fn notifications_stream_in_order_woken_by_arrival() {
    let p = pair("ns", Completion::Immediate, false);
    let mut stream = p.b.notif_stream();
    let sender = p.a.clone();
    let to = p.b.name().to_owned();
    let t = std::thread::spawn(move || {
        for i in 0..100u32 {
            if i % 25 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            sender.gen_notif(&to, &i.to_le_bytes(), &[]).unwrap();
        }
    });
    let mut polls_total = 0;
    for i in 0..100u32 {
        let (item, polls) = block_on(next(&mut stream));
        polls_total += polls;
        let nixl_core::completion::Notification {
            from, message: msg, ..
        } = item.unwrap().unwrap();
        assert_eq!(from, p.a.name());
        assert_eq!(msg, i.to_le_bytes());
    }
    t.join().unwrap();
    // One or two polls per item, a few more where the sender paused.
    assert!(polls_total <= 100 * 3, "{polls_total} polls");
}

/// An idle timeout ends the stream (`None`), so a `try_next()?` loop leaves cleanly (it used
/// to yield `Err(TimedOut)` and go on, which ended such a loop with an error); what arrives
/// later waits for the next stream.
#[test]
fn an_idle_stream_ends() {
    let p = pair("ni", Completion::Immediate, false);
    let mut stream = p.b.notif_stream().idle_timeout(Duration::from_millis(50));
    p.a.gen_notif(p.b.name(), b"first", &[]).unwrap();
    let (item, _) = block_on(next(&mut stream));
    assert_eq!(item.unwrap().unwrap().message, b"first");
    let (item, polls) = block_on(next(&mut stream));
    assert!(item.is_none(), "the idle timeout ends the stream");
    assert!(polls <= 3, "{polls} polls");
    let (item, _) = block_on(next(&mut stream));
    assert!(item.is_none(), "an ended stream stays ended");
    p.a.gen_notif(p.b.name(), b"late", &[]).unwrap();
    let mut again = p.b.notif_stream().idle_timeout(Duration::from_secs(5));
    let (item, _) = block_on(next(&mut again));
    assert_eq!(item.unwrap().unwrap().message, b"late");
}

/// Under tokio: many requests awaited at once from tasks (owning futures, `'static`), and the
/// notification stream read by another task; no thread parked per wait: each request
/// completes 200 ms after its post, so 64 waits that each held one of the runtime's 2 worker
/// threads would take at least 64 x 200 ms / 2 = 6.4 s; awaited, they overlap (bound: half
/// that, 3.2 s, on a shared machine).
#[test]
fn under_tokio_many_requests_and_a_stream() {
    let each = Duration::from_millis(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let p = Arc::new(pair("tk", Completion::Deferred(each), false));
    let started = std::time::Instant::now();
    rt.block_on(async {
        let mut stream = p.b.notif_stream();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < 64 {
                let n = next(&mut stream).await.unwrap().unwrap();
                got.push(u32::from_le_bytes(n.message.try_into().unwrap()));
            }
            got
        });
        let mut tasks = Vec::new();
        for i in 0..64u32 {
            let req = write(&p, Some(&i.to_le_bytes()));
            p.a.post_xfer_req(&req).unwrap();
            tasks.push(tokio::spawn(req.into_completion()));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let mut got = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .unwrap()
            .unwrap();
        got.sort_unstable();
        assert_eq!(got, (0..64).collect::<Vec<_>>());
    });
    let took = started.elapsed();
    let parked = each * 64 / 2;
    assert!(
        took < parked / 2,
        "64 awaited requests of {each:?} took {took:?}: waits held the workers (serial: {parked:?})"
    );
    assert!(landed(&p));
}

/// Issue 36: one failure, one label. A request whose peer was invalidated while it flew ends
/// `RemoteDisconnect` labelled `CheckXfer` whether a check, a blocking wait or a future finds
/// it (before, a check said `PostXfer`); a post to the forgotten peer says `PostXfer`; the
/// deadline of the caller's own future says `Wait`.
#[test]
fn a_failure_has_one_label_whichever_call_finds_it() {
    use nixl_core::Op;
    for how in ["check", "wait", "future"] {
        let p = pair(
            &format!("label-{how}"),
            Completion::Deferred(Duration::from_secs(20)),
            false,
        );
        let (req, again) = (write(&p, None), write(&p, None));
        p.a.post_xfer_req(&req).unwrap();
        p.a.invalidate_remote_metadata(p.b.name()).unwrap();
        let e = match how {
            "check" => p.a.check_xfer_state(&req).unwrap_err(),
            "wait" => req.wait(Duration::from_secs(5)).unwrap_err(),
            _ => block_on(req.completion()).0.unwrap_err(),
        };
        assert_eq!(
            (e.kind(), e.op()),
            (ErrorKind::RemoteDisconnect, Some(Op::CheckXfer)),
            "{how}: {e}"
        );
        let e = p.a.post_xfer_req(&again).map(|_| ()).unwrap_err();
        assert_eq!(e.op(), Some(Op::PostXfer), "{how}: {e}");
    }
    let p = pair(
        "label-deadline",
        Completion::Deferred(Duration::from_secs(20)),
        false,
    );
    let req = write(&p, None);
    p.a.post_xfer_req(&req).unwrap();
    let e = block_on(req.completion_within(Duration::from_millis(20)))
        .0
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.op()),
        (ErrorKind::TimedOut, Some(Op::Wait)),
        "{e}"
    );
}

/// INPROC under its own name, counting the calls to its transfers' [`BackendXfer::arm_wake`]
/// (a backend that defers its wake-up to an awaiting future, as CUDA_IPC does, queues it
/// there).
mod armed {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use nixl_core::backend::inproc::InprocBackend;
    use nixl_core::backend::{
        Backend, BackendContext, BackendMd, BackendParams, BackendXfer, Capabilities, PeerBackend,
        XferSpec, XferState,
    };
    use nixl_core::{InprocParams, RegionDesc, Result};

    pub(crate) struct Armed(InprocBackend, pub(crate) Arc<AtomicUsize>);

    struct ArmedXfer(Box<dyn BackendXfer>, Arc<AtomicUsize>);

    impl BackendXfer for ArmedXfer {
        fn post(&mut self) -> Result<XferState> {
            self.0.post()
        }
        fn check(&mut self) -> Result<XferState> {
            self.0.check()
        }
        fn state(&mut self) -> Result<XferState> {
            self.0.state()
        }
        fn arm_wake(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.arm_wake();
        }
        fn cancel(&mut self) -> Result<()> {
            self.0.cancel()
        }
        fn abandon(&mut self) {
            self.0.abandon();
        }
    }

    impl Backend for Armed {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
            self.0.register(region)
        }
        fn deregister(&self, md: BackendMd) -> Result<()> {
            self.0.deregister(md)
        }
        fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
            Ok(Box::new(ArmedXfer(
                self.0.prepare_xfer(spec)?,
                self.1.clone(),
            )))
        }
        fn wakes(&self) -> bool {
            self.0.wakes()
        }
        fn peers(&self) -> Option<&dyn PeerBackend> {
            self.0.peers()
        }
    }

    pub(crate) struct ArmedParams(pub(crate) InprocParams, pub(crate) Arc<AtomicUsize>);

    impl BackendParams for ArmedParams {
        fn backend_name(&self) -> &str {
            "INPROC"
        }
        fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
            let inner = InprocBackend::with_params(ctx, self.0);
            Ok(Arc::new(Armed(inner, self.1)))
        }
    }
}

/// A future that finds its request in flight arms the backend's wake (where a backend defers
/// it, the first such poll queues it); a blocking wait never does, so it never pays for it.
#[test]
fn an_awaiting_future_arms_the_backends_wake_and_a_blocking_wait_does_not() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let arms = Arc::new(AtomicUsize::new(0));
    let pid = std::process::id();
    let a = Agent::new(&format!("arm-a-{pid}"), AgentConfig::default()).unwrap();
    let b = Agent::new(&format!("arm-b-{pid}"), AgentConfig::default()).unwrap();
    let params = InprocParams::default().completion(Completion::Deferred(LATER));
    a.create_backend(armed::ArmedParams(params.clone(), arms.clone()))
        .unwrap();
    b.create_backend(params).unwrap();
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let dst = Arc::new(HostBuffer::new(LEN).unwrap());
    src.fill(0xA5);
    let _ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(src.addr(), LEN as u64)]);
    let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(dst.addr(), LEN as u64)]);
    let req = a
        .create_xfer_req(XferOp::Write, &l, &r, b.name(), XferOptions::default())
        .unwrap();
    // Blocking: posted and waited for, never armed.
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(10)).unwrap();
    assert_eq!(
        arms.load(Ordering::SeqCst),
        0,
        "a blocking wait armed the wake"
    );
    // Awaited: the first poll finds it in flight (the copy comes 60 ms later) and arms it.
    dst.fill(0);
    a.post_xfer_req(&req).unwrap();
    let (res, polls) = block_on(req.completion());
    res.unwrap();
    assert!(dst.to_vec().iter().all(|&x| x == 0xA5));
    let armed = arms.load(Ordering::SeqCst);
    assert!(
        (1..=polls).contains(&armed),
        "{armed} arms over {polls} polls"
    );
}
