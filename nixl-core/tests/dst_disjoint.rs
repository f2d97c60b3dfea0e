//! What the agent tells a backend about a request's destinations: `XferSpec::dst_disjoint`
//! only where every destination index is named once over a prepared list whose descriptors
//! share no byte, `XferSpec::ends_apart` only where besides no region of the destination's
//! list meets one of the source's, so a backend may skip its own proof; the transfer itself
//! is unchanged (every byte lands).

use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::Backend as _;
use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions,
    XferTarget,
};
use nixl_testkit::unique;
use nixl_testkit::wrapped::WrappedParams;
use parking_lot::Mutex;

/// What each `prepare_xfer` was told: `(dst_disjoint, ends_apart)`.
type Told = Arc<Mutex<Vec<(bool, bool)>>>;

/// A real INPROC backend that records what each `prepare_xfer` was told.
fn recording(told: Told) -> WrappedParams {
    WrappedParams::new("INPROC", move |inproc, spec| {
        told.lock().push((spec.dst_disjoint, spec.ends_apart));
        inproc.prepare_xfer(spec)
    })
}

const BLOCK: u64 = 256;
const BLOCKS: usize = 64;

/// Two agents with a recording INPROC backend and a registered buffer of `BLOCKS` blocks
/// each (one buffer both register where `shared`); `a` knows `b`.
fn pair(shared: bool) -> (Agent, Agent, Arc<HostBuffer>, Arc<HostBuffer>, Told) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mk = |p: &str| {
        let a = Agent::new(&unique(p), AgentConfig::default()).unwrap();
        a.create_backend(recording(seen.clone())).unwrap();
        a
    };
    let (a, b) = (mk("dd-a"), mk("dd-b"));
    let len = BLOCK as usize * BLOCKS;
    let sa = Arc::new(HostBuffer::new(len).unwrap());
    let sb = if shared {
        sa.clone()
    } else {
        Arc::new(HostBuffer::new(len).unwrap())
    };
    std::mem::forget(a.register_mem(vec![sa.clone()], &[]).unwrap());
    std::mem::forget(b.register_mem(vec![sb.clone()], &[]).unwrap());
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    (a, b, sa, sb, seen)
}

/// A fixed shuffle of `0..n` (the list in no address order: no block-table form).
fn shuffled(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = 7u64;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (x >> 33) as usize % (i + 1));
    }
    v
}

/// Runs `op` between `a`'s blocks `0..n` and `b`'s descriptors `rdescs(b's buffer)` at
/// indices `ridx`, checks every byte landed and returns what the backend was told.
fn run(
    op: XferOp,
    rdescs: impl Fn(&HostBuffer) -> Vec<Desc>,
    ridx: &[usize],
) -> std::result::Result<(bool, bool), Error> {
    run_over(false, op, rdescs, ridx)
}

/// [`run`], with both agents registering one buffer where `shared`.
fn run_over(
    shared: bool,
    op: XferOp,
    rdescs: impl Fn(&HostBuffer) -> Vec<Desc>,
    ridx: &[usize],
) -> std::result::Result<(bool, bool), Error> {
    let (a, b, sa, sb, seen) = pair(shared);
    for (i, buf) in [&sa, &sb].into_iter().enumerate() {
        let v: Vec<u8> = (0..BLOCK as usize * BLOCKS)
            .map(|k| (k * 7 + i * 101) as u8)
            .collect();
        assert!(buf.write_at(0, &v));
    }
    let rdescs = rdescs(&sb);
    let n = ridx.len();
    let l = a.prep_xfer_dlist(
        XferTarget::Initiator,
        &XferDescList::from_descs(
            MemKind::Dram,
            (0..BLOCKS).map(|i| Desc::new(sa.addr() + i as u64 * BLOCK, BLOCK)),
        ),
        &[],
    )?;
    let r = a.prep_xfer_dlist(
        XferTarget::Agent(b.name()),
        &XferDescList::from_descs(MemKind::Dram, rdescs.iter().copied()),
        &[],
    )?;
    let lidx: Vec<usize> = (0..n).collect();
    let (before_a, before_b) = (sa.to_vec(), sb.to_vec());
    let req = a.make_prepped_xfer(op, &l, &lidx, &r, ridx, XferOptions::default())?;
    a.post_xfer_req(&req)?;
    req.wait(Duration::from_secs(10))?;
    // Every byte landed: each pair's destination holds its source's bytes.
    let (after_a, after_b) = (sa.to_vec(), sb.to_vec());
    for (k, &ri) in ridx.iter().enumerate() {
        let d = rdescs[ri];
        let (off, len, lo) = (
            (d.addr - sb.addr()) as usize,
            d.len as usize,
            k * BLOCK as usize,
        );
        match op {
            XferOp::Write => assert_eq!(after_b[off..off + len], before_a[lo..lo + len]),
            XferOp::Read => assert_eq!(after_a[lo..lo + len], before_b[off..off + len]),
        }
    }
    let told = seen.lock().clone();
    assert_eq!(told.len(), 1, "one prepare_xfer per request");
    Ok(told[0])
}

/// Remote descriptors: `b`'s blocks in a fixed shuffled order (no block-table form), each
/// `len` bytes from its block's start.
fn shuffled_blocks(len: u64) -> impl Fn(&HostBuffer) -> Vec<Desc> {
    move |buf| {
        shuffled(BLOCKS)
            .into_iter()
            .map(|i| Desc::new(buf.addr() + i as u64 * BLOCK, len))
            .collect()
    }
}

#[test]
fn distinct_destinations_over_a_disjoint_list_are_proven_disjoint() {
    // WRITE into the remote list (in shuffled address order: a sort decides), and READ into
    // the local one (in address order: one pass decides).
    let idx = shuffled(BLOCKS)[..40].to_vec();
    assert_eq!(
        run(XferOp::Write, shuffled_blocks(BLOCK), &idx).unwrap(),
        (true, true)
    );
    assert_eq!(
        run(XferOp::Read, shuffled_blocks(BLOCK), &idx).unwrap(),
        (true, true)
    );
}

#[test]
fn lists_over_one_buffer_are_not_called_apart() {
    // Both agents registered one buffer: the sources are its first half, the destinations
    // its second (no byte shared), yet their regions are one: only the destinations are
    // proven disjoint.
    let second_half = |buf: &HostBuffer| -> Vec<Desc> {
        shuffled(BLOCKS / 2)
            .into_iter()
            .map(|i| Desc::new(buf.addr() + (BLOCKS / 2 + i) as u64 * BLOCK, BLOCK))
            .collect()
    };
    let idx = shuffled(BLOCKS / 2)[..20].to_vec();
    for op in [XferOp::Write, XferOp::Read] {
        assert_eq!(
            run_over(true, op, second_half, &idx).unwrap(),
            (true, false),
            "{op}"
        );
    }
}

#[test]
fn a_list_with_overlapping_descriptors_proves_nothing() {
    // Each remote descriptor reaches into the next block: the list overlaps itself, so even
    // a request naming every other one (no overlap among those) is not called disjoint.
    let idx: Vec<usize> = (0..BLOCKS / 2).map(|i| 2 * i).collect();
    let overlapping = |buf: &HostBuffer| -> Vec<Desc> {
        (0..BLOCKS)
            .map(|i| {
                let len = if i + 1 < BLOCKS { BLOCK + 16 } else { BLOCK };
                Desc::new(buf.addr() + i as u64 * BLOCK, len)
            })
            .collect()
    };
    // Equal lengths are required per pair: pair local block k with remote 2k of one
    // length only where the lengths match, so READ the last (unextended) block alone too.
    let err = run(XferOp::Write, overlapping, &idx).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let told = run(XferOp::Write, overlapping, &[BLOCKS - 1]).unwrap();
    assert_eq!(told, (false, false));
}

#[test]
fn a_repeated_destination_is_refused_before_any_backend() {
    let idx = [3usize, 5, 3];
    let err = run(XferOp::Write, shuffled_blocks(BLOCK), &idx).unwrap_err();
    assert!(matches!(err, Error::InvalidParam { .. }), "{err}");
}
