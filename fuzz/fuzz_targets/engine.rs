//! Fuzzes the sans-IO engine through the invariant-checking harness:
//! `cargo fuzz run -s none engine`. A crash input goes to
//! `fuzz/regressions/engine/`, where `tests/fuzz_regressions.rs` replays it.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../common/decode.rs"]
mod decode;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = decode::run(data) {
        panic!("{v}");
    }
});
