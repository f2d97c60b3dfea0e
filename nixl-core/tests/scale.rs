//! Scale scenarios: a 100,000-region metadata load finishes and does not block transfers to
//! another peer or the load of another peer while it runs; block-table requests move exactly
//! the blocks they name, consumed as strides or materialized, and refuse bad input.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nixl_core::backend::fault::{FaultLog, FaultParams, FaultPlan};
use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, Error, HostBuffer, InprocParams, MemKind, MemoryRegion, RegionDesc, StridedDesc,
    StridedDescList, XferDescList, XferOp, XferOptions, XferTarget,
};
use nixl_testkit::{inproc_agent as agent, registered};

const REGIONS: usize = 100_000;

/// Registers `n` regions of 64 bytes (views of one buffer) on `agent`.
fn many_regions(agent: &Agent, n: usize) -> (Arc<HostBuffer>, nixl_core::Registration) {
    let buf = Arc::new(HostBuffer::new(n * 64).expect("alloc"));
    let views: Vec<Arc<dyn MemoryRegion>> = (0..n as u64)
        .map(|i| {
            // SAFETY: inside `buf`, which the test keeps until after the registration.
            let r = unsafe { RawRegion::new(RegionDesc::dram(buf.addr() + i * 64, 64)) };
            Arc::new(r) as Arc<dyn MemoryRegion>
        })
        .collect();
    let reg = agent.register_mem(views, &[]).expect("register");
    (buf, reg)
}

#[test]
fn a_100k_region_load_blocks_neither_transfers_nor_other_loads() {
    let a = agent("scale-init");
    let big = agent("scale-big");
    let small = agent("scale-small");
    let other = agent("scale-other");
    let (_bb, _breg) = many_regions(&big, REGIONS);
    let blob = big.local_metadata().expect("metadata");
    let (src, _ra) = registered(&a, 4096);
    let (dst, _rs) = registered(&small, 4096);
    let (_ob, _ro) = registered(&other, 4096);
    let other_blob = other.local_metadata().expect("metadata");
    a.load_remote_metadata(&small.local_metadata().expect("metadata"))
        .expect("load small");
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, src.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, dst.addr(), 4096, 1),
            small.name(),
            XferOptions::default(),
        )
        .expect("request");

    let loading = Arc::new(AtomicBool::new(false));
    let load_done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let loader = {
        let (a, loading, load_done) = (a.clone(), loading.clone(), load_done.clone());
        thread::spawn(move || {
            loading.store(true, Ordering::SeqCst);
            let r = a.load_remote_metadata(&blob);
            load_done.store(started.elapsed().as_micros() as u64 + 1, Ordering::SeqCst);
            loading.store(false, Ordering::SeqCst);
            r
        })
    };
    while !loading.load(Ordering::SeqCst) && load_done.load(Ordering::SeqCst) == 0 {
        thread::yield_now();
    }
    // Another peer's load, started while the big one runs.
    let other_loader = {
        let a = a.clone();
        thread::spawn(move || {
            let r = a.load_remote_metadata(&other_blob);
            (r, started.elapsed().as_micros() as u64)
        })
    };
    // Transfers to the small peer, counting those that began and ended inside the load.
    let mut inside = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while load_done.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        let before = loading.load(Ordering::SeqCst);
        src.fill(inside as u8);
        a.post_xfer_req(&req).expect("post");
        req.wait(Duration::from_secs(10)).expect("transfer");
        assert_eq!(dst.to_vec()[4095], inside as u8);
        if before && loading.load(Ordering::SeqCst) {
            inside += 1;
        }
    }
    let loaded = loader
        .join()
        .expect("loader thread")
        .expect("100k-region load");
    assert_eq!(loaded, big.name());
    let (other_result, other_end) = other_loader.join().expect("other loader thread");
    assert_eq!(other_result.expect("other load"), other.name());
    let big_end = load_done.load(Ordering::SeqCst);
    assert!(
        inside > 0,
        "no transfer completed during the {REGIONS}-region load ({big_end} us)"
    );
    assert!(
        other_end < big_end,
        "the small peer's load ended at {other_end} us, after the big one ({big_end} us)"
    );
    assert_eq!(
        a.remote_regions(big.name()).expect("regions").len(),
        REGIONS
    );
}

/// A block table over `layers` regions of `pool` blocks of `block` bytes (K and V per layer,
/// interleaved when `gap`), its memory filled with a pattern.
struct Table {
    buf: Arc<HostBuffer>,
    _reg: nixl_core::Registration,
    table: StridedDescList,
}

fn table(
    agent: &Agent,
    layers: usize,
    pool: u64,
    block: u64,
    interleaved: bool,
    seed: u64,
) -> Table {
    let layer_bytes = 2 * pool * block;
    let buf = Arc::new(HostBuffer::new((layers as u64 * layer_bytes) as usize).expect("alloc"));
    buf.fill_pattern(seed);
    let views: Vec<Arc<dyn MemoryRegion>> = (0..layers as u64)
        .map(|l| {
            // SAFETY: inside `buf`, kept by the table until after the registration.
            let r = unsafe {
                RawRegion::new(RegionDesc::dram(buf.addr() + l * layer_bytes, layer_bytes))
            };
            Arc::new(r) as Arc<dyn MemoryRegion>
        })
        .collect();
    let reg = agent.register_mem(views, &[]).expect("register");
    let mut t = StridedDescList::new(MemKind::Dram);
    for l in 0..layers as u64 {
        let at = buf.addr() + l * layer_bytes;
        for kv in 0..2 {
            t.push(if interleaved {
                StridedDesc::new(at + kv * block, 2 * block, block, pool)
            } else {
                StridedDesc::new(at + kv * pool * block, block, block, pool)
            });
        }
    }
    Table {
        buf,
        _reg: reg,
        table: t,
    }
}

/// What the target's bytes must be after moving `lids[k] -> rids[k]` in every layer.
fn expected(
    src: &Table,
    dst_before: &[u8],
    dst: &Table,
    lids: &[usize],
    rids: &[usize],
) -> Vec<u8> {
    let mut want = dst_before.to_vec();
    let s = src.buf.to_vec();
    for (ls, rs) in src.table.descs().iter().zip(dst.table.descs()) {
        for (&li, &ri) in lids.iter().zip(rids) {
            let from = (ls.block(li as u64).unwrap().addr - src.buf.addr()) as usize;
            let to = (rs.block(ri as u64).unwrap().addr - dst.buf.addr()) as usize;
            let n = ls.len as usize;
            want[to..to + n].copy_from_slice(&s[from..from + n]);
        }
    }
    want
}

fn block_transfer(a: &Agent, b: &Agent, interleaved: bool, op: XferOp, want_path: &str) {
    let (layers, pool, block) = (6, 40, 96);
    let lt = table(a, layers, pool, block, interleaved, 1);
    let rt = table(b, layers, pool, block, interleaved, 2);
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load");
    // Ids as a block manager hands them out: runs and scattered ids.
    let lids = [3usize, 4, 5, 17, 9, 10, 39, 0];
    let rids = [20usize, 21, 22, 1, 30, 31, 2, 38];
    let l = a
        .prep_strided_dlist(XferTarget::Initiator, &lt.table, &[])
        .expect("prep local");
    let r = a
        .prep_strided_dlist(XferTarget::Agent(b.name()), &rt.table, &[])
        .expect("prep remote");
    assert_eq!(l.layers(), 2 * layers);
    assert_eq!(l.len(), 2 * layers * pool as usize);
    let (lb, rb) = (lt.buf.to_vec(), rt.buf.to_vec());
    let req = a
        .make_block_xfer(op, &l, &lids, &r, &rids, XferOptions::default())
        .expect("block request");
    assert!(req.path().contains(want_path), "{}", req.path());
    assert_eq!(req.total_bytes(), (2 * layers * lids.len()) as u64 * block);
    a.post_xfer_req(&req).expect("post");
    req.wait(Duration::from_secs(10)).expect("wait");
    match op {
        XferOp::Write => {
            assert_eq!(rt.buf.to_vec(), expected(&lt, &rb, &rt, &lids, &rids));
            assert_eq!(lt.buf.to_vec(), lb, "the source changed");
        }
        XferOp::Read => {
            assert_eq!(lt.buf.to_vec(), expected(&rt, &lb, &lt, &rids, &lids));
            assert_eq!(rt.buf.to_vec(), rb, "the source changed");
        }
    }
    // The same transfer by flat index over the same prepared lists moves the same bytes.
    lt.buf.fill_pattern(7);
    let lb = lt.buf.to_vec();
    let rb = rt.buf.to_vec();
    let flat = |ids: &[usize]| -> Vec<usize> {
        (0..2 * layers)
            .flat_map(|t| ids.iter().map(move |&i| t * pool as usize + i))
            .collect()
    };
    let req = a
        .make_prepped_xfer(
            op,
            &l,
            &flat(&lids),
            &r,
            &flat(&rids),
            XferOptions::default(),
        )
        .expect("flat request");
    a.post_xfer_req(&req).expect("post");
    req.wait(Duration::from_secs(10)).expect("wait");
    if op == XferOp::Write {
        assert_eq!(rt.buf.to_vec(), expected(&lt, &rb, &rt, &lids, &rids));
    } else {
        assert_eq!(lt.buf.to_vec(), expected(&rt, &lb, &lt, &rids, &lids));
    }
}

#[test]
fn block_tables_move_exactly_the_named_blocks() {
    for interleaved in [false, true] {
        for op in [XferOp::Write, XferOp::Read] {
            let (a, b) = (agent("blk-a"), agent("blk-b"));
            block_transfer(&a, &b, interleaved, op, "strided");
        }
    }
}

#[test]
fn backends_without_strides_get_materialized_segments() {
    // The fault-injection wrapper (with no faults planned) does not consume strides.
    let mk = |p: &str| {
        let a = Agent::new(&nixl_testkit::unique(p), Default::default()).expect("agent");
        a.create_backend(FaultParams::new(
            InprocParams::default(),
            FaultPlan::default(),
            FaultLog::new(),
        ))
        .expect("backend");
        a
    };
    for interleaved in [false, true] {
        let (a, b) = (mk("mat-a"), mk("mat-b"));
        block_transfer(&a, &b, interleaved, XferOp::Write, "materialized into");
    }
}

#[test]
fn bad_block_requests_are_refused_and_change_nothing() {
    let (a, b) = (agent("bad-a"), agent("bad-b"));
    let lt = table(&a, 2, 8, 64, false, 1);
    let rt = table(&b, 2, 8, 64, false, 2);
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load");
    let l = a
        .prep_strided_dlist(XferTarget::Initiator, &lt.table, &[])
        .expect("prep");
    let r = a
        .prep_strided_dlist(XferTarget::Agent(b.name()), &rt.table, &[])
        .expect("prep");
    let make = |li: &[usize], ri: &[usize]| {
        a.make_block_xfer(XferOp::Write, &l, li, &r, ri, XferOptions::default())
    };
    assert!(
        matches!(make(&[0, 8], &[0, 1]), Err(Error::InvalidParam { .. })),
        "local id past the end"
    );
    assert!(
        matches!(make(&[0, 1], &[9, 1]), Err(Error::InvalidParam { .. })),
        "remote id past the end"
    );
    assert!(
        matches!(make(&[], &[]), Err(Error::InvalidParam { .. })),
        "no ids"
    );
    assert!(
        matches!(make(&[0, 1], &[0]), Err(Error::Mismatch { .. })),
        "id counts"
    );
    // Block ids over descriptor lists.
    let flat_l = a
        .prep_xfer_dlist(XferTarget::Initiator, &lt.table.to_desc_list(), &[])
        .expect("flat prep");
    assert!(matches!(
        a.make_block_xfer(
            XferOp::Write,
            &flat_l,
            &[0],
            &r,
            &[0],
            XferOptions::default()
        ),
        Err(Error::InvalidParam { .. })
    ));
    // Layer counts and block lengths must match.
    let short = StridedDescList::from_descs(MemKind::Dram, lt.table.descs()[..3].iter().copied());
    let ls = a
        .prep_strided_dlist(XferTarget::Initiator, &short, &[])
        .expect("prep");
    assert!(matches!(
        a.make_block_xfer(XferOp::Write, &ls, &[0], &r, &[0], XferOptions::default()),
        Err(Error::Mismatch { .. })
    ));
    let halves = StridedDescList::from_descs(
        MemKind::Dram,
        lt.table
            .descs()
            .iter()
            .map(|d| StridedDesc::new(d.addr, d.stride, 32, d.count)),
    );
    let lh = a
        .prep_strided_dlist(XferTarget::Initiator, &halves, &[])
        .expect("prep");
    assert!(matches!(
        a.make_block_xfer(XferOp::Write, &lh, &[0], &r, &[0], XferOptions::default()),
        Err(Error::Mismatch { .. })
    ));
    // Malformed layers and layers outside one region.
    let base = lt.buf.addr();
    for (bad, what) in [
        (StridedDesc::new(base, 32, 64, 2), "overlapping blocks"),
        (StridedDesc::new(base, 64, 64, 0), "no blocks"),
        (StridedDesc::new(base, 64, 0, 2), "empty blocks"),
        (StridedDesc::new(u64::MAX - 64, 64, 64, 2), "overflow"),
    ] {
        let t = StridedDescList::from_descs(MemKind::Dram, [bad]);
        assert!(
            matches!(
                a.prep_strided_dlist(XferTarget::Initiator, &t, &[]),
                Err(Error::InvalidParam { .. })
            ),
            "{what}"
        );
    }
    // A layer spanning both registered regions (each is one layer of 2 x 8 blocks).
    let span = StridedDescList::from_descs(MemKind::Dram, [StridedDesc::new(base, 64, 64, 32)]);
    assert!(matches!(
        a.prep_strided_dlist(XferTarget::Initiator, &span, &[]),
        Err(Error::NotFound { .. })
    ));
    let empty = StridedDescList::new(MemKind::Dram);
    assert!(matches!(
        a.prep_strided_dlist(XferTarget::Initiator, &empty, &[]),
        Err(Error::InvalidParam { .. })
    ));
    // Nothing changed: a good request still moves its blocks.
    let before = rt.buf.to_vec();
    let req = make(&[1], &[2]).expect("good request");
    a.post_xfer_req(&req).expect("post");
    req.wait(Duration::from_secs(5)).expect("wait");
    assert_eq!(rt.buf.to_vec(), expected(&lt, &before, &rt, &[1], &[2]));
    // Lists and requests hold the memory; once they are gone it deregisters.
    assert!(matches!(
        a.deregister_mem(&lt._reg),
        Err(Error::NotAllowed { .. })
    ));
    drop((req, l, r, flat_l, ls, lh));
    a.deregister_mem(&lt._reg).expect("deregister");
}
