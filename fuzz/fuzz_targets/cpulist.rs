//! `IdSet` from the cpulist syntax (`0-3,8`) and from sysfs hex masks; every set
//! that parses must print back to itself: parse(format(x)) == x.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specs::IdSet;

fn round_trip(set: &IdSet) {
    let text = set.to_string();
    let back = IdSet::parse_list(&text).expect("a printed set parses");
    assert_eq!(&back, set, "{text:?} did not parse back to the same set");
    assert_eq!(back.len(), set.iter().count());
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(set) = IdSet::parse_list(text) {
        round_trip(&set);
    }
    if let Ok(set) = IdSet::parse_mask(text) {
        round_trip(&set);
    }
});
