//! Control messages posted without waiting ([`nixl_core::backend::PeerBackend::post_notif`]):
//! an active message handed to UCX with a completion callback that owns its bytes, so the
//! caller returns at once. A peer that does not take them gets at most [`MAX_POSTED`] in
//! flight; past that, posting to it is refused, and nobody else waits.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::endpoint::EpShared;
use crate::loader::Ucx;
use crate::sys;

/// Control messages in flight to one endpoint at most.
pub(crate) const MAX_POSTED: usize = 64;

/// One posted control message: its bytes live here until UCX completes the send.
pub(crate) struct Posted {
    pub(crate) ucx: Arc<Ucx>,
    pub(crate) shared: Arc<EpShared>,
    pub(crate) id: u32,
    pub(crate) header: Arc<[u8]>,
    pub(crate) msg: Arc<[u8]>,
}

impl Posted {
    /// The send ended (sent or failed): the endpoint has one fewer in flight.
    pub(crate) fn ended(&self) {
        self.shared.end_op();
        let _ = self
            .shared
            .posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

impl sys::Completion for Posted {
    fn lib(&self) -> &sys::UcxLib {
        &self.ucx.lib
    }

    fn sent(self: Arc<Self>, status: sys::ucs_status_t, _locked: &sys::Locked<'_>) {
        if status != sys::UCS_OK {
            tracing::debug!(status, "a posted control message was not sent");
        }
        self.ended();
    }
}

impl sys::AmPayload for Posted {
    fn am_payload(&self) -> (u32, u32, &[u8], &[u8]) {
        (
            self.id,
            crate::session::am_flags(self.id),
            &self.header,
            &self.msg,
        )
    }
}
