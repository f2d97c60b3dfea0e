//! A request writes each destination once (issue 36): a block id listed twice in a decode
//! table used to be accepted by `plan_read`, `create_xfer_req` and the index forms, landing two
//! blocks' tokens in one. Every form refuses it now, typed (`InvalidParam`), and nothing moves;
//! the same ids without the repeat still work. Sources may repeat (one block read twice).

use nixl_core::kv::{KvLayout, KvOrder, KvPeer};
use nixl_core::{
    Agent, ErrorKind, MemKind, StridedDesc, StridedDescList, XferDescList, XferOp, XferOptions,
    XferTarget,
};
use nixl_testkit::{host_buf, inproc_agent};

const BLOCK: u64 = 4096;
const BLOCKS: usize = 16;

struct Pair {
    a: Agent,
    b: Agent,
    src: std::sync::Arc<nixl_core::HostBuffer>,
    dst: std::sync::Arc<nixl_core::HostBuffer>,
    _regs: (nixl_core::Registration, nixl_core::Registration),
}

fn pair() -> Pair {
    let (a, b) = (inproc_agent("once-a"), inproc_agent("once-b"));
    let (src, dst) = (
        host_buf(BLOCK as usize * BLOCKS),
        host_buf(BLOCK as usize * BLOCKS),
    );
    src.fill_pattern(3);
    let ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    Pair {
        a,
        b,
        src,
        dst,
        _regs: (ra, rb),
    }
}

fn list(base: u64, ids: &[u64]) -> XferDescList {
    XferDescList::from_descs(
        MemKind::Dram,
        ids.iter()
            .map(|i| nixl_core::Desc::new(base + i * BLOCK, BLOCK)),
    )
}

fn refused(what: &str, e: nixl_core::Error) {
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{what}: {e}");
    assert!(
        e.to_string().contains("twice") || e.to_string().contains("same bytes"),
        "{what}: {e}"
    );
}

#[test]
fn create_xfer_req_refuses_a_destination_listed_twice() {
    let p = pair();
    // WRITE from a's blocks 0, 1 to b's blocks 5, 5: two sources into one block.
    let e =
        p.a.create_xfer_req(
            XferOp::Write,
            &list(p.src.addr(), &[0, 1]),
            &list(p.dst.addr(), &[5, 5]),
            p.b.name(),
            XferOptions::default(),
        )
        .unwrap_err();
    refused("create_xfer_req", e);
    // Overlapping but not equal descriptors, too.
    let e =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::from_descs(
                MemKind::Dram,
                [
                    nixl_core::Desc::new(p.src.addr(), BLOCK),
                    nixl_core::Desc::new(p.src.addr() + BLOCK, BLOCK),
                ],
            ),
            &XferDescList::from_descs(
                MemKind::Dram,
                [
                    nixl_core::Desc::new(p.dst.addr(), BLOCK),
                    nixl_core::Desc::new(p.dst.addr() + BLOCK / 2, BLOCK),
                ],
            ),
            p.b.name(),
            XferOptions::default(),
        )
        .unwrap_err();
    refused("overlapping destinations", e);
    assert!(p.dst.to_vec().iter().all(|&x| x == 0), "nothing moved");
    // A repeated source is fine: block 0 to blocks 5 and 6.
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &list(p.src.addr(), &[0, 0]),
            &list(p.dst.addr(), &[5, 6]),
            p.b.name(),
            XferOptions::default(),
        )
        .unwrap();
    p.a.post_xfer_req(&req).unwrap();
    req.wait(std::time::Duration::from_secs(10)).unwrap();
    let (s, d) = (p.src.to_vec(), p.dst.to_vec());
    let b = BLOCK as usize;
    assert_eq!(d[5 * b..6 * b], s[..b]);
    assert_eq!(d[6 * b..7 * b], s[..b]);
}

#[test]
fn index_and_block_forms_refuse_a_destination_listed_twice() {
    let p = pair();
    let all: Vec<u64> = (0..BLOCKS as u64).collect();
    let l =
        p.a.prep_xfer_dlist(XferTarget::Initiator, &list(p.src.addr(), &all), &[])
            .unwrap();
    let r =
        p.a.prep_xfer_dlist(
            XferTarget::Agent(p.b.name()),
            &list(p.dst.addr(), &all),
            &[],
        )
        .unwrap();
    let e =
        p.a.make_prepped_xfer(
            XferOp::Write,
            &l,
            &[0, 1, 2],
            &r,
            &[7, 8, 7],
            XferOptions::default(),
        )
        .unwrap_err();
    refused("make_prepped_xfer", e);
    // A READ's destination is local.
    let e =
        p.a.make_prepped_xfer(
            XferOp::Read,
            &l,
            &[3, 3],
            &r,
            &[0, 1],
            XferOptions::default(),
        )
        .unwrap_err();
    refused("make_prepped_xfer READ", e);
    // Block tables.
    let table = |base: u64| {
        let mut t = StridedDescList::new(MemKind::Dram);
        t.push(StridedDesc::new(base, BLOCK, BLOCK, BLOCKS as u64));
        t
    };
    let lt =
        p.a.prep_strided_dlist(XferTarget::Initiator, &table(p.src.addr()), &[])
            .unwrap();
    let rt =
        p.a.prep_strided_dlist(XferTarget::Agent(p.b.name()), &table(p.dst.addr()), &[])
            .unwrap();
    let e =
        p.a.make_block_xfer(
            XferOp::Write,
            &lt,
            &[0, 1],
            &rt,
            &[9, 9],
            XferOptions::default(),
        )
        .unwrap_err();
    refused("make_block_xfer", e);
    assert!(p.dst.to_vec().iter().all(|&x| x == 0), "nothing moved");
    // Without the repeat, both work.
    for req in [
        p.a.make_prepped_xfer(
            XferOp::Write,
            &l,
            &[0, 1, 2],
            &r,
            &[7, 8, 9],
            XferOptions::default(),
        )
        .unwrap(),
        p.a.make_block_xfer(
            XferOp::Write,
            &lt,
            &[3, 4],
            &rt,
            &[10, 11],
            XferOptions::default(),
        )
        .unwrap(),
    ] {
        p.a.post_xfer_req(&req).unwrap();
        req.wait(std::time::Duration::from_secs(10)).unwrap();
    }
}

fn kv(tp: u32, r: u32) -> KvLayout {
    kv_in(tp, r, KvOrder::Nhd)
}

fn kv_in(tp: u32, r: u32, order: KvOrder) -> KvLayout {
    let shape = nixl_testkit::kv::KvShape {
        layers: 2,
        heads: 8,
        dim: 128,
        mla: false,
        blocks: 64,
    };
    nixl_testkit::kv::pool_layout(shape, tp, r, 16, order, 0, 1 << 30)
}

#[test]
fn kv_planners_refuse_a_block_listed_twice() {
    let (d, p) = (kv(1, 0), kv(1, 0));
    let src: Vec<u64> = (0..4).collect();
    let dup = [10, 11, 10, 12];
    let peer = |name, layout, blocks| {
        [KvPeer {
            name,
            layout,
            blocks,
        }]
    };
    refused(
        "plan (Read, decode table)",
        d.plan(XferOp::Read, &dup, &peer("p", &p, &src), 64)
            .unwrap_err(),
    );
    refused(
        "plan (Write, decode table)",
        p.plan(XferOp::Write, &src, &peer("d", &d, &dup), 64)
            .unwrap_err(),
    );
    // Another order (tiles: HND -> NHD): refused the same.
    let hnd = kv_in(1, 0, KvOrder::Hnd);
    refused(
        "plan (Read, tiles, decode table)",
        d.plan(XferOp::Read, &dup, &peer("p", &hnd, &src), 64)
            .unwrap_err(),
    );
    // The deprecated per-form entries refuse it too (they run the same planner).
    #[allow(deprecated)]
    {
        refused(
            "plan_read (decode table)",
            d.plan_read(&[("p", &p)], &src, &dup, 64).unwrap_err(),
        );
        refused(
            "plan_write (decode table)",
            p.plan_write(&[("d", &d)], &src, &dup, 64).unwrap_err(),
        );
        refused(
            "plan_read_tiles",
            d.plan_read_tiles(&[("p", &p)], &src, &dup, 64).unwrap_err(),
        );
    }
    // Ids past what the request uses do not matter: 33 tokens use 3 blocks of 16.
    assert!(d
        .plan(XferOp::Read, &[10, 11, 12, 10], &peer("p", &p, &src), 33)
        .is_ok());
    assert!(d
        .plan(XferOp::Read, &[10, 11, 12, 13], &peer("p", &p, &src), 64)
        .is_ok());
}
