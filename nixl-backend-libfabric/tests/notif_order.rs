//! Notifications are delivered in order and never dropped while several threads drive the
//! receiver's progress at once (its progress thread blocking in `fi_cq_sread` and application
//! threads polling): a completion read by one thread must not be handled after a later one
//! another thread read. A fresh sender's first notification right after its hello is the
//! sharpest case (handled before the hello, it names an unknown session and is lost).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::{Agent, AgentConfig};
use nixl_testkit::libfabric::skip_without_provider;

const SENDERS: usize = 100;
const PER_SENDER: u32 = 20;

#[test]
fn notifications_stay_in_order_under_concurrent_progress() {
    if skip_without_provider("tcp") {
        return;
    }
    let pid = std::process::id();
    let rx = Agent::new(&format!("order-rx-{pid}"), AgentConfig::default()).unwrap();
    rx.create_backend(LibfabricParams::tcp_loopback(1)).unwrap();
    let rx_md = rx.local_metadata().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Application threads driving progress beside the backend's own progress thread.
    let pollers: Vec<_> = (0..2)
        .map(|_| {
            let (a, s) = (rx.clone(), stop.clone());
            std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    a.progress();
                }
            })
        })
        .collect();
    let mut got: std::collections::HashMap<String, Vec<u32>> = Default::default();
    let mut names = Vec::new();
    for s in 0..SENDERS {
        let tx = Agent::new(&format!("order-tx-{pid}-{s}"), AgentConfig::default()).unwrap();
        tx.create_backend(LibfabricParams::tcp_loopback(1)).unwrap();
        rx.load_remote_metadata(&tx.local_metadata().unwrap())
            .unwrap();
        // Loading sends the hello; the notifications follow at once.
        tx.load_remote_metadata(&rx_md).unwrap();
        for i in 0..PER_SENDER {
            tx.gen_notif(rx.name(), &i.to_le_bytes(), &[]).unwrap();
        }
        names.push(tx.name().to_owned());
        // Keep the sender alive until its notifications are in.
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            for (from, msgs) in rx.get_notifs().unwrap() {
                got.entry(from).or_default().extend(
                    msgs.iter()
                        .map(|m| u32::from_le_bytes(m[..4].try_into().unwrap())),
                );
            }
            if got.get(tx.name()).map_or(0, Vec::len) >= PER_SENDER as usize || Instant::now() > end
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for p in pollers {
        p.join().unwrap();
    }
    let want: Vec<u32> = (0..PER_SENDER).collect();
    for n in &names {
        assert_eq!(
            got.get(n).map(Vec::as_slice).unwrap_or(&[]),
            want.as_slice(),
            "notifications of {n}: lost or out of order (dropped for an unknown session: {:?})",
            rx.dropped_notifs()
        );
    }
}
