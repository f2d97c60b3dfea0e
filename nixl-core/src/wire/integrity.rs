//! Integrity on demand: a WRITE's payload checksum travels with its notification and the target
//! verifies it against its own memory before handing the notification out.
//!
//! Frame (after the 8-byte magic): `u64` xxh3 hash, `u32` range count, ranges as
//! `(u64 dev_id, u64 addr, u64 len)`, then the user's message. The target checks that every
//! range lies inside its own DRAM registrations before reading it, so a hostile frame cannot make
//! it read memory it does not own.

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::DecodeError;

/// Prefix of an integrity frame (a user message that starts with it is treated as a frame).
pub const MAGIC: &[u8; 8] = b"\0NXINTG1";
/// Most ranges in one frame.
pub const MAX_RANGES: usize = 1 << 20;

/// A parsed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The payload hash.
    pub hash: u64,
    /// `(dev_id, addr, len)` of the target ranges, in payload order.
    pub ranges: Vec<(u64, u64, u64)>,
    /// The user's notification.
    pub msg: Vec<u8>,
}

impl Frame {
    /// Encodes the frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = ByteWriter::with_capacity(20 + self.ranges.len() * 24 + self.msg.len());
        w.put(MAGIC).put_u64(self.hash).put_len(self.ranges.len());
        for &(d, a, l) in &self.ranges {
            w.put_u64(d).put_u64(a).put_u64(l);
        }
        w.put(&self.msg);
        w.into_vec()
    }

    /// `None` when `bytes` is not a frame; otherwise the frame or why it is malformed.
    pub fn parse(bytes: &[u8]) -> Option<Result<Frame, DecodeError>> {
        let rest = bytes.strip_prefix(MAGIC.as_slice())?;
        Some(Self::parse_body(rest))
    }

    fn parse_body(b: &[u8]) -> Result<Frame, DecodeError> {
        let mut r = ByteReader::new(b);
        let hash = r.u64()?;
        let n = r.count("integrity ranges", MAX_RANGES, 24)?;
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            let (d, a, l) = (r.u64()?, r.u64()?, r.u64()?);
            if a.checked_add(l).is_none() {
                return Err(DecodeError::Invalid {
                    what: "integrity range",
                });
            }
            ranges.push((d, a, l));
        }
        Ok(Frame {
            hash,
            ranges,
            msg: r.rest().to_vec(),
        })
    }
}

pub(crate) use crate::sys::host::hash_ranges;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn frames_roundtrip(hash in any::<u64>(), ranges in proptest::collection::vec((any::<u64>(), 0u64..1 << 40, 0u64..1 << 30), 0..8), msg in proptest::collection::vec(any::<u8>(), 0..32)) {
            let f = Frame { hash, ranges, msg };
            prop_assert_eq!(Frame::parse(&f.encode()), Some(Ok(f)));
        }

        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut b = MAGIC.to_vec();
            b.extend_from_slice(&tail);
            let _ = Frame::parse(&b);
            prop_assert!(Frame::parse(&tail[..tail.len().min(4)]).is_none());
        }
    }
}
