//! Safe wrappers over the UCP context and its memory registrations (context-level objects:
//! the context is created with `mt_workers_shared`, so UCX serialises these calls itself).

use core::ffi::{c_void, CStr};
use std::ffi::CString;
use std::sync::Arc;

use super::*;
use crate::loader::Ucx;

/// A live `ucp_context_h`, cleaned up on drop.
pub(crate) struct ContextH {
    raw: ucp_context_h,
    ucx: Arc<Ucx>,
}

// SAFETY: the context is created with `mt_workers_shared = 1`, which makes UCX guard its
// context-level operations (mem_map, mem_unmap, rkey_pack) for use from several threads.
unsafe impl Send for ContextH {}
// SAFETY: as above.
unsafe impl Sync for ContextH {}

/// A `ucp_mem_h` mapped by [`ContextH::mem_map`]; its owner unmaps it once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemH(pub(super) ucp_mem_h);

// SAFETY: memory handles are context-level objects, which UCX guards (`mt_workers_shared`).
unsafe impl Send for MemH {}
// SAFETY: as above.
unsafe impl Sync for MemH {}

/// A `ucp_config_t` read from the environment, released on drop.
pub(crate) struct Config<'a> {
    raw: *mut ucp_config_t,
    lib: &'a UcxLib,
}

impl<'a> Config<'a> {
    /// `ucp_config_read` with the default prefix and file.
    pub(crate) fn read(lib: &'a UcxLib) -> Result<Self, ucs_status_t> {
        let mut cfg: *mut ucp_config_t = std::ptr::null_mut();
        // SAFETY: NULL env prefix and file name select the defaults; cfg is a valid out-pointer.
        let st = unsafe { lib.ucp_config_read(std::ptr::null(), std::ptr::null(), &mut cfg) };
        if st == UCS_OK {
            Ok(Config { raw: cfg, lib })
        } else {
            Err(st)
        }
    }

    /// `ucp_config_modify`.
    pub(crate) fn modify(&mut self, name: &CStr, value: &CStr) -> ucs_status_t {
        // SAFETY: the config is live; both strings are NUL-terminated and outlive the call.
        unsafe {
            self.lib
                .ucp_config_modify(self.raw, name.as_ptr(), value.as_ptr())
        }
    }
}

impl Drop for Config<'_> {
    fn drop(&mut self) {
        // SAFETY: the config came from ucp_config_read and is released once.
        unsafe { self.lib.ucp_config_release(self.raw) }
    }
}

impl ContextH {
    /// `ucp_init` with `features`, `mt_workers_shared` and the name `name`.
    pub(crate) fn init(
        ucx: &Arc<Ucx>,
        cfg: &Config<'_>,
        features: u64,
        name: &CString,
    ) -> Result<Self, ucs_status_t> {
        // SAFETY: ucp_params_t is a plain C struct; all-zero is a valid "no fields" value.
        let mut params: ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = (UCP_PARAM_FIELD_FEATURES
            | UCP_PARAM_FIELD_MT_WORKERS_SHARED
            | UCP_PARAM_FIELD_NAME) as u64;
        params.features = features;
        params.mt_workers_shared = 1;
        params.name = name.as_ptr();
        let mut raw: ucp_context_h = std::ptr::null_mut();
        // SAFETY: params and cfg are valid for the call; the API version is the one the
        // bindings were generated from, which every newer UCX accepts.
        let st = unsafe {
            ucx.lib
                .ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, cfg.raw, &mut raw)
        };
        if st == UCS_OK {
            Ok(ContextH {
                raw,
                ucx: ucx.clone(),
            })
        } else {
            Err(st)
        }
    }

    /// The raw handle, for the other wrappers of this module tree.
    pub(super) fn raw(&self) -> ucp_context_h {
        self.raw
    }

    /// The memory types the context can register (`ucp_context_query`).
    pub(crate) fn memory_types(&self) -> Result<u64, ucs_status_t> {
        // SAFETY: zeroed attr with a field mask is the documented query form.
        let mut attr: ucp_context_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES as u64;
        // SAFETY: the context is live; attr is a valid out-struct.
        let st = unsafe { self.ucx.lib.ucp_context_query(self.raw, &mut attr) };
        if st == UCS_OK {
            Ok(attr.memory_types)
        } else {
            Err(st)
        }
    }

    /// `ucp_mem_map` of `len` bytes at `addr` of memory type `mt`.
    ///
    /// The memory must stay valid until [`ContextH::mem_unmap`] (the `MemoryRegion`
    /// contract, upheld by the agent for a registered region).
    pub(crate) fn mem_map(
        &self,
        addr: u64,
        len: u64,
        mt: ucs_memory_type_t,
    ) -> Result<MemH, ucs_status_t> {
        // SAFETY: zeroed params with a field mask is the documented form.
        let mut p: ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = (UCP_MEM_MAP_PARAM_FIELD_ADDRESS
            | UCP_MEM_MAP_PARAM_FIELD_LENGTH
            | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) as u64;
        p.address = addr as *mut c_void;
        p.length = len as usize;
        p.memory_type = mt;
        let mut memh: ucp_mem_h = std::ptr::null_mut();
        // SAFETY: the context is live; the region's memory is valid for its length for as
        // long as the registration lives (this function's contract).
        let st = unsafe { self.ucx.lib.ucp_mem_map(self.raw, &p, &mut memh) };
        if st == UCS_OK {
            Ok(MemH(memh))
        } else {
            Err(st)
        }
    }

    /// A copy of the packed remote key of a mapping.
    pub(crate) fn rkey_pack(&self, memh: MemH) -> Result<Vec<u8>, ucs_status_t> {
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: memh is a live mapping of this context; both out-pointers are valid.
        let st = unsafe {
            self.ucx
                .lib
                .ucp_rkey_pack(self.raw, memh.0, &mut buf, &mut size)
        };
        if st != UCS_OK {
            return Err(st);
        }
        // SAFETY: UCX returned `size` readable bytes at buf.
        let packed = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: buf came from ucp_rkey_pack and is released once.
        unsafe { self.ucx.lib.ucp_rkey_buffer_release(buf) };
        Ok(packed)
    }

    /// `ucp_mem_unmap`; the handle is never used again (its owner unmaps once).
    pub(crate) fn mem_unmap(&self, memh: MemH) -> ucs_status_t {
        // SAFETY: memh is a live mapping of this context, unmapped once by its owner.
        unsafe { self.ucx.lib.ucp_mem_unmap(self.raw, memh.0) }
    }
}

impl Drop for ContextH {
    fn drop(&mut self) {
        // SAFETY: the last owner; every worker and memory handle keeps the owning context
        // alive, so none is alive any more.
        unsafe { self.ucx.lib.ucp_cleanup(self.raw) };
    }
}
