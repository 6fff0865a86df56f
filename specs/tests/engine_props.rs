//! Property tests of the admission engine: invariants over random machines
//! (synthetic descriptions, with or without memory-only nodes, and raw,
//! possibly inconsistent topologies), random settings and random sequences of
//! pods (some asking for the memory-only nodes, some relaxing their memory).

use std::collections::BTreeMap;

use proptest::prelude::*;
use specs::engine::{admit, Allocations, CpuManagerOptions, NodeSettings};
use specs::pod::{Container, CpuPolicy, MemoryPlacement, Pod, TopologyPolicy, TopologyScope};
use specs::topology::{Cpu, NodeTopology, NumaKind, NumaNode};
use specs::{CpuSet, NumaSet, Quantity};

mod tiers;

#[derive(Debug, Clone)]
struct Ctr {
    millis: u32,
    mem_mib: u32,
    guaranteed: bool,
    policy: Option<CpuPolicy>,
}

fn ctr_strategy() -> impl Strategy<Value = Ctr> {
    (
        prop_oneof![0u32..=12_000, (0u32..=12).prop_map(|c| c * 1000)],
        0u32..=100_000,
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(CpuPolicy::Exclusive)),
            Just(Some(CpuPolicy::Numa)),
            Just(Some(CpuPolicy::Immovable)),
            Just(Some(CpuPolicy::Shared)),
        ],
    )
        .prop_map(|(millis, mem_mib, guaranteed, policy)| Ctr { millis, mem_mib, guaranteed, policy })
}

/// What a pod says in `spec.topology` besides policy and scope.
#[derive(Debug, Clone, Copy, Default)]
struct Asks {
    /// `memory: nearest-memory-only`.
    tier: bool,
    /// `relaxed: [memory]`.
    relax_memory: bool,
}

fn pod(i: usize, ctrs: &[Ctr], policy: Option<TopologyPolicy>, scope: Option<TopologyScope>, asks: Asks) -> Pod {
    let containers = ctrs
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let mut res = BTreeMap::new();
            if c.millis > 0 {
                res.insert("cpu".to_string(), Quantity::from_millis(i64::from(c.millis)));
            }
            if c.mem_mib > 0 {
                res.insert("memory".to_string(), Quantity::parse(&format!("{}Mi", c.mem_mib)).expect("test input"));
            }
            let mut k = Container { name: format!("c{j}"), cpu_policy: c.policy, ..Default::default() };
            k.resources.requests = res.clone();
            if c.guaranteed {
                k.resources.limits = res;
            }
            k
        })
        .collect();
    let topology =
        (policy.is_some() || scope.is_some() || asks.tier || asks.relax_memory).then(|| specs::pod::TopologySpec {
            policy,
            scope,
            memory: if asks.tier { MemoryPlacement::NearestMemoryOnly } else { MemoryPlacement::CpuNodes },
            relaxed: if asks.relax_memory { vec!["memory".into()] } else { vec![] },
        });
    let p = specs::testing::pod(&format!("p{i}")).containers(containers);
    match topology {
        Some(t) => p.topology(t),
        None => p,
    }
    .build()
}

fn policy_strategy() -> impl Strategy<Value = TopologyPolicy> {
    prop_oneof![
        Just(TopologyPolicy::None),
        Just(TopologyPolicy::BestEffort),
        Just(TopologyPolicy::Restricted),
        Just(TopologyPolicy::SingleNumaNode),
    ]
}

fn scope_strategy() -> impl Strategy<Value = TopologyScope> {
    prop_oneof![Just(TopologyScope::Container), Just(TopologyScope::Pod)]
}

fn settings_strategy() -> impl Strategy<Value = NodeSettings> {
    // Every combination, the kubelet's incompatible ones too: the engine must
    // keep its invariants whatever settings reach it.
    (policy_strategy(), scope_strategy(), any::<[bool; 7]>(), proptest::collection::vec(0u32..64, 0..4)).prop_map(
        |(policy, scope, b, reserved)| NodeSettings {
            reserved_cpus: CpuSet::from_ids(reserved).expect("ids below 64"),
            topology_policy: policy,
            topology_scope: scope,
            cpu_manager: CpuManagerOptions {
                full_pcpus_only: b[0],
                distribute_cpus_across_numa: b[1],
                align_by_socket: b[2],
                distribute_cpus_across_cores: b[4],
                prefer_align_cpus_by_uncore_cache: b[5],
                strict_cpu_reservation: b[6],
            },
            prefer_closest_numa_nodes: b[3],
            devices: BTreeMap::new(),
        },
    )
}

type PodPlan = (Vec<Ctr>, Option<TopologyPolicy>, Option<TopologyScope>, Asks);

fn pods_strategy() -> impl Strategy<Value = Vec<PodPlan>> {
    proptest::collection::vec(
        (
            proptest::collection::vec(ctr_strategy(), 1..4),
            proptest::option::of(policy_strategy()),
            proptest::option::of(scope_strategy()),
            // A pod asks for memory-only nodes or relaxes its memory one time in four each.
            (0u8..4, 0u8..4).prop_map(|(t, r)| Asks { tier: t == 0, relax_memory: r == 0 && t != 0 }),
        ),
        1..8,
    )
}

/// Admits the pods in order and checks every invariant after each admission.
///
/// What `single-numa-node` promises, with memory-only nodes: each container's
/// exclusive CPUs are on one node and its `mems` name at most one node (a
/// memory-only one for a pod that asked for those); under scope `pod`, the
/// pod touches one CPU node, where "touches" is: holds exclusive or
/// immovable CPUs there, or is bound to its memory. The near-memory node of
/// a pod that asked is not a CPU node it touches, and a pod that relaxed its
/// memory may have it on more nodes.
fn run(t: &NodeTopology, s: &NodeSettings, pods: &[PodPlan]) -> Result<(), TestCaseError> {
    let mut a = Allocations::default();
    let reserved = s.reserved_cpus.union(&t.reserved_cpus);
    let memory_only = NumaSet::from_ids(t.numa_nodes.iter().filter(|n| n.kind == NumaKind::MemoryOnly).map(|n| n.id))
        .expect("small ids");
    for (i, (ctrs, policy, scope, asks)) in pods.iter().enumerate() {
        let p = pod(i, ctrs, *policy, *scope, *asks);
        let key = format!("p{i}");
        let got = admit(t, s, &a, &key, &p);
        // Same inputs, same answer, byte for byte.
        let again = admit(t, s, &a, &key, &p);
        prop_assert_eq!(format!("{got:?}"), format!("{again:?}"));
        let Ok(placed) = got else { continue };
        let effective = policy.unwrap_or(s.topology_policy);
        let eff_scope = scope.unwrap_or(s.topology_scope);
        let before = a.pinned_cpus();
        let mut pod_nodes = CpuSet::new();
        for c in &placed.containers {
            prop_assert!(c.cpus.is_subset(&t.all_cpus()), "CPUs outside the machine: {:?}", c.cpus);
            if matches!(c.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable) {
                prop_assert!(c.cpus.is_disjoint(&reserved), "reserved CPU handed out: {:?}", c.cpus);
                prop_assert!(c.cpus.is_disjoint(&before), "CPU given twice: {:?} vs {:?}", c.cpus, before);
                if matches!(effective, TopologyPolicy::SingleNumaNode | TopologyPolicy::Restricted) {
                    // A CPU no online node lists is local to no memory: never aligned.
                    let loose: Vec<u32> =
                        c.cpus.iter().filter(|&id| t.cpu(id).is_some_and(|x| x.numa.is_none())).collect();
                    prop_assert!(loose.is_empty(), "{effective:?} took CPUs in no NUMA node: {loose:?}");
                }
                if effective == TopologyPolicy::SingleNumaNode {
                    let nodes = CpuSet::from_ids(c.cpus.iter().filter_map(|id| t.cpu(id)?.numa)).expect("small ids");
                    prop_assert!(nodes.len() <= 1, "single-numa-node spans {:?}", nodes);
                    pod_nodes.union_with(&nodes);
                }
            }
            let accounted: NumaSet =
                NumaSet::from_ids(c.memory.keys().chain(c.hugepages.values().flat_map(|n| n.keys())).copied())
                    .expect("small ids");
            if asks.tier {
                // Accounted memory only on memory-only nodes, and bound there.
                prop_assert!(accounted.is_subset(&memory_only), "tier memory on {:?}", accounted);
                if !accounted.is_empty() {
                    prop_assert_eq!(&c.mems, &accounted);
                }
            } else {
                prop_assert!(c.mems.is_disjoint(&memory_only), "default pod bound to memory-only {:?}", c.mems);
                prop_assert!(accounted.is_disjoint(&memory_only), "default pod's memory on {:?}", accounted);
            }
            if effective == TopologyPolicy::SingleNumaNode && !asks.relax_memory {
                prop_assert!(c.mems.len() <= 1, "single-numa-node mems {:?}", c.mems);
                pod_nodes.union_with(&c.mems.difference(&memory_only));
            }
        }
        if effective == TopologyPolicy::SingleNumaNode {
            // (A pod without any hint gets every node, the kubelet's "don't care".)
            if eff_scope == TopologyScope::Pod {
                prop_assert!(pod_nodes.len() <= 1, "pod scope spans {:?}", pod_nodes);
            }
        }
        // Under strict-cpu-reservation no shared or numa container runs on a
        // reserved CPU (unless the pool had nothing else: never, the engine
        // refuses a pod that would empty it).
        if s.cpu_manager.strict_cpu_reservation {
            for c in placed.containers.iter().filter(|c| matches!(c.cpu_policy, CpuPolicy::Shared | CpuPolicy::Numa)) {
                prop_assert!(
                    c.cpus.is_disjoint(&reserved),
                    "strict: {:?} cpus {:?} include reserved {:?}",
                    c.cpu_policy,
                    c.cpus,
                    reserved
                );
            }
        }
        // Containers of the same pod never share exclusive CPUs either.
        let mut seen = CpuSet::new();
        for c in
            placed.containers.iter().filter(|c| matches!(c.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable))
        {
            prop_assert!(c.cpus.is_disjoint(&seen));
            seen.union_with(&c.cpus);
        }
        a.apply(&key, placed);
        // The live cpusets (the pool moves as pods come) keep the rule too.
        if s.cpu_manager.strict_cpu_reservation {
            for c in a
                .pods
                .values()
                .flat_map(|p| &p.containers)
                .filter(|c| matches!(c.cpu_policy, CpuPolicy::Shared | CpuPolicy::Numa))
            {
                let live = a.cpuset_for(t, s, c);
                prop_assert!(
                    live.is_disjoint(&reserved),
                    "strict: live cpuset {:?} includes reserved {:?}",
                    live,
                    reserved
                );
            }
        }
        // Memory accounted never exceeds a node's memory.
        for n in &t.numa_nodes {
            let used: u64 =
                a.pods.values().flat_map(|p| &p.containers).map(|c| c.memory.get(&n.id).copied().unwrap_or(0)).sum();
            prop_assert!(used <= n.memory_bytes, "node {} over-committed: {used} > {}", n.id, n.memory_bytes);
        }
    }
    Ok(())
}

fn synthetic_strategy() -> impl Strategy<Value = String> {
    (1u32..=4, 1u32..=4, 1u32..=6, 1u32..=2, 1u32..=2)
        .prop_map(|(p, n, c, t, gib)| format!("pack:{p} numa:{n}(memory={}GiB) core:{c} pu:{t}", gib * 16))
}

/// Last-level-cache groups of `cores` consecutive cores (0: none named).
fn with_l3(mut t: NodeTopology, cores: u32) -> NodeTopology {
    for c in &mut t.cpus {
        c.uncore_cache = c.core.checked_div(cores);
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_on_synthetic_machines(desc in synthetic_strategy(), l3 in 0u32..=3, s in settings_strategy(), pods in pods_strategy()) {
        let t = with_l3(specs::topology::synthetic::parse(&desc).expect("test input"), l3);
        run(&t, &s, &pods)?;
    }

    /// The same on machines with memory-only nodes (HBM, CXL) at random distances.
    #[test]
    fn invariants_hold_with_memory_only_nodes(
        desc in synthetic_strategy(),
        extra in proptest::collection::vec((1u64..=64, proptest::collection::vec(11u32..=60, 24)), 1..=3),
        s in settings_strategy(),
        pods in pods_strategy(),
    ) {
        let mut t = specs::topology::synthetic::parse(&desc).expect("test input");
        for (gib, distances) in extra {
            let n = t.numa_nodes.len();
            tiers::add_memory_only(&mut t, gib << 30, 0, &distances[..n]);
        }
        prop_assert!(specs::validate::validate_topology(&t).is_empty());
        run(&t, &s, &pods)?;
    }

    /// The same on machines where some online CPUs are in no online NUMA
    /// node (their node went offline, they did not).
    #[test]
    fn invariants_hold_with_cpus_in_no_node(
        desc in synthetic_strategy(),
        loose in proptest::collection::vec(any::<bool>(), 64),
        s in settings_strategy(),
        pods in pods_strategy(),
    ) {
        let mut t = specs::topology::synthetic::parse(&desc).expect("test input");
        // Whole cores at a time, as the kernel offlines a node.
        for c in &mut t.cpus {
            if loose.get(c.core as usize).copied().unwrap_or(false) {
                c.numa = None;
            }
        }
        for n in &mut t.numa_nodes {
            n.cpus = CpuSet::from_ids(t.cpus.iter().filter(|c| c.numa == Some(n.id)).map(|c| c.id)).expect("small ids");
        }
        prop_assert!(specs::validate::validate_topology(&t).is_empty(), "{:?}", specs::validate::validate_topology(&t));
        run(&t, &s, &pods)?;
    }

    /// Any topology serde accepts, however inconsistent (CPUs on unlisted nodes,
    /// short distance rows, duplicate ids, CPU-less nodes, memory-only nodes
    /// with CPUs), gives an answer, never a panic.
    #[test]
    fn never_panics_on_raw_topologies(
        cpus in proptest::collection::vec((0u32..40, 0u32..10, 0u32..4, proptest::option::of(0u32..5), proptest::option::of(0u32..6)), 0..40),
        nodes in proptest::collection::vec((0u32..5, 0u64..(1 << 36), proptest::collection::vec(0u32..50, 0..6), any::<bool>()), 0..6),
        s in settings_strategy(),
        pods in pods_strategy(),
    ) {
        let mut cpus: Vec<Cpu> = cpus.into_iter().map(|(id, core, socket, numa, uncore_cache)| Cpu { id, core, socket, die: None, numa, uncore_cache }).collect();
        cpus.sort_by_key(|c| c.id);
        let numa_nodes = nodes
            .into_iter()
            .map(|(id, memory_bytes, distances, memory_only)| NumaNode {
                // Memory-only or not, with CPUs or without.
                kind: if memory_only { NumaKind::MemoryOnly } else { NumaKind::CpusAndMemory },
                id,
                cpus: CpuSet::from_ids(cpus.iter().filter(|c| c.numa == Some(id)).map(|c| c.id)).expect("small ids"),
                memory_bytes,
                distances,
                hugepages: vec![],
            })
            .collect();
        let t = NodeTopology { cpus, numa_nodes, devices: vec![], reserved_cpus: CpuSet::new(), kernel: Default::default() };
        for (i, (ctrs, policy, scope, asks)) in pods.iter().enumerate() {
            let _ = admit(&t, &s, &Allocations::default(), "k", &pod(i, ctrs, *policy, *scope, *asks));
        }
    }

    /// The synthetic parser answers every string with a topology or an error.
    #[test]
    fn synthetic_parser_never_panics(desc in "[a-z0-9:() =,]{0,40}") {
        let _ = specs::topology::synthetic::parse(&desc);
    }
}
