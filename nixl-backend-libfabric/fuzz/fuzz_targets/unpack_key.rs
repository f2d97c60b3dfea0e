//! Hostile libfabric remote keys and remote addresses through a real `fi_write` / `fi_read`:
//! the region metadata (addressing mode and one key per rail) and region (address, length) of
//! a live target in another process, on the tcp (two rails) and shm providers,
//! mutated (or replaced) by the input and loaded by a live agent with the target's real
//! connection info; whatever loads is the target of a transfer (up to 4 KiB at the declared
//! region's end, a read or a write) with a short deadline. Keys and addresses go to the
//! provider as the peer gave them (the backend checks only the range against the peer's
//! declared region): neither the victim's libfabric nor the target's, which checks them against
//! its registrations, may crash (a dead target process fails the input), and a transfer that
//! completes with a key or range the target never registered is reported (`FOREIGN`, counted
//! as `rma_done_foreign`).
#![no_main]

#[path = "common.rs"]
mod common;

/// tcp (two rails) and shm. Not sockets: libfabric 1.17's sockets provider crashes in its own
/// progress thread (`sock_pe_progress_thread`, SIGSEGV then `free(): corrupted unsorted
/// chunks`) in the process that receives RMA with hostile keys, so a target there dies of the
/// provider, not of anything nixl-rs passes it (docs/security.md).
const PROVIDERS: &[(&str, usize)] = &[("tcp", 2), ("shm", 1)];

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use nixl_backend_libfabric::fuzzing::decode_region;
use nixl_core::{Error, MemKind, XferDescList, XferOp, XferOptions, XferState};

fuzz_target!(init: common::init(), |data: &[u8]| {
    let w = common::world();
    let first = data.first().copied().unwrap_or(0);
    let p = &w.pairs[usize::from(first & 0x0f) % w.pairs.len()];
    if p.exhausted() {
        return;
    }
    let write = first & 0x10 != 0;
    // The base: public metadata, then the region's address and length.
    let mut base = p.public.clone();
    base.extend(p.region.0.to_le_bytes());
    base.extend(p.region.1.to_le_bytes());
    let m = common::mutate(&base, data);
    let (public, region) = match m.len().checked_sub(16) {
        Some(k) => {
            let word = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().unwrap_or([0; 8]));
            (m[..k].to_vec(), (word(k), word(k + 8)))
        }
        None => (m, p.region),
    };
    let foreign = foreign(p, &public, region);
    let (name, md) = common::metadata(p.conn.clone(), Some((public, region)));
    let r = common::load_and_forget(p, &md, &name, |v| {
        transfer(v, p, &name, region, write, &foreign)
    });
    // The transfer found no end by its deadline, or a hello to the live target (its real
    // connection info) timed out: the victim's endpoint may have stopped working (see
    // `Pair::replace_victim`).
    if matches!(r, Ok(true) | Err(Error::TimedOut { .. })) {
        p.replace_victim();
    }
});

/// Per rail: whether a transfer to `region` with these keys over that rail reaches memory the
/// target never registered or uses a key it never gave out (its provider must refuse it).
fn foreign(p: &common::Pair, public: &[u8], (addr, len): (u64, u64)) -> Vec<bool> {
    let (Ok((virt, keys)), Ok((_, real))) = (decode_region(public), decode_region(&p.public))
    else {
        return Vec::new(); // refused at load
    };
    let n = len.min(4096);
    // The last `n` bytes of the declared region: at that address, or at that offset into the
    // registration.
    let (real_addr, real_len) = p.region;
    let start = if virt {
        addr.wrapping_add(len - n)
    } else {
        real_addr.wrapping_add(len - n)
    };
    let inside = start >= real_addr
        && start
            .checked_add(n)
            .is_some_and(|e| e <= real_addr + real_len);
    keys.iter()
        .zip(&real)
        .map(|(k, r)| k != r || !inside)
        .collect()
}

/// Up to 4 KiB from the victim's buffer to the end of the peer's declared region (or back).
/// Returns whether it timed out.
fn transfer(
    v: &common::Victim,
    p: &common::Pair,
    remote: &str,
    (addr, len): (u64, u64),
    write: bool,
    foreign: &[bool],
) -> bool {
    let n = len.min(4096);
    let Some(raddr) = addr.checked_add(len - n) else {
        return false;
    };
    if n == 0 {
        return false;
    }
    let op = if write { XferOp::Write } else { XferOp::Read };
    let opts = XferOptions::default().timeout(Duration::from_millis(100));
    let v_local = v.local.addr();
    let v = &v.agent;
    let Ok(req) = v.create_xfer_req(
        op,
        &XferDescList::blocks(MemKind::Dram, v_local, n, 1),
        &XferDescList::blocks(MemKind::Dram, raddr, n, 1),
        remote,
        opts,
    ) else {
        return false;
    };
    let mut st = v.post_xfer_req(&req);
    let end = Instant::now() + Duration::from_secs(5);
    while matches!(st, Ok(XferState::InProgress)) && Instant::now() < end {
        std::thread::sleep(Duration::from_micros(200));
        st = v.check_xfer_state(&req);
    }
    if matches!(st, Ok(XferState::Done)) {
        // The rail it went over: the path names each rail's bytes ("rail1 lo: 4096 B").
        let path = req.path();
        let used = (0..foreign.len()).find(|r| {
            path.split([';', ','])
                .map(str::trim)
                .any(|s| s.starts_with(&format!("rail{r} ")) && !s.ends_with(": 0 B"))
        });
        let foreign = used.is_some_and(|r| foreign[r]);
        if foreign {
            eprintln!(
                "FOREIGN: {} {} of {n} bytes at {raddr:#x} completed with a key or range the \
                 target never registered ({path})",
                p.provider,
                if write { "write" } else { "read" }
            );
        }
        common::rma_done(foreign);
    }
    matches!(st, Err(Error::TimedOut { .. }) | Ok(XferState::InProgress))
}
