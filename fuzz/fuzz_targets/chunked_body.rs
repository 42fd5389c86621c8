#![no_main]
//! The chunked decoder fed the same body in pieces (cut where the input
//! says) and all at once must agree: same body bytes, same trailers, same
//! end, same number of bytes consumed.
//!
//! Input: `[max_data, max_trailers/16, seed_lo, seed_hi, body...]`.

use bytes::BytesMut;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use portico::http1::chunked::{ChunkedDecoder, Decoded};

#[derive(Debug, PartialEq)]
enum End {
    /// `Done` after consuming this many bytes.
    Done(usize),
    Error,
    /// All input fed, decoder still wants more.
    Incomplete,
}

#[derive(Debug, PartialEq)]
struct Outcome {
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
    end: End,
}

/// Feeds `input` in pieces of the sizes `next_piece` gives (0 = all the rest)
/// and checks the per-call invariants on the way.
fn decode(input: &[u8], max_trailers: usize, max_data: usize, mut next_piece: impl FnMut() -> usize) -> Outcome {
    let mut dec = ChunkedDecoder::new(max_trailers);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut body = Vec::new();
    let mut trailers = None;
    let mut calls_since_feed = 0;
    let mut budget = 4;
    loop {
        let before = buf.len();
        let result = dec.decode(&mut buf, max_data);
        let consumed = fed - buf.len();
        // Bytes are only ever taken from the front, never added or altered.
        assert!(buf.len() <= before, "decode grew the buffer");
        assert!(consumed <= fed);
        assert_eq!(&buf[..], &input[consumed..fed], "unconsumed bytes changed");
        calls_since_feed += 1;
        assert!(calls_since_feed <= budget, "no progress without new input");
        match result {
            Err(_) => {
                assert!(!dec.is_done());
                return Outcome {
                    body,
                    trailers,
                    end: End::Error,
                };
            }
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty(), "empty Data");
                assert!(d.len() <= max_data.max(1), "Data over max_data");
                assert!(trailers.is_none(), "Data after Trailers");
                assert_eq!(
                    &d[..],
                    &input[consumed - d.len()..consumed],
                    "Data is not the bytes consumed"
                );
                body.extend_from_slice(&d);
            }
            Ok(Decoded::Trailers(t)) => {
                assert!(!t.is_empty());
                assert!(trailers.is_none(), "Trailers twice");
                assert!(dec.is_done(), "Trailers before the end");
                trailers = Some(t);
            }
            Ok(Decoded::Done) => {
                assert!(dec.is_done());
                // Done is final: nothing more is returned or consumed.
                buf.extend_from_slice(&input[fed..]);
                let left = buf.len();
                for _ in 0..2 {
                    assert_eq!(dec.decode(&mut buf, max_data), Ok(Decoded::Done), "not Done after Done");
                    assert_eq!(buf.len(), left, "consumed after Done");
                }
                return Outcome {
                    body,
                    trailers,
                    end: End::Done(consumed),
                };
            }
            Ok(Decoded::NeedMore) => {
                assert!(!dec.is_done());
                assert!(trailers.is_none(), "NeedMore after Trailers");
                // Asking again without new input changes nothing.
                assert_eq!(
                    dec.decode(&mut buf, max_data),
                    Ok(Decoded::NeedMore),
                    "NeedMore not stable"
                );
                assert_eq!(buf.len(), fed - consumed, "consumed on a repeated NeedMore");
                if fed == input.len() {
                    return Outcome {
                        body,
                        trailers,
                        end: End::Incomplete,
                    };
                }
                let piece = match next_piece() {
                    0 => input.len() - fed,
                    n => n.min(input.len() - fed),
                };
                buf.extend_from_slice(&input[fed..fed + piece]);
                fed += piece;
                calls_since_feed = 0;
                budget = buf.len() + 4;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [max_data, trailers, seed_lo, seed_hi, input @ ..] = data else {
        return;
    };
    let max_data = *max_data as usize; // 0 is allowed: the decoder treats it as 1
    let max_trailers = *trailers as usize * 16;

    // Reference: everything at once, no limit on Data size.
    let whole = decode(input, max_trailers, usize::MAX, || 0);

    // Pieces of pseudo-random sizes, seeded from the input.
    let mut state = u32::from(*seed_lo) | u32::from(*seed_hi) << 8 | 0x9e37_0000;
    let split = decode(input, max_trailers, max_data, || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        // Mostly tiny pieces, sometimes larger ones.
        match state % 8 {
            0 => 1 + (state >> 8) as usize % 512,
            _ => 1 + (state >> 8) as usize % 8,
        }
    });
    assert_eq!(split, whole, "split feeding disagrees with whole input");

    // One byte at a time (small inputs only, it is quadratic in places).
    if input.len() <= 2048 {
        let bytes = decode(input, max_trailers, max_data, || 1);
        assert_eq!(bytes, whole, "byte-at-a-time feeding disagrees with whole input");
    }

    // A finished body is finished at exactly that byte: not before it.
    if let End::Done(n) = whole.end {
        let short = decode(&input[..n - 1], max_trailers, usize::MAX, || 0);
        assert_eq!(short.end, End::Incomplete, "body ends early or fails one byte short");
        let exact = decode(&input[..n], max_trailers, usize::MAX, || 0);
        assert_eq!(exact, whole, "prefix up to the end decodes differently");
    }
});
