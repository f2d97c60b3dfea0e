//! A KV block manager shaped like Dynamo's, written against nixl-sys's API and built on the
//! drop-in (`nixl-sys = { package = "nixl-rs-sys" }`): the calls Dynamo's block manager makes
//! (`Agent::new`, `get_plugin_params`, `create_backend("UCX" | "POSIX")`, `register_memory`
//! of its own pool types, descriptor lists, `prepare_xfer_dlist` / `make_xfer_req`,
//! `create_xfer_req` / `post_xfer_req` / `get_xfer_status`, notifications, NIXL's side
//! channel).
//!
//! Two processes. The prefill process owns a host pool (its own allocation, registered as
//! nixl-sys code registers one) and a disk pool (a file, registered by descriptor), offloads
//! every block host -> disk, clears the host pool, onboards disk -> host, and checks every byte;
//! then it starts the decode process, exchanges metadata with it over NIXL's side channel, and
//! WRITEs the blocks into the decode pool by index (in reverse order) with a notification. The
//! decode process checks every byte and answers with a notification; the run fails unless both
//! checks pass. Where a GPU is present the manager also has a device pool (GPU 0's memory,
//! registered by pointer as Dynamo registers its device pool): every block goes host ->
//! device, the host pool is cleared, and every block comes back device -> host through the
//! `CUDA_IPC` plugin, checked; without a GPU that step says why it is skipped.
//!
//! ```text
//! cargo run -p nixl-rs-sys --example block_manager -- --blocks 64 --block-bytes 65536
//! ```

use std::error::Error;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use nixl_sys::*;

#[path = "block_manager/pools.rs"]
mod pools;
use pools::{check_blocks, pattern, DiskPool, HostPool};

type Res<T> = Result<T, Box<dyn Error>>;

const DEADLINE: Duration = Duration::from_secs(60);

/// A KV block manager on nixl-sys's API: host -> disk -> host, then to a second process.
#[derive(Parser, Debug)]
#[command(name = "block_manager")]
struct Args {
    /// Blocks per pool.
    #[arg(long, default_value_t = 64)]
    blocks: usize,
    /// Bytes per block.
    #[arg(long, default_value_t = 65536)]
    block_bytes: usize,
    /// Where the disk pool's file lives (default: the temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: run as the decode process, named so.
    #[arg(long, hide = true)]
    decode: Option<String>,
}

/// The device pool: GPU memory the manager allocated, registered by its device pointer.
#[derive(Debug)]
struct DevicePool {
    buf: nixl::mem::DeviceBuffer,
}

impl MemoryRegion for DevicePool {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.buf.addr() as *const u8
    }

    fn size(&self) -> usize {
        self.buf.len()
    }
}

impl NixlDescriptor for DevicePool {
    fn mem_type(&self) -> MemType {
        MemType::Vram
    }

    fn device_id(&self) -> u64 {
        self.buf.ordinal() as u64
    }
}

fn blocks_list(
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

/// Posts `req` and waits for it; returns the time from post to done.
fn post_and_wait(agent: &Agent, req: &XferRequest, what: &str) -> Res<Duration> {
    let t0 = Instant::now();
    agent.post_xfer_req(req, None)?;
    loop {
        match agent.get_xfer_status(req) {
            Ok(XferStatus::Success) => return Ok(t0.elapsed()),
            Ok(XferStatus::InProgress) => {}
            Err(e) => return Err(format!("{what}: {e} ({:?})", last_error()).into()),
        }
        if t0.elapsed() > DEADLINE {
            return Err(format!("{what}: not done within {DEADLINE:?}").into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn notification_from(agent: &Agent, sender: &str) -> Res<Vec<u8>> {
    let mut map = NotificationMap::new()?;
    let t0 = Instant::now();
    loop {
        agent.get_notifications(&mut map, None)?;
        if let Ok(mut it) = map.get_notifications(sender) {
            if let Some(n) = it.next() {
                return Ok(n?);
            }
        }
        if t0.elapsed() > DEADLINE {
            return Err(format!("no notification from {sender} within {DEADLINE:?}").into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn backend(agent: &Agent, plugin: &str) -> Res<(Backend, OptArgs)> {
    let (_mems, params) = agent.get_plugin_params(plugin)?;
    let b = agent.create_backend(plugin, &params)?;
    let mut opt = OptArgs::new()?;
    opt.add_backend(&b)?;
    Ok((b, opt))
}

fn main() -> Res<()> {
    let args = Args::parse();
    match &args.decode {
        Some(name) => decode(&args, name),
        None => prefill(&args),
    }
}

fn prefill(args: &Args) -> Res<()> {
    let (n, bb) = (args.blocks, args.block_bytes);
    let agent = Agent::new(&format!("bm-prefill-{}", std::process::id()))?;
    let (_ucx, ucx) = backend(&agent, "UCX")?;
    let (_posix, posix) = backend(&agent, "POSIX")?;
    // The device tier, where this machine has a GPU (created before the host pool is
    // registered, so the host pool is registered with it too).
    let gpu = if nixl::mem::cuda::is_available() {
        Some(backend(&agent, "CUDA_IPC")?)
    } else {
        None
    };

    let host = HostPool::new(n * bb).ok_or("host pool allocation")?;
    host.0.write_at(0, &pattern(n, bb));
    // Registered with every backend that takes host memory (UCX and POSIX).
    let host_reg = agent.register_memory(&host, None)?;
    let path = args
        .dir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("bm-disk-pool-{}", std::process::id()));
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    file.set_len((n * bb) as u64)?;
    let _ = std::fs::remove_file(&path);
    let disk = DiskPool { file, len: n * bb };
    let _disk_reg = agent.register_memory(&disk, Some(&posix))?;
    let fd = disk.device_id();

    let host_list = blocks_list(MemType::Dram, host.addr(), 0, n, bb)?;
    let disk_list = blocks_list(MemType::File, 0, fd, n, bb)?;
    let me = agent.name();

    let off = agent.create_xfer_req(XferOp::Write, &host_list, &disk_list, &me, Some(&posix))?;
    let t_off = post_and_wait(&agent, &off, "offload host -> disk")?;
    drop(off);
    host.0.fill(0);
    let on = agent.create_xfer_req(XferOp::Read, &host_list, &disk_list, &me, Some(&posix))?;
    let t_on = post_and_wait(&agent, &on, "onboard disk -> host")?;
    drop(on);
    check_blocks("host -> disk -> host", &host.0.to_vec(), bb, |j| j)?;
    println!(
        "host -> disk -> host: {n} blocks of {bb} B, every byte checked (offload {t_off:?}, onboard {t_on:?})"
    );
    match &gpu {
        Some((_b, cuda)) => {
            let dev = DevicePool {
                buf: nixl::mem::DeviceBuffer::new(0, n * bb)?,
            };
            let _dev_reg = agent.register_memory(&dev, Some(cuda))?;
            let dev_list = blocks_list(MemType::Vram, dev.buf.addr() as usize, 0, n, bb)?;
            let up =
                agent.create_xfer_req(XferOp::Write, &host_list, &dev_list, &me, Some(cuda))?;
            let t_up = post_and_wait(&agent, &up, "host -> device")?;
            drop(up);
            host.0.fill(0);
            let down =
                agent.create_xfer_req(XferOp::Read, &host_list, &dev_list, &me, Some(cuda))?;
            let t_down = post_and_wait(&agent, &down, "device -> host")?;
            drop(down);
            check_blocks("host -> device -> host", &host.0.to_vec(), bb, |j| j)?;
            println!(
                "host -> device -> host (GPU 0, CUDA_IPC): {n} blocks of {bb} B, every byte checked (up {t_up:?}, down {t_down:?})"
            );
        }
        None => println!("host -> device -> host: skipped (no CUDA driver or GPU here)"),
    }

    // The decode process: its name, listener port, pool address.
    let name = format!("bm-decode-{}", std::process::id());
    let mut child = DecodeChild(
        Command::new(std::env::current_exe()?)
            .args([
                "--decode",
                &name,
                "--blocks",
                &n.to_string(),
                "--block-bytes",
                &bb.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let (port, remote_base): (u16, usize) = match f.as_slice() {
        ["READY", p, a] => (p.parse()?, a.parse()?),
        _ => return Err(format!("decode process said {line:?}").into()),
    };
    let mut at = OptArgs::new()?;
    at.set_ip_addr("127.0.0.1")?;
    at.set_port(port)?;
    agent.fetch_remote_md(&name, Some(&at))?;
    agent.send_local_md(Some(&at))?;
    let t0 = Instant::now();
    while !agent.check_remote_metadata(&name, None) {
        if t0.elapsed() > DEADLINE {
            return Err(format!(
                "{name}'s metadata not fetched ({} failures)",
                agent.comm_failures()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    agent.make_connection(&name, Some(&ucx))?;

    // Blocks by index, as the block manager does: local block i goes to remote block n-1-i.
    let local = agent.prepare_xfer_dlist("", &host_list, Some(&ucx))?;
    let remote_list = blocks_list(MemType::Dram, remote_base, 0, n, bb)?;
    let remote = agent.prepare_xfer_dlist(&name, &remote_list, Some(&ucx))?;
    let li: Vec<i32> = (0..n as i32).collect();
    let ri: Vec<i32> = li.iter().rev().copied().collect();
    let mut opt = OptArgs::new()?;
    opt.set_has_notification(true)?;
    opt.set_notification_message(format!("blocks:{n}").as_bytes())?;
    let req = agent.make_xfer_req(XferOp::Write, &local, &li, &remote, &ri, Some(&opt))?;
    let t_w = post_and_wait(&agent, &req, "WRITE to decode")?;
    let answer = notification_from(&agent, &name)?;
    // The decode process exits once told its answer arrived.
    agent.send_notification(&name, b"done", None)?;
    let status = child.0.wait()?;
    drop(host_reg);
    if answer != b"verified" || !status.success() {
        return Err(format!(
            "decode said {:?} ({status})",
            String::from_utf8_lossy(&answer)
        )
        .into());
    }
    println!(
        "prefill -> decode over UCX: {n} blocks by index (reversed), every byte checked by the decode process (WRITE {t_w:?})"
    );
    println!("block_manager: ok");
    Ok(())
}

/// Kills the decode process if the prefill side fails first.
struct DecodeChild(Child);

impl Drop for DecodeChild {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn decode(args: &Args, name: &str) -> Res<()> {
    let (n, bb) = (args.blocks, args.block_bytes);
    let cfg = AgentConfig {
        enable_listen_thread: true,
        listen_port: 0,
        ..Default::default()
    };
    let agent = Agent::new_configured(name, &cfg)?;
    let (_ucx, ucx) = backend(&agent, "UCX")?;
    let mut pool = SystemStorage::new(n * bb)?;
    pool.register(&agent, Some(&ucx))?;
    let port = agent.listen_addr().ok_or("no listener")?.port();
    // SAFETY: only the address is taken.
    let base = unsafe { pool.as_ptr() } as usize;
    println!("READY {port} {base}");
    std::io::stdout().flush()?;

    let t0 = Instant::now();
    let prefill = loop {
        let mut map = NotificationMap::new()?;
        agent.get_notifications(&mut map, None)?;
        let got = map.take_notifs()?;
        if let Some((sender, msgs)) = got.into_iter().find(|(_, m)| !m.is_empty()) {
            if msgs[0] != format!("blocks:{n}") {
                return Err(format!("unexpected notification {msgs:?}").into());
            }
            break sender;
        }
        if t0.elapsed() > DEADLINE {
            return Err("no blocks within the deadline".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let bad = check_blocks("decode pool", pool.as_slice(), bb, |j| n - 1 - j).err();
    while !agent.check_remote_metadata(&prefill, None) {
        if t0.elapsed() > DEADLINE {
            return Err(format!("{prefill}'s metadata never arrived").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let answer = bad.clone().unwrap_or_else(|| "verified".to_owned());
    agent.send_notification(&prefill, answer.as_bytes(), None)?;
    // Stay until the prefill side has the answer (a process's exit may drop what it sent).
    if notification_from(&agent, &prefill)? != b"done" {
        return Err("unexpected notification instead of done".into());
    }
    match bad {
        None => Ok(()),
        Some(b) => Err(b.into()),
    }
}
