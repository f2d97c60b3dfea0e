//! [`NixlWire`]: what a backend implements to reach NIXL peers of its type.

use crate::backend::BackendMd;
use crate::error::Result;
use crate::mem::RegionDesc;

/// A backend's NIXL encodings. Transfers, notifications, disconnects and unloads go through
/// the backend's ordinary [`crate::backend::Backend`] methods: the backend remembers which peers it
/// connected with [`NixlWire::nixl_connect`] and speaks NIXL's wire to them.
pub trait NixlWire: Send + Sync {
    /// The connection info NIXL's backend of this type publishes (UCX: the raw address of the
    /// worker that receives notifications).
    fn nixl_connection_info(&self) -> Result<Vec<u8>>;
    /// A registered region's public metadata as NIXL publishes it (UCX: the raw packed rkey).
    fn nixl_public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>>;
    /// Connects to a NIXL peer from its connection info. Bytes from the peer are checked
    /// structurally before the native library parses them; a peer the library cannot talk to
    /// (another UCX minor version) is refused with a typed error.
    fn nixl_connect(&self, remote: &str, info: &[u8]) -> Result<()>;
    /// Loads a NIXL peer's region from its public metadata.
    fn nixl_load_remote(
        &self,
        remote: &str,
        region: &RegionDesc,
        public: &[u8],
    ) -> Result<BackendMd>;
}
