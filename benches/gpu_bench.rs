//! GPU transfer benchmark of the `CUDA_IPC` backend: two processes on one host, 1024 blocks per
//! request, VRAM<->VRAM READ/WRITE and DRAM<->VRAM both directions, GB/s printed per case, every
//! byte verified after each case.
//!
//! ```text
//! gpu_bench [--blocks 1024] [--block-sizes 1,2] [--iters 20] [--gpu 0] [--target-gpu 0]
//!           [--out results.jsonl] [--no-copy-kernel] [--kernel-shape SHAPE]
//! gpu_bench --sweep [--blocks 1024] [--block-sizes 1,4] [--iters 10] [--reps 5] [--gpu 0]
//!           [--out sweep.jsonl]
//! ```
//!
//! The process started by the user is the initiator; it spawns itself as the target
//! (`--role target`), which allocates the target VRAM pool, publishes its metadata through a
//! file, and verifies the bytes of the last WRITE before it exits. Block sizes are in MiB.
//! Each case runs "merged" (contiguous blocks become one copy, the default of the agent) and
//! "per-block" (`no_merge`: 1024 segments: the copy kernel for VRAM<->VRAM, one
//! `cuMemcpyBatchAsync` for DRAM<->VRAM, or with `--no-copy-kernel` for both).
//! `--kernel-shape` sets the copy kernel's shape (`nixl_mem::KernelShape`'s text form, e.g.
//! `chunk=512k,ctas=2,threads=1024,unroll=8,load=plain,store=cs,schedule=balanced`).
//!
//! `--sweep` measures the copy kernel itself, one process, no target process: per-block
//! VRAM->VRAM WRITE and READ between two pools of GPU `--gpu` (two agents of this process, so
//! no IPC mapping is involved), `--blocks` blocks of each `--block-sizes` MiB, for every shape
//! of `KernelShape::sweep()` and, for reference, the merged copy (one `cuMemcpyAsync`).
//! Completion is busy-polled, each cell is the median of `--reps` rounds of `--iters` posts,
//! and every cell's bytes are verified (a READ of the WRITE's destination back into the zeroed
//! source, compared with the pattern). It prints a table and the best shape: the one whose
//! slowest cell is fastest.

use std::io::Write as _;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{
    Agent, AgentConfig, MemKind, Result, XferDescList, XferOp, XferOptions, XferTarget,
};
use nixl_mem::{
    CudaIpcParams, DeviceBuffer, HostMemory, KernelShape, MmapBuffer, Pinned, CUDA_IPC,
};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

/// Blocks between two processes' GPU buffers through `CUDA_IPC` (see the module docs).
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "gpu_bench")]
struct Args {
    /// `initiator` (the process the user starts) or `target` (started by the initiator).
    #[arg(long, default_value = "initiator", value_parser = ["initiator", "target"])]
    role: String,
    /// Blocks per request.
    #[arg(long, default_value_t = 1024)]
    blocks: usize,
    /// Block sizes in MiB.
    #[arg(long = "block-sizes", value_delimiter = ',', default_values_t = [1u64, 2])]
    sizes: Vec<u64>,
    /// Posts per round.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// The initiator's GPU.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// The target's GPU.
    #[arg(long, default_value_t = 0)]
    target_gpu: usize,
    /// Where the target writes its metadata (target role).
    #[arg(long, default_value = "")]
    md: String,
    /// Write the results to this file too.
    #[arg(long)]
    out: Option<String>,
    /// Copy engines only (no copy kernel).
    #[arg(long = "no-copy-kernel", action = clap::ArgAction::SetFalse)]
    copy_kernel: bool,
    /// The copy kernel's shape (`chunk=...,ctas_per_sm=...`, any subset).
    #[arg(long, default_value_t = KernelShape::default())]
    kernel_shape: KernelShape,
    /// Sweep kernel shapes and print the best.
    #[arg(long)]
    sweep: bool,
    /// Rounds per cell (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Passed by `cargo bench`-style runners; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn parse() -> Args {
    let a = <Args as clap::Parser>::parse();
    if a.blocks == 0 || a.sizes.is_empty() || a.sizes.contains(&0) || a.iters == 0 || a.reps == 0 {
        <Args as clap::CommandFactory>::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                "blocks, block sizes, iters and reps must be positive",
            )
            .exit();
    }
    a
}

/// The seed-`s` pattern byte at offset `i` (cheap to generate and check in bulk).
fn fill_pattern(buf: &mut [u8], seed: u64) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let x = (i as u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(&mut v, seed);
    v
}

fn main() -> ExitCode {
    let args = parse();
    if let Err(e) = nixl_mem::cuda::driver() {
        println!("gpu_bench: skipped: {e}");
        return ExitCode::SUCCESS;
    }
    let r = if args.role == "target" {
        target(&args)
    } else if args.sweep {
        sweep(&args)
    } else {
        initiator(&args)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_bench ({}): {e}", args.role);
            ExitCode::FAILURE
        }
    }
}

fn max_bytes(a: &Args) -> u64 {
    a.blocks as u64 * a.sizes.iter().max().copied().unwrap_or(1) * MIB
}

/// The target: a VRAM pool, metadata to a file, then waits for `done <seed> <len>` and checks
/// that its pool holds the last WRITE's pattern.
fn target(a: &Args) -> Result<()> {
    let agent = Agent::new("bench-target", AgentConfig::default())?;
    agent.create_backend(CudaIpcParams::default().device(a.target_gpu))?;
    let len = max_bytes(a) as usize;
    let pool = Arc::new(DeviceBuffer::new(a.target_gpu, len)?);
    let _reg = agent.register_mem(vec![pool.clone()], &[])?;
    let tmp = format!("{}.tmp", a.md);
    std::fs::write(&tmp, agent.local_metadata()?)
        .map_err(|e| nixl_core::Error::io("bench-target", nixl_core::Op::LocalMetadata, e))?;
    std::fs::rename(&tmp, &a.md)
        .map_err(|e| nixl_core::Error::io("bench-target", nixl_core::Op::LocalMetadata, e))?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(nixl_core::Error::TimedOut {
                agent: "bench-target".into(),
                op: nixl_core::Op::GetNotifs,
                elapsed: Duration::from_secs(600),
            });
        }
        let n = agent.wait_notifs(left)?;
        for msg in n.get("bench-initiator").into_iter().flatten() {
            let text = String::from_utf8_lossy(msg);
            let mut w = text.split_whitespace();
            if w.next() == Some("done") {
                let seed: u64 = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
                let n: usize = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
                let mut got = vec![0u8; n];
                pool.copy_to_host(0, &mut got)?;
                if got != pattern(n, seed) {
                    return Err(nixl_core::Error::Corrupt {
                        agent: "bench-target".into(),
                        remote: "bench-initiator".into(),
                        op: nixl_core::Op::Wait,
                    });
                }
                println!("target: verified the last WRITE's {n} bytes in its VRAM");
                return Ok(());
            }
        }
    }
}

enum Local {
    Vram(Arc<DeviceBuffer>),
    Dram(Arc<Pinned<MmapBuffer>>),
}

impl Local {
    fn addr(&self) -> u64 {
        match self {
            Local::Vram(b) => b.addr(),
            Local::Dram(b) => b.addr(),
        }
    }
    fn kind(&self) -> MemKind {
        match self {
            Local::Vram(_) => MemKind::Vram,
            Local::Dram(_) => MemKind::Dram,
        }
    }
    fn dev(&self) -> u64 {
        match self {
            Local::Vram(b) => b.ordinal() as u64,
            Local::Dram(_) => 0,
        }
    }
    fn write(&self, data: &[u8]) -> Result<()> {
        match self {
            Local::Vram(b) => Ok(b.copy_from_host(0, data)?),
            Local::Dram(b) => {
                b.write_at(0, data);
                Ok(())
            }
        }
    }
    fn read(&self, out: &mut [u8]) -> Result<()> {
        match self {
            Local::Vram(b) => Ok(b.copy_to_host(0, out)?),
            Local::Dram(b) => {
                b.read_at(0, out);
                Ok(())
            }
        }
    }
}

fn list(kind: MemKind, base: u64, block: u64, n: usize, dev: u64) -> XferDescList {
    XferDescList::from_descs(
        kind,
        (0..n as u64).map(|i| nixl_core::Desc::on_device(base + i * block, block, dev)),
    )
}

struct Case<'a> {
    op: XferOp,
    local: &'a Local,
    name: &'static str,
}

fn initiator(a: &Args) -> Result<()> {
    let io = |e| nixl_core::Error::io("bench-initiator", nixl_core::Op::Exchange, e);
    let dir = std::env::temp_dir().join(format!("nixl-gpu-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let md = dir.join("target.md");
    let exe = std::env::current_exe().map_err(io)?;
    let mut child = Command::new(exe)
        .args([
            "--role",
            "target",
            "--md",
            &md.display().to_string(),
            "--blocks",
            &a.blocks.to_string(),
        ])
        .args([
            "--block-sizes",
            &a.sizes
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ])
        .args(["--target-gpu", &a.target_gpu.to_string()])
        .spawn()
        .map_err(io)?;
    let r = run_initiator(a, &md);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        match child.try_wait().map_err(io)? {
            Some(s) => break Some(s),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    r?;
    match status {
        Some(s) if s.success() => Ok(()),
        other => Err(nixl_core::Error::backend(
            "bench-initiator",
            CUDA_IPC,
            nixl_core::Op::Wait,
            format!("target process ended with {other:?}"),
        )),
    }
}

fn run_initiator(a: &Args, md: &std::path::Path) -> Result<()> {
    let agent = Agent::new("bench-initiator", AgentConfig::default())?;
    agent.create_backend(
        CudaIpcParams::default()
            .device(a.gpu)
            .copy_kernel(a.copy_kernel)
            .kernel_shape(a.kernel_shape),
    )?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let bytes = loop {
        if let Ok(b) = std::fs::read(md) {
            break b;
        }
        if Instant::now() >= deadline {
            return Err(nixl_core::Error::TimedOut {
                agent: "bench-initiator".into(),
                op: nixl_core::Op::Exchange,
                elapsed: Duration::from_secs(120),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let peer = agent.load_remote_metadata(&bytes)?;
    let md = nixl_core::AgentMetadata::decode_bytes(&bytes).map_err(|source| {
        nixl_core::Error::Decode {
            agent: "bench-initiator".into(),
            op: nixl_core::Op::LoadMetadata,
            source,
        }
    })?;
    let remote_base = md
        .regions
        .iter()
        .find(|r| r.desc.kind == MemKind::Vram)
        .map(|r| r.desc.addr)
        .ok_or_else(|| {
            nixl_core::Error::not_found(
                "bench-initiator",
                nixl_core::Op::LoadMetadata,
                "target VRAM region",
            )
        })?;
    let len = max_bytes(a) as usize;
    let vram_buf = Arc::new(DeviceBuffer::new(a.gpu, len)?);
    let dram_buf = Arc::new(Pinned::new(MmapBuffer::huge_or_fallback(len)?)?);
    let scratch = Arc::new(DeviceBuffer::new(a.gpu, len)?);
    let _r1 = agent.register_mem(vec![vram_buf.clone(), scratch.clone()], &[])?;
    let _r2 = agent.register_mem(vec![dram_buf.clone()], &[])?;
    let (vram, dram) = (Local::Vram(vram_buf), Local::Dram(dram_buf));
    println!(
        "{}",
        agent
            .path_report(&peer)
            .iter()
            .map(|(b, p)| format!("{b}: {p}"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "{:<22} {:>9} {:>7} {:>10} {:>12} {:>10}  path",
        "case", "block", "blocks", "mode", "GB/s", "verified"
    );
    let mut out = match &a.out {
        Some(p) => Some(
            std::fs::File::create(p)
                .map_err(|e| nixl_core::Error::io("bench-initiator", nixl_core::Op::Exchange, e))?,
        ),
        None => None,
    };
    let cases = [
        Case {
            op: XferOp::Write,
            local: &vram,
            name: "VRAM->VRAM WRITE",
        },
        Case {
            op: XferOp::Read,
            local: &vram,
            name: "VRAM<-VRAM READ",
        },
        Case {
            op: XferOp::Write,
            local: &dram,
            name: "DRAM->VRAM WRITE",
        },
        Case {
            op: XferOp::Read,
            local: &dram,
            name: "DRAM<-VRAM READ",
        },
    ];
    let mut seed = 1u64;
    // What the target's pool holds last (seed, bytes), for its own check at the end.
    let mut last_write = (0u64, 0usize);
    for &block_mib in &a.sizes {
        let block = block_mib * MIB;
        let total = block as usize * a.blocks;
        for c in &cases {
            for no_merge in [false, true] {
                seed += 1;
                // Source pattern: local for WRITE; for READ, put it in the target with a WRITE
                // from the scratch buffer first (verified below by the READ itself).
                let src = pattern(total, seed);
                let remote = list(
                    MemKind::Vram,
                    remote_base,
                    block,
                    a.blocks,
                    a.target_gpu as u64,
                );
                match c.op {
                    XferOp::Write => c.local.write(&src)?,
                    XferOp::Read => {
                        scratch.copy_from_host(0, &src)?;
                        let l = list(MemKind::Vram, scratch.addr(), block, a.blocks, a.gpu as u64);
                        let req = agent.create_xfer_req(
                            XferOp::Write,
                            &l,
                            &remote,
                            &peer,
                            XferOptions::default(),
                        )?;
                        agent.post_xfer_req(&req)?;
                        req.wait(WAIT)?;
                        c.local.write(&vec![0u8; total])?;
                    }
                }
                last_write = (seed, total);
                let local_list = list(
                    c.local.kind(),
                    c.local.addr(),
                    block,
                    a.blocks,
                    c.local.dev(),
                );
                let lp = agent.prep_xfer_dlist(XferTarget::Initiator, &local_list, &[])?;
                let rp = agent.prep_xfer_dlist(XferTarget::Agent(&peer), &remote, &[])?;
                let idx: Vec<usize> = (0..a.blocks).collect();
                let req = agent.make_prepped_xfer(
                    c.op,
                    &lp,
                    &idx,
                    &rp,
                    &idx,
                    XferOptions::default().no_merge(no_merge),
                )?;
                // Warm up, then time `iters` back-to-back post+wait rounds.
                for _ in 0..2 {
                    agent.post_xfer_req(&req)?;
                    req.wait(WAIT)?;
                }
                let t0 = Instant::now();
                for _ in 0..a.iters {
                    agent.post_xfer_req(&req)?;
                    req.wait(WAIT)?;
                }
                let secs = t0.elapsed().as_secs_f64();
                let gbps = (total as f64 * a.iters as f64) / secs / 1e9;
                // Verify every byte.
                let ok = match c.op {
                    XferOp::Read => {
                        let mut got = vec![0u8; total];
                        c.local.read(&mut got)?;
                        got == src
                    }
                    XferOp::Write => {
                        // Read the target back into the zeroed scratch buffer.
                        scratch.fill(0)?;
                        let l = list(MemKind::Vram, scratch.addr(), block, a.blocks, a.gpu as u64);
                        let back = agent.create_xfer_req(
                            XferOp::Read,
                            &l,
                            &remote,
                            &peer,
                            XferOptions::default(),
                        )?;
                        agent.post_xfer_req(&back)?;
                        back.wait(WAIT)?;
                        let mut got = vec![0u8; total];
                        scratch.copy_to_host(0, &mut got)?;
                        got == src
                    }
                };
                let mode = if no_merge { "per-block" } else { "merged" };
                println!(
                    "{:<22} {:>6} MiB {:>7} {:>10} {:>12.1} {:>10}  {}",
                    c.name,
                    block_mib,
                    a.blocks,
                    mode,
                    gbps,
                    if ok { "yes" } else { "NO" },
                    req.path()
                );
                if let Some(f) = out.as_mut() {
                    let _ = writeln!(
                        f,
                        "{{\"case\":\"{}\",\"block_bytes\":{},\"blocks\":{},\"mode\":\"{}\",\"iters\":{},\"gbps\":{:.2},\"verified\":{},\"path\":\"{}\",\"gpu\":{},\"target_gpu\":{}}}",
                        c.name, block, a.blocks, mode, a.iters, gbps, ok, req.path(), a.gpu, a.target_gpu
                    );
                }
                if !ok {
                    return Err(nixl_core::Error::Corrupt {
                        agent: "bench-initiator".into(),
                        remote: peer.clone(),
                        op: nixl_core::Op::Wait,
                    });
                }
            }
        }
    }
    // The target checks the last WRITE's bytes itself before exiting.
    let (s, n) = last_write;
    agent.gen_notif(&peer, format!("done {s} {n}").as_bytes(), &[])?;
    Ok(())
}

/// Posts `req` and busy-polls it to completion (bounded by [`WAIT`]).
fn post_and_spin(agent: &Agent, req: &nixl_core::XferReq) -> Result<()> {
    agent.post_xfer_req(req)?;
    let deadline = Instant::now() + WAIT;
    loop {
        if agent.check_xfer_state(req)? == nixl_core::XferState::Done {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(nixl_core::Error::TimedOut {
                agent: "bench-sweep".into(),
                op: nixl_core::Op::Wait,
                elapsed: WAIT,
            });
        }
        std::hint::spin_loop();
    }
}

/// The median of `reps` rounds of `iters` posts of `req` (after two warm-up posts), in GB/s
/// of `bytes` per post, and every round's value.
fn measure(
    agent: &Agent,
    req: &nixl_core::XferReq,
    bytes: usize,
    a: &Args,
) -> Result<(f64, Vec<f64>)> {
    for _ in 0..2 {
        post_and_spin(agent, req)?;
    }
    let mut rounds = Vec::with_capacity(a.reps);
    for _ in 0..a.reps {
        let t0 = Instant::now();
        for _ in 0..a.iters {
            post_and_spin(agent, req)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        rounds.push(bytes as f64 * a.iters as f64 / secs / 1e9);
    }
    let mut sorted = rounds.clone();
    sorted.sort_by(f64::total_cmp);
    Ok((sorted[sorted.len() / 2], rounds))
}

/// "1056" from a path's "(8192 chunks, 1056 CTAs)", or "-".
fn ctas_of(path: &str) -> String {
    path.split_once(" chunks, ")
        .and_then(|(_, rest)| rest.split_once(" CTAs)"))
        .map_or("-".to_owned(), |(n, _)| n.to_owned())
}

/// One row of the sweep: a name, the shape (None: merged), GB/s per (size, op) cell.
struct Row {
    name: String,
    shape: Option<KernelShape>,
    ctas: String,
    cells: Vec<f64>,
    verified: bool,
    /// For a shape: the path of a request that did not run on the copy kernel.
    fallback: Option<String>,
}

fn sweep(a: &Args) -> Result<()> {
    let io = |e| nixl_core::Error::io("bench-sweep", nixl_core::Op::Exchange, e);
    let len = max_bytes(a) as usize;
    let orig = DeviceBuffer::new(a.gpu, len)?;
    let src = Arc::new(DeviceBuffer::new(a.gpu, len)?);
    let dst = Arc::new(DeviceBuffer::new(a.gpu, len)?);
    let pat = pattern(len, 7);
    orig.copy_from_host(0, &pat)?;
    let target = Agent::new("sweep-target", AgentConfig::default())?;
    target.create_backend(CudaIpcParams::default().device(a.gpu))?;
    let _rt = target.register_mem(vec![dst.clone()], &[])?;
    let target_md = target.local_metadata()?;
    let mut out = match &a.out {
        Some(p) => Some(std::fs::File::create(p).map_err(io)?),
        None => None,
    };
    let mut back = vec![0u8; len];
    let mut configs: Vec<(String, Option<KernelShape>)> = vec![("merged".to_owned(), None)];
    configs.extend(
        KernelShape::sweep()
            .into_iter()
            .map(|(n, s)| (n.to_owned(), Some(s))),
    );
    println!(
        "sweep: per-block VRAM<->VRAM on GPU {}, {} blocks per request, median of {} x {} posts, busy-polled",
        a.gpu, a.blocks, a.reps, a.iters
    );
    let mut rows = Vec::new();
    for (i, (name, shape)) in configs.iter().enumerate() {
        let agent = Agent::new(&format!("sweep-{i}"), AgentConfig::default())?;
        agent.create_backend(
            CudaIpcParams::default()
                .device(a.gpu)
                .kernel_shape(shape.unwrap_or_default()),
        )?;
        let _r = agent.register_mem(vec![src.clone()], &[])?;
        let peer = agent.load_remote_metadata(&target_md)?;
        let mut row = Row {
            name: name.clone(),
            shape: *shape,
            ctas: "-".into(),
            cells: Vec::new(),
            verified: true,
            fallback: None,
        };
        for &mib in &a.sizes {
            let block = mib * MIB;
            let total = block as usize * a.blocks;
            let local = list(MemKind::Vram, src.addr(), block, a.blocks, a.gpu as u64);
            let remote = list(MemKind::Vram, dst.addr(), block, a.blocks, a.gpu as u64);
            let opts = || XferOptions::default().no_merge(shape.is_some());
            // WRITE the pattern into the zeroed destination pool, then READ it back into the
            // zeroed source pool: the source then holds the pattern only if both copied right.
            src.copy_from_device(0, &orig, 0, total)?;
            dst.fill(0)?;
            let w = agent.create_xfer_req(XferOp::Write, &local, &remote, &peer, opts())?;
            let (wg, wr) = measure(&agent, &w, total, a)?;
            src.fill(0)?;
            let r = agent.create_xfer_req(XferOp::Read, &local, &remote, &peer, opts())?;
            let (rg, rr) = measure(&agent, &r, total, a)?;
            src.copy_to_host(0, &mut back[..total])?;
            let ok = back[..total] == pat[..total];
            if !ok {
                dst.copy_to_host(0, &mut back[..total])?;
                let w_ok = back[..total] == pat[..total];
                eprintln!(
                    "sweep: {name} at {mib} MiB: bytes differ after {}",
                    if w_ok { "the READ" } else { "the WRITE" }
                );
            }
            row.verified &= ok;
            if row.ctas == "-" {
                row.ctas = ctas_of(&w.path());
            }
            for p in [w.path(), r.path()] {
                if shape.is_some() && !p.contains("copy kernel x") && row.fallback.is_none() {
                    eprintln!("sweep: {name} did not run on the copy kernel: {p}");
                    row.fallback = Some(p);
                }
            }
            row.cells.extend([wg, rg]);
            for (op, g, rounds, path) in [("WRITE", wg, wr, w.path()), ("READ", rg, rr, r.path())] {
                if let Some(f) = out.as_mut() {
                    let _ = writeln!(
                        f,
                        "{{\"sweep\":true,\"config\":\"{name}\",\"shape\":\"{}\",\"op\":\"{op}\",\"block_bytes\":{block},\"blocks\":{},\"iters\":{},\"gbps\":{g:.2},\"rounds\":{rounds:.2?},\"verified\":{ok},\"path\":\"{path}\",\"gpu\":{}}}",
                        shape.map_or("merged".to_owned(), |s| s.to_string()),
                        a.blocks,
                        a.iters,
                        a.gpu
                    );
                }
            }
        }
        eprintln!(
            "sweep: {name}: {:.1?} GB/s{}",
            row.cells,
            if row.verified { "" } else { " NOT VERIFIED" }
        );
        rows.push(row);
    }
    // The table.
    let mut head = format!("{:<20} {:>5}", "config", "CTAs");
    for &mib in &a.sizes {
        head += &format!(
            " {:>9} {:>9}",
            format!("{mib}M WRITE"),
            format!("{mib}M READ")
        );
    }
    println!("{head} {:>9} {:>8}  shape", "min", "verified");
    let min_of = |r: &Row| r.cells.iter().copied().fold(f64::INFINITY, f64::min);
    for r in &rows {
        let mut line = format!("{:<20} {:>5}", r.name, r.ctas);
        for c in &r.cells {
            line += &format!(" {c:>9.1}");
        }
        println!(
            "{line} {:>9.1} {:>8}  {}",
            min_of(r),
            if r.verified { "yes" } else { "NO" },
            r.shape
                .map_or("cuMemcpyAsync x1 (reference)".to_owned(), |s| s.to_string())
        );
        if let Some(p) = &r.fallback {
            println!("{:<20} not the copy kernel: {p}", "");
        }
    }
    let best = rows
        .iter()
        .filter(|r| r.shape.is_some() && r.verified && r.fallback.is_none())
        .max_by(|x, y| min_of(x).total_cmp(&min_of(y)));
    match best {
        Some(b) => println!(
            "best: {} (slowest cell {:.1} GB/s): kernel_shape={}",
            b.name,
            min_of(b),
            b.shape.map(|s| s.to_string()).unwrap_or_default()
        ),
        None => println!("best: none (no kernel shape verified)"),
    }
    if rows.iter().all(|r| r.verified) {
        Ok(())
    } else {
        Err(nixl_core::Error::Corrupt {
            agent: "bench-sweep".into(),
            remote: "sweep-target".into(),
            op: nixl_core::Op::Wait,
        })
    }
}
