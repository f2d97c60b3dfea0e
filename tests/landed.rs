//! Done means landed, terminal means quiescent (issue 33), over every transport that crosses a
//! process: the target is SIGKILLed at a random point of a READ or a WRITE of 1-256 MiB.
//!
//! - A request never ends `Done` unless every byte is the source's: the initiator's buffer for
//!   a READ; for a WRITE the target's memory, a shared file mapping the test reads after the
//!   kill.
//! - Every other end is a typed error, within the request's deadline.
//! - Once the request is terminal and quiescent ([`XferReq::wait_quiescent`]), a fresh
//!   sentinel in the initiator's buffer stays untouched for 200 ms: nothing the request started
//!   writes there any more.
//!
//! `NIXL_KILLS` sets the kills per transport and operation (default 6, split over the sizes;
//! the closing note's 200 come from `NIXL_KILLS=100`). Every outcome is counted by state and
//! printed.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::core::ErrorKind;
use nixl::libfabric::LibfabricParams;
use nixl::ucx::UcxParams;
use nixl::{
    Agent, AgentConfig, HostBuffer, MemKind, MemoryRegion, RegionDesc, XferDescList, XferOp,
    XferOptions, XferState,
};
use nixl_testkit::two_process::{child_main, Child};

const CHILD: &str = "landed_target_role";
/// Bytes the sentinel is made of.
const SENTINEL: u8 = 0xEE;
/// The request's deadline: far above any transfer here, so a kill, not the clock, ends it.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long a fresh sentinel must stay untouched after quiescence.
const QUIET: Duration = Duration::from_millis(200);
/// libfabric's bound on one operation: what a post on a blocked rail used to wait for.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// How soon a terminal request must be quiescent.
const QUIESCENT: Duration = Duration::from_secs(10);

/// Anonymous memory each target holds beside the mapping it serves.
const BALLAST: usize = 256 << 20;
/// The block each descriptor moves.
const BLOCK: u64 = 1 << 20;

/// A file in /dev/shm mapped shared: the target registers its mapping, the test maps it too
/// and reads what a WRITE left there after the target died.
struct SharedFile {
    path: std::path::PathBuf,
    addr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; it is accessed through raw
// copies only, like `HostBuffer`.
unsafe impl Send for SharedFile {}
// SAFETY: as above.
unsafe impl Sync for SharedFile {}

impl SharedFile {
    fn map(path: &std::path::Path, len: usize, create: bool) -> std::io::Result<SharedFile> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)?;
        if create {
            f.set_len(len as u64)?;
        }
        // SAFETY: a fresh shared mapping of an open file of at least `len` bytes; the kernel
        // picks the address.
        let addr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                f.as_fd(),
                0,
            )
        }?;
        Ok(SharedFile {
            path: path.to_owned(),
            addr: addr.cast(),
            len,
        })
    }

    fn write(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        // SAFETY: inside the mapping; `src` is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.addr, src.len()) };
    }

    fn read(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len.min(self.len)];
        // SAFETY: inside the mapping; `v` is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(self.addr, v.as_mut_ptr(), v.len()) };
        v
    }

    fn fill(&self, b: u8) {
        // SAFETY: the whole mapping.
        unsafe { std::ptr::write_bytes(self.addr, b, self.len) };
    }
}

// SAFETY: the mapping stays valid while the value lives, and a registration holds the value.
unsafe impl MemoryRegion for SharedFile {
    fn desc(&self) -> RegionDesc {
        RegionDesc::dram(self.addr as u64, self.len as u64)
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.addr.cast(), self.len) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `len` bytes of the pattern `seed`: every 1 MiB block is one seeded block with its first
/// word replaced by the block's index and the seed, so a block that landed in the wrong place
/// or came from an earlier transfer differs too. No byte is the sentinel.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let block = BLOCK as usize;
    let mut base = Vec::with_capacity(block);
    let mut x = seed | 1;
    while base.len() < block {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        base.extend(
            x.to_le_bytes()
                .map(|b| if b == SENTINEL { 0x11 } else { b }),
        );
    }
    let mut v = Vec::with_capacity(len);
    for i in 0..len.div_ceil(block) {
        let start = v.len();
        v.extend_from_slice(&base[..block.min(len - start)]);
        let tag = (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 0x0101_0101_0101_0101;
        let n = 8.min(v.len() - start);
        v[start..start + n].copy_from_slice(&tag.to_le_bytes()[..n]);
    }
    v
}

/// Blocks of `got` that differ from `want`, counted.
fn bad_blocks(got: &[u8], want: &[u8]) -> usize {
    got.chunks(BLOCK as usize)
        .zip(want.chunks(BLOCK as usize))
        .filter(|(g, w)| g != w)
        .count()
}

/// Bytes of `b` that are not the sentinel.
fn touched(b: &HostBuffer) -> usize {
    b.to_vec().iter().filter(|&&x| x != SENTINEL).count()
}

fn host_read(b: &HostBuffer, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    assert!(b.read_at(0, &mut v));
    v
}

/// The transports a kill runs over: (name, what the backend is made from).
fn create_backend(a: &Agent, transport: &str) -> nixl::Result<()> {
    create_backend_with(a, transport, &nixl::libfabric::LibfabricStats::default())
}

/// [`create_backend`], counting a libfabric backend's rails in `stats`.
fn create_backend_with(
    a: &Agent,
    transport: &str,
    stats: &nixl::libfabric::LibfabricStats,
) -> nixl::Result<()> {
    let ucx = |tls: &str, direct: bool| {
        UcxParams::default()
            .transports(tls.to_owned())
            .keepalive_interval(Duration::from_millis(500))
            .cancel_timeout(Duration::from_secs(5))
            .direct_cma(direct)
    };
    let fabric = |p: &str| {
        LibfabricParams::default()
            .provider(p.to_owned())
            .op_timeout(OP_TIMEOUT)
            .with_stats(stats.clone())
    };
    match transport {
        "ucx-tcp" => a.create_backend(ucx("tcp", false)),
        "ucx-shm" => a.create_backend(ucx("shm,self", false)),
        "ucx-cma" => a.create_backend(ucx("shm,cma,self", false)),
        "ucx-direct-cma" => a.create_backend(ucx("shm,cma,self", true)),
        "libfabric-tcp" => a.create_backend(fabric("tcp")),
        "libfabric-shm" => a.create_backend(fabric("shm")),
        other => panic!("unknown transport {other}"),
    }
    .map(|_| ())
}

fn config(listen: bool) -> AgentConfig {
    nixl::agent_config()
        .listen(listen)
        .default_timeout(DEADLINE)
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn landed_target_role() {
    child_main(|env| {
        let e = |e: nixl::Error| e.to_string();
        let transport = env.var("transport")?;
        let path = std::path::PathBuf::from(env.var("file")?);
        let len: usize = env.parse("len")?;
        let a = Agent::new(&env.name, config(true)).map_err(e)?;
        create_backend(&a, &transport).map_err(e)?;
        let file = Arc::new(SharedFile::map(&path, len, false).map_err(|e| e.to_string())?);
        let _reg = a.register_mem(vec![file.clone()], &[]).map_err(e)?;
        // Memory of the process's own, as a serving process has plenty of: its exit takes
        // as long as freeing it, and the target's memory may be gone (transfers failing)
        // well before its process is seen to exit.
        let ballast = HostBuffer::new(BALLAST).ok_or("alloc")?;
        ballast.fill(1);
        env.connect(&a, Duration::from_secs(20))?;
        a.gen_notif(
            &env.parent,
            format!("hello|{}", file.addr as u64).as_bytes(),
            &[],
        )
        .map_err(e)?;
        // Serve (progress) until killed, or until the parent is gone.
        let end = Instant::now() + Duration::from_secs(120);
        while Instant::now() < end && env.parent_alive() {
            let _ = a.wait_notifs(Duration::from_millis(50));
        }
        // Keep the mapping registered to the end.
        drop(_reg);
        Ok(())
    });
}

/// A tiny deterministic generator (xorshift) for sizes and kill points.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One target: spawned, connected, its mapping's address known.
struct Target {
    child: Child,
    name: String,
    addr: u64,
    file: Arc<SharedFile>,
}

fn spawn_target(p: &Agent, transport: &str, len: usize, k: usize) -> Target {
    let name = nixl_testkit::unique(&format!("landed-{transport}-{k}"));
    let path = std::env::temp_dir().join(format!("{name}.map"));
    let dir = std::path::Path::new("/dev/shm");
    let path = if dir.is_dir() {
        dir.join(path.file_name().unwrap())
    } else {
        path
    };
    let file = Arc::new(SharedFile::map(&path, len, true).expect("shared file"));
    let vars = [
        ("transport", transport),
        ("file", path.to_str().expect("utf-8 path")),
        ("len", &len.to_string()),
    ];
    let mut child = Child::spawn(CHILD, p, &name, &vars).expect("spawn target");
    let hello = child
        .next(p, Duration::from_secs(60))
        .expect("the target's hello");
    let hello = String::from_utf8_lossy(&hello).into_owned();
    let addr = hello
        .strip_prefix("hello|")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("bad hello {hello:?}"));
    Target {
        child,
        name,
        addr,
        file,
    }
}

/// How each kill ended.
#[derive(Default, Debug)]
struct Tally {
    states: BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, state: &str) {
        *self.states.entry(state.to_owned()).or_default() += 1;
    }
}

/// Fills the source with a fresh pattern and the destination with the sentinel; the pattern.
fn prepare(op: XferOp, t: &Target, local: &HostBuffer, len: usize, seed: u64) -> Vec<u8> {
    let want = pattern(seed, len);
    match op {
        XferOp::Read => {
            t.file.write(&want);
            local.fill(SENTINEL);
        }
        XferOp::Write => {
            assert!(local.write_at(0, &want));
            t.file.fill(SENTINEL);
        }
    }
    want
}

/// What the destination holds.
fn landed(op: XferOp, t: &Target, local: &HostBuffer, len: usize) -> Vec<u8> {
    match op {
        XferOp::Read => host_read(local, len),
        XferOp::Write => t.file.read(len),
    }
}

/// Checks that a fresh sentinel in `local` (of a quiescent request) stays as it is.
fn assert_quiet(local: &HostBuffer, what: &str) {
    local.fill(SENTINEL);
    std::thread::sleep(QUIET);
    let t = touched(local);
    assert_eq!(
        t, 0,
        "{what}: {t} bytes written after the request was quiescent"
    );
}

/// On a libfabric shm rail a dead target blocked: a new post (here to the agent itself) is
/// refused at once, typed, instead of waiting forever for an answer that cannot come.
fn assert_blocked_refuses(p: &Agent, local: &Arc<HostBuffer>, what: &str) {
    let page = 4096;
    let req = p
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, local.addr(), page, 1),
            &XferDescList::blocks(MemKind::Dram, local.addr() + page, page, 1),
            p.name(),
            XferOptions::default(),
        )
        .expect("a loopback request");
    let start = Instant::now();
    let e = p
        .post_xfer_req(&req)
        .and_then(|_| req.wait(Duration::from_secs(10)))
        .expect_err("a post on a blocked shm rail");
    assert!(
        e.kind() == ErrorKind::Backend && e.to_string().contains("blocked"),
        "{what}: {e:?}"
    );
    assert!(
        start.elapsed() < OP_TIMEOUT,
        "{what}: refused after {:?}, not at once",
        start.elapsed()
    );
}

/// Kills targets at random points of READs and WRITEs over `transport`; returns the tally.
fn kills(transport: &str, op: XferOp, seed: u64) -> Tally {
    let kills: usize = std::env::var("NIXL_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let mut rng = Rng(seed | 1);
    let stats = nixl::libfabric::LibfabricStats::default();
    let initiator = || {
        let p = Agent::new(&nixl_testkit::unique("landed-initiator"), config(true)).expect("agent");
        create_backend_with(&p, transport, &stats).expect("backend");
        p
    };
    // libfabric 1.17's shm endpoint answers its operations in post order, so a target killed
    // mid-operation blocks it for good (docs/reliability.md): each kill gets a fresh
    // initiator there, as an application recreates its agent.
    let fresh_each_kill = transport == "libfabric-shm";
    let mut released = 0;
    let mut blocked = 0;
    let mut p = initiator();
    let mut tally = Tally::default();
    // Sizes: 1 MiB to 256 MiB (powers of two, spread over the kills).
    let sizes = [1usize, 4, 16, 64, 256];
    // The time a whole transfer of each size takes, learnt from the first one: kill points
    // spread over it.
    let mut full: BTreeMap<usize, Duration> = BTreeMap::new();
    for k in 0..kills {
        let mib = sizes[k % sizes.len()];
        let len = mib << 20;
        let n = len / BLOCK as usize;
        let mut t = spawn_target(&p, transport, len, k);
        // A buffer of each kill's own: a request that still drains (its memory held) never
        // shares memory with the next one.
        let local = Arc::new(HostBuffer::new(len).expect("alloc"));
        let reg = p.register_mem(vec![local.clone()], &[]).expect("register");
        let req = p
            .create_xfer_req(
                op,
                &XferDescList::blocks(MemKind::Dram, local.addr(), BLOCK, n),
                &XferDescList::blocks(MemKind::Dram, t.addr, BLOCK, n),
                &t.name,
                XferOptions::default().timeout(DEADLINE).no_merge(true),
            )
            .expect("make");
        // The first transfer of a size runs to its end: its time is learnt (kill points are
        // spread over it) and every byte checked.
        if let std::collections::btree_map::Entry::Vacant(slot) = full.entry(mib) {
            let want = prepare(op, &t, &local, len, rng.next());
            let start = Instant::now();
            p.post_xfer_req(&req).expect("post");
            req.wait(DEADLINE).expect("a transfer to a live target");
            slot.insert(start.elapsed());
            let got = landed(op, &t, &local, len);
            assert_eq!(
                bad_blocks(&got, &want),
                0,
                "{transport} {op:?} {mib} MiB: a whole transfer"
            );
        }
        let what = format!("{transport} {op:?} {mib} MiB kill {k}");
        let want = prepare(op, &t, &local, len, rng.next());
        let span = full[&mib].as_nanos() as u64;
        let kill_at = Duration::from_nanos(rng.below(span + span / 4));
        let start = Instant::now();
        let mut killed = false;
        let outcome = match p.post_xfer_req(&req) {
            Err(e) => Err(e),
            Ok(_) => loop {
                if !killed && start.elapsed() >= kill_at {
                    t.child.kill();
                    killed = true;
                }
                match p.check_xfer_state(&req) {
                    Ok(XferState::Done) => break Ok(()),
                    Ok(XferState::InProgress) => {
                        assert!(
                            start.elapsed() < DEADLINE + Duration::from_secs(5),
                            "{what}: still in progress past its deadline"
                        );
                        std::thread::yield_now();
                    }
                    Err(e) => break Err(e),
                }
            },
        };
        let ended = start.elapsed();
        if !killed {
            // Done before the kill point: the kill comes now, the state stands.
            t.child.kill();
        }
        match &outcome {
            Ok(()) => {
                let bad = bad_blocks(&landed(op, &t, &local, len), &want);
                assert_eq!(
                    bad, 0,
                    "{what}: Done after {ended:?} with {bad} of {n} blocks not the source's \
                     (killed at {kill_at:?}: {killed})"
                );
                tally.add(if killed {
                    "Done (killed during)"
                } else {
                    "Done (before the kill)"
                });
            }
            Err(e) => {
                assert!(killed, "{what}: failed without a kill: {e}");
                assert!(
                    e.is_uncertain()
                        || matches!(e.kind(), ErrorKind::RemoteDisconnect | ErrorKind::Backend),
                    "{what}: {e:?}"
                );
                tally.add(e.kind().as_str());
            }
        }
        assert!(!req.is_in_flight(), "{what}: terminal");
        // A failed peer is forgotten, as an application does on `RemoteDisconnect`: what a
        // backend still holds for it is released then.
        if outcome.is_err() {
            let _ = p.invalidate_remote_metadata(&t.name);
        }
        req.wait_quiescent(QUIESCENT)
            .unwrap_or_else(|e| panic!("{what}: not quiescent within {QUIESCENT:?}: {e}"));
        assert!(req.is_quiescent(), "{what}");
        if op == XferOp::Read {
            assert_quiet(&local, &what);
        }
        if fresh_each_kill && stats.rails().iter().any(|r| r.blocked) {
            assert_blocked_refuses(&p, &local, &what);
            blocked += 1;
        }
        drop(req);
        drop(reg);
        let _ = p.invalidate_remote_metadata(&t.name);
        if fresh_each_kill {
            released += stats
                .rails()
                .iter()
                .map(|r| r.dead_locks_released)
                .sum::<u64>();
            p = initiator();
        }
    }
    // Over libfabric's shm: posts freed from the region lock of a target killed holding it.
    released += stats
        .rails()
        .iter()
        .map(|r| r.dead_locks_released)
        .sum::<u64>();
    eprintln!(
        "landed {transport} {op:?}: {kills} transfers, ends {:?}, dead holders' locks released \
         {released}, initiators blocked by a dead target {blocked}",
        tally.states
    );
    tally
}

fn run(transport: &str, seed: u64) {
    if transport.starts_with("ucx") && !nixl_testkit::ucx::ucx_or_skip(transport) {
        return;
    }
    if transport.starts_with("libfabric") {
        if let Err(e) = nixl::libfabric::library_status() {
            nixl_testkit::skip(
                transport,
                nixl_testkit::Dep::Libfabric,
                format!("no usable libfabric: {e}"),
            );
            return;
        }
    }
    for op in [XferOp::Read, XferOp::Write] {
        let t = kills(transport, op, seed ^ op as u64);
        assert!(t.states.values().sum::<usize>() > 0);
    }
}

#[test]
fn landed_ucx_tcp() {
    run("ucx-tcp", 0x7c9);
}

#[test]
fn landed_ucx_shm() {
    run("ucx-shm", 0x5a1);
}

#[test]
fn landed_ucx_cma() {
    run("ucx-cma", 0xc3a);
}

#[test]
fn landed_ucx_direct_cma() {
    run("ucx-direct-cma", 0xd1c);
}

#[test]
fn landed_libfabric_tcp() {
    run("libfabric-tcp", 0xf7c);
}

#[test]
fn landed_libfabric_shm() {
    run("libfabric-shm", 0x5f3);
}
