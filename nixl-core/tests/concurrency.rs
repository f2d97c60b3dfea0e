//! One agent shared by 8 threads posting and polling concurrently; no notification is lost.

use std::sync::Arc;
use std::time::Duration;

use nixl_core::{AgentConfig, MemKind, XferDescList, XferOp, XferOptions, XferTarget};
use nixl_testkit::{inproc_agent_with as agent_with, registered};

#[test]
fn eight_threads_share_one_agent_and_lose_no_notification() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 300;
    const BLOCK: u64 = 4096;
    for progress_thread in [false, true] {
        let config = AgentConfig::default().progress_thread(progress_thread);
        let a = agent_with("cc-a", config.clone());
        let b = agent_with("cc-b", config);
        let (sa, _ra) = registered(&a, BLOCK as usize * THREADS);
        let (sb, _rb) = registered(&b, BLOCK as usize * THREADS);
        sa.fill_pattern(42);
        a.load_remote_metadata(&b.local_metadata().unwrap())
            .unwrap();
        let local = Arc::new(
            a.prep_xfer_dlist(
                XferTarget::Initiator,
                &XferDescList::blocks(MemKind::Dram, sa.addr(), BLOCK, THREADS),
                &[],
            )
            .unwrap(),
        );
        let remote = Arc::new(
            a.prep_xfer_dlist(
                XferTarget::Agent(b.name()),
                &XferDescList::blocks(MemKind::Dram, sb.addr(), BLOCK, THREADS),
                &[],
            )
            .unwrap(),
        );
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (a, local, remote, bname) = (
                    a.clone(),
                    local.clone(),
                    remote.clone(),
                    b.name().to_owned(),
                );
                s.spawn(move || {
                    for r in 0..ROUNDS {
                        let req = a
                            .make_prepped_xfer(
                                XferOp::Write,
                                &local,
                                &[t],
                                &remote,
                                &[t],
                                XferOptions::with_notif(format!("{t}:{r}").into_bytes()),
                            )
                            .unwrap();
                        a.post_xfer_req(&req).unwrap();
                        req.wait(Duration::from_secs(10)).unwrap();
                        if r % 3 == 0 {
                            a.gen_notif(&bname, format!("g{t}:{r}").as_bytes(), &[])
                                .unwrap();
                        }
                    }
                });
            }
        });
        let mut got: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut n = b.wait_notifs(Duration::from_millis(100)).unwrap();
            if n.is_empty() {
                break;
            }
            got.append(n.get_mut(a.name()).unwrap());
        }
        let per_thread_generated = ROUNDS.div_ceil(3);
        assert_eq!(got.len(), THREADS * (ROUNDS + per_thread_generated));
        // Per thread, its messages arrive in the order it sent them.
        for t in 0..THREADS {
            let mine: Vec<String> = got
                .iter()
                .map(|m| String::from_utf8(m.clone()).unwrap())
                .filter(|m| m.starts_with(&format!("{t}:")))
                .collect();
            let want: Vec<String> = (0..ROUNDS).map(|r| format!("{t}:{r}")).collect();
            assert_eq!(mine, want);
        }
        assert_eq!(sa.to_vec(), sb.to_vec());
    }
}
