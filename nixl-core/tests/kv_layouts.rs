//! KV layouts as transfer plans (issue 26), over INPROC: several agents per side in one
//! process, every element of the request checked against its expected value computed in the
//! test from (layer, tensor, token, head, dim), and every byte outside the request unchanged.
// This file also checks the per-form KV entries (`plan_read`, `plan_write`, `plan_read_tiles`,
// `plan_write_tiles`), deprecated for `KvLayout::plan` but kept for one release: they must go
// on moving the same bytes.
#![allow(deprecated)]

use std::sync::Arc;
use std::time::Duration;

use nixl_core::kv::{KvLayout, KvOrder, KvPlan, KvTensor, KvTilePlan};
use nixl_core::kv::{KvMoves, KvPeer, KvXferPlan};
use nixl_core::{
    Agent, AgentConfig, ErrorKind, HostBuffer, InprocParams, MemKind, Registration, XferOp,
    XferOptions, XferTarget,
};

use nixl_testkit::kv::{check_destination, ids_for, pool_layout, pool_len, source_bytes, KvShape};

/// One rank: its agent, pool and description.
struct Rank {
    agent: Agent,
    buf: Arc<HostBuffer>,
    layout: KvLayout,
    _reg: Registration,
}

const POOL_BLOCKS: u64 = 12;

fn rank(
    tag: &str,
    s: KvShape,
    tp: u32,
    r: u32,
    tokens_per_block: u32,
    order: KvOrder,
    pad: u64,
) -> Rank {
    let name = format!("{tag}-{}-{r}", std::process::id());
    let agent = Agent::new(&name, AgentConfig::default()).unwrap();
    agent.create_backend(InprocParams::default()).unwrap();
    let buf = Arc::new(HostBuffer::new(pool_len(s, tp, tokens_per_block, pad)).unwrap());
    let layout = pool_layout(s, tp, r, tokens_per_block, order, pad, buf.addr());
    layout.validate().unwrap();
    let reg = agent.register_mem(vec![buf.clone()], &[]).unwrap();
    Rank {
        agent,
        buf,
        layout,
        _reg: reg,
    }
}

fn fill_source(r: &Rank, ids: &[u64], tokens: u64) {
    assert!(r
        .buf
        .write_at(0, &source_bytes(&r.layout, r.buf.len(), ids, tokens)));
}

fn check(r: &Rank, ids: &[u64], tokens: u64) {
    if let Err(e) = check_destination(&r.layout, &r.buf.to_vec(), ids, tokens) {
        panic!("{}: {e}", r.agent.name());
    }
}

fn connect(a: &[Rank], b: &[Rank]) {
    for x in a {
        for y in b {
            x.agent
                .load_remote_metadata(&y.agent.local_metadata().unwrap())
                .unwrap();
            y.agent
                .load_remote_metadata(&x.agent.local_metadata().unwrap())
                .unwrap();
        }
    }
}

fn post(r: &Rank, plan: &KvPlan) {
    for t in &plan.transfers {
        let req = r
            .agent
            .create_xfer_req(
                plan.op,
                &t.local,
                &t.remote,
                &t.peer,
                XferOptions::default(),
            )
            .unwrap();
        r.agent.post_xfer_req(&req).unwrap();
        req.wait(Duration::from_secs(30)).unwrap();
    }
}

struct Case {
    shape: KvShape,
    tp: (u32, u32),
    block: (u32, u32),
    order: KvOrder,
    /// The destination's order where it differs (tile plans only).
    dst_order: Option<KvOrder>,
    tokens: u64,
    pad: u64,
    write: bool,
}

/// Both sides' ranks, connected, sources filled and destinations cleared; the block ids.
struct Setup {
    src: Vec<Rank>,
    dst: Vec<Rank>,
    sids: Vec<u64>,
    dids: Vec<u64>,
}

fn setup(tag: &str, c: &Case) -> Setup {
    let side = |which: &str, tp: u32, block: u32, order: KvOrder| -> Vec<Rank> {
        (0..tp)
            .map(|r| {
                rank(
                    &format!("{tag}-{which}"),
                    c.shape,
                    tp,
                    r,
                    block,
                    order,
                    c.pad,
                )
            })
            .collect()
    };
    let src = side("p", c.tp.0, c.block.0, c.order);
    let dst = side("d", c.tp.1, c.block.1, c.dst_order.unwrap_or(c.order));
    connect(&src, &dst);
    let (sids, dids) = (
        ids_for(c.tokens, c.block.0, 3, POOL_BLOCKS),
        ids_for(c.tokens, c.block.1, 7, POOL_BLOCKS),
    );
    for r in &src {
        fill_source(r, &sids, c.tokens);
    }
    for r in &dst {
        r.buf.fill(0xDD);
    }
    Setup {
        src,
        dst,
        sids,
        dids,
    }
}

fn sides(ranks: &[Rank]) -> Vec<(&str, &KvLayout)> {
    ranks.iter().map(|r| (r.agent.name(), &r.layout)).collect()
}

/// Runs one case end to end; returns the destination ranks' plans.
fn run(tag: &str, c: Case) -> Vec<KvPlan> {
    let Setup {
        src,
        dst,
        sids,
        dids,
    } = setup(tag, &c);
    let (src_side, dst_side) = (sides(&src), sides(&dst));
    let mut plans = Vec::new();
    for d in &dst {
        plans.push(
            d.layout
                .plan_read(&src_side, &sids, &dids, c.tokens)
                .unwrap(),
        );
    }
    if c.write {
        let mut written = 0;
        for s in &src {
            let plan = s
                .layout
                .plan_write(&dst_side, &sids, &dids, c.tokens)
                .unwrap();
            written += plan.bytes();
            post(s, &plan);
        }
        assert_eq!(written, plans.iter().map(KvPlan::bytes).sum::<u64>());
    } else {
        for (d, plan) in dst.iter().zip(&plans) {
            post(d, plan);
        }
    }
    for d in &dst {
        check(d, &dids, c.tokens);
    }
    plans
}

/// Posts a tile plan: both sides' block tables prepared from their layouts.
fn post_tiles(r: &Rank, plan: &KvTilePlan, peers: &[(&str, &KvLayout)]) {
    let mine = r
        .agent
        .prep_strided_dlist(XferTarget::Initiator, &r.layout.block_table(), &[])
        .unwrap();
    for t in &plan.transfers {
        let (_, peer) = peers.iter().find(|(n, _)| *n == t.peer).unwrap();
        let theirs = r
            .agent
            .prep_strided_dlist(XferTarget::Agent(&t.peer), &peer.block_table(), &[])
            .unwrap();
        let req = r
            .agent
            .make_tile_xfer(
                plan.op,
                &mine,
                &theirs,
                &t.shape,
                &t.tiles,
                XferOptions::default(),
            )
            .unwrap();
        r.agent.post_xfer_req(&req).unwrap();
        req.wait(Duration::from_secs(30)).unwrap();
    }
}

/// [`run`] with tile plans (any orders on the two sides); returns the destination ranks'
/// plans, after checking that writes move the same bytes as reads.
fn run_tiles(tag: &str, c: Case) -> Vec<KvTilePlan> {
    let Setup {
        src,
        dst,
        sids,
        dids,
    } = setup(tag, &c);
    let (src_side, dst_side) = (sides(&src), sides(&dst));
    let plans: Vec<KvTilePlan> = dst
        .iter()
        .map(|d| {
            d.layout
                .plan_read_tiles(&src_side, &sids, &dids, c.tokens)
                .unwrap()
        })
        .collect();
    if c.write {
        let mut written = 0;
        for s in &src {
            let plan = s
                .layout
                .plan_write_tiles(&dst_side, &sids, &dids, c.tokens)
                .unwrap();
            written += plan.bytes();
            post_tiles(s, &plan, &dst_side);
        }
        assert_eq!(written, plans.iter().map(KvTilePlan::bytes).sum::<u64>());
    } else {
        for (d, plan) in dst.iter().zip(&plans) {
            post_tiles(d, plan, &src_side);
        }
    }
    for d in &dst {
        check(d, &dids, c.tokens);
    }
    plans
}

/// [`run`] through the one entry ([`KvLayout::plan`] and [`Agent::make_kv_xfers`]): reads by
/// every destination rank, or writes by every source rank; with `own_ids` each source rank's
/// request sits at block ids of its own. Every element checked; returns the plans posted.
fn run_one(tag: &str, c: Case, own_ids: bool) -> Vec<KvXferPlan> {
    let Setup {
        src,
        dst,
        sids,
        dids,
    } = setup(tag, &c);
    // Each source rank's ids: shared, or its own (refilled there).
    let src_ids: Vec<Vec<u64>> = (0..src.len() as u64)
        .map(|r| {
            if own_ids {
                ids_for(c.tokens, c.block.0, 3 + 2 * r, POOL_BLOCKS)
            } else {
                sids.clone()
            }
        })
        .collect();
    for (r, ids) in src.iter().zip(&src_ids) {
        fill_source(r, ids, c.tokens);
    }
    let peers = |ranks: &[Rank], ids: &[Vec<u64>]| -> Vec<(String, KvLayout, Vec<u64>)> {
        ranks
            .iter()
            .zip(ids)
            .map(|(r, i)| (r.agent.name().to_owned(), r.layout.clone(), i.clone()))
            .collect()
    };
    let src_peers = peers(&src, &src_ids);
    let dst_peers = peers(&dst, &vec![dids.clone(); dst.len()]);
    let mut plans = Vec::new();
    let post_all = |r: &Rank, plan: &KvXferPlan| {
        let reqs = r
            .agent
            .make_kv_xfers(plan, &XferOptions::default())
            .unwrap();
        assert_eq!(reqs.len(), plan.transfers.len());
        for req in &reqs {
            r.agent.post_xfer_req(req).unwrap();
            req.wait(Duration::from_secs(30)).unwrap();
        }
    };
    // (the ranks that post, their ids, the other side, the operation)
    let dst_ids = vec![dids.clone(); dst.len()];
    let (posters, ids, others, op) = if c.write {
        (&src, &src_ids, &dst_peers, XferOp::Write)
    } else {
        (&dst, &dst_ids, &src_peers, XferOp::Read)
    };
    for (r, mine) in posters.iter().zip(ids) {
        let plan = r.layout.plan(op, mine, &as_side(others), c.tokens).unwrap();
        post_all(r, &plan);
        plans.push(plan);
    }
    for d in &dst {
        check(d, &dids, c.tokens);
    }
    plans
}

/// A side's ranks as [`KvPeer`]s: (name, layout, the request's block ids there).
fn as_side(v: &[(String, KvLayout, Vec<u64>)]) -> Vec<KvPeer<'_>> {
    v.iter()
        .map(|(n, l, b)| KvPeer {
            name: n,
            layout: l,
            blocks: b,
        })
        .collect()
}

/// How a plan moves its bytes: (pieces transfers, tile transfers).
fn forms(plans: &[KvXferPlan]) -> (usize, usize) {
    let all = plans.iter().flat_map(|p| &p.transfers);
    let tiles = all
        .clone()
        .filter(|t| matches!(t.moves, KvMoves::Tiles { .. }))
        .count();
    (all.count() - tiles, tiles)
}

#[test]
fn one_plan_entry_picks_pieces_or_tiles_both_ways() {
    // The same order: pieces, reads and writes.
    for write in [false, true] {
        let plans = run_one(
            &format!("one-same-{write}"),
            Case {
                write,
                ..case((2, 4), (16, 16), KvOrder::Hnd, 50)
            },
            false,
        );
        assert!(matches!(forms(&plans), (n, 0) if n > 0), "{plans:?}");
    }
    // HND prefill -> NHD decode: tiles, reads and writes, every element where it belongs.
    for write in [false, true] {
        let plans = run_one(
            &format!("one-perm-{write}"),
            Case {
                dst_order: Some(KvOrder::Nhd),
                write,
                ..case((2, if write { 1 } else { 2 }), (16, 16), KvOrder::Hnd, 40)
            },
            false,
        );
        assert!(matches!(forms(&plans), (0, n) if n > 0), "{plans:?}");
        assert!(plans.iter().all(KvXferPlan::has_tiles));
    }
}

#[test]
fn mla_in_other_orders_moves_as_pieces() {
    // MLA's latent is one head: its blocks lie the same in HND and NHD. The piece planner
    // refused the pair (`NotSupported`, a permute); the one entry moves it as pieces.
    let shape = KvShape {
        layers: 2,
        heads: 1,
        dim: 64,
        mla: true,
        blocks: POOL_BLOCKS,
    };
    let c = Case {
        shape,
        tp: (2, 2),
        block: (16, 16),
        order: KvOrder::Nhd,
        dst_order: Some(KvOrder::Hnd),
        tokens: 40,
        pad: 0,
        write: false,
    };
    let Setup {
        src,
        dst,
        sids,
        dids,
    } = setup("mla-orders-old", &c);
    let e = dst[0]
        .layout
        .plan_read(&sides(&src), &sids, &dids, c.tokens)
        .expect_err("the piece planner refuses other orders");
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    drop((src, dst));
    let plans = run_one("mla-orders", c, false);
    assert!(matches!(forms(&plans), (n, 0) if n > 0), "{plans:?}");
}

#[test]
fn each_peer_rank_has_its_own_block_ids() {
    // Prefill TP 2 -> decode TP 1: the two prefill ranks hold the request at different block
    // ids; decode gathers every head from where each rank keeps it. Pieces and tiles.
    let plans = run_one("own-ids", case((2, 1), (16, 16), KvOrder::Nhd, 50), true);
    assert_eq!(forms(&plans).1, 0);
    let plans = run_one(
        "own-ids-tiles",
        Case {
            dst_order: Some(KvOrder::Hnd),
            ..case((2, 1), (16, 16), KvOrder::Nhd, 50)
        },
        true,
    );
    assert!(forms(&plans).1 > 0);
    // A repeated or out-of-pool id of one peer is refused, naming that peer; nothing planned.
    let l = layout(2, 0, KvOrder::Nhd);
    let me = layout(1, 0, KvOrder::Nhd);
    let p1 = layout(2, 1, KvOrder::Nhd);
    let ok: Vec<u64> = (0..4).collect();
    let twice = [0u64, 1, 1, 2];
    let peers = [
        KvPeer {
            name: "p0",
            layout: &l,
            blocks: &ok,
        },
        KvPeer {
            name: "p1",
            layout: &p1,
            blocks: &twice,
        },
    ];
    let e = me
        .plan(XferOp::Read, &ok, &peers, 4 * 16)
        .expect_err("an id listed twice");
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    assert!(e.to_string().contains("peer p1"), "{e}");
}

const GQA8: KvShape = KvShape {
    layers: 3,
    heads: 8,
    dim: 16,
    mla: false,
    blocks: POOL_BLOCKS,
};

fn case(tp: (u32, u32), block: (u32, u32), order: KvOrder, tokens: u64) -> Case {
    Case {
        shape: GQA8,
        tp,
        block,
        order,
        dst_order: None,
        tokens,
        pad: 0,
        write: false,
    }
}

#[test]
fn tp1_to_tp2_each_decode_rank_reads_its_head_slice() {
    for order in [KvOrder::Nhd, KvOrder::Hnd] {
        let plans = run("t12", case((1, 2), (16, 16), order, 61));
        assert!(plans.iter().all(|p| p.transfers.len() == 1));
    }
}

#[test]
fn tp2_to_tp1_gathers_heads_from_both_prefill_ranks() {
    for order in [KvOrder::Nhd, KvOrder::Hnd] {
        let plans = run("t21", case((2, 1), (16, 16), order, 40));
        assert_eq!(plans[0].transfers.len(), 2);
    }
}

#[test]
fn tp2_to_tp4_and_tp4_to_tp2() {
    for order in [KvOrder::Nhd, KvOrder::Hnd] {
        run("t24", case((2, 4), (16, 16), order, 33));
        run("t42", case((4, 2), (16, 16), order, 48));
    }
}

#[test]
fn equal_tp_moves_whole_blocks_with_padded_strides() {
    let mut c = case((2, 2), (16, 16), KvOrder::Hnd, 64);
    c.pad = 64;
    let plans = run("t22", c);
    // 4 whole blocks per tensor, 3 layers x 2 tensors, scattered ids: one piece per block.
    for p in &plans {
        assert_eq!(p.pieces(), 4 * 6, "{p:?}");
    }
}

#[test]
fn prefill_blocks_smaller_and_larger_than_decode_blocks() {
    for order in [KvOrder::Nhd, KvOrder::Hnd] {
        run("b1632", case((1, 2), (16, 32), order, 70));
        run("b3216", case((2, 1), (32, 16), order, 70));
    }
}

#[test]
fn replicated_heads_when_tp_exceeds_the_head_count() {
    let shape = KvShape { heads: 2, ..GQA8 };
    for tp in [(4, 1), (1, 4), (4, 2)] {
        run(
            "rep",
            Case {
                shape,
                tp,
                block: (16, 16),
                order: KvOrder::Nhd,
                dst_order: None,
                tokens: 30,
                pad: 0,
                write: false,
            },
        );
    }
}

#[test]
fn mla_latent_is_read_once_from_one_rank() {
    let shape = KvShape {
        layers: 2,
        heads: 1,
        dim: 64,
        mla: true,
        blocks: POOL_BLOCKS,
    };
    let plans = run(
        "mla",
        Case {
            shape,
            tp: (2, 4),
            block: (16, 16),
            order: KvOrder::Nhd,
            dst_order: None,
            tokens: 50,
            pad: 0,
            write: false,
        },
    );
    for p in &plans {
        assert_eq!(p.transfers.len(), 1, "{p:?}");
    }
    // The four decode ranks spread over the two prefill ranks.
    let peers: std::collections::BTreeSet<&str> =
        plans.iter().map(|p| p.transfers[0].peer.as_str()).collect();
    assert_eq!(peers.len(), 2);
}

#[test]
fn prefill_writes_land_the_same_bytes_as_decode_reads() {
    let mut c = case((2, 4), (16, 32), KvOrder::Hnd, 77);
    c.write = true;
    run("w24", c);
    let mut c = case((4, 1), (32, 16), KvOrder::Nhd, 40);
    c.write = true;
    run("w41", c);
}

/// Every TP pair, block-size pair and order pair the issue names, as tile plans over INPROC
/// (the CPU copy of the rows; CUDA_IPC's kernel runs the same tiles, nixl-mem's tests):
/// each element lands in the destination's order.
#[test]
fn tile_plans_permute_hnd_and_nhd_in_one_pass() {
    let orders = [
        (KvOrder::Hnd, KvOrder::Nhd),
        (KvOrder::Nhd, KvOrder::Hnd),
        (KvOrder::Nhd, KvOrder::Nhd),
        (KvOrder::Hnd, KvOrder::Hnd),
    ];
    for (so, dst_order) in orders {
        for (tp, block, tokens) in [
            ((1, 1), (16, 16), 64),
            ((1, 2), (16, 16), 61),
            ((2, 1), (16, 16), 40),
            ((2, 4), (16, 32), 77),
            ((4, 2), (32, 16), 48),
        ] {
            let mut c = case(tp, block, so, tokens);
            c.dst_order = Some(dst_order);
            let plans = run_tiles("tile", c);
            assert!(plans.iter().all(|p| !p.transfers.is_empty()));
        }
    }
}

#[test]
fn tile_plans_for_replicated_heads_mla_and_prefill_writes() {
    let shape = KvShape { heads: 2, ..GQA8 };
    for tp in [(4, 1), (1, 4), (4, 2)] {
        for (o, d) in [(KvOrder::Hnd, KvOrder::Nhd), (KvOrder::Nhd, KvOrder::Hnd)] {
            let mut c = case(tp, (16, 32), o, 45);
            c.shape = shape;
            c.dst_order = Some(d);
            run_tiles("trep", c);
        }
    }
    let mla = KvShape {
        layers: 2,
        heads: 1,
        dim: 64,
        mla: true,
        blocks: POOL_BLOCKS,
    };
    let mut c = case((2, 4), (16, 16), KvOrder::Hnd, 50);
    c.shape = mla;
    c.dst_order = Some(KvOrder::Nhd);
    run_tiles("tmla", c);
    for (tp, block) in [((2, 4), (16, 32)), ((4, 1), (32, 16))] {
        let mut c = case(tp, block, KvOrder::Hnd, 70);
        c.dst_order = Some(KvOrder::Nhd);
        c.write = true;
        run_tiles("twr", c);
    }
}

/// Llama-3-8B's heterogeneous-TP request as tiles (TP 2 HND -> TP 1 NHD, 2048 blocks): one
/// tile per (rank, block), the same in every layer: 2 x 2048 tiles, nothing per element.
#[test]
fn tile_plans_are_per_block_at_llama_scale() {
    let llama = |tp: u32, r: u32, order: KvOrder| {
        let mut l = layout(tp, r, order);
        l.layers = 32;
        l.blocks = 4096;
        let bb = l.block_bytes();
        l.tensors = (0..64)
            .map(|i| KvTensor {
                base: (1 << 40) + i * 4096 * bb,
                block_stride: bb,
            })
            .collect();
        l
    };
    let d = llama(1, 0, KvOrder::Nhd);
    let (p0, p1) = (llama(2, 0, KvOrder::Hnd), llama(2, 1, KvOrder::Hnd));
    let ids: Vec<u64> = (0..2048).map(|i| (i * 7) % 4096).collect();
    let plan = d
        .plan_read_tiles(&[("p0", &p0), ("p1", &p1)], &ids, &ids, 2048 * 16)
        .unwrap();
    assert_eq!(plan.transfers.len(), 2);
    assert_eq!(plan.tiles(), 2 * 2048);
    for t in &plan.transfers {
        assert_eq!((t.shape.outer, t.shape.inner, t.shape.row), (4, 16, 256));
    }
    assert_eq!(plan.bytes(), 2048 * 16 * 8 * 256 * 64);
}

/// A tile request's bad inputs are typed and leave nothing behind; a transport that moves
/// bytes as they lie refuses tiles by name.
#[test]
fn tile_requests_refuse_bad_tiles_typed() {
    use nixl_core::tiles::{RowStrides, Tile, TileShape};
    use nixl_core::{StridedDesc, StridedDescList};
    let a = rank("trefa", GQA8, 1, 0, 16, KvOrder::Nhd, 0);
    let b = rank("trefb", GQA8, 1, 0, 16, KvOrder::Hnd, 0);
    connect(std::slice::from_ref(&a), std::slice::from_ref(&b));
    let mine = a
        .agent
        .prep_strided_dlist(XferTarget::Initiator, &a.layout.block_table(), &[])
        .unwrap();
    let theirs = a
        .agent
        .prep_strided_dlist(
            XferTarget::Agent(b.agent.name()),
            &b.layout.block_table(),
            &[],
        )
        .unwrap();
    let row = 16 * 4;
    let shape = TileShape::new(
        8,
        16,
        row,
        RowStrides::new(row, 8 * row),
        RowStrides::new(16 * row, row),
    );
    let tile = |lb, lo, rb, ro| Tile {
        local_block: lb,
        local_offset: lo,
        remote_block: rb,
        remote_offset: ro,
    };
    let make = |s: &TileShape, t: &[Tile]| {
        a.agent.make_tile_xfer(
            nixl_core::XferOp::Read,
            &mine,
            &theirs,
            s,
            t,
            XferOptions::default(),
        )
    };
    // Sound: one whole block permuted.
    drop(make(&shape, &[tile(0, 0, 1, 0)]).unwrap());
    let kind = |r: nixl_core::Result<nixl_core::XferReq>| r.unwrap_err().kind();
    assert_eq!(kind(make(&shape, &[])), ErrorKind::InvalidParam);
    assert_eq!(
        kind(make(&shape, &[tile(POOL_BLOCKS, 0, 0, 0)])),
        ErrorKind::InvalidParam
    );
    assert_eq!(
        kind(make(&shape, &[tile(0, 16, 0, 0)])),
        ErrorKind::InvalidParam
    );
    // Two tiles landing in the same destination block.
    assert_eq!(
        kind(make(&shape, &[tile(2, 0, 0, 0), tile(2, 0, 1, 0)])),
        ErrorKind::InvalidParam
    );
    let mut bad = shape;
    bad.local = RowStrides::new(row / 2, 8 * row);
    assert_eq!(
        kind(make(&bad, &[tile(0, 0, 0, 0)])),
        ErrorKind::InvalidParam
    );
    let e = a
        .agent
        .make_tile_xfer(
            nixl_core::XferOp::Read,
            &mine,
            &theirs,
            &shape,
            &[tile(0, 0, 1, 0)],
            XferOptions::default().integrity(true),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported);
    // Lists that are not block tables.
    let flat = a
        .agent
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &a.layout.block_table().to_desc_list(),
            &[],
        )
        .unwrap();
    let e = a
        .agent
        .make_tile_xfer(
            nixl_core::XferOp::Read,
            &flat,
            &theirs,
            &shape,
            &[tile(0, 0, 1, 0)],
            XferOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam);
    // Fewer layers on one side.
    let one = StridedDescList::from_descs(
        MemKind::Dram,
        [StridedDesc::new(
            a.layout.tensors[0].base,
            a.layout.block_bytes(),
            a.layout.block_bytes(),
            POOL_BLOCKS,
        )],
    );
    let one = a
        .agent
        .prep_strided_dlist(XferTarget::Initiator, &one, &[])
        .unwrap();
    let e = make_with(&a.agent, &one, &theirs, &shape);
    assert_eq!(e.kind(), ErrorKind::Mismatch);
    // Nothing was kept: the sound request still builds and moves.
    let req = make(&shape, &[tile(3, 0, 4, 0)]).unwrap();
    a.agent.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(10)).unwrap();
}

fn make_with(
    a: &Agent,
    l: &nixl_core::PreparedList,
    r: &nixl_core::PreparedList,
    s: &nixl_core::tiles::TileShape,
) -> nixl_core::Error {
    a.make_tile_xfer(
        nixl_core::XferOp::Read,
        l,
        r,
        s,
        &[nixl_core::tiles::Tile {
            local_block: 0,
            local_offset: 0,
            remote_block: 0,
            remote_offset: 0,
        }],
        XferOptions::default(),
    )
    .unwrap_err()
}

fn layout(tp: u32, r: u32, order: KvOrder) -> KvLayout {
    let mut l = KvLayout::new("m", 2, 16, 8, 128, 2)
        .order(order)
        .tp(r, tp)
        .blocks(64);
    let bb = l.block_bytes();
    l.tensors = (0..4)
        .map(|i| KvTensor {
            base: 1 << 30 | (i << 24),
            block_stride: bb,
        })
        .collect();
    l
}

#[test]
fn refusals_are_typed() {
    let d = layout(1, 0, KvOrder::Nhd);
    let p = layout(1, 0, KvOrder::Hnd);
    let ids: Vec<u64> = (0..4).collect();
    let e = d.plan_read(&[("p", &p)], &ids, &ids, 64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert!(e.to_string().contains("HND -> NHD permute"), "{e}");

    let mut other = layout(1, 0, KvOrder::Nhd);
    other.head_dim = 64;
    other.tensors.iter_mut().for_each(|t| t.block_stride /= 2);
    let e = d.plan_read(&[("p", &other)], &ids, &ids, 64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Mismatch, "{e}");
    let mut other = layout(1, 0, KvOrder::Nhd);
    other.model = "another".into();
    assert_eq!(
        d.check_compatible(&other).unwrap_err().kind(),
        ErrorKind::Mismatch
    );

    let same = layout(1, 0, KvOrder::Nhd);
    let e = d
        .plan_read(&[("p", &same)], &[0, 1, 2, 64], &ids, 64)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    let e = d.plan_read(&[("p", &same)], &ids, &ids, 65).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    // A side of TP 2 with one rank given.
    let half = layout(2, 1, KvOrder::Nhd);
    let e = d.plan_read(&[("p1", &half)], &ids, &ids, 64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    let e = d.plan_read(&[], &ids, &ids, 64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");

    let mut bad = layout(2, 0, KvOrder::Nhd);
    bad.kv_heads = 8;
    assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::InvalidParam);
    let mut bad = layout(1, 0, KvOrder::Nhd);
    bad.tensors.pop();
    assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::InvalidParam);
    // A peer that lies about its TP size or head count (the planner sizes tables and loops by
    // them) is refused before any planning.
    let mut liar = layout(1, 0, KvOrder::Nhd);
    liar.tp_size = u32::MAX;
    liar.kv_heads = 1;
    assert_eq!(liar.validate().unwrap_err().kind(), ErrorKind::InvalidParam);
    let e = d.plan_read(&[("liar", &liar)], &ids, &ids, 64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    assert_eq!(
        KvLayout::decode(&liar.encode()).unwrap_err().kind(),
        ErrorKind::InvalidParam
    );
    let mut liar = layout(1, 0, KvOrder::Nhd);
    liar.model_kv_heads = u32::MAX;
    assert_eq!(liar.validate().unwrap_err().kind(), ErrorKind::InvalidParam);
    let mut bad = layout(1, 0, KvOrder::Nhd);
    bad.tensors[0].base = u64::MAX - 10;
    assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::InvalidParam);
}

#[test]
fn descriptions_round_trip_and_hostile_bytes_are_typed() {
    let l = layout(2, 1, KvOrder::Hnd);
    let bytes = l.encode();
    assert_eq!(KvLayout::decode(&bytes).unwrap(), l);
    for cut in 0..bytes.len() {
        let e = KvLayout::decode(&bytes[..cut]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Decode, "prefix {cut}: {e}");
    }
    let mut more = bytes.clone();
    more.push(0);
    assert_eq!(
        KvLayout::decode(&more).unwrap_err().kind(),
        ErrorKind::Decode
    );
    // Every single-byte change decodes to a valid description or a typed error.
    for i in 0..bytes.len() {
        for v in [0u8, 0xFF, bytes[i] ^ 1] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Err(e) = KvLayout::decode(&b) {
                assert!(
                    matches!(e.kind(), ErrorKind::Decode | ErrorKind::InvalidParam),
                    "{e}"
                );
            }
        }
    }
}

#[test]
fn plans_grow_linearly_with_blocks_at_llama_scale() {
    // Llama-3-8B: 32 layers, 8 KV heads of 128, bf16, 16 tokens per block; TP 1 -> TP 2.
    let llama = |tp: u32, r: u32, order: KvOrder| {
        let mut l = layout(tp, r, order);
        l.layers = 32;
        l.blocks = 4096;
        let bb = l.block_bytes();
        l.tensors = (0..64)
            .map(|i| KvTensor {
                base: (1 << 40) + (i << 32),
                block_stride: bb,
            })
            .collect();
        l
    };
    for order in [KvOrder::Hnd, KvOrder::Nhd] {
        let p = llama(1, 0, order);
        let d = llama(2, 1, order);
        let pieces = |n: u64| {
            let ids: Vec<u64> = (0..n).map(|i| (i * 7) % 4096).collect();
            let plan = d.plan_read(&[("p", &p)], &ids, &ids, n * 16).unwrap();
            assert_eq!(plan.bytes(), n * 16 * 4 * 128 * 2 * 64);
            plan.pieces()
        };
        let (a, b) = (pieces(1024), pieces(2048));
        assert_eq!(
            b,
            2 * a,
            "{order:?}: {a} pieces for 1024 blocks, {b} for 2048"
        );
    }
}
