//! The bytes this crate puts on the wire (IPC handles, shared-memory handles, connection
//! info), in the builder shape its encoders use, over nixl-core's one byte reader and writer
//! ([`nixl_core::backend::bytes`]): a magic prefix, then bounded little-endian fields. Every decode
//! failure is a typed [`DecodeError`]; nothing reads past the input.

use nixl_core::backend::bytes::{ByteReader, ByteWriter};
use nixl_core::backend::DecodeError;

pub(crate) struct Writer(ByteWriter);

impl Writer {
    pub(crate) fn new(magic: &[u8; 4]) -> Self {
        let mut w = ByteWriter::new();
        w.put(magic);
        Writer(w)
    }
    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.0.put_u64(v);
        self
    }
    pub(crate) fn bytes(mut self, b: &[u8]) -> Self {
        self.0.put_blob(b);
        self
    }
    pub(crate) fn raw(mut self, b: &[u8]) -> Self {
        self.0.put(b);
        self
    }
    pub(crate) fn finish(self) -> Vec<u8> {
        self.0.into_vec()
    }
}

pub(crate) struct Reader<'a>(ByteReader<'a>);

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], magic: &[u8; 4]) -> Result<Self, DecodeError> {
        let mut r = ByteReader::new(buf);
        r.magic(magic)?;
        Ok(Reader(r))
    }
    pub(crate) fn raw(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        self.0.take(n)
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.0.u64()
    }
    pub(crate) fn bytes(
        &mut self,
        what: &'static str,
        limit: usize,
    ) -> Result<&'a [u8], DecodeError> {
        self.0.blob(what, limit)
    }
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_truncation_is_typed() {
        let b = Writer::new(b"TEST")
            .u64(7)
            .bytes(b"abc")
            .raw(&[9; 3])
            .finish();
        let mut r = Reader::new(&b, b"TEST").unwrap();
        assert_eq!(r.u64().unwrap(), 7);
        assert_eq!(r.bytes("x", 16).unwrap(), b"abc");
        assert_eq!(r.raw(3).unwrap(), &[9; 3]);
        r.finish().unwrap();
        for n in 0..b.len() {
            let res = (|| {
                let mut r = Reader::new(&b[..n], b"TEST")?;
                r.u64()?;
                r.bytes("x", 16)?;
                r.raw(3)?;
                r.finish()
            })();
            assert!(res.is_err(), "prefix {n} decoded");
        }
        assert_eq!(
            Reader::new(b"NOPE", b"TEST").err(),
            Some(DecodeError::BadMagic)
        );
        let big = Writer::new(b"TEST").raw(&u32::MAX.to_le_bytes()).finish();
        assert!(matches!(
            Reader::new(&big, b"TEST").unwrap().bytes("x", 16),
            Err(DecodeError::TooLarge { .. })
        ));
    }
}
