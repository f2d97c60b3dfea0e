//! The two-process quick start of docs/concepts.md: a prefill process writes KV blocks into a
//! decode process's pool over UCX and reads one back, with no address passed by hand.
//!
//! - The decode process (this program re-run with `--decode ADDR`) registers its KV pool,
//!   fetches the prefill agent's metadata from its side channel and pushes its own there.
//! - The prefill process learns where the pool is from that metadata
//!   ([`Agent::remote_regions`]), writes three blocks with a notification that carries the
//!   serialized list of the blocks it wrote ([`XferDescList::encode`]), and the decode side
//!   checks every byte of exactly those blocks before answering.
//! - Prefill then READs a block back and checks it.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl::ucx::UcxParams;
use nixl::{Agent, HostBuffer, MemKind, XferDescList, XferOp, XferOptions, XferTarget};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BLOCK: u64 = 64 << 10;
const BLOCKS: u64 = 16;
const TIMEOUT: Duration = Duration::from_secs(30);

/// An agent that can create every backend compiled in, with its side channel on 127.0.0.1.
fn agent(name: &str) -> Res<Agent> {
    let a = Agent::new(name, nixl::agent_config().listen(true))?;
    a.create_backend(UcxParams::default())?;
    Ok(a)
}

/// The byte block `block` of request `req` carries.
fn pattern(req: u64, block: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (req * 31 + block * 7 + i) as u8)
        .collect()
}

/// Waits for the next notification from `from`.
fn next_notif(a: &Agent, from: &str) -> Res<Vec<u8>> {
    let end = Instant::now() + TIMEOUT;
    while Instant::now() < end {
        if let Some(mut m) = a.wait_notifs(Duration::from_millis(100))?.remove(from) {
            return Ok(m.remove(0));
        }
    }
    Err(format!(
        "{}: no notification from {from} within {TIMEOUT:?}",
        a.name()
    )
    .into())
}

fn decode(prefill_addr: SocketAddr) -> Res<()> {
    let a = agent("decode")?;
    let pool = Arc::new(HostBuffer::new((BLOCK * BLOCKS) as usize).ok_or("alloc")?);
    let _reg = a.register_mem(vec![pool.clone()], &[])?;
    // Learn the prefill agent, then tell it about us: both by the prefill's side channel.
    a.fetch_remote_metadata_blocking("prefill", prefill_addr, TIMEOUT)?;
    a.send_local_metadata(prefill_addr)?;
    // The notification names the blocks that were written; check exactly those.
    let written = XferDescList::decode(&next_notif(&a, "prefill")?)?;
    for (i, d) in written.descs().iter().enumerate() {
        let off = (d.addr - pool.addr()) as usize;
        let block = pool.to_vec()[off..off + d.len as usize].to_vec();
        if block != pattern(1, i as u64) {
            a.gen_notif("prefill", b"corrupt", &[])?;
            return Err(format!("decode: block {i} at offset {off} differs").into());
        }
    }
    println!(
        "decode: verified {} blocks ({} bytes) named by the notification",
        written.len(),
        written.total_bytes().unwrap_or(0)
    );
    a.gen_notif("prefill", b"verified", &[])?;
    // Stay until prefill has read back (its second message).
    next_notif(&a, "prefill")?;
    Ok(())
}

fn prefill() -> Res<()> {
    let a = agent("prefill")?;
    let addr = a.listen_addr().ok_or("side channel not listening")?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--decode", &addr.to_string()])
        .stdin(Stdio::null())
        .spawn()?;
    let result = (|| -> Res<()> {
        let kv = Arc::new(HostBuffer::new((BLOCK * BLOCKS) as usize).ok_or("alloc")?);
        let _reg = a.register_mem(vec![kv.clone()], &[])?;
        // The decode process pushes its metadata to our side channel.
        let end = Instant::now() + TIMEOUT;
        while !a.check_remote_metadata("decode", None) {
            if Instant::now() > end {
                return Err("decode never published its metadata".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Where decode's KV pool is: from its metadata, not from a message.
        let pool = a
            .remote_regions("decode")?
            .into_iter()
            .find(|r| r.kind == MemKind::Dram && r.len >= BLOCK * BLOCKS)
            .ok_or("decode registered no KV pool")?;
        let local = a.prep_xfer_dlist(
            XferTarget::Initiator,
            &XferDescList::blocks(MemKind::Dram, kv.addr(), BLOCK, BLOCKS as usize),
            &[],
        )?;
        let remote_blocks = XferDescList::blocks(MemKind::Dram, pool.addr, BLOCK, BLOCKS as usize);
        let remote = a.prep_xfer_dlist(XferTarget::Agent("decode"), &remote_blocks, &[])?;
        // "Compute" request 1's KV into local blocks 0..3 and write them to decode blocks
        // 9, 4 and 12 (its block table); the notification lists those decode blocks.
        let table = [9usize, 4, 12];
        let mut host = kv.to_vec();
        for (i, _) in table.iter().enumerate() {
            let off = i * BLOCK as usize;
            host[off..off + BLOCK as usize].copy_from_slice(&pattern(1, i as u64));
        }
        if !kv.write_at(0, &host[..table.len() * BLOCK as usize]) {
            return Err("writing the local KV blocks failed".into());
        }
        let named = XferDescList::from_descs(
            MemKind::Dram,
            table.iter().map(|&b| remote_blocks.descs()[b]),
        );
        let req = a.make_prepped_xfer(
            XferOp::Write,
            &local,
            &[0, 1, 2],
            &remote,
            &table,
            XferOptions::with_notif(named.encode()),
        )?;
        a.post_xfer_req(&req)?;
        req.wait(TIMEOUT)?;
        println!(
            "prefill: wrote 3 blocks with {} ({})",
            req.backend(),
            req.path()
        );
        if next_notif(&a, "decode")? != b"verified" {
            return Err("decode found corrupt blocks".into());
        }
        // READ decode's block 4 back into local block 8 and check it.
        let back = a.make_prepped_xfer(
            XferOp::Read,
            &local,
            &[8],
            &remote,
            &[4],
            XferOptions::default(),
        )?;
        a.post_xfer_req(&back)?;
        back.wait(TIMEOUT)?;
        let got = kv.to_vec()[8 * BLOCK as usize..9 * BLOCK as usize].to_vec();
        if got != pattern(1, 1) {
            return Err("READ back differs".into());
        }
        println!("prefill: read decode's block 4 back and verified it");
        a.gen_notif("decode", b"bye", &[])?;
        Ok(())
    })();
    let status = child.wait()?;
    result?;
    if !status.success() {
        return Err(format!("decode exited with {status}").into());
    }
    println!("quickstart: OK");
    Ok(())
}

/// Two processes, one KV transfer: this process is prefill; it starts decode itself.
#[derive(clap::Parser, Debug)]
#[command(name = "quickstart")]
struct Args {
    /// Run as the decode side, reaching prefill's side channel at ADDR (the prefill process
    /// passes it when it starts decode).
    #[arg(long, value_name = "ADDR", hide = true)]
    decode: Option<std::net::SocketAddr>,
}

fn main() -> Res<()> {
    match <Args as clap::Parser>::parse().decode {
        Some(addr) => decode(addr),
        None => prefill(),
    }
}
