//! The `CUDA_IPC` notification stream of one connection, fed in pieces of fuzzer-chosen sizes:
//! no panic; the buffer never holds more than one frame plus the piece just fed; a stream the
//! reader accepted re-frames to the bytes it consumed; and feeding the same bytes in one piece
//! gives the same notifications.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_mem::fuzzing::{frame, Frames, MAX_NOTIF};

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(step % 64) + 1;
    let mut pieces = Frames::default();
    let mut got = Vec::new();
    let mut broken = false;
    for piece in stream.chunks(step) {
        match pieces.feed(piece) {
            Some(n) => got.extend(n),
            None => {
                broken = true;
                break;
            }
        }
        assert!(pieces.buffered() <= 4 + MAX_NOTIF + step);
    }
    let mut whole = Frames::default();
    match whole.feed(stream) {
        Some(n) => {
            assert!(!broken, "split feeding refused what one piece accepted");
            assert_eq!(n, got, "the split does not change the notifications");
            // Re-framing the sender and the notifications gives the consumed prefix.
            if let Some((sender, _)) = n.first() {
                let mut again = frame(sender.as_bytes());
                for (s, m) in &n {
                    assert_eq!(s, sender);
                    again.extend_from_slice(&frame(m));
                }
                let consumed = stream.len() - whole.buffered();
                assert_eq!(&again[..], &stream[..consumed]);
            }
        }
        None => assert!(broken, "one piece refused what split feeding accepted"),
    }
});
