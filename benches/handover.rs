//! The handover benchmark (issue 37): how long decode takes from learning of a request to
//! having its KV cache usable, as a disaggregated serving engine moves it.
//!
//! Shapes are vLLM's with its NIXL connector: every layer's K and V caches are regions of
//! `pool` blocks of 16 tokens (`block_bytes = 16 x kv_heads / tp x head_dim x 2` in bf16),
//! descriptors are (region, block) in region order, and both sides prepare every block once
//! (`prep_xfer_dlist`). A request of `T` tokens is `T / 16` blocks: decode picks its own free
//! blocks and learns prefill's, makes one READ from the prepared lists by index
//! (`make_prepped_xfer`, 2 x layers x blocks descriptors, a notification for prefill), posts
//! it and waits until every byte landed.
//!
//! - **first contact**: decode has never met this prefill agent. Prefill starts a fresh
//!   agent (untimed: an engine starting); decode's clock starts when it learns of the request
//!   (the agent's name, side-channel address and KV base addresses, as vLLM's handshake gives
//!   them) and stops when the READ is done: fetch metadata, load it (and connect), prepare
//!   the remote list, make, post, done. Each round a new prefill agent.
//! - **steady state**: the same pair, the request alone: make + post + done (release after,
//!   timed apart).
//!
//! Two processes (this program starts prefill as `--role prefill`), host memory over UCX or,
//! with `--device cuda`, GPU memory over CUDA_IPC (`--gpus P,D`). Prefill's blocks hold a
//! pattern of (region, block); decode checks every destination byte (and that every other
//! byte of its pool stayed untouched) on the first and last request of each size (and, in
//! host memory, on every first-contact request), and the first word of every destination
//! block on the others in host memory.
//!
//!     cargo run --release -p nixl-bench --bin handover -- [--model llama3-8b|llama3-70b]
//!         [--tp N] [--tokens 1024,4096,16384] [--contacts 5] [--requests 50] [--json]
//!
//! NIXL's side of the same handover: `benches/reference/nixl_handover.py`;
//! `benches/reference/compare_handover.py` runs both interleaved and prints the table.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::mem::{CudaIpcParams, DeviceBuffer};
use nixl::ucx::UcxParams;
use nixl::{
    Agent, AgentConfig, Desc, HostBuffer, MemKind, PreparedList, Registration, StridedDesc,
    StridedDescList, XferDescList, XferOp, XferOptions, XferTarget,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(60);

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "handover", args_override_self = true)]
struct Cli {
    /// `decode` (measures; starts prefill) or `prefill`.
    #[arg(long, default_value = "decode")]
    role: String,
    /// `llama3-8b` (32 layers) or `llama3-70b` (80 layers); 8 KV heads of 128, bf16.
    #[arg(long, default_value = "llama3-8b")]
    model: String,
    /// Layers instead of the model's (a smaller request of the same blocks).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    layers: Option<usize>,
    /// Tensor-parallel size: each rank holds `8 / tp` KV heads.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Tokens per request, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    tokens: Vec<usize>,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    block_tokens: usize,
    /// First-contact rounds per size (a fresh prefill agent each).
    #[arg(long, default_value_t = 5)]
    contacts: usize,
    /// Steady-state requests per size.
    #[arg(long, default_value_t = 50)]
    requests: usize,
    /// `cpu` (host memory, UCX) or `cuda` (GPU memory, CUDA_IPC).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// GPUs of prefill and decode (`--device cuda`).
    #[arg(long, default_value = "0,0")]
    gpus: String,
    /// UCX transports (`UCX_TLS`; host memory).
    #[arg(long)]
    tls: Option<String>,
    /// `UcxParams::progress_spin` in microseconds (host memory): how long UCX's progress
    /// threads poll after an event before they sleep (default: the backend's).
    #[arg(long)]
    ucx_spin_us: Option<u64>,
    /// `UcxParams::warm_up` (host memory): each UCX worker connects with a temporary one at
    /// the agent's start, so UCX's lane and protocol selection is not paid by first contact.
    #[arg(long)]
    ucx_warm_up: bool,
    /// One JSON object per (size, phase) instead of the table.
    #[arg(long)]
    json: bool,
    /// How both sides prepare their pools: `flat` (one descriptor per block, vLLM's lists)
    /// or `strided` (one per region: `prep_strided_dlist`, NIXL 1.5's Nx5 lists); requests
    /// take the same flat indices either way.
    #[arg(long, default_value = "flat", value_parser = ["flat", "strided"])]
    lists: String,
    /// Pool blocks per region (default: the largest request's, plus a quarter).
    #[arg(long)]
    pool: Option<usize>,
    /// Given by `cargo bench`: ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

impl Cli {
    fn layers(&self) -> Res<usize> {
        if let Some(n) = self.layers {
            return Ok(n);
        }
        match self.model.as_str() {
            "llama3-8b" => Ok(32),
            "llama3-70b" => Ok(80),
            m => Err(format!("unknown model {m} (llama3-8b or llama3-70b)").into()),
        }
    }

    fn regions(&self) -> Res<usize> {
        Ok(2 * self.layers()?)
    }

    fn block_bytes(&self) -> Res<usize> {
        if self.tp == 0 || 8 % self.tp != 0 {
            return Err("--tp must divide the 8 KV heads".into());
        }
        Ok(self.block_tokens * (8 / self.tp) * 128 * 2)
    }

    fn blocks_of(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_tokens)
    }

    fn pool(&self) -> usize {
        self.pool.unwrap_or_else(|| {
            let most = self.tokens.iter().map(|&t| self.blocks_of(t)).max();
            let most = most.unwrap_or(1);
            most + most / 4
        })
    }

    fn cuda(&self) -> bool {
        self.device == "cuda"
    }

    fn gpu(&self, prefill: bool) -> Res<usize> {
        let (p, d) = self.gpus.split_once(',').ok_or("--gpus P,D")?;
        Ok(if prefill { p } else { d }.trim().parse()?)
    }
}

/// The word every 8 bytes of prefill's block `block` of region `region` hold.
fn word(region: usize, block: usize) -> u64 {
    let mut x = ((region as u64) << 32 | block as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) | 1
}

/// One KV region (a layer's K or V cache) in host or GPU memory.
enum Region {
    Host(Arc<HostBuffer>),
    Cuda(Arc<DeviceBuffer>),
}

impl Region {
    fn new(cli: &Cli, prefill: bool, len: usize) -> Res<Region> {
        Ok(if cli.cuda() {
            Region::Cuda(Arc::new(DeviceBuffer::new(cli.gpu(prefill)?, len)?))
        } else {
            Region::Host(Arc::new(HostBuffer::new(len).ok_or("allocating a region")?))
        })
    }

    fn addr(&self) -> u64 {
        match self {
            Region::Host(b) => b.addr(),
            Region::Cuda(b) => b.addr(),
        }
    }

    fn write(&self, offset: usize, src: &[u8]) -> Res<()> {
        match self {
            Region::Host(b) if b.write_at(offset, src) => Ok(()),
            Region::Host(_) => Err("write past a region".into()),
            Region::Cuda(b) => Ok(b.copy_from_host(offset, src)?),
        }
    }

    fn read_all(&self, out: &mut [u8]) -> Res<()> {
        match self {
            Region::Host(b) if b.read_at(0, out) => Ok(()),
            Region::Host(_) => Err("read past a region".into()),
            Region::Cuda(b) => Ok(b.copy_to_host(0, out)?),
        }
    }

    fn register(regions: &[Region], agent: &Agent) -> Res<Registration> {
        let bufs: Vec<Arc<dyn nixl::MemoryRegion>> = regions
            .iter()
            .map(|r| match r {
                Region::Host(b) => b.clone() as Arc<dyn nixl::MemoryRegion>,
                Region::Cuda(b) => b.clone(),
            })
            .collect();
        Ok(agent.register_mem(bufs, &[])?)
    }
}

fn agent(cli: &Cli, name: &str) -> Res<Agent> {
    let a = Agent::new(name, AgentConfig::default().listen(true))?;
    if cli.cuda() {
        a.create_backend(CudaIpcParams::default())?;
    } else {
        a.create_backend(
            UcxParams::default()
                .transports(cli.tls.clone())
                .progress_spin(
                    cli.ucx_spin_us
                        .map_or(nixl::ucx::DEFAULT_PROGRESS_SPIN, Duration::from_micros),
                )
                .warm_up(cli.ucx_warm_up),
        )?;
    }
    Ok(a)
}

/// Every block of every region, region by region (vLLM's order), prepared for `target`:
/// one descriptor per block, or one strided descriptor per region (`--lists strided`).
fn prep(
    cli: &Cli,
    a: &Agent,
    target: XferTarget<'_>,
    bases: &[u64],
    gpu: usize,
) -> Res<PreparedList> {
    let (pool, bb) = (cli.pool() as u64, cli.block_bytes()? as u64);
    let kind = if cli.cuda() {
        MemKind::Vram
    } else {
        MemKind::Dram
    };
    let dev = if cli.cuda() { gpu as u64 } else { 0 };
    if cli.lists == "strided" {
        let table = StridedDescList::from_descs(
            kind,
            bases
                .iter()
                .map(|&b| StridedDesc::on_device(b, bb, bb, pool, dev)),
        );
        return Ok(a.prep_strided_dlist(target, &table, &[])?);
    }
    let list = XferDescList::from_descs(
        kind,
        bases
            .iter()
            .flat_map(|&b| (0..pool).map(move |i| Desc::on_device(b + i * bb, bb, dev))),
    );
    Ok(a.prep_xfer_dlist(target, &list, &[])?)
}

/// Prefill: one pool, filled once; a fresh agent on each `agent` line from decode, which is
/// answered with `ready NAME ADDR BASE...`; notifications drained on every line.
fn prefill(cli: &Cli) -> Res<()> {
    let (pool, bb) = (cli.pool(), cli.block_bytes()?);
    let regions: Vec<Region> = (0..cli.regions()?)
        .map(|_| Region::new(cli, true, pool * bb))
        .collect::<Res<_>>()?;
    let mut bytes = vec![0u8; pool * bb];
    for (r, region) in regions.iter().enumerate() {
        for (b, block) in bytes.chunks_mut(bb).enumerate() {
            let w = word(r, b).to_le_bytes();
            block.chunks_mut(8).for_each(|c| c.copy_from_slice(&w));
        }
        region.write(0, &bytes)?;
    }
    let bases: Vec<String> = regions.iter().map(|r| r.addr().to_string()).collect();
    let mut current: Option<(Registration, Agent)> = None;
    let mut out = std::io::stdout().lock();
    writeln!(out, "pool")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if let Some((_, a)) = &current {
            a.get_notifs()?;
        }
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["agent", gen] => {
                // The last agent goes first: decode has invalidated it.
                drop(current.take());
                let name = format!("handover-prefill-{}-{gen}", std::process::id());
                let t = Instant::now();
                let a = agent(cli, &name)?;
                let agent_us = t.elapsed().as_secs_f64() * 1e6;
                let t = Instant::now();
                let reg = Region::register(&regions, &a)?;
                let reg_us = t.elapsed().as_secs_f64() * 1e6;
                let addr = a.listen_addr().ok_or("no side channel")?;
                writeln!(
                    out,
                    "ready {name} {addr} {agent_us:.1} {reg_us:.1} {}",
                    bases.join(" ")
                )?;
                current = Some((reg, a));
            }
            ["quit"] => break,
            other => return Err(format!("prefill: unknown command {other:?}").into()),
        }
        out.flush()?;
    }
    Ok(())
}

struct Prefill {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Prefill {
    fn start() -> Res<Prefill> {
        let exe = std::env::current_exe()?;
        let mut args: Vec<String> = std::env::args().skip(1).collect();
        args.extend(["--role".into(), "prefill".into()]);
        let mut child = Command::new(exe)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("prefill's stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("prefill's stdout")?);
        let mut p = Prefill {
            child,
            stdin,
            stdout,
        };
        if p.line()? != "pool" {
            return Err("prefill did not start".into());
        }
        Ok(p)
    }

    fn line(&mut self) -> Res<String> {
        let mut s = String::new();
        if self.stdout.read_line(&mut s)? == 0 {
            return Err("prefill exited".into());
        }
        Ok(s.trim_end().to_owned())
    }

    /// A fresh prefill agent: its name, side-channel address, region bases, and how long
    /// its agent with backend and its registration took (us).
    fn new_agent(&mut self, gen: usize) -> Res<(String, SocketAddr, Vec<u64>, [f64; 2])> {
        writeln!(self.stdin, "agent {gen}")?;
        self.stdin.flush()?;
        let line = self.line()?;
        let mut it = line.split_whitespace();
        if it.next() != Some("ready") {
            return Err(format!("prefill answered {line:?}").into());
        }
        let name = it.next().ok_or("no name")?.to_owned();
        let addr = it.next().ok_or("no address")?.parse()?;
        let agent_us = it.next().ok_or("no start-up time")?.parse()?;
        let reg_us = it.next().ok_or("no registration time")?.parse()?;
        let bases = it.map(str::parse).collect::<Result<Vec<u64>, _>>()?;
        Ok((name, addr, bases, [agent_us, reg_us]))
    }
}

impl Drop for Prefill {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

/// A small deterministic generator (xorshift) for block choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` distinct blocks of `0..pool`, in random order.
    fn blocks(&mut self, n: usize, pool: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..pool).collect();
        for i in 0..n.min(pool) {
            let j = i + (self.next() % (pool - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(n);
        all
    }
}

/// Decode's side: its pool, its agent and its prepared local list.
struct Decode {
    cli: Cli,
    regions: Vec<Region>,
    agent: Agent,
    _reg: Registration,
    local: PreparedList,
}

/// One request's times (us) and what it moved.
#[derive(Default, Clone, Copy)]
struct Times {
    /// Prefill's agent with its backend, and its registration (first contact; untimed there).
    agent: f64,
    register: f64,
    fetch: f64,
    prep: f64,
    make: f64,
    post: f64,
    done: f64,
    release: f64,
}

impl Decode {
    fn new(cli: &Cli) -> Res<Decode> {
        let (pool, bb) = (cli.pool(), cli.block_bytes()?);
        let regions: Vec<Region> = (0..cli.regions()?)
            .map(|_| Region::new(cli, false, pool * bb))
            .collect::<Res<_>>()?;
        let agent = agent(cli, &format!("handover-decode-{}", std::process::id()))?;
        let reg = Region::register(&regions, &agent)?;
        let bases: Vec<u64> = regions.iter().map(Region::addr).collect();
        let local = prep(cli, &agent, XferTarget::Initiator, &bases, cli.gpu(false)?)?;
        Ok(Decode {
            cli: cli.clone(),
            regions,
            agent,
            _reg: reg,
            local,
        })
    }

    fn indices(&self, blocks: &[usize]) -> Vec<usize> {
        let pool = self.cli.pool();
        (0..self.regions.len())
            .flat_map(|r| blocks.iter().map(move |&b| r * pool + b))
            .collect()
    }

    /// Every byte of the pool set to zero (before a fully checked request).
    fn clear(&self) -> Res<()> {
        let zero = vec![0u8; self.cli.pool() * self.cli.block_bytes()?];
        self.regions.iter().try_for_each(|r| match r {
            Region::Cuda(b) => Ok(b.fill(0)?),
            Region::Host(_) => r.write(0, &zero),
        })
    }

    /// The first word of every destination block set to zero (before a sampled request;
    /// host memory).
    fn clear_words(&self, dst: &[usize]) -> Res<()> {
        let bb = self.cli.block_bytes()?;
        for r in self.regions.iter().filter(|r| matches!(r, Region::Host(_))) {
            for &b in dst {
                r.write(b * bb, &[0; 8])?;
            }
        }
        Ok(())
    }

    /// Every destination byte holds its source block's pattern and every other byte of the
    /// pool is still zero (`full`), or the first word of each destination block is right.
    fn check(&self, src: &[usize], dst: &[usize], full: bool) -> Res<()> {
        let (pool, bb) = (self.cli.pool(), self.cli.block_bytes()?);
        let mut want_of = vec![None; pool];
        for (&s, &d) in src.iter().zip(dst) {
            want_of[d] = Some(s);
        }
        let mut buf = vec![0u8; if full { pool * bb } else { 8 }];
        for (r, region) in self.regions.iter().enumerate() {
            if !full {
                let Region::Host(h) = region else {
                    return Ok(());
                };
                for (&s, &d) in src.iter().zip(dst) {
                    if !h.read_at(d * bb, &mut buf)
                        || u64::from_le_bytes(buf[..8].try_into()?) != word(r, s)
                    {
                        return Err(format!("region {r} block {d}: not prefill's block {s}").into());
                    }
                }
                continue;
            }
            region.read_all(&mut buf)?;
            for (b, blk) in buf.chunks(bb).enumerate() {
                let want = want_of[b].map_or(0, |s| word(r, s));
                if let Some(at) = blk
                    .chunks(8)
                    .position(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()) != want)
                {
                    return Err(format!(
                        "region {r} block {b}: word {at} is not {} (prefill's block {:?})",
                        if want == 0 {
                            "untouched"
                        } else {
                            "the source's"
                        },
                        want_of[b]
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// make + post + done of one READ from `remote`, then its release; times in us.
    fn request(
        &self,
        remote: &PreparedList,
        (src, dst): (&[usize], &[usize]),
        tag: usize,
        t: &mut Times,
    ) -> Res<()> {
        let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
        let (li, ri) = (self.indices(dst), self.indices(src));
        let t0 = Instant::now();
        let x = self.agent.make_prepped_xfer(
            XferOp::Read,
            &self.local,
            &li,
            remote,
            &ri,
            XferOptions::with_notif(format!("req-{tag}").into_bytes()),
        )?;
        let t1 = Instant::now();
        self.agent.post_xfer_req(&x)?;
        let t2 = Instant::now();
        x.wait(WAIT)?;
        let t3 = Instant::now();
        drop(x);
        let t4 = Instant::now();
        (t.make, t.post, t.done, t.release) = (us(t0, t1), us(t1, t2), us(t2, t3), us(t3, t4));
        Ok(())
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n => v[((n as f64 * p) as usize).min(n - 1)],
    }
}

fn report(cli: &Cli, tokens: usize, phase: &str, times: &[Times], bytes: usize) {
    let col = |f: fn(&Times) -> f64| times.iter().map(f).collect::<Vec<f64>>();
    let mut whole = col(|t| t.fetch + t.prep + t.make + t.post + t.done);
    let (p50, p99) = (pct(&mut whole, 0.5), pct(&mut whole, 0.99));
    let med = |f: fn(&Times) -> f64| pct(&mut col(f), 0.5);
    let n = times.len();
    if cli.json {
        println!(
            "{{\"impl\":\"nixl-rs\",\"model\":\"{}\",\"tp\":{},\"device\":\"{}\",\"lists\":\"{}\",\"tokens\":{tokens},\"phase\":\"{phase}\",\"n\":{n},\"bytes\":{bytes},\"p50_us\":{p50:.1},\"p99_us\":{p99:.1},\"fetch_us\":{:.1},\"prep_us\":{:.1},\"make_us\":{:.1},\"post_us\":{:.1},\"done_us\":{:.1},\"release_us\":{:.1},\"agent_us\":{:.1},\"register_us\":{:.1}}}",
            cli.model, cli.tp, cli.device, cli.lists, med(|t| t.fetch), med(|t| t.prep), med(|t| t.make), med(|t| t.post), med(|t| t.done), med(|t| t.release), med(|t| t.agent), med(|t| t.register)
        );
    } else {
        println!(
            "| {tokens} | {phase} | {n} | {:.1} | {p50:.1} | {p99:.1} | {:.1} / {:.1} / {:.1} / {:.1} / {:.1} | {:.1} | {:.2} |",
            bytes as f64 / (1 << 20) as f64,
            med(|t| t.fetch),
            med(|t| t.prep),
            med(|t| t.make),
            med(|t| t.post),
            med(|t| t.done),
            med(|t| t.release),
            bytes as f64 / p50 / 1e3,
        );
    }
}

fn decode(cli: &Cli) -> Res<()> {
    let pool = cli.pool();
    if let Some(&t) = cli
        .tokens
        .iter()
        .find(|&&t| cli.blocks_of(t) > pool || t == 0)
    {
        return Err(format!("{t} tokens do not fit a pool of {pool} blocks").into());
    }
    let d = Decode::new(cli)?;
    let mut p = Prefill::start()?;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (bb, regions) = (cli.block_bytes()?, cli.regions()?);
    if !cli.json {
        println!(
            "Handover, {} TP {} ({} regions of {pool} blocks of {} KiB, {}, {} lists), decode READs; times in us",
            cli.model,
            cli.tp,
            regions,
            bb >> 10,
            if cli.cuda() { "GPU memory, CUDA_IPC" } else { "host memory, UCX" },
            cli.lists
        );
        println!("| tokens | phase | n | MiB | p50 | p99 | median fetch / prep / make / post / done | release | GB/s at p50 |");
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    let mut gen = 0;
    for &tokens in &cli.tokens {
        let nb = cli.blocks_of(tokens);
        let bytes = nb * regions * bb;
        let mut first = Vec::new();
        let mut remote = None;
        let mut name = String::new();
        for round in 0..cli.contacts.max(1) {
            // GPU pools are read back whole for the full check: the first round's only.
            let full = round == 0 || !cli.cuda();
            if !name.is_empty() {
                d.agent.invalidate_remote_metadata(&name)?;
            }
            gen += 1;
            let (n, addr, bases, [agent_us, reg_us]) = p.new_agent(gen)?;
            name = n;
            let (src, dst) = (rng.blocks(nb, pool), rng.blocks(nb, pool));
            if full {
                d.clear()?;
            } else {
                d.clear_words(&dst)?;
            }
            let mut t = Times::default();
            let t0 = Instant::now();
            d.agent.fetch_remote_metadata_blocking(&name, addr, WAIT)?;
            let t1 = Instant::now();
            let r = prep(
                cli,
                &d.agent,
                XferTarget::Agent(&name),
                &bases,
                cli.gpu(true)?,
            )?;
            let t2 = Instant::now();
            d.request(&r, (&src, &dst), gen, &mut t)?;
            (t.agent, t.register) = (agent_us, reg_us);
            (t.fetch, t.prep) = ((t1 - t0).as_secs_f64() * 1e6, (t2 - t1).as_secs_f64() * 1e6);
            d.check(&src, &dst, full)?;
            first.push(t);
            remote = Some(r);
        }
        report(cli, tokens, "first contact", &first, bytes);
        let remote = remote.ok_or("no first contact")?;
        let mut steady = Vec::new();
        for i in 0..cli.requests.max(1) {
            let (src, dst) = (rng.blocks(nb, pool), rng.blocks(nb, pool));
            let last = i + 1 == cli.requests.max(1);
            if last {
                d.clear()?;
            } else {
                d.clear_words(&dst)?;
            }
            let mut t = Times::default();
            d.request(&remote, (&src, &dst), i, &mut t)?;
            d.check(&src, &dst, last)?;
            steady.push(t);
        }
        report(cli, tokens, "steady", &steady, bytes);
    }
    if !cli.json {
        println!(
            "verified: every byte of {} and of each size's last request (and nothing else written){}",
            if cli.cuda() { "each size's first request" } else { "every first-contact request" },
            if cli.cuda() { "" } else { "; the first word of every block of the others" }
        );
    }
    Ok(())
}

fn main() -> Res<()> {
    use clap::Parser;
    let cli = Cli::parse();
    match cli.role.as_str() {
        "prefill" => prefill(&cli),
        "decode" => decode(&cli),
        r => Err(format!("unknown role {r}").into()),
    }
}
