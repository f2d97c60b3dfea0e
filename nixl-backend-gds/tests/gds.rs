//! GPUDirect Storage scenarios. Without a GPU, libcuda or libcufile the backend reports
//! `Unavailable` (quickly: the guard never calls cuFileDriverOpen) and these tests skip with
//! the reason; on the GPU machine they move DRAM and VRAM to and from O_DIRECT files.
#![cfg(feature = "gds")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_gds::{FileRegion, GdsParams, OpenFlags, PosixParams, GDS, POSIX};
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
};

const T: Duration = Duration::from_secs(60);

fn gds_agent(tag: &str, params: GdsParams) -> Option<Agent> {
    let a = Agent::new(
        &format!("gds-{tag}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    match a.create_backend(params) {
        Ok(_) => Some(a),
        Err(Error::Unavailable { what, hint }) => {
            eprintln!("skipping: GDS unavailable: {what}: {hint}");
            None
        }
        Err(e) => panic!("creating GDS: unexpected error {e}"),
    }
}

fn xfer(
    a: &Agent,
    op: XferOp,
    local: XferDescList,
    remote: XferDescList,
    backend: &str,
) -> nixl_core::Result<Duration> {
    let req = a.create_xfer_req(
        op,
        &local,
        &remote,
        a.name(),
        XferOptions {
            backends: vec![backend.to_owned()],
            ..Default::default()
        },
    )?;
    let t = Instant::now();
    a.post_xfer_req(&req)?;
    req.wait(T)?;
    Ok(t.elapsed())
}

#[test]
fn unavailable_is_typed_and_quick() {
    let t = Instant::now();
    let first = gds_agent("probe", GdsParams::default()).is_some();
    // A second agent gets the same answer from the cached probe.
    let second = gds_agent("probe2", GdsParams::default()).is_some();
    assert_eq!(first, second);
    eprintln!("GDS probe took {:?}; available: {first}", t.elapsed());
}

#[test]
fn dram_file_roundtrip_sync_and_batch() {
    for (tag, threshold) in [("sync", usize::MAX), ("batch", 1)] {
        let Some(a) = gds_agent(
            tag,
            GdsParams {
                batch_threshold: threshold,
                ..Default::default()
            },
        ) else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        const BLOCK: u64 = 1 << 20;
        const N: usize = 8;
        let file = Arc::new(
            FileRegion::open(dir.path().join("g"), BLOCK * N as u64, OpenFlags::direct())
                .expect("open"),
        );
        let (src, dst) = (
            Arc::new(HostBuffer::new(BLOCK as usize * N).expect("alloc")),
            Arc::new(HostBuffer::new(BLOCK as usize * N).expect("alloc")),
        );
        src.fill_pattern(8);
        let _r = a
            .register_mem(vec![src.clone(), dst.clone(), file.clone()], &[])
            .expect("register");
        let remote = file.blocks(0, BLOCK, N);
        xfer(
            &a,
            XferOp::Write,
            XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, N),
            remote.clone(),
            GDS,
        )
        .expect("write");
        xfer(
            &a,
            XferOp::Read,
            XferDescList::blocks(MemKind::Dram, dst.addr(), BLOCK, N),
            remote,
            GDS,
        )
        .expect("read");
        assert_eq!(src.to_vec(), dst.to_vec(), "{tag}");
        eprintln!("{tag}: path {:?}", a.path_report(a.name()));
    }
}

#[test]
fn vram_file_roundtrip_with_throughput() {
    let Some(a) = gds_agent("vram", GdsParams::default()) else {
        return;
    };
    a.create_backend(PosixParams::default()).expect("posix");
    let dir = tempfile::tempdir().expect("tempdir");
    const LEN: usize = 64 << 20;
    let dev = match nixl_mem::DeviceBuffer::new(0, LEN) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("skipping: no device buffer: {e}");
            return;
        }
    };
    let back = Arc::new(nixl_mem::DeviceBuffer::new(0, LEN).expect("device buffer"));
    let host = Arc::new(HostBuffer::new(LEN).expect("alloc"));
    host.fill_pattern(21);
    dev.copy_from_host(0, &host.to_vec()).expect("h2d");
    let file = Arc::new(
        FileRegion::open(dir.path().join("v"), LEN as u64, OpenFlags::direct()).expect("open"),
    );
    let _r = a
        .register_mem(vec![dev.clone(), back.clone()], &[GDS])
        .expect("register vram");
    let _r2 = a
        .register_mem(vec![host.clone(), file.clone()], &[])
        .expect("register dram+file");
    let vram = |d: &nixl_mem::DeviceBuffer| {
        XferDescList::from_descs(
            MemKind::Vram,
            [nixl_core::Desc::on_device(d.addr(), LEN as u64, 0)],
        )
    };
    let fdesc = file.blocks(0, LEN as u64, 1);
    let w = xfer(&a, XferOp::Write, vram(&dev), fdesc.clone(), GDS).expect("gds write");
    let r = xfer(&a, XferOp::Read, vram(&back), fdesc.clone(), GDS).expect("gds read");
    assert_eq!(back.to_vec().expect("d2h"), host.to_vec());
    // The path without GDS: cudaMemcpy to host, then POSIX (and back).
    let mut staging = vec![0u8; LEN];
    let t = Instant::now();
    dev.copy_to_host(0, &mut staging).expect("d2h");
    host.write_at(0, &staging);
    let pw = xfer(
        &a,
        XferOp::Write,
        XferDescList::blocks(MemKind::Dram, host.addr(), LEN as u64, 1),
        fdesc.clone(),
        POSIX,
    )
    .expect("posix write")
        + t.elapsed();
    let t = Instant::now();
    xfer(
        &a,
        XferOp::Read,
        XferDescList::blocks(MemKind::Dram, host.addr(), LEN as u64, 1),
        fdesc,
        POSIX,
    )
    .expect("posix read");
    back.copy_from_host(0, &host.to_vec()).expect("h2d");
    let pr = t.elapsed();
    let gb = |d: Duration| LEN as f64 / d.as_secs_f64() / 1e9;
    eprintln!(
        "VRAM->FILE 64 MiB: GDS {:.2} GB/s, cudaMemcpy+POSIX {:.2} GB/s",
        gb(w),
        gb(pw)
    );
    eprintln!(
        "FILE->VRAM 64 MiB: GDS {:.2} GB/s, POSIX+cudaMemcpy {:.2} GB/s",
        gb(r),
        gb(pr)
    );
    eprintln!("path: {:?}", a.path_report(a.name()));
}
