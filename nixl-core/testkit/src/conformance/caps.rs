//! Capability cases: the declaration is consistent, and it matches what the backend does: a
//! declared capability works, an undeclared one is refused (so "not applicable" cases are
//! operations the agent never runs on the backend).

use super::{agent, buf, caps, e2s, ensure, Res, Suite, TIMEOUT};
use nixl_core::backend::Capabilities;
use nixl_core::{Agent, Error, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};

pub(super) fn capabilities_are_consistent(s: &Suite) -> Res {
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

/// Each declared capability is checked against behaviour, in both directions:
///
/// - DRAM: registering host memory with the backend works if and only if it is declared;
/// - remote: a WRITE into another agent's memory lands if declared, and is refused (the
///   memory unchanged) if not;
/// - notifications: a standalone notification to a peer arrives if declared (with remote);
///   if not, notifications and requests carrying one are refused;
/// - local: a loopback WRITE lands if declared and is refused if not (transport backends;
///   a storage backend must declare it, its storage cases then use it).
pub(super) fn capabilities_match_behaviour(s: &Suite) -> Res {
    const LEN: usize = 16384;
    let (a, backend) = agent(s, "decl")?;
    let c = caps(&a, &backend)?;
    let mem = buf(LEN)?;
    let reg = a.register_mem(vec![mem.clone()], std::slice::from_ref(&backend));
    match (&reg, c.supports(MemKind::Dram)) {
        (Ok(_), true) | (Err(_), false) => {}
        (Ok(_), false) => return Err("registers DRAM without declaring it".into()),
        (Err(e), true) => return Err(format!("declares DRAM but refused to register it: {e}")),
    }
    if !c.supports(MemKind::Dram) {
        // Nothing below can move data without DRAM.
        return Ok(());
    }
    let (b, _) = agent(s, "decl-peer")?;
    let peer_mem = buf(LEN)?;
    peer_mem.fill(0x5A);
    let _rb = b
        .register_mem(vec![peer_mem.clone()], &[])
        .map_err(e2s("register the peer's memory"))?;
    let loaded = b
        .local_metadata()
        .and_then(|md| a.load_remote_metadata(&md));
    ensure(loaded.is_ok() || !c.remote, || {
        format!("declares remote transfers but cannot load a peer: {loaded:?}")
    })?;
    declared_remote(&a, &b, &c, &mem, &peer_mem)?;
    declared_notifications(&a, &b, &c, &mem, &peer_mem)?;
    if s.storage.is_some() {
        return ensure(c.local, || {
            "a storage backend that declares no local transfers".into()
        });
    }
    declared_local(&a, &c, &mem)
}

fn one(addr: u64) -> XferDescList {
    XferDescList::blocks(MemKind::Dram, addr, 4096, 1)
}

/// A WRITE into the peer's memory lands if remote transfers are declared, else it is refused
/// and the memory unchanged.
fn declared_remote(
    a: &Agent,
    b: &Agent,
    c: &Capabilities,
    mem: &HostBuffer,
    peer_mem: &HostBuffer,
) -> Res {
    const LEN: usize = 16384;
    mem.fill(0xC3);
    let remote_write = a
        .create_xfer_req(
            XferOp::Write,
            &one(mem.addr()),
            &one(peer_mem.addr()),
            b.name(),
            XferOptions::default(),
        )
        .and_then(|r| a.post_xfer_req(&r).and_then(|_| r.wait(TIMEOUT)));
    let mut head = vec![0u8; 4096];
    peer_mem.read_at(0, &mut head);
    if c.remote {
        remote_write.map_err(e2s("declares remote transfers, but a WRITE to a peer"))?;
        ensure(head == vec![0xC3; 4096], || {
            "a remote WRITE reported done but the peer's memory differs".into()
        })
    } else {
        ensure(remote_write.is_err(), || {
            "declares no remote transfers, but a WRITE to a peer was accepted".into()
        })?;
        ensure(peer_mem.to_vec() == vec![0x5A; LEN], || {
            "declares no remote transfers, but the peer's memory changed".into()
        })
    }
}

/// A standalone notification arrives if notifications are declared (with remote); if not,
/// notifications and requests carrying one are refused.
fn declared_notifications(
    a: &Agent,
    b: &Agent,
    c: &Capabilities,
    mem: &HostBuffer,
    peer_mem: &HostBuffer,
) -> Res {
    let sent = a.gen_notif(b.name(), b"declared", &[]);
    if c.notifications && c.remote {
        sent.map_err(e2s("declares notifications, but gen_notif"))?;
        let got = b.wait_notifs(TIMEOUT).map_err(e2s("wait_notifs"))?;
        ensure(
            got.get(a.name())
                .is_some_and(|m| m.contains(&b"declared".to_vec())),
            || format!("declares notifications, but the peer received {got:?}"),
        )
    } else if !c.notifications {
        ensure(sent.is_err(), || {
            "declares no notifications, but gen_notif was accepted".into()
        })?;
        let target = if c.remote { b.name() } else { a.name() };
        let with_notif = a.create_xfer_req(
            XferOp::Write,
            &one(mem.addr()),
            &one(if c.remote {
                peer_mem.addr()
            } else {
                mem.addr() + 8192
            }),
            target,
            XferOptions::with_notif(b"x".to_vec()),
        );
        ensure(with_notif.is_err(), || {
            "declares no notifications, but a request carrying one was accepted".into()
        })
    } else {
        Ok(())
    }
}

/// A loopback WRITE lands if local transfers are declared, else it is refused and the
/// target unchanged.
fn declared_local(a: &Agent, c: &Capabilities, mem: &HostBuffer) -> Res {
    mem.fill(0x11);
    mem.write_at(0, &[0x77; 4096]);
    let loopback = a
        .create_xfer_req(
            XferOp::Write,
            &one(mem.addr()),
            &one(mem.addr() + 8192),
            a.name(),
            XferOptions::default(),
        )
        .and_then(|r| a.post_xfer_req(&r).and_then(|_| r.wait(TIMEOUT)));
    let mut second = vec![0u8; 4096];
    mem.read_at(8192, &mut second);
    if c.local {
        loopback.map_err(e2s("declares local transfers, but a loopback WRITE"))?;
        ensure(second == vec![0x77; 4096], || {
            "a loopback WRITE reported done but the memory differs".into()
        })
    } else {
        ensure(
            matches!(loopback, Err(ref e) if !matches!(e, Error::TimedOut { .. })),
            || format!("declares no local transfers, but a loopback WRITE gave {loopback:?}"),
        )?;
        ensure(second == vec![0x11; 4096], || {
            "declares no local transfers, but the loopback target changed".into()
        })
    }
}
