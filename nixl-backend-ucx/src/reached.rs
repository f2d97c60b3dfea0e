//! How often peers' bytes reached a native call: `ucp_ep_create` with a peer's worker
//! address, `ucp_ep_rkey_unpack` with its packed key, and `ucp_put_nbx` / `ucp_get_nbx` with
//! the unpacked key; and how often a thread drove a worker (`ucp_worker_progress`), which the
//! tests use to show that an async poll never does. Counted only with the `fuzzing` feature (the counts are what the fuzz
//! targets report: how many inputs got past the structural checks); without it these are
//! empty functions.

#[cfg(feature = "fuzzing")]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "fuzzing")]
static EP_CREATES: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "fuzzing")]
static RKEY_UNPACKS: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "fuzzing")]
static RMA_POSTS: AtomicU64 = AtomicU64::new(0);

/// Called right before `ucp_ep_create`.
#[inline]
pub(crate) fn ep_create() {
    #[cfg(feature = "fuzzing")]
    EP_CREATES.fetch_add(1, Ordering::Relaxed);
}

/// Called right before `ucp_ep_rkey_unpack`.
#[inline]
pub(crate) fn rkey_unpack() {
    #[cfg(feature = "fuzzing")]
    RKEY_UNPACKS.fetch_add(1, Ordering::Relaxed);
}

/// Called right before `ucp_put_nbx` / `ucp_get_nbx`.
#[inline]
pub(crate) fn rma_post() {
    #[cfg(feature = "fuzzing")]
    RMA_POSTS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(feature = "fuzzing")]
thread_local! {
    static PROGRESS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Called right before `ucp_worker_progress`.
#[inline]
pub(crate) fn progress() {
    #[cfg(feature = "fuzzing")]
    PROGRESS_HERE.with(|c| c.set(c.get() + 1));
}

#[cfg(feature = "fuzzing")]
thread_local! {
    static MD_CHECKS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Called for each region metadata a request (or a prepared list's derivation) checks and
/// takes a handle from.
#[inline]
pub(crate) fn md_check() {
    #[cfg(feature = "fuzzing")]
    MD_CHECKS_HERE.with(|c| c.set(c.get() + 1));
}

/// Region metadata checked by the calling thread so far (see `md_check`): what the tests use
/// to show that requests over prepared lists check each region once, not once per request.
#[cfg(feature = "fuzzing")]
pub fn md_checks_here() -> u64 {
    MD_CHECKS_HERE.with(std::cell::Cell::get)
}

/// `ucp_worker_progress` calls made by the calling thread so far.
#[cfg(feature = "fuzzing")]
pub fn progress_calls_here() -> u64 {
    PROGRESS_HERE.with(std::cell::Cell::get)
}

/// `ucp_ep_create` calls of this process so far.
#[cfg(feature = "fuzzing")]
pub fn ep_creates() -> u64 {
    EP_CREATES.load(Ordering::Relaxed)
}

/// `ucp_ep_rkey_unpack` calls of this process so far.
#[cfg(feature = "fuzzing")]
pub fn rkey_unpacks() -> u64 {
    RKEY_UNPACKS.load(Ordering::Relaxed)
}

/// Puts and gets handed to UCX by this process so far.
#[cfg(feature = "fuzzing")]
pub fn rma_posts() -> u64 {
    RMA_POSTS.load(Ordering::Relaxed)
}
