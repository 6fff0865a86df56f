//! The cluster's pod network as plain data: the cluster range the servers
//! hand node ranges out of (`--pod-cidr`), the size of each node's range
//! (`--node-cidr-mask-size`), and the choice of a new node's range among
//! those other nodes hold (`PodRanges::next_free`), as Kubernetes' node IPAM
//! gives each node its `spec.podCIDR`. IPv4 only.
//!
//! `Ipv4Net` is the `ipnet` crate's, re-exported so that the crates above
//! share one type for a range.

use std::net::Ipv4Addr;

pub use ipnet::Ipv4Net;

/// Why a cluster range and node range size do not go together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodRangesError {
    #[error("cluster range {given:?}: {reason}")]
    Cluster { given: String, reason: String },
    #[error("node range size /{prefix}: {reason}")]
    NodePrefix { prefix: u8, reason: String },
}

/// The default cluster range: one that common ranges (Docker's 172.17/16,
/// Kubernetes' 10.96/12 and 10.244/16, podman's 10.88/16, home 192.168/16)
/// leave alone.
pub const DEFAULT_CLUSTER_RANGE: &str = "10.213.0.0/16";
/// The default size of a node's range: a /24, 254 addresses (Kubernetes' too).
pub const DEFAULT_NODE_PREFIX: u8 = 24;
/// The longest node range: a /30 holds the network address, the bridge's
/// gateway, one pod and the broadcast address; a /31 or /32 holds no pod.
pub const LONGEST_NODE_PREFIX: u8 = 30;

/// A cluster range cut into node ranges of one size: `cluster` is a network
/// address (no host bits) and `node_prefix` is between its prefix and
/// `LONGEST_NODE_PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodRanges {
    cluster: Ipv4Net,
    node_prefix: u8,
}

impl Default for PodRanges {
    fn default() -> Self {
        PodRanges::parse(DEFAULT_CLUSTER_RANGE, DEFAULT_NODE_PREFIX).expect("the default pod ranges are valid")
    }
}

impl PodRanges {
    pub fn new(cluster: Ipv4Net, node_prefix: u8) -> Result<PodRanges, PodRangesError> {
        if cluster.addr() != cluster.network() {
            return Err(PodRangesError::Cluster {
                given: cluster.to_string(),
                reason: format!("has host bits set: the range is {}", cluster.trunc()),
            });
        }
        let bad = |reason: String| Err(PodRangesError::NodePrefix { prefix: node_prefix, reason });
        if node_prefix < cluster.prefix_len() {
            return bad(format!("is larger than the cluster range {cluster}"));
        }
        if node_prefix > LONGEST_NODE_PREFIX {
            return bad(format!("leaves no address for a pod (at most /{LONGEST_NODE_PREFIX})"));
        }
        Ok(PodRanges { cluster, node_prefix })
    }

    /// `A.B.C.D/N` and a node range size. An IPv6 range is refused by name.
    pub fn parse(cluster: &str, node_prefix: u8) -> Result<PodRanges, PodRangesError> {
        let bad = |reason: &str| PodRangesError::Cluster { given: cluster.to_string(), reason: reason.to_string() };
        let net: Ipv4Net = match cluster.parse() {
            Ok(n) => n,
            Err(_) if cluster.parse::<ipnet::Ipv6Net>().is_ok() => {
                return Err(bad("IPv6 pod ranges are not supported; give an IPv4 range"))
            }
            Err(_) => return Err(bad("want an IPv4 range A.B.C.D/N")),
        };
        PodRanges::new(net, node_prefix)
    }

    pub fn cluster(&self) -> Ipv4Net {
        self.cluster
    }

    pub fn node_prefix(&self) -> u8 {
        self.node_prefix
    }

    /// How many node ranges the cluster range holds.
    pub fn count(&self) -> u64 {
        1u64 << (self.node_prefix - self.cluster.prefix_len())
    }

    /// Whether `range` is one of this cluster's node ranges: inside the
    /// cluster range, of the node size, and a network address.
    pub fn holds(&self, range: Ipv4Net) -> bool {
        range.prefix_len() == self.node_prefix && range.addr() == range.network() && self.cluster.contains(&range)
    }

    /// The lowest node range that overlaps none of `taken`, if any is left.
    /// A taken range of another size or outside the cluster (one handed out
    /// under other flags) keeps every node range it overlaps taken.
    pub fn next_free(&self, taken: &[Ipv4Net]) -> Option<Ipv4Net> {
        let size = 1u64 << (32 - self.node_prefix);
        let start = u64::from(u32::from(self.cluster.network()));
        let end = start + self.count() * size; // exclusive
        let mut spans: Vec<(u64, u64)> = taken
            .iter()
            .map(|t| {
                let first = u64::from(u32::from(t.network()));
                (first, first + (1u64 << (32 - t.prefix_len())))
            })
            .collect();
        spans.sort_unstable();
        // Sweep the taken spans in order; each one either lies past the
        // candidate (which is then free) or moves the candidate past itself,
        // so this takes at most one step per span.
        let mut candidate = start;
        for (first, past) in spans {
            if candidate + size <= first {
                break;
            }
            if past > candidate {
                candidate = start + (past - start).div_ceil(size) * size;
            }
        }
        if candidate + size > end {
            return None;
        }
        let addr = Ipv4Addr::from(u32::try_from(candidate).ok()?);
        Ipv4Net::new(addr, self.node_prefix).ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    fn check(cluster: &str, node_prefix: u8, taken: &[&str], expected: Option<&str>) {
        let ranges = PodRanges::parse(cluster, node_prefix).unwrap();
        let taken: Vec<Ipv4Net> = taken.iter().map(|t| t.parse().unwrap()).collect();
        let got = ranges.next_free(&taken).map(|n| n.to_string());
        assert_eq!(got.as_deref(), expected, "{cluster} /{node_prefix} with {taken:?} taken");
        if let Some(got) = ranges.next_free(&taken) {
            assert!(ranges.holds(got), "{got} is a node range of {cluster}");
        }
    }

    #[test]
    fn the_lowest_free_node_range_is_chosen() {
        check("10.213.0.0/16", 24, &[], Some("10.213.0.0/24"));
        check("10.213.0.0/16", 24, &["10.213.0.0/24"], Some("10.213.1.0/24"));
        // A released range is the next one handed out.
        check("10.213.0.0/16", 24, &["10.213.0.0/24", "10.213.2.0/24"], Some("10.213.1.0/24"));
        check("10.213.0.0/16", 24, &["10.213.2.0/24", "10.213.0.0/24", "10.213.1.0/24"], Some("10.213.3.0/24"));
        // Duplicates (two nodes' records naming one range) change nothing.
        check("10.213.0.0/16", 24, &["10.213.0.0/24", "10.213.0.0/24"], Some("10.213.1.0/24"));
        check("10.213.4.0/22", 24, &["10.213.4.0/24"], Some("10.213.5.0/24"));
        check("10.213.0.0/16", 26, &["10.213.0.0/26"], Some("10.213.0.64/26"));
        check("10.0.0.0/8", 16, &["10.0.0.0/16"], Some("10.1.0.0/16"));
    }

    #[test]
    fn ranges_of_other_sizes_keep_what_they_overlap() {
        // A /23 from earlier flags holds two /24s; a /25 holds its /24.
        check("10.213.0.0/16", 24, &["10.213.0.0/23"], Some("10.213.2.0/24"));
        check("10.213.0.0/16", 24, &["10.213.0.128/25"], Some("10.213.1.0/24"));
        check("10.213.0.0/16", 24, &["10.213.0.0/25", "10.213.0.128/25"], Some("10.213.1.0/24"));
        // Ranges outside the cluster, before or after it, change nothing.
        check("10.213.0.0/16", 24, &["10.212.255.0/24", "10.214.0.0/24"], Some("10.213.0.0/24"));
        // A range that holds the whole cluster range leaves nothing.
        check("10.213.0.0/16", 24, &["10.0.0.0/8"], None);
        check("10.213.0.0/16", 24, &["10.212.0.0/15"], None);
    }

    #[test]
    fn a_full_cluster_range_has_no_free_node_range() {
        check("10.213.0.0/28", 30, &["10.213.0.0/30", "10.213.0.4/30", "10.213.0.8/30", "10.213.0.12/30"], None);
        check("10.213.0.0/28", 30, &["10.213.0.0/30", "10.213.0.4/30", "10.213.0.12/30"], Some("10.213.0.8/30"));
        check("10.213.0.0/24", 24, &["10.213.0.0/24"], None);
        check("10.213.0.0/24", 24, &[], Some("10.213.0.0/24"));
        // The top of the address space: no overflow.
        check("255.255.255.0/24", 26, &["255.255.255.0/25", "255.255.255.128/26"], Some("255.255.255.192/26"));
        check("255.255.255.0/24", 26, &["255.255.255.0/24"], None);
        check("0.0.0.0/0", 30, &["0.0.0.0/1"], Some("128.0.0.0/30"));
    }

    #[test]
    fn a_node_range_is_inside_the_cluster_range_and_of_its_size() {
        let r = PodRanges::default();
        assert_eq!((r.cluster().to_string(), r.node_prefix(), r.count()), ("10.213.0.0/16".into(), 24, 256));
        for (range, held) in [
            ("10.213.7.0/24", true),
            ("10.213.255.0/24", true),
            ("10.213.7.0/25", false),
            ("10.213.7.1/24", false),
            ("10.214.0.0/24", false),
            ("10.213.0.0/16", false),
        ] {
            assert_eq!(r.holds(range.parse().unwrap()), held, "{range}");
        }
    }

    #[test]
    fn bad_cluster_ranges_and_sizes_are_refused_with_their_reason() {
        let cluster =
            |given: &str, reason: &str| Err(PodRangesError::Cluster { given: given.into(), reason: reason.into() });
        let prefix = |prefix: u8, reason: &str| Err(PodRangesError::NodePrefix { prefix, reason: reason.into() });
        let cases: [(&str, u8, Result<(), PodRangesError>); 7] = [
            ("10.213.0.0/16", 24, Ok(())),
            ("10.213.0.5/16", 24, cluster("10.213.0.5/16", "has host bits set: the range is 10.213.0.0/16")),
            ("fd00::/64", 80, cluster("fd00::/64", "IPv6 pod ranges are not supported; give an IPv4 range")),
            ("10.213.0.0", 24, cluster("10.213.0.0", "want an IPv4 range A.B.C.D/N")),
            ("10.213.0.0/33", 24, cluster("10.213.0.0/33", "want an IPv4 range A.B.C.D/N")),
            ("10.213.0.0/16", 15, prefix(15, "is larger than the cluster range 10.213.0.0/16")),
            ("10.213.0.0/16", 31, prefix(31, "leaves no address for a pod (at most /30)")),
        ];
        for (given, node_prefix, want) in cases {
            assert_eq!(PodRanges::parse(given, node_prefix).map(|_| ()), want, "{given} /{node_prefix}");
        }
    }
}
