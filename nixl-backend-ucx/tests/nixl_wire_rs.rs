//! NIXL's wire between two nixl-rs agents (no NIXL needed, the project's own UCX): metadata as
//! NIXL blobs, transfers and notifications in NIXL's format, the NIXLCOMM listener and client,
//! and hostile side-channel input that must change nothing.

use nixl_testkit::ucx as common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nixl_core::nixl_wire::comm::{encode_command, write_frame, Command};
use nixl_core::nixl_wire::{NixlListener, Wire};
use nixl_core::{Agent, AgentConfig, Error, MemKind, XferDescList, XferOp, XferOptions};

const LEN: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);

fn agent(role: &str) -> Agent {
    let a = Agent::new(
        &common::unique(role),
        AgentConfig::default().default_timeout(WAIT),
    )
    .expect("agent");
    a.create_backend(common::params(common::TCP).nixl_compat(true))
        .expect("UCX");
    a
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_nixl_rs_agents_over_nixls_wire() {
    if !common::ucx_or_skip("two_nixl_rs_agents_over_nixls_wire") {
        return;
    }
    let (a, b) = (agent("a"), agent("b"));
    let (src, dst) = (common::buf(LEN), common::buf(LEN));
    src.fill_pattern(3);
    dst.fill(0);
    let _ra = a.register_mem(vec![src.clone()], &[]).expect("register");
    let _rb = b.register_mem(vec![dst.clone()], &[]).expect("register");
    let blob = b.nixl().local_metadata().expect("NIXL blob");
    assert!(blob.starts_with(b"nixlSerDes|Agent"));
    assert_eq!(a.load_remote_metadata(&blob).expect("load"), b.name());
    assert_eq!(a.peer_wire(b.name()), Some(Wire::Nixl));
    // Loading the same blob again is an append of nothing.
    a.load_remote_metadata(&blob).expect("reload");
    let d = |addr| XferDescList::blocks(MemKind::Dram, addr, LEN as u64, 1);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &d(src.addr()),
            &d(dst.addr()),
            b.name(),
            XferOptions::with_notif(b"nixl-notif".to_vec()),
        )
        .expect("request");
    a.post_xfer_req(&req).expect("post");
    req.wait(WAIT).expect("write");
    let n = b.wait_notifs(WAIT).expect("notif");
    assert_eq!(n[a.name()], vec![b"nixl-notif".to_vec()]);
    assert!(dst.to_vec() == src.to_vec());
    a.gen_notif(b.name(), b"", &[])
        .expect("empty standalone notification");
    eventually("empty notification", || {
        b.get_notifs()
            .expect("notifs")
            .get(a.name())
            .is_some_and(|v| v == &vec![Vec::<u8>::new()])
    });
    // A partial blob without connection info appends to the loaded incarnation.
    let more = common::buf(LEN);
    let reg = b.register_mem(vec![more.clone()], &[]).expect("register");
    let regs = [&reg];
    let partial = b
        .nixl()
        .local_partial_metadata(&nixl_core::MetadataSelection {
            registrations: Some(&regs),
            include_conn: false,
        })
        .expect("partial");
    let generation = a.remote_generation(b.name());
    a.load_remote_metadata(&partial).expect("append");
    assert_eq!(a.remote_generation(b.name()), generation);
    assert!(a.check_remote_metadata(b.name(), Some(&d(more.addr()))));
    // The same partial blob into an agent that never saw b: connection info first.
    let c = agent("c");
    let e = c
        .load_remote_metadata(&partial)
        .expect_err("no connection info yet");
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(c.remotes().is_empty());
}

#[test]
fn nixlcomm_between_nixl_rs_agents_and_hostile_frames() {
    if !common::ucx_or_skip("nixlcomm_between_nixl_rs_agents_and_hostile_frames") {
        return;
    }
    let (a, b) = (agent("srv"), agent("cli"));
    let buf = common::buf(LEN);
    let _r = a.register_mem(vec![buf.clone()], &[]).expect("register");
    let l = NixlListener::start(&a, SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen");
    let addr = l.local_addr();
    assert_eq!(
        b.nixl()
            .fetch_remote_metadata_blocking(a.name(), addr, WAIT)
            .expect("fetch"),
        a.name()
    );
    b.nixl().send_local_metadata(addr).expect("send");
    eventually("LOAD", || a.remotes().contains(&b.name().to_owned()));

    // Hostile input: an unknown verb, a huge length, garbage after a valid frame, a LOAD of
    // bytes that are not metadata. Each ends that connection (or is refused) and changes
    // nothing; the listener keeps serving.
    let before = a.remotes();
    let mut s = TcpStream::connect(addr).expect("connect");
    write_frame(&mut s, b"NIXLCOMM:BOOMxyz").expect("write");
    let mut one = [0u8; 1];
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    assert_eq!(s.read(&mut one).unwrap_or(0), 0, "connection closed");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(&u64::MAX.to_le_bytes()).expect("write");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    assert_eq!(s.read(&mut one).unwrap_or(0), 0, "connection closed");
    let mut s = TcpStream::connect(addr).expect("connect");
    let load = encode_command(&Command::Load(b"nixlSerDes|garbage".to_vec())).expect("encode");
    write_frame(&mut s, &load).expect("write");
    let inval = encode_command(&Command::Invalidate("nobody".into())).expect("encode");
    write_frame(&mut s, &inval).expect("write");
    drop(s);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.remotes(), before, "nothing changed");
    // An INVL naming a nixl-rs peer (loaded natively) is ignored: unauthenticated.
    let d = agent("native");
    a.load_remote_metadata(&d.local_metadata().expect("md"))
        .expect("native load");
    let mut s = TcpStream::connect(addr).expect("connect");
    let inval = encode_command(&Command::Invalidate(d.name().into())).expect("encode");
    write_frame(&mut s, &inval).expect("write");
    drop(s);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        a.remotes().contains(&d.name().to_owned()),
        "a native peer stays"
    );
    // Still serving; then the client's own INVL removes it.
    assert_eq!(
        b.nixl()
            .fetch_remote_metadata_blocking(a.name(), addr, WAIT)
            .expect("fetch"),
        a.name()
    );
    b.nixl().invalidate_local_metadata(addr).expect("INVL");
    eventually("INVL", || !a.remotes().contains(&b.name().to_owned()));
    // Dropping the listener closes the port.
    drop(l);
    let e = b
        .nixl()
        .fetch_remote_metadata_blocking(a.name(), addr, Duration::from_secs(2));
    assert!(e.is_err());
}

/// NIXL's side channel under the side channel's rules (issue 23): it has no authentication,
/// so a listener on a non-loopback address refuses to start unless the agent opted out by
/// name; a frame that trickles in is cut off by one deadline for the whole frame (before: each
/// read reset a 5 s timeout, so a byte every 4 s held a connection forever); at the
/// connection limit the longest-idle connection is evicted, so idle clients lock nobody out
/// (before: every new connection was closed).
#[test]
fn nixl_listener_keeps_the_side_channel_rules() {
    if !common::ucx_or_skip("nixl_listener_keeps_the_side_channel_rules") {
        return;
    }
    let a = agent("rules");
    let e = NixlListener::start(&a, SocketAddr::from(([0, 0, 0, 0], 0)))
        .expect_err("an unauthenticated listener on every interface");
    assert!(matches!(e, Error::NotAllowed { .. }), "{e}");
    let open = Agent::new(
        &common::unique("open"),
        common::config(false).allow_unauthenticated_listener(true),
    )
    .expect("agent");
    drop(NixlListener::start(&open, SocketAddr::from(([0, 0, 0, 0], 0))).expect("opted out"));

    let l = NixlListener::start(&a, SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen");
    let addr = l.local_addr();
    // A trickling frame: a header announcing 100 bytes, then a byte every second.
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(&100u64.to_le_bytes()).expect("header");
    let mut closed = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_secs(1));
        if s.write_all(b"x").is_err() {
            closed = Some(t.elapsed());
            break;
        }
        let mut one = [0u8; 1];
        s.set_read_timeout(Some(Duration::from_millis(10)))
            .expect("timeout");
        if matches!(s.read(&mut one), Ok(0)) {
            closed = Some(t.elapsed());
            break;
        }
    }
    let closed = closed.expect("a trickling frame was never cut off");
    assert!(closed < Duration::from_secs(9), "cut off after {closed:?}");
    // More idle connections than the limit: a fetch still gets through.
    let idle: Vec<TcpStream> = (0..NixlListener::MAX_CONNECTIONS + 8)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let b = agent("after-idle");
    assert_eq!(
        b.nixl()
            .fetch_remote_metadata_blocking(a.name(), addr, WAIT)
            .expect("a fetch past idle connections"),
        a.name()
    );
    drop(idle);
}
