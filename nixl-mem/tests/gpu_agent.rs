//! GPU tests through the agent with the `CUDA_IPC` backend: VRAM<->VRAM READ/WRITE and
//! DRAM<->VRAM between two processes (the test binary re-runs itself as the initiator), the
//! same in one process, notifications without initiator polling, the copy kernel on scattered
//! blocks, bad input, and the shared conformance suite. Every byte is verified.
//! Each test skips with a printed reason where no CUDA GPU is usable.

use nixl_testkit::gpu as common;

use std::sync::Arc;
use std::time::Duration;

use common::{first_diff, gpu, pattern, run_child, ROLE};
use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, AgentConfig, Desc, MemKind, MemoryRegion, RegionDesc, XferDescList, XferOp, XferOptions,
    XferTarget,
};
use nixl_mem::{
    CudaIpcParams, DeviceBuffer, HostBuffer, HostMemory, KernelShape, SharedHostBuffer, CUDA_IPC,
};

const MIB: usize = 1 << 20;
const BLOCK: u64 = 64 << 10;
const WAIT: Duration = Duration::from_secs(30);

fn agent(name: &str) -> Agent {
    agent_with(name, CudaIpcParams::default())
}

fn agent_with(name: &str, params: CudaIpcParams) -> Agent {
    let a = Agent::new(name, AgentConfig::default()).unwrap();
    assert_eq!(a.create_backend(params).unwrap().name(), CUDA_IPC);
    a
}

/// `n` blocks of BLOCK bytes at `base` on `dev`.
fn blocks(kind: MemKind, base: u64, n: usize, dev: u64) -> XferDescList {
    XferDescList::from_descs(
        kind,
        (0..n as u64).map(|i| Desc::on_device(base + i * BLOCK, BLOCK, dev)),
    )
}

fn xfer(
    a: &Agent,
    op: XferOp,
    local: XferDescList,
    remote: XferDescList,
    peer: &str,
    notif: Option<&[u8]>,
    no_merge: bool,
) -> String {
    let opts = XferOptions::default()
        .notif(notif.map(<[u8]>::to_vec))
        .no_merge(no_merge);
    let req = a.create_xfer_req(op, &local, &remote, peer, opts).unwrap();
    assert_eq!(a.query_xfer_backend(&req).name(), CUDA_IPC);
    a.post_xfer_req(&req).unwrap();
    req.wait(WAIT).unwrap();
    let path = req.path();
    eprintln!("{op} path: {path}");
    path
}

// Layout of the target's memory (process "target"):
//   VRAM T, 4 MiB: [0,1) pattern 1 (initiator READs it), [1,2) initiator WRITEs VRAM pattern 2,
//                  [2,3) initiator WRITEs from DRAM pattern 3, [3,4) pattern 4 (READ into DRAM)
//   shared DRAM S, 2 MiB: [0,1) initiator WRITEs VRAM pattern 2, [1,2) pattern 5 (READ to VRAM)

#[test]
fn gpu_agent_two_processes_vram_and_dram() {
    if std::env::var(ROLE).is_ok() || !gpu("gpu_agent_two_processes_vram_and_dram") {
        return;
    }
    let target = agent("target");
    let t = Arc::new(DeviceBuffer::new(0, 4 * MIB).unwrap());
    t.copy_from_host(0, &pattern(1, MIB)).unwrap();
    t.copy_from_host(3 * MIB, &pattern(4, MIB)).unwrap();
    let s = Arc::new(SharedHostBuffer::new(2 * MIB).unwrap());
    s.write_at(MIB, &pattern(5, MIB));
    let _rt = target.register_mem(vec![t.clone()], &[]).unwrap();
    let _rs = target.register_mem(vec![s.clone()], &[]).unwrap();
    let dir = std::env::temp_dir().join(format!("nixl-mem-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let md = dir.join("target.md");
    std::fs::write(&md, target.local_metadata().unwrap()).unwrap();
    let st = run_child(
        "gpu_agent_initiator",
        &[
            (ROLE, "initiator".to_owned()),
            ("NIXL_MEM_MD", md.display().to_string()),
            ("NIXL_MEM_T", t.addr().to_string()),
            ("NIXL_MEM_S", s.addr().to_string()),
        ],
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(st.success(), "initiator failed: {st}");
    // The notification of the last WRITE came after all of the data.
    let notifs = target.wait_notifs(WAIT).unwrap();
    assert_eq!(
        notifs["initiator"].last().map(Vec::as_slice),
        Some(&b"all written"[..])
    );
    let mut got = vec![0u8; MIB];
    t.copy_to_host(MIB, &mut got).unwrap();
    assert_eq!(first_diff(&got, &pattern(2, MIB)), None, "VRAM->VRAM WRITE");
    t.copy_to_host(2 * MIB, &mut got).unwrap();
    assert_eq!(first_diff(&got, &pattern(3, MIB)), None, "DRAM->VRAM WRITE");
    s.read_at(0, &mut got);
    assert_eq!(
        first_diff(&got, &pattern(2, MIB)),
        None,
        "VRAM->shared DRAM WRITE"
    );
    // Untouched ranges are untouched.
    t.copy_to_host(0, &mut got).unwrap();
    assert_eq!(first_diff(&got, &pattern(1, MIB)), None);
}

#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn gpu_agent_initiator() {
    if std::env::var(ROLE).as_deref() != Ok("initiator") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap();
    let t: u64 = var("NIXL_MEM_T").parse().unwrap();
    let s: u64 = var("NIXL_MEM_S").parse().unwrap();
    let a = agent("initiator");
    let peer = a
        .load_remote_metadata(&std::fs::read(var("NIXL_MEM_MD")).unwrap())
        .unwrap();
    assert_eq!(peer, "target");
    let report = a.path_report("target");
    assert!(
        report
            .iter()
            .any(|(b, p)| b == CUDA_IPC && p.contains("CUDA IPC")),
        "{report:?}"
    );

    let l = Arc::new(DeviceBuffer::new(0, 4 * MIB).unwrap());
    l.copy_from_host(0, &pattern(2, MIB)).unwrap();
    let h = Arc::new(HostBuffer::new(2 * MIB).unwrap());
    h.write_at(0, &pattern(3, MIB));
    let _rl = a.register_mem(vec![l.clone()], &[]).unwrap();
    let _rh = a.register_mem(vec![h.clone()], &[]).unwrap();
    let n = MIB / BLOCK as usize;
    let (lv, tv, sd, hd) = (l.addr(), t, s, h.addr());
    let m = MIB as u64;

    // VRAM -> VRAM WRITE, block by block (unmerged: many segments, the copy kernel through
    // the IPC mapping).
    let path = xfer(
        &a,
        XferOp::Write,
        blocks(MemKind::Vram, lv, n, 0),
        blocks(MemKind::Vram, tv + m, n, 0),
        &peer,
        None,
        true,
    );
    assert!(path.contains("copy kernel x16 segments"), "{path}");
    // VRAM <- VRAM READ (merged: one copy).
    xfer(
        &a,
        XferOp::Read,
        blocks(MemKind::Vram, lv + m, n, 0),
        blocks(MemKind::Vram, tv, n, 0),
        &peer,
        None,
        false,
    );
    let mut got = vec![0u8; MIB];
    l.copy_to_host(MIB, &mut got).unwrap();
    assert_eq!(first_diff(&got, &pattern(1, MIB)), None, "VRAM READ");
    // DRAM -> VRAM WRITE (copy engines).
    let path = xfer(
        &a,
        XferOp::Write,
        blocks(MemKind::Dram, hd, n, 0),
        blocks(MemKind::Vram, tv + 2 * m, n, 0),
        &peer,
        None,
        true,
    );
    assert!(path.contains("cuMemcpy"), "{path}");
    // DRAM <- VRAM READ.
    xfer(
        &a,
        XferOp::Read,
        blocks(MemKind::Dram, hd + m, n, 0),
        blocks(MemKind::Vram, tv + 3 * m, n, 0),
        &peer,
        None,
        false,
    );
    h.read_at(MIB, &mut got);
    assert_eq!(first_diff(&got, &pattern(4, MIB)), None, "VRAM->DRAM READ");
    // VRAM <- shared DRAM READ.
    xfer(
        &a,
        XferOp::Read,
        blocks(MemKind::Vram, lv + 2 * m, n, 0),
        blocks(MemKind::Dram, sd + m, n, 0),
        &peer,
        None,
        true,
    );
    l.copy_to_host(2 * MIB, &mut got).unwrap();
    assert_eq!(
        first_diff(&got, &pattern(5, MIB)),
        None,
        "shared DRAM->VRAM READ"
    );
    // VRAM -> shared DRAM WRITE, with the notification the target waits for.
    xfer(
        &a,
        XferOp::Write,
        blocks(MemKind::Vram, lv, n, 0),
        blocks(MemKind::Dram, sd, n, 0),
        &peer,
        Some(b"all written"),
        false,
    );
}

#[test]
fn gpu_agent_one_process_and_loopback() {
    if !gpu("gpu_agent_one_process_and_loopback") {
        return;
    }
    let a = agent("one-a");
    let b = agent("one-b");
    let src = Arc::new(DeviceBuffer::new(0, 2 * MIB).unwrap());
    let dst = Arc::new(DeviceBuffer::new(0, 2 * MIB).unwrap());
    let host = Arc::new(HostBuffer::new(2 * MIB).unwrap());
    src.copy_from_host(0, &pattern(7, 2 * MIB)).unwrap();
    let _r1 = a
        .register_mem(vec![src.clone(), host.clone()], &[])
        .unwrap();
    let _r2 = b.register_mem(vec![dst.clone()], &[]).unwrap();
    let peer = a
        .load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    let n = 2 * MIB / BLOCK as usize;
    xfer(
        &a,
        XferOp::Write,
        blocks(MemKind::Vram, src.addr(), n, 0),
        blocks(MemKind::Vram, dst.addr(), n, 0),
        &peer,
        Some(b"n"),
        true,
    );
    assert_eq!(
        first_diff(&dst.to_vec().unwrap(), &pattern(7, 2 * MIB)),
        None
    );
    assert_eq!(b.wait_notifs(WAIT).unwrap()["one-a"], vec![b"n".to_vec()]);
    // Loopback: VRAM -> the agent's own DRAM.
    xfer(
        &a,
        XferOp::Write,
        blocks(MemKind::Vram, src.addr(), n, 0),
        blocks(MemKind::Dram, host.addr(), n, 0),
        "one-a",
        None,
        false,
    );
    assert_eq!(first_diff(&host.to_vec(), &pattern(7, 2 * MIB)), None);
}

#[test]
fn gpu_agent_bad_input_is_typed_and_changes_nothing() {
    if !gpu("gpu_agent_bad_input_is_typed_and_changes_nothing") {
        return;
    }
    let a = agent("bad");
    let dev = Arc::new(DeviceBuffer::new(0, MIB).unwrap());
    // A VRAM region naming the wrong GPU, or host memory claimed as VRAM.
    let n = nixl_mem::cuda_device_count().unwrap() as u64;
    let not_vram = HostBuffer::new(4096).unwrap();
    for dev_id in [n, 0] {
        let addr = if dev_id == 0 {
            not_vram.addr()
        } else {
            dev.addr()
        };
        let desc = RegionDesc {
            kind: MemKind::Vram,
            addr,
            len: 4096,
            dev_id,
            meta: vec![],
        };
        // SAFETY: registration is refused before anything touches the (bogus) range.
        let raw: Arc<dyn MemoryRegion> = Arc::new(unsafe { RawRegion::new(desc) });
        let e = a.register_mem(vec![raw], &[]).unwrap_err();
        assert!(
            matches!(e.kind().as_str(), "invalid_param" | "mismatch"),
            "{e}"
        );
    }
    // Descriptors outside the registration.
    let _r = a.register_mem(vec![dev.clone()], &[]).unwrap();
    let e = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &blocks(MemKind::Vram, dev.addr() + MIB as u64, 1, 0),
            &[],
        )
        .unwrap_err();
    assert_eq!(e.kind().as_str(), "not_found");
    // A peer's private DRAM in another process is refused with the reason.
    let b = Agent::new("bad-peer", AgentConfig::default()).unwrap();
    b.create_backend(CudaIpcParams::default()).unwrap();
    let private = Arc::new(HostBuffer::new(4096).unwrap());
    let _rp = b.register_mem(vec![private.clone()], &[]).unwrap();
    let peer = a
        .load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    // Same process: private DRAM is reachable directly.
    private.write_at(0, &pattern(9, 4096));
    let local = XferDescList::from_descs(MemKind::Vram, [Desc::on_device(dev.addr(), 4096, 0)]);
    xfer(
        &a,
        XferOp::Read,
        local,
        XferDescList::blocks(MemKind::Dram, private.addr(), 4096, 1),
        &peer,
        None,
        false,
    );
    let mut got = vec![0u8; 4096];
    dev.copy_to_host(0, &mut got).unwrap();
    assert_eq!(first_diff(&got, &pattern(9, 4096)), None);
}

/// A peer whose CUDA_IPC connection info names this very process but which is no agent of it
/// (the victim's own metadata under a new name, naming no process; or naming this process
/// under that new name): CUDA_IPC copies to a peer of this process are plain copies to the
/// addresses its metadata names, so the victim's WRITE would land in its own memory. Refused
/// at load, `NotAllowed`, and nothing lands; the victim's real metadata, loaded by another
/// agent here, still works.
#[test]
fn gpu_agent_a_peer_naming_this_process_is_refused() {
    if std::env::var(ROLE).is_ok() || !gpu("gpu_agent_a_peer_naming_this_process_is_refused") {
        return;
    }
    let v = agent(&nixl_testkit::unique("victim"));
    let secret = Arc::new(DeviceBuffer::new(0, MIB).unwrap());
    secret.copy_from_host(0, &pattern(3, MIB)).unwrap();
    let src = Arc::new(DeviceBuffer::new(0, MIB).unwrap());
    src.copy_from_host(0, &pattern(8, MIB)).unwrap();
    let _r1 = v.register_mem(vec![secret.clone()], &[]).unwrap();
    let _r2 = v.register_mem(vec![src.clone()], &[]).unwrap();
    let real =
        nixl_core::wire::codec::AgentMetadata::decode_bytes(&v.local_metadata().unwrap()).unwrap();
    for process in [None, real.process] {
        let mut md = real.clone();
        md.name = nixl_testkit::unique("liar");
        md.process = process;
        let loaded = v.load_remote_metadata(&md.encode());
        let outcome = loaded.as_ref().map_err(Clone::clone).and_then(|name| {
            let req = v.create_xfer_req(
                XferOp::Write,
                &blocks(MemKind::Vram, src.addr(), 1, 0),
                &blocks(MemKind::Vram, secret.addr(), 1, 0),
                name,
                XferOptions::default(),
            )?;
            v.post_xfer_req(&req)?;
            req.wait(WAIT)
        });
        assert_eq!(
            first_diff(&secret.to_vec().unwrap(), &pattern(3, MIB)),
            None,
            "the WRITE landed in the victim's own memory (process {process:?}: {outcome:?})"
        );
        assert_eq!(
            loaded.as_ref().map_err(|e| e.kind().as_str()),
            Err("not_allowed"),
            "process {process:?}: {loaded:?}"
        );
    }
    let other = agent(&nixl_testkit::unique("other"));
    let peer = other
        .load_remote_metadata(&v.local_metadata().unwrap())
        .unwrap();
    let dst = Arc::new(DeviceBuffer::new(0, MIB).unwrap());
    let _r3 = other.register_mem(vec![dst.clone()], &[]).unwrap();
    xfer(
        &other,
        XferOp::Read,
        blocks(MemKind::Vram, dst.addr(), 1, 0),
        blocks(MemKind::Vram, secret.addr(), 1, 0),
        &peer,
        None,
        false,
    );
    assert_eq!(
        first_diff(
            &dst.to_vec().unwrap()[..BLOCK as usize],
            &pattern(3, MIB)[..BLOCK as usize]
        ),
        None
    );
}

fn cuda_ipc_suite() -> Option<nixl_testkit::conformance::Suite> {
    let test = std::thread::current()
        .name()
        .unwrap_or("gpu_conformance_suite")
        .to_owned();
    if !gpu(&test) {
        return None;
    }
    Some(nixl_testkit::conformance::Suite::new(
        "cuda-ipc",
        AgentConfig::default(),
        Arc::new(|a: &Agent| a.create_backend(CudaIpcParams::default())),
    ))
}

/// The shared conformance suite on CUDA_IPC, one test per case (skipped without a GPU).
mod gpu_conformance_suite {
    nixl_testkit::conformance_tests!(super::cuda_ipc_suite);
}

/// Two agents of one process on GPU 0, each with a registered VRAM buffer, `a` knowing `b`.
struct Pair {
    a: Agent,
    b: Agent,
    src: Arc<DeviceBuffer>,
    dst: Arc<DeviceBuffer>,
    peer: String,
    _regs: [nixl_core::Registration; 2],
}

fn vram_pair(tag: &str, len: usize) -> Pair {
    vram_pair_with(tag, len, KernelShape::default())
}

/// As [`vram_pair`], the initiator's copy kernel of `shape`.
fn vram_pair_with(tag: &str, len: usize, shape: KernelShape) -> Pair {
    let a = agent_with(
        &format!("{tag}-a"),
        CudaIpcParams::default().kernel_shape(shape),
    );
    let b = agent(&format!("{tag}-b"));
    let src = Arc::new(DeviceBuffer::new(0, len).unwrap());
    let dst = Arc::new(DeviceBuffer::new(0, len).unwrap());
    let ra = a.register_mem(vec![src.clone()], &[]).unwrap();
    let rb = b.register_mem(vec![dst.clone()], &[]).unwrap();
    let peer = a
        .load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    Pair {
        a,
        b,
        src,
        dst,
        peer,
        _regs: [ra, rb],
    }
}

/// The initiator posts a WRITE with a notification and never polls: the target still gets the
/// notification (sent by the backend's completion thread once the data is complete), sees the
/// data complete at that moment, and gets it once; the initiator's later checks say `Done`.
/// Then a canceled request: its notification is never sent after `cancel` returns.
#[test]
fn gpu_agent_notification_without_initiator_polling() {
    if !gpu("gpu_agent_notification_without_initiator_polling") {
        return;
    }
    let n = 64usize;
    let len = n * BLOCK as usize;
    let Pair {
        a,
        b,
        src,
        dst,
        peer,
        ..
    } = &vram_pair("nopoll", len);
    for round in 0..3u64 {
        let p = pattern(40 + round, len);
        src.copy_from_host(0, &p).unwrap();
        let msg = format!("round {round}").into_bytes();
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &blocks(MemKind::Vram, src.addr(), n, 0),
                &blocks(MemKind::Vram, dst.addr(), n, 0),
                peer,
                XferOptions::default()
                    .notif(msg.clone())
                    .no_merge(round % 2 == 0),
            )
            .unwrap();
        a.post_xfer_req(&req).unwrap();
        // No check, no wait on the initiator.
        let got = b.wait_notifs(WAIT).unwrap();
        assert_eq!(got.get(a.name()), Some(&vec![msg]), "round {round}");
        assert_eq!(
            first_diff(&dst.to_vec().unwrap(), &p),
            None,
            "round {round}"
        );
        assert_eq!(
            a.check_xfer_state(&req).unwrap(),
            nixl_core::XferState::Done
        );
        assert_eq!(
            a.check_xfer_state(&req).unwrap(),
            nixl_core::XferState::Done
        );
        req.wait(WAIT).unwrap();
        eprintln!("round {round}: {}", req.path());
    }
    // Nothing was sent twice.
    assert!(b.get_notifs().unwrap().is_empty());

    // Cancel right after posting a large request. Whether the notification goes out depends
    // on whether the completion thread saw the data complete before `cancel` marked the
    // request (the unit tests in cuda_ipc::complete pin the rule down); here: at most one, and
    // only with the data complete.
    let big = 256usize;
    let c = vram_pair("cancel", big * MIB);
    c.src.fill(0x5A).unwrap();
    let req =
        c.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Vram, c.src.addr(), MIB as u64, big),
            &XferDescList::blocks(MemKind::Vram, c.dst.addr(), MIB as u64, big),
            &c.peer,
            XferOptions::default()
                .notif(b"canceled".to_vec())
                .no_merge(true),
        )
        .unwrap();
    c.a.post_xfer_req(&req).unwrap();
    req.cancel().unwrap();
    assert!(
        c.a.check_xfer_state(&req).is_err(),
        "a canceled request reports it"
    );
    // A bounded wait for a stray notification (not a timing assertion).
    let got = c.b.wait_notifs(Duration::from_millis(300)).unwrap();
    let n = got.values().map(Vec::len).sum::<usize>();
    assert!(n <= 1, "{got:?}");
    if n == 1 {
        assert!(c.dst.to_vec().unwrap().iter().all(|&x| x == 0x5A));
    }
    eprintln!("cancel right after post: {n} notification(s)");
}

/// (src offset, dst offset, len) in two 8 MiB buffers: co-aligned modulo 16, scattered, in no
/// particular order, no destination overlapping another segment's destination or source.
/// (The first version had the first segment's destination at 3 MiB, which the fifth's ran 5
/// bytes into: the H200 left the first's bytes there, CTAs running in any order; such
/// requests now go to in-order copies, tested below.)
const SCATTERED: [(u64, u64, u64); 7] = [
    (0, 3 * MIB as u64 + 32, MIB as u64),
    (MIB as u64 + 3, 19, 1),
    (MIB as u64 + 64, 4096, 4095),
    (2 * MIB as u64 + 13, 7 * MIB as u64 + 29, 300_001),
    (3 * MIB as u64, MIB as u64, 2 * MIB as u64 + 5),
    (6 * MIB as u64 + 1, 5 * MIB as u64 + 17, 33),
    (7 * MIB as u64, 6 * MIB as u64, 16),
];

/// WRITEs `segs` from `src` to zeroed `dst`, then READs them back into zeroed `src`; checks
/// every byte of both buffers against copying the segments in order. Returns both paths.
fn scatter_round(pair: &Pair, segs: &[(u64, u64, u64)], seed: u64) -> (String, String) {
    let Pair {
        a, src, dst, peer, ..
    } = pair;
    let len = src.len();
    let p = pattern(seed, len);
    src.copy_from_host(0, &p).unwrap();
    dst.fill(0).unwrap();
    let list = |base: u64, pick: fn(&(u64, u64, u64)) -> u64| {
        XferDescList::from_descs(
            MemKind::Vram,
            segs.iter().map(|s| Desc::on_device(base + pick(s), s.2, 0)),
        )
    };
    let write = xfer(
        a,
        XferOp::Write,
        list(src.addr(), |s| s.0),
        list(dst.addr(), |s| s.1),
        peer,
        None,
        true,
    );
    let mut want = vec![0u8; len];
    for &(s, d, l) in segs {
        want[d as usize..(d + l) as usize].copy_from_slice(&p[s as usize..(s + l) as usize]);
    }
    assert_eq!(
        first_diff(&dst.to_vec().unwrap(), &want),
        None,
        "WRITE {write}"
    );
    // READ back into zeroed source blocks.
    src.fill(0).unwrap();
    let read = xfer(
        a,
        XferOp::Read,
        list(src.addr(), |s| s.0),
        list(dst.addr(), |s| s.1),
        peer,
        None,
        true,
    );
    let mut want_src = vec![0u8; len];
    for &(s, d, l) in segs {
        want_src[s as usize..(s + l) as usize].copy_from_slice(&want[d as usize..(d + l) as usize]);
    }
    assert_eq!(
        first_diff(&src.to_vec().unwrap(), &want_src),
        None,
        "READ {read}"
    );
    (write, read)
}

/// The copy kernel on scattered blocks of odd sizes and alignments, WRITE and READ, in one
/// process, with the default shape and every shape `gpu_bench --sweep` measures: every byte
/// lands, nothing between the blocks is touched. A request whose destinations overlap runs as
/// in-order copies (later segments win) and says why; a request whose ends are not
/// co-aligned stays on the copy engines and says why.
#[test]
fn gpu_agent_copy_kernel_scatter_gather() {
    if !gpu("gpu_agent_copy_kernel_scatter_gather") {
        return;
    }
    let len = 8 * MIB;
    for (i, (name, shape)) in KernelShape::sweep().into_iter().enumerate() {
        let pair = vram_pair_with(&format!("kernel{i}"), len, shape);
        let (w, r) = scatter_round(&pair, &SCATTERED, 77 + i as u64);
        assert!(w.contains("copy kernel x7 segments"), "{name}: {w}");
        assert!(r.contains("copy kernel x7 segments"), "{name}: {r}");
    }
    let pair = vram_pair("kernel", len);
    let Pair {
        a, src, dst, peer, ..
    } = &pair;
    // Destinations 0 and 4 overlapping by 5 bytes: the agent refuses the WRITE when it is
    // made (each destination byte is written once), before any backend sees it, and nothing
    // moves. Reading overlapping sources into disjoint destinations is no conflict: the copy
    // kernel takes it.
    let mut overlapping = SCATTERED;
    overlapping[0].1 = 3 * MIB as u64;
    let list = |base: u64, pick: fn(&(u64, u64, u64)) -> u64| {
        XferDescList::from_descs(
            MemKind::Vram,
            overlapping
                .iter()
                .map(|s| Desc::on_device(base + pick(s), s.2, 0)),
        )
    };
    dst.fill(0).unwrap();
    let opts = XferOptions::default().no_merge(true);
    let e = a
        .create_xfer_req(
            XferOp::Write,
            &list(src.addr(), |s| s.0),
            &list(dst.addr(), |s| s.1),
            peer,
            opts,
        )
        .expect_err("destinations overlapping");
    assert_eq!(e.kind(), nixl_core::ErrorKind::InvalidParam, "{e}");
    assert!(e.to_string().contains("cover the same bytes"), "{e}");
    assert!(
        dst.to_vec().unwrap().iter().all(|&b| b == 0),
        "a refused WRITE moved bytes"
    );
    let p = pattern(99, len);
    dst.copy_from_host(0, &p).unwrap();
    src.fill(0).unwrap();
    let r = xfer(
        a,
        XferOp::Read,
        list(src.addr(), |s| s.0),
        list(dst.addr(), |s| s.1),
        peer,
        None,
        true,
    );
    assert!(r.contains("copy kernel x7 segments"), "{r}");
    let mut want = vec![0u8; len];
    for &(s, d, l) in &overlapping {
        want[s as usize..(s + l) as usize].copy_from_slice(&p[d as usize..(d + l) as usize]);
    }
    assert_eq!(first_diff(&src.to_vec().unwrap(), &want), None, "READ {r}");
    let p = pattern(77, len);
    // Not co-aligned: copy engines, with the reason in the path; bytes still right.
    let odd = XferDescList::from_descs(
        MemKind::Vram,
        (0..4u64).map(|i| Desc::on_device(dst.addr() + i * 4096 + 1, 1000, 0)),
    );
    let even = XferDescList::from_descs(
        MemKind::Vram,
        (0..4u64).map(|i| Desc::on_device(src.addr() + i * 4096, 1000, 0)),
    );
    src.copy_from_host(0, &p[..4 * 4096]).unwrap();
    let path = xfer(a, XferOp::Read, even, odd, peer, None, true);
    assert!(path.contains("not 16-byte co-aligned"), "{path}");
    let got = src.to_vec().unwrap();
    let d = dst.to_vec().unwrap();
    for i in 0..4usize {
        assert_eq!(
            got[i * 4096..i * 4096 + 1000],
            d[i * 4096 + 1..i * 4096 + 1001]
        );
    }
}

/// Issue 33's conformance case on CUDA_IPC (two processes, one GPU): see
/// [`nixl_testkit::gpu::killed_target_case`]. `NIXL_KILLS` kills per operation (default 6).
#[test]
fn gpu_agent_a_killed_target_never_ends_done_unless_landed() {
    let test = "gpu_agent_a_killed_target_never_ends_done_unless_landed";
    if std::env::var(ROLE).is_ok() || !gpu(test) {
        return;
    }
    let a = agent("landed-initiator");
    common::killed_target_case(test, "CUDA_IPC", &a, "gpu_agent_landed_target");
}

/// The target of the kill conformance case (spawned by it).
#[test]
#[ignore = "child process entry point: spawned (with --ignored) by a parent test of this file"]
fn gpu_agent_landed_target() {
    if std::env::var(ROLE).as_deref() == Ok(common::LANDED_TARGET) {
        common::landed_target(&agent("landed-target"));
    }
}
