//! Prepared descriptor lists (NIXL's `nixlDlistH`).

/// A descriptor list prepared once against registrations ([`crate::Agent::prepare_xfer_dlist`]),
/// for building requests by index ([`crate::Agent::make_xfer_req`]). Released on drop.
pub struct XferDlistHandle {
    pub(crate) prepared: nixl::PreparedList,
}

impl std::fmt::Debug for XferDlistHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XferDlistHandle")
            .field("len", &self.prepared.len())
            .field("kind", &self.prepared.kind())
            .field("target", &self.prepared.target())
            .finish()
    }
}
