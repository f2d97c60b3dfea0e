//! `nixlSerDes`: the tag-length-value encoding every NIXL wire format uses.
//!
//! ```text
//! blob  := "nixlSerDes|" field*
//! field := tag  u64-len(little endian)  payload  "|"
//! ```
//!
//! Tags carry no length of their own: a reader must know the grammar, field by field. NIXL's
//! reader does not check the `'|'` after a payload; this one does, bounds every length by the
//! bytes left, and so only refuses blobs NIXL would also mis-parse.

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::DecodeError;

/// The 11-byte prefix of every blob.
pub const MAGIC: &[u8; 11] = b"nixlSerDes|";

/// Builds a blob field by field (over the crate's one byte writer).
#[derive(Debug, Clone)]
pub struct Writer {
    w: ByteWriter,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl Writer {
    /// A blob holding only the magic.
    pub fn new() -> Self {
        let mut w = ByteWriter::with_capacity(256);
        w.put(MAGIC);
        Writer { w }
    }

    /// Appends `tag ‖ len ‖ payload ‖ '|'` (NIXL's `addStr` and `addBuf`).
    pub fn field(&mut self, tag: &[u8], payload: &[u8]) -> &mut Self {
        self.w
            .put(tag)
            .put_u64(payload.len() as u64)
            .put(payload)
            .put_u8(b'|');
        self
    }

    /// Appends an 8-byte little-endian integer field (a `size_t` with `addBuf`).
    pub fn u64(&mut self, tag: &[u8], v: u64) -> &mut Self {
        self.field(tag, &v.to_le_bytes())
    }

    /// Appends a 4-byte little-endian integer field (an `int`/enum with `addBuf`).
    pub fn i32(&mut self, tag: &[u8], v: i32) -> &mut Self {
        self.field(tag, &v.to_le_bytes())
    }

    /// The bytes so far.
    pub fn finish(self) -> Vec<u8> {
        self.w.into_vec()
    }
}

/// Reads a blob field by field, strictly in order (over the crate's one byte reader). A
/// field that fails to read leaves the position where it was.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    r: ByteReader<'a>,
}

impl<'a> Reader<'a> {
    /// Starts reading `buf`, which must begin with [`MAGIC`].
    pub fn new(buf: &'a [u8]) -> Result<Self, DecodeError> {
        if !buf.starts_with(MAGIC) {
            return Err(DecodeError::BadMagic);
        }
        let mut r = ByteReader::new(buf);
        r.take(MAGIC.len())?;
        Ok(Reader { r })
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.r.remaining()
    }

    /// The read position.
    pub fn position(&self) -> usize {
        self.r.position()
    }

    /// Whether everything was read.
    pub fn at_end(&self) -> bool {
        self.remaining() == 0
    }

    /// Runs `f`; on error, puts the position back.
    fn atomic<T>(
        &mut self,
        f: impl FnOnce(&mut ByteReader<'a>) -> Result<T, DecodeError>,
    ) -> Result<T, DecodeError> {
        let mut r = self.r.clone();
        let out = f(&mut r)?;
        self.r = r;
        Ok(out)
    }

    /// Reads the field tagged `tag` and returns its payload, at most `max` bytes long.
    pub fn field(
        &mut self,
        tag: &[u8],
        what: &'static str,
        max: usize,
    ) -> Result<&'a [u8], DecodeError> {
        self.atomic(|r| field(r, tag, what, max))
    }

    /// Reads an 8-byte integer field.
    pub fn u64(&mut self, tag: &[u8], what: &'static str) -> Result<u64, DecodeError> {
        self.exact::<8>(tag, what).map(u64::from_le_bytes)
    }

    /// Reads a 4-byte integer field.
    pub fn i32(&mut self, tag: &[u8], what: &'static str) -> Result<i32, DecodeError> {
        self.exact::<4>(tag, what).map(i32::from_le_bytes)
    }

    /// Reads a field whose payload is exactly `N` bytes (NIXL's `getBuf`).
    fn exact<const N: usize>(
        &mut self,
        tag: &[u8],
        what: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        self.atomic(|r| {
            field(r, tag, what, N)?
                .try_into()
                .map_err(|_| DecodeError::Invalid { what })
        })
    }

    /// Reads a field whose payload is UTF-8 text of 1..=`max` bytes.
    pub fn name(
        &mut self,
        tag: &[u8],
        what: &'static str,
        max: usize,
    ) -> Result<String, DecodeError> {
        self.atomic(|r| {
            let p = field(r, tag, what, max)?;
            if p.is_empty() {
                return Err(DecodeError::Invalid { what });
            }
            std::str::from_utf8(p)
                .map(str::to_owned)
                .map_err(|_| DecodeError::Invalid { what })
        })
    }

    /// Fails unless every byte was read.
    pub fn end(&self) -> Result<(), DecodeError> {
        self.r.clone().finish()
    }
}

/// `tag ‖ u64 len ‖ payload ‖ '|'`, with `len` at most `max` and the bytes left.
fn field<'a>(
    r: &mut ByteReader<'a>,
    tag: &[u8],
    what: &'static str,
    max: usize,
) -> Result<&'a [u8], DecodeError> {
    if r.take(tag.len())? != tag {
        return Err(DecodeError::Invalid { what });
    }
    let len = r.u64()?;
    if len > max as u64 {
        return Err(DecodeError::TooLarge {
            what,
            value: len,
            limit: max as u64,
        });
    }
    // Bounded by `max`, so it fits a usize.
    let payload = r.take(len as usize)?;
    if r.u8()? != b'|' {
        return Err(DecodeError::Invalid { what });
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn field_layout_is_nixls() {
        let mut w = Writer::new();
        w.field(b"Agent", b"rs0").u64(b"Conns", 1);
        let b = w.finish();
        let mut want = b"nixlSerDes|Agent".to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"rs0|Conns");
        want.extend_from_slice(&8u64.to_le_bytes());
        want.extend_from_slice(&1u64.to_le_bytes());
        want.push(b'|');
        assert_eq!(b, want);
        let mut r = Reader::new(&b).unwrap();
        assert_eq!(r.name(b"Agent", "agent", 64).unwrap(), "rs0");
        assert_eq!(r.u64(b"Conns", "conns").unwrap(), 1);
        assert!(r.end().is_ok());
    }

    #[test]
    fn bad_fields_are_refused_without_moving() {
        let mut w = Writer::new();
        w.field(b"t", b"UCX");
        let b = w.finish();
        let mut r = Reader::new(&b).unwrap();
        assert!(matches!(
            r.field(b"x", "t", 8),
            Err(DecodeError::Invalid { .. })
        ));
        assert!(matches!(
            r.field(b"t", "t", 2),
            Err(DecodeError::TooLarge { .. })
        ));
        assert!(matches!(r.u64(b"t", "t"), Err(DecodeError::Invalid { .. })));
        assert_eq!(r.position(), MAGIC.len());
        assert_eq!(r.field(b"t", "t", 8).unwrap(), b"UCX");
        let mut bad = b.clone();
        *bad.last_mut().unwrap() = b'#';
        let mut r = Reader::new(&bad).unwrap();
        assert!(r.field(b"t", "t", 8).is_err(), "the '|' is checked");
        assert_eq!(
            Reader::new(b"nixlSerDes").err(),
            Some(DecodeError::BadMagic)
        );
    }

    proptest! {
        #[test]
        fn fields_roundtrip(fields in proptest::collection::vec(("[a-z]{0,6}", proptest::collection::vec(any::<u8>(), 0..40)), 0..8)) {
            let mut w = Writer::new();
            for (t, p) in &fields {
                w.field(t.as_bytes(), p);
            }
            let b = w.finish();
            let mut r = Reader::new(&b).unwrap();
            for (t, p) in &fields {
                prop_assert_eq!(r.field(t.as_bytes(), "f", 64).unwrap(), &p[..]);
            }
            prop_assert!(r.end().is_ok());
        }

        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut b = MAGIC.to_vec();
            b.extend_from_slice(&tail);
            let mut r = Reader::new(&b).unwrap();
            let _ = r.field(b"", "f", 1 << 20);
            let _ = r.u64(b"n", "n");
            let _ = r.name(b"Agent", "a", 16);
        }
    }
}
