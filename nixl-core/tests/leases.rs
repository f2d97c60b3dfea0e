//! Leases on published blocks (issue 27, part 3), between agents over INPROC's notification
//! path (the UCX run is the facade's `tests/leases_ucx.rs`): a reader that renews, one that
//! releases, one that dies (the target reclaims after expiry), one that reads after expiry
//! (typed `LeaseExpired`, nothing moved), and peers that lie or flood.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::leases::{LeaseId, LeaseState, ManualClock};
use nixl_core::{
    Agent, AgentConfig, Desc, ErrorKind, HostBuffer, InprocParams, MemKind, Registration,
    XferDescList, XferOp, XferOptions, XferReq,
};

const LEN: usize = 1 << 14;
const ASK: Duration = Duration::from_secs(10);
/// How far past a configured time (a lease's duration, a deadline) a test lets it be seen:
/// the target's state is polled every 5 ms, on a shared 2-core machine.
const SLACK: Duration = Duration::from_millis(500);

struct Pair {
    target: Agent,
    reader: Agent,
    src: Arc<HostBuffer>,
    dst: Arc<HostBuffer>,
    _regs: (Registration, Registration),
}

fn pair(tag: &str) -> Pair {
    pair_on(tag, None)
}

/// Two agents whose lease times come from `clock` (real time without one).
fn pair_on(tag: &str, clock: Option<Arc<ManualClock>>) -> Pair {
    let pid = std::process::id();
    let config = || {
        let mut c = AgentConfig::default();
        c.clock = clock
            .clone()
            .map(|c| c as Arc<dyn nixl_core::leases::Clock>);
        c
    };
    let mk = |n: &str| {
        let a = Agent::new(&format!("{tag}-{n}-{pid}"), config()).unwrap();
        a.create_backend(InprocParams::default()).unwrap();
        a
    };
    let (target, reader) = (mk("prefill"), mk("decode"));
    let src = Arc::new(HostBuffer::new(LEN).unwrap());
    let dst = Arc::new(HostBuffer::new(LEN).unwrap());
    src.fill(0x42);
    dst.fill(0);
    let rt = target.register_mem(vec![src.clone()], &[]).unwrap();
    let rr = reader.register_mem(vec![dst.clone()], &[]).unwrap();
    target
        .load_remote_metadata(&reader.local_metadata().unwrap())
        .unwrap();
    reader
        .load_remote_metadata(&target.local_metadata().unwrap())
        .unwrap();
    Pair {
        target,
        reader,
        src,
        dst,
        _regs: (rt, rr),
    }
}

fn read(p: &Pair, lease: Option<LeaseId>) -> nixl_core::Result<XferReq> {
    let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(p.dst.addr(), LEN as u64)]);
    let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(p.src.addr(), LEN as u64)]);
    p.reader.create_xfer_req(
        XferOp::Read,
        &l,
        &r,
        p.target.name(),
        XferOptions::default().lease(lease),
    )
}

fn moved(p: &Pair) -> bool {
    p.dst.to_vec().iter().all(|&b| b == 0x42)
}

/// Polls the target's view until `f` holds (the target learns from control messages).
fn eventually(p: &Pair, id: LeaseId, f: impl Fn(LeaseState) -> bool) -> LeaseState {
    let end = Instant::now() + ASK;
    loop {
        let s = p.target.lease_state(id).unwrap();
        if f(s) || Instant::now() > end {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// On a manual clock (no sleeps): renewed every third of its duration, a lease is held for
/// four durations; released, the next post is refused.
#[test]
fn a_reader_that_renews_keeps_reading_past_the_first_duration() {
    let clock = ManualClock::new();
    let p = pair_on("renew", Some(clock.clone()));
    let ttl = Duration::from_millis(300);
    let id = p.target.publish_lease(&[p.reader.name()], ttl).unwrap();
    assert_eq!(
        p.target.lease_state(id).unwrap(),
        LeaseState::Active {
            holding: 0,
            pending: 1
        }
    );
    p.reader.acquire_lease(p.target.name(), id, ASK).unwrap();
    let req = read(&p, Some(id)).unwrap();
    for _ in 0..12 {
        clock.advance(ttl / 3);
        p.reader.renew_lease(p.target.name(), id, ASK).unwrap();
        p.reader.post_xfer_req(&req).unwrap();
        req.wait(ASK).unwrap();
    }
    assert!(moved(&p));
    assert_eq!(
        p.target.lease_state(id).unwrap(),
        LeaseState::Active {
            holding: 1,
            pending: 0
        }
    );
    p.reader.release_lease(p.target.name(), id).unwrap();
    let s = eventually(&p, id, |s| matches!(s, LeaseState::Done { .. }));
    assert_eq!(
        s,
        LeaseState::Done {
            released: 1,
            expired: 0
        }
    );
    // Released: the next post is refused and moves nothing.
    p.dst.fill(0);
    let e = p.reader.post_xfer_req(&req).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LeaseExpired, "{e}");
    assert!(!moved(&p));
    // And a renewal after release is denied.
    assert_eq!(
        p.reader
            .renew_lease(p.target.name(), id, ASK)
            .unwrap_err()
            .kind(),
        ErrorKind::LeaseExpired
    );
}

#[test]
fn a_reader_that_releases_frees_the_blocks_at_once() {
    let p = pair("release");
    let id = p
        .target
        .publish_lease(&[p.reader.name()], Duration::from_secs(60))
        .unwrap();
    p.reader.acquire_lease(p.target.name(), id, ASK).unwrap();
    let req = read(&p, Some(id)).unwrap();
    p.reader.post_xfer_req(&req).unwrap();
    req.wait(ASK).unwrap();
    assert!(moved(&p));
    let t = Instant::now();
    p.reader.release_lease(p.target.name(), id).unwrap();
    let s = eventually(&p, id, |s| matches!(s, LeaseState::Done { .. }));
    assert_eq!(
        s,
        LeaseState::Done {
            released: 1,
            expired: 0
        }
    );
    // Long before the 60 s lease would have run out.
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// On a manual clock: a reader that dies holding its grant is reclaimed exactly at its
/// expiry (held 1 ms before, done at it), not before and with no slack.
#[test]
fn a_reader_that_dies_is_reclaimed_after_expiry() {
    let clock = ManualClock::new();
    let p = pair_on("dies", Some(clock.clone()));
    let ttl = Duration::from_millis(200);
    let other = Agent::new(
        &format!("dies-other-{}", std::process::id()),
        AgentConfig::default().clock(clock.clone()),
    )
    .unwrap();
    other.create_backend(InprocParams::default()).unwrap();
    other
        .load_remote_metadata(&p.target.local_metadata().unwrap())
        .unwrap();
    p.target
        .load_remote_metadata(&other.local_metadata().unwrap())
        .unwrap();
    let id = p
        .target
        .publish_lease(&[p.reader.name(), other.name()], ttl)
        .unwrap();
    p.reader.acquire_lease(p.target.name(), id, ASK).unwrap();
    // The grant to `other` is made at 10 ms on the lease clock: its hold ends `ttl` after.
    clock.advance(Duration::from_millis(10));
    other.acquire_lease(p.target.name(), id, ASK).unwrap();
    // One reader releases; the other dies holding its grant.
    p.reader.release_lease(p.target.name(), id).unwrap();
    drop(other);
    let s = eventually(&p, id, |s| {
        matches!(s, LeaseState::Active { holding: 1, .. })
    });
    assert_eq!(
        s,
        LeaseState::Active {
            holding: 1,
            pending: 0
        }
    );
    // 1 ms before the dead reader's grant runs out it still holds; at it, the lease is done.
    clock.advance(ttl - Duration::from_millis(1));
    assert_eq!(
        p.target.lease_state(id).unwrap(),
        LeaseState::Active {
            holding: 1,
            pending: 0
        }
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        p.target.lease_state(id).unwrap(),
        LeaseState::Done {
            released: 1,
            expired: 1
        }
    );
    // The blocks are the target's again: it forgets the lease and reuses them; the
    // releasing reader's requests under it are refused, nothing moved.
    p.target.forget_lease(id);
    p.src.fill(0x99);
    assert_eq!(
        read(&p, Some(id)).unwrap_err().kind(),
        ErrorKind::LeaseExpired
    );
    assert!(p.dst.to_vec().iter().all(|&b| b != 0x99));
}

/// On a manual clock: a post at the reader's deadline is refused, nothing moved.
#[test]
fn a_read_after_expiry_is_refused_and_moves_nothing() {
    let clock = ManualClock::new();
    let p = pair_on("late", Some(clock.clone()));
    let ttl = Duration::from_millis(100);
    let id = p.target.publish_lease(&[p.reader.name()], ttl).unwrap();
    p.reader.acquire_lease(p.target.name(), id, ASK).unwrap();
    let req = read(&p, Some(id)).unwrap();
    clock.advance(ttl);
    let e = p.reader.post_xfer_req(&req).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LeaseExpired, "{e}");
    assert!(e.to_string().contains(p.target.name()), "{e}");
    assert!(!moved(&p), "nothing moved");
    // A new request with it is refused when made.
    assert_eq!(
        read(&p, Some(id)).unwrap_err().kind(),
        ErrorKind::LeaseExpired
    );
    // The target counts it expired.
    assert_eq!(
        eventually(&p, id, |s| matches!(s, LeaseState::Done { .. })),
        LeaseState::Done {
            released: 0,
            expired: 1
        }
    );
    // A renewal after expiry is refused. Acquiring a lease never published, or published to
    // another agent, gets no answer at all (issue 34: answers to unknown ids only fed a
    // flood): the acquire ends by its deadline, typed.
    assert_eq!(
        p.reader
            .renew_lease(p.target.name(), id, ASK)
            .unwrap_err()
            .kind(),
        ErrorKind::LeaseExpired
    );
    let short = Duration::from_millis(300);
    assert_eq!(
        p.reader
            .acquire_lease(p.target.name(), LeaseId(12345), short)
            .unwrap_err()
            .kind(),
        ErrorKind::TimedOut
    );
    let theirs = p
        .target
        .publish_lease(&["someone-else"], Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        p.reader
            .acquire_lease(p.target.name(), theirs, short)
            .unwrap_err()
            .kind(),
        ErrorKind::TimedOut
    );
    // A request never given a lease it holds is refused too.
    assert_eq!(
        read(&p, Some(theirs)).unwrap_err().kind(),
        ErrorKind::LeaseExpired
    );
}

#[test]
fn lease_messages_stay_off_the_notifications_and_garbage_is_dropped() {
    let p = pair("noise");
    // Malformed control messages, a flood of them, and an unsolicited grant.
    let mut junk: Vec<Vec<u8>> = vec![
        b"\0nixl-rs/lease\0".to_vec(),
        b"\0nixl-rs/lease\0\x02short".to_vec(),
    ];
    let mut grant = b"\0nixl-rs/lease\0".to_vec();
    grant.push(2);
    grant.extend_from_slice(&7u64.to_le_bytes());
    grant.extend_from_slice(&u64::MAX.to_le_bytes());
    junk.push(grant);
    for _ in 0..2000 {
        for j in &junk {
            p.target.gen_notif_raw(p.reader.name(), j).unwrap();
        }
    }
    p.target.gen_notif(p.reader.name(), b"plain", &[]).unwrap();
    let n = p.reader.wait_notifs(Duration::from_secs(5)).unwrap();
    assert_eq!(n.get(p.target.name()), Some(&vec![b"plain".to_vec()]));
    // The unsolicited grant gave the reader nothing.
    assert_eq!(
        read(&p, Some(LeaseId(7))).unwrap_err().kind(),
        ErrorKind::LeaseExpired
    );
    // Still answering afterwards.
    let id = p
        .target
        .publish_lease(&[p.reader.name()], Duration::from_secs(5))
        .unwrap();
    p.reader.acquire_lease(p.target.name(), id, ASK).unwrap();
    // Bad parameters are typed.
    for bad in [
        p.target.publish_lease(&[], Duration::from_secs(1)),
        p.target.publish_lease(&["x"], Duration::ZERO),
    ] {
        assert_eq!(bad.unwrap_err().kind(), ErrorKind::InvalidParam);
    }
    assert_eq!(
        p.target.lease_state(LeaseId(99)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn an_owner_that_does_not_answer_times_the_acquire_out() {
    let p = pair("mute");
    // The target forgets the reader: its answer cannot be sent.
    let id = p
        .target
        .publish_lease(&[p.reader.name()], Duration::from_secs(5))
        .unwrap();
    p.target
        .invalidate_remote_metadata(p.reader.name())
        .unwrap();
    let wait = Duration::from_millis(300);
    let t = Instant::now();
    let e = p
        .reader
        .acquire_lease(p.target.name(), id, wait)
        .unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    // At its deadline: not before, and within a stated slack of 500 ms.
    assert!(
        took >= wait && took < wait + SLACK,
        "the acquire timed out after {took:?} (deadline {wait:?})"
    );
}

/// Issue 36: a lease as a value. The acquire and the owner's end are futures (one
/// current-thread runtime drives both sides: nothing blocks it); `held()` and `remaining()`
/// say where the lease stands; dropping it releases the blocks at once (the owner's end
/// resolves `Done { released: 1 }`), and a request made with it is refused from then on.
#[tokio::test(flavor = "current_thread")]
async fn a_lease_value_releases_on_drop_and_its_end_is_a_future() {
    let p = pair("value");
    let ttl = Duration::from_secs(60);
    let id = p.target.publish_lease(&[p.reader.name()], ttl).unwrap();
    let end = p.target.lease_end(id);
    let lease = p
        .reader
        .lease_async(p.target.name(), id, ASK)
        .await
        .unwrap();
    assert!(lease.held());
    assert_eq!((lease.id(), lease.owner()), (id, p.target.name()));
    let left = lease.remaining().expect("held");
    assert!(left <= ttl && left > ttl - ASK, "{left:?}");
    let req = read(&p, Some(lease.id())).unwrap();
    p.reader.post_xfer_req(&req).unwrap();
    req.completion().await.unwrap();
    assert!(moved(&p));
    lease.renewal(ASK).await.unwrap();
    assert!(lease.held());
    drop(lease);
    let s = tokio::time::timeout(ASK, end)
        .await
        .expect("the lease's end")
        .unwrap();
    assert_eq!(
        s,
        LeaseState::Done {
            released: 1,
            expired: 0
        }
    );
    assert_eq!(
        read(&p, Some(id)).unwrap_err().kind(),
        ErrorKind::LeaseExpired
    );
    // The blocking form: the same value, released by `release()`.
    let id = p.target.publish_lease(&[p.reader.name()], ttl).unwrap();
    let lease = p.reader.lease(p.target.name(), id, ASK).unwrap();
    lease.release().unwrap();
    let s = eventually(&p, id, |s| matches!(s, LeaseState::Done { .. }));
    assert_eq!(
        s,
        LeaseState::Done {
            released: 1,
            expired: 0
        }
    );
}

/// The owner's end of a lease nobody acquires resolves at its duration (woken by the timer,
/// not a poll loop: slack 500 ms); an acquire the owner never answers (a lease it does not
/// know) ends `TimedOut` at its deadline (slack 500 ms).
/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// On a manual clock, a lease's end is a future woken by the clock's moves: pending while the
/// clock stands before the duration (however long real time runs), woken by the move that
/// reaches it, then done.
#[test]
fn a_leases_end_follows_a_manual_clock() {
    use std::future::Future;
    use std::sync::atomic::Ordering;
    use std::task::{Context, Poll};
    let clock = ManualClock::new();
    let p = pair_on("manual-end", Some(clock.clone()));
    let ttl = Duration::from_secs(3600);
    let id = p.target.publish_lease(&[p.reader.name()], ttl).unwrap();
    let wakes = Arc::new(Wakes(0.into()));
    let waker = std::task::Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut end = Box::pin(p.target.lease_end(id));
    assert!(end.as_mut().poll(&mut cx).is_pending());
    // Most of the hour on the clock: woken, still pending.
    clock.advance(ttl - Duration::from_secs(1));
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        1,
        "the move woke the future"
    );
    assert!(end.as_mut().poll(&mut cx).is_pending());
    // 50 ms of real time change nothing.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        1,
        "real time does not wake it"
    );
    // The last second: woken, and done.
    clock.advance(Duration::from_secs(1));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
    match end.as_mut().poll(&mut cx) {
        Poll::Ready(s) => assert_eq!(
            s.unwrap(),
            LeaseState::Done {
                released: 0,
                expired: 1
            }
        ),
        Poll::Pending => panic!("the lease's end is pending with the clock past its duration"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_leases_end_and_an_unanswered_acquire_come_at_their_times() {
    let p = pair("times");
    let ttl = Duration::from_millis(300);
    let slack = Duration::from_millis(500);
    let id = p.target.publish_lease(&[p.reader.name()], ttl).unwrap();
    let t = Instant::now();
    let s = tokio::time::timeout(ttl + slack, p.target.lease_end(id))
        .await
        .expect("ended by its duration")
        .unwrap();
    assert!(t.elapsed() >= ttl, "{:?}", t.elapsed());
    assert_eq!(
        s,
        LeaseState::Done {
            released: 0,
            expired: 1
        }
    );
    let wait = Duration::from_millis(300);
    let t = Instant::now();
    let e = p
        .reader
        .lease_async(p.target.name(), LeaseId(0xdead), wait)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(
        t.elapsed() >= wait && t.elapsed() < wait + slack,
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        p.target
            .lease_end(LeaseId(0xbeef))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
}

/// Issue 36: the blocks a lease covers travel with it. The owner publishes a lease on two
/// of its four 4 KiB blocks; the reader's grant carries them (`Lease::blocks`, merged where
/// they touch), a READ of them with the lease moves the owner's bytes, and a READ with the
/// lease that reaches a block outside them is refused at make, typed, nothing moved. Bad
/// block lists are refused at publish and publish nothing.
#[test]
fn a_lease_carries_its_blocks_and_requests_stay_inside_them() {
    let p = pair("lease-blocks");
    let blk = (LEN / 4) as u64;
    let at = |i: u64| Desc::new(p.src.addr() + i * blk, blk);
    let id = p
        .target
        .publish_lease_blocks(&[p.reader.name()], Duration::from_secs(30), &[at(2), at(1)])
        .unwrap();
    let lease = p.reader.lease(p.target.name(), id, ASK).unwrap();
    assert_eq!(
        lease.blocks(),
        [Desc::new(p.src.addr() + blk, 2 * blk)],
        "the grant carries the covered blocks, merged"
    );
    let with = XferOptions::default().lease(id);
    let req = |remote: Desc| {
        p.reader.create_xfer_req(
            XferOp::Read,
            &XferDescList::from_descs(MemKind::Dram, [Desc::new(p.dst.addr(), remote.len)]),
            &XferDescList::from_descs(MemKind::Dram, [remote]),
            p.target.name(),
            with.clone(),
        )
    };
    // Inside: blocks 1 and 2 in one descriptor.
    let r = req(Desc::new(p.src.addr() + blk, 2 * blk)).unwrap();
    p.reader.post_xfer_req(&r).unwrap();
    r.wait(ASK).unwrap();
    let mut got = vec![0u8; 2 * blk as usize];
    p.dst.read_at(0, &mut got);
    assert!(got.iter().all(|&b| b == 0x42));
    // Outside: block 3, and blocks 2-3 across the end.
    p.dst.fill(0);
    for outside in [at(3), Desc::new(p.src.addr() + 2 * blk, 2 * blk)] {
        let e = req(outside).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
        assert!(e.to_string().contains("outside the blocks"), "{e}");
    }
    // Without the lease the same READ is the owner's ordinary access (not the lease's).
    assert!(p
        .reader
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::from_descs(MemKind::Dram, [Desc::new(p.dst.addr(), blk)]),
            &XferDescList::from_descs(MemKind::Dram, [at(3)]),
            p.target.name(),
            XferOptions::default(),
        )
        .is_ok());
    // Bad block lists: too many, empty, outside every registration.
    let many = vec![at(0); nixl_core::leases::MAX_LEASE_BLOCKS + 1];
    let outside_regs = Desc::new(p.src.addr() + LEN as u64, blk);
    for bad in [many, vec![Desc::new(p.src.addr(), 0)], vec![outside_regs]] {
        let e = p
            .target
            .publish_lease_blocks(&[p.reader.name()], Duration::from_secs(1), &bad)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    }
    // A lease on no blocks covers what the owner lets the reader reach, as before.
    let open = p
        .target
        .publish_lease(&[p.reader.name()], Duration::from_secs(30))
        .unwrap();
    let l2 = p.reader.lease(p.target.name(), open, ASK).unwrap();
    assert!(l2.blocks().is_empty());
    let r = p
        .reader
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::from_descs(MemKind::Dram, [Desc::new(p.dst.addr(), blk)]),
            &XferDescList::from_descs(MemKind::Dram, [at(3)]),
            p.target.name(),
            XferOptions::default().lease(open),
        )
        .unwrap();
    p.reader.post_xfer_req(&r).unwrap();
    r.wait(ASK).unwrap();
    drop((lease, l2));
}

/// Lease control messages start with a reserved prefix the receiving agent takes for its own:
/// an application's notification that starts with it is refused at every way in (it would
/// vanish on the peer), and nothing reaches the peer.
#[test]
fn the_reserved_notification_prefix_is_refused_typed() {
    let p = pair("reserved");
    let mut msg = nixl_core::leases::RESERVED_NOTIF_PREFIX.to_vec();
    msg.extend_from_slice(b"mine");
    let e = p.reader.gen_notif(p.target.name(), &msg, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    let opts = XferOptions::default().notif(msg.clone());
    let l = XferDescList::from_descs(MemKind::Dram, [Desc::new(p.dst.addr(), 64)]);
    let r = XferDescList::from_descs(MemKind::Dram, [Desc::new(p.src.addr(), 64)]);
    let e = p
        .reader
        .create_xfer_req(XferOp::Read, &l, &r, p.target.name(), opts)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    let req = read(&p, None).unwrap();
    let e = req.set_notif(Some(msg)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    // The prefix inside a message (not at its start) is the application's.
    let ok = b"x\0nixl-rs/lease\0".to_vec();
    p.reader.gen_notif(p.target.name(), &ok, &[]).unwrap();
    let end = Instant::now() + ASK;
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < end {
        got = p
            .target
            .wait_notifs(Duration::from_millis(50))
            .unwrap()
            .remove(p.reader.name())
            .unwrap_or_default();
    }
    assert_eq!(got, [ok]);
}
