//! Table tests of memory-only NUMA nodes (`spec.topology.memory`) and of
//! per-resource strictness (`spec.topology.relaxed`): one `check` helper, one
//! row per case.

use std::collections::BTreeMap;

use specs::engine::{admit, Allocations, NodeSettings, Placement, RejectReason};
use specs::pod::{
    Container, CpuPolicy, MemoryPlacement, Pod, RootfsSource, TopologyPolicy, TopologyScope, TopologySpec,
};
use specs::topology::{HugePages, NodeTopology, NumaKind, PciDevice};
use specs::Quantity;

mod tiers;

use tiers::{hbm_machine, GI};

/// A Guaranteed container: requests equal limits.
fn ctr(name: &str, res: &[(&str, &str)]) -> Container {
    let map: BTreeMap<String, Quantity> =
        res.iter().map(|(k, v)| (k.to_string(), Quantity::parse(v).expect("test quantity"))).collect();
    let mut c = Container { name: name.into(), rootfs: Some(RootfsSource::Host), ..Default::default() };
    c.resources.requests = map.clone();
    c.resources.limits = map;
    c
}

fn g(cpu: &str, mem: &str) -> Container {
    ctr("main", &[("cpu", cpu), ("memory", mem)])
}

fn pod(containers: Vec<Container>, topology: TopologySpec) -> Pod {
    specs::testing::pod("p").containers(containers).topology(topology).build()
}

/// A pod with its memory on the nearest memory-only nodes.
fn tier(containers: Vec<Container>) -> Pod {
    pod(containers, TopologySpec { memory: MemoryPlacement::NearestMemoryOnly, ..Default::default() })
}

fn plain(containers: Vec<Container>) -> Pod {
    pod(containers, TopologySpec::default())
}

fn relaxed(containers: Vec<Container>, names: &[&str]) -> Pod {
    pod(containers, TopologySpec { relaxed: names.iter().map(|s| s.to_string()).collect(), ..Default::default() })
}

fn settings(policy: TopologyPolicy) -> NodeSettings {
    NodeSettings { topology_policy: policy, ..Default::default() }
}

/// Bytes and pages per node as `node=amount`: `2=12Gi,4=8Gi`, `2=512p` for pages.
fn accounted(p: &Placement) -> Vec<String> {
    p.containers
        .iter()
        .map(|c| {
            let mut parts: Vec<String> = c
                .memory
                .iter()
                .map(|(n, b)| if b % GI == 0 { format!("{n}={}Gi", b / GI) } else { format!("{n}={b}") })
                .collect();
            for per_node in c.hugepages.values() {
                parts.extend(per_node.iter().map(|(n, pages)| format!("{n}={pages}p")));
            }
            parts.join(",")
        })
        .collect()
}

enum Expect {
    /// numaAffinity; per container (cpus, mems, accounted); remote entries
    /// as (container, resource, nodes, reason).
    Admit(&'static str, &'static [(&'static str, &'static str, &'static str)], &'static [[&'static str; 4]]),
    Reject(RejectReason, &'static str),
}

struct Case {
    name: &'static str,
    machine: NodeTopology,
    settings: NodeSettings,
    /// Admitted first, in order, with the same settings.
    before: Vec<Pod>,
    pod: Pod,
    expect: Expect,
}

fn case(name: &'static str, machine: NodeTopology, s: NodeSettings, pod: Pod, expect: Expect) -> Case {
    Case { name, machine, settings: s, before: vec![], pod, expect }
}

fn after(mut c: Case, before: Vec<Pod>) -> Case {
    c.before = before;
    c
}

fn asks_tier(p: &Pod) -> bool {
    p.spec.topology.as_ref().is_some_and(|t| t.memory == MemoryPlacement::NearestMemoryOnly)
}

/// No memory-only node in a placement's mems or accounting unless its pod asked.
fn check_tier_rule(name: &str, t: &NodeTopology, pod: &Pod, p: &Placement) {
    if asks_tier(pod) {
        return;
    }
    let memory_only = |id: u32| t.numa_node(id).is_some_and(|n| n.kind == NumaKind::MemoryOnly);
    for c in &p.containers {
        let accounted = c.memory.keys().chain(c.hugepages.values().flat_map(|per_node| per_node.keys()));
        for id in c.mems.iter().chain(accounted.copied()) {
            assert!(!memory_only(id), "{name}: container {} of a default pod uses memory-only node {id}", c.name);
        }
    }
}

fn check(c: Case) {
    let mut alloc = Allocations::default();
    for (i, p) in c.before.iter().enumerate() {
        let key = format!("before-{i}");
        let placed = admit(&c.machine, &c.settings, &alloc, &key, p)
            .unwrap_or_else(|r| panic!("{}: pod before #{i} rejected: {r}", c.name));
        check_tier_rule(c.name, &c.machine, p, &placed);
        alloc.apply(&key, placed);
    }
    let problems = specs::validate::validate_pod(&c.pod);
    assert!(problems.is_empty(), "{}: the pod is not valid: {problems:?}", c.name);
    let got = admit(&c.machine, &c.settings, &alloc, "pod", &c.pod);
    let again = admit(&c.machine, &c.settings, &alloc, "pod", &c.pod);
    assert_eq!(format!("{got:?}"), format!("{again:?}"), "{}: not deterministic", c.name);
    match (c.expect, got) {
        (Expect::Admit(aff, ctrs, remote), Ok(p)) => {
            check_tier_rule(c.name, &c.machine, &c.pod, &p);
            assert_eq!(p.numa_affinity.to_string(), aff, "{}: numaAffinity", c.name);
            let acc = accounted(&p);
            let got: Vec<(String, String, String)> =
                p.containers.iter().zip(acc).map(|(x, a)| (x.cpus.to_string(), x.mems.to_string(), a)).collect();
            let want: Vec<(String, String, String)> =
                ctrs.iter().map(|(a, b, m)| (a.to_string(), b.to_string(), m.to_string())).collect();
            assert_eq!(got, want, "{}: (cpus, mems, accounted) per container", c.name);
            let got: Vec<[String; 4]> = p
                .remote
                .iter()
                .map(|r| [r.container.clone(), r.resource.clone(), r.numa_nodes.to_string(), r.reason.clone()])
                .collect();
            let want: Vec<[String; 4]> = remote.iter().map(|r| r.map(String::from)).collect();
            assert_eq!(got, want, "{}: remote", c.name);
            // The placement reads back as written (the new field included).
            let json = serde_json::to_string(&p).expect("serialize");
            assert_eq!(serde_json::from_str::<Placement>(&json).expect("deserialize"), p, "{}", c.name);
            assert_eq!(json.contains("\"remote\""), !p.remote.is_empty(), "{}: remote is skipped when empty", c.name);
        }
        (Expect::Reject(reason, needle), Err(r)) => {
            assert_eq!(r.reason, reason, "{}: {}", c.name, r.message);
            assert!(r.message.contains(needle), "{}: message {:?} lacks {:?}", c.name, r.message, needle);
        }
        (Expect::Admit(..), Err(r)) => panic!("{}: rejected: {:?} {}", c.name, r.reason, r.message),
        (Expect::Reject(..), Ok(p)) => panic!("{}: admitted: {p:?}", c.name),
    }
}

use Expect::{Admit, Reject};
use TopologyPolicy::{BestEffort, None as NoPolicy, Restricted, SingleNumaNode};

const POLICIES: [TopologyPolicy; 4] = [NoPolicy, BestEffort, Restricted, SingleNumaNode];

#[test]
fn default_pods_never_use_memory_only_nodes() {
    let m = || hbm_machine(4, 0);
    let mut cases = Vec::new();
    for policy in POLICIES {
        cases.push(case("4 CPUs, 8Gi: node 0", m(), settings(policy), plain(vec![g("4", "8Gi")]), {
            Admit(if policy == NoPolicy { "0-5" } else { "0" }, &[("0-3", "0", "0=8Gi")], &[])
        }));
        // The second socket: the memory follows the CPUs, not the closer HBM.
        // (Under policy none the memory goes to the first node that holds it, as in the kubelet.)
        cases.push(after(
            case("4 CPUs on node 1", m(), settings(policy), plain(vec![g("4", "8Gi")]), {
                if policy == NoPolicy {
                    Admit("0-5", &[("4-7", "0", "0=8Gi")], &[])
                } else {
                    Admit("1", &[("4-7", "1", "1=8Gi")], &[])
                }
            }),
            vec![plain(vec![g("4", "8Gi")])],
        ));
        // A shared container of a Guaranteed pod.
        cases.push(case("half a CPU, 8Gi", m(), settings(policy), plain(vec![g("500m", "8Gi")]), {
            Admit(if policy == NoPolicy { "0-5" } else { "0" }, &[("0-7", "0", "0=8Gi")], &[])
        }));
    }
    let huge = || plain(vec![g("2", "100Gi")]);
    cases.extend([
        case(
            "memory wider than a node spans the CPU nodes, never HBM or CXL",
            m(),
            settings(BestEffort),
            huge(),
            Admit("0-1", &[("0-1", "0-1", "0=64Gi,1=36Gi")], &[]),
        ),
        case(
            "restricted: the same",
            m(),
            settings(Restricted),
            huge(),
            Admit("0-1", &[("0-1", "0-1", "0=64Gi,1=36Gi")], &[]),
        ),
        case(
            "policy none: the same",
            m(),
            settings(NoPolicy),
            huge(),
            Admit("0-5", &[("0-1", "0-1", "0=64Gi,1=36Gi")], &[]),
        ),
        case(
            "single-numa-node: memory-only nodes do not make a CPU node bigger",
            m(),
            settings(SingleNumaNode),
            huge(),
            Reject(
                RejectReason::TopologyAffinity,
                "no single NUMA node can hold 100Gi memory; the largest, node 0, has 64Gi",
            ),
        ),
        case(
            "more than the CPU nodes hold: refused, though HBM and CXL have room",
            m(),
            settings(BestEffort),
            plain(vec![g("2", "150Gi")]),
            Reject(
                RejectReason::InsufficientMemory,
                "requests 150Gi memory but only 128Gi are free on the node outside its memory-only NUMA nodes \
                 (spec.topology.memory: nearest-memory-only asks for those)",
            ),
        ),
        case(
            "huge pages only on HBM: a default pod gets none",
            hbm_machine(4, 512),
            settings(BestEffort),
            plain(vec![ctr("main", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", "64Mi")])]),
            Reject(
                RejectReason::InsufficientHugePages,
                "requests 32 hugepages-2Mi pages but only 0 are free on the node outside its memory-only NUMA nodes",
            ),
        ),
    ]);
    for c in cases {
        check(c);
    }
}

#[test]
fn nearest_memory_only() {
    let m = || hbm_machine(4, 0);
    let t12 = || tier(vec![g("2", "12Gi")]);
    let mut cases = Vec::new();
    for policy in POLICIES {
        cases.push(case("2 CPUs on node 0, memory on its HBM", m(), settings(policy), t12(), {
            Admit(if policy == NoPolicy { "0-5" } else { "0" }, &[("0-1", "2", "2=12Gi")], &[])
        }));
        cases.push(after(
            case("CPUs on node 1: its own HBM, node 3", m(), settings(policy), t12(), {
                Admit(if policy == NoPolicy { "0-5" } else { "1" }, &[("4-5", "3", "3=12Gi")], &[])
            }),
            vec![plain(vec![g("4", "1Gi")])],
        ));
    }
    cases.extend([
        after(
            case(
                "node 1's CPUs taken, HBM 2 has 4Gi left: the rest spills to the next nearest, CXL 4",
                m(),
                settings(BestEffort),
                t12(),
                Admit("0", &[("2-3", "2,4", "2=4Gi,4=8Gi")], &[]),
            ),
            vec![t12(), plain(vec![g("4", "1Gi")])],
        ),
        after(
            case(
                "single-numa-node, node 1's CPUs taken: one memory node, the nearest that holds it all",
                m(),
                settings(SingleNumaNode),
                t12(),
                Admit("0", &[("2-3", "4", "4=12Gi")], &[]),
            ),
            vec![t12(), plain(vec![g("4", "1Gi")])],
        ),
        after(
            case(
                "HBM 2 full, node 1's CPUs taken: CXL 4 (30) before the far socket's HBM 3 (32)",
                m(),
                settings(Restricted),
                tier(vec![g("2", "4Gi")]),
                Admit("0", &[("2-3", "4", "4=4Gi")], &[]),
            ),
            vec![tier(vec![g("2", "16Gi")]), plain(vec![g("4", "1Gi")])],
        ),
        case(
            "single-numa-node: no memory-only node holds 80Gi alone",
            m(),
            settings(SingleNumaNode),
            tier(vec![g("2", "80Gi")]),
            Reject(
                RejectReason::TopologyAffinity,
                "no single memory-only NUMA node has 80Gi free for container main's memory",
            ),
        ),
        case(
            "best-effort: 80Gi spread nearest first",
            m(),
            settings(BestEffort),
            tier(vec![g("2", "80Gi")]),
            Admit("0", &[("0-1", "2,4", "2=16Gi,4=64Gi")], &[]),
        ),
        case(
            "more than the memory-only nodes hold",
            m(),
            settings(BestEffort),
            tier(vec![g("2", "170Gi")]),
            Reject(
                RejectReason::InsufficientMemory,
                "requests 170Gi memory but only 160Gi are free on the node's memory-only NUMA nodes \
                 (spec.topology.memory: nearest-memory-only)",
            ),
        ),
        after(
            case(
                "memory-only nodes full, CPU nodes empty: refused",
                m(),
                settings(BestEffort),
                t12(),
                Reject(
                    RejectReason::InsufficientMemory,
                    "requests 12Gi memory but only 8Gi are free on the node's memory-only NUMA nodes",
                ),
            ),
            vec![
                tier(vec![g("1", "16Gi")]),
                tier(vec![g("1", "16Gi")]),
                tier(vec![g("1", "64Gi")]),
                tier(vec![g("1", "56Gi")]),
            ],
        ),
        case(
            "a machine without memory-only nodes",
            specs::topology::synthetic::parse("pack:2 numa:1 core:4 pu:1").expect("synthetic"),
            settings(BestEffort),
            t12(),
            Reject(RejectReason::InsufficientMemory, "which has no memory-only NUMA node"),
        ),
        case(
            "huge pages go with the memory, to the HBM",
            hbm_machine(4, 512),
            settings(SingleNumaNode),
            tier(vec![ctr("main", &[("cpu", "2"), ("memory", "4Gi"), ("hugepages-2Mi", "512Mi")])]),
            Admit("0", &[("0-1", "2", "2=4Gi,2=256p")], &[]),
        ),
        case(
            "pod scope: two containers share node 0's HBM",
            m(),
            settings(SingleNumaNode),
            {
                let mut p = tier(vec![
                    ctr("a", &[("cpu", "2"), ("memory", "8Gi")]),
                    ctr("b", &[("cpu", "2"), ("memory", "8Gi")]),
                ]);
                p.spec.topology.as_mut().expect("set").scope = Some(TopologyScope::Pod);
                p
            },
            Admit("0", &[("0-1", "2", "2=8Gi"), ("2-3", "2", "2=8Gi")], &[]),
        ),
        case(
            "container scope: the second container's CPUs on node 1, its memory on HBM 3",
            m(),
            settings(SingleNumaNode),
            tier(vec![ctr("a", &[("cpu", "4"), ("memory", "8Gi")]), ctr("b", &[("cpu", "4"), ("memory", "8Gi")])]),
            Admit("0-1", &[("0-3", "2", "2=8Gi"), ("4-7", "3", "3=8Gi")], &[]),
        ),
        case(
            "a numa container: the pool CPUs of its node, memory on the HBM",
            m(),
            settings(BestEffort),
            tier(vec![{
                let mut c = g("1", "4Gi");
                c.cpu_policy = Some(CpuPolicy::Numa);
                c
            }]),
            Admit("0", &[("0-3", "2", "2=4Gi")], &[]),
        ),
    ]);
    for c in cases {
        check(c);
    }
}

/// The 17-node fixture (`e2e/fixtures/sysfs/128ia64-17n4s2c`) has a CPU-less
/// node 16 with 1 GB of memory, closer (14) to every node than they are to
/// each other (17, 20); discovery marks it memory-only.
fn seventeen() -> NodeTopology {
    let mut t: NodeTopology =
        serde_json::from_str(include_str!("data/128ia64-17n4s2c.json")).expect("committed fixture parses");
    let n16 = t.numa_nodes.iter_mut().find(|n| n.id == 16).expect("node 16");
    assert!(n16.cpus.is_empty() && n16.memory_bytes > 0, "node 16 is the CPU-less one");
    n16.kind = NumaKind::MemoryOnly;
    t
}

#[test]
fn seventeen_nodes() {
    let problems = specs::validate::validate_topology(&seventeen());
    assert!(problems.is_empty(), "{problems:?}");
    let cases = vec![
        case(
            "4 CPUs: node 0's memory",
            seventeen(),
            settings(SingleNumaNode),
            plain(vec![g("4", "1Gi")]),
            Admit("0", &[("0-3", "0", "0=1Gi")], &[]),
        ),
        case(
            "memory wider than a node: two CPU nodes, not node 16",
            seventeen(),
            settings(Restricted),
            plain(vec![g("4", "150Gi")]),
            Admit("0-1", &[("0-3", "0-1", "0=102458458112,1=58602815488")], &[]),
        ),
        case(
            "13 nodes best-effort: node 16 left out",
            seventeen(),
            settings(BestEffort),
            plain(vec![g("100", "1Gi")]),
            Admit("0-12", &[("0-99", "0-12", "0=1Gi")], &[]),
        ),
        case(
            "policy none: node 0",
            seventeen(),
            settings(NoPolicy),
            plain(vec![g("4", "1Gi")]),
            Admit("0-16", &[("0-3", "0", "0=1Gi")], &[]),
        ),
        case(
            "asking for the memory-only node: node 16",
            seventeen(),
            settings(SingleNumaNode),
            tier(vec![g("4", "512Mi")]),
            Admit("0", &[("0-3", "16", "16=536870912")], &[]),
        ),
        case(
            "node 16 holds less than 2Gi",
            seventeen(),
            settings(SingleNumaNode),
            tier(vec![g("4", "2Gi")]),
            Reject(RejectReason::InsufficientMemory, "are free on the node's memory-only NUMA nodes"),
        ),
    ];
    for c in cases {
        check(c);
    }
}

const VF: &str = "pinion.io/sriov-vf";
const VF1: &str = "0000:3b:00.1";

/// Two nodes of 4 CPUs with 2Mi huge pages; two VFs, both on `vf_node`.
fn nic_machine(vf_node: u32) -> NodeTopology {
    let mut t = specs::topology::synthetic::parse("pack:2 numa:1 core:4 pu:1").expect("synthetic");
    for n in &mut t.numa_nodes {
        n.hugepages = vec![HugePages { page_size_bytes: 2 << 20, total: 512 }];
    }
    for a in [VF1, "0000:3b:00.2"] {
        t.devices.push(PciDevice {
            address: a.into(),
            class: "0x020000".into(),
            numa: Some(vf_node),
            ..PciDevice::default()
        });
    }
    t
}

fn nic_settings(policy: TopologyPolicy) -> NodeSettings {
    let mut s = settings(policy);
    s.devices.insert(VF.into(), vec![VF1.into(), "0000:3b:00.2".into()]);
    s
}

fn upf() -> Vec<Container> {
    vec![ctr("upf", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", "256Mi"), (VF, "1")])]
}

#[test]
fn relaxed_resources() {
    let vf_remote: &[[&str; 4]] = &[["upf", VF, "0", "relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 1"]];
    let mut cases = Vec::new();
    for (policy, refusal) in [
        (SingleNumaNode, "no single NUMA node fits every request"),
        (Restricted, "no set of 1 NUMA node(s) has every request free"),
    ] {
        // Node 0's CPUs are taken; the VFs are on node 0 only.
        cases.extend([
            after(
                case(
                    "CPUs and huge pages fit node 1 only, the VFs are on node 0: refused when strict",
                    nic_machine(0),
                    nic_settings(policy),
                    plain(upf()),
                    Reject(RejectReason::TopologyAffinity, refusal),
                ),
                vec![plain(vec![g("4", "1Gi")])],
            ),
            after(
                case(
                    "the same with the VF relaxed: admitted, the VF remote",
                    nic_machine(0),
                    nic_settings(policy),
                    relaxed(upf(), &[VF]),
                    Admit("1", &[("4-5", "1", "1=1Gi,1=128p")], vf_remote),
                ),
                vec![plain(vec![g("4", "1Gi")])],
            ),
        ]);
    }
    cases.extend([
        case(
            "both nodes free: the relaxed VF still pulls the pod to node 1",
            nic_machine(1),
            nic_settings(SingleNumaNode),
            relaxed(upf(), &[VF]),
            Admit("1", &[("4-5", "1", "1=1Gi,1=128p")], &[]),
        ),
        case(
            "best-effort: the same",
            nic_machine(1),
            nic_settings(BestEffort),
            relaxed(upf(), &[VF]),
            Admit("1", &[("4-5", "1", "1=1Gi,1=128p")], &[]),
        ),
        after(
            case(
                "both VFs taken: a relaxed VF is still a VF the node must have",
                nic_machine(1),
                nic_settings(SingleNumaNode),
                relaxed(upf(), &[VF]),
                Reject(RejectReason::InsufficientDevices, "requests 1 pinion.io/sriov-vf devices but only 0 are free"),
            ),
            vec![relaxed(upf(), &[VF]), relaxed(upf(), &[VF])],
        ),
        after(
            case(
                "policy none: nothing is remote, there is no affinity",
                nic_machine(1),
                nic_settings(NoPolicy),
                relaxed(upf(), &[VF]),
                Admit("0-1", &[("0-1", "0", "0=1Gi,0=128p")], &[]),
            ),
            vec![],
        ),
        after(
            case(
                "relaxed memory: 40Gi with 24Gi free on the CPUs' node, the rest on node 1",
                nic_machine(1),
                nic_settings(SingleNumaNode),
                relaxed(vec![g("2", "40Gi")], &["memory"]),
                Admit(
                    "0",
                    &[("2-3", "0-1", "0=24Gi,1=16Gi")],
                    &[["main", "memory", "1", "relaxed: 40Gi requested, 24Gi free on the affinity's NUMA node(s) 0"]],
                ),
            ),
            vec![plain(vec![g("2", "40Gi")]), plain(vec![g("4", "1Gi")])],
        ),
        after(
            case(
                "strict memory: refused",
                nic_machine(1),
                nic_settings(SingleNumaNode),
                plain(vec![g("2", "40Gi")]),
                Reject(RejectReason::TopologyAffinity, "no single NUMA node fits every request"),
            ),
            vec![plain(vec![g("2", "40Gi")]), plain(vec![g("4", "1Gi")])],
        ),
        after(
            case(
                "relaxed huge pages: node 0's are taken, node 1's are used",
                nic_machine(1),
                nic_settings(Restricted),
                relaxed(
                    vec![ctr("main", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", "64Mi")])],
                    &["hugepages-2Mi"],
                ),
                Admit(
                    "0",
                    &[("2-3", "0-1", "0=1Gi,1=32p")],
                    &[["main", "hugepages-2Mi", "1", "relaxed: 32 requested, 0 free on the affinity's NUMA node(s) 0"]],
                ),
            ),
            vec![
                plain(vec![ctr("main", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", "1Gi")])]),
                plain(vec![g("4", "1Gi")]),
            ],
        ),
    ]);
    for c in cases {
        check(c);
    }
}

fn example(name: &str) -> Pod {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut pods = specs::manifest::parse_pods(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(pods.len(), 1, "{name}");
    pods.remove(0)
}

/// The example manifests do what their comments say.
#[test]
fn the_examples_do_what_they_say() {
    check(case(
        "hbm-memory.yaml: CPUs on node 0, memory on its HBM",
        hbm_machine(8, 0),
        settings(NoPolicy),
        example("hbm-memory.yaml"),
        Admit("0", &[("0-3", "2", "2=8Gi")], &[]),
    ));
    check(after(
        case(
            "relaxed-nic.yaml: node 0's CPUs taken, the VFs there: the VF remote",
            nic_machine(0),
            nic_settings(NoPolicy),
            example("relaxed-nic.yaml"),
            Admit(
                "1",
                &[("4-5", "1", "1=1Gi,1=256p")],
                &[["upf", VF, "0", "relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 1"]],
            ),
        ),
        vec![plain(vec![g("4", "1Gi")])],
    ));
}

/// A tier pod's CPU node is chosen where its nearest memory-only node has
/// room (the tier's hint), among the CPU nodes its CPUs and devices accept
/// equally; it never widens or refuses the CPUs' choice.
#[test]
fn tier_hint_chooses_the_cpu_node() {
    let m = || hbm_machine(4, 0);
    // Fills HBM 2 (node 0's) and takes CPUs 0-1.
    let fill_hbm2 = || tier(vec![g("2", "16Gi")]);
    let mut cases = Vec::new();
    for policy in POLICIES {
        let aff = |node: &'static str| if policy == NoPolicy { "0-5" } else { node };
        cases.extend([
            after(
                case(
                    "HBM 2 full: CPU node 1 and its HBM 3, not node 0 with far memory",
                    m(),
                    settings(policy),
                    tier(vec![g("2", "4Gi")]),
                    Admit(aff("1"), &[("4-5", "3", "3=4Gi")], &[]),
                ),
                vec![fill_hbm2()],
            ),
            after(
                case(
                    "both HBMs have room: the lowest CPU node, as before",
                    m(),
                    settings(policy),
                    tier(vec![g("2", "4Gi")]),
                    Admit(aff("0"), &[("2-3", "2", "2=4Gi")], &[]),
                ),
                vec![tier(vec![g("2", "8Gi")])],
            ),
            after(
                case(
                    "the CPUs fit node 0 only: there, the memory spills to CXL 4",
                    m(),
                    settings(policy),
                    tier(vec![g("2", "4Gi")]),
                    Admit(aff("0"), &[("2-3", "4", "4=4Gi")], &[]),
                ),
                vec![fill_hbm2(), plain(vec![g("4", "1Gi")])],
            ),
            case(
                "no CPU node's HBM holds 20Gi: node 0, spilled (one CXL node under single-numa-node)",
                m(),
                settings(policy),
                tier(vec![g("2", "20Gi")]),
                if policy == SingleNumaNode {
                    Admit("0", &[("0-1", "4", "4=20Gi")], &[])
                } else {
                    Admit(aff("0"), &[("0-1", "2,4", "2=16Gi,4=4Gi")], &[])
                },
            ),
        ]);
    }
    cases.extend([
        after(
            case(
                "HBM 2's huge pages taken: node 1, its HBM's pages",
                hbm_machine(4, 512),
                settings(BestEffort),
                tier(vec![ctr("main", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", "64Mi")])]),
                Admit("1", &[("4-5", "3", "3=1Gi,3=32p")], &[]),
            ),
            vec![tier(vec![ctr("main", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", "1Gi")])])],
        ),
        after(
            case(
                "single-numa-node, HBM 2 with 4Gi left, 8Gi asked: node 1's HBM 3 holds it alone",
                m(),
                settings(SingleNumaNode),
                tier(vec![g("2", "8Gi")]),
                Admit("1", &[("4-5", "3", "3=8Gi")], &[]),
            ),
            vec![tier(vec![g("2", "12Gi")])],
        ),
        after(
            case(
                "pod scope: the containers' memory together (12Gi) decides: node 1",
                m(),
                settings(Restricted),
                two_6gi(Some(TopologyScope::Pod)),
                Admit("1", &[("4", "3", "3=6Gi"), ("5", "3", "3=6Gi")], &[]),
            ),
            vec![tier(vec![g("2", "8Gi")])],
        ),
        after(
            case(
                "container scope: the first fits HBM 2's 8Gi, the second goes to node 1",
                m(),
                settings(SingleNumaNode),
                two_6gi(Some(TopologyScope::Container)),
                Admit("0-1", &[("2", "2", "2=6Gi"), ("4", "3", "3=6Gi")], &[]),
            ),
            vec![tier(vec![g("2", "8Gi")])],
        ),
    ]);
    for c in cases {
        check(c);
    }
}

/// Two containers of 1 CPU and 6Gi, with their memory on memory-only nodes.
fn two_6gi(scope: Option<TopologyScope>) -> Pod {
    let mut p = tier(vec![ctr("a", &[("cpu", "1"), ("memory", "6Gi")]), ctr("b", &[("cpu", "1"), ("memory", "6Gi")])]);
    p.spec.topology.as_mut().expect("set").scope = scope;
    p
}
