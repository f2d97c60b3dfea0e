//! The payload of NIXL's UCX notification active message (id 0, no header, eager):
//! `"nixlSerDes|" "name" u64 len sender "|" "msg" u64 len message "|"`.
//!
//! The sender's name inside the payload is the only identity NIXL gives a notification (no
//! authentication, no generation, no integrity check).

use super::serdes::{Reader, Writer};
use crate::codec::{MAX_BLOB, MAX_NAME};
use crate::error::DecodeError;

/// The active-message id NIXL's UCX backend sends notifications on.
pub const AM_ID: u32 = 0;

/// Encodes a notification from `sender` carrying `msg`.
pub fn encode_notif(sender: &str, msg: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.field(b"name", sender.as_bytes()).field(b"msg", msg);
    w.finish()
}

/// [`decode_notif_bytes`] with the crate's [`Error::Decode`](crate::Error::Decode) (its agent
/// is empty: the bytes are decoded outside any agent).
pub fn decode_notif(payload: &[u8]) -> crate::Result<(String, Vec<u8>)> {
    decode_notif_bytes(payload).map_err(|e| e.outside_agent(crate::Op::GetNotifs))
}

/// Decodes a notification into (sender, message). The sender must be 1..=256 bytes of UTF-8;
/// an empty message is legal (as in NIXL); trailing bytes are refused.
pub fn decode_notif_bytes(payload: &[u8]) -> Result<(String, Vec<u8>), DecodeError> {
    let mut r = Reader::new(payload)?;
    let name = r.name(b"name", "notification sender", MAX_NAME)?;
    let msg = r.field(b"msg", "notification message", MAX_BLOB)?.to_vec();
    r.end()?;
    Ok((name, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_the_spec_example() {
        let want = "6e69786c5365724465737c6e616d650300000000000000727330\
                    7c6d73670600000000000000726571 2d34327c";
        let want: Vec<u8> = want
            .chars()
            .filter(char::is_ascii_hexdigit)
            .collect::<Vec<_>>()
            .chunks(2)
            .map(|c| u8::from_str_radix(&c.iter().collect::<String>(), 16).unwrap())
            .collect();
        assert_eq!(encode_notif("rs0", b"req-42"), want);
        assert_eq!(want.len(), 45);
        assert_eq!(
            decode_notif_bytes(&want),
            Ok(("rs0".to_owned(), b"req-42".to_vec()))
        );
    }

    #[test]
    fn bad_payloads_are_refused() {
        assert!(decode_notif_bytes(b"").is_err());
        assert!(decode_notif_bytes(&encode_notif("", b"x")).is_err());
        let mut t = encode_notif("a", b"x");
        t.push(1);
        assert_eq!(decode_notif_bytes(&t), Err(DecodeError::Trailing(1)));
        assert_eq!(
            decode_notif_bytes(&encode_notif("a", b"")),
            Ok(("a".into(), vec![]))
        );
    }

    proptest! {
        #[test]
        fn roundtrips(name in "[a-zA-Z0-9_.-]{1,64}", msg in proptest::collection::vec(any::<u8>(), 0..256)) {
            prop_assert_eq!(decode_notif_bytes(&encode_notif(&name, &msg)), Ok((name, msg)));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Ok((n, m)) = decode_notif_bytes(&b) {
                prop_assert_eq!(encode_notif(&n, &m), b);
            }
        }
    }
}
