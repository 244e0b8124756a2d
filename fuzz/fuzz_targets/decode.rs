//! AdmissionReview decoding, for both endpoints' object types, on any bytes.
#![no_main]

#[path = "../../tests/fuzz_checks/mod.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|body: &[u8]| fuzz_checks::decode(body));
