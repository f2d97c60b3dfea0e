//! Registration descriptor lists (NIXL's `nixl_reg_dlist_t`).

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use super::wire::{Reader, Writer};
use super::MemType;
use crate::{NixlDescriptor, NixlError};

/// A registration descriptor: address (or offset), length, device id and the kind's metadata
/// (a file path, an object key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegDescriptor {
    /// Address, or offset for storage kinds.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Device id (GPU ordinal, file descriptor, object index).
    pub dev_id: u64,
    /// The kind's extra bytes.
    pub metadata: Vec<u8>,
}

/// A list of registration descriptors of one memory type.
pub struct RegDescList<'a> {
    descriptors: Vec<RegDescriptor>,
    mem_type: MemType,
    _phantom: PhantomData<&'a dyn NixlDescriptor>,
}

impl<'a> RegDescList<'a> {
    /// An empty list of `mem_type`.
    pub fn new(mem_type: MemType) -> Result<Self, NixlError> {
        Ok(Self {
            descriptors: Vec::new(),
            mem_type,
            _phantom: PhantomData,
        })
    }

    /// Adds a descriptor.
    pub fn add_desc(&mut self, addr: usize, len: usize, dev_id: u64) {
        self.add_desc_with_meta(addr, len, dev_id, &[])
    }

    /// Adds a descriptor with metadata (a file path, an object key).
    pub fn add_desc_with_meta(&mut self, addr: usize, len: usize, dev_id: u64, metadata: &[u8]) {
        self.descriptors.push(RegDescriptor {
            addr,
            len,
            dev_id,
            metadata: metadata.to_vec(),
        });
    }

    /// Resizes the list, filling with empty descriptors.
    pub fn resize(&mut self, new_size: usize) {
        self.descriptors.resize(
            new_size,
            RegDescriptor {
                addr: 0,
                len: 0,
                dev_id: 0,
                metadata: Vec::new(),
            },
        );
    }

    /// Adds a storage object's region (`InvalidParam` for another memory type).
    pub fn add_storage_desc(&mut self, desc: &'a dyn NixlDescriptor) -> Result<(), NixlError> {
        self.storage_desc(desc)
    }

    /// The list in nixl-sys's byte form (bincode 1: the type, then each descriptor).
    pub fn serialize(&self) -> Result<Vec<u8>, NixlError> {
        let mut w = Writer::new(self.mem_type, self.descriptors.len());
        for d in &self.descriptors {
            w.desc(d.addr, d.len, d.dev_id);
            w.bytes(&d.metadata);
        }
        Ok(w.0)
    }

    /// A list from [`RegDescList::serialize`]'s bytes (`RegDescListCreationFailed` for bytes
    /// that are not one).
    pub fn deserialize(bytes: &[u8]) -> Result<Self, NixlError> {
        let decode = || {
            let (mut r, kind, count) = Reader::new(bytes, 32)?;
            let mut list = RegDescList::new(kind).ok()?;
            for _ in 0..count {
                let (addr, len, dev_id) = (r.usize()?, r.usize()?, r.u64()?);
                let meta = r.bytes()?;
                list.add_desc_with_meta(addr, len, dev_id, &meta);
            }
            r.done().then_some(list)
        };
        decode().ok_or(NixlError::RegDescListCreationFailed)
    }

    /// The descriptors as nixl-rs regions.
    pub(crate) fn regions(&self) -> Result<Vec<nixl::RegionDesc>, NixlError> {
        let kind = self.mem_type.require_kind()?;
        Ok(self
            .descriptors
            .iter()
            .map(|d| nixl::RegionDesc {
                kind,
                addr: d.addr as u64,
                len: d.len as u64,
                dev_id: d.dev_id,
                meta: d.metadata.clone(),
            })
            .collect())
    }
}

super::xfer::list_common!(RegDescList, RegDescriptor);
