//! Interoperability with stock NIXL (the PyPI nixl-cu13 wheel through its Python API, in a
//! child process: `nixl-core/testkit/py/nixl_peer.py`), over UCX tcp and shared memory, both sides loading
//! the wheel's own libucp. Every byte moved is verified.
//!
//! Needs `scripts/deps/nixl.sh` (NIXL_PYTHONPATH, NIXL_WHEEL_UCX); without it the tests skip
//! with `Dep::Nixl`, which CI does not allow.

use nixl_testkit::ucx as common;
use nixl_testkit::ucx::nixl_peer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_ucx::{UcxError, UcxParams};
use nixl_core::nixl_wire::{NixlListener, NixlMetadata, Wire, NIXL_PEER_NOTE};
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
};
use nixl_peer::{nixl_or_skip, pattern, NixlEnv, NixlPeer};
use serde_json::json;

const LEN: usize = 256 << 10;
const WAIT: Duration = Duration::from_secs(20);

/// A nixl-rs agent on the wheel's UCX, mirroring NIXL's UCX context.
fn rs_agent(env: &NixlEnv, role: &str, tls: &str) -> Agent {
    rs_agent_named(env, &common::unique(role), tls)
}

/// Like [`rs_agent`] with a given name.
fn rs_agent_named(env: &NixlEnv, name: &str, tls: &str) -> Agent {
    let a = Agent::new(name, AgentConfig::default().default_timeout(WAIT)).expect("agent");
    a.create_backend(
        UcxParams::default()
            .library_path(env.ucx.clone())
            .transports(tls.to_owned())
            .keepalive_interval(Duration::from_millis(500))
            .nixl_compat(true),
    )
    .expect("UCX backend on the wheel's libucp");
    a
}

fn buf(len: usize, seed: Option<u64>) -> Arc<HostBuffer> {
    let b = common::buf(len);
    match seed {
        Some(s) => assert!(b.write_at(0, &pattern(len, s))),
        None => b.fill(0),
    }
    b
}

fn dram(addr: u64, len: usize) -> XferDescList {
    XferDescList::blocks(MemKind::Dram, addr, len as u64, 1)
}

/// WRITEs `LEN` bytes from `src` into NIXL peer `peer`'s memory at `dst` with notification
/// `msg`, then checks that NIXL got the notification from us and holds `pattern(LEN, seed)`.
fn write_to_nixl(
    rs: &Agent,
    src: &HostBuffer,
    py: &mut NixlPeer,
    peer: &str,
    dst: u64,
    msg: &[u8],
    seed: u64,
) {
    let req = rs
        .create_xfer_req(
            XferOp::Write,
            &dram(src.addr(), LEN),
            &dram(dst, LEN),
            peer,
            XferOptions::with_notif(msg.to_vec()),
        )
        .expect("request");
    rs.post_xfer_req(&req).expect("post");
    req.wait(WAIT).expect("WRITE completes");
    assert_eq!(
        py.notifs(1, WAIT),
        vec![(rs.name().to_owned(), msg.to_vec())]
    );
    assert!(
        py.read(dst, LEN) == pattern(LEN, seed),
        "every byte we wrote is in NIXL's memory"
    );
}

/// The NIXL peer WRITEs `LEN` bytes from its `py_src` into `rs`'s `dst` with notification
/// `msg`; checks that `rs` got the notification from it and holds `pattern(LEN, seed)`.
fn write_from_nixl(
    rs: &Agent,
    py: &mut NixlPeer,
    py_src: u64,
    dst: &HostBuffer,
    msg: &[u8],
    seed: u64,
) {
    let st = py.xfer("WRITE", py_src, dst.addr(), LEN, rs.name(), msg);
    assert_eq!(st, "DONE");
    let n = rs.wait_notifs(WAIT).expect("the notification arrives");
    assert_eq!(n[&py.name], vec![msg.to_vec()]);
    assert!(
        dst.to_vec() == pattern(LEN, seed),
        "every byte NIXL wrote is in place"
    );
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn nixl_to_rs(tls: &str) {
    let test = format!(
        "nixl_initiator_to_nixl_rs_target_{}",
        if tls == common::TCP { "tcp" } else { "shm" }
    );
    let Some(env) = nixl_or_skip(&test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-target", tls);
    let (dst, src) = (buf(LEN, None), buf(LEN, Some(5)));
    let _regs = rs
        .register_mem(vec![dst.clone(), src.clone()], &[])
        .expect("register");
    let mut py = NixlPeer::start(&env, &common::unique("py-init"), tls, &[]);
    let (py_src, py_dst) = (py.alloc(LEN, Some(9)), py.alloc(LEN, None));
    // NIXL loads our blob; it needs nothing else from us (a notification names its sender).
    assert_eq!(
        py.load(&rs.nixl().local_metadata().expect("md"))
            .expect("NIXL loads it"),
        rs.name()
    );

    write_from_nixl(&rs, &mut py, py_src, &dst, b"kv-ready", 9);

    assert_eq!(
        py.xfer("READ", py_dst, src.addr(), LEN, rs.name(), b""),
        "DONE"
    );
    assert!(
        py.read(py_dst, LEN) == pattern(LEN, 5),
        "every byte NIXL read is ours"
    );
}

#[test]
fn nixl_initiator_to_nixl_rs_target_tcp() {
    nixl_to_rs(common::TCP);
}

#[test]
fn nixl_initiator_to_nixl_rs_target_shm() {
    nixl_to_rs(common::SHM);
}

fn rs_to_nixl(tls: &str) {
    let test = format!(
        "nixl_rs_initiator_to_nixl_target_{}",
        if tls == common::TCP { "tcp" } else { "shm" }
    );
    let Some(env) = nixl_or_skip(&test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-init", tls);
    let (src, dst) = (buf(LEN, Some(3)), buf(LEN, None));
    let _regs = rs
        .register_mem(vec![src.clone(), dst.clone()], &[])
        .expect("register");
    let mut py = NixlPeer::start(&env, &common::unique("py-target"), tls, &[]);
    let (py_dst, py_src) = (py.alloc(LEN, None), py.alloc(LEN, Some(11)));
    let name = rs
        .load_remote_metadata(&py.metadata())
        .expect("a NIXL blob loads");
    assert_eq!(name, py.name);
    assert_eq!(rs.peer_wire(&name), Some(Wire::Nixl));
    let report = rs.path_report(&name);
    assert!(
        report
            .iter()
            .any(|(b, p)| b == "UCX" && p.contains("UCX 1.")),
        "{report:?}"
    );
    assert!(report.contains(&("wire".to_owned(), NIXL_PEER_NOTE.to_owned())));
    if tls == common::SHM {
        assert!(
            report.iter().all(|(_, p)| !p.contains("tcp/")),
            "{report:?}"
        );
    }

    write_to_nixl(&rs, &src, &mut py, &name, py_dst, b"layer-0 done", 3);

    let req = rs
        .create_xfer_req(
            XferOp::Read,
            &dram(dst.addr(), LEN),
            &dram(py_src, LEN),
            &name,
            XferOptions::default(),
        )
        .expect("request");
    rs.post_xfer_req(&req).expect("post");
    req.wait(WAIT).expect("READ completes");
    assert!(
        dst.to_vec() == pattern(LEN, 11),
        "every byte read from NIXL"
    );

    // Integrity frames cannot be checked by a NIXL target: refused, not silently dropped.
    let e = rs
        .create_xfer_req(
            XferOp::Write,
            &dram(src.addr(), LEN),
            &dram(py_dst, LEN),
            &name,
            XferOptions::default().integrity(true),
        )
        .expect_err("integrity to a NIXL peer");
    assert!(matches!(e, Error::NotSupported { .. }), "{e}");
}

#[test]
fn nixl_rs_initiator_to_nixl_target_tcp() {
    rs_to_nixl(common::TCP);
}

#[test]
fn nixl_rs_initiator_to_nixl_target_shm() {
    rs_to_nixl(common::SHM);
}

#[test]
fn standalone_notifications_both_ways() {
    let test = "standalone_notifications_both_ways";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-notif", common::TCP);
    let mut py = NixlPeer::start(&env, &common::unique("py-notif"), common::TCP, &[]);
    rs.load_remote_metadata(&py.metadata()).expect("load");
    py.load(&rs.nixl().local_metadata().expect("md"))
        .expect("NIXL loads");
    let binary: Vec<u8> = (0..=255u8).collect();
    for m in [&b"hello"[..], &binary[..]] {
        rs.gen_notif(&py.name, m, &[]).expect("gen_notif");
    }
    let got = py.notifs(2, WAIT);
    let want = vec![
        (rs.name().to_owned(), b"hello".to_vec()),
        (rs.name().to_owned(), binary.clone()),
    ];
    assert_eq!(got, want);
    py.ok(json!({"op": "gen_notif", "remote": rs.name(), "msg": nixl_peer::hex(&binary)}));
    let n = rs.wait_notifs(WAIT).expect("NIXL's notification");
    assert_eq!(n[&py.name], vec![binary]);
}

#[test]
fn side_channel_nixl_listens() {
    let test = "side_channel_nixl_listens";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-client", common::TCP);
    let src = buf(LEN, Some(21));
    let _r = rs.register_mem(vec![src.clone()], &[]).expect("register");
    let (mut py, port) = NixlPeer::start_listening(&env, &common::unique("py-server"), common::TCP);
    let py_dst = py.alloc(LEN, None);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // Fetch (NIXLCOMM:SEND, answered with LOAD on the same connection), then push ours.
    let name = rs
        .nixl()
        .fetch_remote_metadata_blocking(&py.name, addr, WAIT)
        .expect("fetch from NIXL");
    assert_eq!(name, py.name);
    rs.nixl().send_local_metadata(addr).expect("send to NIXL");
    let st = py.ok(json!({"op": "check_md", "name": rs.name(), "wait": 10}));
    assert_eq!(st["loaded"], json!(true), "NIXL loaded what we sent");
    write_to_nixl(&rs, &src, &mut py, &name, py_dst, b"sc", 21);
    // Invalidation: NIXL forgets us.
    rs.nixl().invalidate_local_metadata(addr).expect("INVL");
    let st = py.ok(json!({"op": "check_md", "name": rs.name(), "want": false, "wait": 10}));
    assert_eq!(st["loaded"], json!(false), "NIXL dropped us after INVL");
    // Asking the wrong name is refused and loads nothing new.
    let e = rs
        .nixl()
        .fetch_remote_metadata_blocking("someone-else", addr, WAIT)
        .expect_err("wrong name");
    assert!(matches!(e, Error::Mismatch { .. }), "{e}");
}

#[test]
fn side_channel_nixl_rs_listens() {
    let test = "side_channel_nixl_rs_listens";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-server", common::TCP);
    let dst = buf(LEN, None);
    let _r = rs.register_mem(vec![dst.clone()], &[]).expect("register");
    let listener = NixlListener::start(&rs, SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen");
    let port = listener.local_addr().port();
    // NIXL reads a fetch's answer on its own listener thread, so it listens too.
    let mut py = NixlPeer::start_listening(&env, &common::unique("py-client"), common::TCP).0;
    let py_src = py.alloc(LEN, Some(33));
    py.ok(json!({"op": "fetch_md", "name": rs.name(), "ip": "127.0.0.1", "port": port}));
    let st = py.ok(json!({"op": "check_md", "name": rs.name(), "wait": 10}));
    assert_eq!(
        st["loaded"],
        json!(true),
        "NIXL fetched our metadata from our listener"
    );
    py.ok(json!({"op": "send_md", "ip": "127.0.0.1", "port": port}));
    eventually("NIXL's LOAD", || rs.remotes().contains(&py.name));
    assert_eq!(rs.peer_wire(&py.name), Some(Wire::Nixl));
    write_from_nixl(&rs, &mut py, py_src, &dst, b"via-listener", 33);
    // NIXL invalidates itself: we forget it.
    py.ok(json!({"op": "invalidate_local", "ip": "127.0.0.1", "port": port}));
    eventually("NIXL's INVL", || !rs.remotes().contains(&py.name));
}

#[test]
fn nixl_peer_restart_fences_old_requests() {
    let test = "nixl_peer_restart_fences_old_requests";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-restart", common::TCP);
    let src = buf(LEN, Some(44));
    let _r = rs.register_mem(vec![src.clone()], &[]).expect("register");
    let name = common::unique("py-restart");
    let mut py = NixlPeer::start(&env, &name, common::TCP, &[]);
    let dst1 = py.alloc(LEN, None);
    rs.load_remote_metadata(&py.metadata()).expect("load");
    let gen1 = rs.remote_generation(&name).expect("loaded");
    let old = rs
        .create_xfer_req(
            XferOp::Write,
            &dram(src.addr(), LEN),
            &dram(dst1, LEN),
            &name,
            XferOptions::default(),
        )
        .expect("request");
    drop(py); // the NIXL process exits
    let mut py = NixlPeer::start(&env, &name, common::TCP, &[]);
    let dst2 = py.alloc(LEN, None);
    rs.load_remote_metadata(&py.metadata())
        .expect("the new incarnation loads");
    assert_ne!(
        rs.remote_generation(&name),
        Some(gen1),
        "a new worker address is a new incarnation"
    );
    let e = rs
        .post_xfer_req(&old)
        .expect_err("a request built against the old process");
    assert!(matches!(e, Error::PeerRestarted { .. }), "{e}");
    write_to_nixl(&rs, &src, &mut py, &name, dst2, b"again", 44);
}

#[test]
fn nixl_peer_killed_mid_transfer_is_a_typed_error() {
    let test = "nixl_peer_killed_mid_transfer_is_a_typed_error";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    const BIG: usize = 64 << 20;
    let rs = rs_agent(&env, "rs-kill", common::TCP);
    let src = buf(BIG, Some(1));
    let _r = rs.register_mem(vec![src.clone()], &[]).expect("register");
    let mut py = NixlPeer::start(&env, &common::unique("py-kill"), common::TCP, &[]);
    let dst = py.alloc(BIG, None);
    let name = rs.load_remote_metadata(&py.metadata()).expect("load");
    let blocks = 64;
    let req = rs
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), (BIG / blocks) as u64, blocks),
            &XferDescList::blocks(MemKind::Dram, dst, (BIG / blocks) as u64, blocks),
            &name,
            XferOptions::with_notif(b"never".to_vec()),
        )
        .expect("request");
    rs.post_xfer_req(&req).expect("post");
    py.kill();
    let t = Instant::now();
    match req.wait(WAIT) {
        // The 64 MiB may have landed before the kill on a fast machine; then the next one
        // must fail.
        Ok(()) => {
            rs.post_xfer_req(&req).ok();
            let e = req.wait(WAIT).expect_err("a write to a dead NIXL process");
            assert!(
                matches!(e, Error::RemoteDisconnect { .. } | Error::TimedOut { .. }),
                "{e}"
            );
        }
        Err(e) => assert!(
            matches!(e, Error::RemoteDisconnect { .. } | Error::TimedOut { .. }),
            "{e}"
        ),
    }
    assert!(
        t.elapsed() <= WAIT * 2 + Duration::from_secs(5),
        "ended within the deadline"
    );
}

#[test]
fn nixl_blobs_from_another_ucx_or_damaged_change_nothing() {
    let test = "nixl_blobs_from_another_ucx_or_damaged_change_nothing";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let rs = rs_agent(&env, "rs-hostile", common::TCP);
    let mut py = NixlPeer::start(&env, &common::unique("py-hostile"), common::TCP, &[]);
    py.alloc(4096, Some(1));
    let good = NixlMetadata::decode_bytes(&py.metadata()).expect("decodes");
    // The peer's address claims another UCX minor version (the release nibble of the v1
    // trailer): refused, naming both versions.
    let mut other = good.clone();
    let info = &mut other.conns[0].info;
    let n = info.len();
    info[n - 2] = 0x80 | (((info[n - 2] & 0x0f) + 15) % 16);
    let e = rs
        .load_remote_metadata(&other.encode())
        .expect_err("another UCX");
    let Error::Backend {
        message,
        source: Some(src),
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert!(
        matches!(
            src.downcast_ref::<UcxError>(),
            Some(UcxError::VersionMismatch { .. })
        ),
        "{e}"
    );
    assert!(
        message.contains(&format!(
            "UCX {}",
            nixl_backend_ucx::probe(&UcxParams::default())
                .expect("ucx")
                .0
        )),
        "{message}"
    );
    // An address version UCX would abort on.
    let mut v9 = good.clone();
    v9.conns[0].info[0] = (v9.conns[0].info[0] & 0xf0) | 9;
    assert!(matches!(
        rs.load_remote_metadata(&v9.encode()),
        Err(Error::InvalidParam { .. })
    ));
    // A truncated rkey.
    let mut short = good.clone();
    short.sections[0].descs[0].public.truncate(5);
    assert!(matches!(
        rs.load_remote_metadata(&short.encode()),
        Err(Error::InvalidParam { .. })
    ));
    // A DRAM region carrying a CUDA rkey.
    let mut cuda = good.clone();
    cuda.sections[0].descs[0].public[8] = 1;
    assert!(matches!(
        rs.load_remote_metadata(&cuda.encode()),
        Err(Error::Mismatch { .. })
    ));
    assert!(rs.remotes().is_empty(), "nothing was loaded");
    assert_eq!(
        rs.load_remote_metadata(&good.encode())
            .expect("the real one loads"),
        py.name
    );
}

#[test]
fn metadata_by_etcd_under_nixls_keys() {
    use nixl_core::etcd::{EtcdConfig, EtcdExchange, LocalEtcd};
    let test = "metadata_by_etcd_under_nixls_keys";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let etcd = match LocalEtcd::start() {
        Ok(e) => e,
        Err(e) => {
            nixl_testkit::skip(test, nixl_testkit::Dep::Etcd, e);
            return;
        }
    };
    let rs = rs_agent(&env, "rs-etcd", common::TCP);
    let src = buf(LEN, Some(55));
    let _r = rs.register_mem(vec![src.clone()], &[]).expect("register");
    let endpoint = etcd.endpoint();
    let mut py = NixlPeer::start_bare(&env, common::TCP, &[("NIXL_ETCD_ENDPOINTS", &endpoint)]);
    py.name = common::unique("py-etcd");
    py.ok(json!({"op": "init", "name": py.name}));
    let py_dst = py.alloc(LEN, None);
    py.ok(json!({"op": "send_md"}));
    let x = EtcdExchange::new(
        &rs,
        &EtcdConfig::default()
            .endpoints(vec![endpoint])
            .nixl_keys(true),
    )
    .expect("etcd");
    assert_eq!(
        x.key(&py.name, "metadata"),
        format!("/nixl/agents//{}/metadata", py.name)
    );
    assert_eq!(
        x.fetch(&py.name, WAIT).expect("NIXL's blob from etcd"),
        py.name
    );
    x.publish().expect("publish under NIXL's keys");
    py.ok(json!({"op": "fetch_md", "name": rs.name()}));
    let st = py.ok(json!({"op": "check_md", "name": rs.name(), "wait": 10}));
    assert_eq!(st["loaded"], json!(true), "NIXL fetched our blob from etcd");
    let peer = py.name.clone();
    write_to_nixl(&rs, &src, &mut py, &peer, py_dst, b"etcd", 55);
    // Each side's invalidation (a delete of its prefix) reaches the other through its watch.
    x.invalidate_local().expect("delete our keys");
    let st = py.ok(json!({"op": "check_md", "name": rs.name(), "want": false, "wait": 10}));
    assert_eq!(st["loaded"], json!(false), "NIXL saw our prefix deleted");
    py.ok(json!({"op": "invalidate_local"}));
    eventually("NIXL's delete", || !rs.remotes().contains(&py.name));
}

/// NIXL 1.5's c10d TCPStore metadata backend (`NIXL_TCPSTORE_ENDPOINT`) and nixl-rs's
/// `TcpStoreExchange` through one store: nixl-rs's server, and PyTorch's own where torch
/// imports (the GPU machines). NIXL before 1.5 has no TCPStore backend: its publication
/// never reaches the store, and nixl-rs's fetch ends `NotFound` within its wait.
#[test]
fn metadata_by_tcpstore_both_ways() {
    use nixl_core::tcpstore::{
        TcpStoreClient, TcpStoreConfig, TcpStoreExchange, TcpStoreServer, TcpStoreServerConfig,
    };
    let test = "metadata_by_tcpstore_both_ways";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let ours = TcpStoreServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        &TcpStoreServerConfig::default(),
    )
    .expect("store");
    let torch = nixl_testkit::torch_store::TorchStore::serve(test);
    let mut stores = vec![("nixl-rs", ours.endpoint())];
    if let Some(t) = &torch {
        stores.push(("PyTorch", t.endpoint()));
    }
    let has_tcpstore = !env.version.starts_with("1.3.") && !env.version.starts_with("1.4.");
    // NIXL 1.5 refuses a UCX_TLS without a CUDA transport on a host with NVIDIA GPUs.
    let tls = if nixl_mem::cuda_is_available() {
        "tcp,cuda_copy"
    } else {
        common::TCP
    };
    for (host, endpoint) in stores {
        println!(
            "{test}: NIXL {} through {host}'s TCPStore at {endpoint}",
            env.version
        );
        let rs = rs_agent(&env, "rs-tcpstore", tls);
        let (src, dst) = (buf(LEN, Some(77)), buf(LEN, None));
        let _r = rs
            .register_mem(vec![src.clone(), dst.clone()], &[])
            .expect("register");
        let mut py = NixlPeer::start_bare(&env, tls, &[("NIXL_TCPSTORE_ENDPOINT", &endpoint)]);
        py.name = common::unique("py-tcpstore");
        py.ok(json!({"op": "init", "name": py.name}));
        let (py_dst, py_src) = (py.alloc(LEN, None), py.alloc(LEN, Some(78)));
        let x = TcpStoreExchange::new(
            &rs,
            &TcpStoreConfig::default()
                .endpoint(endpoint.clone())
                .nixl_blobs(true)
                .watch_interval(Some(Duration::from_millis(100))),
        )
        .expect("exchange");
        assert_eq!(
            x.key(&py.name, "metadata"),
            format!("nixl/agents/metadata/{}/NULL_AGENT", py.name)
        );
        let sent = py.call(json!({"op": "send_md"}));
        if !has_tcpstore {
            assert!(
                sent.as_ref()
                    .is_err_and(|e| e.contains("NIXL_ERR_INVALID_PARAM")),
                "NIXL {} refuses a publication with no address: {sent:?}",
                env.version
            );
            let e = x
                .fetch(&py.name, Duration::from_secs(2))
                .expect_err("NIXL before 1.5 publishes nothing to a TCPStore");
            assert!(matches!(e, Error::NotFound { .. }), "{e}");
            println!("{test}: NIXL {} has no TCPStore backend (send_md: {sent:?}); nothing published, fetch NotFound", env.version);
            return;
        }
        sent.expect("NIXL publishes to the store");
        assert_eq!(x.fetch(&py.name, WAIT).expect("NIXL's blob"), py.name);
        x.publish().expect("publish under NIXL's key");
        py.ok(json!({"op": "fetch_md", "name": rs.name()}));
        let st = py.ok(json!({"op": "check_md", "name": rs.name(), "wait": 10}));
        assert_eq!(
            st["loaded"],
            json!(true),
            "NIXL fetched our blob from the store"
        );
        // Both directions, each with its notification.
        let peer = py.name.clone();
        write_to_nixl(&rs, &src, &mut py, &peer, py_dst, b"tcpstore", 77);
        write_from_nixl(&rs, &mut py, py_src, &dst, b"back", 78);
        // NIXL invalidates itself (deletes its key): our watch invalidates it here.
        py.ok(json!({"op": "invalidate_local"}));
        eventually("NIXL's key deleted", || !rs.remotes().contains(&py.name));
        // Ours: the key is gone for every later fetch (NIXL's backend has no watch).
        x.invalidate_local().expect("delete our key");
        let mut c = TcpStoreClient::connect(&endpoint, "check", WAIT).expect("client");
        assert_eq!(c.get(&x.key(rs.name(), "metadata")).expect("get"), None);
    }
}

#[test]
fn nixl_rs_restart_needs_invalidation_on_nixl() {
    let test = "nixl_rs_restart_needs_invalidation_on_nixl";
    let Some(env) = nixl_or_skip(test) else {
        return;
    };
    let (mut py, port) = NixlPeer::start_listening(&env, &common::unique("py-fence"), common::TCP);
    let py_src = py.alloc(LEN, Some(66));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let name = common::unique("rs-restarting");
    let first = rs_agent_named(&env, &name, common::TCP);
    first.nixl().send_local_metadata(addr).expect("send");
    let st = py.ok(json!({"op": "check_md", "name": name, "wait": 10}));
    assert_eq!(st["loaded"], json!(true));
    drop(first); // the nixl-rs process "restarts": same name, new worker address
    let second = rs_agent_named(&env, &name, common::TCP);
    let dst = buf(LEN, None);
    let _r = second
        .register_mem(vec![dst.clone()], &[])
        .expect("register");
    let blob = second.nixl().local_metadata().expect("md");
    let e = py
        .load(&blob)
        .expect_err("NIXL refuses new connection info for a loaded name");
    assert!(e.contains("NOT_ALLOWED"), "{e}");
    // The documented way back: invalidate first, then publish again.
    second.nixl().invalidate_local_metadata(addr).expect("INVL");
    let st = py.ok(json!({"op": "check_md", "name": name, "want": false, "wait": 10}));
    assert_eq!(st["loaded"], json!(false));
    assert_eq!(py.load(&blob).expect("loads after INVL"), name);
    write_from_nixl(&second, &mut py, py_src, &dst, b"back", 66);
}
