//! Metadata: the agent's own (NIXL's wire format, or nixl-rs's), loading and forgetting
//! peers, and publishing through NIXL's side channel (jobs per destination, `comm`) or etcd.

use std::net::{SocketAddr, ToSocketAddrs};
#[cfg(feature = "etcd")]
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{c_name, DEFAULT_COMM_PORT};
use crate::comm::Dest;

/// The etcd exchange (a placeholder that is never reached in a build without etcd).
#[cfg(feature = "etcd")]
type EtcdX = nixl::core::etcd::EtcdExchange;
#[cfg(not(feature = "etcd"))]
type EtcdX = NoEtcd;
use crate::{map_err, refuse, Agent, NixlError, OptArgs, RegDescList, XferDescList};

/// How long a side-channel or etcd fetch waits for the peer's metadata (NIXL's fetches wait
/// on its comm thread without a bound).
const FETCH_WAIT: Duration = Duration::from_secs(30);

/// The side-channel address in `opt` (NIXL's port 8888 without one); `None` without an IP.
fn peer_addr(opt: Option<&OptArgs>) -> Result<Option<SocketAddr>, NixlError> {
    let Some(o) = opt else { return Ok(None) };
    let Some(ip) = &o.ip_addr else {
        return Ok(None);
    };
    let port = o.port.unwrap_or(DEFAULT_COMM_PORT as u16);
    (ip.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(Some)
        .ok_or_else(|| {
            refuse(
                nixl::ErrorKind::InvalidParam,
                format!("{ip}:{port} is not an address"),
                NixlError::InvalidParam,
            )
        })
}

/// No side-channel address and no etcd: NIXL's `NOT_SUPPORTED` (a `BackendError`).
fn no_exchange() -> NixlError {
    refuse(
        nixl::ErrorKind::NotSupported,
        "no peer address in OptArgs (set_ip_addr) and no etcd (NIXL_ETCD_ENDPOINTS, feature \
         `etcd`)"
            .to_owned(),
        NixlError::BackendError,
    )
}

impl Agent {
    /// The agent's metadata, in NIXL's wire format (a stock NIXL agent loads it), or in
    /// nixl-rs's own with `NIXL_RS_METADATA=native`.
    pub fn get_local_md(&self) -> Result<Vec<u8>, NixlError> {
        let r = if self.inner.native_md {
            self.inner.rs.local_metadata()
        } else {
            self.inner.rs.nixl().local_metadata()
        };
        r.map_err(map_err)
    }

    /// The metadata of the registrations `descs` name (`NotFound` for a descriptor no live
    /// registration covers); connection info only, of every backend, for an empty list.
    pub fn get_local_partial_md(
        &self,
        descs: &RegDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<Vec<u8>, NixlError> {
        let _ = opt_args;
        let regions = descs.regions()?;
        let regs: Vec<nixl::Registration> = {
            let mut live = self.inner.regs.lock();
            live.retain(|r| !r.is_deregistered());
            let mut picked: Vec<nixl::Registration> = Vec::new();
            for want in &regions {
                let reg = live.iter().find(|r| {
                    r.regions()
                        .iter()
                        .any(|h| h.kind == want.kind && h.covers(want.addr, want.len, want.dev_id))
                });
                match reg {
                    Some(r) => picked.push(r.clone()),
                    None => {
                        return Err(refuse(
                            nixl::ErrorKind::NotFound,
                            format!(
                                "no registration covers {:#x}+{} on device {}",
                                want.addr, want.len, want.dev_id
                            ),
                            NixlError::NotFound,
                        ))
                    }
                }
            }
            picked
        };
        let refs: Vec<&nixl::Registration> = regs.iter().collect();
        let sel = nixl::core::MetadataSelection {
            registrations: Some(&refs),
            include_conn: refs.is_empty(),
        };
        let r = if self.inner.native_md {
            self.inner.rs.local_partial_metadata(&sel)
        } else {
            self.inner.rs.nixl().local_partial_metadata(&sel)
        };
        r.map_err(map_err)
    }

    /// Loads a peer's metadata (NIXL's blob or nixl-rs's); returns its name.
    pub fn load_remote_md(&self, metadata: &[u8]) -> Result<String, NixlError> {
        let name = self
            .inner
            .rs
            .load_remote_metadata(metadata)
            .map_err(map_err)?;
        self.inner.remotes.lock().insert(name.clone());
        Ok(name)
    }

    /// Whether `remote_agent`'s metadata is loaded, and covers `descs` when given.
    pub fn check_remote_metadata(&self, remote_agent: &str, descs: Option<&XferDescList>) -> bool {
        if remote_agent.contains('\0') {
            return false;
        }
        let list = match descs.map(XferDescList::to_rs).transpose() {
            Ok(l) => l,
            Err(_) => return false,
        };
        self.inner
            .rs
            .check_remote_metadata(remote_agent, list.as_ref())
    }

    /// Forgets a peer this handle loaded (`InvalidParam` for one it did not).
    pub fn invalidate_remote_md(&self, remote_agent: &str) -> Result<(), NixlError> {
        if !self.inner.remotes.lock().contains(remote_agent) {
            return Err(NixlError::InvalidParam);
        }
        match self.inner.rs.invalidate_remote_metadata(remote_agent) {
            Ok(()) => {}
            Err(e) if e.kind() == nixl::ErrorKind::NotFound => {}
            Err(e) => return Err(map_err(e)),
        }
        self.inner.remotes.lock().remove(remote_agent);
        Ok(())
    }

    /// Forgets every peer this handle loaded.
    pub fn invalidate_all_remotes(&self) -> Result<(), NixlError> {
        let names: Vec<String> = self.inner.remotes.lock().iter().cloned().collect();
        for n in names {
            self.invalidate_remote_md(&n)?;
        }
        Ok(())
    }

    /// Publishes this agent's metadata: to the NIXL side channel at `opt_args`' address (sent
    /// off the caller's thread: this returns at once, as NIXL's does), else to etcd
    /// (`NIXL_ETCD_ENDPOINTS`, NIXL's keys).
    pub fn send_local_md(&self, opt_args: Option<&OptArgs>) -> Result<(), NixlError> {
        self.side_channel_or_etcd(
            opt_args,
            |rs, addr| rs.nixl().send_local_metadata(addr),
            |x| x.publish(),
        )
    }

    /// Publishes the metadata of the registrations `descs` name to the NIXL side channel at
    /// `opt_args`' address. Through etcd NIXL needs a label nixl-sys cannot set:
    /// `InvalidParam`.
    pub fn send_local_partial_md(
        &self,
        descs: &RegDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<(), NixlError> {
        let md = self.get_local_partial_md(descs, opt_args)?;
        match peer_addr(opt_args)? {
            Some(addr) => {
                let rs = self.inner.rs.clone();
                self.inner.comm.submit(Dest::Addr(addr), move || {
                    rs.nixl().send_metadata_bytes(addr, &md)
                })
            }
            None => Err(refuse(
                nixl::ErrorKind::InvalidParam,
                "partial metadata through etcd needs a label, which nixl-sys's OptArgs cannot \
                 carry"
                    .to_owned(),
                NixlError::InvalidParam,
            )),
        }
    }

    /// Fetches and loads `remote_name`'s metadata: from the NIXL side channel at `opt_args`'
    /// address, else from etcd. It runs off the caller's thread (waiting up to 30 s for the
    /// peer to publish) and returns at once, as NIXL's does: poll
    /// [`Agent::check_remote_metadata`].
    pub fn fetch_remote_md(
        &self,
        remote_name: &str,
        opt_args: Option<&OptArgs>,
    ) -> Result<(), NixlError> {
        c_name(remote_name)?;
        let name = remote_name.to_owned();
        if let Some(addr) = peer_addr(opt_args)? {
            let rs = self.inner.rs.clone();
            self.inner.comm.submit(Dest::Addr(addr), move || {
                rs.nixl()
                    .fetch_remote_metadata_blocking(&name, addr, FETCH_WAIT)
                    .map(|_| ())
            })?;
        } else {
            self.etcd_async(move |x| x.fetch(&name, FETCH_WAIT).map(|_| ()))?;
        }
        self.inner.remotes.lock().insert(remote_name.to_owned());
        Ok(())
    }

    /// Withdraws this agent's metadata: from the NIXL side channel at `opt_args`' address
    /// (off the caller's thread), else from etcd.
    pub fn invalidate_local_md(&self, opt_args: Option<&OptArgs>) -> Result<(), NixlError> {
        self.side_channel_or_etcd(
            opt_args,
            |rs, addr| rs.nixl().invalidate_local_metadata(addr),
            |x| x.invalidate_local(),
        )
    }

    /// `side` queued for the side channel at `opt_args`' address, else `etcd` now.
    fn side_channel_or_etcd(
        &self,
        opt_args: Option<&OptArgs>,
        side: impl FnOnce(&nixl::Agent, SocketAddr) -> nixl::Result<()> + Send + 'static,
        etcd: impl FnOnce(&EtcdX) -> nixl::Result<()>,
    ) -> Result<(), NixlError> {
        match peer_addr(opt_args)? {
            Some(addr) => {
                let rs = self.inner.rs.clone();
                self.inner
                    .comm
                    .submit(Dest::Addr(addr), move || side(&rs, addr))
            }
            None => self.etcd(etcd),
        }
    }

    /// Runs `f` on the agent's etcd exchange, made at first use from `NIXL_ETCD_ENDPOINTS`.
    #[cfg(feature = "etcd")]
    fn etcd(&self, f: impl FnOnce(&EtcdX) -> nixl::Result<()>) -> Result<(), NixlError> {
        let x = self.etcd_exchange()?;
        f(&x).map_err(map_err)
    }

    #[cfg(feature = "etcd")]
    fn etcd_async(
        &self,
        f: impl FnOnce(&EtcdX) -> nixl::Result<()> + Send + 'static,
    ) -> Result<(), NixlError> {
        let x = self.etcd_exchange()?;
        self.inner.comm.submit(Dest::Etcd, move || f(&x))
    }

    #[cfg(feature = "etcd")]
    fn etcd_exchange(&self) -> Result<Arc<nixl::core::etcd::EtcdExchange>, NixlError> {
        use nixl::core::etcd::{EtcdConfig, EtcdExchange, ENV_ENDPOINTS};
        let mut slot = self.inner.etcd.lock();
        if let Some(x) = &*slot {
            return Ok(x.clone());
        }
        if std::env::var_os(ENV_ENDPOINTS).is_none() {
            return Err(no_exchange());
        }
        let x = Arc::new(
            EtcdExchange::new(&self.inner.rs, &EtcdConfig::default().nixl_keys(true))
                .map_err(map_err)?,
        );
        *slot = Some(x.clone());
        Ok(x)
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd(&self, _f: impl FnOnce(&EtcdX) -> nixl::Result<()>) -> Result<(), NixlError> {
        Err(no_exchange())
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd_async(
        &self,
        _f: impl FnOnce(&EtcdX) -> nixl::Result<()> + Send + 'static,
    ) -> Result<(), NixlError> {
        Err(no_exchange())
    }
}

/// What the calls above ask of etcd, in a build without it (never called: the calls refuse).
#[cfg(not(feature = "etcd"))]
struct NoEtcd;

#[cfg(not(feature = "etcd"))]
impl NoEtcd {
    fn publish(&self) -> nixl::Result<()> {
        Ok(())
    }
    fn invalidate_local(&self) -> nixl::Result<()> {
        Ok(())
    }
    fn fetch(&self, _remote: &str, _wait: Duration) -> nixl::Result<String> {
        Ok(String::new())
    }
}
