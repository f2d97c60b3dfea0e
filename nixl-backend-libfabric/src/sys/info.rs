//! `fi_info` lists owned by Rust ([`Info`]), their entries ([`Entry`]) and the hints an RDM
//! endpoint is looked up with.

use std::ffi::{CStr, CString};
use std::ptr::{self, NonNull};

use crate::result::{check, FiError};
use crate::sys::{self, Lib};

/// A list of `fi_info` entries owned by this value (freed with `fi_freeinfo`).
pub(crate) struct Info {
    ptr: NonNull<sys::fi_info>,
    lib: &'static Lib,
    /// Strings owned by Rust that hint fields point at; the pointers are cleared before
    /// `fi_freeinfo` so libfabric never frees them.
    owned: Vec<(StrField, CString)>,
}

// SAFETY: an `fi_info` list is plain data owned by this value; nothing in it is tied to a thread.
unsafe impl Send for Info {}
// SAFETY: shared access only reads the list.
unsafe impl Sync for Info {}

/// A string field of the hints that Rust may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StrField {
    /// `fabric_attr->prov_name`.
    Provider,
    /// `domain_attr->name`.
    Domain,
}

/// One entry of a list an [`Info`] owns (borrowed from it).
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a>(&'a sys::fi_info);

impl std::ops::Deref for Entry<'_> {
    type Target = sys::fi_info;
    fn deref(&self) -> &sys::fi_info {
        self.0
    }
}

/// The attribute structs of an entry.
pub(crate) struct Attrs<'a> {
    /// `domain_attr`.
    pub domain: &'a sys::fi_domain_attr,
    /// `ep_attr`.
    pub ep: &'a sys::fi_ep_attr,
    /// `tx_attr`.
    pub tx: &'a sys::fi_tx_attr,
    /// `rx_attr`.
    pub rx: &'a sys::fi_rx_attr,
}

impl<'a> Entry<'a> {
    /// The attribute structs, or `None` when the provider left one out.
    pub fn attrs(self) -> Option<Attrs<'a>> {
        let e = self.0;
        if e.domain_attr.is_null()
            || e.ep_attr.is_null()
            || e.tx_attr.is_null()
            || e.rx_attr.is_null()
        {
            return None;
        }
        // SAFETY: non-null attribute pointers of a live entry of a list an `Info` owns point
        // to structs libfabric allocated with it (borrowed for as long as the list).
        Some(unsafe {
            Attrs {
                domain: &*e.domain_attr,
                ep: &*e.ep_attr,
                tx: &*e.tx_attr,
                rx: &*e.rx_attr,
            }
        })
    }

    /// `domain_attr->name` (empty when absent).
    pub fn domain_name(self) -> String {
        if self.0.domain_attr.is_null() {
            return String::new();
        }
        // SAFETY: as in `attrs`: a live attribute struct of an owned list; its string fields
        // are NUL-terminated or null.
        cstr(unsafe { (*self.0.domain_attr).name })
    }

    /// `fabric_attr->prov_name` (empty when absent).
    pub fn provider_name(self) -> String {
        if self.0.fabric_attr.is_null() {
            return String::new();
        }
        // SAFETY: as above.
        cstr(unsafe { (*self.0.fabric_attr).prov_name })
    }
}

/// The hints an RDM endpoint is looked up with ([`Info::set_rdm_hints`]).
pub(crate) struct RdmHints {
    /// `caps`.
    pub caps: u64,
    /// `mode`.
    pub mode: u64,
    /// `domain_attr->mr_mode`.
    pub mr_mode: i32,
    /// `domain_attr->threading`.
    pub threading: sys::fi_threading,
    /// `tx_attr->msg_order` and `rx_attr->msg_order`.
    pub msg_order: u64,
    /// `tx_attr->op_flags`, when set.
    pub tx_op_flags: Option<u64>,
}

impl Info {
    /// Sets the hints of an RDM endpoint lookup on the first entry (hints from
    /// [`Info::hints`], whose attribute structs `fi_allocinfo` allocated).
    pub fn set_rdm_hints(&mut self, h: &RdmHints) -> Result<(), FiError> {
        let i = self.first_mut();
        if i.ep_attr.is_null()
            || i.domain_attr.is_null()
            || i.tx_attr.is_null()
            || i.rx_attr.is_null()
        {
            return Err(FiError::new("fi_allocinfo", sys::FI_EINVAL));
        }
        i.caps = h.caps;
        i.mode = h.mode;
        // SAFETY: the attribute structs are allocated (checked non-null) and exclusively
        // borrowed through `&mut self`.
        unsafe {
            (*i.ep_attr).type_ = sys::FI_EP_RDM;
            (*i.domain_attr).mr_mode = h.mr_mode;
            (*i.domain_attr).threading = h.threading;
            (*i.tx_attr).msg_order = h.msg_order;
            (*i.rx_attr).msg_order = h.msg_order;
            if let Some(f) = h.tx_op_flags {
                (*i.tx_attr).op_flags = f;
            }
        }
        Ok(())
    }

    /// Empty hints (`fi_allocinfo`).
    pub fn hints(lib: &'static Lib) -> Result<Info, FiError> {
        // SAFETY: fi_dupinfo(NULL) allocates a zeroed info with every attribute struct.
        let p = unsafe { (lib.fi_dupinfo)(ptr::null()) };
        let ptr = NonNull::new(p).ok_or_else(|| FiError::new("fi_allocinfo", sys::FI_ENOMEM))?;
        Ok(Info {
            ptr,
            lib,
            owned: Vec::new(),
        })
    }

    /// Copies one entry (`fi_dupinfo`: the copy has no `next`).
    pub fn dup(&self, entry: Entry<'_>) -> Result<Info, FiError> {
        // SAFETY: `entry` is a live entry of a list this crate owns.
        let p = unsafe { (self.lib.fi_dupinfo)(entry.0) };
        let ptr = NonNull::new(p).ok_or_else(|| FiError::new("fi_dupinfo", sys::FI_ENOMEM))?;
        Ok(Info {
            ptr,
            lib: self.lib,
            owned: Vec::new(),
        })
    }

    /// Runs `fi_getinfo` with these hints; `Ok(None)` when no provider matches.
    pub fn getinfo(&self, version: u32) -> Result<Option<Info>, FiError> {
        let mut out: *mut sys::fi_info = ptr::null_mut();
        // SAFETY: the hints are a valid info; `out` receives a list this crate then owns.
        let ret = unsafe {
            (self.lib.fi_getinfo)(
                version,
                ptr::null(),
                ptr::null(),
                0,
                self.ptr.as_ptr(),
                &mut out,
            )
        };
        match check("fi_getinfo", ret as isize) {
            Ok(_) => Ok(NonNull::new(out).map(|ptr| Info {
                ptr,
                lib: self.lib,
                owned: Vec::new(),
            })),
            Err(e) if e.code == sys::FI_ENODATA => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The first entry.
    pub fn first(&self) -> Entry<'_> {
        // SAFETY: the pointer is a live info owned by this value.
        Entry(unsafe { self.ptr.as_ref() })
    }

    /// The first entry, for setting hint fields.
    fn first_mut(&mut self) -> &mut sys::fi_info {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { self.ptr.as_mut() }
    }

    /// The raw pointer (for calls that take `struct fi_info *`).
    pub(super) fn as_ptr(&self) -> *mut sys::fi_info {
        self.ptr.as_ptr()
    }

    /// All entries in list order.
    pub fn entries(&self) -> Vec<Entry<'_>> {
        let mut v = Vec::new();
        let mut p: *const sys::fi_info = self.ptr.as_ptr();
        while !p.is_null() {
            // SAFETY: `p` walks the `next` chain of a list owned by this value.
            let e = unsafe { &*p };
            v.push(Entry(e));
            p = e.next;
        }
        v
    }

    /// Points a string hint at a Rust-owned copy of `value`.
    pub fn set_str(&mut self, field: StrField, value: &str) -> Result<(), FiError> {
        let c = CString::new(value).map_err(|_| FiError::new("hints", sys::FI_EINVAL))?;
        let info = self.first_mut();
        // SAFETY: fi_allocinfo allocated both attribute structs; the string outlives the
        // hints (it is stored in `owned` and the field cleared before they are freed).
        unsafe {
            match field {
                StrField::Provider => (*info.fabric_attr).prov_name = c.as_ptr() as *mut _,
                StrField::Domain => (*info.domain_attr).name = c.as_ptr() as *mut _,
            }
        }
        self.owned.retain(|(f, _)| *f != field);
        self.owned.push((field, c));
        Ok(())
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        let info = self.first_mut() as *mut sys::fi_info;
        for (field, _) in &self.owned {
            // SAFETY: the field was set by `set_str` on this (live) info; clearing it keeps
            // fi_freeinfo from freeing Rust's string.
            unsafe {
                match field {
                    StrField::Provider => (*(*info).fabric_attr).prov_name = ptr::null_mut(),
                    StrField::Domain => (*(*info).domain_attr).name = ptr::null_mut(),
                }
            }
        }
        // SAFETY: the list was allocated by libfabric and is freed once, here.
        unsafe { (self.lib.fi_freeinfo)(self.ptr.as_ptr()) };
    }
}

/// A C string field of libfabric, copied out (empty for null). Only for strings of live
/// libfabric objects (NUL-terminated or null).
pub(super) fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libfabric's strings in a live info are NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
