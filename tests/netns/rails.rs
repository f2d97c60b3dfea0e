//! Two rails: two links (`eth0`, `eth1`) between the same two hosts.

use std::time::{Duration, Instant};

use nixl_testkit::netns::{Net, NetSpec};

use crate::{cfg, report, Peer, T};
use nixl_testkit::eventually;

const MIB: usize = 1 << 20;
const BIG: usize = 32 * MIB;

fn two_rails(test: &str, backend: &'static str) -> Option<(Net, Peer, Peer)> {
    two_rails_on(test, backend, None)
}

/// A UCX of version 1.23 or later for `test`'s agents: the libucp named by `NIXL_NETNS_UCX`,
/// else the default UCX if it is 1.23 or later (`Some(None)`); `None` (skipped, reported)
/// otherwise. Only the agents (child
/// processes) load it: one process keeps the first UCX it loads.
fn ucx_1_23(test: &str) -> Option<Option<String>> {
    // An explicit libucp of 1.23 or later for the agents (e.g. NIXL's wheel's:
    // `NIXL_NETNS_UCX=$NIXL_WHEEL_UCX`); not the default, as loading the wheel's UCX inside a
    // fresh Debian root crashed the agent at its first connect (not understood yet).
    if let Some(p) =
        std::env::var_os("NIXL_NETNS_UCX").filter(|p| std::path::Path::new(p).is_file())
    {
        return Some(Some(p.to_string_lossy().into_owned()));
    }
    let default = nixl::ucx::probe(&nixl::ucx::UcxParams::default())
        .ok()
        .map(|(v, _)| v);
    let at_least = |v: &str| {
        let v: Vec<u32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
        v.as_slice() >= [1, 23].as_slice()
    };
    if default.as_deref().is_some_and(at_least) {
        return Some(None);
    }
    nixl_testkit::skip(
        test,
        nixl_testkit::Dep::Ucx123,
        format!(
            "UCX {} crashes in this scenario; needs UCX 1.23 or later (NIXL_NETNS_UCX=<libucp of 1.23+>)",
            default.unwrap_or_else(|| "(none)".into())
        ),
    );
    None
}

fn two_rails_on(
    test: &str,
    backend: &'static str,
    ucx: Option<String>,
) -> Option<(Net, Peer, Peer)> {
    let net = Net::for_test(test, &NetSpec::pair(2))?;
    let mut ca = cfg(&net, "init", 0, backend, BIG);
    let mut cb = cfg(&net, "target", 1, backend, 2 * BIG);
    ca.ucx_path = ucx.clone();
    cb.ucx_path = ucx;
    ca.domains = vec![Net::ifname(0), Net::ifname(1)];
    cb.domains = ca.domains.clone();
    let mut a = Peer::start(&net, 0, &ca);
    let mut b = Peer::start(&net, 1, &cb);
    a.ok(&format!("fetch {} {} 20000", b.name, b.listen));
    b.ok(&format!("fetch {} {} 20000", a.name, a.listen));
    Some((net, a, b))
}

fn sent(net: &Net, rail: usize) -> u64 {
    net.counters(rail, 0).unwrap_or_default().tx_bytes
}

/// A 32 MiB write crosses both links: each host-0 interface sends at least a quarter of it
/// (`/sys/class/net/eth*/statistics/tx_bytes`), and every byte arrives.
fn both_rails_carry_bytes(test: &str, backend: &'static str) {
    let Some((net, mut a, mut b)) = two_rails(test, backend) else {
        return;
    };
    a.ok("fill 77");
    let before = [sent(&net, 0), sent(&net, 1)];
    a.ok(&format!(
        "post w write {} {} {BIG} 30000 striped",
        b.name, b.addr
    ));
    a.ok("wait w 30000");
    assert_eq!(b.ok(&format!("notifs {} 1 20000", a.name)), "striped");
    assert_eq!(b.ok(&format!("verify 77 0 {BIG}")), "");
    let carried = [sent(&net, 0) - before[0], sent(&net, 1) - before[1]];
    let path = a.ok(&format!("path {}", b.name));
    println!(
        "{test}: eth0 sent {} B, eth1 sent {} B; {path}",
        carried[0], carried[1]
    );
    for (rail, c) in carried.iter().enumerate() {
        assert!(
            *c >= (BIG / 4) as u64,
            "eth{rail} carried {c} B of {BIG}: {carried:?}; {path}"
        );
    }
    assert!(path.contains("eth0") && path.contains("eth1"), "{path}");
}

#[test]
fn libfabric_two_rails_carry_bytes() {
    both_rails_carry_bytes("libfabric_two_rails_carry_bytes", "libfabric");
}

#[test]
fn ucx_two_lanes_carry_bytes() {
    both_rails_carry_bytes("ucx_two_lanes_carry_bytes", "ucx");
}

/// Starts a 32 MiB write striped over two slowed rails and fails rail 1 (both its cables
/// pulled) once both carry it; returns the write's error and the time from the cut to it.
fn fail_rail_mid_write(net: &Net, a: &mut Peer, b: &Peer) -> (crate::Failure, Duration) {
    for rail in 0..2 {
        // 50 Mbit/s each: the 16 MiB on each rail take 2.7 s.
        net.limit_rate(rail, Some(50_000_000)).expect("slow rails");
    }
    a.ok("fill 90");
    let before = [sent(net, 0), sent(net, 1)];
    a.ok(&format!("post w write {} {} {BIG} 6000", b.name, b.addr));
    assert!(
        eventually(T, || {
            sent(net, 0) - before[0] > 2 * MIB as u64 && sent(net, 1) - before[1] > 2 * MIB as u64
        }),
        "both rails carry the write"
    );
    assert_eq!(a.ok("check w"), "InProgress", "still in flight");
    net.set_segment(1, false).expect("fail rail 1");
    let cut = Instant::now();
    let f = a
        .cmd("wait w 30000")
        .expect_err("half the write is on a dead rail");
    (f, cut.elapsed())
}

/// A 1 MiB write of `byte` into the target's second half, verified; the bytes each
/// interface sent meanwhile, and the request's path (its split over the rails).
fn small_write(net: &Net, a: &mut Peer, b: &mut Peer, byte: u8, id: &str) -> ([u64; 2], String) {
    a.ok(&format!("fill {byte}"));
    let before = [sent(net, 0), sent(net, 1)];
    a.ok(&format!(
        "post {id} write {} {} {MIB} 20000 {id}",
        b.name,
        b.addr + BIG as u64
    ));
    a.ok(&format!("wait {id} 20000"));
    assert_eq!(b.ok(&format!("notifs {} 1 20000", a.name)), id);
    assert_eq!(b.ok(&format!("verify {byte} {BIG} {MIB}")), "");
    let path = a.ok(&format!("reqpath {id}"));
    ([sent(net, 0) - before[0], sent(net, 1) - before[1]], path)
}

/// libfabric: the striped write fails (its deadline: the tcp provider reports nothing for a
/// dead link), the rail it is stuck on is failed for that peer (the path report says so),
/// and new requests, with no reload, go over rail 0 alone; once the rail is repaired, a
/// metadata reload brings it back into the stripe.
#[test]
fn libfabric_rail_down_mid_transfer_moves_new_requests_to_the_other_rail() {
    let test = "libfabric_rail_down_mid_transfer";
    let Some((net, mut a, mut b)) = two_rails(test, "libfabric") else {
        return;
    };
    let (f, to_error) = fail_rail_mid_write(&net, &mut a, &b);
    assert_eq!(f.kind, "timed_out", "{f:?}");
    let path = a.ok(&format!("path {}", b.name));
    assert!(
        path.contains("rail1 eth1") && path.contains("[failed]"),
        "{path}"
    );
    assert!(
        !path.contains("eth0: 0 B written, 0 B read [failed]"),
        "{path}"
    );
    let (moved, moved_path) = small_write(&net, &mut a, &mut b, 91, "after-failure");
    assert!(
        moved_path.contains(&format!("rail0 eth0: {MIB} B"))
            && moved_path.contains("rail1 eth1: 0 B"),
        "rail 0 alone carries the new request: {moved_path}"
    );
    assert!(moved[0] >= MIB as u64, "eth0 sent it: {moved:?}");
    net.set_segment(1, true).expect("repair rail 1");
    a.ok(&format!("forget {}", b.name));
    a.ok(&format!("fetch {} {} 20000", b.name, b.listen));
    let (both, both_path) = small_write(&net, &mut a, &mut b, 92, "after-repair");
    let half = format!("{} B", MIB / 2);
    assert!(
        both_path.contains(&format!("rail0 eth0: {half}"))
            && both_path.contains(&format!("rail1 eth1: {half}")),
        "both rails again after the reload: {both_path}"
    );
    assert!(
        both[0] >= (MIB / 2) as u64 && both[1] >= (MIB / 2) as u64,
        "{both:?}"
    );
    println!("{test}: {f:?} after {to_error:?}; {path}; new request {moved:?} {moved_path}; after repair {both:?} {both_path}");
    report(
        "libfabric: rail 1 of 2 fails mid-WRITE (32 MiB striped)",
        "typed error; the rail reported; new requests on the other rail",
        "`timed_out` (the tcp provider reports no error for a dead link); path report marks rail1 `[failed]`; new 1 MiB write, no reload: all bytes on eth0, verified; after the repair and a reload both rails again",
        Some(to_error),
    );
}

/// UCX: the endpoint's lanes fail together: the striped write ends in `RemoteDisconnect`
/// (TCP user timeout of the failed lane) and reconnecting is refused while the rail is down
/// (UCX connects every lane it selected, and still selects the dead interface); after the
/// repair, a reload and new requests work over both lanes again.
#[test]
fn ucx_rail_down_mid_transfer_fails_the_request_until_repaired() {
    let test = "ucx_rail_down_mid_transfer";
    // UCX 1.22's tcp transport crashed the initiator (SIGSEGV in its progress, 4 of 7 loaded
    // runs) around closing the failed endpoint and reconnecting over the repaired link; 1.23
    // passed 21 of 22 runs (no crash). So this runs on UCX 1.23 or later only and skips with
    // `ucx-1.23` otherwise (docs/reliability.md, "Known bugs").
    let Some(ucx) = ucx_1_23(test) else {
        return;
    };
    let Some((net, mut a, mut b)) = two_rails_on(test, "ucx", ucx) else {
        return;
    };
    let (f, to_error) = fail_rail_mid_write(&net, &mut a, &b);
    assert_eq!(f.kind, "remote_disconnect", "{f:?}");
    let path = a.ok(&format!("path {}", b.name));
    assert!(path.contains("failed"), "{path}");
    assert!(
        !path.contains("UCX 1.22"),
        "runs on UCX 1.23 or later: {path}"
    );
    let early = a
        .cmd(&format!("post e write {} {} {MIB} 5000", b.name, b.addr))
        .expect_err("the endpoint failed");
    assert_eq!(early.kind, "remote_disconnect");
    a.ok(&format!("forget {}", b.name));
    // A reload while the rail is still down is refused (`remote_disconnect`: UCX picks the
    // dead interface for a lane and its connect fails), but under a loaded machine that path
    // crashed the process inside UCX 1.22's libucs (2 of 4 full-suite runs; 6 of 6 alone
    // passed), so it is not exercised here: see docs/reliability.md, "Known bugs".
    net.set_segment(1, true).expect("repair rail 1");
    a.ok(&format!("fetch {} {} 20000", b.name, b.listen));
    if b.cmd(&format!("notify {} probe", a.name)).is_err() {
        b.ok(&format!("forget {}", a.name));
        b.ok(&format!("fetch {} {} 20000", a.name, a.listen));
        // b's new connection may replace the one a's endpoint shared with b's old endpoint
        // (UCX pairs the first endpoints two workers create): a's endpoint then fails with
        // "the peer replaced this UCX connection; reload its metadata", so a reloads too.
        a.ok(&format!("forget {}", b.name));
        a.ok(&format!("fetch {} {} 20000", b.name, b.listen));
    }
    let (both, both_path) = small_write(&net, &mut a, &mut b, 93, "after-repair");
    assert!(both_path.contains("tcp/eth0, tcp/eth1"), "{both_path}");
    assert!(
        both[0] + both[1] >= MIB as u64,
        "the write crossed the links: {both:?}"
    );
    println!("{test}: {f:?} after {to_error:?}; {path}; after repair {both:?}");
    report(
        "UCX: rail 1 of 2 fails mid-WRITE (32 MiB over two lanes)",
        "typed error",
        "`remote_disconnect` (the endpoint's lanes fail together); new requests fail at once; after the repair a reload works over both lanes",
        Some(to_error),
    );
}
