//! Hostile libfabric endpoint names through the real `fi_av_insert`: the real names of a live
//! target in another process (or the victim's own) on the tcp (two rails), shm and sockets
//! providers, mutated (or replaced) by the input, framed as a peer's connection info and loaded
//! by a live agent, which then sends its hello through them. Whatever the backend's checks
//! (`validate.rs`) let through must not crash libfabric.
#![no_main]

#[path = "common.rs"]
mod common;

/// tcp (two rails), shm and sockets.
const PROVIDERS: &[(&str, usize)] = &[("tcp", 2), ("shm", 1), ("sockets", 1)];

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::init(), |data: &[u8]| {
    let w = common::world();
    // (pair, names, rail whose name the input mutates): the target's names, or the victim's own.
    let own: Vec<Vec<Vec<u8>>> = w.pairs.iter().map(|p| p.victim().own.clone()).collect();
    let bases: Vec<(&common::Pair, &Vec<Vec<u8>>, usize)> = w
        .pairs
        .iter()
        .zip(&own)
        .flat_map(|(p, own)| {
            [&p.names, own]
                .into_iter()
                .flat_map(move |names| (0..names.len()).map(move |r| (p, names, r)))
        })
        .collect();
    let pick = data.first().map_or(0, |b| usize::from(*b & 0x1f)) % bases.len();
    let (p, names, rail) = bases[pick];
    if p.exhausted() {
        return;
    }
    let mut names = names.clone();
    names[rail] = common::mutate(&names[rail], data);
    let (name, md) = common::metadata(common::conn(&p.provider, &names), None);
    let _ = common::load_and_forget(p, &md, &name, |_| {});
});
