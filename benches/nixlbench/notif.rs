//! `--mode notif`: notification latency, the pattern of benches/reference/native's notif mode.
//!
//! The initiator posts a 4 KiB WRITE carrying a notification, one in flight; the target
//! busy-polls `get_notifs`, stamps each arrival (wall clock: one clock for both processes, and
//! the one the native NIXL reference uses), checks the block's first 8 bytes (the iteration's
//! tag) arrived before the notification, and answers with `gen_notif`. The target writes its
//! stamps to a file the initiator names; the initiator prints the median and p99 time from
//! post to the target seeing the notification.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nixl::{Agent, XferOp, XferOptions, XferState, XferTarget};

use crate::{descs, Mem, Opts, Res, PAGE};

const INITIATOR: &str = "nixlbench-initiator";
const TARGET: &str = "nixlbench-target";

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn median_p99(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let p99 = v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)];
    (v[v.len() / 2], p99, v[0])
}

/// Where the target leaves its stamps for the initiator.
pub(crate) fn stamp_file() -> PathBuf {
    std::env::temp_dir().join(format!("nixlbench-notif-{}.txt", std::process::id()))
}

/// Target side: serves `total` notifications, then writes `bad stamp stamp ...` to `out`.
pub(crate) fn serve(a: &Agent, m: &Mem, total: usize, out: &Path) -> Res<()> {
    let host = m.host.as_ref().ok_or("--mode notif needs DRAM")?;
    let mut seen = Vec::with_capacity(total);
    let mut bad = 0u64;
    let end = Instant::now() + Duration::from_secs(120);
    while seen.len() < total && Instant::now() < end {
        let n = a.get_notifs()?;
        let Some(msgs) = n.get(INITIATOR) else {
            continue;
        };
        for _ in msgs {
            seen.push(now_ns());
            let mut tag = [0u8; 8];
            host.read_at(0, &mut tag);
            bad += u64::from(u64::from_le_bytes(tag) != seen.len() as u64);
            a.gen_notif(INITIATOR, b"ack", &[])?;
        }
    }
    let mut text = bad.to_string();
    for t in &seen {
        text.push(' ');
        text.push_str(&t.to_string());
    }
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// Initiator side: `warmup + iters` posts, one in flight; prints one JSON line.
pub(crate) fn run(a: &Agent, o: &Opts, m: &Mem, raddr: u64, stamps: &Path) -> Res<()> {
    let host = m.host.as_ref().ok_or("--mode notif needs DRAM")?;
    let local = a.prep_xfer_dlist(
        XferTarget::Initiator,
        &descs(o.init_kind, m.addr, PAGE, 1),
        &[],
    )?;
    let remote = a.prep_xfer_dlist(
        XferTarget::Agent(TARGET),
        &descs(o.target_kind, raddr, PAGE, 1),
        &[],
    )?;
    let req = a.make_prepped_xfer(
        XferOp::Write,
        &local,
        &[0],
        &remote,
        &[0],
        XferOptions::with_notif(b"n".to_vec()),
    )?;
    let total = o.warmup + o.iters;
    let mut posted = Vec::with_capacity(total);
    let mut xfer = Vec::with_capacity(total);
    for i in 0..total {
        host.write_at(0, &(i as u64 + 1).to_le_bytes());
        posted.push(now_ns());
        let t0 = Instant::now();
        let mut st = a.post_xfer_req(&req)?;
        while st == XferState::InProgress {
            st = a.check_xfer_state(&req)?;
        }
        xfer.push(t0.elapsed().as_secs_f64() * 1e6);
        // One notification in flight: wait for the target's answer.
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if Instant::now() > end {
                return Err("no answer from the target".into());
            }
            if a.get_notifs()?.contains_key(TARGET) {
                break;
            }
        }
    }
    let end = Instant::now() + Duration::from_secs(30);
    let text = loop {
        if let Ok(t) = std::fs::read_to_string(stamps) {
            break t;
        }
        if Instant::now() > end {
            return Err("the target left no stamps".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_file(stamps);
    let mut it = text.split_whitespace().map(str::parse::<i64>);
    let bad = it.next().ok_or("empty stamp file")??;
    let seen: Vec<i64> = it.collect::<Result<_, _>>()?;
    if seen.len() != total {
        return Err(format!("the target saw {} of {total} notifications", seen.len()).into());
    }
    if bad != 0 {
        return Err(format!("{bad} notifications arrived before their data").into());
    }
    let lat: Vec<f64> = (o.warmup..total)
        .map(|i| (seen[i] - posted[i]) as f64 / 1e3)
        .collect();
    let (med, p99, min) = median_p99(lat);
    let (xmed, _, _) = median_p99(xfer.split_off(o.warmup));
    if o.json {
        println!(
            "{{\"impl\": \"nixl-rs\", \"mode\": \"notif\", \"op\": \"WRITE\", \"block\": 4096, \"batch\": 1, \"iters\": {}, \"notif_med_us\": {med:.3}, \"notif_p99_us\": {p99:.3}, \"notif_min_us\": {min:.3}, \"lat_med_us\": {xmed:.3}, \"verified\": true}}",
            o.iters
        );
    } else {
        println!(
            "# notification latency, 4 KiB WRITE + notification, {} iterations, every tag checked",
            o.iters
        );
        println!("post -> target sees it: median {med:.2} us, p99 {p99:.2} us, min {min:.2} us; post -> done median {xmed:.2} us");
    }
    Ok(())
}
