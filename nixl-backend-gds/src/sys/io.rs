//! `pread`/`pwrite` on raw buffers, and copies between registered memory and the crate's own
//! buffers. Crate invariant (see `super`): every address range names memory that stays alive,
//! and for a destination is not otherwise accessed, until the call returns.

/// One `pread(fd, buf, len, off)` into the host range `[buf, buf+len)`: bytes read, or -1 with
/// `errno` set.
#[cfg(feature = "posix")]
pub(crate) fn pread(fd: std::os::fd::RawFd, buf: u64, len: usize, off: libc::off_t) -> isize {
    // SAFETY: the crate invariant: `buf..buf+len` is live host memory no one else accesses
    // until this returns; an invalid descriptor yields EBADF.
    unsafe { libc::pread(fd, buf as *mut libc::c_void, len, off) }
}

/// One `pwrite(fd, buf, len, off)` from the host range `[buf, buf+len)`: bytes written, or -1
/// with `errno` set.
#[cfg(feature = "posix")]
pub(crate) fn pwrite(fd: std::os::fd::RawFd, buf: u64, len: usize, off: libc::off_t) -> isize {
    // SAFETY: the crate invariant: `buf..buf+len` is live host memory; pwrite only reads it.
    unsafe { libc::pwrite(fd, buf as *const libc::c_void, len, off) }
}

/// Appends the host range `[addr, addr+len)` to `out`.
#[cfg(feature = "s3")]
pub(crate) fn append_from(addr: u64, len: usize, out: &mut Vec<u8>) {
    // SAFETY: the crate invariant: the range lies in a DRAM registration the request keeps
    // alive until the task reading it is aborted and awaited.
    let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    out.extend_from_slice(src);
}

/// Copies `src` to the host address `dst`.
#[cfg(feature = "s3")]
pub(crate) fn copy_to(dst: u64, src: &[u8]) {
    // SAFETY: the crate invariant: `dst..dst+src.len()` lies in a DRAM registration the request
    // keeps alive and no one else writes while the request runs; the caller copies between
    // await points, so an abort never tears it.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
}

#[cfg(all(test, feature = "posix"))]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn pread_and_pwrite_move_the_bytes_of_the_named_range() {
        let dir = std::env::temp_dir().join(format!("nixl-sysio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("f"))
            .expect("open");
        let src: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        // The buffers are owned here and outlive the calls (the crate invariant).
        assert_eq!(
            pwrite(f.as_raw_fd(), src.as_ptr() as u64, src.len(), 100),
            4096
        );
        let mut dst = vec![0u8; 4096];
        assert_eq!(
            pread(f.as_raw_fd(), dst.as_mut_ptr() as u64, dst.len(), 100),
            4096
        );
        assert_eq!(dst, src);
        assert_eq!(pread(-1, dst.as_mut_ptr() as u64, 1, 0), -1);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
