//! How long an async poll holds the executor's thread, and how late a future's deadline ends
//! it (issue 33: "async without stalls"), per path: UCX tcp, UCX's own cma copies, UCX direct
//! CMA, libfabric tcp, INPROC; two agents in this process.
//!
//! - completion: `--requests` READs of `--size` bytes (64 KiB blocks), each awaited with
//!   `XferReq::completion()` on an executor that times every poll;
//! - deadline: `--requests` READs of 64 MiB awaited with `completion_within(--deadline-us)`:
//!   the overrun is when the future returned minus its deadline (first poll + the deadline).
//!   Each request is waited quiescent (not timed) before the next.
//!
//! - idle: the process's CPU time per wall millisecond over `--idle-ms`, for two agents over
//!   UCX tcp that wait (a notification stream polled once, pending), against the same agents
//!   without one.
//!
//! `cargo bench -p nixl-bench --bench poll` prints markdown tables (1,000 requests per path
//! and phase); without `--bench` (as under `cargo test`) it runs 5 per path as a smoke test.

use futures_core::Stream;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use nixl::libfabric::LibfabricParams;
use nixl::ucx::UcxParams;
use nixl_core::{
    Agent, HostBuffer, InprocParams, MemKind, Registration, XferDescList, XferOp, XferOptions,
};

const BLOCK: u64 = 64 << 10;
const BIG: usize = 64 << 20;

/// The bench's options (after `--`).
#[derive(clap::Parser, Debug)]
#[command(about = "Async poll durations and deadline overruns per path")]
struct Cli {
    /// Given by `cargo bench`: the full run (without it, a smoke run).
    #[arg(long)]
    bench: bool,
    /// Requests per path and phase (default: 1000 with --bench, else 5).
    #[arg(long)]
    requests: Option<usize>,
    /// Bytes of each completion-phase READ.
    #[arg(long, default_value_t = 4 << 20)]
    size: usize,
    /// The deadline of each deadline-phase future, in microseconds.
    #[arg(long, default_value_t = 200)]
    deadline_us: u64,
    /// Wall time of each idle measurement, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    idle_ms: u64,
    /// Only these paths (comma-separated: ucx-tcp, ucx-cma, ucx-direct-cma, libfabric-tcp,
    /// inproc).
    #[arg(long, value_delimiter = ',')]
    paths: Vec<String>,
}

/// Unparks the polling thread, noting when (the last wake before a future ends tells a late
/// timer from a late thread).
struct Unpark(std::thread::Thread, parking_lot::Mutex<Option<Instant>>);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        *self.1.lock() = Some(Instant::now());
        self.0.unpark();
    }
}

/// This thread's CPU time.
fn cpu_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Each poll's wall time and this thread's CPU time in it: on a loaded machine a poll can
/// be descheduled (wall) while doing little (CPU).
#[derive(Default)]
struct Polls {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
}

/// Runs `f` on this thread, timing each poll; its output and when it was first polled.
fn run_timed<F: Future>(f: F, polls: &mut Polls) -> (F::Output, Instant, Option<Instant>) {
    let unpark = Arc::new(Unpark(
        std::thread::current(),
        parking_lot::Mutex::new(None),
    ));
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let first = Instant::now();
    loop {
        let (t, c) = (Instant::now(), cpu_now());
        let r = f.as_mut().poll(&mut cx);
        polls.wall.push(t.elapsed());
        polls.cpu.push(cpu_now().saturating_sub(c));
        if let Poll::Ready(v) = r {
            let woke = *unpark.1.lock();
            return (v, first, woke);
        }
        std::thread::park_timeout(Duration::from_secs(30));
    }
}

fn backend(a: &Agent, path: &str) -> nixl_core::Result<()> {
    let ucx = |tls: &str, direct: bool| {
        UcxParams::default()
            .transports(tls.to_owned())
            .direct_cma(direct)
    };
    match path {
        "ucx-tcp" => a.create_backend(ucx("tcp", false)),
        "ucx-cma" => a.create_backend(ucx("shm,cma,self", false)),
        "ucx-direct-cma" => a.create_backend(ucx("shm,cma,self", true)),
        "libfabric-tcp" => a.create_backend(LibfabricParams::tcp_loopback(1)),
        "inproc" => a.create_backend(InprocParams::default()),
        other => panic!("unknown path {other}"),
    }
    .map(|_| ())
}

struct Pair {
    a: Agent,
    b: Agent,
    dst: Arc<HostBuffer>,
    src: Arc<HostBuffer>,
    _regs: (Registration, Registration),
}

fn pair(path: &str) -> nixl_core::Result<Pair> {
    let mk = |role: &str| -> nixl_core::Result<Agent> {
        let a = Agent::new(
            &format!("poll-{path}-{role}-{}", std::process::id()),
            nixl::agent_config().default_timeout(Duration::from_secs(60)),
        )?;
        backend(&a, path)?;
        Ok(a)
    };
    let (a, b) = (mk("a")?, mk("b")?);
    let dst = Arc::new(HostBuffer::new(BIG).expect("alloc"));
    let src = Arc::new(HostBuffer::new(BIG).expect("alloc"));
    src.fill(0x5A);
    let ra = a.register_mem(vec![dst.clone()], &[])?;
    let rb = b.register_mem(vec![src.clone()], &[])?;
    a.load_remote_metadata(&b.local_metadata()?)?;
    Ok(Pair {
        a,
        b,
        dst,
        src,
        _regs: (ra, rb),
    })
}

fn read(p: &Pair, len: usize) -> nixl_core::Result<nixl_core::XferReq> {
    let n = len / BLOCK as usize;
    p.a.create_xfer_req(
        XferOp::Read,
        &XferDescList::blocks(MemKind::Dram, p.dst.addr(), BLOCK, n),
        &XferDescList::blocks(MemKind::Dram, p.src.addr(), BLOCK, n),
        p.b.name(),
        XferOptions::default(),
    )
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// One path: (completion polls, per-request poll counts, deadline overruns, deadline ends).
fn measure(path: &str, cli: &Cli, n: usize) -> nixl_core::Result<String> {
    let p = pair(path)?;
    // Completion phase.
    let mut polls = Polls::default();
    let mut counts = 0usize;
    for _ in 0..n {
        let req = read(&p, cli.size)?;
        p.a.post_xfer_req(&req)?;
        let before = polls.wall.len();
        let (r, _, _) = run_timed(req.completion(), &mut polls);
        r?;
        counts += polls.wall.len() - before;
    }
    assert_eq!(p.dst.to_vec()[..cli.size], p.src.to_vec()[..cli.size]);
    // Deadline phase.
    let deadline = Duration::from_micros(cli.deadline_us);
    let mut over = Vec::new();
    // Of each overrun: the last wake past the deadline (the timer's lateness), and from that
    // wake to the return (the polling thread's).
    let (mut late_wake, mut late_resume) = (Vec::new(), Vec::new());
    let mut dpolls = Polls::default();
    let (mut timed_out, mut done) = (0usize, 0usize);
    for _ in 0..n {
        let req = read(&p, BIG)?;
        p.a.post_xfer_req(&req)?;
        let (r, first, woke) = run_timed(req.completion_within(deadline), &mut dpolls);
        let end = Instant::now();
        match r {
            Ok(()) => done += 1,
            Err(e) if e.kind() == nixl_core::ErrorKind::TimedOut => {
                timed_out += 1;
                over.push(end.saturating_duration_since(first + deadline));
                if let Some(w) = woke {
                    late_wake.push(w.saturating_duration_since(first + deadline));
                    late_resume.push(end.saturating_duration_since(w));
                }
            }
            Err(e) => return Err(e),
        }
        req.wait_quiescent(Duration::from_secs(60))?;
    }
    let mut wall = polls.wall;
    wall.extend_from_slice(&dpolls.wall);
    let mut cpu = polls.cpu;
    cpu.extend_from_slice(&dpolls.cpu);
    Ok(format!(
        "| {path} | {n} | {:.1} | {} | {} | {} | {} | {} | {timed_out} / {done} | {} | {} | {} | {} / {} | {} / {} |",
        counts as f64 / n as f64,
        us(pct(&mut wall, 0.5)),
        us(pct(&mut wall, 0.99)),
        us(pct(&mut wall, 1.0)),
        us(pct(&mut cpu, 0.99)),
        us(pct(&mut cpu, 1.0)),
        us(pct(&mut over, 0.5)),
        us(pct(&mut over, 0.99)),
        us(pct(&mut over, 1.0)),
        us(pct(&mut late_wake, 0.99)),
        us(pct(&mut late_wake, 1.0)),
        us(pct(&mut late_resume, 0.99)),
        us(pct(&mut late_resume, 1.0)),
    ))
}

/// This process's CPU time (every thread).
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU-ms per wall-ms of this process over `wall`.
fn cpu_per_ms(wall: Duration) -> f64 {
    let (c, t) = (process_cpu(), Instant::now());
    std::thread::sleep(wall);
    (process_cpu() - c).as_secs_f64() / t.elapsed().as_secs_f64()
}

/// Idle cost: two UCX tcp agents that wait, without and with a pending stream.
fn idle(wall: Duration) -> nixl_core::Result<String> {
    let p = pair("ucx-tcp")?;
    std::thread::sleep(Duration::from_millis(300));
    let without = cpu_per_ms(wall);
    let mut stream = p.b.notif_stream();
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    let pending = std::pin::Pin::new(&mut stream)
        .poll_next(&mut cx)
        .is_pending();
    std::thread::sleep(Duration::from_millis(300));
    let with = cpu_per_ms(wall);
    // The stream is live: a notification still reaches it.
    p.a.gen_notif(p.b.name(), b"wake", &[])?;
    let got = std::iter::repeat_with(|| {
        std::thread::sleep(Duration::from_millis(1));
        std::pin::Pin::new(&mut stream).poll_next(&mut cx)
    })
    .take(5000)
    .find_map(|p| match p {
        Poll::Ready(Some(Ok(n))) => Some(n.message),
        _ => None,
    });
    Ok(format!(
        "| ucx-tcp | {:.4} | {:.4} | {} |",
        without,
        with,
        if pending && got.as_deref() == Some(&b"wake"[..]) {
            "pending, then woke for a notification"
        } else {
            "NOT pending and live"
        }
    ))
}

fn main() {
    use clap::Parser;
    let cli = Cli::parse();
    let n = cli.requests.unwrap_or(if cli.bench { 1000 } else { 5 });
    let paths: Vec<String> = if cli.paths.is_empty() {
        [
            "ucx-tcp",
            "ucx-cma",
            "ucx-direct-cma",
            "libfabric-tcp",
            "inproc",
        ]
        .map(String::from)
        .to_vec()
    } else {
        cli.paths.clone()
    };
    println!(
        "Async polls: {} B READs awaited (completion), 64 MiB READs with a {} us deadline \
         (completion_within); poll durations over both phases; overrun = return - deadline",
        cli.size, cli.deadline_us
    );
    println!("| path | requests | polls per request | poll p50 (us) | poll p99 (us) | poll max (us) | poll CPU p99 (us) | poll CPU max (us) | deadline: TimedOut / Done | overrun p50 (us) | overrun p99 (us) | overrun max (us) | of it, wake after the deadline p99 / max (us) | of it, wake to return p99 / max (us) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for path in &paths {
        match measure(path, &cli, n) {
            Ok(row) => println!("{row}"),
            Err(e) => println!("| {path} | unavailable here: {e} |"),
        }
    }
    let wall = Duration::from_millis(if cli.bench { cli.idle_ms } else { 200 });
    println!();
    println!("Idle cost: process CPU-ms per wall-ms over {wall:?} (two agents, UCX's own progress threads)");
    println!("| path | agents waiting, no stream | with a pending notification stream | stream |");
    println!("|---|---|---|---|");
    match idle(wall) {
        Ok(row) => println!("{row}"),
        Err(e) => println!("| ucx-tcp | unavailable here: {e} |"),
    }
}
