//! `NodeTopology` from JSON, validated; a valid one drawn and offered a few
//! pods. The body is `specs/tests/topology_input`, shared with the
//! regression tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../specs/tests/topology_input/mod.rs"]
mod topology_input;

fuzz_target!(|data: &[u8]| {
    let _ = topology_input::check(data);
});
