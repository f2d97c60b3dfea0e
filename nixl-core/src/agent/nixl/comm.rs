//! The agent's side of NIXL's side channel (NIXLCOMM): sending, fetching and invalidating metadata at a NIXL listener.

use crate::agent::Agent;
use crate::error::{Error, Op, Result};
use crate::nixl_wire::comm::{encode_command, parse_body, read_frame, write_frame, Command};
use crate::nixl_wire::listener::connect;
use crate::nixl_wire::metadata::NixlMetadata;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

impl Agent {
    fn nixl_command(&self, addr: SocketAddr, cmd: &Command, timeout: Duration) -> Result<()> {
        let body = encode_command(cmd).ok_or_else(|| {
            Error::not_supported(
                self.name(),
                Op::Exchange,
                "the metadata holds the bytes NIXLCOMM: (NIXL would split it)",
            )
        })?;
        let mut s =
            connect(addr, Instant::now() + timeout).map_err(|e| self.exchange_io(e, timeout))?;
        write_frame(&mut s, &body).map_err(|e| self.exchange_io(e, timeout))
    }

    /// Sends this agent's NIXL metadata to the NIXL listener at `addr` (NIXL's
    /// `sendLocalMD`). NIXL answers nothing; it loads the blob within its listener's poll
    /// delay (100 ms by default).
    #[doc(alias = "sendLocalMD")]
    #[deprecated(note = "use `agent.nixl().send_local_metadata(addr)`")]
    pub fn nixl_send_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        self.nixl().send_local_metadata(addr)
    }

    /// Sends NIXL metadata bytes.
    #[deprecated(note = "use `agent.nixl().send_metadata_bytes(addr, md)`")]
    pub fn nixl_send_metadata_bytes(&self, addr: SocketAddr, md: &[u8]) -> Result<()> {
        self.nixl().send_metadata_bytes(addr, md)
    }

    /// Asks the NIXL listener at `addr` for its agent's metadata and loads it.
    #[doc(alias = "fetchRemoteMD")]
    #[deprecated(note = "use `agent.nixl().fetch_remote_metadata_blocking(remote, addr, timeout)`")]
    pub fn nixl_fetch_remote_metadata(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String> {
        self.nixl()
            .fetch_remote_metadata_blocking(remote, addr, timeout)
    }

    /// Tells the NIXL listener at `addr` to forget this agent.
    #[doc(alias = "invalidateLocalMD")]
    #[deprecated(note = "use `agent.nixl().invalidate_local_metadata(addr)`")]
    pub fn nixl_invalidate_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        self.nixl().invalidate_local_metadata(addr)
    }

    pub(crate) fn nixl_send_bytes(&self, addr: SocketAddr, md: &[u8]) -> Result<()> {
        let timeout = self.shared.config.default_timeout;
        self.nixl_command(addr, &Command::Load(md.to_vec()), timeout)
    }

    pub(crate) fn nixl_fetch(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let io = |e| self.exchange_io(e, timeout);
        let mut s = connect(addr, deadline).map_err(io)?;
        let body = encode_command(&Command::Send).unwrap_or_default();
        write_frame(&mut s, &body).map_err(io)?;
        let reply = read_frame(&mut s).map_err(io)?;
        let decode = |source| Error::Decode {
            agent: self.name().to_owned(),
            op: Op::Exchange,
            source,
        };
        let blob = match parse_body(&reply).map_err(decode)?.as_slice() {
            [Command::Load(b)] => b.clone(),
            _ => {
                return Err(Error::invalid(
                    self.name(),
                    Op::Exchange,
                    "a NIXLCOMM SEND must be answered by one LOAD",
                ))
            }
        };
        let md = NixlMetadata::decode_bytes(&blob).map_err(decode)?;
        if md.name != remote {
            return Err(Error::mismatch(
                self.name(),
                Op::Exchange,
                format!("asked {addr} for {remote}, got {}", md.name),
            ));
        }
        self.load_remote_metadata(&blob)
    }

    pub(crate) fn nixl_invalidate(&self, addr: SocketAddr) -> Result<()> {
        let timeout = self.shared.config.default_timeout;
        self.nixl_command(addr, &Command::Invalidate(self.name().to_owned()), timeout)
    }
}
