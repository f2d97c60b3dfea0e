//! Metadata exchange between agents: the side channel (TCP, or a Unix socket whose other end
//! the kernel names), etcd, a c10d TCPStore, NIXL's own wire format, and whether a same-host
//! peer still runs.

pub(crate) mod accept;
#[cfg(feature = "etcd")]
pub mod etcd;
pub(crate) mod liveness;
pub mod nixl_wire;
pub(crate) mod published;
pub mod sidechannel;
pub mod tcpstore;
