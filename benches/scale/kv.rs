//! KV mode: model-shaped block tables and requests named by block ids.
//!
//! Each layer's KV cache is one registered region holding K and V for `pool` blocks. Layout
//! `split` (vLLM's FlashAttention layout, `[2, blocks, ...]`): K blocks then V blocks, each a
//! dense strided descriptor; layout `interleaved` (FlashInfer's `[blocks, 2, ...]`): K and V
//! of a block side by side, so each is strided with a gap. A request moves the same `blocks`
//! block ids of every layer and K/V from a random free list on each side (ids as a block
//! manager hands them out: not contiguous), and is compared with the same transfer given as
//! a flat descriptor list (`prep_xfer_dlist` + `make_prepped_xfer`, NIXL's way).

use std::time::{Duration, Instant};

use nixl::core::{StridedDesc, StridedDescList};
use nixl::{Agent, XferOp, XferOptions, XferTarget};

use super::{agents, best, run, shuffle, side, time, Opts, Res, Which};

/// A model's KV shape.
#[derive(Debug, Clone, Copy)]
struct Model {
    name: &'static str,
    layers: u64,
    kv_heads: u64,
    head_dim: u64,
    dtype: u64,
    tokens_per_block: u64,
    tp: u64,
    /// Block ids per request (every layer, K and V).
    blocks: u64,
}

const MODELS: [Model; 3] = [
    // 32 layers x K,V x 2,048 blocks = 131,072 blocks of 32 KiB (a 32k-token sequence).
    Model {
        name: "llama3-8b",
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        dtype: 2,
        tokens_per_block: 16,
        tp: 1,
        blocks: 2048,
    },
    // 80 layers x K,V x 1,024 blocks = 163,840 blocks of 4 KiB (TP 8: one KV head per GPU).
    Model {
        name: "llama3-70b",
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        dtype: 2,
        tokens_per_block: 16,
        tp: 8,
        blocks: 1024,
    },
    // A 16-layer MoE (OLMoE-1B-7B's attention: 16 KV heads of 128): 16 x K,V x 4,096 blocks
    // = 131,072 blocks of 64 KiB.
    Model {
        name: "moe16",
        layers: 16,
        kv_heads: 16,
        head_dim: 128,
        dtype: 2,
        tokens_per_block: 16,
        tp: 1,
        blocks: 4096,
    },
];

impl Model {
    fn block_bytes(&self) -> u64 {
        self.tokens_per_block * (self.kv_heads / self.tp.max(1)).max(1) * self.head_dim * self.dtype
    }
}

/// One side's block table over `layers` regions of `pool` blocks (K and V each).
fn table(
    kind: nixl::MemKind,
    base: u64,
    m: &Model,
    pool: u64,
    interleaved: bool,
) -> StridedDescList {
    let bb = m.block_bytes();
    let layer_bytes = 2 * pool * bb;
    let mut t = StridedDescList::new(kind);
    for l in 0..m.layers {
        let at = base + l * layer_bytes;
        for kv in 0..2 {
            t.push(if interleaved {
                StridedDesc::on_device(at + kv * bb, 2 * bb, bb, pool, 0)
            } else {
                StridedDesc::on_device(at + kv * pool * bb, bb, bb, pool, 0)
            });
        }
    }
    t
}

/// Runs every requested model on one backend.
pub(crate) fn run_models(which: Which, o: &Opts) -> Res<()> {
    for name in &o.models {
        let mut m = *MODELS
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| format!("unknown model {name}: llama3-8b, llama3-70b or moe16"))?;
        if let Some(b) = o.kv_blocks {
            m.blocks = b.max(1);
        }
        if let Some(tp) = o.tp {
            m.tp = tp.max(1);
        }
        for interleaved in [false, true] {
            if let Err(e) = model(which, o, &m, interleaved) {
                println!("# kv {} {}: skipped: {e}", which.name(), m.name);
            }
        }
    }
    Ok(())
}

fn model(which: Which, o: &Opts, m: &Model, interleaved: bool) -> Res<()> {
    let kind = which.kind();
    let bb = m.block_bytes();
    let pool = m.blocks + m.blocks / 4;
    let bytes = m.layers * 2 * pool * bb;
    let (a, b) = agents(which, &format!("kv-{}-{interleaved}", m.name))?;
    let la = side(&a, which, bytes, m.layers as usize, bytes / m.layers)?;
    let lb = side(&b, which, bytes, m.layers as usize, bytes / m.layers)?;
    a.load_remote_metadata(&b.local_metadata()?)?;
    let remote = b.name().to_owned();
    let (lt, rt) = (
        table(kind, la.base, m, pool, interleaved),
        table(kind, lb.base, m, pool, interleaved),
    );
    // Block ids from each side's free list.
    let lids: Vec<usize> = shuffle(pool as usize)[..m.blocks as usize].to_vec();
    let mut rids: Vec<usize> = shuffle(pool as usize)[..m.blocks as usize].to_vec();
    rids.reverse();
    let n = (m.layers * 2 * m.blocks) as usize;
    let iters = if o.iters > 0 { o.iters } else { 21 };
    let data_iters = if which == Which::Null {
        iters
    } else {
        (iters / 2).max(5)
    };

    let prep = time(iters, || {
        Ok((
            a.prep_strided_dlist(XferTarget::Initiator, &lt, &[])?,
            a.prep_strided_dlist(XferTarget::Agent(&remote), &rt, &[])?,
        ))
    })?;
    let l = a.prep_strided_dlist(XferTarget::Initiator, &lt, &[])?;
    let r = a.prep_strided_dlist(XferTarget::Agent(&remote), &rt, &[])?;
    let build = || a.make_block_xfer(XferOp::Write, &l, &lids, &r, &rids, XferOptions::default());
    let req = build()?;
    let path = req.path();
    run(&a, &req)?; // first touch
                    // Build + post of a fresh request, then its completion (not timed).
    let (mut builds, mut posts, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..data_iters {
        let t0 = Instant::now();
        let q = build()?;
        let t1 = Instant::now();
        let mut st = a.post_xfer_req(&q)?;
        let t2 = Instant::now();
        builds.push(t1 - t0);
        posts.push(t2 - t1);
        both.push(t2 - t0);
        let end = Instant::now() + Duration::from_secs(60);
        while st == nixl::XferState::InProgress && Instant::now() < end {
            st = a.check_xfer_state(&q)?;
        }
    }
    let (repost, fresh) = interleaved_cycles(&a, &req, &build, data_iters)?;
    drop(req);
    // The same transfer as flat descriptors (NIXL's way): prep of every block, then make by
    // index.
    let (flat_prep, flat_make) = flat(&a, &remote, &lt, &rt, &lids, &rids, pool, iters.min(9))?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let per = |d: Duration| d.as_nanos() as f64 / n as f64;
    let gbps = (n as u64 * bb) as f64 / repost.as_secs_f64() / 1e9;
    let layout = if interleaved { "interleaved" } else { "split" };
    if o.json {
        println!(
            "{{\"bench\": \"scale\", \"mode\": \"kv\", \"backend\": \"{}\", \"model\": \"{}\", \"layout\": \"{layout}\", \"layers\": {}, \"blocks\": {}, \"block_bytes\": {bb}, \"descs\": {n}, \"prep_us\": {:.1}, \"build_us\": {:.1}, \"post_us\": {:.1}, \"build_post_us\": {:.1}, \"repost_us\": {:.1}, \"fresh_us\": {:.1}, \"fresh_over_repost\": {:.3}, \"gbps\": {gbps:.2}, \"flat_prep_ns_per_desc\": {:.1}, \"flat_make_ns_per_desc\": {:.1}, \"path\": {:?}}}",
            which.name(),
            m.name,
            m.layers * 2,
            m.blocks,
            us(prep),
            us(best(&builds)),
            us(best(&posts)),
            us(best(&both)),
            us(repost),
            us(fresh),
            fresh.as_secs_f64() / repost.as_secs_f64(),
            per(flat_prep),
            per(flat_make),
            path
        );
    } else {
        println!(
            "# kv {} {} ({layout}): {} layers x K,V x {} blocks of {bb} B = {n} blocks, {:.1} MiB; best of {iters}",
            which.name(),
            m.name,
            m.layers,
            m.blocks,
            (n as u64 * bb) as f64 / 1048576.0
        );
        println!("#   path: {path}");
        let data = if which == Which::Null {
            "nothing moved".to_owned()
        } else {
            format!(
                "repost {:.1} us | fresh {:.1} us (fresh/repost {:.3}) | {gbps:.2} GB/s",
                us(repost),
                us(fresh),
                fresh.as_secs_f64() / repost.as_secs_f64()
            )
        };
        println!(
            "    prep {:.1} us | build {:.1} us | post {:.1} us | build+post {:.1} us | {data}",
            us(prep),
            us(best(&builds)),
            us(best(&posts)),
            us(best(&both)),
        );
        println!(
            "    as a flat list (NIXL's way): prep {:.1} ns/desc ({:.1} ms), make {:.1} ns/desc ({:.1} ms)",
            per(flat_prep),
            flat_prep.as_secs_f64() * 1e3,
            per(flat_make),
            flat_make.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Repost and fresh cycles, alternated so both see the same machine: the best of
/// post + done of one request, and of build + post + done + drop of a new one.
fn interleaved_cycles(
    a: &Agent,
    req: &nixl::XferReq,
    build: &dyn Fn() -> nixl::Result<nixl::XferReq>,
    iters: usize,
) -> Res<(Duration, Duration)> {
    let (mut rep, mut fr) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let t = Instant::now();
        run(a, req)?;
        rep.push(t.elapsed());
        let t = Instant::now();
        let q = build()?;
        run(a, &q)?;
        drop(q);
        fr.push(t.elapsed());
    }
    Ok((best(&rep), best(&fr)))
}

/// The same request as flat lists: (prep of both lists, make by index), best times.
#[allow(clippy::too_many_arguments)]
fn flat(
    a: &Agent,
    remote: &str,
    lt: &StridedDescList,
    rt: &StridedDescList,
    lids: &[usize],
    rids: &[usize],
    pool: u64,
    iters: usize,
) -> Res<(Duration, Duration)> {
    let (ld, rd) = (lt.to_desc_list(), rt.to_desc_list());
    let prep = time(iters, || {
        Ok((
            a.prep_xfer_dlist(XferTarget::Initiator, &ld, &[])?,
            a.prep_xfer_dlist(XferTarget::Agent(remote), &rd, &[])?,
        ))
    })?;
    let l = a.prep_xfer_dlist(XferTarget::Initiator, &ld, &[])?;
    let r = a.prep_xfer_dlist(XferTarget::Agent(remote), &rd, &[])?;
    // Block id `i` of table layer `t` is flat index `t * pool + i`.
    let layers = lt.len();
    let li: Vec<usize> = (0..layers)
        .flat_map(|t| lids.iter().map(move |&i| t * pool as usize + i))
        .collect();
    let ri: Vec<usize> = (0..layers)
        .flat_map(|t| rids.iter().map(move |&i| t * pool as usize + i))
        .collect();
    let make = time(iters, || {
        a.make_prepped_xfer(XferOp::Write, &l, &li, &r, &ri, XferOptions::default())
            .map_err(Into::into)
    })?;
    Ok((prep, make))
}
