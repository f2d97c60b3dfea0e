//! DRAM <-> FILE throughput of the POSIX backend, in the patterns NIXL's POSIX plugin is
//! measured with (`benches/reference/storage/nixl_posix.py` runs the same patterns on NIXL 1.5.1).
//!
//! ```text
//! cargo bench -p nixl-bench --bench storage -- [--dir PATH] [--iters N] [--engine auto|threadpool]
//!     [--chunk-kib N] [--qd N] [--threads N] [--inline-kib N] [--serve]
//! ```
//! `--serve` is the lockstep mode `benches/reference/storage/nixl_posix.py --lockstep` drives: it reads
//! `setup [@FILE] <pattern>`, `warm <WRITE|READ>`, `run <WRITE|READ> <iters>` and `teardown` lines on stdin and answers each
//! with one line (`run` answers the elapsed seconds), so NIXL and nixl-rs take turns on the
//! same disk within one run instead of minutes apart.
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

/// One pattern's file, buffer, prepared lists and requests (built once, like NIXL's prepared
/// requests), and where the next iteration starts.
struct Prepared {
    path: std::path::PathBuf,
    /// The file was made here (removed on drop) rather than handed in by the driver.
    owned: bool,
    total: u64,
    reqs: Vec<(XferOp, Vec<nixl_core::XferReq>)>,
    next: usize,
    _reg: nixl_core::Registration,
}

impl Prepared {
    fn new(
        agent: &Agent,
        dir: &std::path::Path,
        p: &Pattern,
        iters: usize,
        shared: Option<std::path::PathBuf>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let owned = shared.is_none();
        let path = shared.unwrap_or_else(|| {
            dir.join(format!(
                "nixl-rs-bench-{}-{}.bin",
                std::process::id(),
                p.direct
            ))
        });
        let flags = if p.direct {
            OpenFlags::direct()
        } else {
            OpenFlags::buffered()
        };
        let file = Arc::new(FileRegion::open(&path, FILE_SIZE, flags)?);
        let total = p.block * p.count as u64;
        let buf = Arc::new(HostBuffer::new(total as usize).ok_or("alloc")?);
        buf.fill_pattern(1);
        let reg = agent.register_mem(vec![buf.clone(), file.clone()], &[])?;
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
        // Requests for each window of the file (NIXL's script uses the same windows).
        let windows = (nblocks / p.count).min(iters + 1);
        let mut reqs = Vec::new();
        for &op in p.ops {
            let r = (0..windows)
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
                .collect::<Result<Vec<_>, _>>()?;
            reqs.push((op, r));
        }
        Ok(Prepared {
            path,
            owned,
            total,
            reqs,
            next: 0,
            _reg: reg,
        })
    }

    fn requests(&self, op: XferOp) -> Result<&[nixl_core::XferReq], Box<dyn std::error::Error>> {
        Ok(self
            .reqs
            .iter()
            .find(|(o, _)| *o == op)
            .ok_or("op not in this pattern")?
            .1
            .as_slice())
    }

    /// One pass over every window (warm-up; for READ through the page cache it also fills the
    /// cache).
    fn warm(&mut self, agent: &Agent, op: XferOp) -> Result<(), Box<dyn std::error::Error>> {
        for r in self.requests(op)? {
            agent.post_xfer_req(r)?;
            r.wait(Duration::from_secs(60))?;
        }
        self.next = 0;
        Ok(())
    }

    /// Runs `iters` requests back to back, continuing the window rotation.
    fn run(
        &mut self,
        agent: &Agent,
        op: XferOp,
        iters: usize,
    ) -> Result<Duration, Box<dyn std::error::Error>> {
        let reqs = self.requests(op)?;
        let n = reqs.len();
        let t = Instant::now();
        for i in 0..iters {
            let r = &reqs[(self.next + i) % n];
            agent.post_xfer_req(r)?;
            r.wait(Duration::from_secs(60))?;
        }
        let el = t.elapsed();
        self.next = (self.next + iters) % n;
        Ok(el)
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn parse_op(s: &str) -> Result<XferOp, Box<dyn std::error::Error>> {
    match s {
        "WRITE" => Ok(XferOp::Write),
        "READ" => Ok(XferOp::Read),
        _ => Err(format!("unknown op {s}").into()),
    }
}

/// The lockstep protocol (see the module docs).
fn serve(
    agent: &Agent,
    dir: &std::path::Path,
    iters: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{BufRead, Write};
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut cur: Option<Prepared> = None;
    for line in stdin.lock().lines() {
        let line = line?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let reply = match w.as_slice() {
            // `setup <pattern name>` or `setup @<path of an existing file> <pattern name>`.
            ["setup", rest @ ..] => {
                let (shared, name) = match rest.split_first() {
                    Some((f, n)) if f.starts_with('@') => (Some(f[1..].into()), n),
                    _ => (None, rest),
                };
                let name = name.join(" ");
                let p = PATTERNS
                    .iter()
                    .find(|p| p.name == name)
                    .ok_or_else(|| format!("unknown pattern {name}"))?;
                // Drop the previous pattern's file before making the next one.
                drop(cur.take());
                cur = Some(Prepared::new(agent, dir, p, iters, shared)?);
                "ok".to_owned()
            }
            ["warm", op] => {
                cur.as_mut().ok_or("no setup")?.warm(agent, parse_op(op)?)?;
                "ok".to_owned()
            }
            ["run", op, n] => {
                let el = cur
                    .as_mut()
                    .ok_or("no setup")?
                    .run(agent, parse_op(op)?, n.parse()?)?;
                format!("{:.9}", el.as_secs_f64())
            }
            ["teardown"] => {
                cur = None;
                "ok".to_owned()
            }
            _ => return Err(format!("bad command {line:?}").into()),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}

fn chunk_desc(p: &PosixParams) -> String {
    p.chunk_size.map_or_else(
        || "auto (device limit for O_DIRECT)".to_owned(),
        |c| format!("{} KiB", c >> 10),
    )
}

/// DRAM <-> FILE throughput of the POSIX backend, in NIXL's POSIX plugin's patterns.
#[derive(clap::Parser, Debug)]
#[command(name = "storage")]
struct Args {
    /// Directory of the 1 GiB test files.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: std::path::PathBuf,
    /// Iterations per point (after one warm-up).
    #[arg(long, default_value_t = 40)]
    iters: usize,
    /// The POSIX engine.
    #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
    engine: EngineArg,
    /// Chunk size in KiB (default: the device's limit for O_DIRECT).
    #[arg(long)]
    chunk_kib: Option<u64>,
    /// io_uring queue depth.
    #[arg(long)]
    qd: Option<u32>,
    /// Thread-pool threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Requests up to this many KiB use inline pread/pwrite.
    #[arg(long)]
    inline_kib: Option<u64>,
    /// Lockstep mode for `benches/reference/storage/nixl_posix.py --lockstep` (commands on stdin).
    #[arg(long)]
    serve: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `--engine` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum EngineArg {
    Auto,
    Threadpool,
    #[value(name = "io_uring")]
    IoUring,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = <Args as clap::Parser>::parse();
    let (dir, iters, serve_mode) = (args.dir, args.iters, args.serve);
    let engine = match args.engine {
        EngineArg::Auto => Engine::Auto,
        EngineArg::Threadpool => Engine::ThreadPool,
        EngineArg::IoUring => Engine::IoUring,
    };
    let mut params = PosixParams::default();
    if let Some(k) = args.chunk_kib {
        params.chunk_size = Some(k << 10);
    }
    if let Some(n) = args.threads {
        params.pool_threads = n;
    }
    if let Some(n) = args.qd {
        params.queue_depth = n;
    }
    if let Some(k) = args.inline_kib {
        params.inline_max = k << 10;
    }
    let agent = Agent::new("bench", AgentConfig::default())?;
    agent.create_backend(params.clone().engine(engine))?;
    let engine_desc = agent
        .path_report("bench")
        .first()
        .map(|p| p.1.clone())
        .unwrap_or_default();
    if serve_mode {
        eprintln!(
            "nixl-rs POSIX ({engine_desc}), chunk {}, serving lockstep commands",
            chunk_desc(&params)
        );
        return serve(&agent, &dir, iters);
    }
    println!(
        "chunk {}, queue depth {}, inline up to {} KiB",
        chunk_desc(&params),
        params.queue_depth,
        params.inline_max >> 10
    );
    println!(
        "nixl-rs POSIX ({engine_desc}), {iters} iterations per point, files in {}",
        dir.display()
    );
    println!("{:<22} {:<6} {:>10}", "pattern", "op", "GB/s");
    for p in PATTERNS {
        let mut prep = Prepared::new(&agent, &dir, p, iters, None)?;
        for &op in p.ops {
            prep.warm(&agent, op)?;
            let el = prep.run(&agent, op, iters)?;
            let gbps = (prep.total * iters as u64) as f64 / el.as_secs_f64() / 1e9;
            println!(
                "{:<22} {:<6} {:>10.2}",
                p.name,
                format!("{op:?}").to_uppercase(),
                gbps
            );
        }
    }
    Ok(())
}
