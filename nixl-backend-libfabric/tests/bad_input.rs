//! Bad input gets a typed error and changes nothing: parameters, connection info, region
//! metadata, notifications, memory kinds.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nixl_backend_libfabric::{LibfabricParams, LibfabricPlugin};
use nixl_core::codec::AgentMetadata;
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, RawRegion, RegionDesc, XferDescList, XferOp,
    XferOptions,
};

fn agent(tag: &str) -> Agent {
    let config = AgentConfig {
        plugins: vec![Arc::new(LibfabricPlugin)],
        ..AgentConfig::default()
    };
    Agent::new(&format!("bad-{tag}-{}", std::process::id()), config).unwrap()
}

#[test]
fn bad_params_are_refused() {
    let a = agent("params");
    for p in [
        LibfabricParams {
            rails: 0,
            ..LibfabricParams::tcp_loopback(1)
        },
        LibfabricParams {
            notif_size: 1,
            ..LibfabricParams::tcp_loopback(1)
        },
        LibfabricParams {
            notif_slots: 0,
            ..LibfabricParams::tcp_loopback(1)
        },
        LibfabricParams {
            op_timeout: Duration::ZERO,
            ..LibfabricParams::tcp_loopback(1)
        },
        LibfabricParams {
            stripe_min: 0,
            ..LibfabricParams::tcp_loopback(1)
        },
        LibfabricParams {
            provider: Some(String::new()),
            ..Default::default()
        },
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
        LibfabricParams {
            domains: vec!["no-such-domain".into()],
            ..LibfabricParams::tcp_loopback(1)
        },
        // One of two domains missing: refused, not two rails on the one that exists.
        LibfabricParams {
            domains: vec!["lo".into(), "no-such-domain".into()],
            ..LibfabricParams::tcp_loopback(2)
        },
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
    let good = AgentMetadata::decode(&p.b.local_metadata().unwrap()).unwrap();
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
    let small = LibfabricParams {
        notif_size: 256,
        ..LibfabricParams::tcp_loopback(1)
    };
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
