//! Host memory another process can map: [`SharedHostBuffer`] (a memfd, `MAP_SHARED`) and its
//! import, [`SharedHostMapping`].
//!
//! A process can only reach another process's DRAM if that DRAM was allocated shareable: plain
//! heap or anonymous memory (a `HostBuffer`, an `MmapBuffer`) has no name another process can
//! open. A `SharedHostBuffer` is a memfd; its [`SharedHostHandle`] names it by
//! `/proc/<pid>/fd/<fd>` plus a random token that is part of the memfd's name, so the importer
//! can tell a reused descriptor number from the buffer it wants. Requirements: both processes
//! in one PID namespace, the importer allowed to open the exporter's `/proc/<pid>/fd` (same
//! user, the default).

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

use nixl_core::backend::DecodeError;
use nixl_core::{MemoryRegion, Op, RegionDesc};

use crate::error::{MemError, MemResult as Result};

use crate::host::HostMemory;
use crate::sys::host::{memfd, Mapping};
use crate::wire::{Reader, Writer};

const MAGIC: &[u8; 4] = b"NXSH";

/// Live shared buffers of this process: start address -> handle. Lets a backend tell, from a
/// region's address alone, whether it can be exported.
static LIVE: Mutex<BTreeMap<u64, SharedHostHandle>> = Mutex::new(BTreeMap::new());

/// How a peer opens a [`SharedHostBuffer`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SharedHostHandle {
    /// The exporter's process id.
    pub pid: u32,
    /// The memfd's descriptor number in the exporter.
    pub fd: i32,
    /// The random token in the memfd's name.
    pub token: u64,
    /// The buffer's start address in the exporter.
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl SharedHostHandle {
    /// The bytes to send to a peer.
    pub fn to_bytes(&self) -> Vec<u8> {
        Writer::new(MAGIC)
            .u64(u64::from(self.pid))
            .u64(self.fd as u64)
            .u64(self.token)
            .u64(self.addr)
            .u64(self.len)
            .finish()
    }

    /// Parses [`SharedHostHandle::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> std::result::Result<Self, DecodeError> {
        let mut r = Reader::new(b, MAGIC)?;
        let pid = u32::try_from(r.u64()?).map_err(|_| DecodeError::Invalid { what: "pid" })?;
        let fd = i32::try_from(r.u64()?).map_err(|_| DecodeError::Invalid { what: "fd" })?;
        let h = SharedHostHandle {
            pid,
            fd,
            token: r.u64()?,
            addr: r.u64()?,
            len: r.u64()?,
        };
        r.finish()?;
        if h.len == 0 || h.addr.checked_add(h.len).is_none() || h.fd < 0 {
            return Err(DecodeError::Invalid {
                what: "shared host range",
            });
        }
        Ok(h)
    }

    /// The handle of the live shared buffer of this process containing `[addr, addr+len)`.
    pub fn find_local(addr: u64, len: u64) -> Option<SharedHostHandle> {
        let live = LIVE.lock();
        let (_, h) = live.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= h.addr + h.len).then(|| h.clone())
    }

    fn name(token: u64) -> String {
        format!("nixl-shm-{token:016x}")
    }
}

fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// Host memory backed by a memfd that another process can map (see the module docs), zeroed,
/// unmapped and closed on drop.
pub struct SharedHostBuffer {
    // Fields drop in order: unmapped, then the memfd closed.
    map: Mapping,
    len: usize,
    fd: OwnedFd,
    token: u64,
}

impl SharedHostBuffer {
    /// Creates and maps a `len`-byte memfd.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "a shared buffer needs at least one byte",
            ));
        }
        let token = random_token();
        let name = CString::new(SharedHostHandle::name(token))
            .map_err(|_| MemError::invalid(Op::RegisterMem, "memfd name"))?;
        let fd = memfd(&name).map_err(|e| MemError::io(Op::RegisterMem, e))?;
        let file = File::from(fd);
        file.set_len(len as u64)
            .map_err(|e| MemError::io(Op::RegisterMem, e))?;
        let map = Mapping::shared(&file, len).map_err(|e| MemError::io(Op::RegisterMem, e))?;
        let b = SharedHostBuffer {
            map,
            len,
            fd: OwnedFd::from(file),
            token,
        };
        LIVE.lock().insert(b.addr(), b.handle());
        Ok(b)
    }

    /// The handle a peer opens it with.
    pub fn handle(&self) -> SharedHostHandle {
        SharedHostHandle {
            pid: std::process::id(),
            fd: self.fd.as_raw_fd(),
            token: self.token,
            addr: self.addr(),
            len: self.len as u64,
        }
    }
}

// SAFETY: the mapping lives until Drop.
unsafe impl HostMemory for SharedHostBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedHostBuffer {
    fn drop(&mut self) {
        LIVE.lock().remove(&self.addr());
        // Then the fields: the mapping is unmapped, the memfd closed.
    }
}

impl fmt::Debug for SharedHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedHostBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the mapping lives as long as the value; the description never changes.
unsafe impl MemoryRegion for SharedHostBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::dram(self.addr(), self.len as u64)
    }
}

/// Another process's [`SharedHostBuffer`] mapped into this one, unmapped on drop.
pub struct SharedHostMapping {
    map: Mapping,
    handle: SharedHostHandle,
}

impl SharedHostMapping {
    /// Opens and maps the buffer a handle names. `NotFound` when the exporter is gone or the
    /// descriptor no longer is that buffer; `Mismatch` when its size changed.
    pub fn open(handle: &SharedHostHandle) -> Result<Self> {
        let path = format!("/proc/{}/fd/{}", handle.pid, handle.fd);
        let target = std::fs::read_link(&path)
            .map_err(|e| MemError::not_found(Op::LoadMetadata, format!("{path}: {e}")))?;
        if !target
            .to_string_lossy()
            .contains(&SharedHostHandle::name(handle.token))
        {
            return Err(MemError::not_found(
                Op::LoadMetadata,
                format!("{path} is no longer the shared buffer"),
            ));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| MemError::io(Op::LoadMetadata, e))?;
        let size = file
            .metadata()
            .map_err(|e| MemError::io(Op::LoadMetadata, e))?
            .len();
        if size != handle.len {
            return Err(MemError::mismatch(
                Op::LoadMetadata,
                format!("shared buffer is {size} bytes, handle says {}", handle.len),
            ));
        }
        let len = usize::try_from(handle.len)
            .map_err(|_| MemError::invalid(Op::LoadMetadata, "length"))?;
        let map = Mapping::shared(&file, len).map_err(|e| MemError::io(Op::LoadMetadata, e))?;
        Ok(SharedHostMapping {
            map,
            handle: handle.clone(),
        })
    }

    /// Where the exporter's address `remote` is mapped here, if in range.
    pub fn translate(&self, remote: u64, len: u64) -> Option<u64> {
        self.window().translate(remote, len)
    }

    /// The exporter's range and where it is mapped here.
    pub(crate) fn window(&self) -> Window {
        Window {
            remote: self.handle.addr,
            len: self.handle.len,
            here: self.addr(),
        }
    }

    /// The handle it was opened from.
    pub fn handle(&self) -> &SharedHostHandle {
        &self.handle
    }
}

// SAFETY: the mapping lives until Drop.
unsafe impl HostMemory for SharedHostMapping {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }
    fn len(&self) -> usize {
        self.handle.len as usize
    }
}

impl fmt::Debug for SharedHostMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedHostMapping")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("handle", &self.handle)
            .finish()
    }
}

// SAFETY: the mapping lives as long as the value; the description never changes.
unsafe impl MemoryRegion for SharedHostMapping {
    fn desc(&self) -> RegionDesc {
        RegionDesc::dram(self.addr(), self.handle.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_sees_the_exporters_bytes_both_ways() {
        let b = SharedHostBuffer::new(3 * 4096 + 5).unwrap();
        b.write_at(100, b"hello");
        // Opening our own /proc/self/fd is the same path a peer takes.
        let m = SharedHostMapping::open(&b.handle()).unwrap();
        assert_ne!(m.addr(), b.addr());
        let mut out = [0u8; 5];
        assert!(m.read_at(100, &mut out));
        assert_eq!(&out, b"hello");
        m.write_at(3 * 4096, b"world");
        let mut out = [0u8; 5];
        b.read_at(3 * 4096, &mut out);
        assert_eq!(&out, b"world");
        assert_eq!(m.translate(b.addr() + 10, 5), Some(m.addr() + 10));
        assert_eq!(m.translate(b.addr() + 3 * 4096 + 1, 5), None);
        assert_eq!(m.translate(b.addr() - 1, 1), None);
    }

    #[test]
    fn the_live_table_finds_contained_ranges_only() {
        let b = SharedHostBuffer::new(8192).unwrap();
        let h = SharedHostHandle::find_local(b.addr() + 4096, 4096).unwrap();
        assert_eq!(h, b.handle());
        assert!(SharedHostHandle::find_local(b.addr() + 4096, 4097).is_none());
        let addr = b.addr();
        drop(b);
        assert!(SharedHostHandle::find_local(addr, 1).is_none());
    }

    #[test]
    fn stale_or_corrupt_handles_are_refused() {
        let b = SharedHostBuffer::new(4096).unwrap();
        let h = b.handle();
        let wrong_token = SharedHostHandle {
            token: h.token ^ 1,
            ..h.clone()
        };
        assert_eq!(
            SharedHostMapping::open(&wrong_token)
                .unwrap_err()
                .kind()
                .as_str(),
            "not_found"
        );
        let wrong_len = SharedHostHandle {
            len: 8192,
            ..h.clone()
        };
        assert_eq!(
            SharedHostMapping::open(&wrong_len)
                .unwrap_err()
                .kind()
                .as_str(),
            "mismatch"
        );
        let bytes = h.to_bytes();
        assert_eq!(SharedHostHandle::from_bytes(&bytes).unwrap(), h);
        for n in 0..bytes.len() {
            assert!(SharedHostHandle::from_bytes(&bytes[..n]).is_err());
        }
        drop(b);
        assert_eq!(
            SharedHostMapping::open(&h).unwrap_err().kind().as_str(),
            "not_found"
        );
        assert_eq!(
            SharedHostBuffer::new(0).unwrap_err().kind().as_str(),
            "invalid_param"
        );
    }
}

/// An exporter's range `[remote, remote + len)` mapped here at `here`: a plain value, so a
/// request translates many addresses of one mapping without touching the mapping again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub remote: u64,
    pub len: u64,
    pub here: u64,
}

impl Window {
    /// Where the exporter's `[remote, remote + len)` is mapped here, if it lies in the range.
    #[inline]
    pub(crate) fn translate(&self, remote: u64, len: u64) -> Option<u64> {
        let off = remote.checked_sub(self.remote)?;
        (off.checked_add(len)? <= self.len).then(|| self.here + off)
    }
}
