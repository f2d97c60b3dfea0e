//! Paged KV blocks between two processes' GPU pools through `CUDA_IPC`, as a decode rank moves
//! them: `--blocks` blocks per request (2048), each block one block apart from the next on
//! both sides and the remote slots shuffled (nothing merges: one copy per block), WRITE and
//! READ, for each `--block-bytes` size; GB/s per cell (median of `--reps` rounds of `--iters`
//! posts of one prepared request, completion busy-polled), every byte verified after each cell.
//! The same layout and timing as `benches/reference/nixl_paged_gpu.py` (NIXL's Python API),
//! which the GPU script runs in the same call.
//!
//! ```text
//! paged_bench --gpu 1 --target-gpu 0 [--blocks 2048] [--block-bytes 4096,16384,65536,1048576]
//!             [--iters 20] [--reps 5] [--json out.jsonl]
//! ```
//! The process started by the user is the initiator (its pool on `--gpu`); it starts itself as
//! the target (`--role target`, its pool on `--target-gpu`).

use std::io::Write as _;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{Agent, AgentConfig, Desc, MemKind, Result, XferDescList, XferOp, XferOptions};
use nixl_mem::{CudaIpcParams, DeviceBuffer};

const WAIT: Duration = Duration::from_secs(120);

/// Paged KV blocks between two processes' GPU pools through `CUDA_IPC`.
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "paged_bench")]
struct Args {
    /// `initiator` (the process the user starts) or `target` (started by the initiator).
    #[arg(long, default_value = "initiator", value_parser = ["initiator", "target"])]
    role: String,
    /// The initiator's GPU.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// The target's GPU.
    #[arg(long, default_value_t = 1)]
    target_gpu: usize,
    /// Blocks per request.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    blocks: u64,
    /// Block sizes in bytes.
    #[arg(long = "block-bytes", value_delimiter = ',', default_values_t = [4096u64, 16384, 65536, 1 << 20], required = false, value_parser = clap::value_parser!(u64).range(1..))]
    sizes: Vec<u64>,
    /// Posts per round.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Rounds per cell (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Milliseconds the GPU sits idle before each post (0: posts back to back). With a gap,
    /// each post is timed alone (post to done, the gap excluded): what a request pays when it
    /// finds the GPU idle, as a serving engine's request after host-side work does.
    #[arg(long, default_value_t = 0)]
    idle_ms: u64,
    /// Where the target writes its metadata (target role).
    #[arg(long, default_value = "")]
    md: String,
    /// Append one JSON line per cell to this file.
    #[arg(long)]
    json: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The pool both sides allocate: the largest size's blocks, one block apart.
fn pool_len(a: &Args) -> usize {
    (2 * a.blocks * a.sizes.iter().max().copied().unwrap_or(4096)) as usize
}

/// Remote slot of local block `i` (a permutation of `0..n`).
fn perm(i: u64, n: u64) -> u64 {
    // 2654435761 is odd, so i -> i * k mod n is a permutation whenever n is a power of two;
    // for other n fall back to a rotation.
    if n.is_power_of_two() {
        (i.wrapping_mul(2_654_435_761) + 7) & (n - 1)
    } else {
        (i + n / 3) % n
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, c) in v.chunks_mut(8).enumerate() {
        let x = (i as u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

fn main() -> ExitCode {
    let a = <Args as clap::Parser>::parse();
    if let Err(e) = nixl_mem::cuda::driver() {
        println!("paged_bench: skipped: {e}");
        return ExitCode::SUCCESS;
    }
    let r = if a.role == "target" {
        target(&a)
    } else {
        initiator(&a)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paged_bench ({}): {e}", a.role);
            ExitCode::FAILURE
        }
    }
}

fn io(e: std::io::Error) -> nixl_core::Error {
    nixl_core::Error::io("paged-bench", nixl_core::Op::Exchange, e)
}

/// The target: its pool, its metadata in a file, then it waits for "done".
fn target(a: &Args) -> Result<()> {
    let agent = Agent::new("paged-target", AgentConfig::default())?;
    agent.create_backend(CudaIpcParams::default().device(a.target_gpu))?;
    let pool = Arc::new(DeviceBuffer::new(a.target_gpu, pool_len(a))?);
    let _reg = agent.register_mem(vec![pool.clone()], &[])?;
    let tmp = format!("{}.tmp", a.md);
    std::fs::write(&tmp, agent.local_metadata()?).map_err(io)?;
    std::fs::rename(&tmp, &a.md).map_err(io)?;
    let end = Instant::now() + Duration::from_secs(900);
    while Instant::now() < end {
        let n = agent.wait_notifs(Duration::from_secs(1));
        if let Ok(n) = n {
            if n.values().flatten().any(|m| m.as_slice() == b"done") {
                return Ok(());
            }
        }
    }
    Ok(())
}

fn initiator(a: &Args) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("nixl-paged-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let md = dir.join("target.md");
    let exe = std::env::current_exe().map_err(io)?;
    let mut child = Command::new(exe)
        .args(["--role", "target", "--md", &md.display().to_string()])
        .args(["--gpu", &a.gpu.to_string()])
        .args(["--target-gpu", &a.target_gpu.to_string()])
        .args(["--blocks", &a.blocks.to_string()])
        .args([
            "--block-bytes",
            &a.sizes
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ])
        .spawn()
        .map_err(io)?;
    let r = measure(a, &md);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn measure(a: &Args, md: &std::path::Path) -> Result<()> {
    let end = Instant::now() + WAIT;
    while !md.exists() {
        if Instant::now() > end {
            return Err(nixl_core::Error::TimedOut {
                agent: "paged-initiator".into(),
                op: nixl_core::Op::LoadMetadata,
                elapsed: WAIT,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let agent = Agent::new("paged-initiator", AgentConfig::default())?;
    agent.create_backend(CudaIpcParams::default().device(a.gpu))?;
    let peer = agent.load_remote_metadata(&std::fs::read(md).map_err(io)?)?;
    let rbase = agent
        .remote_regions(&peer)?
        .first()
        .map(|r| r.addr)
        .ok_or_else(|| {
            nixl_core::Error::not_found(
                "paged-initiator",
                nixl_core::Op::LoadMetadata,
                "no remote pool",
            )
        })?;
    let len = pool_len(a);
    let src = Arc::new(DeviceBuffer::new(a.gpu, len)?);
    let back = Arc::new(DeviceBuffer::new(a.gpu, len)?);
    let _reg = agent.register_mem(vec![src.clone(), back.clone()], &[])?;
    let mut out = match &a.json {
        Some(p) => Some(std::fs::File::create(p).map_err(io)?),
        None => None,
    };
    println!(
        "paged_bench: initiator GPU {} <-> target GPU {}, {} blocks per request, one block apart, shuffled{}",
        a.gpu,
        a.target_gpu,
        a.blocks,
        if a.idle_ms > 0 {
            format!("; the GPU idle {} ms before each post (timed alone)", a.idle_ms)
        } else {
            String::new()
        }
    );
    for (k, &blk) in a.sizes.iter().enumerate() {
        let n = a.blocks;
        let data = pattern(len, k as u64 + 1);
        src.copy_from_host(0, &data)?;
        let slots = |base: u64, remote: bool, dev: usize| {
            XferDescList::from_descs(
                MemKind::Vram,
                (0..n).map(move |i| {
                    let s = if remote { perm(i, n) } else { i };
                    Desc::on_device(base + 2 * s * blk, blk, dev as u64)
                }),
            )
        };
        let opts = XferOptions::default().no_merge(true);
        for (op, local) in [(XferOp::Write, &src), (XferOp::Read, &back)] {
            let l = slots(local.addr(), false, a.gpu);
            let r = slots(rbase, true, a.target_gpu);
            let req = agent.create_xfer_req(op, &l, &r, &peer, opts.clone())?;
            // Warm up (JIT, mappings), then rounds.
            for _ in 0..2 {
                agent.post_xfer_req(&req)?;
                req.wait(WAIT)?;
            }
            let mut rates = Vec::with_capacity(a.reps as usize);
            for _ in 0..a.reps {
                let mut busy = Duration::ZERO;
                for _ in 0..a.iters {
                    if a.idle_ms > 0 {
                        std::thread::sleep(Duration::from_millis(a.idle_ms));
                    }
                    let t = Instant::now();
                    agent.post_xfer_req(&req)?;
                    while agent.check_xfer_state(&req)? != nixl_core::XferState::Done {}
                    busy += t.elapsed();
                }
                rates.push((a.iters * n * blk) as f64 / busy.as_secs_f64() / 1e9);
            }
            rates.sort_by(|x, y| x.total_cmp(y));
            let gbs = rates[rates.len() / 2];
            let path = req.path();
            // Every byte: after a WRITE the remote slots hold the source blocks; a READ brings
            // them back into `back` at the local slots.
            let ok = if op == XferOp::Read {
                let mut got = vec![0u8; len];
                back.copy_to_host(0, &mut got)?;
                (0..n).all(|i| {
                    let o = (2 * i * blk) as usize;
                    got[o..o + blk as usize] == data[o..o + blk as usize]
                })
            } else {
                true
            };
            if !ok {
                return Err(nixl_core::Error::Corrupt {
                    agent: "paged-initiator".into(),
                    remote: peer.clone(),
                    op: nixl_core::Op::Wait,
                });
            }
            println!(
                "{op:5} {blk:>8} B x {n}: {gbs:8.2} GB/s (rounds {:.2}..{:.2}){}  path: {path}",
                rates[0],
                rates[rates.len() - 1],
                if op == XferOp::Read {
                    ", every byte verified"
                } else {
                    ""
                }
            );
            if let Some(f) = out.as_mut() {
                writeln!(
                    f,
                    "{{\"impl\":\"nixl-rs\",\"op\":\"{op}\",\"gpu\":{},\"target_gpu\":{},\"block_bytes\":{blk},\"blocks\":{n},\"idle_ms\":{},\"gbs\":{gbs:.3},\"path\":{:?}}}",
                    a.gpu, a.target_gpu, a.idle_ms, path
                )
                .map_err(io)?;
            }
        }
    }
    agent.gen_notif(&peer, b"done", &[])?;
    Ok(())
}
