//! Criterion bench: two agents in one process over UCX (the default transports: shared
//! memory / CMA for RMA), WRITE and READ of one prepared request reposted, 4 KiB to 1 MiB.
//! Skips (printing why) when no UCX can be loaded.

#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nixl::ucx::UcxParams;
use nixl::{
    Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferState,
    XferTarget,
};

/// Two agents, their buffers and registrations.
type Setup = (
    Agent,
    Agent,
    Arc<HostBuffer>,
    Arc<HostBuffer>,
    nixl::Registration,
    nixl::Registration,
);

fn setup() -> nixl::Result<Setup> {
    let a = Agent::new("bench-init", AgentConfig::default())?;
    let b = Agent::new("bench-target", AgentConfig::default())?;
    a.create_backend(UcxParams::default())?;
    b.create_backend(UcxParams::default())?;
    let (src, dst) = (
        Arc::new(HostBuffer::new(1 << 20).expect("alloc")),
        Arc::new(HostBuffer::new(1 << 20).expect("alloc")),
    );
    let ra = a.register_mem(vec![src.clone()], &[])?;
    let rb = b.register_mem(vec![dst.clone()], &[])?;
    a.load_remote_metadata(&b.local_metadata()?)?;
    Ok((a, b, src, dst, ra, rb))
}

fn bench(c: &mut Criterion) {
    let (a, _b, src, dst, _ra, _rb) = match setup() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("transfer bench SKIPPED: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("ucx_two_agents_one_process");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    for op in [XferOp::Write, XferOp::Read] {
        for size in [4096u64, 65536, 1 << 20] {
            let local = a
                .prep_xfer_dlist(
                    XferTarget::Initiator,
                    &XferDescList::blocks(MemKind::Dram, src.addr(), size, 1),
                    &[],
                )
                .expect("prep");
            let remote = a
                .prep_xfer_dlist(
                    XferTarget::Agent("bench-target"),
                    &XferDescList::blocks(MemKind::Dram, dst.addr(), size, 1),
                    &[],
                )
                .expect("prep");
            let req = a
                .make_prepped_xfer(op, &local, &[0], &remote, &[0], XferOptions::default())
                .expect("make");
            g.throughput(Throughput::Bytes(size));
            g.bench_with_input(
                BenchmarkId::new(format!("{op:?}"), size),
                &size,
                |bch, _| {
                    bch.iter(|| {
                        let mut st = a.post_xfer_req(&req).expect("post");
                        while st == XferState::InProgress {
                            st = a.check_xfer_state(&req).expect("check");
                        }
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
