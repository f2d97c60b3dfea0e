//! The UCX backend's wire bytes from peers: connection info and region metadata (in agent
//! metadata) and notification headers (in active messages), and the structural parsers of
//! UCX worker addresses and packed keys (never panic, whatever the bytes). Arbitrary bytes must decode to
//! an error or to values that re-encode to the same bytes; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_backend_ucx::fuzzing::{
    decode_conn, decode_conn_info, decode_notif_header, decode_rkey, encode_conn, encode_conn_with,
    encode_notif_header, encode_rkey, parse_address, parse_rkey,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = decode_conn_info(data) {
        let refs: Vec<&[u8]> = info.addresses.iter().map(|a| a.as_slice()).collect();
        assert_eq!(
            encode_conn_with(&refs, info.process.as_ref()),
            data,
            "conn info re-encodes to the same bytes"
        );
        assert_eq!(decode_conn(data).ok(), Some(info.addresses.clone()));
    }
    if let Ok((t, packed)) = decode_rkey(data) {
        assert_eq!(
            encode_rkey(t, packed),
            data,
            "rkey re-encodes to the same bytes"
        );
    }
    if let Ok(session) = decode_notif_header(data) {
        assert_eq!(encode_notif_header(&session), data);
    }
    for minor in [13, 18, 19, 22, 23] {
        if let Ok(a) = parse_address(data, minor) {
            let _ = parse_rkey(data, a.dst_version);
        }
    }
    let _ = parse_rkey(data, 0);
    // Structured side: whatever we encode decodes back.
    if let Some((&t, rest)) = data.split_first() {
        if !rest.is_empty() && rest.len() <= 1 << 16 {
            assert_eq!(decode_rkey(&encode_rkey(t, rest)), Ok((t, rest)));
        }
        let parts: Vec<&[u8]> = rest.chunks(usize::from(t % 32) + 1).take(64).collect();
        if !parts.is_empty() {
            let enc = encode_conn(&parts);
            let dec = decode_conn(&enc).expect("own conn info decodes");
            assert_eq!(dec.iter().map(|v| v.as_slice()).collect::<Vec<_>>(), parts);
        }
    }
});
