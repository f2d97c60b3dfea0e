//! Introducing this agent on a new connection: a hello over every endpoint to a peer, before
//! any notification (UCX keeps the order of active messages on an endpoint), and the
//! notification header of that endpoint's session. The receiver attributes notifications by
//! session and connection (`nixl_core::hello`), never by a name in the message.

use std::ffi::c_void;
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
    _hello: Vec<u8>,
    /// The payload: the sending worker's index (little-endian), which tells the receiver
    /// that a later hello from the same worker replaced this connection (`crate::links`).
    _index: [u8; 4],
}

unsafe extern "C" fn hello_sent(req: *mut c_void, status: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: user is the InFlight leaked for this request in `introduce`; reclaimed once.
    let f = unsafe { Box::from_raw(user as *mut InFlight) };
    if status != sys::UCS_OK {
        tracing::debug!(status = %f.ucx.status_string(status), "a UCX hello was not delivered");
    }
    // SAFETY: req is this callback's request, freed once.
    unsafe { f.ucx.lib.ucp_request_free(req) };
}

/// Sends a hello on each endpoint of `peer` (without waiting: UCX sends it once the
/// endpoint is wired up, ahead of anything sent later) and fills `peer.headers`.
pub(crate) fn introduce(ucx: &Arc<Ucx>, peers: &PeerAuth, peer: &mut Peer) -> Result<()> {
    let me = peers.agent().to_owned();
    let mut headers = Vec::with_capacity(peer.eps.len());
    for pe in &peer.eps {
        let session = peers.new_session()?;
        let hello = peers.hello(&peer.name, &session)?;
        let g = pe.worker.lock();
        // On the endpoint notifications use (the same-host shared-memory one where there is
        // one): the receiver ties the session to the connection the hello came on.
        let ep = pe.notif_raw(&g).ok_or_else(|| {
            Error::disconnected(&me, &peer.name, Op::LoadMetadata, "UCX endpoint was closed")
        })?;
        let index = u32::try_from(pe.worker.index).unwrap_or(u32::MAX);
        let f = Box::new(InFlight {
            ucx: ucx.clone(),
            _hello: hello,
            _index: index.to_le_bytes(),
        });
        let (ptr, len) = (f._hello.as_ptr(), f._hello.len());
        let data = f._index.as_ptr();
        let user = Box::into_raw(f);
        // SAFETY: zeroed request params with a mask are the documented form.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = AM_FLAGS;
        p.cb.send = Some(hello_sent);
        p.user_data = user as *mut c_void;
        // SAFETY: the endpoint is live under the held worker lock; the hello and index bytes
        // live in the InFlight box until the callback (or the immediate completion below)
        // frees it.
        let r = unsafe {
            ucx.lib.ucp_am_send_nbx(
                ep,
                AM_HELLO,
                ptr as *const c_void,
                len,
                data as *const c_void,
                4,
                &p,
            )
        };
        drop(g);
        if !sys::ptr_is_ptr(r) {
            // Done (or failed) at once: the callback will not run.
            // SAFETY: reclaims the box leaked above, once.
            drop(unsafe { Box::from_raw(user) });
            let st = sys::ptr_status(r);
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
