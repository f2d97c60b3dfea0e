//! The `static inline` calls of libfabric's headers that this crate uses, written in Rust:
//! each one is a call through an ops table of the object (`ep->rma->write(...)`), exactly as
//! the C header does it. A null table or slot gives `-FI_ENOSYS` instead of a crash.
//!
//! Every function here is `unsafe`: the caller passes live objects of the right class (opened
//! by libfabric and not yet closed) and buffers valid for the operation's lifetime.

use std::ffi::{c_char, c_int, c_void};

use super::*;

const ENOSYS: isize = -(FI_ENOSYS as isize);

macro_rules! call {
    ($table:expr, $slot:ident ( $($arg:expr),* )) => {{
        let table = $table;
        if table.is_null() {
            ENOSYS
        } else {
            match (*table).$slot {
                Some(f) => f($($arg),*) as isize,
                None => ENOSYS,
            }
        }
    }};
}

/// `fi_close(fid)`.
pub unsafe fn fi_close(fid: *mut fid) -> isize {
    // SAFETY: the caller passes a live fid; its ops table is the provider's.
    unsafe { call!((*fid).ops, close(fid)) }
}

/// `fi_domain(fabric, info, &domain, ctx)`.
pub unsafe fn fi_domain(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    domain: *mut *mut fid_domain,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live fabric and a valid info.
    unsafe { call!((*fabric).ops, domain(fabric, info, domain, ctx)) }
}

/// `fi_av_open(domain, attr, &av, ctx)`.
pub unsafe fn fi_av_open(
    domain: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live domain and a valid attribute struct.
    unsafe { call!((*domain).ops, av_open(domain, attr, av, ctx)) }
}

/// `fi_cq_open(domain, attr, &cq, ctx)`.
pub unsafe fn fi_cq_open(
    domain: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live domain and a valid attribute struct.
    unsafe { call!((*domain).ops, cq_open(domain, attr, cq, ctx)) }
}

/// `fi_endpoint(domain, info, &ep, ctx)`.
pub unsafe fn fi_endpoint(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live domain and a valid info.
    unsafe { call!((*domain).ops, endpoint(domain, info, ep, ctx)) }
}

/// `fi_ep_bind(ep, bfid, flags)`.
pub unsafe fn fi_ep_bind(ep: *mut fid_ep, bfid: *mut fid, flags: u64) -> isize {
    // SAFETY: the caller passes a live endpoint and a live object to bind.
    unsafe { call!((*ep).fid.ops, bind(&mut (*ep).fid, bfid, flags)) }
}

/// `fi_enable(ep)`.
pub unsafe fn fi_enable(ep: *mut fid_ep) -> isize {
    // SAFETY: the caller passes a live endpoint.
    unsafe {
        call!(
            (*ep).fid.ops,
            control(&mut (*ep).fid, FI_ENABLE as c_int, std::ptr::null_mut())
        )
    }
}

/// `fi_getname(&ep->fid, addr, &len)`.
pub unsafe fn fi_getname(ep: *mut fid_ep, addr: *mut c_void, len: *mut usize) -> isize {
    // SAFETY: the caller passes a live endpoint and a buffer of `*len` bytes.
    unsafe { call!((*ep).cm, getname(&mut (*ep).fid, addr, len)) }
}

/// `fi_cancel(&ep->fid, ctx)`.
pub unsafe fn fi_cancel(ep: *mut fid_ep, ctx: *mut c_void) -> isize {
    // SAFETY: the caller passes a live endpoint.
    unsafe { call!((*ep).ops, cancel(&mut (*ep).fid, ctx)) }
}

/// `fi_av_insert(av, addr, count, fi_addr, flags, ctx)`.
pub unsafe fn fi_av_insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live AV, `count` addresses and `count` output slots.
    unsafe { call!((*av).ops, insert(av, addr, count, fi_addr, flags, ctx)) }
}

/// `fi_av_remove(av, fi_addr, count, flags)`.
pub unsafe fn fi_av_remove(
    av: *mut fid_av,
    fi_addr: *mut fi_addr_t,
    count: usize,
    flags: u64,
) -> isize {
    // SAFETY: the caller passes a live AV and `count` addresses it inserted.
    unsafe { call!((*av).ops, remove(av, fi_addr, count, flags)) }
}

/// `fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, &mr, ctx)`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_mr_reg(
    domain: *mut fid_domain,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live domain and memory valid for `len` bytes.
    unsafe {
        call!(
            (*domain).mr,
            reg(
                &mut (*domain).fid,
                buf,
                len,
                access,
                offset,
                requested_key,
                flags,
                mr,
                ctx
            )
        )
    }
}

/// `fi_mr_regattr(domain, attr, flags, &mr)`.
pub unsafe fn fi_mr_regattr(
    domain: *mut fid_domain,
    attr: *const fi_mr_attr,
    flags: u64,
    mr: *mut *mut fid_mr,
) -> isize {
    // SAFETY: the caller passes a live domain and a valid attribute struct.
    unsafe { call!((*domain).mr, regattr(&mut (*domain).fid, attr, flags, mr)) }
}

/// `fi_mr_bind(mr, bfid, flags)`.
pub unsafe fn fi_mr_bind(mr: *mut fid_mr, bfid: *mut fid, flags: u64) -> isize {
    // SAFETY: the caller passes a live MR and a live object to bind.
    unsafe { call!((*mr).fid.ops, bind(&mut (*mr).fid, bfid, flags)) }
}

/// `fi_mr_enable(mr)`.
pub unsafe fn fi_mr_enable(mr: *mut fid_mr) -> isize {
    // SAFETY: the caller passes a live MR.
    unsafe {
        call!(
            (*mr).fid.ops,
            control(&mut (*mr).fid, FI_ENABLE as c_int, std::ptr::null_mut())
        )
    }
}

/// `fi_cq_read(cq, buf, count)`.
pub unsafe fn fi_cq_read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: the caller passes a live CQ and room for `count` entries of its format.
    unsafe { call!((*cq).ops, read(cq, buf, count)) }
}

/// `fi_cq_sread(cq, buf, count, NULL, timeout_ms)`: blocks until a completion or the timeout.
pub unsafe fn fi_cq_sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    timeout_ms: c_int,
) -> isize {
    // SAFETY: the caller passes a live CQ opened with a wait object and room for `count`
    // entries of its format.
    unsafe {
        call!(
            (*cq).ops,
            sread(cq, buf, count, std::ptr::null(), timeout_ms)
        )
    }
}

/// `fi_cq_readerr(cq, buf, flags)`.
pub unsafe fn fi_cq_readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, flags: u64) -> isize {
    // SAFETY: the caller passes a live CQ and one error entry.
    unsafe { call!((*cq).ops, readerr(cq, buf, flags)) }
}

/// `fi_cq_strerror(cq, prov_errno, err_data, buf, len)`; null when the provider has none.
pub unsafe fn fi_cq_strerror(
    cq: *mut fid_cq,
    prov_errno: c_int,
    err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: the caller passes a live CQ and a buffer of `len` bytes.
    unsafe {
        let table = (*cq).ops;
        if table.is_null() {
            return std::ptr::null();
        }
        match (*table).strerror {
            Some(f) => f(cq, prov_errno, err_data, buf, len),
            None => std::ptr::null(),
        }
    }
}

/// `fi_write(ep, buf, len, desc, dest_addr, addr, key, ctx)`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest: fi_addr_t,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller passes a live endpoint, a buffer valid until the completion and
    // a context that stays put until then.
    unsafe { call!((*ep).rma, write(ep, buf, len, desc, dest, addr, key, ctx)) }
}

/// `fi_read(ep, buf, len, desc, src_addr, addr, key, ctx)`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: fi_addr_t,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: as for fi_write.
    unsafe { call!((*ep).rma, read(ep, buf, len, desc, src, addr, key, ctx)) }
}

/// `fi_send(ep, buf, len, desc, dest_addr, ctx)`.
pub unsafe fn fi_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest: fi_addr_t,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: as for fi_write.
    unsafe { call!((*ep).msg, send(ep, buf, len, desc, dest, ctx)) }
}

/// `fi_recv(ep, buf, len, desc, src_addr, ctx)`.
pub unsafe fn fi_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: fi_addr_t,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: as for fi_write.
    unsafe { call!((*ep).msg, recv(ep, buf, len, desc, src, ctx)) }
}
