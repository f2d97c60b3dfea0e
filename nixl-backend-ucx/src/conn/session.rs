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
use crate::worker::AmCtx;

/// The active-message id of hellos.
pub(crate) const AM_HELLO: u32 = 0x4e59;

/// The active-message id of notifications.
pub(crate) const AM_NOTIF: u32 = 0x4e58;

/// NIXL's notification active-message id.
pub(crate) const AM_NIXL: u32 = nixl_core::nixl_wire::notif::AM_ID;

/// Flags of every message whose sender the receiver must know: eager (no rendezvous) and
/// with the reply endpoint, which tells the receiver which connection it came on.
pub(crate) const AM_FLAGS: u32 = sys::UCP_AM_SEND_FLAG_EAGER | sys::UCP_AM_SEND_FLAG_REPLY;

/// The send flags of a message with AM id `am_id`: ours carry the reply endpoint; NIXL's
/// ([`AM_NIXL`]) are plain eager messages, as a stock NIXL agent sends them.
pub(crate) fn am_flags(am_id: u32) -> u32 {
    if am_id == AM_NIXL {
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

/// The header and (eager) payload of an active message, or why it is dropped.
fn am_parts<'a>(msg: &sys::AmMsg<'a>) -> std::result::Result<(&'a [u8], &'a [u8]), &'static str> {
    if msg.rndv {
        return Err("a rendezvous message (senders use eager)");
    }
    match (msg.header, msg.data) {
        (Some(h), Some(d)) => Ok((h, d)),
        _ => Err("a malformed message"),
    }
}

/// Notifications (id [`AM_NOTIF`]): queued under the sender whose hello opened the connection.
pub(crate) fn on_notif(am: &AmCtx, m: &sys::AmMsg<'_>) {
    let (h, msg) = match am_parts(m) {
        Ok(p) => p,
        Err(why) => {
            tracing::warn!(agent = %am.agent, why, "dropping a notification");
            return;
        }
    };
    let session = match crate::wire::decode_notif_header(h) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(agent = %am.agent, error = %e, "dropping a notification with a malformed header");
            return;
        }
    };
    // The sender is the peer whose hello opened this connection, never a name in the
    // message.
    match m
        .reply_ep
        .and_then(|ep| am.peers.attribute(&am.sessions, &session, ep))
    {
        Some(sender) => {
            am.notifs.push(&sender, msg.to_vec());
        }
        None => {
            tracing::warn!(agent = %am.agent, "dropping a notification from a connection without an accepted hello");
        }
    }
}

/// Hellos (id [`AM_HELLO`]): a checked hello binds its sender to the connection.
pub(crate) fn on_hello(am: &AmCtx, m: &sys::AmMsg<'_>) {
    let Ok((h, d)) = am_parts(m) else {
        tracing::warn!(agent = %am.agent, "dropping a malformed hello");
        return;
    };
    let Some(ep) = m.reply_ep else {
        tracing::warn!(agent = %am.agent, "dropping a hello without its connection");
        return;
    };
    match am.peers.check_hello(h) {
        Ok(hello) => {
            tracing::debug!(agent = %am.agent, remote = %hello.sender, authenticated = hello.authenticated, "UCX connection introduced");
            if let Err(why) = am.sessions.accept(&hello, ep) {
                tracing::warn!(agent = %am.agent, remote = %hello.sender, why, "refused a UCX hello");
                return;
            }
            // The payload names the sender's worker (`crate::session::introduce`).
            let index = <[u8; 4]>::try_from(d).ok().map(u32::from_le_bytes);
            if let Some(old) = am.links.introduced(&hello.sender, index, ep) {
                tracing::debug!(agent = %am.agent, remote = %hello.sender, old, "the peer replaced a UCX connection our endpoint shares; it fails until the peer is reloaded");
            }
        }
        Err(e) => {
            tracing::warn!(agent = %am.agent, error = %e, "refused a UCX connection's hello");
        }
    }
}
