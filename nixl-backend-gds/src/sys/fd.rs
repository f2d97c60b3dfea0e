//! libc on file descriptors: duplicating, status flags, `fstat`, block device size, page size.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `fcntl(raw, F_DUPFD_CLOEXEC)`: a new descriptor of the same open file, owned by the caller.
#[cfg_attr(not(feature = "posix"), allow(dead_code))]
pub(crate) fn dup_cloexec(raw: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only creates a new descriptor; an invalid `raw` yields EBADF.
    let dup = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `dup` is a new descriptor this process owns and nothing else closes.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// Whether the open file was opened with `O_DIRECT` (false when the flags cannot be read).
pub(crate) fn is_direct(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GETFL only reads the status flags of a descriptor the caller holds open.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    fl >= 0 && fl & libc::O_DIRECT != 0
}

/// `fstat(fd)`.
#[cfg_attr(not(feature = "posix"), allow(dead_code))]
pub(crate) fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes a `stat` into the pointer it is given, which is valid for writes;
    // an invalid descriptor yields EBADF.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so the struct is initialised (and it was zeroed before).
    Ok(unsafe { st.assume_init() })
}

/// `_IOR(0x12, 114, size_t)`.
#[cfg(feature = "posix")]
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// The size of the block device open as `fd` (`BLKGETSIZE64`).
#[cfg(feature = "posix")]
pub(crate) fn block_device_size(fd: RawFd) -> std::io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 into the pointer, which is valid for writes; other
    // descriptors yield an error.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut size as *mut u64) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}

/// The page size (4096 where it cannot be read).
#[cfg(feature = "posix")]
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

#[cfg(all(test, feature = "posix"))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn descriptors_are_duplicated_flagged_and_sized_or_refused() {
        let dir = std::env::temp_dir().join(format!("nixl-sysfd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        let f = std::fs::File::create(&path).expect("create");
        f.set_len(8192).expect("len");
        let dup = dup_cloexec(f.as_raw_fd()).expect("dup");
        assert_ne!(dup.as_raw_fd(), f.as_raw_fd());
        assert!(!is_direct(dup.as_fd()));
        assert_eq!(fstat(dup.as_raw_fd()).expect("fstat").st_size, 8192);
        // A regular file is no block device.
        assert!(block_device_size(dup.as_raw_fd()).is_err());
        // Bad descriptors are errors, not crashes.
        assert!(dup_cloexec(-1).is_err());
        assert!(fstat(-1).is_err());
        assert!(page_size() >= 4096);
        if let Ok(d) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
        {
            assert!(is_direct(d.as_fd()));
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}

/// `fdatasync(fd)`: the file's data (and the metadata needed to read it) on the device.
#[cfg(feature = "posix")]
pub(crate) fn fdatasync(fd: RawFd) -> std::io::Result<()> {
    loop {
        // SAFETY: fdatasync takes a descriptor number and reads no memory; an invalid one
        // yields EBADF.
        if unsafe { libc::fdatasync(fd) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
