//! VRAM <-> FILE through the POSIX backend's pinned bounce buffers (no GDS).
//!
//! Without CUDA (no driver, no device) the GPU tests skip with a printed reason; the tests of
//! parameters and of VRAM registration without CUDA run everywhere. On the GPU machine every
//! test runs: round trips verified byte for byte (O_DIRECT and page cache, several segments,
//! lengths that are not multiples of `bounce_chunk`), alignment errors at prepare, range checks
//! at registration, cancel of an in-flight request, and the reported path.
#![cfg(feature = "posix")]

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use nixl_backend_gds::{Engine, FileRegion, OpenFlags, PosixParams, PosixPlugin, POSIX};
use nixl_core::backend::BackendPlugin;
use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, RegionDesc, XferDescList, XferOp,
    XferOptions, XferReq,
};
use nixl_mem::DeviceBuffer;

const T: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

fn agent(tag: &str, params: PosixParams) -> Agent {
    let a = Agent::new(
        &format!("vram-{tag}-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    a.create_backend(params).expect("posix backend");
    a
}

/// Small chunks and fewer buffers than threads, so a few MiB exercise chunking, several
/// workers in flight and waiting for a free staging buffer.
fn small_bounce() -> PosixParams {
    PosixParams::default()
        .bounce_chunk(MIB)
        .bounce_buffers(2)
        .pool_threads(4)
}

/// A device buffer, or `None` (after printing why) where CUDA is not usable.
fn device(len: usize) -> Option<Arc<DeviceBuffer>> {
    match DeviceBuffer::new(0, len) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            nixl_testkit::skip(
                "vram_file",
                nixl_testkit::Dep::Gpu,
                format!("no CUDA device buffer: {e}"),
            );
            None
        }
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn vram(d: &DeviceBuffer, segs: &[(u64, u64)]) -> XferDescList {
    XferDescList::from_descs(
        MemKind::Vram,
        segs.iter()
            .map(|&(off, len)| Desc::on_device(d.addr() + off, len, d.ordinal() as u64)),
    )
}

fn files(f: &FileRegion, segs: &[(u64, u64)]) -> XferDescList {
    XferDescList::from_descs(
        MemKind::File,
        segs.iter().map(|&(off, len)| f.desc_at(off, len)),
    )
}

fn request(
    a: &Agent,
    op: XferOp,
    local: &XferDescList,
    remote: &XferDescList,
) -> nixl_core::Result<XferReq> {
    a.create_xfer_req(
        op,
        local,
        remote,
        a.name(),
        XferOptions::default().backends(a.backend(POSIX).into_iter().collect()),
    )
}

fn run(a: &Agent, op: XferOp, local: &XferDescList, remote: &XferDescList) -> String {
    let req = request(a, op, local, remote).expect("create request");
    a.post_xfer_req(&req).expect("post");
    req.wait(T).expect("wait");
    req.path()
}

#[test]
fn vram_registration_without_cuda_is_unavailable() {
    if nixl_mem::cuda_is_available() {
        eprintln!("skipping: CUDA is available here (the GPU tests cover VRAM registration)");
        return;
    }
    let a = agent("nocuda", PosixParams::default());
    // SAFETY: the region is never accessed: registration fails before any transfer.
    let fake = Arc::new(unsafe {
        RawRegion::new(RegionDesc {
            kind: MemKind::Vram,
            addr: 0x7f00_0000_0000,
            len: MIB,
            dev_id: 0,
            meta: Vec::new(),
        })
    });
    match a.register_mem(
        vec![fake.clone()],
        &[a.backend(POSIX).expect("POSIX backend")],
    ) {
        Err(Error::Unavailable { what, hint }) => {
            assert!(what.contains("libcuda") || what.contains("CUDA"), "{what}");
            assert!(!hint.is_empty());
            eprintln!("VRAM registration without CUDA: {what}: {hint}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Asked again: the same typed answer (the failed load is cached, not retried).
    assert!(matches!(
        a.register_mem(vec![fake], &[a.backend(POSIX).expect("POSIX backend")]),
        Err(Error::Unavailable { .. })
    ));
    // Nothing changed: DRAM and files still work, and the report names no VRAM path.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Arc::new(
        FileRegion::open(dir.path().join("f"), 8192, OpenFlags::buffered()).expect("open"),
    );
    let buf = Arc::new(HostBuffer::new(8192).expect("alloc"));
    buf.fill_pattern(3);
    let _r = a
        .register_mem(vec![buf.clone(), file.clone()], &[])
        .expect("register dram + file");
    run(
        &a,
        XferOp::Write,
        &XferDescList::blocks(MemKind::Dram, buf.addr(), 8192, 1),
        &file.blocks(0, 8192, 1),
    );
    let report = a.path_report(a.name());
    assert!(
        report.iter().all(|(_, p)| !p.contains("VRAM")),
        "{report:?}"
    );
}

#[test]
fn bad_bounce_params_are_typed_errors() {
    let a = Agent::new(
        &format!("vram-params-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    let bad = [
        PosixParams::default().bounce_chunk(0),
        PosixParams::default().bounce_chunk(4097),
        PosixParams::default().bounce_chunk(2 << 30),
        PosixParams::default()
            .bounce_chunk(8192)
            .direct_alignment(65536)
            .chunk_size(65536),
        PosixParams::default().bounce_buffers(0),
        PosixParams::default().bounce_buffers(100_000),
    ];
    for p in bad {
        let what = format!("{p:?}");
        match a.create_backend(p) {
            Err(Error::InvalidParam { reason, .. }) => {
                assert!(reason.contains("bounce"), "{reason}")
            }
            other => panic!("{what}: expected InvalidParam, got {other:?}"),
        }
    }
    let map = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    for kv in [
        [("bounce_chunk", "abc")],
        [("bounce_chunk", "0")],
        [("bounce_chunk", "4097")],
        [("bounce_buffers", "0")],
        [("bounce_buffers", "many")],
    ] {
        assert!(
            matches!(
                PosixPlugin.parse_params(&map(&kv)),
                Err(Error::InvalidParam { .. })
            ),
            "{kv:?}"
        );
    }
    for kv in [
        [("bounce_buffers", "auto")],
        [("bounce_chunk", "1048576")],
        [("bounce_buffers", "3")],
    ] {
        assert!(PosixPlugin.parse_params(&map(&kv)).is_ok(), "{kv:?}");
    }
    let d = PosixPlugin.default_params();
    assert_eq!(d.get("bounce_chunk").map(String::as_str), Some("8388608"));
    assert!(PosixPlugin.parse_params(&d).is_ok());
    // Nothing was created by the failures.
    assert!(a.path_report(a.name()).is_empty());
    a.create_backend(PosixParams::default())
        .expect("valid params still work");
}

/// WRITE `segs` of `src` to the file, READ them back into `dst`, compare in device memory and
/// in the file itself.
fn roundtrip(
    a: &Agent,
    file: &FileRegion,
    segs: &[(u64, u64)],
    file_base: u64,
    seed: u64,
) -> String {
    let total: u64 = segs.iter().map(|s| s.0 + s.1).max().unwrap_or(0);
    let (Some(src), Some(dst)) = (device(total as usize), device(total as usize)) else {
        return String::new();
    };
    let bytes = pattern(total as usize, seed);
    src.copy_from_host(0, &bytes).expect("h2d");
    let _r = a
        .register_mem(
            vec![src.clone(), dst.clone()],
            &[a.backend(POSIX).expect("POSIX backend")],
        )
        .expect("register VRAM with POSIX");
    // File offsets: the segments packed one after another from `file_base`.
    let mut fsegs = Vec::new();
    let mut at = file_base;
    for &(_, len) in segs {
        fsegs.push((at, len));
        at += len.next_multiple_of(4096);
    }
    let path = run(a, XferOp::Write, &vram(&src, segs), &files(file, &fsegs));
    run(a, XferOp::Read, &vram(&dst, segs), &files(file, &fsegs));
    let mut back = vec![0u8; total as usize];
    dst.copy_to_host(0, &mut back).expect("d2h");
    for (&(off, len), &(foff, _)) in segs.iter().zip(&fsegs) {
        let r = off as usize..(off + len) as usize;
        assert!(
            back[r.clone()] == bytes[r.clone()],
            "segment at {off}+{len} differs after the round trip"
        );
        let mut on_disk = vec![0u8; len as usize];
        std::fs::File::open(file.path())
            .expect("open")
            .read_exact_at(&mut on_disk, foff)
            .expect("read file");
        assert!(on_disk == bytes[r], "file bytes at {foff}+{len} differ");
    }
    path
}

#[test]
fn vram_file_roundtrip_direct_and_page_cache() {
    if device(4096).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for engine in [Engine::Auto, Engine::ThreadPool] {
        let a = agent("rt", small_bounce().engine(engine));
        // O_DIRECT: aligned file offsets and lengths; lengths not multiples of bounce_chunk.
        let direct = Arc::new(
            FileRegion::open(
                dir.path().join(format!("d-{engine:?}")),
                64 * MIB,
                OpenFlags::direct(),
            )
            .expect("open"),
        );
        let _fr = a
            .register_mem(
                vec![direct.clone()],
                &[a.backend(POSIX).expect("POSIX backend")],
            )
            .expect("register");
        let segs = [
            (0, 3 * MIB + 8192),
            (4 * MIB, MIB),
            (6 * MIB, 512 * 1024 + 4096),
            (7 * MIB, 5 * MIB),
        ];
        let path = roundtrip(&a, &direct, &segs, 4096, 1);
        assert!(path.contains("pinned bounce buffers 2 x 1 MiB"), "{path}");
        assert!(path.contains("O_DIRECT"), "{path}");
        // Page cache: any offsets and lengths, a misaligned device address too.
        let cached = Arc::new(
            FileRegion::open(
                dir.path().join(format!("c-{engine:?}")),
                64 * MIB,
                OpenFlags::buffered(),
            )
            .expect("open"),
        );
        let _fc = a
            .register_mem(
                vec![cached.clone()],
                &[a.backend(POSIX).expect("POSIX backend")],
            )
            .expect("register");
        let segs = [(1, 1_000_001), (2 * MIB + 3, 3 * MIB + 17), (6 * MIB, 4095)];
        let path = roundtrip(&a, &cached, &segs, 17, 2);
        assert!(path.contains("page cache"), "{path}");
        eprintln!("{engine:?}: {path}");
    }
}

#[test]
fn vram_misaligned_direct_is_typed_error_at_prepare() {
    let Some(dev) = device(4 * MIB as usize) else {
        return;
    };
    let a = agent("align", small_bounce());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Arc::new(
        FileRegion::open(dir.path().join("d"), 8 * MIB, OpenFlags::direct()).expect("open"),
    );
    let _r = a
        .register_mem(
            vec![dev.clone()],
            &[a.backend(POSIX).expect("POSIX backend")],
        )
        .expect("register vram");
    let _f = a
        .register_mem(
            vec![file.clone()],
            &[a.backend(POSIX).expect("POSIX backend")],
        )
        .expect("register file");
    for (what, local, remote) in [
        ("file offset", (0, MIB), (512, MIB)),
        ("length", (0, MIB - 1), (0, MIB - 1)),
    ] {
        for op in [XferOp::Write, XferOp::Read] {
            match request(&a, op, &vram(&dev, &[local]), &files(&file, &[remote])) {
                Err(Error::InvalidParam { reason, .. }) => {
                    assert!(
                        reason.contains(what) && reason.contains("O_DIRECT"),
                        "{reason}"
                    )
                }
                Err(e) => panic!("{what}: expected InvalidParam, got {e}"),
                Ok(_) => panic!("{what}: a misaligned O_DIRECT request was accepted"),
            }
        }
    }
    // The device address need not be aligned (the staging is): this one works.
    let req = request(
        &a,
        XferOp::Write,
        &vram(&dev, &[(3, MIB)]),
        &files(&file, &[(0, MIB)]),
    )
    .expect("unaligned device address is fine");
    a.post_xfer_req(&req).expect("post");
    req.wait(T).expect("wait");
}

#[test]
fn vram_registration_checks_the_range_and_device() {
    let Some(dev) = device(MIB as usize) else {
        return;
    };
    let a = agent("range", PosixParams::default());
    let host = HostBuffer::new(4096).expect("alloc");
    for (what, desc) in [
        (
            "past the allocation",
            RegionDesc {
                kind: MemKind::Vram,
                addr: dev.addr(),
                len: 2 * MIB,
                dev_id: 0,
                meta: Vec::new(),
            },
        ),
        (
            "bad ordinal",
            RegionDesc {
                kind: MemKind::Vram,
                addr: dev.addr(),
                len: MIB,
                dev_id: 4096,
                meta: Vec::new(),
            },
        ),
        (
            "host memory",
            RegionDesc {
                kind: MemKind::Vram,
                addr: host.addr(),
                len: 4096,
                dev_id: 0,
                meta: Vec::new(),
            },
        ),
    ] {
        // SAFETY: registration fails before any transfer touches the range.
        let r = Arc::new(unsafe { RawRegion::new(desc) });
        match a.register_mem(vec![r], &[a.backend(POSIX).expect("POSIX backend")]) {
            Err(Error::InvalidParam { reason, .. }) => eprintln!("{what}: {reason}"),
            other => panic!("{what}: expected InvalidParam, got {other:?}"),
        }
    }
    let _ok = a
        .register_mem(vec![dev], &[a.backend(POSIX).expect("POSIX backend")])
        .expect("the real buffer registers");
}

#[test]
fn vram_cancel_in_flight_waits_for_running_chunks() {
    const LEN: u64 = 128 * MIB;
    let Some(dev) = device(LEN as usize) else {
        return;
    };
    let a = agent(
        "cancel",
        PosixParams::default()
            .bounce_chunk(MIB)
            .bounce_buffers(1)
            .pool_threads(2),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file =
        Arc::new(FileRegion::open(dir.path().join("c"), LEN, OpenFlags::direct()).expect("open"));
    let _r = a
        .register_mem(
            vec![dev.clone(), file.clone()],
            &[a.backend(POSIX).expect("POSIX backend")],
        )
        .expect("register");
    let local = vram(&dev, &[(0, LEN)]);
    let remote = files(&file, &[(0, LEN)]);
    for op in [XferOp::Write, XferOp::Read] {
        let req = request(&a, op, &local, &remote).expect("request");
        a.post_xfer_req(&req).expect("post");
        req.cancel().expect("cancel returns once no chunk runs");
        assert!(!req.is_in_flight());
        // Dropping after cancel is immediate and safe; the memory can be reused at once.
        drop(req);
    }
    // The backend still works after cancels: a full round trip of a part.
    let bytes = pattern(4 * MIB as usize, 9);
    dev.copy_from_host(0, &bytes).expect("h2d");
    run(
        &a,
        XferOp::Write,
        &vram(&dev, &[(0, 4 * MIB)]),
        &files(&file, &[(0, 4 * MIB)]),
    );
    dev.fill(0).expect("clear");
    run(
        &a,
        XferOp::Read,
        &vram(&dev, &[(0, 4 * MIB)]),
        &files(&file, &[(0, 4 * MIB)]),
    );
    let mut back = vec![0u8; bytes.len()];
    dev.copy_to_host(0, &mut back).expect("d2h");
    assert!(back == bytes, "data after cancel + re-run differs");
}

#[test]
fn vram_path_is_reported() {
    let Some(dev) = device(2 * MIB as usize) else {
        return;
    };
    let a = agent("path", small_bounce());
    let _r = a
        .register_mem(
            vec![dev.clone()],
            &[a.backend(POSIX).expect("POSIX backend")],
        )
        .expect("register");
    let report = a.path_report(a.name());
    let posix = report
        .iter()
        .find(|(b, _)| b == POSIX)
        .map(|(_, p)| p.clone())
        .unwrap_or_default();
    assert!(
        posix.contains(
            "VRAM: pinned bounce buffers 2 x 1 MiB + pread/pwrite x4, cuMemcpyAsync (no GDS)"
        ),
        "{posix}"
    );
    eprintln!("path report: {posix}");
}
