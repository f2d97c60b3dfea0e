//! GPU memory through `FI_HMEM`: DRAM -> VRAM WRITE with a notification, then VRAM -> DRAM
//! READ, between two agents. Skips (with the reason) without a GPU or without a libfabric whose
//! provider offers `FI_HMEM` for CUDA (the AWS EFA installer's build has it; Debian's does
//! not). Provider: `NIXL_LF_TEST_PROVIDER` (default `tcp` on loopback).

use std::sync::Arc;
use std::time::Duration;

use nixl_backend_libfabric::{HmemMode, LibfabricParams};
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
};
use nixl_mem::DeviceBuffer;

const LEN: usize = 1 << 20;

fn params() -> LibfabricParams {
    let p = std::env::var("NIXL_LF_TEST_PROVIDER").unwrap_or_else(|_| "tcp".to_owned());
    let base = if p == "tcp" {
        LibfabricParams::tcp_loopback(1)
    } else {
        LibfabricParams::with_provider(&p)
    };
    base.hmem(HmemMode::Require)
}

#[test]
fn dram_to_vram_and_back() {
    if !nixl_mem::cuda_is_available() {
        nixl_testkit::skip(
            "libfabric dram_to_vram_and_back",
            nixl_testkit::Dep::Gpu,
            "no CUDA device",
        );
        return;
    }
    let a = Agent::new(
        &format!("vram-a-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    let b = Agent::new(
        &format!("vram-b-{}", std::process::id()),
        AgentConfig::default(),
    )
    .unwrap();
    match a.create_backend(params()) {
        Ok(_) => {}
        Err(e @ Error::Unavailable { .. }) => {
            nixl_testkit::skip(
                "libfabric dram_to_vram_and_back",
                nixl_testkit::Dep::FiHmem,
                format!("no libfabric provider with FI_HMEM here: {e}"),
            );
            return;
        }
        Err(e) => panic!("{e}"),
    }
    b.create_backend(params()).unwrap();
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let back = Arc::new(HostBuffer::new(LEN).unwrap());
    src.fill_pattern(11);
    let gpu = Arc::new(DeviceBuffer::new(0, LEN).unwrap());
    let _ra = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .unwrap();
    let _rb = b.register_mem(vec![gpu.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    b.load_remote_metadata(&a.local_metadata().unwrap())
        .unwrap();
    let blocks = |kind, base| XferDescList::blocks(kind, base, (LEN / 16) as u64, 16);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &blocks(MemKind::Dram, src.addr()),
            &blocks(MemKind::Vram, gpu.addr()),
            b.name(),
            XferOptions::with_notif(b"in gpu".to_vec()),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(30)).unwrap();
    assert_eq!(
        b.wait_notifs(Duration::from_secs(30)).unwrap()[a.name()],
        vec![b"in gpu".to_vec()]
    );
    let mut host = vec![0u8; LEN];
    gpu.copy_to_host(0, &mut host).unwrap();
    assert_eq!(host, src.to_vec());
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &blocks(MemKind::Dram, back.addr()),
            &blocks(MemKind::Vram, gpu.addr()),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(30)).unwrap();
    assert_eq!(back.to_vec(), src.to_vec());
    eprintln!("{}", req.path());
}
