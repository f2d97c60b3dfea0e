//! KV layouts between two GPUs (issue 26's benchmark): a heterogeneous-TP request landed in
//! the destination's layout in one pass vs the same bytes moved in the source layout and then
//! permuted by a separate kernel.
//!
//! Prefill: TP `--tp` ranks, each its own process (this program with `--prefill-rank`), pools
//! on GPU 0 in HND order. Decode: one rank (TP 1) on GPU 1 in NHD order, over `CUDA_IPC`.
//! - one pass: `KvLayout::plan` (tiles: HND -> NHD) and `Agent::make_kv_xfers` -> one tile
//!   request per prefill rank (the tile kernel gathers each rank's heads into NHD blocks while
//!   it reads them over NVLink);
//! - move, then permute: the same planner into a staging pool in the prefill order (HND, all
//!   heads: contiguous pieces over NVLink), then the staging pool permuted into the NHD cache
//!   by the tile kernel on GPU 1 (a second kernel, local memory; tiles from this agent's own
//!   staging table);
//! - the link: each prefill rank's whole pool read as one descriptor (the same bytes, no
//!   rearrangement): the best plain copy CUDA_IPC makes over this link.
//!
//! Every element of both results is checked against its value (a function of layer, K/V,
//! token, head and dim, bf16-sized), and the two results must be byte-identical.
//!
//! `cargo run --release -p nixl-bench --bin kv_bench -- --model 8b --blocks 2048`

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nixl_core::kv::{KvLayout, KvOrder, KvPeer, KvTensor};
use nixl_core::{
    Agent, AgentConfig, Desc, MemKind, Registration, XferDescList, XferOp, XferOptions, XferReq,
};
use nixl_mem::{CudaIpcParams, DeviceBuffer};

const WAIT: Duration = Duration::from_secs(120);
const TOKENS_PER_BLOCK: u32 = 16;
const ELEM: u64 = 2;

#[derive(Parser, Debug)]
#[command(about = "KV permute between two GPUs: one pass vs move then permute")]
struct Args {
    /// Model shape: 8b (Llama-3-8B: 32 layers) or 70b (Llama-3-70B: 80 layers); 8 KV heads of
    /// 128, bf16, 16 tokens per block.
    #[arg(long, default_value = "8b")]
    model: String,
    /// Blocks in the request (and in each pool).
    #[arg(long, default_value_t = 2048)]
    blocks: u64,
    /// Prefill TP size (decode is TP 1).
    #[arg(long, default_value_t = 2)]
    tp: u32,
    /// Timed posts of each method (after one warm-up post).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// The decode rank's GPU (prefill's is GPU 0): 1 across NVLink; 0 for a one-GPU machine,
    /// where the same requests cross CUDA IPC between processes on one GPU (a smoke run: the
    /// link figure is then GPU 0's own copy).
    #[arg(long, default_value_t = 1)]
    decode_gpu: u64,
    /// Child mode: serve as this prefill rank.
    #[arg(long, hide = true)]
    prefill_rank: Option<u32>,
    /// Child mode: the agent's name.
    #[arg(long, hide = true, default_value = "")]
    name: String,
}

fn layers(model: &str) -> Result<u32, String> {
    match model {
        "8b" => Ok(32),
        "70b" => Ok(80),
        m => Err(format!("unknown model {m:?} (8b or 70b)")),
    }
}

/// A bf16-sized pool of `blocks` blocks per tensor at `base` on `gpu`, rank `r` of TP `tp`.
fn layout(
    layers: u32,
    tp: u32,
    r: u32,
    order: KvOrder,
    blocks: u64,
    base: u64,
    gpu: u64,
) -> KvLayout {
    let mut l = KvLayout::new("llama-3", layers, TOKENS_PER_BLOCK, 8, 128, ELEM as u32)
        .order(order)
        .tp(r, tp)
        .blocks(blocks)
        .kind(MemKind::Vram)
        .dev_id(gpu);
    let bb = l.block_bytes();
    l.tensors = (0..u64::from(layers) * 2)
        .map(|i| KvTensor {
            base: base + i * blocks * bb,
            block_stride: bb,
        })
        .collect();
    l
}

fn pool_bytes(l: &KvLayout) -> usize {
    (l.tensors.len() as u64 * l.blocks * l.block_bytes()) as usize
}

/// The request's block ids: every block of the pool, scattered (a step of 5 is a permutation
/// of any pool whose size 5 does not divide).
fn ids(blocks: u64, salt: u64) -> Vec<u64> {
    let step = if blocks.is_multiple_of(5) { 1 } else { 5 };
    (0..blocks).map(|i| (i * step + salt) % blocks).collect()
}

/// The bf16-sized value of one element.
fn value(ti: usize, token: u64, head: u32, d: u32) -> u16 {
    nixl_testkit::kv::value(ti as u32 / 2, ti as u32 % 2, token, head, d) as u16
}

/// Byte offset of (tensor, block, slot, local head, dim) in a pool laid out as `l`.
fn offset(l: &KvLayout, ti: usize, block: u64, slot: u64, hl: u64, d: u64) -> usize {
    let (b, h, dim) = (
        u64::from(l.tokens_per_block),
        u64::from(l.kv_heads),
        u64::from(l.head_dim),
    );
    let inner = match l.order {
        KvOrder::Nhd => (slot * h + hl) * dim + d,
        KvOrder::Hnd => (hl * b + slot) * dim + d,
    };
    (l.tensors[ti].base - l.tensors[0].base + block * l.tensors[ti].block_stride + inner * ELEM)
        as usize
}

/// Calls `f(tensor, block, slot, local head)` for every row of the request, tensors spread
/// over the host's cores; `f` gets the tensor's bytes `(start, end)` of `pool` too.
fn rows_par(
    l: &KvLayout,
    ids: &[u64],
    pool: &mut [u8],
    f: impl Fn(&mut [u8], usize, usize, u64, u64) + Sync,
) {
    let per = (l.blocks * l.block_bytes()) as usize;
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let chunks: Vec<(usize, &mut [u8])> = pool.chunks_mut(per).enumerate().collect();
    let per_thread = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per_thread).collect());
    }
    let b = u64::from(l.tokens_per_block);
    std::thread::scope(|s| {
        for g in groups {
            let f = &f;
            s.spawn(move || {
                for (ti, bytes) in g {
                    for (i, &blk) in ids.iter().enumerate() {
                        for slot in 0..b {
                            for hl in 0..u64::from(l.kv_heads) {
                                let at = offset(l, ti, blk, slot, hl, 0) - ti * per;
                                f(bytes, at, ti, i as u64 * b + slot, hl);
                            }
                        }
                    }
                }
            });
        }
    });
}

/// Fills the request's rows of a pool with their values.
fn fill(l: &KvLayout, ids: &[u64]) -> Vec<u8> {
    let mut pool = vec![0xEEu8; pool_bytes(l)];
    let first = l.head_range().0;
    rows_par(l, ids, &mut pool, |bytes, at, ti, token, hl| {
        for d in 0..l.head_dim {
            let v = value(ti, token, first + hl as u32, d);
            let o = at + d as usize * ELEM as usize;
            bytes[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    });
    pool
}

/// The first element of the request whose value is wrong, described.
fn check(l: &KvLayout, ids: &[u64], mut pool: Vec<u8>) -> Result<(), String> {
    let bad = std::sync::OnceLock::<String>::new();
    let first = l.head_range().0;
    rows_par(l, ids, &mut pool, |bytes, at, ti, token, hl| {
        for d in 0..l.head_dim {
            let want = value(ti, token, first + hl as u32, d);
            let o = at + d as usize * ELEM as usize;
            let have = u16::from_le_bytes([bytes[o], bytes[o + 1]]);
            if have != want {
                let _ = bad.set(format!(
                    "tensor {ti} token {token} head {} dim {d}: {have:#x}, expected {want:#x}",
                    first + hl as u32
                ));
                return;
            }
        }
    });
    match bad.into_inner() {
        Some(b) => Err(b),
        None => Ok(()),
    }
}

fn agent(name: &str, device: usize, listen: bool) -> Result<Agent, String> {
    let a = Agent::new(
        name,
        AgentConfig::default().listen(listen).default_timeout(WAIT),
    )
    .map_err(|e| e.to_string())?;
    a.create_backend(CudaIpcParams::default().device(device))
        .map_err(|e| e.to_string())?;
    Ok(a)
}

/// Child mode: a prefill rank on GPU 0 serving its pool until stdin closes.
fn prefill(args: &Args, rank: u32) -> Result<(), String> {
    let layers = layers(&args.model)?;
    let a = agent(&args.name, 0, true)?;
    let probe = layout(layers, args.tp, rank, KvOrder::Hnd, args.blocks, 0, 0);
    let buf = Arc::new(DeviceBuffer::new(0, pool_bytes(&probe)).map_err(|e| e.to_string())?);
    let l = layout(
        layers,
        args.tp,
        rank,
        KvOrder::Hnd,
        args.blocks,
        buf.addr(),
        0,
    );
    buf.copy_from_host(0, &fill(&l, &ids(args.blocks, 3)))
        .map_err(|e| e.to_string())?;
    let _reg = a
        .register_mem(vec![buf.clone()], &[])
        .map_err(|e| e.to_string())?;
    let addr = a.listen_addr().ok_or("no side channel")?;
    let msg = nixl_testkit::kv::ready_message(addr, &l);
    println!("{}", String::from_utf8_lossy(&msg));
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // Serve until the parent closes our stdin.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    Ok(())
}

/// Posts every request, waits for all; the wall time.
fn timed(reqs: &[XferReq], a: &Agent) -> Result<Duration, String> {
    let t = Instant::now();
    for r in reqs {
        a.post_xfer_req(r).map_err(|e| e.to_string())?;
    }
    for r in reqs {
        r.wait(WAIT).map_err(|e| e.to_string())?;
    }
    Ok(t.elapsed())
}

/// Best and median of `n` timed runs of `f`.
fn stats(
    n: usize,
    mut f: impl FnMut() -> Result<Duration, String>,
) -> Result<(Duration, Duration), String> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        v.push(f()?);
    }
    v.sort_unstable();
    Ok((v[0], v[v.len() / 2]))
}

fn gbs(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

struct Decode {
    agent: Agent,
    cache: Arc<DeviceBuffer>,
    layout: KvLayout,
    staging_layout: KvLayout,
    _regs: Vec<Registration>,
}

fn run(args: &Args) -> Result<(), String> {
    let layers = layers(&args.model)?;
    let pid = std::process::id();
    let me = format!("kvb-d-{pid}");
    let g = args.decode_gpu;
    let a = agent(&me, g as usize, false)?;
    let probe = layout(layers, 1, 0, KvOrder::Nhd, args.blocks, 0, g);
    let cache =
        Arc::new(DeviceBuffer::new(g as usize, pool_bytes(&probe)).map_err(|e| e.to_string())?);
    let staging =
        Arc::new(DeviceBuffer::new(g as usize, pool_bytes(&probe)).map_err(|e| e.to_string())?);
    let d = Decode {
        layout: layout(layers, 1, 0, KvOrder::Nhd, args.blocks, cache.addr(), g),
        staging_layout: layout(layers, 1, 0, KvOrder::Hnd, args.blocks, staging.addr(), g),
        _regs: vec![
            a.register_mem(vec![cache.clone()], &[])
                .map_err(|e| e.to_string())?,
            a.register_mem(vec![staging.clone()], &[])
                .map_err(|e| e.to_string())?,
        ],
        agent: a,
        cache,
    };
    // The prefill ranks.
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children: Vec<Child> = Vec::new();
    let mut peers: Vec<(String, KvLayout)> = Vec::new();
    for r in 0..args.tp {
        let name = format!("kvb-p{r}-{pid}");
        let mut c = Command::new(&exe)
            .args(["--model", &args.model, "--blocks", &args.blocks.to_string()])
            .args([
                "--tp",
                &args.tp.to_string(),
                "--prefill-rank",
                &r.to_string(),
            ])
            .args(["--name", &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let out = c.stdout.take().ok_or("no child stdout")?;
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if !line.starts_with("ready ") {
            return Err(format!("prefill rank {r} did not start: {line:?}"));
        }
        let (addr, l) = nixl_testkit::kv::parse_ready(line.trim().as_bytes());
        d.agent
            .fetch_remote_metadata_blocking(&name, addr, WAIT)
            .map_err(|e| e.to_string())?;
        peers.push((name, l));
        children.push(c);
    }
    let result = measure(args, &d, &peers);
    for mut c in children {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    result
}

fn measure(args: &Args, d: &Decode, peers: &[(String, KvLayout)]) -> Result<(), String> {
    let a = &d.agent;
    let side: Vec<(&str, &KvLayout)> = peers.iter().map(|(n, l)| (n.as_str(), l)).collect();
    let (sids, dids) = (ids(args.blocks, 3), ids(args.blocks, 7));
    let tokens = args.blocks * u64::from(TOKENS_PER_BLOCK);
    let e = |e: nixl_core::Error| e.to_string();
    // One pass: tiles from every prefill rank straight into the NHD cache (the one planner
    // picks tiles for HND -> NHD).
    let prefill: Vec<KvPeer<'_>> = side
        .iter()
        .map(|&(name, layout)| KvPeer {
            name,
            layout,
            blocks: &sids,
        })
        .collect();
    let plan = d
        .layout
        .plan(XferOp::Read, &dids, &prefill, tokens)
        .map_err(e)?;
    if !plan.has_tiles() {
        return Err("HND -> NHD planned without tiles".to_owned());
    }
    let one = a.make_kv_xfers(&plan, &XferOptions::default()).map_err(e)?;
    let bytes = plan.bytes();
    d.cache.fill(0xDD).map_err(|e| e.to_string())?;
    let first = timed(&one, a)?;
    let one_pass = d.cache.to_vec().map_err(|e| e.to_string())?;
    check(&d.layout, &dids, one_pass.clone()).map_err(|e| format!("one pass: {e}"))?;
    let (one_best, one_med) = stats(args.iters, || timed(&one, a))?;

    // Move in the source layout (HND staging, all heads), then permute on GPU 1.
    let moves = d
        .staging_layout
        .plan(XferOp::Read, &dids, &prefill, tokens)
        .map_err(e)?;
    if moves.has_tiles() {
        return Err("HND -> HND staging planned with tiles".to_owned());
    }
    let mv = a
        .make_kv_xfers(&moves, &XferOptions::default())
        .map_err(e)?;
    let me = a.name().to_owned();
    let staging = [KvPeer {
        name: me.as_str(),
        layout: &d.staging_layout,
        blocks: &dids,
    }];
    let perm_plan = d
        .layout
        .plan(XferOp::Read, &dids, &staging, tokens)
        .map_err(e)?;
    let perm = a
        .make_kv_xfers(&perm_plan, &XferOptions::default())
        .map_err(e)?;
    d.cache.fill(0xDD).map_err(|e| e.to_string())?;
    timed(&mv, a)?;
    timed(&perm, a)?;
    let two_pass = d.cache.to_vec().map_err(|e| e.to_string())?;
    if two_pass != one_pass {
        return Err("move-then-permute and one pass landed different bytes".to_owned());
    }
    let (mv_best, mv_med) = stats(args.iters, || timed(&mv, a))?;
    let (pm_best, pm_med) = stats(args.iters, || timed(&perm, a))?;
    let (both_best, both_med) = stats(args.iters, || Ok(timed(&mv, a)? + timed(&perm, a)?))?;

    // The link: each prefill rank's pool as one descriptor into the staging pool.
    let mut link = Vec::new();
    let mut off = 0u64;
    for (name, l) in peers {
        let n = l.tensors.len() as u64 * l.blocks * l.block_bytes();
        let local = XferDescList::from_descs(
            MemKind::Vram,
            [Desc::on_device(
                d.staging_layout.tensors[0].base + off,
                n,
                args.decode_gpu,
            )],
        );
        let remote =
            XferDescList::from_descs(MemKind::Vram, [Desc::on_device(l.tensors[0].base, n, 0)]);
        link.push(
            a.create_xfer_req(XferOp::Read, &local, &remote, name, XferOptions::default())
                .map_err(e)?,
        );
        off += n;
    }
    timed(&link, a)?;
    let (link_best, link_med) = stats(args.iters, || timed(&link, a))?;
    let link_gbs = gbs(off, link_best);

    println!(
        "kv_bench: Llama-3-{} ({} layers), {} blocks x {} tokens, 8 KV heads x 128 bf16; prefill TP {} HND on GPU 0 (one process per rank) -> decode TP 1 NHD on GPU {}; {} bytes; {} tiles",
        args.model.to_uppercase(),
        d.layout.layers,
        args.blocks,
        TOKENS_PER_BLOCK,
        args.tp,
        args.decode_gpu,
        bytes,
        plan.tiles()
    );
    println!("  one pass (tile kernel, NVLink):  best {:>9.3} ms  median {:>9.3} ms  {:>7.1} GB/s  {:.2} of the link (first post {:.3} ms)", ms(one_best), ms(one_med), gbs(bytes, one_best), gbs(bytes, one_best) / link_gbs, ms(first));
    println!("  move in HND (pieces, NVLink):    best {:>9.3} ms  median {:>9.3} ms  {:>7.1} GB/s  ({} pieces)", ms(mv_best), ms(mv_med), gbs(bytes, mv_best), moves.pieces());
    println!(
        "  permute on decode GPU (tile kernel): best {:>9.3} ms  median {:>9.3} ms  {:>7.1} GB/s",
        ms(pm_best),
        ms(pm_med),
        gbs(bytes, pm_best)
    );
    println!("  move then permute (sequential):  best {:>9.3} ms  median {:>9.3} ms  {:>7.1} GB/s  {:.2} of the link", ms(both_best), ms(both_med), gbs(bytes, both_best), gbs(bytes, both_best) / link_gbs);
    println!("  link (whole pools, one descriptor per rank): best {:>9.3} ms  median {:>9.3} ms  {:>7.1} GB/s", ms(link_best), ms(link_med), link_gbs);
    println!("  one pass vs move then permute: {:.2}x faster (best), {:.2}x (median); every element of both checked, both byte-identical", ms(both_best) / ms(one_best), ms(both_med) / ms(one_med));
    println!("  paths: {} | {}", one[0].path(), perm[0].path());
    Ok(())
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}

fn main() {
    let args = Args::parse();
    let r = match args.prefill_rank {
        Some(rank) => prefill(&args, rank),
        None => {
            let need = if args.decode_gpu == 0 { 1 } else { 2 };
            match nixl_mem::cuda::device_count() {
                Ok(n) if n >= need => {}
                n => {
                    println!("kv_bench: SKIPPED: {need} GPUs needed, {n:?} visible");
                    return;
                }
            }
            run(&args)
        }
    };
    if let Err(e) = r {
        eprintln!("kv_bench: {e}");
        std::process::exit(1);
    }
}
