//! Times metadata load, registration and deregistration at scale (INPROC), for a quick check
//! of linear costs: `cargo run --release -p nixl-bench --bin load_scale -- 100000`.
use std::sync::Arc;
use std::time::Instant;

use nixl_core::{Agent, AgentConfig, HostBuffer, InprocParams, MemoryRegion};

/// Loading a peer's metadata with many regions.
#[derive(clap::Parser, Debug)]
struct Cli {
    /// Regions the peer registers.
    #[arg(default_value_t = 100_000)]
    n: usize,
}

fn main() -> nixl_core::Result<()> {
    let Cli { n } = <Cli as clap::Parser>::parse();
    let a = Agent::new("scale-a", AgentConfig::default())?;
    let b = Agent::new("scale-b", AgentConfig::default())?;
    a.create_backend(InprocParams::default())?;
    b.create_backend(InprocParams::default())?;
    let big = Arc::new(HostBuffer::new(n * 4096).expect("alloc"));
    // n regions: views of one big buffer.
    let regions: Vec<Arc<dyn MemoryRegion>> = (0..n)
        .map(|i| {
            // SAFETY: each view lies inside `big`, which outlives the agents in this program.
            let r = unsafe {
                nixl_core::backend::RawRegion::new(nixl_core::RegionDesc::dram(
                    big.addr() + (i * 4096) as u64,
                    4096,
                ))
            };
            Arc::new(r) as Arc<dyn MemoryRegion>
        })
        .collect();
    let t = Instant::now();
    let reg = b.register_mem(regions, &[])?;
    println!("register {n} regions: {:?}", t.elapsed());
    let t = Instant::now();
    let md = b.local_metadata()?;
    println!("local_metadata: {:?} ({} bytes)", t.elapsed(), md.len());
    let t = Instant::now();
    a.load_remote_metadata(&md)?;
    println!("load_remote_metadata of {n} regions: {:?}", t.elapsed());
    let t = Instant::now();
    b.deregister_mem(&reg)?;
    println!("deregister: {:?}", t.elapsed());
    // Register/deregister in a loop: the last thousand cost no more than the first.
    let mut first = None;
    let t = Instant::now();
    let mut keep = Vec::new();
    for i in 0..10_000usize {
        // SAFETY: as above.
        let r = unsafe {
            nixl_core::backend::RawRegion::new(nixl_core::RegionDesc::dram(
                big.addr() + ((i % n) * 4096) as u64,
                4096,
            ))
        };
        keep.push(b.register_mem(vec![Arc::new(r)], &[])?);
        if i == 999 {
            first = Some(t.elapsed());
        }
    }
    let t2 = Instant::now();
    for r in keep.drain(..9000) {
        b.deregister_mem(&r)?;
    }
    let mid = t2.elapsed();
    let t3 = Instant::now();
    for r in keep.drain(..) {
        b.deregister_mem(&r)?;
    }
    println!(
        "10k registrations: first 1k {:?}, all {:?}; deregister 9k {:?}, last 1k {:?}",
        first.unwrap_or_default(),
        t.elapsed() - mid - t3.elapsed(),
        mid,
        t3.elapsed()
    );
    Ok(())
}
