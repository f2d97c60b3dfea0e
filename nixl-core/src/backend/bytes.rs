//! The one byte reader and writer behind every codec of nixl-rs: the metadata blob, the side
//! channel, integrity frames and each backend's private wire formats (connection info,
//! region keys, notification framing).
//!
//! Little endian throughout. Every length and count read from outside bytes is bounded by a
//! caller-given limit *and* by the bytes actually left before anything is allocated, so
//! hostile input costs at most its own size; every failure is a typed [`DecodeError`] naming
//! the field.
//!
//! ```
//! use nixl_core::backend::bytes::{ByteReader, ByteWriter};
//! let mut w = ByteWriter::new();
//! w.put_u16(7).put_str("ucx").put_blob(&[1, 2, 3]);
//! let bytes = w.into_vec();
//! let mut r = ByteReader::new(&bytes);
//! assert_eq!(r.u16().unwrap(), 7);
//! assert_eq!(r.str("name", 64).unwrap(), "ucx");
//! assert_eq!(r.blob("key", 16).unwrap(), &[1, 2, 3]);
//! r.finish().unwrap();
//! ```

use crate::error::DecodeError;

/// Reads little-endian values from a byte slice, bounds-checked.
#[derive(Debug, Clone)]
pub struct ByteReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        ByteReader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let rest = self.remaining();
        if n > rest {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n - rest,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// Checks that the next bytes are `magic`.
    pub fn magic(&mut self, magic: &[u8]) -> Result<(), DecodeError> {
        match self.take(magic.len()) {
            Ok(m) if m == magic => Ok(()),
            _ => Err(DecodeError::BadMagic),
        }
    }

    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A `bool` encoded as one byte 0 or 1 (anything else is [`DecodeError::Invalid`]).
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid { what }),
        }
    }

    /// A `u32` length at most `limit` and at most the bytes left.
    pub fn len(&mut self, what: &'static str, limit: usize) -> Result<usize, DecodeError> {
        self.count(what, limit, 1)
    }

    /// A `u32` element count at most `limit`, and at most what the bytes left can hold at
    /// `min_size` bytes per element (so a hostile count allocates nothing).
    pub fn count(
        &mut self,
        what: &'static str,
        limit: usize,
        min_size: usize,
    ) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
        if n > limit {
            return Err(DecodeError::TooLarge {
                what,
                value: n as u64,
                limit: limit as u64,
            });
        }
        let room = self.remaining() / min_size.max(1);
        if n > room {
            return Err(DecodeError::Truncated {
                offset: at,
                needed: (n - room).saturating_mul(min_size.max(1)),
            });
        }
        Ok(n)
    }

    /// An unsigned LEB128 integer: 7 bits per byte, low first, at most 10 bytes; an overlong
    /// form (a last byte of zero after the first) or bits past 64 are
    /// [`DecodeError::Invalid`], so every value has one encoding.
    pub fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if (i == 9 && b > 1) || (i > 0 && b == 0) {
                return Err(DecodeError::Invalid { what });
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Invalid { what })
    }

    /// A [`ByteReader::varint`] length at most `limit` and at most the bytes left.
    pub fn varint_len(&mut self, what: &'static str, limit: usize) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = usize::try_from(self.varint(what)?).unwrap_or(usize::MAX);
        if n > limit {
            return Err(DecodeError::TooLarge {
                what,
                value: n as u64,
                limit: limit as u64,
            });
        }
        if n > self.remaining() {
            return Err(DecodeError::Truncated {
                offset: at,
                needed: n - self.remaining(),
            });
        }
        Ok(n)
    }

    /// A [`ByteReader::varint`]-length-prefixed byte string of at most `limit` bytes.
    pub fn varint_blob(
        &mut self,
        what: &'static str,
        limit: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let n = self.varint_len(what, limit)?;
        self.take(n)
    }

    /// A `u32`-length-prefixed byte string of at most `limit` bytes.
    pub fn blob(&mut self, what: &'static str, limit: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.len(what, limit)?;
        self.take(n)
    }

    /// A `u32`-length-prefixed UTF-8 string of at most `limit` bytes.
    pub fn str(&mut self, what: &'static str, limit: usize) -> Result<&'a str, DecodeError> {
        let b = self.blob(what, limit)?;
        std::str::from_utf8(b).map_err(|_| DecodeError::Invalid { what })
    }

    /// Ends reading: refuses bytes left over.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Appends little-endian values to a buffer.
#[derive(Debug, Clone, Default)]
pub struct ByteWriter {
    buf: Vec<u8>,
}

impl ByteWriter {
    /// An empty writer.
    pub fn new() -> Self {
        ByteWriter::default()
    }

    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        ByteWriter {
            buf: Vec::with_capacity(n),
        }
    }

    /// Raw bytes.
    pub fn put(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    /// A `u8`.
    pub fn put_u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// A `u16`.
    pub fn put_u16(&mut self, v: u16) -> &mut Self {
        self.put(&v.to_le_bytes())
    }

    /// A `u32`.
    pub fn put_u32(&mut self, v: u32) -> &mut Self {
        self.put(&v.to_le_bytes())
    }

    /// A `u64`.
    pub fn put_u64(&mut self, v: u64) -> &mut Self {
        self.put(&v.to_le_bytes())
    }

    /// A `bool` as one byte.
    pub fn put_bool(&mut self, v: bool) -> &mut Self {
        self.put_u8(u8::from(v))
    }

    /// A length or count as `u32`. Callers bound what they encode far below `u32::MAX` (the
    /// decoders' limits); a larger value saturates, which every decoder then refuses.
    pub fn put_len(&mut self, n: usize) -> &mut Self {
        self.put_u32(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// An unsigned LEB128 integer ([`ByteReader::varint`]).
    pub fn put_varint(&mut self, mut v: u64) -> &mut Self {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                return self.put_u8(b);
            }
            self.put_u8(b | 0x80);
        }
    }

    /// A [`ByteWriter::put_varint`]-length-prefixed byte string.
    pub fn put_varint_blob(&mut self, b: &[u8]) -> &mut Self {
        self.put_varint(b.len() as u64).put(b)
    }

    /// A `u32`-length-prefixed byte string.
    pub fn put_blob(&mut self, b: &[u8]) -> &mut Self {
        self.put_len(b.len()).put(b)
    }

    /// A `u32`-length-prefixed UTF-8 string.
    pub fn put_str(&mut self, s: &str) -> &mut Self {
        self.put_blob(s.as_bytes())
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The encoded bytes.
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn truncation_and_bounds_are_typed() {
        let mut r = ByteReader::new(&[1, 0]);
        assert_eq!(
            r.u32(),
            Err(DecodeError::Truncated {
                offset: 0,
                needed: 2
            })
        );
        let mut w = ByteWriter::new();
        w.put_len(1000);
        let b = w.into_vec();
        assert!(matches!(
            ByteReader::new(&b).blob("x", 10),
            Err(DecodeError::TooLarge { what: "x", .. })
        ));
        assert!(matches!(
            ByteReader::new(&b).blob("x", 2000),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(matches!(
            ByteReader::new(&[5, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb]).str("s", 9),
            Err(DecodeError::Invalid { what: "s" })
        ));
        assert_eq!(
            ByteReader::new(&[1]).finish(),
            Err(DecodeError::Trailing(1))
        );
        assert_eq!(
            ByteReader::new(&[2]).bool("b"),
            Err(DecodeError::Invalid { what: "b" })
        );
        assert_eq!(
            ByteReader::new(b"XY").magic(b"XZ"),
            Err(DecodeError::BadMagic)
        );
    }

    #[test]
    fn hostile_counts_allocate_nothing() {
        let mut w = ByteWriter::new();
        w.put_u32(u32::MAX);
        let b = w.into_vec();
        assert!(matches!(
            ByteReader::new(&b).count("n", usize::MAX, 37),
            Err(DecodeError::Truncated { .. })
        ));
    }

    proptest! {
        #[test]
        fn values_roundtrip(a in any::<u8>(), b in any::<u16>(), c in any::<u32>(), d in any::<u64>(), s in ".{0,40}", blob in proptest::collection::vec(any::<u8>(), 0..64), flag in any::<bool>()) {
            let mut w = ByteWriter::new();
            w.put_u8(a).put_u16(b).put_u32(c).put_u64(d).put_str(&s).put_blob(&blob).put_bool(flag);
            let bytes = w.into_vec();
            let mut r = ByteReader::new(&bytes);
            prop_assert_eq!(r.u8().unwrap(), a);
            prop_assert_eq!(r.u16().unwrap(), b);
            prop_assert_eq!(r.u32().unwrap(), c);
            prop_assert_eq!(r.u64().unwrap(), d);
            prop_assert_eq!(r.str("s", 1024).unwrap(), s.as_str());
            prop_assert_eq!(r.blob("b", 1024).unwrap(), &blob[..]);
            prop_assert_eq!(r.bool("f").unwrap(), flag);
            prop_assert!(r.finish().is_ok());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = ByteReader::new(&bytes);
            let _ = r.blob("b", 16);
            let _ = r.count("c", 1 << 20, 8);
            let _ = r.str("s", 8);
            let _ = r.u64();
        }
    }
}
