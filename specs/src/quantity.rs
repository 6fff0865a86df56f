//! Resource quantities parsed exactly, as Kubernetes does (`500m`, `2`, `1.5`,
//! `1Gi`, `512Mi`, `2M`, `1e3`).
//!
//! The value is held as an integer count of nano-units (`i128`), so every
//! quantity the grammar allows up to about 10^29 is exact and resource
//! arithmetic never touches floating point. Precision finer than a nano-unit is
//! rounded up, as Kubernetes rounds.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::limits::MAX_UNITS;

const NANO: i128 = 1_000_000_000;

/// Bytes as a person reads them, in one unit: the largest binary unit
/// they reach, exact where it divides them (`64Gi`, `512Mi`), else to one
/// decimal (`8.5Gi`, not `8874196Ki`); under 1Ki, plain bytes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")];
    for (shift, suffix) in UNITS {
        let unit = 1u64 << shift;
        if n >= unit {
            return if n.is_multiple_of(unit) {
                format!("{}{suffix}", n >> shift)
            } else {
                format!("{:.1}{suffix}", n as f64 / unit as f64)
            };
        }
    }
    format!("{n} bytes")
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    pub input: String,
    pub reason: &'static str,
}

/// An exact resource quantity; keeps the text it was written as.
#[derive(Clone)]
pub struct Quantity {
    nanos: i128,
    text: String,
}

impl Quantity {
    pub fn parse(input: &str) -> Result<Quantity, QuantityError> {
        let err = |reason| QuantityError { input: input.to_string(), reason };
        // Kubernetes' grammar has no whitespace anywhere: " 1" is refused, not trimmed.
        let s = input;
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(err("contains whitespace"));
        }
        if s.len() > 64 {
            return Err(err("longer than 64 characters"));
        }
        let (negative, body) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
        let (number, suffix) = body.split_at(num_end);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err("no digits"));
        }
        if frac_part.contains('.') {
            return Err(err("more than one decimal point"));
        }
        // The value is digits * 10^exp10 * 2^exp2 (before the nano scaling).
        let digits_str = format!("{int_part}{frac_part}");
        let digits_str = digits_str.trim_start_matches('0');
        if digits_str.len() > 36 {
            return Err(err("too many significant digits"));
        }
        let digits: i128 =
            if digits_str.is_empty() { 0 } else { digits_str.parse().map_err(|_| err("not a number"))? };
        let mut exp10: i32 = -(frac_part.len() as i32);
        let mut exp2: u32 = 0;
        match suffix {
            "" => {}
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            _ => {
                let exp = suffix.strip_prefix('e').or_else(|| suffix.strip_prefix('E')).ok_or_else(|| {
                    err("unknown suffix (use n, u, m, k, M, G, T, P, E, Ki..Ei or an exponent like e3)")
                })?;
                let e: i32 = exp.parse().map_err(|_| err("exponent is not an integer"))?;
                if !(-40..=40).contains(&e) {
                    return Err(err("exponent out of range"));
                }
                exp10 += e;
            }
        }
        // nanos = ceil(digits * 2^exp2 * 10^(exp10 + 9))
        let overflow = || err("too large");
        let mut value = digits.checked_mul(1i128 << exp2).ok_or_else(overflow)?;
        let e = exp10 + 9;
        if e >= 0 {
            for _ in 0..e {
                value = value.checked_mul(10).ok_or_else(overflow)?;
            }
        } else {
            let mut div: i128 = 1;
            for _ in 0..(-e) {
                div = match div.checked_mul(10) {
                    Some(d) => d,
                    // Dividing by more than i128 can hold leaves at most one nano.
                    None => {
                        value = i128::from(value != 0);
                        div = 1;
                        break;
                    }
                };
            }
            value = value / div + i128::from(value % div != 0);
        }
        if value / NANO > MAX_UNITS {
            return Err(err("too large"));
        }
        Ok(Quantity { nanos: if negative { -value } else { value }, text: s.to_string() })
    }

    /// A quantity of whole units, written as a plain integer.
    pub fn from_units(units: i64) -> Quantity {
        Quantity { nanos: i128::from(units) * NANO, text: units.to_string() }
    }

    /// A quantity of milli-units, written with the `m` suffix unless whole.
    pub fn from_millis(millis: i64) -> Quantity {
        let text = if millis % 1000 == 0 { (millis / 1000).to_string() } else { format!("{millis}m") };
        Quantity { nanos: i128::from(millis) * 1_000_000, text }
    }

    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The value in milli-units, rounded up (CPU is accounted in millicores).
    pub fn millis_ceil(&self) -> i128 {
        ceil_div(self.nanos, 1_000_000)
    }

    /// The value in whole units, rounded up (memory is accounted in bytes).
    pub fn units_ceil(&self) -> i128 {
        ceil_div(self.nanos, NANO)
    }

    /// True when the value is a whole number of units (an integer CPU count).
    pub fn is_whole(&self) -> bool {
        self.nanos % NANO == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b > 0 {
        q + 1
    } else {
        q
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quantity({})", self.text)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Manifests write `cpu: 2` as often as `cpu: "2"`. A visitor (not an
        // untagged enum) so that a wrong type says what was expected.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as 500m, 2, 1.5 or 1Gi")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Quantity::parse(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                // Rust prints the shortest text that reads back as the same f64,
                // so `0.1` stays `0.1`; NaN and infinities are refused by parse.
                self.visit_str(&v.to_string())
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {

    #[test]
    fn bytes_read_in_one_unit_exact_where_it_divides() {
        let table = [
            (0, "0 bytes"),
            (1000, "1000 bytes"),
            (1024, "1Ki"),
            (64 << 20, "64Mi"),
            (100 << 30, "100Gi"),
            // A node's free memory: one decimal, not 8874196Ki.
            (8_874_196 << 10, "8.5Gi"),
            (1536 << 20, "1.5Gi"),
            (3 << 40, "3Ti"),
        ];
        for (n, want) in table {
            assert_eq!(human_bytes(n), want, "{n} bytes");
        }
    }

    use super::*;

    fn check(input: &str, nanos: i128) {
        let q = Quantity::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(q.nanos(), nanos, "{input}");
    }

    #[test]
    fn parses_exactly() {
        const G: i128 = NANO;
        check("500m", G / 2);
        check("2", 2 * G);
        check("1.5", 3 * G / 2);
        check("1Gi", (1 << 30) * G);
        check("512Mi", (512 << 20) * G);
        check("2M", 2_000_000 * G);
        check("1e3", 1000 * G);
        check("1E3", 1000 * G);
        check("1.5Gi", (3 << 29) * G);
        check("0.1", G / 10);
        check("100n", 100);
        check("1u", 1000);
        check("0", 0);
        check("-1", -G);
        check(".5", G / 2);
        check("1e-10", 1); // rounded up to a nano
        check("1Ei", (1 << 60) * G);
    }

    #[test]
    fn rounding() {
        assert_eq!(Quantity::parse("1.5").unwrap().millis_ceil(), 1500);
        assert_eq!(Quantity::parse("0.0001").unwrap().millis_ceil(), 1);
        assert_eq!(Quantity::parse("1.0001").unwrap().units_ceil(), 2);
        assert!(Quantity::parse("2").unwrap().is_whole());
        assert!(!Quantity::parse("1500m").unwrap().is_whole());
        assert!(Quantity::parse("2000m").unwrap().is_whole());
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "abc",
            "1..5",
            "1Q",
            "1ee3",
            "1e999",
            "1e30",
            "99999999999999999999999999999999999999999999",
            "Gi",
            ".",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn equality_is_by_value() {
        assert_eq!(Quantity::parse("1k").unwrap(), Quantity::parse("1000").unwrap());
        assert_eq!(Quantity::parse("1Ki").unwrap(), Quantity::parse("1024").unwrap());
        assert!(Quantity::parse("1Gi").unwrap() > Quantity::parse("1G").unwrap());
    }

    #[test]
    fn serde_accepts_numbers_and_strings() {
        let q: Quantity = serde_json::from_str("2").unwrap();
        assert_eq!(q.units_ceil(), 2);
        let q: Quantity = serde_json::from_str("\"250m\"").unwrap();
        assert_eq!(q.millis_ceil(), 250);
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"250m\"");
    }

    /// Grammar table: input and expected nanos, or None for a refusal.
    #[test]
    fn grammar_table() {
        const G: i128 = NANO;
        let cases: &[(&str, Option<i128>)] = &[
            ("+1", Some(G)),
            ("1.", Some(G)),
            ("-0", Some(0)),
            ("1e+3", Some(1000 * G)),
            ("1e-3", Some(G / 1000)),
            ("5E", Some(5_000_000_000_000_000_000 * G)),
            ("0.3Ki", Some(3072 * G / 10)),
            ("1k", Some(1000 * G)),
            ("1Ti", Some((1 << 40) * G)),
            ("1P", Some(1_000_000_000_000_000 * G)),
            (" 1", None),
            ("1 ", None),
            ("1 Gi", None),
            ("--1", None),
            ("-", None),
            ("1e", None),
            ("1e3Ki", None),
            ("1Kie3", None),
            ("1e1.5", None),
            ("1K", None),
            ("1gi", None),
            ("1mi", None),
            ("0x10", None),
            ("1,5", None),
            ("١", None),
            ("NaN", None),
            ("inf", None),
        ];
        for (input, want) in cases {
            let got = Quantity::parse(input).ok().map(|q| q.nanos());
            assert_eq!(got, *want, "{input:?}");
        }
    }

    #[test]
    fn serde_table() {
        let cases: &[(&str, Result<i128, &str>)] = &[
            ("2", Ok(2 * NANO)),
            ("0.1", Ok(NANO / 10)),
            ("1e3", Ok(1000 * NANO)),
            ("\"1Gi\"", Ok((1 << 30) * NANO)),
            ("true", Err("invalid type: boolean `true`, expected a quantity such as 500m, 2, 1.5 or 1Gi")),
            ("\"1Q\"", Err("invalid quantity \"1Q\"")),
        ];
        for (json, want) in cases {
            let got: Result<Quantity, _> = serde_json::from_str(json);
            match (got, want) {
                (Ok(q), Ok(n)) => assert_eq!(q.nanos(), *n, "{json}"),
                (Err(e), Err(msg)) => assert!(e.to_string().starts_with(msg), "{json}: {e}"),
                (got, want) => panic!("{json}: got {got:?}, want {want:?}"),
            }
        }
    }
}
