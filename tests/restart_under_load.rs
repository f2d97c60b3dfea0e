//! Restart under load (issue 22): a peer is killed (SIGKILL) and restarted on the same name
//! again and again while the survivor keeps writing and reading to it, with a silent peer
//! (SIGSTOPped, its metadata loaded) in the cluster that the survivor keeps trying too. The
//! survivor never crashes or hangs: every request ends `Done` or with a typed error within
//! its deadline, and transfers resume after every restart, every byte verified, without
//! recreating the survivor's agent. Over UCX tcp, UCX shared memory (direct CMA) and
//! libfabric tcp. `NIXL_RESTARTS` sets the number of restarts (default 100).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use nixl::core::ErrorKind;
use nixl::libfabric::LibfabricParams;
use nixl::ucx::{probe, UcxParams};
use nixl::{Agent, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};
use nixl_testkit::signal::Sig;
use nixl_testkit::two_process::{child_main, Child};
use nixl_testkit::{skip, Dep};

const CHILD: &str = "restart_peer_role";
/// The block each request moves.
const BLK: u64 = 64 << 10;
/// The deadline of every request of the survivor.
const DEADLINE: Duration = Duration::from_secs(1);
/// How much later than its deadline a request may end (a loaded 2-core machine; cancel).
const SLACK: Duration = Duration::from_millis(1500);

/// Creates the backend of `kind` (`libfabric`, or a UCX transport selection) on `a`.
fn create_backend(a: &Agent, kind: &str) -> nixl::Result<()> {
    match kind {
        "libfabric" => a.create_backend(
            LibfabricParams::default()
                .provider("tcp".to_string())
                .op_timeout(Duration::from_millis(500)),
        ),
        tls => a.create_backend(
            UcxParams::default()
                .transports(tls.to_string())
                .keepalive_interval(Duration::from_millis(500))
                .cancel_timeout(Duration::from_millis(500)),
        ),
    }
    .map(|_| ())
}

fn agent(name: &str, kind: &str) -> Agent {
    let a = Agent::new(
        name,
        nixl::agent_config()
            .listen(true)
            .default_timeout(Duration::from_secs(10)),
    )
    .expect("agent");
    create_backend(&a, kind).expect("backend");
    a
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn restart_peer_role() {
    child_main(|env| {
        let kind = env.var("kind")?;
        let a =
            Agent::new(&env.name, nixl::agent_config().listen(true)).map_err(|e| e.to_string())?;
        create_backend(&a, &kind).map_err(|e| e.to_string())?;
        let buf = Arc::new(HostBuffer::new(2 * BLK as usize).ok_or("alloc")?);
        let _reg = a
            .register_mem(vec![buf.clone()], &[])
            .map_err(|e| e.to_string())?;
        env.connect(&a, Duration::from_secs(20))?;
        a.gen_notif(&env.parent, format!("ready {}", buf.addr()).as_bytes(), &[])
            .map_err(|e| e.to_string())?;
        // Serve until killed (or the parent is gone).
        while env.parent_alive() {
            a.progress();
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
}

/// What the survivor's traffic saw.
#[derive(Debug, Default)]
struct Seen {
    /// Verified write+read round trips per incarnation.
    verified: Vec<u64>,
    /// Typed errors by kind.
    errors: std::collections::BTreeMap<&'static str, u64>,
    /// The longest a request took past its post.
    worst: Duration,
    /// Failures of the test's own rules.
    broken: Vec<String>,
    /// Completed requests whose path was direct CMA, and an example of another path (with
    /// how many took one).
    direct_cma: u64,
    other_paths: (u64, Option<String>),
}

/// The target of the traffic: (incarnation, name, remote address).
type Target = Arc<Mutex<Option<(usize, String, u64)>>>;

fn one_request(
    a: &Agent,
    op: XferOp,
    local: u64,
    remote: u64,
    name: &str,
    seen: &Mutex<Seen>,
) -> bool {
    let t = Instant::now();
    let r = a
        .create_xfer_req(
            op,
            &XferDescList::blocks(MemKind::Dram, local, BLK, 1),
            &XferDescList::blocks(MemKind::Dram, remote, BLK, 1),
            name,
            XferOptions::default().timeout(DEADLINE),
        )
        .and_then(|r| a.post_xfer_req(&r).map(|_| r))
        .and_then(|r| r.wait(DEADLINE + SLACK).map(|()| r.path()));
    let took = t.elapsed();
    let mut s = seen.lock();
    s.worst = s.worst.max(took);
    if took > DEADLINE + SLACK {
        s.broken.push(format!("a {op:?} to {name} took {took:?}"));
    }
    match r {
        Ok(path) => {
            if path.contains("direct CMA") {
                s.direct_cma += 1;
            } else {
                s.other_paths.0 += 1;
                s.other_paths.1.get_or_insert(path);
            }
            true
        }
        Err(e) => {
            let k = e.kind();
            if !matches!(
                k,
                ErrorKind::RemoteDisconnect
                    | ErrorKind::PeerRestarted
                    | ErrorKind::TimedOut
                    | ErrorKind::NotFound
                    | ErrorKind::Backend
            ) {
                s.broken.push(format!("untyped outcome for {name}: {e}"));
            }
            *s.errors.entry(k.as_str()).or_default() += 1;
            drop(s);
            // A dead peer fails at once: do not spin on it.
            std::thread::sleep(Duration::from_millis(1));
            false
        }
    }
}

/// Writes a pattern to the current target and reads it back, verified, until `stop`; also
/// tries the silent peer every tenth round.
fn traffic(
    a: Agent,
    target: Target,
    silent: (String, u64),
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
) {
    let src = Arc::new(HostBuffer::new(BLK as usize).expect("alloc"));
    let back = Arc::new(HostBuffer::new(BLK as usize).expect("alloc"));
    let _reg = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .expect("register");
    let mut round = 0u64;
    while !stop.load(Ordering::Acquire) {
        round += 1;
        if round.is_multiple_of(10) {
            one_request(&a, XferOp::Write, src.addr(), silent.1, &silent.0, &seen);
        }
        let Some((inc, name, raddr)) = target.lock().clone() else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        src.fill((round % 251) as u8 + 1);
        back.fill(0);
        if one_request(&a, XferOp::Write, src.addr(), raddr, &name, &seen)
            && one_request(&a, XferOp::Read, back.addr(), raddr, &name, &seen)
        {
            let mut s = seen.lock();
            if back.to_vec() != src.to_vec() {
                s.broken
                    .push(format!("incarnation {inc}: read back other bytes"));
            } else {
                if s.verified.len() <= inc {
                    s.verified.resize(inc + 1, 0);
                }
                s.verified[inc] += 1;
            }
        }
    }
}

fn ready_addr(msg: &[u8]) -> u64 {
    let s = String::from_utf8_lossy(msg);
    s.strip_prefix("ready ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected message {s:?}"))
}

fn restart_under_load(test: &str, kind: &str) {
    if kind == "libfabric" {
        if let Err(e) = nixl::libfabric::library_status() {
            skip(test, Dep::Libfabric, format!("no usable libfabric: {e}"));
            return;
        }
    } else if let Err(e) = probe(&UcxParams::default()) {
        skip(test, Dep::Ucx, format!("no usable UCX: {e}"));
        return;
    }
    let restarts: usize = std::env::var("NIXL_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let pid = std::process::id();
    let survivor = agent(&format!("survivor-{kind}-{pid}"), kind);
    let vars = [("kind", kind)];
    // The silent peer: alive when it published, then stopped for good.
    let mut quiet = Child::spawn(CHILD, &survivor, &format!("silent-{kind}-{pid}"), &vars)
        .expect("spawn the silent peer");
    let quiet_addr = ready_addr(
        &quiet
            .next(&survivor, Duration::from_secs(60))
            .expect("ready"),
    );
    quiet.signal(Sig::Stop).expect("SIGSTOP");
    let target: Target = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let worker = {
        let (a, t, s, seen) = (survivor.clone(), target.clone(), stop.clone(), seen.clone());
        let silent = (quiet.name().to_owned(), quiet_addr);
        std::thread::spawn(move || traffic(a, t, silent, s, seen))
    };
    let name = format!("restarted-{kind}-{pid}");
    let started = Instant::now();
    for inc in 0..restarts {
        let mut c = Child::spawn(CHILD, &survivor, &name, &vars).expect("spawn");
        let msg = c
            .next(&survivor, Duration::from_secs(60))
            .unwrap_or_else(|e| {
                // What the survivor saw, for a failure that cannot be rerun at will.
                panic!(
                    "incarnation {inc}: {e}; the child is {}; survivor: metadata of {name} \
                     loaded {}, dropped notifications {:?}, traffic {:?}",
                    if c.try_wait().is_none() {
                        "alive"
                    } else {
                        "gone"
                    },
                    survivor.check_remote_metadata(&name, None),
                    survivor.dropped_notifs(),
                    seen.lock()
                )
            });
        *target.lock() = Some((inc, name.clone(), ready_addr(&msg)));
        // Transfers resume: at least one verified round trip to this incarnation.
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let s = seen.lock();
            assert!(s.broken.is_empty(), "{:?}", s.broken);
            if s.verified.get(inc).copied().unwrap_or(0) > 0 {
                break;
            }
            drop(s);
            assert!(
                Instant::now() < end,
                "incarnation {inc}: no verified transfer within 30 s ({:?})",
                seen.lock()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // Killed under load: the traffic keeps hitting the dead incarnation until the next.
        c.kill();
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Release);
    worker.join().expect("the traffic thread panicked");
    let s = seen.lock();
    println!(
        "{test}: {restarts} restarts in {:?}; verified round trips per incarnation min {} max {}; errors {:?}; worst request {:?}",
        started.elapsed(),
        s.verified.iter().min().unwrap_or(&0),
        s.verified.iter().max().unwrap_or(&0),
        s.errors,
        s.worst
    );
    assert!(s.broken.is_empty(), "{:?}", s.broken);
    assert_eq!(s.verified.len(), restarts);
    assert!(s.verified.iter().all(|&n| n > 0));
    assert!(
        s.errors.values().sum::<u64>() > 0,
        "the silent and dead peers were tried: typed errors expected"
    );
    if kind == "shm,cma,self" {
        // The path named: every completed request went by direct CMA, none fell back.
        assert!(
            s.direct_cma > 0 && s.other_paths.0 == 0,
            "direct CMA {} requests, other paths {:?}",
            s.direct_cma,
            s.other_paths
        );
    }
}

#[test]
fn restart_under_load_ucx_tcp() {
    restart_under_load("restart_under_load_ucx_tcp", "tcp");
}

#[test]
fn restart_under_load_ucx_shm_direct_cma() {
    restart_under_load("restart_under_load_ucx_shm_direct_cma", "shm,cma,self");
}

#[test]
fn restart_under_load_libfabric_tcp() {
    restart_under_load("restart_under_load_libfabric_tcp", "libfabric");
}
