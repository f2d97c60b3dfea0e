//! Disaggregated prefill/decode KV-cache transfer over UCX — the job nixl-rs exists for.
//!
//! A prefill process and a decode process on one machine each own an agent and a paged KV
//! pool (`layers x blocks x block_bytes`). They exchange metadata over the side channel. For
//! every inference request the prefill side "computes" KV blocks (fills them with data unique
//! to the request, layer and block), and the blocks move into the decode pool at the slots the
//! decode block table names: with `--op write` prefill pushes them (`make_prepped_xfer` on
//! lists prepared once, with a notification); with `--op read` decode pulls them. Decode
//! verifies every byte of every request; both sides print throughput and latency. Any
//! mismatch makes the process exit non-zero.
//!
//! ```text
//! cargo run --release --example disagg_kv -- --op write --requests 20
//! cargo run --release --example disagg_kv -- --op read --layers 32 --blocks 256 --block-bytes 65536
//! ```
//! Flags: `--op read|write`, `--requests N`, `--layers L`, `--blocks B` (pool blocks per
//! layer), `--block-bytes S`, `--blocks-per-request K`, `--backend ucx|libfabric|cuda_ipc`,
//! `--tls UCX_TLS`, `--provider tcp|shm|efa`, `--rails R` and `--domains D0,D1` (libfabric),
//! `--device cpu|cuda` (KV pools in host or GPU memory; with `cuda` the default backend is
//! `cuda_ipc`, the native CUDA IPC + copy-engine/copy-kernel path), `--timeout-secs T`,
//! `--metadata side-channel|etcd` (with `etcd`, prefill starts an etcd server and both sides
//! publish and fetch their metadata there; needs `--features etcd`), `--listen IP` (the side
//! channel's and etcd's address), `--expect-path TEXT` (fail unless the request path names
//! TEXT; repeatable).
//!
//! `--hosts 2` runs prefill and decode on two hosts of their own: network, PID, mount, IPC and
//! UTS namespaces joined by `--rails` virtual links (`nixl::core::testing::netns`; needs root
//! and iproute2), so nothing but the network path connects them, and the run fails unless the
//! path report names the network transport (UCX `tcp/eth0`, libfabric `tcp` on `eth0`):
//!
//! ```text
//! sudo cargo run --example disagg_kv --features libfabric,etcd -- --hosts 2 --backend libfabric --metadata etcd
//! ```
//! (`--role decode --peer ADDR` and `--decode external` are how the example starts its parts.)
//!
//! With a stock NIXL agent as the other side (`--nixl-peer`): the example plays `--role
//! prefill` (default) or `--role decode` and starts `examples/nixl_kv.py` (NIXL's Python API,
//! nixl-cu13 wheel from `scripts/deps/nixl.sh`) as the other role. Metadata goes over NIXL's
//! side channel (this side serves `NIXLCOMM`), notifications and data over UCX in NIXL's
//! wire; this side loads the wheel's own libucp (`NIXL_WHEEL_UCX`, or `--ucx-path`) so both
//! sides run one UCX. Host memory only.
//!
//! ```text
//! cargo run --release --example disagg_kv -- --nixl-peer --op write
//! cargo run --release --example disagg_kv -- --nixl-peer --role decode --op read
//! ```

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::mem::{CudaIpcParams, DeviceBuffer};
use nixl::ucx::UcxParams;
use nixl::{
    Agent, AgentConfig, HostBuffer, MemKind, PreparedList, XferDescList, XferOp, XferOptions,
    XferTarget,
};

#[path = "disagg_kv/hosts.rs"]
mod hosts;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[derive(Debug, Clone)]
struct Opts {
    role: String,
    peer: Option<SocketAddr>,
    op: XferOp,
    requests: usize,
    layers: usize,
    blocks: usize,
    block_bytes: usize,
    per_request: usize,
    tls: Option<String>,
    backend: String,
    provider: Option<String>,
    rails: usize,
    cuda: bool,
    timeout: Duration,
    hosts: usize,
    etcd: bool,
    etcd_url: Option<String>,
    listen: IpAddr,
    domains: Vec<String>,
    expect_path: Vec<String>,
    external_decode: bool,
    nixl_peer: bool,
    ucx_path: Option<std::path::PathBuf>,
    nixl_script: std::path::PathBuf,
}

fn parse() -> Res<Opts> {
    let mut o = Opts {
        role: "prefill".into(),
        peer: None,
        op: XferOp::Write,
        requests: 16,
        layers: 8,
        blocks: 128,
        block_bytes: 64 << 10,
        per_request: 16,
        tls: None,
        backend: String::new(),
        provider: None,
        rails: 1,
        cuda: false,
        timeout: Duration::from_secs(60),
        hosts: 1,
        etcd: false,
        etcd_url: None,
        listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
        domains: Vec::new(),
        expect_path: Vec::new(),
        external_decode: false,
        nixl_peer: false,
        ucx_path: None,
        nixl_script: concat!(env!("CARGO_MANIFEST_DIR"), "/examples/nixl_kv.py").into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| format!("{flag}: {s:?} is not a number"))
        };
        match flag.as_str() {
            "--role" => o.role = val()?.clone(),
            "--peer" => o.peer = Some(val()?.parse().map_err(|_| "--peer: not an address")?),
            "--op" => {
                o.op = match val()?.to_ascii_lowercase().as_str() {
                    "write" => XferOp::Write,
                    "read" => XferOp::Read,
                    v => return Err(format!("--op: {v} is not read|write").into()),
                }
            }
            "--requests" => o.requests = num(val()?)?,
            "--layers" => o.layers = num(val()?)?,
            "--blocks" => o.blocks = num(val()?)?,
            "--block-bytes" => o.block_bytes = num(val()?)?,
            "--blocks-per-request" => o.per_request = num(val()?)?,
            "--tls" => o.tls = Some(val()?.clone()),
            "--timeout-secs" => o.timeout = Duration::from_secs(num(val()?)? as u64),
            "--backend" => {
                o.backend = val()?.to_ascii_lowercase();
                if !matches!(o.backend.as_str(), "ucx" | "libfabric" | "cuda_ipc") {
                    return Err(
                        format!("--backend {}: ucx, libfabric or cuda_ipc", o.backend).into(),
                    );
                }
            }
            "--provider" => o.provider = Some(val()?.clone()),
            "--nixl-peer" => o.nixl_peer = true,
            "--ucx-path" => o.ucx_path = Some(val()?.into()),
            "--nixl-script" => o.nixl_script = val()?.into(),
            "--rails" => o.rails = num(val()?)?,
            "--domains" => o.domains = val()?.split(',').map(str::to_owned).collect(),
            "--hosts" => o.hosts = num(val()?)?,
            "--metadata" => {
                o.etcd = match val()?.to_ascii_lowercase().as_str() {
                    "side-channel" | "sidechannel" => false,
                    "etcd" => true,
                    v => return Err(format!("--metadata: {v} is not side-channel|etcd").into()),
                }
            }
            "--etcd" => {
                o.etcd = true;
                o.etcd_url = Some(val()?.clone());
            }
            "--listen" => o.listen = val()?.parse().map_err(|_| "--listen: not an IP address")?,
            "--expect-path" => o.expect_path.push(val()?.clone()),
            "--decode" => {
                o.external_decode = match val()?.as_str() {
                    "external" => true,
                    "child" => false,
                    v => return Err(format!("--decode: {v} is not external|child").into()),
                }
            }
            "--device" => {
                o.cuda = match val()?.to_ascii_lowercase().as_str() {
                    "cpu" | "dram" => false,
                    "cuda" | "gpu" | "vram" => true,
                    v => return Err(format!("--device: {v} is not cpu|cuda").into()),
                }
            }
            "-h" | "--help" => {
                println!("disagg_kv [--op read|write] [--requests N] [--layers L] [--blocks B] [--block-bytes S] [--blocks-per-request K] [--backend ucx|libfabric|cuda_ipc] [--tls UCX_TLS] [--provider P] [--rails R] [--domains D0,D1] [--device cpu|cuda] [--timeout-secs T] [--metadata side-channel|etcd] [--listen IP] [--expect-path TEXT] [--hosts 1|2] [--nixl-peer [--role prefill|decode] [--ucx-path LIBUCP] [--nixl-script PY]]");
                std::process::exit(0);
            }
            f => return Err(format!("unknown flag {f}").into()),
        }
    }
    if o.layers == 0 || o.blocks == 0 || o.block_bytes == 0 || o.per_request == 0 || o.requests == 0
    {
        return Err("sizes and counts must be positive".into());
    }
    if o.per_request > o.blocks {
        return Err("--blocks-per-request exceeds --blocks".into());
    }
    if o.backend.is_empty() {
        o.backend = if o.cuda { "cuda_ipc" } else { "ucx" }.into();
    }
    if o.rails == 0 {
        return Err("--rails must be positive".into());
    }
    if !matches!(o.hosts, 1 | 2) {
        return Err("--hosts must be 1 or 2".into());
    }
    if o.etcd && !cfg!(feature = "etcd") {
        return Err("--metadata etcd needs `--features etcd`".into());
    }
    if o.nixl_peer && (o.backend != "ucx" || o.cuda) {
        return Err("--nixl-peer runs over UCX with host memory".into());
    }
    if o.nixl_peer && o.ucx_path.is_none() {
        o.ucx_path = std::env::var_os("NIXL_WHEEL_UCX").map(Into::into);
        if o.ucx_path.is_none() {
            return Err("--nixl-peer needs the NIXL wheel's libucp: run scripts/deps/nixl.sh and set NIXL_WHEEL_UCX, or pass --ucx-path".into());
        }
    }
    Ok(o)
}

/// The bytes prefill "computes" for (request, layer, k-th block of the request).
fn kv_bytes(req: usize, layer: usize, k: usize, out: &mut [u8]) {
    let mut x = ((req as u64) << 40 ^ (layer as u64) << 20 ^ k as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        | 1;
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// The block tables of a request: prefill's source blocks and decode's destination blocks.
fn tables(o: &Opts, req: usize) -> (Vec<usize>, Vec<usize>) {
    let b = o.blocks;
    let src = (0..o.per_request)
        .map(|k| (req * o.per_request + k) % b)
        .collect();
    // Decode allocates scattered slots (a stride coprime-ish to the pool size).
    let stride = (b / 2 + 1) | 1;
    let dst = (0..o.per_request)
        .map(|k| ((req * 31 + k) * stride + req) % b)
        .collect::<Vec<_>>();
    let mut seen = vec![false; b];
    let dst = dst
        .into_iter()
        .map(|mut d| {
            while seen[d] {
                d = (d + 1) % b;
            }
            seen[d] = true;
            d
        })
        .collect();
    (src, dst)
}

/// Descriptor indices of the request's blocks across all layers.
fn indices(o: &Opts, blocks: &[usize]) -> Vec<usize> {
    (0..o.layers)
        .flat_map(|l| blocks.iter().map(move |&b| l * o.blocks + b))
        .collect()
}

/// A KV pool in host or GPU memory.
enum Pool {
    Host(Arc<HostBuffer>),
    Cuda(Arc<DeviceBuffer>),
}

impl Pool {
    fn addr(&self) -> u64 {
        match self {
            Pool::Host(b) => b.addr(),
            Pool::Cuda(b) => b.addr(),
        }
    }

    fn kind(&self) -> MemKind {
        match self {
            Pool::Host(_) => MemKind::Dram,
            Pool::Cuda(_) => MemKind::Vram,
        }
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Res<()> {
        match self {
            Pool::Host(b) if b.write_at(offset, src) => Ok(()),
            Pool::Host(_) => Err("write past the pool".into()),
            Pool::Cuda(b) => Ok(b.copy_from_host(offset, src)?),
        }
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Res<()> {
        match self {
            Pool::Host(b) if b.read_at(offset, dst) => Ok(()),
            Pool::Host(_) => Err("read past the pool".into()),
            Pool::Cuda(b) => Ok(b.copy_to_host(offset, dst)?),
        }
    }
}

struct Node {
    agent: Agent,
    pool: Pool,
    _reg: nixl::Registration,
    /// The etcd exchange (and server) when metadata goes through etcd.
    meta: hosts::Meta,
}

fn node(name: &str, o: &Opts) -> Res<Node> {
    let agent = Agent::new(
        name,
        AgentConfig {
            // A NIXL peer speaks NIXL's side channel (served by `nixl_peer` below).
            listen: !o.nixl_peer,
            listen_addr: SocketAddr::new(o.listen, 0),
            default_timeout: o.timeout,
            ..AgentConfig::default()
        },
    )?;
    match o.backend.as_str() {
        #[cfg(feature = "libfabric")]
        "libfabric" => {
            use nixl::libfabric::LibfabricParams;
            let mut p = match o.provider.as_deref() {
                None | Some("tcp") => LibfabricParams::tcp_loopback(o.rails),
                Some(p) => LibfabricParams {
                    rails: o.rails,
                    ..LibfabricParams::with_provider(p)
                },
            };
            if !o.domains.is_empty() {
                p.domains = o.domains.clone();
            }
            agent.create_backend(p)?;
        }
        #[cfg(not(feature = "libfabric"))]
        "libfabric" => return Err("--backend libfabric needs `--features libfabric`".into()),
        "cuda_ipc" => {
            agent.create_backend(CudaIpcParams::default())?;
        }
        _ => {
            agent.create_backend(UcxParams {
                transports: o.tls.clone(),
                library_path: o.ucx_path.clone(),
                nixl_compat: o.nixl_peer,
                ..UcxParams::default()
            })?;
        }
    }
    let len = o.layers * o.blocks * o.block_bytes;
    let (pool, reg) = if o.cuda {
        let b = Arc::new(DeviceBuffer::new(0, len)?);
        let reg = agent.register_mem(vec![b.clone()], &[])?;
        (Pool::Cuda(b), reg)
    } else {
        let b = Arc::new(HostBuffer::new(len).ok_or("cannot allocate the KV pool")?);
        let reg = agent.register_mem(vec![b.clone()], &[])?;
        (Pool::Host(b), reg)
    };
    Ok(Node {
        agent,
        pool,
        _reg: reg,
        meta: hosts::Meta::default(),
    })
}

fn dlist(o: &Opts, base: u64) -> XferDescList {
    XferDescList::blocks(
        if o.cuda { MemKind::Vram } else { MemKind::Dram },
        base,
        o.block_bytes as u64,
        o.layers * o.blocks,
    )
}

fn next_notif(a: &Agent, from: &str, queue: &mut Vec<Vec<u8>>, timeout: Duration) -> Res<String> {
    let end = Instant::now() + timeout;
    while queue.is_empty() {
        if Instant::now() >= end {
            return Err(format!("{}: no message from {from} within {timeout:?}", a.name()).into());
        }
        match a.wait_notifs(Duration::from_millis(100)) {
            Ok(mut n) => queue.extend(n.remove(from).unwrap_or_default()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(String::from_utf8(queue.remove(0))?)
}

struct Stats(Vec<Duration>);

impl Stats {
    fn line(&mut self, what: &str, bytes_each: usize) -> String {
        self.0.sort();
        let n = self.0.len().max(1);
        let total: Duration = self.0.iter().sum();
        let pct = |p: f64| {
            self.0
                .get(((n as f64 * p) as usize).min(n - 1))
                .copied()
                .unwrap_or_default()
        };
        let gbps = (bytes_each * self.0.len()) as f64 / total.as_secs_f64().max(1e-9) / 1e9;
        format!(
            "{what}: {} requests x {} KiB: {gbps:.2} GB/s, latency median {:?} p99 {:?}",
            self.0.len(),
            bytes_each >> 10,
            pct(0.5),
            pct(0.99)
        )
    }
}

fn fill_request(o: &Opts, n: &Node, req: usize, src: &[usize]) -> Res<()> {
    let mut tmp = vec![0u8; o.block_bytes];
    for l in 0..o.layers {
        for (k, &b) in src.iter().enumerate() {
            kv_bytes(req, l, k, &mut tmp);
            n.pool.write_at((l * o.blocks + b) * o.block_bytes, &tmp)?;
        }
    }
    Ok(())
}

fn verify_request(o: &Opts, n: &Node, req: usize, dst: &[usize]) -> Res<()> {
    let (mut want, mut got) = (vec![0u8; o.block_bytes], vec![0u8; o.block_bytes]);
    for l in 0..o.layers {
        for (k, &b) in dst.iter().enumerate() {
            kv_bytes(req, l, k, &mut want);
            n.pool
                .read_at((l * o.blocks + b) * o.block_bytes, &mut got)?;
            if want != got {
                let at = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(0);
                return Err(
                    format!("request {req}: layer {l} block {b} differs at byte {at}").into(),
                );
            }
        }
    }
    Ok(())
}

fn prefill(o: &Opts, ctl: Option<&hosts::Control>) -> Res<()> {
    let mut n = node("prefill", o)?;
    let addr = n.agent.listen_addr().ok_or("side channel not listening")?;
    let etcd = n.meta.serve(o, &n.agent)?;
    if o.external_decode {
        // Started by `--hosts 2` in its own host: announce where decode finds us.
        hosts::announce(ctl, addr, etcd.as_deref());
        return prefill_run(o, &n);
    }
    let exe = std::env::current_exe()?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.extend([
        "--role".into(),
        "decode".into(),
        "--peer".into(),
        addr.to_string(),
    ]);
    if let Some(url) = etcd {
        args.extend(["--etcd".into(), url]);
    }
    let mut child = Command::new(exe).args(&args).stdin(Stdio::null()).spawn()?;
    let r = prefill_run(o, &n);
    let end = Instant::now() + o.timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= end || r.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    r?;
    match status {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(format!("decode exited with {st}").into()),
        None => Err("decode did not exit in time".into()),
    }
}

fn prefill_run(o: &Opts, n: &Node) -> Res<()> {
    let a = &n.agent;
    let mut q = Vec::new();
    let msg = next_notif(a, "decode", &mut q, o.timeout)?;
    let decode_pool: u64 = msg
        .strip_prefix("ready:")
        .and_then(|s| s.parse().ok())
        .ok_or("bad ready message")?;
    // Over etcd, decode published its metadata before it said ready.
    n.meta.fetch(o, "decode")?;
    println!(
        "prefill: {} KV pool, connected to decode: {:?}",
        n.pool.kind(),
        a.path_report("decode")
    );
    let per_req = o.layers * o.per_request * o.block_bytes;
    let mut xfer = Stats(Vec::new());
    let mut e2e = Stats(Vec::new());
    let (local, remote) = if o.op == XferOp::Write {
        let local = a.prep_xfer_dlist(XferTarget::Initiator, &dlist(o, n.pool.addr()), &[])?;
        let remote = a.prep_xfer_dlist(XferTarget::Agent("decode"), &dlist(o, decode_pool), &[])?;
        (Some(local), Some(remote))
    } else {
        a.gen_notif("decode", format!("pool:{}", n.pool.addr()).as_bytes(), &[])?;
        (None, None)
    };
    for req in 0..o.requests {
        let (src, dst) = tables(o, req);
        fill_request(o, n, req, &src)?;
        let started = Instant::now();
        let tag = format!("req:{req}");
        if let (Some(local), Some(remote)) = (&local, &remote) {
            let x = a.make_prepped_xfer(
                XferOp::Write,
                local,
                &indices(o, &src),
                remote,
                &indices(o, &dst),
                XferOptions::with_notif(tag.into_bytes()),
            )?;
            a.post_xfer_req(&x)?;
            x.wait(o.timeout)?;
            xfer.0.push(started.elapsed());
            if req == 0 {
                println!("prefill: request path: {}", x.path());
                hosts::check_path(o, &x.path())?;
            }
        } else {
            a.gen_notif("decode", tag.as_bytes(), &[])?;
        }
        let reply = next_notif(a, "decode", &mut q, o.timeout)?;
        if reply != format!("ok:{req}") {
            return Err(format!("decode reported: {reply}").into());
        }
        e2e.0.push(started.elapsed());
    }
    a.gen_notif("decode", b"done", &[])?;
    if o.op == XferOp::Write {
        println!(
            "prefill: WRITE {}",
            xfer.line("transfer (post to done)", per_req)
        );
    }
    println!(
        "prefill: {}",
        e2e.line("request incl. decode verification", per_req)
    );
    Ok(())
}

fn decode(o: &Opts, peer: SocketAddr) -> Res<()> {
    let mut n = node("decode", o)?;
    if o.etcd {
        n.meta.join(o, &n.agent)?;
        n.meta.fetch(o, "prefill")?;
    } else {
        n.agent
            .fetch_remote_metadata_blocking("prefill", peer, o.timeout)?;
        n.agent.send_local_metadata(peer)?;
    }
    decode_run(o, &n)
}

fn decode_run(o: &Opts, n: &Node) -> Res<()> {
    let a = &n.agent;
    if o.op == XferOp::Write {
        // The requests' path is prefill's to check; decode checks the connection it has.
        hosts::check_path(o, &format!("{:?}", a.path_report("prefill")))?;
    }
    a.gen_notif(
        "prefill",
        format!("ready:{}", n.pool.addr()).as_bytes(),
        &[],
    )?;
    let per_req = o.layers * o.per_request * o.block_bytes;
    let mut q = Vec::new();
    let mut lists: Option<(PreparedList, PreparedList)> = None;
    let mut xfer = Stats(Vec::new());
    let mut verified = 0usize;
    let mut seen: HashMap<usize, bool> = HashMap::new();
    loop {
        let msg = next_notif(a, "prefill", &mut q, o.timeout)?;
        if msg == "done" {
            break;
        }
        if let Some(p) = msg.strip_prefix("pool:") {
            let base: u64 = p.parse()?;
            let local = a.prep_xfer_dlist(XferTarget::Initiator, &dlist(o, n.pool.addr()), &[])?;
            let remote = a.prep_xfer_dlist(XferTarget::Agent("prefill"), &dlist(o, base), &[])?;
            lists = Some((local, remote));
            continue;
        }
        let req: usize = msg
            .strip_prefix("req:")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("unexpected message {msg}"))?;
        let (src, dst) = tables(o, req);
        if o.op == XferOp::Read {
            let (local, remote) = lists
                .as_ref()
                .ok_or("READ before the prefill pool was announced")?;
            let started = Instant::now();
            let x = a.make_prepped_xfer(
                XferOp::Read,
                local,
                &indices(o, &dst),
                remote,
                &indices(o, &src),
                XferOptions::default(),
            )?;
            a.post_xfer_req(&x)?;
            x.wait(o.timeout)?;
            xfer.0.push(started.elapsed());
            if req == 0 {
                println!("decode: request path: {}", x.path());
                hosts::check_path(o, &x.path())?;
            }
        }
        let verdict = verify_request(o, n, req, &dst);
        let reply = match &verdict {
            Ok(()) => format!("ok:{req}"),
            Err(e) => format!("bad:{req}: {e}"),
        };
        a.gen_notif("prefill", reply.as_bytes(), &[])?;
        verdict?;
        seen.insert(req, true);
        verified += 1;
    }
    if verified != o.requests {
        return Err(format!("decode verified {verified} of {} requests", o.requests).into());
    }
    if o.op == XferOp::Read {
        println!(
            "decode: READ {}",
            xfer.line("transfer (post to done)", per_req)
        );
    }
    println!(
        "decode: verified every byte of {verified} requests ({} MiB each)",
        per_req >> 20
    );
    Ok(())
}

/// This side against a stock NIXL agent (`examples/nixl_kv.py`) playing the other role.
fn nixl_peer(o: &Opts) -> Res<()> {
    let (me, other) = match o.role.as_str() {
        "prefill" => ("prefill", "decode"),
        "decode" => ("decode", "prefill"),
        r => return Err(format!("unknown role {r}").into()),
    };
    let n = node(me, o)?;
    let listener = nixl::nixl_wire::NixlListener::start(&n.agent, ([127, 0, 0, 1], 0).into())?;
    let py_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let op = if o.op == XferOp::Write {
        "write"
    } else {
        "read"
    };
    let mut cmd = Command::new("python3");
    cmd.arg(&o.nixl_script);
    for (k, v) in [
        ("--role", other.to_owned()),
        ("--peer-port", listener.local_addr().port().to_string()),
        ("--listen-port", py_port.to_string()),
        ("--op", op.to_owned()),
        ("--requests", o.requests.to_string()),
        ("--layers", o.layers.to_string()),
        ("--blocks", o.blocks.to_string()),
        ("--block-bytes", o.block_bytes.to_string()),
        ("--blocks-per-request", o.per_request.to_string()),
        ("--timeout", o.timeout.as_secs().to_string()),
    ] {
        cmd.args([k, &v]);
    }
    if let Some(p) = std::env::var_os("NIXL_PYTHONPATH") {
        cmd.env("PYTHONPATH", p);
    }
    if let Some(t) = &o.tls {
        cmd.env("UCX_TLS", t);
    }
    let mut child = cmd.stdin(Stdio::null()).spawn()?;
    // The NIXL agent sends its metadata to our listener and fetches ours from it.
    let end = Instant::now() + o.timeout;
    let mut r: Res<()> = Ok(());
    while !n.agent.check_remote_metadata(other, None) {
        if Instant::now() >= end || child.try_wait()?.is_some() {
            r = Err(format!("no metadata from the NIXL {other} within {:?}", o.timeout).into());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "{me} (nixl-rs): NIXL peer {other} loaded over NIXLCOMM, wire {:?}",
        n.agent.peer_wire(other)
    );
    if r.is_ok() {
        r = if me == "prefill" {
            prefill_run(o, &n)
        } else {
            decode_run(o, &n)
        };
    }
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= end + o.timeout || r.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    r?;
    match status {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(format!("the NIXL {other} exited with {st}").into()),
        None => Err(format!("the NIXL {other} did not exit in time").into()),
    }
}

fn main() -> Res<()> {
    let o = parse()?;
    if o.nixl_peer {
        if std::env::var_os("UCX_MODULES").is_none() {
            // The NIXL wheel's UCX loads its bundled libnl through the ib and rdmacm modules,
            // and libnl crashes in its exit handlers. Set before any thread or UCX exists.
            std::env::set_var("UCX_MODULES", "^ib,rdmacm");
        }
        return nixl_peer(&o);
    }
    // Present when `--hosts 2` started this process in a host: it exits with its parent.
    let ctl = hosts::control();
    match (o.role.as_str(), o.peer) {
        ("prefill", _) if o.hosts == 2 => hosts::run(&o),
        ("prefill", _) => prefill(&o, ctl.as_ref()),
        ("decode", Some(peer)) => decode(&o, peer),
        ("decode", None) => Err("--role decode needs --peer".into()),
        (r, _) => Err(format!("unknown role {r}").into()),
    }
}
