//! Nothing lost in silence (issue 28): every read of notifications reports the drops since the
//! last read, whatever else is queued; a flood of hellos never evicts the sessions of live
//! connections.

mod common;

use std::time::Duration;

use common::agent_with;
use nixl_core::hello::{Hello, Sessions, SESSION_LEN};
use nixl_core::{AgentConfig, Error};

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
