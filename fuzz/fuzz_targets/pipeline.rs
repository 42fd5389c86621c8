#![no_main]
//! Several requests back to back on one connection buffer: each head is
//! parsed from what the previous head and body left, as the server does.
//! Bodies are skipped by their framing (Content-Length, or the chunked
//! decoder up to `Done`).

mod head_checks;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portico::http1::chunked::{ChunkedDecoder, Decoded};
use portico::http1::head::{BodyFraming, HeadLimits};

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits::default();
    let mut rest = data;
    for _ in 0..32 {
        let Some((head, used)) = head_checks::check(rest, &limits) else {
            return;
        };
        rest = &rest[used..];
        match head.body {
            BodyFraming::Empty => {}
            BodyFraming::Length(n) => {
                let Ok(n) = usize::try_from(n) else { return };
                if n > rest.len() {
                    return;
                }
                rest = &rest[n..];
            }
            BodyFraming::Chunked => {
                let mut buf = BytesMut::from(rest);
                let mut dec = ChunkedDecoder::new(4096);
                loop {
                    match dec.decode(&mut buf, 4096) {
                        Ok(Decoded::Data(d)) => assert!(!d.is_empty()),
                        Ok(Decoded::Trailers(_)) => {}
                        Ok(Decoded::Done) => break,
                        Ok(Decoded::NeedMore) | Err(_) => return,
                    }
                }
                let consumed = rest.len() - buf.len();
                assert_eq!(&rest[consumed..], &buf[..], "decoder changed unconsumed bytes");
                rest = &rest[consumed..];
            }
        }
    }
});
