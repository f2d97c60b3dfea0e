//! Metadata at cluster scale: N agents (threads of one process, INPROC backend) where every
//! agent loads every other agent's metadata and writes one 4 KiB block into each peer,
//! verified; through etcd (one fetch per peer, then one `fetch_all` range read per agent)
//! and through the side channel, timed phase by phase.
//!
//! ```text
//! cargo run --release -p nixl-bench --bin etcd_scale -- [AGENTS] [ROUNDS]
//! ```
//! Starts its own etcd on 127.0.0.1 unless `NIXL_ETCD_ENDPOINTS` names one.

#[cfg(not(feature = "etcd"))]
fn main() {
    eprintln!("etcd_scale needs the etcd feature: cargo run --release -p nixl-bench --features etcd --bin etcd_scale");
}

#[cfg(feature = "etcd")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    scale::main()
}

#[cfg(feature = "etcd")]
mod scale {
    use std::net::SocketAddr;
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use nixl_core::etcd::{EtcdConfig, EtcdExchange, LocalEtcd, DEFAULT_LABEL};
    use nixl_core::{
        Agent, AgentConfig, HostBuffer, InprocParams, MemKind, Registration, XferDescList, XferOp,
        XferOptions,
    };

    const BLOCK: u64 = 4096;
    const WAIT: Duration = Duration::from_secs(60);

    type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

    struct Node {
        agent: Agent,
        buf: Arc<HostBuffer>,
        _reg: Registration,
    }

    fn pattern(i: usize) -> u8 {
        (i as u8).wrapping_mul(37).wrapping_add(1)
    }

    /// N agents, each with N blocks: block `i` of every agent receives agent `i`'s write, and
    /// an agent's own block is its source.
    fn nodes(n: usize, tag: &str, listen: bool) -> Res<Vec<Node>> {
        (0..n)
            .map(|i| {
                let agent =
                    Agent::new(&format!("{tag}-{i}"), AgentConfig::default().listen(listen))?;
                agent.create_backend(InprocParams::default())?;
                let buf = Arc::new(HostBuffer::new(BLOCK as usize * n).ok_or("allocation failed")?);
                buf.write_at(i * BLOCK as usize, &vec![pattern(i); BLOCK as usize]);
                let reg = agent.register_mem(vec![buf.clone()], &[])?;
                Ok(Node {
                    agent,
                    buf,
                    _reg: reg,
                })
            })
            .collect()
    }

    fn write_to_all(nodes: &[Node], me: usize) -> Res<()> {
        let src = XferDescList::blocks(
            MemKind::Dram,
            nodes[me].buf.addr() + me as u64 * BLOCK,
            BLOCK,
            1,
        );
        for (j, peer) in nodes.iter().enumerate().filter(|(j, _)| *j != me) {
            let dst =
                XferDescList::blocks(MemKind::Dram, peer.buf.addr() + me as u64 * BLOCK, BLOCK, 1);
            let req = nodes[me].agent.create_xfer_req(
                XferOp::Write,
                &src,
                &dst,
                peer.agent.name(),
                XferOptions::default(),
            )?;
            nodes[me].agent.post_xfer_req(&req)?;
            req.wait(WAIT)
                .map_err(|e| format!("write {me} -> {j}: {e}"))?;
        }
        Ok(())
    }

    fn verify(nodes: &[Node]) -> Res<()> {
        for (j, node) in nodes.iter().enumerate() {
            let data = node.buf.to_vec();
            for (i, block) in data.chunks(BLOCK as usize).enumerate() {
                if block.iter().any(|&b| b != pattern(i)) {
                    return Err(
                        format!("agent {j}: block {i} does not hold agent {i}'s data").into(),
                    );
                }
            }
        }
        Ok(())
    }

    /// Phase end times (seconds since the start) measured by the coordinating thread.
    struct Timing {
        phases: Vec<(&'static str, f64)>,
    }

    /// Counts the barrier waits of one thread so it can always complete the same number.
    struct Gate<'a> {
        barrier: &'a Barrier,
        used: usize,
    }

    const GATES: usize = 8;

    impl Gate<'_> {
        fn wait(&mut self) {
            self.used += 1;
            self.barrier.wait();
        }

        fn finish(&mut self) {
            while self.used < GATES {
                self.wait();
            }
        }
    }

    /// Runs `per_agent(i, gate)` on one thread per agent; the closure waits on the gate before
    /// it starts and after each phase, and the main thread timestamps every phase's end.
    fn run_threads<F>(n: usize, names: &[&'static str], per_agent: F) -> Res<Timing>
    where
        F: Fn(usize, &mut Gate<'_>) -> Res<()> + Send + Sync + 'static,
    {
        let barrier = Arc::new(Barrier::new(n + 1));
        let f = Arc::new(per_agent);
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (b, f) = (barrier.clone(), f.clone());
                std::thread::spawn(move || {
                    let mut gate = Gate {
                        barrier: &b,
                        used: 0,
                    };
                    let r = f(i, &mut gate);
                    // Also after an error, so the others never wait for this thread forever.
                    gate.finish();
                    r
                })
            })
            .collect();
        let mut gate = Gate {
            barrier: &barrier,
            used: 0,
        };
        gate.wait(); // everyone is ready
        let start = Instant::now();
        let mut phases = Vec::new();
        for name in names {
            gate.wait();
            phases.push((*name, start.elapsed().as_secs_f64()));
        }
        gate.finish();
        for h in handles {
            h.join().map_err(|_| "an agent thread panicked")??;
        }
        Ok(Timing { phases })
    }

    /// Through etcd: each agent fetches each peer by name (`bulk`: one `fetch_all` range
    /// read instead).
    fn over_etcd(n: usize, endpoints: Vec<String>, bulk: bool) -> Res<Timing> {
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nodes = Arc::new(nodes(n, "etcd", false)?);
        let cfg = EtcdConfig::default()
            .endpoints(endpoints)
            .namespace(format!("/nixl-scale/{}/{run}", std::process::id()));
        let all = nodes.clone();
        let t = run_threads(
            n,
            &["connect+publish", "fetch all", "transfers"],
            move |i, b| {
                b.wait();
                let x = EtcdExchange::new(&all[i].agent, &cfg)?;
                x.publish()?;
                b.wait();
                if bulk {
                    let loaded = x.fetch_all(DEFAULT_LABEL)?;
                    for (name, r) in &loaded {
                        r.as_ref().map_err(|e| format!("{i} loading {name}: {e}"))?;
                    }
                    if loaded.len() != n - 1 {
                        return Err(
                            format!("{i} found {} peers, not {}", loaded.len(), n - 1).into()
                        );
                    }
                } else {
                    for (j, peer) in all.iter().enumerate().filter(|(j, _)| *j != i) {
                        x.fetch(peer.agent.name(), WAIT)
                            .map_err(|e| format!("{i} fetching {j}: {e}"))?;
                    }
                }
                b.wait();
                write_to_all(&all, i)?;
                b.wait();
                drop(x);
                Ok(())
            },
        )?;
        verify(&nodes)?;
        Ok(t)
    }

    fn over_side_channel(n: usize) -> Res<Timing> {
        let nodes = Arc::new(nodes(n, "side", true)?);
        let addrs: Vec<SocketAddr> = nodes
            .iter()
            .map(|x| x.agent.listen_addr().ok_or("no listen address"))
            .collect::<Result<_, _>>()?;
        let all = nodes.clone();
        let t = run_threads(n, &["fetch all", "transfers"], move |i, b| {
            b.wait();
            for (j, peer) in all.iter().enumerate().filter(|(j, _)| *j != i) {
                all[i]
                    .agent
                    .fetch_remote_metadata_blocking(peer.agent.name(), addrs[j], WAIT)
                    .map_err(|e| format!("{i} fetching {j}: {e}"))?;
            }
            b.wait();
            write_to_all(&all, i)?;
            b.wait();
            Ok(())
        })?;
        verify(&nodes)?;
        Ok(t)
    }

    fn report(what: &str, n: usize, t: &Timing) {
        let mut prev = 0.0;
        let parts: Vec<String> = t
            .phases
            .iter()
            .map(|(name, end)| {
                let s = format!("{name} {:.1} ms", (end - prev) * 1e3);
                prev = *end;
                s
            })
            .collect();
        println!(
            "{what:<13} {n} agents, {} loads, {} writes: total {:.1} ms ({})",
            n * (n - 1),
            n * (n - 1),
            prev * 1e3,
            parts.join(", ")
        );
    }

    /// Metadata at cluster scale through etcd and the side channel.
    #[derive(clap::Parser, Debug)]
    struct Cli {
        /// Agents (threads of this process).
        #[arg(default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
        n: usize,
        /// Rounds of the three runs.
        #[arg(default_value_t = 3)]
        rounds: usize,
    }

    pub(crate) fn main() -> Result<(), Box<dyn std::error::Error>> {
        let Cli { n, rounds } = <Cli as clap::Parser>::parse();
        let env = std::env::var(nixl_core::etcd::ENV_ENDPOINTS)
            .ok()
            .filter(|s| !s.is_empty());
        let _local;
        let endpoints = match env {
            Some(e) => e.split(',').map(str::to_owned).collect(),
            None => {
                let l = LocalEtcd::start()?;
                let e = vec![l.endpoint()];
                _local = l;
                e
            }
        };
        for round in 1..=rounds {
            println!("round {round}/{rounds}");
            let t = over_etcd(n, endpoints.clone(), false).map_err(|e| e.to_string())?;
            report("etcd", n, &t);
            let t = over_etcd(n, endpoints.clone(), true).map_err(|e| e.to_string())?;
            report("etcd bulk", n, &t);
            let t = over_side_channel(n).map_err(|e| e.to_string())?;
            report("side channel", n, &t);
        }
        println!("verified: every agent holds every other agent's block, both runs, every round");
        Ok(())
    }
}
