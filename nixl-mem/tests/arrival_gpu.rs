//! GPU-waitable arrival (issue 27): a block-table READ over CUDA_IPC with per-layer arrival
//! counters, and a decode-side kernel (the test kit's `LayerWaiter`, launched before the post
//! on its own stream) whose CTA for layer `l` waits on the GPU for counter `l`, then reads
//! (checksums) layer `l`'s bytes. Every layer's checksum must equal its source's: a layer
//! released early would read stale bytes. A request of plain descriptors has one counter.
//! Counters refused where they cannot be honoured.
//!
//! `arrival_counters_release_each_layer_on_the_gpu` runs on one GPU (skips as `gpu`);
//! `llama70b_first_layer_usable_long_before_the_whole_request` reads a Llama-3-70B-shaped
//! request of 2048 blocks from GPU 0 to GPU 1 and prints when layer 0 was usable vs the whole
//! request (skips as `multi-gpu`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{
    Agent, AgentConfig, ArrivalCounters, ErrorKind, PreparedList, StridedDesc, StridedDescList,
    XferOp, XferOptions, XferTarget,
};
use nixl_mem::{CudaIpcParams, DeviceBuffer};
use nixl_testkit::gpu::{gpu, two_gpus, LayerWaiter};

const WAIT: Duration = Duration::from_secs(120);

struct Side {
    agent: Agent,
    buf: Arc<DeviceBuffer>,
    table: StridedDescList,
    _reg: nixl_core::Registration,
}

/// A pool of `layers` x `pool` blocks on `dev` (plus 8 bytes per layer of counters after it).
fn side(name: &str, dev: usize, layers: u64, pool: u64, block: u64) -> Side {
    let agent = Agent::new(
        &format!("{name}-{}", std::process::id()),
        AgentConfig::default().default_timeout(WAIT),
    )
    .unwrap();
    agent
        .create_backend(CudaIpcParams::default().device(dev))
        .unwrap();
    let len = (layers * pool * block + 8 * layers) as usize;
    let buf = Arc::new(DeviceBuffer::new(dev, len).unwrap());
    let table = StridedDescList::from_descs(
        nixl_core::MemKind::Vram,
        (0..layers).map(|l| {
            StridedDesc::on_device(
                buf.addr() + l * pool * block,
                block,
                block,
                pool,
                dev as u64,
            )
        }),
    );
    let reg = agent.register_mem(vec![buf.clone()], &[]).unwrap();
    Side {
        agent,
        buf,
        table,
        _reg: reg,
    }
}

/// Fills the source pool layer by layer with a distinct u32 per word (layer, block, word), so
/// a checksum tells a landed layer from a stale one; returns each block's checksum (u64 sum
/// of its u32 words), per layer.
fn fill(buf: &DeviceBuffer, layers: u64, pool: u64, block: u64) -> Vec<Vec<u64>> {
    let per_layer = (pool * block) as usize;
    let mut sums = Vec::with_capacity(layers as usize);
    let mut bytes = vec![0u8; per_layer];
    for l in 0..layers {
        let first = l * pool * block / 4;
        for (i, w) in bytes.chunks_exact_mut(4).enumerate() {
            let x = ((first + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) as u32 | 1;
            w.copy_from_slice(&x.to_le_bytes());
        }
        buf.copy_from_host(l as usize * per_layer, &bytes).unwrap();
        sums.push(
            bytes
                .chunks_exact(block as usize)
                .map(|b| {
                    b.chunks_exact(4)
                        .map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
                        .sum()
                })
                .collect(),
        );
    }
    sums
}

struct Run {
    /// The same request without counters: best of three posts (host time).
    plain: Duration,
    /// Per layer: (released ns after the waiter started, checksum ok).
    layers: Vec<(u64, bool)>,
    /// Host time from post to the request's completion.
    whole: Duration,
    bytes: u64,
    path: String,
}

/// Decode (on `gpus.1`) reads `n` blocks of every layer from the source (on `gpus.0`) with
/// arrival counters, while the waiter's CTA per layer waits for its counter and checksums it.
fn run(tag: &str, gpus: (usize, usize), layers: u64, n: u64, block: u64) -> Run {
    let pool = n;
    let src = side(&format!("{tag}-src"), gpus.0, layers, pool, block);
    let dst = side(&format!("{tag}-dst"), gpus.1, layers, pool, block);
    let block_sums = fill(&src.buf, layers, pool, block);
    dst.buf.fill(0).unwrap();
    dst.agent
        .load_remote_metadata(&src.agent.local_metadata().unwrap())
        .unwrap();
    let local: PreparedList = dst
        .agent
        .prep_strided_dlist(XferTarget::Initiator, &dst.table, &[])
        .unwrap();
    let remote = dst
        .agent
        .prep_strided_dlist(XferTarget::Agent(src.agent.name()), &src.table, &[])
        .unwrap();
    // Dense destination ids (each layer's request is one range), scattered source ids.
    let dids: Vec<usize> = (0..n as usize).collect();
    let step = if n.is_multiple_of(5) { 1 } else { 5 };
    let sids: Vec<usize> = (0..n).map(|i| ((i * step + 3) % n) as usize).collect();
    let counters = dst.buf.addr() + layers * pool * block;
    let req = dst
        .agent
        .make_block_xfer(
            XferOp::Read,
            &local,
            &dids,
            &remote,
            &sids,
            XferOptions::default().arrival(ArrivalCounters::new(counters, gpus.1 as u64)),
        )
        .unwrap();
    let per_post = req.arrival_per_post().expect("counters");
    // The same request without counters, for the counters' cost.
    let plain_req = dst
        .agent
        .make_block_xfer(
            XferOp::Read,
            &local,
            &dids,
            &remote,
            &sids,
            XferOptions::default(),
        )
        .unwrap();
    let mut plain = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.agent.post_xfer_req(&plain_req).unwrap();
        plain_req.wait(WAIT).unwrap();
        plain = plain.min(t.elapsed());
    }
    dst.buf.fill(0).unwrap();
    let waiter = LayerWaiter::new(gpus.1).unwrap();
    let bases: Vec<u64> = (0..layers)
        .map(|l| dst.buf.addr() + l * pool * block)
        .collect();
    // The waiter's CTAs start spinning just before the post: their start is the origin of the
    // release times.
    let wait = waiter
        .launch(counters, per_post, &bases, n * block)
        .unwrap();
    let t = Instant::now();
    dst.agent.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    let whole = t.elapsed();
    let seen = wait.finish().unwrap();
    let start = seen.iter().map(|s| s.1).min().unwrap_or(0);
    let layers_seen = seen
        .iter()
        .enumerate()
        .map(|(l, &(sum, _, released))| {
            (
                released.saturating_sub(start),
                sum == sids.iter().map(|&b| block_sums[l][b]).sum::<u64>(),
            )
        })
        .collect();
    let mut c = vec![0u8; 8 * layers as usize];
    dst.buf
        .copy_to_host((layers * pool * block) as usize, &mut c)
        .unwrap();
    for (l, w) in c.chunks_exact(8).enumerate() {
        assert_eq!(
            u64::from_le_bytes(w.try_into().unwrap()),
            per_post,
            "layer {l}'s counter after one post"
        );
    }
    Run {
        plain,
        layers: layers_seen,
        whole,
        bytes: layers * n * block,
        path: req.path(),
    }
}

/// Layers are released as they land, not all at the end: the first layer before half of the
/// request's time to its last release (when about half its bytes have landed), and the first
/// quarter of the layers all before any of the last quarter (the counters advance in layer
/// order). A backend that advanced every counter at the end fails both.
fn assert_progressive(released: &[u64]) {
    let last = released.iter().copied().max().unwrap_or(0);
    assert!(
        released[0] < last / 2,
        "layer 0 released at {} ns of {last} ns: not before half of the request",
        released[0]
    );
    let q = (released.len() / 4).max(1);
    let first = released[..q].iter().copied().max().unwrap_or(0);
    let late = released[released.len() - q..]
        .iter()
        .copied()
        .min()
        .unwrap_or(u64::MAX);
    assert!(
        first < late,
        "the first {q} layers' last release ({first} ns) came after the last {q} layers' first ({late} ns)"
    );
}

#[test]
fn arrival_counters_release_each_layer_on_the_gpu() {
    if !gpu("arrival_counters_release_each_layer_on_the_gpu") {
        return;
    }
    let r = run("arr1", (0, 0), 16, 256, 64 << 10);
    for (l, &(_, ok)) in r.layers.iter().enumerate() {
        assert!(ok, "layer {l} was read before its bytes landed");
    }
    assert_progressive(&r.layers.iter().map(|x| x.0).collect::<Vec<_>>());
    println!(
        "one GPU: {} bytes; layer 0 released at {} us, last at {} us; whole request {:?}; {}",
        r.bytes,
        r.layers[0].0 / 1000,
        r.layers.iter().map(|x| x.0).max().unwrap_or(0) / 1000,
        r.whole,
        r.path
    );
}

#[test]
fn arrival_counters_are_refused_where_they_cannot_be_honoured() {
    if !gpu("arrival_counters_are_refused_where_they_cannot_be_honoured") {
        return;
    }
    let (layers, pool, block) = (4u64, 8u64, 4096u64);
    let src = side("arrno-src", 0, layers, pool, block);
    let dst = side("arrno-dst", 0, layers, pool, block);
    dst.agent
        .load_remote_metadata(&src.agent.local_metadata().unwrap())
        .unwrap();
    src.agent
        .load_remote_metadata(&dst.agent.local_metadata().unwrap())
        .unwrap();
    let local = dst
        .agent
        .prep_strided_dlist(XferTarget::Initiator, &dst.table, &[])
        .unwrap();
    let remote = dst
        .agent
        .prep_strided_dlist(XferTarget::Agent(src.agent.name()), &src.table, &[])
        .unwrap();
    let ids: Vec<usize> = (0..4).collect();
    let counters = dst.buf.addr() + layers * pool * block;
    let make = |op, at: u64, dev: u64| {
        dst.agent.make_block_xfer(
            op,
            &local,
            &ids,
            &remote,
            &ids,
            XferOptions::default().arrival(ArrivalCounters::new(at, dev)),
        )
    };
    let kind = |r: nixl_core::Result<nixl_core::XferReq>| r.unwrap_err().kind();
    assert_eq!(
        kind(make(XferOp::Write, counters, 0)),
        ErrorKind::NotSupported
    );
    assert_eq!(
        kind(make(XferOp::Read, counters + 4, 0)),
        ErrorKind::InvalidParam
    );
    assert_eq!(
        kind(make(XferOp::Read, counters + 8, 0)),
        ErrorKind::InvalidParam
    );
    assert_eq!(
        kind(make(XferOp::Read, counters, 1)),
        ErrorKind::InvalidParam
    );
    // A request of plain descriptors has one counter, advanced per descriptor.
    let flat = dst
        .agent
        .create_xfer_req(
            XferOp::Read,
            &local_flat(&dst),
            &local_flat(&src),
            src.agent.name(),
            XferOptions::default().arrival(ArrivalCounters::new(counters, 0)),
        )
        .unwrap();
    assert_eq!(flat.arrival_per_post(), Some(1));
    dst.buf.fill(0).unwrap();
    dst.agent.post_xfer_req(&flat).unwrap();
    flat.wait(WAIT).unwrap();
    let mut c = [0u8; 8];
    dst.buf
        .copy_to_host((layers * pool * block) as usize, &mut c)
        .unwrap();
    assert_eq!(
        u64::from_le_bytes(c),
        1,
        "the request's counter after one post"
    );
    // The sound one still builds.
    let ok = make(XferOp::Read, counters, 0).unwrap();
    assert_eq!(ok.arrival_per_post(), Some(1));
}

fn local_flat(s: &Side) -> nixl_core::XferDescList {
    nixl_core::XferDescList::from_descs(
        nixl_core::MemKind::Vram,
        [nixl_core::Desc::on_device(
            s.buf.addr(),
            4096,
            s.buf.ordinal() as u64,
        )],
    )
}

/// Issue 27's benchmark: Llama-3-70B's KV (80 layers x K and V: 160 tensors, 8 KV heads x 128,
/// bf16, 16 tokens per block: 32 KiB blocks), 2048 blocks read from GPU 0 into GPU 1. The
/// decode GPU's layer-0 CTA is released as soon as layer 0's K and V have landed.
#[test]
fn llama70b_first_layer_usable_long_before_the_whole_request() {
    if !two_gpus("llama70b_first_layer_usable_long_before_the_whole_request") {
        return;
    }
    let r = run("arr70", (0, 1), 160, 2048, 32 << 10);
    for (l, &(_, ok)) in r.layers.iter().enumerate() {
        assert!(ok, "tensor {l} was read before its bytes landed");
    }
    let layer = |t: usize| r.layers[2 * t].0.max(r.layers[2 * t + 1].0);
    assert_progressive(&(0..r.layers.len() / 2).map(layer).collect::<Vec<_>>());
    let last = r.layers.iter().map(|x| x.0).max().unwrap_or(0);
    println!(
        "llama70b 2048 blocks GPU 0 -> GPU 1: {} bytes; layer 0 (K and V) usable on the decode GPU at {:.3} ms, layer 40 at {:.3} ms, the whole request at {:.3} ms (GPU clock, from the waiter's start); host saw completion after {:?} ({:.1} GB/s; without counters {:?}, {:.1} GB/s); {}",
        r.bytes,
        layer(0) as f64 / 1e6,
        layer(40) as f64 / 1e6,
        last as f64 / 1e6,
        r.whole,
        r.bytes as f64 / r.whole.as_secs_f64() / 1e9,
        r.plain,
        r.bytes as f64 / r.plain.as_secs_f64() / 1e9,
        r.path
    );
}
