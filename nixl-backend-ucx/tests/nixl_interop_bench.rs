//! WRITE throughput between stock NIXL (the nixl-cu13 wheel, Python API) and nixl-rs, beside
//! NIXL <-> NIXL in the same run, every byte verified: a NIXL initiator writes into a NIXL
//! target and into a nixl-rs target, and nixl-rs writes into the NIXL target, each one request
//! of `LEN` bytes posted `ITERS` times. With host memory it runs in CI (no timed asserts:
//! the numbers are printed); with GPU memory (`vram_write_beside_nixl`) it is the GPU
//! machine's measurement (UCX cuda_ipc on one GPU), skipped without a GPU.

use nixl_testkit::ucx as common;
use nixl_testkit::ucx::nixl_peer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_ucx::UcxParams;
use nixl_core::{Agent, AgentConfig, MemKind, MemoryRegion, XferDescList, XferOp, XferOptions};
use nixl_mem::HostMemory;
use nixl_peer::{nixl_or_skip, pattern, NixlEnv, NixlPeer};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Memory of one kind on the nixl-rs side. Host memory is advised for transparent huge pages,
/// as numpy does for large arrays on the NIXL side (CMA moves huge pages much faster).
enum Mem {
    Host(Arc<nixl_mem::MmapBuffer>),
    Device(Arc<nixl_mem::DeviceBuffer>),
}

impl Mem {
    fn new(kind: MemKind, len: usize, seed: Option<u64>) -> Self {
        let bytes = seed.map_or_else(|| vec![0u8; len], |s| pattern(len, s));
        match kind {
            MemKind::Vram => {
                let d = Arc::new(nixl_mem::DeviceBuffer::new(0, len).expect("cudaMalloc"));
                d.copy_from_host(0, &bytes).expect("upload");
                Mem::Device(d)
            }
            _ => {
                let b = Arc::new(
                    nixl_mem::MmapBuffer::new(len, nixl_mem::Pages::Transparent).expect("mmap"),
                );
                assert!(b.write_at(0, &bytes));
                Mem::Host(b)
            }
        }
    }

    fn region(&self) -> Arc<dyn MemoryRegion> {
        match self {
            Mem::Host(b) => b.clone(),
            Mem::Device(d) => d.clone(),
        }
    }

    fn addr(&self) -> u64 {
        match self {
            Mem::Host(b) => b.addr(),
            Mem::Device(d) => d.addr(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            Mem::Host(b) => b.to_vec(),
            Mem::Device(d) => d.to_vec().expect("download"),
        }
    }
}

fn gbps(len: usize, iters: usize, secs: f64) -> f64 {
    (len * iters) as f64 / secs.max(1e-9) / 1e9
}

fn run(test: &str, env: &NixlEnv, kind: MemKind, tls: &str, len: usize, iters: usize) {
    let vram = kind == MemKind::Vram;
    let mem = if vram { "VRAM" } else { "DRAM" };
    let rs = Agent::new(
        &common::unique("rs-bench"),
        AgentConfig::default().default_timeout(WAIT),
    )
    .expect("agent");
    let ucx = rs
        .create_backend(
            UcxParams::default()
                .library_path(env.ucx.clone())
                .transports(tls.to_owned())
                .nixl_compat(true),
        )
        .expect("UCX on the wheel's libucp");
    if !ucx.capabilities().supports(kind) {
        nixl_testkit::skip(
            test,
            nixl_testkit::Dep::CudaUcx,
            "the wheel's UCX cannot register this memory here",
        );
        return;
    }
    let (rs_src, rs_dst) = (Mem::new(kind, len, Some(13)), Mem::new(kind, len, None));
    let _regs = rs
        .register_mem(vec![rs_src.region(), rs_dst.region()], &[])
        .expect("register");
    let mut a = NixlPeer::start(env, &common::unique("nixl-init"), tls, &[]);
    let mut b = NixlPeer::start(env, &common::unique("nixl-target"), tls, &[]);
    let alloc = |p: &mut NixlPeer, seed: Option<u64>| {
        let mut c = json!({"op": "alloc", "len": len, "vram": vram});
        if let Some(s) = seed {
            c["seed"] = json!(s);
        }
        p.ok(c)["addr"].as_u64().expect("addr")
    };
    let a_src = alloc(&mut a, Some(7));
    let b_dst = alloc(&mut b, None);
    a.load(&b.metadata()).expect("NIXL loads NIXL");
    a.load(&rs.nixl().local_metadata().expect("md"))
        .expect("NIXL loads nixl-rs");
    let bench = |p: &mut NixlPeer, raddr: u64, remote: &str| {
        let v = p.ok(
            json!({"op": "bench", "kind": "WRITE", "laddr": a_src, "raddr": raddr,
            "len": len, "remote": remote, "iters": iters, "mem": mem}),
        );
        assert_eq!(v["state"], json!("DONE"));
        v["secs"].as_f64().expect("secs")
    };
    let t_nn = bench(&mut a, b_dst, &b.name);
    assert!(
        b.read(b_dst, len) == pattern(len, 7),
        "NIXL -> NIXL: every byte"
    );
    let t_nr = bench(&mut a, rs_dst.addr(), rs.name());
    assert!(
        rs_dst.bytes() == pattern(len, 7),
        "NIXL -> nixl-rs: every byte"
    );

    let name = rs
        .load_remote_metadata(&b.metadata())
        .expect("nixl-rs loads NIXL");
    let d = |addr| XferDescList::blocks(kind, addr, len as u64, 1);
    let req = rs
        .create_xfer_req(
            XferOp::Write,
            &d(rs_src.addr()),
            &d(b_dst),
            &name,
            XferOptions::default(),
        )
        .expect("request");
    for _ in 0..2 {
        rs.post_xfer_req(&req).expect("post");
        req.wait(WAIT).expect("warm-up");
    }
    let t = Instant::now();
    for _ in 0..iters {
        rs.post_xfer_req(&req).expect("post");
        req.wait(WAIT).expect("write");
    }
    let t_rn = t.elapsed().as_secs_f64();
    assert!(
        b.read(b_dst, len) == pattern(len, 13),
        "nixl-rs -> NIXL: every byte"
    );
    println!(
        "{test}: {mem} WRITE {} MiB x {iters} (UCX_TLS={tls}, NIXL {}), every byte verified:\n  \
         NIXL -> NIXL     {:.2} GB/s\n  NIXL -> nixl-rs  {:.2} GB/s\n  nixl-rs -> NIXL  {:.2} GB/s\n  \
         nixl-rs path: {:?}",
        len >> 20,
        env.version,
        gbps(len, iters, t_nn),
        gbps(len, iters, t_nr),
        gbps(len, iters, t_rn),
        rs.path_report(&name)
    );
}

#[test]
fn dram_write_beside_nixl() {
    let test = "dram_write_beside_nixl";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    // NIXL 1.5.1 refuses a UCX_TLS without a CUDA transport on a host with NVIDIA GPUs
    // ("does not enable CUDA memory support"): add cuda_copy there (it carries no DRAM).
    let tls = if nixl_mem::cuda_is_available() {
        "shm,cma,self,cuda_copy"
    } else {
        "shm,cma,self"
    };
    run(test, &env, MemKind::Dram, tls, 16 << 20, 10);
}

#[test]
fn vram_write_beside_nixl() {
    let test = "vram_write_beside_nixl";
    if !nixl_mem::cuda_is_available() {
        nixl_testkit::skip(test, nixl_testkit::Dep::Gpu, "no CUDA device");
        return;
    }
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let len = std::env::var("NIXL_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64usize)
        << 20;
    run(test, &env, MemKind::Vram, "cuda_ipc,cuda_copy,tcp", len, 50);
}
