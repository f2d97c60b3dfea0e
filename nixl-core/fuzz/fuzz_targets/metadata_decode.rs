//! The metadata decoder never panics, and whatever it accepts re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_core::AgentMetadata;

fuzz_target!(|data: &[u8]| {
    if let Ok(md) = AgentMetadata::decode_bytes(data) {
        assert_eq!(md.encode(), data, "accepted metadata must be canonical");
    }
});
