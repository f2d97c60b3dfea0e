#![allow(dead_code)]
//! Shared by the unpack targets. Per provider (each target's `PROVIDERS`: tcp with two rails,
//! shm, and for endpoint names sockets):
//!
//! - a **victim** agent in the fuzzing process that loads hostile metadata through its public
//!   API (authentication off), so every input the backend's checks let through reaches the
//!   real `fi_av_insert` (and, with keys, a real `fi_write` / `fi_read`);
//! - a live **target** agent in a second process (this binary again, spawned by [`world`]
//!   with `NIXL_FUZZ_TARGET_PROCESS` set, serving until the fuzzing process goes away), whose
//!   real endpoint names, keys and region are the base the inputs mutate. A peer in another
//!   process is what a victim meets in production: the shm provider maps and unmaps its region
//!   (it never maps its own process's), tcp and sockets connect across processes.
//!
//! Counts: how many inputs reached `fi_av_insert` / an RMA post (the backend's `fuzzing`
//! counters), printed every 1,000 inputs as `UNPACK-STATS`, and, where `NIXL_FUZZ_STATS` names
//! a directory, written after every input to `<dir>/<pid>` (libFuzzer's fork mode keeps no
//! output of its jobs: sum the files after the run).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nixl_backend_libfabric::fuzzing::{av_inserts, decode_conn, encode_conn, rma_posts};
use nixl_backend_libfabric::LibfabricParams;
use nixl_core::wire::codec::AgentMetadata;
use nixl_core::{Agent, AgentConfig, Error, HostBuffer, Registration};

/// Bytes of the victim's and the targets' registered buffers.
pub const BUF: usize = 1 << 16;
/// Set in the target process's environment.
const ROLE: &str = "NIXL_FUZZ_TARGET_PROCESS";
/// The providers, and their rails: each target names its own (`crate::PROVIDERS`).
use crate::PROVIDERS;

/// A victim agent, its registered buffer (the local side of its transfers) and its own
/// endpoint names (a peer may name them too).
pub struct Victim {
    pub agent: Agent,
    pub local: Arc<HostBuffer>,
    pub own: Vec<Vec<u8>>,
    _reg: Registration,
}

/// One provider's victim, and what its target published.
pub struct Pair {
    pub provider: String,
    rails: usize,
    victim: Mutex<Victim>,
    /// The target's endpoint names, one per rail.
    pub names: Vec<Vec<u8>>,
    /// The target's connection info (unmodified).
    pub conn: Vec<u8>,
    /// The target's region: `(addr, len)`, and its public metadata (keys).
    pub region: (u64, u64),
    pub public: Vec<u8>,
    exhausted: std::sync::atomic::AtomicBool,
}

impl Pair {
    pub fn victim(&self) -> MutexGuard<'_, Victim> {
        self.victim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces a victim whose endpoint stopped working (libfabric 1.17's shm provider never
    /// answers an RMA its target refuses, and the initiator's endpoint then sends to no one:
    /// see docs/security.md), so later inputs reach a working one. Each replaced victim's
    /// stuck request keeps its backend, endpoint included (never freed under a transfer that
    /// may still touch its memory); once the provider makes no more endpoints in this process
    /// (shm: a few hundred), the pair is exhausted and its inputs are skipped.
    pub fn replace_victim(&self) {
        if self.exhausted() {
            return;
        }
        let core = self.provider.split(';').next().unwrap_or_default();
        let fresh = match try_victim(core, self.rails) {
            Ok(v) => v,
            Err(e) => {
                self.exhausted.store(true, Ordering::Relaxed);
                eprintln!(
                    "fuzz world: no more {} victims after {} replaced ({e}): its inputs are skipped from now",
                    self.provider,
                    REPLACED.load(Ordering::Relaxed)
                );
                return;
            }
        };
        let old = std::mem::replace(&mut *self.victim(), fresh);
        drop(old);
        REPLACED.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "fuzz world: replaced the {} victim (its endpoint stopped working)",
            self.provider
        );
    }

    /// Whether no working victim can be made any more (see [`Pair::replace_victim`]).
    pub fn exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }
}

pub struct World {
    pub pairs: Vec<Pair>,
    target: Mutex<Child>,
}

static WORLD: OnceLock<World> = OnceLock::new();
static INPUTS: AtomicU64 = AtomicU64::new(0);
static LOADED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static REACHED_AV: AtomicU64 = AtomicU64::new(0);
static REACHED_RMA: AtomicU64 = AtomicU64::new(0);
static RMA_DONE: AtomicU64 = AtomicU64::new(0);
static RMA_DONE_FOREIGN: AtomicU64 = AtomicU64::new(0);
static REPLACED: AtomicU64 = AtomicU64::new(0);

fn params(provider: &str, rails: usize) -> LibfabricParams {
    LibfabricParams::default()
        .provider(provider.to_string())
        .domains(if provider == "tcp" {
            vec!["lo".into()]
        } else {
            Vec::new()
        })
        .rails(rails)
        .op_timeout(Duration::from_millis(100))
        .notif_slots(8)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The fuzz binary's `init`: in the target process, creates the targets, prints one line of
/// metadata per provider, serves until stdin closes (the fuzzing process went away), closes
/// the endpoints (unlinking the shm regions) and exits. Elsewhere it does nothing.
pub fn init() {
    // libFuzzer's `main` is C++: the Rust runtime never set SIGPIPE to be ignored as it does
    // for a Rust `main`, and a provider writing to a closed socket would kill the process.
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    let mut keep = Vec::new();
    let mut out = std::io::stdout().lock();
    for (i, (provider, rails)) in PROVIDERS.iter().enumerate() {
        let name = format!("fuzz-target-{provider}-{}", std::process::id());
        let t = Agent::new(&name, AgentConfig::default()).expect("target agent");
        t.create_backend(params(provider, *rails))
            .expect("target libfabric backend");
        let buf = Arc::new(HostBuffer::new(BUF).expect("alloc"));
        buf.fill_pattern(i as u64 + 1);
        let reg = t.register_mem(vec![buf.clone()], &[]).expect("register");
        let md = t.local_metadata().expect("target metadata");
        writeln!(out, "{} {} {}", hex(&md), buf.addr(), buf.len()).expect("stdout");
        keep.push((t, buf, reg));
    }
    out.flush().expect("stdout");
    drop(out);
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(keep);
    std::process::exit(0);
}

fn spawn_target() -> (Child, Vec<(AgentMetadata, u64, u64)>) {
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
    for _ in PROVIDERS.iter() {
        let line = lines
            .next()
            .expect("a target line")
            .expect("reading the target");
        let f: Vec<&str> = line.split(' ').collect();
        let md = AgentMetadata::decode_bytes(&unhex(f[0])).expect("target metadata");
        targets.push((md, f[1].parse().expect("addr"), f[2].parse().expect("len")));
    }
    (child, targets)
}

fn victim(provider: &str, rails: usize) -> Victim {
    try_victim(provider, rails).expect("victim libfabric backend")
}

/// A victim, or why its backend could not be made.
fn try_victim(provider: &str, rails: usize) -> Result<Victim, Error> {
    let name = format!(
        "fuzz-victim-{provider}-{}-{}",
        std::process::id(),
        REPLACED.load(Ordering::Relaxed)
    );
    let agent = Agent::new(&name, AgentConfig::default()).expect("victim");
    agent.create_backend(params(provider, rails))?;
    let local = Arc::new(HostBuffer::new(BUF).expect("alloc"));
    let reg = agent
        .register_mem(vec![local.clone()], &[])
        .expect("victim register");
    let md = AgentMetadata::decode_bytes(&agent.local_metadata().expect("md")).expect("decode");
    let (_, own) = decode_conn(&md.backends[0].conn_info).expect("victim conn info");
    Ok(Victim {
        agent,
        local,
        own,
        _reg: reg,
    })
}

fn pair((provider, rails): (&str, usize), (md, addr, len): (AgentMetadata, u64, u64)) -> Pair {
    let v = victim(provider, rails);
    let conn = md.backends[0].conn_info.clone();
    let (prov, names) = decode_conn(&conn).expect("target conn info");
    let show = |n: &[Vec<u8>]| {
        n.iter()
            .map(|n| n.escape_ascii().to_string())
            .collect::<Vec<_>>()
    };
    eprintln!(
        "fuzz world: {prov}: target names {:?}, own {:?}, target region {len} bytes",
        show(&names),
        show(&v.own)
    );
    Pair {
        provider: prov,
        rails,
        victim: Mutex::new(v),
        names,
        conn,
        region: (addr, len),
        public: md.regions[0].public.clone(),
        exhausted: std::sync::atomic::AtomicBool::new(false),
    }
}

pub fn world() -> &'static World {
    WORLD.get_or_init(|| {
        let (target, published) = spawn_target();
        World {
            pairs: PROVIDERS
                .iter()
                .copied()
                .zip(published)
                .map(|(p, t)| pair(p, t))
                .collect(),
            target: Mutex::new(target),
        }
    })
}

pub use nixl_core::wire::fuzz::mutate;

/// Metadata of a fresh peer name with one LIBFABRIC backend and optional region.
pub fn metadata(conn_info: Vec<u8>, region: Option<(Vec<u8>, (u64, u64))>) -> (String, Vec<u8>) {
    nixl_core::wire::fuzz::peer_metadata("LIBFABRIC", conn_info, region)
}

pub fn conn(provider: &str, names: &[Vec<u8>]) -> Vec<u8> {
    encode_conn(provider, names)
}

/// Loads hostile metadata into `pair`'s victim, runs `then` on it when it loaded, and forgets
/// it again: whatever loaded is torn down (addresses removed from the AVs) before the next
/// input. Returns how loading ended, and what `then` returned.
pub fn load_and_forget<T: Default>(
    pair: &Pair,
    bytes: &[u8],
    name: &str,
    then: impl FnOnce(&Victim) -> T,
) -> Result<T, Error> {
    let (av0, rma0) = (av_inserts(), rma_posts());
    let v = pair.victim();
    let mut r = v.agent.load_remote_metadata(bytes).map(|_| T::default());
    if let Ok(out) = &mut r {
        LOADED.fetch_add(1, Ordering::Relaxed);
        *out = then(&v);
        v.agent.progress();
        let _ = v.agent.invalidate_remote_metadata(name);
        v.agent.progress();
    } else {
        REFUSED.fetch_add(1, Ordering::Relaxed);
    }
    drop(v);
    if av_inserts() > av0 {
        REACHED_AV.fetch_add(1, Ordering::Relaxed);
    }
    if rma_posts() > rma0 {
        REACHED_RMA.fetch_add(1, Ordering::Relaxed);
    }
    check_target();
    report();
    r
}

/// A crash of the target process (its provider handling what the victim sent) is a crash
/// of this input too.
fn check_target() {
    let mut t = world().target.lock().unwrap_or_else(|p| p.into_inner());
    if let Ok(Some(status)) = t.try_wait() {
        panic!("the target process died: {status}");
    }
}

/// Counts an RMA that completed (the target's provider accepted the key and range);
/// `foreign`: with a key or a range the target never registered (a provider that did not
/// check them).
pub fn rma_done(foreign: bool) {
    RMA_DONE.fetch_add(1, Ordering::Relaxed);
    if foreign {
        RMA_DONE_FOREIGN.fetch_add(1, Ordering::Relaxed);
    }
}

fn report() {
    let n = INPUTS.fetch_add(1, Ordering::Relaxed) + 1;
    let line = format!(
        "inputs {n} loaded {} refused {} reached_av_insert {} reached_rma {} rma_done {} rma_done_foreign {} victims_replaced {}\n",
        LOADED.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
        REACHED_AV.load(Ordering::Relaxed),
        REACHED_RMA.load(Ordering::Relaxed),
        RMA_DONE.load(Ordering::Relaxed),
        RMA_DONE_FOREIGN.load(Ordering::Relaxed),
        REPLACED.load(Ordering::Relaxed),
    );
    if n.is_multiple_of(1000) {
        eprint!("UNPACK-STATS {line}");
    }
    if let Some(dir) = std::env::var_os("NIXL_FUZZ_STATS") {
        nixl_core::wire::fuzz::write_stats(std::path::Path::new(&dir), &line);
    }
}
