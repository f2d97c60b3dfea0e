//! NIXL's wire formats from hostile bytes: the metadata blob, the notification payload and
//! NIXLCOMM frame bodies decode or refuse without panicking or over-allocating; what decodes
//! re-encodes to the same bytes. The input is tried as is and behind the `nixlSerDes|` magic
//! (so the fuzzer starts inside the grammar).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_core::nixl_wire::comm::{encode_command, parse_body, read_frame};
use nixl_core::nixl_wire::notif::{decode_notif_bytes, encode_notif};
use nixl_core::nixl_wire::serdes::MAGIC;
use nixl_core::nixl_wire::NixlMetadata;

fuzz_target!(|data: &[u8]| {
    let mut framed = MAGIC.to_vec();
    framed.extend_from_slice(data);
    for bytes in [data, &framed[..]] {
        if let Ok(md) = NixlMetadata::decode_bytes(bytes) {
            assert_eq!(md.encode(), bytes);
        }
        if let Ok((name, msg)) = decode_notif_bytes(bytes) {
            assert_eq!(encode_notif(&name, &msg), bytes);
        }
    }
    if let Ok(cmds) = parse_body(data) {
        for c in cmds {
            let _ = encode_command(&c);
        }
    }
    let _ = read_frame(&mut &data[..]);
});
