//! The UCP context: one per backend, created with RMA, active messages and wake-up.

use std::ffi::CString;
use std::sync::Arc;

use nixl_core::{Error, Op, Result};

use crate::error::status_error;
use crate::loader::Ucx;
use crate::sys;

/// An owned `ucp_context_h`.
pub(crate) struct Context {
    /// Declared first: dropped (`ucp_cleanup`) before the library reference below.
    raw: sys::ContextH,
    pub ucx: Arc<Ucx>,
    /// Bit mask of `ucs_memory_type_t` the context can register.
    pub memory_types: u64,
    /// Created with `UCP_FEATURE_WAKEUP` (workers have event descriptors).
    pub wakeup: bool,
}

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
    pub(crate) fn new(
        ucx: Arc<Ucx>,
        agent: &str,
        config: &[(String, String)],
        nixl_features: bool,
        wakeup: bool,
    ) -> Result<Arc<Self>> {
        let fail = |call, st| status_error(&ucx, agent, None, Op::CreateBackend, call, st);
        let mut cfg = sys::Config::read(&ucx.lib).map_err(|st| fail("ucp_config_read", st))?;
        for (k, v) in config {
            let ck = cstring(agent, "a UCX option name", k)?;
            let cv = cstring(agent, "a UCX option value", v)?;
            let st = cfg.modify(&ck, &cv);
            if st != sys::UCS_OK {
                return Err(Error::invalid(
                    agent,
                    Op::CreateBackend,
                    format!("UCX option {k}={v}: {}", ucx.status_string(st)),
                ));
            }
        }
        let name = cstring(agent, "the agent name", agent)?;
        let mut features = (sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AM) as u64;
        if wakeup {
            features |= sys::UCP_FEATURE_WAKEUP as u64;
        }
        if nixl_features {
            features |= (sys::UCP_FEATURE_AMO32 | sys::UCP_FEATURE_AMO64) as u64;
        }
        let raw = sys::ContextH::init(&ucx, &cfg, features, &name);
        drop(cfg);
        let raw = raw.map_err(|st| fail("ucp_init", st))?;
        let memory_types = raw.memory_types().unwrap_or(1 << sys::UCS_MEMORY_TYPE_HOST);
        Ok(Arc::new(Context {
            ucx,
            raw,
            memory_types,
            wakeup,
        }))
    }

    /// The context handle.
    pub(crate) fn raw(&self) -> &sys::ContextH {
        &self.raw
    }

    /// Whether the context registers CUDA device memory.
    pub(crate) fn cuda_aware(&self) -> bool {
        self.memory_types & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0
    }
}
