//! Transfer descriptor lists (NIXL's `nixl_xfer_dlist_t`).

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use super::wire::{Reader, Writer};
use super::MemType;
use crate::{NixlDescriptor, NixlError};

/// A transfer descriptor: address (or offset), length, device id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XferDescriptor {
    /// Address, or offset for storage kinds.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Device id (GPU ordinal, file descriptor, object index).
    pub dev_id: u64,
}

/// A list of transfer descriptors of one memory type.
pub struct XferDescList<'a> {
    descriptors: Vec<XferDescriptor>,
    mem_type: MemType,
    _phantom: PhantomData<&'a dyn NixlDescriptor>,
}

/// The methods both list types share (nixl-sys gives each the same set).
macro_rules! list_common {
    ($list:ident, $desc:ident) => {
        impl $list<'_> {
            /// The list's memory type.
            pub fn get_type(&self) -> Result<MemType, NixlError> {
                Ok(self.mem_type)
            }

            /// Whether the list is empty.
            pub fn is_empty(&self) -> Result<bool, NixlError> {
                Ok(self.descriptors.is_empty())
            }

            /// The number of descriptors.
            pub fn desc_count(&self) -> Result<usize, NixlError> {
                Ok(self.descriptors.len())
            }

            /// The number of descriptors.
            pub fn len(&self) -> Result<usize, NixlError> {
                Ok(self.descriptors.len())
            }

            /// Frees unused capacity.
            pub fn trim(&mut self) {
                self.descriptors.shrink_to_fit();
            }

            /// Removes the descriptor at `index` (`InvalidParam` when there is none).
            pub fn rem_desc(&mut self, index: i32) -> Result<(), NixlError> {
                let idx = usize::try_from(index).map_err(|_| NixlError::InvalidParam)?;
                if idx >= self.descriptors.len() {
                    return Err(NixlError::InvalidParam);
                }
                self.descriptors.remove(idx);
                Ok(())
            }

            /// Removes every descriptor.
            pub fn clear(&mut self) {
                self.descriptors.clear();
            }

            /// The descriptor at `index` (`InvalidParam` when there is none).
            pub fn get(&self, index: usize) -> Result<&$desc, NixlError> {
                self.descriptors.get(index).ok_or(NixlError::InvalidParam)
            }

            /// The descriptor at `index`, mutable (`InvalidParam` when there is none).
            pub fn get_mut(&mut self, index: usize) -> Result<&mut $desc, NixlError> {
                self.descriptors
                    .get_mut(index)
                    .ok_or(NixlError::InvalidParam)
            }

            /// The descriptors.
            #[allow(dead_code)]
            pub(crate) fn descs(&self) -> &[$desc] {
                &self.descriptors
            }

            /// Prints the list to standard output.
            pub fn print(&self) -> Result<(), NixlError> {
                println!("{self:?}: {:?}", self.descriptors);
                Ok(())
            }

            /// Adds a storage object's region (`InvalidParam` for another memory type).
            fn storage_desc(&mut self, desc: &dyn crate::NixlDescriptor) -> Result<(), NixlError> {
                self.check_type(desc.mem_type())?;
                let addr = crate::storage::addr_of(desc);
                self.add_desc(addr, desc.size(), desc.device_id());
                Ok(())
            }

            /// `InvalidParam` when a descriptor of `kind` may not join the list.
            fn check_type(&self, kind: MemType) -> Result<(), NixlError> {
                let list = if self.descriptors.is_empty() {
                    kind
                } else {
                    self.mem_type
                };
                if kind != list && list != MemType::Unknown {
                    return Err(NixlError::InvalidParam);
                }
                Ok(())
            }
        }

        impl std::fmt::Debug for $list<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($list))
                    .field("mem_type", &self.mem_type)
                    .field("len", &self.descriptors.len())
                    .field("desc_count", &self.descriptors.len())
                    .finish()
            }
        }

        impl PartialEq for $list<'_> {
            fn eq(&self, other: &Self) -> bool {
                self.mem_type == other.mem_type && self.descriptors == other.descriptors
            }
        }

        impl std::ops::Index<usize> for $list<'_> {
            type Output = $desc;

            fn index(&self, index: usize) -> &Self::Output {
                &self.descriptors[index]
            }
        }

        impl std::ops::IndexMut<usize> for $list<'_> {
            fn index_mut(&mut self, index: usize) -> &mut Self::Output {
                &mut self.descriptors[index]
            }
        }
    };
}
pub(super) use list_common;

impl<'a> XferDescList<'a> {
    /// An empty list of `mem_type`.
    pub fn new(mem_type: MemType) -> Result<Self, NixlError> {
        Ok(Self {
            descriptors: Vec::new(),
            mem_type,
            _phantom: PhantomData,
        })
    }

    /// The descriptors' address: an opaque pointer, valid until the list changes (nixl-sys
    /// returned its C list; nothing in this API takes one).
    pub fn as_ptr(&self) -> *const std::ffi::c_void {
        self.descriptors.as_ptr().cast()
    }

    /// Adds a descriptor.
    pub fn add_desc(&mut self, addr: usize, len: usize, dev_id: u64) {
        self.descriptors.push(XferDescriptor { addr, len, dev_id });
    }

    /// Resizes the list, filling with empty descriptors.
    pub fn resize(&mut self, new_size: usize) {
        self.descriptors.resize(
            new_size,
            XferDescriptor {
                addr: 0,
                len: 0,
                dev_id: 0,
            },
        );
    }

    /// Adds a storage object's region (`InvalidParam` for another memory type).
    pub fn add_storage_desc<D: NixlDescriptor + 'a>(
        &mut self,
        desc: &'a D,
    ) -> Result<(), NixlError> {
        self.storage_desc(desc)
    }

    /// The list in nixl-sys's byte form (bincode 1: the type, then each descriptor).
    pub fn serialize(&self) -> Result<Vec<u8>, NixlError> {
        let mut w = Writer::new(self.mem_type, self.descriptors.len());
        for d in &self.descriptors {
            w.desc(d.addr, d.len, d.dev_id);
        }
        Ok(w.0)
    }

    /// A list from [`XferDescList::serialize`]'s bytes (`FailedToCreateXferDlistHandle` for
    /// bytes that are not one).
    pub fn deserialize(bytes: &[u8]) -> Result<Self, NixlError> {
        let decode = || {
            let (mut r, kind, count) = Reader::new(bytes, 24)?;
            let mut list = XferDescList::new(kind).ok()?;
            for _ in 0..count {
                list.add_desc(r.usize()?, r.usize()?, r.u64()?);
            }
            r.done().then_some(list)
        };
        decode().ok_or(NixlError::FailedToCreateXferDlistHandle)
    }

    /// The list as nixl-rs's.
    pub(crate) fn to_rs(&self) -> Result<nixl::XferDescList, NixlError> {
        let kind = self.mem_type.require_kind()?;
        Ok(nixl::XferDescList::from_descs(
            kind,
            self.descriptors.iter().map(|d| nixl::Desc {
                addr: d.addr as u64,
                len: d.len as u64,
                dev_id: d.dev_id,
            }),
        ))
    }
}

list_common!(XferDescList, XferDescriptor);
