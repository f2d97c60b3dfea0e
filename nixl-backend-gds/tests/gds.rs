//! GPUDirect Storage scenarios. Without a GPU, libcuda or libcufile the backend reports
//! `Unavailable` (quickly: the guard never calls cuFileDriverOpen) and these tests skip with
//! the reason; on the GPU machine they move DRAM and VRAM to and from O_DIRECT files, through
//! cuFile or, where cuFile refuses a file (`cuFileHandleRegister` failing on a VM's disk),
//! through the reported bounce fallback.
//!
//! `NIXL_TEST_GDS_FORCE_COMPAT=1` creates every GDS backend with `force_compat_mode` (the
//! cuFile driver is opened once per process, so run the binary once plain and once with it).
#![cfg(feature = "gds")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_gds::{
    FileRegion, GdsFallback, GdsParams, GdsPlugin, OpenFlags, PosixParams, GDS, POSIX,
};
use nixl_core::backend::BackendPlugin;
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
};

const T: Duration = Duration::from_secs(60);

fn force_compat() -> bool {
    std::env::var("NIXL_TEST_GDS_FORCE_COMPAT").is_ok_and(|v| v == "1")
}

fn gds_agent(tag: &str, mut params: GdsParams) -> Option<Agent> {
    params.force_compat_mode |= force_compat();
    let a = Agent::new(
        &format!("gds-{tag}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    match a.create_backend(params) {
        Ok(_) => Some(a),
        Err(Error::Unavailable { what, hint }) => {
            nixl_testkit::skip(
                &format!("gds {tag}"),
                nixl_testkit::Dep::Gpu,
                format!("GDS unavailable: {what}: {hint}"),
            );
            None
        }
        Err(e) => panic!("creating GDS: unexpected error {e}"),
    }
}

/// A request through GDS only.
fn gds_request(
    a: &Agent,
    op: XferOp,
    local: &XferDescList,
    remote: &XferDescList,
) -> nixl_core::XferReq {
    a.create_xfer_req(
        op,
        local,
        remote,
        a.name(),
        XferOptions::default().backends(a.backend(GDS).into_iter().collect()),
    )
    .expect("request")
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
        XferOptions::default().backends(a.backend(backend).into_iter().collect()),
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
        let Some(a) = gds_agent(tag, GdsParams::default().batch_threshold(threshold)) else {
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
            nixl_testkit::skip(
                "gds device buffer",
                nixl_testkit::Dep::Gpu,
                format!("no device buffer: {e}"),
            );
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
        .register_mem(
            vec![dev.clone(), back.clone()],
            &[a.backend(GDS).expect("GDS backend")],
        )
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

#[test]
fn plugin_params_are_parsed_and_checked() {
    let map = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    for kv in [
        vec![("force_compat_mode", "true"), ("fallback", "refuse")],
        vec![("force_compat_mode", "false"), ("fallback", "bounce")],
        vec![("bounce_chunk", "1048576"), ("bounce_buffers", "2")],
        vec![("bounce_buffers", "auto")],
    ] {
        assert!(GdsPlugin.parse_params(&map(&kv)).is_ok(), "{kv:?}");
    }
    for kv in [
        vec![("force_compat_mode", "maybe")],
        vec![("fallback", "posix")],
        vec![("bounce_chunk", "4097")],
        vec![("bounce_chunk", "0")],
        vec![("bounce_buffers", "0")],
        vec![("max_batch", "0")],
    ] {
        assert!(
            matches!(
                GdsPlugin.parse_params(&map(&kv)),
                Err(Error::InvalidParam { .. })
            ),
            "{kv:?}"
        );
    }
    assert!(GdsPlugin.parse_params(&GdsPlugin.default_params()).is_ok());
    // Typed params are checked before the driver is touched.
    let a = Agent::new(
        &format!("gds-badparams-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    let bad = GdsParams::default().fallback_engine(PosixParams::default().bounce_chunk(100));
    assert!(matches!(
        a.create_backend(bad),
        Err(Error::InvalidParam { .. })
    ));
}

/// Registers a file with GDS in fallback mode if cuFile refuses one: first an O_DIRECT file in
/// the temp dir (refused on the GPU VM's virtio disk), then a buffered file in /dev/shm.
fn refused_file(
    a: &Agent,
    dir: &std::path::Path,
    len: u64,
) -> Option<(Arc<FileRegion>, nixl_core::Registration)> {
    let candidates = [
        (dir.join("refused"), OpenFlags::direct()),
        (
            std::path::PathBuf::from(format!("/dev/shm/nixl-gds-refused-{}", std::process::id())),
            OpenFlags::buffered(),
        ),
    ];
    for (path, flags) in candidates {
        let Ok(f) = FileRegion::open(&path, len, flags) else {
            continue;
        };
        let f = Arc::new(f);
        let reg = a
            .register_mem(vec![f.clone()], &[a.backend(GDS).expect("GDS backend")])
            .expect("bounce mode registers");
        let report = a.path_report(a.name());
        if report.iter().any(|(_, p)| p.contains("GDS fallback")) {
            eprintln!("cuFile refused {} ({report:?})", path.display());
            return Some((f, reg));
        }
        eprintln!("cuFile took {}", path.display());
    }
    None
}

#[test]
fn fallback_when_cufile_refuses_a_file_is_reported_and_moves_data() {
    let Some(a) = gds_agent("fallback", GdsParams::default()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    const LEN: u64 = 8 << 20;
    let Some((file, _freg)) = refused_file(&a, dir.path(), LEN) else {
        eprintln!("skipping: cuFile registered every candidate file (no fallback to test here)");
        return;
    };
    // DRAM through the fallback: pread/pwrite.
    let (src, dst) = (
        Arc::new(HostBuffer::new(LEN as usize).expect("alloc")),
        Arc::new(HostBuffer::new(LEN as usize).expect("alloc")),
    );
    src.fill_pattern(5);
    let _r = a
        .register_mem(
            vec![src.clone(), dst.clone()],
            &[a.backend(GDS).expect("GDS backend")],
        )
        .expect("register dram");
    let remote = file.blocks(0, 1 << 20, 8);
    for (op, buf) in [(XferOp::Write, &src), (XferOp::Read, &dst)] {
        let req = gds_request(
            &a,
            op,
            &XferDescList::blocks(MemKind::Dram, buf.addr(), 1 << 20, 8),
            &remote,
        );
        let path = req.path();
        assert!(
            path.contains("GDS fallback (cuFileHandleRegister failed: cuFile error"),
            "{path}"
        );
        a.post_xfer_req(&req).expect("post");
        req.wait(T).expect("wait");
        eprintln!("DRAM {op:?}: {path}");
    }
    assert_eq!(src.to_vec(), dst.to_vec());
    // VRAM through the fallback: pinned bounce buffers.
    let (dev, back) = match (
        nixl_mem::DeviceBuffer::new(0, LEN as usize),
        nixl_mem::DeviceBuffer::new(0, LEN as usize),
    ) {
        (Ok(d), Ok(b)) => (Arc::new(d), Arc::new(b)),
        (Err(e), _) | (_, Err(e)) => {
            nixl_testkit::skip(
                "gds fallback VRAM part",
                nixl_testkit::Dep::Gpu,
                format!("no device buffer: {e}"),
            );
            return;
        }
    };
    dev.copy_from_host(0, &src.to_vec()).expect("h2d");
    let _v = a
        .register_mem(
            vec![dev.clone(), back.clone()],
            &[a.backend(GDS).expect("GDS backend")],
        )
        .expect("register vram");
    for (op, d) in [(XferOp::Write, &dev), (XferOp::Read, &back)] {
        let local = XferDescList::from_descs(
            MemKind::Vram,
            (0..3u64).map(|i| {
                Desc::on_device(
                    d.addr() + i * (3 << 20),
                    if i == 2 { 2 << 20 } else { 3 << 20 },
                    0,
                )
            }),
        );
        let remote = XferDescList::from_descs(
            MemKind::File,
            (0..3u64).map(|i| file.desc_at(i * (3 << 20), if i == 2 { 2 << 20 } else { 3 << 20 })),
        );
        let req = gds_request(&a, op, &local, &remote);
        let path = req.path();
        assert!(
            path.contains("GDS fallback (cuFileHandleRegister failed: cuFile error")
                && path.contains("pinned bounce buffers"),
            "{path}"
        );
        a.post_xfer_req(&req).expect("post");
        req.wait(T).expect("wait");
        eprintln!("VRAM {op:?}: {path}");
    }
    assert!(
        back.to_vec().expect("d2h") == src.to_vec(),
        "VRAM round trip through the fallback differs"
    );
    let _ = std::fs::remove_file(format!("/dev/shm/nixl-gds-refused-{}", std::process::id()));
}

#[test]
fn refuse_fallback_is_a_typed_error() {
    let Some(a) = gds_agent("refuse", GdsParams::default().fallback(GdsFallback::Refuse)) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Arc::new(
        FileRegion::open(dir.path().join("r"), 1 << 20, OpenFlags::direct()).expect("open"),
    );
    match a.register_mem(vec![f], &[a.backend(GDS).expect("GDS backend")]) {
        Ok(_) => eprintln!("skipping: cuFile registered the file (nothing to refuse)"),
        Err(Error::Backend { message, .. }) => {
            assert!(message.contains("cuFileHandleRegister failed"), "{message}");
            eprintln!("refused as asked: {message}");
        }
        Err(e) => panic!("expected a Backend error, got {e}"),
    }
}

#[test]
fn gds_vram_cancel_in_flight() {
    let Some(a) = gds_agent("cancel", GdsParams::default()) else {
        return;
    };
    const LEN: usize = 64 << 20;
    let dev = match nixl_mem::DeviceBuffer::new(0, LEN) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            nixl_testkit::skip(
                "gds_vram_cancel_in_flight",
                nixl_testkit::Dep::Gpu,
                format!("no device buffer: {e}"),
            );
            return;
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Arc::new(
        FileRegion::open(dir.path().join("c"), LEN as u64, OpenFlags::direct()).expect("open"),
    );
    let _r = a
        .register_mem(
            vec![dev.clone(), file.clone()],
            &[a.backend(GDS).expect("GDS backend")],
        )
        .expect("register");
    let local = XferDescList::from_descs(
        MemKind::Vram,
        (0..64u64).map(|i| Desc::on_device(dev.addr() + i * (1 << 20), 1 << 20, 0)),
    );
    let req = gds_request(&a, XferOp::Write, &local, &file.blocks(0, 1 << 20, 64));
    a.post_xfer_req(&req).expect("post");
    req.cancel().expect("cancel");
    assert!(!req.is_in_flight());
    eprintln!("canceled: {}", req.path());
}

/// The shared conformance suite on GDS, one test per case: O_DIRECT files in a temporary
/// directory (skipped without a GPU, libcuda or libcufile).
fn gds_suite() -> Option<nixl_testkit::conformance::Suite> {
    let params = GdsParams::default().force_compat_mode(force_compat());
    gds_agent("conformance-probe", params.clone())?;
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Some(nixl_testkit::conformance::Suite {
        name: "gds".to_owned(),
        config: AgentConfig::default(),
        create: Arc::new(move |a: &Agent| a.create_backend(params.clone())),
        storage: Some(Arc::new(move |len| {
            let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let f = FileRegion::open(dir.path().join(format!("c{n}")), len, OpenFlags::direct())
                .map_err(|e| Error::io("conformance", nixl_core::Op::RegisterMem, e))?;
            Ok(Arc::new(f) as Arc<dyn nixl_core::MemoryRegion>)
        })),
    })
}

mod conformance_gds {
    nixl_testkit::conformance_tests!(super::gds_suite);
}
