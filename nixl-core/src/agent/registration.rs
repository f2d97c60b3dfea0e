//! Registrations: memory registered with backends, kept alive while anything uses it.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::agent::{Agent, BackendHandle, BackendSlot, Shared};
use crate::backend::BackendMd;
use crate::error::{Error, Op, Result};
use crate::index::{RegionIndex, RegionKey};
use crate::mem::{MemKind, MemoryRegion, RegionDesc};

/// One registered region and its per-backend metadata.
pub(crate) struct RegRegion {
    pub desc: RegionDesc,
    /// Unique per region (the agent's id counter): its key in the agent's index.
    pub seq: u64,
    /// Held so the memory outlives every backend registration and transfer.
    pub _memory: Arc<dyn MemoryRegion>,
    pub mds: Mutex<Vec<(Arc<BackendSlot>, BackendMd)>>,
}

impl RegRegion {
    pub(crate) fn md_for(&self, slot_id: usize) -> Option<BackendMd> {
        self.mds
            .lock()
            .iter()
            .find(|(s, _)| s.id == slot_id)
            .map(|(_, m)| m.clone())
    }
}

pub(crate) struct RegInner {
    pub id: u64,
    /// The label the owner registered it with ([`Agent::register_mem_labeled`]).
    pub label: Option<String>,
    /// The agent: not held (a request the agent's drop leaks holds its registrations, which
    /// must not keep the agent, and so its threads, alive with them).
    pub shared: Weak<Shared>,
    /// The agent's name and generation (for logs and handles, once it is gone too).
    pub agent: Arc<str>,
    pub generation: u64,
    pub regions: Vec<RegRegion>,
    pub deregistered: AtomicBool,
    /// Prepared lists and requests holding this registration.
    pub users: AtomicUsize,
}

impl RegInner {
    fn release(&self) -> Vec<Error> {
        let mut errors = Vec::new();
        let shared = self.shared.upgrade();
        for r in &self.regions {
            for (slot, md) in std::mem::take(&mut *r.mds.lock()) {
                if let Err(e) = slot.backend.deregister(md) {
                    errors.push(e);
                }
            }
            if let Some(s) = &shared {
                s.counters.deregistered(r.desc.len);
            }
        }
        if let Some(s) = &shared {
            s.regs.lock().remove(self);
        }
        errors
    }
}

impl Drop for RegInner {
    fn drop(&mut self) {
        if !self.deregistered.swap(true, Ordering::SeqCst) {
            for e in self.release() {
                tracing::warn!(agent = %self.agent, error = %e, "deregistration on drop failed");
            }
        }
    }
}

/// A handle to registered memory (NIXL's registration of a `nixl_reg_dlist_t`).
///
/// It keeps the memory alive; so does every prepared list and request built on it. Dropping the
/// last of them deregisters; [`Agent::deregister_mem`] does so explicitly and reports errors.
/// It does not keep its agent alive (prepared lists and requests do): a registration that
/// outlives its agent still deregisters when dropped.
#[derive(Clone)]
#[must_use = "dropping the registration deregisters the memory at once"]
pub struct Registration {
    pub(crate) inner: Arc<RegInner>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.inner.id)
            .field("regions", &self.inner.regions.len())
            .finish()
    }
}

impl Registration {
    /// The label it was registered with ([`Agent::register_mem_labeled`]), if any.
    pub fn label(&self) -> Option<&str> {
        self.inner.label.as_deref()
    }

    /// The registered regions.
    pub fn regions(&self) -> Vec<RegionDesc> {
        self.inner.regions.iter().map(|r| r.desc.clone()).collect()
    }

    /// The backends the regions are registered with, in creation order.
    pub fn backends(&self) -> Vec<BackendHandle> {
        let mut v: Vec<(usize, BackendHandle)> = self
            .inner
            .regions
            .iter()
            .flat_map(|r| {
                r.mds
                    .lock()
                    .iter()
                    .map(|(s, _)| (s.id, s.handle(self.inner.generation)))
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v.dedup_by_key(|(id, _)| *id);
        v.into_iter().map(|(_, h)| h).collect()
    }

    /// Whether it was explicitly deregistered.
    pub fn is_deregistered(&self) -> bool {
        self.inner.deregistered.load(Ordering::SeqCst)
    }
}

/// A registration region's key in the agent's index: its own range and its unique sequence
/// number (so one memory registered twice has two entries).
fn region_key(r: &RegRegion) -> RegionKey {
    (r.desc.kind, r.desc.dev_id, r.desc.addr, r.seq)
}

/// The agent's index of live registrations: region to (registration, region index).
#[derive(Default)]
pub(crate) struct RegTable {
    by_start: RegionIndex<(Weak<RegInner>, usize)>,
}

/// Entry `(w, i)` of the index as a live registration whose region `i` covers the range.
fn live_cover(
    (w, i): &(Weak<RegInner>, usize),
    addr: u64,
    len: u64,
    dev_id: u64,
) -> Option<(Arc<RegInner>, usize)> {
    let r = w.upgrade()?;
    let live =
        !r.deregistered.load(Ordering::SeqCst) && r.regions[*i].desc.covers(addr, len, dev_id);
    live.then_some((r, *i))
}

impl RegTable {
    fn insert(&mut self, inner: &Arc<RegInner>) {
        for (i, r) in inner.regions.iter().enumerate() {
            self.by_start
                .insert(region_key(r), r.desc.len, (Arc::downgrade(inner), i));
        }
    }

    /// Removes a registration's regions: O(regions log n), whatever the table's size.
    fn remove(&mut self, inner: &RegInner) {
        for r in &inner.regions {
            self.by_start.remove(&region_key(r));
        }
    }

    /// The live registration region covering `[addr, addr+len)`.
    pub(crate) fn find(
        &self,
        kind: MemKind,
        dev_id: u64,
        addr: u64,
        len: u64,
    ) -> Option<(Arc<RegInner>, usize)> {
        let mut found = None;
        self.by_start.find(kind, dev_id, addr, len, |e| {
            found = live_cover(e, addr, len, dev_id);
            found.is_some()
        });
        found
    }

    /// As [`RegTable::find`], with the bound below which every covered range finds the same
    /// region (see [`RegionIndex::find_bounded`]).
    pub(crate) fn find_bounded(
        &self,
        kind: MemKind,
        dev_id: u64,
        addr: u64,
        len: u64,
    ) -> Option<(Arc<RegInner>, usize, u64)> {
        let mut found = None;
        let (_, bound) = self.by_start.find_bounded(kind, dev_id, addr, len, |e| {
            found = live_cover(e, addr, len, dev_id);
            found.is_some()
        })?;
        found.map(|(r, i)| (r, i, bound))
    }

    pub(crate) fn live(&self) -> Vec<Arc<RegInner>> {
        let mut v: Vec<Arc<RegInner>> = self
            .by_start
            .values()
            .filter_map(|(w, _)| w.upgrade())
            .filter(|r| !r.deregistered.load(Ordering::SeqCst))
            .collect();
        v.sort_by_key(|r| r.id);
        v.dedup_by_key(|r| r.id);
        v
    }
}

impl Agent {
    /// Registers memory with every backend that supports its kind (or with the hinted ones).
    ///
    /// Per backend it is all-or-nothing: a backend that fails on one region keeps none of the
    /// list. The call fails (and changes nothing) when no backend registered the whole list.
    #[doc(alias = "registerMem")]
    pub fn register_mem(
        &self,
        regions: Vec<Arc<dyn MemoryRegion>>,
        hints: &[BackendHandle],
    ) -> Result<Registration> {
        self.register(regions, hints, None)
    }

    /// Registers memory as [`Agent::register_mem`] does, under a label its metadata carries
    /// to peers (`"kv-pool"`, `"layer-3"`): a peer finds these regions with
    /// [`Agent::remote_regions_labeled`] instead of telling them apart by size. The label is
    /// 1 to 256 bytes (`InvalidParam` otherwise); several registrations may share one.
    pub fn register_mem_labeled(
        &self,
        label: &str,
        regions: Vec<Arc<dyn MemoryRegion>>,
        hints: &[BackendHandle],
    ) -> Result<Registration> {
        if label.is_empty() || label.len() > crate::codec::MAX_NAME {
            return Err(Error::invalid(
                self.name(),
                Op::RegisterMem,
                format!(
                    "a region label is 1 to {} bytes, not {}",
                    crate::codec::MAX_NAME,
                    label.len()
                ),
            ));
        }
        self.register(regions, hints, Some(label))
    }

    fn register(
        &self,
        regions: Vec<Arc<dyn MemoryRegion>>,
        hints: &[BackendHandle],
        label: Option<&str>,
    ) -> Result<Registration> {
        let name = self.name().to_owned();
        if regions.is_empty() {
            return Err(Error::invalid(
                &name,
                Op::RegisterMem,
                "empty registration list",
            ));
        }
        let descs: Vec<RegionDesc> = regions.iter().map(|r| r.desc()).collect();
        check_descs(&name, &descs)?;
        let candidates = self.select_backends(Op::RegisterMem, hints)?;
        let mut per_region: Vec<Vec<(Arc<BackendSlot>, BackendMd)>> =
            descs.iter().map(|_| Vec::new()).collect();
        let mut errors = Vec::new();
        for slot in candidates
            .iter()
            .filter(|s| descs.iter().all(|d| s.caps.supports(d.kind)))
        {
            match register_all(&name, slot, &descs) {
                Ok(done) => {
                    for (i, md) in done.into_iter().enumerate() {
                        per_region[i].push((slot.clone(), md));
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if per_region[0].is_empty() {
            if let Some(e) = errors.into_iter().next() {
                return Err(e);
            }
            let kinds: Vec<String> = descs.iter().map(|d| d.kind.to_string()).collect();
            return Err(Error::not_supported(
                &name,
                Op::RegisterMem,
                format!("no backend registers {}", kinds.join(",")),
            ));
        }
        let inner = Arc::new(RegInner {
            id: self.shared.next_id(),
            label: label.map(str::to_owned),
            shared: Arc::downgrade(&self.shared),
            agent: self.shared.name.as_str().into(),
            generation: self.shared.generation,
            regions: regions
                .into_iter()
                .zip(descs)
                .zip(per_region)
                .map(|((m, d), mds)| RegRegion {
                    desc: d,
                    seq: self.shared.next_id(),
                    _memory: m,
                    mds: Mutex::new(mds),
                })
                .collect(),
            deregistered: AtomicBool::new(false),
            users: AtomicUsize::new(0),
        });
        for r in &inner.regions {
            self.shared.counters.registered(r.desc.len);
        }
        self.shared.regs.lock().insert(&inner);
        Ok(Registration { inner })
    }

    /// Deregisters explicitly, reporting backend errors. Refused (nothing changes) while a
    /// prepared list or request still uses the memory, or when the handle belongs to another
    /// agent. After success the handle is inert.
    #[doc(alias = "deregisterMem")]
    pub fn deregister_mem(&self, reg: &Registration) -> Result<()> {
        self.check_live(reg, Op::DeregisterMem)?;
        if reg.inner.users.load(Ordering::SeqCst) > 0 {
            return Err(Error::not_allowed(
                self.name(),
                Op::DeregisterMem,
                "memory is in use by a prepared list or request",
            ));
        }
        if reg.inner.deregistered.swap(true, Ordering::SeqCst) {
            return Err(self.deregistered(Op::DeregisterMem));
        }
        match reg.inner.release().into_iter().next() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Refuses a registration of another agent's, or one deregistered already.
    pub(super) fn check_live(&self, reg: &Registration, op: Op) -> Result<()> {
        if !std::ptr::eq(reg.inner.shared.as_ptr(), Arc::as_ptr(&self.shared)) {
            return Err(Error::mismatch(
                self.name(),
                op,
                "registration belongs to another agent",
            ));
        }
        if reg.is_deregistered() {
            return Err(self.deregistered(op));
        }
        Ok(())
    }

    fn deregistered(&self, op: Op) -> Error {
        Error::not_found(self.name(), op, "registration already deregistered")
    }
}

/// A prepared list's or request's hold on a registration: while any exists, explicit
/// deregistration is refused and the memory stays alive.
pub(crate) struct RegUse(pub Arc<RegInner>);

impl RegUse {
    pub(crate) fn new(inner: Arc<RegInner>) -> Self {
        inner.users.fetch_add(1, Ordering::SeqCst);
        RegUse(inner)
    }
}

impl Clone for RegUse {
    fn clone(&self) -> Self {
        RegUse::new(self.0.clone())
    }
}

impl Drop for RegUse {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every region is non-empty, does not overflow, and (if addressable) is not at address 0.
fn check_descs(me: &str, descs: &[RegionDesc]) -> Result<()> {
    for d in descs {
        if d.len == 0 || d.end().is_none() {
            return Err(Error::invalid(
                me,
                Op::RegisterMem,
                format!("region {:#x}+{} is empty or overflows", d.addr, d.len),
            ));
        }
        if d.kind.is_addressable() && d.addr == 0 {
            return Err(Error::invalid(me, Op::RegisterMem, "null address"));
        }
    }
    Ok(())
}

/// Registers every region with one backend, all or nothing: on the first failure the
/// regions it did register are deregistered again.
fn register_all(me: &str, slot: &BackendSlot, descs: &[RegionDesc]) -> Result<Vec<BackendMd>> {
    let mut done: Vec<BackendMd> = Vec::with_capacity(descs.len());
    for d in descs {
        match slot.backend.register(d) {
            Ok(md) => done.push(md),
            Err(e) => {
                for md in done {
                    if let Err(e2) = slot.backend.deregister(md) {
                        tracing::warn!(agent = %me, backend = %slot.name, error = %e2, "rollback deregistration failed");
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}
