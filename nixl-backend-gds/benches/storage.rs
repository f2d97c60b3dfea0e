//! DRAM <-> FILE throughput of the POSIX backend, in the patterns NIXL's POSIX plugin is
//! measured with (`benches/reference/nixl_posix.py` runs the same patterns on NIXL 1.5.1).
//!
//! ```text
//! cargo bench -p nixl-backend-gds --bench storage -- [--dir PATH] [--iters N] [--engine auto|threadpool]
//! ```
//! Each pattern: a file of 1 GiB, `count` blocks of `block` bytes per request; iteration `i`
//! targets the next `count * block` bytes of the file (wrapping), so O_DIRECT reads come from
//! the device rather than a cache of the same offsets. Throughput = bytes moved / wall time of
//! post + wait over all iterations (after one warm-up iteration).

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_gds::{Engine, FileRegion, OpenFlags, PosixParams};
use nixl_core::{
    Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferTarget,
};

const FILE_SIZE: u64 = 1 << 30;

struct Pattern {
    name: &'static str,
    direct: bool,
    block: u64,
    count: usize,
    ops: &'static [XferOp],
}

const PATTERNS: &[Pattern] = &[
    Pattern {
        name: "O_DIRECT 16 MiB x1",
        direct: true,
        block: 16 << 20,
        count: 1,
        ops: &[XferOp::Write, XferOp::Read],
    },
    Pattern {
        name: "O_DIRECT 1 MiB x32",
        direct: true,
        block: 1 << 20,
        count: 32,
        ops: &[XferOp::Write, XferOp::Read],
    },
    Pattern {
        name: "page cache 1 MiB x1",
        direct: false,
        block: 1 << 20,
        count: 1,
        ops: &[XferOp::Write, XferOp::Read],
    },
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut dir = std::env::temp_dir();
    let mut iters = 40usize;
    let mut engine = Engine::Auto;
    let mut params = PosixParams::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = args.next().ok_or("--dir PATH")?.into(),
            "--iters" => iters = args.next().ok_or("--iters N")?.parse()?,
            "--engine" => {
                engine = match args.next().as_deref() {
                    Some("threadpool") => Engine::ThreadPool,
                    Some("io_uring") => Engine::IoUring,
                    _ => Engine::Auto,
                }
            }
            "--chunk-kib" => {
                params.chunk_size = args.next().ok_or("--chunk-kib N")?.parse::<u64>()? << 10
            }
            "--qd" => params.queue_depth = args.next().ok_or("--qd N")?.parse()?,
            "--inline-kib" => {
                params.inline_max = args.next().ok_or("--inline-kib N")?.parse::<u64>()? << 10
            }
            "--bench" => {}
            _ => {}
        }
    }
    let agent = Agent::new("bench", AgentConfig::default())?;
    agent.create_backend(PosixParams {
        engine,
        ..params.clone()
    })?;
    println!(
        "chunk {} KiB, queue depth {}, inline up to {} KiB",
        params.chunk_size >> 10,
        params.queue_depth,
        params.inline_max >> 10
    );
    println!(
        "nixl-rs POSIX ({}), {iters} iterations per point, files in {}",
        agent
            .path_report("bench")
            .first()
            .map(|p| p.1.clone())
            .unwrap_or_default(),
        dir.display()
    );
    println!("{:<22} {:<6} {:>10}", "pattern", "op", "GB/s");
    for p in PATTERNS {
        let path = dir.join(format!(
            "nixl-rs-bench-{}-{}.bin",
            std::process::id(),
            p.direct
        ));
        let flags = if p.direct {
            OpenFlags::direct()
        } else {
            OpenFlags::buffered()
        };
        let file = Arc::new(FileRegion::open(&path, FILE_SIZE, flags)?);
        let total = p.block * p.count as u64;
        let buf = Arc::new(HostBuffer::new(total as usize).ok_or("alloc")?);
        buf.fill_pattern(1);
        let _reg = agent.register_mem(vec![buf.clone(), file.clone()], &[])?;
        let local = agent.prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, buf.addr(), p.block, p.count),
            &[],
        )?;
        // One prepared file list covering the whole file; requests pick consecutive blocks.
        let nblocks = (FILE_SIZE / p.block) as usize;
        let remote = agent.prep_xfer_dlist(
            XferTarget::Agent("bench"),
            &file.blocks(0, p.block, nblocks),
            &[],
        )?;
        let lidx: Vec<usize> = (0..p.count).collect();
        // Requests for each window of the file, built once (NIXL's prepared-request model).
        let windows = nblocks / p.count;
        for &op in p.ops {
            let reqs: Vec<_> = (0..windows.min(iters + 1))
                .map(|w| {
                    let ridx: Vec<usize> = (w * p.count..(w + 1) * p.count).collect();
                    agent.make_prepped_xfer(
                        op,
                        &local,
                        &lidx,
                        &remote,
                        &ridx,
                        XferOptions::default(),
                    )
                })
                .collect::<Result<_, _>>()?;
            // Warm-up (and, for READ through the page cache, populate the cache).
            for r in &reqs {
                agent.post_xfer_req(r)?;
                r.wait(Duration::from_secs(60))?;
            }
            let t = Instant::now();
            for i in 0..iters {
                let r = &reqs[i % reqs.len()];
                agent.post_xfer_req(r)?;
                r.wait(Duration::from_secs(60))?;
            }
            let el = t.elapsed();
            let gbps = (total * iters as u64) as f64 / el.as_secs_f64() / 1e9;
            println!(
                "{:<22} {:<6} {:>10.2}",
                p.name,
                format!("{op:?}").to_uppercase(),
                gbps
            );
        }
        drop(_reg);
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
