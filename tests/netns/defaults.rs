//! Safe defaults across hosts (issue 23): a default agent's UCX tcp listens on nothing but the
//! loopback interface, or the devices it was given; keep-alive is on by default and detects
//! a pulled cable.

use std::time::{Duration, Instant};

use nixl_testkit::netns::{Net, NetSpec};

use crate::agent::KEEPALIVE_DEFAULT;
use crate::{cfg, report, Peer, T};
use nixl_testkit::eventually;

/// The listening sockets of `p`'s host other than its side channel's.
fn ucx_listening(p: &mut Peer) -> Vec<std::net::SocketAddr> {
    let side = p.listen;
    p.ok("listening")
        .split_whitespace()
        .map(|a| a.parse().expect("address"))
        .filter(|a: &std::net::SocketAddr| *a != side)
        .collect()
}

#[test]
fn ucx_tcp_listens_on_loopback_or_the_named_devices_only() {
    let Some(net) = Net::for_test(
        "ucx_tcp_listens_on_loopback_or_the_named_devices_only",
        &NetSpec::pair(1),
    ) else {
        return;
    };
    // Default params: no device named.
    let mut plain = cfg(&net, "plain", 0, "ucx", 1 << 20);
    plain.domains.clear();
    plain.tls = Some("tcp".into());
    plain.keepalive_ms = KEEPALIVE_DEFAULT;
    let mut a = Peer::start(&net, 0, &plain);
    let l = ucx_listening(&mut a);
    println!("default UCX agent listens on {l:?}");
    assert!(!l.is_empty(), "UCX's tcp transport listens somewhere");
    assert!(
        l.iter().all(|s| s.ip().is_loopback()),
        "a default agent's UCX listens beyond loopback: {l:?}"
    );
    // The host's link named: UCX listens there (and only there).
    let mut named = cfg(&net, "named", 1, "ucx", 1 << 20);
    named.tls = Some("tcp".into());
    let mut b = Peer::start(&net, 1, &named);
    let l = ucx_listening(&mut b);
    let eth0 = net.addr(0, 1).expect("address");
    println!("UCX agent with devices eth0 listens on {l:?}");
    assert!(l.iter().any(|s| s.ip() == eth0), "{l:?}");
    assert!(
        l.iter().all(|s| s.ip() == eth0),
        "listens beyond the named device: {l:?}"
    );
    // And across the link, named devices carry a transfer; the default agent on the other
    // host is not reachable there (its UCX is on loopback only).
    // Loading it fails at once, typed: UCX has no way to it.
    let f = b
        .cmd(&format!("fetch {} {} 20000", a.name, a.listen))
        .and_then(|_| b.cmd(&format!("post x write {} {} 4096 3000", a.name, a.addr)))
        .and_then(|s| {
            if s == "Done" {
                Ok(s)
            } else {
                b.cmd("wait x 10000")
            }
        });
    let f = f.expect_err("a peer whose UCX listens on loopback only was reached");
    assert_eq!(f.kind, "remote_disconnect", "{f:?}");
    report(
        "UCX default params: tcp devices",
        "listens on loopback only; named devices only when named",
        "as expected",
        None,
    );
}

/// The cable of the target is pulled while a 64 MiB write is in flight, with the backend's
/// default keep-alive: the request ends in `RemoteDisconnect` (the peer declared dead), not
/// only by its deadline.
#[test]
fn ucx_default_keepalive_detects_a_pulled_cable() {
    let test = "ucx_default_keepalive_detects_a_pulled_cable";
    let Some(net) = Net::for_test(test, &NetSpec::pair(1)) else {
        return;
    };
    net.limit_rate(0, Some(200_000_000)).expect("rate");
    let mut ca = cfg(&net, "init", 0, "ucx", 64 << 20);
    let mut cb = cfg(&net, "target", 1, "ucx", 128 << 20);
    ca.keepalive_ms = KEEPALIVE_DEFAULT;
    cb.keepalive_ms = KEEPALIVE_DEFAULT;
    let mut a = Peer::start(&net, 0, &ca);
    let b = Peer::start(&net, 1, &cb);
    a.ok(&format!("fetch {} {} 20000", b.name, b.listen));
    let deadline_ms = 40_000;
    let posted = a.ok(&format!(
        "post w write {} {} {} {deadline_ms}",
        b.name,
        b.addr,
        64 << 20
    ));
    assert_eq!(posted, "InProgress");
    let before = net.counters(0, 1).expect("counters").rx_bytes;
    assert!(
        eventually(T, || net.counters(0, 1).map(|c| c.rx_bytes).unwrap_or(0)
            - before
            >= 4 << 20),
        "the write's bytes reach the target"
    );
    net.set_port(0, 1, false).expect("pull the cable");
    let cut = Instant::now();
    let f = a
        .cmd(&format!("wait w {}", deadline_ms + 10_000))
        .expect_err("a write over a pulled cable cannot complete");
    let took = cut.elapsed();
    println!("{test}: `{}` after {took:?}: {}", f.kind, f.msg);
    assert_eq!(f.kind, "remote_disconnect", "{f:?}");
    // Declared dead at the tcp user timeout the default keep-alive sets (4 intervals of 2 s:
    // 8 s of unacknowledged data), plus up to one retransmission's backoff and the check's own
    // latency: a stated slack of 4 s.
    let user_timeout = nixl::ucx::UcxParams::default()
        .keepalive_interval
        .expect("keep-alive is on by default")
        * nixl::ucx::TCP_USER_TIMEOUT_FACTOR;
    let slack = Duration::from_secs(4);
    assert!(
        took >= user_timeout / 2 && took < user_timeout + slack,
        "declared dead after {took:?} (user timeout {user_timeout:?})"
    );
    report(
        "ucx, default keep-alive: cable pulled mid-WRITE (64 MiB)",
        "the peer is declared dead (RemoteDisconnect), well before a 40 s deadline",
        &format!("`{}`", f.kind),
        Some(took),
    );
}
