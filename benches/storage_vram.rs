//! VRAM <-> FILE throughput with `O_DIRECT`: (a) the POSIX backend's pinned bounce engine,
//! (b) the GDS backend (cuFile, or its bounce fallback where cuFile refuses the file; the path
//! column says which), (c) the baseline a user writes by hand: `cuMemcpy` into one pinned host
//! buffer then `pwrite` (and `pread` then `cuMemcpy`), one descriptor after another.
//!
//! ```text
//! cargo bench -p nixl-bench --features gds --bench storage_vram -- \
//!     [--dir PATH] [--size-mib 64,256] [--block-mib 1,16] [--iters N]
//!     [--bounce-chunk-mib N] [--threads N] [--only-posix]
//! ```
//! Each point moves `size` bytes in descriptors of `block` bytes per request (one request),
//! `iters` times after one warm-up; GB/s = bytes / wall time of post + wait. Without a GPU it
//! prints why and exits 0.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_gds::{FileRegion, OpenFlags, PosixParams, POSIX};
use nixl_core::{Agent, AgentConfig, Desc, MemKind, XferDescList, XferOp, XferOptions};
use nixl_mem::{CudaHostBuffer, DeviceBuffer, HostMemory};

const MIB: u64 = 1 << 20;
const T: Duration = Duration::from_secs(300);

fn op_name(op: XferOp) -> &'static str {
    match op {
        XferOp::Write => "VRAM->FILE",
        XferOp::Read => "FILE->VRAM",
    }
}

/// One request of `size / block` descriptors through `backend`; GB/s over `iters` posts.
#[allow(clippy::too_many_arguments)]
fn agent_point(
    a: &Agent,
    backend: &str,
    op: XferOp,
    dev: &DeviceBuffer,
    file: &FileRegion,
    size: u64,
    block: u64,
    iters: usize,
) -> Result<(f64, String), Box<dyn std::error::Error>> {
    let n = (size / block) as usize;
    let local = XferDescList::from_descs(
        MemKind::Vram,
        (0..n as u64).map(|i| Desc::on_device(dev.addr() + i * block, block, dev.ordinal() as u64)),
    );
    let req = a.create_xfer_req(
        op,
        &local,
        &file.blocks(0, block, n),
        a.name(),
        XferOptions::default().backends(a.backend(backend).into_iter().collect()),
    )?;
    let mut spent = Duration::ZERO;
    for i in 0..=iters {
        let t = Instant::now();
        a.post_xfer_req(&req)?;
        req.wait(T)?;
        if i > 0 {
            spent += t.elapsed();
        }
    }
    Ok((
        (size * iters as u64) as f64 / spent.as_secs_f64() / 1e9,
        req.path(),
    ))
}

/// The hand-written baseline: per descriptor, a synchronous copy into one pinned buffer and a
/// `pwrite` (or `pread` and a copy), sequential.
fn baseline_point(
    op: XferOp,
    dev: &DeviceBuffer,
    file: &FileRegion,
    pinned: &CudaHostBuffer,
    size: u64,
    block: u64,
    iters: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    // SAFETY: the pinned buffer is at least `block` bytes, owned here and used by this thread
    // only; no device copy is in flight when the slice is used (the copies are synchronous).
    let host = unsafe { std::slice::from_raw_parts_mut(pinned.as_ptr(), block as usize) };
    let f = file.file();
    let mut spent = Duration::ZERO;
    for i in 0..=iters {
        let t = Instant::now();
        for k in 0..size / block {
            let (off, foff) = ((k * block) as usize, k * block);
            match op {
                XferOp::Write => {
                    dev.copy_to_host(off, host)?;
                    f.write_all_at(host, foff)?;
                }
                XferOp::Read => {
                    f.read_exact_at(host, foff)?;
                    dev.copy_from_host(off, host)?;
                }
            }
        }
        if i > 0 {
            spent += t.elapsed();
        }
    }
    Ok((size * iters as u64) as f64 / spent.as_secs_f64() / 1e9)
}

/// VRAM <-> FILE throughput of the POSIX bounce engine (and GDS, with the `gds` feature).
#[derive(clap::Parser, Debug)]
#[command(name = "storage_vram")]
struct Args {
    /// Directory of the test file (O_DIRECT).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: std::path::PathBuf,
    /// Request sizes in MiB.
    #[arg(long = "size-mib", value_delimiter = ',', default_values_t = [64u64, 256])]
    sizes: Vec<u64>,
    /// Blocks per request.
    #[arg(long = "block-mib", value_delimiter = ',', default_values_t = [1u64, 16])]
    blocks: Vec<u64>,
    /// Iterations per point.
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// The bounce engine's chunk in MiB.
    #[arg(long)]
    bounce_chunk_mib: Option<u64>,
    /// Thread-pool threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Measure POSIX only (not GDS).
    #[arg(long)]
    only_posix: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = <Args as clap::Parser>::parse();
    let (dir, sizes, blocks, iters, only_posix) = (
        args.dir,
        args.sizes,
        args.blocks,
        args.iters,
        args.only_posix,
    );
    let mut pp = PosixParams::default();
    if let Some(m) = args.bounce_chunk_mib {
        pp.bounce_chunk = m << 20;
    }
    if let Some(n) = args.threads {
        pp.pool_threads = n;
    }
    let max = sizes.iter().copied().max().unwrap_or(0) * MIB;
    let dev = match DeviceBuffer::new(0, max as usize) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            println!("storage_vram: skipped: no CUDA device buffer: {e}");
            return Ok(());
        }
    };
    let pattern: Vec<u8> = (0..max).map(|i| (i * 131 % 251) as u8).collect();
    dev.copy_from_host(0, &pattern)?;
    let file = Arc::new(FileRegion::open(
        dir.join(format!("nixl-rs-vram-bench-{}.bin", std::process::id())),
        max,
        OpenFlags::direct(),
    )?);

    let posix = Agent::new("bench-posix", AgentConfig::default())?;
    let ph = posix.create_backend(pp.clone())?;
    let _rp = posix.register_mem(vec![dev.clone(), file.clone()], &[ph])?;

    #[cfg(not(feature = "gds"))]
    let _ = only_posix;
    #[cfg(feature = "gds")]
    let gds = if only_posix {
        None
    } else {
        let a = Agent::new("bench-gds", AgentConfig::default())?;
        match a.create_backend(nixl_backend_gds::GdsParams::default()) {
            Ok(h) => match a.register_mem(vec![dev.clone(), file.clone()], &[h]) {
                Ok(r) => Some((a, r)),
                Err(e) => {
                    println!("GDS: skipped: registration failed: {e}");
                    None
                }
            },
            Err(e) => {
                println!("GDS: skipped: {e}");
                None
            }
        }
    };
    #[cfg(not(feature = "gds"))]
    let gds: Option<(Agent, nixl_core::Registration)> = {
        println!("GDS: skipped: built without the gds feature");
        None
    };

    let pinned =
        CudaHostBuffer::new(blocks.iter().copied().max().unwrap_or(1) as usize * MIB as usize)?;
    println!(
        "O_DIRECT file in {}, {iters} iterations per point (after 1 warm-up)",
        dir.display()
    );
    println!(
        "{:<11} {:>9} {:>10} {:<10} {:>8}  path",
        "op", "size", "block", "method", "GB/s"
    );
    for &size_mib in &sizes {
        for &block_mib in &blocks {
            let (size, block) = (size_mib * MIB, block_mib * MIB);
            if block > size {
                continue;
            }
            for op in [XferOp::Write, XferOp::Read] {
                let row = |method: &str, gbs: f64, path: &str| {
                    println!(
                        "{:<11} {:>5} MiB {:>6} MiB {:<10} {:>8.2}  {path}",
                        op_name(op),
                        size_mib,
                        block_mib,
                        method,
                        gbs
                    )
                };
                let (g, p) = agent_point(&posix, POSIX, op, &dev, &file, size, block, iters)?;
                row("posix", g, &p);
                if let Some((a, _)) = &gds {
                    match agent_point(a, "GDS", op, &dev, &file, size, block, iters) {
                        Ok((g, p)) => row("gds", g, &p),
                        Err(e) => row("gds", f64::NAN, &format!("failed: {e}")),
                    }
                }
                let g = baseline_point(op, &dev, &file, &pinned, size, block, iters)?;
                row(
                    "baseline",
                    g,
                    "cuMemcpy + pwrite/pread, one pinned buffer, sequential",
                );
            }
        }
    }
    // The data made it: the file holds what the device held (the last WRITE of each method).
    // Through a second, buffered descriptor: O_DIRECT would need an aligned buffer.
    let mut head = vec![0u8; MIB as usize];
    std::fs::File::open(file.path())?.read_exact_at(&mut head, 0)?;
    if head[..] != pattern[..MIB as usize] {
        return Err("the file's first MiB differs from the device buffer".into());
    }
    drop(gds);
    std::fs::remove_file(file.path()).ok();
    Ok(())
}
