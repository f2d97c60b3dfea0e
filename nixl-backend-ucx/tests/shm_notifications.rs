//! Same-host notifications over shared memory (`UcxParams::shm_notifications`): the path report
//! names the shared-memory transport, notifications still arrive after their data and in
//! order (more of them than UCX's shared-memory queue holds), standalone notifications use the
//! same endpoint, and with the option off there is a single endpoint as before. Two agents in
//! one process, UCX's default transports (each agent its own UCX context). Skips with a printed
//! reason when no UCX can be loaded.

use nixl_testkit::ucx as common;

use std::sync::Arc;
use std::time::Duration;

use nixl_core::{Agent, HostBuffer, MemKind, Registration, XferDescList, XferOp, XferOptions};

const T: Duration = Duration::from_secs(30);

/// Two agents on UCX's default transports; `b` has loaded `a`'s metadata and `a` has loaded
/// `b`'s.
fn pair(
    shm_notifications: bool,
    len: usize,
) -> (
    Agent,
    Agent,
    Arc<HostBuffer>,
    Arc<HostBuffer>,
    Vec<Registration>,
) {
    let mk = |role| {
        let a = Agent::new(&common::unique(role), common::config(false)).expect("agent");
        // UCX's own transport choice (shm among them), from the kit's other settings.
        a.create_backend(
            common::params(common::TCP)
                .transports(None)
                .shm_notifications(shm_notifications),
        )
        .expect("backend");
        a
    };
    let (a, b) = (mk("shm-a"), mk("shm-b"));
    let (src, dst) = (common::buf(len), common::buf(len));
    src.fill_pattern(9);
    let r1 = a.register_mem(vec![src.clone()], &[]).expect("register");
    let r2 = b.register_mem(vec![dst.clone()], &[]).expect("register");
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load b");
    b.load_remote_metadata(&a.local_metadata().expect("md"))
        .expect("load a");
    (a, b, src, dst, vec![r1, r2])
}

fn one(len: u64, addr: u64) -> XferDescList {
    XferDescList::blocks(MemKind::Dram, addr, len, 1)
}

#[test]
fn same_host_notifications_go_over_shared_memory_after_their_data() {
    if !common::ucx_or_skip("shm_notifications") {
        return;
    }
    let len = 16 << 20;
    let (a, b, src, dst, _regs) = pair(true, len);
    let path = a.path_report(b.name());
    let report = &path[0].1;
    assert!(
        report.contains("notifications over")
            && (report.contains("posix/") || report.contains("sysv/")),
        "a same-host peer gets a shared-memory notification endpoint: {report}"
    );
    // Data on the first endpoint (cma between processes of this host), with peer failure
    // detection kept there.
    assert!(!report.contains("no peer-failure detection"), "{report}");

    // More notifications than UCX's shared-memory queue holds (64), each after a WRITE that
    // changes the whole block: every one arrives, in order, with its data complete.
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &one(len as u64, src.addr()),
            &one(len as u64, dst.addr()),
            b.name(),
            XferOptions::default(),
        )
        .expect("make");
    for i in 0..200u32 {
        src.fill_pattern(u64::from(i));
        req.set_notif(Some(i.to_le_bytes().to_vec()))
            .expect("set notif");
        a.post_xfer_req(&req).expect("post");
        req.wait(T).expect("done");
        let n = b.wait_notifs(T).expect("notification");
        assert_eq!(n[a.name()], vec![i.to_le_bytes().to_vec()], "in order");
        assert!(
            dst.to_vec() == src.to_vec(),
            "data complete at notification {i}"
        );
    }
    // A standalone notification takes the same endpoint.
    a.gen_notif(b.name(), b"standalone", &[])
        .expect("gen_notif");
    let n = b.wait_notifs(T).expect("standalone notification");
    assert_eq!(n[a.name()], vec![b"standalone".to_vec()]);
    // And back, from b's side.
    b.gen_notif(a.name(), b"back", &[]).expect("gen_notif back");
    assert_eq!(
        a.wait_notifs(T).expect("back")[b.name()],
        vec![b"back".to_vec()]
    );
}

#[test]
fn burst_of_notifications_arrives_complete_and_in_order() {
    if !common::ucx_or_skip("shm_notifications_burst") {
        return;
    }
    let (a, b, src, dst, _regs) = pair(true, 4096);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &one(4096, src.addr()),
            &one(4096, dst.addr()),
            b.name(),
            XferOptions::default(),
        )
        .expect("make");
    // The target does not drain while the initiator sends 1000 (its progress thread keeps
    // UCX's queue moving); then every message is there once, in order.
    for i in 0..1000u32 {
        req.set_notif(Some(i.to_le_bytes().to_vec()))
            .expect("set notif");
        a.post_xfer_req(&req).expect("post");
        req.wait(T).expect("done");
    }
    let mut got = Vec::new();
    let end = std::time::Instant::now() + T;
    while got.len() < 1000 && std::time::Instant::now() < end {
        if let Some(v) = b
            .wait_notifs(Duration::from_millis(200))
            .expect("drain")
            .remove(a.name())
        {
            got.extend(v);
        }
    }
    let want: Vec<Vec<u8>> = (0..1000u32).map(|i| i.to_le_bytes().to_vec()).collect();
    assert_eq!(got, want);
    assert!(dst.to_vec() == src.to_vec());
}

#[test]
fn without_shm_notifications_one_endpoint_carries_everything() {
    if !common::ucx_or_skip("shm_notifications_off") {
        return;
    }
    let (a, b, src, dst, _regs) = pair(false, 1 << 20);
    let report = a.path_report(b.name())[0].1.clone();
    assert!(!report.contains("notifications over"), "{report}");
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &one(1 << 20, src.addr()),
            &one(1 << 20, dst.addr()),
            b.name(),
            XferOptions::with_notif(b"one".to_vec()),
        )
        .expect("make");
    a.post_xfer_req(&req).expect("post");
    req.wait(T).expect("done");
    assert_eq!(
        b.wait_notifs(T).expect("notification")[a.name()],
        vec![b"one".to_vec()]
    );
    assert!(dst.to_vec() == src.to_vec());
}
