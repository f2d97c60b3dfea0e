//! Same-host peers proven by the kernel (issue 23): with no credential (the default, and how
//! prefill and decode processes of one node are usually started), the victim's side channel
//! knows which process and user is on the other end of its Unix socket. A live impersonator's
//! PUSH, a stranger's INVALIDATE and a stranger's region injection are refused, typed; a
//! process of another user is refused FETCH and PUSH (so it cannot load the keys to READ); a
//! restarted peer (the old process gone) is accepted. Every actor is a process of its own.

use std::time::Duration;

use std::os::linux::net::SocketAddrExt;

use nixl::core::backend::ProcessId;
use nixl::core::wire::codec::AgentMetadata;
use nixl::core::wire::sidechannel::frame::{decode, encode_plain, Kind};
use nixl::core::wire::sidechannel::read_frame;
use nixl::core::{ErrorKind, RegionDesc};
use nixl::ucx::UcxParams;
use nixl::{Agent, HostBuffer};
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::ucx::ucx_or_skip;
use nixl_testkit::{skip, Dep};

const CHILD: &str = "identity_role";
const WAIT: Duration = Duration::from_secs(60);

fn ucx() -> UcxParams {
    UcxParams::default().transports("shm,cma,self".to_string())
}

fn agent(name: &str) -> Result<Agent, String> {
    agent_with(name, None)
}

/// An agent, handing its name to its next incarnation through `succession` where given.
fn agent_with(name: &str, succession: Option<std::path::PathBuf>) -> Result<Agent, String> {
    let a = Agent::new(
        name,
        nixl::agent_config()
            .listen(true)
            .default_timeout(Duration::from_secs(20))
            .succession(succession),
    )
    .map_err(|e| e.to_string())?;
    a.create_backend(ucx()).map_err(|e| e.to_string())?;
    Ok(a)
}

/// Whether `r` is a refusal (`NotAllowed`) of the victim.
fn refused<T: std::fmt::Debug>(what: &str, r: nixl::Result<T>) -> Result<(), String> {
    match r {
        Err(e) if e.kind() == ErrorKind::NotAllowed => {
            eprintln!("{what}: refused as expected: {e}");
            Ok(())
        }
        other => Err(format!("{what}: expected NotAllowed, got {other:?}")),
    }
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn identity_role() {
    child_main(|env| {
        let a = agent_with(&env.name, env.var("succession").ok().map(Into::into))?;
        let buf = std::sync::Arc::new(HostBuffer::new(1 << 20).ok_or("alloc")?);
        let _reg = a
            .register_mem(vec![buf.clone()], &[])
            .map_err(|e| e.to_string())?;
        let victim = env.parent_addr;
        match env.var("act")?.as_str() {
            // The real peer: publishes itself to the victim and stays until killed.
            "publish" => {
                env.connect(&a, WAIT)?;
                a.gen_notif(&env.parent, b"ready", &[])
                    .map_err(|e| e.to_string())?;
                while env.parent_alive() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            }
            // The real peer, answering each of the victim's notifications ("got <msg>").
            "echo" => {
                env.connect(&a, WAIT)?;
                a.gen_notif(&env.parent, b"ready", &[])
                    .map_err(|e| e.to_string())?;
                while env.parent_alive() {
                    let n = a
                        .wait_notifs(Duration::from_millis(50))
                        .map_err(|e| e.to_string())?;
                    for m in n.get(&env.parent).into_iter().flatten() {
                        let reply = [&b"got "[..], m].concat();
                        a.gen_notif(&env.parent, &reply, &[])
                            .map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            }
            // Another process under the real peer's name, over UCX: it loads the victim (a
            // FETCH, which anyone of the user may) and sends notifications, its hello claiming
            // the real peer's name from the same worker index as the real one.
            "hello-forge" => {
                a.fetch_remote_metadata_blocking(&env.parent, victim, WAIT)
                    .map_err(|e| e.to_string())?;
                for i in 0..4 {
                    a.gen_notif(&env.parent, format!("forged {i}").as_bytes(), &[])
                        .map_err(|e| e.to_string())?;
                }
                // Its messages are delivered to the victim's UCX before it exits.
                let end = std::time::Instant::now() + Duration::from_millis(300);
                while std::time::Instant::now() < end {
                    a.progress();
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            }
            // Another process under the real peer's name: its PUSH and its INVALIDATE.
            "impersonate" => {
                refused(
                    "PUSH under a live peer's name",
                    a.send_local_metadata(victim),
                )?;
                refused(
                    "INVALIDATE of a live peer by another process",
                    a.invalidate_local_metadata(victim),
                )
            }
            // A stranger adds a 1 TiB region to the real peer's metadata under its name and
            // generation: once claiming the real peer's process, once its own.
            "inject" => {
                let owner = env.var("owner")?;
                let generation: u64 = env.parse("generation")?;
                let owner_pid: u32 = env.parse("owner_pid")?;
                let mine = a.local_metadata().map_err(|e| e.to_string())?;
                let mut m = AgentMetadata::decode_bytes(
                    nixl::core::wire::auth::unsealed(&mine).map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?;
                let me = m.process.ok_or("no process in metadata")?;
                m.name = owner;
                m.generation = generation;
                let mut r = m.regions[0].clone();
                r.desc = RegionDesc {
                    addr: 1 << 44,
                    len: 1 << 40,
                    ..r.desc.clone()
                };
                m.regions.push(r);
                let owner_id = ProcessId {
                    pid: owner_pid,
                    start_time: start_time(owner_pid)?,
                    ..me
                };
                for (claim, what) in [
                    (owner_id, "claiming the peer's process"),
                    (me, "claiming its own process"),
                ] {
                    m.process = Some(claim);
                    refused(
                        &format!("a stranger's PUSH adding a region to a peer's metadata, {what}"),
                        a.send_metadata_bytes(victim, &m.encode(), WAIT),
                    )?;
                }
                Ok(())
            }
            // A process of another user: its FETCH and PUSH are refused by the victim's side
            // channel, over the Unix socket (raw frames: a hostile client skips the checks our
            // own client makes) and over TCP.
            "other-user" => {
                let push = a.local_metadata().map_err(|e| e.to_string())?;
                let mut wanted = nixl::core::backend::bytes::ByteWriter::new();
                wanted.put_str(&env.parent);
                for (kind, payload, what) in [
                    (Kind::Fetch, wanted.as_slice(), "FETCH"),
                    (Kind::Push, push.as_slice(), "PUSH"),
                ] {
                    let req = encode_plain(kind, payload);
                    let name = format!("nixl-side-channel:{}", victim.port());
                    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)
                        .map_err(|e| e.to_string())?;
                    let u = std::os::unix::net::UnixStream::connect_addr(&addr)
                        .map_err(|e| format!("the victim's Unix side channel: {e}"))?;
                    let over_unix = raw_exchange(u, &req)?;
                    let t = std::net::TcpStream::connect(victim).map_err(|e| e.to_string())?;
                    let over_tcp = raw_exchange(t, &req)?;
                    for (via, reply) in [("Unix socket", over_unix), ("TCP", over_tcp)] {
                        if !reply.contains("not allowed") && !reply.starts_with("refused") {
                            return Err(format!("another user's {what} over {via}: {reply}"));
                        }
                        eprintln!("another user's {what} over {via}: {reply}");
                    }
                }
                Ok(())
            }
            other => Err(format!("unknown act {other}")),
        }
    });
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`).
fn start_time(pid: u32) -> Result<u64, String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    s[s.rfind(')').ok_or("stat")? + 1..]
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "stat field 22".to_owned())
}

/// Spawns an actor and waits for its exit: it returns 0 when every check it made held.
fn act(victim: &Agent, name: &str, vars: &[(&str, &str)], uid: Option<u32>) {
    let mut c = Child::spawn_as(CHILD, victim, name, vars, uid).expect("spawn");
    let st = c.join(WAIT).expect("the actor exits");
    assert_eq!(st.code(), Some(0), "actor {name} {vars:?}: {st}");
}

#[test]
fn without_a_credential_the_kernel_names_same_host_peers() {
    if !ucx_or_skip("without_a_credential_the_kernel_names_same_host_peers") {
        return;
    }
    let pid = std::process::id();
    let victim = agent(&format!("victim-{pid}")).expect("victim");
    let name = format!("peer-{pid}");
    // The real peer publishes itself.
    let mut real = Child::spawn(CHILD, &victim, &name, &[("act", "publish")]).expect("spawn");
    assert_eq!(real.next(&victim, WAIT).expect("ready"), b"ready");
    let g1 = victim.remote_generation(&name).expect("loaded");
    let real_regions = victim.remote_regions(&name).expect("regions");
    // A live impersonator: its PUSH and its INVALIDATE are refused.
    act(&victim, &name, &[("act", "impersonate")], None);
    assert_eq!(
        victim.remote_generation(&name),
        Some(g1),
        "the real peer stays"
    );
    // A stranger's region injection (under the peer's name and generation, plus 1 TiB).
    let (g1s, owner_pid) = (g1.to_string(), real.id().to_string());
    act(
        &victim,
        &format!("stranger-{pid}"),
        &[
            ("act", "inject"),
            ("owner", name.as_str()),
            ("generation", g1s.as_str()),
            ("owner_pid", owner_pid.as_str()),
        ],
        None,
    );
    assert_eq!(victim.remote_regions(&name).expect("regions"), real_regions);
    assert_eq!(victim.remote_generation(&name), Some(g1));
    // Another user's process.
    if rustix_euid() == 0 {
        act(
            &victim,
            &format!("nobody-{pid}"),
            &[("act", "other-user")],
            Some(65534),
        );
    } else {
        skip(
            "without_a_credential_the_kernel_names_same_host_peers",
            Dep::Root,
            "starting a process of another user needs root".to_owned(),
        );
    }
    // A restart: the old process gone, the new one under the same name is accepted.
    real.kill();
    let mut again = Child::spawn(CHILD, &victim, &name, &[("act", "publish")]).expect("spawn");
    assert_eq!(again.next(&victim, WAIT).expect("ready"), b"ready");
    let g2 = victim.remote_generation(&name).expect("reloaded");
    assert_ne!(g2, g1, "the restarted peer replaced the old incarnation");
    again.kill();
}

/// Issue 34 (3): without a credential, a name on the wire is its process. The victim loaded
/// the real peer (its PUSH, kernel-proven); another process of the same user names itself
/// like the peer, loads the victim and sends notifications over UCX. Before, its hello was a
/// claim: its notifications were delivered under the peer's name, and its hello (from the
/// same worker index) marked the victim's connection to the real peer replaced, so the
/// victim's next notification to the real peer failed `RemoteDisconnect`. Now its hello does
/// not verify under the key the peer's metadata announced: refused and counted, nothing of it
/// delivered, and the real peer's connection untouched.
#[test]
fn a_hello_under_a_loaded_name_counts_only_from_its_process() {
    if !ucx_or_skip("a_hello_under_a_loaded_name_counts_only_from_its_process") {
        return;
    }
    let pid = std::process::id();
    let victim = agent(&format!("hello-victim-{pid}")).expect("victim");
    let name = format!("hello-peer-{pid}");
    let mut real = Child::spawn(CHILD, &victim, &name, &[("act", "echo")]).expect("spawn");
    assert_eq!(real.next(&victim, WAIT).expect("ready"), b"ready");
    victim.gen_notif(&name, b"ping-1", &[]).expect("notify");
    assert_eq!(real.next(&victim, WAIT).expect("echo"), b"got ping-1");
    let refused_before = victim.refused_hellos();
    act(&victim, &name, &[("act", "hello-forge")], None);
    // The forger's hello reached the victim and was refused (its sender waited for its
    // messages to go out before exiting).
    let end = std::time::Instant::now() + WAIT;
    while victim.refused_hellos() == refused_before && std::time::Instant::now() < end {
        victim.progress();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        victim.refused_hellos() > refused_before,
        "the forger's hello was never refused"
    );
    // Nothing of it under the real peer's name; the real peer's connection still works.
    victim.gen_notif(&name, b"ping-2", &[]).expect(
        "a notification to the real peer after the forger's hello (its connection replaced?)",
    );
    let mut got = Vec::new();
    let end = std::time::Instant::now() + WAIT;
    while !got.iter().any(|m: &Vec<u8>| m == b"got ping-2") && std::time::Instant::now() < end {
        let n = victim.wait_notifs(Duration::from_millis(100)).unwrap();
        got.extend(n.get(&name).into_iter().flatten().cloned());
    }
    assert!(
        got.iter().any(|m| m == b"got ping-2"),
        "the real peer's answer: {got:?}"
    );
    let forged: Vec<_> = got.iter().filter(|m| m.starts_with(b"forged")).collect();
    assert!(forged.is_empty(), "delivered under {name}: {forged:?}");
    real.kill();
}

/// Issue 34 (2): a restart re-claims its name; a stranger cannot. The peer hands its name to
/// its next incarnation through a succession file; after it is killed, another process of the
/// same user (without the file's secret) is refused a PUSH under its name (before: accepted,
/// the first process to push held the name until it exited), and the restarted peer, reading
/// the file, is accepted.
#[test]
fn a_restart_reclaims_its_name_and_a_stranger_cannot() {
    if !ucx_or_skip("a_restart_reclaims_its_name_and_a_stranger_cannot") {
        return;
    }
    let pid = std::process::id();
    let victim = agent(&format!("succession-victim-{pid}")).expect("victim");
    let dir = std::env::temp_dir().join(format!("nixl-succession-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("peer.secret");
    let path = file.display().to_string();
    let name = format!("succession-peer-{pid}");
    let publish = [("act", "publish"), ("succession", path.as_str())];
    let mut real = Child::spawn(CHILD, &victim, &name, &publish).expect("spawn");
    assert_eq!(real.next(&victim, WAIT).expect("ready"), b"ready");
    let g1 = victim.remote_generation(&name).expect("loaded");
    real.kill();
    // The peer is gone (its process exited): a stranger's PUSH under its name is refused.
    act(&victim, &name, &[("act", "impersonate")], None);
    assert_eq!(
        victim.remote_generation(&name),
        Some(g1),
        "the name was taken"
    );
    // The restart reads the secret its predecessor left and is accepted.
    let mut again = Child::spawn(CHILD, &victim, &name, &publish).expect("spawn");
    assert_eq!(again.next(&victim, WAIT).expect("ready"), b"ready");
    let g2 = victim.remote_generation(&name).expect("reloaded");
    assert_ne!(g2, g1, "the restart replaced the old incarnation");
    again.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 34 (3), strict: with `AgentConfig::loaded_senders_only` a process the victim never
/// loaded is not heard at all (by default its signed hello would hold its own, unloaded name:
/// its notifications were delivered); the loaded peer, whose hello arrives before its PUSH is
/// loaded, is heard.
#[test]
fn with_loaded_senders_only_an_unloaded_sender_is_not_heard() {
    if !ucx_or_skip("with_loaded_senders_only_an_unloaded_sender_is_not_heard") {
        return;
    }
    let pid = std::process::id();
    let victim = Agent::new(
        &format!("strict-victim-{pid}"),
        nixl::agent_config()
            .listen(true)
            .default_timeout(Duration::from_secs(20))
            .loaded_senders_only(true),
    )
    .expect("victim");
    victim.create_backend(ucx()).expect("UCX");
    let name = format!("strict-peer-{pid}");
    let mut real = Child::spawn(CHILD, &victim, &name, &[("act", "echo")]).expect("spawn");
    assert_eq!(real.next(&victim, WAIT).expect("ready"), b"ready");
    let before = victim.refused_hellos();
    let stranger = format!("strict-stranger-{pid}");
    act(&victim, &stranger, &[("act", "hello-forge")], None);
    let end = std::time::Instant::now() + WAIT;
    while victim.refused_hellos() == before && std::time::Instant::now() < end {
        victim.progress();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        victim.refused_hellos() > before,
        "the unloaded sender's notifications were never refused"
    );
    victim.gen_notif(&name, b"ping", &[]).expect("notify");
    let mut got: Vec<(String, Vec<u8>)> = Vec::new();
    let end = std::time::Instant::now() + WAIT;
    while !got.iter().any(|(_, m)| m == b"got ping") && std::time::Instant::now() < end {
        for (from, msgs) in victim.wait_notifs(Duration::from_millis(100)).unwrap() {
            got.extend(msgs.into_iter().map(|m| (from.clone(), m)));
        }
    }
    assert!(
        got.iter().any(|(f, m)| f == &name && m == b"got ping"),
        "{got:?}"
    );
    assert!(
        got.iter().all(|(f, _)| f != &stranger),
        "the unloaded sender was heard: {got:?}"
    );
    real.kill();
}

fn rustix_euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Sends one raw side-channel request frame and reads the reply: `refused: <message>` for an
/// `Err` reply, else the reply's kind.
fn raw_exchange<S: std::io::Read + std::io::Write>(mut s: S, req: &[u8]) -> Result<String, String> {
    s.write_all(req).map_err(|e| e.to_string())?;
    let body = read_frame(&mut s, 1 << 28).map_err(|e| e.to_string())?;
    let f = decode(&body).map_err(|e| e.to_string())?;
    Ok(match f.kind {
        Kind::Err => format!(
            "refused: {}",
            String::from_utf8_lossy(f.payload)
                .chars()
                .filter(|c| !c.is_control())
                .collect::<String>()
                .trim_start_matches(|c: char| !c.is_alphanumeric())
        ),
        k => format!("{k:?}"),
    })
}
