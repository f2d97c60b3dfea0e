//! The two-host harness itself (`nixl_testkit::netns`): hosts are isolated from each
//! other (PID, /dev/shm, hostname) and joined only by their links; pulling a cable cuts the
//! path and plugging it back restores it; counters see the traffic; everything the harness
//! made is gone after a drop, a panic, or the death of the process that made it; host
//! processes never outlive their test. Skips (Dep::Netns) where namespaces cannot be made.
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nixl_testkit::netns::{self, Control, Net, NetSpec, EXIT_ORPHANED};

const T: Duration = Duration::from_secs(20);
const PORT: u16 = 7000;
const ROLE: &str = "NIXL_HARNESS_ROLE";
const PEER: &str = "NIXL_HARNESS_PEER";

#[test]
#[ignore = "child process entry point: spawned inside a host by this file's tests"]
fn harness_child() {
    let Some(ctl) = Control::connect() else {
        return;
    };
    let role = std::env::var(ROLE).unwrap_or_default();
    let r = match role.as_str() {
        "server" => server(&ctl),
        "client" => client(&ctl),
        "idle" => {
            ctl.send("idle");
            // Until the parent closes the channel (exit 97) or the lifetime kills us.
            loop {
                let _ = ctl.recv(Duration::from_secs(60));
            }
        }
        other => Err(format!("unknown role {other:?}")),
    };
    if let Err(e) = r {
        ctl.send(&format!("error {e}"));
        std::process::exit(2);
    }
}

/// What this host looks like from inside: pid, hostname, /dev/shm entries.
fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let shm: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    format!(
        "pid={} host={} shm={}",
        std::process::id(),
        host.trim(),
        shm.join(",")
    )
}

fn server(ctl: &Control) -> Result<(), String> {
    let me: SocketAddr = std::env::var(PEER)
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|_| "bad address")?;
    let l = TcpListener::bind(me).map_err(|e| e.to_string())?;
    ctl.send(&format!("ready {}", identity()));
    // Serve echo connections until told to stop.
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    loop {
        match ctl.recv(Duration::from_millis(20)).as_deref() {
            Some("stop") => return Ok(()),
            Some("ident") => ctl.send(&format!("ident {}", identity())),
            _ => {}
        }
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0usize;
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n;
            }
            let _ = s.write_all(&(total as u64).to_le_bytes());
        }
    }
}

fn client(ctl: &Control) -> Result<(), String> {
    let peer: SocketAddr = std::env::var(PEER)
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|_| "bad address")?;
    std::fs::write("/dev/shm/nixl-harness-probe", b"x").map_err(|e| e.to_string())?;
    ctl.send(&format!("ready {}", identity()));
    // One connection per "send N" command: send N bytes, report what the server counted.
    loop {
        let Some(cmd) = ctl.recv(T) else {
            return Err("no command".into());
        };
        let Some(n) = cmd.strip_prefix("send ") else {
            return Ok(());
        };
        let n: usize = n.parse().map_err(|_| "bad count")?;
        let res = (|| -> std::io::Result<u64> {
            let mut s = TcpStream::connect_timeout(&peer, Duration::from_secs(2))?;
            s.set_write_timeout(Some(Duration::from_secs(2)))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(&vec![7u8; n])?;
            s.shutdown(std::net::Shutdown::Write)?;
            let mut b = [0u8; 8];
            s.read_exact(&mut b)?;
            Ok(u64::from_le_bytes(b))
        })();
        match res {
            Ok(got) => ctl.send(&format!("sent {got}")),
            Err(e) => ctl.send(&format!("failed {:?}", e.kind())),
        }
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or("")
}

#[test]
fn hosts_are_isolated_and_joined_by_a_link_that_can_be_cut() {
    let Some(net) = Net::for_test("hosts_are_isolated", &NetSpec::pair(1)) else {
        return;
    };
    let addr = SocketAddr::from((net.addr(0, 1).expect("host 1 on segment 0"), PORT));
    let mut srv = net
        .spawn_test(
            1,
            "harness_child",
            &[(ROLE, "server".into()), (PEER, addr.to_string())],
        )
        .expect("spawn server");
    let s_id = srv.expect("ready ", T).expect("server ready");
    let mut cli = net
        .spawn_test(
            0,
            "harness_child",
            &[(ROLE, "client".into()), (PEER, addr.to_string())],
        )
        .expect("spawn client");
    let c_id = cli.expect("ready ", T).expect("client ready");
    // Own PID namespaces (the test binary is the third process there), own hostnames, own
    // /dev/shm: the client's file is invisible to the server, and neither sees the machine's.
    for (id, p) in [(&s_id, &srv), (&c_id, &cli)] {
        let pid: u32 = field(id, "pid").parse().expect("pid");
        assert!(pid < 10 && pid != p.id(), "{id}: a fresh PID namespace");
    }
    assert_eq!(field(&s_id, "host"), "nixl-h1");
    assert_eq!(field(&c_id, "host"), "nixl-h0");
    assert_eq!(field(&s_id, "shm"), "");
    // The client wrote a file into its /dev/shm; the server's stays empty.
    assert_eq!(field(&c_id, "shm"), "nixl-harness-probe");
    srv.send("ident").expect("command");
    let s_now = srv.expect("ident ", T).expect("ident");
    assert_eq!(field(&s_now, "shm"), "", "{s_now}");
    assert!(
        !std::path::Path::new("/dev/shm/nixl-harness-probe").exists(),
        "nor does the machine see it"
    );

    let before = net.counters(0, 0).expect("counters");
    cli.send("send 1000000").expect("command");
    assert_eq!(cli.expect("", T).expect("reply"), "sent 1000000");
    let after = net.counters(0, 0).expect("counters");
    assert!(
        after.tx_bytes >= before.tx_bytes + 1_000_000,
        "host 0's eth0 carried the bytes: {before:?} -> {after:?}"
    );

    // Pull the server's cable: connecting fails (the SYN goes nowhere); plug it back: works.
    net.set_port(0, 1, false).expect("pull the cable");
    cli.send("send 1000").expect("command");
    let r = cli.expect("", T).expect("reply");
    assert!(r.starts_with("failed "), "with the cable pulled: {r}");
    net.set_port(0, 1, true).expect("plug the cable");
    cli.send("send 1000").expect("command");
    assert_eq!(cli.expect("", T).expect("reply"), "sent 1000");

    srv.send("stop").expect("stop");
    assert!(srv.wait(T).expect("server exits").success());
    cli.send("exit").expect("exit");
    assert!(cli.wait(T).expect("client exits").success());
    assert!(net.set_port(0, 5, false).is_err(), "no host 5");
    assert!(net.counters(3, 0).is_err(), "no segment 3");
}

#[test]
fn drop_removes_namespaces_and_processes_even_when_the_test_panics() {
    let Some(probe) = Net::for_test("drop_removes", &NetSpec::pair(2)) else {
        return;
    };
    drop(probe);
    let made = parking_lot::Mutex::new((Vec::new(), 0u32));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let net = Net::create(&NetSpec::pair(2)).expect("create");
        let mut p = net
            .spawn_test(0, "harness_child", &[(ROLE, "idle".into())])
            .expect("spawn");
        p.expect("idle", T).expect("idle");
        *made.lock() = (net.namespaces(), p.id());
        panic!("a failing test");
    }));
    assert!(r.is_err());
    let (names, pid) = made.into_inner();
    assert_eq!(names.len(), 4, "2 hosts + 2 wires: {names:?}");
    let left = netns::existing_namespaces();
    assert!(
        names.iter().all(|n| !left.contains(n)),
        "left behind: {left:?}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the host process was killed and reaped"
    );
}

#[test]
fn sweeper_removes_leftovers_of_dead_processes_only() {
    let Some(net) = Net::for_test("sweeper", &NetSpec::switched(1)) else {
        return;
    };
    drop(net);
    // A pid that is surely dead: a child that has exited and been reaped.
    let mut c = Command::new("true").spawn().expect("spawn true");
    let dead = c.id();
    c.wait().expect("reap");
    let stale = format!("nixl-{dead}-0-h0");
    let mine = format!("nixl-{}-999999-h0", std::process::id());
    for n in [&stale, &mine] {
        let st = Command::new("ip")
            .args(["netns", "add", n])
            .status()
            .expect("ip");
        assert!(st.success(), "ip netns add {n}");
    }
    assert!(netns::sweep() >= 1);
    let left = netns::existing_namespaces();
    let mine_kept = left.contains(&mine);
    let _ = Command::new("ip").args(["netns", "del", &mine]).status();
    assert!(
        !left.contains(&stale),
        "a dead process's namespace is swept"
    );
    assert!(mine_kept, "a live process's namespace is kept");
}

#[test]
fn host_processes_never_outlive_their_test() {
    let mut spec = NetSpec::switched(2);
    spec.lifetime = Duration::from_secs(3);
    let Some(net) = Net::for_test("never_outlive", &spec) else {
        return;
    };
    // The parent closes the control channel: the child exits on its own.
    let mut a = net
        .spawn_test(0, "harness_child", &[(ROLE, "idle".into())])
        .expect("spawn");
    a.expect("idle", T).expect("idle");
    a.close();
    let st = a.wait(T).expect("exits after the channel closed");
    assert_eq!(st.code(), Some(EXIT_ORPHANED), "{st:?}");

    // A child that ignores everything is killed by its lifetime.
    let mut b = net
        .spawn(1, "sleeper", Command::new("sleep").arg("600"))
        .expect("spawn");
    let started = Instant::now();
    let st = b.wait(T).expect("killed by the lifetime");
    assert!(started.elapsed() < T);
    assert!(!st.success(), "{st:?} {:?}", st.signal());

    // Destroying a host kills what runs in it and refuses new processes there.
    let mut c = net
        .spawn_test(1, "harness_child", &[(ROLE, "idle".into())])
        .expect("spawn");
    c.expect("idle", T).expect("idle");
    net.destroy_host(1).expect("destroy");
    assert!(!c.wait(T).expect("killed").success());
    assert!(net.spawn(1, "late", &Command::new("true")).is_err());
    assert!(net.destroy_host(1).is_err(), "destroyed once");
    assert!(!netns::existing_namespaces().contains(&net.namespaces()[1]));
}
