//! No stray write (issue 22): direct CMA copies aim at a proven process, never at a thread of
//! this process, never at a process that exited; forgetting a peer stops its copies; a check
//! of a large request does a bounded slice of its copying and returns by its deadline.
//!
//! A forged peer's metadata is made from a real agent's by changing the process it names
//! (the blob's checksums recomputed, as an attacker on the same host can).

use nixl_testkit::ucx::hostile;
use nixl_testkit::ucx::ucx_or_skip;

use std::sync::Arc;
use std::time::Duration;

use nixl::core::backend::ProcessId;
use nixl::core::wire::codec::AgentMetadata;
use nixl::core::{ErrorKind, RegionDesc};
use nixl::ucx::{fuzzing, UcxParams};
use nixl::{Agent, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};

const SHM: &str = "shm,cma,self";

fn registered(a: &Agent, len: usize) -> (Arc<HostBuffer>, nixl::Registration) {
    let b = Arc::new(HostBuffer::new(len).expect("alloc"));
    let r = a.register_mem(vec![b.clone()], &[]).expect("register");
    (b, r)
}

/// The start time (field 22 of `/proc/<id>/stat`) of a process or thread.
fn start_time(id: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{id}/stat")).expect("stat");
    s[s.rfind(')').expect("comm") + 1..]
        .split_whitespace()
        .nth(19)
        .expect("field 22")
        .parse()
        .expect("number")
}

/// A thread of this process that lives until the returned sender is dropped: its id.
fn a_thread() -> (u32, std::sync::mpsc::Sender<()>) {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let link = std::fs::read_link("/proc/thread-self").expect("thread-self");
        let tid: u32 = link
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok())
            .expect("tid");
        tid_tx.send(tid).expect("send tid");
        let _ = stop_rx.recv();
    });
    let tid = tid_rx.recv().expect("tid");
    assert_ne!(tid, std::process::id());
    (tid, stop_tx)
}

/// `md` (a real agent's metadata) naming process `id` instead, in its agent metadata and in
/// its UCX connection info, with one region `region` (an address the attacker chooses).
fn forged(md: &[u8], id: ProcessId, region: (u64, u64)) -> Vec<u8> {
    forged_as(md, None, Some(id), region)
}

/// Writes `len` bytes of `src` into `remote`'s region at `raddr`; the outcome.
fn write(a: &Agent, src: &HostBuffer, remote: &str, raddr: u64, len: u64) -> nixl::Result<String> {
    let local = XferDescList::blocks(MemKind::Dram, src.addr(), len, 1);
    let rl = XferDescList::blocks(MemKind::Dram, raddr, len, 1);
    let r = a.create_xfer_req(XferOp::Write, &local, &rl, remote, XferOptions::default())?;
    a.post_xfer_req(&r)?;
    r.wait(Duration::from_secs(10))?;
    Ok(r.path())
}

/// A forged peer whose metadata names a thread of the victim's own process (start time from
/// `/proc/<tid>/stat`, checksums recomputed) and a region at the victim's own secret buffer:
/// before, the victim's WRITE to it landed in that buffer (direct CMA to the thread id, which
/// passed the "not this process" guard). Now the load is refused, typed, and nothing lands.
#[test]
fn a_peer_naming_a_thread_of_this_process_is_refused() {
    if !ucx_or_skip("a_peer_naming_a_thread_of_this_process_is_refused") {
        return;
    }
    let victim = hostile::agent("victim", SHM, None);
    let attacker = hostile::agent("attacker", SHM, None);
    let (secret, _r1) = registered(&victim, 4096);
    secret.fill(0x11);
    let (src, _r2) = registered(&victim, 4096);
    src.fill(0xEE);
    let (_theirs, _r3) = registered(&attacker, 4096);
    let (tid, _keep) = a_thread();
    let me = ProcessId::current().expect("/proc");
    let id = ProcessId {
        pid: tid,
        start_time: start_time(tid),
        ..me
    };
    let md = forged(
        &attacker.local_metadata().expect("md"),
        id,
        (secret.addr(), 4096),
    );
    let loaded = victim.load_remote_metadata(&md);
    let outcome = loaded
        .as_ref()
        .map_err(|e| e.clone())
        .and_then(|name| write(&victim, &src, name, secret.addr(), 4096));
    assert!(
        secret.to_vec().iter().all(|&b| b == 0x11),
        "the victim's WRITE landed in its own buffer ({outcome:?})"
    );
    let e = loaded.expect_err("metadata naming a thread of this process is refused");
    assert_eq!(e.kind(), ErrorKind::InvalidParam, "{e}");
    assert!(e.to_string().contains("thread"), "{e}");
}

/// The agent's metadata names the attacker's real process but its UCX connection info names
/// a thread of the victim: such connection info is refused at load, so no copy of any kind is
/// aimed at the thread (first: the direct copies went to the thread id; then the load was
/// accepted with direct CMA turned off).
#[test]
fn a_ucx_connection_info_naming_another_process_is_refused() {
    if !ucx_or_skip("a_ucx_connection_info_naming_another_process_gets_no_direct_copies") {
        return;
    }
    let params = UcxParams::default()
        .transports(SHM.to_string())
        .direct_cma_same_process(true);
    let victim = Agent::new(&hostile::unique("victim"), hostile::config(None)).expect("agent");
    victim.create_backend(params.clone()).expect("UCX");
    let attacker = Agent::new(&hostile::unique("attacker"), hostile::config(None)).expect("agent");
    attacker.create_backend(params).expect("UCX");
    let (src, _r1) = registered(&victim, 4096);
    src.fill(0xEE);
    let (theirs, _r2) = registered(&attacker, 4096);
    let (tid, _keep) = a_thread();
    let me = ProcessId::current().expect("/proc");
    let mut m = AgentMetadata::decode_bytes(
        nixl::core::wire::auth::unsealed(&attacker.local_metadata().expect("md")).expect("plain"),
    )
    .expect("md");
    assert_eq!(m.process, Some(me));
    let thread = ProcessId {
        pid: tid,
        start_time: start_time(tid),
        ..me
    };
    for b in &mut m.backends {
        let info = fuzzing::decode_conn_info(&b.conn_info).expect("UCX conn info");
        let addrs: Vec<&[u8]> = info.addresses.iter().map(Vec::as_slice).collect();
        b.conn_info = fuzzing::encode_conn_with(&addrs, Some(&thread));
    }
    // Connection info naming another process than the one the metadata was proven to come
    // from is refused at load (issue 34: it used to load, with direct CMA only turned off,
    // while UCX's own copies could still be aimed elsewhere).
    let e = victim
        .load_remote_metadata(&m.encode())
        .expect_err("connection info naming another process");
    assert_eq!(e.kind(), nixl::core::ErrorKind::NotAllowed, "{e}");
    assert!(e.to_string().contains("names another process"), "{e}");
    assert!(theirs.to_vec().iter().all(|&b| b == 0), "nothing moved");
}

/// Two agents of this process over shared memory with direct CMA between them (a process may
/// attach to itself: the same system calls run as between two processes).
fn direct_pair(threads: usize) -> (Agent, Agent) {
    let params = UcxParams::default()
        .transports(SHM.to_string())
        .direct_cma_same_process(true)
        .cma_threads(threads);
    let mk = |role| {
        let a = Agent::new(&hostile::unique(role), hostile::config(None)).expect("agent");
        a.create_backend(params.clone()).expect("UCX");
        a
    };
    (mk("initiator"), mk("target"))
}

/// The target published a large buffer, the initiator posted one WRITE of all of it (copied
/// in pieces by its copy threads) and then forgot the target: once `invalidate_remote_metadata`
/// returns, no byte lands any more (before: the copy threads went on writing for as long as
/// the copy took, over what the target had reused), and the request ends with an error that
/// says the peer was invalidated, not `PeerRestarted`.
#[test]
fn forgetting_a_peer_stops_its_direct_copies() {
    if !ucx_or_skip("forgetting_a_peer_stops_its_direct_copies") {
        return;
    }
    const LEN: u64 = 512 << 20;
    let (a, b) = direct_pair(1);
    let (src, _r1) = registered(&a, LEN as usize);
    src.fill(0x5a);
    let (dst, _r2) = registered(&b, LEN as usize);
    a.load_remote_metadata(&b.local_metadata().expect("md"))
        .expect("load");
    let local = XferDescList::blocks(MemKind::Dram, src.addr(), LEN, 1);
    let remote = XferDescList::blocks(MemKind::Dram, dst.addr(), LEN, 1);
    let r = a
        .create_xfer_req(
            XferOp::Write,
            &local,
            &remote,
            b.name(),
            XferOptions::default(),
        )
        .expect("make");
    assert_eq!(
        a.post_xfer_req(&r).expect("post"),
        nixl::XferState::InProgress,
        "a {LEN} B direct WRITE is copied by the copy threads after post"
    );
    assert!(r.path().contains("direct CMA"), "{}", r.path());
    a.invalidate_remote_metadata(b.name()).expect("forget");
    // The target reuses its memory at once.
    dst.fill(0xcc);
    std::thread::sleep(Duration::from_millis(500));
    let v = dst.to_vec();
    let clean = [0xccu8; 4096];
    let landed = v.chunks(4096).filter(|c| *c != &clean[..c.len()]).count();
    assert_eq!(
        landed, 0,
        "{landed} pages were written after the peer was forgotten"
    );
    let e = r
        .wait(Duration::from_secs(10))
        .expect_err("the write was cut short");
    assert_eq!(e.kind(), ErrorKind::RemoteDisconnect, "{e}");
    assert!(e.to_string().contains("invalidated"), "{e}");
}

/// What a forged peer claims (see [`a_peer_naming_a_worker_of_this_process_is_refused`]).
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// The victim's own metadata under a new name, naming no process.
    VictimsWorker,
    /// Another agent of this process's metadata under a new name, naming no process.
    AnotherAgentsWorker,
    /// That agent's metadata under a new name, naming this process (truly).
    NewNameInThisProcess,
    /// That agent's own name, generation and process, with a region it never registered.
    ThatAgentWithARegionNotItsOwn,
}

/// Metadata `md` renamed to `name` (when given), naming process `process`, with its first
/// region moved to `region`.
fn forged_as(
    md: &[u8],
    name: Option<&str>,
    process: Option<ProcessId>,
    region: (u64, u64),
) -> Vec<u8> {
    let mut m = AgentMetadata::decode_bytes(nixl::core::wire::auth::unsealed(md).expect("plain"))
        .expect("md");
    if let Some(n) = name {
        m.name = n.to_owned();
    }
    m.process = process;
    for b in &mut m.backends {
        let info = fuzzing::decode_conn_info(&b.conn_info).expect("UCX conn info");
        let addrs: Vec<&[u8]> = info.addresses.iter().map(Vec::as_slice).collect();
        b.conn_info = fuzzing::encode_conn_with(&addrs, process.as_ref());
    }
    let r = &mut m.regions[0];
    r.desc = RegionDesc {
        addr: region.0,
        len: region.1,
        ..r.desc.clone()
    };
    m.encode()
}

/// A peer whose UCX worker address is a worker of this very process (the victim's own, or
/// another agent's here) under a name no agent of this process has, or under such an agent's
/// name with a region it never registered: the victim's WRITE "to the peer" would go through
/// that worker, whose puts (emulated with messages over tcp and shared memory) write wherever
/// the sender says: into the victim's own memory (found by the fuzz target
/// `ucx/unpack_address`: a mutated shared-memory address named the fuzzing process's own
/// FIFO and the emulated put wrote at the target process's address, which killed it). Every
/// such load is refused, typed `NotAllowed`, and no byte lands, over each of UCX's transports.
#[test]
fn a_peer_naming_a_worker_of_this_process_is_refused() {
    if !ucx_or_skip("a_peer_naming_a_worker_of_this_process_is_refused") {
        return;
    }
    let me = ProcessId::current().expect("/proc");
    let mut landed = Vec::new();
    for tls in [
        "tcp",
        "sysv",
        "posix",
        "self",
        "shm,cma,self",
        "tcp,sysv,self",
    ] {
        for claim in [
            Claim::VictimsWorker,
            Claim::AnotherAgentsWorker,
            Claim::NewNameInThisProcess,
            Claim::ThatAgentWithARegionNotItsOwn,
        ] {
            let victim = hostile::agent("victim", tls, None);
            let other = hostile::agent("other", tls, None);
            let (secret, _r1) = registered(&victim, 4096);
            secret.fill(0x11);
            let (src, _r2) = registered(&victim, 4096);
            src.fill(0xEE);
            let (_theirs, _r3) = registered(&other, 4096);
            let region = (secret.addr(), 4096);
            let liar = hostile::unique("liar");
            let md = match claim {
                Claim::VictimsWorker => forged_as(
                    &victim.local_metadata().expect("md"),
                    Some(&liar),
                    None,
                    region,
                ),
                Claim::AnotherAgentsWorker => forged_as(
                    &other.local_metadata().expect("md"),
                    Some(&liar),
                    None,
                    region,
                ),
                Claim::NewNameInThisProcess => forged_as(
                    &other.local_metadata().expect("md"),
                    Some(&liar),
                    Some(me),
                    region,
                ),
                Claim::ThatAgentWithARegionNotItsOwn => {
                    forged_as(&other.local_metadata().expect("md"), None, Some(me), region)
                }
            };
            let loaded = victim.load_remote_metadata(&md);
            let outcome = loaded
                .as_ref()
                .map_err(|e| e.clone())
                .and_then(|name| write(&victim, &src, name, secret.addr(), 4096));
            if !secret.to_vec().iter().all(|&b| b == 0x11) {
                landed.push(format!(
                    "{tls} {claim:?}: the WRITE landed in the victim's own buffer ({outcome:?})"
                ));
                continue;
            }
            match loaded {
                Err(e) if e.kind() == ErrorKind::NotAllowed => {}
                other => landed.push(format!(
                    "{tls} {claim:?}: loaded ({other:?}), then {outcome:?}"
                )),
            }
        }
    }
    assert!(landed.is_empty(), "{}", landed.join("\n"));
}
