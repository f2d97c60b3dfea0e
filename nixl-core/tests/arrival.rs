//! Arrival counters (issue 27) are never ignored: a request whose backend cannot advance them
//! (INPROC), a DRAM destination or a WRITE (block table or plain descriptors) is refused
//! `NotSupported`, and
//! nothing is kept. (The GPU runs, where CUDA_IPC advances them, are nixl-mem's
//! `tests/arrival_gpu.rs`.)

use std::sync::Arc;

use nixl_core::{
    Agent, AgentConfig, ArrivalCounters, Desc, ErrorKind, HostBuffer, InprocParams, MemKind,
    StridedDesc, StridedDescList, XferDescList, XferOp, XferOptions, XferTarget,
};

#[test]
fn counters_are_refused_typed_where_no_backend_advances_them() {
    let pid = std::process::id();
    let a = Agent::new(&format!("arr-a-{pid}"), AgentConfig::default()).unwrap();
    let b = Agent::new(&format!("arr-b-{pid}"), AgentConfig::default()).unwrap();
    a.create_backend(InprocParams::default()).unwrap();
    b.create_backend(InprocParams::default()).unwrap();
    let (ba, bb) = (
        Arc::new(HostBuffer::new(1 << 16).unwrap()),
        Arc::new(HostBuffer::new(1 << 16).unwrap()),
    );
    let _ra = a.register_mem(vec![ba.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![bb.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let table = |addr: u64| {
        StridedDescList::from_descs(
            MemKind::Dram,
            (0..2).map(|l| StridedDesc::new(addr + l * 8192, 1024, 1024, 8)),
        )
    };
    let local = a
        .prep_strided_dlist(XferTarget::Initiator, &table(ba.addr()), &[])
        .unwrap();
    let remote = a
        .prep_strided_dlist(XferTarget::Agent(b.name()), &table(bb.addr()), &[])
        .unwrap();
    let counters = ArrivalCounters::new(ba.addr() + 60_000, 0);
    let opts = || XferOptions::default().arrival(counters);
    for op in [XferOp::Read, XferOp::Write] {
        let e = a
            .make_block_xfer(op, &local, &[0, 1], &remote, &[2, 3], opts())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    }
    let flat = |addr: u64| XferDescList::from_descs(MemKind::Dram, [Desc::new(addr, 64)]);
    let e = a
        .create_xfer_req(
            XferOp::Read,
            &flat(ba.addr()),
            &flat(bb.addr()),
            b.name(),
            opts(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    // Without counters the same request is fine: nothing was kept by the refusals.
    let req = a
        .make_block_xfer(
            XferOp::Read,
            &local,
            &[0, 1],
            &remote,
            &[2, 3],
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(std::time::Duration::from_secs(10)).unwrap();
    assert_eq!(req.arrival_per_post(), None);
}
