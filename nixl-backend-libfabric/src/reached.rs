//! How often peers' bytes reached a native call: `fi_av_insert` with a peer's endpoint name,
//! and `fi_write` / `fi_read` with a peer's key and remote address. Counted only with the
//! `fuzzing` feature (the counts are what the fuzz targets report: how many inputs got past
//! the structural checks); without it these are empty functions.

#[cfg(feature = "fuzzing")]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "fuzzing")]
static AV_INSERTS: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "fuzzing")]
static RMA_POSTS: AtomicU64 = AtomicU64::new(0);

/// Called right before `fi_av_insert` of a peer's (or this agent's own) endpoint name.
#[inline]
pub(crate) fn av_insert() {
    #[cfg(feature = "fuzzing")]
    AV_INSERTS.fetch_add(1, Ordering::Relaxed);
}

/// Called right before an RMA operation (`fi_write` / `fi_read`) is handed to the provider.
#[inline]
pub(crate) fn rma_post() {
    #[cfg(feature = "fuzzing")]
    RMA_POSTS.fetch_add(1, Ordering::Relaxed);
}

/// `fi_av_insert` calls of this process so far.
#[cfg(feature = "fuzzing")]
pub fn av_inserts() -> u64 {
    AV_INSERTS.load(Ordering::Relaxed)
}

/// RMA operations (`fi_write` / `fi_read`) handed to the provider by this process so far.
#[cfg(feature = "fuzzing")]
pub fn rma_posts() -> u64 {
    RMA_POSTS.load(Ordering::Relaxed)
}

#[cfg(feature = "fuzzing")]
thread_local! {
    static DRIVES_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Called right before the provider is driven on the calling thread: a completion queue read
/// (attempted: counted whether or not its lock was free) or an RMA operation handed to it.
#[inline]
pub(crate) fn drive() {
    #[cfg(feature = "fuzzing")]
    DRIVES_HERE.with(|c| c.set(c.get() + 1));
}

/// Completion-queue reads (attempted) and RMA posts made by the calling thread so far.
#[cfg(feature = "fuzzing")]
pub fn drives_here() -> u64 {
    DRIVES_HERE.with(std::cell::Cell::get)
}
