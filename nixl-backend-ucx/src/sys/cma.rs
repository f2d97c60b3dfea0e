//! Cross-memory attach: `process_vm_writev` / `process_vm_readv`, the copies UCX's `cma`
//! transport makes, issued by the backend itself with many ranges per system call
//! (`crate::cma`).

use core::ffi::{c_int, c_ulong};
use std::io;

/// One range: an address (in this process or the peer's) and its length. Laid out as the C
/// library's `struct iovec` (a pointer and a `size_t`), which the kernel reads; holding the
/// address as an integer keeps the lists `Send`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IoVec {
    pub base: usize,
    pub len: usize,
}

const _: () = assert!(
    std::mem::size_of::<IoVec>() == std::mem::size_of::<libc::iovec>()
        && std::mem::align_of::<IoVec>() == std::mem::align_of::<libc::iovec>()
);

/// The most ranges one call takes on each side (the kernel's `UIO_MAXIOV`).
pub(crate) const IOV_MAX: usize = 1024;

/// Copies `local[k]` to process `pid`'s `remote[k]` (`write`) or back (`!write`) for every
/// `k`, in as many calls as the kernel needs: it may stop early at a range it cannot access,
/// and the copy resumes there; a call that moves nothing ends it with `EFAULT`. The lists are
/// in pairs of equal lengths, at most [`IOV_MAX`] of them.
///
/// Crate invariant (the caller's): every local range is memory of this process that stays
/// mapped during the call: readable for a WRITE; for a READ, writable and not read or written
/// by anything else meanwhile (the kernel writes it as `read(2)` would). The remote ranges are
/// the peer's; a bad one is an error, never a fault here.
pub(crate) fn copy(pid: u32, write: bool, local: &[IoVec], remote: &[IoVec]) -> io::Result<()> {
    if local.len() != remote.len()
        || local.len() > IOV_MAX
        || local.iter().zip(remote).any(|(l, r)| l.len != r.len)
    {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let pid = c_int::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut first = 0usize;
    // How much of `local[first]` (and `remote[first]`) is already copied.
    let mut done_in_first = 0usize;
    while first < local.len() {
        let (mut l0, mut r0) = (local[first], remote[first]);
        l0.base += done_in_first;
        r0.base += done_in_first;
        l0.len -= done_in_first;
        r0.len -= done_in_first;
        // The head range is copied and adjusted; the rest are passed as they are.
        let mut head_l = [l0];
        let mut head_r = [r0];
        let rest = first + 1..local.len();
        let n = call(
            pid,
            write,
            &mut head_l,
            &mut head_r,
            &local[rest.clone()],
            &remote[rest],
        )?;
        if n == 0 {
            return Err(io::Error::from_raw_os_error(14)); // EFAULT
        }
        // Skip what was copied.
        let mut left = n;
        let head = l0.len;
        if left < head {
            done_in_first += left;
            continue;
        }
        left -= head;
        first += 1;
        done_in_first = 0;
        while left > 0 && first < local.len() {
            if left < local[first].len {
                done_in_first = left;
                left = 0;
            } else {
                left -= local[first].len;
                first += 1;
            }
        }
    }
    Ok(())
}

/// One system call over `head ++ rest` on each side; returns the bytes copied.
fn call(
    pid: c_int,
    write: bool,
    head_l: &mut [IoVec; 1],
    head_r: &mut [IoVec; 1],
    rest_l: &[IoVec],
    rest_r: &[IoVec],
) -> io::Result<usize> {
    // The kernel wants one array per side: the head (possibly advanced) then the rest. Short
    // lists are assembled on the stack; the head alone needs no copy.
    let mut l = [IoVec::default(); 64];
    let mut r = [IoVec::default(); 64];
    let mut lv;
    let mut rv;
    let (lp, rp, cnt): (&[IoVec], &[IoVec], usize) = if rest_l.is_empty() {
        (&head_l[..], &head_r[..], 1)
    } else if rest_l.len() < l.len() {
        l[0] = head_l[0];
        r[0] = head_r[0];
        l[1..=rest_l.len()].copy_from_slice(rest_l);
        r[1..=rest_r.len()].copy_from_slice(rest_r);
        (&l[..], &r[..], rest_l.len() + 1)
    } else {
        lv = Vec::with_capacity(rest_l.len() + 1);
        rv = Vec::with_capacity(rest_r.len() + 1);
        lv.push(head_l[0]);
        rv.push(head_r[0]);
        lv.extend_from_slice(rest_l);
        rv.extend_from_slice(rest_r);
        (&lv[..], &rv[..], rest_l.len() + 1)
    };
    let cnt = cnt as c_ulong;
    // SAFETY: both arrays hold at least `cnt` IoVec, laid out as `struct iovec`, alive for the
    // call; the local ranges satisfy `copy`'s crate invariant (memory of this process that
    // stays mapped; for a READ, written by nothing else meanwhile), so the kernel's reads and
    // writes of them are those of a read(2)/write(2) into owned buffers. The remote ranges
    // name the peer's memory, which the kernel checks (EFAULT) without touching ours.
    let n = unsafe {
        if write {
            libc::process_vm_writev(pid, lp.as_ptr().cast(), cnt, rp.as_ptr().cast(), cnt, 0)
        } else {
            libc::process_vm_readv(pid, lp.as_ptr().cast(), cnt, rp.as_ptr().cast(), cnt, 0)
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(b: &[u8]) -> IoVec {
        IoVec {
            base: b.as_ptr() as usize,
            len: b.len(),
        }
    }

    /// Copies within this process (a process may attach to itself) in pieces of many
    /// lengths, both ways, every byte checked; lists longer than the stack buffer too.
    #[test]
    fn copies_every_range_both_ways() {
        let me = std::process::id();
        let src: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // Ranges of uneven lengths over the whole buffer, in shuffled pairs.
        let mut cuts = vec![0usize];
        let mut at = 0usize;
        let mut k = 1usize;
        while at < src.len() {
            at = (at + 1 + (k * 997) % 4000).min(src.len());
            cuts.push(at);
            k += 1;
        }
        let pieces: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
        assert!(pieces.len() > 64, "longer than the stack list");
        for chunk in pieces.chunks(IOV_MAX) {
            let l: Vec<IoVec> = chunk.iter().map(|&(o, n)| iov(&src[o..o + n])).collect();
            let r: Vec<IoVec> = chunk
                .iter()
                .map(|&(o, n)| IoVec {
                    base: dst.as_mut_ptr() as usize + o,
                    len: n,
                })
                .collect();
            copy(me, true, &l, &r).unwrap();
        }
        assert_eq!(dst, src);
        let mut back = vec![0u8; src.len()];
        let l = [IoVec {
            base: back.as_mut_ptr() as usize,
            len: back.len(),
        }];
        copy(me, false, &l, &[iov(&dst)]).unwrap();
        assert_eq!(back, src);
    }

    #[test]
    fn bad_lists_and_peers_are_errors() {
        let me = std::process::id();
        let a = [1u8; 64];
        let mut b = [0u8; 64];
        let bv = IoVec {
            base: b.as_mut_ptr() as usize,
            len: 64,
        };
        assert!(copy(me, true, &[iov(&a)], &[]).is_err(), "unpaired");
        assert!(
            copy(me, true, &[iov(&a[..32])], &[bv]).is_err(),
            "lengths differ"
        );
        let many = vec![iov(&a); IOV_MAX + 1];
        assert!(copy(me, true, &many, &many).is_err(), "too many");
        // A remote range that is not mapped in the peer is EFAULT, not a fault here.
        let unmapped = IoVec { base: 8, len: 64 };
        let e = copy(me, true, &[iov(&a)], &[unmapped]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(14));
        // A process that does not exist.
        let e = copy(u32::MAX >> 1, true, &[iov(&a)], &[bv]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(3), "{e}");
        assert_eq!(b, [0u8; 64], "nothing copied");
        copy(me, true, &[], &[]).unwrap();
    }
}
