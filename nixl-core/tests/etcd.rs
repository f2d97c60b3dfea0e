//! The etcd metadata exchange against a real `etcd` (one per test, on 127.0.0.1 with free
//! ports and a temporary data directory). Tests skip with a printed reason when the `etcd`
//! binary is missing (`scripts/deps/etcd.sh` installs it).
#![cfg(feature = "etcd")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nixl_core::etcd::{EtcdConfig, EtcdExchange, LocalEtcd, DEFAULT_LABEL};
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, InprocParams, MemKind, MetadataSelection, Registration,
    XferDescList, XferOp, XferOptions, XferReq,
};

const BLOCK: u64 = 4096;
const WAIT: Duration = Duration::from_secs(15);

fn server() -> Option<LocalEtcd> {
    match LocalEtcd::start() {
        Ok(e) => Some(e),
        Err(Error::Unavailable { what, hint }) => {
            let test = std::thread::current().name().unwrap_or("etcd").to_owned();
            nixl_testkit::skip(
                &test,
                nixl_testkit::Dep::Etcd,
                format!("{what} is unavailable ({hint})"),
            );
            None
        }
        Err(e) => panic!("starting etcd failed: {e}"),
    }
}

/// Generous deadlines: these calls are expected to succeed, also on a loaded CI machine.
fn config(etcd: &LocalEtcd) -> EtcdConfig {
    EtcdConfig::default()
        .endpoints(vec![etcd.endpoint()])
        .lease_ttl(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(3))
        .retries(2)
}

/// Short deadlines, for calls expected to fail (etcd stopped or frozen).
/// An exchange with [`impatient`] timeouts, retried while a loaded machine makes the first
/// requests miss them (what the tests check comes after).
fn impatient_exchange(agent: &Agent, etcd: &LocalEtcd) -> EtcdExchange {
    let mut last = None;
    for _ in 0..20 {
        match EtcdExchange::new(agent, &impatient(etcd)) {
            Ok(x) => return x,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the exchange never started: {last:?}")
}

fn impatient(etcd: &LocalEtcd) -> EtcdConfig {
    config(etcd)
        .request_timeout(Duration::from_millis(300))
        .retries(1)
}

struct Peer {
    agent: Agent,
    buf: Arc<HostBuffer>,
    _reg: Registration,
}

fn peer(name: &str, blocks: usize) -> Peer {
    let agent = Agent::new(name, AgentConfig::default()).unwrap();
    agent.create_backend(InprocParams::default()).unwrap();
    let buf = Arc::new(HostBuffer::new(BLOCK as usize * blocks).unwrap());
    let reg = agent.register_mem(vec![buf.clone()], &[]).unwrap();
    Peer {
        agent,
        buf,
        _reg: reg,
    }
}

/// Builds a write of `from`'s block 0 into `to`'s block `slot`.
fn write_req(from: &Peer, to: &Peer, slot: u64) -> nixl_core::Result<XferReq> {
    from.agent.create_xfer_req(
        XferOp::Write,
        &XferDescList::blocks(MemKind::Dram, from.buf.addr(), BLOCK, 1),
        &XferDescList::blocks(MemKind::Dram, to.buf.addr() + slot * BLOCK, BLOCK, 1),
        to.agent.name(),
        XferOptions::default(),
    )
}

fn transfer(from: &Peer, to: &Peer, slot: u64, byte: u8) {
    from.buf.fill(byte);
    let req = write_req(from, to, slot).unwrap();
    from.agent.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(5)).unwrap();
    let got = to.buf.to_vec();
    assert!(got[(slot * BLOCK) as usize..((slot + 1) * BLOCK) as usize]
        .iter()
        .all(|&b| b == byte));
}

/// Polls `f` until it holds or `WAIT` passes; whether it held.
fn eventually(f: impl FnMut() -> bool) -> bool {
    nixl_testkit::eventually(WAIT, f)
}

/// Puts raw bytes under a key, optionally with a lease of `ttl` seconds that nobody keeps
/// alive (an agent that crashed right after publishing).
fn raw_put(etcd: &LocalEtcd, key: &str, value: Vec<u8>, ttl: Option<i64>) {
    etcd.put_raw(&[(key, &value)], ttl).unwrap();
}

#[test]
fn publish_fetch_transfer_and_invalidate() {
    let Some(etcd) = server() else { return };
    let (a, b) = (peer("a", 1), peer("b", 4));
    let (xa, xb) = (
        EtcdExchange::new(&a.agent, &config(&etcd)).unwrap(),
        EtcdExchange::new(&b.agent, &config(&etcd)).unwrap(),
    );
    assert!(xb.lease_id().is_some());
    xb.publish().unwrap();
    assert_eq!(xa.fetch("b", Duration::ZERO).unwrap(), "b");
    assert_eq!(xa.watched_peers(), vec!["b".to_owned()]);
    transfer(&a, &b, 2, 0x5a);

    // A request built now must not run once b is gone.
    let built = write_req(&a, &b, 1).unwrap();
    xb.invalidate_local().unwrap();
    assert!(
        eventually(|| !a.agent.check_remote_metadata("b", None)),
        "a never invalidated b"
    );
    assert!(xa.watched_peers().is_empty());
    let r = a.agent.post_xfer_req(&built);
    assert!(invalidated(&r), "{r:?}");
    assert!(matches!(write_req(&a, &b, 1), Err(Error::NotFound { .. })));
    // Gone from etcd too: fetching again finds nothing.
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::NotFound { .. })
    ));

    // Publishing again brings it back.
    xb.publish().unwrap();
    xa.fetch("b", Duration::ZERO).unwrap();
    transfer(&a, &b, 3, 0x77);
    // Closing revokes the lease: keys vanish at once and a invalidates b again.
    xb.close().unwrap();
    assert!(eventually(|| !a.agent.check_remote_metadata("b", None)));
}

#[test]
fn fetch_waits_for_publication_up_to_its_deadline() {
    let Some(etcd) = server() else { return };
    let (a, b) = (peer("a", 1), peer("b", 1));
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    let err = xa.fetch("b", Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(a.agent.remotes().is_empty());

    let xb = EtcdExchange::new(&b.agent, &config(&etcd)).unwrap();
    let publisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        xb.publish().unwrap();
        xb
    });
    assert_eq!(xa.fetch("b", WAIT).unwrap(), "b");
    let _xb = publisher.join().unwrap();
    transfer(&a, &b, 0, 9);
}

#[test]
fn bad_requests_are_typed_errors_and_change_nothing() {
    let Some(etcd) = server() else { return };
    let (a, c) = (peer("a", 1), peer("c", 1));
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    assert!(matches!(
        xa.fetch("", Duration::ZERO),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        xa.fetch("a", Duration::ZERO),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        xa.fetch_label("b", "", Duration::ZERO),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        xa.fetch_label("b", &"x".repeat(300), Duration::ZERO),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        xa.publish_bytes("", &a.agent.local_metadata().unwrap()),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        xa.publish_bytes(DEFAULT_LABEL, b"garbage"),
        Err(Error::Decode { .. })
    ));
    assert!(matches!(
        xa.publish_bytes(DEFAULT_LABEL, &c.agent.local_metadata().unwrap()),
        Err(Error::Mismatch { .. })
    ));
    // Nothing was published by the refused calls.
    let xc = EtcdExchange::new(&c.agent, &config(&etcd)).unwrap();
    assert!(matches!(
        xc.fetch("a", Duration::ZERO),
        Err(Error::NotFound { .. })
    ));
    // Agent names with '/' cannot reach into another agent's prefix.
    assert_eq!(xa.key("a/b", "x"), format!("{}/a%2Fb/x", xa.namespace()));
}

#[test]
fn partial_metadata_by_label() {
    let Some(etcd) = server() else { return };
    let a = peer("a", 1);
    let b = Agent::new("b", AgentConfig::default()).unwrap();
    b.create_backend(InprocParams::default()).unwrap();
    let (k0, k1) = (
        Arc::new(HostBuffer::new(BLOCK as usize).unwrap()),
        Arc::new(HostBuffer::new(BLOCK as usize).unwrap()),
    );
    let (r0, r1) = (
        b.register_mem(vec![k0.clone()], &[]).unwrap(),
        b.register_mem(vec![k1.clone()], &[]).unwrap(),
    );
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    let xb = EtcdExchange::new(&b, &config(&etcd)).unwrap();
    xb.publish_partial(
        "conn",
        &MetadataSelection {
            registrations: Some(&[]),
            include_conn: true,
        },
    )
    .unwrap();
    xb.publish_partial(
        "kv0",
        &MetadataSelection {
            registrations: Some(&[&r0]),
            include_conn: false,
        },
    )
    .unwrap();
    xb.publish_partial(
        "kv1",
        &MetadataSelection {
            registrations: Some(&[&r1]),
            include_conn: false,
        },
    )
    .unwrap();
    let d0 = XferDescList::blocks(MemKind::Dram, k0.addr(), BLOCK, 1);
    let d1 = XferDescList::blocks(MemKind::Dram, k1.addr(), BLOCK, 1);

    // Regions without connection info first: refused, nothing loaded.
    assert!(matches!(
        xa.fetch_label("b", "kv0", Duration::ZERO),
        Err(Error::NotFound { .. })
    ));
    assert!(!a.agent.check_remote_metadata("b", None));
    xa.fetch_label("b", "conn", Duration::ZERO).unwrap();
    assert!(a.agent.check_remote_metadata("b", None));
    assert!(!a.agent.check_remote_metadata("b", Some(&d0)));
    xa.fetch_label("b", "kv0", Duration::ZERO).unwrap();
    assert!(a.agent.check_remote_metadata("b", Some(&d0)));
    assert!(!a.agent.check_remote_metadata("b", Some(&d1)));
    xa.fetch_label("b", "kv1", Duration::ZERO).unwrap();
    assert!(a.agent.check_remote_metadata("b", Some(&d1)));
    assert!(matches!(
        xa.fetch_label("b", "kv2", Duration::ZERO),
        Err(Error::NotFound { .. })
    ));

    // Write into the second region, then b re-publishes a label (same incarnation): kept.
    a.buf.fill(3);
    let req = a
        .agent
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, a.buf.addr(), BLOCK, 1),
            &d1,
            "b",
            XferOptions::default(),
        )
        .unwrap();
    a.agent.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(k1.to_vec(), vec![3u8; BLOCK as usize]);
    xb.publish_partial(
        "kv0",
        &MetadataSelection {
            registrations: Some(&[&r0]),
            include_conn: false,
        },
    )
    .unwrap();
    // Deleting everything of b invalidates it.
    xb.invalidate_local().unwrap();
    assert!(eventually(|| !a.agent.check_remote_metadata("b", None)));
}

#[test]
fn expired_lease_invalidates_the_peer() {
    let Some(etcd) = server() else { return };
    let (a, b) = (peer("a", 1), peer("b", 1));
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    // b "crashes" right after publishing: its key sits on a lease nobody keeps alive (4 s:
    // long enough for the fetch below on a loaded machine, well within `eventually`'s wait).
    raw_put(
        &etcd,
        &xa.key("b", DEFAULT_LABEL),
        b.agent.local_metadata().unwrap(),
        Some(4),
    );
    xa.fetch("b", Duration::ZERO).unwrap();
    let built = write_req(&a, &b, 0).unwrap();
    assert!(
        eventually(|| !a.agent.check_remote_metadata("b", None)),
        "the lease never expired"
    );
    let r = a.agent.post_xfer_req(&built);
    assert!(invalidated(&r), "{r:?}");
    assert!(matches!(write_req(&a, &b, 0), Err(Error::NotFound { .. })));
}

#[test]
fn a_live_exchange_keeps_its_lease_past_the_ttl() {
    let Some(etcd) = server() else { return };
    // Keep-alives go every TTL/3: the lease survives unless they stall for a whole TTL.
    let cfg = (config(&etcd)).lease_ttl(Duration::from_secs(5));
    let (a, b) = (peer("a", 1), peer("b", 1));
    let (xa, xb) = (
        EtcdExchange::new(&a.agent, &cfg).unwrap(),
        EtcdExchange::new(&b.agent, &cfg).unwrap(),
    );
    xb.publish().unwrap();
    xa.fetch("b", Duration::ZERO).unwrap();
    // Over two TTLs: without keep-alives the key would be gone.
    std::thread::sleep(Duration::from_secs(12));
    assert!(a.agent.check_remote_metadata("b", None));
    let xc = EtcdExchange::new(&peer("c", 1).agent, &cfg).unwrap();
    assert!(xc.fetch("b", Duration::ZERO).is_ok());
}

const CHILD_ENV: &str = "NIXL_ETCD_TEST_CHILD_ENDPOINT";

/// Not a test on its own: the crashing peer of `crashed_process_disappears_after_its_ttl`,
/// run in a child process. Publishes, says so, and waits to be killed.
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn crash_child_process() {
    let Ok(endpoint) = std::env::var(CHILD_ENV) else {
        return;
    };
    // No backend: INPROC cannot connect across processes, and the lease is what is tested.
    let agent = Agent::new("crashy", AgentConfig::default()).unwrap();
    let cfg = EtcdConfig::default()
        .endpoints(vec![endpoint])
        .lease_ttl(Duration::from_secs(2));
    let x = EtcdExchange::new(&agent, &cfg).unwrap();
    x.publish().unwrap();
    println!("PUBLISHED");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn crashed_process_disappears_after_its_ttl() {
    let Some(etcd) = server() else { return };
    let a = peer("a", 1);
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child_process",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, etcd.endpoint())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("PUBLISHED") {
                let _ = tx.send(());
            }
        }
    });
    let published = rx.recv_timeout(WAIT).is_ok();
    if !published {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child never published");
    }
    xa.fetch("crashy", Duration::ZERO).unwrap();
    child.kill().unwrap(); // SIGKILL: no revoke, no goodbye.
    child.wait().unwrap();
    assert!(
        eventually(|| !a.agent.check_remote_metadata("crashy", None)),
        "crashy was never invalidated"
    );
    assert!(matches!(
        xa.fetch("crashy", Duration::ZERO),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn restarted_peer_fences_the_old_incarnation() {
    let Some(etcd) = server() else { return };
    let a = peer("a", 1);
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    let b1 = peer("b", 1);
    let xb1 = EtcdExchange::new(&b1.agent, &config(&etcd)).unwrap();
    xb1.publish().unwrap();
    xa.fetch("b", Duration::ZERO).unwrap();
    let built = write_req(&a, &b1, 0).unwrap();
    let g1 = b1.agent.generation();
    // b restarts: a new incarnation publishes over the same key.
    let b2 = peer("b", 1);
    let xb2 = EtcdExchange::new(&b2.agent, &config(&etcd)).unwrap();
    xb2.publish().unwrap();
    assert!(eventually(|| a.agent.remote_generation("b") != Some(g1)));
    // The old incarnation is fenced: `PeerRestarted` once the new one is loaded, a
    // `RemoteDisconnect` that says it was invalidated while none is.
    let r = a.agent.post_xfer_req(&built);
    assert!(
        matches!(r, Err(Error::PeerRestarted { .. })) || invalidated(&r),
        "{r:?}"
    );
    xa.fetch("b", Duration::ZERO).unwrap();
    assert_eq!(a.agent.remote_generation("b"), Some(b2.agent.generation()));
    transfer(&a, &b2, 0, 0x42);
    // The old incarnation closing late must not remove the new one.
    drop(xb1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.agent.remote_generation("b"), Some(b2.agent.generation()));
}

#[test]
fn garbage_under_a_key_is_a_decode_error() {
    let Some(etcd) = server() else { return };
    let (a, b, c) = (peer("a", 1), peer("b", 1), peer("c", 1));
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    raw_put(
        &etcd,
        &xa.key("b", DEFAULT_LABEL),
        b"\x00not metadata at all".to_vec(),
        None,
    );
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::Decode { .. })
    ));
    // Truncated real metadata.
    let md = b.agent.local_metadata().unwrap();
    raw_put(
        &etcd,
        &xa.key("b", DEFAULT_LABEL),
        md[..md.len() / 2].to_vec(),
        None,
    );
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::Decode { .. })
    ));
    // Another agent's metadata under b's key.
    raw_put(
        &etcd,
        &xa.key("b", DEFAULT_LABEL),
        c.agent.local_metadata().unwrap(),
        None,
    );
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::Mismatch { .. })
    ));
    assert!(a.agent.remotes().is_empty());
    assert!(xa.watched_peers().is_empty());

    // A loaded peer whose key is overwritten with garbage is invalidated.
    raw_put(&etcd, &xa.key("b", DEFAULT_LABEL), md.clone(), None);
    xa.fetch("b", Duration::ZERO).unwrap();
    raw_put(&etcd, &xa.key("b", DEFAULT_LABEL), b"junk".to_vec(), None);
    assert!(eventually(|| !a.agent.check_remote_metadata("b", None)));
}

#[test]
fn etcd_stopped_mid_test_gives_typed_errors_then_recovers() {
    let Some(mut etcd) = server() else { return };
    let (a, b) = (peer("a", 2), peer("b", 2));
    let (xa, xb) = (
        impatient_exchange(&a.agent, &etcd),
        impatient_exchange(&b.agent, &etcd),
    );
    xb.publish().unwrap();
    xa.fetch("b", Duration::ZERO).unwrap();

    etcd.kill();
    let e = xa.publish().unwrap_err();
    assert!(
        matches!(e, Error::Backend { .. } | Error::TimedOut { .. }),
        "{e}"
    );
    let e = xa.fetch("b", Duration::from_millis(200)).unwrap_err();
    assert!(
        matches!(e, Error::Backend { .. } | Error::TimedOut { .. }),
        "{e}"
    );
    assert!(matches!(
        xa.invalidate_local(),
        Err(Error::Backend { .. } | Error::TimedOut { .. })
    ));
    // Peers already loaded keep working: etcd is only the directory.
    transfer(&a, &b, 1, 0x11);
    let e = EtcdExchange::new(&peer("c", 1).agent, &impatient(&etcd)).unwrap_err();
    assert!(
        matches!(e, Error::Backend { .. } | Error::TimedOut { .. }),
        "{e}"
    );

    // Back on the same data: publishing and fetching work again.
    etcd.restart().unwrap();
    assert!(
        eventually(|| xa.publish().is_ok()),
        "publish never recovered"
    );
    let xc = impatient_exchange(&peer("c", 1).agent, &etcd);
    assert_eq!(xc.fetch("a", Duration::ZERO).unwrap(), "a");
    transfer(&a, &b, 0, 0x22);
}

#[test]
fn frozen_etcd_times_out_instead_of_hanging() {
    let Some(mut etcd) = server() else { return };
    let a = peer("a", 1);
    let xa = impatient_exchange(&a.agent, &etcd);
    etcd.set_paused(true).unwrap();
    let e = xa.publish().unwrap_err();
    assert!(matches!(e, Error::TimedOut { .. }), "{e}");
    let e = xa.fetch("b", Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, Error::TimedOut { .. }), "{e}");
    etcd.set_paused(false).unwrap();
    assert!(eventually(|| xa.publish().is_ok()));
}

#[test]
fn unreachable_endpoint_is_a_typed_error() {
    // Needs no etcd: nothing listens on the port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a = peer("a", 1);
    let cfg = EtcdConfig::default()
        .endpoints(vec![format!("127.0.0.1:{port}")])
        .request_timeout(Duration::from_millis(300))
        .retries(1);
    let e = EtcdExchange::new(&a.agent, &cfg).unwrap_err();
    assert!(
        matches!(e, Error::Backend { .. } | Error::TimedOut { .. }),
        "{e}"
    );
    let e = EtcdExchange::new(&a.agent, &cfg.endpoints(vec!["https://h:1".into()])).unwrap_err();
    assert!(matches!(e, Error::InvalidParam { .. }), "{e}");
}

#[test]
fn namespaces_are_separate() {
    let Some(etcd) = server() else { return };
    let (a, b) = (peer("a", 1), peer("b", 1));
    let ns = |n: &str| config(&etcd).namespace(n.to_string());
    let xa = EtcdExchange::new(&a.agent, &ns("/one")).unwrap();
    let xb = EtcdExchange::new(&b.agent, &ns("/two")).unwrap();
    xb.publish().unwrap();
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::NotFound { .. })
    ));
    let xa2 = EtcdExchange::new(&a.agent, &ns("/two/")).unwrap();
    assert_eq!(xa2.namespace(), "/two");
    xa2.fetch("b", Duration::ZERO).unwrap();
}

#[test]
fn fetch_all_loads_every_peer_in_pages_and_reports_bad_entries() {
    let Some(etcd) = server() else { return };
    let (a, b, c) = (peer("a", 1), peer("b", 1), peer("c", 1));
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    let (xb, xc) = (
        EtcdExchange::new(&b.agent, &config(&etcd)).unwrap(),
        EtcdExchange::new(&c.agent, &config(&etcd)).unwrap(),
    );
    xa.publish().unwrap();
    xb.publish().unwrap();
    xc.publish().unwrap();
    xc.publish_partial(
        "conn",
        &MetadataSelection {
            registrations: Some(&[]),
            include_conn: true,
        },
    )
    .unwrap();
    // More garbage entries than one page holds (transactions of 100 puts).
    for chunk in 0..3 {
        let keys: Vec<String> = (0..100)
            .map(|i| xa.key(&format!("junk{}", chunk * 100 + i), DEFAULT_LABEL))
            .collect();
        let entries: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &b"junk"[..])).collect();
        etcd.put_raw(&entries, None).unwrap();
    }
    let all = xa.fetch_all(DEFAULT_LABEL).unwrap();
    assert_eq!(all.len(), 302, "a itself and other labels are skipped");
    let ok: Vec<&str> = all
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(ok, vec!["b", "c"]);
    assert!(all
        .iter()
        .filter(|(n, _)| n.starts_with("junk"))
        .all(|(_, r)| matches!(r, Err(Error::Decode { .. }))));
    assert_eq!(a.agent.remotes(), vec!["b".to_owned(), "c".to_owned()]);
    assert_eq!(xa.watched_peers(), vec!["b".to_owned(), "c".to_owned()]);
    transfer(&a, &b, 0, 1);
    transfer(&a, &c, 0, 2);
    assert!(matches!(xa.fetch_all(""), Err(Error::InvalidParam { .. })));
}

/// An agent with a credential.
fn signed_peer(name: &str, cred: &nixl_core::access::Credential, blocks: usize) -> Peer {
    let agent = Agent::new(
        name,
        AgentConfig::default().auth(nixl_core::access::Auth::new(cred.clone())),
    )
    .unwrap();
    agent.create_backend(InprocParams::default()).unwrap();
    let buf = Arc::new(HostBuffer::new(BLOCK as usize * blocks).unwrap());
    let reg = agent.register_mem(vec![buf.clone()], &[]).unwrap();
    Peer {
        agent,
        buf,
        _reg: reg,
    }
}

/// With a cluster credential, metadata in etcd carries its MAC: two authenticated agents
/// exchange through etcd and transfer; write access to etcd alone cannot inject a peer (a
/// forged blob under a key is refused and does not replace the loaded one), nor replay an
/// old incarnation's blob.
#[test]
fn authenticated_exchange_through_etcd() {
    let Some(etcd) = server() else { return };
    let cred = nixl_core::access::Credential::generate("cluster").unwrap();
    let (a, b) = (signed_peer("a", &cred, 1), signed_peer("b", &cred, 4));
    let xa = EtcdExchange::new(&a.agent, &config(&etcd)).unwrap();
    let xb = EtcdExchange::new(&b.agent, &config(&etcd)).unwrap();
    xb.publish().unwrap();
    assert_eq!(xa.fetch("b", Duration::ZERO).unwrap(), "b");
    transfer(&a, &b, 1, 0x3c);
    let g = b.agent.generation();
    let old_blob = b.agent.local_metadata().unwrap();

    // Someone with etcd write access but no credential: an unsigned blob and a blob signed
    // with another secret under b's key (a new generation, pointing at their own memory).
    let key = xa.key("b", DEFAULT_LABEL);
    let intruder = peer("b", 1);
    raw_put(&etcd, &key, intruder.agent.local_metadata().unwrap(), None);
    let other = signed_peer(
        "b",
        &nixl_core::access::Credential::generate("cluster").unwrap(),
        1,
    );
    raw_put(&etcd, &key, other.agent.local_metadata().unwrap(), None);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        a.agent.remote_generation("b"),
        Some(g),
        "a forged put replaced b"
    );
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::NotAllowed { .. })
    ));
    assert_eq!(a.agent.remote_generation("b"), Some(g));
    transfer(&a, &b, 2, 0x3d);

    // b restarts; its old incarnation's blob, replayed into etcd, is refused by an agent that
    // saw the newer one.
    let b2 = signed_peer("b", &cred, 4);
    let xb2 = EtcdExchange::new(&b2.agent, &config(&etcd)).unwrap();
    xb2.publish().unwrap();
    assert!(eventually(|| a.agent.remote_generation("b") != Some(g)));
    xa.fetch("b", Duration::ZERO).unwrap();
    assert_eq!(a.agent.remote_generation("b"), Some(b2.agent.generation()));
    raw_put(&etcd, &key, old_blob, None);
    assert!(matches!(
        xa.fetch("b", Duration::ZERO),
        Err(Error::NotAllowed { .. })
    ));
    transfer(&a, &b2, 0, 0x3e);
    drop(xb);
}
/// `LocalEtcd::start_on` serves on the address it is given (here 127.0.0.2, also a loopback
/// address on Linux), and agents exchange metadata through it; an address this machine does
/// not have is an I/O error and starts nothing.
#[test]
fn local_etcd_binds_the_address_it_is_given() {
    let ip: std::net::IpAddr = [127, 0, 0, 2].into();
    let etcd = match LocalEtcd::start_on(ip) {
        Ok(e) => e,
        Err(Error::Unavailable { what, hint }) => {
            nixl_testkit::skip(
                "local_etcd_binds_the_address_it_is_given",
                nixl_testkit::Dep::Etcd,
                format!("{what} is unavailable ({hint})"),
            );
            return;
        }
        Err(e) => panic!("starting etcd on {ip} failed: {e}"),
    };
    assert!(
        etcd.endpoint().starts_with("http://127.0.0.2:"),
        "{}",
        etcd.endpoint()
    );
    let (a, b) = (peer("bind-a", 1), peer("bind-b", 1));
    let (xa, xb) = (
        EtcdExchange::new(&a.agent, &config(&etcd)).unwrap(),
        EtcdExchange::new(&b.agent, &config(&etcd)).unwrap(),
    );
    xb.publish().unwrap();
    assert_eq!(xa.fetch("bind-b", WAIT).unwrap(), "bind-b");
    // 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this machine.
    match LocalEtcd::start_on([192, 0, 2, 1].into()) {
        Err(Error::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrNotAvailable)
        }
        other => panic!("etcd on a foreign address: {other:?}"),
    }
}

/// A request refused because its peer was invalidated (forgotten, no incarnation loaded).
fn invalidated<T: std::fmt::Debug>(r: &nixl_core::Result<T>) -> bool {
    matches!(r, Err(e @ Error::RemoteDisconnect { .. }) if e.to_string().contains("invalidated"))
}
