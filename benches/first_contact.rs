//! First contact on one host (issue 37): how long an agent with its UCX backend takes to be
//! ready, and how long a reader takes from knowing a peer's side-channel address to the end
//! of its first 4 KiB READ (fetch the metadata, load it, connect, move). Each round makes two
//! fresh agents in this process (the target's listener serves the fetch on its own thread)
//! over UCX's tcp and shared-memory transports.
//!
//!     cargo bench -p nixl-bench --bench first_contact -- [--rounds N] [--tls tcp|shm,cma,self]
//!
//! Prints the phases in milliseconds: the first round (the process's first reader), then the
//! median and max of the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::ucx::UcxParams;
use nixl_core::{Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};

#[derive(clap::Parser, Debug)]
struct Cli {
    /// Rounds (fresh agents each).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// UCX transports (`UCX_TLS`).
    #[arg(long, default_value = "tcp")]
    tls: String,
    /// Given by `cargo bench`: ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const PHASES: [&str; 6] = [
    "agent",
    "UCX backend",
    "register 4 KiB",
    "fetch metadata",
    "load + connect + first 4 KiB READ",
    "first contact (fetch .. READ done)",
];

fn round(cli: &Cli, i: usize) -> Res<[f64; 6]> {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let pid = std::process::id();
    let params = || UcxParams::default().transports(cli.tls.clone());
    let target = Agent::new(
        &format!("fc-target-{pid}-{i}"),
        AgentConfig::default().listen(true),
    )?;
    target.create_backend(params())?;
    let tbuf = Arc::new(HostBuffer::new(4096).ok_or("allocating")?);
    let _treg = target.register_mem(vec![tbuf.clone()], &[])?;
    let addr = target.listen_addr().ok_or("no listener")?;

    let t = Instant::now();
    let reader = Agent::new(&format!("fc-reader-{pid}-{i}"), AgentConfig::default())?;
    let agent_ms = ms(t);
    let t = Instant::now();
    reader.create_backend(params())?;
    let backend_ms = ms(t);
    let t = Instant::now();
    let rbuf = Arc::new(HostBuffer::new(4096).ok_or("allocating")?);
    let _rreg = reader.register_mem(vec![rbuf.clone()], &[])?;
    let reg_ms = ms(t);

    let start = Instant::now();
    let name =
        reader.fetch_remote_metadata_blocking(target.name(), addr, Duration::from_secs(10))?;
    let fetch_ms = ms(start);
    let t = Instant::now();
    let local = XferDescList::blocks(MemKind::Dram, rbuf.addr(), 1, 4096);
    let remote = XferDescList::blocks(MemKind::Dram, tbuf.addr(), 1, 4096);
    let req =
        reader.create_xfer_req(XferOp::Read, &local, &remote, &name, XferOptions::default())?;
    reader.post_xfer_req(&req)?;
    req.wait(Duration::from_secs(10))?;
    let first_ms = ms(t);
    Ok([agent_ms, backend_ms, reg_ms, fetch_ms, first_ms, ms(start)])
}

fn main() -> Res<()> {
    use clap::Parser;
    let cli = Cli::parse();
    let mut all: Vec<[f64; 6]> = Vec::new();
    for i in 0..cli.rounds.max(1) {
        all.push(round(&cli, i)?);
    }
    println!(
        "First contact on one host, UCX {} ({} rounds, fresh agents each; ms)",
        cli.tls,
        all.len()
    );
    println!("| phase | first round | median of the rest | max of the rest |");
    println!("|---|---|---|---|");
    for (k, phase) in PHASES.iter().enumerate() {
        let mut v: Vec<f64> = all.iter().skip(1).map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        let (med, max) = match v.len() {
            0 => (f64::NAN, f64::NAN),
            n => (v[n / 2], v[n - 1]),
        };
        println!("| {phase} | {:.2} | {med:.2} | {max:.2} |", all[0][k]);
    }
    Ok(())
}
