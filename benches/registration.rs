//! Registration and metadata at KV-pool scale (issue 37): an agent with its UCX backend
//! registers R regions of host memory (one call, as a serving engine registers its KV caches),
//! serializes its metadata, deregisters, and registers the same regions again.
//!
//!     cargo run --release -p nixl-bench --bin registration -- [--regions 1,160,1280]
//!         [--region-bytes 1048576] [--rounds 5]
//!
//! Prints one JSON object per region count: median and min over rounds of the first
//! registration in a fresh agent, of a registration again (the same memory, the agent's
//! second), and of serializing the metadata, in ms, and the metadata's size in bytes. NIXL's
//! side: `benches/reference/nixl_registration.py` (the same keys).

use std::sync::Arc;
use std::time::Instant;

use nixl::ucx::UcxParams;
use nixl::{Agent, AgentConfig, HostBuffer, MemoryRegion};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(clap::Parser, Debug)]
#[command(name = "registration")]
struct Cli {
    /// Region counts, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1,160,1280")]
    regions: Vec<usize>,
    /// Bytes per region.
    #[arg(long, default_value_t = 1 << 20)]
    region_bytes: usize,
    /// Rounds (a fresh agent each).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// UCX transports (`UCX_TLS`).
    #[arg(long)]
    tls: Option<String>,
    /// Given by `cargo bench`: ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, f64::NAN),
        n => (v[n / 2], v[0]),
    }
}

fn main() -> Res<()> {
    use clap::Parser;
    let cli = Cli::parse();
    for (k, &n) in cli.regions.iter().enumerate() {
        let bufs: Vec<Arc<HostBuffer>> = (0..n)
            .map(|_| HostBuffer::new(cli.region_bytes).map(Arc::new))
            .collect::<Option<_>>()
            .ok_or("allocating the regions")?;
        // Every page touched once, as a KV cache's are before it is registered.
        for b in &bufs {
            b.write_at(0, &vec![1u8; cli.region_bytes]);
        }
        let (mut fresh, mut again, mut ser) = (Vec::new(), Vec::new(), Vec::new());
        let mut bytes = 0;
        for r in 0..cli.rounds.max(1) {
            let agent = Agent::new(
                &format!("registration-{}-{k}-{r}", std::process::id()),
                AgentConfig::default(),
            )?;
            agent.create_backend(UcxParams::default().transports(cli.tls.clone()))?;
            let regions = || -> Vec<Arc<dyn MemoryRegion>> {
                bufs.iter()
                    .map(|b| b.clone() as Arc<dyn MemoryRegion>)
                    .collect()
            };
            let t = Instant::now();
            let reg = agent.register_mem(regions(), &[])?;
            fresh.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let md = agent.local_metadata()?;
            ser.push(t.elapsed().as_secs_f64() * 1e3);
            bytes = md.len();
            agent.deregister_mem(&reg)?;
            let t = Instant::now();
            let reg = agent.register_mem(regions(), &[])?;
            again.push(t.elapsed().as_secs_f64() * 1e3);
            agent.deregister_mem(&reg)?;
        }
        let ((fm, fmin), (am, amin), (sm, smin)) =
            (stats(&mut fresh), stats(&mut again), stats(&mut ser));
        println!(
            "{{\"impl\":\"nixl-rs\",\"regions\":{n},\"region_bytes\":{},\"rounds\":{},\"register_fresh_ms\":{fm:.3},\"register_fresh_min_ms\":{fmin:.3},\"register_again_ms\":{am:.3},\"register_again_min_ms\":{amin:.3},\"metadata_ms\":{sm:.3},\"metadata_min_ms\":{smin:.3},\"metadata_bytes\":{bytes}}}",
            cli.region_bytes,
            cli.rounds.max(1)
        );
    }
    Ok(())
}
