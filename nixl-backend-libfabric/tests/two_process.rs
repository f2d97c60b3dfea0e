//! Two processes over libfabric (tcp on loopback, and shm): this test binary spawns itself as
//! the target (env `NIXL_LF_TEST_ROLE`); the agents exchange metadata over the side channel;
//! the initiator writes and reads descriptor batches with notifications and standalone
//! notifications, and the target answers each notification with a digest of its memory at
//! the moment the notification arrived. Another test kills the target and checks the
//! initiator's next request ends in a typed error.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferTarget,
};

const ROLE: &str = "NIXL_LF_TEST_ROLE";
const PARENT_ADDR: &str = "NIXL_LF_TEST_PARENT_ADDR";
const PARENT_NAME: &str = "NIXL_LF_TEST_PARENT_NAME";
const CHILD_NAME: &str = "NIXL_LF_TEST_CHILD_NAME";
const PROVIDER: &str = "NIXL_LF_TEST_PROVIDER";
const LEN: usize = 32 * BLOCK;
const BLOCK: usize = 64 << 10;
const DEADLINE: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn env(k: &str) -> Result<String, String> {
    std::env::var(k).map_err(|_| format!("{k} not set"))
}

fn params(provider: &str) -> LibfabricParams {
    match provider {
        "tcp" => LibfabricParams::tcp_loopback(2),
        p => LibfabricParams::with_provider(p),
    }
}

fn config(listen: bool) -> AgentConfig {
    AgentConfig {
        listen,
        ..AgentConfig::default()
    }
}

/// The target's side: runs only when spawned by a parent test.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn child_target_role() {
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    match target_main() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("target failed: {e}");
            std::process::exit(2)
        }
    }
}

fn target_main() -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let (name, parent, provider) = (env(CHILD_NAME)?, env(PARENT_NAME)?, env(PROVIDER)?);
    let parent_addr: SocketAddr = env(PARENT_ADDR)?
        .parse()
        .map_err(|_| "bad parent address")?;
    let a = Agent::new(&name, config(false)).map_err(e)?;
    a.create_backend(params(&provider)).map_err(e)?;
    let mem = Arc::new(HostBuffer::new(LEN).ok_or("alloc")?);
    mem.fill_pattern(7);
    let _reg = a.register_mem(vec![mem.clone()], &[]).map_err(e)?;
    a.fetch_remote_metadata_blocking(&parent, parent_addr, WAIT)
        .map_err(e)?;
    a.send_local_metadata(parent_addr).map_err(e)?;
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

struct Target {
    child: Child,
}

impl Drop for Target {
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Session {
    a: Agent,
    child: String,
    remote_addr: u64,
    target: Target,
}

fn start(provider: &str, tag: &str, p: LibfabricParams) -> Result<Session, String> {
    let e = |e: Error| e.to_string();
    let name = format!("lf-parent-{tag}-{}", std::process::id());
    let child_name = format!("lf-child-{tag}-{}", std::process::id());
    let a = Agent::new(&name, config(true)).map_err(e)?;
    a.create_backend(p).map_err(e)?;
    let addr = a.listen_addr().ok_or("no side channel")?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .args([
            "--exact",
            "child_target_role",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "target")
        .env(PARENT_ADDR, addr.to_string())
        .env(PARENT_NAME, &name)
        .env(CHILD_NAME, &child_name)
        .env(PROVIDER, provider)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let target = Target { child };
    let msg = next_notif(&a, &child_name)?;
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

/// Messages drained from an agent but not yet consumed, per (agent, sender).
type Pending = std::collections::HashMap<(String, String), std::collections::VecDeque<Vec<u8>>>;

thread_local! {
    /// One drain can return several messages, and none may be dropped.
    static PENDING: std::cell::RefCell<Pending> = std::cell::RefCell::new(Pending::new());
}

fn next_notif(a: &Agent, from: &str) -> Result<Vec<u8>, String> {
    let key = (a.name().to_owned(), from.to_owned());
    let end = Instant::now() + WAIT;
    loop {
        if let Some(m) = PENDING.with(|p| p.borrow_mut().get_mut(&key).and_then(|q| q.pop_front()))
        {
            return Ok(m);
        }
        if Instant::now() >= end {
            return Err(format!("no notification from {from}"));
        }
        if let Ok(n) = a.wait_notifs(Duration::from_millis(100)) {
            PENDING.with(|p| {
                let mut p = p.borrow_mut();
                for (sender, msgs) in n {
                    p.entry((a.name().to_owned(), sender))
                        .or_default()
                        .extend(msgs);
                }
            });
        }
    }
}

fn two_process_roundtrip(provider: &str) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let s = start(provider, provider, params(provider))?;
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
        let reply = next_notif(a, &s.child)?;
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
        let r = next_notif(a, &s.child)?;
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
    let mut t = s.target;
    let end = Instant::now() + WAIT;
    loop {
        match t.child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("target exited with {st}")),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => return Err("target did not exit".into()),
        }
    }
}

#[test]
fn two_processes_tcp() {
    if std::env::var_os(ROLE).is_some() || common::skip_without_provider("tcp") {
        return;
    }
    two_process_roundtrip("tcp").unwrap();
}

#[test]
fn two_processes_shm() {
    if std::env::var_os(ROLE).is_some() || common::skip_without_provider("shm") {
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
    if std::env::var_os(ROLE).is_some() || common::skip_without_provider("tcp") {
        return;
    }
    let p = LibfabricParams {
        op_timeout: Duration::from_secs(3),
        ..params("tcp")
    };
    let s = start("tcp", "kill", p).unwrap();
    let a = &s.a;
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let _r = a.register_mem(vec![src.clone()], &[]).unwrap();
    let mut t = s.target;
    t.child.kill().unwrap();
    t.child.wait().unwrap();
    let opts = XferOptions {
        timeout: Some(Duration::from_secs(3)),
        ..Default::default()
    };
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
