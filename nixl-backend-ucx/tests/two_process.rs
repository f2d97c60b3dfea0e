//! Two processes over UCX (tcp and shared memory): this test binary spawns itself as the
//! target (env `NIXL_UCX_TEST_ROLE`), the agents exchange metadata over the side channel, and
//! the initiator writes, reads, notifies and fences the target; the target verifies what it
//! holds whenever a notification arrives and reports a digest back. Another test kills the
//! target mid-transfer and checks the initiator's request ends in a typed error.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nixl_core::{Agent, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferTarget};

const ROLE: &str = "NIXL_UCX_TEST_ROLE";
const PARENT_ADDR: &str = "NIXL_UCX_TEST_PARENT_ADDR";
const PARENT_NAME: &str = "NIXL_UCX_TEST_PARENT_NAME";
const CHILD_NAME: &str = "NIXL_UCX_TEST_CHILD_NAME";
const TLS: &str = "NIXL_UCX_TEST_TLS";
const LEN: &str = "NIXL_UCX_TEST_LEN";
const DEADLINE: Duration = Duration::from_secs(60);
const BLOCK: usize = 64 << 10;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn env(k: &str) -> Result<String, String> {
    std::env::var(k).map_err(|_| format!("{k} not set"))
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
    let (name, parent, tls) = (env(CHILD_NAME)?, env(PARENT_NAME)?, env(TLS)?);
    let parent_addr: SocketAddr = env(PARENT_ADDR)?
        .parse()
        .map_err(|_| "bad parent address")?;
    let len: usize = env(LEN)?.parse().map_err(|_| "bad length")?;
    let a = Agent::new(&name, common::config(true)).map_err(e)?;
    a.create_backend(common::params(&tls)).map_err(e)?;
    let mem = common::buf(len);
    mem.fill_pattern(7);
    let _reg = a.register_mem(vec![mem.clone()], &[]).map_err(e)?;
    a.fetch_remote_metadata_blocking(&parent, parent_addr, Duration::from_secs(20))
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
    Err("no exit message within the deadline".into())
}

/// A spawned target, killed on drop.
struct Target {
    child: Child,
    name: String,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Target {
    fn spawn(parent: &Agent, tls: &str, len: usize) -> Target {
        let name = common::unique("target");
        let exe = std::env::current_exe().expect("test binary path");
        let child = Command::new(exe)
            .args([
                "--exact",
                "child_target_role",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, "target")
            .env(
                PARENT_ADDR,
                parent.listen_addr().expect("listening").to_string(),
            )
            .env(PARENT_NAME, parent.name())
            .env(CHILD_NAME, &name)
            .env(TLS, tls)
            .env(LEN, len.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn target");
        Target { child, name }
    }

    /// Waits for the process to exit; its status code.
    fn join(&mut self, timeout: Duration) -> Option<i32> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

/// Waits for the next notification from `from`.
fn next_notif(a: &Agent, from: &str, pending: &mut Vec<Vec<u8>>) -> String {
    let end = Instant::now() + DEADLINE;
    while pending.is_empty() {
        assert!(Instant::now() < end, "no notification from {from}");
        if let Ok(mut n) = a.wait_notifs(Duration::from_millis(200)) {
            pending.extend(n.remove(from).unwrap_or_default());
        }
    }
    String::from_utf8(pending.remove(0)).expect("utf-8 notification")
}

fn connect(parent: &Agent, t: &Target, pending: &mut Vec<Vec<u8>>) -> u64 {
    let msg = next_notif(parent, &t.name, pending);
    assert!(
        parent.check_remote_metadata(&t.name, None),
        "target metadata loaded before its first notification"
    );
    msg.strip_prefix("addr:")
        .and_then(|a| a.parse().ok())
        .expect("address message")
}

fn scenario(tls: &str) {
    if !common::ucx_or_skip("two_process") {
        return;
    }
    let len = 4 << 20;
    let blocks = len / BLOCK;
    let parent = common::agent("initiator", tls, true).expect("agent");
    let src = common::buf(len);
    let back = common::buf(len);
    src.fill_pattern(1);
    let _r = parent
        .register_mem(vec![src.clone(), back.clone()], &[])
        .expect("register");
    let mut t = Target::spawn(&parent, tls, len);
    let mut pending = Vec::new();
    let raddr = connect(&parent, &t, &mut pending);
    let path = parent.path_report(&t.name);
    eprintln!("two_process[{tls}]: path {path:?}");
    assert!(!path.is_empty(), "a path is reported");
    if tls == common::TCP {
        assert!(
            path[0].1.contains("tcp"),
            "tcp transport reported: {path:?}"
        );
    }

    // Expected target memory: its own pattern with our blocks written in permuted order.
    let mut expected = {
        let b = HostBuffer::new(len).expect("alloc");
        b.fill_pattern(7);
        b.to_vec()
    };
    let srcv = src.to_vec();
    let perm: Vec<usize> = (0..blocks).map(|i| (i * 7 + 3) % blocks).collect();
    let local = parent
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, blocks),
            &[],
        )
        .expect("prep local");
    let remote = parent
        .prep_xfer_dlist(
            XferTarget::Agent(&t.name),
            &XferDescList::blocks(MemKind::Dram, raddr, BLOCK as u64, blocks),
            &[],
        )
        .expect("prep remote");
    // Write half of the blocks, permuted, with a notification.
    let li: Vec<usize> = (0..blocks / 2).collect();
    let ri: Vec<usize> = li.iter().map(|&i| perm[i]).collect();
    for (&l, &r) in li.iter().zip(&ri) {
        expected[r * BLOCK..(r + 1) * BLOCK].copy_from_slice(&srcv[l * BLOCK..(l + 1) * BLOCK]);
    }
    let w = parent
        .make_prepped_xfer(
            XferOp::Write,
            &local,
            &li,
            &remote,
            &ri,
            XferOptions::with_notif(b"w1".to_vec()),
        )
        .expect("make write");
    parent.post_xfer_req(&w).expect("post write");
    w.wait(DEADLINE).expect("write completes");
    let reply = next_notif(&parent, &t.name, &mut pending);
    assert_eq!(
        reply,
        format!("w1:{:016x}", fnv(&expected)),
        "target held the data when the notification arrived"
    );

    // Read everything back, by block index, and compare.
    let back_list = parent
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, back.addr(), BLOCK as u64, blocks),
            &[],
        )
        .expect("prep back");
    let all: Vec<usize> = (0..blocks).collect();
    let r = parent
        .make_prepped_xfer(
            XferOp::Read,
            &back_list,
            &all,
            &remote,
            &all,
            XferOptions::default(),
        )
        .expect("make read");
    parent.post_xfer_req(&r).expect("post read");
    r.wait(DEADLINE).expect("read completes");
    assert!(back.to_vec() == expected, "read-back matches");
    // Repost once done.
    back.fill(0);
    parent.post_xfer_req(&r).expect("repost read");
    r.wait(DEADLINE).expect("read completes again");
    assert!(back.to_vec() == expected, "second read-back matches");

    // Standalone notifications keep their order.
    for i in 0..10 {
        parent
            .gen_notif(&t.name, format!("n{i}").as_bytes(), &[])
            .expect("gen_notif");
    }
    for i in 0..10 {
        let m = next_notif(&parent, &t.name, &mut pending);
        assert!(
            m.starts_with(&format!("n{i}:")),
            "echo {i} in order, got {m}"
        );
    }
    parent
        .gen_notif(&t.name, b"exit", &[])
        .expect("exit message");
    assert_eq!(t.join(DEADLINE), Some(0), "target exits cleanly");

    // An invalidated peer fails its requests with a typed error.
    parent
        .invalidate_remote_metadata(&t.name)
        .expect("invalidate");
    let e = parent
        .post_xfer_req(&r)
        .expect_err("post to an invalidated peer");
    assert!(
        matches!(
            e,
            Error::PeerRestarted { .. } | Error::RemoteDisconnect { .. }
        ),
        "typed error: {e}"
    );
}

#[test]
fn two_process_tcp() {
    scenario(common::TCP);
}

#[test]
fn two_process_shm() {
    scenario(common::SHM);
}

fn kill_mid_transfer(tls: &str) {
    if !common::ucx_or_skip("kill_mid_transfer") {
        return;
    }
    let len = 64 << 20;
    let parent = common::agent("initiator", tls, true).expect("agent");
    let src = common::buf(len);
    let _r = parent
        .register_mem(vec![src.clone()], &[])
        .expect("register");
    let mut t = Target::spawn(&parent, tls, len);
    let mut pending = Vec::new();
    let raddr = connect(&parent, &t, &mut pending);
    let blk = 4u64 << 20;
    let n = len / blk as usize;
    let req = parent
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), blk, n),
            &XferDescList::blocks(MemKind::Dram, raddr, blk, n),
            &t.name,
            XferOptions {
                timeout: Some(Duration::from_secs(20)),
                no_merge: true,
                ..XferOptions::default()
            },
        )
        .expect("make");
    parent.post_xfer_req(&req).expect("first post");
    req.wait(DEADLINE).expect("first transfer completes");
    // Post, kill the target while the request is (most likely) in flight, and keep posting:
    // one of the requests must end in a typed error, each within its deadline.
    let mut outcome = None;
    for i in 0..200 {
        if let Err(e) = parent.post_xfer_req(&req) {
            outcome = Some(e);
            break;
        }
        if i == 0 {
            t.child.kill().expect("kill target");
        }
        if let Err(e) = req.wait(Duration::from_secs(20)) {
            outcome = Some(e);
            break;
        }
    }
    let e = outcome.expect("a request to a killed target fails");
    eprintln!("kill_mid_transfer[{tls}]: {e}");
    assert!(e.is_uncertain(), "typed, uncertain-outcome error: {e:?}");
    assert!(!req.is_in_flight(), "the request is terminal");
    // Later requests fail too, without hanging.
    let again = parent
        .post_xfer_req(&req)
        .and_then(|_| req.wait(Duration::from_secs(20)));
    assert!(again.is_err(), "a dead peer keeps failing requests");
}

#[test]
fn kill_target_mid_transfer_tcp() {
    kill_mid_transfer(common::TCP);
}

#[test]
fn kill_target_mid_transfer_shm() {
    kill_mid_transfer(common::SHM);
}
