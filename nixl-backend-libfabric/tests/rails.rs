//! Several rails: a batch striped over two tcp endpoints on loopback, with the split visible
//! in the per-rail counters, the request's path and the agent's path report.

use nixl_testkit::libfabric as common;

use std::sync::Arc;
use std::time::Duration;

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::{Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};

const WAIT: Duration = Duration::from_secs(20);

fn agent(name: &str, rails: usize) -> (Agent, nixl_backend_libfabric::LibfabricStats) {
    let a = Agent::new(
        &format!("{name}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    let p = LibfabricParams::tcp_loopback(rails);
    let stats = p.stats();
    a.create_backend(p).unwrap();
    (a, stats)
}

#[test]
fn two_rails_both_carry_bytes() {
    if common::skip_without_provider("tcp") {
        return;
    }
    let (a, stats) = agent("rails-a", 2);
    let (b, _) = agent("rails-b", 2);
    const BLOCK: u64 = 256 << 10;
    const N: usize = 32;
    let len = BLOCK as usize * N;
    let (src, dst, back) = (
        Arc::new(HostBuffer::new(len).unwrap()),
        Arc::new(HostBuffer::new(len).unwrap()),
        Arc::new(HostBuffer::new(len).unwrap()),
    );
    src.fill_pattern(42);
    let _ra = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    b.load_remote_metadata(&a.local_metadata().unwrap())
        .unwrap();

    // A batch of 32 separate blocks (no merging): spread over both rails.
    let opts = (XferOptions::with_notif(b"striped".to_vec())).no_merge(true);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, N),
            &XferDescList::blocks(MemKind::Dram, dst.addr(), BLOCK, N),
            b.name(),
            opts,
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    assert_eq!(dst.to_vec(), src.to_vec());
    assert_eq!(
        b.wait_notifs(WAIT).unwrap()[a.name()],
        vec![b"striped".to_vec()]
    );
    let s = stats.rails();
    assert_eq!(s.len(), 2);
    eprintln!("after the batch: {s:?}");
    assert!(
        s.iter().all(|r| r.bytes_written > 0),
        "a rail carried nothing: {s:?}"
    );
    assert_eq!(s.iter().map(|r| r.bytes_written).sum::<u64>(), len as u64);
    let path = req.path();
    assert!(path.contains("rail0") && path.contains("rail1"), "{path}");

    // One large segment is cut across both rails too (READ this time).
    let before: Vec<u64> = stats.rails().iter().map(|r| r.bytes_read).collect();
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, back.addr(), len as u64, 1),
            &XferDescList::blocks(MemKind::Dram, dst.addr(), len as u64, 1),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    assert_eq!(back.to_vec(), src.to_vec());
    let after = stats.rails();
    for (r, b0) in after.iter().zip(before) {
        assert!(
            r.bytes_read > b0,
            "rail {} read nothing of the striped segment: {after:?}",
            r.rail
        );
    }
    let report = a.path_report(b.name());
    eprintln!("path report: {report:?}");
    assert!(
        report
            .iter()
            .any(|(n, p)| n == "LIBFABRIC" && p.contains("2 rail(s)") && p.contains("rail1")),
        "{report:?}"
    );
}

#[test]
fn rails_are_limited_by_the_peer() {
    if common::skip_without_provider("tcp") {
        return;
    }
    // A two-rail initiator and a one-rail target: everything goes over the one common rail.
    let (a, stats) = agent("rails-c", 2);
    let (b, _) = agent("rails-d", 1);
    let (src, dst) = (
        Arc::new(HostBuffer::new(1 << 20).unwrap()),
        Arc::new(HostBuffer::new(1 << 20).unwrap()),
    );
    src.fill_pattern(3);
    let _ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), 1 << 20, 1),
            &XferDescList::blocks(MemKind::Dram, dst.addr(), 1 << 20, 1),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    assert_eq!(dst.to_vec(), src.to_vec());
    let s = stats.rails();
    assert_eq!(
        (s[0].bytes_written, s[1].bytes_written),
        (1 << 20, 0),
        "{s:?}"
    );
}
