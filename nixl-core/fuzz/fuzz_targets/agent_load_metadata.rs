//! Hostile metadata loaded into a live agent (with the INPROC backend): a typed error or a
//! successful load, never a panic; a refused blob leaves the peer table unchanged.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nixl_core::{Agent, AgentConfig, InprocParams};

fn agent() -> &'static Agent {
    static A: OnceLock<Agent> = OnceLock::new();
    A.get_or_init(|| {
        let a = Agent::new("fuzz", AgentConfig::default()).expect("agent");
        a.create_backend(InprocParams::default()).expect("backend");
        a
    })
}

fuzz_target!(|data: &[u8]| {
    let a = agent();
    let before = a.remotes();
    match a.load_remote_metadata(data) {
        Ok(name) => {
            let _ = a.invalidate_remote_metadata(&name);
        }
        Err(_) => assert_eq!(a.remotes(), before),
    }
});
