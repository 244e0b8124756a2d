//! `/mutate` through the real router: two bytes choose what the cluster answers, the rest
//! is the request body (see `Scenario` in testkit/src/fuzz.rs).
#![no_main]

use std::sync::LazyLock;

use testkit::fuzz as fuzz_checks;

/// The runtime and router, built once for the whole run.
static HARNESS: LazyLock<fuzz_checks::Harness> = LazyLock::new(fuzz_checks::Harness::new);

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    HARNESS.mutate(input);
});
