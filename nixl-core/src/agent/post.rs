//! The agent's request calls: create, post, check, query and estimate a transfer request.

use crate::agent::options::XferOptions;
use crate::agent::request::{XferReq, XferTarget};
use crate::agent::{Agent, BackendHandle};
use crate::backend::{CostEstimate, XferState};
use crate::desc::{XferDescList, XferOp};
use crate::error::{Error, Op, Result};

impl Agent {
    /// One-shot form: prepares both lists and builds a request over all their descriptors
    /// (NIXL's `createXferReq`).
    #[doc(alias = "createXferReq")]
    pub fn create_xfer_req(
        &self,
        op: XferOp,
        local: &XferDescList,
        remote: &XferDescList,
        remote_agent: &str,
        opts: XferOptions,
    ) -> Result<XferReq> {
        if local.len() != remote.len() {
            return Err(Error::mismatch(
                self.name(),
                Op::MakeXfer,
                format!(
                    "{} local and {} remote descriptors",
                    local.len(),
                    remote.len()
                ),
            ));
        }
        // The destination's bytes are written once: two descriptors on the same bytes would
        // race (a block id listed twice in a table lands two blocks' tokens in one).
        let dst = match op {
            XferOp::Read => local,
            XferOp::Write => remote,
        };
        if let Some((a, b)) = first_overlap(dst.descs()) {
            return Err(Error::invalid(
                self.name(),
                Op::MakeXfer,
                format!(
                    "destination descriptors {a} and {b} cover the same bytes: a request writes \
                     each destination byte once"
                ),
            ));
        }
        let l = self.prep_xfer_dlist(XferTarget::Initiator, local, &opts.backends)?;
        let r = self.prep_xfer_dlist(XferTarget::Agent(remote_agent), remote, &opts.backends)?;
        let idx: Vec<usize> = (0..local.len()).collect();
        self.make_prepped_xfer(op, &l, &idx, &r, &idx, opts)
    }

    /// Posts a request (NIXL's `postXferReq`): the one way to start (and restart, once done)
    /// a request. Returns `Done` when the backend completed it inside the call.
    #[doc(alias = "postXferReq")]
    pub fn post_xfer_req(&self, req: &XferReq) -> Result<XferState> {
        self.check_owner(req, Op::PostXfer)?;
        req.post()
    }

    /// Polls a request (NIXL's `getXferStatus`).
    #[doc(alias = "getXferStatus")]
    pub fn check_xfer_state(&self, req: &XferReq) -> Result<XferState> {
        self.check_owner(req, Op::CheckXfer)?;
        req.check()
    }

    /// The backend a request uses (NIXL's `queryXferBackend`).
    #[doc(alias = "queryXferBackend")]
    pub fn query_xfer_backend(&self, req: &XferReq) -> BackendHandle {
        req.backend()
    }

    /// The backend's estimate of a request's cost, where it can make one.
    #[doc(alias = "estimateXferCost")]
    pub fn estimate_xfer_cost(&self, req: &XferReq) -> Result<Option<CostEstimate>> {
        self.check_owner(req, Op::EstimateCost)?;
        req.estimate_cost()
    }

    fn check_owner(&self, req: &XferReq, op: Op) -> Result<()> {
        if req.belongs_to(&self.shared) {
            Ok(())
        } else {
            Err(Error::mismatch(
                self.name(),
                op,
                "request belongs to another agent",
            ))
        }
    }
}

/// The indexes of two descriptors that share a byte (same device), if any: O(n log n).
pub(crate) fn first_overlap(descs: &[crate::Desc]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..descs.len()).filter(|&i| descs[i].len > 0).collect();
    order.sort_unstable_by_key(|&i| (descs[i].dev_id, descs[i].addr));
    order.windows(2).find_map(|w| {
        let (a, b) = (&descs[w[0]], &descs[w[1]]);
        (a.dev_id == b.dev_id && a.addr.saturating_add(a.len) > b.addr).then_some((w[0], w[1]))
    })
}
