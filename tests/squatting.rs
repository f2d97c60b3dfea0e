//! Squatting the same-host side channel's name (issue 34): a listening agent's same-host
//! (Unix) side channel is named after its TCP port in Linux's abstract namespace, which any
//! process of any user can bind first. Every actor is a process of its own.
//!
//! - A process holding the name of a fixed port makes the agent refuse to listen there (typed,
//!   `NotAllowed`), whether it runs as the same user or another: it used to start with a warning,
//!   serving TCP only, which same-host peers are refused on, while the squatter received them.
//! - A client refuses a squatter that holds a port's Unix name without serving the port's TCP
//!   socket, even one that relays to a real agent of its own under the victim's name: it used
//!   to fetch (and load) the squatter's metadata, so a prefill's KV went to the squatter.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::time::Duration;

use nixl::core::ErrorKind;
use nixl::Agent;
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::{skip, Dep};

const CHILD: &str = "squatter_role";
const WAIT: Duration = Duration::from_secs(60);

fn unix_name(port: u16) -> UnixAddr {
    UnixAddr::from_abstract_name(format!("nixl-side-channel:{port}")).expect("abstract name")
}

/// A TCP port free right now on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn agent(name: &str, port: u16) -> nixl::Result<Agent> {
    Agent::new(
        name,
        nixl::agent_config()
            .listen(true)
            .listen_addr(([127, 0, 0, 1], port).into())
            .default_timeout(Duration::from_secs(20)),
    )
}

/// Copies bytes one way until either end closes.
fn pipe(mut from: UnixStream, mut to: UnixStream) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn squatter_role() {
    child_main(|env| {
        let port: u16 = env.parse("port")?;
        let squat = UnixListener::bind_addr(&unix_name(port)).map_err(|e| format!("squat: {e}"))?;
        match env.var("act")?.as_str() {
            // Hold the name until killed.
            "hold" => {
                std::fs::write(env.var("ready")?, b"ok").map_err(|e| e.to_string())?;
                std::thread::sleep(Duration::from_secs(120));
                Ok(())
            }
            // A real agent under the victim's name on a port of its own, and the victim's
            // port's Unix name relayed to it.
            "relay" => {
                let a = agent(&env.var("victim")?, 0).map_err(|e| e.to_string())?;
                let own = a.listen_addr().ok_or("no side channel")?.port();
                std::fs::write(env.var("ready")?, b"ok").map_err(|e| e.to_string())?;
                for c in squat.incoming().flatten() {
                    let Ok(up) = UnixStream::connect_addr(&unix_name(own)) else {
                        continue;
                    };
                    let (c2, up2) = (
                        c.try_clone().map_err(|e| e.to_string())?,
                        up.try_clone().map_err(|e| e.to_string())?,
                    );
                    std::thread::spawn(move || pipe(c, up));
                    std::thread::spawn(move || pipe(up2, c2));
                }
                Ok(())
            }
            other => Err(format!("unknown act {other}")),
        }
    });
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Spawns a squatter on `port`'s Unix name and waits until it holds it.
fn squatter(parent: &Agent, act: &str, port: u16, victim: &str, uid: Option<u32>) -> Child {
    let ready = std::env::temp_dir().join(format!("squat-{}-{port}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let port_s = port.to_string();
    let mut c = Child::spawn_as(
        CHILD,
        parent,
        &format!("squatter-{port}"),
        &[
            ("act", act),
            ("port", &port_s),
            ("victim", victim),
            ("ready", ready.to_str().expect("utf-8")),
        ],
        uid,
    )
    .expect("spawn the squatter");
    let end = std::time::Instant::now() + WAIT;
    while !ready.exists() {
        assert!(c.try_wait().is_none(), "the squatter exited");
        assert!(
            std::time::Instant::now() < end,
            "the squatter never got ready"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_file(&ready);
    c
}

/// The first attack: a squatter (of this user, and of another where this test runs as
/// root) holds the name of the port decode is configured to listen on. Decode refuses to
/// start there, typed, naming the reason; with the squatter gone it starts.
#[test]
fn a_held_port_name_stops_the_listener_typed() {
    let pid = std::process::id();
    let parent = agent(&format!("squat-parent-{pid}"), 0).expect("parent");
    let mut uids = vec![None];
    if euid() == 0 {
        uids.push(Some(65534));
    } else {
        skip(
            "a_held_port_name_stops_the_listener_typed",
            Dep::Root,
            "another user's squatter needs root to start".to_owned(),
        );
    }
    for uid in uids {
        let port = free_port();
        let mut s = squatter(&parent, "hold", port, "-", uid);
        let e = agent(&format!("decode-{pid}-{port}"), port)
            .expect_err("a listener whose Unix name is held");
        assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
        assert!(e.to_string().contains("holds the same-host"), "{e}");
        eprintln!("squatter of uid {uid:?}: {e}");
        s.kill();
        let a = agent(&format!("decode-{pid}-{port}-again"), port).expect("free again");
        assert_eq!(a.listen_addr().map(|a| a.port()), Some(port));
    }
}

/// The second form: decode exits, a squatter takes its port's Unix name and relays it
/// to an agent of its own under decode's name. Prefill's fetch from decode's address reaches
/// the squatter over Unix, and is refused: the squatter does not serve that TCP port. Nothing
/// is loaded.
#[test]
fn a_client_refuses_a_squatter_that_does_not_serve_the_port() {
    let pid = std::process::id();
    let prefill = agent(&format!("prefill-{pid}"), 0).expect("prefill");
    let victim = format!("decode-{pid}");
    // Decode listened on `port` and exited.
    let port = {
        let d = agent(&victim, 0).expect("decode");
        d.listen_addr().expect("listening").port()
    };
    let mut s = squatter(&prefill, "relay", port, &victim, None);
    let e = prefill
        .fetch_remote_metadata_blocking(&victim, ([127, 0, 0, 1], port).into(), WAIT)
        .expect_err("a squatter's metadata");
    assert_eq!(e.kind(), ErrorKind::NotAllowed, "{e}");
    assert!(e.to_string().contains("squatter"), "{e}");
    assert!(
        !prefill.check_remote_metadata(&victim, None),
        "nothing loaded"
    );
    s.kill();
}
