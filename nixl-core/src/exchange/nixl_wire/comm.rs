//! NIXL's peer-to-peer metadata side channel ("NIXLCOMM"): TCP frames of a `u64`
//! little-endian length and a body; a body holds commands, each the literal `NIXLCOMM:`, a
//! 4-byte verb and its argument:
//!
//! | command | meaning | answer |
//! |---|---|---|
//! | `NIXLCOMM:LOAD<blob>` | load this metadata blob | none (errors are only logged) |
//! | `NIXLCOMM:SEND` | send me your full metadata | one frame `NIXLCOMM:LOAD<blob>` on the same socket |
//! | `NIXLCOMM:INVL<name>` | forget agent `name` | none |
//!
//! NIXL splits a body on every occurrence of `NIXLCOMM:`, so a blob that contains those 9
//! bytes is corrupted in transit: [`encode_command`] refuses to write one, and this crate sends
//! one command per frame.

use std::io::{Read, Write};

use crate::error::DecodeError;

/// The command marker.
pub const MARKER: &[u8; 9] = b"NIXLCOMM:";
/// Largest frame read (NIXL 1.5 caps frames at 1 GiB; metadata here is bounded lower).
pub const MAX_FRAME: usize = crate::codec::MAX_METADATA + 64;
/// Most commands taken from one frame.
pub const MAX_COMMANDS: usize = 64;

/// One side-channel command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `LOAD`: a metadata blob to load.
    Load(Vec<u8>),
    /// `SEND`: a request for the receiver's full metadata.
    Send,
    /// `INVL`: the named agent is to be forgotten.
    Invalidate(String),
}

/// Encodes one command as a frame body. `None` when its argument contains [`MARKER`] (NIXL
/// would split it apart).
pub fn encode_command(c: &Command) -> Option<Vec<u8>> {
    let (verb, arg): (&[u8], &[u8]) = match c {
        Command::Load(b) => (b"LOAD", b),
        Command::Send => (b"SEND", b""),
        Command::Invalidate(n) => (b"INVL", n.as_bytes()),
    };
    if arg.windows(MARKER.len()).any(|w| w == MARKER) {
        return None;
    }
    let mut v = Vec::with_capacity(MARKER.len() + 4 + arg.len());
    v.extend_from_slice(MARKER);
    v.extend_from_slice(verb);
    v.extend_from_slice(arg);
    Some(v)
}

/// Splits a frame body into commands as NIXL does: on every `NIXLCOMM:`; pieces shorter than
/// 4 bytes are skipped (NIXL ignores them). Unknown verbs and bad names are errors here; at
/// most [`MAX_COMMANDS`] are taken.
pub fn parse_body(body: &[u8]) -> Result<Vec<Command>, DecodeError> {
    let mut out = Vec::new();
    let mut pieces = Vec::new();
    let mut start = 0usize;
    let mut i = 0usize;
    while i + MARKER.len() <= body.len() {
        if &body[i..i + MARKER.len()] == MARKER {
            pieces.push(&body[start..i]);
            i += MARKER.len();
            start = i;
        } else {
            i += 1;
        }
    }
    pieces.push(&body[start..]);
    for p in pieces {
        if p.len() < 4 {
            continue;
        }
        if out.len() == MAX_COMMANDS {
            return Err(DecodeError::TooLarge {
                what: "commands in one frame",
                value: MAX_COMMANDS as u64 + 1,
                limit: MAX_COMMANDS as u64,
            });
        }
        let (verb, arg) = p.split_at(4);
        out.push(match verb {
            b"LOAD" => Command::Load(arg.to_vec()),
            b"SEND" => Command::Send,
            b"INVL" => {
                let n = std::str::from_utf8(arg)
                    .ok()
                    .filter(|n| !n.is_empty() && n.len() <= crate::codec::MAX_NAME)
                    .ok_or(DecodeError::Invalid {
                        what: "agent name to invalidate",
                    })?;
                Command::Invalidate(n.to_owned())
            }
            _ => {
                return Err(DecodeError::Invalid {
                    what: "NIXLCOMM verb",
                })
            }
        });
    }
    Ok(out)
}

/// Reads one frame body; refuses a length over [`MAX_FRAME`] before allocating.
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut hdr = [0u8; 8];
    r.read_exact(&mut hdr)?;
    let len = u64::from_le_bytes(hdr);
    if len > MAX_FRAME as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("NIXLCOMM frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut body = Vec::new();
    r.take(len).read_to_end(&mut body)?;
    if body.len() as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> std::io::Result<()> {
    w.write_all(&(body.len() as u64).to_le_bytes())?;
    w.write_all(body)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_roundtrip_through_frames() {
        let cmds = [
            Command::Load(b"nixlSerDes|...".to_vec()),
            Command::Send,
            Command::Invalidate("py0".into()),
        ];
        for c in &cmds {
            let mut wire = Vec::new();
            write_frame(&mut wire, &encode_command(c).unwrap()).unwrap();
            assert_eq!(&wire[..8], &(wire.len() as u64 - 8).to_le_bytes());
            let body = read_frame(&mut &wire[..]).unwrap();
            assert_eq!(parse_body(&body).unwrap(), vec![c.clone()]);
        }
        let mut batch = encode_command(&cmds[2]).unwrap();
        batch.extend(encode_command(&cmds[1]).unwrap());
        assert_eq!(
            parse_body(&batch).unwrap(),
            vec![cmds[2].clone(), Command::Send]
        );
    }

    #[test]
    fn hostile_frames_are_refused() {
        assert_eq!(
            encode_command(&Command::Load(b"xxNIXLCOMM:yy".to_vec())),
            None
        );
        assert!(parse_body(b"NIXLCOMM:BOOM").is_err());
        assert!(parse_body(b"NIXLCOMM:INVL").is_err());
        assert_eq!(parse_body(b"NIXLCOMM:ab").unwrap(), vec![]);
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"NIXLCOMM:SEND");
        assert!(read_frame(&mut &huge[..]).is_err());
        let short = 20u64.to_le_bytes();
        assert!(read_frame(&mut &short[..]).is_err());
        let many = b"NIXLCOMM:SEND".repeat(MAX_COMMANDS + 1);
        assert!(parse_body(&many).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = parse_body(&b);
            let _ = read_frame(&mut &b[..]);
        }
    }
}
