//! Hostile UCX remote keys through the real `ucp_ep_rkey_unpack`, `ucp_put_nbx` and
//! `ucp_get_nbx`: the packed key of a live target in another process (over tcp, shared memory,
//! or both) mutated (or replaced) by the input, loaded by a live agent with the target's real
//! worker address; whatever loads is the target of a 4 KiB READ or WRITE at the region's end
//! with a 100 ms deadline. Neither the victim's UCX nor the target's may crash (a dead target
//! process fails the input), and the request must end.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::init(), |data: &[u8]| {
    let w = common::world();
    let first = data.first().copied().unwrap_or(0);
    let t = &w.targets[usize::from(first & 0x0f) % w.targets.len()];
    let rkey = common::mutate(&t.rkey, data);
    let (name, md) = common::metadata(common::conn(&t.address), Some((rkey, t.region)));
    common::load_post_forget(&md, &name, Some(t.region), first & 0x10 != 0);
});
