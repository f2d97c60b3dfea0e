//! Integrity-frame parsing (notification framing) never panics or over-allocates, and what it
//! accepts re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_core::wire::integrity::{Frame, MAGIC};

fuzz_target!(|data: &[u8]| {
    let mut framed = MAGIC.to_vec();
    framed.extend_from_slice(data);
    for bytes in [data, &framed[..]] {
        if let Some(Ok(f)) = Frame::parse(bytes) {
            assert_eq!(f.encode(), bytes, "accepted frames must be canonical");
        }
    }
});
