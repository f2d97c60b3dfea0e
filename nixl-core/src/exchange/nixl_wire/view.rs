//! [`Agent::nixl`]: the agent as a stock NIXL agent's peers see it, over NIXL's own wire.

use std::net::SocketAddr;
use std::time::Duration;

use crate::{Agent, MetadataSelection, Result};

/// NIXL's wire for one agent ([`Agent::nixl`]): its metadata in NIXL's format, and NIXL's
/// side-channel calls (`sendLocalMD`, `fetchRemoteMD`, `invalidateLocalMD`) to a stock NIXL
/// agent's listener. To serve NIXL peers, start a [`super::NixlListener`].
#[derive(Debug, Clone, Copy)]
pub struct NixlView<'a> {
    pub(crate) agent: &'a Agent,
}

impl NixlView<'_> {
    /// The agent's full metadata as a stock NIXL agent's `getLocalMD` writes it: connection
    /// info and regions of every backend that speaks NIXL's wire ([`super::NixlWire`]).
    #[doc(alias = "getLocalMD")]
    pub fn local_metadata(&self) -> Result<Vec<u8>> {
        self.agent.nixl_full_metadata()
    }

    /// Partial metadata in NIXL's format (`getLocalPartialMD`): only the selected
    /// registrations, and connection info when asked for. NIXL needs connection info in the
    /// first blob it loads from an agent.
    #[doc(alias = "getLocalPartialMD")]
    pub fn local_partial_metadata(&self, sel: &MetadataSelection<'_>) -> Result<Vec<u8>> {
        self.agent.nixl_partial_metadata(sel)
    }

    /// Sends this agent's NIXL metadata to the NIXL listener at `addr` (NIXL's
    /// `sendLocalMD`). NIXL answers nothing; it loads the blob within its listener's poll
    /// delay (100 ms by default).
    #[doc(alias = "sendLocalMD")]
    pub fn send_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        let md = self.local_metadata()?;
        self.send_metadata_bytes(addr, &md)
    }

    /// Sends NIXL metadata bytes (e.g. from [`NixlView::local_partial_metadata`]).
    pub fn send_metadata_bytes(&self, addr: SocketAddr, md: &[u8]) -> Result<()> {
        self.agent.nixl_send_bytes(addr, md)
    }

    /// Asks the NIXL listener at `addr` for its agent's metadata (NIXL's `fetchRemoteMD`),
    /// loads it and returns the name, blocking up to `timeout` (as
    /// [`Agent::fetch_remote_metadata_blocking`] does over the native side channel). The
    /// answer must be `remote`'s: another name is refused before anything is loaded.
    #[doc(alias = "fetchRemoteMD")]
    pub fn fetch_remote_metadata_blocking(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String> {
        self.agent.nixl_fetch(remote, addr, timeout)
    }

    /// [`NixlView::fetch_remote_metadata_blocking`] under the name that, on [`Agent`], starts
    /// a fetch without blocking.
    #[deprecated(
        since = "0.1.0",
        note = "blocks (unlike `Agent::fetch_remote_metadata`): use `fetch_remote_metadata_blocking`"
    )]
    pub fn fetch_remote_metadata(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String> {
        self.fetch_remote_metadata_blocking(remote, addr, timeout)
    }

    /// Tells the NIXL listener at `addr` to forget this agent (NIXL's `invalidateLocalMD`).
    /// Send it before re-publishing under the same name with new connection info: a NIXL
    /// agent refuses changed connection info for a name it has loaded.
    #[doc(alias = "invalidateLocalMD")]
    pub fn invalidate_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        self.agent.nixl_invalidate(addr)
    }
}
