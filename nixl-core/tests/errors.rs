//! Every bad input gets a typed error and leaves the agent unchanged.

use std::sync::Arc;

use nixl_core::backend::RawRegion;
use nixl_core::wire::codec::{AgentMetadata, BackendEntry, RegionEntry};
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, MetadataSelection, RegionDesc,
    XferDescList, XferOp, XferOptions, XferTarget,
};
use nixl_testkit::{inproc_agent as agent, registered, snapshot};

fn connected() -> (
    Agent,
    Agent,
    Arc<HostBuffer>,
    Arc<HostBuffer>,
    nixl_core::Registration,
    nixl_core::Registration,
) {
    let a = agent("err-a");
    let b = agent("err-b");
    let (sa, ra) = registered(&a, 16384);
    let (sb, rb) = registered(&b, 16384);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    (a, b, sa, sb, ra, rb)
}

#[test]
fn bad_agent_names_are_refused() {
    assert!(matches!(
        Agent::new("", AgentConfig::default()),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        Agent::new(&"x".repeat(300), AgentConfig::default()),
        Err(Error::InvalidParam { .. })
    ));
}

#[test]
fn duplicate_and_unknown_backends_are_refused() {
    let a = agent("dup");
    assert!(matches!(
        a.create_backend(nixl_core::InprocParams::default()),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        a.create_backend_named("nope", &Default::default()),
        Err(Error::NotFound { .. })
    ));
    let mut bad = std::collections::BTreeMap::new();
    bad.insert("bogus".to_owned(), "1".to_owned());
    let b = Agent::new(&nixl_testkit::unique("p"), AgentConfig::default()).unwrap();
    assert!(matches!(
        b.create_backend_named("INPROC", &bad),
        Err(Error::InvalidParam { .. })
    ));
    assert!(b.backends().is_empty());
    assert_eq!(b.available_backends(), vec!["INPROC".to_owned()]);
    assert!(b.backend_params("inproc").unwrap().is_empty());
    let backends = a.backends();
    let names: Vec<&str> = backends.iter().map(|h| h.name()).collect();
    assert_eq!(names, vec!["INPROC"]);
    assert!(a.backend("nope").is_none());
    assert!(a.backend("INPROC").is_some_and(|h| h.capabilities().remote));
}

#[test]
fn bad_registrations_change_nothing() {
    let a = agent("reg");
    let before = snapshot(&a);
    assert!(matches!(
        a.register_mem(vec![], &[]),
        Err(Error::InvalidParam { .. })
    ));
    let b = Arc::new(HostBuffer::new(4096).unwrap());
    // A hint naming another agent's backend.
    let stranger = agent("reg-stranger");
    let foreign = stranger.backend("INPROC").expect("stranger's backend");
    assert!(matches!(
        a.register_mem(vec![b.clone()], &[foreign]),
        Err(Error::Mismatch { .. })
    ));
    // SAFETY: a zero-length region names no memory.
    let empty = unsafe {
        RawRegion::new(RegionDesc {
            kind: MemKind::Dram,
            addr: 4096,
            len: 0,
            dev_id: 0,
            meta: vec![],
        })
    };
    assert!(matches!(
        a.register_mem(vec![Arc::new(empty)], &[]),
        Err(Error::InvalidParam { .. })
    ));
    // SAFETY: the region is refused before anything touches it.
    let wrap = unsafe {
        RawRegion::new(RegionDesc {
            kind: MemKind::Dram,
            addr: u64::MAX - 2,
            len: 10,
            dev_id: 0,
            meta: vec![],
        })
    };
    assert!(matches!(
        a.register_mem(vec![Arc::new(wrap)], &[]),
        Err(Error::InvalidParam { .. })
    ));
    // No backend registers VRAM or files here.
    // SAFETY: refused before use.
    let vram = unsafe {
        RawRegion::new(RegionDesc {
            kind: MemKind::Vram,
            addr: 0x1000,
            len: 10,
            dev_id: 0,
            meta: vec![],
        })
    };
    assert!(matches!(
        a.register_mem(vec![Arc::new(vram)], &[]),
        Err(Error::NotSupported { .. })
    ));
    // A mixed list is all-or-nothing.
    let file = RawRegion::storage(RegionDesc {
        kind: MemKind::File,
        addr: 0,
        len: 10,
        dev_id: 3,
        meta: vec![],
    })
    .unwrap();
    assert!(a
        .register_mem(vec![b.clone(), Arc::new(file)], &[])
        .is_err());
    assert_eq!(snapshot(&a), before);
}

#[test]
fn deregistration_errors() {
    let a = agent("dereg");
    let other = agent("dereg-other");
    let (_b, r) = registered(&a, 4096);
    assert!(matches!(
        other.deregister_mem(&r),
        Err(Error::Mismatch { .. })
    ));
    let before = a.telemetry().agent_memory_registered;
    assert_eq!(before, 4096);
    a.deregister_mem(&r).unwrap();
    assert!(r.is_deregistered());
    assert_eq!(a.telemetry().agent_memory_registered, 0);
    assert!(matches!(a.deregister_mem(&r), Err(Error::NotFound { .. })));
    assert!(matches!(
        a.local_partial_metadata(&MetadataSelection {
            registrations: Some(&[&r]),
            include_conn: true
        }),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn dropping_the_handle_deregisters() {
    let a = agent("drop");
    let (b, r) = registered(&a, 4096);
    assert_eq!(a.telemetry().agent_memory_registered, 4096);
    drop(r);
    assert_eq!(a.telemetry().agent_memory_registered, 0);
    assert!(matches!(
        a.prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
            &[]
        ),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn a_request_keeps_memory_registered_after_the_handle_is_dropped() {
    let (a, b, sa, sb, ra, _rb) = connected();
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
            b.name(),
            XferOptions::default(),
        )
        .unwrap();
    drop(ra);
    // The registration lives on inside the request.
    assert_eq!(a.telemetry().agent_memory_registered, 16384);
    sa.fill(3);
    a.post_xfer_req(&req).unwrap();
    req.wait(std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(sb.to_vec()[..4096], vec![3u8; 4096][..]);
    drop(req);
    assert_eq!(a.telemetry().agent_memory_registered, 0);
}

#[test]
fn bad_metadata_changes_nothing() {
    let (a, b, _sa, _sb, _ra, _rb) = connected();
    let before = snapshot(&a);
    let good = b.local_metadata().unwrap();
    // Garbage, truncations, wrong version.
    assert!(matches!(
        a.load_remote_metadata(b""),
        Err(Error::Decode { .. })
    ));
    assert!(matches!(
        a.load_remote_metadata(&good[..good.len() - 1]),
        Err(Error::Decode { .. })
    ));
    let mut v = good.clone();
    v[8] = 99;
    assert!(matches!(
        a.load_remote_metadata(&v),
        Err(Error::Decode { .. })
    ));
    // Own metadata.
    assert!(matches!(
        a.load_remote_metadata(&a.local_metadata().unwrap()),
        Err(Error::NotAllowed { .. })
    ));
    // Same generation, changed connection info.
    let mut md = AgentMetadata::decode_bytes(&good).unwrap();
    md.backends[0].conn_info[10] ^= 1;
    assert!(matches!(
        a.load_remote_metadata(&md.encode()),
        Err(Error::Mismatch { .. })
    ));
    // Same generation, changed region metadata.
    let mut md = AgentMetadata::decode_bytes(&good).unwrap();
    md.regions[0].public[0] ^= 1;
    assert!(matches!(
        a.load_remote_metadata(&md.encode()),
        Err(Error::Mismatch { .. })
    ));
    // An unknown peer without connection info.
    let md = AgentMetadata {
        name: "stranger".into(),
        generation: 5,
        has_conn_info: false,
        process: None,
        verifies_integrity: false,
        hello_key: None,
        succession: None,
        backends: vec![],
        regions: vec![],
    };
    assert!(matches!(
        a.load_remote_metadata(&md.encode()),
        Err(Error::NotFound { .. })
    ));
    // A new peer whose connection info is malformed, and one naming a region that does not exist.
    let md = AgentMetadata {
        name: "liar".into(),
        generation: 5,
        has_conn_info: true,
        process: None,
        verifies_integrity: false,
        hello_key: None,
        succession: None,
        backends: vec![BackendEntry {
            name: "INPROC".into(),
            conn_info: vec![1, 2, 3],
        }],
        regions: vec![],
    };
    assert!(matches!(
        a.load_remote_metadata(&md.encode()),
        Err(Error::InvalidParam { .. })
    ));
    let mut md = AgentMetadata::decode_bytes(&good).unwrap();
    md.name = "impostor".into();
    // Claiming no process: under a name no agent of this process has, a claim of this
    // process is refused first (`NotAllowed`), before the region's key is looked at.
    md.process = None;
    md.regions.push(RegionEntry {
        label: String::new(),
        backend: 0,
        desc: RegionDesc {
            kind: MemKind::Dram,
            addr: 0x1000,
            len: 64,
            dev_id: 0,
            meta: vec![],
        },
        public: 999u64.to_le_bytes().to_vec(),
    });
    assert!(matches!(
        a.load_remote_metadata(&md.encode()),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(snapshot(&a), before);
    assert!(!a.check_remote_metadata("impostor", None));
}

#[test]
fn append_only_loading() {
    let a = agent("app-a");
    let b = agent("app-b");
    let (b1, r1) = registered(&b, 4096);
    let first = b
        .local_partial_metadata(&nixl_core::MetadataSelection {
            registrations: Some(&[&r1]),
            include_conn: true,
        })
        .unwrap();
    a.load_remote_metadata(&first).unwrap();
    let (b2, r2) = registered(&b, 4096);
    let list2 = XferDescList::blocks(MemKind::Dram, b2.addr(), 4096, 1);
    assert!(!a.check_remote_metadata(b.name(), Some(&list2)));
    // Partial metadata without connection info adds a region to a known peer.
    let second = b
        .local_partial_metadata(&nixl_core::MetadataSelection {
            registrations: Some(&[&r2]),
            include_conn: false,
        })
        .unwrap();
    a.load_remote_metadata(&second).unwrap();
    assert!(a.check_remote_metadata(b.name(), Some(&list2)));
    assert!(a.check_remote_metadata(
        b.name(),
        Some(&XferDescList::blocks(MemKind::Dram, b1.addr(), 4096, 1))
    ));
    // Loading the same again is a no-op.
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    // Connection-only metadata.
    let c = agent("app-c");
    let conn_only = c
        .local_partial_metadata(&nixl_core::MetadataSelection {
            registrations: Some(&[]),
            include_conn: true,
        })
        .unwrap();
    assert_eq!(
        AgentMetadata::decode_bytes(&conn_only)
            .unwrap()
            .regions
            .len(),
        0
    );
    a.load_remote_metadata(&conn_only).unwrap();
    assert!(a.check_remote_metadata(c.name(), None));
}

#[test]
fn bad_transfer_inputs_change_nothing() {
    let (a, b, sa, sb, _ra, _rb) = connected();
    let before = snapshot(&a);
    let local = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 4),
            &[],
        )
        .unwrap();
    let remote = a
        .prep_xfer_dlist(
            XferTarget::Agent(b.name()),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 4),
            &[],
        )
        .unwrap();
    let opts = XferOptions::default;
    assert!(matches!(
        a.make_prepped_xfer(XferOp::Write, &local, &[], &remote, &[], opts()),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        a.make_prepped_xfer(XferOp::Write, &local, &[0, 1], &remote, &[0], opts()),
        Err(Error::Mismatch { .. })
    ));
    assert!(matches!(
        a.make_prepped_xfer(XferOp::Write, &local, &[4], &remote, &[0], opts()),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        a.make_prepped_xfer(XferOp::Write, &local, &[0], &remote, &[usize::MAX], opts()),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        a.make_prepped_xfer(XferOp::Write, &local, &[0], &local, &[0], opts()),
        Err(Error::InvalidParam { .. })
    ));
    assert!(matches!(
        a.make_prepped_xfer(
            XferOp::Write,
            &local,
            &[0],
            &remote,
            &[0],
            opts().backends(vec![agent("stranger").backend("INPROC").expect("handle")])
        ),
        Err(Error::Mismatch { .. })
    ));
    // Lists of another agent.
    let bl = b
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
            &[],
        )
        .unwrap();
    assert!(matches!(
        a.make_prepped_xfer(XferOp::Write, &bl, &[0], &remote, &[0], opts()),
        Err(Error::Mismatch { .. })
    ));
    // Overflowing and wrong-kind descriptors.
    let wrap = XferDescList::from_descs(MemKind::Dram, [Desc::new(u64::MAX - 1, 16)]);
    assert!(matches!(
        a.prep_xfer_dlist(XferTarget::Initiator, &wrap, &[]),
        Err(Error::InvalidParam { .. })
    ));
    let vram = XferDescList::from_descs(MemKind::Vram, [Desc::new(sa.addr(), 16)]);
    assert!(matches!(
        a.prep_xfer_dlist(XferTarget::Initiator, &vram, &[]),
        Err(Error::NotFound { .. })
    ));
    let other_dev = XferDescList::from_descs(MemKind::Dram, [Desc::on_device(sa.addr(), 16, 1)]);
    assert!(matches!(
        a.prep_xfer_dlist(XferTarget::Initiator, &other_dev, &[]),
        Err(Error::NotFound { .. })
    ));
    // One-shot form with mismatched list lengths.
    assert!(matches!(
        a.create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 2),
            &XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1),
            b.name(),
            opts()
        ),
        Err(Error::Mismatch { .. })
    ));
    // A request of another agent; check before post.
    let req = a
        .make_prepped_xfer(XferOp::Write, &local, &[0], &remote, &[0], opts())
        .unwrap();
    assert!(matches!(b.post_xfer_req(&req), Err(Error::Mismatch { .. })));
    assert!(matches!(
        a.check_xfer_state(&req),
        Err(Error::NotAllowed { .. })
    ));
    assert!(matches!(
        b.gen_notif("nobody", b"x", &[]),
        Err(Error::NotFound { .. })
    ));
    drop((local, remote, req, bl));
    assert_eq!(snapshot(&a), before);
}

#[test]
fn timeouts_are_typed() {
    let a = Agent::new(
        &nixl_testkit::unique("to"),
        AgentConfig::default().default_timeout(std::time::Duration::from_millis(200)),
    )
    .unwrap();
    // Nothing is queued: waiting for notifications ends, on time, with none.
    assert!(a
        .wait_notifs(std::time::Duration::from_millis(20))
        .unwrap()
        .is_empty());
    // A side-channel fetch from a closed port ends in a typed error, not a hang.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let r = a.fetch_remote_metadata_blocking("x", port, std::time::Duration::from_millis(300));
    assert!(
        matches!(r, Err(Error::Io { .. }) | Err(Error::TimedOut { .. })),
        "{r:?}"
    );
}

/// Every public decoder answers with the crate's `Error` (`Decode`, its agent empty: no agent
/// decoded the bytes); the `*_bytes` forms keep the bare `DecodeError` for fuzzing.
#[test]
fn public_decoders_return_the_crates_error() {
    use nixl_core::nixl_wire::notif::{decode_notif, decode_notif_bytes};
    use nixl_core::nixl_wire::NixlMetadata;
    let junk = b"not metadata at all";
    let checks: [(&str, nixl_core::Result<()>); 5] = [
        (
            "AgentMetadata",
            nixl_core::AgentMetadata::decode(junk).map(|_| ()),
        ),
        ("NixlMetadata", NixlMetadata::decode(junk).map(|_| ())),
        ("notification", decode_notif(junk).map(|_| ())),
        (
            "XferDescList",
            nixl_core::XferDescList::decode(junk).map(|_| ()),
        ),
        (
            "KvLayout",
            nixl_core::kv::KvLayout::decode(junk).map(|_| ()),
        ),
    ];
    for (what, r) in checks {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), nixl_core::ErrorKind::Decode, "{what}: {e}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "{what}: the DecodeError is its source"
        );
    }
    assert!(nixl_core::AgentMetadata::decode_bytes(junk).is_err());
    assert!(decode_notif_bytes(junk).is_err());
}

/// Metadata that names this very process is believed only of a live agent of it, with its
/// own registrations (`NotAllowed` otherwise, nothing loaded): a forgery claiming this
/// process under a new name, a real agent's name with a region it never registered, and the
/// metadata of an agent of this process that was dropped. The real agent's own metadata
/// loads. (Over UCX such metadata made the victim's WRITEs land in its own memory:
/// `tests/stray_writes.rs::a_peer_naming_a_worker_of_this_process_is_refused`.)
#[test]
fn metadata_naming_this_process_must_be_a_live_agent_of_it() {
    let a = agent("here-a");
    let b = agent("here-b");
    let (_sb, _rb) = registered(&b, 4096);
    let unregistered = HostBuffer::new(4096).unwrap();
    let good = AgentMetadata::decode_bytes(&b.local_metadata().unwrap()).unwrap();
    assert_eq!(good.process, nixl_core::backend::ProcessId::current());
    let before = snapshot(&a);

    let mut renamed = good.clone();
    renamed.name = nixl_testkit::unique("here-liar");
    let mut not_its_own = good.clone();
    not_its_own.regions[0].desc.addr = unregistered.addr();
    let mut other_generation = good.clone();
    other_generation.generation ^= 1;
    for (what, md) in [
        ("a new name", &renamed),
        ("a region it never registered", &not_its_own),
        ("another generation", &other_generation),
    ] {
        let r = a.load_remote_metadata(&md.encode());
        assert!(matches!(r, Err(Error::NotAllowed { .. })), "{what}: {r:?}");
        assert_eq!(snapshot(&a), before, "{what}");
    }
    // Naming no process, the renamed one is another process's claim: loaded (the backends
    // judge its connection info).
    renamed.process = None;
    assert!(a.load_remote_metadata(&renamed.encode()).is_ok());
    assert!(a.invalidate_remote_metadata(&renamed.name).is_ok());

    let before = snapshot(&a);
    assert_eq!(a.load_remote_metadata(&good.encode()).unwrap(), b.name());
    assert!(a.invalidate_remote_metadata(b.name()).is_ok());
    drop((_rb, b));
    let r = a.load_remote_metadata(&good.encode());
    assert!(
        matches!(r, Err(Error::NotAllowed { .. })),
        "a dropped agent: {r:?}"
    );
    assert_eq!(snapshot(&a), before);
}
