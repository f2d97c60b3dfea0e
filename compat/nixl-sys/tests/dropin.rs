//! The drop-in beyond nixl-sys's own tests: what a nixl-sys program relies on, and what
//! nixl-rs adds (typed reports, memory kept alive, refusals instead of silent no-ops).

use nixl_sys::*;
use std::collections::HashMap;

fn ucx_agent(name: &str) -> (Agent, OptArgs) {
    let agent = Agent::new(name).expect("agent");
    let (_m, params) = agent.get_plugin_params("UCX").expect("params");
    let b = agent.create_backend("UCX", &params).expect("UCX backend");
    let mut opt = OptArgs::new().expect("opt");
    opt.add_backend(&b).expect("add");
    (agent, opt)
}

#[test]
fn partial_metadata_of_a_registration_is_sent() {
    let (agent, opt) = ucx_agent("partial-sender");
    let mut s = SystemStorage::new(4096).expect("storage");
    s.register(&agent, Some(&opt)).expect("register");
    let mut descs = RegDescList::new(MemType::Dram).expect("list");
    descs.add_storage_desc(&s).expect("desc");
    let md = agent.get_local_partial_md(&descs, Some(&opt));
    assert!(md.is_ok(), "{md:?} {:?}", last_error());
}

/// nixl-sys's test helpers register one storage twice and drop the second handle: the first
/// registration stays, and so does its partial metadata.
#[test]
fn a_second_registration_dropped_leaves_the_first() {
    let (agent, opt) = ucx_agent("twice");
    let mut s = SystemStorage::new(4096).expect("storage");
    s.register(&agent, Some(&opt)).expect("register");
    drop(agent.register_memory(&s, Some(&opt)).expect("again"));
    let mut descs = RegDescList::new(MemType::Dram).expect("list");
    descs.add_storage_desc(&s).expect("desc");
    let md = agent.get_local_partial_md(&descs, Some(&opt));
    assert!(md.is_ok(), "{md:?} {:?}", last_error());
    let mut other = RegDescList::new(MemType::Dram).expect("list");
    other.add_desc(0x1000, 16, 0);
    assert!(matches!(
        agent.get_local_partial_md(&other, None),
        Err(NixlError::NotFound)
    ));
    assert_eq!(
        last_error().map(|e| e.kind),
        Some(nixl::ErrorKind::NotFound)
    );
}

fn kind() -> Option<nixl::ErrorKind> {
    last_error().map(|e| e.kind)
}

/// nixl-sys's byte form (bincode 1: `u32` type index, `u64` count, `u64` fields), so lists
/// move between a nixl-sys program and this crate; hostile bytes are refused before any
/// allocation.
#[test]
fn serialized_lists_are_nixl_sys_bytes_and_hostile_ones_are_refused() {
    let mut l = XferDescList::new(MemType::Vram).expect("list");
    l.add_desc(0x1000, 0x100, 7);
    let mut want = vec![1, 0, 0, 0];
    for v in [1u64, 0x1000, 0x100, 7] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(l.serialize().expect("bytes"), want);
    let mut r = RegDescList::new(MemType::File).expect("list");
    r.add_desc_with_meta(0, 10, 3, b"/p");
    let mut want = vec![4, 0, 0, 0];
    for v in [1u64, 0, 10, 3, 2] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    want.extend_from_slice(b"/p");
    assert_eq!(r.serialize().expect("bytes"), want);

    let mut huge = vec![0, 0, 0, 0];
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        XferDescList::deserialize(&huge),
        Err(NixlError::FailedToCreateXferDlistHandle)
    ));
    assert!(matches!(
        RegDescList::deserialize(&huge),
        Err(NixlError::RegDescListCreationFailed)
    ));
    let good = l.serialize().expect("bytes");
    for bad in [
        &good[..good.len() - 1],
        &[good.as_slice(), &[0]].concat()[..],
        &[&[9, 0, 0, 0][..], &good[4..]].concat()[..],
    ] {
        assert!(XferDescList::deserialize(bad).is_err(), "{bad:?}");
    }
    // A metadata length past the end.
    let mut meta = r.serialize().expect("bytes");
    let at = meta.len() - 2 - 8;
    meta[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(RegDescList::deserialize(&meta).is_err());
}

#[test]
fn bad_plugins_params_and_indices_are_typed_errors() {
    let (agent, opt) = ucx_agent("bad-inputs");
    assert!(matches!(
        agent.get_plugin_params("NO_SUCH_PLUGIN"),
        Err(NixlError::BackendError)
    ));
    assert!(matches!(
        agent.create_backend("UC\0X", &Params::from([("a", "b")]).expect("p")),
        Err(NixlError::InvalidParam)
    ));
    let p = Params::from([("no_such_key", "1")]).expect("params");
    assert!(matches!(
        agent.create_backend("POSIX", &p),
        Err(NixlError::InvalidParam)
    ));
    assert_eq!(kind(), Some(nixl::ErrorKind::InvalidParam));
    assert!(Params::from([("k\0", "v")]).is_err());

    let mut src = SystemStorage::new(4096).expect("storage");
    src.register(&agent, Some(&opt)).expect("register");
    let mut l = XferDescList::new(MemType::Dram).expect("list");
    l.add_storage_desc(&src).expect("desc");
    let h = agent.prepare_xfer_dlist("", &l, None).expect("prep");
    let me = agent
        .prepare_xfer_dlist(&agent.name(), &l, None)
        .expect("prep self");
    assert!(matches!(
        agent.make_xfer_req(XferOp::Write, &h, &[-1], &me, &[0], None),
        Err(NixlError::InvalidParam)
    ));
    assert!(matches!(
        agent.make_xfer_req(XferOp::Write, &h, &[0], &me, &[1], None),
        Err(NixlError::InvalidParam)
    ));
    assert!(matches!(
        agent.prepare_xfer_dlist("nobody", &l, None),
        Err(NixlError::NotFound)
    ));
    // A custom parameter no backend takes is refused, not ignored.
    let mut custom = OptArgs::new().expect("opt");
    custom.set_custom_param(b"worker_id=0").expect("set");
    assert!(matches!(
        agent.create_xfer_req(XferOp::Write, &l, &l, &agent.name(), Some(&custom)),
        Err(NixlError::InvalidParam)
    ));
    assert_eq!(kind(), Some(nixl::ErrorKind::NotSupported));
    // An Unknown memory type names no memory.
    let u = XferDescList::new(MemType::Unknown).expect("list");
    assert!(matches!(
        agent.prepare_xfer_dlist("", &u, None),
        Err(NixlError::InvalidParam)
    ));
    // NIXL's device API: refused, typed.
    // SAFETY: the call fails before touching memory.
    let v = unsafe { agent.prep_mem_view_local(&l, None) };
    assert!(matches!(v, Err(NixlError::BackendError)));
    assert_eq!(kind(), Some(nixl::ErrorKind::NotSupported));
    let mut rl = RemoteDescList::new(MemType::Vram).expect("list");
    rl.add_desc(&RemoteDescriptor {
        addr: 0x1000,
        len: 16,
        dev_id: 0,
        remote_agent: Some("nobody"),
    })
    .expect("add");
    // SAFETY: as above.
    let v = unsafe { agent.prep_mem_view_remote(&rl, None) };
    assert!(matches!(v, Err(NixlError::NotFound)));
    // Telemetry off: NoTelemetry, whatever the request's state.
    let req = agent
        .create_xfer_req(XferOp::Write, &l, &l, &agent.name(), None)
        .expect("loopback request");
    if std::env::var_os("NIXL_TELEMETRY_ENABLE").is_none() {
        assert!(matches!(req.get_telemetry(), Err(NixlError::NoTelemetry)));
    }
    assert!(matches!(
        agent.invalidate_remote_md("never-loaded"),
        Err(NixlError::InvalidParam)
    ));
}

/// Two UCX agents, `a` with `src` (filled with `fill`) and `b` with `dst`, `a` having loaded
/// `b`, and a WRITE request from `src` to `dst`.
struct WritePair {
    a: Agent,
    b: Agent,
    src: SystemStorage,
    dst: SystemStorage,
    req: XferRequest,
}

fn write_pair(role: &str, len: usize, fill: u8) -> WritePair {
    let (a, aopt) = ucx_agent(&format!("{role}-src"));
    let (b, bopt) = ucx_agent(&format!("{role}-dst"));
    let mut src = SystemStorage::new(len).expect("storage");
    src.memset(fill);
    src.register(&a, Some(&aopt)).expect("register");
    let mut dst = SystemStorage::new(len).expect("storage");
    dst.register(&b, Some(&bopt)).expect("register");
    let name = a
        .load_remote_md(&b.get_local_md().expect("md"))
        .expect("load");
    let mut l = XferDescList::new(MemType::Dram).expect("list");
    l.add_storage_desc(&src).expect("desc");
    let mut r = XferDescList::new(MemType::Dram).expect("list");
    r.add_storage_desc(&dst).expect("desc");
    let req = a
        .create_xfer_req(XferOp::Write, &l, &r, &name, None)
        .expect("request");
    WritePair {
        a,
        b,
        src,
        dst,
        req,
    }
}

/// nixl-sys's `SystemStorage` frees its bytes on drop even under a request; here the agent
/// keeps them until the request is gone, so the request still moves them.
#[test]
fn a_dropped_storage_stays_alive_under_its_request() {
    let WritePair {
        a,
        b: _b,
        src,
        dst,
        req,
    } = write_pair("keep", 4 << 20, 0x77);
    // 4 MiB: an allocation the size the allocator maps and unmaps on its own, so bytes freed
    // on drop (nixl-sys's `Vec`) would be unmapped and the transfer reading them would fail.
    drop(src);
    a.post_xfer_req(&req, None).expect("post");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while a.get_xfer_status(&req).expect("status") != XferStatus::Success {
        assert!(std::time::Instant::now() < end, "not done");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(dst.as_slice().iter().all(|&x| x == 0x77));
}

/// A request to a peer that is gone ends typed: nixl-sys's `BackendError`, and
/// [`last_error`] says `RemoteDisconnect` (NIXL's C API has no word for it).
#[test]
fn a_request_to_an_invalidated_peer_is_a_typed_error() {
    let p = write_pair("gone", 4096, 1);
    let name = p.b.name();
    p.a.invalidate_remote_md(&name).expect("invalidate");
    assert!(matches!(
        p.a.post_xfer_req(&p.req, None),
        Err(NixlError::BackendError)
    ));
    assert_eq!(
        kind(),
        Some(nixl::ErrorKind::RemoteDisconnect),
        "{:?}",
        last_error()
    );
    assert!(!p.a.check_remote_metadata(&name, None));
    drop((p.src, p.dst));
}

/// 100,000 descriptors: a list prepared once, a request by index over all of them, and the
/// byte form round-tripped.
#[test]
fn a_hundred_thousand_descriptors() {
    const N: usize = 100_000;
    let (agent, opt) = ucx_agent("scale");
    let mut s = SystemStorage::new(N * 64).expect("storage");
    s.register(&agent, Some(&opt)).expect("register");
    // SAFETY: only the address is taken.
    let base = (unsafe { s.as_ptr() }) as usize;
    let mut l = XferDescList::new(MemType::Dram).expect("list");
    for i in 0..N {
        l.add_desc(base + i * 64, 64, 0);
    }
    let back = XferDescList::deserialize(&l.serialize().expect("bytes")).expect("decode");
    assert!(back == l);
    let local = agent.prepare_xfer_dlist("", &l, None).expect("prep");
    let me = agent
        .prepare_xfer_dlist(&agent.name(), &l, None)
        .expect("prep");
    let idx: Vec<i32> = (0..N as i32).collect();
    let rev: Vec<i32> = idx.iter().rev().copied().collect();
    agent
        .make_xfer_req(XferOp::Write, &local, &idx, &me, &rev, None)
        .expect("100k-descriptor request");
}

/// The memory types `get_plugin_params` lists before a backend exists (what the plugin can
/// take, as NIXL lists them) hold every type the backend reports once made on this machine
/// (UCX without a GPU: DRAM only).
#[test]
fn plugin_memory_types_match_the_backends() {
    let agent = Agent::new("kinds").expect("agent");
    let plugins = agent.get_available_plugins().expect("plugins");
    let names: Vec<String> = plugins
        .iter()
        .map(|p| p.expect("name").to_owned())
        .collect();
    assert!(
        names.iter().any(|n| n == "UCX") && names.iter().any(|n| n == "POSIX"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n == "INPROC"));
    for plugin in ["UCX", "POSIX"] {
        let (mems, params) = agent.get_plugin_params(plugin).expect("params");
        let b = agent.create_backend(plugin, &params).expect("backend");
        let (made, made_params) = agent.get_backend_params(&b).expect("backend params");
        let set = |m: &MemList| {
            let mut v: Vec<String> = m.iter().map(|k| k.expect("kind").to_string()).collect();
            v.sort();
            v
        };
        let (listed, made) = (set(&mems), set(&made));
        assert!(!made.is_empty(), "{plugin}");
        assert!(
            made.iter().all(|k| listed.contains(k)),
            "{plugin}: {made:?} not in {listed:?}"
        );
        assert_eq!(
            HashMap::from(params.iter().expect("iter")),
            HashMap::from(made_params.iter().expect("iter")),
            "{plugin}"
        );
        assert_eq!(agent.get_backend(plugin).expect("by name").name(), plugin);
    }
}

/// What nixl-sys's types promise across threads, the drop-in keeps (its agents and requests
/// are shared between a block manager's threads).
#[test]
fn handles_cross_threads_as_nixl_sys_ones_do() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Agent>();
    send_sync::<XferRequest>();
    send_sync::<Backend>();
    send_sync::<RegistrationHandle>();
    send_sync::<MemView>();
    let (agent, _opt) = ucx_agent("threads");
    let a = agent.clone();
    let name = std::thread::spawn(move || a.name()).join().expect("thread");
    assert_eq!(name, agent.name());
}

/// A side-channel peer that never answers holds up only its own jobs: a fetch from a live
/// listener queued behind a fetch from a silent one completes while the silent one waits
/// (NIXL's single comm thread would make it wait the whole fetch deadline).
#[test]
fn a_silent_side_channel_peer_delays_no_other() {
    // Accepts connections into its backlog and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let cfg = AgentConfig {
        enable_listen_thread: true,
        listen_port: 0,
        ..Default::default()
    };
    let server = Agent::new_configured("comm-server", &cfg).expect("agent");
    let (_m, params) = server.get_plugin_params("UCX").expect("params");
    server.create_backend("UCX", &params).expect("UCX");
    let live = server.listen_addr().expect("listening");
    let (client, _opt) = ucx_agent("comm-client");
    let at = |addr: std::net::SocketAddr| {
        let mut o = OptArgs::new().expect("opt");
        o.set_ip_addr(&addr.ip().to_string()).expect("ip");
        o.set_port(addr.port()).expect("port");
        o
    };
    let t0 = std::time::Instant::now();
    client
        .fetch_remote_md("nobody", Some(&at(silent.local_addr().expect("addr"))))
        .expect("queued");
    client
        .fetch_remote_md(&server.name(), Some(&at(live)))
        .expect("queued");
    while !client.check_remote_metadata(&server.name(), None) {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "the live peer's fetch waited behind the silent one ({} failures)",
            client.comm_failures()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!client.check_remote_metadata("nobody", None));
}
