//! Connections to peers: the UCP workers and their active-message routes (`worker`), the
//! endpoints made from a peer's worker addresses (`endpoint`), which endpoint a peer's
//! connection shares and when it was replaced (`links`), the hello that opens a session on
//! each (`session`), and this process's own workers, which no peer's address may name
//! (`own`).

pub(crate) mod endpoint;
pub(crate) mod links;
pub(crate) mod own;
pub(crate) mod session;
pub(crate) mod worker;
