//! Sets of small integer ids (CPU ids, NUMA node ids) as a bitset.
//!
//! The engine's hot path is set arithmetic on CPUs, so the representation is a
//! word vector, not a `BTreeSet`. On the wire a set is a sorted array of integers;
//! on the command line and in cgroup files it is the Linux cpulist syntax
//! (`0-3,8,10-11`).
//!
//! A set holds ids `0..=MAX_ID` and no others: every way in that takes an id
//! (`insert`, `from_ids`, `single`, `range`, the parsers, deserialization)
//! refuses a larger one with an error, so a set is never larger than
//! `MAX_ID / 8 + 1` bytes, and whatever a set holds serializes and reads back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest id a set accepts (the shared limit: see `limits`).
pub use crate::limits::MAX_ID;

/// A set of ids. `CpuSet` and `NumaSet` are the names used in the field.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdSet {
    // Invariants: no trailing zero words, so derived equality is set equality;
    // no id above MAX_ID, so at most MAX_ID / 64 + 1 words.
    words: Vec<u64>,
}

/// A set of logical CPU ids.
pub type CpuSet = IdSet;
/// A set of NUMA node ids.
pub type NumaSet = IdSet;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdSetError {
    #[error("invalid list {input:?}: {reason}")]
    Invalid { input: String, reason: String },
    #[error("id {id} is larger than {MAX_ID}")]
    TooLarge { id: u32 },
}

impl IdSet {
    pub const fn new() -> Self {
        IdSet { words: Vec::new() }
    }

    /// The set of `ids`; refused if one is larger than `MAX_ID`.
    pub fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Result<Self, IdSetError> {
        let mut s = IdSet::new();
        for id in ids {
            s.insert(id)?;
        }
        Ok(s)
    }

    /// The set `lo..=hi` (empty when `lo > hi`); refused if `hi` is larger than `MAX_ID`.
    pub fn range(lo: u32, hi: u32) -> Result<Self, IdSetError> {
        if hi > MAX_ID && lo <= hi {
            return Err(IdSetError::TooLarge { id: hi });
        }
        IdSet::from_ids(lo..=hi)
    }

    pub fn single(id: u32) -> Result<Self, IdSetError> {
        IdSet::from_ids([id])
    }

    /// Adds `id`; refused (the set unchanged) if it is larger than `MAX_ID`,
    /// since a set's words grow to fit its largest id.
    pub fn insert(&mut self, id: u32) -> Result<(), IdSetError> {
        if id > MAX_ID {
            return Err(IdSetError::TooLarge { id });
        }
        let (w, b) = ((id / 64) as usize, id % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
        Ok(())
    }

    /// The ids of this set for which `keep` is true (a subset, so never refused).
    pub fn filter(&self, mut keep: impl FnMut(u32) -> bool) -> IdSet {
        let mut s = self.clone();
        for id in self.iter() {
            if !keep(id) {
                s.words[(id / 64) as usize] &= !(1 << (id % 64));
            }
        }
        s.trim();
        s
    }

    pub fn remove(&mut self, id: u32) {
        let (w, b) = ((id / 64) as usize, id % 64);
        if let Some(word) = self.words.get_mut(w) {
            *word &= !(1 << b);
        }
        self.trim();
    }

    pub fn contains(&self, id: u32) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    pub fn union(&self, other: &IdSet) -> IdSet {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| self.words.get(i).copied().unwrap_or(0) | other.words.get(i).copied().unwrap_or(0))
            .collect();
        IdSet { words }
    }

    pub fn intersection(&self, other: &IdSet) -> IdSet {
        let n = self.words.len().min(other.words.len());
        let mut s = IdSet { words: (0..n).map(|i| self.words[i] & other.words[i]).collect() };
        s.trim();
        s
    }

    pub fn difference(&self, other: &IdSet) -> IdSet {
        let mut s = IdSet {
            words: self.words.iter().enumerate().map(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0)).collect(),
        };
        s.trim();
        s
    }

    pub fn union_with(&mut self, other: &IdSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
    }

    pub fn difference_with(&mut self, other: &IdSet) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        self.trim();
    }

    pub fn is_subset(&self, other: &IdSet) -> bool {
        self.words.iter().enumerate().all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    pub fn is_disjoint(&self, other: &IdSet) -> bool {
        self.words.iter().zip(&other.words).all(|(a, b)| a & b == 0)
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }

    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }

    /// Parses the Linux list syntax: `0-3,8,10-11`. An empty string (or only
    /// whitespace, as an empty `cpuset.cpus` reads) is the empty set.
    pub fn parse_list(input: &str) -> Result<IdSet, IdSetError> {
        let bad = |reason: String| IdSetError::Invalid { input: input.to_string(), reason };
        let mut s = IdSet::new();
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Ok(s);
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            let num = |t: &str| -> Result<u32, IdSetError> {
                let v: u32 = t.trim().parse().map_err(|_| bad(format!("{t:?} is not a non-negative integer")))?;
                if v > MAX_ID {
                    return Err(bad(format!("{v} is larger than {MAX_ID}")));
                }
                Ok(v)
            };
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (num(lo)?, num(hi)?);
                    if lo > hi {
                        return Err(bad(format!("range {lo}-{hi} is reversed")));
                    }
                    let range = IdSet::range(lo, hi).map_err(|e| bad(e.to_string()))?;
                    s.union_with(&range);
                }
                None => s.insert(num(part)?).map_err(|e| bad(e.to_string()))?,
            }
        }
        Ok(s)
    }

    /// Parses a sysfs hex mask: comma-separated 32-bit words, most significant first
    /// (`00000000,0000ffff`).
    pub fn parse_mask(input: &str) -> Result<IdSet, IdSetError> {
        let bad = |reason: String| IdSetError::Invalid { input: input.to_string(), reason };
        let mut s = IdSet::new();
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Ok(s);
        }
        let words: Vec<&str> = trimmed.split(',').collect();
        for (i, word) in words.iter().rev().enumerate() {
            let v =
                u32::from_str_radix(word.trim(), 16).map_err(|_| bad(format!("{word:?} is not a 32-bit hex word")))?;
            for b in 0..32 {
                if v & (1 << b) != 0 {
                    let id = i as u64 * 32 + b;
                    if id > u64::from(MAX_ID) {
                        return Err(bad(format!("bit {id} is larger than {MAX_ID}")));
                    }
                    s.insert(id as u32).map_err(|e| bad(e.to_string()))?;
                }
            }
        }
        Ok(s)
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

impl FromStr for IdSet {
    type Err = IdSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdSet::parse_list(s)
    }
}

/// The Linux list syntax, ranges collapsed: `0-3,8,10-11`; empty set is `""`.
impl fmt::Display for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{self}}}")
    }
}

impl Serialize for IdSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for IdSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked id by id as they arrive, so a hostile array never grows the set.
        struct Ids;
        impl<'de> serde::de::Visitor<'de> for Ids {
            type Value = IdSet;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an array of ids from 0 to {MAX_ID}")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<IdSet, A::Error> {
                let mut s = IdSet::new();
                while let Some(id) = seq.next_element::<u32>()? {
                    s.insert(id).map_err(serde::de::Error::custom)?;
                }
                Ok(s)
            }
        }
        d.deserialize_seq(Ids)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn list_round_trips() {
        for (input, ids, canon) in [
            ("", vec![], ""),
            ("0", vec![0], "0"),
            ("0-3,8,10-11", vec![0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
            ("3,1,2", vec![1, 2, 3], "1-3"),
            ("0-27,56-83\n", (0..28).chain(56..84).collect(), "0-27,56-83"),
            ("63,64,65", vec![63, 64, 65], "63-65"),
        ] {
            let s = IdSet::parse_list(input).expect(input);
            assert_eq!(s.to_vec(), ids, "{input}");
            assert_eq!(s.to_string(), canon, "{input}");
        }
    }

    #[test]
    fn list_errors_name_the_problem() {
        for (input, needle) in
            [("a", "not a non-negative integer"), ("3-1", "reversed"), ("9000", "larger than"), ("1,,2", "not a")]
        {
            let e = IdSet::parse_list(input).expect_err(input).to_string();
            assert!(e.contains(needle), "{input}: {e}");
        }
    }

    #[test]
    fn masks_parse_most_significant_word_first() {
        assert_eq!(IdSet::parse_mask("00000000,0000000f").unwrap().to_vec(), vec![0, 1, 2, 3]);
        assert_eq!(IdSet::parse_mask("00000001,00000000").unwrap().to_vec(), vec![32]);
        assert_eq!(IdSet::parse_mask("ff").unwrap().len(), 8);
    }

    #[test]
    fn set_algebra() {
        let r = |lo, hi| IdSet::range(lo, hi).unwrap();
        let a = r(0, 69);
        let b = r(64, 127);
        assert_eq!(a.intersection(&b), r(64, 69));
        assert_eq!(a.difference(&b), r(0, 63));
        assert_eq!(a.union(&b), r(0, 127));
        assert!(r(64, 69).is_subset(&a));
        assert!(!a.is_disjoint(&b));
        // Trailing empty words must not break equality.
        assert_eq!(b.difference(&r(0, 127)), IdSet::new());
        assert_eq!(a.filter(|id| id >= 64), r(64, 69));
        assert_eq!(a.filter(|id| id < 3), r(0, 2));
    }

    #[test]
    fn serde_is_a_sorted_array() {
        let s = IdSet::from_ids([5, 1, 3]).unwrap();
        assert_eq!(serde_json::to_string(&s).unwrap(), "[1,3,5]");
        let back: IdSet = serde_json::from_str("[3,1,5]").unwrap();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<IdSet>("[9999]").is_err());
    }

    /// Capacity is part of the type: no way in takes an id above MAX_ID, and
    /// every set that exists reads back from what it serializes to.
    #[test]
    fn no_way_in_takes_an_id_beyond_the_capacity() {
        let too_large = IdSetError::TooLarge { id: 4_000_000_000 };
        let mut s = IdSet::single(MAX_ID).unwrap();
        assert_eq!(s.insert(4_000_000_000), Err(too_large.clone()));
        assert_eq!(s.insert(MAX_ID + 1), Err(IdSetError::TooLarge { id: MAX_ID + 1 }));
        assert_eq!(s, IdSet::single(MAX_ID).unwrap(), "a refused insert leaves the set as it was");
        assert_eq!(IdSet::single(4_000_000_000), Err(too_large.clone()));
        assert_eq!(IdSet::from_ids([1, 4_000_000_000]), Err(too_large));
        assert_eq!(IdSet::range(0, MAX_ID + 1), Err(IdSetError::TooLarge { id: MAX_ID + 1 }));
        assert_eq!(IdSet::range(5, 4), Ok(IdSet::new()));
        assert!(IdSet::parse_list("0-4000000000").is_err());
        assert!(IdSet::parse_mask(&format!("1{}", ",00000000".repeat(256))).is_err());
        let e = serde_json::from_str::<IdSet>("[1,4000000000]").unwrap_err().to_string();
        assert!(e.contains("4000000000 is larger than 8191"), "{e}");
        let full = IdSet::range(0, MAX_ID).unwrap();
        let back: IdSet = serde_json::from_str(&serde_json::to_string(&full).unwrap()).unwrap();
        assert_eq!(back, full);
    }
}
