//! Hostile UCX worker addresses through the real `ucp_ep_create`: real addresses mutated (or
//! replaced) by the input, framed as a peer's connection info and loaded by a live agent.
//! Whatever the backend's checks let through must not crash UCX.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let w = common::world();
    let pick = data.first().map_or(0, |b| usize::from(*b & 0x1f)) % w.addresses.len();
    let addr = common::mutate(&w.addresses[pick], data);
    let (name, md) = common::metadata(common::conn(&addr), None);
    common::load_and_forget(&md, &name);
});
