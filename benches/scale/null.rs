//! `NULL`: a measuring device, not a transport. It registers any DRAM, loads any peer, and
//! "moves" nothing: a prepared transfer keeps its segments' addresses (so the backend does the
//! per-segment work every backend must do once) and completes at once. Through it the bench
//! measures nixl-core's own cost per descriptor, without a copy or a network in the numbers.
//! It lives in the bench only; no library code can create it.

use std::sync::Arc;

use nixl::core::backend::{
    Backend, BackendContext, BackendMd, BackendParams, BackendXfer, BlockXferSpec, Capabilities,
    XferSpec,
};
use nixl::core::{MemKind, RegionDesc, Result, XferState};

/// Creates the null backend.
#[derive(Debug, Default)]
pub(crate) struct NullParams;

impl BackendParams for NullParams {
    fn backend_name(&self) -> &str {
        "NULL"
    }

    fn create(self: Box<Self>, _ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(Null))
    }
}

struct Null;

struct NullXfer {
    /// (local, remote, len) of every segment, as a real backend would keep them.
    segs: Vec<(u64, u64, u64)>,
    /// Layers x block runs of a block-table transfer (nothing per block).
    blocks: usize,
}

impl BackendXfer for NullXfer {
    fn post(&mut self) -> Result<XferState> {
        std::hint::black_box((&self.segs, self.blocks));
        Ok(XferState::Done)
    }

    fn check(&mut self) -> Result<XferState> {
        Ok(XferState::Done)
    }

    fn cancel(&mut self) -> Result<()> {
        Ok(())
    }

    fn path(&self) -> Option<String> {
        Some("null (moves nothing)".into())
    }

    fn set_notif(&mut self, _msg: Option<&[u8]>) -> Result<()> {
        Ok(())
    }
}

impl Backend for Null {
    fn name(&self) -> &str {
        "NULL"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .mem_kinds(vec![MemKind::Dram])
            .remote(true)
            .local(true)
            .notifications(true)
            .needs_progress(false)
    }

    fn register(&self, _region: &RegionDesc) -> Result<BackendMd> {
        Ok(Arc::new(()))
    }

    fn deregister(&self, _md: BackendMd) -> Result<()> {
        Ok(())
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let segs = spec
            .segments
            .iter()
            .map(|s| (s.local_addr, s.remote_addr, s.len))
            .collect();
        Ok(Box::new(NullXfer { segs, blocks: 0 }))
    }

    fn prepare_blocks(&self, spec: &BlockXferSpec) -> Result<Option<Box<dyn BackendXfer>>> {
        Ok(Some(Box::new(NullXfer {
            segs: Vec::new(),
            blocks: spec.layers.len() * spec.runs.len(),
        })))
    }

    fn peers(&self) -> Option<&dyn nixl_core::backend::PeerBackend> {
        Some(self)
    }
}

impl nixl_core::backend::PeerBackend for Null {
    fn connection_info(&self) -> Result<Vec<u8>> {
        Ok(b"null".to_vec())
    }

    fn connect(&self, _remote: &str, _info: &[u8]) -> Result<()> {
        Ok(())
    }

    fn disconnect(&self, _remote: &str) -> Result<()> {
        Ok(())
    }

    fn public_metadata(&self, _md: &BackendMd) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    fn load_remote(
        &self,
        _remote: &str,
        _region: &RegionDesc,
        _public: &[u8],
    ) -> Result<BackendMd> {
        Ok(Arc::new(()))
    }

    fn gen_notif(&self, _remote: &str, _msg: &[u8]) -> Result<()> {
        Ok(())
    }
}
