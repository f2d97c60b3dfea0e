//! The conformance suite and a striped batch on a provider chosen by the environment:
//! `NIXL_LF_TEST_PROVIDER` (default `efa`) and `NIXL_LF_TEST_RAILS` (default 1). On a machine
//! without that provider (like CI) it skips with a printed reason. On an EFA instance:
//! `cargo test -p nixl-backend-libfabric --test efa -- --nocapture`.

use nixl_testkit::libfabric as common;

use std::sync::Arc;
use std::time::Duration;

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::{Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};
use nixl_testkit::conformance::Suite;

fn provider() -> (String, usize) {
    let p = std::env::var("NIXL_LF_TEST_PROVIDER").unwrap_or_else(|_| "efa".to_owned());
    let rails = std::env::var("NIXL_LF_TEST_RAILS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    (p, rails)
}

fn params() -> LibfabricParams {
    let (p, rails) = provider();
    (LibfabricParams::with_provider(&p)).rails(rails)
}

fn chosen() -> Option<Suite> {
    let (p, _) = provider();
    if common::skip_without_provider(&p) {
        return None;
    }
    let params = params();
    Some(Suite::new(
        &format!("lf-{p}"),
        AgentConfig::default(),
        Arc::new(move |a| a.create_backend(params.clone())),
    ))
}

mod conformance_on_chosen_provider {
    nixl_testkit::conformance_tests!(super::chosen);
}

#[test]
fn striped_batch_on_chosen_provider() {
    let (p, rails) = provider();
    if common::skip_without_provider(&p) {
        return;
    }
    let a = Agent::new(
        &format!("efa-a-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    let b = Agent::new(
        &format!("efa-b-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    let pa = params();
    let stats = pa.stats();
    a.create_backend(pa).unwrap();
    b.create_backend(params()).unwrap();
    const BLOCK: u64 = 1 << 20;
    const N: usize = 32;
    let (src, dst) = (
        Arc::new(HostBuffer::new(BLOCK as usize * N).unwrap()),
        Arc::new(HostBuffer::new(BLOCK as usize * N).unwrap()),
    );
    src.fill_pattern(9);
    let _ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let opts = XferOptions::default().no_merge(true);
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
    req.wait(Duration::from_secs(30)).unwrap();
    assert_eq!(dst.to_vec(), src.to_vec());
    let s = stats.rails();
    eprintln!("{p}: {}\n{:?}\n{s:?}", req.path(), a.path_report(b.name()));
    assert_eq!(s.len(), rails);
    assert!(s.iter().all(|r| r.bytes_written > 0), "{s:?}");
}
