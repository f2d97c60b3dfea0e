//! Memory: nixl-sys's storage traits, the host storage nixl-rs owns, registration, and NIXL's
//! device API (memory views), which nixl-rs has not.
//!
//! Exception to the crate's `deny(unsafe_code)`: nixl-sys's API hands memory over as raw
//! pointers (`MemoryRegion::as_ptr` is an `unsafe fn`, the memory-view calls are `unsafe fn`s),
//! and registering a descriptor that nixl-rs does not own is nixl-sys's own contract
//! (`RawRegion`). Every `unsafe` of the crate is in this file.
#![allow(unsafe_code)]

use std::sync::Arc;

use crate::agent::hints;
use crate::{
    map_err, refuse, Agent, MemType, MemView, NixlError, OptArgs, RegistrationHandle,
    RemoteDescList, XferDescList,
};

/// A descriptor's address, as a number (nothing is dereferenced).
pub(crate) fn addr_of(d: &(impl MemoryRegion + ?Sized)) -> usize {
    // SAFETY: only the address is read, as a number; nothing is dereferenced.
    (unsafe { d.as_ptr() }) as usize
}

/// A trait for storage types that can be used with NIXL.
pub trait MemoryRegion: std::fmt::Debug + Send + Sync {
    /// Get a raw pointer to the storage
    ///
    /// # Safety
    /// The caller must ensure:
    /// - The pointer is not used after the storage is dropped
    /// - Access patterns respect the storage's thread safety model
    unsafe fn as_ptr(&self) -> *const u8;

    /// Returns the total size of the storage in bytes
    fn size(&self) -> usize;

    /// The nixl-rs region that owns these bytes, when the storage is one (as
    /// [`SystemStorage`] is): the agent then keeps the bytes alive while any request uses
    /// them. `None` (the default): the agent trusts [`MemoryRegion::as_ptr`] and
    /// [`MemoryRegion::size`] as nixl-sys does. An addition to nixl-sys's trait, with a
    /// default, so existing implementations compile unchanged.
    #[doc(hidden)]
    fn owned_region(&self) -> Option<Arc<dyn nixl::MemoryRegion>> {
        None
    }
}

/// A trait for types that can be added to NIXL descriptor lists.
pub trait NixlDescriptor: MemoryRegion {
    /// Get the memory type for this descriptor
    fn mem_type(&self) -> MemType;

    /// Get the device ID for this memory region
    fn device_id(&self) -> u64;
}

/// A trait for types that can be registered with NIXL.
pub trait NixlRegistration: NixlDescriptor {
    /// Registers the storage with `agent`, keeping the handle in the storage.
    fn register(&mut self, agent: &Agent, opt_args: Option<&OptArgs>) -> Result<(), NixlError>;
}

/// Host memory owned by nixl-rs: page-aligned, zeroed, kept alive by the agent while any
/// request uses it (nixl-sys's `Vec<u8>`-backed storage, without its use-after-free when the
/// storage is dropped under a transfer).
#[derive(Debug)]
pub struct SystemStorage {
    // Dropped first: deregistration, then the storage's own reference to the bytes.
    handle: Option<RegistrationHandle>,
    data: Option<Arc<nixl::HostBuffer>>,
    size: usize,
}

impl SystemStorage {
    /// Creates a new system storage with the given size (`BackendError` when the allocation
    /// fails).
    pub fn new(size: usize) -> Result<Self, NixlError> {
        let data = match size {
            0 => None,
            n => Some(Arc::new(nixl::HostBuffer::new(n).ok_or_else(|| {
                refuse(
                    nixl::ErrorKind::Backend,
                    format!("could not allocate {n} bytes of host memory"),
                    NixlError::BackendError,
                )
            })?)),
        };
        Ok(Self {
            handle: None,
            data,
            size,
        })
    }

    /// Fills the storage with a specific byte value.
    pub fn memset(&mut self, value: u8) {
        if let Some(d) = &self.data {
            d.fill(value);
        }
    }

    /// The bytes. As with nixl-sys, a peer may write them while a transfer is in flight:
    /// read them once the transfer that fills them is complete.
    pub fn as_slice(&self) -> &[u8] {
        match &self.data {
            // SAFETY: the buffer lives as long as `self` (the Arc), its bytes are initialised
            // (zeroed at allocation), and writes by transfers are the caller's to order, as
            // for nixl-sys's Vec-backed storage.
            Some(d) => unsafe { d.as_slice() },
            None => &[],
        }
    }
}

impl MemoryRegion for SystemStorage {
    fn size(&self) -> usize {
        self.size
    }

    unsafe fn as_ptr(&self) -> *const u8 {
        match &self.data {
            Some(d) => d.as_ptr(),
            None => std::ptr::NonNull::dangling().as_ptr(),
        }
    }

    fn owned_region(&self) -> Option<Arc<dyn nixl::MemoryRegion>> {
        self.data.clone().map(|d| d as Arc<dyn nixl::MemoryRegion>)
    }
}

impl NixlDescriptor for SystemStorage {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

impl NixlRegistration for SystemStorage {
    fn register(&mut self, agent: &Agent, opt_args: Option<&OptArgs>) -> Result<(), NixlError> {
        let handle = agent.register_memory(self, opt_args)?;
        self.handle = Some(handle);
        Ok(())
    }
}

impl Agent {
    /// Registers a memory descriptor with the agent (with the backends in `opt_args`, or
    /// every backend that takes its type). [`crate::SystemStorage`] is kept alive by the agent;
    /// any other descriptor's pointer and size are trusted, as nixl-sys does, until the handle
    /// deregisters.
    pub fn register_memory(
        &self,
        descriptor: &impl NixlDescriptor,
        opt_args: Option<&OptArgs>,
    ) -> Result<RegistrationHandle, NixlError> {
        let mem_type = descriptor.mem_type();
        let kind = mem_type.require_kind()?;
        let ptr = addr_of(descriptor);
        let (size, dev_id) = (descriptor.size(), descriptor.device_id());
        let region: Arc<dyn nixl::MemoryRegion> = match descriptor.owned_region() {
            Some(r) => r,
            None => {
                let desc = nixl::RegionDesc {
                    kind,
                    addr: ptr as u64,
                    len: size as u64,
                    dev_id,
                    meta: Vec::new(),
                };
                // SAFETY: nixl-sys's contract for `register_memory`, which this signature
                // keeps: the descriptor's bytes stay valid while the registration lives (the
                // caller drops the handle, or the storage holding it, before freeing them).
                Arc::new(unsafe { nixl::core::backend::RawRegion::new(desc) })
            }
        };
        let reg = self
            .inner
            .rs
            .register_mem(vec![region], &hints(opt_args))
            .map_err(map_err)?;
        self.inner.regs.lock().push(reg.clone());
        Ok(RegistrationHandle {
            agent: Some(self.clone()),
            reg: Some(reg),
            ptr,
            size,
            dev_id,
            mem_type,
        })
    }

    /// NIXL's device API (memory views for GPU-initiated transfers): nixl-rs has none, so
    /// this is `BackendError` ([`crate::last_error`]: `NotSupported`).
    ///
    /// # Safety
    ///
    /// nixl-sys's contract: the memory `descs` names outlives the view.
    pub unsafe fn prep_mem_view_local(
        &self,
        descs: &XferDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<MemView, NixlError> {
        let _ = (descs, opt_args);
        Err(refuse(
            nixl::ErrorKind::NotSupported,
            "device-side memory views (NIXL's device API) are not implemented by nixl-rs"
                .to_owned(),
            NixlError::BackendError,
        ))
    }

    /// NIXL's device API for remote memory: `NotFound` when no entry names a loaded agent,
    /// else `BackendError` (nixl-rs has no device API).
    ///
    /// # Safety
    ///
    /// nixl-sys's contract: the memory `descs` names outlives the view.
    pub unsafe fn prep_mem_view_remote(
        &self,
        descs: &RemoteDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<MemView, NixlError> {
        let _ = (opt_args, descs.mem_type);
        let loaded = self.inner.rs.remotes();
        let named: Vec<&String> = descs.descs.iter().filter_map(|d| d.3.as_ref()).collect();
        if named.is_empty() || named.iter().any(|n| !loaded.contains(n)) {
            return Err(refuse(
                nixl::ErrorKind::NotFound,
                "a remote memory view names no loaded agent".to_owned(),
                NixlError::NotFound,
            ));
        }
        Err(refuse(
            nixl::ErrorKind::NotSupported,
            "device-side memory views (NIXL's device API) are not implemented by nixl-rs"
                .to_owned(),
            NixlError::BackendError,
        ))
    }
}
