//! Introducing this agent on a new connection: a hello over every endpoint to a peer, before
//! any notification (UCX keeps the order of active messages on an endpoint), and the
//! notification header of that endpoint's session. The receiver attributes notifications by
//! session and connection (`nixl_core::backend::hello`), never by a name in the message.

use std::sync::Arc;

use nixl_core::backend::PeerAuth;
use nixl_core::{Error, Op, Result};

use crate::endpoint::Peer;
use crate::loader::Ucx;
use crate::sys;

/// The active-message id of hellos.
pub(crate) const AM_HELLO: u32 = 0x4e59;

/// Flags of every message whose sender the receiver must know: eager (no rendezvous) and
/// with the reply endpoint, which tells the receiver which connection it came on.
pub(crate) const AM_FLAGS: u32 = sys::UCP_AM_SEND_FLAG_EAGER | sys::UCP_AM_SEND_FLAG_REPLY;

/// The send flags of a message with AM id `am_id`: ours carry the reply endpoint; NIXL's
/// (`crate::nixl::AM_NIXL`) are plain eager messages, as a stock NIXL agent sends them.
pub(crate) fn am_flags(am_id: u32) -> u32 {
    if am_id == crate::nixl::AM_NIXL {
        sys::UCP_AM_SEND_FLAG_EAGER
    } else {
        AM_FLAGS
    }
}

/// A hello in flight: its bytes stay alive until UCX is done with them.
struct InFlight {
    ucx: Arc<Ucx>,
    hello: Vec<u8>,
    /// The payload: the sending worker's index (little-endian), which tells the receiver
    /// that a later hello from the same worker replaced this connection (`crate::links`).
    index: [u8; 4],
}

impl sys::Completion for InFlight {
    fn lib(&self) -> &sys::UcxLib {
        &self.ucx.lib
    }

    fn sent(self: Arc<Self>, status: sys::ucs_status_t, _locked: &sys::Locked<'_>) {
        if status != sys::UCS_OK {
            tracing::debug!(status = %self.ucx.status_string(status), "a UCX hello was not delivered");
        }
    }
}

impl sys::AmPayload for InFlight {
    fn am_payload(&self) -> (u32, u32, &[u8], &[u8]) {
        (AM_HELLO, AM_FLAGS, &self.hello, &self.index)
    }
}

/// Sends a hello on each endpoint of `peer` (without waiting: UCX sends it once the
/// endpoint is wired up, ahead of anything sent later) and fills `peer.headers`.
pub(crate) fn introduce(ucx: &Arc<Ucx>, peers: &PeerAuth, peer: &mut Peer) -> Result<()> {
    let me = peers.agent().to_owned();
    let mut headers = Vec::with_capacity(peer.eps.len());
    for pe in &peer.eps {
        let session = peers.new_session()?;
        let hello = peers.hello(&peer.name, &session)?;
        let mut g = pe.worker.lock();
        // On the endpoint notifications use (the same-host shared-memory one where there is
        // one): the receiver ties the session to the connection the hello came on.
        let ep = pe.notif_raw(&g).ok_or_else(|| {
            Error::disconnected(&me, &peer.name, Op::LoadMetadata, "UCX endpoint was closed")
        })?;
        let index = u32::try_from(pe.worker.index).unwrap_or(u32::MAX);
        let f = Arc::new(InFlight {
            ucx: ucx.clone(),
            hello,
            index: index.to_le_bytes(),
        });
        // The endpoint is live under the held worker lock; the hello bytes live in `f` until
        // the callback (or the immediate completion) releases it.
        let r = sys::am_send(&g.h().locked(), ep, &f);
        drop(g);
        if let Some(st) = r {
            // Done (or failed) at once: the callback will not run.
            if st != sys::UCS_OK {
                return Err(crate::error::status_error(
                    ucx,
                    &me,
                    Some(&peer.name),
                    Op::LoadMetadata,
                    "ucp_am_send_nbx (hello)",
                    st,
                ));
            }
        }
        headers.push(Arc::from(crate::wire::encode_notif_header(&session)));
    }
    peer.headers = headers;
    Ok(())
}
