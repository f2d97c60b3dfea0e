//! VRAM over UCX (runs on the GPU machine; skips with a printed reason without a GPU or a
//! CUDA-aware UCX): two agents in one process, DRAM -> VRAM WRITE and VRAM -> DRAM READ,
//! verified by copying the device memory back.

use nixl_testkit::ucx as common;

use std::sync::Arc;
use std::time::Duration;

use nixl_core::{MemKind, XferDescList, XferOp, XferOptions};
use nixl_mem::DeviceBuffer;

/// Whether `a`'s UCX moves VRAM; reports the skip (`Dep::CudaUcx`) when not.
fn cuda_aware(a: &nixl_core::Agent, test: &str) -> bool {
    let yes = a
        .backend("UCX")
        .expect("UCX backend")
        .capabilities()
        .supports(MemKind::Vram);
    if !yes {
        nixl_testkit::skip(
            test,
            nixl_testkit::Dep::CudaUcx,
            "this UCX is not CUDA-aware (install the libucx-cu13 wheel and the NVIDIA driver)",
        );
    }
    yes
}

#[test]
fn dram_to_vram_and_back() {
    if !common::ucx_or_skip("vram") {
        return;
    }
    if !nixl_mem::cuda_is_available() {
        nixl_testkit::skip("ucx vram", nixl_testkit::Dep::Gpu, "no CUDA device");
        return;
    }
    // Default transports: cuda_copy / cuda_ipc where UCX has them.
    let a = common::agent("a", "all", false).expect("agent");
    let b = common::agent("b", "all", false).expect("agent");
    if !cuda_aware(&b, "ucx vram") {
        return;
    }
    let len = 4 << 20;
    let src = common::buf(len);
    let back = common::buf(len);
    src.fill_pattern(11);
    let dev = Arc::new(DeviceBuffer::new(0, len).expect("cudaMalloc"));
    let _r1 = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .expect("register host");
    let _r2 = b
        .register_mem(vec![dev.clone()], &[])
        .expect("register device");
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load");
    eprintln!("vram: path {:?}", a.path_report(b.name()));
    let d = |addr| XferDescList::blocks(MemKind::Vram, addr, len as u64, 1);
    let h = |addr| XferDescList::blocks(MemKind::Dram, addr, len as u64, 1);
    let w = a
        .create_xfer_req(
            XferOp::Write,
            &h(src.addr()),
            &d(dev.addr()),
            b.name(),
            XferOptions::default(),
        )
        .expect("make write");
    a.post_xfer_req(&w).expect("post");
    w.wait(Duration::from_secs(30)).expect("write");
    assert!(
        dev.to_vec().expect("copy back") == src.to_vec(),
        "device holds the data"
    );
    let r = a
        .create_xfer_req(
            XferOp::Read,
            &h(back.addr()),
            &d(dev.addr()),
            b.name(),
            XferOptions::default(),
        )
        .expect("make read");
    a.post_xfer_req(&r).expect("post");
    r.wait(Duration::from_secs(30)).expect("read");
    assert!(back.to_vec() == src.to_vec(), "read back from the device");
}

/// Host memory to a peer's VRAM, where the backend copies host memory itself (direct CMA:
/// process_vm_writev/readv into the peer's process). Those system calls reach host memory
/// only: a request with VRAM on either side must go to UCX's CUDA transports. Before the fix
/// the two-process nixlbench DRAM -> VRAM run on the H200 ended `CMA: a range of ... is not
/// mapped in its process (EFAULT)`; here the same-process variant (direct CMA allowed within
/// the process) reproduces it without a second process.
#[test]
fn host_memory_to_a_peers_vram_never_takes_direct_cma() {
    let test = "host_memory_to_a_peers_vram_never_takes_direct_cma";
    if !common::ucx_or_skip(test) || !nixl_testkit::gpu::gpu(test) {
        return;
    }
    let agent = |role: &str| {
        let a = nixl_core::Agent::new(
            &nixl_testkit::unique(role),
            nixl_core::AgentConfig::default(),
        )
        .expect("agent");
        let mut p = common::params("all");
        p.direct_cma_same_process = true;
        a.create_backend(p).expect("UCX");
        a
    };
    let (a, b) = (agent("host"), agent("vram"));
    if !cuda_aware(&b, test) {
        return;
    }
    let len = 1 << 20;
    let (src, back, host_b) = (common::buf(len), common::buf(len), common::buf(len));
    src.fill_pattern(21);
    back.fill(0);
    let dev = Arc::new(DeviceBuffer::new(0, len).expect("cudaMalloc"));
    let _ra = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .expect("register host");
    let _rb = b
        .register_mem(vec![dev.clone()], &[])
        .expect("register device");
    let _rh = b
        .register_mem(vec![host_b.clone()], &[])
        .expect("register host");
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load");
    let d = |addr| XferDescList::blocks(MemKind::Vram, addr, len as u64, 1);
    let h = |addr| XferDescList::blocks(MemKind::Dram, addr, len as u64, 1);
    // The control: host to host takes direct CMA (so the case below is the one it exists for).
    let hh = a
        .create_xfer_req(
            XferOp::Write,
            &h(src.addr()),
            &h(host_b.addr()),
            b.name(),
            XferOptions::default(),
        )
        .expect("make host write");
    assert!(hh.path().contains("direct CMA"), "{}", hh.path());
    for op in [XferOp::Write, XferOp::Read] {
        let local = if op == XferOp::Write {
            src.addr()
        } else {
            back.addr()
        };
        let r = a
            .create_xfer_req(
                op,
                &h(local),
                &d(dev.addr()),
                b.name(),
                XferOptions::default(),
            )
            .expect("make");
        assert!(!r.path().contains("direct CMA"), "{op:?}: {}", r.path());
        a.post_xfer_req(&r).expect("post");
        r.wait(Duration::from_secs(30)).expect("lands");
    }
    assert!(
        dev.to_vec().expect("copy back") == src.to_vec(),
        "the device holds the data"
    );
    assert!(back.to_vec() == src.to_vec(), "read back from the device");
}

/// An agent whose UCX moves VRAM between processes of one GPU (cuda_ipc), or `None` (the skip
/// printed) where UCX or the GPU is not there.
fn cuda_ipc_agent(test: &str, role: &str) -> Option<nixl_core::Agent> {
    if !common::ucx_or_skip(test) || !nixl_testkit::gpu::gpu(test) {
        return None;
    }
    let a = common::agent(role, "cuda_ipc,cuda_copy,tcp", false).expect("agent");
    cuda_aware(&a, test).then_some(a)
}

/// Issue 33's conformance case over UCX's cuda_ipc (two processes, one GPU): see
/// `nixl_testkit::gpu::killed_target_case`. `NIXL_KILLS` kills per operation (default 6).
#[test]
fn ucx_cuda_ipc_a_killed_target_never_ends_done_unless_landed() {
    let test = "ucx_cuda_ipc_a_killed_target_never_ends_done_unless_landed";
    if std::env::var(nixl_testkit::gpu::ROLE).is_ok() {
        return;
    }
    if let Some(a) = cuda_ipc_agent(test, "landed-initiator") {
        nixl_testkit::gpu::killed_target_case(test, "UCX cuda_ipc", &a, "ucx_landed_target");
    }
}

/// The target of the kill conformance case (spawned by it).
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn ucx_landed_target() {
    if std::env::var(nixl_testkit::gpu::ROLE).as_deref() == Ok(nixl_testkit::gpu::LANDED_TARGET) {
        if let Some(a) = cuda_ipc_agent("ucx_landed_target", "landed-target") {
            nixl_testkit::gpu::landed_target(&a);
        }
    }
}
