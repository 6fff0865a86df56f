//! `Quantity::parse` over arbitrary text. A quantity that parses keeps its text,
//! so it must parse again to the same value, and the accessors the engine uses
//! (millis, units) must not overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specs::Quantity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(q) = Quantity::parse(text) else { return };
    let back = Quantity::parse(&q.to_string()).expect("a quantity's text parses again");
    assert_eq!(back, q);
    // Rounding up to units never lands below rounding up to millis.
    assert!(q.units_ceil() * 1000 >= q.millis_ceil(), "{text:?}");
    let _ = (q.is_whole(), q.is_negative(), q.is_zero());
    // What serde writes (a string) must deserialize to the same quantity.
    let json = serde_json::to_string(&q).expect("a quantity serializes");
    let again: Quantity = serde_json::from_str(&json).expect("a quantity reads back");
    assert_eq!(again, q);
});
