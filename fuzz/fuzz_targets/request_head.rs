#![no_main]
//! `parse_request` on arbitrary bytes, with the default limits and with
//! small limits taken from the first three input bytes.

mod head_checks;

use libfuzzer_sys::fuzz_target;
use portico::http1::head::HeadLimits;

fuzz_target!(|data: &[u8]| {
    head_checks::check(data, &HeadLimits::default());
    if let [a, b, c, rest @ ..] = data {
        head_checks::check(rest, &head_checks::small_limits([*a, *b, *c]));
    }
});
