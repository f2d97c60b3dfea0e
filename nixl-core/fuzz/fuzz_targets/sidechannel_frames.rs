//! Side-channel frame and invalidation parsing never panics or over-allocates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_core::wire::sidechannel::frame::decode;
use nixl_core::wire::sidechannel::{parse_invalidate, read_frame};

fuzz_target!(|data: &[u8]| {
    let mut cur = data;
    while let Ok(body) = read_frame(&mut cur, 1 << 20) {
        if let Ok(f) = decode(&body) {
            let _ = parse_invalidate(f.payload);
        }
    }
    let _ = decode(data);
    let _ = parse_invalidate(data);
});
