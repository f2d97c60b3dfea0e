//! The backends every agent has: INPROC (copies inside one process, with deferred completion
//! for tests of data in flight) and the deterministic fault injector that wraps any backend.

pub(crate) mod deferred;
pub(crate) mod fault;
pub(crate) mod inproc;
