//! Storage cases: a round trip through a storage region, out-of-range descriptors.

use super::{agent, buf, e2s, ensure, storage_fn, Res, Suite, TIMEOUT};
use nixl_core::{Error, MemKind, XferDescList, XferOp, XferOptions, XferTarget};

pub(super) fn storage_roundtrip(s: &Suite) -> Res {
    let make = storage_fn(s)?;
    const BLOCK: u64 = 64 * 1024;
    const N: usize = 8;
    let (a, _) = agent(s, "store")?;
    let region = make(BLOCK * N as u64).map_err(e2s("storage region"))?;
    let sd = region.desc();
    let src = buf(BLOCK as usize * N)?;
    let back = buf(BLOCK as usize * N)?;
    let _r1 = a
        .register_mem(vec![src.clone(), back.clone()], &[])
        .map_err(e2s("register dram"))?;
    let _r2 = a
        .register_mem(vec![region], &[])
        .map_err(e2s("register storage"))?;
    src.fill_pattern(9);
    let storage_list = |base: u64| {
        XferDescList::from_descs(
            sd.kind,
            (0..N as u64).map(|i| nixl_core::Desc::on_device(base + i * BLOCK, BLOCK, sd.dev_id)),
        )
    };
    let local = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, src.addr(), BLOCK, N),
            &[],
        )
        .map_err(e2s("prep dram"))?;
    let remote = a
        .prep_xfer_dlist(XferTarget::Agent(a.name()), &storage_list(sd.addr), &[])
        .map_err(e2s("prep storage"))?;
    let idx: Vec<usize> = (0..N).collect();
    let rev: Vec<usize> = (0..N).rev().collect();
    let w = a
        .make_prepped_xfer(
            XferOp::Write,
            &local,
            &idx,
            &remote,
            &rev,
            XferOptions::default(),
        )
        .map_err(e2s("make write"))?;
    a.post_xfer_req(&w).map_err(e2s("post write"))?;
    w.wait(TIMEOUT).map_err(e2s("wait write"))?;
    let back_list = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, back.addr(), BLOCK, N),
            &[],
        )
        .map_err(e2s("prep back"))?;
    let r = a
        .make_prepped_xfer(
            XferOp::Read,
            &back_list,
            &rev,
            &remote,
            &rev,
            XferOptions::default(),
        )
        .map_err(e2s("make read"))?;
    a.post_xfer_req(&r).map_err(e2s("post read"))?;
    r.wait(TIMEOUT).map_err(e2s("wait read"))?;
    // back[j] = storage[j] = src[N-1-j]... read used identity pairs (rev, rev), so back == storage.
    let (s_v, b_v) = (src.to_vec(), back.to_vec());
    for j in 0..N {
        let from = (N - 1 - j) * BLOCK as usize;
        let at = j * BLOCK as usize;
        ensure(
            b_v[at..at + BLOCK as usize] == s_v[from..from + BLOCK as usize],
            || format!("storage block {j} differs"),
        )?;
    }
    Ok(())
}

pub(super) fn storage_out_of_range_is_refused(s: &Suite) -> Res {
    let make = storage_fn(s)?;
    let (a, _) = agent(s, "store-bad")?;
    let region = make(1 << 16).map_err(e2s("storage region"))?;
    let sd = region.desc();
    let _r = a
        .register_mem(vec![region], &[])
        .map_err(e2s("register storage"))?;
    let past = XferDescList::from_descs(
        sd.kind,
        [nixl_core::Desc::on_device(
            sd.addr + (1 << 16) - 4096,
            8192,
            sd.dev_id,
        )],
    );
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Agent(a.name()), &past, &[]),
            Err(Error::NotFound { .. })
        ),
        || "storage descriptor past the end accepted".into(),
    )
}
