//! Block tables through the UCX backend (two agents in one process): the backend consumes the
//! strides (one put/get per block, per run in a dense layer), in vLLM's split and FlashInfer's
//! interleaved K/V layouts, WRITE and READ, over shared memory and tcp; every byte of both
//! buffers is checked. Skips with a printed reason when no UCX can be loaded.

use nixl_testkit::ucx as common;

use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, HostBuffer, MemKind, MemoryRegion, RegionDesc, StridedDesc, StridedDescList, XferOp,
    XferOptions, XferTarget,
};

const LAYERS: u64 = 3;
const POOL: u64 = 24;
const BLOCK: u64 = 4096 + 64;

struct Side {
    buf: Arc<HostBuffer>,
    _reg: nixl_core::Registration,
    table: StridedDescList,
}

fn side(a: &Agent, seed: u64, interleaved: bool) -> Side {
    let layer = 2 * POOL * BLOCK;
    let buf = common::buf((LAYERS * layer) as usize);
    buf.fill_pattern(seed);
    let views: Vec<Arc<dyn MemoryRegion>> = (0..LAYERS)
        .map(|l| {
            // SAFETY: inside `buf`, which the side keeps until after the registration.
            let r = unsafe { RawRegion::new(RegionDesc::dram(buf.addr() + l * layer, layer)) };
            Arc::new(r) as Arc<dyn MemoryRegion>
        })
        .collect();
    let reg = a.register_mem(views, &[]).expect("register");
    let mut table = StridedDescList::new(MemKind::Dram);
    for l in 0..LAYERS {
        let at = buf.addr() + l * layer;
        for kv in 0..2 {
            table.push(if interleaved {
                StridedDesc::new(at + kv * BLOCK, 2 * BLOCK, BLOCK, POOL)
            } else {
                StridedDesc::new(at + kv * POOL * BLOCK, BLOCK, BLOCK, POOL)
            });
        }
    }
    Side {
        buf,
        _reg: reg,
        table,
    }
}

/// The destination's bytes after moving `from[k] -> to[k]` in every layer.
fn expected(src: &Side, s: &[u8], dst: &Side, d: &[u8], from: &[usize], to: &[usize]) -> Vec<u8> {
    let mut want = d.to_vec();
    for (a, b) in src.table.descs().iter().zip(dst.table.descs()) {
        for (&i, &j) in from.iter().zip(to) {
            let x = (a.block(i as u64).expect("block").addr - src.buf.addr()) as usize;
            let y = (b.block(j as u64).expect("block").addr - dst.buf.addr()) as usize;
            want[y..y + BLOCK as usize].copy_from_slice(&s[x..x + BLOCK as usize]);
        }
    }
    want
}

#[test]
fn block_tables_through_ucx() {
    if !common::ucx_or_skip("block_tables_through_ucx") {
        return;
    }
    let lids = [4usize, 5, 6, 20, 1, 2, 23, 0];
    let rids = [10usize, 11, 12, 3, 17, 18, 0, 22];
    for tls in [common::SHM, common::TCP] {
        for interleaved in [false, true] {
            for op in [XferOp::Write, XferOp::Read] {
                let a = common::agent("blk-a", tls, false).expect("agent");
                let b = common::agent("blk-b", tls, false).expect("agent");
                let (ls, rs) = (side(&a, 1, interleaved), side(&b, 2, interleaved));
                let peer = a
                    .load_remote_metadata(&b.local_metadata().expect("md"))
                    .expect("load");
                let l = a
                    .prep_strided_dlist(XferTarget::Initiator, &ls.table, &[])
                    .expect("prep");
                let r = a
                    .prep_strided_dlist(XferTarget::Agent(&peer), &rs.table, &[])
                    .expect("prep");
                let (lb, rb) = (ls.buf.to_vec(), rs.buf.to_vec());
                let req = a
                    .make_block_xfer(
                        op,
                        &l,
                        &lids,
                        &r,
                        &rids,
                        XferOptions::with_notif(b"kv".to_vec()),
                    )
                    .expect("block request");
                let path = req.path();
                assert!(path.contains("strided"), "{path}");
                a.post_xfer_req(&req).expect("post");
                req.wait(Duration::from_secs(30)).expect("wait");
                assert_eq!(
                    b.wait_notifs(Duration::from_secs(10)).expect("notifs")[a.name()],
                    vec![b"kv".to_vec()]
                );
                let (la, ra) = (ls.buf.to_vec(), rs.buf.to_vec());
                let ctx = format!("{tls} interleaved={interleaved} {op}");
                match op {
                    XferOp::Write => {
                        assert!(
                            ra == expected(&ls, &lb, &rs, &rb, &lids, &rids),
                            "{ctx}: target bytes"
                        );
                        assert!(la == lb, "{ctx}: source changed");
                    }
                    XferOp::Read => {
                        assert!(
                            la == expected(&rs, &rb, &ls, &lb, &rids, &lids),
                            "{ctx}: local bytes"
                        );
                        assert!(ra == rb, "{ctx}: source changed");
                    }
                }
                // Reposting moves the same blocks again (the walk allocates nothing per block).
                a.post_xfer_req(&req).expect("repost");
                req.wait(Duration::from_secs(30)).expect("wait");
            }
        }
    }
}
