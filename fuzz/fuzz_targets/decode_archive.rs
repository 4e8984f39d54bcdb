//! Arbitrary bytes as an archive: parsing, listing and decoding every segment must return `Ok` or
//! `Err`, never panic, hang or allocate more than the input justifies; and a segment that decodes in
//! memory must equal the same segment streamed.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "archive_checks.rs"]
mod archive_checks;
#[path = "one_engine.rs"]
mod one_engine;

fuzz_target!(|data: &[u8]| archive_checks::check_archive(data));
