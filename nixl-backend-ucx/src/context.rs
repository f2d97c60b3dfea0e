//! The UCP context: one per backend, created with RMA, active messages and wake-up.

use std::ffi::CString;
use std::sync::Arc;

use nixl_core::{Error, Op, Result};

use crate::error::check;
use crate::loader::Ucx;
use crate::sys;

/// An owned `ucp_context_h`.
pub(crate) struct Context {
    pub ucx: Arc<Ucx>,
    raw: sys::ucp_context_h,
    /// Bit mask of `ucs_memory_type_t` the context can register.
    pub memory_types: u64,
    /// Created with `UCP_FEATURE_WAKEUP` (workers have event descriptors).
    pub wakeup: bool,
}

// SAFETY: the context is created with `mt_workers_shared = 1`, which makes UCX guard its
// context-level operations (mem_map, mem_unmap, rkey_pack) for use from several threads.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ucx", &self.ucx)
            .field("memory_types", &self.memory_types)
            .finish()
    }
}

fn cstring(agent: &str, what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| {
        Error::invalid(
            agent,
            Op::CreateBackend,
            format!("{what} contains a NUL byte"),
        )
    })
}

impl Context {
    /// Reads UCX's configuration, applies `config` (`("TLS", "tcp")`, ...) and creates the
    /// context.
    /// With `nixl_features`, the context asks for NIXL's features (adds 32- and 64-bit
    /// atomics). As NIXL's UCX plugin does, it asks for wake-up only when a progress thread
    /// sleeps on the workers' event descriptors (`wakeup`). Unlike NIXL with one worker, it
    /// always asks for a thread-safe context (`mt_workers_shared`): registration runs on the
    /// application's threads beside progress, and that lock is not on the put/get path.
    pub fn new(
        ucx: Arc<Ucx>,
        agent: &str,
        config: &[(String, String)],
        nixl_features: bool,
        wakeup: bool,
    ) -> Result<Arc<Self>> {
        let mut cfg: *mut sys::ucp_config_t = std::ptr::null_mut();
        // SAFETY: NULL env prefix and file name select the defaults; cfg is a valid out-pointer.
        let st = unsafe {
            ucx.lib
                .ucp_config_read(std::ptr::null(), std::ptr::null(), &mut cfg)
        };
        check(&ucx, agent, Op::CreateBackend, "ucp_config_read", st)?;
        let release = |cfg| {
            // SAFETY: cfg came from ucp_config_read and is released exactly once.
            unsafe { ucx.lib.ucp_config_release(cfg) }
        };
        for (k, v) in config {
            let (ck, cv) = match (
                cstring(agent, "a UCX option name", k),
                cstring(agent, "a UCX option value", v),
            ) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    release(cfg);
                    return Err(e);
                }
            };
            // SAFETY: cfg is live; both strings are NUL-terminated and outlive the call.
            let st = unsafe { ucx.lib.ucp_config_modify(cfg, ck.as_ptr(), cv.as_ptr()) };
            if st != sys::UCS_OK {
                release(cfg);
                return Err(Error::invalid(
                    agent,
                    Op::CreateBackend,
                    format!("UCX option {k}={v}: {}", ucx.status_string(st)),
                ));
            }
        }
        let name = cstring(agent, "the agent name", agent)?;
        // SAFETY: ucp_params_t is a plain C struct; all-zero is a valid "no fields" value.
        let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = (sys::UCP_PARAM_FIELD_FEATURES
            | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED
            | sys::UCP_PARAM_FIELD_NAME) as u64;
        params.features = (sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AM) as u64;
        if wakeup {
            params.features |= sys::UCP_FEATURE_WAKEUP as u64;
        }
        if nixl_features {
            params.features |= (sys::UCP_FEATURE_AMO32 | sys::UCP_FEATURE_AMO64) as u64;
        }
        params.mt_workers_shared = 1;
        params.name = name.as_ptr();
        let mut raw: sys::ucp_context_h = std::ptr::null_mut();
        // SAFETY: params and cfg are valid for the call; the API version is the one the
        // bindings were generated from, which every newer UCX accepts.
        let st = unsafe {
            ucx.lib.ucp_init_version(
                sys::UCP_API_MAJOR,
                sys::UCP_API_MINOR,
                &params,
                cfg,
                &mut raw,
            )
        };
        release(cfg);
        check(&ucx, agent, Op::CreateBackend, "ucp_init", st)?;
        // SAFETY: zeroed attr with a field mask is the documented query form.
        let mut attr: sys::ucp_context_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_ATTR_FIELD_MEMORY_TYPES as u64;
        // SAFETY: raw is a live context; attr is a valid out-struct.
        let st = unsafe { ucx.lib.ucp_context_query(raw, &mut attr) };
        let memory_types = if st == sys::UCS_OK {
            attr.memory_types
        } else {
            1 << sys::UCS_MEMORY_TYPE_HOST
        };
        Ok(Arc::new(Context {
            ucx,
            raw,
            memory_types,
            wakeup,
        }))
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::ucp_context_h {
        self.raw
    }

    /// Whether the context registers CUDA device memory.
    pub fn cuda_aware(&self) -> bool {
        self.memory_types & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the last owner; every worker and memory handle holds an Arc of this
        // context, so none is alive any more.
        unsafe { self.ucx.lib.ucp_cleanup(self.raw) };
    }
}
