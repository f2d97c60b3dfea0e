//! Stopping a transfer in flight: after `cancel` returns `Ok`, after the request is dropped,
//! or after its deadline ended it and it drained (`XferReq::is_draining`), the backend no
//! longer writes the destination. A canceled request reports `Canceled`, or `Done` when the
//! backend could not stop it and it completed before the cancel returned (every byte there). Where a
//! backend completes transfers inside `post` (nothing is ever in flight), the cases are not
//! applicable ("completes inside post"); INPROC with `Completion::Deferred` and the fault
//! injector's delays make them apply in one process.

use std::time::Duration;

use super::{e2s, ensure, pair, CaseResult, Outcome, Suite, TIMEOUT};
use crate::{Error, MemKind, Op, XferDescList, XferOp, XferOptions, XferState};

/// How the request is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    Cancel,
    Drop,
    Deadline,
}

const BLOCK: u64 = 8 << 20;
const BLOCKS: usize = 4;
const CONTROL: usize = 4096;

pub(super) fn stop_in_flight(s: &Suite, how: Stop) -> CaseResult {
    let len = BLOCK as usize * BLOCKS;
    let p = pair(s, len + CONTROL)?;
    p.src.fill(0xA7);
    p.dst.fill(0x3C);
    let opts = XferOptions {
        no_merge: true,
        timeout: (how == Stop::Deadline).then(|| Duration::from_millis(1)),
        ..XferOptions::default()
    };
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), BLOCK, BLOCKS),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), BLOCK, BLOCKS),
            p.b.name(),
            opts,
        )
        .map_err(e2s("create"))?;
    let not_in_flight = || {
        Ok(Outcome::NotApplicable {
            capability: "completes inside post",
            reason: format!(
                "a {} MiB WRITE was complete before it could be stopped",
                len >> 20
            ),
        })
    };
    if p.a.post_xfer_req(&req).map_err(e2s("post"))? == XferState::Done {
        return not_in_flight();
    }
    match how {
        Stop::Cancel => match req.cancel() {
            // Canceled, or (a backend that cannot stop RMA waited for it) delivered: Done, and
            // then every byte is there.
            Ok(()) => match p.a.check_xfer_state(&req) {
                Err(Error::Canceled { .. }) => {}
                Ok(XferState::Done) => {
                    ensure(p.dst.to_vec()[..len].iter().all(|&b| b == 0xA7), || {
                        "a canceled request reports Done but its data did not all land".into()
                    })?
                }
                other => {
                    return Err(format!(
                        "a canceled request reports {other:?}, neither Canceled nor Done"
                    ))
                }
            },
            Err(e @ Error::Backend { op: Op::Cancel, .. }) => {
                // Refused: the backend could not confirm it stopped, so the agent keeps the
                // memory and the request can never be posted again.
                ensure(
                    matches!(p.a.post_xfer_req(&req), Err(Error::NotAllowed { .. })),
                    || format!("cancel refused ({e}) but the request can be posted again"),
                )?;
                return Ok(Outcome::Passed);
            }
            Err(e) => return Err(format!("cancel: {e}")),
        },
        Stop::Drop => drop(req),
        Stop::Deadline => {
            let end = std::time::Instant::now() + TIMEOUT;
            loop {
                match p.a.check_xfer_state(&req) {
                    Ok(XferState::InProgress) => {
                        ensure(std::time::Instant::now() < end, || {
                            "still in progress long past its 1 ms deadline".into()
                        })?;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Ok(XferState::Done) => return not_in_flight(),
                    Err(Error::TimedOut { .. }) => break,
                    Err(e) => return Err(format!("past its deadline: {e}")),
                }
            }
            // The deadline ends the request at once; the backend may still own the transfer
            // (UCX cannot cancel RMA in flight) and the request drains until the backend
            // confirms it stopped, by finishing or failing it.
            while req.is_draining() {
                ensure(std::time::Instant::now() < end, || {
                    "still draining long past its deadline".into()
                })?;
                std::thread::sleep(Duration::from_millis(1));
            }
            ensure(
                matches!(p.a.check_xfer_state(&req), Err(Error::TimedOut { .. })),
                || "a request ended by its deadline does not stay TimedOut".into(),
            )?;
        }
    }
    // From here on (once the backend confirmed it stopped) the destination must not change: a
    // control WRITE on the same backend (its completion drives everything queued before it)
    // must leave it as it was.
    let snapshot = p.dst.to_vec();
    let control =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr() + len as u64, CONTROL as u64, 1),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr() + len as u64, CONTROL as u64, 1),
            p.b.name(),
            XferOptions::default(),
        )
        .map_err(e2s("create control"))?;
    p.a.post_xfer_req(&control).map_err(e2s("post control"))?;
    control.wait(TIMEOUT).map_err(e2s("wait control"))?;
    let after = p.dst.to_vec();
    ensure(after[len..] == vec![0xA7; CONTROL][..], || {
        "the control WRITE did not land".into()
    })?;
    ensure(after[..len] == snapshot[..len], || {
        format!("the destination changed after the request was stopped ({how:?})")
    })?;
    Ok(Outcome::Passed)
}
