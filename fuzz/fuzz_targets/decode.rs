//! AdmissionReview decoding, for both endpoints' object types, on any bytes.
#![no_main]

use testkit::fuzz as fuzz_checks;

libfuzzer_sys::fuzz_target!(|body: &[u8]| fuzz_checks::decode(body));
