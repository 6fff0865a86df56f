//! Table-driven tests of the admission engine: one `check` helper, one row per case.

use std::collections::BTreeMap;

use specs::engine::{admit, Allocations, ContainerPlacement, CpuManagerOptions, NodeSettings, Placement, RejectReason};
use specs::pod::{Container, CpuPolicy, Pod, TopologyPolicy, TopologyScope, TopologySpec};
use specs::topology::{HugePages, NodeTopology, PciDevice};
use specs::{CpuSet, Quantity};

const SEED: &str = "pack:2 numa:1 core:28 pu:2";
const M2X10: &str = "pack:2 numa:1 core:10 pu:1";
const M2X20: &str = "pack:2 numa:1 core:20 pu:1";
const M4: &str = "pack:2 numa:2 core:4 pu:2";
const GI: u64 = 1 << 30;

fn seventeen() -> NodeTopology {
    let text = include_str!("data/128ia64-17n4s2c.json");
    serde_json::from_str(text).expect("committed fixture parses")
}

fn machine(desc: &str) -> NodeTopology {
    if desc == "17n" {
        return seventeen();
    }
    specs::topology::synthetic::parse(desc).expect(desc)
}

/// A container; `g` makes requests equal limits (Guaranteed when every container is).
fn ctr(name: &str, res: &[(&str, &str)], g: bool, policy: Option<CpuPolicy>) -> Container {
    let map: BTreeMap<String, Quantity> =
        res.iter().map(|(k, v)| (k.to_string(), Quantity::parse(v).expect("test quantity"))).collect();
    let mut c = Container { name: name.into(), cpu_policy: policy, ..Default::default() };
    c.resources.requests = map.clone();
    if g {
        c.resources.limits = map;
    }
    c
}

fn gctr(name: &str, cpu: &str, mem: &str) -> Container {
    ctr(name, &[("cpu", cpu), ("memory", mem)], true, None)
}

fn pod(name: &str, containers: Vec<Container>) -> Pod {
    specs::testing::pod(name).containers(containers).build()
}

fn with_topology(mut p: Pod, policy: Option<TopologyPolicy>, scope: Option<TopologyScope>) -> Pod {
    p.spec.topology = Some(TopologySpec { policy, scope, ..Default::default() });
    p
}

fn settings(policy: TopologyPolicy) -> NodeSettings {
    NodeSettings { topology_policy: policy, ..Default::default() }
}

/// An existing allocation holding `cpus` exclusively and `memory` bytes per node id.
fn taken(a: &mut Allocations, cpus: &str, memory: &[(u32, u64)], hugepages: &[(u64, u32, u64)]) {
    let mut hp: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
    for &(size, node, pages) in hugepages {
        hp.entry(size).or_default().insert(node, pages);
    }
    let c = ContainerPlacement {
        name: "x".into(),
        cpu_policy: CpuPolicy::Exclusive,
        cpus: cpus.parse().expect("cpulist"),
        mems: Default::default(),
        memory: memory.iter().copied().collect(),
        hugepages: hp,
        devices: BTreeMap::new(),
    };
    let key = format!("existing-{}", a.pods.len());
    a.apply(&key, Placement { numa_affinity: Default::default(), containers: vec![c], ..Default::default() });
}

enum Expect {
    /// numaAffinity, then per container (cpus, mems).
    Admit(&'static str, &'static [(&'static str, &'static str)]),
    Reject(RejectReason, &'static str),
}

struct Case {
    name: &'static str,
    machine: NodeTopology,
    settings: NodeSettings,
    allocations: Allocations,
    /// Admitted first, in order, with the same settings.
    before: Vec<Pod>,
    pod: Pod,
    expect: Expect,
}

fn case(name: &'static str, desc: &str, s: NodeSettings, pod: Pod, expect: Expect) -> Case {
    Case { name, machine: machine(desc), settings: s, allocations: Allocations::default(), before: vec![], pod, expect }
}

fn check(c: Case) {
    let mut alloc = c.allocations.clone();
    for (i, p) in c.before.iter().enumerate() {
        let key = format!("before-{i}");
        let placed = admit(&c.machine, &c.settings, &alloc, &key, p)
            .unwrap_or_else(|r| panic!("{}: pod before #{i} rejected: {r}", c.name));
        alloc.apply(&key, placed);
    }
    let got = admit(&c.machine, &c.settings, &alloc, "pod", &c.pod);
    // Byte-for-byte determinism: a second run gives the same serialization.
    let again = admit(&c.machine, &c.settings, &alloc, "pod", &c.pod);
    assert_eq!(
        serde_json::to_string(&got.as_ref().map_err(|r| r.message.clone())).expect("test input"),
        serde_json::to_string(&again.as_ref().map_err(|r| r.message.clone())).expect("test input"),
        "{}",
        c.name
    );
    match (c.expect, got) {
        (Expect::Admit(aff, ctrs), Ok(p)) => {
            assert_eq!(p.numa_affinity.to_string(), aff, "{}: numaAffinity", c.name);
            let got: Vec<(String, String)> =
                p.containers.iter().map(|x| (x.cpus.to_string(), x.mems.to_string())).collect();
            let want: Vec<(String, String)> = ctrs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            assert_eq!(got, want, "{}: (cpus, mems) per container", c.name);
            // Never a reserved CPU among exclusive ones, never a CPU given twice.
            let reserved = c.settings.reserved_cpus.union(&c.machine.reserved_cpus);
            for x in &p.containers {
                // Memory is never bound to a node that has none.
                for n in x.mems.iter() {
                    let node = c.machine.numa_node(n).unwrap_or_else(|| panic!("{}: mems names node {n}", c.name));
                    let has_memory = node.memory_bytes > 0 || node.hugepages.iter().any(|h| h.total > 0);
                    assert!(has_memory, "{}: container {} bound to node {n}, which has no memory", c.name, x.name);
                }
                if x.cpu_policy == CpuPolicy::Exclusive {
                    assert!(x.cpus.is_disjoint(&reserved), "{}: reserved CPU handed out", c.name);
                    assert!(x.cpus.is_disjoint(&alloc.pinned_cpus()), "{}: CPU given twice", c.name);
                }
            }
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

fn opts(f: impl FnOnce(&mut CpuManagerOptions)) -> CpuManagerOptions {
    let mut o = CpuManagerOptions::default();
    f(&mut o);
    o
}

#[test]
fn seed_machine() {
    let g4 = || pod("p", vec![gctr("c", "4", "1Gi")]);
    let mut full = settings(NoPolicy);
    full.cpu_manager = opts(|o| o.full_pcpus_only = true);
    let mut reserved = settings(SingleNumaNode);
    reserved.reserved_cpus = "0,56".parse().expect("test input");
    let mut dist = settings(NoPolicy);
    dist.cpu_manager = opts(|o| o.distribute_cpus_across_numa = true);
    let mut dist_full = dist.clone();
    dist_full.cpu_manager.full_pcpus_only = true;
    let cases = vec![
        case("4 CPUs are two whole cores", SEED, settings(NoPolicy), g4(), Admit("0-1", &[("0-1,56-57", "0")])),
        case(
            "56 CPUs are the whole first socket",
            SEED,
            settings(NoPolicy),
            pod("p", vec![gctr("c", "56", "1Gi")]),
            Admit("0-1", &[("0-27,56-83", "0")]),
        ),
        case(
            "3 CPUs: a whole core then a thread",
            SEED,
            settings(NoPolicy),
            pod("p", vec![gctr("c", "3", "1Gi")]),
            Admit("0-1", &[("0-1,56", "0")]),
        ),
        case(
            "full-pcpus-only refuses 3",
            SEED,
            full.clone(),
            pod("p", vec![gctr("c", "3", "1Gi")]),
            Reject(RejectReason::SmtAlignment, "requested 3 CPUs, not a multiple of 2 CPUs per core"),
        ),
        case("full-pcpus-only takes 4 as two cores", SEED, full.clone(), g4(), Admit("0-1", &[("0-1,56-57", "0")])),
        case("reserved CPUs are never exclusive", SEED, reserved.clone(), g4(), Admit("0", &[("1-2,57-58", "0")])),
        case(
            "distribute-cpus-across-numa: 56 fit one node, so packed (as the kubelet)",
            SEED,
            dist.clone(),
            pod("p", vec![gctr("c", "56", "1Gi")]),
            Admit("0-1", &[("0-27,56-83", "0")]),
        ),
        case(
            "distribute-cpus-across-numa splits 58 evenly over both nodes",
            SEED,
            dist.clone(),
            pod("p", vec![gctr("c", "58", "1Gi")]),
            Admit("0-1", &[("0-14,28-42,56-69,84-97", "0")]),
        ),
        case(
            "distribute with full-pcpus-only: whole cores per node",
            SEED,
            dist_full.clone(),
            pod("p", vec![gctr("c", "60", "1Gi")]),
            Admit("0-1", &[("0-14,28-42,56-70,84-98", "0")]),
        ),
        case("distribute: fits one node, packed", SEED, dist.clone(), g4(), Admit("0-1", &[("0-1,56-57", "0")])),
        case(
            "shared container gets the pool, no mems (burstable)",
            SEED,
            settings(SingleNumaNode),
            pod("p", vec![ctr("c", &[("cpu", "500m")], false, None)]),
            Admit("0-1", &[("0-111", "")]),
        ),
        case(
            "fractional Guaranteed is shared but memory-bound",
            SEED,
            settings(SingleNumaNode),
            pod("p", vec![gctr("c", "1500m", "2Gi")]),
            Admit("0", &[("0-111", "0")]),
        ),
        case(
            "numa policy shares node 0's CPUs",
            SEED,
            settings(SingleNumaNode),
            pod("p", vec![ctr("c", &[("cpu", "2")], false, Some(CpuPolicy::Numa))]),
            Admit("0", &[("0-27,56-83", "0")]),
        ),
        case(
            "numa policy under none still picks a node",
            SEED,
            settings(NoPolicy),
            pod("p", vec![ctr("c", &[("cpu", "2")], false, Some(CpuPolicy::Numa))]),
            Admit("0-1", &[("0-27,56-83", "0")]),
        ),
        case(
            "exclusive needs whole CPUs",
            SEED,
            settings(NoPolicy),
            pod("p", vec![ctr("c", &[("cpu", "1500m")], true, Some(CpuPolicy::Exclusive))]),
            Reject(RejectReason::InvalidRequest, "needs a whole number of CPUs, got 1500m"),
        ),
        case(
            "too many CPUs for the machine",
            SEED,
            reserved.clone(),
            pod("p", vec![gctr("c", "112", "1Gi")]),
            Reject(
                RejectReason::InsufficientCpu,
                "requests 112 CPU but only 110 of the node's 110 allocatable CPUs (2 reserved)",
            ),
        ),
        case(
            "no containers",
            SEED,
            settings(NoPolicy),
            pod("p", vec![]),
            Reject(RejectReason::InvalidRequest, "no containers"),
        ),
    ];
    for c in cases {
        check(c);
    }
}

#[test]
fn sequences_and_existing_allocations() {
    let g4 = || pod("p", vec![gctr("c", "4", "1Gi")]);
    let mut c1 = case(
        "second pod packs next to the first",
        SEED,
        settings(SingleNumaNode),
        g4(),
        Admit("0", &[("2-3,58-59", "0")]),
    );
    c1.before = vec![g4()];
    let mut c2 = case(
        "a full socket sends the next pod to node 1",
        SEED,
        settings(SingleNumaNode),
        g4(),
        Admit("1", &[("28-29,84-85", "1")]),
    );
    c2.before = vec![pod("big", vec![gctr("c", "56", "1Gi")])];
    let mut c3 = case(
        "exclusive avoids immovable cores",
        SEED,
        settings(SingleNumaNode),
        g4(),
        Admit("0", &[("1-2,57-58", "0")]),
    );
    c3.before = vec![pod("imm", vec![ctr("c", &[("cpu", "2")], false, Some(CpuPolicy::Immovable))])];
    let mut c4 = case(
        "immovable stays in the shared pool",
        SEED,
        settings(NoPolicy),
        pod("p", vec![ctr("c", &[("cpu", "1")], false, None)]),
        Admit("0-1", &[("0-111", "")]),
    );
    c4.before = vec![pod("imm", vec![ctr("c", &[("cpu", "2")], false, Some(CpuPolicy::Immovable))])];
    let mut c5 = case(
        "shared pool excludes exclusive CPUs",
        SEED,
        settings(NoPolicy),
        pod("p", vec![ctr("c", &[("cpu", "1")], false, None)]),
        Admit("0-1", &[("2-55,58-111", "")]),
    );
    c5.before = vec![g4()];
    let mut c6 = case(
        "already allocated",
        SEED,
        settings(NoPolicy),
        g4(),
        Reject(RejectReason::AlreadyAllocated, "already allocated"),
    );
    taken(&mut c6.allocations, "", &[], &[]);
    c6.allocations.pods.insert("pod".into(), Placement::default());
    // An 8-CPU machine without reserved CPUs: the shared pool can run dry.
    // BestEffort: no request, so only the pool rule can refuse it.
    let shared = || pod("s", vec![ctr("c", &[], false, None)]);
    let all8 = || pod("all", vec![gctr("c", "8", "1Gi")]);
    let two_by_four = "pack:1 numa:1 core:4 pu:2";
    let mut c7 = case(
        "a shared pod cannot run on an empty pool",
        two_by_four,
        settings(NoPolicy),
        shared(),
        Reject(
            RejectReason::InsufficientCpu,
            "no CPU would be left in the shared pool for this pod's shared containers",
        ),
    );
    c7.before = vec![all8()];
    let mut c8 = case(
        "an exclusive pod may not empty the pool under running shared pods",
        two_by_four,
        settings(NoPolicy),
        all8(),
        Reject(RejectReason::InsufficientCpu, "for the shared containers running here"),
    );
    c8.before = vec![shared()];
    let c9 = case(
        "with no shared container anywhere, exclusive may take every CPU",
        two_by_four,
        settings(NoPolicy),
        all8(),
        Admit("0", &[("0-7", "0")]),
    );
    let mut c10 = case(
        "reserved CPUs keep the pool alive",
        two_by_four,
        NodeSettings { reserved_cpus: CpuSet::parse_list("0,4").expect("list"), ..settings(NoPolicy) },
        shared(),
        Admit("0", &[("0,4", "")]),
    );
    c10.before = vec![pod("six", vec![gctr("c", "6", "1Gi")])];
    let mut c11 = case(
        "node totals count every pod's requests (the kubelet's allocatable check)",
        two_by_four,
        settings(NoPolicy),
        pod("b", vec![ctr("c", &[("cpu", "3"), ("memory", "1Gi")], false, None)]),
        Reject(RejectReason::InsufficientCpu, "requests 3 CPU but only 2500m of the node's 8 allocatable CPUs"),
    );
    c11.before =
        vec![pod("burst", vec![ctr("c", &[("cpu", "3500m")], false, None)]), pod("two", vec![gctr("c", "2", "1Gi")])];
    let mut c12 = case(
        "a pod that requests nothing fits a fully requested node",
        two_by_four,
        settings(NoPolicy),
        shared(),
        Admit("0", &[("1-3,5-7", "")]),
    );
    c12.before =
        vec![pod("burst", vec![ctr("c", &[("cpu", "6")], false, None)]), pod("two", vec![gctr("c", "2", "1Gi")])];
    for c in [c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12] {
        check(c);
    }
}

#[test]
fn two_by_ten_and_two_by_twenty() {
    let p20 = || pod("p", vec![gctr("c", "20", "1Gi")]);
    let p6 = || pod("p", vec![gctr("c", "6", "1Gi")]);
    let part = |name, policy, expect| {
        let mut c = case(name, M2X10, settings(policy), p6(), expect);
        taken(&mut c.allocations, "0-5,10-15", &[], &[]);
        c
    };
    let cases = vec![
        case(
            "20 CPUs single-numa-node do not fit 2x10",
            M2X10,
            settings(SingleNumaNode),
            p20(),
            Reject(
                RejectReason::TopologyAffinity,
                "no single NUMA node can hold 20 exclusive CPUs; the largest, node 0, has 10",
            ),
        ),
        case("20 CPUs single-numa-node fit 2x20", M2X20, settings(SingleNumaNode), p20(), Admit("0", &[("0-19", "0")])),
        case("20 CPUs best-effort span 2x10", M2X10, settings(BestEffort), p20(), Admit("0-1", &[("0-19", "0-1")])),
        case(
            "20 CPUs restricted: two nodes are the narrowest",
            M2X10,
            settings(Restricted),
            p20(),
            Admit("0-1", &[("0-19", "0-1")]),
        ),
        case(
            "pod override of the node's none",
            M2X10,
            settings(NoPolicy),
            with_topology(p20(), Some(SingleNumaNode), None),
            Reject(RejectReason::TopologyAffinity, "no single NUMA node"),
        ),
        part(
            "restricted refuses a split when one node would do",
            Restricted,
            Reject(
                RejectReason::TopologyAffinity,
                "no set of 1 NUMA node(s) has every request free; the narrowest that does is nodes 0,1",
            ),
        ),
        part(
            "single-numa-node names the best node",
            SingleNumaNode,
            Reject(
                RejectReason::TopologyAffinity,
                "no single NUMA node has 6 free exclusive CPUs; best is node 0 with 4",
            ),
        ),
        part("best-effort splits", BestEffort, Admit("0-1", &[("6-9,16-17", "0-1")])),
        part("none splits", NoPolicy, Admit("0-1", &[("6-9,16-17", "0")])),
    ];
    for c in cases {
        check(c);
    }
    // The 2x20 with 20 CPUs free but split 9 / 11: a 20-CPU pod finds no single node.
    let mut c = case(
        "best is node 1 with 11",
        M2X20,
        settings(SingleNumaNode),
        p20(),
        Reject(
            RejectReason::TopologyAffinity,
            "no single NUMA node has 20 free exclusive CPUs; best is node 1 with 11",
        ),
    );
    taken(&mut c.allocations, "0-10,20-28", &[], &[]);
    check(c);
}

#[test]
fn scopes() {
    // Node 0 has 6 free CPUs, node 1 has 10.
    let two = || pod("p", vec![gctr("a", "5", "1Gi"), gctr("b", "5", "1Gi")]);
    let mut container = case(
        "container scope places each container on its own best node",
        M2X10,
        settings(SingleNumaNode),
        two(),
        Admit("0-1", &[("4-8", "0"), ("10-14", "1")]),
    );
    taken(&mut container.allocations, "0-3", &[], &[]);
    let mut podscope = case(
        "pod scope keeps the pod on one node",
        M2X10,
        settings(SingleNumaNode),
        with_topology(two(), None, Some(TopologyScope::Pod)),
        Admit("1", &[("10-14", "1"), ("15-19", "1")]),
    );
    taken(&mut podscope.allocations, "0-3", &[], &[]);
    let mut node_default = case(
        "pod scope as the node default",
        M2X10,
        NodeSettings { topology_scope: TopologyScope::Pod, ..settings(SingleNumaNode) },
        two(),
        Admit("1", &[("10-14", "1"), ("15-19", "1")]),
    );
    taken(&mut node_default.allocations, "0-3", &[], &[]);
    let mut too_big = case(
        "pod scope refuses what only container scope can split",
        M2X10,
        NodeSettings { topology_scope: TopologyScope::Pod, ..settings(SingleNumaNode) },
        pod("p", vec![gctr("a", "6", "1Gi"), gctr("b", "6", "1Gi")]),
        Reject(RejectReason::TopologyAffinity, "no single NUMA node can hold 12 exclusive CPUs"),
    );
    taken(&mut too_big.allocations, "", &[], &[]);
    for c in [container, podscope, node_default, too_big] {
        check(c);
    }
}

#[test]
fn socket_alignment_and_closest_nodes() {
    // M4: node0 = 0-3,16-19, node1 = 4-7,20-23 (socket 0); node2, node3 (socket 1).
    let p8 = || pod("p", vec![gctr("c", "8", "1Gi")]);
    let mut plain = case(
        "restricted refuses two half-free nodes",
        M4,
        settings(Restricted),
        p8(),
        Reject(RejectReason::TopologyAffinity, "no set of 1 NUMA node(s)"),
    );
    taken(&mut plain.allocations, "0-1,16-17,4-5,20-21,8-15,24-31", &[], &[]);
    let mut aligned = case(
        "align-by-socket prefers two nodes of one socket",
        M4,
        NodeSettings { cpu_manager: opts(|o| o.align_by_socket = true), ..settings(Restricted) },
        p8(),
        Admit("0-1", &[("2-3,6-7,18-19,22-23", "0-1")]),
    );
    taken(&mut aligned.allocations, "0-1,16-17,4-5,20-21,8-15,24-31", &[], &[]);
    let p12 = || pod("p", vec![gctr("c", "12", "1Gi")]);
    let mut lowest = case(
        "narrowest, then the lowest nodes",
        M4,
        settings(BestEffort),
        p12(),
        Admit("0,2", &[("0-3,8-9,16-19,24-25", "0,2")]),
    );
    taken(&mut lowest.allocations, "4-7,20-23", &[], &[]);
    let mut closest = case(
        "prefer-closest-numa-nodes keeps to one socket",
        M4,
        NodeSettings { prefer_closest_numa_nodes: true, ..settings(BestEffort) },
        p12(),
        Admit("2-3", &[("8-13,24-29", "2-3")]),
    );
    taken(&mut closest.allocations, "4-7,20-23", &[], &[]);
    for c in [plain, aligned, lowest, closest] {
        check(c);
    }
}

fn with_hugepages(mut t: NodeTopology, pages: u64) -> NodeTopology {
    for n in &mut t.numa_nodes {
        n.hugepages = vec![HugePages { page_size_bytes: 2 << 20, total: pages }];
    }
    t
}

#[test]
fn memory_hugepages_and_devices() {
    let mem = |m: &str| pod("p", vec![gctr("c", "4", m)]);
    let mut moved = case(
        "memory exhaustion moves the pod to node 1",
        SEED,
        settings(SingleNumaNode),
        mem("40Gi"),
        Admit("1", &[("28-29,84-85", "1")]),
    );
    taken(&mut moved.allocations, "", &[(0, 30 * GI)], &[]);
    let mut spill = case(
        "best-effort: CPUs on node 0, memory extended to both",
        SEED,
        settings(BestEffort),
        mem("100Gi"),
        Admit("0-1", &[("0-1,56-57", "0-1")]),
    );
    taken(&mut spill.allocations, "", &[], &[]);
    let too_much = case(
        "memory beyond the machine",
        SEED,
        settings(SingleNumaNode),
        mem("200Gi"),
        Reject(RejectReason::InsufficientMemory, "requests 200Gi memory but only 128Gi of the node's 128Gi"),
    );
    let restricted_mem = case(
        "restricted: memory needs two nodes, so two nodes are preferred",
        SEED,
        settings(Restricted),
        mem("100Gi"),
        Admit("0-1", &[("0-1,56-57", "0-1")]),
    );
    let hp_pod = |amount: &str| {
        pod("p", vec![ctr("c", &[("cpu", "2"), ("memory", "1Gi"), ("hugepages-2Mi", amount)], true, None)])
    };
    let mut hp_moved = case(
        "huge page exhaustion moves the pod to node 1",
        SEED,
        settings(SingleNumaNode),
        hp_pod("400Mi"),
        Admit("1", &[("28,84", "1")]),
    );
    hp_moved.machine = with_hugepages(hp_moved.machine, 512);
    taken(&mut hp_moved.allocations, "", &[], &[(2 << 20, 0, 400)]);
    let mut hp_out = case(
        "huge pages beyond the machine",
        SEED,
        settings(SingleNumaNode),
        hp_pod("2Gi"),
        Reject(
            RejectReason::InsufficientHugePages,
            "requests 1024 hugepages-2Mi pages but only 624 of the node's 1024",
        ),
    );
    hp_out.machine = with_hugepages(hp_out.machine, 512);
    taken(&mut hp_out.allocations, "", &[], &[(2 << 20, 0, 400)]);
    let hp_odd = case(
        "huge pages in whole pages",
        SEED,
        settings(SingleNumaNode),
        hp_pod("3Mi"),
        Reject(RejectReason::InvalidRequest, "not a whole number of 2Mi pages"),
    );
    // Burstable pods' huge pages have no NUMA node but count on the node.
    let burst_hp = |name: &str| pod(name, vec![ctr("c", &[("cpu", "1"), ("hugepages-2Mi", "1Gi")], false, None)]);
    let mut hp_burst = case(
        "huge pages of Burstable pods count against the node's",
        SEED,
        settings(SingleNumaNode),
        burst_hp("p"),
        Reject(RejectReason::InsufficientHugePages, "requests 512 hugepages-2Mi pages but only 511 of the node's 1024"),
    );
    hp_burst.machine = with_hugepages(hp_burst.machine.clone(), 512);
    hp_burst.before = vec![
        burst_hp("a"),
        pod("g", vec![ctr("c", &[("cpu", "1"), ("memory", "1Gi"), ("hugepages-2Mi", "2Mi")], true, None)]),
    ];

    let mut dev_machine = machine(SEED);
    dev_machine.devices = vec![
        PciDevice { address: "0000:3b:00.0".into(), class: "0x020000".into(), numa: Some(1), ..Default::default() },
        PciDevice { address: "0000:3b:00.1".into(), class: "0x020000".into(), numa: Some(1), ..Default::default() },
    ];
    let mut dev_settings = settings(SingleNumaNode);
    dev_settings.devices.insert("pinion.io/nic".into(), vec!["0000:3b:00.0".into(), "0000:3b:00.1".into()]);
    let nic = |n: &str| pod("p", vec![ctr("c", &[("cpu", "4"), ("memory", "1Gi"), ("pinion.io/nic", n)], true, None)]);
    let mut far = case(
        "a device on the far node pulls the pod there",
        SEED,
        dev_settings.clone(),
        nic("1"),
        Admit("1", &[("28-29,84-85", "1")]),
    );
    far.machine = dev_machine.clone();
    let mut none_left = case(
        "devices exhausted",
        SEED,
        dev_settings.clone(),
        nic("3"),
        Reject(RejectReason::InsufficientDevices, "requests 3 pinion.io/nic devices but only 2 are free"),
    );
    none_left.machine = dev_machine.clone();
    let mut unknown = case(
        "a resource the node does not offer",
        SEED,
        dev_settings,
        pod("p", vec![ctr("c", &[("cpu", "1"), ("memory", "1Gi"), ("pinion.io/gpu", "1")], true, None)]),
        Reject(RejectReason::InsufficientDevices, "offers none"),
    );
    unknown.machine = dev_machine;
    for c in [moved, spill, too_much, restricted_mem, hp_moved, hp_out, hp_odd, hp_burst, far, none_left, unknown] {
        check(c);
    }
}

#[test]
fn device_placement_records_addresses() {
    let mut t = machine(SEED);
    t.devices = vec![PciDevice {
        address: "0000:3b:00.0".into(),
        class: "0x020000".into(),
        numa: Some(1),
        ..Default::default()
    }];
    let mut s = settings(SingleNumaNode);
    s.devices.insert("pinion.io/nic".into(), vec!["0000:3b:00.0".into()]);
    let p = pod("p", vec![ctr("c", &[("cpu", "2"), ("memory", "1Gi"), ("pinion.io/nic", "1")], true, None)]);
    let placed = admit(&t, &s, &Allocations::default(), "p", &p).expect("admitted");
    assert_eq!(placed.containers[0].devices["pinion.io/nic"], vec!["0000:3b:00.0".to_string()]);
    let mut a = Allocations::default();
    a.apply("p", placed);
    let r = admit(&t, &s, &a, "q", &p).expect_err("the only device is taken");
    assert_eq!(r.reason, RejectReason::InsufficientDevices);
}

#[test]
fn seventeen_nodes() {
    let g = |cpu: &str, mem: &str| pod("p", vec![gctr("c", cpu, mem)]);
    let mut busy = case(
        "node 0 busy: the next node",
        "17n",
        settings(SingleNumaNode),
        g("4", "1Gi"),
        Admit("1", &[("8-11", "1")]),
    );
    taken(&mut busy.allocations, "0-5", &[], &[]);
    let cases = vec![
        case(
            "4 CPUs: two whole sockets of node 0",
            "17n",
            settings(SingleNumaNode),
            g("4", "1Gi"),
            Admit("0", &[("0-3", "0")]),
        ),
        case("8 CPUs: a whole node", "17n", settings(SingleNumaNode), g("8", "1Gi"), Admit("0", &[("0-7", "0")])),
        case(
            "16 CPUs do not fit one node",
            "17n",
            settings(SingleNumaNode),
            g("16", "1Gi"),
            Reject(
                RejectReason::TopologyAffinity,
                "no single NUMA node can hold 16 exclusive CPUs; the largest, node 0, has 8",
            ),
        ),
        case(
            "16 CPUs restricted: two nodes",
            "17n",
            settings(Restricted),
            g("16", "1Gi"),
            Admit("0-1", &[("0-15", "0-1")]),
        ),
        case(
            "memory wider than a node widens the affinity",
            "17n",
            settings(Restricted),
            g("4", "150Gi"),
            Admit("0-1", &[("0-3", "0-1")]),
        ),
        case(
            "100 CPUs best-effort across 13 nodes",
            "17n",
            settings(BestEffort),
            g("100", "1Gi"),
            Admit("0-12", &[("0-99", "0-12")]),
        ),
        busy,
    ];
    for c in cases {
        check(c);
    }
}

#[test]
fn pod_with_every_policy_in_it() {
    let p = pod(
        "p",
        vec![
            ctr("e", &[("cpu", "2"), ("memory", "1Gi")], true, Some(CpuPolicy::Exclusive)),
            ctr("i", &[("cpu", "2"), ("memory", "1Gi")], true, Some(CpuPolicy::Immovable)),
            ctr("n", &[("cpu", "1"), ("memory", "1Gi")], true, Some(CpuPolicy::Numa)),
            ctr("s", &[("cpu", "1"), ("memory", "1Gi")], true, Some(CpuPolicy::Shared)),
        ],
    );
    check(case(
        "exclusive, immovable, numa and shared in one pod",
        SEED,
        NodeSettings { topology_scope: TopologyScope::Pod, ..settings(SingleNumaNode) },
        p,
        Admit("0", &[("0,56", "0"), ("1,57", "0"), ("1-27,57-83", "0"), ("1-55,57-111", "0")]),
    ));
}

#[test]
fn cpuset_type_round_trip_is_what_plan_prints() {
    // The CLI prints CPU lists as sorted arrays; the engine's CpuSet serializes so.
    let s: CpuSet = "3,1-2".parse().expect("test input");
    assert_eq!(serde_json::to_string(&s).expect("test input"), "[1,2,3]");
}

/// Two NUMA nodes of four CPUs; node 1 has CPUs but no memory (issue 12,
/// hole 8: an online node may have CPUs and no memory).
fn memoryless_node_1() -> NodeTopology {
    let mut t = machine("pack:1 numa:2 core:4 pu:1");
    t.numa_nodes[1].memory_bytes = 0;
    t
}

#[test]
fn memory_is_never_bound_to_a_node_without_memory() {
    let numa_ctr = |cpu: &str| ctr("c", &[("cpu", cpu)], false, Some(CpuPolicy::Numa));
    let mut cases = vec![
        Case {
            machine: memoryless_node_1(),
            ..case(
                "guaranteed, the only free CPUs on the memoryless node: memory from node 0",
                "pack:1 numa:2 core:4 pu:1",
                settings(BestEffort),
                pod("p", vec![gctr("c", "1", "1Gi")]),
                Admit("0-1", &[("4", "0")]),
            )
        },
        Case {
            machine: memoryless_node_1(),
            ..case(
                "a numa container on the memoryless node binds the nearest node with memory",
                "pack:1 numa:2 core:4 pu:1",
                settings(NoPolicy),
                pod("p", vec![numa_ctr("1")]),
                Admit("0-1", &[("4-7", "0")]),
            )
        },
        Case {
            machine: memoryless_node_1(),
            ..case(
                "single-numa-node: no node has both the CPU and the memory",
                "pack:1 numa:2 core:4 pu:1",
                settings(SingleNumaNode),
                pod("p", vec![gctr("c", "1", "1Gi")]),
                Reject(RejectReason::TopologyAffinity, ""),
            )
        },
    ];
    for c in &mut cases {
        // Node 0's CPUs are all held exclusively, so CPUs come from node 1 only.
        taken(&mut c.allocations, "0-3", &[], &[]);
    }
    for c in cases {
        check(c);
    }
}

/// node0 offline while its CPUs 0-3 stay online: they are in no node.
fn node0_offline() -> NodeTopology {
    let mut t = machine("pack:1 numa:2 core:4 pu:1");
    for c in t.cpus.iter_mut().filter(|c| c.numa == Some(0)) {
        c.numa = None;
    }
    t.numa_nodes.retain(|n| n.id != 0);
    t.numa_nodes[0].distances = vec![10];
    assert!(specs::validate::validate_topology(&t).is_empty(), "{:?}", specs::validate::validate_topology(&t));
    t
}

#[test]
fn cpus_in_no_online_node_are_never_aligned() {
    let p =
        |cpus: &str, policy: TopologyPolicy| with_topology(pod("p", vec![gctr("c", cpus, "1Gi")]), Some(policy), None);
    let on = |c: Case| Case { machine: node0_offline(), ..c };
    let d = "pack:1 numa:2 core:4 pu:1";
    let s = settings(NoPolicy);
    for c in [
        on(case(
            "single-numa-node: node 1's CPUs only",
            d,
            s.clone(),
            p("2", SingleNumaNode),
            Admit("1", &[("4-5", "1")]),
        )),
        on(case(
            "single-numa-node: more than node 1 holds is refused, not topped up from CPUs in no node",
            d,
            s.clone(),
            p("5", SingleNumaNode),
            Reject(RejectReason::TopologyAffinity, "NUMA"),
        )),
        on(case(
            "restricted likewise",
            d,
            s.clone(),
            p("5", Restricted),
            Reject(RejectReason::TopologyAffinity, "NUMA"),
        )),
        on(case("policy none may use them", d, s.clone(), p("6", NoPolicy), Admit("1", &[("0-1,4-7", "1")]))),
        on(case(
            "best-effort: node 1 first, then them",
            d,
            s.clone(),
            p("6", BestEffort),
            Admit("1", &[("0-1,4-7", "1")]),
        )),
    ] {
        check(c);
    }
}
