//! io_uring: registering a request's buffers and pushing submission entries. Crate invariant
//! (see `super`): the buffers named stay alive until the ring holds no entry using them.

use io_uring::{squeue, IoUring};

/// Registers `spans` (host ranges `[start, end)`) as the ring's fixed buffers.
pub(crate) fn register_buffers(ring: &IoUring, spans: &[(u64, u64)]) -> std::io::Result<()> {
    let iovecs: Vec<libc::iovec> = spans
        .iter()
        .map(|&(s, e)| libc::iovec {
            iov_base: s as *mut libc::c_void,
            iov_len: (e - s) as usize,
        })
        .collect();
    // SAFETY: each iovec spans memory inside the DRAM registrations of the request's chunks;
    // the kernel pins those pages until the ring is dropped, so no I/O ever touches unpinned
    // memory, and (crate invariant) the request keeps the registrations alive as long as the
    // ring.
    unsafe { ring.submitter().register_buffers(&iovecs) }
}

/// Pushes one entry to the submission queue; false when the queue is full.
pub(crate) fn push(ring: &mut IoUring, entry: &squeue::Entry) -> bool {
    // SAFETY: the entry names a buffer inside a DRAM registration and a descriptor owned by the
    // request's plan; (crate invariant) the request holds both until the entry completes
    // (cancel and drop drain the ring, or leak it and the agent leaks the memory).
    unsafe { ring.submission().push(entry).is_ok() }
}

/// A request's ring: dropped with the request, or leaked ([`Ring::leak`]) when the kernel may
/// still use the request's buffers.
pub(crate) struct Ring {
    ring: std::mem::ManuallyDrop<IoUring>,
    leak: bool,
}

impl Ring {
    /// Owns `ring`.
    pub(crate) fn new(ring: IoUring) -> Self {
        Ring {
            ring: std::mem::ManuallyDrop::new(ring),
            leak: false,
        }
    }

    /// Never closes the ring (the kernel keeps its pinned buffers and in-flight entries).
    pub(crate) fn leak(&mut self) {
        self.leak = true;
    }
}

impl std::ops::Deref for Ring {
    type Target = IoUring;
    fn deref(&self) -> &IoUring {
        &self.ring
    }
}

impl std::ops::DerefMut for Ring {
    fn deref_mut(&mut self) -> &mut IoUring {
        &mut self.ring
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if !self.leak {
            // SAFETY: dropped exactly once, here; the owner called `leak` if any entry was still
            // in flight.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.ring) };
        }
    }
}
