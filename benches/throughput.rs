//! Throughput of the LIBFABRIC backend: READ and WRITE of batches of 1 and 32 blocks of 4 KiB
//! to 16 MiB between two agents, in one process and in two processes (this binary spawns
//! itself as the target), on the tcp (loopback, 1 and 2 rails) and shm providers.
//!
//! `cargo bench -p nixl-bench --bench throughput` prints a markdown table (GB/s,
//! 1 GB = 10^9 bytes). Options after `--`: `--provider tcp|shm|efa|...`, `--rails N`,
//! `--procs 1|2`, `--min-time-ms N`, `--sizes 4096,65536,...`. Without `--bench` (as under
//! `cargo test`) it runs one tiny point as a smoke test.
//!
//! Each point posts the same prepared request again and again (`no_merge`, so a batch stays
//! that many RMA operations) until `--min-time-ms` passed, after two warm-up posts. Buffers are
//! capped at 256 MiB per side: a 16 MiB x 32 batch writes each block of the buffer twice.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
    XferTarget,
};

const ROLE: &str = "NIXL_LF_BENCH_ROLE";
const CAP: usize = 256 << 20;
const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Config {
    provider: String,
    rails: usize,
    procs: usize,
}

fn params(c: &Config) -> LibfabricParams {
    if c.provider == "tcp" {
        LibfabricParams::tcp_loopback(c.rails)
    } else {
        (LibfabricParams::with_provider(&c.provider)).rails(c.rails)
    }
}

/// The bench's options (after `--`).
#[derive(clap::Parser, Debug)]
#[command(about = "Throughput of the LIBFABRIC backend (GB/s)")]
struct Cli {
    /// Given by `cargo bench`: the full sweep (without it, one tiny smoke point).
    #[arg(long)]
    bench: bool,
    /// One provider (tcp, shm, efa, ...) instead of the default set.
    #[arg(long)]
    provider: Option<String>,
    /// Rails of `--provider`.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    rails: usize,
    /// 1: both agents in this process; 2: the target in a child process.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=2))]
    procs: usize,
    /// Time per point, milliseconds (400 with `--bench`, else 1).
    #[arg(long = "min-time-ms")]
    min_time_ms: Option<u64>,
    /// Block sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
}

fn main() {
    if std::env::var_os(ROLE).is_some() {
        if let Err(e) = target_main() {
            eprintln!("bench target failed: {e}");
            std::process::exit(2);
        }
        return;
    }
    let cli = <Cli as clap::Parser>::parse();
    let full = cli.bench;
    let min_time = Duration::from_millis(cli.min_time_ms.unwrap_or(if full { 400 } else { 1 }));
    let sizes: Vec<usize> = match cli.sizes {
        Some(s) => s,
        None if full => vec![
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
        ],
        None => vec![4 << 10],
    };
    let config = |provider: &str, rails, procs| Config {
        provider: provider.into(),
        rails,
        procs,
    };
    let configs: Vec<Config> = match cli.provider {
        Some(p) => vec![config(&p, cli.rails, cli.procs)],
        None if full => vec![
            config("tcp", 1, 1),
            config("tcp", 2, 1),
            config("shm", 1, 1),
            config("tcp", 1, 2),
            config("shm", 1, 2),
        ],
        None => vec![config("tcp", 1, 1)],
    };
    if let Err(e) = nixl_backend_libfabric::library_status() {
        eprintln!("skipping the libfabric bench: {e}");
        return;
    }
    println!("| provider | rails | processes | op | block | batch | GB/s |");
    println!("|---|---|---|---|---|---|---|");
    for c in &configs {
        match run_config(c, &sizes, min_time) {
            Ok(()) => {}
            Err(e) => eprintln!("{c:?}: {e}"),
        }
    }
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{}M", n >> 20)
    } else {
        format!("{}K", n >> 10)
    }
}

/// The target side of a measurement: a registered buffer, and (in two-process mode) a
/// child process holding it.
struct Target {
    name: String,
    addr: u64,
    _local: Option<(Agent, Arc<HostBuffer>, nixl_core::Registration)>,
    child: Option<Child>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run_config(c: &Config, sizes: &[usize], min_time: Duration) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let max = sizes.iter().map(|s| s * 32).max().unwrap_or(4096).min(CAP);
    let a = Agent::new(
        &format!("bench-init-{}", std::process::id()),
        AgentConfig::default().listen(c.procs == 2),
    )
    .map_err(e)?;
    a.create_backend(params(c)).map_err(e)?;
    let src = Arc::new(HostBuffer::new(max).ok_or("alloc")?);
    src.fill_pattern(1);
    let _reg = a.register_mem(vec![src.clone()], &[]).map_err(e)?;
    let target = if c.procs == 2 {
        spawn_target(&a, c, max)?
    } else {
        local_target(&a, c, max)?
    };
    for op in [XferOp::Write, XferOp::Read] {
        for &block in sizes {
            for batch in [1usize, 32] {
                let gbps = measure(&a, &target, &src, op, block, batch, max, min_time)?;
                println!(
                    "| {} | {} | {} | {op} | {} | {batch} | {gbps:.2} |",
                    c.provider,
                    c.rails,
                    c.procs,
                    human(block)
                );
            }
        }
    }
    if c.procs == 2 {
        a.gen_notif(&target.name, b"exit", &[]).map_err(e)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    a: &Agent,
    t: &Target,
    src: &HostBuffer,
    op: XferOp,
    block: usize,
    batch: usize,
    max: usize,
    min_time: Duration,
) -> Result<f64, String> {
    let e = |e: Error| e.to_string();
    let slots = (max / block).max(1);
    let descs = |base: u64| {
        XferDescList::from_descs(
            MemKind::Dram,
            (0..batch).map(|i| Desc::new(base + ((i % slots) * block) as u64, block as u64)),
        )
    };
    let local = a
        .prep_xfer_dlist(XferTarget::Initiator, &descs(src.addr()), &[])
        .map_err(e)?;
    let remote = a
        .prep_xfer_dlist(XferTarget::Agent(&t.name), &descs(t.addr), &[])
        .map_err(e)?;
    let idx: Vec<usize> = (0..batch).collect();
    let req = a
        .make_prepped_xfer(
            op,
            &local,
            &idx,
            &remote,
            &idx,
            XferOptions::default().no_merge(true),
        )
        .map_err(e)?;
    for _ in 0..2 {
        a.post_xfer_req(&req).map_err(e)?;
        req.wait(WAIT).map_err(e)?;
    }
    let start = Instant::now();
    let mut iters = 0u64;
    while iters < 3 || start.elapsed() < min_time {
        a.post_xfer_req(&req).map_err(e)?;
        req.wait(WAIT).map_err(e)?;
        iters += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((block * batch) as f64 * iters as f64 / secs / 1e9)
}

fn local_target(a: &Agent, c: &Config, max: usize) -> Result<Target, String> {
    let e = |e: Error| e.to_string();
    let b = Agent::new(
        &format!("bench-target-{}", std::process::id()),
        AgentConfig::default(),
    )
    .map_err(e)?;
    b.create_backend(params(c)).map_err(e)?;
    let dst = Arc::new(HostBuffer::new(max).ok_or("alloc")?);
    let reg = b.register_mem(vec![dst.clone()], &[]).map_err(e)?;
    a.load_remote_metadata(&b.local_metadata().map_err(e)?)
        .map_err(e)?;
    b.load_remote_metadata(&a.local_metadata().map_err(e)?)
        .map_err(e)?;
    Ok(Target {
        name: b.name().to_owned(),
        addr: dst.addr(),
        _local: Some((b, dst, reg)),
        child: None,
    })
}

fn spawn_target(a: &Agent, c: &Config, max: usize) -> Result<Target, String> {
    let addr = a.listen_addr().ok_or("no side channel")?;
    let name = format!("bench-child-{}", std::process::id());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .env(ROLE, "target")
        .env("NIXL_LF_BENCH_PARENT", format!("{}|{}", a.name(), addr))
        .env("NIXL_LF_BENCH_CHILD", &name)
        .env(
            "NIXL_LF_BENCH_CONFIG",
            format!("{}|{}|{max}", c.provider, c.rails),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut t = Target {
        name: name.clone(),
        addr: 0,
        _local: None,
        child: Some(child),
    };
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        if let Ok(mut n) = a.wait_notifs(Duration::from_millis(100)) {
            if let Some(m) = n.remove(&name).and_then(|v| v.into_iter().next()) {
                t.addr = std::str::from_utf8(&m)
                    .ok()
                    .and_then(|s| s.strip_prefix("addr:"))
                    .and_then(|s| s.parse().ok())
                    .ok_or("bad hello")?;
                return Ok(t);
            }
        }
    }
    Err("the target process did not say hello".into())
}

fn target_main() -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let env = |k: &str| std::env::var(k).map_err(|_| format!("{k} not set"));
    let parent = env("NIXL_LF_BENCH_PARENT")?;
    let (pname, paddr) = parent.split_once('|').ok_or("bad parent")?;
    let paddr: SocketAddr = paddr.parse().map_err(|_| "bad parent address")?;
    let cfg = env("NIXL_LF_BENCH_CONFIG")?;
    let parts: Vec<&str> = cfg.split('|').collect();
    let [provider, rails, max] = parts.as_slice() else {
        return Err("bad config".into());
    };
    let c = Config {
        provider: (*provider).to_owned(),
        rails: rails.parse().map_err(|_| "rails")?,
        procs: 2,
    };
    let max: usize = max.parse().map_err(|_| "max")?;
    let b = Agent::new(&env("NIXL_LF_BENCH_CHILD")?, AgentConfig::default()).map_err(e)?;
    b.create_backend(params(&c)).map_err(e)?;
    let dst = Arc::new(HostBuffer::new(max).ok_or("alloc")?);
    let _reg = b.register_mem(vec![dst.clone()], &[]).map_err(e)?;
    b.fetch_remote_metadata_blocking(pname, paddr, WAIT)
        .map_err(e)?;
    b.send_local_metadata(paddr).map_err(e)?;
    b.gen_notif(pname, format!("addr:{}", dst.addr()).as_bytes(), &[])
        .map_err(e)?;
    let end = Instant::now() + Duration::from_secs(600);
    while Instant::now() < end {
        if let Ok(n) = b.wait_notifs(Duration::from_millis(200)) {
            if n.get(pname).is_some_and(|v| v.iter().any(|m| m == b"exit")) {
                return Ok(());
            }
        }
    }
    Err("no exit before the deadline".into())
}
