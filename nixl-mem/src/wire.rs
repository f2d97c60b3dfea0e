//! A tiny bounded little-endian reader/writer for the bytes this crate puts on the wire (IPC
//! handles, shared-memory handles, connection info). Every decode failure is a typed
//! [`DecodeError`]; nothing reads past the input.

use nixl_core::DecodeError;

pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn new(magic: &[u8; 4]) -> Self {
        Writer(magic.to_vec())
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self = self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn finish(self) -> Vec<u8> {
        self.0
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], magic: &[u8; 4]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf, pos: 0 };
        if r.raw(4)? != magic {
            return Err(DecodeError::BadMagic);
        }
        Ok(r)
    }
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n.saturating_sub(self.buf.len() - self.pos),
            });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.raw(8)?);
        Ok(u64::from_le_bytes(a))
    }
    pub fn bytes(&mut self, what: &'static str, limit: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.u64()?;
        if n > limit as u64 {
            return Err(DecodeError::TooLarge {
                what,
                value: n,
                limit: limit as u64,
            });
        }
        self.raw(n as usize)
    }
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
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
        let big = Writer::new(b"TEST").u64(1 << 40).finish();
        assert!(matches!(
            Reader::new(&big, b"TEST").unwrap().bytes("x", 16),
            Err(DecodeError::TooLarge { .. })
        ));
    }
}
