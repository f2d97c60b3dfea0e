//! Operations posted on an endpoint. Their contexts ([`OpCtx`], in an [`Inflight`] table) and
//! message buffers ([`MsgPool`]) live in the endpoint's own state, which [`Endpoint`] drops only
//! after closing the endpoint: the posting methods reach them only through the endpoint's
//! lock ([`EpGuard`]), so nothing the provider may still touch can be freed early.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

use super::fabric::{Domain, Endpoint, Mr};
use crate::result::{check, FiError};
use crate::sys::{self, ops};

/// A posted operation's context. `fi` must stay the first field: its address is what the
/// provider hands back in the completion (providers that need `FI_CONTEXT`/`FI_CONTEXT2`
/// space get it).
#[repr(C)]
struct OpCtx<K> {
    fi: sys::fi_context2,
    kind: K,
}

// SAFETY: `fi` is scratch space owned by the provider while the operation is in flight and
// only touched by libfabric calls made under the endpoint's lock; `kind` is Send.
unsafe impl<K: Send> Send for OpCtx<K> {}

/// The contexts of operations in flight, by address.
pub(crate) struct Inflight<K>(HashMap<usize, Box<OpCtx<K>>>);

impl<K> Default for Inflight<K> {
    fn default() -> Self {
        Inflight(HashMap::new())
    }
}

impl<K> Inflight<K> {
    /// Takes back the context a completion names (its `op_context`), if it is one of ours.
    fn remove(&mut self, ctx: *mut c_void) -> Option<K> {
        self.0.remove(&(ctx as usize)).map(|c| c.kind)
    }

    /// Boxes a context for `kind`; returns it and the address the provider is given.
    fn boxed(kind: K) -> (Box<OpCtx<K>>, *mut c_void) {
        let mut ctx = Box::new(OpCtx {
            fi: sys::fi_context2 {
                internal: [std::ptr::null_mut(); 8],
            },
            kind,
        });
        let p = &mut *ctx as *mut OpCtx<K> as *mut c_void;
        (ctx, p)
    }
}

/// Buffers for messages (sent from and received into), in fixed-size slots, registered once.
pub(crate) struct MsgPool {
    buf: Vec<u8>,
    slot_size: usize,
    mr: Option<Mr>,
}

impl MsgPool {
    /// `slots` (at least one) slots of `slot_size` bytes.
    pub fn new(slots: usize, slot_size: usize) -> MsgPool {
        MsgPool {
            buf: vec![0u8; slots.max(1) * slot_size],
            slot_size,
            mr: None,
        }
    }

    /// Registers the buffer on `domain` (kept until the pool is dropped); returns the
    /// registration (to bind it where the provider needs that).
    fn register(&mut self, domain: &Arc<Domain>, access: u64, key: u64) -> Result<&Mr, FiError> {
        // The buffer lives in the endpoint's state, which is dropped only after the endpoint
        // (and so every operation using the registration) is closed; the Mr is dropped with it.
        let mr = Mr::register(
            domain,
            self.buf.as_ptr() as u64,
            self.buf.len() as u64,
            access,
            key,
            None,
        )?;
        Ok(self.mr.insert(mr))
    }

    /// The first `len` bytes (at most a slot) of slot `slot`; empty for a slot out of range.
    fn received(&self, slot: usize, len: usize) -> &[u8] {
        let start = slot.saturating_mul(self.slot_size);
        self.buf
            .get(start..start.saturating_add(len.min(self.slot_size)))
            .unwrap_or(&[])
    }

    fn slot(&self, slot: usize, call: &'static str) -> Result<Range<usize>, FiError> {
        let start = slot
            .checked_mul(self.slot_size)
            .filter(|s| s.saturating_add(self.slot_size) <= self.buf.len())
            .ok_or_else(|| FiError::new(call, sys::FI_EINVAL))?;
        Ok(start..start + self.slot_size)
    }

    fn desc(&self) -> *mut c_void {
        self.mr
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| m.desc() as *mut c_void)
    }
}

/// The state of an endpoint that operations are posted with: its in-flight table and its
/// receive and send pools (reachable only through [`EpGuard`]'s methods, so they can neither
/// be replaced nor freed while the endpoint is open), and the owner's own data `X`.
pub(crate) struct EpState<K, X> {
    inflight: Inflight<K>,
    recv: MsgPool,
    send: MsgPool,
    extra: X,
}

impl<K, X> EpState<K, X> {
    /// A state with these pools.
    pub fn new(recv: MsgPool, send: MsgPool, extra: X) -> Self {
        EpState {
            inflight: Inflight::default(),
            recv,
            send,
            extra,
        }
    }
}

/// One RMA operation of [`EpGuard::post_rma`].
pub(crate) struct Rma {
    /// Write (`fi_write`) or read (`fi_read`).
    pub write: bool,
    /// Local address.
    pub local: u64,
    /// Length in bytes.
    pub len: u64,
    /// The local registration's descriptor.
    pub desc: usize,
    /// The peer.
    pub dest: sys::fi_addr_t,
    /// Remote address.
    pub raddr: u64,
    /// Remote key.
    pub key: u64,
}

/// An endpoint with its state locked: the only way to post on it. Derefs to the owner's
/// data `X`.
pub(crate) struct EpGuard<'a, K, X> {
    ep: *mut sys::fid_ep,
    g: MutexGuard<'a, EpState<K, X>>,
}

impl<K, X> Endpoint<Mutex<EpState<K, X>>> {
    /// Locks the endpoint's state.
    pub fn lock(&self) -> EpGuard<'_, K, X> {
        EpGuard {
            ep: self.as_ptr(),
            g: self.state().lock(),
        }
    }
}

impl<K, X> Deref for EpGuard<'_, K, X> {
    type Target = X;
    fn deref(&self) -> &X {
        &self.g.extra
    }
}

impl<K, X> DerefMut for EpGuard<'_, K, X> {
    fn deref_mut(&mut self) -> &mut X {
        &mut self.g.extra
    }
}

/// `Ok(true)` posted, `Ok(false)` the queue is full (`-FI_EAGAIN`), or the error.
fn posted(call: &'static str, ret: isize) -> Result<bool, FiError> {
    match check(call, ret) {
        Ok(_) => Ok(true),
        Err(e) if e.is_again() => Ok(false),
        Err(e) => Err(e),
    }
}

impl<K: Send, X> EpGuard<'_, K, X> {
    /// Registers both pools on `domain` with keys from `next_key`, binding them to the
    /// endpoint `ep` (this one) with `bind`.
    pub fn register_pools(
        &mut self,
        domain: &Arc<Domain>,
        access: u64,
        mut next_key: impl FnMut() -> u64,
        mut bind: impl FnMut(&Mr) -> Result<(), FiError>,
    ) -> Result<(), FiError> {
        let st = &mut *self.g;
        for pool in [&mut st.recv, &mut st.send] {
            let mr = pool.register(domain, access, next_key())?;
            bind(mr)?;
        }
        Ok(())
    }

    /// Takes back the context a completion names (its `op_context`), if it is one of ours.
    pub fn complete(&mut self, ctx: *mut c_void) -> Option<K> {
        self.g.inflight.remove(ctx)
    }

    /// The first `len` bytes (at most a slot) of receive slot `slot`.
    pub fn received(&self, slot: usize, len: usize) -> &[u8] {
        self.g.recv.received(slot, len)
    }

    /// The size of a send slot.
    pub fn send_slot_size(&self) -> usize {
        self.g.send.slot_size
    }

    /// Posts a receive into slot `slot` of the receive pool.
    pub fn post_recv(&mut self, slot: usize, kind: K) -> Result<bool, FiError> {
        let ep = self.ep;
        let st = &mut *self.g;
        let (inflight, recv) = (&mut st.inflight, &mut st.recv);
        let range = recv.slot(slot, "fi_recv")?;
        let (ctx, p) = Inflight::boxed(kind);
        let buf = recv.buf[range].as_mut_ptr();
        // SAFETY: live endpoint (borrowed by the guard); the buffer slot and the context live
        // in the endpoint's state until the completion is read or the endpoint is closed.
        let ret = unsafe {
            ops::fi_recv(
                ep,
                buf as *mut c_void,
                recv.slot_size,
                recv.desc(),
                sys::FI_ADDR_UNSPEC,
                p,
            )
        };
        let ok = posted("fi_recv", ret)?;
        if ok {
            inflight.0.insert(p as usize, ctx);
        }
        Ok(ok)
    }

    /// Posts one RMA operation.
    ///
    /// The local range must lie in the registration `desc` describes and the remote one in
    /// the peer's region of `key` (the transfer checked both and keeps them alive until the
    /// operation completes).
    pub fn post_rma(&mut self, op: &Rma, kind: K) -> Result<bool, FiError> {
        let ep = self.ep;
        let inflight = &mut self.g.inflight;
        let (ctx, p) = Inflight::boxed(kind);
        let call = if op.write { "fi_write" } else { "fi_read" };
        let len = usize::try_from(op.len).map_err(|_| FiError::new("fi_write", sys::FI_EINVAL))?;
        // SAFETY: live endpoint; the local range lies in a registration the transfer holds
        // (desc is its descriptor, this function's contract), the context lives in the
        // in-flight table until its completion is read.
        let ret = unsafe {
            if op.write {
                ops::fi_write(
                    ep,
                    op.local as *const c_void,
                    len,
                    op.desc as *mut c_void,
                    op.dest,
                    op.raddr,
                    op.key,
                    p,
                )
            } else {
                ops::fi_read(
                    ep,
                    op.local as *mut c_void,
                    len,
                    op.desc as *mut c_void,
                    op.dest,
                    op.raddr,
                    op.key,
                    p,
                )
            }
        };
        let ok = posted(call, ret)?;
        if ok {
            inflight.0.insert(p as usize, ctx);
        }
        Ok(ok)
    }

    /// Copies `msg` into the free slot `slot` of the send pool and sends it.
    pub fn post_send(
        &mut self,
        slot: usize,
        msg: &[u8],
        dest: sys::fi_addr_t,
        kind: K,
    ) -> Result<bool, FiError> {
        let ep = self.ep;
        let st = &mut *self.g;
        let (inflight, send) = (&mut st.inflight, &mut st.send);
        let range = send.slot(slot, "fi_send")?;
        let dst = send.buf[range]
            .get_mut(..msg.len())
            .ok_or_else(|| FiError::new("fi_send", sys::FI_EMSGSIZE))?;
        dst.copy_from_slice(msg);
        let buf = dst.as_ptr();
        let (ctx, p) = Inflight::boxed(kind);
        // SAFETY: live endpoint; the buffer slot and the context live in the endpoint's state
        // until the completion is read.
        let ret =
            unsafe { ops::fi_send(ep, buf as *const c_void, msg.len(), send.desc(), dest, p) };
        let ok = posted("fi_send", ret)?;
        if ok {
            inflight.0.insert(p as usize, ctx);
        }
        Ok(ok)
    }
}
