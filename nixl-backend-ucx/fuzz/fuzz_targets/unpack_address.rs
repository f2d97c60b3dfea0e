//! Hostile UCX worker addresses through the real `ucp_ep_create`: the worker address of a
//! live target in another process (over tcp, shared memory, or both) mutated (or replaced) by
//! the input, framed as a peer's connection info and loaded by a live agent. With bit 0x10 of
//! the first byte the peer also names the target's real region and key, and the victim posts
//! a 4 KiB READ or WRITE (bit 0x20) over the endpoint the mutated address made, with a 100 ms
//! deadline. Whatever the backend's checks let through must not crash UCX on either side.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::init(), |data: &[u8]| {
    let w = common::world();
    let first = data.first().copied().unwrap_or(0);
    let t = &w.targets[usize::from(first & 0x0f) % w.targets.len()];
    let addr = common::mutate(&t.address, data);
    let with_region = first & 0x10 != 0;
    let rkey = with_region.then(|| (t.rkey.clone(), t.region));
    let (name, md) = common::metadata(common::conn(&addr), rkey);
    common::load_post_forget(&md, &name, with_region.then_some(t.region), first & 0x20 != 0);
});
