//! Synthetic machines described in hwloc's words: `pack:2 numa:1 core:28 pu:2`.
//!
//! Each word is `LEVEL:COUNT`, outermost level first; counts multiply (`numa:1`
//! under `pack:2` is two NUMA nodes). Levels: `pack`/`package`/`socket`,
//! `numa`/`node`/`numanode`, `die`, the caches and `group` (accepted; they multiply
//! but add nothing to the model), `core`, `pu`. `core` and `pu` must come last, in
//! that order; a missing `pu` means one thread per core, a missing `pack` one
//! package, a missing `numa` one node for the whole machine.
//!
//! Numbering follows the usual Linux x86 convention, so that a synthetic copy of a
//! real machine reads the same: the first thread of every core gets ids
//! `0..cores`, the second threads `cores..2*cores`, and so on (`pack:2 numa:1
//! core:28 pu:2` gives NUMA0 = 0-27,56-83 and siblings N and N+56).
//!
//! Defaults: 64 GiB per NUMA node (override with `numa:2(memory=32GiB)`), distance
//! 10 local, 20 within a package, 32 across packages, no huge pages.

use crate::idset::{CpuSet, MAX_ID};
use crate::topology::{Cpu, NodeTopology, NumaNode};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid synthetic topology {input:?}: {reason}")]
pub struct SyntheticError {
    pub input: String,
    pub reason: String,
}

/// Default memory of a synthetic NUMA node.
pub const DEFAULT_NODE_MEMORY: u64 = 64 << 30;
/// Most NUMA nodes a synthetic machine may have: the shared limit.
pub const MAX_NUMA_NODES: u64 = crate::limits::MAX_NUMA_NODES as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pack,
    Numa,
    Die,
    /// Caches and groups: they multiply but are not modelled.
    Other,
    Core,
    Pu,
}

struct Level {
    kind: Kind,
    count: u64,
}

/// Builds a machine from an hwloc synthetic description.
pub fn parse(desc: &str) -> Result<NodeTopology, SyntheticError> {
    let err = |reason: String| SyntheticError { input: desc.to_string(), reason };
    let mut levels: Vec<Level> = Vec::new();
    let mut node_memory = DEFAULT_NODE_MEMORY;
    if desc.len() > 1024 {
        return Err(err("longer than 1024 characters".into()));
    }
    for word in desc.split_whitespace() {
        let (head, attrs) = match word.split_once('(') {
            Some((h, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(|| err(format!("word {word:?}: unclosed '('")))?;
                (h, Some(inner))
            }
            None => (word, None),
        };
        let (name, count) =
            head.split_once(':').ok_or_else(|| err(format!("word {word:?}: expected LEVEL:COUNT, e.g. core:8")))?;
        let kind = match name.to_ascii_lowercase().as_str() {
            "pack" | "package" | "socket" => Kind::Pack,
            "numa" | "node" | "numanode" => Kind::Numa,
            "die" => Kind::Die,
            "l1" | "l2" | "l3" | "l4" | "l5" | "l1d" | "l1i" | "l2d" | "l3d" | "l1cache" | "l2cache" | "l3cache"
            | "cache" | "group" => Kind::Other,
            "core" => Kind::Core,
            "pu" => Kind::Pu,
            other => {
                return Err(err(format!(
                    "word {word:?}: unknown level {other:?} (use pack, numa, die, l1-l3, group, core, pu)"
                )))
            }
        };
        let count: u64 =
            count.parse().map_err(|_| err(format!("word {word:?}: count {count:?} is not a positive integer")))?;
        if count == 0 {
            return Err(err(format!("word {word:?}: count must be at least 1")));
        }
        if let Some(attrs) = attrs {
            for attr in attrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                match attr.split_once('=') {
                    Some(("memory", v)) if kind == Kind::Numa => {
                        node_memory = parse_bytes(v).ok_or_else(|| {
                            err(format!("word {word:?}: memory {v:?} is not a size like 32GiB or 1073741824"))
                        })?;
                    }
                    _ => {
                        return Err(err(format!(
                            "word {word:?}: unsupported attribute {attr:?} (only numa(memory=SIZE))"
                        )))
                    }
                }
            }
        }
        if kind != Kind::Other && levels.iter().any(|l| l.kind == kind) {
            return Err(err(format!("word {word:?}: level {name} appears twice")));
        }
        if let Some(last) = levels.last() {
            if last.kind == Kind::Pu {
                return Err(err(format!("word {word:?}: nothing may follow pu")));
            }
            if last.kind == Kind::Core && kind != Kind::Pu {
                return Err(err(format!("word {word:?}: only pu may follow core")));
            }
        }
        levels.push(Level { kind, count });
    }
    if levels.is_empty() {
        return Err(err("empty description (e.g. \"pack:2 numa:1 core:28 pu:2\")".into()));
    }
    if !levels.iter().any(|l| l.kind == Kind::Core) {
        // `pu` directly under a package or node: each PU is its own core.
        let pos = levels.iter().position(|l| l.kind == Kind::Pu).unwrap_or(levels.len());
        levels.insert(pos, Level { kind: Kind::Core, count: 1 });
        if pos == levels.len() - 1 {
            // No pu either: the last level was not a core, so the description
            // names no processors at all.
            return Err(err("no core or pu level".into()));
        }
        // `... pu:N` becomes `... core:N pu:1`.
        let n = levels[pos + 1].count;
        levels[pos].count = n;
        levels[pos + 1].count = 1;
    }
    if !levels.iter().any(|l| l.kind == Kind::Pu) {
        levels.push(Level { kind: Kind::Pu, count: 1 });
    }
    let mut total: u64 = 1;
    for l in &levels {
        total = total.saturating_mul(l.count);
    }
    if total > u64::from(MAX_ID) + 1 {
        return Err(err(format!("{total} PUs; at most {} are supported", u64::from(MAX_ID) + 1)));
    }
    // For each level, how many PUs one instance spans.
    let mut span = vec![1u64; levels.len()];
    for i in (0..levels.len().saturating_sub(1)).rev() {
        span[i] = span[i + 1] * levels[i + 1].count;
    }
    let span_of = |k: Kind| levels.iter().position(|l| l.kind == k).map(|i| span[i]);
    let pu_per_core = span_of(Kind::Core).unwrap_or(1);
    let cores = total / pu_per_core;
    let numa_span = span_of(Kind::Numa).unwrap_or(total);
    let nodes = total / numa_span;
    if nodes > MAX_NUMA_NODES {
        return Err(err(format!("{nodes} NUMA nodes; at most {MAX_NUMA_NODES} are supported")));
    }
    let pack_span = span_of(Kind::Pack).unwrap_or(total);
    let die_span = span_of(Kind::Die);

    let mut cpus = Vec::with_capacity(total as usize);
    let mut node_cpus = vec![CpuSet::new(); nodes as usize];
    let mut node_socket = vec![u32::MAX; nodes as usize];
    for leaf in 0..total {
        let core = leaf / pu_per_core;
        let thread = leaf % pu_per_core;
        let id = (thread * cores + core) as u32;
        let socket = (leaf / pack_span) as u32;
        let numa = (leaf / numa_span) as u32;
        // Die within its package.
        let die = die_span.map(|d| ((leaf % pack_span.max(d)) / d) as u32);
        cpus.push(Cpu { id, core: core as u32, socket, die, numa: Some(numa), uncore_cache: None });
        // `total` was checked against the sets' capacity above.
        let _ = node_cpus[numa as usize].insert(id);
        if node_socket[numa as usize] == u32::MAX {
            node_socket[numa as usize] = socket;
        }
    }
    cpus.sort_by_key(|c| c.id);
    let numa_nodes = (0..nodes as usize)
        .map(|i| NumaNode {
            kind: Default::default(),
            id: i as u32,
            cpus: std::mem::take(&mut node_cpus[i]),
            memory_bytes: node_memory,
            distances: (0..nodes as usize)
                .map(|j| {
                    if i == j {
                        10
                    } else if node_socket[i] == node_socket[j] {
                        20
                    } else {
                        32
                    }
                })
                .collect(),
            hugepages: Vec::new(),
        })
        .collect();
    Ok(NodeTopology { cpus, numa_nodes, devices: Vec::new(), reserved_cpus: CpuSet::new(), kernel: Default::default() })
}

/// `1073741824`, `32G`, `32GiB`, `512MB`, `1T` (binary multiples throughout, as hwloc).
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, suffix) = v.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let suffix = suffix.trim_end_matches(['B', 'b']).trim_end_matches('i');
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_machine_numbering() {
        let t = parse("pack:2 numa:1 core:28 pu:2").expect("test input");
        assert_eq!(t.cpus.len(), 112);
        assert_eq!(t.numa_nodes.len(), 2);
        assert_eq!(t.numa_nodes[0].cpus.to_string(), "0-27,56-83");
        assert_eq!(t.numa_nodes[1].cpus.to_string(), "28-55,84-111");
        assert_eq!(t.sockets(), 2);
        assert_eq!(t.cores(), 56);
        // Siblings N and N+56 share a core.
        assert_eq!(t.cpu(3).expect("test input").core, t.cpu(59).expect("test input").core);
        assert_ne!(t.cpu(3).expect("test input").core, t.cpu(4).expect("test input").core);
        assert_eq!(t.numa_nodes[0].distances, vec![10, 32]);
        assert_eq!(t.numa_nodes[0].memory_bytes, 64 << 30);
    }

    #[test]
    fn shapes() {
        // (desc, cpus, nodes, sockets, cores, node0 cpus, distances of node 0)
        let check = |desc: &str, cpus: usize, nodes: usize, sockets: usize, cores: usize, node0: &str, d0: &[u32]| {
            let t = parse(desc).unwrap_or_else(|e| panic!("{desc}: {e}"));
            assert_eq!(t.cpus.len(), cpus, "{desc}");
            assert_eq!(t.numa_nodes.len(), nodes, "{desc}");
            assert_eq!(t.sockets(), sockets, "{desc}");
            assert_eq!(t.cores(), cores, "{desc}");
            assert_eq!(t.numa_nodes[0].cpus.to_string(), node0, "{desc}");
            assert_eq!(t.numa_nodes[0].distances, d0, "{desc}");
        };
        check("core:4", 4, 1, 1, 4, "0-3", &[10]);
        check("pu:4", 4, 1, 1, 4, "0-3", &[10]);
        check("socket:2 core:2 pu:2", 8, 1, 2, 4, "0-7", &[10]);
        check("pack:2 numa:2 core:2 pu:2", 16, 4, 2, 8, "0-1,8-9", &[10, 20, 32, 32]);
        check("Package:1 L3:2 core:3", 6, 1, 1, 6, "0-5", &[10]);
        check("numa:2 pack:2 core:1", 4, 2, 4, 4, "0-1", &[10, 32]);
        check("pack:8 numa:8 core:8 pu:2", 1024, 64, 8, 512, "0-7,512-519", &{
            let mut v = vec![10];
            v.extend([20; 7]);
            v.extend([32; 56]);
            v
        });
    }

    #[test]
    fn memory_attribute() {
        let t = parse("pack:1 numa:2(memory=32GiB) core:2").expect("test input");
        assert!(t.numa_nodes.iter().all(|n| n.memory_bytes == 32 << 30));
        assert_eq!(parse("numa:1(memory=1024) core:1").expect("test input").numa_nodes[0].memory_bytes, 1024);
    }

    #[test]
    fn errors_name_the_word() {
        for (desc, needle) in [
            ("", "empty"),
            ("pack:2 foo:3 core:1", "unknown level \"foo\""),
            ("core:x", "\"x\" is not a positive integer"),
            ("core:0", "at least 1"),
            ("pu:2 core:2", "nothing may follow pu"),
            ("core:2 numa:2", "only pu may follow core"),
            ("pack:2 pack:2 core:1", "appears twice"),
            ("core", "expected LEVEL:COUNT"),
            ("pack:2", "no core or pu"),
            ("numa:2(memory=lots) core:1", "memory \"lots\""),
            ("core:2(foo=1)", "unsupported attribute"),
            ("numa:2(memory=1G core:1", "unclosed"),
            ("pack:100 core:100 pu:2", "at most 8192"),
            ("numa:2000 pu:2", "at most 128"),
        ] {
            let e = parse(desc).expect_err(desc).to_string();
            assert!(e.contains(needle), "{desc}: {e}");
        }
    }
}
