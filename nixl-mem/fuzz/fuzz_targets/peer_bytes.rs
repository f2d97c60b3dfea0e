//! nixl-mem's decoders of bytes from peers (built on its wire reader): `CUDA_IPC` region
//! metadata and connection info, CUDA IPC handles and shared host handles. Arbitrary bytes
//! must decode to an error or to a value that re-encodes to exactly the same bytes; nothing
//! may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_mem::fuzzing::{conn_info, ipc_handle, region_md, shared_handle};

fuzz_target!(|data: &[u8]| {
    for (what, decode) in [
        ("region metadata", region_md as fn(&[u8]) -> Option<Vec<u8>>),
        ("connection info", conn_info),
        ("IPC handle", ipc_handle),
        ("shared host handle", shared_handle),
    ] {
        if let Some(again) = decode(data) {
            assert_eq!(again, data, "accepted {what} must be canonical");
        }
    }
    // The region metadata carries the two handles behind a one-byte tag: exercise those
    // paths with the fuzzer's bytes as the body too.
    for tag in [b'V', b'S', b'P'] {
        let mut tagged = vec![tag];
        tagged.extend_from_slice(data);
        if let Some(again) = region_md(&tagged) {
            assert_eq!(
                again, tagged,
                "accepted tagged region metadata must be canonical"
            );
        }
    }
});
