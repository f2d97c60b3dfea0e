//! Async completion over libfabric (issue 27): a request's future is woken when the
//! backend's progress thread sees the transfer end, not by a timer; its notification arrives
//! on the target's stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::{Agent, AgentConfig, Desc, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};
use nixl_testkit::executor::{block_on, next};
use nixl_testkit::libfabric::skip_without_provider;

/// An agent of this process with a libfabric tcp loopback backend.
fn tcp_agent(name: &str) -> Agent {
    let a = Agent::new(
        &format!("{name}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    a.create_backend(LibfabricParams::tcp_loopback(1)).unwrap();
    a
}

/// A source and a destination of `len` bytes.
fn buffers(len: usize) -> (Arc<HostBuffer>, Arc<HostBuffer>) {
    let b = || Arc::new(HostBuffer::new(len).unwrap());
    (b(), b())
}

#[test]
fn libfabric_tcp_future_is_woken_by_the_progress_thread() {
    if skip_without_provider("tcp") {
        return;
    }
    let (a, b) = (tcp_agent("fi-async-a"), tcp_agent("fi-async-b"));
    const LEN: usize = 32 << 20;
    let (src, dst) = buffers(LEN);
    src.fill(0x3C);
    dst.fill(0);
    let _ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    b.load_remote_metadata(&a.local_metadata().unwrap())
        .unwrap();
    let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(src.addr(), LEN as u64)]);
    let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(dst.addr(), LEN as u64)]);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &l,
            &r,
            b.name(),
            XferOptions::default().notif(b"fi-done".to_vec()),
        )
        .unwrap();
    let mut stream = b.notif_stream().idle_timeout(Duration::from_secs(20));
    let t = Instant::now();
    a.post_xfer_req(&req).unwrap();
    let (res, polls) = block_on(req.completion());
    res.unwrap();
    let took = t.elapsed();
    assert!(dst.to_vec().iter().all(|&x| x == 0x3C));
    assert!(polls <= 5, "{polls} polls in {took:?}");
    let (item, _) = block_on(next(&mut stream));
    let nixl_core::completion::Notification {
        from, message: msg, ..
    } = item.expect("a notification").unwrap();
    assert_eq!((from.as_str(), msg.as_slice()), (a.name(), &b"fi-done"[..]));
    eprintln!("32 MiB over libfabric tcp in {took:?}, {polls} polls");
}

/// A READ whose future times out is abandoned; once quiescent it can be posted again, and that
/// post is not abandoned with it: it ends `Done` with every byte of the source.
#[test]
fn libfabric_tcp_a_timed_out_read_reposts_and_lands() {
    if skip_without_provider("tcp") {
        return;
    }
    let (a, b) = (tcp_agent("fi-repost-a"), tcp_agent("fi-repost-b"));
    const LEN: usize = 64 << 20;
    let (src, dst) = buffers(LEN);
    src.fill(0x5A);
    let _ra = a.register_mem(vec![dst.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![src.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(dst.addr(), LEN as u64)]);
    let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(src.addr(), LEN as u64)]);
    let req = a
        .create_xfer_req(XferOp::Read, &l, &r, b.name(), XferOptions::default())
        .unwrap();
    let mut timed_out = 0;
    for round in 0..3 {
        dst.fill(0);
        a.post_xfer_req(&req).unwrap();
        let (res, _) = block_on(req.completion_within(Duration::from_micros(50)));
        match res {
            Err(e) if e.kind() == nixl_core::ErrorKind::TimedOut => timed_out += 1,
            other => eprintln!("round {round}: the READ ended before its deadline: {other:?}"),
        }
        req.wait_quiescent(Duration::from_secs(30))
            .expect("quiescent");
        // Posted again after the abandoned one: it must run to its end.
        dst.fill(0);
        a.post_xfer_req(&req).unwrap();
        req.wait(Duration::from_secs(30))
            .expect("the repost ends Done");
        assert!(
            dst.to_vec().iter().all(|&x| x == 0x5A),
            "round {round}: every byte of the repost landed"
        );
    }
    assert!(
        timed_out > 0,
        "no READ timed out: the abandon path never ran"
    );
}
