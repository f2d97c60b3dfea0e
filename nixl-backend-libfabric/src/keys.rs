//! The memory keys this backend requests (providers without `FI_MR_PROV_KEY`, such as tcp,
//! shm and sockets, use them as given): unpredictable, so a peer cannot reach a registration
//! whose key it was not given by guessing it — the notification buffers (which tcp;ofi_rxm
//! leaves remotely readable whatever access they are registered with, for its rendezvous
//! protocol), or regions published to other peers only. Sequential keys (1, 2, 3, ...) let the
//! `unpack_key` fuzz target read a target's notification buffers with a key one bit away from
//! its region's.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of requested keys: SipHash, keyed from the OS's random source (`RandomState`), of
/// a counter.
#[derive(Debug, Default)]
pub(crate) struct KeySource {
    hasher: RandomState,
    counter: AtomicU64,
}

impl KeySource {
    /// The next key, fitting `key_size` bytes (the provider's `mr_key_size`; 0 or more than 8:
    /// a full 64-bit key), never 0.
    pub(crate) fn next(&self, key_size: usize) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut h = self.hasher.build_hasher();
        h.write_u64(n);
        let key = match key_size {
            1..=7 => h.finish() & ((1u64 << (8 * key_size)) - 1),
            _ => h.finish(),
        };
        key.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_unpredictable_and_fit() {
        let (a, b) = (KeySource::default(), KeySource::default());
        let ka: Vec<u64> = (0..1000).map(|_| a.next(8)).collect();
        let kb: Vec<u64> = (0..1000).map(|_| b.next(8)).collect();
        let mut all: Vec<u64> = ka.iter().chain(&kb).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 2000, "keys repeat");
        assert!(
            ka.iter().all(|&k| k > 1000),
            "small (guessable) keys: {ka:?}"
        );
        assert!((0..100).all(|_| a.next(2) <= 0xffff));
        assert!((0..100).all(|_| a.next(0) != 0));
    }
}
