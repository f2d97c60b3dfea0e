//! Metadata exchange over the TCP side channel between two agents on 127.0.0.1.

use std::io::Write;
use std::time::{Duration, Instant};

use nixl_core::wire::sidechannel::frame::{decode, encode_plain, Kind};
use nixl_core::wire::sidechannel::read_frame;
use nixl_core::{
    Agent, AgentConfig, Error, MemKind, XferDescList, XferOp, XferOptions, XferTarget,
};
use nixl_testkit::{inproc_agent_with as agent_with, registered, unique};

fn listening(prefix: &str) -> Agent {
    agent_with(
        prefix,
        AgentConfig::default()
            .listen(true)
            .default_timeout(Duration::from_secs(5)),
    )
}

#[test]
fn push_fetch_transfer_and_invalidate() {
    let a = listening("sc-a");
    let b = listening("sc-b");
    let (sa, _ra) = registered(&a, 8192);
    let (sb, _rb) = registered(&b, 8192);
    let (addr_a, addr_b) = (a.listen_addr().unwrap(), b.listen_addr().unwrap());
    assert!(addr_a.ip().is_loopback());

    // a pushes its metadata to b; a fetches b's, blocking with a deadline.
    a.send_local_metadata(addr_b).unwrap();
    assert!(b.check_remote_metadata(a.name(), None));
    assert_eq!(
        a.fetch_remote_metadata_blocking(b.name(), addr_b, Duration::from_secs(5))
            .unwrap(),
        b.name()
    );

    sa.fill_pattern(3);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 8192, 1),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 8192, 1),
            b.name(),
            XferOptions::with_notif(b"hi".to_vec()),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(sa.to_vec(), sb.to_vec());
    assert_eq!(
        b.wait_notifs(Duration::from_secs(5)).unwrap()[a.name()],
        vec![b"hi".to_vec()]
    );

    // a tells b to forget it.
    a.invalidate_local_metadata(addr_b).unwrap();
    assert!(!b.check_remote_metadata(a.name(), None));
}

/// Issue 36: fetch as a future. A current-thread runtime awaits it (the exchange runs on a
/// thread of its own: the executor is never blocked); the future resolves with the loaded
/// name; a fetch from nobody resolves with the refusal, by its deadline.
#[tokio::test(flavor = "current_thread")]
async fn fetch_is_a_future() {
    let a = listening("ff-a");
    let b = listening("ff-b");
    let got = a
        .fetch_remote_metadata_async(b.name(), b.listen_addr().unwrap(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got, b.name());
    assert!(a.check_remote_metadata(b.name(), None));
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = nobody.local_addr().unwrap();
    drop(nobody);
    let t = Instant::now();
    let e = a
        .fetch_remote_metadata_async("ghost", addr, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        t.elapsed() < Duration::from_millis(500) + Duration::from_millis(500),
        "{e}"
    );
    assert!(!a.check_remote_metadata("ghost", None));
}

#[test]
fn asynchronous_fetch_is_polled() {
    let a = listening("af-a");
    let b = listening("af-b");
    let (sb, _rb) = registered(&b, 4096);
    a.fetch_remote_metadata(b.name(), b.listen_addr().unwrap())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !a.fetch_status(b.name()).unwrap() {
        assert!(Instant::now() < deadline, "fetch did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(a.check_remote_metadata(
        b.name(),
        Some(&XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1))
    ));
    assert!(a
        .prep_xfer_dlist(
            XferTarget::Agent(b.name()),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
            &[]
        )
        .is_ok());
}

#[test]
fn fetching_the_wrong_name_or_from_nobody_fails() {
    let a = listening("wn-a");
    let b = listening("wn-b");
    let r = a.fetch_remote_metadata_blocking(
        "someone-else",
        b.listen_addr().unwrap(),
        Duration::from_secs(5),
    );
    assert!(matches!(r, Err(Error::NotFound { .. })), "{r:?}");
    assert!(a.remotes().is_empty());
    // Background fetch from a closed port reports its failure.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    a.fetch_remote_metadata("ghost", closed).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match a.fetch_status("ghost") {
            Ok(false) => {}
            Ok(true) => panic!("fetched from a closed port"),
            Err(e) => {
                assert!(matches!(e, Error::NotFound { .. }));
                break;
            }
        }
        assert!(Instant::now() < deadline, "fetch never failed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(
        a.fetch_remote_metadata("", closed),
        Err(Error::InvalidParam { .. })
    ));
}

/// Sends raw bytes and reads one reply frame body.
fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    read_frame(&mut s, 1 << 20).unwrap()
}

#[test]
fn hostile_clients_do_not_break_the_listener() {
    let b = listening("hostile");
    let addr = b.listen_addr().unwrap();
    // Oversized frame header, garbage, a reply sent as a request, garbage metadata, a bad
    // invalidation, a client that says nothing.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 1]).unwrap();
    drop(s);
    let mut garbage = 9u32.to_le_bytes().to_vec();
    garbage.extend_from_slice(b"NXS2garbg");
    assert_eq!(decode(&raw(addr, &garbage)).unwrap().kind, Kind::Err);
    assert_eq!(
        decode(&raw(addr, &encode_plain(Kind::Ack, b"")))
            .unwrap()
            .kind,
        Kind::Err
    );
    let f = raw(addr, &encode_plain(Kind::Push, b"NIXLRSMD garbage"));
    assert_eq!(
        decode(&f).unwrap().kind,
        Kind::Err,
        "garbage metadata must be refused"
    );
    let f = raw(addr, &encode_plain(Kind::Invalidate, &[200, 0, 1]));
    assert_eq!(decode(&f).unwrap().kind, Kind::Err);
    let _silent = std::net::TcpStream::connect(addr).unwrap();
    // The listener still serves a real peer.
    let a = Agent::new(&unique("hostile-a"), AgentConfig::default()).unwrap();
    a.create_backend(nixl_core::InprocParams::default())
        .unwrap();
    a.send_local_metadata(addr).unwrap();
    assert!(b.remotes().contains(&a.name().to_owned()));
}

#[test]
fn listener_stops_when_the_agent_is_dropped() {
    let b = listening("stop");
    let addr = b.listen_addr().unwrap();
    drop(b);
    // The port is released: a new listener can bind it, or connecting fails.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if std::net::TcpListener::bind(addr).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "listener still bound");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fetch has one deadline for the whole exchange: a server that trickles its reply (a byte
/// every 100 ms, each read well within any per-read timeout) cannot stretch it.
#[test]
fn fetch_deadline_bounds_a_trickling_reply() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = nixl_core::wire::sidechannel::read_frame(&mut s, 1 << 20);
        // A frame header announcing 1000 bytes, then the body one byte at a time, for at
        // most 10 s.
        let _ = s.write_all(&1000u32.to_le_bytes());
        for _ in 0..100 {
            if s.write_all(&[0]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let a = listening("trickled");
    let t = Instant::now();
    match a.fetch_remote_metadata_blocking("slow", addr, Duration::from_secs(1)) {
        Err(Error::TimedOut { .. }) => {}
        other => panic!("expected TimedOut, got {other:?}"),
    }
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the deadline held: {:?}",
        t.elapsed()
    );
    assert!(a.remotes().is_empty());
    server.join().unwrap();
}

/// A client that trickles its request cannot hold the listener (which serves one connection
/// at a time) past the serving deadline: a real peer behind it is served.
#[test]
fn a_trickling_client_cannot_hold_the_listener() {
    let b = listening("held");
    let addr = b.listen_addr().unwrap();
    let trickler = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        // A PUSH header announcing 100 bytes, sent a byte every 500 ms (60 s in all).
        for byte in [0u8, 0, 0, 100, 1].into_iter().chain([0u8; 100]) {
            if s.write_all(&[byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let a = Agent::new(&unique("held-a"), AgentConfig::default()).unwrap();
    a.create_backend(nixl_core::InprocParams::default())
        .unwrap();
    let md = a.local_metadata().unwrap();
    let t = Instant::now();
    a.send_metadata_bytes(addr, &md, Duration::from_secs(10))
        .expect("served once the trickling client's deadline (5 s) passed");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(b.remotes().contains(&a.name().to_owned()));
    drop(b);
    trickler.join().unwrap();
}

/// A server that answers a FETCH of one name with the metadata of another peer, one the
/// client has loaded (a new incarnation of it, as a liar would serve): the answer is refused
/// before anything is loaded, and the loaded peer stays exactly as it was. Before, the answer
/// was loaded first (replacing the loaded peer's incarnation) and then the name it gave was
/// forgotten: a lying server made the client drop a peer it had nothing to do with.
#[test]
fn a_fetch_answered_with_another_peers_metadata_changes_nothing() {
    let a = listening("liar-client");
    let honest = listening("liar-honest");
    let (_hb, _hr) = registered(&honest, 4096);
    a.load_remote_metadata(&honest.local_metadata().unwrap())
        .unwrap();
    let generation = a.remote_generation(honest.name()).unwrap();
    let regions = a.remote_regions(honest.name()).unwrap();
    // Another incarnation under the honest peer's name: what the liar answers with.
    let forged = Agent::new(honest.name(), AgentConfig::default()).unwrap();
    forged
        .create_backend(nixl_core::InprocParams::default())
        .unwrap();
    let (_fb, _fr) = registered(&forged, 8192);
    let answer = forged.local_metadata().unwrap();
    let liar = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = liar.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = liar.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let request = read_frame(&mut s, 1 << 20).unwrap();
        assert_eq!(decode(&request).unwrap().kind, Kind::Fetch);
        s.write_all(&encode_plain(Kind::Metadata, &answer)).unwrap();
    });
    let r = a.fetch_remote_metadata_blocking("ghost", addr, Duration::from_secs(10));
    server.join().unwrap();
    let e = r.expect_err("an answer naming another agent is refused");
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("ghost"), "{e}");
    // Nothing changed: the honest peer is loaded, same incarnation, same regions.
    assert!(a.check_remote_metadata(honest.name(), None));
    assert_eq!(a.remote_generation(honest.name()), Some(generation));
    assert_eq!(a.remote_regions(honest.name()).unwrap(), regions);
    assert!(!a.check_remote_metadata("ghost", None));
}
