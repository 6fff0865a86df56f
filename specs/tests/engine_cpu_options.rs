//! Table tests of the kubelet's CPU-manager options as the engine implements
//! them: `distribute-cpus-across-numa` (the kubelet's balance over NUMA-node
//! combinations), `distribute-cpus-across-cores`, `prefer-align-cpus-by-uncorecache`,
//! `strict-cpu-reservation`, and the option parser and its refusals. Each row
//! says, in words, the behaviour the kubelet documents or implements
//! (`pkg/kubelet/cm/cpumanager/cpu_assignment.go`, `policy_static.go`,
//! `policy_options.go`).

use std::collections::BTreeMap;

use specs::engine::{admit, Allocations, ContainerPlacement, NodeSettings, OptionError, Placement};
use specs::pod::{Container, CpuPolicy, Pod, TopologyPolicy};
use specs::topology::NodeTopology;
use specs::{CpuSet, Quantity};

/// The 2-socket 112-CPU seed machine: NUMA 0 = 0-27,56-83, NUMA 1 = 28-55,84-111.
const SEED: &str = "pack:2 numa:1 core:28 pu:2";
/// 8 NUMA nodes of 4 two-thread cores on 2 sockets: node i = 4i..4i+3 and
/// their siblings 32+4i..32+4i+3.
const EIGHT: &str = "pack:2 numa:4 core:4 pu:2";
/// One socket, two NUMA nodes of 16 two-thread cores, the cores in L3 groups
/// of 4 (an AMD-like machine with 4 CCXs per node): core c = CPUs c and c+32.
const CCX: &str = "pack:1 numa:2 core:16 pu:2";

fn machine(desc: &str) -> NodeTopology {
    let mut t = specs::topology::synthetic::parse(desc).expect(desc);
    if desc == CCX {
        for c in &mut t.cpus {
            c.uncore_cache = Some(c.core / 4);
        }
    }
    t
}

fn guaranteed(cpus: &str) -> Pod {
    specs::testing::pod("p").named("c").guaranteed(cpus, "1Gi").build()
}

fn pod(containers: Vec<Container>) -> Pod {
    specs::testing::pod("p").containers(containers).build()
}

/// A pod with one BestEffort or Burstable container of the given policy.
fn sharing(policy: Option<CpuPolicy>, cpu: Option<&str>) -> Pod {
    let mut c = Container { name: "c".into(), cpu_policy: policy, ..Default::default() };
    if let Some(q) = cpu {
        c.resources.requests.insert("cpu".into(), Quantity::parse(q).expect("test quantity"));
    }
    pod(vec![c])
}

/// Settings from `--cpu-manager-option` flags, through the one parser.
fn settings(policy: TopologyPolicy, reserved: &str, flags: &[&str]) -> NodeSettings {
    let mut s = NodeSettings { topology_policy: policy, ..Default::default() };
    s.reserved_cpus = reserved.parse().expect("test cpulist");
    for f in flags {
        s.set_option_flag(f).expect("test flag");
    }
    s
}

/// An existing exclusive allocation of `cpus`.
fn used(cpus: &str) -> Allocations {
    let mut a = Allocations::default();
    let c = ContainerPlacement {
        name: "x".into(),
        cpu_policy: CpuPolicy::Exclusive,
        cpus: cpus.parse().expect("test cpulist"),
        mems: Default::default(),
        memory: BTreeMap::new(),
        hugepages: BTreeMap::new(),
        devices: BTreeMap::new(),
    };
    a.apply("existing", Placement { containers: vec![c], ..Default::default() });
    a
}

struct Case {
    name: &'static str,
    machine: &'static str,
    settings: NodeSettings,
    allocations: Allocations,
    pod: Pod,
    /// The first container's cpuset.
    cpus: &'static str,
}

fn check(c: Case) {
    let t = machine(c.machine);
    let got = admit(&t, &c.settings, &c.allocations, "pod", &c.pod)
        .unwrap_or_else(|r| panic!("{}: rejected: {}", c.name, r.message));
    assert_eq!(got.containers[0].cpus.to_string(), c.cpus, "{}", c.name);
}

const NONE: TopologyPolicy = TopologyPolicy::None;
const NUMA: &str = "distribute-cpus-across-numa=true";
const FULL: &str = "full-pcpus-only=true";
const CORES: &str = "distribute-cpus-across-cores=true";
const L3: &str = "prefer-align-cpus-by-uncorecache=true";
const STRICT: &str = "strict-cpu-reservation=true";

/// Node i of `EIGHT` with 3 of its 8 CPUs taken (a core and one thread of the
/// next), for i in `nodes`.
fn three_taken_on(nodes: &[u32]) -> String {
    let ids = nodes.iter().flat_map(|&i| [4 * i, 4 * i + 1, 32 + 4 * i]);
    CpuSet::from_ids(ids).expect("small ids").to_string()
}

#[test]
fn distribute_cpus_across_numa() {
    let cases = vec![
        Case {
            name: "a request one node holds goes to one node, packed there",
            machine: SEED,
            settings: settings(NONE, "", &[NUMA]),
            allocations: Allocations::default(),
            pod: guaranteed("4"),
            cpus: "0-1,56-57",
        },
        Case {
            // The kubelet scores even a one-node choice by the balance left
            // behind: the node with the most free CPUs wins. Packed picks the
            // fuller node (the next row).
            name: "balance: a small request goes to the emptier node",
            machine: SEED,
            settings: settings(NONE, "", &[NUMA]),
            allocations: used("0-4,56-60"),
            pod: guaranteed("4"),
            cpus: "28-29,84-85",
        },
        Case {
            name: "packed (no option) fills the fuller node instead",
            machine: SEED,
            settings: settings(NONE, "", &[]),
            allocations: used("0-4,56-60"),
            pod: guaranteed("4"),
            cpus: "5-6,61-62",
        },
        Case {
            name: "58 CPUs need two nodes: 29 on each",
            machine: SEED,
            settings: settings(NONE, "", &[NUMA]),
            allocations: Allocations::default(),
            pod: guaranteed("58"),
            cpus: "0-14,28-42,56-69,84-97",
        },
        Case {
            // In groups of a core's two threads: 28 per node, and the one
            // group left over to the first of the equally free nodes.
            name: "full-pcpus-only: 58 as whole cores, the leftover core on node 0",
            machine: SEED,
            settings: settings(NONE, "", &[NUMA, FULL]),
            allocations: Allocations::default(),
            pod: guaranteed("58"),
            cpus: "0-14,28-41,56-70,84-97",
        },
        Case {
            // 61 = 30 + 30 + 1: the leftover CPU goes where it leaves the
            // nodes most even, the emptier node 1, although node 0 comes
            // first in the kubelet's order (fewest free first).
            name: "the leftover CPU goes to the node with the most free CPUs",
            machine: SEED,
            settings: settings(NONE, "", &[NUMA]),
            allocations: used("0-4,56-60"),
            pod: guaranteed("61"),
            cpus: "5-19,28-43,61-75,84-98",
        },
        Case {
            // 20 CPUs on nodes of 8: at least 3 nodes; 6 each and 2 left
            // over. All nodes tie, so the first three in the kubelet's order
            // (socket 0's nodes by id) and the leftover to the first two.
            name: "8 nodes: 20 CPUs over three nodes, 7+7+6",
            machine: EIGHT,
            settings: settings(NONE, "", &[NUMA]),
            allocations: Allocations::default(),
            pod: guaranteed("20"),
            cpus: "0-10,32-34,36-38,40-42",
        },
        Case {
            // Node 0 has 8 free, the others 5. Two nodes hold 12 CPUs (8 + 5)
            // but not as an even 6 + 6, so the kubelet goes to three nodes, 4
            // each: node 0 and the first two 5-free nodes in its order, which
            // are on socket 1 (it has fewer free CPUs, so it sorts first).
            name: "8 nodes: no even split on two nodes, so three, in the kubelet's order",
            machine: EIGHT,
            settings: settings(NONE, "", &[NUMA]),
            allocations: used(&three_taken_on(&[1, 2, 3, 4, 5, 6, 7])),
            pod: guaranteed("12"),
            cpus: "0-1,18-19,22-23,32-33,50-51,54-55",
        },
        Case {
            // 64 nodes of 16 CPUs: too many combinations to try each, the
            // closed form answers. 40 CPUs: 3 nodes, 13 each and one left
            // over; all tie, so socket 0's first three nodes, the extra CPU
            // on the first.
            name: "64 nodes: 40 CPUs over three nodes, 14+13+13",
            machine: "pack:8 numa:8 core:8 pu:2",
            settings: settings(NONE, "", &[NUMA]),
            allocations: Allocations::default(),
            pod: guaranteed("40"),
            cpus: "0-6,8-14,16-22,512-518,520-525,528-533",
        },
        Case {
            // Aligned first: the hint picks node 1 and the distribution
            // happens inside it.
            name: "with single-numa-node, the split stays inside the chosen node",
            machine: SEED,
            settings: settings(TopologyPolicy::SingleNumaNode, "", &[NUMA]),
            allocations: used("0-4,56-60"),
            pod: guaranteed("8"),
            cpus: "5-8,61-64",
        },
    ];
    for c in cases {
        check(c);
    }
}

#[test]
fn distribute_cpus_across_cores() {
    let cases = vec![
        Case {
            name: "one thread per core: 4 CPUs are four cores' first threads",
            machine: SEED,
            settings: settings(NONE, "", &[CORES]),
            allocations: Allocations::default(),
            pod: guaranteed("4"),
            cpus: "0-3",
        },
        Case {
            name: "a core's second thread only after every first thread of the socket",
            machine: SEED,
            settings: settings(NONE, "", &[CORES]),
            allocations: Allocations::default(),
            pod: guaranteed("30"),
            cpus: "0-27,56-57",
        },
        Case {
            name: "whole sockets are still taken whole",
            machine: SEED,
            settings: settings(NONE, "", &[CORES]),
            allocations: Allocations::default(),
            pod: guaranteed("58"),
            cpus: "0-29,56-83",
        },
        Case {
            // Sockets are ordered fewest free first, as packed does.
            name: "the fuller socket first",
            machine: SEED,
            settings: settings(NONE, "", &[CORES]),
            allocations: used("0-1"),
            pod: guaranteed("3"),
            cpus: "2-4",
        },
    ];
    for c in cases {
        check(c);
    }
}

#[test]
fn prefer_align_cpus_by_uncorecache() {
    let cases = vec![
        Case {
            // L3 group 0 has two free cores, group 1 three: 6 CPUs fit group 1
            // exactly, so they go there, not across groups 0 and 1.
            name: "the first L3 group that holds the request whole",
            machine: CCX,
            settings: settings(NONE, "", &[L3]),
            allocations: used("0-1,4,32-33,36"),
            pod: guaranteed("6"),
            cpus: "5-7,37-39",
        },
        Case {
            name: "without the option, packed whole cores span L3 groups",
            machine: CCX,
            settings: settings(NONE, "", &[]),
            allocations: used("0-1,4,32-33,36"),
            pod: guaranteed("6"),
            cpus: "2-3,5,34-35,37",
        },
        Case {
            // A whole group (8 CPUs) first, then the 2 left from the next
            // group's first core.
            name: "whole L3 groups first, the rest from the next group",
            machine: CCX,
            settings: settings(NONE, "", &[L3]),
            allocations: Allocations::default(),
            pod: guaranteed("10"),
            cpus: "0-4,32-36",
        },
        Case {
            // An odd rest on SMT: the group's first two cores less the last thread.
            name: "an odd request takes whole cores and one thread in one group",
            machine: CCX,
            settings: settings(NONE, "", &[L3]),
            allocations: used("0-1,4,32-33,36"),
            pod: guaranteed("3"),
            cpus: "2-3,34",
        },
        Case {
            name: "a machine without L3 groups is packed as usual",
            machine: SEED,
            settings: settings(NONE, "", &[L3]),
            allocations: Allocations::default(),
            pod: guaranteed("6"),
            cpus: "0-2,56-58",
        },
    ];
    for c in cases {
        check(c);
    }
}

#[test]
fn strict_cpu_reservation() {
    let cases = vec![
        Case {
            name: "BestEffort runs on the reserved CPUs too without the option",
            machine: SEED,
            settings: settings(NONE, "0,56", &[]),
            allocations: Allocations::default(),
            pod: sharing(None, None),
            cpus: "0-111",
        },
        Case {
            name: "strict: BestEffort never runs on a reserved CPU",
            machine: SEED,
            settings: settings(NONE, "0,56", &[STRICT]),
            allocations: Allocations::default(),
            pod: sharing(None, None),
            cpus: "1-55,57-111",
        },
        Case {
            name: "strict: nor Burstable",
            machine: SEED,
            settings: settings(NONE, "0,56", &[STRICT]),
            allocations: used("1-3"),
            pod: sharing(None, Some("500m")),
            cpus: "4-55,57-111",
        },
        Case {
            name: "strict: a numa container gets its node's pool less the reserved CPUs",
            machine: SEED,
            settings: settings(TopologyPolicy::BestEffort, "0,56", &[STRICT]),
            allocations: Allocations::default(),
            pod: sharing(Some(CpuPolicy::Numa), Some("2")),
            cpus: "1-27,57-83",
        },
        Case {
            name: "strict: exclusive CPUs are chosen as before",
            machine: SEED,
            settings: settings(NONE, "0,56", &[STRICT]),
            allocations: Allocations::default(),
            pod: guaranteed("2"),
            cpus: "1,57",
        },
    ];
    for c in cases {
        check(c);
    }
}

#[test]
fn strict_reservation_moves_the_live_pool() {
    let t = machine(SEED);
    let a = used("1-3");
    let plain = settings(NONE, "0,56", &[]);
    let strict = settings(NONE, "0,56", &[STRICT]);
    assert_eq!(a.shared_pool(&t, &plain).to_string(), "0,4-111");
    assert_eq!(a.shared_pool(&t, &strict).to_string(), "4-55,57-111");
}

#[test]
fn strict_reservation_refuses_a_pod_that_would_empty_the_pool() {
    // 4 CPUs, 1 reserved: 3 exclusive would leave the strict pool empty
    // while a shared container runs.
    let t = specs::topology::synthetic::parse("core:4").expect("test machine");
    let s = settings(NONE, "0", &[STRICT]);
    let mut a = Allocations::default();
    let shared = admit(&t, &s, &a, "shared", &sharing(None, None)).expect("shared pod admitted");
    a.apply("shared", shared);
    let err = admit(&t, &s, &a, "big", &guaranteed("3")).expect_err("would empty the pool");
    assert!(err.message.contains("strict-cpu-reservation"), "{}", err.message);
}

#[test]
fn options_parse_and_conflicts_are_refused() {
    type Row = (&'static [&'static str], TopologyPolicy, Result<(), &'static str>);
    let rows: Vec<Row> = vec![
        (&[FULL, NUMA], NONE, Ok(())),
        (&[NUMA, "align-by-socket=true"], NONE, Ok(())),
        (&[STRICT, L3], TopologyPolicy::SingleNumaNode, Ok(())),
        (&[FULL, CORES], NONE, Err("full-pcpus-only and distribute-cpus-across-cores cannot be used together")),
        (&[NUMA, CORES], NONE, Err("distribute-cpus-across-numa and distribute-cpus-across-cores")),
        (&[L3, CORES], NONE, Err("prefer-align-cpus-by-uncorecache and distribute-cpus-across-cores")),
        (&[L3, NUMA], NONE, Err("prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa")),
        (
            &["align-by-socket=true"],
            TopologyPolicy::SingleNumaNode,
            Err("align-by-socket and topology policy single-numa-node"),
        ),
        // Turned off again: no conflict.
        (&[FULL, CORES, "full-pcpus-only=false"], NONE, Ok(())),
    ];
    for (flags, policy, want) in rows {
        let s = settings(policy, "", flags);
        match (s.validate(), want) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(needle)) => {
                assert!(matches!(e, OptionError::Incompatible { .. }), "{flags:?}: {e:?}");
                assert!(e.to_string().contains(needle), "{flags:?}: {e} lacks {needle:?}");
            }
            (got, want) => panic!("{flags:?} under {policy:?}: got {got:?}, want {want:?}"),
        }
    }
    let mut s = NodeSettings::default();
    let errors = [
        ("smt=true", "unknown option \"smt\" (known: full-pcpus-only,"),
        ("full-pcpus-only=yes", "value \"yes\" of full-pcpus-only must be true or false"),
        ("full-pcpus-only", "expected KEY=VALUE"),
    ];
    for (flag, needle) in errors {
        let e = s.set_option_flag(flag).expect_err(flag);
        assert!(e.to_string().contains(needle), "{flag}: {e} lacks {needle:?}");
    }
    for flag in [CORES, L3, STRICT, "prefer-closest-numa-nodes=true"] {
        s.set_option_flag(flag).expect(flag);
    }
    let o = s.cpu_manager;
    assert!(o.distribute_cpus_across_cores && o.prefer_align_cpus_by_uncore_cache && o.strict_cpu_reservation);
    assert!(s.prefer_closest_numa_nodes);
}

#[test]
fn the_server_refuses_a_node_with_conflicting_options() {
    let mut node: specs::api::Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "spec": {"topology": serde_json::to_value(machine(SEED)).expect("serializes")},
    }))
    .expect("test node");
    assert!(specs::validate::validate_node(&node).is_empty());
    node.spec.settings = settings(NONE, "", &[FULL, CORES]);
    let errs = specs::validate::validate_node(&node);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "spec.settings.cpuManager");
    assert!(errs[0].message.contains("cannot be used together"), "{}", errs[0].message);
}

/// A node booted with `isolcpus`: exclusive CPUs come from the isolated set
/// first, then from the rest as usual.
#[test]
fn isolated_cpus_first() {
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        // (name, isolated, existing allocation, request, cpus)
        ("no isolated CPUs: the lowest ids", "", "", "2", "0,56"),
        ("isolated 4-5: those", "4-5", "", "2", "4-5"),
        ("more than the isolated: those, then packed (a partly used core first)", "4-5", "", "3", "4-5,60"),
        ("isolated taken: as if none", "4-5", "4-5", "2", "0,56"),
        ("isolated on NUMA 1: still first", "30,86", "", "2", "30,86"),
    ];
    for (name, isolated, taken, request, cpus) in cases {
        let mut t = machine(SEED);
        t.kernel.isolated_cpus = isolated.parse().expect("test cpulist");
        let alloc = if taken.is_empty() { Allocations::default() } else { used(taken) };
        let got = admit(&t, &settings(NONE, "", &[]), &alloc, "pod", &guaranteed(request))
            .unwrap_or_else(|r| panic!("{name}: rejected: {}", r.message));
        assert_eq!(got.containers[0].cpus.to_string(), *cpus, "{name}");
    }
}
