//! Where the main job's parts run and how they find each other: the two-host placement
//! (`--hosts 2`), the metadata exchange over etcd or a TCPStore (`--metadata etcd|tcpstore`),
//! and the check that the request path is the one asked for (`--expect-path`).

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use nixl::Agent;
pub(crate) use nixl_testkit::netns::Control;
use nixl_testkit::netns::{Net, NetSpec};

use crate::{Opts, Res};

/// The control channel to the `--hosts 2` parent, when this process is one of its parts (its
/// reader exits the process if the parent goes away).
pub(crate) fn control() -> Option<Control> {
    Control::connect()
}

/// Metadata through etcd or a c10d TCPStore: the exchange, and the server when this process
/// started it.
#[derive(Default)]
pub(crate) struct Meta {
    #[cfg(feature = "etcd")]
    exchange: Option<nixl::core::etcd::EtcdExchange>,
    #[cfg(feature = "etcd")]
    server: Option<nixl::core::etcd::LocalEtcd>,
    tcpstore: Option<nixl::core::tcpstore::TcpStoreExchange>,
    tcpstore_server: Option<nixl::core::tcpstore::TcpStoreServer>,
}

impl Meta {
    /// Prefill's side: with `--metadata etcd`, starts etcd on `--listen` (unless `--etcd URL`
    /// names one), with `--metadata tcpstore` a TCPStore (unless `--tcpstore` names one), and
    /// publishes the agent there. Returns the argument that points decode at the store.
    pub(crate) fn serve(&mut self, o: &Opts, agent: &Agent) -> Res<Option<String>> {
        if o.tcpstore {
            use nixl::core::tcpstore::{TcpStoreServer, TcpStoreServerConfig};
            let endpoint = match &o.tcpstore_url {
                Some(e) => e.clone(),
                None => {
                    // Across hosts the store listens on the link (c10d has no authentication:
                    // the network namespaces of `--hosts 2` are the test's own).
                    let cfg = TcpStoreServerConfig::default().allow_remote(!o.listen.is_loopback());
                    let server = TcpStoreServer::start(SocketAddr::new(o.listen, 0), &cfg)?;
                    let endpoint = server.endpoint();
                    println!("prefill: serving a TCPStore at {endpoint}");
                    self.tcpstore_server = Some(server);
                    endpoint
                }
            };
            self.open_tcpstore(agent, &endpoint)?;
            return Ok(Some(format!("--tcpstore={endpoint}")));
        }
        if !o.etcd {
            return Ok(None);
        }
        #[cfg(feature = "etcd")]
        {
            let url = match &o.etcd_url {
                Some(u) => u.clone(),
                None => {
                    let server = nixl::core::etcd::LocalEtcd::start_on(o.listen)?;
                    let url = server.endpoint();
                    println!("prefill: started etcd at {url}");
                    self.server = Some(server);
                    url
                }
            };
            self.open(agent, &url)?;
            Ok(Some(format!("--etcd={url}")))
        }
        #[cfg(not(feature = "etcd"))]
        {
            let _ = agent;
            Err("--metadata etcd needs `--features etcd`".into())
        }
    }

    /// Decode's side: joins the store `--etcd URL` or `--tcpstore HOST:PORT` names and
    /// publishes the agent.
    pub(crate) fn join(&mut self, o: &Opts, agent: &Agent) -> Res<()> {
        if o.tcpstore {
            let endpoint = o
                .tcpstore_url
                .as_deref()
                .ok_or("decode over a TCPStore needs --tcpstore HOST:PORT")?;
            return self.open_tcpstore(agent, endpoint);
        }
        let url = o
            .etcd_url
            .as_deref()
            .ok_or("decode over etcd needs --etcd URL")?;
        #[cfg(feature = "etcd")]
        {
            self.open(agent, url)
        }
        #[cfg(not(feature = "etcd"))]
        {
            let _ = (agent, url);
            Err("--metadata etcd needs `--features etcd`".into())
        }
    }

    fn open_tcpstore(&mut self, agent: &Agent, endpoint: &str) -> Res<()> {
        use nixl::core::tcpstore::{TcpStoreConfig, TcpStoreExchange};
        let x = TcpStoreExchange::new(agent, &TcpStoreConfig::default().endpoint(endpoint))?;
        x.publish()?;
        self.tcpstore = Some(x);
        Ok(())
    }

    #[cfg(feature = "etcd")]
    fn open(&mut self, agent: &Agent, url: &str) -> Res<()> {
        use nixl::core::etcd::{EtcdConfig, EtcdExchange};
        let x = EtcdExchange::new(
            agent,
            &EtcdConfig::default().endpoints(vec![url.to_owned()]),
        )?;
        x.publish()?;
        self.exchange = Some(x);
        Ok(())
    }

    /// Loads `remote`'s metadata from the store (waiting for it to be published); nothing to
    /// do over the side channel, where metadata is fetched and pushed directly.
    pub(crate) fn fetch(&self, o: &Opts, remote: &str) -> Res<()> {
        if let Some(x) = &self.tcpstore {
            x.fetch(remote, o.timeout)?;
        }
        #[cfg(feature = "etcd")]
        if let Some(x) = &self.exchange {
            x.fetch(remote, o.timeout)?;
        }
        let _ = (o, remote);
        Ok(())
    }
}

/// Prefill started with `--decode external`: tells the parent (or the user) where decode
/// finds it.
pub(crate) fn announce(ctl: Option<&Control>, addr: SocketAddr, store: Option<&str>) {
    let line = format!("listening {addr} {}", store.unwrap_or("-"));
    match ctl {
        Some(c) => c.send(&line),
        None => println!("prefill: {line}"),
    }
}

/// Fails unless `path` names every `--expect-path` text.
pub(crate) fn check_path(o: &Opts, path: &str) -> Res<()> {
    match o.expect_path.iter().find(|t| !path.contains(t.as_str())) {
        Some(t) => Err(format!("the path {path:?} does not name {t:?}").into()),
        None => Ok(()),
    }
}

/// The arguments the user gave, without `--hosts N`.
fn user_args() -> Vec<String> {
    let mut out = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--hosts" {
            it.next();
        } else {
            out.push(a);
        }
    }
    out
}

/// `--hosts 2`: prefill on host 0 and decode on host 1 of a fresh two-host net with `--rails`
/// links, each part this program again; the run succeeds when both parts do.
pub(crate) fn run(o: &Opts) -> Res<()> {
    let net = Net::create(&NetSpec::pair(o.rails))?;
    let ip = |h| net.addr(0, h).ok_or("host not on link 0");
    let (ip0, ip1) = (ip(0)?, ip(1)?);
    let mut args = user_args();
    let libfabric = o.backend == "libfabric";
    // The links' interfaces: libfabric's domains, UCX's devices (its tcp transport listens on
    // the loopback interface only unless told which interfaces to use).
    if o.domains.is_empty() {
        let d: Vec<String> = (0..o.rails).map(Net::ifname).collect();
        args.extend(["--domains".into(), d.join(",")]);
    }
    // The network path, not a loopback or shared-memory one.
    let expect = if libfabric {
        ["libfabric tcp", "eth0"]
    } else {
        ["tcp/eth", "UCX"]
    };
    for e in expect {
        args.extend(["--expect-path".into(), e.into()]);
    }
    println!(
        "disagg_kv: prefill on host 0 ({ip0}), decode on host 1 ({ip1}), {} link(s) ({})",
        o.rails,
        net.tag()
    );
    let exe = std::env::current_exe()?;
    let mut prefill_args = args.clone();
    prefill_args.extend([
        "--listen".into(),
        ip0.to_string(),
        "--decode".into(),
        "external".into(),
    ]);
    let with_cred = |mut c: Command| {
        if let Some(cr) = &o.cred {
            c.env(nixl::core::access::Credential::ENV, cr.export());
        }
        c
    };
    let mut pc = Command::new(&exe);
    pc.args(&prefill_args);
    let mut p = net.spawn(0, "prefill", &with_cred(pc))?;
    let line = p.expect("listening ", o.timeout)?;
    let mut words = line.split_whitespace();
    let addr = words
        .next()
        .ok_or("prefill announced no address")?
        .to_owned();
    let mut decode_args = args;
    decode_args.extend([
        "--role".into(),
        "decode".into(),
        "--peer".into(),
        addr,
        "--listen".into(),
        ip1.to_string(),
    ]);
    // The argument that points decode at prefill's metadata store (`--etcd=URL`, ...).
    if let Some(arg) = words.next().filter(|u| *u != "-") {
        decode_args.push(arg.to_owned());
    }
    let mut dc = Command::new(&exe);
    dc.args(&decode_args);
    let mut d = net.spawn(1, "decode", &with_cred(dc))?;
    let end = Instant::now() + o.timeout * 2;
    let left = || {
        end.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let ds = d.wait(left());
    let ps = p.wait(left());
    for s in 0..o.rails {
        let c = net.counters(s, 0)?;
        println!(
            "disagg_kv: host 0 {}: sent {} KiB, received {} KiB",
            Net::ifname(s),
            c.tx_bytes >> 10,
            c.rx_bytes >> 10
        );
    }
    match (ps?, ds?) {
        (ps, ds) if ps.success() && ds.success() => Ok(()),
        (ps, ds) => Err(format!("prefill exited with {ps}, decode with {ds}").into()),
    }
}
