//! Transfer cases: block tables, reposts, bad descriptors, invalidated peers, registrations
//! in use, concurrency, loopback.

use std::sync::Arc;

use super::{agent, buf, e2s, ensure, pair, Pair, Res, Suite, TIMEOUT};
use nixl_core::{
    Agent, AgentConfig, Error, MemKind, XferDescList, XferOp, XferOptions, XferTarget,
};

pub(super) fn write_then_read_by_block_index(s: &Suite) -> Res {
    const BLOCK: u64 = 8192;
    const N: usize = 16;
    let p = pair(s, BLOCK as usize * N)?;
    p.src.fill_pattern(11);
    let local =
        p.a.prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), BLOCK, N),
            &[],
        )
        .map_err(e2s("prep local"))?;
    let remote =
        p.a.prep_xfer_dlist(
            XferTarget::Agent(p.b.name()),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), BLOCK, N),
            &[],
        )
        .map_err(e2s("prep remote"))?;
    // A permuted block table: local block i goes to remote block perm[i].
    let perm: Vec<usize> = (0..N).map(|i| (i * 5 + 3) % N).collect();
    let idx: Vec<usize> = (0..N).collect();
    let w =
        p.a.make_prepped_xfer(
            XferOp::Write,
            &local,
            &idx,
            &remote,
            &perm,
            XferOptions::default(),
        )
        .map_err(e2s("make write"))?;
    p.a.post_xfer_req(&w).map_err(e2s("post write"))?;
    w.wait(TIMEOUT).map_err(e2s("wait write"))?;
    let (src, dst) = (p.src.to_vec(), p.dst.to_vec());
    for (i, &j) in perm.iter().enumerate() {
        let (b, c) = (i * BLOCK as usize, j * BLOCK as usize);
        ensure(
            src[b..b + BLOCK as usize] == dst[c..c + BLOCK as usize],
            || format!("WRITE block {i} -> {j} differs"),
        )?;
    }
    // Read everything back (contiguous, so merged into one segment) into a cleared source.
    p.src.fill(0);
    let r =
        p.a.make_prepped_xfer(
            XferOp::Read,
            &local,
            &idx,
            &remote,
            &idx,
            XferOptions::default(),
        )
        .map_err(e2s("make read"))?;
    ensure(r.segment_count() == 1, || {
        format!(
            "contiguous blocks not merged: {} segments",
            r.segment_count()
        )
    })?;
    p.a.post_xfer_req(&r).map_err(e2s("post read"))?;
    r.wait(TIMEOUT).map_err(e2s("wait read"))?;
    ensure(p.src.to_vec() == dst, || "READ data differs".into())?;
    ensure(r.backend() == p.backend, || {
        "request reports another backend".into()
    })
}

pub(super) fn repost_after_completion(s: &Suite) -> Res {
    let p = pair(s, 65536)?;
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), 65536, 1),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), 65536, 1),
            p.b.name(),
            XferOptions::default(),
        )
        .map_err(e2s("create"))?;
    for round in 0..4u64 {
        p.src.fill_pattern(round);
        match p.a.post_xfer_req(&req) {
            Ok(_) => {}
            Err(e) => return Err(format!("post {round}: {e}")),
        }
        if req.is_in_flight() {
            ensure(
                matches!(p.a.post_xfer_req(&req), Err(Error::RepostActive { .. })),
                || "repost while active accepted".into(),
            )?;
        }
        req.wait(TIMEOUT).map_err(e2s("wait"))?;
        ensure(p.dst.to_vec() == p.src.to_vec(), || {
            format!("round {round}: data differs")
        })?;
    }
    Ok(())
}

pub(super) fn bad_descriptors_are_refused(s: &Suite) -> Res {
    let p = pair(s, 8192)?;
    bad_lists_are_refused(&p)?;
    let l = bad_pairings_are_refused(&p)?;
    bad_metadata_is_refused(&p.a)?;
    let a = &p.a;
    // The agent is unchanged: a good transfer still works.
    let good = a
        .make_prepped_xfer(
            XferOp::Write,
            &l,
            &[0],
            &l_remote(&p)?,
            &[0],
            XferOptions::default(),
        )
        .map_err(e2s("make"))?;
    a.post_xfer_req(&good).map_err(e2s("post"))?;
    good.wait(TIMEOUT).map_err(e2s("wait"))
}

/// Descriptors outside registrations, unknown agents, empty descriptors and another agent's
/// backend hint are refused when preparing.
fn bad_lists_are_refused(p: &Pair) -> Res {
    let a = &p.a;
    let outside = XferDescList::blocks(MemKind::Dram, p.src.addr() + 4096, 8192, 1);
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Initiator, &outside, &[]),
            Err(Error::NotFound { .. })
        ),
        || "local descriptor past the registration accepted".into(),
    )?;
    let remote_out = XferDescList::blocks(MemKind::Dram, p.dst.addr() + 1, 8192, 1);
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Agent(p.b.name()), &remote_out, &[]),
            Err(Error::NotFound { .. })
        ),
        || "remote descriptor past the region accepted".into(),
    )?;
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Agent("no-such-agent"), &outside, &[]),
            Err(Error::NotFound { .. })
        ),
        || "unknown agent accepted".into(),
    )?;
    let zero = XferDescList::from_descs(MemKind::Dram, [nixl_core::Desc::new(p.src.addr(), 0)]);
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Initiator, &zero, &[]),
            Err(Error::InvalidParam { .. })
        ),
        || "empty descriptor accepted".into(),
    )?;
    let stranger = Agent::new(&format!("{}-stranger", a.name()), AgentConfig::default())
        .map_err(e2s("stranger agent"))?;
    let foreign = stranger
        .create_backend(nixl_core::InprocParams::default())
        .map_err(e2s("stranger backend"))?;
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Initiator, &outside, &[foreign]),
            Err(Error::Mismatch { .. })
        ),
        || "another agent's backend handle accepted as a hint".into(),
    )?;
    Ok(())
}

/// Mismatched lengths and counts, indices out of range and swapped sides are refused when
/// making a request. Returns a good local list (two 4 KiB descriptors).
fn bad_pairings_are_refused(p: &Pair) -> std::result::Result<nixl_core::PreparedList, String> {
    let a = &p.a;
    let l = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), 4096, 2),
            &[],
        )
        .map_err(e2s("prep"))?;
    let r = a
        .prep_xfer_dlist(
            XferTarget::Agent(p.b.name()),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), 2048, 2),
            &[],
        )
        .map_err(e2s("prep"))?;
    ensure(
        matches!(
            a.make_prepped_xfer(XferOp::Write, &l, &[0], &r, &[0], XferOptions::default()),
            Err(Error::Mismatch { .. })
        ),
        || "length mismatch accepted".into(),
    )?;
    ensure(
        matches!(
            a.make_prepped_xfer(XferOp::Write, &l, &[0, 1], &r, &[0], XferOptions::default()),
            Err(Error::Mismatch { .. })
        ),
        || "index count mismatch accepted".into(),
    )?;
    ensure(
        matches!(
            a.make_prepped_xfer(XferOp::Write, &l, &[5], &r, &[0], XferOptions::default()),
            Err(Error::InvalidParam { .. })
        ),
        || "index out of range accepted".into(),
    )?;
    ensure(
        matches!(
            a.make_prepped_xfer(XferOp::Write, &r, &[0], &l, &[0], XferOptions::default()),
            Err(Error::InvalidParam { .. })
        ),
        || "swapped sides accepted".into(),
    )?;
    Ok(l)
}

/// Garbage and the agent's own metadata are refused.
fn bad_metadata_is_refused(a: &Agent) -> Res {
    ensure(
        matches!(
            a.load_remote_metadata(b"garbage"),
            Err(Error::Decode { .. })
        ),
        || "garbage metadata accepted".into(),
    )?;
    let own = a.local_metadata().map_err(e2s("md"))?;
    ensure(
        matches!(a.load_remote_metadata(&own), Err(Error::NotAllowed { .. })),
        || "own metadata accepted".into(),
    )?;
    Ok(())
}

fn l_remote(p: &Pair) -> std::result::Result<nixl_core::PreparedList, String> {
    p.a.prep_xfer_dlist(
        XferTarget::Agent(p.b.name()),
        &XferDescList::blocks(MemKind::Dram, p.dst.addr(), 4096, 2),
        &[],
    )
    .map_err(|e| e.to_string())
}

pub(super) fn invalidated_peer_fails_requests(s: &Suite) -> Res {
    let p = pair(s, 4096)?;
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), 4096, 1),
            p.b.name(),
            XferOptions::default(),
        )
        .map_err(e2s("create"))?;
    p.a.invalidate_remote_metadata(p.b.name())
        .map_err(e2s("invalidate"))?;
    // Refused with an error that says the peer was invalidated (not that it restarted).
    let r = p.a.post_xfer_req(&req);
    ensure(
        matches!(&r, Err(e @ Error::RemoteDisconnect { .. }) if e.to_string().contains("invalidated")),
        || format!("post to an invalidated peer: {r:?}"),
    )?;
    ensure(
        matches!(
            p.a.invalidate_remote_metadata(p.b.name()),
            Err(Error::NotFound { .. })
        ),
        || "double invalidate accepted".into(),
    )?;
    ensure(!p.a.check_remote_metadata(p.b.name(), None), || {
        "peer still listed".into()
    })?;
    // Reloading works again.
    p.a.load_remote_metadata(&p.b.local_metadata().map_err(e2s("md"))?)
        .map_err(e2s("reload"))?;
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), 4096, 1),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), 4096, 1),
            p.b.name(),
            XferOptions::default(),
        )
        .map_err(e2s("create after reload"))?;
    p.a.post_xfer_req(&req).map_err(e2s("post after reload"))?;
    req.wait(TIMEOUT).map_err(e2s("wait after reload"))
}

pub(super) fn registration_in_use_is_kept(s: &Suite) -> Res {
    let (a, backend) = agent(s, "reg")?;
    let b = buf(8192)?;
    let reg = a
        .register_mem(vec![b.clone()], &[])
        .map_err(e2s("register"))?;
    ensure(reg.backends() == vec![backend.clone()], || {
        format!("registered with {:?}", reg.backends())
    })?;
    let list = a
        .prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 2),
            &[],
        )
        .map_err(e2s("prep"))?;
    ensure(
        matches!(a.deregister_mem(&reg), Err(Error::NotAllowed { .. })),
        || "deregistration under a prepared list accepted".into(),
    )?;
    drop(list);
    a.deregister_mem(&reg).map_err(e2s("deregister"))?;
    ensure(
        matches!(a.deregister_mem(&reg), Err(Error::NotFound { .. })),
        || "double deregistration accepted".into(),
    )?;
    ensure(
        matches!(
            a.prep_xfer_dlist(
                XferTarget::Initiator,
                &XferDescList::blocks(MemKind::Dram, b.addr(), 4096, 1),
                &[]
            ),
            Err(Error::NotFound { .. })
        ),
        || "deregistered memory still usable".into(),
    )?;
    ensure(
        matches!(a.register_mem(vec![], &[]), Err(Error::InvalidParam { .. })),
        || "empty registration accepted".into(),
    )
}

pub(super) fn concurrent_requests_on_one_agent(s: &Suite) -> Res {
    const THREADS: usize = 4;
    const BLOCK: u64 = 16384;
    let p = pair(s, BLOCK as usize * THREADS)?;
    p.src.fill_pattern(77);
    let local = Arc::new(
        p.a.prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), BLOCK, THREADS),
            &[],
        )
        .map_err(e2s("prep"))?,
    );
    let remote = Arc::new(
        p.a.prep_xfer_dlist(
            XferTarget::Agent(p.b.name()),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), BLOCK, THREADS),
            &[],
        )
        .map_err(e2s("prep"))?,
    );
    let results: Vec<std::result::Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (a, local, remote) = (p.a.clone(), local.clone(), remote.clone());
                sc.spawn(move || -> std::result::Result<(), String> {
                    let req = a
                        .make_prepped_xfer(
                            XferOp::Write,
                            &local,
                            &[t],
                            &remote,
                            &[t],
                            XferOptions::default(),
                        )
                        .map_err(|e| e.to_string())?;
                    for _ in 0..20 {
                        a.post_xfer_req(&req).map_err(|e| e.to_string())?;
                        req.wait(TIMEOUT).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    for r in results {
        r?;
    }
    ensure(p.dst.to_vec() == p.src.to_vec(), || {
        "data differs after concurrent writes".into()
    })
}

pub(super) fn loopback_transfer(s: &Suite) -> Res {
    let (a, _) = agent(s, "loop")?;
    let b = buf(16384)?;
    let _r = a
        .register_mem(vec![b.clone()], &[])
        .map_err(e2s("register"))?;
    b.fill_pattern(5);
    let req = a
        .create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, b.addr(), 8192, 1),
            &XferDescList::blocks(MemKind::Dram, b.addr() + 8192, 8192, 1),
            a.name(),
            XferOptions::default(),
        )
        .map_err(e2s("create"))?;
    a.post_xfer_req(&req).map_err(e2s("post"))?;
    req.wait(TIMEOUT).map_err(e2s("wait"))?;
    let v = b.to_vec();
    ensure(v[..8192] == v[8192..], || "loopback data differs".into())
}
