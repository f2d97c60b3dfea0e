//! POSIX backend scenarios: both engines, buffered and O_DIRECT, bad inputs, queries, and the
//! shared conformance suite.
#![cfg(feature = "posix")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nixl_backend_gds::{Engine, FileRegion, OpenFlags, PosixParams, PosixPlugin, POSIX};
use nixl_core::backend::BackendPlugin;
use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, MemoryRegion, RegionDesc, XferDescList,
    XferOp, XferOptions, XferTarget,
};
use nixl_testkit::conformance::Suite;
use nixl_testkit::{skip, Dep};

const T: Duration = Duration::from_secs(20);

fn agent(tag: &str, engine: Engine) -> Agent {
    agent_or_skip(tag, engine).expect("io_uring is available (checked by the caller)")
}

/// An agent with a POSIX backend on `engine`; `None` (after reporting a skip for
/// [`Dep::IoUring`]) when `Engine::IoUring` is asked for and this kernel has none.
fn agent_or_skip(tag: &str, engine: Engine) -> Option<Agent> {
    let name = format!("posix-{tag}-{}", std::process::id());
    let a = Agent::new(&name, AgentConfig::default()).expect("agent");
    match a.create_backend(
        PosixParams::default()
            .engine(engine)
            .queue_depth(8)
            .chunk_size(64 * 1024)
            .inline_max(0),
    ) {
        Ok(_) => Some(a),
        Err(Error::Unavailable { what, hint }) if engine == Engine::IoUring => {
            let test = std::thread::current().name().unwrap_or(tag).to_owned();
            skip(
                &test,
                Dep::IoUring,
                format!("io_uring unavailable: {what}: {hint}"),
            );
            None
        }
        Err(e) => panic!("creating POSIX on {engine:?}: {e}"),
    }
}

/// The word a request's path names for an engine that was asked for explicitly.
fn engine_word(engine: Engine) -> &'static str {
    match engine {
        Engine::IoUring => "io_uring",
        Engine::ThreadPool => "thread-pool",
        Engine::Auto => "",
    }
}

fn buf(len: usize) -> Arc<HostBuffer> {
    Arc::new(HostBuffer::new(len).expect("alloc"))
}

fn xfer(a: &Agent, op: XferOp, local: XferDescList, remote: XferDescList) -> nixl_core::Result<()> {
    xfer_path(a, op, local, remote).map(|_| ())
}

/// Runs one request; the path it reported.
fn xfer_path(
    a: &Agent,
    op: XferOp,
    local: XferDescList,
    remote: XferDescList,
) -> nixl_core::Result<String> {
    let req = a.create_xfer_req(op, &local, &remote, a.name(), XferOptions::default())?;
    a.post_xfer_req(&req)?;
    req.wait(T)?;
    Ok(req.path())
}

/// A scattered WRITE and READ back through `engine`, which both requests' paths must name
/// (no silent fallback to the other engine).
fn roundtrip(engine: Engine, flags: OpenFlags) {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(a) = agent_or_skip(&format!("rt-{engine:?}-{}", flags.direct), engine) else {
        return;
    };
    const BLOCK: u64 = 256 * 1024;
    const N: usize = 12;
    let file =
        Arc::new(FileRegion::open(dir.path().join("kv"), BLOCK * N as u64, flags).expect("open"));
    let (src, dst) = (buf(BLOCK as usize * N), buf(BLOCK as usize * N));
    src.fill_pattern(42);
    let _r = a
        .register_mem(vec![src.clone(), dst.clone(), file.clone()], &[])
        .expect("register");
    // Scattered: DRAM block i goes to file block (i * 7) % N.
    let perm: Vec<u64> = (0..N as u64).map(|i| (i * 7) % N as u64).collect();
    let local = XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, N);
    let remote = XferDescList::from_descs(
        MemKind::File,
        perm.iter().map(|&j| file.desc_at(j * BLOCK, BLOCK)),
    );
    let wpath = xfer_path(&a, XferOp::Write, local, remote.clone()).expect("write");
    let rpath = xfer_path(
        &a,
        XferOp::Read,
        XferDescList::blocks(MemKind::Dram, dst.addr(), BLOCK, N),
        remote,
    )
    .expect("read");
    for path in [&wpath, &rpath] {
        assert!(path.contains(engine_word(engine)), "{engine:?}: {path}");
        if engine == Engine::IoUring {
            assert!(!path.contains("thread-pool"), "fell back: {path}");
        }
    }
    assert_eq!(src.to_vec(), dst.to_vec());
    // The bytes really are in the file, where the descriptors said.
    let on_disk = std::fs::read(file.path()).expect("read file");
    let s = src.to_vec();
    for (i, &j) in perm.iter().enumerate() {
        let (a0, b0) = (i * BLOCK as usize, j as usize * BLOCK as usize);
        assert_eq!(
            s[a0..a0 + BLOCK as usize],
            on_disk[b0..b0 + BLOCK as usize],
            "block {i}"
        );
    }
}

#[test]
fn io_uring_buffered_roundtrip() {
    roundtrip(Engine::IoUring, OpenFlags::buffered());
}

#[test]
fn io_uring_direct_roundtrip() {
    roundtrip(Engine::IoUring, OpenFlags::direct());
}

#[test]
fn thread_pool_buffered_roundtrip() {
    roundtrip(Engine::ThreadPool, OpenFlags::buffered());
}

#[test]
fn thread_pool_direct_roundtrip() {
    roundtrip(Engine::ThreadPool, OpenFlags::direct());
}

#[test]
fn path_names_the_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    for engine in [Engine::ThreadPool, Engine::IoUring] {
        let word = engine_word(engine);
        let Some(a) = agent_or_skip(&format!("path-{engine:?}"), engine) else {
            continue;
        };
        let file = Arc::new(
            FileRegion::open(
                dir.path().join(format!("{engine:?}")),
                4096,
                OpenFlags::direct(),
            )
            .expect("open"),
        );
        let b = buf(4096);
        let _r = a
            .register_mem(vec![b.clone(), file.clone()], &[])
            .expect("register");
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
                &file.blocks(0, 4096, 1),
                a.name(),
                XferOptions::default(),
            )
            .expect("create");
        let path = req.path();
        eprintln!("{engine:?}: {path}");
        assert!(
            path.starts_with("POSIX: ") && path.contains("O_DIRECT") && path.contains(word),
            "{path}"
        );
        let report = a.path_report(a.name());
        assert_eq!(report.len(), 1, "{report:?}");
        if path.contains("io_uring") {
            // Buffers are registered with the ring, or the path says why not.
            assert!(
                path.contains("fixed buffers") || path.contains("unregistered buffers: "),
                "{path}"
            );
        }
        // The chunk size is reported.
        assert!(path.contains("chunks up to "), "{path}");
    }
}

#[test]
fn io_uring_engine_is_available_here_or_reported() {
    let a = Agent::new(
        &format!("posix-uring-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    match a.create_backend(PosixParams::default().engine(Engine::IoUring)) {
        Ok(_) => {}
        Err(Error::Unavailable { what, hint }) => nixl_testkit::skip(
            "io_uring_backend",
            nixl_testkit::Dep::IoUring,
            format!("io_uring unavailable here: {what}: {hint}"),
        ),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn misaligned_direct_descriptors_are_refused_at_prepare() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = agent("misaligned", Engine::Auto);
    let file = Arc::new(
        FileRegion::open(dir.path().join("d"), 1 << 20, OpenFlags::direct()).expect("open"),
    );
    let b = buf(1 << 20);
    let _r = a
        .register_mem(vec![b.clone(), file.clone()], &[])
        .expect("register");
    let cases = [
        ("offset", b.addr(), 512u64, 4096u64),
        ("length", b.addr(), 0, 1000),
        ("buffer", b.addr() + 8, 0, 4096),
    ];
    for (what, addr, off, len) in cases {
        let r = a.create_xfer_req(
            XferOp::Write,
            &XferDescList::from_descs(MemKind::Dram, [Desc::new(addr, len)]),
            &XferDescList::from_descs(MemKind::File, [file.desc_at(off, len)]),
            a.name(),
            XferOptions::default(),
        );
        match r {
            Err(Error::InvalidParam { reason, .. }) => {
                assert!(reason.contains("O_DIRECT"), "{what}: {reason}")
            }
            other => panic!("{what}: expected InvalidParam, got {other:?}"),
        }
    }
    // The same descriptors are fine through the page cache.
    let cached = Arc::new(
        FileRegion::open(dir.path().join("c"), 1 << 20, OpenFlags::buffered()).expect("open"),
    );
    let _r2 = a.register_mem(vec![cached.clone()], &[]).expect("register");
    b.fill_pattern(3);
    xfer(
        &a,
        XferOp::Write,
        XferDescList::from_descs(MemKind::Dram, [Desc::new(b.addr() + 8, 1000)]),
        XferDescList::from_descs(MemKind::File, [cached.desc_at(512, 1000)]),
    )
    .expect("buffered misaligned write");
    let on_disk = std::fs::read(cached.path()).expect("read");
    assert_eq!(on_disk[512..1512], b.to_vec()[8..1008]);
}

#[test]
fn descriptor_past_end_of_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = agent("past-end", Engine::Auto);
    let file = Arc::new(
        FileRegion::open(dir.path().join("p"), 8192, OpenFlags::buffered()).expect("open"),
    );
    let b = buf(16384);
    let _r = a
        .register_mem(vec![b.clone(), file.clone()], &[])
        .expect("register");
    // Past the registered region: the agent refuses it when preparing.
    let past = XferDescList::from_descs(MemKind::File, [file.desc_at(4096, 8192)]);
    assert!(matches!(
        a.prep_xfer_dlist(XferTarget::Agent(a.name()), &past, &[]),
        Err(Error::NotFound { .. })
    ));
    // A region declared longer than the file: READ past the file's end fails at post, typed.
    std::fs::write(dir.path().join("short"), vec![7u8; 4096]).expect("write");
    let short = Arc::new(
        FileRegion::open(
            dir.path().join("short"),
            16384,
            OpenFlags {
                read_only: true,
                create: false,
                ..OpenFlags::default()
            },
        )
        .expect("open"),
    );
    let _r2 = a.register_mem(vec![short.clone()], &[]).expect("register");
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, b.addr(), 8192, 1),
            &short.blocks(0, 8192, 1),
            a.name(),
            XferOptions::default(),
        )
        .expect("create");
    match a.post_xfer_req(&req) {
        Err(Error::InvalidParam { reason, .. }) => {
            assert!(reason.contains("past the end"), "{reason}")
        }
        other => panic!("expected InvalidParam, got {other:?}"),
    }
    // Nothing was written into the buffer, and a read inside the file still works.
    assert!(b.to_vec().iter().all(|&x| x == 0));
    xfer(
        &a,
        XferOp::Read,
        XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
        short.blocks(0, 4096, 1),
    )
    .expect("read inside");
    assert_eq!(b.to_vec()[..4096], vec![7u8; 4096][..]);
}

#[test]
fn query_mem_reports_existence_and_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = agent("query", Engine::Auto);
    let file = FileRegion::open(dir.path().join("q"), 12288, OpenFlags::buffered()).expect("open");
    let missing = RegionDesc {
        kind: MemKind::File,
        addr: 0,
        len: 0,
        dev_id: 0,
        meta: dir
            .path()
            .join("nope")
            .as_os_str()
            .as_encoded_bytes()
            .to_vec(),
    };
    let q = a.query_mem(&[file.desc(), missing], &[]).expect("query");
    assert_eq!(q.len(), 2);
    let (have, none) = (q[0].expect("answer"), q[1].expect("answer"));
    assert!(have.exists && have.size == Some(12288), "{have:?}");
    assert!(!none.exists && none.size.is_none(), "{none:?}");
    // A query without a path is a typed error.
    let nameless = RegionDesc {
        kind: MemKind::File,
        addr: 0,
        len: 0,
        dev_id: 3,
        meta: vec![],
    };
    assert!(matches!(
        a.query_mem(&[nameless], &[]),
        Err(Error::InvalidParam { .. })
    ));
}

#[test]
fn bad_registrations_and_transfers_are_typed() {
    let a = agent("bad", Engine::Auto);
    // A device id that is not an open descriptor.
    let bogus = RawRegion::storage(RegionDesc {
        kind: MemKind::File,
        addr: 0,
        len: 4096,
        dev_id: 1 << 30,
        meta: vec![],
    })
    .expect("storage");
    assert!(matches!(
        a.register_mem(
            vec![Arc::new(bogus)],
            &[a.backend(POSIX).expect("POSIX backend")]
        ),
        Err(Error::InvalidParam { .. })
    ));
    // Notifications are not a storage feature.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Arc::new(
        FileRegion::open(dir.path().join("n"), 4096, OpenFlags::buffered()).expect("open"),
    );
    let b = buf(4096);
    let _r = a
        .register_mem(vec![b.clone(), file.clone()], &[])
        .expect("register");
    let r = a.create_xfer_req(
        XferOp::Write,
        &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
        &file.blocks(0, 4096, 1),
        a.name(),
        XferOptions::with_notif(b"x".to_vec()),
    );
    assert!(matches!(r, Err(Error::NotSupported { .. })), "{r:?}");
    // Parameters parsed from strings are checked.
    let mut m = BTreeMap::new();
    m.insert("chunk_size".to_owned(), "1000".to_owned());
    assert!(matches!(
        PosixPlugin.parse_params(&m),
        Err(Error::InvalidParam { .. })
    ));
    m.insert("chunk_size".to_owned(), "x".to_owned());
    assert!(matches!(
        PosixPlugin.parse_params(&m),
        Err(Error::InvalidParam { .. })
    ));
    let mut m = BTreeMap::new();
    m.insert("bogus".to_owned(), "1".to_owned());
    assert!(matches!(
        PosixPlugin.parse_params(&m),
        Err(Error::InvalidParam { .. })
    ));
    assert!(PosixPlugin
        .parse_params(&PosixPlugin.default_params())
        .is_ok());
    let bad = Agent::new(
        &format!("posix-badparams-{}", std::process::id()),
        AgentConfig::default(),
    )
    .expect("agent");
    assert!(matches!(
        bad.create_backend(PosixParams::default().queue_depth(0)),
        Err(Error::InvalidParam { .. })
    ));
    assert!(bad.backends().is_empty());
}

#[test]
fn registration_survives_closing_the_callers_descriptor() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().expect("tempdir");
    let a = agent("dup", Engine::Auto);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("raw"))
        .expect("open");
    f.set_len(4096).expect("len");
    let fd = f.as_raw_fd() as u64;
    let raw = RawRegion::storage(RegionDesc {
        kind: MemKind::File,
        addr: 0,
        len: 4096,
        dev_id: fd,
        meta: vec![],
    })
    .expect("storage");
    let b = buf(4096);
    b.fill(9);
    let _r = a
        .register_mem(vec![b.clone(), Arc::new(raw)], &[])
        .expect("register");
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
            &XferDescList::from_descs(MemKind::File, [Desc::on_device(0, 4096, fd)]),
            a.name(),
            XferOptions::default(),
        )
        .expect("create");
    drop(f);
    a.post_xfer_req(&req).expect("post");
    req.wait(T).expect("wait");
    assert_eq!(
        std::fs::read(dir.path().join("raw")).expect("read"),
        vec![9u8; 4096]
    );
}

#[test]
fn repost_and_concurrent_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = agent("conc", Engine::Auto);
    const BLOCK: u64 = 128 * 1024;
    let file = Arc::new(
        FileRegion::open(dir.path().join("c"), BLOCK * 4, OpenFlags::direct()).expect("open"),
    );
    let b = buf(BLOCK as usize * 4);
    b.fill_pattern(1);
    let _r = a
        .register_mem(vec![b.clone(), file.clone()], &[])
        .expect("register");
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (a, b, file) = (a.clone(), b.clone(), file.clone());
            s.spawn(move || {
                let req = a
                    .create_xfer_req(
                        XferOp::Write,
                        &XferDescList::blocks(MemKind::Dram, b.addr() + t * BLOCK, BLOCK, 1),
                        &file.blocks(t * BLOCK, BLOCK, 1),
                        a.name(),
                        XferOptions::default(),
                    )
                    .expect("create");
                for _ in 0..10 {
                    a.post_xfer_req(&req).expect("post");
                    req.wait(T).expect("wait");
                }
            });
        }
    });
    assert_eq!(std::fs::read(file.path()).expect("read"), b.to_vec());
}

/// A POSIX agent on `engine` with extra parameters (`None` after a skip, as
/// [`agent_or_skip`]).
fn agent_with(tag: &str, p: PosixParams) -> Option<Agent> {
    let name = format!("posix-{tag}-{}", std::process::id());
    let a = Agent::new(&name, AgentConfig::default()).expect("agent");
    match a.create_backend(p.clone()) {
        Ok(_) => Some(a),
        Err(Error::Unavailable { what, hint }) if p.engine == Engine::IoUring => {
            skip(
                tag,
                Dep::IoUring,
                format!("io_uring unavailable: {what}: {hint}"),
            );
            None
        }
        Err(e) => panic!("creating POSIX on {:?}: {e}", p.engine),
    }
}

fn fault_params(engine: Engine) -> PosixParams {
    PosixParams::default()
        .engine(engine)
        .queue_depth(8)
        .chunk_size(64 * 1024)
        .pool_threads(2)
        .inline_max(0)
}

/// `/dev/full` as a FILE region: every write to it fails with ENOSPC.
fn dev_full(len: u64) -> Arc<FileRegion> {
    Arc::new(
        FileRegion::open(
            "/dev/full",
            len,
            OpenFlags {
                create: false,
                ..OpenFlags::default()
            },
        )
        .expect("open /dev/full"),
    )
}

/// The `device id N (path) bytes [a, b)` ranges an error names.
fn named_ranges(msg: &str) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    for part in msg.split("device id ").skip(1) {
        let num = |s: &str| s.trim().parse::<u64>().ok();
        let Some((fd, rest)) = part.split_once(" bytes [") else {
            continue;
        };
        let fd = fd.split(' ').next().unwrap_or(fd);
        let Some((a, rest)) = rest.split_once(", ") else {
            continue;
        };
        let Some((b, _)) = rest.split_once(')') else {
            continue;
        };
        if let (Some(fd), Some(a), Some(b)) = (num(fd), num(a), num(b)) {
            out.push((fd, a, b));
        }
    }
    out
}

fn io_error(e: &Error) -> (std::io::ErrorKind, String) {
    match e {
        Error::Io { source, .. } => (source.kind(), source.to_string()),
        other => panic!("expected a typed I/O error, got {other:?}"),
    }
}

/// A full device fails a WRITE with a typed error that says nothing was written; a READ
/// of the same request shape still works elsewhere (the agent is unharmed).
#[test]
fn a_full_device_fails_the_write_typed_and_says_nothing_was_written() {
    for engine in [Engine::IoUring, Engine::ThreadPool] {
        let Some(a) = agent_with("enospc_all_written_chunks_named", fault_params(engine)) else {
            continue;
        };
        const BLOCK: u64 = 64 * 1024;
        let full = dev_full(BLOCK * 4);
        let src = buf(BLOCK as usize * 4);
        src.fill_pattern(3);
        let _r = a
            .register_mem(vec![src.clone(), full.clone()], &[])
            .expect("register");
        let e = xfer(
            &a,
            XferOp::Write,
            XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, 4),
            full.blocks(0, BLOCK, 4),
        )
        .expect_err("a write to /dev/full fails");
        let (kind, msg) = io_error(&e);
        assert_eq!(kind, std::io::ErrorKind::StorageFull, "{engine:?}: {msg}");
        assert!(
            msg.contains("no chunk of 4 was written"),
            "{engine:?}: {msg}"
        );
        assert_eq!(a.draining_requests(), 0, "{engine:?}: nothing left behind");
    }
}

/// A request whose chunks partly fail names exactly the chunks it wrote: every range it
/// names holds the new bytes, and every chunk it does not name was never written.
#[test]
fn a_partial_write_failure_names_exactly_the_chunks_written() {
    for engine in [Engine::IoUring, Engine::ThreadPool] {
        let Some(a) = agent_with("partial_write_names_chunks", fault_params(engine)) else {
            continue;
        };
        const BLOCK: u64 = 64 * 1024;
        const N: usize = 6;
        let dir = tempfile::tempdir().expect("tempdir");
        let good = Arc::new(
            FileRegion::open(
                dir.path().join("good"),
                BLOCK * N as u64,
                OpenFlags::buffered(),
            )
            .expect("open"),
        );
        let full = dev_full(BLOCK * 2);
        let src = buf(BLOCK as usize * (N + 2));
        src.fill_pattern(9);
        let _r = a
            .register_mem(vec![src.clone(), good.clone(), full.clone()], &[])
            .expect("register");
        // N blocks to the good file, then two to the full device.
        let remote = XferDescList::from_descs(
            MemKind::File,
            (0..N as u64)
                .map(|i| good.desc_at(i * BLOCK, BLOCK))
                .chain((0..2).map(|i| full.desc_at(i * BLOCK, BLOCK))),
        );
        let e = xfer(
            &a,
            XferOp::Write,
            XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, N + 2),
            remote,
        )
        .expect_err("the /dev/full chunks fail");
        let (kind, msg) = io_error(&e);
        assert_eq!(kind, std::io::ErrorKind::StorageFull, "{engine:?}: {msg}");
        let named = named_ranges(&msg);
        assert!(
            named.iter().all(|&(fd, _, _)| fd != full.dev_id()),
            "{engine:?}: a failed chunk is named written: {msg}"
        );
        let on_disk = std::fs::read(good.path()).expect("read");
        let s = src.to_vec();
        let mut written = 0;
        for i in 0..N {
            let (lo, hi) = (i * BLOCK as usize, (i + 1) * BLOCK as usize);
            let is_named = named
                .iter()
                .any(|&(fd, a0, b0)| fd == good.dev_id() && a0 as usize <= lo && hi <= b0 as usize);
            if is_named {
                written += 1;
                assert_eq!(
                    s[lo..hi],
                    on_disk[lo..hi],
                    "{engine:?}: named block {i}: {msg}"
                );
            } else {
                assert!(
                    on_disk[lo..hi].iter().all(|&x| x == 0),
                    "{engine:?}: block {i} was written but not named: {msg}"
                );
            }
        }
        if written > 0 {
            let path = good.path().display().to_string();
            assert!(msg.contains(&path), "{engine:?}: the file is named: {msg}");
        }
        assert!(
            msg.contains(&format!("{written} of {} chunks were written", N + 2))
                || (written == 0 && msg.contains("no chunk")),
            "{engine:?}: {msg}"
        );
    }
}

/// With `durable`, a WRITE's path says it is synced before `Done`, and the bytes are there.
#[test]
fn durable_writes_sync_before_done_and_say_so() {
    for engine in [Engine::IoUring, Engine::ThreadPool] {
        let Some(a) = agent_with("durable_writes_sync", fault_params(engine).durable(true)) else {
            continue;
        };
        const BLOCK: u64 = 64 * 1024;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = Arc::new(
            FileRegion::open(dir.path().join("d"), BLOCK * 4, OpenFlags::buffered()).expect("open"),
        );
        let (src, dst) = (buf(BLOCK as usize * 4), buf(BLOCK as usize * 4));
        src.fill_pattern(5);
        let _r = a
            .register_mem(vec![src.clone(), dst.clone(), file.clone()], &[])
            .expect("register");
        let path = xfer_path(
            &a,
            XferOp::Write,
            XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, 4),
            file.blocks(0, BLOCK, 4),
        )
        .expect("durable write");
        assert!(path.contains("durable (fdatasync before done)"), "{path}");
        let rpath = xfer_path(
            &a,
            XferOp::Read,
            XferDescList::blocks(MemKind::Dram, dst.addr(), BLOCK, 4),
            file.blocks(0, BLOCK, 4),
        )
        .expect("read");
        assert!(
            !rpath.contains("durable"),
            "a READ has nothing to sync: {rpath}"
        );
        assert_eq!(src.to_vec(), dst.to_vec());
    }
    // The parameter is reachable by name, and a bad value is refused.
    let mut m = BTreeMap::new();
    m.insert("durable".to_owned(), "true".to_owned());
    PosixPlugin.parse_params(&m).expect("durable=true");
    m.insert("durable".to_owned(), "maybe".to_owned());
    assert!(matches!(
        PosixPlugin.parse_params(&m),
        Err(Error::InvalidParam { .. })
    ));
}

/// A request whose deadline passes stops: chunks not yet submitted are never written, and
/// the request stops draining once the kernel holds none of its chunks.
#[test]
fn a_request_past_its_deadline_writes_no_further_chunks() {
    for engine in [Engine::IoUring, Engine::ThreadPool] {
        let Some(a) = agent_with("deadline_stops_queued_chunks", fault_params(engine)) else {
            continue;
        };
        const BLOCK: u64 = 64 * 1024;
        const N: usize = 4096; // 256 MiB
        let dir = tempfile::tempdir().expect("tempdir");
        let file = Arc::new(
            FileRegion::open(
                dir.path().join("big"),
                BLOCK * N as u64,
                OpenFlags::buffered(),
            )
            .expect("open"),
        );
        let src = buf(BLOCK as usize * N);
        src.fill_pattern(11);
        let _r = a
            .register_mem(vec![src.clone(), file.clone()], &[])
            .expect("register");
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, N),
                &file.blocks(0, BLOCK, N),
                a.name(),
                XferOptions::default().timeout(Duration::from_millis(1)),
            )
            .expect("create");
        a.post_xfer_req(&req).expect("post");
        match req.wait(T) {
            Err(Error::TimedOut { .. }) => {}
            other => panic!("{engine:?}: expected TimedOut, got {other:?}"),
        }
        let until = std::time::Instant::now() + T;
        while req.is_draining() {
            assert!(
                std::time::Instant::now() < until,
                "{engine:?}: still draining"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let on_disk = std::fs::read(file.path()).expect("read");
        let written = on_disk
            .chunks(BLOCK as usize)
            .filter(|c| c.iter().any(|&x| x != 0))
            .count();
        assert!(
            written < N,
            "{engine:?}: all {N} chunks were written after the deadline passed"
        );
        // Settled: nothing more lands after the request stopped draining.
        std::thread::sleep(Duration::from_millis(50));
        let again = std::fs::read(file.path()).expect("read");
        assert!(
            on_disk == again,
            "{engine:?}: bytes landed after the request settled"
        );
        eprintln!("{engine:?}: {written} of {N} chunks written before the request stopped");
    }
}

fn suite(engine: Engine, direct: bool) -> Suite {
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Suite {
        name: format!("posix-{engine:?}-{direct}"),
        config: AgentConfig::default(),
        create: Arc::new(move |a: &Agent| {
            a.create_backend(PosixParams::default().engine(engine).inline_max(0))
        }),
        storage: Some(Arc::new(move |len| {
            let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let flags = if direct {
                OpenFlags::direct()
            } else {
                OpenFlags::buffered()
            };
            let f = FileRegion::open(dir.path().join(format!("f{n}")), len, flags)
                .map_err(|e| Error::io("conformance", nixl_core::Op::RegisterMem, e))?;
            Ok(Arc::new(f) as Arc<dyn MemoryRegion>)
        })),
    }
}

fn io_uring_direct() -> Option<Suite> {
    agent_or_skip("conf-probe", Engine::IoUring)?;
    Some(suite(Engine::IoUring, true))
}

fn io_uring_buffered() -> Option<Suite> {
    agent_or_skip("conf-probe", Engine::IoUring)?;
    Some(suite(Engine::IoUring, false))
}

fn thread_pool_direct() -> Option<Suite> {
    Some(suite(Engine::ThreadPool, true))
}

fn thread_pool_buffered() -> Option<Suite> {
    Some(suite(Engine::ThreadPool, false))
}

mod conformance_io_uring_direct {
    nixl_testkit::conformance_tests!(super::io_uring_direct);
}

mod conformance_io_uring_buffered {
    nixl_testkit::conformance_tests!(super::io_uring_buffered);
}

mod conformance_thread_pool_direct {
    nixl_testkit::conformance_tests!(super::thread_pool_direct);
}

mod conformance_thread_pool_buffered {
    nixl_testkit::conformance_tests!(super::thread_pool_buffered);
}

/// Done means landed for storage too (issue 33): a 64 MiB READ whose file is truncated at a
/// random point while the READ is in flight never ends `Done` unless every byte is the file's
/// (it ends in a typed error naming the end of file instead); a file removed mid-READ is still
/// open, so that READ lands whole. Both engines.
fn truncated_mid_read(engine: Engine) {
    const LEN: usize = 64 << 20;
    let Some(a) = agent_or_skip("truncated", engine) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let want: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 | 1).collect();
    let b = Arc::new(HostBuffer::new(LEN).expect("alloc"));
    let _rb = a.register_mem(vec![b.clone()], &[]).expect("register");
    let mut ends = BTreeMap::<String, usize>::new();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..8 {
        let path = dir.path().join(format!("t{round}"));
        std::fs::write(&path, &want).expect("write");
        let file =
            Arc::new(FileRegion::open(&path, LEN as u64, OpenFlags::buffered()).expect("open"));
        let _rf = a.register_mem(vec![file.clone()], &[]).expect("register");
        b.fill(0);
        let req = a
            .create_xfer_req(
                XferOp::Read,
                &XferDescList::blocks(MemKind::Dram, b.addr(), 1 << 20, LEN >> 20),
                &file.blocks(0, 1 << 20, LEN >> 20),
                a.name(),
                XferOptions::default(),
            )
            .expect("create");
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let cut = (seed % LEN as u64) & !4095;
        let removed = round % 4 == 3;
        a.post_xfer_req(&req).expect("post");
        if removed {
            std::fs::remove_file(&path).expect("remove");
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(cut))
                .expect("truncate");
        }
        match req.wait(T) {
            Ok(()) => {
                assert!(
                    b.to_vec() == want,
                    "{engine:?} round {round}: Done with bytes missing"
                );
                *ends.entry("Done".into()).or_default() += 1;
            }
            Err(e) => {
                assert!(!removed, "a removed file is still open: {e}");
                assert!(
                    matches!(
                        e.kind(),
                        nixl_core::ErrorKind::Backend | nixl_core::ErrorKind::Io
                    ),
                    "{e:?}"
                );
                assert!(req.is_quiescent());
                *ends.entry(e.kind().as_str().to_owned()).or_default() += 1;
            }
        }
    }
    eprintln!("{engine:?}: file truncated or removed mid-READ, ends {ends:?}");
}

#[test]
fn truncated_mid_read_io_uring() {
    truncated_mid_read(Engine::IoUring);
}

#[test]
fn truncated_mid_read_thread_pool() {
    truncated_mid_read(Engine::ThreadPool);
}
