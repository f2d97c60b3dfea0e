//! Layer-wise pipelining on the decode GPU: a decode rank pulls a request's KV blocks from the
//! prefill GPU with per-layer arrival counters, and its "attention" for layer `l` (here a
//! kernel that checksums the layer) waits on the GPU for counter `l`, so layer 0 is worked on
//! while later layers are still moving. The request's completion is awaited as a future.
//!
//! - prefill's pool on GPU 0, decode's on GPU 1 (GPU 0 when there is one), both over
//!   CUDA_IPC (`Agent::make_block_xfer` with `XferOptions::arrival`);
//! - the waiting kernel (the test kit's `LayerWaiter`: one CTA per layer spinning on the
//!   counter) is launched before the post; it records when each layer was released;
//! - every layer's checksum is compared with its source's: a layer released early would fail.
//!
//! ```text
//! cargo run --release --example layerwise -- --layers 160 --blocks 2048 --block-kib 32
//! ```
//! (Llama-3-70B's KV: 80 layers x K and V, 32 KiB blocks of 16 tokens; 10.7 GB.) Without a
//! CUDA GPU it says so and exits.

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use nixl::mem::{CudaIpcParams, DeviceBuffer};
use nixl::{
    Agent, AgentConfig, ArrivalCounters, MemKind, StridedDesc, StridedDescList, XferOp,
    XferOptions, XferTarget,
};
use nixl_testkit::gpu::LayerWaiter;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[derive(Parser, Debug)]
#[command(about = "Layer-wise pipelining: decode's layer 0 starts before the request is complete")]
struct Args {
    /// Layers (tensors) in the block table.
    #[arg(long, default_value_t = 32)]
    layers: u64,
    /// Blocks in the request (and in each pool).
    #[arg(long, default_value_t = 256)]
    blocks: u64,
    /// KiB per block.
    #[arg(long, default_value_t = 32)]
    block_kib: u64,
}

fn agent(name: &str, gpu: usize) -> Res<Agent> {
    let a = Agent::new(name, AgentConfig::default())?;
    a.create_backend(CudaIpcParams::default().device(gpu))?;
    Ok(a)
}

/// A block table of `layers` pools of `n` blocks on `gpu` in `buf`.
fn table(buf: &DeviceBuffer, gpu: usize, layers: u64, n: u64, block: u64) -> StridedDescList {
    StridedDescList::from_descs(
        MemKind::Vram,
        (0..layers).map(|l| {
            StridedDesc::on_device(buf.addr() + l * n * block, block, block, n, gpu as u64)
        }),
    )
}

fn main() -> Res<()> {
    let args = Args::parse();
    let gpus = match nixl::mem::cuda::device_count() {
        Ok(n) if n >= 2 => (0, 1),
        Ok(1) => (0, 0),
        other => {
            println!("layerwise: no CUDA GPU here ({other:?}); nothing to show");
            return Ok(());
        }
    };
    let (layers, n, block) = (args.layers, args.blocks, args.block_kib << 10);
    let pid = std::process::id();
    let prefill = agent(&format!("prefill-{pid}"), gpus.0)?;
    let decode = agent(&format!("decode-{pid}"), gpus.1)?;
    let bytes = (layers * n * block) as usize;
    let src = Arc::new(DeviceBuffer::new(gpus.0, bytes)?);
    // The decode pool, with 8 bytes per layer of arrival counters after it (one registration).
    let dst = Arc::new(DeviceBuffer::new(gpus.1, bytes + 8 * layers as usize)?);
    dst.fill(0)?;
    // Each source layer filled with its own word pattern; its checksum kept.
    let mut sums = Vec::new();
    let mut layer_bytes = vec![0u8; (n * block) as usize];
    for l in 0..layers {
        let mut sum = 0u64;
        for (i, w) in layer_bytes.chunks_exact_mut(4).enumerate() {
            let x = ((l << 32 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) as u32;
            w.copy_from_slice(&x.to_le_bytes());
            sum += u64::from(x);
        }
        src.copy_from_host(l as usize * layer_bytes.len(), &layer_bytes)?;
        sums.push(sum);
    }
    let _rs = prefill.register_mem(vec![src.clone()], &[])?;
    let _rd = decode.register_mem(vec![dst.clone()], &[])?;
    decode.load_remote_metadata(&prefill.local_metadata()?)?;
    let mine = decode.prep_strided_dlist(
        XferTarget::Initiator,
        &table(&dst, gpus.1, layers, n, block),
        &[],
    )?;
    let theirs = decode.prep_strided_dlist(
        XferTarget::Agent(prefill.name()),
        &table(&src, gpus.0, layers, n, block),
        &[],
    )?;
    let ids: Vec<usize> = (0..n as usize).collect();
    let counters = dst.addr() + bytes as u64;
    let req = decode.make_block_xfer(
        XferOp::Read,
        &mine,
        &ids,
        &theirs,
        &ids,
        XferOptions::default().arrival(ArrivalCounters::new(counters, gpus.1 as u64)),
    )?;
    let per_post = req.arrival_per_post().ok_or("no arrival counters")?;

    // Decode's per-layer work, waiting on the GPU; then the post.
    let bases: Vec<u64> = (0..layers).map(|l| dst.addr() + l * n * block).collect();
    let waiter = LayerWaiter::new(gpus.1)?;
    let wait = waiter.launch(counters, per_post, &bases, n * block)?;
    let t = Instant::now();
    decode.post_xfer_req(&req)?;
    let (done, polls) = nixl_testkit::executor::block_on(req.completion());
    done?;
    let whole = t.elapsed();
    let seen = wait.finish()?;
    let start = seen.iter().map(|s| s.1).min().unwrap_or(0);
    let ms = |ns: u64| ns.saturating_sub(start) as f64 / 1e6;
    for (l, &(sum, _, released)) in seen.iter().enumerate() {
        if sum != sums[l] {
            return Err(format!("layer {l} was worked on before its bytes landed").into());
        }
        if l < 3 || l + 1 == seen.len() || l == seen.len() / 2 {
            println!(
                "layer {l:>4}: released to decode's kernel at {:>8.3} ms",
                ms(released)
            );
        }
    }
    let last = seen.iter().map(|s| s.2).max().unwrap_or(0);
    println!(
        "{} bytes GPU {} -> GPU {}: layer 0 usable at {:.3} ms, the whole request at {:.3} ms; the future completed after {:?} ({polls} polls); every layer's checksum matched",
        bytes,
        gpus.0,
        gpus.1,
        ms(seen[0].2),
        ms(last),
        whole
    );
    Ok(())
}
