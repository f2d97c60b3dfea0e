//! Wire interop through the drop-in API (issue 38, item 4): an agent made with nixl-sys's API
//! on nixl-rs and a stock NIXL agent (the `nixl-cu13` wheel, its own UCX on both sides)
//! exchange metadata (blob and NIXL's side channel, both roles) and move data both ways, with
//! notifications; every byte is checked.

use std::time::{Duration, Instant};

use nixl_sys::*;
use nixl_testkit::ucx as common;
use nixl_testkit::ucx::nixl_peer::{nixl_or_skip, pattern, NixlEnv, NixlPeer};
use serde_json::json;

const LEN: usize = 256 << 10;
const WAIT: Duration = Duration::from_secs(20);

/// A drop-in agent with a UCX backend on the wheel's UCX, made as a nixl-sys program makes one.
fn dropin(env: &NixlEnv, role: &str, cfg: &AgentConfig) -> (Agent, OptArgs) {
    let agent = Agent::new_configured(&common::unique(role), cfg).expect("agent");
    let (_mems, mut params) = agent.get_plugin_params("UCX").expect("UCX params");
    params
        .set("ucx_path", env.ucx.to_str().expect("utf-8 path"))
        .expect("set");
    params.set("transports", common::TCP).expect("set");
    let backend = agent.create_backend("UCX", &params).expect("UCX backend");
    let mut opt = OptArgs::new().expect("opt");
    opt.add_backend(&backend).expect("add");
    (agent, opt)
}

fn storage(agent: &Agent, opt: &OptArgs, fill: u8) -> SystemStorage {
    let mut s = SystemStorage::new(LEN).expect("storage");
    s.memset(fill);
    s.register(agent, Some(opt)).expect("register");
    s
}

fn addr(s: &SystemStorage) -> u64 {
    // SAFETY: only the address is taken, as a number.
    (unsafe { s.as_ptr() }) as u64
}

fn dlist(addr: u64) -> XferDescList<'static> {
    let mut l = XferDescList::new(MemType::Dram).expect("list");
    l.add_desc(addr as usize, LEN, 0);
    l
}

fn wait_done(agent: &Agent, req: &XferRequest) {
    let end = Instant::now() + WAIT;
    loop {
        match agent.get_xfer_status(req) {
            Ok(XferStatus::Success) => return,
            Ok(XferStatus::InProgress) => {}
            Err(e) => panic!("transfer failed: {e} ({:?})", last_error()),
        }
        assert!(Instant::now() < end, "transfer not done within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn notifs_from(agent: &Agent, sender: &str) -> Vec<Vec<u8>> {
    let mut map = NotificationMap::new().expect("map");
    let end = Instant::now() + WAIT;
    while map.is_empty().expect("len") {
        assert!(Instant::now() < end, "no notification within {WAIT:?}");
        agent.get_notifications(&mut map, None).expect("notifs");
        std::thread::sleep(Duration::from_millis(5));
    }
    map.get_notifications(sender)
        .expect("from the sender")
        .map(|n| n.expect("bytes"))
        .collect()
}

#[test]
fn stock_nixl_writes_and_reads_a_dropin_agent() {
    let Some(env) = nixl_or_skip("stock_nixl_writes_and_reads_a_dropin_agent") else {
        return;
    };
    let (agent, opt) = dropin(&env, "dropin-target", &AgentConfig::default());
    let (dst, src) = (storage(&agent, &opt, 0), storage(&agent, &opt, 0x5a));
    let mut py = NixlPeer::start(&env, &common::unique("py-init"), common::TCP, &[]);
    let (py_src, py_dst) = (py.alloc(LEN, Some(9)), py.alloc(LEN, None));
    let md = agent.get_local_md().expect("md");
    assert_eq!(
        py.load(&md).expect("NIXL loads the drop-in's blob"),
        agent.name()
    );

    let st = py.xfer("WRITE", py_src, addr(&dst), LEN, &agent.name(), b"kv-ready");
    assert_eq!(st, "DONE");
    assert_eq!(notifs_from(&agent, &py.name), vec![b"kv-ready".to_vec()]);
    assert!(
        dst.as_slice() == pattern(LEN, 9),
        "every byte NIXL wrote is in place"
    );

    assert_eq!(
        py.xfer("READ", py_dst, addr(&src), LEN, &agent.name(), b""),
        "DONE"
    );
    assert!(
        py.read(py_dst, LEN) == vec![0x5a; LEN],
        "every byte NIXL read is ours"
    );
}

#[test]
fn a_dropin_agent_writes_and_reads_stock_nixl() {
    let Some(env) = nixl_or_skip("a_dropin_agent_writes_and_reads_stock_nixl") else {
        return;
    };
    let (agent, opt) = dropin(&env, "dropin-init", &AgentConfig::default());
    let (src, dst) = (storage(&agent, &opt, 0x3c), storage(&agent, &opt, 0));
    let mut py = NixlPeer::start(&env, &common::unique("py-target"), common::TCP, &[]);
    let (py_dst, py_src) = (py.alloc(LEN, None), py.alloc(LEN, Some(11)));
    let name = agent
        .load_remote_md(&py.metadata())
        .expect("a NIXL blob loads");
    assert_eq!(name, py.name);
    agent.make_connection(&name, Some(&opt)).expect("connected");

    let mut args = OptArgs::new().expect("opt");
    args.set_has_notification(true).expect("set");
    args.set_notification_message(b"layer-0 done").expect("set");
    let w = agent
        .create_xfer_req(
            XferOp::Write,
            &dlist(addr(&src)),
            &dlist(py_dst),
            &name,
            Some(&args),
        )
        .expect("WRITE request");
    agent.post_xfer_req(&w, None).expect("post");
    wait_done(&agent, &w);
    assert_eq!(
        py.notifs(1, WAIT),
        vec![(agent.name(), b"layer-0 done".to_vec())]
    );
    assert!(
        py.read(py_dst, LEN) == vec![0x3c; LEN],
        "every byte written is in NIXL's memory"
    );

    // READ through prepared lists, by index.
    let local = agent
        .prepare_xfer_dlist("", &dlist(addr(&dst)), None)
        .expect("prep local");
    let remote = agent
        .prepare_xfer_dlist(&name, &dlist(py_src), None)
        .expect("prep remote");
    let r = agent
        .make_xfer_req(XferOp::Read, &local, &[0], &remote, &[0], None)
        .expect("READ request");
    agent.post_xfer_req(&r, None).expect("post");
    wait_done(&agent, &r);
    assert!(
        dst.as_slice() == pattern(LEN, 11),
        "every byte read from NIXL"
    );
}

#[test]
fn side_channel_both_roles_through_the_dropin_api() {
    let Some(env) = nixl_or_skip("side_channel_both_roles_through_the_dropin_api") else {
        return;
    };
    // The drop-in fetches from NIXL's listener and sends its own metadata there.
    let (agent, opt) = dropin(&env, "dropin-client", &AgentConfig::default());
    let src = storage(&agent, &opt, 0x21);
    let (mut py, port) = NixlPeer::start_listening(&env, &common::unique("py-server"), common::TCP);
    let py_dst = py.alloc(LEN, None);
    let mut at = OptArgs::new().expect("opt");
    at.set_ip_addr("127.0.0.1").expect("ip");
    at.set_port(port).expect("port");
    agent
        .fetch_remote_md(&py.name, Some(&at))
        .expect("fetch queued");
    let end = Instant::now() + WAIT;
    while !agent.check_remote_metadata(&py.name, None) {
        assert!(
            Instant::now() < end,
            "NIXL's metadata not fetched ({} failures)",
            agent.comm_failures()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.send_local_md(Some(&at)).expect("send queued");
    let st = py.ok(json!({"op": "check_md", "name": agent.name(), "wait": 10}));
    assert_eq!(
        st["loaded"],
        json!(true),
        "NIXL loaded what the drop-in sent"
    );
    let w = agent
        .create_xfer_req(
            XferOp::Write,
            &dlist(addr(&src)),
            &dlist(py_dst),
            &py.name,
            None,
        )
        .expect("request");
    agent.post_xfer_req(&w, None).expect("post");
    wait_done(&agent, &w);
    assert!(py.read(py_dst, LEN) == vec![0x21; LEN]);
    agent.invalidate_local_md(Some(&at)).expect("INVL queued");
    let st = py.ok(json!({"op": "check_md", "name": agent.name(), "want": false, "wait": 10}));
    assert_eq!(
        st["loaded"],
        json!(false),
        "NIXL dropped the drop-in after INVL"
    );

    // NIXL fetches from the drop-in's listener (enable_listen_thread, port 0).
    let cfg = AgentConfig {
        enable_listen_thread: true,
        listen_port: 0,
        ..Default::default()
    };
    let (server, sopt) = dropin(&env, "dropin-server", &cfg);
    let dst = storage(&server, &sopt, 0);
    let sport = server.listen_addr().expect("listening").port();
    let mut client = NixlPeer::start_listening(&env, &common::unique("py-client"), common::TCP).0;
    let py_src = client.alloc(LEN, Some(33));
    client.ok(json!({"op": "fetch_md", "name": server.name(), "ip": "127.0.0.1", "port": sport}));
    let st = client.ok(json!({"op": "check_md", "name": server.name(), "wait": 10}));
    assert_eq!(
        st["loaded"],
        json!(true),
        "NIXL fetched the drop-in's metadata"
    );
    client.ok(json!({"op": "send_md", "ip": "127.0.0.1", "port": sport}));
    let end = Instant::now() + WAIT;
    while !server.check_remote_metadata(&client.name, None) {
        assert!(Instant::now() < end, "NIXL's LOAD not seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        client.xfer(
            "WRITE",
            py_src,
            addr(&dst),
            LEN,
            &server.name(),
            b"via-listener"
        ),
        "DONE"
    );
    assert_eq!(
        notifs_from(&server, &client.name),
        vec![b"via-listener".to_vec()]
    );
    assert!(dst.as_slice() == pattern(LEN, 33));
}
