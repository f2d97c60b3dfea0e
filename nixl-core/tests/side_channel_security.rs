//! The side channel under attack, in one process over INPROC: authentication, identity,
//! replay, owner-only invalidation, the non-loopback rule, stalls (slowloris, idle
//! connections, a slow server), connection and byte limits, peer and region limits.
//! The same attacks over real UCX between processes are in the root crate's
//! `tests/hostile_peer.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::access::{Auth, Credential};
use nixl_core::wire::sidechannel::frame::{decode, encode_plain, encode_signed_request, Kind};
use nixl_core::wire::sidechannel::read_frame;
use nixl_core::{Agent, AgentConfig, ErrorKind, InprocParams, Limits, ListenerLimits};
use nixl_testkit::{registered, unique};

fn config(auth: Option<&Credential>) -> AgentConfig {
    AgentConfig::default()
        .listen(true)
        .default_timeout(Duration::from_secs(5))
        .auth(auth.map(|c| Auth::new(c.clone())))
}

fn agent(prefix: &str, cfg: AgentConfig) -> Agent {
    let a = Agent::new(&unique(prefix), cfg).unwrap();
    a.create_backend(InprocParams::default()).unwrap();
    a
}

/// One credential per id.
fn credentials(ids: &[&str]) -> Vec<Credential> {
    ids.iter()
        .map(|id| Credential::generate(id).unwrap())
        .collect()
}

/// A listening member of `creds` holding `own` and trusting the others.
fn member(creds: &[Credential], own: &Credential) -> AgentConfig {
    let mut auth = Auth::new(own.clone());
    auth.trusted = creds
        .iter()
        .filter(|c| c.id() != own.id())
        .cloned()
        .collect();
    AgentConfig::default()
        .listen(true)
        .default_timeout(Duration::from_secs(5))
        .auth(auth)
}

/// Sends raw bytes and returns the reply body.
fn raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    read_frame(&mut s, 64 << 20).unwrap()
}

#[test]
fn authenticated_agents_exchange_and_others_are_refused() {
    let cred = Credential::generate("cluster").unwrap();
    let a = agent("auth-a", config(Some(&cred)));
    let b = agent("auth-b", config(Some(&cred)));
    let (_sb, _rb) = registered(&b, 4096);
    let addr_b = b.listen_addr().unwrap();
    a.send_local_metadata(addr_b).unwrap();
    assert!(b.check_remote_metadata(a.name(), None));
    assert_eq!(
        a.fetch_remote_metadata_blocking(b.name(), addr_b, Duration::from_secs(5))
            .unwrap(),
        b.name()
    );

    // No credential, or the same id with another secret: nothing loads, nothing leaks.
    let open = agent("auth-open", config(None));
    let forged = agent(
        "auth-forged",
        config(Some(&Credential::generate("cluster").unwrap())),
    );
    for intruder in [&open, &forged] {
        let e = intruder.send_local_metadata(addr_b).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
        let e = intruder
            .fetch_remote_metadata_blocking(b.name(), addr_b, Duration::from_secs(5))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
        assert!(!b.remotes().contains(&intruder.name().to_owned()));
        assert!(intruder.remotes().is_empty());
    }
    // Unsealed metadata is refused even when delivered out of band.
    let e = b
        .load_remote_metadata(&open.local_metadata().unwrap())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowed);
    // A raw unsigned frame gets a refusal, not metadata.
    let mut w = nixl_core::backend::bytes::ByteWriter::new();
    w.put_str(b.name());
    let f = raw(addr_b, &encode_plain(Kind::Fetch, w.as_slice()));
    assert_eq!(decode(&f).unwrap().kind, Kind::Err);
}

#[test]
fn a_name_stays_with_its_credential_and_replays_are_refused() {
    let (c1, c2) = (
        Credential::generate("team-1").unwrap(),
        Credential::generate("team-2").unwrap(),
    );
    let mut victim_cfg = config(Some(&c1));
    victim_cfg.auth.as_mut().unwrap().trusted.push(c2.clone());
    let victim = agent("bind-victim", victim_cfg);
    let addr = victim.listen_addr().unwrap();
    let name = unique("bind-peer");
    let honest = Agent::new(&name, config(Some(&c1))).unwrap();
    honest.create_backend(InprocParams::default()).unwrap();
    let md = honest.local_metadata().unwrap();
    victim.load_remote_metadata(&md).unwrap();
    let gen = victim.remote_generation(&name).unwrap();

    // Another credential the victim trusts cannot take the name (new generation).
    let impostor = Agent::new(&name, config(Some(&c2))).unwrap();
    impostor.create_backend(InprocParams::default()).unwrap();
    let e = impostor.send_local_metadata(addr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
    assert_eq!(victim.remote_generation(&name), Some(gen));

    // A captured PUSH frame replayed: refused (nonce seen).
    let (frame, _) =
        encode_signed_request(Kind::Push, &md, &Credential::parse(&c1.export()).unwrap()).unwrap();
    assert_eq!(decode(&raw(addr, &frame)).unwrap().kind, Kind::Ack);
    assert_eq!(decode(&raw(addr, &frame)).unwrap().kind, Kind::Err);

    // The honest agent restarts (new generation): accepted. Then its old incarnation's
    // metadata, replayed out of band, is refused.
    drop(honest);
    let restarted = Agent::new(&name, config(Some(&c1))).unwrap();
    restarted.create_backend(InprocParams::default()).unwrap();
    restarted.send_local_metadata(addr).unwrap();
    let new_gen = victim.remote_generation(&name).unwrap();
    assert_ne!(new_gen, gen);
    let e = victim.load_remote_metadata(&md).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
    assert_eq!(victim.remote_generation(&name), Some(new_gen));
}

#[test]
fn only_the_owner_invalidates() {
    let cred = Credential::generate("cluster").unwrap();
    let victim = agent("inv-victim", config(Some(&cred)));
    let addr = victim.listen_addr().unwrap();
    let owner = agent("inv-owner", config(Some(&cred)));
    owner.send_local_metadata(addr).unwrap();
    // A cluster member forges an INVALIDATE for the owner (right name and generation, its own
    // owner token): refused.
    let payload = nixl_core::wire::sidechannel::frame::encode_invalidate(
        owner.name(),
        owner.generation(),
        &[7u8; 32],
    );
    let (f, _) = encode_signed_request(Kind::Invalidate, &payload, &cred).unwrap();
    let reply = raw(addr, &f);
    assert_eq!(decode(&reply).unwrap().kind, Kind::Err);
    assert!(victim.check_remote_metadata(owner.name(), None));
    // The owner itself: accepted.
    owner.invalidate_local_metadata(addr).unwrap();
    assert!(!victim.check_remote_metadata(owner.name(), None));
}

#[test]
fn non_loopback_listener_needs_a_credential_or_an_explicit_opt_out() {
    let any = SocketAddr::from(([0, 0, 0, 0], 0));
    let mut cfg = config(None);
    cfg.listen_addr = any;
    let e = Agent::new(&unique("nl-open"), cfg.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
    cfg.allow_unauthenticated_listener = true;
    assert!(Agent::new(&unique("nl-optout"), cfg).is_ok());
    let mut cfg = config(Some(&Credential::generate("c").unwrap()));
    cfg.listen_addr = any;
    assert!(Agent::new(&unique("nl-auth"), cfg).is_ok());
}

/// How long fetches of `b` take while something else happens: the slowest of `n`.
fn slowest_fetch(b: &Agent, n: usize) -> Duration {
    let a = agent("probe", AgentConfig::default());
    let addr = b.listen_addr().unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..n {
        let t = Instant::now();
        a.fetch_remote_metadata_blocking(b.name(), addr, Duration::from_secs(10))
            .unwrap();
        worst = worst.max(t.elapsed());
        a.invalidate_remote_metadata(b.name()).unwrap();
    }
    worst
}

#[test]
fn slowloris_and_idle_connections_do_not_stall_fetches() {
    let b = agent("stall", config(None));
    let addr = b.listen_addr().unwrap();
    let baseline = slowest_fetch(&b, 5);
    // One trickling client (a byte every 300 ms) and 130 idle ones.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stop2, slow) = (stop.clone(), TcpStream::connect(addr).unwrap());
    let trickle = std::thread::spawn(move || {
        let mut s = slow;
        let mut sent = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if s.write_all(&[0x10]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(300));
        }
        sent
    });
    let idle: Vec<TcpStream> = (0..130)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let loaded = slowest_fetch(&b, 8);
    eprintln!(
        "slowest fetch: {baseline:?} alone, {loaded:?} beside a slowloris and 130 idle connections"
    );
    // The old listener served one connection at a time with 5 s per read: >= 5 s here.
    assert!(
        loaded < baseline + Duration::from_secs(1),
        "fetch took {loaded:?} beside idle connections (alone: {baseline:?})"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(idle);
    trickle.join().unwrap();
}

#[test]
fn the_server_closes_a_request_that_does_not_finish_in_time() {
    let mut cfg = config(None);
    cfg.limits.listener.request_timeout = Duration::from_millis(500);
    let b = agent("deadline", cfg);
    let mut s = TcpStream::connect(b.listen_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    // A byte at a time, forever: the server hangs up at its deadline.
    let mut closed = false;
    for _ in 0..100 {
        if s.write_all(&[1]).is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1];
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    assert!(
        closed,
        "the server kept a trickling request for {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "closed after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_blocking_fetch_ends_by_its_deadline_against_a_slow_server() {
    // A server that accepts and then answers one byte every 300 ms (the old client waited
    // up to its timeout per read: 40 s here).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
        // A frame of 1000 bytes, announced and then trickled.
        let _ = s.write_all(&1000u32.to_le_bytes());
        for _ in 0..40 {
            if s.write_all(&[0]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let a = agent("slow-fetch", AgentConfig::default());
    let t = Instant::now();
    let e = a
        .fetch_remote_metadata_blocking("anyone", addr, Duration::from_secs(2))
        .unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(
        took < Duration::from_millis(2300),
        "returned after {took:?}"
    );
    drop(a);
    server.join().unwrap();
}

#[test]
fn connection_and_byte_limits_hold() {
    let mut cfg = config(None);
    cfg.limits.listener = ListenerLimits::default()
        .max_connections(4)
        .max_request_bytes(1 << 20)
        .max_buffered_bytes(1 << 20);
    let b = agent("limits", cfg);
    let addr = b.listen_addr().unwrap();
    // Ten idle connections on a four-slot listener: the oldest idle ones make room.
    let _idle: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    assert!(slowest_fetch(&b, 3) < Duration::from_secs(2));
    // A frame over the request limit is refused before its body is read.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&(2u32 << 20).to_le_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(s.read(&mut buf), Ok(0) | Err(_)),
        "oversize frame not refused"
    );
    // Two requests that together exceed the byte budget: the second is refused while the
    // first holds its bytes.
    let mut first = TcpStream::connect(addr).unwrap();
    first.write_all(&(800u32 << 10).to_le_bytes()).unwrap();
    first.write_all(&[0u8; 1024]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut second = TcpStream::connect(addr).unwrap();
    second.write_all(&(800u32 << 10).to_le_bytes()).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let reply = read_frame(&mut second, 1 << 20).unwrap();
    let f = decode(&reply).unwrap();
    assert_eq!(f.kind, Kind::Err);
    drop(first);
}

#[test]
fn peer_and_region_limits_are_typed_and_change_nothing() {
    let cfg = AgentConfig::default().limits(Limits::default().max_peers(2).max_regions_per_peer(3));
    let a = agent("plim", cfg);
    let peers: Vec<Agent> = (0..3)
        .map(|_| agent("plim-peer", AgentConfig::default()))
        .collect();
    a.load_remote_metadata(&peers[0].local_metadata().unwrap())
        .unwrap();
    a.load_remote_metadata(&peers[1].local_metadata().unwrap())
        .unwrap();
    let e = a
        .load_remote_metadata(&peers[2].local_metadata().unwrap())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert_eq!(a.remotes().len(), 2);
    // Regions: four registrations of a peer already loaded are refused as a whole.
    let regs: Vec<_> = (0..4).map(|_| registered(&peers[0], 4096)).collect();
    let e = a
        .load_remote_metadata(&peers[0].local_metadata().unwrap())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert!(a.remote_regions(peers[0].name()).unwrap().is_empty());
    drop(regs);
}

#[test]
fn a_notification_flood_is_bounded_and_reported_once() {
    let mut cfg = AgentConfig::default();
    cfg.limits.max_queued_notif_bytes = 64 << 10;
    cfg.limits.max_queued_notif_bytes_per_sender = 32 << 10;
    let target = agent("flood-t", cfg);
    let flooder = agent("flood-f", AgentConfig::default());
    let quiet = agent("flood-q", AgentConfig::default());
    flooder
        .load_remote_metadata(&target.local_metadata().unwrap())
        .unwrap();
    quiet
        .load_remote_metadata(&target.local_metadata().unwrap())
        .unwrap();
    for _ in 0..1000 {
        flooder.gen_notif(target.name(), &[0u8; 1024], &[]).unwrap();
    }
    quiet.gen_notif(target.name(), b"still heard", &[]).unwrap();
    // The drops end the first read with a typed error (whatever is queued); the messages stay
    // for the next read.
    let e = target.get_notifs().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    let got = target.get_notifs().unwrap();
    let kept = got[flooder.name()].len();
    assert!(
        kept * (1024 + nixl_core::backend::NOTIF_OVERHEAD) <= 32 << 10,
        "{kept} kept"
    );
    assert_eq!(got[quiet.name()], vec![b"still heard".to_vec()]);
    let dropped = target.dropped_notifs()[flooder.name()];
    assert_eq!(dropped as usize + kept, 1000);
    // Reported once: the next wait is quiet.
    let t = Instant::now();
    assert!(target
        .wait_notifs(Duration::from_millis(200))
        .unwrap()
        .is_empty());
    assert!(t.elapsed() >= Duration::from_millis(200));
}

/// Issue 34, item 5: reading is opt-in too. With `FetchPolicy::LoadedPeers` the victim serves
/// its metadata (the keys to its memory) only to peers it loaded: a member holding an accepted
/// credential but not loaded is refused, typed, and learns nothing; a loaded peer fetches. The
/// default (`Anyone`) serves every accepted member, as before.
#[test]
fn a_fetch_policy_serves_loaded_peers_only() {
    let creds = credentials(&["victim", "loaded", "stranger"]);
    let cfg = |own: &Credential, policy: nixl_core::access::FetchPolicy| {
        (member(&creds, own)).fetch_policy(policy)
    };
    use nixl_core::access::FetchPolicy::{Anyone, LoadedPeers};
    let victim = agent("policy-victim", cfg(&creds[0], LoadedPeers));
    let (_m, _r) = registered(&victim, 4096);
    let loaded = agent("policy-loaded", cfg(&creds[1], Anyone));
    let stranger = agent("policy-stranger", cfg(&creds[2], Anyone));
    let at = victim.listen_addr().unwrap();
    let t = Duration::from_secs(5);
    // The stranger is a member (its PUSH would load) but not loaded: its FETCH is refused.
    let e = stranger
        .fetch_remote_metadata_blocking(victim.name(), at, t)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
    assert!(e.to_string().contains("LoadedPeers"), "{e}");
    assert!(stranger.remotes().is_empty(), "nothing learnt");
    // A peer the victim loaded (it pushed its metadata) fetches.
    loaded.send_local_metadata(at).unwrap();
    assert!(victim.check_remote_metadata(loaded.name(), None));
    assert_eq!(
        loaded
            .fetch_remote_metadata_blocking(victim.name(), at, t)
            .unwrap(),
        victim.name()
    );
    // The default serves every member.
    let open = agent("policy-open", cfg(&creds[0], Anyone));
    assert_eq!(
        stranger
            .fetch_remote_metadata_blocking(open.name(), open.listen_addr().unwrap(), t)
            .unwrap(),
        open.name()
    );
}

/// `AgentConfig::shares` over credentials: a labeled registration's keys go to the peers the
/// share lists, each proven by the credential its name is bound to; another member gets the
/// rest of the metadata only.
#[test]
fn a_share_reaches_the_listed_credential_only() {
    let creds = credentials(&["owner", "decode", "router"]);
    let cfg = |own: &Credential, shares: Vec<nixl_core::access::Share>| {
        (member(&creds, own)).shares(shares)
    };
    let decode = agent("share-decode", cfg(&creds[1], Vec::new()));
    let router = agent("share-router", cfg(&creds[2], Vec::new()));
    let share = nixl_core::access::Share::new("kv", &[decode.name()]);
    let owner = agent("share-owner", cfg(&creds[0], vec![share]));
    let kv = Arc::new(nixl_core::HostBuffer::new(4096).unwrap());
    let _kv = owner.register_mem_labeled("kv", vec![kv], &[]).unwrap();
    let (_open, _r) = registered(&owner, 4096);
    let at = owner.listen_addr().unwrap();
    let t = Duration::from_secs(5);
    for (peer, regions) in [(&decode, 2), (&router, 1)] {
        peer.send_local_metadata(at).unwrap();
        peer.fetch_remote_metadata_blocking(owner.name(), at, t)
            .unwrap();
        assert_eq!(peer.remote_regions(owner.name()).unwrap().len(), regions);
    }
    assert_eq!(
        decode
            .remote_regions_labeled(owner.name(), "kv")
            .unwrap()
            .len(),
        1
    );
    assert!(router
        .remote_regions_labeled(owner.name(), "kv")
        .unwrap()
        .is_empty());
}
