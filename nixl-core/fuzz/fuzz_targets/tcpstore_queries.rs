//! c10d TCPStore queries from hostile bytes: the server's parser and store answer or close
//! without panicking or over-allocating. The input is tried as is and behind a `VALIDATE`
//! (so the fuzzer starts past the handshake).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_core::tcpstore::serve_bytes;
use nixl_core::tcpstore::wire::{QueryType, Request, VALIDATION_MAGIC};

fuzz_target!(|data: &[u8]| {
    let _ = serve_bytes(data);
    let mut validated = Request::new(QueryType::Validate)
        .u32(VALIDATION_MAGIC)
        .into_vec();
    validated.extend_from_slice(data);
    let _ = serve_bytes(&validated);
});
