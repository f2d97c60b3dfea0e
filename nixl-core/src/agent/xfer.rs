//! The agent's request calls: create, post, check, query and estimate a transfer request.

use crate::agent::{Agent, BackendHandle};
use crate::backend::{CostEstimate, XferState};
use crate::desc::{XferDescList, XferOp};
use crate::error::{Error, Op, Result};
use crate::xfer::{XferOptions, XferReq, XferTarget};

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
