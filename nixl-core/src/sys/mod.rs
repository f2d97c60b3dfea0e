//! The only place in nixl-core that touches memory through raw pointers (the crate denies
//! `unsafe_code` elsewhere, with the exceptions its root lists): host allocations, bounded
//! copies over a [`host::Span`], and the hash of registered ranges by address.

pub(crate) mod host;
