//! Region labels: a registration's label travels in its owner's metadata, so a peer finds the
//! KV pool by name instead of telling it from the other regions by size.

use std::sync::Arc;

use nixl_core::{AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};
use nixl_testkit::inproc_agent_with as agent_with;

#[test]
fn a_peer_finds_regions_by_the_label_they_were_registered_with() {
    let owner = agent_with("labels-owner", AgentConfig::default());
    let peer = agent_with("labels-peer", AgentConfig::default());
    let buf = |n| Arc::new(HostBuffer::new(n).expect("alloc"));
    // Two pools of the same size: only the label tells them apart.
    let (kv, scratch, plain) = (buf(1 << 20), buf(1 << 20), buf(4096));
    let rk = owner
        .register_mem_labeled("kv-pool", vec![kv.clone()], &[])
        .unwrap();
    let _rs = owner
        .register_mem_labeled("scratch", vec![scratch.clone()], &[])
        .unwrap();
    let rp = owner.register_mem(vec![plain.clone()], &[]).unwrap();
    assert_eq!(rk.label(), Some("kv-pool"));
    assert_eq!(rp.label(), None);
    peer.load_remote_metadata(&owner.local_metadata().unwrap())
        .unwrap();
    let found = peer
        .remote_regions_labeled(owner.name(), "kv-pool")
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].addr, found[0].len), (kv.addr(), kv.len() as u64));
    assert_eq!(
        peer.remote_regions_labeled(owner.name(), "scratch")
            .unwrap()[0]
            .addr,
        scratch.addr()
    );
    assert!(peer
        .remote_regions_labeled(owner.name(), "no-such")
        .unwrap()
        .is_empty());
    // The empty label names nothing (unlabeled regions are not "labeled ''").
    assert!(peer
        .remote_regions_labeled(owner.name(), "")
        .unwrap()
        .is_empty());
    assert_eq!(peer.remote_regions(owner.name()).unwrap().len(), 3);
    assert!(matches!(
        peer.remote_regions_labeled("nobody", "kv-pool"),
        Err(Error::NotFound { .. })
    ));
    // The region found by label is the one a transfer reaches.
    let src = buf(4096);
    src.fill(0x5C);
    let _r = peer.register_mem(vec![src.clone()], &[]).unwrap();
    let req = peer
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, found[0].addr, 4096, 1),
            owner.name(),
            XferOptions::default(),
        )
        .unwrap();
    peer.post_xfer_req(&req).unwrap();
    req.wait(std::time::Duration::from_secs(10)).unwrap();
    let mut head = vec![0u8; 4096];
    kv.read_at(0, &mut head);
    assert_eq!(head, vec![0x5C; 4096]);
}

#[test]
fn bad_labels_are_refused_and_change_nothing() {
    let a = agent_with("labels-bad", AgentConfig::default());
    let b = Arc::new(HostBuffer::new(4096).expect("alloc"));
    for label in [String::new(), "x".repeat(257)] {
        let e = a
            .register_mem_labeled(&label, vec![b.clone()], &[])
            .unwrap_err();
        assert!(matches!(e, Error::InvalidParam { .. }), "{e}");
    }
    let _r = a
        .register_mem_labeled(&"x".repeat(256), vec![b], &[])
        .expect("a 256-byte label");
    let md =
        nixl_core::wire::codec::AgentMetadata::decode_bytes(&a.local_metadata().unwrap()).unwrap();
    assert_eq!(
        md.regions.len(),
        1,
        "only the good registration is published"
    );
    assert_eq!(md.regions[0].label.len(), 256);
}

/// An agent encodes its metadata from where each region lives (no entry copied first): the
/// bytes are exactly those of the decoded entries encoded again, labels, several regions per
/// registration and unlabeled ones included.
#[test]
fn metadata_encoded_in_place_equals_its_entries_encoded_again() {
    let a = agent_with("labels-encode", AgentConfig::default());
    let bufs: Vec<Arc<HostBuffer>> = (0..5)
        .map(|_| Arc::new(HostBuffer::new(8192).expect("alloc")))
        .collect();
    let as_regions = |b: &[Arc<HostBuffer>]| {
        b.iter()
            .map(|x| x.clone() as Arc<dyn nixl_core::MemoryRegion>)
            .collect::<Vec<_>>()
    };
    let _r1 = a
        .register_mem_labeled("kv-pool", as_regions(&bufs[..3]), &[])
        .unwrap();
    let _r2 = a.register_mem(as_regions(&bufs[3..]), &[]).unwrap();
    let md = a.local_metadata().unwrap();
    let decoded = nixl_core::wire::codec::AgentMetadata::decode_bytes(&md).unwrap();
    assert_eq!(decoded.regions.len(), 5);
    assert_eq!(
        decoded
            .regions
            .iter()
            .filter(|r| r.label == "kv-pool")
            .count(),
        3
    );
    assert!(decoded.encode() == md, "the same bytes");
}
