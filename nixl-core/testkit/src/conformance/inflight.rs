//! Stopping a transfer in flight: after `cancel` returns `Ok`, after the request is dropped,
//! or after its deadline ended it and it drained (`XferReq::is_draining`), the backend no
//! longer writes the destination. A canceled request reports `Canceled`, or `Done` when the
//! backend could not stop it and it completed before the cancel returned (every byte there). Where a
//! backend completes transfers inside `post` (nothing is ever in flight), the cases are not
//! applicable ("completes inside post"); INPROC with `Completion::Deferred` and the fault
//! injector's delays make them apply in one process.

use std::time::Duration;

use super::{e2s, ensure, pair, CaseResult, Outcome, Pair, Res, Suite, TIMEOUT};
use nixl_core::{Error, MemKind, Op, XferDescList, XferOp, XferOptions, XferReq, XferState};

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
    let opts = XferOptions::default()
        .no_merge(true)
        .timeout((how == Stop::Deadline).then(|| Duration::from_millis(1)));
    let req =
        p.a.create_xfer_req(
            XferOp::Write,
            &XferDescList::blocks(MemKind::Dram, p.src.addr(), BLOCK, BLOCKS),
            &XferDescList::blocks(MemKind::Dram, p.dst.addr(), BLOCK, BLOCKS),
            p.b.name(),
            opts,
        )
        .map_err(e2s("create"))?;
    if p.a.post_xfer_req(&req).map_err(e2s("post"))? == XferState::Done {
        return Ok(not_in_flight(len));
    }
    let early = match how {
        Stop::Cancel => stop_by_cancel(&p, &req, len)?,
        Stop::Drop => {
            drop(req);
            None
        }
        Stop::Deadline => stop_by_deadline(&p, &req, len)?,
    };
    if let Some(outcome) = early {
        return Ok(outcome);
    }
    destination_settled(&p, len, how)?;
    Ok(Outcome::Passed)
}

fn not_in_flight(len: usize) -> Outcome {
    Outcome::NotApplicable {
        capability: "completes inside post",
        reason: format!(
            "a {} MiB WRITE was complete before it could be stopped",
            len >> 20
        ),
    }
}

/// Cancels the request: it is then `Canceled`, or (a backend that cannot stop RMA waited for
/// it) `Done` with every byte there. A cancel the backend refuses leaves a request that can
/// never be posted again (the case passes there).
fn stop_by_cancel(p: &Pair, req: &XferReq, len: usize) -> Result<Option<Outcome>, String> {
    match req.cancel() {
        Ok(()) => match p.a.check_xfer_state(req) {
            Err(Error::Canceled { .. }) => Ok(None),
            Ok(XferState::Done) => {
                ensure(p.dst.to_vec()[..len].iter().all(|&b| b == 0xA7), || {
                    "a canceled request reports Done but its data did not all land".into()
                })?;
                Ok(None)
            }
            other => Err(format!(
                "a canceled request reports {other:?}, neither Canceled nor Done"
            )),
        },
        Err(e @ Error::Backend { op: Op::Cancel, .. }) => {
            // Refused: the backend could not confirm it stopped, so the agent keeps the
            // memory and the request can never be posted again.
            ensure(
                matches!(p.a.post_xfer_req(req), Err(Error::NotAllowed { .. })),
                || format!("cancel refused ({e}) but the request can be posted again"),
            )?;
            Ok(Some(Outcome::Passed))
        }
        Err(e) => Err(format!("cancel: {e}")),
    }
}

/// Waits for the 1 ms deadline to end the request (`TimedOut` at once), then for the request
/// to drain: the backend may still own the transfer (UCX cannot cancel RMA in flight) until it
/// confirms it stopped, by finishing or failing it.
fn stop_by_deadline(p: &Pair, req: &XferReq, len: usize) -> Result<Option<Outcome>, String> {
    let end = std::time::Instant::now() + TIMEOUT;
    loop {
        match p.a.check_xfer_state(req) {
            Ok(XferState::InProgress) => {
                ensure(std::time::Instant::now() < end, || {
                    "still in progress long past its 1 ms deadline".into()
                })?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(XferState::Done) => return Ok(Some(not_in_flight(len))),
            Err(Error::TimedOut { .. }) => break,
            Err(e) => return Err(format!("past its deadline: {e}")),
        }
    }
    while req.is_draining() {
        ensure(std::time::Instant::now() < end, || {
            "still draining long past its deadline".into()
        })?;
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure(
        matches!(p.a.check_xfer_state(req), Err(Error::TimedOut { .. })),
        || "a request ended by its deadline does not stay TimedOut".into(),
    )?;
    Ok(None)
}

/// Once the backend confirmed it stopped, the destination must not change: a control WRITE
/// on the same backend (its completion drives everything queued before it) must leave it as
/// it was.
fn destination_settled(p: &Pair, len: usize, how: Stop) -> Res {
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
    })
}
