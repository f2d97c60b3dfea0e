//! Descriptor lists that are block tables in disguise (issue 37): NIXL's users prepare one
//! descriptor per layer and block, layer after layer, and build each request by index
//! (`layer * blocks + id` for the same ids in every layer). `make_prepped_xfer` recognises
//! that shape and builds the block-table request (O(layers + runs) in the backends that
//! consume strides) instead of one segment per descriptor; every other shape keeps the
//! descriptor path, and refusals stay in the lists' own terms. Every byte is checked, and
//! every byte outside the request stays untouched.

use std::sync::Arc;

use proptest::prelude::{Just, Strategy};
use std::time::Duration;

use nixl_core::{
    Agent, Desc, ErrorKind, HostBuffer, MemKind, PreparedList, Registration, XferDescList, XferOp,
    XferOptions, XferReq, XferTarget,
};
use nixl_testkit::{host_buf, inproc_agent};

const BLOCK: u64 = 4096;
const BLOCKS: u64 = 64;
const LAYERS: usize = 4;
/// The remote side's blocks sit `REMOTE_STRIDE` apart (not dense), the local side's packed.
const REMOTE_STRIDE: u64 = 2 * BLOCK;

struct Pair {
    a: Agent,
    _b: Agent,
    /// One buffer (one registered region) per layer, each side.
    src: Vec<Arc<HostBuffer>>,
    dst: Vec<Arc<HostBuffer>>,
    local: PreparedList,
    remote: PreparedList,
    _regs: (Registration, Registration),
}

/// `a`'s layers packed, `b`'s layers with gaps; `a` holds the flat lists of both (NIXL's
/// shape: region after region, every block of each).
fn pair(name: &str) -> Pair {
    let (a, b) = (
        inproc_agent(&format!("{name}-a")),
        inproc_agent(&format!("{name}-b")),
    );
    let src: Vec<_> = (0..LAYERS)
        .map(|l| {
            let s = host_buf((BLOCK * BLOCKS) as usize);
            s.fill_pattern(10 + l as u64);
            s
        })
        .collect();
    let dst: Vec<_> = (0..LAYERS)
        .map(|_| host_buf((REMOTE_STRIDE * BLOCKS) as usize))
        .collect();
    let regions = |v: &[Arc<HostBuffer>]| -> Vec<Arc<dyn nixl_core::MemoryRegion>> {
        v.iter()
            .map(|b| b.clone() as Arc<dyn nixl_core::MemoryRegion>)
            .collect()
    };
    let ra = a.register_mem(regions(&src), &[]).unwrap();
    let rb = b.register_mem(regions(&dst), &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let flat = |bufs: &[Arc<HostBuffer>], stride: u64| {
        XferDescList::from_descs(
            MemKind::Dram,
            bufs.iter().flat_map(|b| {
                let base = b.addr();
                (0..BLOCKS).map(move |i| Desc::new(base + i * stride, BLOCK))
            }),
        )
    };
    let local = a
        .prep_xfer_dlist(XferTarget::Initiator, &flat(&src, BLOCK), &[])
        .unwrap();
    let remote = a
        .prep_xfer_dlist(XferTarget::Agent(b.name()), &flat(&dst, REMOTE_STRIDE), &[])
        .unwrap();
    Pair {
        a,
        _b: b,
        src,
        dst,
        local,
        remote,
        _regs: (ra, rb),
    }
}

/// A local `(layer, block id)` and the remote one it pairs with.
type Pairing = ((usize, u64), (usize, u64));

/// Distinct pseudo-random block ids.
fn ids(n: usize, seed: u64) -> Vec<u64> {
    let mut all: Vec<u64> = (0..BLOCKS).collect();
    let mut x = seed | 1;
    for i in (1..all.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        all.swap(i, (x % (i as u64 + 1)) as usize);
    }
    all.truncate(n);
    all
}

/// `(layer, id)` pairs as flat indices.
fn index(pairs: &[(usize, u64)]) -> Vec<usize> {
    pairs
        .iter()
        .map(|&(l, i)| l * BLOCKS as usize + i as usize)
        .collect()
}

fn run(p: &Pair, req: &XferReq) {
    p.a.post_xfer_req(req).unwrap();
    req.wait(Duration::from_secs(10)).unwrap();
}

/// Every remote block is the local block its pair names, and every other remote byte zero.
fn check_written(p: &Pair, pairs: &[Pairing]) {
    let src: Vec<Vec<u8>> = p.src.iter().map(|b| b.to_vec()).collect();
    let mut want: Vec<Vec<u8>> = p.dst.iter().map(|b| vec![0; b.len()]).collect();
    for &((ll, li), (rl, ri)) in pairs {
        let (s, d) = ((li * BLOCK) as usize, (ri * REMOTE_STRIDE) as usize);
        want[rl][d..d + BLOCK as usize].copy_from_slice(&src[ll][s..s + BLOCK as usize]);
    }
    for (l, (b, w)) in p.dst.iter().zip(&want).enumerate() {
        assert!(
            b.to_vec() == *w,
            "remote layer {l} differs from the request"
        );
    }
}

/// The pairs of a request given as layer pairs and ids (the same ids in every layer).
fn layered(layers: &[(usize, usize)], local_ids: &[u64], remote_ids: &[u64]) -> Vec<Pairing> {
    layers
        .iter()
        .flat_map(|&(ll, rl)| {
            local_ids
                .iter()
                .zip(remote_ids)
                .map(move |(&li, &ri)| ((ll, li), (rl, ri)))
        })
        .collect()
}

fn make(p: &Pair, op: XferOp, pairs: &[Pairing]) -> nixl_core::Result<XferReq> {
    let (l, r): (Vec<_>, Vec<_>) = pairs.iter().copied().unzip();
    p.a.make_prepped_xfer(
        op,
        &p.local,
        &index(&l),
        &p.remote,
        &index(&r),
        XferOptions::default(),
    )
}

#[test]
fn layer_after_layer_indices_take_the_block_table_path() {
    let p = pair("flat-table");
    let (li, ri) = (ids(24, 7), ids(24, 11));
    // Every layer, and the remote layers in another order.
    let pairs = layered(&[(0, 3), (1, 2), (2, 1), (3, 0)], &li, &ri);
    let req = make(&p, XferOp::Write, &pairs).unwrap();
    let path = req.path();
    assert!(
        path.contains("block table: 4 layers x 24 blocks"),
        "a WRITE of the same ids in every layer is a block-table request: {path}"
    );
    run(&p, &req);
    check_written(&p, &pairs);
    // A READ of remote layer 3 into a fifth local layer (fresh memory) lands the blocks it
    // names there and nothing else.
    let back = host_buf((BLOCK * BLOCKS) as usize);
    let _r = p.a.register_mem(vec![back.clone()], &[]).unwrap();
    let local = XferDescList::from_descs(
        MemKind::Dram,
        p.src.iter().chain([&back]).flat_map(|b| {
            let base = b.addr();
            (0..BLOCKS).map(move |i| Desc::new(base + i * BLOCK, BLOCK))
        }),
    );
    let local =
        p.a.prep_xfer_dlist(XferTarget::Initiator, &local, &[])
            .unwrap();
    let l_idx = index(&li.iter().map(|&i| (LAYERS, i)).collect::<Vec<_>>());
    let r_idx = index(&ri.iter().map(|&i| (3, i)).collect::<Vec<_>>());
    let req =
        p.a.make_prepped_xfer(
            XferOp::Read,
            &local,
            &l_idx,
            &p.remote,
            &r_idx,
            XferOptions::default(),
        )
        .unwrap();
    assert!(
        req.path().contains("block table: 1 layers x 24 blocks"),
        "{}",
        req.path()
    );
    run(&p, &req);
    // Remote layer 3 holds local layer 0's blocks (the WRITE above): block li[k] of layer 0
    // went to ri[k], and comes back to li[k] of `back`.
    let (got, want) = (back.to_vec(), p.src[0].to_vec());
    for i in 0..BLOCKS {
        let s = (i * BLOCK) as usize;
        let block = &got[s..s + BLOCK as usize];
        if li.contains(&i) {
            assert!(
                block == &want[s..s + BLOCK as usize],
                "block {i} did not come back"
            );
        } else {
            assert!(block.iter().all(|&x| x == 0), "block {i} was not asked for");
        }
    }
}

#[test]
fn other_index_shapes_keep_the_descriptor_path() {
    let p = pair("flat-other");
    let (li, ri) = (ids(8, 3), ids(8, 5));
    // Block after block (every layer of one block, then the next block).
    let block_major: Vec<_> = li
        .iter()
        .zip(&ri)
        .flat_map(|(&l, &r)| (0..LAYERS).map(move |k| ((k, l), (k, r))))
        .collect();
    // Other ids in each layer.
    let (li2, ri2) = (ids(8, 13), ids(8, 17));
    let mut mixed = layered(&[(0, 0)], &li, &ri);
    mixed.extend(layered(&[(1, 1)], &li2, &ri2));
    // Groups of different lengths.
    let mut ragged = layered(&[(2, 2)], &li, &ri);
    ragged.extend(layered(&[(3, 3)], &li2[..3], &ri2[..3]));
    for (what, pairs) in [
        ("block major", block_major),
        ("mixed", mixed),
        ("ragged", ragged),
    ] {
        for b in &p.dst {
            b.fill(0);
        }
        let req = make(&p, XferOp::Write, &pairs).unwrap();
        let path = req.path();
        assert!(!path.contains("block table"), "{what}: {path}");
        run(&p, &req);
        check_written(&p, &pairs);
    }
}

#[test]
fn refusals_stay_in_the_lists_terms_and_nothing_moves() {
    let p = pair("flat-refused");
    let (li, ri) = (ids(8, 3), ids(8, 5));
    // One destination layer named twice: every destination index twice.
    let twice = layered(&[(0, 1), (2, 1)], &li, &ri);
    let e = make(&p, XferOp::Write, &twice).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    assert!(e.to_string().contains("listed twice"), "{e}");
    // An id repeated inside the groups.
    let mut dup = ri.clone();
    dup[1] = dup[0];
    let e = make(&p, XferOp::Write, &layered(&[(0, 0), (1, 1)], &li, &dup)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    assert!(e.to_string().contains("listed twice"), "{e}");
    // An index past the remote list's end, shaped like a fifth layer.
    let past: Vec<usize> = index(&ri.iter().map(|&i| (LAYERS, i)).collect::<Vec<_>>());
    let e =
        p.a.make_prepped_xfer(
            XferOp::Write,
            &p.local,
            &index(&li.iter().map(|&i| (0, i)).collect::<Vec<_>>()),
            &p.remote,
            &past,
            XferOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    assert!(e.to_string().contains("out of range"), "{e}");
    for (l, b) in p.dst.iter().enumerate() {
        assert!(
            b.to_vec().iter().all(|&x| x == 0),
            "layer {l}: nothing moved"
        );
    }
}

#[test]
fn lists_of_other_shapes_are_not_tables() {
    let p = pair("flat-shapes");
    // Blocks of two lengths in one layer: a mismatch, found pair by pair as before.
    let odd = XferDescList::from_descs(
        MemKind::Dram,
        (0..BLOCKS).map(|i| {
            let len = if i == 5 { BLOCK / 2 } else { BLOCK };
            Desc::new(p.src[0].addr() + i * BLOCK, len)
        }),
    );
    let odd =
        p.a.prep_xfer_dlist(XferTarget::Initiator, &odd, &[])
            .unwrap();
    let r: Vec<usize> = (0..8).collect();
    let e =
        p.a.make_prepped_xfer(
            XferOp::Write,
            &odd,
            &r,
            &p.remote,
            &r,
            XferOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Mismatch, "{e}");
    // Without the odd block, the same request moves.
    let l: Vec<usize> = (0..5).collect();
    let req =
        p.a.make_prepped_xfer(
            XferOp::Write,
            &odd,
            &l,
            &p.remote,
            &l,
            XferOptions::default(),
        )
        .unwrap();
    run(&p, &req);
    check_written(&p, &layered(&[(0, 0)], &[0, 1, 2, 3, 4], &[0, 1, 2, 3, 4]));
}

/// One region per side holding every layer, layer after layer (a KV pool of one allocation,
/// as the main job's): `a`'s blocks packed, `b`'s with gaps; `a` holds both flat lists.
struct OnePool {
    a: Agent,
    _b: Agent,
    src: Arc<HostBuffer>,
    dst: Arc<HostBuffer>,
    local: PreparedList,
    remote: PreparedList,
    _regs: (Registration, Registration),
}

fn one_pool(name: &str) -> OnePool {
    let (a, b) = (
        inproc_agent(&format!("{name}-a")),
        inproc_agent(&format!("{name}-b")),
    );
    let all = BLOCKS * LAYERS as u64;
    let src = host_buf((BLOCK * all) as usize);
    src.fill_pattern(21);
    let dst = host_buf((REMOTE_STRIDE * all) as usize);
    let ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let flat = |base: u64, stride: u64| {
        XferDescList::from_descs(
            MemKind::Dram,
            (0..all).map(move |i| Desc::new(base + i * stride, BLOCK)),
        )
    };
    let local = a
        .prep_xfer_dlist(XferTarget::Initiator, &flat(src.addr(), BLOCK), &[])
        .unwrap();
    let remote = a
        .prep_xfer_dlist(
            XferTarget::Agent(b.name()),
            &flat(dst.addr(), REMOTE_STRIDE),
            &[],
        )
        .unwrap();
    OnePool {
        a,
        _b: b,
        src,
        dst,
        local,
        remote,
        _regs: (ra, rb),
    }
}

/// What `pool` holds after `pairs` moved from `from` (blocks `from_step` apart) into it
/// (blocks `to_step` apart), starting from zeros.
fn moved(
    from: &[u8],
    from_step: u64,
    to_len: usize,
    to_step: u64,
    pairs: &[(usize, usize)],
) -> Vec<u8> {
    let mut want = vec![0u8; to_len];
    let b = BLOCK as usize;
    for &(f, t) in pairs {
        let (s, d) = (f * from_step as usize, t * to_step as usize);
        want[d..d + b].copy_from_slice(&from[s..s + b]);
    }
    want
}

/// Makes, posts and waits for a request by index over `p`'s lists; returns its path.
fn moved_by(p: &OnePool, op: XferOp, l: &[usize], r: &[usize]) -> String {
    let req =
        p.a.make_prepped_xfer(op, &p.local, l, &p.remote, r, XferOptions::default())
            .unwrap();
    p.a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(10)).unwrap();
    req.path()
}

/// A pool of one region is one layer of every block: where a request names the same ids in
/// layer after layer (its indices repeat with the layers' period), the request is a
/// block-table request of those layers (the ids' runs shared by every layer) rather than one
/// layer of every block it names. Other orders, and ids already in a few runs, stay one
/// layer; every byte lands either way and nothing else is written.
#[test]
fn one_region_pools_split_into_layers_by_the_ids_period() {
    let p = one_pool("flat-one-region");
    let (li, ri) = (ids(24, 7), ids(24, 11));
    let dense: Vec<u64> = (0..24).collect();
    let cases: [(&str, Vec<Pairing>, &str); 4] = [
        (
            "every layer",
            layered(&[(0, 0), (1, 1), (2, 2), (3, 3)], &li, &ri),
            "block table: 4 layers x 24 blocks",
        ),
        (
            "layers 1 to 3",
            layered(&[(1, 1), (2, 2), (3, 3)], &li, &ri),
            "block table: 3 layers x 24 blocks",
        ),
        (
            "remote layers reversed",
            layered(&[(0, 3), (1, 2), (2, 1), (3, 0)], &li, &ri),
            "block table: 1 layers x 96 blocks",
        ),
        (
            "ids already one run per layer",
            layered(&[(0, 0), (1, 1), (2, 2), (3, 3)], &dense, &dense),
            "block table: 1 layers x 96 blocks",
        ),
    ];
    let src = p.src.to_vec();
    for (what, pairs, want_path) in cases {
        p.dst.fill(0);
        let (l, r): (Vec<_>, Vec<_>) = pairs.iter().copied().unzip();
        let (l, r) = (index(&l), index(&r));
        let path = moved_by(&p, XferOp::Write, &l, &r);
        assert!(path.contains(want_path), "{what}: {path}");
        let flat: Vec<(usize, usize)> = l.iter().copied().zip(r.iter().copied()).collect();
        assert!(
            p.dst.to_vec() == moved(&src, BLOCK, p.dst.len(), REMOTE_STRIDE, &flat),
            "{what}: the remote pool differs from the request"
        );
    }
    // And back: a READ of the last WRITE's blocks into a cleared local pool, split the same.
    let (l, r): (Vec<_>, Vec<_>) = layered(&[(0, 0), (1, 1), (2, 2), (3, 3)], &li, &ri)
        .into_iter()
        .unzip();
    let (l, r) = (index(&l), index(&r));
    p.dst.fill(0);
    moved_by(&p, XferOp::Write, &l, &r);
    p.src.fill(0);
    let path = moved_by(&p, XferOp::Read, &l, &r);
    assert!(path.contains("block table: 4 layers x 24 blocks"), "{path}");
    // Local block `l[k]` went to remote `r[k]` and came back to `l[k]`.
    let flat: Vec<(usize, usize)> = l.iter().map(|&i| (i, i)).collect();
    assert!(
        p.src.to_vec() == moved(&src, BLOCK, p.src.len(), BLOCK, &flat),
        "the READ brought back exactly the blocks it names"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever the request's shape over one-region pools (layers in any order, some repeated
    /// on the source side, ids in any order, one destination index moved so the list is not
    /// periodic), a WRITE lands exactly the blocks its indices name and nothing else, whether
    /// it is split into layers, one layer or the descriptor path.
    #[test]
    fn one_region_requests_land_exactly_what_they_name(
        local_layers in proptest::collection::vec(0..LAYERS, 1..=LAYERS),
        remote_order in Just((0..LAYERS).collect::<Vec<_>>()).prop_shuffle(),
        local_ids in Just((0..BLOCKS).collect::<Vec<_>>()).prop_shuffle(),
        remote_ids in Just((0..BLOCKS).collect::<Vec<_>>()).prop_shuffle(),
        k in 1usize..=16,
        moved_one in proptest::option::of(0usize..1 << 16),
        ordered in proptest::bool::ANY,
    ) {
        let p = one_pool("flat-prop");
        // Half the cases in layer order on both sides: the shape the split takes.
        let (local_layers, remote_order) = if ordered {
            let g = local_layers.len();
            ((0..g).collect::<Vec<_>>(), (LAYERS - g..LAYERS).collect::<Vec<_>>())
        } else {
            (local_layers, remote_order)
        };
        let g = local_layers.len();
        let mut l = Vec::with_capacity(g * k);
        let mut r = Vec::with_capacity(g * k);
        for (i, &ll) in local_layers.iter().enumerate() {
            for j in 0..k {
                l.push(ll * BLOCKS as usize + local_ids[j] as usize);
                r.push(remote_order[i] * BLOCKS as usize + remote_ids[j] as usize);
            }
        }
        if let Some(m) = moved_one {
            // One destination index moved to a block no other index names.
            let all = LAYERS * BLOCKS as usize;
            let free: Vec<usize> = (0..all).filter(|x| !r.contains(x)).collect();
            let at = m % r.len();
            r[at] = free[m % free.len()];
        }
        let path = moved_by(&p, XferOp::Write, &l, &r);
        if ordered && moved_one.is_none() && k >= 4 && g >= 3 {
            proptest::prop_assert!(path.contains(&format!("block table: {g} layers")), "{}", path);
        }
        let flat: Vec<(usize, usize)> = l.iter().copied().zip(r.iter().copied()).collect();
        proptest::prop_assert!(
            p.dst.to_vec() == moved(&p.src.to_vec(), BLOCK, p.dst.len(), REMOTE_STRIDE, &flat),
            "the remote pool differs from the request"
        );
    }
}

/// Lists prepared as block tables (`prep_strided_dlist`, NIXL 1.5's Nx5 lists) and indexed
/// by flat index take the same block-table path as the flat lists of the same blocks: the
/// strided preparation must not make the request slower (it made one segment per
/// descriptor: 100 times the make on CUDA_IPC at 16k-token requests).
#[test]
fn strided_lists_indexed_flat_take_the_block_table_path() {
    use nixl_core::{StridedDesc, StridedDescList};
    let p = pair("strided-flat");
    let table = |bufs: &[Arc<HostBuffer>], stride: u64| {
        StridedDescList::from_descs(
            MemKind::Dram,
            bufs.iter()
                .map(|b| StridedDesc::new(b.addr(), stride, BLOCK, BLOCKS)),
        )
    };
    let local =
        p.a.prep_strided_dlist(XferTarget::Initiator, &table(&p.src, BLOCK), &[])
            .unwrap();
    let remote =
        p.a.prep_strided_dlist(
            XferTarget::Agent(p._b.name()),
            &table(&p.dst, REMOTE_STRIDE),
            &[],
        )
        .unwrap();
    let (li, ri) = (ids(24, 5), ids(24, 9));
    let pairs = layered(&[(0, 3), (1, 2), (2, 1), (3, 0)], &li, &ri);
    let (l, r): (Vec<_>, Vec<_>) = pairs.iter().copied().unzip();
    let req =
        p.a.make_prepped_xfer(
            XferOp::Write,
            &local,
            &index(&l),
            &remote,
            &index(&r),
            XferOptions::default(),
        )
        .unwrap();
    let path = req.path();
    assert!(
        path.contains("block table: 4 layers x 24 blocks"),
        "strided lists indexed flat build the block table: {path}"
    );
    run(&p, &req);
    check_written(&p, &pairs);
}
