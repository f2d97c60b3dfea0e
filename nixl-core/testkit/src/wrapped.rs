//! A real INPROC backend under a name of the test's choosing whose `prepare_xfer` the test
//! writes: to record what the agent told it, to decline, and so on. Everything else is
//! INPROC's own (registration, metadata, connections, notifications); the block path is
//! declined (the trait's default), so every request reaches `prepare_xfer`.

use std::sync::Arc;

use nixl_core::backend::inproc::InprocBackend;
use nixl_core::backend::{
    Backend, BackendContext, BackendMd, BackendParams, BackendXfer, Capabilities, PeerBackend,
    XferSpec,
};
use nixl_core::{RegionDesc, Result};

/// What the test's backend does with a transfer: INPROC is there to delegate to.
pub type Prepare =
    dyn Fn(&InprocBackend, &XferSpec) -> Result<Box<dyn BackendXfer>> + Send + Sync + 'static;

/// Creates a [`WrappedInproc`] (pass to `Agent::create_backend`).
#[derive(Clone)]
pub struct WrappedParams {
    name: &'static str,
    prepare: Arc<Prepare>,
}

impl WrappedParams {
    /// A backend named `name` whose transfers `prepare` makes.
    pub fn new(
        name: &'static str,
        prepare: impl Fn(&InprocBackend, &XferSpec) -> Result<Box<dyn BackendXfer>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        WrappedParams {
            name,
            prepare: Arc::new(prepare),
        }
    }
}

impl std::fmt::Debug for WrappedParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrappedParams")
            .field("name", &self.name)
            .finish()
    }
}

impl BackendParams for WrappedParams {
    fn backend_name(&self) -> &str {
        self.name
    }

    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(WrappedInproc {
            inner: InprocBackend::new(ctx),
            name: self.name,
            prepare: self.prepare,
        }))
    }
}

/// INPROC with the test's name and `prepare_xfer` ([`WrappedParams`]).
pub struct WrappedInproc {
    inner: InprocBackend,
    name: &'static str,
    prepare: Arc<Prepare>,
}

impl std::fmt::Debug for WrappedInproc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrappedInproc")
            .field("name", &self.name)
            .finish()
    }
}

impl Backend for WrappedInproc {
    fn name(&self) -> &str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        self.inner.register(region)
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        self.inner.deregister(md)
    }

    fn load_local(&self, region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        self.inner.load_local(region, md)
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        (self.prepare)(&self.inner, spec)
    }

    fn peers(&self) -> Option<&dyn PeerBackend> {
        Some(self)
    }
}

impl PeerBackend for WrappedInproc {
    fn connection_info(&self) -> Result<Vec<u8>> {
        self.inner.connection_info()
    }

    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.inner.connect(remote, info)
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        self.inner.disconnect(remote)
    }

    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        self.inner.public_metadata(md)
    }

    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        self.inner.load_remote(remote, region, public)
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.inner.gen_notif(remote, msg)
    }
}
