//! Endpoints to peers: one per (peer, local worker), created from the peer's worker addresses
//! with UCX's peer error handling, so a dead peer fails its requests instead of hanging them.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nixl_core::{Error, Op, Result};

use crate::error::status_error;
use crate::sys;
use crate::worker::{Grave, Worker, WorkerGuard};

/// State the endpoint's error handler writes.
#[derive(Debug, Default)]
pub(crate) struct EpShared {
    failed: AtomicBool,
    status: AtomicI32,
}

impl EpShared {
    pub fn failed(&self) -> Option<sys::ucs_status_t> {
        self.failed
            .load(Ordering::Acquire)
            .then(|| self.status.load(Ordering::Acquire) as sys::ucs_status_t)
    }

    pub fn fail(&self, status: sys::ucs_status_t) {
        self.status.store(status as i32, Ordering::Release);
        self.failed.store(true, Ordering::Release);
    }
}

unsafe extern "C" fn ep_error(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: arg is an EpShared kept alive by the worker until after it is destroyed.
    let shared = unsafe { &*(arg as *const EpShared) };
    tracing::debug!(status, "UCX endpoint error");
    shared.fail(status);
}

/// One endpoint on one worker.
pub(crate) struct PeerEp {
    pub worker: Arc<Worker>,
    ep: sys::ucp_ep_h,
    pub shared: Arc<EpShared>,
    /// Set (under the worker lock) once the endpoint was closed early.
    closed: AtomicBool,
    /// Whether UCX detects this peer's failure (peer error handling mode).
    pub peer_failure: bool,
}

// SAFETY: the endpoint handle is only used under its worker's mutex.
unsafe impl Send for PeerEp {}
// SAFETY: as above.
unsafe impl Sync for PeerEp {}

impl PeerEp {
    /// The handle, if still open. Only call with the worker locked.
    pub fn raw(&self, _g: &WorkerGuard<'_>) -> Option<sys::ucp_ep_h> {
        (!self.closed.load(Ordering::Acquire)).then_some(self.ep)
    }

    /// Closes the endpoint now with `UCP_EP_CLOSE_FLAG_FORCE`: UCX completes every request
    /// on it (with an error) and no longer touches their memory. Requires the worker lock.
    pub fn force_close(&self, g: &mut WorkerGuard<'_>) -> bool {
        if self.closed.swap(true, Ordering::AcqRel) {
            return true;
        }
        if self.shared.failed().is_none() {
            self.shared.fail(sys::UCS_ERR_CANCELED);
        }
        g.close_ep(self.ep, true, Duration::from_secs(2))
    }
}

impl Drop for PeerEp {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            let force = self.shared.failed().is_some();
            self.worker.bury(Grave { ep: self.ep, force });
        }
    }
}

/// A connected peer: its name and one endpoint per local worker.
pub(crate) struct Peer {
    pub name: String,
    pub eps: Vec<PeerEp>,
    /// Per endpoint: the notification header of the session its hello opened
    /// (`crate::session::introduce`).
    pub headers: Vec<Arc<[u8]>>,
    /// The peer's worker address as checked by `crate::validate` (what its rkeys are
    /// checked against).
    pub address: Option<crate::validate::Address>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.name)
            .field("eps", &self.eps.len())
            .finish()
    }
}

impl Peer {
    /// Creates endpoints from every local worker to the peer's workers (round robin).
    pub fn connect(
        agent: &str,
        name: &str,
        workers: &[Arc<Worker>],
        addresses: &[Vec<u8>],
    ) -> Result<Self> {
        let mut eps = Vec::with_capacity(workers.len());
        for (i, w) in workers.iter().enumerate() {
            let addr = &addresses[i % addresses.len()];
            let shared = Arc::new(EpShared::default());
            // SAFETY: zeroed params with a field mask is the documented form.
            let mut p: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
            p.field_mask = (sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
            p.address = addr.as_ptr() as *const sys::ucp_address_t;
            p.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
            p.err_handler.cb = Some(ep_error);
            p.err_handler.arg = Arc::as_ptr(&shared) as *mut c_void;
            let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
            w.keep_handler_arg(shared.clone());
            let g = w.lock();
            // SAFETY: the worker is live and locked; the address bytes were framed by
            // wire::decode_conn and checked by validate::Shapes::check_address (UCX reads
            // exactly them), and outlive the call (UCX copies what it keeps); the handler
            // argument is kept alive by the worker (above).
            let mut st = unsafe { w.ctx.ucx.lib.ucp_ep_create(g.raw(), &p, &mut ep) };
            let mut peer_failure = true;
            if st == sys::UCS_ERR_UNREACHABLE {
                // The selected transports cannot detect peer failure (shared memory in UCX
                // builds without it): connect without, and say so in the path report.
                p.field_mask &= !((sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER)
                    as u64);
                p.err_mode = sys::UCP_ERR_HANDLING_MODE_NONE;
                // SAFETY: as above.
                st = unsafe { w.ctx.ucx.lib.ucp_ep_create(g.raw(), &p, &mut ep) };
                peer_failure = false;
                tracing::warn!(
                    agent,
                    remote = name,
                    "UCX transports cannot detect peer failure; endpoint created without it"
                );
            }
            drop(g);
            if st != sys::UCS_OK {
                return Err(status_error(
                    &w.ctx.ucx,
                    agent,
                    Some(name),
                    Op::LoadMetadata,
                    "ucp_ep_create",
                    st,
                ));
            }
            eps.push(PeerEp {
                worker: w.clone(),
                ep,
                shared,
                closed: AtomicBool::new(false),
                peer_failure,
            });
        }
        Ok(Peer {
            name: name.to_owned(),
            eps,
            headers: Vec::new(),
            address: None,
        })
    }

    /// Fails unless the endpoint on `worker` is usable.
    pub fn check_alive(&self, agent: &str, worker: usize, op: Op) -> Result<()> {
        let ep = self
            .eps
            .get(worker)
            .ok_or_else(|| Error::invalid(agent, op, "worker index out of range"))?;
        match ep.shared.failed() {
            None => Ok(()),
            Some(st) => Err(Error::disconnected(
                agent,
                &self.name,
                op,
                format!(
                    "UCX endpoint failed ({})",
                    ep.worker.ctx.ucx.status_string(st)
                ),
            )),
        }
    }

    /// Which transports the first endpoint uses.
    pub fn transports(&self) -> String {
        let Some(pe) = self.eps.first() else {
            return "no endpoint".to_owned();
        };
        let ucx = &pe.worker.ctx.ucx;
        let g = pe.worker.lock();
        let Some(ep) = pe.raw(&g) else {
            return "endpoint closed".to_owned();
        };
        let body = if ucx.has_ep_transports() {
            query_transports(&g, ep)
        } else {
            print_info(&g, ep)
        };
        let mut state = match pe.shared.failed() {
            Some(st) => format!(" [failed: {}]", ucx.status_string(st)),
            None => String::new(),
        };
        if !pe.peer_failure {
            state.push_str(" [no peer-failure detection]");
        }
        format!("UCX {}: {body}{state}", ucx.version_string())
    }
}

fn query_transports(g: &WorkerGuard<'_>, ep: sys::ucp_ep_h) -> String {
    let mut entries = [sys::TransportEntry {
        transport_name: std::ptr::null(),
        device_name: std::ptr::null(),
    }; 16];
    // SAFETY: a zeroed attribute struct is a valid "no fields" value.
    let mut attr: sys::EpAttrV114 = unsafe { std::mem::zeroed() };
    attr.field_mask = sys::UCP_EP_ATTR_FIELD_TRANSPORTS;
    attr.transports = sys::Transports {
        entries: entries.as_mut_ptr(),
        num_entries: entries.len() as u32,
        entry_size: std::mem::size_of::<sys::TransportEntry>(),
    };
    let lib = &g.worker().ctx.ucx.lib;
    // SAFETY: the endpoint is live under the locked worker; UCX >= 1.14 (checked by the
    // caller) reads the 1.14 layout of ucp_ep_attr_t and writes at most num_entries entries
    // of entry_size bytes into the array, which outlives the call.
    let st = unsafe {
        lib.ucp_ep_query(
            ep,
            &mut attr as *mut sys::EpAttrV114 as *mut sys::ucp_ep_attr_t,
        )
    };
    if st != sys::UCS_OK {
        return format!("ucp_ep_query failed ({st})");
    }
    let n = (attr.transports.num_entries as usize).min(entries.len());
    let mut parts: Vec<String> = entries[..n]
        .iter()
        .map(|e| {
            let s = |p: *const std::ffi::c_char| {
                if p.is_null() {
                    "?".to_owned()
                } else {
                    // SAFETY: UCX wrote NUL-terminated names valid while the endpoint lives.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            };
            format!("{}/{}", s(e.transport_name), s(e.device_name))
        })
        .collect();
    parts.dedup();
    parts.join(", ")
}

fn print_info(g: &WorkerGuard<'_>, ep: sys::ucp_ep_h) -> String {
    let mut buf: *mut std::ffi::c_char = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: both out-pointers are valid; the stream is closed below.
    let f = unsafe { sys::open_memstream(&mut buf, &mut size) };
    if f.is_null() {
        return "transports unknown (open_memstream failed)".to_owned();
    }
    // SAFETY: the endpoint is live under the locked worker; f is an open stream.
    unsafe { g.worker().ctx.ucx.lib.ucp_ep_print_info(ep, f as *mut _) };
    // SAFETY: f is open; closing it finalises buf/size.
    unsafe { sys::fclose(f) };
    if buf.is_null() {
        return "transports unknown".to_owned();
    }
    // SAFETY: buf holds `size` bytes written by the stream, NUL-terminated.
    let text = unsafe { CStr::from_ptr(buf) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: buf was allocated by open_memstream with malloc.
    unsafe { sys::free(buf as *mut c_void) };
    let mut lanes: Vec<String> = text
        .lines()
        .filter(|l| l.contains("lane["))
        .map(|l| l.trim().trim_start_matches('#').trim().to_owned())
        .collect();
    lanes.dedup();
    if lanes.is_empty() {
        text.trim().to_owned()
    } else {
        lanes.join("; ")
    }
}
