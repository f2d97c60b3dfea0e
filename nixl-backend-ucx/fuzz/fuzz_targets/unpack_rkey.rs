//! Hostile UCX remote keys through the real `ucp_ep_rkey_unpack`: real keys mutated (or
//! replaced) by the input, on an endpoint to a live target, loaded by a live agent. Whatever
//! the backend's checks let through must not crash UCX.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let w = common::world();
    let pick = data.first().map_or(0, |b| usize::from(*b & 0x1f)) % w.rkeys.len();
    let (base, addr) = &w.rkeys[pick];
    let rkey = common::mutate(base, data);
    let (name, md) = common::metadata(common::conn(addr), Some((rkey, w.region)));
    common::load_and_forget(&md, &name);
});
