//! Operation counts for the scale tests: the per-descriptor, per-region and per-candidate
//! steps of preparing, building, posting and releasing requests, and of registration, call
//! [`tick`]. In test builds it adds to a per-thread count (so the scale test can fail when the
//! work grows faster than the descriptors); in every other build it compiles to nothing.

#[cfg(test)]
thread_local! {
    static OPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `n` steps (test builds only).
#[inline(always)]
pub(crate) fn tick(n: usize) {
    #[cfg(test)]
    OPS.with(|c| c.set(c.get() + n as u64));
    #[cfg(not(test))]
    let _ = n;
}

/// Returns this thread's count and resets it.
#[cfg(test)]
pub(crate) fn take() -> u64 {
    OPS.with(|c| c.replace(0))
}
