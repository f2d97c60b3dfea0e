//! Connections to peers: the UCP workers and their active-message routes (`worker`), the
//! endpoints made from a peer's worker addresses (`endpoint`), which endpoint a peer's
//! connection shares and when it was replaced (`links`), and the hello that opens a session on
//! each (`session`).

pub(crate) mod endpoint;
pub(crate) mod links;
pub(crate) mod session;
pub(crate) mod worker;
