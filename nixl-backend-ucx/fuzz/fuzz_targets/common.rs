#![allow(dead_code)]
//! Shared by the unpack targets:
//!
//! - a **victim** agent in the fuzzing process (UCX over tcp, shared memory, CMA and self,
//!   authentication off) that loads hostile metadata through its public API, so every input
//!   the checks let through reaches the real `ucp_ep_create` / `ucp_ep_rkey_unpack`, and then
//!   posts a 4 KiB READ or WRITE with what loaded (100 ms deadline), so the mutant also
//!   reaches `ucp_put_nbx` / `ucp_get_nbx` and the target's side of the transport;
//! - live **targets** in a second process (this binary again, spawned by [`world`] with
//!   `NIXL_FUZZ_TARGET_PROCESS` set, progressing their workers until the fuzzing process goes
//!   away): over tcp, over shared memory, and over both. Their real worker addresses, keys and
//!   regions are the base the inputs mutate.
//!
//! Mutated addresses and keys may name other processes' resources (a CMA pid, a shared
//! memory segment, a host and port): run these targets where nothing else lives, as
//! `scripts/fuzz.sh` does (its own network, pid, IPC and mount namespaces).
//!
//! The victim agent is made anew every [`RECYCLE`] inputs: an endpoint to a live peer leaves
//! UCX's connection to it open on both sides until one of the workers goes (the backend keeps
//! forgotten peers' endpoints for the next load at the same address, but each distinct
//! mutated address that connects is a new one: docs/security.md, "Connections to live
//! peers"), and a run of a million inputs would otherwise exhaust the process's mappings.
//!
//! Counts: how many inputs loaded, reached `ucp_ep_create` / `ucp_ep_rkey_unpack` / an RMA
//! post (the backend's `fuzzing` counters) and completed a transfer, printed every 1,000
//! inputs as `UNPACK-STATS`, and, where `NIXL_FUZZ_STATS` names a directory, written after
//! every input to `<dir>/<pid>` (libFuzzer's fork mode keeps no output of its jobs).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nixl_backend_ucx::fuzzing::{
    decode_conn, decode_rkey, encode_conn, encode_rkey, ep_creates, rkey_unpacks, rma_posts,
};
use nixl_backend_ucx::UcxParams;
use nixl_core::wire::codec::AgentMetadata;
use nixl_core::{
    Agent, AgentConfig, Error, HostBuffer, MemKind, Registration, XferDescList, XferOp,
    XferOptions, XferState,
};

/// Bytes of the victim's and the targets' registered buffers.
pub const BUF: usize = 1 << 16;
/// Set in the target process's environment.
const ROLE: &str = "NIXL_FUZZ_TARGET_PROCESS";
/// The targets' transports.
const TARGETS: [&str; 3] = ["tcp", "shm,cma,self", "tcp,shm,cma,self"];

/// One target: its worker address, packed key and region.
pub struct Target {
    pub address: Vec<u8>,
    pub rkey: Vec<u8>,
    pub region: (u64, u64),
}

pub struct World {
    victim: Mutex<Victim>,
    pub targets: Vec<Target>,
    process: Mutex<Child>,
}

/// The agent that loads the inputs, with its registered buffer.
pub struct Victim {
    pub agent: Agent,
    pub local: Arc<HostBuffer>,
    _reg: Registration,
}

/// Inputs between two victims (see the module docs).
const RECYCLE: u64 = 4096;

static WORLD: OnceLock<World> = OnceLock::new();
static INPUTS: AtomicU64 = AtomicU64::new(0);
static LOADED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static REACHED_EP: AtomicU64 = AtomicU64::new(0);
static REACHED_RKEY: AtomicU64 = AtomicU64::new(0);
static REACHED_RMA: AtomicU64 = AtomicU64::new(0);
static RMA_DONE: AtomicU64 = AtomicU64::new(0);
static RMA_FAILED: AtomicU64 = AtomicU64::new(0);

fn ucx(tls: &str) -> UcxParams {
    UcxParams::default()
        .transports(tls.to_string())
        .devices("lo".to_string())
        .keepalive_interval(Duration::from_millis(250))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The fuzz binary's `init`: in the target process, creates the targets, prints one line per
/// target (metadata, buffer address and length), progresses them until stdin closes (the
/// fuzzing process went away) and exits. Elsewhere it does nothing.
pub fn init() {
    ignore_sigpipe();
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    let mut keep = Vec::new();
    let mut out = std::io::stdout().lock();
    for (i, tls) in TARGETS.iter().enumerate() {
        let name = format!("fuzz-target-{i}-{}", std::process::id());
        let t = Agent::new(&name, AgentConfig::default()).expect("target agent");
        t.create_backend(ucx(tls)).expect("target UCX");
        let buf = Arc::new(HostBuffer::new(BUF).expect("alloc"));
        buf.fill_pattern(i as u64 + 1);
        let reg = t.register_mem(vec![buf.clone()], &[]).expect("register");
        let md = t.local_metadata().expect("target metadata");
        writeln!(out, "{} {} {}", hex(&md), buf.addr(), buf.len()).expect("stdout");
        keep.push((t, buf, reg));
    }
    out.flush().expect("stdout");
    drop(out);
    // UCX over tcp emulates puts and gets with active messages: the target must progress.
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        d.store(true, Ordering::Release);
    });
    while !done.load(Ordering::Acquire) {
        for (t, _, _) in &keep {
            t.progress();
            let _ = t.get_notifs();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    std::process::exit(0);
}

/// libFuzzer's `main` is C++, so the Rust runtime never set SIGPIPE to be ignored as it
/// does for a Rust `main`: without this, a peer that closes a tcp connection UCX is writing
/// to kills the writer (as it would any program whose `main` is not Rust's and that does not
/// ignore SIGPIPE: docs/security.md).
pub fn ignore_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

fn spawn_targets() -> (Child, Vec<Target>) {
    let exe = std::env::current_exe().expect("own executable");
    let mut child = Command::new(exe)
        .env(ROLE, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning the target process");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut targets = Vec::new();
    for _ in TARGETS {
        let line = lines
            .next()
            .expect("a target line")
            .expect("reading the target");
        let f: Vec<&str> = line.split(' ').collect();
        let md = AgentMetadata::decode_bytes(&unhex(f[0])).expect("target metadata");
        let conn = decode_conn(&md.backends[0].conn_info).expect("conn");
        let (_, packed) = decode_rkey(&md.regions[0].public).expect("rkey");
        targets.push(Target {
            address: conn[0].clone(),
            rkey: packed.to_vec(),
            region: (f[1].parse().expect("addr"), f[2].parse().expect("len")),
        });
    }
    (child, targets)
}

fn victim() -> Victim {
    static N: AtomicU64 = AtomicU64::new(0);
    let agent = Agent::new(
        &format!(
            "fuzz-victim-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ),
        AgentConfig::default(),
    )
    .expect("victim");
    agent
        .create_backend(ucx("tcp,shm,cma,self"))
        .expect("victim UCX");
    let local = Arc::new(HostBuffer::new(BUF).expect("alloc"));
    let reg = agent
        .register_mem(vec![local.clone()], &[])
        .expect("victim register");
    Victim {
        agent,
        local,
        _reg: reg,
    }
}

pub fn world() -> &'static World {
    WORLD.get_or_init(|| {
        let (process, targets) = spawn_targets();
        World {
            victim: Mutex::new(victim()),
            targets,
            process: Mutex::new(process),
        }
    })
}

pub use nixl_core::wire::fuzz::mutate;

/// Metadata of a fresh peer name with one backend and optional region.
pub fn metadata(conn_info: Vec<u8>, rkey: Option<(Vec<u8>, (u64, u64))>) -> (String, Vec<u8>) {
    let region = rkey.map(|(packed, span)| (encode_rkey(0, &packed), span));
    nixl_core::wire::fuzz::peer_metadata("UCX", conn_info, region)
}

pub fn conn(addr: &[u8]) -> Vec<u8> {
    encode_conn(&[addr])
}

/// Loads hostile metadata into the victim; when it loaded and names a region, posts a 4 KiB
/// READ or WRITE (`write`) at the region's end with a 100 ms deadline and waits for it to end
/// (at most 5 s); then forgets the peer, which tears down whatever loaded before the next
/// input.
pub fn load_post_forget(bytes: &[u8], name: &str, region: Option<(u64, u64)>, write: bool) {
    let w = world();
    let mut victim = w.victim.lock().unwrap_or_else(|p| p.into_inner());
    if INPUTS.load(Ordering::Relaxed) % RECYCLE == RECYCLE - 1 {
        *victim = self::victim();
    }
    let v = &victim.agent;
    let (ep0, rk0, rma0) = (ep_creates(), rkey_unpacks(), rma_posts());
    if v.load_remote_metadata(bytes).is_ok() {
        LOADED.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = region {
            transfer(&victim, name, r, write);
        }
        v.progress();
        let _ = v.invalidate_remote_metadata(name);
        v.progress();
    } else {
        REFUSED.fetch_add(1, Ordering::Relaxed);
    }
    for (before, now, count) in [
        (ep0, ep_creates(), &REACHED_EP),
        (rk0, rkey_unpacks(), &REACHED_RKEY),
        (rma0, rma_posts(), &REACHED_RMA),
    ] {
        if now > before {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
    check_targets();
    report();
}

fn transfer(w: &Victim, remote: &str, (addr, len): (u64, u64), write: bool) {
    let n = len.min(4096);
    let Some(raddr) = addr.checked_add(len - n) else {
        return;
    };
    if n == 0 {
        return;
    }
    let op = if write { XferOp::Write } else { XferOp::Read };
    let opts = XferOptions::default().timeout(Duration::from_millis(100));
    let v = &w.agent;
    let Ok(req) = v.create_xfer_req(
        op,
        &XferDescList::blocks(MemKind::Dram, w.local.addr(), n, 1),
        &XferDescList::blocks(MemKind::Dram, raddr, n, 1),
        remote,
        opts,
    ) else {
        return;
    };
    let mut st = v.post_xfer_req(&req);
    let end = Instant::now() + Duration::from_secs(5);
    while matches!(st, Ok(XferState::InProgress)) && Instant::now() < end {
        std::thread::sleep(Duration::from_micros(200));
        st = v.check_xfer_state(&req);
    }
    match st {
        Ok(XferState::Done) => RMA_DONE.fetch_add(1, Ordering::Relaxed),
        Ok(XferState::InProgress) => {
            panic!("a request with a 100 ms deadline still runs after 5 s")
        }
        Err(Error::TimedOut { .. }) | Err(_) => RMA_FAILED.fetch_add(1, Ordering::Relaxed),
    };
}

/// A crash of the target process (its UCX handling what the victim sent) is a crash of this
/// input too.
fn check_targets() {
    let mut t = world().process.lock().unwrap_or_else(|p| p.into_inner());
    if let Ok(Some(status)) = t.try_wait() {
        panic!("the target process died: {status}");
    }
}

fn report() {
    let n = INPUTS.fetch_add(1, Ordering::Relaxed) + 1;
    let line = format!(
        "inputs {n} loaded {} refused {} reached_ep_create {} reached_rkey_unpack {} reached_rma {} rma_done {} rma_failed {}\n",
        LOADED.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
        REACHED_EP.load(Ordering::Relaxed),
        REACHED_RKEY.load(Ordering::Relaxed),
        REACHED_RMA.load(Ordering::Relaxed),
        RMA_DONE.load(Ordering::Relaxed),
        RMA_FAILED.load(Ordering::Relaxed),
    );
    if n.is_multiple_of(1000) {
        eprint!("UNPACK-STATS {line}");
    }
    if let Some(dir) = std::env::var_os("NIXL_FUZZ_STATS") {
        nixl_core::wire::fuzz::write_stats(std::path::Path::new(&dir), &line);
    }
}
