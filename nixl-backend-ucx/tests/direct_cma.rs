//! Direct CMA (`UcxParams::direct_cma`): where UCX would copy host memory to a same-host peer
//! with its cma transport, the backend makes the `process_vm_writev`/`process_vm_readv` calls
//! itself, many segments per call, and large requests in pieces on its copy threads. These
//! tests check that the path says which copies were made, that every byte lands (both ways,
//! inline and in pieces, segments and block tables), that a notification follows its data,
//! and that a peer range that is not mapped is a typed error. Two agents in one process
//! (`direct_cma_same_process`): a process may attach to itself, so the same system calls run
//! as between two processes (`two_process.rs` covers those, with the default settings).

use nixl_testkit::ucx as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_ucx::UcxParams;
use nixl_core::backend::RawRegion;
use nixl_core::{
    Agent, Desc, Error, HostBuffer, MemKind, RegionDesc, XferDescList, XferOp, XferOptions,
};

const T: Duration = Duration::from_secs(30);

fn agent(role: &str, params: UcxParams) -> Agent {
    let a = Agent::new(&common::unique(role), common::config(false)).expect("agent");
    a.create_backend(params).expect("UCX backend");
    a
}

fn shm(direct: bool, threads: usize) -> UcxParams {
    common::params(common::SHM)
        .direct_cma(direct)
        .cma_threads(threads)
        .direct_cma_same_process(true)
}

/// Initiator and target agents (the target's memory `len` bytes of zeros, the initiator's a
/// pattern), with the target's metadata loaded.
struct Pair {
    a: Agent,
    b: Agent,
    src: Arc<HostBuffer>,
    dst: Arc<HostBuffer>,
    _regs: Vec<nixl_core::Registration>,
}

fn pair(params: UcxParams, len: usize) -> Pair {
    let (a, b) = (agent("a", params.clone()), agent("b", params));
    let (src, dst) = (common::buf(len), common::buf(len));
    src.fill_pattern(9);
    let r1 = a.register_mem(vec![src.clone()], &[]).expect("register");
    let r2 = b.register_mem(vec![dst.clone()], &[]).expect("register");
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load");
    Pair {
        a,
        b,
        src,
        dst,
        _regs: vec![r1, r2],
    }
}

/// Moves `n` blocks of `blk` bytes, shuffled on the target side, WRITE then READ back into a
/// cleared source; returns the two requests' paths.
fn round_trip(p: &Pair, blk: u64, n: usize) -> (String, String) {
    // Block i of the source goes to block (i * 7 + 3) % n of the target: nothing merges.
    let order: Vec<u64> = (0..n as u64).map(|i| (i * 7 + 3) % n as u64).collect();
    let local = XferDescList::blocks(MemKind::Dram, p.src.addr(), blk, n);
    let mut remote = XferDescList::new(MemKind::Dram);
    for &k in &order {
        remote.push(Desc::new(p.dst.addr() + k * blk, blk));
    }
    let w =
        p.a.create_xfer_req(
            XferOp::Write,
            &local,
            &remote,
            p.b.name(),
            XferOptions::with_notif(b"written".to_vec()),
        )
        .expect("make WRITE");
    p.a.post_xfer_req(&w).expect("post WRITE");
    w.wait(T).expect("WRITE completes");
    // The notification follows its data: when it is handed out, every block is there.
    let got = p.b.wait_notifs(T).expect("notification");
    assert_eq!(got[p.a.name()], vec![b"written".to_vec()]);
    let (s, d) = (p.src.to_vec(), p.dst.to_vec());
    for (i, &k) in order.iter().enumerate() {
        let (i, k, b) = (i as u64, k, blk);
        assert!(
            d[(k * b) as usize..((k + 1) * b) as usize]
                == s[(i * b) as usize..((i + 1) * b) as usize],
            "block {i} landed at {k}"
        );
    }
    let wpath = w.path();
    // READ back into a cleared source.
    p.src.fill(0);
    let r =
        p.a.create_xfer_req(
            XferOp::Read,
            &local,
            &remote,
            p.b.name(),
            XferOptions::default(),
        )
        .expect("make READ");
    p.a.post_xfer_req(&r).expect("post READ");
    r.wait(T).expect("READ completes");
    let (s, d) = (p.src.to_vec(), p.dst.to_vec());
    for (i, &k) in order.iter().enumerate() {
        let (i, b) = (i as u64, blk);
        assert!(
            s[(i * b) as usize..((i + 1) * b) as usize]
                == d[(k * b) as usize..((k + 1) * b) as usize],
            "block {k} read back into {i}"
        );
    }
    (wpath, r.path())
}

#[test]
fn small_requests_copy_many_segments_per_call_inside_post() {
    if !common::ucx_or_skip("direct_cma_small") {
        return;
    }
    let p = pair(shm(true, 2), 64 * 4096);
    let (w, r) = round_trip(&p, 4096, 64);
    assert!(
        w.contains("direct CMA (process_vm_writev x1 per post, 64 segments)"),
        "{w}"
    );
    assert!(
        r.contains("direct CMA (process_vm_readv x1 per post, 64 segments)"),
        "{r}"
    );
    assert!(w.contains("cma/"), "UCX's own choice is cma: {w}");
}

#[test]
fn large_requests_are_copied_in_pieces_by_the_copy_threads() {
    if !common::ucx_or_skip("direct_cma_large") {
        return;
    }
    // 2,500 blocks of 8 KiB (20 MiB, more segments than one call takes) over three threads.
    let p = pair(shm(true, 3), 2500 * 8192);
    let (w, r) = round_trip(&p, 8192, 2500);
    assert!(
        w.contains("direct CMA (process_vm_writev, 2500 segments in pieces on 3 copy threads)"),
        "{w}"
    );
    assert!(r.contains("process_vm_readv"), "{r}");
    // One large segment, cut across the threads.
    let p = pair(shm(true, 4), 32 << 20);
    let (w, _) = round_trip(&p, 32 << 20, 1);
    assert!(w.contains("direct CMA"), "{w}");
}

#[test]
fn without_threads_large_requests_are_copied_inside_post() {
    if !common::ucx_or_skip("direct_cma_inline") {
        return;
    }
    let p = pair(shm(true, 0), 1500 * 8192);
    let (w, _) = round_trip(&p, 8192, 1500);
    assert!(
        w.contains("direct CMA (process_vm_writev x2 per post, 1500 segments)"),
        "{w}"
    );
    let local = XferDescList::blocks(MemKind::Dram, p.src.addr(), 8192, 1500);
    let remote = XferDescList::blocks(MemKind::Dram, p.dst.addr(), 8192, 1500);
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &local,
            &remote,
            p.b.name(),
            XferOptions::default(),
        )
        .expect("make");
    assert_eq!(
        p.a.post_xfer_req(&req).expect("post"),
        nixl_core::XferState::Done,
        "copied inside post"
    );
    assert!(p.dst.to_vec() == p.src.to_vec());
}

#[test]
fn turned_off_ucx_makes_the_copies() {
    if !common::ucx_or_skip("direct_cma_off") {
        return;
    }
    let p = pair(shm(false, 2), 64 * 4096);
    let (w, r) = round_trip(&p, 4096, 64);
    assert!(
        !w.contains("direct CMA") && !r.contains("direct CMA"),
        "{w} / {r}"
    );
    assert!(w.contains("cma/"), "{w}");
}

/// A peer whose metadata names this very process is not copied to directly unless the caller
/// trusts its in-process peers: a forged peer could otherwise aim this process's copies at its
/// own memory.
#[test]
fn a_peer_in_this_process_gets_ucx_copies_by_default() {
    if !common::ucx_or_skip("direct_cma_same_process") {
        return;
    }
    let p = pair((shm(true, 2)).direct_cma_same_process(false), 16 * 4096);
    let (w, r) = round_trip(&p, 4096, 16);
    assert!(
        !w.contains("direct CMA") && !r.contains("direct CMA"),
        "{w} / {r}"
    );
    assert!(w.contains("cma/"), "{w}");
}

#[test]
fn over_tcp_ucx_makes_the_copies() {
    if !common::ucx_or_skip("direct_cma_tcp") {
        return;
    }
    // UCX_TLS=tcp: UCX has no cma lane, so neither does the backend.
    let p = pair(common::params(common::TCP).direct_cma(true), 16 * 4096);
    let (w, _) = round_trip(&p, 4096, 16);
    assert!(!w.contains("direct CMA") && w.contains("tcp/"), "{w}");
}

/// A peer range the peer's process can no longer access (it gave the memory up behind
/// metadata this agent still holds) ends the request in a typed error; nothing crashes, and
/// the agent keeps working. The range stays reserved (`PROT_NONE`) rather than unmapped: the
/// agents share this process with other tests, and an unmapped range could be mapped again by
/// one of them before the write (which would then land in its memory, as it would with UCX's
/// own cma or any CMA copy to a peer that freed memory it had published).
#[test]
fn an_inaccessible_peer_range_is_a_typed_error() {
    if !common::ucx_or_skip("direct_cma_inaccessible") {
        return;
    }
    for threads in [0, 2] {
        let params = shm(true, threads);
        let (a, b) = (agent("a", params.clone()), agent("b", params));
        let len = 4 << 20;
        let src = common::buf(len);
        let _r1 = a.register_mem(vec![src.clone()], &[]).expect("register");
        let target = Reserved::new(len);
        // SAFETY: the mapping outlives the registration (dropped at the end of this
        // iteration, after the agents); the agents never touch it once it is PROT_NONE except
        // through CMA, which the kernel checks.
        let raw = unsafe { RawRegion::new(RegionDesc::dram(target.addr, len as u64)) };
        let r2 = b.register_mem(vec![Arc::new(raw)], &[]).expect("register");
        a.load_remote_metadata(&b.local_metadata().expect("md"))
            .expect("load");
        let req = a
            .create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, src.addr(), len as u64, 1),
                &XferDescList::blocks(MemKind::Dram, target.addr, len as u64, 1),
                b.name(),
                XferOptions::default(),
            )
            .expect("make");
        assert!(req.path().contains("direct CMA"), "{}", req.path());
        b.deregister_mem(&r2).expect("deregister");
        drop(r2);
        target.protect_none();
        let e = match a.post_xfer_req(&req) {
            Err(e) => e,
            Ok(_) => req.wait(T).expect_err("the range is inaccessible"),
        };
        assert!(matches!(e, Error::Backend { .. }), "{e:?}");
        assert!(e.to_string().contains("EFAULT"), "{e}");
        // Still working: a standalone notification goes through.
        a.gen_notif(b.name(), b"still here", &[]).expect("notif");
        assert_eq!(
            b.wait_notifs(T).expect("notif")[a.name()],
            vec![b"still here".to_vec()]
        );
        drop(req);
        drop((a, b));
    }
}

/// An anonymous mapping of this process, unmapped on drop.
struct Reserved {
    addr: u64,
    len: usize,
}

impl Reserved {
    fn new(len: usize) -> Self {
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        Reserved {
            addr: p as u64,
            len,
        }
    }

    /// Keeps the range reserved but inaccessible.
    fn protect_none(&self) {
        // SAFETY: the range is this value's own mapping; nothing in this process reads or
        // writes it after this (the agents only reach it through the kernel's CMA checks).
        let rc =
            unsafe { libc::mprotect(self.addr as *mut libc::c_void, self.len, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect");
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // SAFETY: this value's own mapping, unmapped once.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// Notifications keep post order, and each implies the data of the posts before it (as UCX's
/// flush per post gives UCX's own copies): a large WRITE copied in pieces, then at once a small
/// one copied inside `post`; the small one's notification must not overtake the large one's,
/// and when it is handed out the large one's bytes are all there.
#[test]
fn notifications_keep_post_order_across_inline_and_pieces() {
    if !common::ucx_or_skip("direct_cma_order") {
        return;
    }
    let big = 48usize << 20;
    let p = pair(shm(true, 2), big + (64 << 10));
    for round in 0..5u8 {
        p.src.fill(round + 1);
        let large =
            p.a.create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, p.src.addr(), big as u64, 1),
                &XferDescList::blocks(MemKind::Dram, p.dst.addr(), big as u64, 1),
                p.b.name(),
                XferOptions::with_notif(vec![b'L', round]),
            )
            .expect("make large");
        let small =
            p.a.create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, p.src.addr() + big as u64, 4096, 16),
                &XferDescList::blocks(MemKind::Dram, p.dst.addr() + big as u64, 4096, 16),
                p.b.name(),
                XferOptions::with_notif(vec![b'S', round]),
            )
            .expect("make small");
        assert!(large.path().contains("in pieces"), "{}", large.path());
        p.a.post_xfer_req(&large).expect("post large");
        p.a.post_xfer_req(&small).expect("post small");
        let mut seen = Vec::new();
        let end = std::time::Instant::now() + T;
        while seen.len() < 2 && std::time::Instant::now() < end {
            let n = p.b.wait_notifs(Duration::from_millis(200)).expect("notifs");
            for m in n.get(p.a.name()).into_iter().flatten() {
                if m[0] == b'S' {
                    // Every byte of the large WRITE is there when the small one's
                    // notification is handed out.
                    let d = p.dst.to_vec();
                    assert!(
                        d[..big].iter().all(|&x| x == round + 1),
                        "round {round}: the small post's notification overtook the large post's data"
                    );
                }
                seen.push(m[0]);
            }
        }
        assert_eq!(seen, vec![b'L', b'S'], "round {round}: post order");
        large.wait(T).expect("large done");
        small.wait(T).expect("small done");
    }
}

/// A poll, a short wait and another post do a bounded slice of a large direct copy, never the
/// whole rest of it (before: `check` copied every piece no copy thread had taken, so on a
/// machine with few copy threads a poll of a 1 GiB WRITE took as long as the copy, `wait`
/// outlasted its deadline, and an unrelated 4 KiB post without a notification waited for the
/// large one's flight).
#[test]
fn polls_and_posts_do_a_bounded_slice_of_a_large_copy() {
    if !common::ucx_or_skip("direct_cma_bounded") {
        return;
    }
    let big = 1usize << 30;
    let p = pair(shm(true, 1), big + (1 << 20));
    let write = |off: usize, len: usize, notif: Option<&[u8]>| {
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr() + off as u64, len as u64, 1),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr() + off as u64, len as u64, 1),
            p.b.name(),
            XferOptions::default().notif(notif.map(<[u8]>::to_vec)),
        )
        .expect("make")
    };
    let large = write(0, big, None);
    let small = write(big, 4096, None);
    let ordered = write(big + 8192, 4096, Some(b"after"));
    assert!(large.path().contains("in pieces"), "{}", large.path());
    p.a.post_xfer_req(&large).expect("post large");
    let t = Instant::now();
    let first = p.a.check_xfer_state(&large);
    let check = t.elapsed();
    let t = Instant::now();
    p.a.post_xfer_req(&small).expect("post small");
    let small_post = t.elapsed();
    // A post with a notification returns at once too: its notification goes out after the
    // large post's data, without anyone waiting for it.
    let t = Instant::now();
    p.a.post_xfer_req(&ordered)
        .expect("post with a notification");
    let ordered_post = t.elapsed();
    let t = Instant::now();
    let waited = large.wait(Duration::from_millis(20));
    let wait = t.elapsed();
    println!(
        "1 GiB direct WRITE, 1 copy thread: check {check:?} ({first:?}), 4 KiB post {small_post:?}, \
         4 KiB post with a notification {ordered_post:?}, wait(20 ms) {wait:?} ({waited:?})"
    );
    // Bounds far above a slice (4 pieces of 256 KiB) and far below the whole copy.
    assert!(check < Duration::from_millis(30), "a check took {check:?}");
    assert!(
        small_post < Duration::from_millis(30),
        "an unrelated post took {small_post:?}"
    );
    assert!(
        ordered_post < Duration::from_millis(30),
        "a post with a notification took {ordered_post:?}"
    );
    assert!(
        wait < Duration::from_millis(20 + 100),
        "wait(20 ms) took {wait:?}"
    );
    small.wait(T).expect("small done");
    // The notification of the post after the large one still comes (the large one was ended
    // by the short wait, or finished), and the small post's bytes are there.
    ordered.wait(T).expect("ordered done");
    let n = p.b.wait_notifs(T).expect("notification");
    assert_eq!(n[p.a.name()], vec![b"after".to_vec()]);
    let (s, d) = (p.src.to_vec(), p.dst.to_vec());
    assert_eq!(s[big..big + 4096], d[big..big + 4096]);
}
