//! The safe wrappers over libfabric objects: each raw handle is owned by one type that closes it
//! on drop, and a child keeps its parent alive (an endpoint holds its domain, CQ and AV).
//!
//! Domains are opened with `FI_THREAD_SAFE`, so objects may be used and closed from any
//! thread; the backend still serialises the data path of an endpoint under one lock.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use super::info::{cstr, Info};
use crate::result::{check, FiError};
use crate::sys::{self, ops, Lib};

fn close(call: &'static str, fid: *mut sys::fid) {
    // SAFETY: called once from the owner's Drop with the live fid it opened.
    let ret = unsafe { ops::fi_close(fid) };
    if let Err(e) = check(call, ret) {
        tracing::warn!(error = %e, "closing a libfabric object failed");
    }
}

macro_rules! owned {
    ($(#[$m:meta])* $name:ident, $raw:ty, $($parent:ident: $pty:ty),*) => {
        $(#[$m])*
        pub(crate) struct $name {
            ptr: *mut $raw,
            $($parent: $pty,)*
        }
        // SAFETY: the domain was opened with FI_THREAD_SAFE, so this object may be used and
        // closed from any thread.
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: every fid class starts with `struct fid`.
                close(concat!("fi_close(", stringify!($name), ")"), self.ptr as *mut sys::fid);
            }
        }
    };
}

owned!(
    /// An open fabric.
    Fabric, sys::fid_fabric,
);
owned!(
    /// An open domain (one NIC or one software provider instance).
    Domain, sys::fid_domain, _fabric: Arc<Fabric>
);
owned!(
    /// A completion queue.
    Cq, sys::fid_cq, _domain: Arc<Domain>
);
owned!(
    /// An address vector.
    Av, sys::fid_av, _domain: Arc<Domain>
);
owned!(
    /// A memory registration.
    Mr, sys::fid_mr, _domain: Arc<Domain>
);

impl Fabric {
    /// Opens the fabric of an info entry.
    pub fn open(lib: &'static Lib, info: &Info) -> Result<Arc<Fabric>, FiError> {
        let mut p = ptr::null_mut();
        // SAFETY: the info is live; `p` receives the new fabric.
        let ret = unsafe { (lib.fi_fabric)(info.first().fabric_attr, &mut p, ptr::null_mut()) };
        check("fi_fabric", ret as isize)?;
        Ok(Arc::new(Fabric { ptr: p }))
    }
}

impl Domain {
    /// Opens a domain of the fabric.
    pub fn open(fabric: &Arc<Fabric>, info: &Info) -> Result<Arc<Domain>, FiError> {
        let mut p = ptr::null_mut();
        // SAFETY: live fabric and info; `p` receives the domain.
        check("fi_domain", unsafe {
            ops::fi_domain(fabric.ptr, info.as_ptr(), &mut p, ptr::null_mut())
        })?;
        Ok(Arc::new(Domain {
            ptr: p,
            _fabric: fabric.clone(),
        }))
    }
}

impl Cq {
    /// Opens a CQ of `FI_CQ_FORMAT_MSG` entries, with a wait object (for [`Cq::sread`]) or
    /// polled only.
    pub fn open(domain: &Arc<Domain>, size: usize, wait: bool) -> Result<Arc<Cq>, FiError> {
        // SAFETY: fi_cq_attr is plain data; all-zero is its documented default.
        let mut attr: sys::fi_cq_attr = unsafe { std::mem::zeroed() };
        attr.size = size;
        attr.format = sys::FI_CQ_FORMAT_MSG;
        // Only fd waits: libfabric 1.17's yield-based waits (shm) ignore the sread timeout.
        attr.wait_obj = if wait {
            sys::FI_WAIT_FD
        } else {
            sys::FI_WAIT_NONE
        };
        let mut p = ptr::null_mut();
        // SAFETY: live domain and attributes; `p` receives the CQ.
        check("fi_cq_open", unsafe {
            ops::fi_cq_open(domain.ptr, &mut attr, &mut p, ptr::null_mut())
        })?;
        Ok(Arc::new(Cq {
            ptr: p,
            _domain: domain.clone(),
        }))
    }

    /// Reads up to `out.len()` completions; `Ok(0)` when none.
    pub fn read(&self, out: &mut [sys::fi_cq_msg_entry]) -> Result<usize, FiError> {
        // SAFETY: live CQ of FI_CQ_FORMAT_MSG; `out` has room for `out.len()` entries.
        let ret = unsafe { ops::fi_cq_read(self.ptr, out.as_mut_ptr() as *mut c_void, out.len()) };
        match check("fi_cq_read", ret) {
            Ok(n) => Ok(n),
            Err(e) if e.is_again() => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Waits up to `timeout_ms` for completions (CQs opened with a wait object); `Ok(0)` on
    /// timeout. An error completion shows as `FI_EAVAIL`.
    pub fn sread(
        &self,
        out: &mut [sys::fi_cq_msg_entry],
        timeout_ms: i32,
    ) -> Result<usize, FiError> {
        // SAFETY: live CQ of FI_CQ_FORMAT_MSG with a wait object; room for `out.len()` entries.
        let ret = unsafe {
            ops::fi_cq_sread(
                self.ptr,
                out.as_mut_ptr() as *mut c_void,
                out.len(),
                timeout_ms,
            )
        };
        match check("fi_cq_sread", ret) {
            Ok(n) => Ok(n),
            Err(e) if e.is_again() || e.code == sys::FI_ETIMEDOUT || e.code == sys::FI_EINTR => {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads one error completion: its operation context and the error.
    pub fn read_error(&self) -> Result<Option<(*mut c_void, FiError)>, FiError> {
        // SAFETY: plain data; zero means "provider supplies err_data".
        let mut entry: sys::fi_cq_err_entry = unsafe { std::mem::zeroed() };
        // SAFETY: live CQ and one entry.
        let ret = unsafe { ops::fi_cq_readerr(self.ptr, &mut entry, 0) };
        match check("fi_cq_readerr", ret) {
            Ok(0) => Ok(None),
            Ok(_) => {
                let mut buf = [0 as std::ffi::c_char; 256];
                // SAFETY: live CQ; err_data is the provider's, valid until the next CQ read.
                let s = unsafe {
                    ops::fi_cq_strerror(
                        self.ptr,
                        entry.prov_errno,
                        entry.err_data,
                        buf.as_mut_ptr(),
                        buf.len(),
                    )
                };
                let detail = cstr(s);
                let code = u32::try_from(entry.err).unwrap_or(sys::FI_EOTHER);
                Ok(Some((
                    entry.op_context,
                    FiError::new("completion", code).with_detail(&detail),
                )))
            }
            Err(e) if e.is_again() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Av {
    /// Opens a table-type address vector.
    pub fn open(domain: &Arc<Domain>) -> Result<Arc<Av>, FiError> {
        // SAFETY: plain data; all-zero is the default.
        let mut attr: sys::fi_av_attr = unsafe { std::mem::zeroed() };
        attr.type_ = sys::FI_AV_TABLE;
        let mut p = ptr::null_mut();
        // SAFETY: live domain and attributes; `p` receives the AV.
        check("fi_av_open", unsafe {
            ops::fi_av_open(domain.ptr, &mut attr, &mut p, ptr::null_mut())
        })?;
        Ok(Arc::new(Av {
            ptr: p,
            _domain: domain.clone(),
        }))
    }

    /// Inserts one endpoint name; returns its `fi_addr_t`.
    pub fn insert(&self, name: &[u8]) -> Result<sys::fi_addr_t, FiError> {
        let mut out = sys::FI_ADDR_UNSPEC;
        // SAFETY: live AV; `name` is one address in the provider's format (checked by the
        // provider), `out` one slot.
        let n = check("fi_av_insert", unsafe {
            ops::fi_av_insert(
                self.ptr,
                name.as_ptr() as *const c_void,
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        })?;
        if n != 1 || out == sys::FI_ADDR_UNSPEC {
            return Err(FiError::new("fi_av_insert", sys::FI_EADDRNOTAVAIL));
        }
        Ok(out)
    }

    /// Removes an address inserted earlier.
    pub fn remove(&self, addr: sys::fi_addr_t) -> Result<(), FiError> {
        let mut a = addr;
        // SAFETY: live AV; `a` was returned by `insert` on it.
        check("fi_av_remove", unsafe {
            ops::fi_av_remove(self.ptr, &mut a, 1, 0)
        })
        .map(|_| ())
    }
}

impl Mr {
    /// Registers `[addr, addr+len)` (host memory, or device memory through `hmem`).
    ///
    /// The memory must stay valid for as long as the registration is used by any operation:
    /// a region registered through the agent (`MemoryRegion`'s contract), or a buffer that
    /// lives in the endpoint's state ([`super::post::MsgPool`]). Registering touches no
    /// memory; operations are posted only on ranges checked against a registration.
    pub fn register(
        domain: &Arc<Domain>,
        addr: u64,
        len: u64,
        access: u64,
        requested_key: u64,
        hmem: Option<(u32, i32)>,
    ) -> Result<Mr, FiError> {
        let mut p = ptr::null_mut();
        let len = usize::try_from(len).map_err(|_| FiError::new("fi_mr_reg", sys::FI_EINVAL))?;
        let ret = match hmem {
            None => {
                // SAFETY: live domain; registering reads no memory, and the caller keeps it valid
                // while operations use it (see above).
                unsafe {
                    ops::fi_mr_reg(
                        domain.ptr,
                        addr as *const c_void,
                        len,
                        access,
                        0,
                        requested_key,
                        0,
                        &mut p,
                        ptr::null_mut(),
                    )
                }
            }
            Some((iface, device)) => {
                let iov = sys::iovec {
                    iov_base: addr as *mut c_void,
                    iov_len: len,
                };
                // SAFETY: plain data; all-zero is the default.
                let mut attr: sys::fi_mr_attr = unsafe { std::mem::zeroed() };
                attr.mr_iov = &iov;
                attr.iov_count = 1;
                attr.access = access;
                attr.requested_key = requested_key;
                attr.iface = iface;
                attr.device.cuda = device;
                // SAFETY: live domain; `iov` outlives the call; the caller keeps the memory valid
                // while operations use it (see above).
                unsafe { ops::fi_mr_regattr(domain.ptr, &attr, 0, &mut p) }
            }
        };
        check("fi_mr_reg", ret)?;
        Ok(Mr {
            ptr: p,
            _domain: domain.clone(),
        })
    }

    /// The remote key (`fi_mr_key`).
    pub fn key(&self) -> u64 {
        // SAFETY: live MR; `key` is set by the provider at registration.
        unsafe { (*self.ptr).key }
    }

    /// Binds to an endpoint of the same domain and enables it (`FI_MR_ENDPOINT` providers).
    pub fn bind<T>(&self, ep: &Endpoint<T>) -> Result<(), FiError> {
        // SAFETY: live MR and endpoint (both borrowed).
        check("fi_mr_bind", unsafe {
            ops::fi_mr_bind(self.ptr, ep.ptr as *mut sys::fid, 0)
        })?;
        // SAFETY: live MR.
        check("fi_mr_enable", unsafe { ops::fi_mr_enable(self.ptr) }).map(|_| ())
    }

    /// The local descriptor (`fi_mr_desc`), as an address.
    pub fn desc(&self) -> usize {
        // SAFETY: live MR; `mem_desc` is set by the provider at registration.
        unsafe { (*self.ptr).mem_desc as usize }
    }
}

/// An endpoint bound to a CQ and an AV. It owns `T`, state that must outlive the provider's
/// use of it (posted buffers and operation contexts): `T` is dropped only after the endpoint is
/// closed, when the provider can no longer write into it.
pub(crate) struct Endpoint<T = ()> {
    ptr: *mut sys::fid_ep,
    /// State the provider may reference while the endpoint is open.
    state: std::mem::ManuallyDrop<T>,
    _cq: Arc<Cq>,
    _av: Arc<Av>,
    _domain: Arc<Domain>,
}

// SAFETY: the domain is FI_THREAD_SAFE; `T` is only reached through `state`, which requires
// `T: Send`/`Sync` like any field.
unsafe impl<T: Send> Send for Endpoint<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Endpoint<T> {}

impl<T> Endpoint<T> {
    /// Opens an RDM endpoint, binds the CQ (transmit + receive) and AV, and enables it.
    pub fn open(
        domain: &Arc<Domain>,
        info: &Info,
        cq: &Arc<Cq>,
        av: &Arc<Av>,
        state: T,
    ) -> Result<Endpoint<T>, FiError> {
        let mut p = ptr::null_mut();
        // SAFETY: live domain and info; `p` receives the endpoint.
        check("fi_endpoint", unsafe {
            ops::fi_endpoint(domain.ptr, info.as_ptr(), &mut p, ptr::null_mut())
        })?;
        let ep = Endpoint {
            ptr: p,
            state: std::mem::ManuallyDrop::new(state),
            _cq: cq.clone(),
            _av: av.clone(),
            _domain: domain.clone(),
        };
        // SAFETY: live endpoint and AV/CQ of the same domain.
        check("fi_ep_bind(av)", unsafe {
            ops::fi_ep_bind(p, av.ptr as *mut sys::fid, 0)
        })?;
        // SAFETY: as above.
        check("fi_ep_bind(cq)", unsafe {
            ops::fi_ep_bind(
                p,
                cq.ptr as *mut sys::fid,
                u64::from(sys::FI_TRANSMIT) | u64::from(sys::FI_RECV),
            )
        })?;
        // SAFETY: live, bound endpoint.
        check("fi_enable", unsafe { ops::fi_enable(p) })?;
        Ok(ep)
    }

    /// The state the provider may reference while the endpoint is open.
    pub(super) fn state(&self) -> &T {
        &self.state
    }

    /// The endpoint's address (`fi_getname`).
    pub fn name(&self) -> Result<Vec<u8>, FiError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: live endpoint; `buf` holds `len` bytes.
        let ret = unsafe { ops::fi_getname(self.ptr, buf.as_mut_ptr() as *mut c_void, &mut len) };
        if ret == -(sys::FI_ETOOSMALL as isize) && len > buf.len() {
            buf.resize(len, 0);
            // SAFETY: as above, with the size the provider asked for.
            check("fi_getname", unsafe {
                ops::fi_getname(self.ptr, buf.as_mut_ptr() as *mut c_void, &mut len)
            })?;
        } else {
            check("fi_getname", ret)?;
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// The raw handle, for the posting wrappers (`super::post`).
    pub(super) fn as_ptr(&self) -> *mut sys::fid_ep {
        self.ptr
    }
}

impl<T> Drop for Endpoint<T> {
    fn drop(&mut self) {
        close("fi_close(Endpoint)", self.ptr as *mut sys::fid);
        // SAFETY: dropped once, here, after the endpoint is closed (the provider no longer
        // touches buffers or contexts posted on it).
        unsafe { std::mem::ManuallyDrop::drop(&mut self.state) };
    }
}
