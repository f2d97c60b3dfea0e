//! A future's first poll starts no thread (issue 33: every poll returns within 100 us). The
//! process's timer thread starts with its first agent and an agent's progress thread (for
//! backends that need one, where the agent was made without it) starts on the timer thread;
//! both used to start inside the first poll, which made it the slowest poll of a path
//! (80-140 us in the poll bench). One test in its own binary: the process's first poll is
//! this test's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use nixl::core::fuzzing::threads_started_here;
use nixl::ucx::UcxParams;
use nixl::{Agent, HostBuffer, MemKind, XferDescList, XferOp};
use nixl_testkit::executor::block_on;

const LEN: usize = 8 << 20;
const BLOCK: u64 = 64 << 10;

#[test]
fn a_first_poll_starts_no_thread() {
    if !nixl_testkit::ucx::ucx_or_skip("first-poll") {
        return;
    }
    // Agents without a progress thread: UCX tcp needs one, so the first future starts it.
    let agent = |role: &str| {
        let a = Agent::new(
            &nixl_testkit::unique(&format!("first-poll-{role}")),
            nixl::agent_config()
                .progress_thread(false)
                .default_timeout(Duration::from_secs(60)),
        )
        .expect("agent");
        a.create_backend(UcxParams::default().transports("tcp".to_owned()))
            .expect("backend");
        a
    };
    let (a, b) = (agent("a"), agent("b"));
    let dst = Arc::new(HostBuffer::new(LEN).expect("alloc"));
    let src = Arc::new(HostBuffer::new(LEN).expect("alloc"));
    src.fill_pattern(3);
    let _ra = a.register_mem(vec![dst.clone()], &[]).expect("register");
    let _rb = b.register_mem(vec![src.clone()], &[]).expect("register");
    a.load_remote_metadata(&b.local_metadata().expect("metadata"))
        .expect("load");
    let n = LEN / BLOCK as usize;
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, dst.addr(), BLOCK, n),
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, n),
            b.name(),
            nixl::XferOptions::default(),
        )
        .expect("make");
    a.post_xfer_req(&req).expect("post");

    let before = threads_started_here();
    let mut fut = req.completion();
    let mut cx = Context::from_waker(Waker::noop());
    let _ = Pin::new(&mut fut).poll(&mut cx);
    assert_eq!(
        threads_started_here() - before,
        0,
        "the first poll started a thread (the timer's or the agent's progress thread) on the executor's thread"
    );
    let (res, _) = block_on(fut);
    res.expect("the READ completes: the progress thread started elsewhere drives it");
    assert!(dst.to_vec() == src.to_vec(), "every byte landed");
}
