//! A silent peer costs its own requests their deadline and nobody else anything (issue 22):
//! an agent keeps writing to an honest peer while it loads, writes to, notifies and forgets a
//! peer whose host stopped answering after it published its metadata (its cable pulled: a
//! connect to it gets no answer at all, as when a host dies or a firewall drops packets).

use std::time::{Duration, Instant};

use nixl_testkit::netns::{Net, NetSpec};

use crate::{cfg, report, Peer};

/// The deadline of every request to the silent peer.
const DEADLINE_MS: u64 = 2_000;
/// The longest any request to the honest peer may take (its own deadline is 1 s).
const HONEST_BOUND: Duration = Duration::from_millis(1_500);

/// `keepalive_ms`: the UCX keep-alive of every agent (0: off).
fn silent_peer(test: &str, backend: &'static str, keepalive_ms: u64) {
    let Some(net) = Net::for_test(test, &NetSpec::switched(3)) else {
        return;
    };
    let agent = |name, host| {
        let mut c = cfg(&net, name, host, backend, 1 << 20);
        c.keepalive_ms = keepalive_ms;
        Peer::start(&net, host, &c)
    };
    let mut a = agent("survivor", 0);
    let a_cancel_ms = cfg(&net, "survivor", 0, backend, 1 << 20).cancel_ms;
    let b = agent("honest", 1);
    let mut c = agent("silent", 2);
    a.ok(&format!("fetch {} {} 20000", b.name, b.listen));
    // The silent peer's metadata, taken while it was alive (as a stale etcd entry, a push or
    // a fetch answer gives it); the survivor knows the link address of its host, so packets to
    // it go out and vanish.
    let blob = c.ok("blob");
    net.pin_neighbors(0).expect("pin the survivor's neighbours");
    a.ok(&format!("pump {} {} 4096", b.name, b.addr));
    std::thread::sleep(Duration::from_millis(300));
    net.set_port(0, 2, false)
        .expect("pull the silent host's cable");

    let t = Instant::now();
    let load = a.cmd(&format!("load {blob} 30000"));
    let load_took = t.elapsed();
    assert!(
        !matches!(&load, Err(f) if f.kind == "hung"),
        "loading a silent peer's metadata did not return: {load:?}"
    );
    assert!(
        load_took < Duration::from_secs(5),
        "loading a silent peer's metadata took {load_took:?}: {load:?}"
    );
    println!("{test}: load {load:?}");
    let mut outcomes = vec![format!(
        "load {:?} in {} ms",
        load.as_ref().map(|_| "ok").map_err(|f| f.kind.clone()),
        load_took.as_millis()
    )];
    if load.is_ok() {
        // A write and a notification to it end by their own deadline, typed.
        let t = Instant::now();
        let w = a
            .cmd(&format!(
                "post s write {} {} 4096 {DEADLINE_MS}",
                c.name, c.addr
            ))
            .and_then(|s| {
                if s == "Done" {
                    Ok(s)
                } else {
                    a.cmd(&format!("wait s {}", DEADLINE_MS + 5_000))
                }
            });
        let took = t.elapsed();
        let f = w.expect_err("a write to a silent peer cannot complete");
        assert!(
            matches!(f.kind.as_str(), "timed_out" | "remote_disconnect"),
            "{f:?}"
        );
        assert!(
            took < Duration::from_millis(DEADLINE_MS) + Duration::from_millis(1_500),
            "the write to the silent peer ended {took:?} after its post (deadline {DEADLINE_MS} ms)"
        );
        outcomes.push(format!("write `{}` in {} ms", f.kind, took.as_millis()));
        let _ = a.cmd("drop s");
        // A notification is posted or refused typed, by the agent's deadline; forgetting the
        // peer does not wait for it.
        let t = Instant::now();
        let n = a.cmd(&format!("notify {} hello", c.name));
        let took = t.elapsed();
        assert!(
            n.is_ok()
                || matches!(&n, Err(f) if matches!(f.kind.as_str(), "timed_out" | "remote_disconnect")),
            "a notification to the silent peer: {n:?}"
        );
        assert!(
            took < Duration::from_millis(DEADLINE_MS) + Duration::from_millis(1_500),
            "a notification to the silent peer took {took:?}"
        );
        outcomes.push(format!(
            "notify {:?} in {} ms",
            n.map_err(|f| f.kind),
            took.as_millis()
        ));
        // Forgetting it drains each endpoint for at most the backend's cancel timeout (UCX
        // 1.22's tcp must not be force-closed with operations in flight).
        let t = Instant::now();
        let fg = a.cmd(&format!("forget {}", c.name));
        let took = t.elapsed();
        assert!(fg.is_ok(), "forgetting the silent peer: {fg:?}");
        let bound = Duration::from_millis(a_cancel_ms) + Duration::from_millis(1_500);
        assert!(
            took < bound,
            "forgetting the silent peer took {took:?} (cancel timeout {a_cancel_ms} ms)"
        );
        outcomes.push(format!("forget ok in {} ms", took.as_millis()));
    } else {
        // A load that cannot reach the peer fails typed (a connection that never answers), and
        // nothing of it stays loaded: a notification to it is refused `not_found` at once.
        let kind = load.as_ref().map_err(|f| f.kind.clone()).unwrap_err();
        assert!(
            matches!(kind.as_str(), "timed_out" | "remote_disconnect"),
            "a failed load of a silent peer must say why, typed: {load:?}"
        );
        let n = a.cmd(&format!("notify {} hello", c.name));
        assert!(
            matches!(&n, Err(f) if f.kind == "not_found"),
            "a notification to a peer whose load failed: {n:?}"
        );
        outcomes.push("notify `not_found` (not loaded)".to_owned());
    }
    // The honest peer was served throughout.
    std::thread::sleep(Duration::from_millis(300));
    let stats = a.ok("pump-stop");
    let w: Vec<&str> = stats.splitn(3, ' ').collect();
    let (n, worst): (u64, u64) = (w[0].parse().expect("count"), w[1].parse().expect("worst"));
    let errors = w.get(2).copied().unwrap_or("");
    println!(
        "{test}: {}; honest peer: {n} writes, worst {worst} ms, errors [{errors}]",
        outcomes.join("; ")
    );
    assert!(
        errors.is_empty(),
        "writes to the honest peer failed: {errors}"
    );
    assert!(n >= 10, "the honest peer got only {n} writes");
    assert!(
        Duration::from_millis(worst) < HONEST_BOUND,
        "a write to the honest peer took {worst} ms while a silent peer was loaded, written to, notified and forgotten"
    );
    report(
        &format!("{backend}: a peer whose host went silent is loaded, written, notified, forgotten"),
        "its requests end by their deadline; an honest peer's wait(1 s) returns within 1.5 s throughout",
        &format!("{}; honest worst {worst} ms over {n} writes", outcomes.join("; ")),
        Some(load_took),
    );
    drop(c);
}

#[test]
fn ucx_silent_peer_freezes_nobody() {
    silent_peer("ucx_silent_peer_freezes_nobody", "ucx", 500);
}

#[test]
fn ucx_silent_peer_freezes_nobody_without_keepalive() {
    silent_peer("ucx_silent_peer_freezes_nobody_without_keepalive", "ucx", 0);
}

#[test]
fn libfabric_silent_peer_freezes_nobody() {
    silent_peer("libfabric_silent_peer_freezes_nobody", "libfabric", 0);
}
