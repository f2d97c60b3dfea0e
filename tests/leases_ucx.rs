//! Leases over UCX between processes (issue 27, part 3): the target (this process) publishes a
//! lease to a reader that is its own process; the reader acquires it over the connection its
//! notifications use, reads under it, and is then killed without releasing: the target sees
//! the lease held, then, once its duration passes on the target's clock, done with one reader
//! expired (the blocks may be reused). A second reader renews and releases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::access::{Auth, Credential};
use nixl::leases::{LeaseId, LeaseState};
use nixl::{
    Agent, AgentConfig, Desc, ErrorKind, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
};
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::ucx::{params, ucx_or_skip, TCP};

const ENTRY: &str = "lease_reader";
const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 1 << 16;

fn agent(name: &str) -> Agent {
    agent_in(name, None)
}

/// An agent, with the cluster credential `cred` (an exported one) where given.
fn agent_in(name: &str, cred: Option<&str>) -> Agent {
    let a = Agent::new(
        name,
        AgentConfig::default()
            .listen(true)
            .default_timeout(Duration::from_secs(20))
            .auth(cred.map(|c| Auth::new(Credential::parse(c).expect("credential")))),
    )
    .expect("agent");
    a.create_backend(params(TCP)).expect("UCX backend");
    a
}

/// The reader: acquires the parent's lease, reads the parent's buffer under it, says so, then
/// renews and releases where told (`release` = 1), else idles until killed.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by the tests of this file"]
fn lease_reader() {
    child_main(|env| {
        let a = agent_in(&env.name, env.var("cred").ok().as_deref());
        let dst = Arc::new(HostBuffer::new(LEN).ok_or("alloc")?);
        let _reg = a
            .register_mem(vec![dst.clone()], &[])
            .map_err(|e| e.to_string())?;
        env.connect(&a, WAIT)?;
        let id = LeaseId(env.parse("lease")?);
        let src: u64 = env.parse("src")?;
        a.acquire_lease(&env.parent, id, WAIT)
            .map_err(|e| e.to_string())?;
        let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(dst.addr(), LEN as u64)]);
        let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(src, LEN as u64)]);
        let req = a
            .create_xfer_req(
                XferOp::Read,
                &l,
                &r,
                &env.parent,
                XferOptions::default().lease(id),
            )
            .map_err(|e| e.to_string())?;
        a.post_xfer_req(&req).map_err(|e| e.to_string())?;
        req.wait(WAIT).map_err(|e| e.to_string())?;
        let ok = dst.to_vec().iter().all(|&b| b == 0x6B);
        if env.var("release")? == "1" {
            std::thread::sleep(Duration::from_millis(150));
            a.renew_lease(&env.parent, id, WAIT)
                .map_err(|e| e.to_string())?;
            a.release_lease(&env.parent, id)
                .map_err(|e| e.to_string())?;
            let e = a.post_xfer_req(&req).map_err(|e| e.to_string());
            let refused = matches!(&e, Err(m) if m.contains("expired"));
            a.gen_notif(
                &env.parent,
                format!("read {ok} released refused {refused}").as_bytes(),
                &[],
            )
            .map_err(|e| e.to_string())?;
        } else {
            a.gen_notif(&env.parent, format!("read {ok}").as_bytes(), &[])
                .map_err(|e| e.to_string())?;
        }
        while env.parent_alive() {
            a.progress();
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
}

fn wait_state(a: &Agent, id: LeaseId, f: impl Fn(LeaseState) -> bool) -> LeaseState {
    let end = Instant::now() + WAIT;
    loop {
        let s = a.lease_state(id).unwrap();
        if f(s) || Instant::now() > end {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ucx_a_killed_reader_is_reclaimed_after_expiry_and_a_releasing_one_at_once() {
    if !ucx_or_skip("ucx_a_killed_reader_is_reclaimed_after_expiry_and_a_releasing_one_at_once") {
        return;
    }
    let pid = std::process::id();
    let target = agent(&format!("lease-target-{pid}"));
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    src.fill(0x6B);
    let _reg = target.register_mem(vec![src.clone()], &[]).unwrap();
    let ttl = Duration::from_millis(1500);
    for (tag, release) in [("killed", false), ("releases", true)] {
        let name = format!("lease-{tag}-{pid}");
        let id = target.publish_lease(&[&name], ttl).unwrap();
        let (ids, addr) = (id.0.to_string(), src.addr().to_string());
        let vars = [
            ("lease", ids.as_str()),
            ("src", addr.as_str()),
            ("release", if release { "1" } else { "0" }),
        ];
        let mut c = Child::spawn(ENTRY, &target, &name, &vars).unwrap();
        let said = String::from_utf8(c.next(&target, WAIT).unwrap()).unwrap();
        if release {
            assert_eq!(said, "read true released refused true");
            let s = wait_state(&target, id, |s| matches!(s, LeaseState::Done { .. }));
            assert_eq!(
                s,
                LeaseState::Done {
                    released: 1,
                    expired: 0
                }
            );
        } else {
            assert_eq!(said, "read true");
            assert_eq!(
                target.lease_state(id).unwrap(),
                LeaseState::Active {
                    holding: 1,
                    pending: 0
                }
            );
            c.kill();
            let t = Instant::now();
            let s = wait_state(&target, id, |s| matches!(s, LeaseState::Done { .. }));
            assert_eq!(
                s,
                LeaseState::Done {
                    released: 0,
                    expired: 1
                }
            );
            assert!(t.elapsed() <= ttl + Duration::from_secs(5));
        }
        // A lease nobody holds cannot be acquired by its old reader's name any more.
        assert!(matches!(
            target.lease_state(id),
            Ok(LeaseState::Done { .. })
        ));
        drop(c);
    }
    let e = target.lease_state(LeaseId(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

/// A lease control message in the wire format (kind, id, a zero duration, then `secret`):
/// what a hostile peer can send by hand.
fn lease_msg(kind: u8, id: u64, secret: &[u8]) -> Vec<u8> {
    let mut m = b"\0nixl-rs/lease\0".to_vec();
    m.push(kind);
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes());
    m.extend_from_slice(secret);
    m
}

/// A co-reader's impostor: an agent in its own process under the real reader's name, which
/// fetches the target's metadata (any same-user process may) and sends the reader's RELEASE
/// and RENEW for the lease id it was handed, without the reader's secret.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by the tests of this file"]
fn lease_impostor() {
    child_main(|env| {
        let a = agent_in(&env.var("claims")?, env.var("cred").ok().as_deref());
        a.fetch_remote_metadata_blocking(&env.parent, env.parent_addr, WAIT)
            .map_err(|e| e.to_string())?;
        let id: u64 = env.parse("lease")?;
        for kind in [6u8, 4] {
            // RELEASE, RENEW: in the format without a secret (which the old code took) and
            // with a guessed (zero) one.
            for secret in [&[][..], &[0u8; 16][..]] {
                a.gen_notif_raw(&env.parent, &lease_msg(kind, id, secret))
                    .map_err(|e| e.to_string())?;
            }
        }
        // The target handles its control messages in order: what follows them arrives after.
        a.gen_notif(&env.parent, b"forged", &[])
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    });
}

/// Issue 34: a RELEASE (and a RENEW) under a reader's name from another process change
/// nothing: the lease stays held by the real reader until its duration passes. Before, the
/// target counted the reader released and reused the blocks under its still-valid lease. Two
/// layers, each shown: with one cluster credential for all (an insider: its hello under the
/// reader's name verifies), the RELEASE lacks the secret the reader acquired with; without a
/// credential, the impostor's hello is not signed with the reader's key, so nothing it sends
/// is taken as the reader's.
#[test]
fn a_forged_release_leaves_the_readers_hold() {
    if !ucx_or_skip("a_forged_release_leaves_the_readers_hold") {
        return;
    }
    let cred = Credential::generate("leases").unwrap().export();
    for insider in [true, false] {
        forged_release(insider.then_some(cred.as_str()));
    }
}

fn forged_release(cred: Option<&str>) {
    let pid = std::process::id();
    let tag = if cred.is_some() {
        "insider"
    } else {
        "same-user"
    };
    let target = agent_in(&format!("lease-owner-{tag}-{pid}"), cred);
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    src.fill(0x6B);
    let _reg = target.register_mem(vec![src.clone()], &[]).unwrap();
    let reader = format!("lease-holder-{tag}-{pid}");
    let ttl = Duration::from_secs(20);
    let id = target.publish_lease(&[&reader], ttl).unwrap();
    let (ids, addr) = (id.0.to_string(), src.addr().to_string());
    let mut vars = vec![
        ("lease", ids.as_str()),
        ("src", addr.as_str()),
        ("release", "0"),
    ];
    if let Some(c) = cred {
        vars.push(("cred", c));
    }
    let mut real = Child::spawn(ENTRY, &target, &reader, &vars).unwrap();
    assert_eq!(real.next(&target, WAIT).unwrap(), b"read true");
    let held = LeaseState::Active {
        holding: 1,
        pending: 0,
    };
    assert_eq!(target.lease_state(id).unwrap(), held);
    let refused_before = target.refused_hellos();
    let mut ivars = vec![("claims", reader.as_str()), ("lease", ids.as_str())];
    if let Some(c) = cred {
        ivars.push(("cred", c));
    }
    let mut impostor = Child::spawn(
        "lease_impostor",
        &target,
        &format!("co-reader-{tag}-{pid}"),
        &ivars,
    )
    .unwrap();
    let st = impostor.join(WAIT).expect("the impostor exits");
    assert_eq!(st.code(), Some(0), "{st}");
    // Its last plain notification arrived (an insider: its control messages were handled
    // before it), or its hello was refused (same user, no credential).
    let mut heard = false;
    let end = Instant::now() + WAIT;
    while !heard && target.refused_hellos() == refused_before && Instant::now() < end {
        let n = target.wait_notifs(Duration::from_millis(200)).unwrap();
        heard = n.values().flatten().any(|m| m == b"forged");
    }
    if cred.is_some() {
        assert!(heard, "an insider's messages reached the target");
    } else {
        assert!(!heard, "delivered under the reader's name without its key");
        assert!(
            target.refused_hellos() > refused_before,
            "the impostor's hello was never refused"
        );
    }
    assert_eq!(
        target.lease_state(id).unwrap(),
        held,
        "a RELEASE from another process than the reader's released it ({tag})"
    );
    drop(real);
}

/// A flooder: fetches the target's metadata, sends ACQUIREs for random lease ids as fast as it
/// can, then stops itself (SIGSTOP): it never reads an answer.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by the tests of this file"]
fn lease_flooder() {
    child_main(|env| {
        let a = Agent::new(
            &env.name,
            AgentConfig::default()
                .listen(true)
                .default_timeout(Duration::from_secs(20)),
        )
        .map_err(|e| e.to_string())?;
        a.create_backend(params(&env.var("tls")?))
            .map_err(|e| e.to_string())?;
        env.connect(&a, WAIT)?;
        let n: u64 = env.parse("count")?;
        let mut sent = 0u64;
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(std::process::id());
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let secret = [x.to_le_bytes(), x.to_be_bytes()].concat();
            match a.gen_notif_raw(&env.parent, &lease_msg(1, x, &secret)) {
                Ok(()) => sent += 1,
                // A full queue is refused typed: the flood goes on.
                Err(e) if e.kind() == nixl::core::ErrorKind::LimitExceeded => {}
                Err(e) => return Err(format!("ACQUIRE {x}: {e}")),
            }
        }
        if sent < n / 2 {
            return Err(format!("only {sent} of {n} ACQUIREs went out: no flood"));
        }
        a.gen_notif(&env.parent, b"flooded", &[])
            .map_err(|e| e.to_string())?;
        nixl_testkit::signal::send(std::process::id(), nixl_testkit::signal::Sig::Stop)
            .map_err(|e| e.to_string())?;
        Ok(())
    });
}

/// Issue 34: renewals hold after an ACQUIRE flood from a process that then stops reading (its
/// messages still queued at the owner), and while the reader has a large direct CMA READ in
/// flight (a renewal used to wait behind the
/// reader's in-flight copies: with 2 GiB, 406-535 ms, and the lease was lost). A 400 ms lease
/// renewed every 100 ms with a 200 ms deadline per renewal: none is lost.
#[test]
fn renewals_hold_under_a_flood_and_behind_data() {
    if !ucx_or_skip("renewals_hold_under_a_flood_and_behind_data") {
        return;
    }
    let pid = std::process::id();
    let shm = |name: &str| {
        let a = Agent::new(
            name,
            AgentConfig::default()
                .listen(true)
                .default_timeout(Duration::from_secs(20)),
        )
        .expect("agent");
        a.create_backend(
            (params("shm,cma,self"))
                .direct_cma_same_process(true)
                .cma_threads(1),
        )
        .expect("UCX backend");
        a
    };
    let target = shm(&format!("renew-owner-{pid}"));
    let reader = shm(&format!("renew-reader-{pid}"));
    const BIG: usize = 2 << 30;
    let src = Arc::new(HostBuffer::new(BIG).unwrap());
    let dst = Arc::new(HostBuffer::new(BIG).unwrap());
    let _rs = target.register_mem(vec![src.clone()], &[]).unwrap();
    let _rd = reader.register_mem(vec![dst.clone()], &[]).unwrap();
    reader
        .load_remote_metadata(&target.local_metadata().unwrap())
        .unwrap();
    target
        .load_remote_metadata(&reader.local_metadata().unwrap())
        .unwrap();
    // The flood: 20,000 ACQUIREs for random ids, then the flooder stops itself, reading
    // nothing (an owner that answered each would block on it).
    let mut flooder = Child::spawn(
        "lease_flooder",
        &target,
        &format!("flooder-{pid}"),
        &[("count", "20000"), ("tls", "shm,cma,self")],
    )
    .unwrap();
    let mut flooded = false;
    let end = Instant::now() + WAIT;
    while !flooded && Instant::now() < end {
        assert!(flooder.try_wait().is_none(), "the flooder exited early");
        flooded = target
            .wait_notifs(Duration::from_millis(100))
            .unwrap()
            .values()
            .flatten()
            .any(|m| m == b"flooded");
    }
    assert!(flooded, "the flood reached the target");
    let ttl = Duration::from_millis(400);
    let id = target.publish_lease(&[reader.name()], ttl).unwrap();
    reader.acquire_lease(target.name(), id, WAIT).unwrap();
    // A 2 GiB READ in pieces on one copy thread (the case), in flight while the
    // renewals go out.
    let read = reader
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, dst.addr(), 1 << 20, BIG >> 20),
            &XferDescList::blocks(MemKind::Dram, src.addr(), 1 << 20, BIG >> 20),
            target.name(),
            XferOptions::default().lease(id),
        )
        .unwrap();
    assert!(read.path().contains("direct CMA"), "{}", read.path());
    let mut renewed = 0;
    let mut in_flight_renewals = 0;
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        if !read.is_in_flight() {
            let _ = read.wait(Duration::from_secs(30));
            reader.post_xfer_req(&read).unwrap();
        }
        let flying = read.is_in_flight();
        reader
            .renew_lease(target.name(), id, Duration::from_millis(200))
            .unwrap_or_else(|e| panic!("renewal {renewed} lost: {e}"));
        renewed += 1;
        in_flight_renewals += usize::from(flying);
        assert!(matches!(
            target.lease_state(id).unwrap(),
            LeaseState::Active { holding: 1, .. }
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = read.wait(Duration::from_secs(30));
    eprintln!(
        "{renewed} renewals after the flood, {in_flight_renewals} with the 2 GiB READ in flight"
    );
    assert!(renewed >= 10, "{renewed}");
    assert!(in_flight_renewals >= 1, "no renewal went out behind data");
    drop(flooder);
}

/// Issue 36: a lease on the most blocks a grant carries (`MAX_LEASE_BLOCKS`, 4,096 ranges of
/// 4 KiB a page apart: about 96 KiB of GRANT) crosses UCX tcp whole; the reader's `blocks()`
/// are the owner's ranges, and a READ of one of them under the lease moves its bytes.
#[test]
fn a_grant_with_the_most_blocks_crosses_ucx() {
    if !ucx_or_skip("a_grant_with_the_most_blocks_crosses_ucx") {
        return;
    }
    let pid = std::process::id();
    let (owner, reader) = (
        agent(&format!("blocks-owner-{pid}")),
        agent(&format!("blocks-reader-{pid}")),
    );
    const BLK: u64 = 4096;
    let n = nixl::leases::MAX_LEASE_BLOCKS as u64;
    let pool = Arc::new(HostBuffer::new((2 * n * BLK) as usize).unwrap());
    pool.fill(0x5A);
    let dst = Arc::new(HostBuffer::new(BLK as usize).unwrap());
    let _rp = owner.register_mem(vec![pool.clone()], &[]).unwrap();
    let _rd = reader.register_mem(vec![dst.clone()], &[]).unwrap();
    owner
        .load_remote_metadata(&reader.local_metadata().unwrap())
        .unwrap();
    reader
        .load_remote_metadata(&owner.local_metadata().unwrap())
        .unwrap();
    let blocks: Vec<Desc> = (0..n)
        .map(|i| Desc::new(pool.addr() + 2 * i * BLK, BLK))
        .collect();
    let id = owner
        .publish_lease_blocks(&[reader.name()], Duration::from_secs(60), &blocks)
        .unwrap();
    let lease = reader.lease(owner.name(), id, WAIT).unwrap();
    assert_eq!(lease.blocks(), blocks, "every range, in order");
    let last = blocks[blocks.len() - 1];
    let req = reader
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::from_descs(MemKind::Dram, [Desc::new(dst.addr(), BLK)]),
            &XferDescList::from_descs(MemKind::Dram, [last]),
            owner.name(),
            XferOptions::default().lease(id),
        )
        .unwrap();
    reader.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    assert!(dst.to_vec().iter().all(|&b| b == 0x5A));
}
