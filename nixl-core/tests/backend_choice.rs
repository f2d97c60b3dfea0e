//! When the preferred backend declines a transfer (`NotSupported` from `prepare_xfer`), the
//! agent falls back to the next one that holds both sides; the request reports which.

use std::sync::Arc;
use std::time::Duration;

use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, InprocParams, MemKind, Op, XferDescList, XferOp,
    XferOptions,
};
use nixl_testkit::unique;
use nixl_testkit::wrapped::WrappedParams;

/// A real INPROC backend under another name that declines every transfer.
fn declining() -> WrappedParams {
    WrappedParams::new("DECLINING", |_, _| {
        Err(Error::not_supported(
            "test",
            Op::MakeXfer,
            "this backend cannot reach that region",
        ))
    })
}

fn agent(prefix: &str) -> Agent {
    let a = Agent::new(&unique(prefix), AgentConfig::default()).unwrap();
    a.create_backend(declining()).unwrap();
    a.create_backend(InprocParams::default()).unwrap();
    a
}

#[test]
fn a_declining_backend_yields_to_the_next() {
    let a = agent("bc-a");
    let b = agent("bc-b");
    let (sa, sb) = (
        Arc::new(HostBuffer::new(4096).unwrap()),
        Arc::new(HostBuffer::new(4096).unwrap()),
    );
    let ra = a.register_mem(vec![sa.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![sb.clone()], &[]).unwrap();
    let mut names: Vec<String> = ra.backends().iter().map(|h| h.name().to_owned()).collect();
    names.sort();
    assert_eq!(names, vec!["DECLINING".to_owned(), "INPROC".to_owned()]);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    sa.fill(5);
    let l = XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1);
    let r = XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1);
    let req = a
        .create_xfer_req(XferOp::Write, &l, &r, b.name(), XferOptions::default())
        .unwrap();
    assert_eq!(req.backend().name(), "INPROC");
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(sb.to_vec(), vec![5u8; 4096]);
    // Restricted to the declining backend, its refusal is what the caller sees.
    let only =
        XferOptions::default().backends(vec![a.backend("DECLINING").expect("declining backend")]);
    assert!(matches!(
        a.create_xfer_req(XferOp::Write, &l, &r, b.name(), only),
        Err(Error::NotSupported { .. })
    ));
}
