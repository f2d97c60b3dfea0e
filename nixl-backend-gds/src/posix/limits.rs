//! The largest direct I/O a file's block device takes as one request.
//!
//! A direct I/O larger than the device's limits is split by the block layer; under io_uring's
//! non-blocking first attempt (`REQ_NOWAIT`) a bio that needs splitting can fail with `EAGAIN`
//! and the request is re-issued from an io-wq worker thread, which costs a second submission
//! and a thread hop per chunk. Two limits matter:
//! - `max_sectors_kb`: the largest request. Buffers registered with the ring reach the block
//!   layer as whole (often physically contiguous, e.g. huge) pages, so for them this is the
//!   binding limit.
//! - `max_segments x page size`: for buffers pinned page by page at each I/O (no registration,
//!   or the thread pool's `pread`/`pwrite`), every 4 KiB page is a segment.
//!
//! Measured on the dev VM's virtio disk (max_sectors_kb 4096, max_segments 254) with the
//! lockstep driver (docs/perf/storage.md): unregistered 1 MiB chunks (four pages over the
//! segment limit) ran at 0.60x NIXL on 1 MiB x32; with registered buffers, 4 MiB chunks beat
//! 1016 KiB ones on every O_DIRECT point.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::sys::fd::{fstat, page_size};

/// Chunks are never made smaller than this, whatever the device says.
const FLOOR: u64 = 128 << 10;

/// Direct-I/O chunk sizes for one file (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirectLimits {
    /// For buffers registered with the ring: the device's largest request.
    pub registered: u64,
    /// For buffers pinned per I/O: also at most `max_segments` pages.
    pub paged: u64,
}

/// The chunk sizes for direct I/O on `fd`, each rounded down to `align`, at least [`FLOOR`],
/// at most `cap`; `None` when the limits cannot be read (not a block-device-backed file, no
/// sysfs), and the caller uses its default.
pub(crate) fn direct_limits(fd: RawFd, align: u64, cap: u64) -> Option<DirectLimits> {
    let (max_bytes, max_segments) = device_limits(fd)?;
    let paged = match max_segments {
        Some(segs) => max_bytes.min(segs.saturating_mul(page_size())),
        None => max_bytes,
    };
    let align = align.max(1);
    let fit = |v: u64| {
        (v / align * align)
            .max(FLOOR.div_ceil(align) * align)
            .min(cap)
    };
    Some(DirectLimits {
        registered: fit(max_bytes),
        paged: fit(paged),
    })
}

/// `(max_sectors_kb in bytes, max_segments)` of the block device holding `fd` (the device
/// itself for a block device, the filesystem's device for a regular file).
fn device_limits(fd: RawFd) -> Option<(u64, Option<u64>)> {
    let st = fstat(fd).ok()?;
    let dev = if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
        st.st_rdev
    } else {
        st.st_dev
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let queue = queue_dir(&PathBuf::from(format!("/sys/dev/block/{major}:{minor}")))?;
    let kb = read_u64(&queue.join("max_sectors_kb"))?;
    Some((
        kb.checked_mul(1024)?,
        read_u64(&queue.join("max_segments")).filter(|&s| s > 0),
    ))
}

/// The `queue` directory of a disk, or of the disk a partition belongs to.
fn queue_dir(dev: &Path) -> Option<PathBuf> {
    let q = dev.join("queue");
    if q.is_dir() {
        return Some(q);
    }
    let q = dev.join("../queue");
    q.is_dir().then_some(q)
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn chunks_are_aligned_and_bounded() {
        let dir = std::env::temp_dir();
        let f = std::fs::File::open(&dir).expect("temp dir");
        match direct_limits(f.as_raw_fd(), 4096, 1 << 30) {
            Some(l) => {
                for c in [l.registered, l.paged] {
                    assert_eq!(c % 4096, 0, "{c}");
                    assert!(c >= FLOOR, "{c}");
                }
                assert!(l.paged <= l.registered, "{l:?}");
                eprintln!(
                    "direct chunks for {}: {} KiB registered, {} KiB paged",
                    dir.display(),
                    l.registered >> 10,
                    l.paged >> 10
                );
            }
            // tmpfs, overlay without a block device, or no sysfs: the default applies.
            None => eprintln!("no block-device limits for {}", dir.display()),
        }
        assert!(direct_limits(f.as_raw_fd(), 4096, 64 << 10)
            .is_none_or(|l| l.registered <= 64 << 10 && l.paged <= 64 << 10));
    }

    #[test]
    fn bad_descriptor_has_no_limits() {
        assert_eq!(direct_limits(-1, 4096, 1 << 30), None);
    }
}
