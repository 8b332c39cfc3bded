//! Every CSV and JSON parser of `windfall-forecasts` on arbitrary bytes: refusals are fine,
//! panics are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    windfall_forecasts::fuzz::fuzz_parsers(data);
});
