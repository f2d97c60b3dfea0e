//! Typed storage regions: a file the region owns ([`FileRegion`]) and an object key
//! ([`ObjectRegion`]).
//!
//! Registering one hands the agent an `Arc` of it, so a file descriptor cannot be closed (and
//! its number reused) while a registration, prepared list or request names it. The backends
//! also duplicate the descriptor at registration, so a [`nixl_core::backend::RawRegion::storage`]
//! naming a caller-owned descriptor is safe too.

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nixl_core::{Desc, MemKind, MemoryRegion, RegionDesc, XferDescList};

/// How [`FileRegion::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFlags {
    /// Create the file if it does not exist.
    pub create: bool,
    /// Truncate it to zero length first.
    pub truncate: bool,
    /// Open it read-only (WRITE transfers then fail with the OS error).
    pub read_only: bool,
    /// Bypass the page cache (`O_DIRECT`): offsets, lengths and buffer addresses of transfers
    /// must then be aligned (checked when a transfer is prepared).
    pub direct: bool,
}

impl Default for OpenFlags {
    fn default() -> Self {
        OpenFlags {
            create: true,
            truncate: false,
            read_only: false,
            direct: false,
        }
    }
}

impl OpenFlags {
    /// Read-write, created if missing, through the page cache.
    pub fn buffered() -> Self {
        OpenFlags::default()
    }

    /// Read-write, created if missing, with `O_DIRECT`.
    pub fn direct() -> Self {
        OpenFlags {
            direct: true,
            ..OpenFlags::default()
        }
    }
}

/// A file registered as storage (`MemKind::File`): offsets `[0, len)` of an open file.
///
/// The region owns the file; its descriptor number is the region's device id, which transfer
/// descriptors name ([`FileRegion::desc_at`]).
#[derive(Debug)]
pub struct FileRegion {
    file: File,
    path: PathBuf,
    len: u64,
    direct: bool,
}

impl FileRegion {
    /// Opens `path` as a region of `len` bytes. With `flags.create` and a shorter file, the
    /// file is extended (sparse) to `len` so READs of unwritten ranges return zeros.
    pub fn open(path: impl AsRef<Path>, len: u64, flags: OpenFlags) -> std::io::Result<Self> {
        let path = path.as_ref();
        let mut o = OpenOptions::new();
        o.read(true)
            .write(!flags.read_only)
            .create(flags.create && !flags.read_only);
        o.truncate(flags.truncate && !flags.read_only);
        if flags.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o.open(path)?;
        if flags.create && !flags.read_only && file.metadata()?.len() < len {
            file.set_len(len)?;
        }
        Ok(FileRegion {
            file,
            path: path.to_owned(),
            len,
            direct: flags.direct,
        })
    }

    /// Wraps an already open file (its path is kept for queries and reports).
    pub fn from_file(file: File, path: impl Into<PathBuf>, len: u64) -> Self {
        let direct = crate::sys::fd::is_direct(file.as_fd());
        FileRegion {
            file,
            path: path.into(),
            len,
            direct,
        }
    }

    /// The device id transfer descriptors use: the file descriptor number.
    pub fn dev_id(&self) -> u64 {
        self.file.as_raw_fd() as u64
    }

    /// The region length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file was opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A descriptor for `len` bytes at `offset` of this file.
    pub fn desc_at(&self, offset: u64, len: u64) -> Desc {
        Desc::on_device(offset, len, self.dev_id())
    }

    /// `count` consecutive blocks of `block` bytes starting at `offset`.
    pub fn blocks(&self, offset: u64, block: u64, count: usize) -> XferDescList {
        XferDescList::from_descs(
            MemKind::File,
            (0..count as u64).map(|i| self.desc_at(offset + i * block, block)),
        )
    }
}

// SAFETY: a file names no process memory; the descriptor stays open while the value lives
// (the value owns the `File`), and the description never changes.
unsafe impl MemoryRegion for FileRegion {
    fn desc(&self) -> RegionDesc {
        RegionDesc {
            kind: MemKind::File,
            addr: 0,
            len: self.len,
            dev_id: self.dev_id(),
            meta: self.path.as_os_str().as_encoded_bytes().to_vec(),
        }
    }
}

static NEXT_OBJECT_ID: AtomicU64 = AtomicU64::new(1);

/// An object in an object store (`MemKind::Object`): bytes `[0, len)` of the object named by
/// a key. The device id is a process-unique number, so regions of different keys never
/// overlap in the agent's registration table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRegion {
    key: String,
    len: u64,
    id: u64,
}

impl ObjectRegion {
    /// An object region for `key` of `len` bytes, with a fresh device id.
    pub fn new(key: impl Into<String>, len: u64) -> Self {
        let id = NEXT_OBJECT_ID.fetch_add(1, Ordering::Relaxed);
        ObjectRegion {
            key: key.into(),
            len,
            id,
        }
    }

    /// An object region with a chosen device id (NIXL's `devId`).
    pub fn with_id(key: impl Into<String>, len: u64, id: u64) -> Self {
        ObjectRegion {
            key: key.into(),
            len,
            id,
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The region length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device id transfer descriptors use.
    pub fn dev_id(&self) -> u64 {
        self.id
    }

    /// A descriptor for `len` bytes at `offset` of this object.
    pub fn desc_at(&self, offset: u64, len: u64) -> Desc {
        Desc::on_device(offset, len, self.id)
    }

    /// `count` consecutive blocks of `block` bytes starting at `offset`.
    pub fn blocks(&self, offset: u64, block: u64, count: usize) -> XferDescList {
        XferDescList::from_descs(
            MemKind::Object,
            (0..count as u64).map(|i| self.desc_at(offset + i * block, block)),
        )
    }

    /// The description used to query the object ([`nixl_core::Agent::query_mem`]).
    pub fn query_desc(&self) -> RegionDesc {
        self.desc()
    }
}

// SAFETY: an object key names no process memory; the description never changes.
unsafe impl MemoryRegion for ObjectRegion {
    fn desc(&self) -> RegionDesc {
        RegionDesc {
            kind: MemKind::Object,
            addr: 0,
            len: self.len,
            dev_id: self.id,
            meta: self.key.as_bytes().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_region_describes_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        let r = FileRegion::open(&p, 8192, OpenFlags::buffered()).expect("open");
        let d = r.desc();
        assert_eq!(
            (d.kind, d.addr, d.len, d.dev_id),
            (MemKind::File, 0, 8192, r.dev_id())
        );
        assert_eq!(d.meta, p.as_os_str().as_encoded_bytes());
        assert_eq!(std::fs::metadata(&p).expect("stat").len(), 8192);
        assert_eq!(
            r.blocks(4096, 1024, 2).descs()[1],
            Desc::on_device(5120, 1024, r.dev_id())
        );
    }

    #[test]
    fn object_regions_get_distinct_ids() {
        let a = ObjectRegion::new("a", 10);
        let b = ObjectRegion::new("b", 10);
        assert_ne!(a.dev_id(), b.dev_id());
        assert_eq!(a.desc().meta, b"a");
    }
}
