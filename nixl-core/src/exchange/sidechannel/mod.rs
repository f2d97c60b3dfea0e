//! Metadata exchange over a TCP side channel.
//!
//! Each agent with `listen` on serves requests ([`frame`] has the bytes):
//!
//! | request | payload | reply |
//! |---|---|---|
//! | `Push` | metadata (sealed with authentication) | `Ack` or `Err` |
//! | `Fetch` | wanted agent name | `Metadata` or `Err` |
//! | `Invalidate` | name, generation, owner token | `Ack` or `Err` |
//!
//! With [`crate::AgentConfig::auth`] every request and reply carries an HMAC-SHA256 under the
//! cluster credential, a timestamp within [`crate::access::Auth::max_clock_skew`] and a nonce accepted
//! once; a reply repeats its request's nonce. Unauthenticated requests get an `Err` reply.
//! A listener on a non-loopback address refuses to start without a credential unless
//! [`crate::AgentConfig::allow_unauthenticated_listener`] is set.
//!
//! Every exchange has one deadline for the whole of it, on both sides: a client's `timeout`
//! covers connecting, sending and receiving; the server gives each connection
//! [`crate::ListenerLimits::request_timeout`] and serves connections concurrently, so a slow
//! or idle client delays nobody else (see [`crate::ListenerLimits`]).

pub mod frame;
mod listener;
pub(crate) mod local;

use frame::Kind;
use local::LocalPeer;

pub use frame::{parse_invalidate, read_frame};

pub(crate) use listener::start as start_listener;

/// A reply, verified when the client authenticates.
pub(crate) struct Reply {
    pub(crate) kind: Kind,
    pub(crate) payload: Vec<u8>,
    /// The server's process, when the kernel named it (the same-host Unix side channel).
    pub(crate) server: Option<LocalPeer>,
}
