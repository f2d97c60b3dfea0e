//! Async completion over UCX (issue 27): a request's future is woken by UCX's completion
//! callback (the post's flush, run by UCX's progress thread), not by a timer; notifications
//! arrive on the stream as UCX delivers them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{Desc, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};
use nixl_testkit::executor::{block_on, next};
use nixl_testkit::ucx::{agent, ucx_or_skip, TCP};

#[test]
fn ucx_tcp_future_is_woken_by_the_completion_callback() {
    if !ucx_or_skip("ucx_tcp_future_is_woken_by_the_completion_callback") {
        return;
    }
    let (a, b) = (
        agent("async-a", TCP, false).unwrap(),
        agent("async-b", TCP, false).unwrap(),
    );
    const LEN: usize = 64 << 20;
    let (src, dst) = (
        Arc::new(HostBuffer::new(LEN).unwrap()),
        Arc::new(HostBuffer::new(LEN).unwrap()),
    );
    src.fill(0x5A);
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
            XferOptions::default().notif(b"done".to_vec()),
        )
        .unwrap();
    let mut stream = b.notif_stream().idle_timeout(Duration::from_secs(20));
    let t = Instant::now();
    a.post_xfer_req(&req).unwrap();
    let (res, polls) = block_on(req.completion());
    res.unwrap();
    let took = t.elapsed();
    assert!(dst.to_vec().iter().all(|&x| x == 0x5A));
    // 64 MiB over UCX tcp takes tens of milliseconds here: a timer-driven future polls
    // hundreds of times; this one at the start and at the callback's wake (a few more where
    // other completions of the agent wake it).
    assert!(polls <= 5, "{polls} polls in {took:?}");
    let (item, _) = block_on(next(&mut stream));
    let nixl_core::completion::Notification {
        from, message: msg, ..
    } = item.expect("a notification").unwrap();
    assert_eq!((from.as_str(), msg.as_slice()), (a.name(), &b"done"[..]));
    eprintln!("64 MiB over UCX tcp in {took:?}, {polls} polls");
}
