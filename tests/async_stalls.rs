//! Async without stalls (issue 33): a future's poll reads the request's state and never drives
//! the backend on the executor's thread (over UCX's own copies a poll used to run up to 64
//! progress passes, each copying, and blocked the thread for 95-232 ms), and dropping an owning
//! future lets its request go without waiting for the transfer (it used to wait for the RMA, up
//! to `cancel_timeout`). Shown by counting `ucp_worker_progress` calls on the polling thread,
//! which must stay at zero; the poll durations and deadline overruns are measured by the
//! `poll_bench` bench (docs/reliability.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nixl::ucx::fuzzing::progress_calls_here;
use nixl::ucx::UcxParams;
use nixl::{Agent, HostBuffer, MemKind, Registration, XferDescList, XferOp};
use nixl_testkit::executor::block_on;

const LEN: usize = 256 << 20;
const BLOCK: u64 = 512 << 10;

struct Pair {
    a: Agent,
    b: Agent,
    dst: Arc<HostBuffer>,
    src: Arc<HostBuffer>,
    _regs: (Registration, Registration),
}

/// Two agents of this process over UCX `tls` with UCX's own copies (no direct CMA), `b`'s
/// memory filled with a pattern for `a` to READ.
fn pair(tag: &str, tls: &str) -> Option<Pair> {
    if !nixl_testkit::ucx::ucx_or_skip(tag) {
        return None;
    }
    Some(pair_with(tag, |a| {
        a.create_backend(
            UcxParams::default()
                .transports(tls.to_owned())
                .direct_cma(false),
        )
        .map(|_| ())
    }))
}

/// Two agents of this process, each with the backend `backend` creates, `b`'s memory filled
/// with a pattern for `a` to READ.
fn pair_with(tag: &str, backend: impl Fn(&Agent) -> nixl::Result<()>) -> Pair {
    let agent = |role: &str| {
        let a = Agent::new(
            &nixl_testkit::unique(&format!("{tag}-{role}")),
            nixl::agent_config().default_timeout(Duration::from_secs(60)),
        )
        .expect("agent");
        backend(&a).expect("backend");
        a
    };
    let (a, b) = (agent("a"), agent("b"));
    let dst = Arc::new(HostBuffer::new(LEN).expect("alloc"));
    let src = Arc::new(HostBuffer::new(LEN).expect("alloc"));
    src.fill_pattern(7);
    let ra = a.register_mem(vec![dst.clone()], &[]).expect("register");
    let rb = b.register_mem(vec![src.clone()], &[]).expect("register");
    a.load_remote_metadata(&b.local_metadata().expect("metadata"))
        .expect("load");
    Pair {
        a,
        b,
        dst,
        src,
        _regs: (ra, rb),
    }
}

fn read(p: &Pair) -> nixl::XferReq {
    let n = LEN / BLOCK as usize;
    p.a.create_xfer_req(
        XferOp::Read,
        &XferDescList::blocks(MemKind::Dram, p.dst.addr(), BLOCK, n),
        &XferDescList::blocks(MemKind::Dram, p.src.addr(), BLOCK, n),
        p.b.name(),
        nixl::XferOptions::default(),
    )
    .expect("make")
}

fn polls_never_drive(tag: &str, tls: &str) {
    let Some(p) = pair(tag, tls) else {
        return;
    };
    for round in 0..3 {
        p.dst.fill(0);
        let req = read(&p);
        p.a.post_xfer_req(&req).expect("post");
        let before = progress_calls_here();
        let t = Instant::now();
        let (res, polls) = block_on(req.completion());
        res.expect("the READ");
        let driven = progress_calls_here() - before;
        eprintln!(
            "{tag} round {round}: 256 MiB READ awaited in {:?}, {polls} polls",
            t.elapsed()
        );
        assert_eq!(
            driven, 0,
            "{tag}: the polls drove the UCX worker {driven} times on the executor's thread"
        );
        assert!(p.dst.to_vec() == p.src.to_vec(), "{tag}: every byte landed");
    }
}

#[test]
fn a_poll_never_drives_ucx_tcp() {
    polls_never_drive("poll-tcp", "tcp");
}

#[test]
fn a_poll_never_drives_ucx_cma() {
    polls_never_drive("poll-cma", "shm,cma,self");
}

/// Polls a future once.
fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(f).poll(&mut cx)
}

/// Dropping an owning future whose 256 MiB READ is in flight returns without driving the
/// worker or waiting for the transfer; the agent holds the memory until the backend lets go,
/// then releases it; the peer keeps working.
#[test]
fn dropping_an_owning_future_never_waits() {
    let Some(p) = pair("drop-owning", "tcp") else {
        return;
    };
    let req = read(&p);
    p.a.post_xfer_req(&req).expect("post");
    let mut fut = req.into_completion();
    assert!(
        poll_once(&mut fut).is_pending(),
        "256 MiB over tcp is in flight"
    );
    let before = progress_calls_here();
    drop(fut);
    assert_eq!(
        progress_calls_here() - before,
        0,
        "the drop drove the worker (it waited for the transfer)"
    );
    // The agent drains the request (its progress thread, started by the future's poll) and
    // then releases what it held.
    let end = Instant::now() + Duration::from_secs(30);
    while p.a.draining_requests() > 0 {
        assert!(Instant::now() < end, "the dropped request never drained");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The peer still works.
    p.dst.fill(0);
    let again = read(&p);
    p.a.post_xfer_req(&again).expect("post");
    again.wait(Duration::from_secs(60)).expect("the next READ");
    assert!(p.dst.to_vec() == p.src.to_vec());
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn stream_peer_role() {
    nixl_testkit::two_process::child_main(|env| {
        let e = |e: nixl::Error| e.to_string();
        let a = Agent::new(&env.name, nixl::agent_config().listen(true)).map_err(e)?;
        a.create_backend(UcxParams::default().transports("tcp".to_string()))
            .map_err(e)?;
        env.connect(&a, Duration::from_secs(20))?;
        for i in 0..3 {
            a.gen_notif(&env.parent, format!("kv-{i}").as_bytes(), &[])
                .map_err(e)?;
        }
        // Wait to be killed.
        std::thread::sleep(Duration::from_secs(120));
        Ok(())
    });
}

/// A stream that ends with its peer: the peer's notifications, then `RemoteDisconnect` once
/// its process is killed, then the end (it used to go on until an idle timeout, or forever).
#[test]
fn a_notification_stream_ends_when_its_peer_dies() {
    if !nixl_testkit::ucx::ucx_or_skip("stream_ends") {
        return;
    }
    let p = Agent::new(
        &nixl_testkit::unique("stream-parent"),
        nixl::agent_config().listen(true),
    )
    .expect("agent");
    p.create_backend(UcxParams::default().transports("tcp".to_string()))
        .expect("UCX");
    let name = nixl_testkit::unique("stream-peer");
    let mut child =
        nixl_testkit::two_process::Child::spawn("stream_peer_role", &p, &name, &[]).expect("spawn");
    let mut stream = p.notif_stream().end_when_gone(&name);
    for i in 0..3 {
        let (item, _) = block_on(nixl_testkit::executor::next(&mut stream));
        let n = item.expect("an item").expect("a notification");
        assert_eq!(
            (n.from.as_str(), n.message),
            (name.as_str(), format!("kv-{i}").into_bytes())
        );
    }
    child.kill();
    let killed = Instant::now();
    let (item, _) = block_on(nixl_testkit::executor::next(&mut stream));
    let e = item.expect("the peer's end").expect_err("an error item");
    assert_eq!(e.kind(), nixl::core::ErrorKind::RemoteDisconnect, "{e}");
    assert!(e.to_string().contains(&name), "{e}");
    eprintln!("stream ended {:?} after the kill: {e}", killed.elapsed());
    let (item, _) = block_on(nixl_testkit::executor::next(&mut stream));
    assert!(item.is_none(), "the stream ended");
}

/// A request that ended by its deadline while 256 MiB were in flight drains; its quiescence
/// future resolves once UCX let go of it, and from then on nothing lands in its memory (a
/// fresh sentinel stays for 200 ms).
#[test]
fn a_timed_out_request_is_quiescent_once_its_future_says_so() {
    let Some(p) = pair("quiescence", "tcp") else {
        return;
    };
    p.dst.fill(0);
    let req = read(&p);
    p.a.post_xfer_req(&req).expect("post");
    let (r, _) = block_on(req.completion_within(Duration::from_micros(200)));
    let e = r.expect_err("256 MiB over tcp take longer than 200 us");
    assert_eq!(e.kind(), nixl::core::ErrorKind::TimedOut, "{e}");
    assert!(!req.is_in_flight());
    let (q, _) = block_on(req.quiescence(Duration::from_secs(60)));
    q.expect("quiescent once UCX is done with the READ");
    assert!(req.is_quiescent());
    p.dst.fill(0xEE);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        p.dst.to_vec().iter().all(|&b| b == 0xEE),
        "a byte landed after the request was quiescent"
    );
}

/// The same over libfabric's tcp provider: the rails' progress threads drive a posted READ
/// (post its operations, read its completion queues); the polls of the future awaiting it only
/// look (before, each poll pumped the rails on the executor's thread).
#[test]
fn a_poll_never_drives_libfabric_tcp() {
    use nixl::libfabric::fuzzing::drives_here;
    use nixl::libfabric::LibfabricParams;
    let tag = "poll-libfabric-tcp";
    if let Err(e) = nixl::libfabric::library_status() {
        nixl_testkit::skip(
            tag,
            nixl_testkit::Dep::Libfabric,
            format!("no usable libfabric: {e}"),
        );
        return;
    }
    let p = pair_with(tag, |a| {
        a.create_backend(LibfabricParams::tcp_loopback(1))
            .map(|_| ())
    });
    for round in 0..2 {
        p.dst.fill(0);
        let req = read(&p);
        p.a.post_xfer_req(&req).expect("post");
        let before = drives_here();
        let (res, polls) = block_on(req.completion());
        res.expect("the READ");
        let driven = drives_here() - before;
        eprintln!("{tag} round {round}: {polls} polls, {driven} drives on this thread");
        assert_eq!(
            driven, 0,
            "{tag}: the polls drove libfabric {driven} times on the executor's thread"
        );
        assert!(p.dst.to_vec() == p.src.to_vec(), "{tag}: every byte landed");
    }
}
