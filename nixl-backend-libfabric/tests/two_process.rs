//! Two processes over libfabric (tcp on loopback, and shm), on the shared harness
//! `nixl_testkit::two_process`: this test binary spawns itself as the target; the agents
//! exchange metadata over the side channel;
//! the initiator writes and reads descriptor batches with notifications and standalone
//! notifications, and the target answers each notification with a digest of its memory at
//! the moment the notification arrived. Another test kills the target and checks the
//! initiator's next request ends in a typed error.

use nixl_testkit::libfabric as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::wire::codec::AgentMetadata;
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferTarget,
};
use nixl_testkit::two_process::{child_main, Child, ChildEnv, ENV_CHILD};
const LEN: usize = 32 * BLOCK;
const BLOCK: usize = 64 << 10;
const DEADLINE: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn params(provider: &str) -> LibfabricParams {
    match provider {
        "tcp" => LibfabricParams::tcp_loopback(2),
        p => LibfabricParams::with_provider(p),
    }
}

fn config(listen: bool) -> AgentConfig {
    AgentConfig::default().listen(listen)
}

/// The target's side: runs only when spawned by a parent test.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn child_target_role() {
    child_main(target_main);
}

fn target_main(env: ChildEnv) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let provider = env.var("provider")?;
    let parent = env.parent.clone();
    let a = Agent::new(&env.name, config(false)).map_err(e)?;
    a.create_backend(params(&provider)).map_err(e)?;
    let mem = Arc::new(HostBuffer::new(LEN).ok_or("alloc")?);
    mem.fill_pattern(7);
    let _reg = a.register_mem(vec![mem.clone()], &[]).map_err(e)?;
    env.connect(&a, WAIT)?;
    a.gen_notif(&parent, format!("addr:{}", mem.addr()).as_bytes(), &[])
        .map_err(e)?;
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        let Ok(n) = a.wait_notifs(Duration::from_millis(200)) else {
            continue;
        };
        for msg in n.get(&parent).into_iter().flatten() {
            if msg == b"exit" {
                return Ok(());
            }
            if msg == b"metadata" {
                let md = a.local_metadata().map_err(e)?;
                let hex: String = md.iter().map(|b| format!("{b:02x}")).collect();
                a.gen_notif(&parent, format!("md:{hex}").as_bytes(), &[])
                    .map_err(e)?;
                continue;
            }
            // Whatever arrives, answer with what memory holds at that moment.
            let reply = format!(
                "{}:{:016x}",
                String::from_utf8_lossy(msg),
                fnv(&mem.to_vec())
            );
            a.gen_notif(&parent, reply.as_bytes(), &[]).map_err(e)?;
        }
    }
    Err("no exit notification before the deadline".into())
}

struct Session {
    a: Agent,
    child: String,
    remote_addr: u64,
    target: Child,
}

fn start(provider: &str, tag: &str, p: LibfabricParams) -> Result<Session, String> {
    start_as(
        &format!("lf-parent-{tag}-{}", std::process::id()),
        provider,
        tag,
        p,
    )
}

/// As [`start`], the parent agent named `name`.
fn start_as(name: &str, provider: &str, tag: &str, p: LibfabricParams) -> Result<Session, String> {
    let e = |e: Error| e.to_string();
    let child_name = format!("lf-child-{tag}-{}", std::process::id());
    let a = Agent::new(name, config(true)).map_err(e)?;
    a.create_backend(p).map_err(e)?;
    let mut target = Child::spawn(
        "child_target_role",
        &a,
        &child_name,
        &[("provider", provider)],
    )
    .map_err(|e| e.to_string())?;
    let msg = target.next(&a, WAIT)?;
    let remote_addr = std::str::from_utf8(&msg)
        .ok()
        .and_then(|s| s.strip_prefix("addr:"))
        .and_then(|s| s.parse().ok())
        .ok_or("bad hello")?;
    if !a.check_remote_metadata(&child_name, None) {
        return Err("child metadata not loaded".into());
    }
    Ok(Session {
        a,
        child: child_name,
        remote_addr,
        target,
    })
}

fn two_process_roundtrip(provider: &str) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let mut s = start(provider, provider, params(provider))?;
    let a = &s.a;
    let src = Arc::new(HostBuffer::new(LEN).ok_or("alloc")?);
    let back = Arc::new(HostBuffer::new(LEN).ok_or("alloc")?);
    let _r1 = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .map_err(e)?;
    let local = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, LEN / BLOCK),
            &[],
        )
        .map_err(e)?;
    let remote = a
        .prep_xfer_dlist(
            XferTarget::Agent(&s.child),
            &XferDescList::blocks(MemKind::Dram, s.remote_addr, BLOCK as u64, LEN / BLOCK),
            &[],
        )
        .map_err(e)?;
    // Batches of 32 blocks, written in reverse order so nothing merges, with a notification.
    for round in 0..3u64 {
        src.fill_pattern(round + 1);
        let li: Vec<usize> = (0..LEN / BLOCK).rev().collect();
        let req = a
            .make_prepped_xfer(
                XferOp::Write,
                &local,
                &li,
                &remote,
                &li,
                XferOptions::with_notif(format!("w{round}").into_bytes()),
            )
            .map_err(e)?;
        a.post_xfer_req(&req).map_err(e)?;
        let reply = s.target.next(a, WAIT)?;
        let want = format!("w{round}:{:016x}", fnv(&src.to_vec()));
        if reply != want.as_bytes() {
            return Err(format!(
                "round {round}: target saw {:?} when the notification arrived, want {want}",
                String::from_utf8_lossy(&reply)
            ));
        }
        req.wait(WAIT).map_err(e)?;
    }
    // READ it back into another buffer.
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, back.addr(), BLOCK as u64, LEN / BLOCK),
            &XferDescList::blocks(MemKind::Dram, s.remote_addr, BLOCK as u64, LEN / BLOCK),
            &s.child,
            XferOptions::default(),
        )
        .map_err(e)?;
    a.post_xfer_req(&req).map_err(e)?;
    req.wait(WAIT).map_err(e)?;
    if back.to_vec() != src.to_vec() {
        return Err("read-back differs".into());
    }
    // Standalone notifications arrive in order.
    for i in 0..20 {
        a.gen_notif(&s.child, format!("n{i}").as_bytes(), &[])
            .map_err(e)?;
    }
    for i in 0..20 {
        let r = s.target.next(a, WAIT)?;
        if !r.starts_with(format!("n{i}:").as_bytes()) {
            return Err(format!(
                "notification {i} came back as {:?}",
                String::from_utf8_lossy(&r)
            ));
        }
    }
    let path = req.path();
    if !path.contains("libfabric") {
        return Err(format!("path does not name libfabric: {path}"));
    }
    a.gen_notif(&s.child, b"exit", &[]).map_err(e)?;
    match s.target.join(WAIT) {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(format!("target exited with {st}")),
        None => Err("target did not exit".into()),
    }
}

#[test]
fn two_processes_tcp() {
    if std::env::var_os(ENV_CHILD).is_some() || common::skip_without_provider("tcp") {
        return;
    }
    two_process_roundtrip("tcp").unwrap();
}

#[test]
fn two_processes_shm() {
    if std::env::var_os(ENV_CHILD).is_some() || common::skip_without_provider("shm") {
        return;
    }
    two_process_roundtrip("shm").unwrap();
}

/// Killing the target: the next request to it ends in `RemoteDisconnect` when the provider
/// reports the broken connection, or in `TimedOut` at the request's (or the backend's)
/// deadline when it does not (libfabric 1.17's tcp provider sometimes keeps a write to a
/// peer whose socket was reset queued without completing it). Never a hang, never Ok.
#[test]
fn killed_target_fails_requests_with_typed_errors() {
    if std::env::var_os(ENV_CHILD).is_some() || common::skip_without_provider("tcp") {
        return;
    }
    let p = (params("tcp")).op_timeout(Duration::from_secs(3));
    let s = start("tcp", "kill", p).unwrap();
    let a = &s.a;
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let _r = a.register_mem(vec![src.clone()], &[]).unwrap();
    let mut t = s.target;
    t.kill();
    let opts = XferOptions::default().timeout(Duration::from_secs(3));
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, 4),
            &XferDescList::blocks(MemKind::Dram, s.remote_addr, BLOCK as u64, 4),
            &s.child,
            opts,
        )
        .unwrap();
    let r = a.post_xfer_req(&req).and_then(|_| req.wait(WAIT));
    eprintln!("write to a killed target: {r:?}");
    assert!(
        matches!(
            r,
            Err(Error::RemoteDisconnect { .. } | Error::TimedOut { .. })
        ),
        "write to a dead peer: {r:?}"
    );
    let r = a.gen_notif(&s.child, b"hello?", &[]);
    eprintln!("notification to a killed target: {r:?}");
    assert!(
        matches!(
            r,
            Err(Error::RemoteDisconnect { .. } | Error::TimedOut { .. })
        ),
        "gen_notif to a dead peer: {r:?}"
    );
    // Either way the peer is now known to be gone: the next request fails at once.
    let r = a.post_xfer_req(&req).and_then(|_| req.wait(WAIT));
    eprintln!("second write to a killed target: {r:?}");
    assert!(
        matches!(r, Err(Error::RemoteDisconnect { .. })),
        "second write to a dead peer: {r:?}"
    );
}

/// A second name for a peer's endpoints (another agent name whose metadata carries the same
/// connection info: a hostile peer, or a stale copy), loaded and then forgotten, leaves the
/// peer working. Each endpoint name is in a rail's AV once, shared by the peers naming it:
/// libfabric 1.17's shm provider gives two entries of one name one map slot and unmaps the
/// peer's region when either is removed, so the next notification to the real peer wrote into
/// unmapped memory (SIGSEGV), which two agents in one process never show (the provider does
/// not map its own process's regions).
fn alias_forgotten(provider: &str) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let mut s = start(provider, &format!("alias-{provider}"), params(provider))?;
    let a = &s.a;
    a.gen_notif(&s.child, b"metadata", &[]).map_err(e)?;
    let reply = s.target.next(a, WAIT)?;
    let hex = reply
        .strip_prefix(b"md:")
        .ok_or("no metadata from the target")?;
    let md: Vec<u8> = hex
        .chunks(2)
        .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut alias = AgentMetadata::decode_bytes(&md).map_err(|e| e.to_string())?;
    alias.name = format!("{}-alias", s.child);
    for round in 0..3 {
        a.load_remote_metadata(&alias.encode()).map_err(e)?;
        a.invalidate_remote_metadata(&alias.name).map_err(e)?;
        a.gen_notif(&s.child, format!("n{round}").as_bytes(), &[])
            .map_err(e)?;
        let r = s.target.next(a, WAIT)?;
        if !r.starts_with(format!("n{round}:").as_bytes()) {
            return Err(format!(
                "notification {round} came back as {:?}",
                String::from_utf8_lossy(&r)
            ));
        }
    }
    let src = Arc::new(HostBuffer::new(LEN).ok_or("alloc")?);
    let _r = a.register_mem(vec![src.clone()], &[]).map_err(e)?;
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, 2),
            &XferDescList::blocks(MemKind::Dram, s.remote_addr, BLOCK as u64, 2),
            &s.child,
            XferOptions::default(),
        )
        .map_err(e)?;
    a.post_xfer_req(&req).map_err(e)?;
    req.wait(WAIT).map_err(e)?;
    a.gen_notif(&s.child, b"exit", &[]).map_err(e)?;
    match s.target.join(WAIT) {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(format!("target exited with {st}")),
        None => Err("target did not exit".into()),
    }
}

#[test]
fn forgetting_an_alias_of_a_peers_endpoints_leaves_the_peer_working() {
    if std::env::var_os(ENV_CHILD).is_some() {
        return;
    }
    for provider in ["shm", "tcp"] {
        if !common::skip_without_provider(provider) {
            alias_forgotten(provider).unwrap();
        }
    }
}

/// A notification to a frozen (`SIGSTOP`) peer over shm times out, and the peer's late answer
/// (it writes the send's delivery-complete response into this agent's region once thawed) is
/// harmless. The backend used to remove the peer's address when the send timed out: the shm
/// provider unmapped the peer's region with the send still pending, and reading the late
/// response dereferenced the unmapped region (SIGSEGV in `fi_cq_read`, found by the
/// `unpack_address` fuzz target). Addresses with operations in flight are now removed from the
/// AV only once those complete. After a reload the peer works again.
#[test]
fn a_late_answer_from_a_thawed_shm_peer_is_harmless() {
    if std::env::var_os(ENV_CHILD).is_some() || common::skip_without_provider("shm") {
        return;
    }
    use nixl_testkit::signal::Sig;
    let p = (params("shm")).op_timeout(Duration::from_millis(300));
    let mut s = start("shm", "frozen", p).unwrap();
    let md = child_metadata(&mut s);
    let a = &s.a;
    s.target.signal(Sig::Stop).unwrap();
    let r = a.gen_notif(&s.child, b"while frozen", &[]);
    eprintln!("notification to a frozen peer: {r:?}");
    assert!(
        matches!(
            r,
            Err(Error::TimedOut { .. } | Error::RemoteDisconnect { .. })
        ),
        "{r:?}"
    );
    s.target.signal(Sig::Cont).unwrap();
    // The thawed peer answers; this agent's progress thread reads the answer.
    std::thread::sleep(Duration::from_secs(1));
    a.invalidate_remote_metadata(&s.child).unwrap();
    a.load_remote_metadata(&md).unwrap();
    for i in 0..3 {
        a.gen_notif(&s.child, format!("n{i}").as_bytes(), &[])
            .unwrap();
    }
    // The notification sent while frozen may arrive too (its answer is the one read above).
    let mut got = Vec::new();
    while got.len() < 3 {
        let r = s.target.next(a, WAIT).unwrap();
        if !r.starts_with(b"while frozen:") {
            got.push(
                String::from_utf8_lossy(&r)
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            );
        }
    }
    assert_eq!(got, ["n0", "n1", "n2"]);
    a.gen_notif(&s.child, b"exit", &[]).unwrap();
    assert!(s.target.join(WAIT).is_some_and(|st| st.success()));
}

/// A post to a live peer whose shm region lock stays held is bounded by `op_timeout`. A peer
/// stopped while it holds its lock (it holds it while it handles its queue and copies RMA
/// data) used to make `fi_send` spin until it was thawed: this test holds the child's lock
/// itself, so the case is certain, and frees it after 5 s in case the post spins. Before the
/// post looked at the lock, `gen_notif` returned only then (`Ok`); now `TimedOut` within
/// about `op_timeout`, and after the lock is free a reload reaches the peer again.
#[test]
fn a_post_to_a_peer_whose_region_lock_stays_held_is_bounded() {
    if std::env::var_os(ENV_CHILD).is_some() || common::skip_without_provider("shm") {
        return;
    }
    use std::os::unix::fs::FileExt;
    let op_timeout = Duration::from_millis(300);
    let p = (params("shm")).op_timeout(op_timeout);
    let mut s = start("shm", "held", p).unwrap();
    let md = child_metadata(&mut s);
    let a = &s.a;
    // The child's regions (libfabric's shm provider names them `<pid>:<uid>:<n>`).
    let prefix = format!("{}:", s.target.id());
    let regions: Vec<std::fs::File> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(e.path())
                .unwrap()
        })
        .collect();
    assert!(
        !regions.is_empty(),
        "no shm region of the child in /dev/shm"
    );
    // A free and a taken lock word, as glibc writes them (the lock is at byte 24 of the
    // region's header: libfabric 1.15-1.19).
    let (free, held) = {
        let mut w: libc::pthread_spinlock_t = 0;
        // SAFETY: a local spin lock, initialised before it is taken.
        unsafe {
            assert_eq!(
                libc::pthread_spin_init(&mut w, libc::PTHREAD_PROCESS_SHARED),
                0
            );
            let free = w;
            assert_eq!(libc::pthread_spin_trylock(&mut w), 0);
            (free, w)
        }
    };
    let set = |word: i32| {
        for f in &regions {
            f.write_all_at(&word.to_ne_bytes(), 24).unwrap();
        }
    };
    set(held);
    // Whatever the post does, the lock is free again after 5 s.
    let freer = {
        let regions: Vec<std::fs::File> = regions.iter().map(|f| f.try_clone().unwrap()).collect();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(5));
            for f in &regions {
                f.write_all_at(&free.to_ne_bytes(), 24).unwrap();
            }
        })
    };
    let t = std::time::Instant::now();
    let r = a.gen_notif(&s.child, b"while held", &[]);
    let took = t.elapsed();
    eprintln!("notification while the peer's region lock is held: {r:?} after {took:?}");
    freer.join().unwrap();
    assert!(
        matches!(r, Err(Error::TimedOut { .. })),
        "a post to a peer holding its region lock must time out: {r:?}"
    );
    assert!(
        took < op_timeout + Duration::from_secs(2),
        "bounded by op_timeout ({op_timeout:?}), took {took:?}"
    );
    // Free again: the peer is reached after a reload.
    a.invalidate_remote_metadata(&s.child).unwrap();
    a.load_remote_metadata(&md).unwrap();
    a.gen_notif(&s.child, b"ping", &[]).unwrap();
    loop {
        let r = s.target.next(a, WAIT).unwrap();
        if r.starts_with(b"ping:") {
            break;
        }
        assert!(
            r.starts_with(b"while held:"),
            "{}",
            String::from_utf8_lossy(&r)
        );
    }
    a.gen_notif(&s.child, b"exit", &[]).unwrap();
    assert!(s.target.join(WAIT).is_some_and(|st| st.success()));
}

/// Threads of this process whose name starts with `prefix` (the kernel keeps 15 bytes of a
/// thread's name).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|c| c.starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// An agent dropped with a request its backend never lets go of keeps the request, its memory
/// and the backend (nothing is freed under a transfer that may still touch it; the process's
/// orphan thread holds them), but not the agent's or the backend's threads: they stop with the
/// agent (`Backend::shutdown`). Before, the request's registration held the agent, which then
/// lived, threads and all, for good. The request: a READ over shm with a key the target never
/// registered, which libfabric's shm provider never answers (docs/security.md); the parent's
/// name makes its threads' names unique in this binary.
#[test]
fn an_agent_dropped_with_a_leaked_request_stops_its_backend_threads() {
    if std::env::var_os(ENV_CHILD).is_some() || common::skip_without_provider("shm") {
        return;
    }
    let e = |e: Error| e.to_string();
    let name = format!("LEAKED-{}", std::process::id());
    let prefix = "nixl-lf0-LEAKED";
    let p = params("shm").op_timeout(Duration::from_millis(200));
    let mut s = start_as(&name, "shm", "leak", p).unwrap();
    assert_eq!(
        threads_named(prefix),
        1,
        "the backend's progress thread runs"
    );
    let md = child_metadata(&mut s);
    // The child's metadata with its region's keys changed: well formed, never registered.
    let mut bad = AgentMetadata::decode_bytes(&md).unwrap();
    for r in &mut bad.regions {
        let n = r.public.len();
        for b in &mut r.public[n - 8..] {
            *b ^= 0x5a;
        }
    }
    let a = s.a;
    a.invalidate_remote_metadata(&s.child).unwrap();
    a.load_remote_metadata(&bad.encode()).unwrap();
    let local = Arc::new(HostBuffer::new(BLOCK).unwrap());
    let _reg = a.register_mem(vec![local.clone()], &[]).unwrap();
    let one = |addr| XferDescList::blocks(MemKind::Dram, addr, 4096, 1);
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &one(local.addr()),
            &one(s.remote_addr),
            &s.child,
            XferOptions::default(),
        )
        .map_err(e)
        .unwrap();
    let r = a
        .post_xfer_req(&req)
        .and_then(|_| req.wait(Duration::from_secs(2)));
    eprintln!("READ with a key the target never registered: {r:?}");
    assert!(
        r.is_err(),
        "a READ the target refuses does not end Done: {r:?}"
    );
    drop(req);
    let leaked = a.draining_requests();
    eprintln!("requests the backend has not let go of: {leaked}");
    drop(a);
    // The agent's drop waited for them: no polling thread is left, leaked request or not.
    assert_eq!(
        threads_named(prefix),
        0,
        "the backend's threads stopped with its agent"
    );
    assert!(
        leaked > 0,
        "the case this test exists for: the backend kept the request (an orphan after the drop)"
    );
    // The child is waited for by its own deadline (the parent that reached it is gone).
    s.target.kill();
}

/// The child's metadata, asked for over a notification.
fn child_metadata(s: &mut Session) -> Vec<u8> {
    s.a.gen_notif(&s.child, b"metadata", &[]).unwrap();
    let reply = s.target.next(&s.a, WAIT).unwrap();
    unhex(
        reply
            .strip_prefix(b"md:")
            .expect("metadata from the target"),
    )
}

fn unhex(hex: &[u8]) -> Vec<u8> {
    hex.chunks(2)
        .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap_or("zz"), 16).unwrap_or(0))
        .collect()
}
