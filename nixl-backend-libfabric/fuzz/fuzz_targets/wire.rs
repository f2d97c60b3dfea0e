//! The libfabric backend's wire bytes from peers: connection info and region metadata (in
//! agent metadata), framed hellos and notifications (in received messages), and the structural
//! check of endpoint names before `fi_av_insert`. Arbitrary bytes must
//! decode to an error or to values that re-encode to the same bytes; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_backend_libfabric::fuzzing::{
    check_name, decode_conn, decode_message, decode_region, encode_conn, encode_hello,
    encode_notif, encode_region, Message,
};

fuzz_target!(|data: &[u8]| {
    if let Ok((provider, names)) = decode_conn(data) {
        assert_eq!(encode_conn(&provider, &names), data, "conn info re-encodes");
    }
    if let Ok((virt, keys)) = decode_region(data) {
        assert_eq!(
            encode_region(virt, &keys),
            data,
            "region metadata re-encodes"
        );
    }
    match decode_message(data) {
        Ok(Message::Notif(s, msg)) => {
            assert_eq!(encode_notif(&s, msg), data, "notification re-frames")
        }
        Ok(Message::Hello(h)) => assert_eq!(encode_hello(h), data, "hello re-frames"),
        Err(_) => {}
    }
    for provider in ["tcp;ofi_rxm", "tcp", "shm", "verbs;ofi_rxm", "efa"] {
        let _ = check_name(provider, data, &data[..data.len() / 2]);
    }
    // Structured side: whatever we encode decodes back.
    if let Some((&n, rest)) = data.split_first() {
        let session = [n; 16];
        let f = encode_notif(&session, rest);
        assert_eq!(decode_message(&f), Ok(Message::Notif(session, rest)));
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
