//! The backend conformance suite: one set of behaviours every backend must show, run by each
//! backend crate against its real transport (feature `conformance`).
//!
//! ```
//! # #[cfg(feature = "conformance")] {
//! use std::sync::Arc;
//! use nixl_core::conformance::{assert_all, Suite};
//! use nixl_core::{AgentConfig, InprocParams};
//!
//! assert_all(&Suite::new("inproc", AgentConfig::default(), Arc::new(|a| a.create_backend(InprocParams::default()))));
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{
    Agent, AgentConfig, BackendHandle, Capabilities, Error, HostBuffer, MemKind, MemoryRegion,
    Result, XferDescList, XferOp, XferOptions, XferTarget,
};

/// Makes a backend on a fresh agent and returns its handle.
pub type CreateFn = Arc<dyn Fn(&Agent) -> Result<BackendHandle> + Send + Sync>;
/// Makes a storage region (a file, an object) of the given size.
pub type StorageFn = Arc<dyn Fn(u64) -> Result<Arc<dyn MemoryRegion>> + Send + Sync>;

/// What to run the suite against.
#[derive(Clone)]
pub struct Suite {
    /// A label for agent names and messages.
    pub name: String,
    /// The configuration of every agent the suite creates.
    pub config: AgentConfig,
    /// Creates the backend under test on an agent.
    pub create: CreateFn,
    /// For storage backends: creates a storage region of a given size.
    pub storage: Option<StorageFn>,
}

impl Suite {
    /// A suite for a transport backend.
    pub fn new(name: &str, config: AgentConfig, create: CreateFn) -> Self {
        Suite {
            name: name.to_owned(),
            config,
            create,
            storage: None,
        }
    }
}

type Case = (&'static str, fn(&Suite) -> std::result::Result<(), String>);

const TIMEOUT: Duration = Duration::from_secs(20);

fn cases() -> Vec<Case> {
    vec![
        ("capabilities_are_consistent", capabilities_are_consistent),
        (
            "write_then_read_by_block_index",
            write_then_read_by_block_index,
        ),
        ("notification_follows_data", notification_follows_data),
        (
            "notification_changes_per_post",
            notification_changes_per_post,
        ),
        (
            "standalone_notifications_keep_order",
            standalone_notifications_keep_order,
        ),
        ("repost_after_completion", repost_after_completion),
        ("bad_descriptors_are_refused", bad_descriptors_are_refused),
        (
            "invalidated_peer_fails_requests",
            invalidated_peer_fails_requests,
        ),
        ("registration_in_use_is_kept", registration_in_use_is_kept),
        (
            "concurrent_requests_on_one_agent",
            concurrent_requests_on_one_agent,
        ),
        ("loopback_transfer", loopback_transfer),
        ("storage_roundtrip", storage_roundtrip),
        (
            "storage_out_of_range_is_refused",
            storage_out_of_range_is_refused,
        ),
    ]
}

/// Runs every case; each result is `Ok` (passed or not applicable) or the failure.
pub fn run_all(suite: &Suite) -> Vec<(&'static str, std::result::Result<(), String>)> {
    cases().into_iter().map(|(n, f)| (n, f(suite))).collect()
}

/// Runs every case and panics listing the failures.
pub fn assert_all(suite: &Suite) {
    let failed: Vec<String> = run_all(suite)
        .into_iter()
        .filter_map(|(n, r)| r.err().map(|e| format!("{n}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "conformance failures for {}:\n{}",
        suite.name,
        failed.join("\n")
    );
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn agent(s: &Suite, role: &str) -> std::result::Result<(Agent, BackendHandle), String> {
    let name = format!(
        "{}-{role}-{}-{}",
        s.name,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let a = Agent::new(&name, s.config.clone()).map_err(|e| e.to_string())?;
    let b = (s.create)(&a).map_err(|e| format!("creating the backend: {e}"))?;
    Ok((a, b))
}

fn caps(a: &Agent, b: &BackendHandle) -> std::result::Result<Capabilities, String> {
    ensure(a.backends().contains(b), || {
        format!("{b} is not a backend of {}", a.name())
    })?;
    Ok(b.capabilities().clone())
}

fn buf(len: usize) -> std::result::Result<Arc<HostBuffer>, String> {
    HostBuffer::new(len)
        .map(Arc::new)
        .ok_or_else(|| "allocation failed".to_owned())
}

fn e2s(what: &str) -> impl FnOnce(Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> std::result::Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// Two connected agents with one registered buffer each (initiator `a`, target `b`).
struct Pair {
    a: Agent,
    b: Agent,
    backend: BackendHandle,
    src: Arc<HostBuffer>,
    dst: Arc<HostBuffer>,
    _regs: (crate::Registration, crate::Registration),
}

fn pair(s: &Suite, len: usize) -> std::result::Result<Option<Pair>, String> {
    let (a, backend) = agent(s, "init")?;
    if !caps(&a, &backend)?.remote || !caps(&a, &backend)?.supports(MemKind::Dram) {
        return Ok(None);
    }
    let (b, _) = agent(s, "target")?;
    let src = buf(len)?;
    let dst = buf(len)?;
    let ra = a
        .register_mem(vec![src.clone()], &[])
        .map_err(e2s("register initiator"))?;
    let rb = b
        .register_mem(vec![dst.clone()], &[])
        .map_err(e2s("register target"))?;
    let md = b.local_metadata().map_err(e2s("target metadata"))?;
    let name = a
        .load_remote_metadata(&md)
        .map_err(e2s("load target metadata"))?;
    ensure(name == b.name(), || {
        format!("loaded {name}, expected {}", b.name())
    })?;
    // The target also learns the initiator (for notifications back and symmetric setups).
    let md = a.local_metadata().map_err(e2s("initiator metadata"))?;
    b.load_remote_metadata(&md)
        .map_err(e2s("load initiator metadata"))?;
    Ok(Some(Pair {
        a,
        b,
        backend,
        src,
        dst,
        _regs: (ra, rb),
    }))
}

fn capabilities_are_consistent(s: &Suite) -> std::result::Result<(), String> {
    let (a, b) = agent(s, "caps")?;
    let c = caps(&a, &b)?;
    ensure(!c.mem_kinds.is_empty(), || "no memory kinds".into())?;
    ensure(c.remote || c.local, || "neither remote nor local".into())?;
    ensure(a.backends() == vec![b.clone()], || {
        "backend not listed".into()
    })?;
    ensure(
        matches!(
            a.create_backend_named("no-such-backend", &Default::default()),
            Err(Error::NotFound { .. })
        ),
        || "unknown backend type accepted".into(),
    )
}

fn write_then_read_by_block_index(s: &Suite) -> std::result::Result<(), String> {
    const BLOCK: u64 = 8192;
    const N: usize = 16;
    let Some(p) = pair(s, BLOCK as usize * N)? else {
        return Ok(());
    };
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

fn notification_follows_data(s: &Suite) -> std::result::Result<(), String> {
    let len = 1 << 20;
    let Some(p) = pair(s, len)? else {
        return Ok(());
    };
    if !caps(&p.a, &p.backend)?.notifications {
        return Ok(());
    }
    for round in 0..3u64 {
        p.src.fill_pattern(100 + round);
        let req =
            p.a.create_xfer_req(
                XferOp::Write,
                &XferDescList::blocks(MemKind::Dram, p.src.addr(), len as u64 / 4, 4),
                &XferDescList::blocks(MemKind::Dram, p.dst.addr(), len as u64 / 4, 4),
                p.b.name(),
                XferOptions::with_notif(format!("round {round}").into_bytes()),
            )
            .map_err(e2s("create"))?;
        p.a.post_xfer_req(&req).map_err(e2s("post"))?;
        // The target sees the notification, and at that moment the data must be complete,
        // whether or not the initiator is still polling.
        let n = p.b.wait_notifs(TIMEOUT).map_err(e2s("wait notif"))?;
        let got = n.get(p.a.name()).cloned().unwrap_or_default();
        ensure(got == vec![format!("round {round}").into_bytes()], || {
            format!("round {round}: notifications {got:?}")
        })?;
        ensure(p.dst.to_vec() == p.src.to_vec(), || {
            format!("round {round}: data incomplete when the notification arrived")
        })?;
        req.wait(TIMEOUT).map_err(e2s("wait"))?;
    }
    Ok(())
}

/// One prepared request reposted for several KV requests, each post with its own message
/// (NIXL's per-post `notifMsg`), then with none.
fn notification_changes_per_post(s: &Suite) -> std::result::Result<(), String> {
    let len = 64 << 10;
    let Some(p) = pair(s, len)? else {
        return Ok(());
    };
    if !caps(&p.a, &p.backend)?.notifications {
        return Ok(());
    }
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), len as u64, 1),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), len as u64, 1),
            p.b.name(),
            XferOptions::with_notif(b"kv request 0".to_vec()),
        )
        .map_err(e2s("create"))?;
    let mut got: Vec<Vec<u8>> = Vec::new();
    for k in 0..3u64 {
        if k > 0 {
            req.set_notif(Some(format!("kv request {k}").into_bytes()))
                .map_err(e2s("set_notif"))?;
        }
        p.src.fill_pattern(300 + k);
        p.a.post_xfer_req(&req).map_err(e2s("post"))?;
        req.wait(TIMEOUT).map_err(e2s("wait"))?;
        let deadline = std::time::Instant::now() + TIMEOUT;
        while got.len() as u64 <= k && std::time::Instant::now() < deadline {
            let mut n =
                p.b.wait_notifs(Duration::from_millis(100))
                    .map_err(e2s("wait notif"))?;
            got.append(n.entry(p.a.name().to_owned()).or_default());
        }
        ensure(p.dst.to_vec() == p.src.to_vec(), || {
            format!("post {k}: data differs")
        })?;
    }
    let want: Vec<Vec<u8>> = (0..3)
        .map(|k| format!("kv request {k}").into_bytes())
        .collect();
    ensure(got == want, || format!("notifications {got:?}"))?;
    // Without a message the next post delivers none.
    req.set_notif(None).map_err(e2s("clear notif"))?;
    p.a.post_xfer_req(&req).map_err(e2s("post without notif"))?;
    req.wait(TIMEOUT).map_err(e2s("wait without notif"))?;
    let n =
        p.b.wait_notifs(Duration::from_millis(300))
            .map_err(e2s("wait notif"))?;
    ensure(n.is_empty(), || {
        format!("a post without a message notified: {n:?}")
    })
}

fn standalone_notifications_keep_order(s: &Suite) -> std::result::Result<(), String> {
    let Some(p) = pair(s, 4096)? else {
        return Ok(());
    };
    if !caps(&p.a, &p.backend)?.notifications {
        return Ok(());
    }
    ensure(
        matches!(
            p.a.gen_notif("nobody", b"x", &[]),
            Err(Error::NotFound { .. })
        ),
        || "notification to an unknown agent accepted".into(),
    )?;
    const N: usize = 200;
    for i in 0..N {
        p.a.gen_notif(p.b.name(), format!("{i}").as_bytes(), &[])
            .map_err(e2s("gen_notif"))?;
    }
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while got.len() < N && std::time::Instant::now() < deadline {
        if let Ok(mut n) = p.b.wait_notifs(Duration::from_millis(200)) {
            got.append(n.entry(p.a.name().to_owned()).or_default());
        }
    }
    let want: Vec<Vec<u8>> = (0..N).map(|i| format!("{i}").into_bytes()).collect();
    ensure(got == want, || {
        format!(
            "received {} of {N}, in order: {}",
            got.len(),
            got.iter().zip(&want).all(|(a, b)| a == b)
        )
    })
}

fn repost_after_completion(s: &Suite) -> std::result::Result<(), String> {
    let Some(p) = pair(s, 65536)? else {
        return Ok(());
    };
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

fn bad_descriptors_are_refused(s: &Suite) -> std::result::Result<(), String> {
    let Some(p) = pair(s, 8192)? else {
        return Ok(());
    };
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
    let zero = XferDescList::from_descs(MemKind::Dram, [crate::Desc::new(p.src.addr(), 0)]);
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
        .create_backend(crate::InprocParams::default())
        .map_err(e2s("stranger backend"))?;
    ensure(
        matches!(
            a.prep_xfer_dlist(XferTarget::Initiator, &outside, &[foreign]),
            Err(Error::Mismatch { .. })
        ),
        || "another agent's backend handle accepted as a hint".into(),
    )?;
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

fn l_remote(p: &Pair) -> std::result::Result<crate::PreparedList, String> {
    p.a.prep_xfer_dlist(
        XferTarget::Agent(p.b.name()),
        &XferDescList::blocks(MemKind::Dram, p.dst.addr(), 4096, 2),
        &[],
    )
    .map_err(|e| e.to_string())
}

fn invalidated_peer_fails_requests(s: &Suite) -> std::result::Result<(), String> {
    let Some(p) = pair(s, 4096)? else {
        return Ok(());
    };
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
    ensure(
        matches!(p.a.post_xfer_req(&req), Err(Error::PeerRestarted { .. })),
        || "post to an invalidated peer accepted".into(),
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

fn registration_in_use_is_kept(s: &Suite) -> std::result::Result<(), String> {
    let (a, backend) = agent(s, "reg")?;
    if !caps(&a, &backend)?.supports(MemKind::Dram) {
        return Ok(());
    }
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

fn concurrent_requests_on_one_agent(s: &Suite) -> std::result::Result<(), String> {
    const THREADS: usize = 4;
    const BLOCK: u64 = 16384;
    let Some(p) = pair(s, BLOCK as usize * THREADS)? else {
        return Ok(());
    };
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

fn loopback_transfer(s: &Suite) -> std::result::Result<(), String> {
    let (a, backend) = agent(s, "loop")?;
    let c = caps(&a, &backend)?;
    if !c.local || !c.supports(MemKind::Dram) || s.storage.is_some() {
        return Ok(());
    }
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

fn storage_roundtrip(s: &Suite) -> std::result::Result<(), String> {
    let Some(make) = &s.storage else {
        return Ok(());
    };
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
            (0..N as u64).map(|i| crate::Desc::on_device(base + i * BLOCK, BLOCK, sd.dev_id)),
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

fn storage_out_of_range_is_refused(s: &Suite) -> std::result::Result<(), String> {
    let Some(make) = &s.storage else {
        return Ok(());
    };
    let (a, _) = agent(s, "store-bad")?;
    let region = make(1 << 16).map_err(e2s("storage region"))?;
    let sd = region.desc();
    let _r = a
        .register_mem(vec![region], &[])
        .map_err(e2s("register storage"))?;
    let past = XferDescList::from_descs(
        sd.kind,
        [crate::Desc::on_device(
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
