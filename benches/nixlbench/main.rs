//! nixlbench-style throughput and latency CLI: two processes (this binary spawns the target),
//! metadata over the side channel, DRAM or VRAM on either side, over the UCX backend; or, with
//! `--backend POSIX` (or `GDS`, feature `gds`), one process moving DRAM/VRAM to and from a file
//! in `--filepath DIR` (`--storage-enable-direct` for O_DIRECT), as NIXL's nixlbench does for
//! its storage backends.
//!
//! ```text
//! cargo bench -p nixl-bench --bench nixlbench -- --op WRITE --start-block-size 4096 --max-block-size 67108864 \
//!     --start-batch-size 1 --max-batch-size 32
//! cargo bench -p nixl-bench --bench nixlbench -- --mode kv --model-layers 32 --kv-heads 8 --head-dim 128 \
//!     --dtype-bytes 2 --tokens-per-block 16 --seq-len 4096 --tp 1
//! cargo bench -p nixl-bench --bench nixlbench -- --blocks 4096,1048576 --batches 1,32 --json
//! ```
//! Knobs (NIXL's names): `--op READ|WRITE`, `--initiator-seg-type DRAM|VRAM`,
//! `--target-seg-type DRAM|VRAM`, `--start-block-size`, `--max-block-size`, `--start-batch-size`,
//! `--max-batch-size` (powers of two between), or explicit `--blocks a,b --batches c,d`;
//! `--total-buffer-size`, `--num-iter`, `--warmup-iter`, `--num-threads`, `--tls`,
//! `--fresh-requests` (make a request per iteration instead of reposting one),
//! `--progress-thread on|off` (the UCX backend's own thread), `--direct-cma on|off` and
//! `--cma-threads N` (the UCX backend's same-host copies, `UcxParams::direct_cma`), `--json`,
//! `--backend UCX|POSIX|GDS`, `--filepath DIR`, `--storage-enable-direct`, `--target-gpu N`
//! (the target process sees only GPU N: GPU-to-GPU runs).
//! KV mode (like NIXL's kvbench): `--mode kv` with `--model-layers`, `--kv-heads`,
//! `--head-dim`, `--dtype-bytes`, `--tokens-per-block`, `--seq-len`, `--tp`: one request moves a
//! sequence's K and V blocks of every layer (block = tokens x kv_heads/tp x head_dim x dtype).
//! Notification latency (`--mode notif`, like benches/reference/native): a 4 KiB WRITE with a
//! notification, one in flight, the target busy-polling; prints the median and p99 time from
//! post to the target seeing it (`--num-iter`, default 2000).
//! Columns: block size, batch size, GB/s, average latency, and average and p99 of prepare
//! (`make_prepped_xfer`), post (`post_xfer_req`) and transfer (post to done) times.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

mod notif;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "posix")]
use nixl::storage::{FileRegion, OpenFlags};
use nixl::ucx::UcxParams;
use nixl::{Agent, AgentConfig, MemKind, XferDescList, XferOp, XferOptions, XferState, XferTarget};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PAGE: u64 = 4096;

#[derive(Debug, Clone)]
struct Opts {
    role: String,
    peer: Option<SocketAddr>,
    op: XferOp,
    init_kind: MemKind,
    target_kind: MemKind,
    blocks: Vec<u64>,
    batches: Vec<usize>,
    total_buffer: u64,
    iters: usize,
    warmup: usize,
    threads: usize,
    tls: Option<String>,
    fresh: bool,
    json: bool,
    bytes_per_point: f64,
    progress_thread: bool,
    /// `UcxParams::direct_cma` and `cma_threads` of the initiator (`None`: the default).
    direct_cma: Option<bool>,
    cma_threads: Option<usize>,
    backend: BenchBackend,
    filepath: std::path::PathBuf,
    direct: bool,
    /// `--mode notif`: notification latency instead of the sweep.
    notif: bool,
    /// Where the notif-mode target leaves its stamps (set by the initiator).
    stamps: Option<std::path::PathBuf>,
    /// `--target-gpu N`: the spawned target process sees only GPU N (`CUDA_VISIBLE_DEVICES`),
    /// so its VRAM is on that GPU (GPU-to-GPU runs on a machine with several).
    target_gpu: Option<u32>,
}

/// Which backend moves the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchBackend {
    /// Two processes over UCX.
    Ucx,
    /// One process, memory <-> a file, through the POSIX backend.
    Posix,
    /// One process, memory <-> a file, through GDS (cuFile).
    Gds,
}

fn pow2_range(lo: u64, hi: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut x = lo.max(1);
    while x <= hi {
        v.push(x);
        x *= 2;
    }
    v
}

/// NIXL's nixlbench, in nixl-rs (see the module docs).
#[derive(clap::Parser, Debug)]
#[command(name = "nixlbench", args_override_self = true)]
struct Cli {
    /// `initiator` (started by the user) or `target` (started by the initiator).
    #[arg(long, default_value = "initiator")]
    role: String,
    /// The initiator's side channel (target role).
    #[arg(long)]
    peer: Option<SocketAddr>,
    /// READ or WRITE.
    #[arg(long, value_enum, ignore_case = true, default_value = "WRITE")]
    op: OpArg,
    /// DRAM or VRAM.
    #[arg(
        long = "initiator-seg-type",
        value_enum,
        ignore_case = true,
        default_value = "DRAM"
    )]
    init_kind: SegArg,
    /// DRAM or VRAM.
    #[arg(
        long = "target-seg-type",
        value_enum,
        ignore_case = true,
        default_value = "DRAM"
    )]
    target_kind: SegArg,
    /// Smallest block of the sweep (powers of two up to the largest).
    #[arg(long, default_value_t = 4096)]
    start_block_size: u64,
    /// Largest block of the sweep.
    #[arg(long, default_value_t = 64 << 20)]
    max_block_size: u64,
    /// Smallest batch of the sweep (powers of two up to the largest).
    #[arg(long, default_value_t = 1)]
    start_batch_size: u64,
    /// Largest batch of the sweep.
    #[arg(long, default_value_t = 32)]
    max_batch_size: u64,
    /// Block sizes instead of the sweep's.
    #[arg(long, value_delimiter = ',')]
    blocks: Vec<u64>,
    /// Batch sizes instead of the sweep's.
    #[arg(long, value_delimiter = ',')]
    batches: Vec<usize>,
    /// Bytes of each side's buffer (0: what the largest point needs).
    #[arg(long = "total-buffer-size", default_value_t = 0)]
    total_buffer: u64,
    /// Iterations per point (0: from --bytes-per-point).
    #[arg(long = "num-iter", default_value_t = 0)]
    iters: usize,
    /// Warm-up iterations per point.
    #[arg(long = "warmup-iter", default_value_t = 10)]
    warmup: usize,
    /// Threads, each with its own requests.
    #[arg(long = "num-threads", default_value_t = 1)]
    threads: usize,
    /// Bytes moved per point when --num-iter is 0.
    #[arg(long, default_value_t = 2e9)]
    bytes_per_point: f64,
    /// UCX transports.
    #[arg(long)]
    tls: Option<String>,
    /// Build, post and drop a request every iteration.
    #[arg(long = "fresh-requests")]
    fresh: bool,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// The agents' progress thread.
    #[arg(long, value_enum, default_value = "on")]
    progress_thread: OnOff,
    /// UCX direct CMA copies (default: the backend's).
    #[arg(long, value_enum)]
    direct_cma: Option<OnOff>,
    /// UCX direct CMA copy threads.
    #[arg(long)]
    cma_threads: Option<usize>,
    /// UCX (two processes), POSIX or GDS (one process, memory <-> a file).
    #[arg(long, value_enum, ignore_case = true, default_value = "UCX")]
    backend: BackendArg,
    /// Directory of the storage backends' file.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    filepath: std::path::PathBuf,
    /// O_DIRECT for the storage backends.
    #[arg(long = "storage-enable-direct", alias = "storage_enable_direct")]
    direct: bool,
    /// `sweep`, `kv` (a model's KV request) or `notif` (notification latency).
    #[arg(long, default_value = "sweep", value_parser = ["sweep", "kv", "notif"])]
    mode: String,
    /// The target process sees only this GPU.
    #[arg(long)]
    target_gpu: Option<u32>,
    /// Where the notif-mode target leaves its stamps (set by the initiator).
    #[arg(long = "notif-stamps")]
    stamps: Option<std::path::PathBuf>,
    /// KV mode: layers.
    #[arg(long, default_value_t = 32)]
    model_layers: u64,
    /// KV mode: KV heads.
    #[arg(long, default_value_t = 8)]
    kv_heads: u64,
    /// KV mode: head dimension.
    #[arg(long, default_value_t = 128)]
    head_dim: u64,
    /// KV mode: bytes per element.
    #[arg(long, default_value_t = 2)]
    dtype_bytes: u64,
    /// KV mode: tokens per block.
    #[arg(long, default_value_t = 16)]
    tokens_per_block: u64,
    /// KV mode: sequence length.
    #[arg(long, default_value_t = 4096)]
    seq_len: u64,
    /// KV mode: tensor-parallel degree.
    #[arg(long, default_value_t = 1)]
    tp: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum OpArg {
    #[value(name = "READ")]
    Read,
    #[value(name = "WRITE")]
    Write,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum SegArg {
    #[value(name = "DRAM")]
    Dram,
    #[value(name = "VRAM")]
    Vram,
}

impl SegArg {
    fn kind(self) -> MemKind {
        match self {
            SegArg::Dram => MemKind::Dram,
            SegArg::Vram => MemKind::Vram,
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OnOff {
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum BackendArg {
    #[value(name = "UCX")]
    Ucx,
    #[value(name = "POSIX")]
    Posix,
    #[value(name = "GDS")]
    Gds,
}

fn parse() -> Res<Opts> {
    let c = <Cli as clap::Parser>::parse();
    let mut o = Opts {
        role: c.role,
        peer: c.peer,
        op: match c.op {
            OpArg::Read => XferOp::Read,
            OpArg::Write => XferOp::Write,
        },
        init_kind: c.init_kind.kind(),
        target_kind: c.target_kind.kind(),
        blocks: c.blocks,
        batches: c.batches,
        total_buffer: c.total_buffer,
        iters: c.iters,
        warmup: c.warmup,
        threads: c.threads.max(1),
        tls: c.tls,
        fresh: c.fresh,
        json: c.json,
        bytes_per_point: c.bytes_per_point,
        progress_thread: c.progress_thread == OnOff::On,
        direct_cma: c.direct_cma.map(|v| v == OnOff::On),
        cma_threads: c.cma_threads,
        backend: match c.backend {
            BackendArg::Ucx => BenchBackend::Ucx,
            BackendArg::Posix => BenchBackend::Posix,
            BackendArg::Gds => BenchBackend::Gds,
        },
        filepath: c.filepath,
        direct: c.direct,
        notif: false,
        stamps: c.stamps,
        target_gpu: c.target_gpu,
    };
    let (b0, b1, n0, n1) = (
        c.start_block_size,
        c.max_block_size,
        c.start_batch_size,
        c.max_batch_size,
    );
    let kvv = [
        c.model_layers,
        c.kv_heads,
        c.head_dim,
        c.dtype_bytes,
        c.tokens_per_block,
        c.seq_len,
        c.tp,
    ];
    let mode = c.mode;
    let mut kv: Option<[u64; 7]> = None;
    if mode == "kv" {
        kv = Some(kvv);
    } else if mode == "notif" {
        o.notif = true;
        o.blocks = vec![PAGE];
        o.batches = vec![1];
        if o.iters == 0 {
            o.iters = 2000;
        }
    }
    if let Some([layers, heads, dim, dtype, tpb, seq, tp]) = kv {
        if tp == 0 || heads % tp != 0 || [layers, heads, dim, dtype, tpb, seq].contains(&0) {
            return Err("KV shape values must be positive and kv_heads divisible by tp".into());
        }
        let block = tpb * (heads / tp) * dim * dtype;
        let per_layer = seq.div_ceil(tpb) * 2;
        o.blocks = vec![block];
        o.batches = vec![(layers * per_layer) as usize];
        if !o.json {
            println!(
                "# KV mode: {layers} layers x {} blocks (K+V) of {block} B = {:.1} MiB per request",
                per_layer,
                (layers * per_layer * block) as f64 / 1048576.0
            );
        }
    }
    if o.blocks.is_empty() {
        o.blocks = pow2_range(b0, b1);
    }
    if o.batches.is_empty() {
        o.batches = pow2_range(n0, n1).into_iter().map(|x| x as usize).collect();
    }
    if o.blocks.contains(&0) || o.batches.contains(&0) {
        return Err("block and batch sizes must be positive".into());
    }
    if o.backend != BenchBackend::Ucx {
        o.target_kind = MemKind::File;
        if o.direct && o.blocks.iter().any(|b| b % PAGE != 0) {
            return Err(
                "--storage-enable-direct needs block sizes that are multiples of 4096".into(),
            );
        }
    }
    let need = o
        .blocks
        .iter()
        .flat_map(|&b| o.batches.iter().map(move |&n| span(b, n)))
        .max()
        .unwrap_or(0)
        * o.threads as u64;
    if o.total_buffer == 0 {
        o.total_buffer = need;
    }
    Ok(o)
}

/// Bytes one thread's descriptors of a point span (one page between blocks, so none merge).
fn span(block: u64, batch: usize) -> u64 {
    batch as u64 * (block + PAGE)
}

fn descs(kind: MemKind, base: u64, block: u64, batch: usize) -> XferDescList {
    XferDescList::from_descs(
        kind,
        (0..batch as u64).map(|i| nixl::Desc::new(base + i * (block + PAGE), block)),
    )
}

struct Mem {
    region: Arc<dyn nixl::core::MemoryRegion>,
    addr: u64,
    /// The buffer, when it is host memory.
    host: Option<Arc<nixl::HostBuffer>>,
}

fn alloc(kind: MemKind, len: u64) -> Res<Mem> {
    match kind {
        MemKind::Dram => {
            let b =
                Arc::new(nixl::HostBuffer::new(len as usize).ok_or("cannot allocate host memory")?);
            b.fill(1);
            let addr = b.addr();
            Ok(Mem {
                region: b.clone(),
                addr,
                host: Some(b),
            })
        }
        _ => {
            let b = Arc::new(nixl::mem::DeviceBuffer::new(0, len as usize)?);
            let addr = b.addr();
            Ok(Mem {
                region: b,
                addr,
                host: None,
            })
        }
    }
}

fn agent(name: &str, o: &Opts) -> Res<Agent> {
    let a = Agent::new(
        name,
        AgentConfig::default()
            .listen(true)
            .default_timeout(Duration::from_secs(60)),
    )?;
    let mut p = UcxParams::default()
        .transports(o.tls.clone())
        .progress_thread(o.progress_thread);
    p.direct_cma = o.direct_cma.unwrap_or(p.direct_cma);
    p.cma_threads = o.cma_threads.unwrap_or(p.cma_threads);
    a.create_backend(p)?;
    Ok(a)
}

fn target(o: &Opts, peer: SocketAddr) -> Res<()> {
    let a = agent("nixlbench-target", o)?;
    let m = alloc(o.target_kind, o.total_buffer)?;
    let _reg = a.register_mem(vec![m.region.clone()], &[])?;
    a.fetch_remote_metadata_blocking("nixlbench-initiator", peer, Duration::from_secs(60))?;
    a.send_local_metadata(peer)?;
    a.gen_notif(
        "nixlbench-initiator",
        format!("addr:{}", m.addr).as_bytes(),
        &[],
    )?;
    if o.notif {
        let out = o
            .stamps
            .as_deref()
            .ok_or("--mode notif: no --notif-stamps")?;
        notif::serve(&a, &m, o.warmup + o.iters, out)?;
    }
    // Sleep between polls: the backend's progress thread does the work; spinning here would
    // steal the CPU the initiator's copies need.
    let end = Instant::now() + Duration::from_secs(3600);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        if a.get_notifs()?
            .get("nixlbench-initiator")
            .is_some_and(|v| v.iter().any(|m| m == b"done"))
        {
            return Ok(());
        }
    }
    Err("no done message".into())
}

#[derive(Default)]
struct Times {
    prepare: Vec<Duration>,
    post: Vec<Duration>,
    xfer: Vec<Duration>,
}

fn avg_p99(v: &mut [Duration]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort();
    let avg = v.iter().sum::<Duration>().as_secs_f64() / v.len() as f64;
    let p99 = v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)].as_secs_f64();
    (avg * 1e6, p99 * 1e6)
}

/// Where a point's remote descriptors live.
enum Remote {
    /// The spawned target process's memory at this address.
    Peer(u64),
    /// A file of this agent (storage backends).
    #[cfg(feature = "posix")]
    File(Arc<FileRegion>),
}

impl Remote {
    fn agent<'a>(&self, a: &'a Agent) -> &'a str {
        let _ = a; // only storage targets name the agent itself
        match self {
            Remote::Peer(_) => "nixlbench-target",
            #[cfg(feature = "posix")]
            Remote::File(_) => a.name(),
        }
    }

    fn descs(&self, kind: MemKind, off: u64, block: u64, batch: usize) -> XferDescList {
        match self {
            Remote::Peer(addr) => descs(kind, addr + off, block, batch),
            #[cfg(feature = "posix")]
            Remote::File(f) => XferDescList::from_descs(
                MemKind::File,
                (0..batch as u64).map(|i| f.desc_at(off + i * (block + PAGE), block)),
            ),
        }
    }
}

#[allow(clippy::too_many_arguments)] // one point's parameters, passed to each thread
fn thread_run(
    a: &Agent,
    o: &Opts,
    t: usize,
    block: u64,
    batch: usize,
    laddr: u64,
    remote_side: &Remote,
    iters: usize,
) -> Res<Times> {
    let off = t as u64 * span(block, batch);
    let local = a.prep_xfer_dlist(
        XferTarget::Initiator,
        &descs(o.init_kind, laddr + off, block, batch),
        &[],
    )?;
    let remote = a.prep_xfer_dlist(
        XferTarget::Agent(remote_side.agent(a)),
        &remote_side.descs(o.target_kind, off, block, batch),
        &[],
    )?;
    let idx: Vec<usize> = (0..batch).collect();
    let mut times = Times::default();
    let make = |times: &mut Times| -> Res<nixl::XferReq> {
        let t0 = Instant::now();
        let r = a.make_prepped_xfer(o.op, &local, &idx, &remote, &idx, XferOptions::default())?;
        times.prepare.push(t0.elapsed());
        Ok(r)
    };
    let mut req = make(&mut times)?;
    let warmup = o.warmup.min(warmup_for(block * batch as u64));
    for i in 0..warmup + iters {
        if o.fresh && i > 0 {
            req = make(&mut times)?;
        }
        let t0 = Instant::now();
        let mut st = a.post_xfer_req(&req)?;
        let t1 = Instant::now();
        // A request done inside post costs no second clock read (the native reference
        // reads the clock twice per request too).
        let t2 = if st == XferState::InProgress {
            while st == XferState::InProgress {
                st = a.check_xfer_state(&req)?;
            }
            Instant::now()
        } else {
            t1
        };
        if i >= warmup {
            times.post.push(t1 - t0);
            times.xfer.push(t2 - t0);
        }
    }
    Ok(times)
}

/// Warm-up iterations for a request size (the same rule as benches/reference/nixl_ref.py):
/// 10 for small requests, down to 2 for huge ones.
fn warmup_for(bytes: u64) -> usize {
    ((2e8 / bytes as f64) as usize).clamp(2, 10)
}

struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn initiator(o: &Opts) -> Res<()> {
    let a = agent("nixlbench-initiator", o)?;
    let m = alloc(o.init_kind, o.total_buffer)?;
    let _reg = a.register_mem(vec![m.region.clone()], &[])?;
    let addr = a.listen_addr().ok_or("not listening")?;
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|x| x != "--bench")
        .collect();
    args.extend([
        "--role".into(),
        "target".into(),
        "--peer".into(),
        addr.to_string(),
        "--total-buffer-size".into(),
        o.total_buffer.to_string(),
    ]);
    let stamps = notif::stamp_file();
    if o.notif {
        args.extend(["--notif-stamps".into(), stamps.display().to_string()]);
    }
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(&args).stdin(Stdio::null());
    if let Some(g) = o.target_gpu {
        cmd.env("CUDA_VISIBLE_DEVICES", g.to_string());
    }
    let _child = Spawned(cmd.spawn()?);
    let end = Instant::now() + Duration::from_secs(60);
    let raddr: u64 = loop {
        if Instant::now() >= end {
            return Err("target did not connect".into());
        }
        if let Ok(n) = a.wait_notifs(Duration::from_millis(100)) {
            if let Some(m) = n.get("nixlbench-target").and_then(|v| v.first()) {
                break String::from_utf8_lossy(m)
                    .strip_prefix("addr:")
                    .ok_or("bad hello")?
                    .parse()?;
            }
        }
    };
    let result = if o.notif {
        notif::run(&a, o, &m, raddr, &stamps)
    } else {
        sweep(&a, o, m.addr, &Remote::Peer(raddr))
    };
    let _ = a.gen_notif("nixlbench-target", b"done", &[]);
    result
}

/// One process: memory <-> a file in `--filepath` through POSIX or GDS.
#[cfg(not(feature = "posix"))]
fn storage(o: &Opts) -> Res<()> {
    Err(format!(
        "--backend {:?} needs the storage backends: cargo bench -p nixl-bench --features posix (gds for GDS)",
        o.backend
    )
    .into())
}

/// One process: memory <-> a file in `--filepath` through POSIX or GDS.
#[cfg(feature = "posix")]
fn storage(o: &Opts) -> Res<()> {
    let a = Agent::new(
        "nixlbench",
        AgentConfig::default().default_timeout(Duration::from_secs(60)),
    )?;
    match o.backend {
        BenchBackend::Posix => {
            a.create_backend(nixl::storage::PosixParams::default())?;
        }
        #[cfg(feature = "gds")]
        BenchBackend::Gds => {
            a.create_backend(nixl::storage::GdsParams::default())?;
        }
        b => return Err(format!("backend {b:?} is not built in (GDS needs feature gds)").into()),
    }
    let m = alloc(o.init_kind, o.total_buffer)?;
    let path = o
        .filepath
        .join(format!("nixlbench-{}.bin", std::process::id()));
    let flags = if o.direct {
        OpenFlags::direct()
    } else {
        OpenFlags::buffered()
    };
    let file = Arc::new(FileRegion::open(&path, o.total_buffer, flags)?);
    let result = (|| -> Res<()> {
        let _reg = a.register_mem(vec![m.region.clone(), file.clone()], &[])?;
        sweep(&a, o, m.addr, &Remote::File(file.clone()))
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Runs every (block, batch) point and prints a row each.
fn sweep(a: &Agent, o: &Opts, laddr: u64, remote: &Remote) -> Res<()> {
    let path = a.path_report(remote.agent(a));
    if !o.json {
        println!(
            "# nixl-rs nixlbench: {:?} {} -> {}, {} thread(s), path {:?}",
            o.op, o.init_kind, o.target_kind, o.threads, path
        );
        println!(
            "{:>10} {:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "block",
            "batch",
            "GB/s",
            "avg_lat_us",
            "prep_avg",
            "prep_p99",
            "post_avg",
            "post_p99",
            "xfer_avg",
            "xfer_p99"
        );
    }
    for &block in &o.blocks {
        for &batch in &o.batches {
            if span(block, batch) * o.threads as u64 > o.total_buffer {
                continue;
            }
            let bytes = block * batch as u64;
            let iters = if o.iters > 0 {
                o.iters
            } else {
                ((o.bytes_per_point / bytes as f64) as usize).clamp(8, 20_000)
            };
            let t0 = Instant::now();
            // One thread runs on this thread, as NIXL's reference does: a fresh thread may
            // start on another core (or NUMA node) than the one that touched the buffers.
            let per_thread: Vec<Res<Times>> = if o.threads == 1 {
                vec![thread_run(a, o, 0, block, batch, laddr, remote, iters)]
            } else {
                std::thread::scope(|s| {
                    let hs: Vec<_> = (0..o.threads)
                        .map(|t| {
                            s.spawn(move || thread_run(a, o, t, block, batch, laddr, remote, iters))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                        .collect()
                })
            };
            let wall = t0.elapsed();
            let mut all = Times::default();
            for t in per_thread {
                let t = t?;
                all.prepare.extend(t.prepare);
                all.post.extend(t.post);
                all.xfer.extend(t.xfer);
            }
            // Bandwidth from transfer time (as NIXL's nixlbench: bytes over summed
            // transfer time per thread, threads added).
            let xsum: f64 =
                all.xfer.iter().map(Duration::as_secs_f64).sum::<f64>() / o.threads as f64;
            let gbps = (bytes * iters as u64 * o.threads as u64) as f64 / xsum.max(1e-12) / 1e9;
            let (med, min) = {
                let mut v = all.xfer.clone();
                v.sort();
                let us = |d: Option<&Duration>| d.copied().unwrap_or_default().as_secs_f64() * 1e6;
                (us(v.get(v.len() / 2)), us(v.first()))
            };
            let (pa, pp) = avg_p99(&mut all.prepare);
            let (qa, qp) = avg_p99(&mut all.post);
            let (xa, xp) = avg_p99(&mut all.xfer);
            if o.json {
                println!(
                    "{{\"impl\": \"nixl-rs\", \"op\": \"{}\", \"block\": {block}, \"batch\": {batch}, \"iters\": {iters}, \"gbps\": {gbps}, \"lat_med_us\": {med}, \"lat_min_us\": {min}, \"lat_p99_us\": {xp}, \"lat_avg_us\": {xa}, \"prep_avg_us\": {pa}, \"post_avg_us\": {qa}, \"wall_s\": {}}}",
                    if o.op == XferOp::Read { "READ" } else { "WRITE" },
                    wall.as_secs_f64()
                );
            } else {
                println!("{block:>10} {batch:>6} {gbps:>9.3} {xa:>10.2} {pa:>10.2} {pp:>10.2} {qa:>10.2} {qp:>10.2} {xa:>10.2} {xp:>10.2}");
            }
        }
    }
    Ok(())
}

fn main() {
    let r = parse().and_then(|o| match (o.role.as_str(), o.peer) {
        ("initiator", _) if o.backend != BenchBackend::Ucx => storage(&o),
        ("initiator", _) => initiator(&o),
        ("target", Some(p)) => target(&o, p),
        _ => Err("--role target needs --peer".into()),
    });
    if let Err(e) = r {
        eprintln!("nixlbench: {e}");
        std::process::exit(1);
    }
}
