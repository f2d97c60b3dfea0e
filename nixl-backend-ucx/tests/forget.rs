//! Forgetting a peer leaves nothing behind in this process. Alone in its test binary: it
//! counts the process's descriptors and mappings, which other tests running beside it change.
//! Skips with a printed reason when no UCX can be loaded.

use nixl_testkit::ucx as common;

use std::time::Duration;

use nixl_core::{Agent, MemKind, XferDescList, XferOp, XferOptions};

const T: Duration = Duration::from_secs(30);

fn one(len: u64, addr: u64) -> XferDescList {
    XferDescList::blocks(MemKind::Dram, addr, len, 1)
}

/// Open file descriptors and memory mappings of this process, together.
fn open_fds() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count) + maps
}

/// Forgetting a peer leaves no connection behind: 64 rounds of load, a 4 KiB WRITE with a
/// notification (every other round; every byte checked) and `invalidate_remote_metadata`
/// leave this process's descriptors and mappings where they started (within a slack of 8,
/// waiting up to 10 s for closes to finish), over tcp and over shared memory. Before the
/// backend kept forgotten peers' endpoints for reuse, each round left UCX's connection open on
/// both sides (2 descriptors or mappings a round over tcp, 6 over shm and cma: 128-384 after
/// the 64 rounds).
#[test]
fn forgetting_a_peer_releases_its_connection() {
    if !common::ucx_or_skip("forget releases") {
        return;
    }
    for tls in [common::TCP, "shm,cma,self,tcp", "sysv,cma,self,tcp"] {
        let len = 1 << 16;
        let mk = |role| {
            let a = Agent::new(&common::unique(role), common::config(false)).expect("agent");
            a.create_backend(common::params(tls)).expect("backend");
            a
        };
        let (a, b) = (mk("forget-a"), mk("forget-b"));
        let (src, dst) = (common::buf(len), common::buf(len));
        src.fill_pattern(3);
        let _regs = [
            a.register_mem(vec![src.clone()], &[]).expect("register"),
            b.register_mem(vec![dst.clone()], &[]).expect("register"),
        ];
        let md = b.local_metadata().expect("md");
        // One round first: UCX's own lazily made resources (the interface's listener
        // connections, the shared-memory segments it keeps) are not the peer's.
        let round = |i: usize| {
            a.load_remote_metadata(&md).expect("load");
            if i.is_multiple_of(2) {
                dst.fill(0);
                let req = a
                    .create_xfer_req(
                        XferOp::Write,
                        &one(4096, src.addr()),
                        &one(4096, dst.addr()),
                        b.name(),
                        XferOptions::with_notif(b"f".to_vec()),
                    )
                    .expect("request");
                a.post_xfer_req(&req).expect("post");
                req.wait(T).expect("done");
                assert!(
                    dst.to_vec()[..4096] == src.to_vec()[..4096],
                    "{tls}: round {i}"
                );
                assert_eq!(
                    b.wait_notifs(T).expect("notification")[a.name()],
                    vec![b"f".to_vec()]
                );
            }
            a.invalidate_remote_metadata(b.name()).expect("forget");
        };
        round(0);
        std::thread::sleep(Duration::from_millis(300));
        let before = open_fds();
        for i in 0..64 {
            round(i);
        }
        let end = std::time::Instant::now() + Duration::from_secs(10);
        let mut now = open_fds();
        while now > before + 8 && std::time::Instant::now() < end {
            a.progress();
            b.progress();
            std::thread::sleep(Duration::from_millis(50));
            now = open_fds();
        }
        assert!(
            now <= before + 8,
            "{tls}: {before} descriptors before 64 rounds of load + forget, {now} after"
        );
    }
}
