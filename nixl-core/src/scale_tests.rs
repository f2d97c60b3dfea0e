//! Scale tests that count operations (see `work`), not time: the work of preparing, building,
//! posting and releasing a request must grow linearly with its descriptors (131,072 against
//! 1,024), a block-table request's with its layers and ids (never with its blocks), and
//! registration's must stay flat over time.

// Exception to the crate's `deny(unsafe_code)`: tests build raw regions over their own buffers.
#![allow(unsafe_code)]

use std::sync::Arc;

use crate::mem::RawRegion;
use crate::work::take;
use crate::{
    Agent, AgentConfig, Desc, HostBuffer, InprocParams, MemKind, MemoryRegion, RegionDesc,
    StridedDesc, StridedDescList, XferDescList, XferOp, XferOptions, XferState, XferTarget,
};

/// Two agents over INPROC; the initiator has loaded the target.
fn agents(tag: &str) -> (Agent, Agent) {
    let a = Agent::new(&format!("scale-a-{tag}"), AgentConfig::default()).unwrap();
    let b = Agent::new(&format!("scale-b-{tag}"), AgentConfig::default()).unwrap();
    a.create_backend(InprocParams::default()).unwrap();
    b.create_backend(InprocParams::default()).unwrap();
    (a, b)
}

/// `len` bytes registered as `regions` equal regions; returns (buffer, registration).
fn memory(agent: &Agent, len: usize, regions: usize) -> (Arc<HostBuffer>, crate::Registration) {
    let buf = Arc::new(HostBuffer::new(len).unwrap());
    let per = len / regions;
    let views: Vec<Arc<dyn MemoryRegion>> = (0..regions)
        .map(|i| {
            // SAFETY: every view lies inside `buf`, which the caller keeps until after the
            // registration and every list and request built on it.
            let r = unsafe {
                RawRegion::new(RegionDesc::dram(buf.addr() + (i * per) as u64, per as u64))
            };
            Arc::new(r) as Arc<dyn MemoryRegion>
        })
        .collect();
    let reg = agent.register_mem(views, &[]).unwrap();
    (buf, reg)
}

/// A fixed permutation of `0..n`.
fn shuffle(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// Operations per descriptor of prep (both sides), make, post + check, and drop, for `n`
/// descriptors of 64 bytes over 64 regions per side (the target's in shuffled order).
fn flat_ops(n: usize) -> [f64; 4] {
    flat_ops_over(n, 64)
}

/// [`flat_ops`] over `regions` regions per side.
fn flat_ops_over(n: usize, regions: usize) -> [f64; 4] {
    const BLOCK: usize = 64;
    let (a, b) = agents(&format!("flat{n}-{regions}"));
    let (src, _ra) = memory(&a, n * BLOCK, regions);
    let (dst, _rb) = memory(&b, n * BLOCK, regions);
    src.fill_pattern(n as u64);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let ldescs = XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, n);
    let perm = shuffle(n);
    let rdescs = XferDescList::from_descs(
        MemKind::Dram,
        perm.iter()
            .map(|&p| Desc::new(dst.addr() + (p * BLOCK) as u64, BLOCK as u64)),
    );
    let idx: Vec<usize> = (0..n).collect();
    take();
    let (l, r) = prep_both(&a, &b, &ldescs, &rdescs);
    let prep = take();
    let req = a
        .make_prepped_xfer(XferOp::Write, &l, &idx, &r, &idx, XferOptions::default())
        .unwrap();
    let make = take();
    assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::Done);
    assert_eq!(a.check_xfer_state(&req).unwrap(), XferState::Done);
    let post = take();
    drop(req);
    drop((l, r));
    let release = take();
    // The data arrived (block i of the source is block perm[i] of the target).
    let (s, d) = (src.to_vec(), dst.to_vec());
    for (i, &p) in perm.iter().enumerate().step_by(997) {
        assert_eq!(s[i * BLOCK..(i + 1) * BLOCK], d[p * BLOCK..(p + 1) * BLOCK]);
    }
    [prep, make, post, release].map(|x| x as f64 / n as f64)
}

#[test]
fn request_work_is_linear_in_descriptors() {
    let small = flat_ops(1024);
    let large = flat_ops(131_072);
    for (i, step) in ["prep", "make", "post", "release"].iter().enumerate() {
        assert!(
            large[i] <= 1.5 * small[i].max(1.0),
            "{step}: {:.2} operations per descriptor at 131072, {:.2} at 1024",
            large[i],
            small[i]
        );
    }
    // A small constant too: a few steps per descriptor, not a scan of anything.
    let total: f64 = large.iter().sum();
    assert!(
        total < 40.0,
        "{total:.1} operations per descriptor at 131072"
    );
}

/// A request shares its lists' metadata tables: its make does nothing per region of the lists
/// (before, it cloned every region's metadata into the request: 6.0 operations per descriptor
/// over 4096 regions against 4.0 over 64). Release is held to the same bound.
#[test]
fn make_does_no_work_per_region_of_its_lists() {
    let n = 8192;
    let few = flat_ops_over(n, 64);
    let many = flat_ops_over(n, 4096);
    for (i, step) in ["make", "release"].iter().enumerate() {
        let i = [1, 3][i];
        assert!(
            many[i] <= few[i] + 0.25,
            "{step}: {:.3} operations per descriptor over 4096 regions, {:.3} over 64",
            many[i],
            few[i]
        );
    }
}

/// A block table of `layers` layers of `pool` blocks of 64 bytes on `agent`'s memory (one
/// region per layer).
fn table(
    agent: &Agent,
    layers: usize,
    pool: u64,
) -> (Arc<HostBuffer>, crate::Registration, StridedDescList) {
    let per = pool as usize * 64;
    let (buf, reg) = memory(agent, layers * per, layers);
    let t = StridedDescList::from_descs(
        MemKind::Dram,
        (0..layers).map(|l| StridedDesc::new(buf.addr() + (l * per) as u64, 64, 64, pool)),
    );
    (buf, reg, t)
}

/// Operations of prep (both sides) and build of a block request: `layers` layers, `ids`
/// block ids (not consecutive), pool `pool`.
fn block_ops(layers: usize, ids: usize, pool: u64) -> (u64, u64) {
    let (a, b) = agents(&format!("blocks{layers}-{ids}-{pool}"));
    let (_sb, _ra, lt) = table(&a, layers, pool);
    let (_db, _rb, rt) = table(&b, layers, pool);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let lids: Vec<usize> = (0..ids).map(|i| (i * 7) % pool as usize).collect();
    let rids: Vec<usize> = (0..ids).map(|i| (i * 5 + 3) % pool as usize).collect();
    take();
    let l = a
        .prep_strided_dlist(XferTarget::Initiator, &lt, &[])
        .unwrap();
    let r = a
        .prep_strided_dlist(XferTarget::Agent(b.name()), &rt, &[])
        .unwrap();
    let prep = take();
    let req = a
        .make_block_xfer(XferOp::Write, &l, &lids, &r, &rids, XferOptions::default())
        .unwrap();
    let build = take();
    assert!(req.path().contains("strided"), "{}", req.path());
    assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::Done);
    (prep, build)
}

#[test]
fn block_request_work_grows_with_layers_and_ids_not_blocks() {
    // Validation is O(layers): the same table with 64x more blocks per layer costs the same.
    let (prep_small, _) = block_ops(64, 16, 64);
    let (prep_big, _) = block_ops(64, 16, 4096);
    assert_eq!(prep_small, prep_big, "prep counted blocks");
    // Building 64 layers x 2,048 ids (131,072 blocks) is linear in layers + ids.
    let (_, build_small) = block_ops(64, 16, 4096);
    let (_, build_big) = block_ops(64, 2048, 4096);
    let per = |ops: u64, ids: usize| ops as f64 / (64 + ids) as f64;
    assert!(
        per(build_big, 2048) <= 1.5 * per(build_small, 16),
        "build: {build_big} operations for 64 + 2048, {build_small} for 64 + 16"
    );
    assert!(
        build_big < 20 * (64 + 2048),
        "{build_big} operations for 131072 blocks"
    );
}

#[test]
fn registration_cost_stays_flat() {
    let (a, _b) = agents("reg-flat");
    let buf = Arc::new(HostBuffer::new(10_000 * 64).unwrap());
    let mut regs = Vec::new();
    let mut costs = Vec::new();
    for i in 0..10_000u64 {
        // SAFETY: inside `buf`, which outlives the registrations.
        let r = unsafe { RawRegion::new(RegionDesc::dram(buf.addr() + i * 64, 64)) };
        take();
        regs.push(a.register_mem(vec![Arc::new(r)], &[]).unwrap());
        costs.push(take());
    }
    for r in regs.drain(..) {
        take();
        a.deregister_mem(&r).unwrap();
        costs.push(take());
    }
    let sum = |s: &[u64]| s.iter().sum::<u64>();
    assert!(
        sum(&costs[9000..10_000]) <= sum(&costs[..1000]),
        "registration grew"
    );
    assert!(
        sum(&costs[19_000..]) <= sum(&costs[10_000..11_000]),
        "deregistration grew"
    );
}

/// Two agents with one registered region of `n` blocks of 64 bytes each, and `a`'s prepared
/// lists of every block of both (NIXL's shape for a pool of one allocation). Fields drop in
/// order: the lists before the memory, the memory before the agents.
struct OneRegion {
    l: crate::PreparedList,
    r: crate::PreparedList,
    _mem: [(Arc<HostBuffer>, crate::Registration); 2],
    a: Agent,
    _b: Agent,
}

impl OneRegion {
    const BLOCK: u64 = 64;

    fn new(tag: &str, n: usize) -> Self {
        let (a, b) = agents(tag);
        let (src, dst) = (
            memory(&a, n * Self::BLOCK as usize, 1),
            memory(&b, n * Self::BLOCK as usize, 1),
        );
        a.load_remote_metadata(&b.local_metadata().unwrap())
            .unwrap();
        let list = |base: u64| XferDescList::blocks(MemKind::Dram, base, Self::BLOCK, n);
        let l = a
            .prep_xfer_dlist(XferTarget::Initiator, &list(src.0.addr()), &[])
            .unwrap();
        let r = a
            .prep_xfer_dlist(XferTarget::Agent(b.name()), &list(dst.0.addr()), &[])
            .unwrap();
        OneRegion {
            l,
            r,
            _mem: [src, dst],
            a,
            _b: b,
        }
    }

    /// A WRITE of the pairs `idx` over the two lists.
    fn make(&self, idx: (&[usize], &[usize])) -> crate::Result<crate::XferReq> {
        self.a.make_prepped_xfer(
            XferOp::Write,
            &self.l,
            idx.0,
            &self.r,
            idx.1,
            XferOptions::default(),
        )
    }
}

/// Operations of `make_prepped_xfer` over flat lists of one region per side (`layers` x
/// `pool` blocks of 64 bytes, [`OneRegion`]) for the indices `(local, remote)`; returns
/// (operations, the request's path).
fn one_region_make(
    tag: &str,
    layers: usize,
    pool: usize,
    idx: (&[usize], &[usize]),
) -> (u64, String) {
    let one = OneRegion::new(tag, layers * pool);
    take();
    let req = one.make(idx).unwrap();
    let make = take();
    assert_eq!(one.a.post_xfer_req(&req).unwrap(), XferState::Done);
    (make, req.path())
}

/// `layers` groups of the same `ids` (distinct, below `pool`), layer after layer.
fn layered(layers: usize, pool: usize, ids: &[usize]) -> Vec<usize> {
    (0..layers)
        .flat_map(|l| ids.iter().map(move |&i| l * pool + i))
        .collect()
}

#[test]
fn one_region_period_search_is_linear() {
    const LAYERS: usize = 32;
    const POOL: usize = 8192;
    // The main job's shape: the same shuffled ids in every layer, split into 32 layers.
    let per_desc = |ids: usize| {
        let (li, ri) = (
            shuffle(POOL),
            shuffle(POOL).into_iter().rev().collect::<Vec<_>>(),
        );
        let (l, r) = (
            layered(LAYERS, POOL, &li[..ids]),
            layered(LAYERS, POOL, &ri[..ids]),
        );
        let (ops, path) = one_region_make(&format!("period{ids}"), LAYERS, POOL, (&l, &r));
        assert!(path.contains("block table: 32 layers"), "{path}");
        ops as f64 / l.len() as f64
    };
    let (small, large) = (per_desc(32), per_desc(4096));
    assert!(
        large <= 1.5 * small,
        "make: {large:.2} operations per descriptor at 131072, {small:.2} at 1024"
    );
    // A list periodic for every even period but its last index: each candidate period is
    // compared almost to the end. The search gives up after a few passes (the request is then
    // one layer), never one pass per divisor of the length (15 here).
    let n = LAYERS * 4096;
    let local: Vec<usize> = (0..n).collect();
    let mut remote: Vec<usize> = (0..n).map(|j| j ^ 1).collect();
    remote[n - 1] = n + 7;
    let (ops, path) = one_region_make("period-hostile", LAYERS, POOL, (&local, &remote));
    assert!(path.contains("block table: 1 layers"), "{path}");
    let hostile = ops as f64 / n as f64;
    // The one-layer request's own steps (about 6 per descriptor) and at most 4 passes of the
    // search (without the bound: 20 per descriptor here).
    assert!(
        hostile <= 12.0,
        "make: {hostile:.2} operations per descriptor for a list periodic but for its end ({large:.2} for the main job's shape)"
    );
}

/// The main job's ids (`disagg_kv`: the source's blocks consecutive, the destination's slots
/// at a stride of about half the pool) are periodic for many candidate periods until a wrap or
/// a layer's end: the search screens each candidate at a few spread positions before comparing
/// it in full, so it costs what a list of shuffled ids costs (one comparison per index for the
/// true period), not a pass per near-miss.
#[test]
fn one_region_period_search_screens_near_misses() {
    const LAYERS: usize = 4;
    const POOL: usize = 16384;
    const IDS: usize = 2048;
    let stride = POOL / 2 + 1;
    let engine: (Vec<usize>, Vec<usize>) = (
        (0..IDS).map(|k| 4096 + k).collect(),
        (0..IDS).map(|k| (77 + k * stride) % POOL).collect(),
    );
    let shuffled: (Vec<usize>, Vec<usize>) = (
        shuffle(POOL)[..IDS].to_vec(),
        shuffle(POOL).into_iter().rev().take(IDS).collect(),
    );
    let per_desc = |tag: &str, (li, ri): &(Vec<usize>, Vec<usize>)| {
        let (l, r) = (layered(LAYERS, POOL, li), layered(LAYERS, POOL, ri));
        let (ops, path) = one_region_make(tag, LAYERS, POOL, (&l, &r));
        assert!(path.contains("block table: 4 layers"), "{path}");
        ops as f64 / l.len() as f64
    };
    let (e, s) = (
        per_desc("period-engine", &engine),
        per_desc("period-shuffled", &shuffled),
    );
    assert!(
        e <= s + 0.5,
        "make: {e:.2} operations per descriptor for the main job's ids, {s:.2} for shuffled ids"
    );
}

/// Indices at the top of `usize` shaped like a period (steps of one, a group of four) are a
/// typed error over lists of one region, never an overflow in the period search.
#[test]
fn period_shaped_indices_near_the_top_of_usize_are_refused() {
    let one = OneRegion::new("period-top", 64);
    let top: Vec<usize> = (0..8).map(|i| usize::MAX - 7 + i).collect();
    let scattered: Vec<usize> = vec![9, 3, 17, 5, 13, 7, 21, 11];
    for (li, ri) in [(&top, &scattered), (&scattered, &top), (&top, &top)] {
        let e = one.make((li, ri)).unwrap_err();
        assert!(matches!(e, crate::Error::InvalidParam { .. }), "{e}");
    }
}

/// A descriptor list that is a block table (every block of each region, region after region:
/// vLLM's lists) prepares in work proportional to its layers, not its descriptors, and stays a
/// descriptor list to its caller: flat indices build requests from it (here random ones, every
/// byte checked), block ids are refused. A list of the same descriptors shuffled keeps one
/// entry per descriptor.
/// `a`'s list `ldescs` and `b`'s `rdescs`, prepared by `a`.
fn prep_both(
    a: &Agent,
    b: &Agent,
    ldescs: &XferDescList,
    rdescs: &XferDescList,
) -> (crate::PreparedList, crate::PreparedList) {
    let l = a
        .prep_xfer_dlist(XferTarget::Initiator, ldescs, &[])
        .unwrap();
    let r = a
        .prep_xfer_dlist(XferTarget::Agent(b.name()), rdescs, &[])
        .unwrap();
    (l, r)
}

#[test]
fn a_descriptor_list_shaped_as_a_table_prepares_per_layer() {
    const BLOCK: usize = 64;
    let (layers, per) = (32usize, 2048usize);
    let n = layers * per;
    let (a, b) = agents("table-shaped");
    let (src, _ra) = memory(&a, n * BLOCK, layers);
    let (dst, _rb) = memory(&b, n * BLOCK, layers);
    src.fill_pattern(7);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let ldescs = XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK as u64, n);
    let rdescs = XferDescList::blocks(MemKind::Dram, dst.addr(), BLOCK as u64, n);
    take();
    let (l, r) = prep_both(&a, &b, &ldescs, &rdescs);
    let prep = take();
    // A few operations per layer and list (resolution, metadata tables, the footprint's
    // layer spans and region bounds), none per block.
    assert!(
        prep < 20 * layers as u64 + 64,
        "{prep} operations to prepare two lists of {layers} layers x {per} blocks"
    );
    assert_eq!((l.len(), l.layers()), (n, 0), "still a descriptor list");
    let refused = a
        .make_block_xfer(XferOp::Write, &l, &[0], &r, &[0], XferOptions::default())
        .unwrap_err();
    assert_eq!(refused.kind(), crate::ErrorKind::InvalidParam);
    // Random pairs over the whole lists land exactly.
    let (li, ri) = (shuffle(n), shuffle(n).into_iter().rev().collect::<Vec<_>>());
    let (li, ri) = (&li[..4096], &ri[..4096]);
    let req = a
        .make_prepped_xfer(XferOp::Write, &l, li, &r, ri, XferOptions::default())
        .unwrap();
    assert_eq!(a.post_xfer_req(&req).unwrap(), XferState::Done);
    let (s, d) = (src.to_vec(), dst.to_vec());
    let mut written = vec![false; n];
    for (&x, &y) in li.iter().zip(ri) {
        assert_eq!(s[x * BLOCK..(x + 1) * BLOCK], d[y * BLOCK..(y + 1) * BLOCK]);
        written[y] = true;
    }
    for (y, w) in written.iter().enumerate() {
        if !w {
            assert!(
                d[y * BLOCK..(y + 1) * BLOCK].iter().all(|&x| x == 0),
                "block {y}"
            );
        }
    }
    // The same descriptors shuffled: one entry each.
    let perm = shuffle(n);
    let shuffled = XferDescList::from_descs(
        MemKind::Dram,
        perm.iter()
            .map(|&p| Desc::new(dst.addr() + (p * BLOCK) as u64, BLOCK as u64)),
    );
    take();
    let _s = a
        .prep_xfer_dlist(XferTarget::Agent(b.name()), &shuffled, &[])
        .unwrap();
    assert!(
        take() >= n as u64,
        "a shuffled list is prepared descriptor by descriptor"
    );
}
