//! Scale bench: what each step of a transfer costs per descriptor as requests grow to KV-cache
//! sizes (issue 14), so superlinear costs show as a rising column.
//!
//! ```text
//! cargo bench -p nixl-bench --bench scale -- --backend NULL,INPROC,UCX --descs 1024,8192,65536,131072
//! cargo bench -p nixl-bench --bench scale -- --backend INPROC --mode kv --model llama3-8b,llama3-70b,moe16
//! cargo bench -p nixl-bench --bench scale -- --backend CUDA_IPC --mode all          # on a GPU machine
//! ```
//! Two agents in one process (the initiator and the target), each with the backend under test:
//! `NULL` (this bench's measuring device: nixl-core's own cost, nothing moved), `INPROC`
//! (memcpy), `UCX` (shared memory / CMA loopback), `CUDA_IPC` (VRAM on GPU 0, copy kernel).
//!
//! Flat mode (`--mode flat`): `n` descriptors of `--block` bytes over `--regions` registered
//! regions per side; the target's blocks are a fixed shuffle of the initiator's (nothing
//! merges, as with a block table's free list); with `--order layers` both lists are region
//! after region and the request names the same shuffled block ids in every region (the
//! shape NIXL's users build, taken as a block-table request). Every point is set up first, then measured in
//! `--rounds` interleaved rounds (so a busy moment of a shared machine hits every size alike);
//! per step the best time over all runs, in ns per descriptor: `prep` (both `prep_xfer_dlist`
//! calls), `make` (`make_prepped_xfer`), `post` (`post_xfer_req`), `done` (post until `Done`:
//! includes the data movement), `repost` (post + done of a built request), `fresh` (make +
//! post + done + drop every time), `drop`. The last line is the linearity figure: ns per
//! descriptor at the largest `n` over the smallest (1.0 is linear; the goal is <= 1.5).
//!
//! KV mode (`--mode kv`, `--model llama3-8b,llama3-70b,moe16`, `--kv-blocks N` block ids per
//! request, `--tp N`): model-shaped block tables (one region per layer holding K and V, in
//! vLLM's split layout and FlashInfer's interleaved one), a request named by block ids
//! (`prep_strided_dlist` + `make_block_xfer`): `prep`, `build` (make), `post`, `build+post`,
//! `repost` (post + done) and `fresh` (build + post + done + drop) cycles alternated, their
//! ratio, and the path taken (whether the backend consumed the strides or got materialized
//! segments); then the same transfer as a flat descriptor list for comparison.

mod flat;
mod kv;
mod null;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::{Agent, AgentConfig, MemKind, XferState};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The backends the bench knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Which {
    #[value(name = "NULL")]
    Null,
    #[value(name = "INPROC")]
    Inproc,
    #[value(name = "UCX")]
    Ucx,
    #[value(name = "CUDA_IPC")]
    CudaIpc,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Null => "NULL",
            Which::Inproc => "INPROC",
            Which::Ucx => "UCX",
            Which::CudaIpc => "CUDA_IPC",
        }
    }

    fn create(self, a: &Agent) -> Res<()> {
        match self {
            Which::Null => a.create_backend(null::NullParams)?,
            Which::Inproc => a.create_backend(nixl::core::InprocParams::default())?,
            Which::Ucx => a.create_backend(nixl::ucx::UcxParams::default())?,
            Which::CudaIpc => a.create_backend(nixl::mem::CudaIpcParams::default())?,
        };
        Ok(())
    }

    fn kind(self) -> MemKind {
        if self == Which::CudaIpc {
            MemKind::Vram
        } else {
            MemKind::Dram
        }
    }
}

/// What each step of a transfer costs per descriptor as requests grow (see the module docs).
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "scale")]
struct Opts {
    /// Backends to measure.
    #[arg(long = "backend", value_enum, ignore_case = true, value_delimiter = ',', default_values_t = [Which::Null, Which::Inproc])]
    backends: Vec<Which>,
    /// `flat` (descriptor lists), `kv` (model-shaped block tables) or `all`.
    #[arg(long, default_value = "flat", value_parser = ["flat", "kv", "all"])]
    mode: String,
    /// Descriptor counts (flat mode).
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 8192, 65536, 131072])]
    descs: Vec<usize>,
    /// Block size in bytes (flat mode).
    #[arg(long, default_value_t = 4096)]
    block: u64,
    /// Registered regions per side (flat mode; at least 1).
    #[arg(long, default_value_t = 64)]
    regions: usize,
    /// Flat mode's pairing: `shuffled` (the target's blocks a fixed shuffle of the
    /// initiator's, indices in order) or `layers` (NIXL users' shape: both lists region after
    /// region, every block of each; the request names one shuffle of the block ids in every
    /// region, which nixl-rs builds as a block-table request). `layers` needs the descriptor
    /// counts to be multiples of `--regions`.
    #[arg(long, default_value = "shuffled", value_parser = ["shuffled", "layers"])]
    order: String,
    /// With `--order layers`: the layers each region holds, slices of it one after the other
    /// (the main job's pools: one region, `--layers 4`), every layer moving the same ids.
    #[arg(long, default_value_t = 1)]
    layers: usize,
    /// With `--order layers`: the ids each request names in every layer. `shuffled`: one
    /// shuffle of the layer's blocks on both sides; `engine`: as the main job's block
    /// manager hands them out (the source's blocks consecutive, the destination's scattered
    /// slots at a stride of about half the layer, `disagg_kv`'s pattern).
    #[arg(long, default_value = "shuffled", value_parser = ["shuffled", "engine"])]
    ids: String,
    /// Flat mode: evict the CPU caches (write a 64 MiB buffer) before every timed prep, make
    /// and post, as a server's request path finds them after moving and checking data (the
    /// main job's conditions) instead of hot from the previous iteration.
    #[arg(long)]
    cold: bool,
    /// Iterations per point (0: chosen per size).
    #[arg(long, default_value_t = 0)]
    iters: usize,
    /// Interleaved rounds (at least 1).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Models (kv mode): llama3-8b, llama3-70b, moe16.
    #[arg(long = "model", value_delimiter = ',', default_values_t = ["llama3-8b".to_owned(), "llama3-70b".to_owned(), "moe16".to_owned()])]
    models: Vec<String>,
    /// Block ids per request (kv mode).
    #[arg(long)]
    kv_blocks: Option<u64>,
    /// Tensor-parallel degree (kv mode).
    #[arg(long)]
    tp: Option<u64>,
    /// Print JSON lines too.
    #[arg(long)]
    json: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn parse() -> Res<Opts> {
    let mut o = <Opts as clap::Parser>::parse();
    o.regions = o.regions.max(1);
    o.rounds = o.rounds.max(1);
    if o.descs.is_empty() || o.descs.contains(&0) || o.block == 0 {
        return Err("descriptor counts and the block size must be positive".into());
    }
    Ok(o)
}

/// Memory of one side: one allocation cut into `regions` registered regions.
struct Side {
    base: u64,
    /// Dropped before the memory its regions view.
    _reg: nixl::Registration,
    _mem: Mem,
}

/// One side's allocation.
enum Mem {
    /// Registered memory a backend moves.
    Region(#[allow(dead_code)] Arc<dyn nixl::core::MemoryRegion>),
    /// Address space only (`NULL` never touches it, so no page is committed).
    Reserved(#[allow(dead_code)] Vec<u8>),
}

/// Allocates `len` bytes for `which`.
fn alloc(which: Which, len: u64) -> Res<(Mem, u64)> {
    match which {
        Which::CudaIpc => {
            let b = Arc::new(nixl::mem::DeviceBuffer::new(0, len as usize)?);
            let a = b.addr();
            Ok((Mem::Region(b), a))
        }
        Which::Null => {
            let v: Vec<u8> = Vec::with_capacity(len as usize);
            let a = v.as_ptr() as u64;
            Ok((Mem::Reserved(v), a))
        }
        _ => {
            let b =
                Arc::new(nixl::HostBuffer::new(len as usize).ok_or("cannot allocate host memory")?);
            let a = b.addr();
            Ok((Mem::Region(b), a))
        }
    }
}

/// Two agents with the backend under test; the initiator has loaded the target.
fn agents(which: Which, tag: &str) -> Res<(Agent, Agent)> {
    let cfg = || AgentConfig::default().default_timeout(Duration::from_secs(60));
    let a = Agent::new(&format!("scale-init-{tag}"), cfg())?;
    let b = Agent::new(&format!("scale-target-{tag}"), cfg())?;
    which.create(&a)?;
    which.create(&b)?;
    Ok((a, b))
}

/// Registers `len` bytes as `regions` regions of whole `block`s (each a view of one
/// allocation; the last takes what is left), so no block straddles two regions.
fn side(agent: &Agent, which: Which, len: u64, regions: usize, block: u64) -> Res<Side> {
    let kind = which.kind();
    let (mem, base) = alloc(which, len)?;
    let per = (len / block.max(1) / regions as u64).max(1) * block.max(1);
    let dev = 0;
    let views: Vec<Arc<dyn nixl::core::MemoryRegion>> = (0..regions as u64)
        .map(|i| {
            let (addr, l) = (
                base + i * per,
                if i + 1 == regions as u64 {
                    len - i * per
                } else {
                    per
                },
            );
            let desc = if kind == MemKind::Vram {
                nixl::core::RegionDesc::vram(addr, l, dev)
            } else {
                nixl::core::RegionDesc::dram(addr, l)
            };
            // SAFETY: every view lies inside `mem` (allocated, `len` bytes), which `Side` keeps
            // alive until after the registration (fields drop in order); the bench drops every
            // prepared list and request built on a side before the side. `Reserved` memory is
            // only registered with NULL, which never reads or writes it.
            let r = unsafe { nixl::core::backend::RawRegion::new(desc) };
            Arc::new(r) as Arc<dyn nixl::core::MemoryRegion>
        })
        .collect();
    let reg = agent.register_mem(views, &[])?;
    Ok(Side {
        base,
        _reg: reg,
        _mem: mem,
    })
}

/// The shortest of `v` (on a shared machine the best run is the one others disturbed least).
fn best(v: &[Duration]) -> Duration {
    v.iter().copied().min().unwrap_or_default()
}

/// Runs `f` `iters` times; the best time.
fn time<T>(iters: usize, mut f: impl FnMut() -> Res<T>) -> Res<Duration> {
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        std::hint::black_box(f()?);
        v.push(t.elapsed());
    }
    Ok(best(&v))
}

/// Posts a request and polls it to `Done`.
fn run(a: &Agent, req: &nixl::XferReq) -> Res<()> {
    let end = Instant::now() + Duration::from_secs(60);
    let mut st = a.post_xfer_req(req)?;
    while st == XferState::InProgress {
        if Instant::now() > end {
            return Err("transfer did not finish in 60 s".into());
        }
        st = a.check_xfer_state(req)?;
    }
    Ok(())
}

/// A fixed permutation of `0..n` (so the target's blocks never line up into merges).
fn shuffle(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn main() {
    let r = parse().map(|o| {
        for &w in &o.backends {
            if o.mode == "flat" || o.mode == "all" {
                if let Err(e) = flat::sweep(w, &o) {
                    println!("# flat {}: skipped: {e}", w.name());
                }
            }
            if o.mode == "kv" || o.mode == "all" {
                if let Err(e) = kv::run_models(w, &o) {
                    println!("# kv {}: skipped: {e}", w.name());
                }
            }
        }
    });
    if let Err(e) = r {
        eprintln!("scale: {e}");
        std::process::exit(1);
    }
}
