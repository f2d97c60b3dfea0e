//! Restarted peers, cancel, deadlines, telemetry and fault injection.

use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::fault::{FaultEvent, FaultLog, FaultParams, FaultPlan};
use nixl_core::backend::inproc::Completion;
use nixl_core::{
    Agent, AgentConfig, Error, InprocParams, MemKind, XferDescList, XferOp, XferOptions, XferState,
    XferTarget,
};
use nixl_testkit::{inproc_agent as agent, inproc_agent_with as agent_with, registered, unique};

fn faulty(prefix: &str, plan: FaultPlan) -> (Agent, Arc<FaultLog>) {
    let a = Agent::new(&unique(prefix), AgentConfig::default()).unwrap();
    let log = FaultLog::new();
    a.create_backend(FaultParams::new(InprocParams::default(), plan, log.clone()))
        .unwrap();
    (a, log)
}

#[test]
fn restarted_peer_fails_old_requests_and_new_ones_work() {
    let a = agent("rs-a");
    let (sa, _ra) = registered(&a, 4096);
    let name = unique("rs-b");
    let b1 = Agent::new(&name, AgentConfig::default()).unwrap();
    b1.create_backend(InprocParams::default()).unwrap();
    let (sb1, _rb1) = registered(&b1, 4096);
    a.load_remote_metadata(&b1.local_metadata().unwrap())
        .unwrap();
    let g1 = a.remote_generation(&name).unwrap();
    let old = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, sb1.addr(), 4096, 1),
            &name,
            XferOptions::default(),
        )
        .unwrap();
    let old_list = a
        .prep_xfer_dlist(
            XferTarget::Agent(&name),
            &XferDescList::blocks(MemKind::Dram, sb1.addr(), 4096, 1),
            &[],
        )
        .unwrap();
    // The peer "restarts": same name, new incarnation.
    drop(_rb1);
    drop(b1);
    let b2 = Agent::new(&name, AgentConfig::default()).unwrap();
    b2.create_backend(InprocParams::default()).unwrap();
    let (sb2, _rb2) = registered(&b2, 4096);
    a.load_remote_metadata(&b2.local_metadata().unwrap())
        .unwrap();
    let g2 = a.remote_generation(&name).unwrap();
    assert_ne!(g1, g2);
    match a.post_xfer_req(&old) {
        Err(Error::PeerRestarted { built, current, .. }) => assert_eq!((built, current), (g1, g2)),
        other => panic!("expected PeerRestarted, got {other:?}"),
    }
    // A request built from the stale prepared list fails the same way.
    let local = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
            &[],
        )
        .unwrap();
    let stale = a
        .make_prepped_xfer(
            XferOp::Write,
            &local,
            &[0],
            &old_list,
            &[0],
            XferOptions::default(),
        )
        .unwrap();
    assert!(matches!(
        a.post_xfer_req(&stale),
        Err(Error::PeerRestarted { .. })
    ));
    // New requests to the new incarnation work, with no restart on this side.
    sa.fill(9);
    let new = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, sb2.addr(), 4096, 1),
            &name,
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&new).unwrap();
    new.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(sb2.to_vec(), vec![9u8; 4096]);
}

/// Deadline, `wait`, cancel and drop while the data is really in flight: the initiator's
/// backend holds every post back for `delay` (the fault injector's delay, or INPROC's deferred
/// completion), so each step acts on a request that is `InProgress` with the destination
/// still unchanged, and checks that it stays unchanged after the request ended: a deadline
/// or cancel that did not stop the transfer would let the copy land later.
fn canceled_in_flight_never_lands(a: &Agent, b: &Agent, delay: Duration) {
    const LEN: usize = 4096;
    const SLOTS: usize = 6;
    let (sa, _ra) = registered(a, LEN);
    let (sb, _rb) = registered(b, LEN * SLOTS);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    sa.fill(9);
    let mk = |slot: usize, timeout| {
        a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), LEN as u64, 1),
            &XferDescList::blocks(
                MemKind::Dram,
                sb.addr() + (slot * LEN) as u64,
                LEN as u64,
                1,
            ),
            b.name(),
            XferOptions::default().timeout(timeout),
        )
        .unwrap()
    };
    let slot_is = |slot: usize, byte: u8| {
        let mut v = vec![0u8; LEN];
        assert!(sb.read_at(slot * LEN, &mut v));
        v == vec![byte; LEN]
    };
    // The request's own deadline.
    let req = mk(0, Some(Duration::from_millis(30)));
    assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::InProgress);
    assert!(slot_is(0, 0), "in flight: nothing landed yet");
    assert!(matches!(
        a.post_xfer_req(&req),
        Err(Error::RepostActive { .. })
    ));
    let err = loop {
        match a.check_xfer_state(&req) {
            Ok(XferState::InProgress) => std::thread::sleep(Duration::from_millis(2)),
            Ok(XferState::Done) => panic!("a request held back for {delay:?} completed"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::TimedOut { .. }), "{err:?}");
    assert!(!req.is_in_flight());
    // Terminal: polling again reports the same error.
    assert!(matches!(
        a.check_xfer_state(&req),
        Err(Error::TimedOut { .. })
    ));
    // wait() with a deadline.
    let waited = mk(1, None);
    a.post_xfer_req(&waited).unwrap();
    assert!(matches!(
        waited.wait(Duration::from_millis(20)),
        Err(Error::TimedOut { .. })
    ));
    // Explicit cancel.
    let canceled = mk(2, None);
    a.post_xfer_req(&canceled).unwrap();
    assert!(slot_is(2, 0), "in flight when canceled");
    canceled.cancel().unwrap();
    assert!(matches!(
        a.check_xfer_state(&canceled),
        Err(Error::Canceled { .. })
    ));
    // Dropping an in-flight request cancels it.
    let dropped = mk(3, None);
    assert_eq!(a.post_xfer_req(&dropped).unwrap(), XferState::InProgress);
    assert!(slot_is(3, 0), "in flight when dropped");
    drop(dropped);
    // A control request posted after all of them: delayed posts start in order on one
    // thread, so once it is done every earlier one would have landed had it not been stopped.
    let control = mk(5, None);
    assert_eq!(a.post_xfer_req(&control).unwrap(), XferState::InProgress);
    assert!(slot_is(5, 0), "the control request is in flight too");
    control.wait(delay * 20 + Duration::from_secs(20)).unwrap();
    assert!(slot_is(5, 9), "the control request landed");
    for (slot, what) in [(0, "deadline"), (1, "wait"), (2, "cancel"), (3, "drop")] {
        assert!(
            slot_is(slot, 0),
            "a request stopped by its {what} wrote its destination afterwards"
        );
    }
}

#[test]
fn delayed_request_is_canceled_by_its_deadline_and_by_wait() {
    let delay = Duration::from_millis(300);
    let plan = FaultPlan::default()
        .seed(1)
        .delay_prob(1.0)
        .delay((delay, delay));
    let (a, log) = faulty("dl-a", plan);
    let b = agent("dl-b");
    canceled_in_flight_never_lands(&a, &b, delay);
    assert_eq!(
        log.events()
            .iter()
            .filter(|e| matches!(e, FaultEvent::Delay { .. }))
            .count(),
        5,
        "every post was held back"
    );
}

#[test]
fn deferred_inproc_request_is_canceled_by_its_deadline_wait_cancel_and_drop() {
    let delay = Duration::from_millis(300);
    let a = Agent::new(&unique("dd-a"), AgentConfig::default()).unwrap();
    a.create_backend(InprocParams::default().completion(Completion::Deferred(delay)))
        .unwrap();
    let b = agent("dd-b");
    canceled_in_flight_never_lands(&a, &b, delay);
    let path = a.path_report(b.name());
    assert!(
        path.len() == 1 && path[0].1.contains("deferred"),
        "{path:?}"
    );
}

/// An initiator over a deferred INPROC (copies 50 ms after post), an immediate target that
/// the initiator has loaded, and 1 MiB registered on each.
#[allow(clippy::type_complexity)]
fn deferred_pair(
    prefix: &str,
) -> (
    Agent,
    Agent,
    Arc<nixl_core::HostBuffer>,
    Arc<nixl_core::HostBuffer>,
    (nixl_core::Registration, nixl_core::Registration),
) {
    let a = Agent::new(&unique(&format!("{prefix}-a")), AgentConfig::default()).unwrap();
    a.create_backend(
        InprocParams::default().completion(Completion::Deferred(Duration::from_millis(50))),
    )
    .unwrap();
    let b = agent(&format!("{prefix}-b"));
    let (sa, ra) = registered(&a, 1 << 20);
    let (sb, rb) = registered(&b, 1 << 20);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    (a, b, sa, sb, (ra, rb))
}

/// The notification of a deferred request arrives after its data, without the initiator
/// polling: at the moment the target sees it, the data is complete.
#[test]
fn deferred_inproc_notification_follows_data_without_polling() {
    let (a, b, sa, sb, _regs) = deferred_pair("dn");
    for round in 0..3u64 {
        sa.fill_pattern(round + 1);
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, sa.addr(), 1 << 18, 4),
                &XferDescList::blocks(MemKind::Dram, sb.addr(), 1 << 18, 4),
                b.name(),
                XferOptions::with_notif(format!("r{round}").into_bytes()),
            )
            .unwrap();
        assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::InProgress);
        assert!(
            sb.to_vec() != sa.to_vec(),
            "round {round}: in flight, not landed yet"
        );
        let n = b.wait_notifs(Duration::from_secs(20)).unwrap();
        assert_eq!(n[a.name()], vec![format!("r{round}").into_bytes()]);
        assert!(
            sb.to_vec() == sa.to_vec(),
            "round {round}: data before notification"
        );
        req.wait(Duration::from_secs(20)).unwrap();
    }
}

/// A block-table request over a deferred INPROC backend is in flight after `post` like any
/// other (INPROC's block path used to copy inside `post` whatever the completion mode, so the
/// in-flight cases of block requests never ran there); its notification follows its data.
#[test]
fn deferred_inproc_block_requests_are_in_flight_after_post() {
    let (a, b, sa, sb, _regs) = deferred_pair("db");
    let table = |addr: u64| {
        nixl_core::StridedDescList::from_descs(
            MemKind::Dram,
            [nixl_core::StridedDesc::new(addr, 1 << 16, 1 << 16, 16)],
        )
    };
    let l = a
        .prep_strided_dlist(XferTarget::Initiator, &table(sa.addr()), &[])
        .unwrap();
    let r = a
        .prep_strided_dlist(XferTarget::Agent(b.name()), &table(sb.addr()), &[])
        .unwrap();
    sa.fill_pattern(9);
    let ids: Vec<usize> = (0..16).collect();
    let req = a
        .make_block_xfer(
            XferOp::Write,
            &l,
            &ids,
            &r,
            &ids,
            XferOptions::with_notif(b"blocks".to_vec()),
        )
        .unwrap();
    assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::InProgress);
    assert!(sb.to_vec() != sa.to_vec(), "in flight, not landed yet");
    let n = b.wait_notifs(Duration::from_secs(20)).unwrap();
    assert_eq!(n[a.name()], vec![b"blocks".to_vec()]);
    assert!(sb.to_vec() == sa.to_vec(), "data before notification");
    req.wait(Duration::from_secs(20)).unwrap();
}

#[test]
fn injected_faults_are_deterministic_and_detected() {
    let plan = FaultPlan::default()
        .seed(7)
        .error_prob(0.2)
        .drop_notif_prob(0.2)
        .dup_notif_prob(0.2)
        .corrupt_prob(0.2);
    let run = || {
        let (a, log) = faulty("fi-a", plan.clone());
        let b = agent("fi-b");
        let (sa, _ra) = registered(&a, 4096);
        let (sb, _rb) = registered(&b, 4096);
        a.load_remote_metadata(&b.local_metadata().unwrap())
            .unwrap();
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
                &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
                b.name(),
                XferOptions::with_notif(b"n".to_vec()),
            )
            .unwrap();
        let mut outcomes = Vec::new();
        for i in 0..200u64 {
            sa.fill_pattern(i);
            let sent = sa.to_vec();
            let ok = a.post_xfer_req(&req).is_ok() && req.wait(Duration::from_secs(5)).is_ok();
            let notifs = b.get_notifs().unwrap().get(a.name()).map_or(0, Vec::len);
            // The injector corrupts a private copy: the caller's source is never written.
            assert!(
                sa.to_vec() == sent,
                "post {i}: the source buffer was modified"
            );
            let intact = sent == sb.to_vec();
            outcomes.push((ok, notifs, intact));
        }
        (outcomes, log.events())
    };
    let (o1, e1) = run();
    let (o2, e2) = run();
    assert_eq!(o1, o2, "same seed, same outcomes");
    assert_eq!(e1, e2, "same seed, same faults");
    // Each kind of fault happened and is visible in the outcomes.
    let count = |f: fn(&FaultEvent) -> bool| e1.iter().filter(|e| f(e)).count();
    let (errors, drops, dups, corrupt) = (
        count(|e| matches!(e, FaultEvent::Error { .. })),
        count(|e| matches!(e, FaultEvent::DropNotif { .. })),
        count(|e| matches!(e, FaultEvent::DupNotif { .. })),
        count(|e| matches!(e, FaultEvent::Corrupt { .. })),
    );
    assert!(
        errors > 0 && drops > 0 && dups > 0 && corrupt > 0,
        "{errors} {drops} {dups} {corrupt}"
    );
    assert_eq!(o1.iter().filter(|o| !o.0).count(), errors);
    assert_eq!(o1.iter().filter(|o| o.0 && o.1 == 0).count(), drops);
    assert_eq!(o1.iter().filter(|o| o.1 == 2).count(), dups);
    assert_eq!(o1.iter().filter(|o| o.0 && !o.2).count(), corrupt);
}

/// A corrupted WRITE moves a private copy with one byte flipped: while it is in flight (held
/// back by a delay) and after it landed, the caller's registered source is exactly what the
/// caller wrote, and the destination differs from it in exactly one byte.
#[test]
fn corrupted_write_sends_a_private_copy_and_never_touches_the_source() {
    let plan = FaultPlan::default()
        .seed(9)
        .corrupt_prob(1.0)
        .delay_prob(1.0)
        .delay((Duration::from_millis(100), Duration::from_millis(100)));
    let (a, log) = faulty("pc-a", plan);
    let b = agent("pc-b");
    let (sa, _ra) = registered(&a, 1 << 16);
    let (sb, _rb) = registered(&b, 1 << 16);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 1 << 14, 4),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 1 << 14, 4),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    for round in 0..3u64 {
        sa.fill_pattern(round + 40);
        let sent = sa.to_vec();
        assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::InProgress);
        assert!(
            sa.to_vec() == sent,
            "round {round}: source written while in flight"
        );
        req.wait(Duration::from_secs(20)).unwrap();
        assert!(sa.to_vec() == sent, "round {round}: source written");
        let got = sb.to_vec();
        let diff: Vec<usize> = (0..got.len()).filter(|&i| got[i] != sent[i]).collect();
        assert_eq!(
            diff.len(),
            1,
            "round {round}: one corrupted byte, got {diff:?}"
        );
        let logged = log.events().iter().rev().find_map(|e| match e {
            FaultEvent::Corrupt { offset, .. } => Some(*offset),
            _ => None,
        });
        assert_eq!(
            logged,
            Some(diff[0] as u64),
            "round {round}: at the logged offset"
        );
    }
}

#[test]
fn killed_peer_ends_requests_in_remote_disconnect() {
    let plan = FaultPlan::default().seed(3).kill_after_posts(2);
    let (a, log) = faulty("kill-a", plan);
    let b = agent("kill-b");
    let (sa, _ra) = registered(&a, 4096);
    let (sb, _rb) = registered(&b, 4096);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    for _ in 0..2 {
        a.post_xfer_req(&req).unwrap();
        req.wait(Duration::from_secs(5)).unwrap();
    }
    let e = a.post_xfer_req(&req).unwrap_err();
    assert!(
        matches!(e, Error::RemoteDisconnect { .. }) && e.is_uncertain(),
        "{e:?}"
    );
    assert!(matches!(
        a.gen_notif(b.name(), b"x", &[]),
        Err(Error::RemoteDisconnect { .. })
    ));
    assert_eq!(log.events(), vec![FaultEvent::Kill { post: 3 }]);
}

#[test]
fn telemetry_counts_requests_and_bytes() {
    let a = agent_with("tel-a", AgentConfig::default().telemetry(true));
    let b = agent("tel-b");
    let (sa, _ra) = registered(&a, 65536);
    let (sb, _rb) = registered(&b, 65536);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 16),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 16),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    assert_eq!(a.query_xfer_backend(&req).name(), "INPROC");
    assert!(req.path().contains("INPROC"));
    assert_eq!(a.estimate_xfer_cost(&req).unwrap(), None);
    for _ in 0..3 {
        a.post_xfer_req(&req).unwrap();
        req.wait(Duration::from_secs(5)).unwrap();
    }
    let t = req.telemetry();
    assert_eq!((t.bytes, t.desc_count), (65536, 1));
    assert!(t.start.is_some());
    let s = a.telemetry();
    assert_eq!(
        (
            s.agent_tx_bytes,
            s.agent_rx_bytes,
            s.agent_requests,
            s.agent_memory_registered
        ),
        (3 * 65536, 0, 3, 65536)
    );
    a.set_telemetry(false);
    a.post_xfer_req(&req).unwrap();
    assert_eq!(a.telemetry().agent_requests, 3);
    assert_eq!(
        a.path_report(b.name()),
        vec![("INPROC".to_owned(), "in-process memcpy".to_owned())]
    );
}

#[test]
fn loopback_and_self_target() {
    let a = agent("self");
    let (s, _r) = registered(&a, 8192);
    s.fill_pattern(1);
    let req = a
        .create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, s.addr() + 4096, 4096, 1),
            &XferDescList::blocks(MemKind::Dram, s.addr(), 4096, 1),
            a.name(),
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(5)).unwrap();
    let v = s.to_vec();
    assert_eq!(v[..4096], v[4096..]);
}

#[test]
fn integrity_detects_every_corruption() {
    let plan = FaultPlan::default().seed(11).corrupt_prob(0.3);
    let (a, log) = faulty("int-a", plan);
    // The target verifies integrity frames (and says so in its metadata).
    let b = nixl_testkit::inproc_agent_with(
        "int-b",
        nixl_core::AgentConfig::default().verify_integrity(true),
    );
    let (sa, _ra) = registered(&a, 65536);
    let (sb, _rb) = registered(&b, 65536);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let opts = XferOptions::default().notif(b"kv".to_vec()).integrity(true);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 16),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 16),
            b.name(),
            opts,
        )
        .unwrap();
    let (mut verified, mut corrupt) = (0, 0);
    for i in 0..100u64 {
        sa.fill_pattern(i);
        a.post_xfer_req(&req).unwrap();
        req.wait(Duration::from_secs(5)).unwrap();
        match b.wait_notifs(Duration::from_secs(5)) {
            Ok(n) => {
                assert_eq!(n.get(a.name()), Some(&vec![b"kv".to_vec()]), "round {i}");
                assert_eq!(
                    sa.to_vec(),
                    sb.to_vec(),
                    "a verified notification implies intact data"
                );
                verified += 1;
            }
            Err(Error::Corrupt { remote, .. }) => {
                assert_eq!(remote, a.name());
                let f = b.take_integrity_failures();
                assert_eq!(f.len(), 1);
                assert_eq!(f[0].1, b"kv".to_vec());
                assert_ne!(sa.to_vec(), sb.to_vec());
                corrupt += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    let injected = log
        .events()
        .iter()
        .filter(|e| matches!(e, FaultEvent::Corrupt { .. }))
        .count();
    assert_eq!(
        corrupt, injected,
        "every injected corruption detected, none falsely"
    );
    assert!(corrupt > 0 && verified > 0);
    // READ with integrity is refused.
    let r = a.create_xfer_req(
        XferOp::Read,
        &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
        &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
        b.name(),
        XferOptions::default().integrity(true),
    );
    assert!(matches!(r, Err(Error::NotSupported { .. })));
}

#[test]
fn hostile_integrity_frames_never_read_foreign_memory() {
    let a = agent("hif-a");
    let b = agent("hif-b");
    let (_sb, _rb) = registered(&b, 4096);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    // A frame naming memory b never registered (address 8: unmapped) must be refused, not read.
    let frame = nixl_core::wire::integrity::Frame {
        hash: 1,
        ranges: vec![(0, 8, 4096)],
        msg: b"x".to_vec(),
    }
    .encode();
    a.gen_notif(b.name(), &frame, &[]).unwrap();
    let mut truncated = nixl_core::wire::integrity::MAGIC.to_vec();
    truncated.extend_from_slice(&[1, 2, 3]);
    a.gen_notif(b.name(), &truncated, &[]).unwrap();
    a.gen_notif(b.name(), b"plain", &[]).unwrap();
    let n = b.get_notifs().unwrap();
    assert_eq!(n[a.name()], vec![b"plain".to_vec()]);
    assert_eq!(b.take_integrity_failures().len(), 2);
}

#[test]
fn wait_notifs_reports_each_integrity_failure_once() {
    let a = agent("once-a");
    let b = agent("once-b");
    let (_sb, _rb) = registered(&b, 4096);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    // Two frames that fail verification (memory b never registered).
    for _ in 0..2 {
        let frame = nixl_core::wire::integrity::Frame {
            hash: 1,
            ranges: vec![(0, 8, 4096)],
            msg: b"bad".to_vec(),
        }
        .encode();
        a.gen_notif(b.name(), &frame, &[]).unwrap();
    }
    let short = Duration::from_millis(200);
    // Each failure ends one wait; the same failure does not end the next one.
    let mut corrupt = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while corrupt < 2 && std::time::Instant::now() < deadline {
        match b.wait_notifs(short) {
            Err(Error::Corrupt { remote, .. }) => {
                assert_eq!(remote, a.name());
                corrupt += 1;
            }
            Ok(n) if n.is_empty() => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(corrupt, 2);
    assert!(
        b.wait_notifs(short).unwrap().is_empty(),
        "nothing arrived: Ok(empty)"
    );
    // A good notification after the failures is delivered.
    a.gen_notif(b.name(), b"good", &[]).unwrap();
    let n = b.wait_notifs(Duration::from_secs(5)).unwrap();
    assert_eq!(n[a.name()], vec![b"good".to_vec()]);
    // Reported or not, every failure stays available until taken.
    assert_eq!(b.take_integrity_failures().len(), 2);
    assert!(b.take_integrity_failures().is_empty());
}

#[test]
fn uncertain_requests_are_listed() {
    let plan = FaultPlan::default()
        .seed(1)
        .delay_prob(1.0)
        .delay((Duration::from_secs(30), Duration::from_secs(30)));
    let (a, _log) = faulty("unc-a", plan);
    let b = agent("unc-b");
    let (sa, _ra) = registered(&a, 4096);
    let (sb, _rb) = registered(&b, 4096);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    // The peer is invalidated while the request is in flight: the request is fenced, with an
    // error that says so.
    a.invalidate_remote_metadata(b.name()).unwrap();
    let r = a.check_xfer_state(&req);
    assert!(
        matches!(&r, Err(e @ Error::RemoteDisconnect { .. }) if e.to_string().contains("invalidated")),
        "{r:?}"
    );
    let u = a.uncertain_requests();
    assert_eq!(u.len(), 1);
    assert_eq!(
        (u[0].id, u[0].remote.as_str(), u[0].bytes, u[0].error),
        (
            req.id(),
            b.name(),
            4096,
            nixl_core::ErrorKind::RemoteDisconnect
        )
    );
    a.clear_uncertain_requests();
    assert!(a.uncertain_requests().is_empty());
}

/// A registration does not keep its agent alive (a request leaked at the agent's drop holds
/// its registrations, and must not keep the agent's threads with them): one that outlives its
/// agent still names its regions and backends, is refused by another agent, and deregisters
/// when dropped.
#[test]
fn a_registration_outlives_its_agent_and_still_deregisters() {
    let a = agent("outlive");
    let (buf, reg) = registered(&a, 4096);
    let name = a.name().to_owned();
    drop(a);
    assert_eq!(reg.regions().len(), 1);
    assert_eq!(reg.regions()[0].addr, buf.addr());
    assert_eq!(
        reg.backends()
            .iter()
            .map(|b| b.name().to_owned())
            .collect::<Vec<_>>(),
        ["INPROC"]
    );
    let other = agent("outlive-other");
    assert_ne!(other.name(), name);
    match other.deregister_mem(&reg) {
        Err(e) => assert_eq!(e.kind(), nixl_core::ErrorKind::Mismatch, "{e}"),
        Ok(()) => panic!("another agent deregistered it"),
    }
    assert!(!reg.is_deregistered());
    drop(reg);
}
