//! Scale across hosts: 4 hosts x 16 agents (one process per host) on one switch, metadata
//! through etcd (running on host 0), and a 64 KiB block written from every agent to every
//! other (4032 writes, three quarters of them across the network), each with a
//! notification, each block verified by its target.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::core::etcd::{EtcdConfig, EtcdExchange, LocalEtcd, DEFAULT_LABEL};
use nixl::ucx::UcxParams;
use nixl::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, Registration, XferDescList, XferOp, XferOptions,
};
use nixl_testkit::netns::{Control, HostProcess, Net, NetSpec};

use crate::{ROLE, T};

const HOSTS: usize = 4;
const PER_HOST: usize = 16;
const AGENTS: usize = HOSTS * PER_HOST;
const BLOCK: usize = 64 << 10;
const CFG: &str = "NIXL_NETNS_SCALE";
/// The bound on each phase (no speed is asserted; a phase that does not end fails the test).
const PHASE: Duration = Duration::from_secs(120);

fn name(tag: &str, g: usize) -> String {
    format!("s{g}-{tag}")
}

/// The byte agent `from` writes into every block it sends.
fn byte(from: usize) -> u8 {
    (from as u8).wrapping_mul(3).wrapping_add(1)
}

/// The host side: 16 agents; phases driven by the parent (`load`, `write`, `check`).
pub(crate) fn child(ctl: Control) -> Result<(), String> {
    let cfg = std::env::var(CFG).map_err(|_| format!("{CFG} not set"))?;
    let w: Vec<&str> = cfg.split(';').collect();
    let [tag, ip, url] = w[..] else {
        return Err(format!("bad {CFG} {cfg:?}"));
    };
    let host = ctl.host();
    let ip: std::net::IpAddr = ip.parse().map_err(|_| "bad ip")?;
    let _etcd = if url == "serve" {
        let s = LocalEtcd::start_on(ip).map_err(|e| e.to_string())?;
        ctl.send(&format!("etcd {}", s.endpoint()));
        Some(s)
    } else {
        None
    };
    let url = match &_etcd {
        Some(s) => s.endpoint(),
        None => url.to_owned(),
    };
    let ecfg = EtcdConfig::default()
        .endpoints(vec![url])
        .namespace(format!("/nixl-scale/{tag}"))
        .request_timeout(Duration::from_secs(10));
    let e = |x: Error| x.to_string();
    struct Node {
        g: usize,
        agent: Agent,
        x: EtcdExchange,
        mem: Arc<HostBuffer>,
        _reg: Registration,
    }
    let t = Instant::now();
    let nodes: Vec<Node> = (0..PER_HOST)
        .map(|i| {
            let g = host * PER_HOST + i;
            let agent = Agent::new(&name(tag, g), AgentConfig::default()).map_err(e)?;
            // The host's link: UCX's tcp listens on loopback only unless told.
            agent
                .create_backend(UcxParams::default().devices(nixl_testkit::netns::Net::ifname(0)))
                .map_err(e)?;
            // Slot k receives agent k's block; the last slot is the block this agent sends.
            let mem = Arc::new(HostBuffer::new((AGENTS + 1) * BLOCK).ok_or("cannot allocate")?);
            let reg = agent.register_mem(vec![mem.clone()], &[]).map_err(e)?;
            let x = EtcdExchange::new(&agent, &ecfg).map_err(e)?;
            x.publish().map_err(e)?;
            Ok(Node {
                g,
                agent,
                x,
                mem,
                _reg: reg,
            })
        })
        .collect::<Result<_, String>>()?;
    ctl.send(&format!("published {}", t.elapsed().as_millis()));
    let addrs: HashMap<String, u64> = HashMap::new();
    let mut addrs = addrs;
    loop {
        let Some(cmd) = ctl.recv(PHASE) else {
            return Err("no command from the parent".into());
        };
        let t = Instant::now();
        let r: Result<String, String> = match cmd.as_str() {
            // Every agent loads every other one's metadata with one paged range read.
            "load" => std::thread::scope(|s| {
                let hs: Vec<_> = nodes
                    .iter()
                    .map(|n| {
                        s.spawn(move || -> Result<usize, String> {
                            let all = n.x.fetch_all(DEFAULT_LABEL).map_err(e)?;
                            let ok = all.iter().filter(|(_, r)| r.is_ok()).count();
                            if ok != AGENTS - 1 {
                                let bad: Vec<_> = all.iter().filter(|(_, r)| r.is_err()).collect();
                                return Err(format!(
                                    "{}: loaded {ok} of {}: {bad:?}",
                                    n.agent.name(),
                                    AGENTS - 1
                                ));
                            }
                            Ok(ok)
                        })
                    })
                    .collect();
                let mut total = 0;
                for h in hs {
                    total += h.join().map_err(|_| "a loader panicked")??;
                }
                Ok(format!("loaded {total} {}", t.elapsed().as_millis()))
            }),
            // Base addresses of every agent's memory, from the parent (gathered from "mem").
            c if c.starts_with("addrs ") => {
                for kv in c["addrs ".len()..].split(',') {
                    if let Some((k, v)) = kv.split_once('=') {
                        addrs.insert(k.to_owned(), v.parse().map_err(|_| "bad address")?);
                    }
                }
                Ok(format!("addrs {}", addrs.len()))
            }
            "mem" => Ok(format!(
                "mem {}",
                nodes
                    .iter()
                    .map(|n| format!("{}={}", n.agent.name(), n.mem.addr()))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            // Every agent writes its block into its slot at every other agent, with a
            // notification, all requests in flight at once.
            "write" => std::thread::scope(|s| {
                let addrs = &addrs;
                let hs: Vec<_> = nodes
                    .iter()
                    .map(|n| {
                        s.spawn(move || -> Result<(), String> {
                            let own = AGENTS * BLOCK;
                            if !n.mem.write_at(own, &vec![byte(n.g); BLOCK]) {
                                return Err("cannot fill the block".into());
                            }
                            let src = XferDescList::blocks(
                                MemKind::Dram,
                                n.mem.addr() + own as u64,
                                BLOCK as u64,
                                1,
                            );
                            let mut reqs = Vec::with_capacity(AGENTS);
                            for to in (0..AGENTS).filter(|&k| k != n.g) {
                                let peer = name(tag, to);
                                let base =
                                    addrs.get(&peer).ok_or(format!("no address of {peer}"))?;
                                let dst = XferDescList::blocks(
                                    MemKind::Dram,
                                    base + (n.g * BLOCK) as u64,
                                    BLOCK as u64,
                                    1,
                                );
                                let opts =
                                    (XferOptions::with_notif(format!("b{}", n.g).into_bytes()))
                                        .timeout(PHASE);
                                let r = n
                                    .agent
                                    .create_xfer_req(XferOp::Write, &src, &dst, &peer, opts)
                                    .map_err(e)?;
                                n.agent.post_xfer_req(&r).map_err(e)?;
                                reqs.push(r);
                            }
                            for r in &reqs {
                                r.wait(PHASE).map_err(e)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().map_err(|_| "a writer panicked")??;
                }
                Ok(format!("written {}", t.elapsed().as_millis()))
            }),
            // Every agent waits for a notification from each other agent and verifies the
            // block that agent wrote.
            "check" => std::thread::scope(|s| {
                let hs: Vec<_> = nodes
                    .iter()
                    .map(|n| {
                        s.spawn(move || -> Result<(), String> {
                            let mut seen = [false; AGENTS];
                            seen[n.g] = true;
                            let end = Instant::now() + PHASE;
                            while seen.iter().any(|s| !s) {
                                if Instant::now() >= end {
                                    let missing: Vec<usize> =
                                        (0..AGENTS).filter(|&k| !seen[k]).collect();
                                    return Err(format!(
                                        "{}: no notification from {missing:?}",
                                        n.agent.name()
                                    ));
                                }
                                let got = match n.agent.wait_notifs(Duration::from_millis(200)) {
                                    Ok(g) => g,
                                    Err(Error::TimedOut { .. }) => continue,
                                    Err(x) => return Err(e(x)),
                                };
                                for msgs in got.into_values() {
                                    for m in msgs {
                                        let k: usize = String::from_utf8_lossy(&m)
                                            .strip_prefix('b')
                                            .and_then(|k| k.parse().ok())
                                            .filter(|&k| k < AGENTS)
                                            .ok_or("bad notification")?;
                                        let mut v = vec![0u8; BLOCK];
                                        n.mem.read_at(k * BLOCK, &mut v);
                                        if v.iter().any(|&b| b != byte(k)) {
                                            return Err(format!(
                                                "{}: block from {k} is wrong",
                                                n.agent.name()
                                            ));
                                        }
                                        seen[k] = true;
                                    }
                                }
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().map_err(|_| "a checker panicked")??;
                }
                Ok(format!("verified {}", t.elapsed().as_millis()))
            }),
            "exit" => return Ok(()),
            other => Err(format!("unknown command {other}")),
        };
        match r {
            Ok(reply) => ctl.send(&reply),
            Err(m) => {
                ctl.send(&format!("error {m}"));
                return Err(m);
            }
        }
    }
}

/// Sends `cmd` to every host and returns each reply, which must start with `want`.
fn all(hosts: &mut [HostProcess], cmd: &str, want: &str) -> Vec<String> {
    for h in hosts.iter_mut() {
        h.send(cmd).expect("send");
    }
    hosts
        .iter_mut()
        .map(|h| {
            let r = h.recv(PHASE + T).expect("reply");
            assert!(r.starts_with(want), "{}: {cmd}: {r}", h.label());
            r[want.len()..].trim().to_owned()
        })
        .collect()
}

#[test]
fn four_hosts_sixteen_agents_each_exchange_through_etcd_and_write_to_all() {
    let test = "four_hosts_sixteen_agents_each";
    let Some(net) = Net::for_test(test, &NetSpec::switched(HOSTS)) else {
        return;
    };
    let tag = format!("{}", std::process::id());
    let started = Instant::now();
    let spawn = |h: usize, url: &str| {
        let ip = net.addr(0, h).expect("on the switch");
        net.spawn_test(
            h,
            crate::CHILD,
            &[(ROLE, "scale".into()), (CFG, format!("{tag};{ip};{url}"))],
        )
        .expect("spawn a host process")
    };
    let mut first = spawn(0, "serve");
    let url = first.expect("etcd ", T).expect("etcd started on host 0");
    let mut hosts = vec![first];
    hosts.extend((1..HOSTS).map(|h| spawn(h, &url)));
    for h in hosts.iter_mut() {
        h.expect("published ", PHASE).expect("agents published");
    }
    let published = started.elapsed();
    let t = Instant::now();
    let loaded = all(&mut hosts, "load", "loaded ");
    let load_time = t.elapsed();
    for l in &loaded {
        let n: usize = l
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert_eq!(
            n,
            PER_HOST * (AGENTS - 1),
            "every agent loaded every other: {l}"
        );
    }
    let mems = all(&mut hosts, "mem", "mem ").join(",");
    all(
        &mut hosts,
        &format!("addrs {mems}"),
        &format!("addrs {AGENTS}"),
    );
    let t = Instant::now();
    all(&mut hosts, "write", "written ");
    let write_time = t.elapsed();
    let t = Instant::now();
    all(&mut hosts, "check", "verified ");
    let check_time = t.elapsed();
    let t = Instant::now();
    for h in hosts.iter_mut() {
        h.send("exit").expect("exit");
        assert!(h.wait(T).expect("exits").success());
    }
    let teardown = t.elapsed();
    let writes = AGENTS * (AGENTS - 1);
    println!(
        "SCALE | {HOSTS} hosts x {PER_HOST} agents | start + publish {:.2} s | metadata load (etcd, all peers) {:.2} s | {writes} writes of {} KiB with notifications {:.2} s | notifications + verification {:.2} s | teardown {:.2} s | total {:.2} s |",
        published.as_secs_f64(),
        load_time.as_secs_f64(),
        BLOCK >> 10,
        write_time.as_secs_f64(),
        check_time.as_secs_f64(),
        teardown.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
