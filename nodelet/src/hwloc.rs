//! hwloc XML (`lstopo --of xml`, the format HPC sites keep of their machines and
//! Flux and Slurm read) -> `NodeTopology`, by the same rules as sysfs discovery.
//!
//! Reads hwloc 2.x XML, and 1.x XML where it costs little (`Socket` and
//! `Cache` objects, NUMA nodes as parents of the CPUs, `distances` with
//! `latency` values). What it takes:
//! - a CPU is a `PU` object (its `os_index`); its core is the nearest `Core`
//!   above it (a PU without one is a core of its own), its socket the nearest
//!   `Package`, its die the nearest `Die`'s `os_index`, its uncore cache group
//!   the nearest `L3Cache` (Die, Group and caches may sit in between); cores,
//!   sockets and L3 groups are numbered 0.. by their lowest CPU id, as sysfs
//!   discovery numbers them;
//! - a NUMA node is a `NUMANode` object (`os_index`, `local_memory`, and
//!   `page_type` sizes above the smallest, the base page, as huge pages); a CPU
//!   belongs to the node whose `cpuset` holds it; distances come from the
//!   `distances2` matrix of NUMA nodes (named `NUMALatency`), indexed by os or
//!   gp index; a single node without a matrix is 10 from itself, as sysfs says;
//! - a PCI device is a `PCIDev` or `Bridge` object with a `pci_busid`; its
//!   class is the `CCSS` of its `pci_type` written as sysfs writes it,
//!   `0xCCSS00` (hwloc keeps no programming interface); its NUMA node is the
//!   nodeset of the nearest non-I/O object above it when that names one node.
//!
//! Every error names the element (with its line) and the attribute; input is
//! bounded (`MAX_XML_BYTES`, `MAX_XML_NODES`, ids up to `specs::limits::MAX_ID`)
//! and the result passes `validate_topology`. No input makes it panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use roxmltree::{Document, Node, ParsingOptions};
use specs::idset::{CpuSet, IdSet, MAX_ID};
use specs::limits::MAX_NUMA_NODES;
use specs::topology::{Cpu, HugePages, NumaNode, PciDevice};
use specs::NodeTopology;

/// Largest XML document read: an 8,192-CPU machine with its caches and PCI
/// tree is a few MiB.
const MAX_XML_BYTES: usize = 64 << 20;
/// Most XML nodes (elements, attributes' text, whitespace) parsed, so that a
/// hostile document cannot make the parser's arena grow past the file size
/// many times over.
const MAX_XML_NODES: u32 = 4_000_000;

#[derive(Debug, thiserror::Error)]
pub enum HwlocError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Any other error, with the file it came from.
    #[error("{path}: {source}")]
    File { path: PathBuf, source: Box<HwlocError> },
    #[error("{bytes} bytes; at most {MAX_XML_BYTES} are read")]
    TooLarge { bytes: u64 },
    #[error("not XML: {0}")]
    Syntax(String),
    /// An element or attribute that does not describe a machine.
    #[error("line {line}: {element}: {reason}")]
    Malformed { line: u32, element: String, reason: String },
    /// Every element parsed but together they describe no machine:
    /// `validate_topology`'s problems.
    #[error("inconsistent topology: {problems}")]
    Inconsistent { problems: String },
}

/// Reads and parses an hwloc XML file.
pub fn read(path: &Path) -> Result<NodeTopology, HwlocError> {
    let io = |source| HwlocError::Io { path: path.to_path_buf(), source };
    let bytes = std::fs::metadata(path).map_err(io)?.len();
    let in_file = |source| HwlocError::File { path: path.to_path_buf(), source: Box::new(source) };
    if bytes > MAX_XML_BYTES as u64 {
        return Err(in_file(HwlocError::TooLarge { bytes }));
    }
    let raw = std::fs::read(path).map_err(io)?;
    let text = String::from_utf8(raw).map_err(|_| in_file(HwlocError::Syntax("not UTF-8 text".into())))?;
    parse(&text).map_err(in_file)
}

/// Parses the text of an hwloc XML export.
pub fn parse(xml: &str) -> Result<NodeTopology, HwlocError> {
    if xml.len() > MAX_XML_BYTES {
        return Err(HwlocError::TooLarge { bytes: xml.len() as u64 });
    }
    // hwloc writes a DOCTYPE naming its DTD file; roxmltree never fetches it,
    // and bounds entity expansion itself.
    let options = ParsingOptions { allow_dtd: true, nodes_limit: MAX_XML_NODES, ..ParsingOptions::default() };
    let doc = Document::parse_with_options(xml, options).map_err(|e| HwlocError::Syntax(e.to_string()))?;
    let root = doc.root_element();
    if root.tag_name().name() != "topology" {
        return Err(bad(root, "the root element must be <topology> (is this lstopo --of xml output?)"));
    }
    if let Some(v) = root.attribute("version") {
        if !v.starts_with("2.") {
            return Err(bad(root, format!("version {v:?}: only hwloc 1.x and 2.x XML is read")));
        }
    }
    let found = walk(root)?;
    build(root, found)
}

// ---------------------------------------------------------------------------
// Errors and attributes

fn bad(node: Node, reason: impl Into<String>) -> HwlocError {
    let line = node.document().text_pos_at(node.range().start).row;
    let mut element = format!("<{}", node.tag_name().name());
    for key in ["type", "os_index", "pci_busid"] {
        if let Some(v) = node.attribute(key) {
            // Bounded: the element is named, not echoed.
            let v: String = v.chars().take(40).collect();
            element.push_str(&format!(" {key}={v:?}"));
        }
    }
    element.push('>');
    HwlocError::Malformed { line, element, reason: reason.into() }
}

fn bad_attr(node: Node, attr: &str, reason: impl std::fmt::Display) -> HwlocError {
    bad(node, format!("attribute {attr}: {reason}"))
}

/// A short, bounded quotation of a bad value.
fn quoted(v: &str) -> String {
    let mut s: String = v.chars().take(40).collect();
    if s.len() < v.len() {
        s.push_str("...");
    }
    format!("{s:?}")
}

fn attr_u64(node: Node, attr: &str) -> Result<Option<u64>, HwlocError> {
    match node.attribute(attr) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| bad_attr(node, attr, format!("{} is not a non-negative integer", quoted(v)))),
    }
}

/// An id attribute: present, and at most `MAX_ID`.
fn attr_id(node: Node, attr: &str) -> Result<u32, HwlocError> {
    let v = attr_u64(node, attr)?.ok_or_else(|| bad_attr(node, attr, "missing"))?;
    if v > u64::from(MAX_ID) {
        return Err(bad_attr(node, attr, format!("{v} is larger than {MAX_ID}")));
    }
    Ok(v as u32)
}

/// An hwloc bitmap attribute: comma-separated 32-bit words, most significant
/// first, each `0x`-prefixed or empty for zero (`0xffffffff,,0x0` is CPUs
/// 64-95); `0xf...f` starts an infinite set, which no machine's CPUs or nodes are.
fn attr_set(node: Node, attr: &str) -> Result<Option<IdSet>, HwlocError> {
    let Some(v) = node.attribute(attr) else { return Ok(None) };
    let mut words = Vec::new();
    for w in v.split(',') {
        let w = w.trim();
        let hex = w.strip_prefix("0x").unwrap_or(w);
        if hex.contains("...") {
            return Err(bad_attr(node, attr, format!("{} is an infinite set", quoted(v))));
        }
        words.push(if hex.is_empty() { "0" } else { hex });
    }
    IdSet::parse_mask(&words.join(",")).map(Some).map_err(|e| bad_attr(node, attr, e))
}

// ---------------------------------------------------------------------------
// The walk: every object with what lies above it

/// The objects above the one being visited that matter to it.
#[derive(Clone, Copy, Default)]
struct Above<'a, 'i> {
    package: Option<Node<'a, 'i>>,
    die: Option<u32>,
    core: Option<Node<'a, 'i>>,
    l3: Option<Node<'a, 'i>>,
    /// The nearest non-I/O object with a nodeset: a PCI device's locality.
    local: Option<Node<'a, 'i>>,
}

struct Pu<'a, 'i> {
    node: Node<'a, 'i>,
    id: u32,
    above: Above<'a, 'i>,
}

struct Numa<'a, 'i> {
    node: Node<'a, 'i>,
    id: u32,
}

struct Pci<'a, 'i> {
    node: Node<'a, 'i>,
    local: Option<Node<'a, 'i>>,
}

#[derive(Default)]
struct Found<'a, 'i> {
    pus: Vec<Pu<'a, 'i>>,
    numa: Vec<Numa<'a, 'i>>,
    pci: Vec<Pci<'a, 'i>>,
    /// The first (outermost) object: the Machine.
    machine: Option<Node<'a, 'i>>,
}

fn is_object(n: &Node) -> bool {
    n.is_element() && n.tag_name().name() == "object"
}

/// Visits every object in document order without recursion (a hostile file
/// may nest deeply).
fn walk<'a, 'i>(root: Node<'a, 'i>) -> Result<Found<'a, 'i>, HwlocError> {
    let mut found = Found::default();
    let mut stack: Vec<(Node, Above)> = root.children().filter(is_object).map(|n| (n, Above::default())).collect();
    stack.reverse();
    while let Some((node, mut above)) = stack.pop() {
        found.machine.get_or_insert(node);
        let kind = node.attribute("type").ok_or_else(|| bad_attr(node, "type", "missing"))?;
        let io = matches!(kind, "Bridge" | "PCIDev" | "OSDev" | "Misc");
        match kind {
            "Package" | "Socket" => above.package = Some(node),
            "Die" => above.die = attr_u64(node, "os_index")?.and_then(|d| u32::try_from(d).ok()),
            "Core" => above.core = Some(node),
            "L3Cache" => above.l3 = Some(node),
            // hwloc 1.x: one Cache type, its level in `depth`, 2 = instruction.
            "Cache" if node.attribute("depth") == Some("3") && node.attribute("cache_type") != Some("2") => {
                above.l3 = Some(node)
            }
            "PU" => found.pus.push(Pu { node, id: attr_id(node, "os_index")?, above }),
            "NUMANode" => found.numa.push(Numa { node, id: attr_id(node, "os_index")? }),
            "PCIDev" | "Bridge" if node.attribute("pci_busid").is_some() => {
                found.pci.push(Pci { node, local: above.local })
            }
            _ => {}
        }
        if !io && node.attribute("nodeset").is_some() {
            above.local = Some(node);
        }
        let first = stack.len();
        stack.extend(node.children().filter(is_object).map(|n| (n, above)));
        stack[first..].reverse();
    }
    Ok(found)
}

// ---------------------------------------------------------------------------
// Building the topology

fn build<'a, 'i>(root: Node<'a, 'i>, mut found: Found<'a, 'i>) -> Result<NodeTopology, HwlocError> {
    found.pus.sort_by_key(|p| p.id);
    for w in found.pus.windows(2) {
        if w[0].id == w[1].id {
            return Err(bad(w[1].node, format!("PU {} appears twice", w[1].id)));
        }
    }
    if found.pus.is_empty() {
        return Err(bad(root, "no PU object (no CPU)"));
    }
    let online = CpuSet::from_ids(found.pus.iter().map(|p| p.id)).map_err(|e| bad(root, e.to_string()))?;

    // NUMA nodes by os index; document order is hwloc 1.x's logical order.
    let logical: Vec<u32> = found.numa.iter().map(|n| n.id).collect();
    found.numa.sort_by_key(|n| n.id);
    for w in found.numa.windows(2) {
        if w[0].id == w[1].id {
            return Err(bad(w[1].node, format!("NUMA node {} appears twice", w[1].id)));
        }
    }
    if found.numa.len() > MAX_NUMA_NODES {
        return Err(bad(root, format!("{} NUMA nodes; at most {MAX_NUMA_NODES}", found.numa.len())));
    }

    let mut numa_of: BTreeMap<u32, u32> = BTreeMap::new();
    let mut nodes: Vec<NumaNode> = Vec::new();
    if found.numa.is_empty() {
        // hwloc 1.x on a machine without NUMA: one node with the machine's memory.
        let memory_bytes = match found.machine {
            Some(m) => attr_u64(m, "local_memory")?.unwrap_or(0),
            None => 0,
        };
        nodes.push(NumaNode { id: 0, memory_bytes, ..NumaNode::default() });
    }
    for n in &found.numa {
        if let Some(cpus) = attr_set(n.node, "cpuset")? {
            for cpu in cpus.intersection(&online).iter() {
                if let Some(other) = numa_of.insert(cpu, n.id) {
                    return Err(bad_attr(n.node, "cpuset", format!("CPU {cpu} is also in NUMA node {other}")));
                }
            }
        }
        nodes.push(NumaNode {
            id: n.id,
            memory_bytes: attr_u64(n.node, "local_memory")?.unwrap_or(0),
            hugepages: huge_pages(n.node)?,
            ..NumaNode::default()
        });
    }
    // As sysfs discovery: a CPU no node claims is in no node, unless no node
    // claims any (one implicit node).
    if numa_of.is_empty() {
        let first = nodes.first().map(|n| n.id).unwrap_or(0);
        numa_of.extend(found.pus.iter().map(|p| (p.id, first)));
    }
    for p in found.pus.iter().filter(|p| !numa_of.contains_key(&p.id)) {
        tracing::warn!(cpu = p.id, "CPU is in no NUMA node's cpuset: in no node, never in an aligned placement");
    }
    for n in &mut nodes {
        n.cpus = online.filter(|id| numa_of.get(&id) == Some(&n.id));
        n.kind = crate::discovery::numa_kind(&n.cpus, n.memory_bytes);
    }
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    match distances(root, &found, &ids, &logical)? {
        Some(rows) => {
            for (n, row) in nodes.iter_mut().zip(rows) {
                n.distances = row;
            }
        }
        // A lone node is 10 from itself, as its sysfs `distance` file says;
        // hwloc writes no matrix for one node.
        None if nodes.len() == 1 => nodes[0].distances = vec![10],
        None => {}
    }

    // Cores, sockets and L3 groups keyed by the object's position in the
    // document, numbered by lowest CPU id (the PUs are sorted by id).
    fn number(keys: &mut BTreeMap<usize, u32>, key: usize) -> u32 {
        let n = keys.len() as u32;
        *keys.entry(key).or_insert(n)
    }
    let (mut cores, mut sockets, mut l3s) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let cpus: Vec<Cpu> = found
        .pus
        .iter()
        .map(|p| Cpu {
            id: p.id,
            // A PU without a Core is a core of its own; without a Package, all
            // such PUs are one socket (position 0 is the XML declaration's).
            core: number(&mut cores, p.above.core.unwrap_or(p.node).range().start),
            socket: number(&mut sockets, p.above.package.map(|n| n.range().start).unwrap_or(0)),
            die: p.above.die,
            numa: numa_of.get(&p.id).copied(),
            uncore_cache: p.above.l3.map(|n| number(&mut l3s, n.range().start)),
        })
        .collect();

    let mut devices = Vec::with_capacity(found.pci.len());
    for d in &found.pci {
        devices.push(pci_device(d, &ids)?);
    }
    devices.sort_by(|a, b| a.address.cmp(&b.address));

    let topology =
        NodeTopology { cpus, numa_nodes: nodes, devices, reserved_cpus: CpuSet::new(), kernel: Default::default() };
    let problems = specs::validate::validate_topology(&topology);
    if !problems.is_empty() {
        let problems = problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        return Err(HwlocError::Inconsistent { problems });
    }
    Ok(topology)
}

/// A node's `page_type` children above its smallest size (the base page, which
/// holds the rest of its memory), sorted by size; sizes with zero pages kept,
/// as sysfs discovery keeps them.
fn huge_pages(node: Node) -> Result<Vec<HugePages>, HwlocError> {
    let mut pages = Vec::new();
    for p in node.children().filter(|c| c.is_element() && c.tag_name().name() == "page_type") {
        let size = attr_u64(p, "size")?.ok_or_else(|| bad_attr(p, "size", "missing"))?;
        let count = attr_u64(p, "count")?.unwrap_or(0);
        pages.push(HugePages { page_size_bytes: size, total: count });
    }
    pages.sort_by_key(|h| h.page_size_bytes);
    if !pages.is_empty() {
        pages.remove(0);
    }
    Ok(pages)
}

/// The distance rows of `ids` (sorted os indexes), from the first NUMA latency
/// matrix: hwloc 2.x's `distances2`, or 1.x's `distances` in logical order.
fn distances(root: Node, found: &Found, ids: &[u32], logical: &[u32]) -> Result<Option<Vec<Vec<u32>>>, HwlocError> {
    let elements = |name: &'static str| move |n: &Node| -> bool { n.is_element() && n.tag_name().name() == name };
    let matrix = root
        .children()
        .filter(elements("distances2"))
        .find(|d| d.attribute("type") == Some("NUMANode") && d.attribute("name").is_none_or(|n| n == "NUMALatency"));
    if let Some(d) = matrix {
        let count = attr_u64(d, "nbobjs")?.ok_or_else(|| bad_attr(d, "nbobjs", "missing"))?;
        if count > MAX_NUMA_NODES as u64 {
            return Err(bad_attr(d, "nbobjs", format!("{count} objects; at most {MAX_NUMA_NODES}")));
        }
        let count = count as usize;
        let numbers = |tag: &'static str| -> Result<Vec<u64>, HwlocError> {
            let mut out = Vec::new();
            for part in d.children().filter(elements(tag)) {
                for w in part.text().unwrap_or("").split_whitespace() {
                    if out.len() >= count * count {
                        return Err(bad(part, format!("more than {} values", count * count)));
                    }
                    out.push(w.parse().map_err(|_| bad(part, format!("{} is not a number", quoted(w))))?);
                }
            }
            Ok(out)
        };
        let indexes = numbers("indexes")?;
        let values = numbers("u64values")?;
        if indexes.len() != count || values.len() != count * count {
            return Err(bad(d, format!("{} indexes and {} values for {count} objects", indexes.len(), values.len())));
        }
        // Which node each index names: os indexes, or the nodes' gp_index.
        let by_index: Vec<u32> = match d.attribute("indexing") {
            None | Some("os") => indexes.iter().map(|&i| u32::try_from(i).unwrap_or(u32::MAX)).collect(),
            Some("gp") => {
                let mut gp = BTreeMap::new();
                for n in &found.numa {
                    if let Some(g) = attr_u64(n.node, "gp_index")? {
                        gp.insert(g, n.id);
                    }
                }
                indexes.iter().map(|i| gp.get(i).copied().unwrap_or(u32::MAX)).collect()
            }
            Some(other) => return Err(bad_attr(d, "indexing", format!("{} is neither os nor gp", quoted(other)))),
        };
        return rows(d, ids, &by_index, |i, j| values[i * count + j]).map(Some);
    }
    // hwloc 1.x: a matrix under the Machine object, values relative to a base.
    let Some(machine) = found.machine else { return Ok(None) };
    let Some(d) = machine
        .children()
        .filter(elements("distances"))
        .find(|d| d.attribute("nbobjs").and_then(|n| n.parse::<usize>().ok()) == Some(logical.len()))
    else {
        return Ok(None);
    };
    let base = match d.attribute("latency_base") {
        None => 1.0,
        Some(b) => b.trim().parse::<f64>().map_err(|_| bad_attr(d, "latency_base", "not a number"))?,
    };
    let count = logical.len();
    let mut values = Vec::with_capacity(count * count);
    for l in d.children().filter(elements("latency")) {
        if values.len() >= count * count {
            return Err(bad(l, format!("more than {} latencies", count * count)));
        }
        let v = l.attribute("value").unwrap_or("");
        let v = v.trim().parse::<f64>().map_err(|_| bad_attr(l, "value", format!("{} is not a number", quoted(v))))?;
        let distance = (v * base).round();
        if !(0.0..=f64::from(u32::MAX)).contains(&distance) {
            return Err(bad_attr(l, "value", format!("{v} x {base} is not a distance")));
        }
        values.push(distance as u64);
    }
    if values.len() != count * count {
        return Err(bad(d, format!("{} latencies for {count} NUMA nodes", values.len())));
    }
    rows(d, ids, logical, |i, j| values[i * count + j]).map(Some)
}

/// Row `i` of the result is node `ids[i]`'s distances to every node of `ids`,
/// read from a matrix whose positions name the nodes `order`.
fn rows(d: Node, ids: &[u32], order: &[u32], value: impl Fn(usize, usize) -> u64) -> Result<Vec<Vec<u32>>, HwlocError> {
    let position = |id: u32| {
        order.iter().position(|&o| o == id).ok_or_else(|| bad(d, format!("NUMA node {id} is not in the matrix")))
    };
    let positions: Vec<usize> = ids.iter().map(|&id| position(id)).collect::<Result<_, _>>()?;
    positions
        .iter()
        .map(|&i| {
            positions
                .iter()
                .map(|&j| {
                    u32::try_from(value(i, j)).map_err(|_| bad(d, format!("distance {} is too large", value(i, j))))
                })
                .collect()
        })
        .collect()
}

fn pci_device(d: &Pci, numa_ids: &[u32]) -> Result<PciDevice, HwlocError> {
    let address = d.node.attribute("pci_busid").unwrap_or_default().to_string();
    if address.is_empty() || address.len() > 32 {
        return Err(bad_attr(d.node, "pci_busid", format!("{} is not a PCI address", quoted(&address))));
    }
    // `CCSS [VVVV:DDDD] [SSSS:SSSS] RR`: the class and subclass come first.
    let class = match d.node.attribute("pci_type") {
        None => String::new(),
        Some(t) => {
            let word = t.split_whitespace().next().unwrap_or("");
            let code = (word.len() == 4).then(|| u16::from_str_radix(word, 16).ok()).flatten().ok_or_else(|| {
                bad_attr(d.node, "pci_type", format!("{} does not start with a 4-digit class", quoted(t)))
            })?;
            format!("0x{code:04x}00")
        }
    };
    let numa = match d.local {
        None => None,
        Some(local) => {
            let set = attr_set(local, "nodeset")?.unwrap_or_default();
            match (set.len(), set.first()) {
                (1, Some(n)) if numa_ids.contains(&n) => Some(n),
                _ => None,
            }
        }
    };
    Ok(PciDevice { address, class, numa, ..PciDevice::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::topology::NumaKind;

    /// lstopo's XML of the 2-socket Intel fixture (see e2e/fixtures/hwloc/README.md).
    const INTEL: &str = include_str!("../../e2e/fixtures/hwloc/32intel64-2p8co2t+8ve.xml");

    #[test]
    fn the_intel_fixture() {
        let t = parse(INTEL).expect("parse");
        assert_eq!((t.sockets(), t.numa_nodes.len(), t.cores(), t.cpus.len()), (2, 2, 16, 32));
        for n in 0..16 {
            let (a, b) = (t.cpu(n).expect("cpu"), t.cpu(n + 16).expect("cpu"));
            assert_eq!(a.core, b.core, "HT siblings {n} and {}", n + 16);
            assert_eq!(a.uncore_cache, Some(a.socket), "one L3 per socket");
        }
        assert_eq!(t.numa_nodes[0].cpus.to_string(), "0-7,16-23");
        assert_eq!(t.numa_nodes[0].memory_bytes, 49_075_843_072);
        assert_eq!(t.numa_nodes[1].distances, vec![21, 10]);
        assert_eq!(
            t.numa_nodes[1].hugepages,
            vec![HugePages { page_size_bytes: 2 << 20, total: 2048 }, HugePages { page_size_bytes: 1 << 30, total: 0 }]
        );
        assert!(t.numa_nodes.iter().all(|n| n.kind == NumaKind::CpusAndMemory));
        assert_eq!(t.devices.len(), 28);
        assert!(t.devices.iter().all(|d| d.numa == Some(0)));
        let nic = t.devices.iter().find(|d| d.address == "0000:60:00.0").expect("the NIC");
        assert_eq!(nic.class, "0x020000");
        let bridge = t.devices.iter().find(|d| d.address == "0000:17:00.0").expect("a bridge");
        assert_eq!(bridge.class, "0x060400");
    }

    /// A machine in hwloc 2.x's words: `objects` inside the Machine, then `tail`
    /// (distances) after it.
    fn machine(objects: &str, tail: &str) -> String {
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" nodeset="0x00000003">
{objects}
  </object>
{tail}
</topology>"#
        )
    }

    /// Two packages of one two-thread core each, one node per package, and
    /// a memory-only node 2 (HBM, say) on the Machine.
    fn two_packages(pci: &str) -> String {
        machine(
            &format!(
                r#"    <object type="Package" os_index="0" cpuset="0x3" nodeset="0x1">
      <object type="NUMANode" os_index="0" cpuset="0x3" nodeset="0x1" local_memory="1073741824">
        <page_type size="4096" count="262144"/>
        <page_type size="2097152" count="4"/>
      </object>
      <object type="L3Cache" cpuset="0x3" cache_size="1" depth="3" cache_type="0">
        <object type="Core" os_index="0" cpuset="0x3">
          <object type="PU" os_index="0" cpuset="0x1"/>
          <object type="PU" os_index="1" cpuset="0x2"/>
        </object>
      </object>
      {pci}
    </object>
    <object type="Package" os_index="1" cpuset="0xc" nodeset="0x2">
      <object type="NUMANode" os_index="1" cpuset="0xc" nodeset="0x2" local_memory="2147483648"/>
      <object type="Die" os_index="7" cpuset="0xc" nodeset="0x2">
        <object type="Core" os_index="0" cpuset="0xc">
          <object type="PU" os_index="2" cpuset="0x4"/>
          <object type="PU" os_index="3" cpuset="0x8"/>
        </object>
      </object>
    </object>
    <object type="NUMANode" os_index="2" cpuset="0x0" nodeset="0x4" local_memory="4294967296"/>"#
            ),
            r#"  <distances2 type="NUMANode" nbobjs="3" kind="5" name="NUMALatency" indexing="os">
    <indexes length="6">2 0 1</indexes>
    <u64values length="9">10 20 30 </u64values>
    <u64values length="9">20 10 21 30 21 10</u64values>
  </distances2>"#,
        )
    }

    #[test]
    fn a_small_machine_with_a_memory_only_node() {
        let t = parse(&two_packages(
            r#"<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[00-01]">
                 <object type="PCIDev" pci_busid="0000:00:1f.2" pci_type="0106 [8086:8d02] [15d9:0832] 05"/>
               </object>"#,
        ))
        .expect("parse");
        // (id, core, socket, die, numa, uncore cache)
        type Row = (u32, u32, u32, Option<u32>, Option<u32>, Option<u32>);
        let cpus: Vec<Row> = t.cpus.iter().map(|c| (c.id, c.core, c.socket, c.die, c.numa, c.uncore_cache)).collect();
        assert_eq!(
            cpus,
            vec![
                (0, 0, 0, None, Some(0), Some(0)),
                (1, 0, 0, None, Some(0), Some(0)),
                (2, 1, 1, Some(7), Some(1), None),
                (3, 1, 1, Some(7), Some(1), None)
            ]
        );
        let nodes: Vec<(u32, NumaKind, String, u64, Vec<u32>)> = t
            .numa_nodes
            .iter()
            .map(|n| (n.id, n.kind, n.cpus.to_string(), n.memory_bytes, n.distances.clone()))
            .collect();
        // The matrix lists node 2 first (os indexing): rows are read by id.
        assert_eq!(
            nodes,
            vec![
                (0, NumaKind::CpusAndMemory, "0-1".into(), 1 << 30, vec![10, 21, 20]),
                (1, NumaKind::CpusAndMemory, "2-3".into(), 2 << 30, vec![21, 10, 30]),
                (2, NumaKind::MemoryOnly, String::new(), 4 << 30, vec![20, 30, 10]),
            ]
        );
        assert_eq!(t.numa_nodes[0].hugepages, vec![HugePages { page_size_bytes: 2 << 20, total: 4 }]);
        assert_eq!(
            t.devices,
            vec![PciDevice {
                address: "0000:00:1f.2".into(),
                class: "0x010600".into(),
                numa: Some(0),
                ..PciDevice::default()
            }]
        );
    }

    #[test]
    fn pci_locality_is_one_node_or_none() {
        // (where the device hangs, its node)
        let cases: &[(&str, Option<u32>)] = &[
            // Under package 0, whose nodeset is node 0.
            ("package", Some(0)),
            // Under the Machine (nodes 0 and 1): no one node.
            ("machine", None),
        ];
        for (place, want) in cases {
            let dev = r#"<object type="PCIDev" pci_busid="0000:03:00.0" pci_type="0200 [8086:1521] [0000:0000] 01"/>"#;
            let xml = match *place {
                "package" => two_packages(dev),
                _ => two_packages("").replace(
                    "<object type=\"Package\" os_index=\"1\"",
                    &format!("{dev}<object type=\"Package\" os_index=\"1\""),
                ),
            };
            let t = parse(&xml).unwrap_or_else(|e| panic!("{place}: {e}"));
            assert_eq!(t.devices.first().map(|d| d.numa), Some(*want), "{place}");
        }
    }

    #[test]
    fn gp_indexed_distances_and_a_lone_node() {
        let gp = machine(
            r#"<object type="NUMANode" os_index="0" cpuset="0x1" gp_index="7" local_memory="4096"/>
               <object type="NUMANode" os_index="1" cpuset="0x2" gp_index="9" local_memory="4096"/>
               <object type="Core" cpuset="0x1"><object type="PU" os_index="0"/></object>
               <object type="Core" cpuset="0x2"><object type="PU" os_index="1"/></object>"#,
            r#"<distances2 type="NUMANode" nbobjs="2" name="NUMALatency" indexing="gp">
                 <indexes length="3">9 7</indexes><u64values length="11">10 15 15 10</u64values>
               </distances2>"#,
        );
        let t = parse(&gp).expect("parse");
        assert_eq!(t.numa_nodes[0].distances, vec![10, 15]);
        assert_eq!(t.sockets(), 1, "PUs without a Package are one socket");
        let lone = machine(
            r#"<object type="NUMANode" os_index="0" cpuset="0x1" local_memory="4096"/>
               <object type="PU" os_index="0"/>"#,
            "",
        );
        assert_eq!(parse(&lone).expect("parse").numa_nodes[0].distances, vec![10], "10 from itself");
    }

    /// hwloc 1.x: NUMA nodes above the packages, `Socket`, `Cache` with a
    /// depth, a `distances` matrix of relative latencies under the Machine.
    #[test]
    fn hwloc_1x_xml() {
        let v1 = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc.dtd">
<topology>
  <object type="Machine" os_index="0" cpuset="0x00000003" nodeset="0x00000003">
    <distances nbobjs="2" relative_depth="1" latency_base="10.000000">
      <latency value="1.000000"/><latency value="2.100000"/>
      <latency value="2.100000"/><latency value="1.000000"/>
    </distances>
    <object type="NUMANode" os_index="1" cpuset="0x00000002" nodeset="0x00000002" local_memory="8192">
      <object type="Socket" os_index="1" cpuset="0x00000002">
        <object type="Cache" cpuset="0x00000002" cache_size="1" depth="3" cache_type="0">
          <object type="Core" os_index="0" cpuset="0x00000002"><object type="PU" os_index="1"/></object>
        </object>
      </object>
    </object>
    <object type="NUMANode" os_index="0" cpuset="0x00000001" nodeset="0x00000001" local_memory="4096">
      <object type="Socket" os_index="0" cpuset="0x00000001">
        <object type="Cache" cpuset="0x00000001" cache_size="1" depth="2" cache_type="0">
          <object type="Core" os_index="0" cpuset="0x00000001"><object type="PU" os_index="0"/></object>
        </object>
      </object>
    </object>
  </object>
</topology>"#;
        let t = parse(v1).expect("parse");
        // (id, core, socket, numa, uncore cache)
        type Row = (u32, u32, u32, Option<u32>, Option<u32>);
        let cpus: Vec<Row> = t.cpus.iter().map(|c| (c.id, c.core, c.socket, c.numa, c.uncore_cache)).collect();
        assert_eq!(cpus, vec![(0, 0, 0, Some(0), None), (1, 1, 1, Some(1), Some(0))]);
        // The matrix is in document (logical) order: node 1 first.
        assert_eq!(t.numa_nodes[0].distances, vec![10, 21]);
        assert_eq!((t.numa_nodes[0].memory_bytes, t.numa_nodes[1].memory_bytes), (4096, 8192));
    }

    #[test]
    fn bad_input_names_the_element_and_the_reason() {
        let pu = |attrs: &str| machine(&format!(r#"<object type="PU" {attrs}/>"#), "");
        let node = |cpuset: &str| {
            machine(
                &format!(
                    r#"<object type="NUMANode" os_index="0" cpuset="{cpuset}" local_memory="1"/>
                       <object type="NUMANode" os_index="1" cpuset="0x1" local_memory="1"/>
                       <object type="PU" os_index="0"/>"#
                ),
                "",
            )
        };
        let two_nodes = |tail: &str| {
            machine(
                r#"<object type="NUMANode" os_index="0" cpuset="0x1" local_memory="1"/>
                   <object type="NUMANode" os_index="1" cpuset="0x0" local_memory="1"/>
                   <object type="PU" os_index="0"/>"#,
                tail,
            )
        };
        let matrix = |indexes: &str, values: &str| {
            two_nodes(&format!(
                r#"<distances2 type="NUMANode" nbobjs="2" indexing="os"><indexes>{indexes}</indexes><u64values>{values}</u64values></distances2>"#
            ))
        };
        let pci = |attrs: &str| two_packages(&format!(r#"<object type="PCIDev" {attrs}/>"#));
        // (input, words the error must hold)
        let cases: Vec<(String, &str)> = vec![
            ("".into(), "not XML"),
            ("<topology><object".into(), "not XML"),
            ("<machine/>".into(), "root element must be <topology>"),
            (r#"<topology version="3.0"/>"#.into(), "version \"3.0\""),
            ("<topology/>".into(), "no PU object"),
            (machine(r#"<object os_index="1"/>"#, ""), "attribute type: missing"),
            (pu(""), r#"<object type="PU">: attribute os_index: missing"#),
            (pu(r#"os_index="one""#), "\"one\" is not a non-negative integer"),
            (pu(r#"os_index="-1""#), "\"-1\" is not a non-negative integer"),
            (pu(r#"os_index="8192""#), "8192 is larger than 8191"),
            (pu(r#"os_index="99999999999999999999999""#), "is not a non-negative integer"),
            (machine(r#"<object type="PU" os_index="3"/><object type="PU" os_index="3"/>"#, ""), "PU 3 appears twice"),
            (node("0xzz"), "attribute cpuset: invalid"),
            (node("0xf...f"), "infinite set"),
            (node("0x1"), "CPU 0 is also in NUMA node 0"),
            (node(&format!("0x1{}", ",".repeat(256))), "bit 8192 is larger than 8191"),
            (
                machine(
                    r#"<object type="NUMANode" os_index="0" local_memory="lots"/><object type="PU" os_index="0"/>"#,
                    "",
                ),
                "attribute local_memory: \"lots\"",
            ),
            (
                machine(
                    r#"<object type="NUMANode" os_index="0"><page_type count="1"/></object><object type="PU" os_index="0"/>"#,
                    "",
                ),
                "<page_type>: attribute size: missing",
            ),
            (
                machine(
                    r#"<object type="NUMANode" os_index="0"><page_type size="4096"/><page_type size="3000000" count="1"/></object><object type="PU" os_index="0"/>"#,
                    "",
                ),
                "inconsistent topology: numaNodes[0].hugepages[0].pageSizeBytes",
            ),
            (matrix("0 1", "10 20 20"), "2 indexes and 3 values for 2 objects"),
            (matrix("0 1", "10 20 20 10 5"), "more than 4 values"),
            (matrix("0 5", "10 20 20 10"), "NUMA node 1 is not in the matrix"),
            (matrix("0 1", "10 x 20 10"), "\"x\" is not a number"),
            (matrix("0 1", "10 99999999999 20 10"), "distance 99999999999 is too large"),
            (
                two_nodes(
                    r#"<distances2 type="NUMANode" nbobjs="2" indexing="logical"><indexes>0 1</indexes><u64values>10 20 20 10</u64values></distances2>"#,
                ),
                "attribute indexing: \"logical\" is neither os nor gp",
            ),
            (two_nodes(r#"<distances2 type="NUMANode" nbobjs="100000"/>"#), "100000 objects; at most 128"),
            (pci(r#"pci_busid="0000:01:00.0" pci_type="net""#), "\"net\" does not start with a 4-digit class"),
            (pci(r#"pci_busid="" pci_type="0200""#), "\"\" is not a PCI address"),
            (pci(r#"pci_busid="0000:01:00.0""#).replace("</topology>", ""), "not XML"),
        ];
        for (xml, words) in &cases {
            match parse(xml) {
                Ok(_) => panic!("{words}: accepted\n{xml}"),
                Err(e) => assert!(e.to_string().contains(words), "error {e:?} lacks {words:?}"),
            }
        }
        // The line of the element is named.
        let e = parse(&pu(r#"os_index="one""#)).expect_err("bad id").to_string();
        assert!(e.starts_with("line 5: "), "{e}");
    }

    #[test]
    fn read_names_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("machine.xml");
        std::fs::write(&path, "<topology/>").expect("write");
        let e = read(&path).expect_err("no PU").to_string();
        assert!(e.starts_with(&format!("{}: line 1: <topology>: no PU object", path.display())), "{e}");
        let e = read(&dir.path().join("absent.xml")).expect_err("absent").to_string();
        assert!(e.contains("absent.xml") && e.contains("No such file"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

        /// No input makes the parser panic, and what it accepts is a valid machine:
        /// the Intel fixture with a slice cut out, replaced by arbitrary text.
        #[test]
        fn mangled_fixture_never_panics(at in 0..INTEL.len(), len in 0usize..400, junk in ".{0,20}") {
            let (at, end) = (floor(INTEL, at), floor(INTEL, (at + len).min(INTEL.len())));
            let xml = format!("{}{junk}{}", &INTEL[..at], &INTEL[end..]);
            if let Ok(t) = parse(&xml) {
                proptest::prop_assert!(specs::validate::validate_topology(&t).is_empty());
            }
        }

        #[test]
        fn arbitrary_text_never_panics(xml in "(<[a-z/]{0,12}( [a-z_]{1,9}=\"[0-9a-fx,.]{0,12}\")*>|[ 0-9a-z]{0,5}){0,40}") {
            let _ = parse(&xml);
        }
    }

    /// The largest char boundary at or below `i`.
    fn floor(s: &str, mut i: usize) -> usize {
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}
