//! The libfabric backend's wire bytes from peers: connection info and region metadata (in
//! agent metadata) and framed notifications (in received messages). Arbitrary bytes must
//! decode to an error or to values that re-encode to the same bytes; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_backend_libfabric::fuzzing::{
    decode_conn, decode_notif, decode_region, encode_conn, encode_notif, encode_region,
};

fuzz_target!(|data: &[u8]| {
    if let Ok((provider, names)) = decode_conn(data) {
        assert_eq!(encode_conn(&provider, &names), data, "conn info re-encodes");
    }
    if let Ok((virt, keys)) = decode_region(data) {
        assert_eq!(encode_region(virt, &keys), data, "region metadata re-encodes");
    }
    if let Ok((sender, msg)) = decode_notif(data) {
        assert_eq!(encode_notif(&sender, &msg), data, "notification re-frames");
    }
    // Structured side: whatever we encode decodes back.
    if let Some((&n, rest)) = data.split_first() {
        let cut = usize::from(n).min(rest.len());
        if let Ok(sender) = std::str::from_utf8(&rest[..cut]) {
            let f = encode_notif(sender, &rest[cut..]);
            assert_eq!(decode_notif(&f), Ok((sender.to_owned(), rest[cut..].to_vec())));
        }
        let keys: Vec<u64> = rest
            .chunks_exact(8)
            .take(16)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        if !keys.is_empty() {
            let virt = n & 1 == 1;
            assert_eq!(decode_region(&encode_region(virt, &keys)), Ok((virt, keys)));
        }
    }
});
