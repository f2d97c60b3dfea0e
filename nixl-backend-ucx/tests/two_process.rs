//! Two processes over UCX (tcp and shared memory), on the shared harness
//! `nixl_testkit::two_process`: this test binary spawns itself as the target, the agents
//! exchange metadata over the side channel, and the initiator writes, reads, notifies and
//! fences the target; the target verifies what it holds whenever a notification arrives and
//! reports a digest back. Another test kills the target while a transfer to it is in flight
//! and checks the initiator's request ends in a typed error.

use nixl_testkit::ucx as common;

use std::time::{Duration, Instant};

use nixl_core::{
    Agent, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferState, XferTarget,
};
use nixl_testkit::signal::Sig;
use nixl_testkit::two_process::{child_main, Child, ChildEnv};

const DEADLINE: Duration = Duration::from_secs(60);
const BLOCK: usize = 64 << 10;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The target's side: runs only when spawned by a parent test.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn child_target_role() {
    child_main(target_main);
}

fn target_main(env: ChildEnv) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let (tls, len): (String, usize) = (env.var("tls")?, env.parse("len")?);
    let parent = env.parent.clone();
    let a = Agent::new(&env.name, common::config(true)).map_err(e)?;
    a.create_backend(common::params(&tls)).map_err(e)?;
    let mem = common::buf(len);
    mem.fill_pattern(7);
    let _reg = a.register_mem(vec![mem.clone()], &[]).map_err(e)?;
    env.connect(&a, Duration::from_secs(20))?;
    a.gen_notif(&parent, format!("addr:{}", mem.addr()).as_bytes(), &[])
        .map_err(e)?;
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        let Ok(n) = a.wait_notifs(Duration::from_millis(200)) else {
            continue;
        };
        for msg in n.get(&parent).into_iter().flatten() {
            if msg == b"exit" {
                return Ok(());
            }
            // Whatever arrives, answer with what memory holds at that moment.
            let reply = format!(
                "{}:{:016x}",
                String::from_utf8_lossy(msg),
                fnv(&mem.to_vec())
            );
            a.gen_notif(&parent, reply.as_bytes(), &[]).map_err(e)?;
        }
    }
    Err("no exit message within the deadline".into())
}

/// A spawned target and its name.
struct Target {
    child: Child,
    name: String,
}

impl Target {
    fn spawn(parent: &Agent, tls: &str, len: usize) -> Target {
        let name = common::unique("target");
        let child = Child::spawn(
            "child_target_role",
            parent,
            &name,
            &[("tls", tls), ("len", &len.to_string())],
        )
        .expect("spawn target");
        Target { child, name }
    }

    /// The next notification from the target.
    fn next(&mut self, parent: &Agent) -> String {
        let m = self
            .child
            .next(parent, DEADLINE)
            .unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8(m).expect("utf-8 notification")
    }

    /// Waits for the process to exit; its status code.
    fn join(&mut self, timeout: Duration) -> Option<i32> {
        self.child.join(timeout).and_then(|st| st.code())
    }
}

fn connect(parent: &Agent, t: &mut Target) -> u64 {
    let msg = t.next(parent);
    assert!(
        parent.check_remote_metadata(&t.name, None),
        "target metadata loaded before its first notification"
    );
    msg.strip_prefix("addr:")
        .and_then(|a| a.parse().ok())
        .expect("address message")
}

fn scenario(tls: &str) {
    if !common::ucx_or_skip("two_process") {
        return;
    }
    let len = 4 << 20;
    let blocks = len / BLOCK;
    let parent = common::agent("initiator", tls, true).expect("agent");
    let src = common::buf(len);
    let back = common::buf(len);
    src.fill_pattern(1);
    let _r = parent
        .register_mem(vec![src.clone(), back.clone()], &[])
        .expect("register");
    let mut t = Target::spawn(&parent, tls, len);
    let raddr = connect(&parent, &mut t);
    let path = parent.path_report(&t.name);
    eprintln!("two_process[{tls}]: path {path:?}");
    assert!(!path.is_empty(), "a path is reported");
    if tls == common::TCP {
        assert!(
            path[0].1.contains("tcp"),
            "tcp transport reported: {path:?}"
        );
    }

    // Expected target memory: its own pattern with our blocks written in permuted order.
    let mut expected = {
        let b = HostBuffer::new(len).expect("alloc");
        b.fill_pattern(7);
        b.to_vec()
    };
    let srcv = src.to_vec();
    let perm: Vec<usize> = (0..blocks).map(|i| (i * 7 + 3) % blocks).collect();
    let local = parent
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, blocks),
            &[],
        )
        .expect("prep local");
    let remote = parent
        .prep_xfer_dlist(
            XferTarget::Agent(&t.name),
            &XferDescList::blocks(MemKind::Dram, raddr, BLOCK as u64, blocks),
            &[],
        )
        .expect("prep remote");
    // Write half of the blocks, permuted, with a notification.
    let li: Vec<usize> = (0..blocks / 2).collect();
    let ri: Vec<usize> = li.iter().map(|&i| perm[i]).collect();
    for (&l, &r) in li.iter().zip(&ri) {
        expected[r * BLOCK..(r + 1) * BLOCK].copy_from_slice(&srcv[l * BLOCK..(l + 1) * BLOCK]);
    }
    let w = parent
        .make_prepped_xfer(
            XferOp::Write,
            &local,
            &li,
            &remote,
            &ri,
            XferOptions::with_notif(b"w1".to_vec()),
        )
        .expect("make write");
    parent.post_xfer_req(&w).expect("post write");
    w.wait(DEADLINE).expect("write completes");
    let reply = t.next(&parent);
    assert_eq!(
        reply,
        format!("w1:{:016x}", fnv(&expected)),
        "target held the data when the notification arrived"
    );

    // Read everything back, by block index, and compare.
    let back_list = parent
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, back.addr(), BLOCK as u64, blocks),
            &[],
        )
        .expect("prep back");
    let all: Vec<usize> = (0..blocks).collect();
    let r = parent
        .make_prepped_xfer(
            XferOp::Read,
            &back_list,
            &all,
            &remote,
            &all,
            XferOptions::default(),
        )
        .expect("make read");
    parent.post_xfer_req(&r).expect("post read");
    r.wait(DEADLINE).expect("read completes");
    assert!(back.to_vec() == expected, "read-back matches");
    // Repost once done.
    back.fill(0);
    parent.post_xfer_req(&r).expect("repost read");
    r.wait(DEADLINE).expect("read completes again");
    assert!(back.to_vec() == expected, "second read-back matches");

    // Standalone notifications keep their order.
    for i in 0..10 {
        parent
            .gen_notif(&t.name, format!("n{i}").as_bytes(), &[])
            .expect("gen_notif");
    }
    for i in 0..10 {
        let m = t.next(&parent);
        assert!(
            m.starts_with(&format!("n{i}:")),
            "echo {i} in order, got {m}"
        );
    }
    parent
        .gen_notif(&t.name, b"exit", &[])
        .expect("exit message");
    assert_eq!(t.join(DEADLINE), Some(0), "target exits cleanly");

    // An invalidated peer fails its requests with a typed error.
    parent
        .invalidate_remote_metadata(&t.name)
        .expect("invalidate");
    let e = parent
        .post_xfer_req(&r)
        .expect_err("post to an invalidated peer");
    assert!(
        matches!(
            e,
            Error::PeerRestarted { .. } | Error::RemoteDisconnect { .. }
        ),
        "typed error: {e}"
    );
}

#[test]
fn two_process_tcp() {
    scenario(common::TCP);
}

#[test]
fn two_process_shm() {
    scenario(common::SHM);
}

/// Kills the target while a WRITE to it is in flight: the target is stopped (SIGSTOP) first,
/// so the 64 MiB WRITE cannot complete and `post` must return `InProgress`; then it is killed
/// (SIGKILL). The request ends within its deadline (never a hang) and is terminal. Where UCX
/// detects peer failure (tcp) it ends in a typed uncertain error, is listed as uncertain, and
/// later requests to the dead peer fail too; where it cannot (shared memory: the path report
/// says "no peer-failure detection") the initiator may finish writing into the shared segment
/// the dead process had mapped, so `Done` is a possible outcome there. UCX makes the copies
/// (`direct_cma` off): a direct CMA copy does not wait for the target to run, so it is not held
/// in flight by a stopped target (`kill_target_during_direct_cma_copies` covers that path).
fn kill_mid_transfer(tls: &str, detects_failure: bool) {
    if !common::ucx_or_skip("kill_mid_transfer") {
        return;
    }
    let len = 64 << 20;
    let parent = Agent::new(&common::unique("initiator"), common::config(true)).expect("agent");
    parent
        .create_backend(common::params(tls).direct_cma(false))
        .expect("UCX backend");
    let src = common::buf(len);
    let _r = parent
        .register_mem(vec![src.clone()], &[])
        .expect("register");
    let mut t = Target::spawn(&parent, tls, len);
    let raddr = connect(&parent, &mut t);
    let path = parent.path_report(&t.name);
    assert_eq!(
        !path[0].1.contains("[no peer-failure detection]"),
        detects_failure,
        "{path:?}"
    );
    let blk = 4u64 << 20;
    let n = len / blk as usize;
    let req = parent
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), blk, n),
            &XferDescList::blocks(MemKind::Dram, raddr, blk, n),
            &t.name,
            XferOptions::default()
                .timeout(Duration::from_secs(5))
                .no_merge(true),
        )
        .expect("make");
    parent.post_xfer_req(&req).expect("first post");
    req.wait(DEADLINE).expect("first transfer completes");
    t.child.signal(Sig::Stop).expect("SIGSTOP the target");
    let posted = parent
        .post_xfer_req(&req)
        .expect("post to the stopped target");
    assert_eq!(
        posted,
        XferState::InProgress,
        "a 64 MiB WRITE to a stopped target over {tls} is in flight"
    );
    assert!(req.is_in_flight());
    t.child.kill();
    let start = Instant::now();
    let outcome = req.wait(DEADLINE);
    eprintln!(
        "kill_mid_transfer[{tls}]: {outcome:?} after {:?}",
        start.elapsed()
    );
    assert!(!req.is_in_flight(), "the request is terminal");
    if !detects_failure {
        if let Err(e) = outcome {
            assert!(e.is_uncertain(), "typed, uncertain-outcome error: {e:?}");
        }
        return;
    }
    let e = outcome.expect_err("a WRITE to a killed target cannot complete");
    assert!(e.is_uncertain(), "typed, uncertain-outcome error: {e:?}");
    assert!(
        parent.uncertain_requests().iter().any(|u| u.id == req.id()),
        "listed as uncertain"
    );
    // Later requests fail too, without hanging (or are refused: a cancel that could not be
    // confirmed keeps the request's memory and retires it).
    let again = parent
        .post_xfer_req(&req)
        .and_then(|_| req.wait(Duration::from_secs(20)));
    assert!(again.is_err(), "a dead peer keeps failing requests");
}

#[test]
fn kill_target_mid_transfer_tcp() {
    kill_mid_transfer(common::TCP, true);
}

/// Shared memory without CMA (so the data moves through the target's progress and a stopped
/// target holds the WRITE in flight), where UCX has no peer-failure detection.
#[test]
fn kill_target_mid_transfer_shm_ends_without_hanging() {
    kill_mid_transfer("shm,self", false);
}

/// Direct CMA (the default between processes of one host): the target is killed right after
/// a 256 MiB WRITE in pieces was posted (`InProgress`, copy threads running). The request ends
/// within its deadline, either complete (the copies finished first) or in a typed uncertain
/// error (the process was gone: ESRCH); later requests to the dead peer fail with
/// `RemoteDisconnect` at once.
#[test]
fn kill_target_during_direct_cma_copies() {
    if !common::ucx_or_skip("kill_direct_cma") {
        return;
    }
    let tls = common::SHM;
    let len = 256 << 20;
    let parent = Agent::new(&common::unique("initiator"), common::config(true)).expect("agent");
    parent
        .create_backend(common::params(tls).cma_threads(2))
        .expect("UCX backend");
    let src = common::buf(len);
    src.fill_pattern(5);
    let _r = parent
        .register_mem(vec![src.clone()], &[])
        .expect("register");
    let mut t = Target::spawn(&parent, tls, len);
    let raddr = connect(&parent, &mut t);
    let blk = 1u64 << 20;
    let n = len / blk as usize;
    let req = parent
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), blk, n),
            &XferDescList::blocks(MemKind::Dram, raddr, blk, n),
            &t.name,
            XferOptions::default().timeout(Duration::from_secs(10)),
        )
        .expect("make");
    assert!(req.path().contains("direct CMA"), "{}", req.path());
    assert_eq!(
        parent.post_xfer_req(&req).expect("post"),
        XferState::InProgress,
        "256 MiB in pieces on the copy threads"
    );
    t.child.kill();
    let start = Instant::now();
    let outcome = req.wait(DEADLINE);
    eprintln!("kill_direct_cma: {outcome:?} after {:?}", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "within the deadline"
    );
    assert!(!req.is_in_flight(), "the request is terminal");
    if let Err(e) = &outcome {
        assert!(e.is_uncertain(), "typed, uncertain-outcome error: {e:?}");
    }
    // The peer is gone: a new request to it fails at once (the agent's process watch, or
    // ESRCH from the copy). The killed request itself may still drain (memory kept) until its
    // copy threads saw the exit.
    let again = parent
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), blk, 1),
            &XferDescList::blocks(MemKind::Dram, raddr, blk, 1),
            &t.name,
            XferOptions::default(),
        )
        .and_then(|r| {
            parent
                .post_xfer_req(&r)
                .and_then(|_| r.wait(Duration::from_secs(5)))
        });
    let e = again.expect_err("writes to a dead process fail");
    assert!(
        matches!(e, Error::RemoteDisconnect { .. }),
        "a dead peer: {e:?}"
    );
}
