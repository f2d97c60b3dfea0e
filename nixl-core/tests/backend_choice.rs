//! When the preferred backend declines a transfer (`NotSupported` from `prepare_xfer`), the
//! agent falls back to the next one that holds both sides; the request reports which.

use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::inproc::InprocBackend;
use nixl_core::backend::Capabilities;
use nixl_core::backend::{
    Backend, BackendContext, BackendMd, BackendParams, BackendXfer, PeerBackend, XferSpec,
};
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, InprocParams, MemKind, Op, RegionDesc, Result,
    XferDescList, XferOp, XferOptions,
};
use nixl_testkit::unique;

/// A real INPROC backend under another name that declines every transfer.
struct Declining(InprocBackend);

impl Backend for Declining {
    fn name(&self) -> &str {
        "DECLINING"
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        self.0.register(region)
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        self.0.deregister(md)
    }

    fn prepare_xfer(&self, _spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        Err(Error::not_supported(
            "test",
            Op::MakeXfer,
            "this backend cannot reach that region",
        ))
    }

    fn peers(&self) -> Option<&dyn PeerBackend> {
        Some(self)
    }
}

impl PeerBackend for Declining {
    fn connection_info(&self) -> Result<Vec<u8>> {
        self.0.connection_info()
    }

    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.0.connect(remote, info)
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        self.0.disconnect(remote)
    }

    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        self.0.public_metadata(md)
    }

    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        self.0.load_remote(remote, region, public)
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.0.gen_notif(remote, msg)
    }
}

struct DecliningParams;

impl BackendParams for DecliningParams {
    fn backend_name(&self) -> &str {
        "DECLINING"
    }
    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(Declining(InprocBackend::new(ctx))))
    }
}

fn agent(prefix: &str) -> Agent {
    let a = Agent::new(&unique(prefix), AgentConfig::default()).unwrap();
    a.create_backend(DecliningParams).unwrap();
    a.create_backend(InprocParams::default()).unwrap();
    a
}

#[test]
fn a_declining_backend_yields_to_the_next() {
    let a = agent("bc-a");
    let b = agent("bc-b");
    let (sa, sb) = (
        Arc::new(HostBuffer::new(4096).unwrap()),
        Arc::new(HostBuffer::new(4096).unwrap()),
    );
    let ra = a.register_mem(vec![sa.clone()], &[]).unwrap();
    let _rb = b.register_mem(vec![sb.clone()], &[]).unwrap();
    let mut names: Vec<String> = ra.backends().iter().map(|h| h.name().to_owned()).collect();
    names.sort();
    assert_eq!(names, vec!["DECLINING".to_owned(), "INPROC".to_owned()]);
    a.load_remote_metadata(&b.local_metadata().unwrap())
        .unwrap();
    sa.fill(5);
    let l = XferDescList::blocks(MemKind::Dram, sa.addr(), 4096, 1);
    let r = XferDescList::blocks(MemKind::Dram, sb.addr(), 4096, 1);
    let req = a
        .create_xfer_req(XferOp::Write, &l, &r, b.name(), XferOptions::default())
        .unwrap();
    assert_eq!(req.backend().name(), "INPROC");
    a.post_xfer_req(&req).unwrap();
    req.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(sb.to_vec(), vec![5u8; 4096]);
    // Restricted to the declining backend, its refusal is what the caller sees.
    let only =
        XferOptions::default().backends(vec![a.backend("DECLINING").expect("declining backend")]);
    assert!(matches!(
        a.create_xfer_req(XferOp::Write, &l, &r, b.name(), only),
        Err(Error::NotSupported { .. })
    ));
}
