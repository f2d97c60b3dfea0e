//! Scale bench: what each step of a transfer costs per descriptor as requests grow to KV-cache
//! sizes (issue 14), so superlinear costs show as a rising column.
//!
//! ```text
//! cargo bench --bench scale -- --backend NULL,INPROC,UCX --descs 1024,8192,65536,131072
//! cargo bench --bench scale -- --backend INPROC --mode kv --model llama3-8b,llama3-70b,moe16
//! cargo bench --bench scale -- --backend CUDA_IPC --mode all          # on a GPU machine
//! ```
//! Two agents in one process (the initiator and the target), each with the backend under test:
//! `NULL` (this bench's measuring device: nixl-core's own cost, nothing moved), `INPROC`
//! (memcpy), `UCX` (shared memory / CMA loopback), `CUDA_IPC` (VRAM on GPU 0, copy kernel).
//!
//! Flat mode (`--mode flat`): `n` descriptors of `--block` bytes over `--regions` registered
//! regions per side; the target's blocks are a fixed shuffle of the initiator's (nothing
//! merges, as with a block table's free list). Per step, the median over `--iters` runs, in
//! ns per descriptor: `prep` (both `prep_xfer_dlist` calls), `make` (`make_prepped_xfer`),
//! `post` (`post_xfer_req`), `done` (post until `Done`: includes the data movement), `repost`
//! (post + done of a built request), `fresh` (make + post + done + drop every time), `drop`.
//! The last line is the linearity figure: ns per descriptor at the largest `n` over the
//! smallest (1.0 is linear; the goal is <= 1.5).
//!
//! KV mode (`--mode kv`): model-shaped block tables (one strided region per layer and K/V,
//! vLLM's layout), a request named by block ids (`prep_strided_dlist` + `make_block_xfer`):
//! `build` (make), `post`, `build+post`, `repost` and `fresh` cycles, and the path taken
//! (whether the backend consumed the strides or got materialized segments).

mod kv;
mod null;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::{Agent, AgentConfig, MemKind, XferDescList, XferOp, XferOptions, XferState, XferTarget};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The backends the bench knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Null,
    Inproc,
    Ucx,
    CudaIpc,
}

impl Which {
    fn parse(s: &str) -> Res<Self> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "NULL" => Which::Null,
            "INPROC" => Which::Inproc,
            "UCX" => Which::Ucx,
            "CUDA_IPC" => Which::CudaIpc,
            b => return Err(format!("--backend {b}: NULL, INPROC, UCX or CUDA_IPC").into()),
        })
    }

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

    pub fn kind(self) -> MemKind {
        if self == Which::CudaIpc {
            MemKind::Vram
        } else {
            MemKind::Dram
        }
    }
}

/// Command-line options.
#[derive(Debug, Clone)]
pub struct Opts {
    pub backends: Vec<Which>,
    pub mode: String,
    pub descs: Vec<usize>,
    pub block: u64,
    pub regions: usize,
    pub iters: usize,
    pub models: Vec<String>,
    pub kv_blocks: Option<u64>,
    pub tp: Option<u64>,
    pub json: bool,
}

fn parse() -> Res<Opts> {
    let mut o = Opts {
        backends: vec![Which::Null, Which::Inproc],
        mode: "flat".into(),
        descs: vec![1024, 8192, 65536, 131072],
        block: 4096,
        regions: 64,
        iters: 0,
        models: vec!["llama3-8b".into(), "llama3-70b".into(), "moe16".into()],
        kv_blocks: None,
        tp: None,
        json: false,
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let list = |s: String| -> Vec<String> { s.split(',').map(|x| x.trim().to_owned()).collect() };
        match flag.as_str() {
            "--backend" => {
                o.backends = list(val()?)
                    .iter()
                    .map(|b| Which::parse(b))
                    .collect::<Res<_>>()?
            }
            "--mode" => o.mode = val()?,
            "--descs" => {
                o.descs = list(val()?)
                    .iter()
                    .map(|x| x.parse::<usize>())
                    .collect::<std::result::Result<_, _>>()?
            }
            "--block" => o.block = val()?.parse()?,
            "--regions" => o.regions = val()?.parse::<usize>()?.max(1),
            "--iters" => o.iters = val()?.parse()?,
            "--model" => o.models = list(val()?),
            "--kv-blocks" => o.kv_blocks = Some(val()?.parse()?),
            "--tp" => o.tp = Some(val()?.parse()?),
            "--json" => o.json = true,
            "-h" | "--help" => {
                println!("see the doc comment at the top of benches/scale/main.rs");
                std::process::exit(0);
            }
            f => return Err(format!("unknown flag {f}").into()),
        }
    }
    if !["flat", "kv", "all"].contains(&o.mode.as_str()) {
        return Err(format!("--mode {}: flat, kv or all", o.mode).into());
    }
    if o.descs.is_empty() || o.descs.contains(&0) || o.block == 0 {
        return Err("descriptor counts and the block size must be positive".into());
    }
    Ok(o)
}

/// Memory of one side: one allocation cut into `regions` registered regions.
pub struct Side {
    pub base: u64,
    /// Dropped before the memory its regions view.
    _reg: nixl::Registration,
    _mem: Arc<dyn nixl::core::MemoryRegion>,
}

/// Allocates `len` bytes of `kind` (DRAM is not touched: pages are committed by the first
/// copy, so `NULL` measures no memory at all).
fn alloc(kind: MemKind, len: u64) -> Res<(Arc<dyn nixl::core::MemoryRegion>, u64)> {
    if kind == MemKind::Vram {
        let b = Arc::new(nixl::mem::DeviceBuffer::new(0, len as usize)?);
        let a = b.addr();
        return Ok((b, a));
    }
    let b = Arc::new(nixl::HostBuffer::new(len as usize).ok_or("cannot allocate host memory")?);
    let a = b.addr();
    Ok((b, a))
}

/// Two agents with the backend under test; the initiator has loaded the target.
pub fn agents(which: Which, tag: &str) -> Res<(Agent, Agent)> {
    let cfg = || AgentConfig {
        default_timeout: Duration::from_secs(60),
        ..AgentConfig::default()
    };
    let a = Agent::new(&format!("scale-init-{tag}"), cfg())?;
    let b = Agent::new(&format!("scale-target-{tag}"), cfg())?;
    which.create(&a)?;
    which.create(&b)?;
    Ok((a, b))
}

/// Registers `len` bytes as `regions` equal regions (each a view of one allocation).
pub fn side(agent: &Agent, kind: MemKind, len: u64, regions: usize) -> Res<Side> {
    let (mem, base) = alloc(kind, len)?;
    let per = len / regions as u64;
    let dev = 0;
    let views: Vec<Arc<dyn nixl::core::MemoryRegion>> = (0..regions as u64)
        .map(|i| {
            let (addr, l) = (base + i * per, if i + 1 == regions as u64 { len - i * per } else { per });
            let desc = if kind == MemKind::Vram {
                nixl::core::RegionDesc::vram(addr, l, dev)
            } else {
                nixl::core::RegionDesc::dram(addr, l)
            };
            // SAFETY: every view lies inside `mem`, which `Side` keeps alive until after the
            // registration (fields drop in order); the bench drops every prepared list and
            // request built on a side before the side.
            let r = unsafe { nixl::core::RawRegion::new(desc) };
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

/// The median of `v`.
pub fn median(v: &mut [Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[v.len() / 2]
}

/// Runs `f` `iters` times; the median time.
pub fn time<T>(iters: usize, mut f: impl FnMut() -> Res<T>) -> Res<Duration> {
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        std::hint::black_box(f()?);
        v.push(t.elapsed());
    }
    Ok(median(&mut v))
}

/// Posts a request and polls it to `Done`.
pub fn run(a: &Agent, req: &nixl::XferReq) -> Res<()> {
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
pub fn shuffle(n: usize) -> Vec<usize> {
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

const STEPS: [&str; 7] = ["prep", "make", "post", "done", "repost", "fresh", "drop"];

/// One flat point: the per-step medians in ns per descriptor.
fn flat_point(which: Which, o: &Opts, n: usize) -> Res<[f64; 7]> {
    let (a, b) = agents(which, &format!("flat{n}"))?;
    let kind = which.kind();
    let len = n as u64 * o.block;
    let regions = o.regions.min(n);
    let la = side(&a, kind, len, regions)?;
    let lb = side(&b, kind, len, regions)?;
    a.load_remote_metadata(&b.local_metadata()?)?;
    let remote = b.name().to_owned();
    let perm = shuffle(n);
    let ldescs = XferDescList::blocks(kind, la.base, o.block, n);
    let rdescs = XferDescList::from_descs(
        kind,
        perm.iter()
            .map(|&p| nixl::Desc::new(lb.base + p as u64 * o.block, o.block)),
    );
    let iters = if o.iters > 0 {
        o.iters
    } else {
        (2_000_000 / n).clamp(5, 101)
    };
    let (iters_data, iters_cpu) = match which {
        // Moving the data dominates: fewer rounds.
        Which::Null => (iters, iters),
        _ => ((iters / 4).max(5), iters),
    };
    let prep = time(iters_cpu, || {
        let l = a.prep_xfer_dlist(XferTarget::Initiator, &ldescs, &[])?;
        let r = a.prep_xfer_dlist(XferTarget::Agent(&remote), &rdescs, &[])?;
        Ok((l, r))
    })?;
    let l = a.prep_xfer_dlist(XferTarget::Initiator, &ldescs, &[])?;
    let r = a.prep_xfer_dlist(XferTarget::Agent(&remote), &rdescs, &[])?;
    let idx: Vec<usize> = (0..n).collect();
    let make = || a.make_prepped_xfer(XferOp::Write, &l, &idx, &r, &idx, XferOptions::default());
    let (mut makes, mut drops) = (Vec::new(), Vec::new());
    for _ in 0..iters_cpu {
        let t = Instant::now();
        let req = make()?;
        makes.push(t.elapsed());
        let t = Instant::now();
        drop(req);
        drops.push(t.elapsed());
    }
    let mk = median(&mut makes);
    let req = make()?;
    run(&a, &req)?; // first touch of the pages
    let mut posts = Vec::new();
    let mut dones = Vec::new();
    for _ in 0..iters_data {
        let t = Instant::now();
        let mut st = a.post_xfer_req(&req)?;
        posts.push(t.elapsed());
        while st == XferState::InProgress {
            st = a.check_xfer_state(&req)?;
        }
        dones.push(t.elapsed());
    }
    let repost = time(iters_data, || run(&a, &req))?;
    let fresh = time(iters_data, || {
        let r = make()?;
        run(&a, &r)
    })?;
    drop(req);
    let per = |d: Duration| d.as_nanos() as f64 / n as f64;
    Ok([
        per(prep),
        per(mk),
        per(median(&mut posts)),
        per(median(&mut dones)),
        per(repost),
        per(fresh),
        per(median(&mut drops)),
    ])
}

fn flat(which: Which, o: &Opts) -> Res<()> {
    if !o.json {
        println!(
            "# flat {}: {} B descriptors over {} regions per side, ns per descriptor (median)",
            which.name(),
            o.block,
            o.regions
        );
        print!("{:>8}", "descs");
        for s in STEPS {
            print!(" {s:>9}");
        }
        println!();
    }
    let mut rows = Vec::new();
    for &n in &o.descs {
        let row = flat_point(which, o, n)?;
        if o.json {
            let fields: Vec<String> = STEPS
                .iter()
                .zip(row)
                .map(|(s, v)| format!("\"{s}_ns\": {v:.1}"))
                .collect();
            println!(
                "{{\"bench\": \"scale\", \"mode\": \"flat\", \"backend\": \"{}\", \"descs\": {n}, \"block\": {}, {}}}",
                which.name(),
                o.block,
                fields.join(", ")
            );
        } else {
            print!("{n:>8}");
            for v in row {
                print!(" {v:>9.1}");
            }
            println!();
        }
        rows.push((n, row));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        if rows.len() > 1 {
            let lin: Vec<f64> = (0..STEPS.len())
                .map(|i| last.1[i] / first.1[i].max(1e-9))
                .collect();
            if o.json {
                let fields: Vec<String> = STEPS
                    .iter()
                    .zip(&lin)
                    .map(|(s, v)| format!("\"{s}\": {v:.2}"))
                    .collect();
                println!(
                    "{{\"bench\": \"scale\", \"mode\": \"linearity\", \"backend\": \"{}\", \"from\": {}, \"to\": {}, {}}}",
                    which.name(),
                    first.0,
                    last.0,
                    fields.join(", ")
                );
            } else {
                print!("{:>8}", format!("{}/{}", short(last.0), short(first.0)));
                for v in lin {
                    print!(" {v:>9.2}");
                }
                println!("   <- linearity (ns/desc at {} over at {})", last.0, first.0);
            }
        }
    }
    Ok(())
}

fn short(n: usize) -> String {
    if n >= 1024 && n % 1024 == 0 {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

fn main() {
    let r = parse().and_then(|o| {
        for &w in &o.backends {
            if o.mode == "flat" || o.mode == "all" {
                if let Err(e) = flat(w, &o) {
                    println!("# flat {}: skipped: {e}", w.name());
                }
            }
            if o.mode == "kv" || o.mode == "all" {
                if let Err(e) = kv::run_models(w, &o) {
                    println!("# kv {}: skipped: {e}", w.name());
                }
            }
        }
        Ok(())
    });
    if let Err(e) = r {
        eprintln!("scale: {e}");
        std::process::exit(1);
    }
}
