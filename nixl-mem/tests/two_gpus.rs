//! Prefill GPU to decode GPU (issue 24): two processes, the target's pool on one GPU and the
//! initiator's on the other, both ways (initiator on GPU 0 and on GPU 1), WRITE and READ,
//! paged blocks of 4 KiB, 16 KiB, 64 KiB and 1 MiB laid out one block apart (nothing merges),
//! a block table, host memory to the other GPU's memory and back, a notification after its
//! data, cancel and a deadline in flight. Every byte is verified, and every VRAM request must
//! run the copy kernel on the initiator's own GPU (before: decode on GPU 1 reading from GPU 0
//! ran on GPU 0's copy engines, far below the link, in silence).
//!
//! Skips as `multi-gpu` where fewer than two GPUs are visible (and fails under
//! `NIXL_REQUIRE_DEPS` on a machine that has them but cannot run it).

use nixl_testkit::gpu as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{first_diff, pattern, run_child, two_gpus, ROLE};
use nixl_core::{
    Agent, AgentConfig, Desc, Error, MemKind, StridedDesc, StridedDescList, XferDescList, XferOp,
    XferOptions, XferState, XferTarget,
};
use nixl_mem::{CudaHostBuffer, CudaIpcParams, DeviceBuffer, HostMemory, CUDA_IPC};

const WAIT: Duration = Duration::from_secs(60);
/// Block sizes of the paged layouts.
const SIZES: [u64; 4] = [4 << 10, 16 << 10, 64 << 10, 1 << 20];
/// Blocks per request.
const BLOCKS: u64 = 256;
/// The target's pool: every size's blocks, one block apart (2 x BLOCKS x 1 MiB at most).
const POOL: usize = 2 * BLOCKS as usize * (1 << 20);

fn agent(name: &str, device: usize) -> Agent {
    let a = Agent::new(name, AgentConfig::default()).unwrap();
    let b = a
        .create_backend(CudaIpcParams::default().device(device))
        .unwrap();
    assert_eq!(b.name(), CUDA_IPC);
    a
}

/// Block `k` of size `blk` in a pool at `base`: blocks sit one block apart.
fn slot(base: u64, blk: u64, k: u64) -> u64 {
    base + 2 * k * blk
}

/// The initiator's blocks `0..BLOCKS` map to the target's `perm(i)`: shuffled.
fn perm(i: u64) -> u64 {
    (i * 97 + 31) % BLOCKS
}

fn list(kind: MemKind, dev: u64, addrs: impl Iterator<Item = u64>, blk: u64) -> XferDescList {
    XferDescList::from_descs(kind, addrs.map(|a| Desc::on_device(a, blk, dev)))
}

/// One request, waited for; its path.
fn run(a: &Agent, op: XferOp, l: XferDescList, r: XferDescList, notif: Option<&[u8]>) -> String {
    let opts = XferOptions::default()
        .notif(notif.map(<[u8]>::to_vec))
        .no_merge(true);
    let req = a.create_xfer_req(op, &l, &r, "target", opts).unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    req.path()
}

/// Held by each direction's test: both name their target agent `target` (the child loads it
/// by name) and each has 512 MiB pools on both GPUs, so the two run one after the other even
/// where the harness runs tests in parallel.
static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::const_mutex(());

fn both_ways(initiator_gpu: usize, target_gpu: usize) {
    let _one = ONE_AT_A_TIME.lock();
    let target = agent("target", target_gpu);
    let t = Arc::new(DeviceBuffer::new(target_gpu, POOL).unwrap());
    let _r = target.register_mem(vec![t.clone()], &[]).unwrap();
    // One folder per direction: the metadata file is the child's only way to the target.
    let dir = std::env::temp_dir().join(format!(
        "nixl-two-gpus-{}-{initiator_gpu}-{target_gpu}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let md = dir.join("target.md");
    std::fs::write(&md, target.local_metadata().unwrap()).unwrap();
    let st = run_child(
        "two_gpus_initiator",
        &[
            (ROLE, "initiator".to_owned()),
            ("NIXL_TWO_GPUS_MD", md.display().to_string()),
            ("NIXL_TWO_GPUS_T", t.addr().to_string()),
            ("NIXL_TWO_GPUS_I_GPU", initiator_gpu.to_string()),
            ("NIXL_TWO_GPUS_T_GPU", target_gpu.to_string()),
        ],
        Duration::from_secs(300),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        st.success(),
        "initiator on GPU {initiator_gpu} failed: {st}"
    );
    // The last WRITE's notification came after its data: the target sees every block of the
    // largest size written with pattern 9 when it is handed out.
    let n = target.wait_notifs(WAIT).unwrap();
    assert_eq!(
        n["initiator"].last().map(Vec::as_slice),
        Some(&b"after the data"[..])
    );
    let blk = 1u64 << 20;
    let want = pattern(9, (BLOCKS * blk) as usize);
    let mut got = vec![0u8; blk as usize];
    for i in 0..BLOCKS {
        t.copy_to_host((slot(0, blk, perm(i))) as usize, &mut got)
            .unwrap();
        let w = &want[(i * blk) as usize..((i + 1) * blk) as usize];
        assert_eq!(
            first_diff(&got, w),
            None,
            "block {i} after its notification"
        );
    }
}

#[test]
fn two_gpus_initiator_on_gpu1_target_on_gpu0() {
    if std::env::var(ROLE).is_ok() || !two_gpus("two_gpus_initiator_on_gpu1_target_on_gpu0") {
        return;
    }
    both_ways(1, 0);
}

#[test]
fn two_gpus_initiator_on_gpu0_target_on_gpu1() {
    if std::env::var(ROLE).is_ok() || !two_gpus("two_gpus_initiator_on_gpu0_target_on_gpu1") {
        return;
    }
    both_ways(0, 1);
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn two_gpus_initiator() {
    if std::env::var(ROLE).as_deref() != Ok("initiator") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap();
    let tbase: u64 = var("NIXL_TWO_GPUS_T").parse().unwrap();
    let ig: usize = var("NIXL_TWO_GPUS_I_GPU").parse().unwrap();
    let tg: usize = var("NIXL_TWO_GPUS_T_GPU").parse().unwrap();
    // The backend's default GPU is the *other* one: requests must still run on the GPU of
    // the initiator's memory.
    let a = agent("initiator", tg);
    let peer = a
        .load_remote_metadata(&std::fs::read(var("NIXL_TWO_GPUS_MD")).unwrap())
        .unwrap();
    assert_eq!(peer, "target");
    let l = Arc::new(DeviceBuffer::new(ig, POOL).unwrap());
    let back = Arc::new(DeviceBuffer::new(ig, POOL).unwrap());
    let h = Arc::new(CudaHostBuffer::new(4 << 20).unwrap());
    let _r = a
        .register_mem(vec![l.clone(), back.clone(), h.clone()], &[])
        .unwrap();
    let (ig64, tg64) = (ig as u64, tg as u64);
    for (round, &blk) in SIZES.iter().enumerate() {
        let seed = round as u64 + 1;
        let data = pattern(seed, (BLOCKS * blk) as usize);
        for i in 0..BLOCKS {
            l.copy_from_host(
                slot(0, blk, i) as usize,
                &data[(i * blk) as usize..((i + 1) * blk) as usize],
            )
            .unwrap();
        }
        let local = |base: u64| {
            list(
                MemKind::Vram,
                ig64,
                (0..BLOCKS).map(|i| slot(base, blk, i)),
                blk,
            )
        };
        let remote = list(
            MemKind::Vram,
            tg64,
            (0..BLOCKS).map(|i| slot(tbase, blk, perm(i))),
            blk,
        );
        let w = run(&a, XferOp::Write, local(l.addr()), remote.clone(), None);
        let r = run(&a, XferOp::Read, local(back.addr()), remote, None);
        eprintln!("{blk} B blocks, GPU {ig} -> GPU {tg}: WRITE {w}; READ {r}");
        for p in [&w, &r] {
            assert!(
                p.contains("copy kernel") && p.contains(&format!("on GPU {ig}")),
                "{blk} B blocks: not the copy kernel on the initiator's GPU {ig}: {p}"
            );
        }
        let mut got = vec![0u8; blk as usize];
        for i in 0..BLOCKS {
            back.copy_to_host(slot(0, blk, i) as usize, &mut got)
                .unwrap();
            let want = &data[(i * blk) as usize..((i + 1) * blk) as usize];
            assert_eq!(first_diff(&got, want), None, "{blk} B block {i} read back");
        }
    }

    // A block table: 4 layers of 64 blocks of 16 KiB, K and V apart, shuffled ids.
    let blk = 16u64 << 10;
    let table = |base: u64, dev: u64| {
        let mut t = StridedDescList::new(MemKind::Vram);
        for layer in 0..4u64 {
            t.push(StridedDesc::on_device(
                base + layer * 128 * blk,
                blk,
                blk,
                128,
                dev,
            ));
        }
        t
    };
    let lp = a
        .prep_strided_dlist(XferTarget::Initiator, &table(l.addr(), ig64), &[])
        .unwrap();
    let rp = a
        .prep_strided_dlist(XferTarget::Agent(&peer), &table(tbase, tg64), &[])
        .unwrap();
    let lids: Vec<usize> = (0..64).collect();
    let rids: Vec<usize> = (0..64).map(|i| (i * 37 + 5) % 128).collect();
    let data = pattern(7, (4 * 128 * blk) as usize);
    l.copy_from_host(0, &data).unwrap();
    let req = a
        .make_block_xfer(
            XferOp::Write,
            &lp,
            &lids,
            &rp,
            &rids,
            XferOptions::default(),
        )
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    let p = req.path();
    assert!(
        p.contains("kernel") && p.contains(&format!("on GPU {ig}")),
        "block table: {p}"
    );
    let bp = a
        .prep_strided_dlist(XferTarget::Initiator, &table(back.addr(), ig64), &[])
        .unwrap();
    let req = a
        .make_block_xfer(XferOp::Read, &bp, &lids, &rp, &rids, XferOptions::default())
        .unwrap();
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    let mut got = vec![0u8; blk as usize];
    for layer in 0..4u64 {
        for &i in &lids {
            let off = ((layer * 128 + i as u64) * blk) as usize;
            back.copy_to_host(off, &mut got).unwrap();
            assert_eq!(
                first_diff(&got, &data[off..off + blk as usize]),
                None,
                "block table: layer {layer} block {i}"
            );
        }
    }

    // Host memory to the other GPU's memory and back (copy engines: PCIe is the limit), on
    // the GPU of the remote memory.
    let hb = 64u64 << 10;
    let hdata = pattern(8, 2 << 20);
    h.write_at(0, &hdata);
    let n = (2u64 << 20) / hb;
    let dl = |off: u64| {
        list(
            MemKind::Dram,
            0,
            (0..n).map(|i| h.addr() + off + i * hb),
            hb,
        )
    };
    let rv = list(MemKind::Vram, tg64, (0..n).map(|i| tbase + i * 2 * hb), hb);
    let p = run(&a, XferOp::Write, dl(0), rv.clone(), None);
    assert!(p.contains(&format!("on GPU {tg}")), "DRAM -> GPU {tg}: {p}");
    run(&a, XferOp::Read, dl(2 << 20), rv, None);
    let mut hgot = vec![0u8; 2 << 20];
    h.read_at(2 << 20, &mut hgot);
    assert_eq!(first_diff(&hgot, &hdata), None, "DRAM <- GPU {tg} <- DRAM");

    // Cancel in flight: a large request is posted and canceled; the next one works.
    let big = POOL as u64;
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &list(MemKind::Vram, ig64, std::iter::once(l.addr()), big),
            &list(MemKind::Vram, tg64, std::iter::once(tbase), big),
            &peer,
            XferOptions::default(),
        )
        .unwrap();
    for _ in 0..3 {
        a.post_xfer_req(&req).unwrap();
        match req.cancel() {
            Ok(()) | Err(Error::Canceled { .. }) => {}
            Err(e) => panic!("cancel in flight: {e}"),
        }
    }
    // A deadline in flight: 1 us is past by the first check.
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &list(MemKind::Vram, ig64, std::iter::once(l.addr()), big),
            &list(MemKind::Vram, tg64, std::iter::once(tbase), big),
            &peer,
            XferOptions::default().timeout(Duration::from_micros(1)),
        )
        .unwrap();
    let t0 = Instant::now();
    let s = a.post_xfer_req(&req).unwrap();
    assert_eq!(
        s,
        XferState::InProgress,
        "512 MiB between GPUs takes over a millisecond"
    );
    // Checked at once: the copy is still running and the deadline has passed.
    let e = a.check_xfer_state(&req).expect_err("past its deadline");
    assert!(matches!(e, Error::TimedOut { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    drop(req);

    // Last: the largest blocks with pattern 9 and a notification the target checks against
    // its memory when it is handed out.
    let blk = 1u64 << 20;
    let data = pattern(9, (BLOCKS * blk) as usize);
    for i in 0..BLOCKS {
        l.copy_from_host(
            slot(0, blk, i) as usize,
            &data[(i * blk) as usize..((i + 1) * blk) as usize],
        )
        .unwrap();
    }
    run(
        &a,
        XferOp::Write,
        list(
            MemKind::Vram,
            ig64,
            (0..BLOCKS).map(|i| slot(l.addr(), blk, i)),
            blk,
        ),
        list(
            MemKind::Vram,
            tg64,
            (0..BLOCKS).map(|i| slot(tbase, blk, perm(i))),
            blk,
        ),
        Some(b"after the data"),
    );
}
