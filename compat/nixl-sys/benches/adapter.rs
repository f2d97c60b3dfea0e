//! What the drop-in costs: the block manager example's transfers (`examples/block_manager.rs`)
//! through nixl-sys's API on nixl-rs-sys and through nixl-rs's own API, in one run.
//!
//! Each side has two agents in this process (a prefill one with UCX and POSIX, a decode one
//! with UCX), built the way each API builds them: the same plugins, the same UCX parameters
//! (nixl-sys's defaults on nixl-rs: `nixl_compat`), the same metadata format (NIXL's, or
//! nixl-rs's with `NIXL_RS_METADATA=native`), host pools of nixl-rs's host buffers
//! (`SystemStorage` is one) and a page-cache file. A round is the example's three requests,
//! each built, posted and polled to its end as the example does:
//!
//! - offload: every block host -> disk (`create_xfer_req`, POSIX);
//! - onboard: every block disk -> a cleared host pool;
//! - WRITE to decode by index, reversed, with a notification (`make_xfer_req` on lists
//!   prepared once, UCX), timed until the decode agent has the notification.
//!
//! Rounds alternate which API goes first. Every byte of every round is checked outside the
//! timed spans (and the pools cleared again), so a request that moved nothing fails the run.
//! It prints each request's median time and throughput per API and the drop-in's cost
//! (`dropin / native - 1` of the medians, and of the summed round time).
//!
//! ```text
//! cargo bench -p nixl-rs-sys --bench adapter -- --blocks 64 --block-bytes 65536 --rounds 30
//! ```

use std::error::Error;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

#[path = "../examples/block_manager/pools.rs"]
mod pools;
use pools::{check_blocks, pattern};

type Res<T> = Result<T, Box<dyn Error>>;

const DEADLINE: Duration = Duration::from_secs(60);

/// The block manager's requests through the drop-in and through nixl-rs's own API.
#[derive(Parser, Debug)]
#[command(name = "adapter")]
struct Args {
    /// Blocks per pool.
    #[arg(long, default_value_t = 64)]
    blocks: usize,
    /// Bytes per block.
    #[arg(long, default_value_t = 65536)]
    block_bytes: usize,
    /// Measured rounds per API.
    #[arg(long, default_value_t = 30)]
    rounds: usize,
    /// Unmeasured rounds per API first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Where the disk pools' files live (default: the temp dir).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Cargo's own flag for benches (`cargo bench` passes it); ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The three requests of a round, in order.
const OPS: [&str; 3] = [
    "offload host->disk",
    "onboard disk->host",
    "WRITE to decode",
];

/// One API's setup: runs a round, returning each request's time.
trait Side {
    fn name(&self) -> &'static str;
    fn round(&mut self) -> Res<[Duration; 3]>;
}

/// A page-cache file of `len` bytes, unlinked once open.
fn disk_file(dir: &std::path::Path, tag: &str, len: usize) -> Res<File> {
    let path = dir.join(format!("adapter-{tag}-{}", std::process::id()));
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    f.set_len(len as u64)?;
    std::fs::remove_file(&path)?;
    Ok(f)
}

/// Polls `done` until it says the request ended (`Ok(true)`), failing past the deadline.
fn spin(what: &str, mut done: impl FnMut() -> Res<bool>) -> Res<()> {
    let t0 = Instant::now();
    while !done()? {
        if t0.elapsed() > DEADLINE {
            return Err(format!("{what}: not done within {DEADLINE:?}").into());
        }
        std::thread::yield_now();
    }
    Ok(())
}

mod dropin {
    use super::*;
    use nixl_sys::*;

    use crate::pools::{DiskPool, HostPool};

    fn backend(agent: &Agent, plugin: &str) -> Res<OptArgs> {
        let (_mems, params) = agent.get_plugin_params(plugin)?;
        let b = agent.create_backend(plugin, &params)?;
        let mut opt = OptArgs::new()?;
        opt.add_backend(&b)?;
        Ok(opt)
    }

    fn blocks(
        kind: MemType,
        base: usize,
        dev: u64,
        n: usize,
        bb: usize,
    ) -> Res<XferDescList<'static>> {
        let mut l = XferDescList::new(kind)?;
        for i in 0..n {
            l.add_desc(base + i * bb, bb, dev);
        }
        Ok(l)
    }

    fn wait(agent: &Agent, req: &XferRequest, what: &str) -> Res<()> {
        spin(what, || match agent.get_xfer_status(req) {
            Ok(s) => Ok(s.is_success()),
            Err(e) => Err(format!("{what}: {e} ({:?})", last_error()).into()),
        })
    }

    pub(crate) struct DropIn {
        n: usize,
        bb: usize,
        prefill: Agent,
        decode: Agent,
        decode_name: String,
        posix: OptArgs,
        host: HostPool,
        restore: HostPool,
        dst: HostPool,
        host_list: XferDescList<'static>,
        restore_list: XferDescList<'static>,
        disk_list: XferDescList<'static>,
        local: XferDlistHandle,
        remote: XferDlistHandle,
        _disk: DiskPool,
        _regs: Vec<RegistrationHandle>,
    }

    impl DropIn {
        pub(crate) fn new(args: &Args, dir: &std::path::Path) -> Res<Self> {
            let (n, bb) = (args.blocks, args.block_bytes);
            let tag = std::process::id();
            let prefill = Agent::new(&format!("adapter-dropin-prefill-{tag}"))?;
            let ucx = backend(&prefill, "UCX")?;
            let posix = backend(&prefill, "POSIX")?;
            let decode = Agent::new(&format!("adapter-dropin-decode-{tag}"))?;
            let decode_ucx = backend(&decode, "UCX")?;

            let pool = || HostPool::new(n * bb).ok_or("host pool allocation");
            let host = pool()?;
            host.0.write_at(0, &pattern(n, bb));
            let (restore, dst) = (pool()?, pool()?);
            let disk = DiskPool {
                file: disk_file(dir, "dropin", n * bb)?,
                len: n * bb,
            };
            let regs = vec![
                prefill.register_memory(&host, None)?,
                prefill.register_memory(&restore, None)?,
                decode.register_memory(&dst, Some(&decode_ucx))?,
                prefill.register_memory(&disk, Some(&posix))?,
            ];

            let decode_name = prefill.load_remote_md(&decode.get_local_md()?)?;
            decode.load_remote_md(&prefill.get_local_md()?)?;
            prefill.make_connection(&decode_name, Some(&ucx))?;
            let (h, r, d) = (host.addr(), restore.addr(), dst.addr());
            let host_list = blocks(MemType::Dram, h, 0, n, bb)?;
            let restore_list = blocks(MemType::Dram, r, 0, n, bb)?;
            let disk_list = blocks(MemType::File, 0, disk.device_id(), n, bb)?;
            let local = prefill.prepare_xfer_dlist("", &host_list, Some(&ucx))?;
            let remote_list = blocks(MemType::Dram, d, 0, n, bb)?;
            let remote = prefill.prepare_xfer_dlist(&decode_name, &remote_list, Some(&ucx))?;
            Ok(DropIn {
                n,
                bb,
                prefill,
                decode,
                decode_name,
                posix,
                host,
                restore,
                dst,
                host_list,
                restore_list,
                disk_list,
                local,
                remote,
                _disk: disk,
                _regs: regs,
            })
        }
    }

    impl Side for DropIn {
        fn name(&self) -> &'static str {
            "drop-in (nixl-sys API)"
        }

        fn round(&mut self) -> Res<[Duration; 3]> {
            let (a, n, bb) = (&self.prefill, self.n, self.bb);
            let me = a.name();
            // A storage request built from the lists, posted and polled to its end.
            let hop = |op, local: &XferDescList<'_>, what| -> Res<Duration> {
                let t0 = Instant::now();
                let req = a.create_xfer_req(op, local, &self.disk_list, &me, Some(&self.posix))?;
                a.post_xfer_req(&req, None)?;
                wait(a, &req, what)?;
                drop(req);
                Ok(t0.elapsed())
            };
            let t_off = hop(XferOp::Write, &self.host_list, "offload")?;
            let t_on = hop(XferOp::Read, &self.restore_list, "onboard")?;

            let t0 = Instant::now();
            let li: Vec<i32> = (0..n as i32).collect();
            let ri: Vec<i32> = li.iter().rev().copied().collect();
            let mut opt = OptArgs::new()?;
            opt.set_has_notification(true)?;
            opt.set_notification_message(b"blocks")?;
            let req = a.make_xfer_req(
                XferOp::Write,
                &self.local,
                &li,
                &self.remote,
                &ri,
                Some(&opt),
            )?;
            a.post_xfer_req(&req, None)?;
            wait(a, &req, "WRITE")?;
            let sender = a.name();
            let mut map = NotificationMap::new()?;
            spin("notification", || {
                self.decode.get_notifications(&mut map, None)?;
                Ok(map.get_notifications_size(&sender).unwrap_or(0) > 0)
            })?;
            drop(req);
            let t_w = t0.elapsed();

            check_blocks("onboard (drop-in)", &self.restore.0.to_vec(), bb, |j| j)?;
            check_blocks("WRITE (drop-in)", &self.dst.0.to_vec(), bb, |j| n - 1 - j)?;
            self.restore.0.fill(0);
            self.dst.0.fill(0);
            // The host pool is the source of every request: unchanged.
            check_blocks("host pool (drop-in)", &self.host.0.to_vec(), bb, |j| j)?;
            let _ = &self.decode_name;
            Ok([t_off, t_on, t_w])
        }
    }
}

mod native {
    use super::*;
    use nixl::core::BackendHandle;
    use nixl::storage::FileRegion;
    use nixl::{Agent, HostBuffer, MemKind, MemoryRegion, PreparedList, XferDescList};
    use nixl::{XferOp, XferOptions, XferState, XferTarget};

    /// nixl-rs's defaults for each plugin, with the drop-in's UCX default (`nixl_compat`) so
    /// both sides run one UCX configuration.
    fn backend(agent: &Agent, plugin: &str) -> Res<BackendHandle> {
        let mut params = agent.backend_params(plugin)?;
        if plugin == "UCX" {
            params.insert("nixl_compat".to_owned(), "true".to_owned());
        }
        Ok(agent.create_backend_named(plugin, &params)?)
    }

    fn host_buffer(len: usize) -> Res<Arc<HostBuffer>> {
        Ok(Arc::new(HostBuffer::new(len).ok_or("host buffer")?))
    }

    fn wait(agent: &Agent, req: &nixl::XferReq, what: &str) -> Res<()> {
        spin(what, || Ok(agent.check_xfer_state(req)? == XferState::Done))
    }

    /// The metadata format the drop-in sends: NIXL's unless `NIXL_RS_METADATA=native`.
    fn metadata(agent: &Agent) -> Res<Vec<u8>> {
        Ok(
            if std::env::var("NIXL_RS_METADATA").is_ok_and(|v| v == "native") {
                agent.local_metadata()?
            } else {
                agent.nixl().local_metadata()?
            },
        )
    }

    pub(crate) struct Native {
        n: usize,
        bb: usize,
        prefill: Agent,
        decode: Agent,
        decode_name: String,
        posix: BackendHandle,
        host: Arc<HostBuffer>,
        restore: Arc<HostBuffer>,
        dst: Arc<HostBuffer>,
        disk: Arc<FileRegion>,
        local: PreparedList,
        remote: PreparedList,
        _regs: Vec<nixl::Registration>,
    }

    impl Native {
        pub(crate) fn new(args: &Args, dir: &std::path::Path) -> Res<Self> {
            let (n, bb) = (args.blocks, args.block_bytes);
            let tag = std::process::id();
            // nixl-sys's defaults, as the drop-in makes them: a progress thread, no telemetry.
            let config = || nixl::agent_config().progress_thread(true).telemetry(false);
            let prefill = Agent::new(&format!("adapter-native-prefill-{tag}"), config())?;
            let ucx = backend(&prefill, "UCX")?;
            let posix = backend(&prefill, "POSIX")?;
            let decode = Agent::new(&format!("adapter-native-decode-{tag}"), config())?;
            let decode_ucx = backend(&decode, "UCX")?;

            let host = host_buffer(n * bb)?;
            host.write_at(0, &pattern(n, bb));
            let restore = host_buffer(n * bb)?;
            let dst = host_buffer(n * bb)?;
            let disk = Arc::new(FileRegion::from_file(
                disk_file(dir, "native", n * bb)?,
                dir.join("adapter-native"),
                (n * bb) as u64,
            ));
            let regions = |v: &[&Arc<HostBuffer>]| -> Vec<Arc<dyn MemoryRegion>> {
                v.iter()
                    .map(|b| (*b).clone() as Arc<dyn MemoryRegion>)
                    .collect()
            };
            let regs = vec![
                prefill.register_mem(regions(&[&host, &restore]), &[])?,
                prefill.register_mem(vec![disk.clone()], std::slice::from_ref(&posix))?,
                decode.register_mem(regions(&[&dst]), &[decode_ucx])?,
            ];

            let decode_name = prefill.load_remote_metadata(&metadata(&decode)?)?;
            decode.load_remote_metadata(&metadata(&prefill)?)?;
            let list = |b: &HostBuffer| XferDescList::blocks(MemKind::Dram, b.addr(), bb as u64, n);
            let hint = std::slice::from_ref(&ucx);
            let local = prefill.prep_xfer_dlist(XferTarget::Initiator, &list(&host), hint)?;
            let remote =
                prefill.prep_xfer_dlist(XferTarget::Agent(&decode_name), &list(&dst), hint)?;
            Ok(Native {
                n,
                bb,
                prefill,
                decode,
                decode_name,
                posix,
                host,
                restore,
                dst,
                disk,
                local,
                remote,
                _regs: regs,
            })
        }
    }

    impl Side for Native {
        fn name(&self) -> &'static str {
            "native (nixl-rs API)"
        }

        fn round(&mut self) -> Res<[Duration; 3]> {
            let (a, n, bb) = (&self.prefill, self.n, self.bb as u64);
            let me = a.name().to_owned();
            let posix = XferOptions::default().backends(vec![self.posix.clone()]);
            let dram = |b: &HostBuffer| XferDescList::blocks(MemKind::Dram, b.addr(), bb, n);
            // A storage request built from the lists, posted and polled to its end.
            let hop = |op, local: &HostBuffer, what| -> Res<Duration> {
                let t0 = Instant::now();
                let disk = self.disk.blocks(0, bb, n);
                let req = a.create_xfer_req(op, &dram(local), &disk, &me, posix.clone())?;
                a.post_xfer_req(&req)?;
                wait(a, &req, what)?;
                drop(req);
                Ok(t0.elapsed())
            };
            let t_off = hop(XferOp::Write, &self.host, "offload")?;
            let t_on = hop(XferOp::Read, &self.restore, "onboard")?;

            let t0 = Instant::now();
            let li: Vec<usize> = (0..n).collect();
            let ri: Vec<usize> = li.iter().rev().copied().collect();
            let req = a.make_prepped_xfer(
                XferOp::Write,
                &self.local,
                &li,
                &self.remote,
                &ri,
                XferOptions::with_notif(b"blocks".to_vec()),
            )?;
            a.post_xfer_req(&req)?;
            wait(a, &req, "WRITE")?;
            spin("notification", || {
                Ok(self
                    .decode
                    .get_notifs()?
                    .get(&me)
                    .is_some_and(|m| !m.is_empty()))
            })?;
            drop(req);
            let t_w = t0.elapsed();

            let bb = self.bb;
            check_blocks("onboard (native)", &self.restore.to_vec(), bb, |j| j)?;
            check_blocks("WRITE (native)", &self.dst.to_vec(), bb, |j| n - 1 - j)?;
            self.restore.fill(0);
            self.dst.fill(0);
            check_blocks("host pool (native)", &self.host.to_vec(), bb, |j| j)?;
            let _ = &self.decode_name;
            Ok([t_off, t_on, t_w])
        }
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Res<()> {
    let args = Args::parse();
    if args.blocks == 0 || args.block_bytes == 0 || args.rounds == 0 {
        return Err("--blocks, --block-bytes and --rounds must be non-zero".into());
    }
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let wire = match std::env::var("NIXL_RS_METADATA") {
        Ok(v) if v == "native" => "nixl-rs metadata",
        _ => "NIXL metadata",
    };
    let mut sides: Vec<Box<dyn Side>> = vec![
        Box::new(dropin::DropIn::new(&args, &dir)?),
        Box::new(native::Native::new(&args, &dir)?),
    ];
    let bytes = (args.blocks * args.block_bytes) as f64;
    println!(
        "adapter: {} blocks of {} B per request, {} rounds (+{} warm-up) per API, alternating first, {wire}, every byte checked each round",
        args.blocks, args.block_bytes, args.rounds, args.warmup
    );
    let mut times: Vec<Vec<[Duration; 3]>> = vec![Vec::new(), Vec::new()];
    for r in 0..args.warmup + args.rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for s in order {
            let t = sides[s].round()?;
            if r >= args.warmup {
                times[s].push(t);
            }
        }
    }
    let mut med = [[Duration::ZERO; 3]; 2];
    let mut total = [Duration::ZERO; 2];
    for s in 0..2 {
        println!("{}:", sides[s].name());
        for (op, name) in OPS.iter().enumerate() {
            let mut v: Vec<Duration> = times[s].iter().map(|t| t[op]).collect();
            med[s][op] = median(&mut v);
            println!(
                "  {name:<20} median {:>9.1} us  {:>6.2} GB/s",
                med[s][op].as_secs_f64() * 1e6,
                bytes / med[s][op].as_secs_f64() / 1e9
            );
        }
        total[s] = times[s].iter().flat_map(|t| t.iter()).sum();
    }
    for (op, name) in OPS.iter().enumerate() {
        println!(
            "cost {name:<20} {:+6.1}% (drop-in / native median - 1)",
            (med[0][op].as_secs_f64() / med[1][op].as_secs_f64() - 1.0) * 100.0
        );
    }
    println!(
        "cost all rounds          {:+6.1}% (drop-in {:.1} ms / native {:.1} ms summed)",
        (total[0].as_secs_f64() / total[1].as_secs_f64() - 1.0) * 100.0,
        total[0].as_secs_f64() * 1e3,
        total[1].as_secs_f64() * 1e3
    );
    Ok(())
}
