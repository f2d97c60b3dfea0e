//! The lock of a peer's shm region, for the one case libfabric cannot recover from: its holder
//! died.
//!
//! libfabric's shm provider (1.15-1.19) guards each endpoint's region with a
//! `pthread_spinlock_t` in the region itself, shared by every process that maps it. The region's
//! owner holds it while it handles the commands in its queue, including the copies of RMA
//! operations (megabytes: milliseconds); a sender takes it to queue a command, spinning without
//! end (`fi_read`, `fi_write`, `fi_send` never return while it is held). A peer killed while it
//! holds its lock leaves it held for good, and the next post to it spins forever, holding the
//! rail's endpoint lock: the rail stops for every peer. A [`RegionLock`] maps the first page of
//! such a region (the region's header, where the lock lives) so that, once the owner's process
//! is known to have exited, the lock can be released for the thread spinning on it (see
//! `crate::rail::ShmGuard`).
//!
//! The layout read: `struct smr_region { uint8_t version; uint8_t resv; uint16_t flags; int pid;
//! uint8_t cma_cap_peer; uint8_t cma_cap_self; [uint32_t max_sar_buf_per_peer;] void
//! *base_addr; pthread_spinlock_t lock; ...}` (`include/ofi_shm.h`), so `lock` lies at byte 24
//! on 64-bit targets for `SMR_VERSION` 2 to 5 (libfabric 1.15 to 1.19). Other versions are not
//! mapped (`None`): no recovery there.

use std::ffi::c_int;
use std::os::fd::AsFd;
use std::path::Path;
use std::ptr::NonNull;

/// Where `version`, `pid` and `lock` lie in the region's header.
const VERSION_AT: usize = 0;
const PID_AT: usize = 4;
const LOCK_AT: usize = 24;
/// The `SMR_VERSION`s whose header has this layout.
const KNOWN: std::ops::RangeInclusive<u8> = 2..=5;
/// Bytes mapped: the header.
const MAPPED: usize = 4096;

/// The header of a peer's shm region, mapped shared (read and write) in this process.
pub(crate) struct RegionLock {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory owned by this value; the lock word is only
// touched through libc's own spin-lock call, which is safe from any thread.
unsafe impl Send for RegionLock {}
// SAFETY: as above.
unsafe impl Sync for RegionLock {}

impl RegionLock {
    /// Maps the header of the region at `path`. `Ok(None)` where its layout is not one this
    /// module knows; `Err` where the file cannot be opened or mapped, or its header names a
    /// process other than `pid`.
    pub(crate) fn open(path: &Path, pid: u32) -> Result<Option<RegionLock>, String> {
        if cfg!(not(target_pointer_width = "64")) {
            return Ok(None);
        }
        let what = |e: rustix::io::Errno| format!("shm region {}: {e}", path.display());
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .map_err(what)?;
        let size = rustix::fs::fstat(&fd).map_err(what)?.st_size;
        if size < MAPPED as i64 {
            return Err(format!(
                "shm region {} is {size} bytes, shorter than its header",
                path.display()
            ));
        }
        // SAFETY: a fresh shared mapping of the file's first page (the file is at least that
        // long, checked above), at an address the kernel picks; unmapped by `Drop`.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                MAPPED,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd.as_fd(),
                0,
            )
        }
        .map_err(what)?;
        let Some(base) = NonNull::new(base.cast::<u8>()) else {
            return Err(format!("shm region {}: mapped at null", path.display()));
        };
        let lock = RegionLock { base };
        let version = lock.read_u8(VERSION_AT);
        if !KNOWN.contains(&version) {
            tracing::debug!(version, region = %path.display(), "shm region of an unknown layout: a dead holder's lock cannot be released");
            return Ok(None);
        }
        let owner = lock.read_i32(PID_AT);
        if u32::try_from(owner).ok() != Some(pid) {
            return Err(format!(
                "shm region {} belongs to process {owner}, not {pid}",
                path.display()
            ));
        }
        Ok(Some(lock))
    }

    fn read_u8(&self, at: usize) -> u8 {
        // SAFETY: `at` lies inside the mapped page; a volatile read of shared memory another
        // process may write (a torn value is harmless: it is only compared).
        unsafe { self.base.as_ptr().add(at).read_volatile() }
    }

    fn read_i32(&self, at: usize) -> i32 {
        // SAFETY: as in `read_u8`; `at` is 4-byte aligned in a page-aligned mapping.
        unsafe { self.base.as_ptr().add(at).cast::<i32>().read_volatile() }
    }

    /// Whether the region's lock is held now: its word differs from a free lock's (glibc's
    /// free value is not 0 on every target, so it is read off a freshly initialised lock). A
    /// racy read: the owner may take or release it right after; a post that finds it held
    /// waits outside libfabric (bounded) instead of spinning inside it without end.
    pub(crate) fn is_held(&self) -> bool {
        self.read_i32(LOCK_AT) != free_word()
    }

    /// Releases the region's lock, as its holder would have. Only for a lock whose holder's
    /// process has exited: releasing a live holder's lock lets two processes into the region's
    /// queues at once.
    pub(crate) fn release_for_dead_holder(&self) {
        // SAFETY: `LOCK_AT` lies inside the mapped page and is the `pthread_spinlock_t` of a
        // region of a known layout (checked at `open`); glibc's unlock is a single store.
        let r: c_int = unsafe {
            libc::pthread_spin_unlock(
                self.base
                    .as_ptr()
                    .add(LOCK_AT)
                    .cast::<libc::pthread_spinlock_t>(),
            )
        };
        if r != 0 {
            tracing::warn!(error = r, "releasing a dead peer's shm region lock failed");
        }
    }
}

/// The word of a free `pthread_spinlock_t` as this libc writes it.
fn free_word() -> i32 {
    static FREE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *FREE.get_or_init(|| {
        let mut word: libc::pthread_spinlock_t = 0;
        // SAFETY: initialises a local spin lock (process-shared, as libfabric's is).
        let r = unsafe { libc::pthread_spin_init(&mut word, libc::PTHREAD_PROCESS_SHARED) };
        if r == 0 {
            word
        } else {
            0
        }
    })
}

impl Drop for RegionLock {
    fn drop(&mut self) {
        // SAFETY: the page mapped by `open`, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), MAPPED) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region file of `MAPPED` bytes with the given header fields and the lock held.
    fn region(name: &str, version: u8, pid: i32) -> std::path::PathBuf {
        let mut header = vec![0u8; MAPPED];
        header[VERSION_AT] = version;
        header[PID_AT..PID_AT + 4].copy_from_slice(&pid.to_ne_bytes());
        // Held, as glibc leaves it locked: initialised, then taken, on a private copy.
        let mut word: libc::pthread_spinlock_t = 0;
        // SAFETY: `word` is a local spin lock, initialised before it is taken.
        unsafe {
            assert_eq!(libc::pthread_spin_init(&mut word, 0), 0);
            assert_eq!(libc::pthread_spin_trylock(&mut word), 0);
        }
        header[LOCK_AT..LOCK_AT + 4].copy_from_slice(&word.to_ne_bytes());
        let path = std::path::Path::new("/dev/shm")
            .join(format!("nixl-region-lock-{name}-{}", std::process::id()));
        std::fs::write(&path, header).expect("a region file");
        path
    }

    #[test]
    fn a_dead_holders_lock_is_released_and_other_regions_are_refused() {
        if !std::path::Path::new("/dev/shm").is_dir() {
            eprintln!("SKIP: no /dev/shm");
            return;
        }
        let me = std::process::id();
        let ok = region("ok", 4, me as i32);
        let other = region("other", 4, 1);
        let unknown = region("unknown", 9, me as i32);
        let short = std::path::Path::new("/dev/shm").join(format!("nixl-region-lock-short-{me}"));
        std::fs::write(&short, [4u8; 16]).expect("a short file");

        let lock = RegionLock::open(&ok, me)
            .expect("maps")
            .expect("a known layout");
        let word = |l: &RegionLock| l.read_i32(LOCK_AT);
        let held = word(&lock);
        assert!(lock.is_held(), "a taken lock reads as held");
        lock.release_for_dead_holder();
        assert!(!lock.is_held(), "a released lock reads as free");
        // Released: libc can take it again (and the file saw the store).
        let mut taken = word(&lock);
        // SAFETY: a private copy of the released word, as a spin lock.
        let took = unsafe { libc::pthread_spin_trylock(&mut taken) };
        assert_eq!(took, 0, "not released");
        assert_ne!(held, word(&lock), "the word did not change");

        assert!(
            RegionLock::open(&other, me).is_err(),
            "another process's region"
        );
        assert!(
            matches!(RegionLock::open(&unknown, me), Ok(None)),
            "an unknown layout"
        );
        assert!(
            RegionLock::open(&short, me).is_err(),
            "shorter than a header"
        );
        for p in [ok, other, unknown, short] {
            let _ = std::fs::remove_file(p);
        }
    }
}
