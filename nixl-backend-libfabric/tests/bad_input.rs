//! Bad input gets a typed error and changes nothing: parameters, connection info, region
//! metadata, notifications, memory kinds.

use nixl_testkit::libfabric as common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nixl_backend_libfabric::{LibfabricParams, LibfabricPlugin};
use nixl_core::backend::RawRegion;
use nixl_core::wire::codec::AgentMetadata;
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, RegionDesc, XferDescList, XferOp, XferOptions,
};

fn agent(tag: &str) -> Agent {
    let config = AgentConfig::default().plugins(vec![Arc::new(LibfabricPlugin)]);
    Agent::new(&format!("bad-{tag}-{}", std::process::id()), config).unwrap()
}

#[test]
fn bad_params_are_refused() {
    let a = agent("params");
    for p in [
        LibfabricParams::tcp_loopback(1).rails(0),
        LibfabricParams::tcp_loopback(1).notif_size(1),
        LibfabricParams::tcp_loopback(1).notif_slots(0),
        LibfabricParams::tcp_loopback(1).op_timeout(Duration::ZERO),
        LibfabricParams::tcp_loopback(1).stripe_min(0),
        LibfabricParams::default().provider(String::new()),
    ] {
        assert!(
            matches!(a.create_backend(p.clone()), Err(Error::InvalidParam { .. })),
            "{p:?} accepted"
        );
    }
    let m = BTreeMap::from([("rails".to_owned(), "many".to_owned())]);
    assert!(matches!(
        a.create_backend_named("LIBFABRIC", &m),
        Err(Error::InvalidParam { .. })
    ));
    assert!(a.backends().is_empty());
    if common::skip_without_provider("tcp") {
        return;
    }
    // A provider or domain that does not exist is Unavailable, naming it.
    for p in [
        LibfabricParams::with_provider("no-such-provider"),
        LibfabricParams::tcp_loopback(1).domains(vec!["no-such-domain".into()]),
        // One of two domains missing: refused, not two rails on the one that exists.
        LibfabricParams::tcp_loopback(2).domains(vec!["lo".into(), "no-such-domain".into()]),
    ] {
        match a.create_backend(p) {
            Err(Error::Unavailable { what, hint }) => eprintln!("{what}: {hint}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    assert!(a.backends().is_empty());
    // By name, with the string map.
    let m = BTreeMap::from([
        ("provider".to_owned(), "tcp".to_owned()),
        ("domains".to_owned(), "lo".to_owned()),
        ("rails".to_owned(), "2".to_owned()),
    ]);
    assert_eq!(
        a.create_backend_named("LIBFABRIC", &m).unwrap().name(),
        "LIBFABRIC"
    );
}

struct Pair {
    a: Agent,
    b: Agent,
    _bufs: (Arc<HostBuffer>, Arc<HostBuffer>),
    _regs: (nixl_core::Registration, nixl_core::Registration),
}

fn pair(tag: &str, pa: LibfabricParams, pb: LibfabricParams) -> Pair {
    let (a, b) = (agent(&format!("{tag}-a")), agent(&format!("{tag}-b")));
    a.create_backend(pa).unwrap();
    b.create_backend(pb).unwrap();
    let (x, y) = (
        Arc::new(HostBuffer::new(8192).unwrap()),
        Arc::new(HostBuffer::new(8192).unwrap()),
    );
    let ra = a.register_mem(vec![x.clone()], &[]).unwrap();
    let rb = b.register_mem(vec![y.clone()], &[]).unwrap();
    Pair {
        a,
        b,
        _bufs: (x, y),
        _regs: (ra, rb),
    }
}

#[test]
fn corrupt_connection_and_region_metadata_are_refused() {
    if common::skip_without_provider("tcp") {
        return;
    }
    let p = pair(
        "md",
        LibfabricParams::tcp_loopback(1),
        LibfabricParams::tcp_loopback(1),
    );
    let good = AgentMetadata::decode_bytes(&p.b.local_metadata().unwrap()).unwrap();
    let mut bad_conn = good.clone();
    bad_conn.backends[0].conn_info = b"LFB1 garbage".to_vec();
    let mut bad_region = good.clone();
    bad_region.regions[0].public = vec![1, 0, 9];
    let mut empty_conn = good.clone();
    empty_conn.backends[0].conn_info.clear();
    for (what, md) in [
        ("connection info", bad_conn),
        ("region metadata", bad_region),
        ("empty connection info", empty_conn),
    ] {
        let r = p.a.load_remote_metadata(&md.encode());
        assert!(
            matches!(r, Err(Error::InvalidParam { .. })),
            "{what}: {r:?}"
        );
        assert!(
            !p.a.check_remote_metadata(p.b.name(), None),
            "{what}: peer loaded anyway"
        );
    }
    // The good metadata still loads afterwards.
    p.a.load_remote_metadata(&good.encode()).unwrap();
}

#[test]
fn provider_mismatch_is_refused() {
    if common::skip_without_provider("tcp") || common::skip_without_provider("shm") {
        return;
    }
    let p = pair(
        "prov",
        LibfabricParams::tcp_loopback(1),
        LibfabricParams::with_provider("shm"),
    );
    let r = p.a.load_remote_metadata(&p.b.local_metadata().unwrap());
    assert!(matches!(r, Err(Error::Mismatch { .. })), "{r:?}");
    assert!(!p.a.check_remote_metadata(p.b.name(), None));
}

#[test]
fn oversized_notifications_and_unsupported_memory_are_refused() {
    if common::skip_without_provider("tcp") {
        return;
    }
    let small = LibfabricParams::tcp_loopback(1).notif_size(256);
    let p = pair("notif", small.clone(), small);
    p.a.load_remote_metadata(&p.b.local_metadata().unwrap())
        .unwrap();
    let big = vec![7u8; 1024];
    assert!(matches!(
        p.a.gen_notif(p.b.name(), &big, &[]),
        Err(Error::InvalidParam { .. })
    ));
    let (x, y) = (&p._bufs.0, &p._bufs.1);
    let r = p.a.create_xfer_req(
        XferOp::Write,
        &XferDescList::blocks(MemKind::Dram, x.addr(), 4096, 1),
        &XferDescList::blocks(MemKind::Dram, y.addr(), 4096, 1),
        p.b.name(),
        XferOptions::with_notif(big),
    );
    assert!(matches!(r, Err(Error::InvalidParam { .. })), "{r:?}");
    // A small one still goes through.
    p.a.gen_notif(p.b.name(), b"ok", &[]).unwrap();
    assert_eq!(
        p.b.wait_notifs(Duration::from_secs(20)).unwrap()[p.a.name()],
        vec![b"ok".to_vec()]
    );
    // GPU memory on a provider without FI_HMEM: refused before anything is touched.
    // SAFETY: the region is never accessed: registration is refused on its kind.
    let vram = unsafe {
        RawRegion::new(RegionDesc {
            kind: MemKind::Vram,
            addr: 0x1000,
            len: 4096,
            dev_id: 0,
            meta: vec![],
        })
    };
    let r = p.a.register_mem(vec![Arc::new(vram)], &[]);
    assert!(
        matches!(r, Err(Error::NotSupported { .. } | Error::NotFound { .. })),
        "{r:?}"
    );
}

/// Where an agent's shm endpoint name (`fi_shm://...`, NUL included) lies in its
/// connection info.
fn shm_name_at(conn: &[u8]) -> std::ops::Range<usize> {
    let start = conn
        .windows(9)
        .position(|w| w == b"fi_shm://")
        .expect("an shm endpoint name");
    let len = conn[start..].iter().position(|&b| b == 0).expect("a NUL") + 1;
    start..start + len
}

/// shm endpoint names libfabric 1.17 mishandles are refused before `fi_av_insert`, found by
/// the `unpack_address` fuzz target: a name whose region cannot be opened (here: a path,
/// which `shm_open` refuses) keeps a half-initialised slot in the provider's map, so
/// inserting it a second time "succeeds" and the hello sent through it crashed the process
/// (SIGSEGV in `pthread_spin_lock` on no region); a name of a region that does not exist
/// leaks a slot the same way. Then the real name still connects.
#[test]
fn shm_names_of_no_region_are_refused() {
    if common::skip_without_provider("shm") {
        return;
    }
    let shm = (LibfabricParams::with_provider("shm")).op_timeout(Duration::from_millis(500));
    let p = pair("shm-names", shm.clone(), shm);
    let good = AgentMetadata::decode_bytes(&p.b.local_metadata().unwrap()).unwrap();
    let conn = &good.backends[0].conn_info;
    let at = shm_name_at(conn);
    // The last character before the NUL (a digit of the endpoint's index).
    let last = at.end - 2;
    let mut slash = conn.clone();
    slash[last] = b'/';
    let mut missing = conn.clone();
    missing[last] = if conn[last] == b'9' {
        b'8'
    } else {
        conn[last] + 1
    };
    for (what, conn) in [("a path", slash), ("a region that does not exist", missing)] {
        for round in 0..3 {
            let mut md = good.clone();
            md.name = format!("{}-alias-{round}", good.name);
            // Claiming no process, so the name itself is what is checked (an unknown name
            // claiming this process is refused before any backend sees it).
            md.process = None;
            md.backends[0].conn_info = conn.clone();
            let r = p.a.load_remote_metadata(&md.encode());
            assert!(
                matches!(r, Err(Error::InvalidParam { .. })),
                "{what} (round {round}): {r:?}"
            );
        }
    }
    p.a.load_remote_metadata(&good.encode()).unwrap();
    p.a.gen_notif(p.b.name(), b"ok", &[]).unwrap();
    assert_eq!(
        p.b.wait_notifs(Duration::from_secs(20)).unwrap()[p.a.name()],
        vec![b"ok".to_vec()]
    );
}

/// shm names carry the pid and the endpoint's index in its process, so their length varies:
/// a peer whose name is longer or shorter than this agent's own connects (an exact-length
/// rule refused it).
#[test]
fn shm_names_of_other_lengths_connect() {
    if common::skip_without_provider("shm") {
        return;
    }
    let name_of = |a: &Agent| {
        let md = AgentMetadata::decode_bytes(&a.local_metadata().unwrap()).unwrap();
        let conn = &md.backends[0].conn_info;
        conn[shm_name_at(conn)].to_vec()
    };
    let first = agent("len-0");
    first
        .create_backend(LibfabricParams::with_provider("shm"))
        .unwrap();
    let own = name_of(&first);
    // Endpoint indexes count up per process: one of these crosses a power of ten.
    let mut other = None;
    for i in 1..=120 {
        let a = agent(&format!("len-{i}"));
        a.create_backend(LibfabricParams::with_provider("shm"))
            .unwrap();
        if name_of(&a).len() != own.len() {
            other = Some(a);
            break;
        }
    }
    let other = other.expect("an shm endpoint name of another length");
    eprintln!(
        "{:?} <-> {:?}",
        own.escape_ascii().to_string(),
        name_of(&other).escape_ascii().to_string()
    );
    first
        .load_remote_metadata(&other.local_metadata().unwrap())
        .unwrap();
    other
        .load_remote_metadata(&first.local_metadata().unwrap())
        .unwrap();
    first.gen_notif(other.name(), b"to", &[]).unwrap();
    other.gen_notif(first.name(), b"fro", &[]).unwrap();
    assert_eq!(
        other.wait_notifs(Duration::from_secs(20)).unwrap()[first.name()],
        vec![b"to".to_vec()]
    );
    assert_eq!(
        first.wait_notifs(Duration::from_secs(20)).unwrap()[other.name()],
        vec![b"fro".to_vec()]
    );
}

/// A peer cannot reach the notification buffers by guessing their keys (tcp addresses by
/// offset, so a key is all it takes, and tcp;ofi_rxm leaves every registration remotely
/// readable): the `unpack_key` fuzz target read a target's notification buffers with a key one
/// bit away from its region's when keys were sequential (1, 2, 3, ...). Keys are now
/// unpredictable, and the buffers are registered for messages only. The region's own key
/// still works.
#[test]
fn notification_buffers_are_not_remotely_accessible() {
    if common::skip_without_provider("tcp") {
        return;
    }
    let params = LibfabricParams::tcp_loopback(1).op_timeout(Duration::from_secs(2));
    let p = pair("pool-keys", params.clone(), params);
    let good = AgentMetadata::decode_bytes(&p.b.local_metadata().unwrap()).unwrap();
    let public = &good.regions[0].public;
    // Region metadata ends in the key (one rail: one key, 8 bytes little-endian).
    let at = public.len() - 8;
    let real = u64::from_le_bytes(public[at..].try_into().unwrap());
    let (x, y) = (&p._bufs.0, &p._bufs.1);
    let read = |name: &str| {
        let req = p.a.create_xfer_req(
            XferOp::Read,
            &XferDescList::blocks(MemKind::Dram, x.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, y.addr(), 4096, 1),
            name,
            XferOptions::default().timeout(Duration::from_secs(2)),
        )?;
        p.a.post_xfer_req(&req)?;
        req.wait(Duration::from_secs(10))
    };
    let near = (0..64).map(|bit| real ^ (1 << bit));
    for key in (1..=8).chain(near).filter(|&k| k != real) {
        // Under the target's own name (a peer naming an endpoint of this process must be the
        // agent here that owns it), loaded afresh with the guessed key each time.
        let mut md = good.clone();
        md.regions[0].public[at..].copy_from_slice(&u64::to_le_bytes(key));
        // The target's provider drops the connection over a refused read; connecting again
        // may take a moment.
        load_retrying(&p.a, &md.encode());
        let r = read(&md.name);
        assert!(
            r.is_err(),
            "a read with key {key} (not the region's {real}): {r:?}"
        );
        p.a.invalidate_remote_metadata(&md.name).unwrap();
    }
    load_retrying(&p.a, &good.encode());
    read(p.b.name()).unwrap();
}

fn load_retrying(a: &Agent, md: &[u8]) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match a.load_remote_metadata(md) {
            Ok(_) => return,
            Err(e @ (Error::RemoteDisconnect { .. } | Error::TimedOut { .. }))
                if std::time::Instant::now() < end =>
            {
                eprintln!("loading again after: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("loading metadata: {e}"),
        }
    }
}

/// A peer whose endpoint names are this agent's own (its metadata under a new name, naming no
/// process), with a region at one of the agent's own buffers and that buffer's key: the
/// agent's WRITE "to the peer" would go to itself and land in its own memory. Refused at
/// load, `NotAllowed`, over tcp and shm; nothing lands.
#[test]
fn a_peer_naming_this_agents_own_endpoints_is_refused() {
    let mut landed = Vec::new();
    for (provider, params) in [
        ("tcp", LibfabricParams::tcp_loopback(1)),
        ("shm", LibfabricParams::with_provider("shm")),
    ] {
        if common::skip_without_provider(provider) {
            continue;
        }
        let v = agent(&format!("own-{provider}"));
        v.create_backend(params).unwrap();
        let secret = Arc::new(HostBuffer::new(4096).unwrap());
        secret.fill(0x11);
        let src = Arc::new(HostBuffer::new(4096).unwrap());
        src.fill(0xEE);
        let _r1 = v.register_mem(vec![secret.clone()], &[]).unwrap();
        let _r2 = v.register_mem(vec![src.clone()], &[]).unwrap();
        let mut md = AgentMetadata::decode_bytes(&v.local_metadata().unwrap()).unwrap();
        md.name = format!("{}-liar", v.name());
        md.process = None;
        let at = md
            .regions
            .iter()
            .position(|r| r.desc.addr == secret.addr())
            .expect("the secret's region");
        md.regions.swap(0, at);
        let loaded = v.load_remote_metadata(&md.encode());
        let outcome = loaded.as_ref().map_err(|e| e.clone()).and_then(|name| {
            let req = v.create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, src.addr(), 4096, 1),
                &XferDescList::blocks(MemKind::Dram, secret.addr(), 4096, 1),
                name,
                XferOptions::default().timeout(Duration::from_secs(2)),
            )?;
            v.post_xfer_req(&req)?;
            req.wait(Duration::from_secs(10))
        });
        if !secret.to_vec().iter().all(|&b| b == 0x11) {
            landed.push(format!(
                "{provider}: the WRITE landed in the agent's own buffer ({outcome:?})"
            ));
        } else if !matches!(loaded, Err(Error::NotAllowed { .. })) {
            landed.push(format!("{provider}: loaded ({loaded:?}), then {outcome:?}"));
        }
    }
    assert!(landed.is_empty(), "{}", landed.join("\n"));
}
