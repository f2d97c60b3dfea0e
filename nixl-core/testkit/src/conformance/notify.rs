//! Notification cases: after the data, per post, standalone order.

use std::time::Duration;

use super::{e2s, ensure, pair, Res, Suite, TIMEOUT};
use nixl_core::{Error, MemKind, XferDescList, XferOp, XferOptions};

pub(super) fn notification_follows_data(s: &Suite) -> Res {
    let len = 1 << 20;
    let p = pair(s, len)?;
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
pub(super) fn notification_changes_per_post(s: &Suite) -> Res {
    let len = 64 << 10;
    let p = pair(s, len)?;
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

pub(super) fn standalone_notifications_keep_order(s: &Suite) -> Res {
    let p = pair(s, 4096)?;
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
