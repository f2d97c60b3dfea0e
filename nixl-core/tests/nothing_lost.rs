//! Nothing lost in silence (issue 28): every read of notifications reports the drops since the
//! last read, whatever else is queued; a flood of hellos never evicts the sessions of live
//! connections.

use std::time::Duration;

use nixl_core::backend::hello::{Hello, Sessions, SESSION_LEN};
use nixl_core::{AgentConfig, Error};
use nixl_testkit::inproc_agent_with as agent_with;

fn small_queue() -> AgentConfig {
    let mut cfg = AgentConfig::default();
    cfg.limits.max_queued_notif_bytes = 16 << 10;
    cfg.limits.max_queued_notif_bytes_per_sender = 16 << 10;
    cfg
}

/// Under sustained traffic the queue is never empty when the receiver reads, and drops used to
/// be reported only by a `wait_notifs` that found nothing else queued (never, here), and never
/// by `get_notifs`. Now the first read after a drop reports it, with the queued messages kept
/// for the next read.
#[test]
fn drops_are_reported_by_the_next_read_whatever_else_is_queued() {
    let rx = agent_with("nl-rx", small_queue());
    let tx = agent_with("nl-tx", AgentConfig::default());
    tx.load_remote_metadata(&rx.local_metadata().unwrap())
        .unwrap();
    let msg = vec![7u8; 1024];
    // Overfill the queue: some of these are dropped.
    for _ in 0..64 {
        tx.gen_notif(rx.name(), &msg, &[]).unwrap();
    }
    // get_notifs: the drops first, the queued messages kept.
    let e = rx.get_notifs().expect_err("the drops are reported");
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    assert!(e.to_string().contains(tx.name()), "{e}");
    let n = rx.get_notifs().expect("then the messages");
    let got = n.get(tx.name()).map_or(0, Vec::len);
    assert!(got > 0, "the queued messages survive the report");
    let dropped = rx.dropped_notifs()[tx.name()];
    assert_eq!(
        got as u64 + dropped,
        64,
        "{got} received + {dropped} dropped"
    );
    // Sustained traffic: something is always queued when wait_notifs looks; a new drop is
    // still reported by the next read.
    for _ in 0..64 {
        tx.gen_notif(rx.name(), &msg, &[]).unwrap();
    }
    let e = rx
        .wait_notifs(Duration::from_secs(5))
        .expect_err("reported while messages are queued");
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    assert!(!rx.get_notifs().unwrap().is_empty());
    // Nothing new dropped: reads are quiet again.
    tx.gen_notif(rx.name(), b"last", &[]).unwrap();
    assert_eq!(
        rx.wait_notifs(Duration::from_secs(5)).unwrap()[tx.name()],
        vec![b"last".to_vec()]
    );
}

fn hello(sender: &str, id: u8, n: u32) -> Hello {
    let mut session = [0u8; SESSION_LEN];
    session[0] = id;
    session[1..5].copy_from_slice(&n.to_le_bytes());
    Hello {
        sender: sender.to_owned(),
        generation: 1,
        session,
        authenticated: false,
        key: None,
    }
}

/// A flood of hellos from strangers (more than the table holds) does not evict an honest
/// peer's session, so its later notifications are still attributed (before: the oldest
/// sessions were forgotten, the honest one first, and its notifications dropped); the
/// newcomers past the capacity are refused, typed.
#[test]
fn a_hello_flood_never_evicts_live_sessions() {
    let t = Sessions::with_capacity(1024);
    let honest = hello("honest", 1, 0);
    t.accept(&honest, 7).expect("room");
    let mut refused = 0;
    for i in 0..4096u32 {
        if t.accept(&hello(&format!("stranger-{i}"), 2, i), 1000 + u64::from(i))
            .is_err()
        {
            refused += 1;
        }
    }
    assert_eq!(t.sender(&honest.session, 7).as_deref(), Some("honest"));
    assert_eq!(
        refused,
        4096 - 1023,
        "newcomers past the capacity are refused"
    );
    // A peer that reconnects replaces its own older sessions, not anyone else's.
    for i in 0..100u32 {
        t.accept(&hello("honest", 3, i), 8)
            .expect("its own sessions make room");
    }
    assert_eq!(t.len(), 1024);
}

/// Integrity frames are hashed only where the receiver asked for them and within its budget
/// (issue 28): a receiver that never asked refuses even a frame whose hash is right (before:
/// any notification starting with the frame's magic made it hash the regions named, seconds
/// for a large pool, inside `get_notifs`); one that asked hashes at most
/// `Limits::max_integrity_bytes` per frame; and a sender cannot ask for integrity from a peer
/// that does not verify it.
#[test]
fn integrity_frames_are_hashed_only_where_asked_and_within_budget() {
    let len = 256usize << 10;
    let sender = nixl_testkit::inproc_agent("int-sender");
    let plain = nixl_testkit::inproc_agent("int-plain");
    let mut cfg = AgentConfig::default().verify_integrity(true);
    cfg.limits.max_integrity_bytes = 64 << 10;
    let verifier = agent_with("int-verifier", cfg);
    let frame_over = |buf: &nixl_core::HostBuffer, n: usize| {
        let bytes = buf.to_vec()[..n].to_vec();
        nixl_core::wire::integrity::Frame {
            hash: xxhash_rust::xxh3::xxh3_64(&bytes),
            ranges: vec![(0, buf.addr(), n as u64)],
            msg: format!("{} bytes", n).into_bytes(),
        }
        .encode()
    };
    let (pb, _r1) = nixl_testkit::registered(&plain, len);
    let (vb, _r2) = nixl_testkit::registered(&verifier, len);
    for rx in [&plain, &verifier] {
        sender
            .load_remote_metadata(&rx.local_metadata().unwrap())
            .unwrap();
    }
    pb.fill_pattern(1);
    vb.fill_pattern(2);
    // The plain receiver never asked: a correct frame is refused, unread.
    sender
        .gen_notif(plain.name(), &frame_over(&pb, 32 << 10), &[])
        .unwrap();
    let e = plain.wait_notifs(Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // The verifier: within its budget a correct frame is delivered, past it refused.
    sender
        .gen_notif(verifier.name(), &frame_over(&vb, 32 << 10), &[])
        .unwrap();
    let n = verifier.wait_notifs(Duration::from_secs(5)).unwrap();
    assert_eq!(n[sender.name()], vec![b"32768 bytes".to_vec()]);
    sender
        .gen_notif(verifier.name(), &frame_over(&vb, len), &[])
        .unwrap();
    let e = verifier.wait_notifs(Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "over the budget: {e}");
    // Asking a peer that does not verify is refused at make time.
    let (sb, _r3) = nixl_testkit::registered(&sender, 4096);
    let opts = nixl_core::XferOptions::default().integrity(true);
    let list = |a: u64| nixl_core::XferDescList::blocks(nixl_core::MemKind::Dram, a, 4096, 1);
    let e = sender
        .create_xfer_req(
            nixl_core::XferOp::Write,
            &list(sb.addr()),
            &list(pb.addr()),
            plain.name(),
            opts.clone(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }), "{e}");
    assert!(sender
        .create_xfer_req(
            nixl_core::XferOp::Write,
            &list(sb.addr()),
            &list(vb.addr()),
            verifier.name(),
            opts,
        )
        .is_ok());
}
