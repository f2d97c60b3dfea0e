#![allow(dead_code)]
//! Shared by the unpack targets: a victim agent (UCX over tcp, shared memory, CMA and self,
//! authentication off) that loads hostile metadata through its public API, so every input the
//! checks let through reaches the real `ucp_ep_create` / `ucp_ep_rkey_unpack`; and a live
//! target agent whose real worker addresses and keys are the base the inputs mutate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use nixl_backend_ucx::fuzzing::{decode_conn, decode_rkey, encode_conn, encode_rkey};
use nixl_backend_ucx::UcxParams;
use nixl_core::codec::{AgentMetadata, BackendEntry, RegionEntry};
use nixl_core::{Agent, AgentConfig, HostBuffer, MemKind, RegionDesc, Registration};

pub struct World {
    pub victim: Agent,
    /// Worker addresses of targets over each transport selection.
    pub addresses: Vec<Vec<u8>>,
    /// Packed rkeys of the targets' registrations, with their worker address.
    pub rkeys: Vec<(Vec<u8>, Vec<u8>)>,
    pub region: (u64, u64),
    _targets: Vec<(Agent, Arc<HostBuffer>, Registration)>,
}

static WORLD: OnceLock<World> = OnceLock::new();
static SEQ: AtomicU64 = AtomicU64::new(1);
static LOADED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

fn ucx(tls: &str) -> UcxParams {
    UcxParams {
        transports: Some(tls.into()),
        // Mutated addresses name unreachable hosts; UCX's default blocking tcp connect would
        // then take the kernel's SYN timeout (minutes) per input. Parsing is the same.
        config: vec![("TCP_CONN_NB".into(), "y".into())],
        ..UcxParams::default()
    }
}

pub fn world() -> &'static World {
    WORLD.get_or_init(|| {
        let victim = Agent::new("fuzz-victim", AgentConfig::default()).expect("victim");
        victim
            .create_backend(ucx("tcp,shm,cma,self"))
            .expect("victim UCX");
        let mut addresses = Vec::new();
        let mut rkeys = Vec::new();
        let mut targets = Vec::new();
        let mut region = (0, 0);
        for (i, tls) in ["tcp", "shm,cma,self", "tcp,shm,cma,self"].iter().enumerate() {
            let t = Agent::new(&format!("fuzz-target-{i}"), AgentConfig::default()).expect("target");
            t.create_backend(ucx(tls)).expect("target UCX");
            let buf = Arc::new(HostBuffer::new(1 << 16).expect("alloc"));
            let reg = t.register_mem(vec![buf.clone()], &[]).expect("register");
            let md = AgentMetadata::decode(&t.local_metadata().expect("md")).expect("decode");
            let conn = decode_conn(&md.backends[0].conn_info).expect("conn");
            let (_, packed) = decode_rkey(&md.regions[0].public).expect("rkey");
            addresses.push(conn[0].clone());
            rkeys.push((packed.to_vec(), conn[0].clone()));
            region = (buf.addr(), buf.len() as u64);
            targets.push((t, buf, reg));
        }
        World {
            victim,
            addresses,
            rkeys,
            region,
            _targets: targets,
        }
    })
}

/// Applies an input to a base: byte 0 picks the mode; then `(offset, xor)` pairs edit the
/// base, or (raw mode) the rest of the input replaces it; a final length byte may truncate
/// or extend.
pub fn mutate(base: &[u8], data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else {
        return base.to_vec();
    };
    if mode & 0x80 != 0 {
        return rest.to_vec();
    }
    let mut out = base.to_vec();
    let mut it = rest.chunks_exact(2);
    for pair in &mut it {
        if out.is_empty() {
            break;
        }
        let i = usize::from(pair[0]) % out.len();
        out[i] ^= pair[1];
    }
    if let [len] = it.remainder() {
        let n = usize::from(*len);
        if mode & 0x40 != 0 {
            out.truncate(n.min(out.len()));
        } else if mode & 0x20 != 0 {
            out.extend(std::iter::repeat_n(*len, n % 17));
        }
    }
    out
}

/// Metadata of a fresh peer name with one backend and optional region.
pub fn metadata(conn_info: Vec<u8>, rkey: Option<(Vec<u8>, (u64, u64))>) -> (String, Vec<u8>) {
    let name = format!("fuzz-peer-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let regions = rkey
        .map(|(packed, (addr, len))| RegionEntry {
            backend: 0,
            desc: RegionDesc {
                kind: MemKind::Dram,
                addr,
                len,
                dev_id: 0,
                meta: Vec::new(),
            },
            public: encode_rkey(0, &packed),
        })
        .into_iter()
        .collect();
    let md = AgentMetadata {
        name: name.clone(),
        generation: 1,
        has_conn_info: true,
        process: None,
        verifies_integrity: false,
        backends: vec![BackendEntry {
            name: "UCX".into(),
            conn_info,
        }],
        regions,
    };
    (name, md.encode())
}

/// Loads hostile metadata into the victim and forgets it again: whatever loads is torn down
/// (endpoints force-closed, keys destroyed) before the next input.
pub fn load_and_forget(bytes: &[u8], name: &str) {
    let v = &world().victim;
    if v.load_remote_metadata(bytes).is_ok() {
        LOADED.fetch_add(1, Ordering::Relaxed);
        v.progress();
        let _ = v.invalidate_remote_metadata(name);
        v.progress();
    } else {
        REFUSED.fetch_add(1, Ordering::Relaxed);
    }
    let (l, r) = (LOADED.load(Ordering::Relaxed), REFUSED.load(Ordering::Relaxed));
    if (l + r) % 5000 == 0 {
        // How many inputs got past the checks into UCX (and loaded) in this process.
        eprintln!("UNPACK-STATS loaded {l} refused {r}");
    }
}

pub fn conn(addr: &[u8]) -> Vec<u8> {
    encode_conn(&[addr])
}
