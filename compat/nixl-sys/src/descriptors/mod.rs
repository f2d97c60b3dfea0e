//! Descriptor lists (nixl-sys's `descriptors` module): memory types, registration and transfer
//! lists, remote lists of memory views, prepared list handles, memory queries.

use serde::{Deserialize, Serialize};
use std::fmt;

mod query;
mod reg;
mod remote;
mod sync_manager;
mod wire;
mod xfer;
mod xfer_dlist_handle;

pub use query::{QueryResponse, QueryResponseIterator, QueryResponseList};
pub use reg::{RegDescList, RegDescriptor};
pub use remote::{RemoteDescList, RemoteDescriptor};
pub use sync_manager::{BackendSyncable, SyncManager};
pub use xfer::{XferDescList, XferDescriptor};
pub use xfer_dlist_handle::XferDlistHandle;

/// A memory type (NIXL's segment types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemType {
    /// Host memory.
    Dram,
    /// GPU memory.
    Vram,
    /// A block device.
    Block,
    /// An object-store object.
    Object,
    /// A file.
    File,
    /// None of the above.
    Unknown,
}

impl MemType {
    pub(crate) fn from_kind(kind: nixl::MemKind) -> Self {
        match kind {
            nixl::MemKind::Dram => MemType::Dram,
            nixl::MemKind::Vram => MemType::Vram,
            nixl::MemKind::Block => MemType::Block,
            nixl::MemKind::Object => MemType::Object,
            nixl::MemKind::File => MemType::File,
        }
    }

    /// nixl-rs's kind; `None` for `Unknown`.
    pub(crate) fn kind(self) -> Option<nixl::MemKind> {
        match self {
            MemType::Dram => Some(nixl::MemKind::Dram),
            MemType::Vram => Some(nixl::MemKind::Vram),
            MemType::Block => Some(nixl::MemKind::Block),
            MemType::Object => Some(nixl::MemKind::Object),
            MemType::File => Some(nixl::MemKind::File),
            MemType::Unknown => None,
        }
    }

    /// nixl-rs's kind, or `InvalidParam` for `Unknown`.
    pub(crate) fn require_kind(self) -> Result<nixl::MemKind, crate::NixlError> {
        self.kind().ok_or_else(|| {
            crate::refuse(
                nixl::ErrorKind::InvalidParam,
                "memory type Unknown names no memory".to_owned(),
                crate::NixlError::InvalidParam,
            )
        })
    }

    /// The C API's number (bincode's variant index in nixl-sys's serialized lists).
    pub(crate) fn index(self) -> u32 {
        match self {
            MemType::Dram => 0,
            MemType::Vram => 1,
            MemType::Block => 2,
            MemType::Object => 3,
            MemType::File => 4,
            MemType::Unknown => 5,
        }
    }

    pub(crate) fn from_index(i: u32) -> Option<Self> {
        Some(match i {
            0 => MemType::Dram,
            1 => MemType::Vram,
            2 => MemType::Block,
            3 => MemType::Object,
            4 => MemType::File,
            5 => MemType::Unknown,
            _ => return None,
        })
    }
}

impl fmt::Display for MemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NIXL's C API names (`nixl_capi_mem_type_to_string`).
        f.write_str(match self {
            MemType::Dram => "DRAM",
            MemType::Vram => "VRAM",
            MemType::Block => "BLOCK",
            MemType::Object => "OBJECT",
            MemType::File => "FILE",
            MemType::Unknown => "UNKNOWN",
        })
    }
}
