//! Property test: the summary pre-filters are sound against the engine.
//!
//! The scheduler rules nodes out with `filter::quick` (the hot summary) and
//! `filter::totals` + `filter::numa` (the full summary) before it runs the
//! engine. Ruling out a node the engine would admit the pod on loses a
//! placement, so on random machines, settings, engine-admitted allocations and
//! pods this checks: the engine admits => the pre-filters pass the node, and
//! `schedule` on that node alone binds the engine's placement.
//!
//! No exception: the scheduler's request accounting (node totals, as the
//! Kubernetes scheduler's) is the engine's allocatable check, counted the same
//! way (`Placement::counted`).
//!
//! The converse (the filters pass a node the engine then rejects) is allowed;
//! its rate is printed with `--nocapture`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use specs::pod::{ResourceRequirements, TopologySpec};
use specs::topology::{Cpu, HugePages, NumaNode, PciDevice};
use specs::{
    Allocations, Container, CpuManagerOptions, CpuPolicy, CpuSet, NodeSettings, NodeTopology, Pod, PodSpec, Quantity,
    TopologyPolicy, TopologyScope,
};

use super::demand::Demand;
use super::filter::{self, Quick};
use super::tests::{node, scheduler, ENGINE, VF};
use super::SchedulerConfig;

const MI: u64 = 1 << 20;
const PAGE: u64 = 2 * MI;

#[derive(Debug, Clone)]
struct NumaGen {
    cores: u32,
    memory_mib: u64,
    hugepages: u64,
}

#[derive(Debug, Clone)]
struct NodeGen {
    numa: Vec<NumaGen>,
    smt: bool,
    /// One socket for the whole machine, else one per NUMA node.
    one_socket: bool,
    /// Indexes into the machine's CPUs (taken modulo their number).
    reserved: Vec<u32>,
    /// One entry per device: its NUMA node (index, modulo their number), if any.
    devices: Vec<Option<u32>>,
    policy: TopologyPolicy,
    scope: TopologyScope,
    options: [bool; 4],
    /// Node 0's CPUs are in no node (as when the node is offline and they
    /// are not); it keeps its memory.
    loose: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

#[derive(Debug, Clone)]
struct CtrGen {
    /// Millicores: whole CPUs or a fraction.
    cpu_millis: u32,
    memory_mib: u64,
    hugepages: u64,
    devices: u32,
    /// Burstable only: limits above requests (else no limits at all).
    limits_above: bool,
    policy: Option<CpuPolicy>,
}

#[derive(Debug, Clone)]
struct PodGen {
    qos: Qos,
    containers: Vec<CtrGen>,
    policy: Option<TopologyPolicy>,
    scope: Option<TopologyScope>,
}

#[derive(Debug, Clone)]
struct Case {
    node: NodeGen,
    /// Admitted in order; those marked `true` leave again afterwards (holes).
    existing: Vec<(PodGen, bool)>,
    pod: PodGen,
}

/// The policies that rule nodes out per NUMA node more often than the others.
fn policy() -> impl Strategy<Value = TopologyPolicy> {
    prop_oneof![
        1 => Just(TopologyPolicy::None),
        1 => Just(TopologyPolicy::BestEffort),
        2 => Just(TopologyPolicy::Restricted),
        2 => Just(TopologyPolicy::SingleNumaNode),
    ]
}

fn scope() -> impl Strategy<Value = TopologyScope> {
    prop_oneof![Just(TopologyScope::Container), Just(TopologyScope::Pod)]
}

fn node_gen() -> impl Strategy<Value = NodeGen> {
    let numa = (prop_oneof![1 => Just(0u32), 6 => 1u32..=4], 1u64..=8, 0u64..=8)
        .prop_map(|(cores, half_gib, hugepages)| NumaGen { cores, memory_mib: half_gib * 512, hugepages });
    (
        proptest::collection::vec(numa, 1..=4),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(0u32..32, 0..=2),
        proptest::collection::vec(proptest::option::weighted(0.8, 0u32..4), 0..=4),
        policy(),
        scope(),
        any::<[bool; 4]>(),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(numa, smt, one_socket, reserved, devices, policy, scope, options, loose)| NodeGen {
            numa,
            smt,
            one_socket,
            reserved,
            devices,
            policy,
            scope,
            options,
            loose,
        })
}

/// A container of up to `cpus` whole CPUs and `memory_mib` of memory; huge
/// pages, devices and an explicit CPU policy in one container out of `1 + plain`.
fn ctr_gen(cpus: u32, memory_mib: u64, plain: u32) -> impl Strategy<Value = CtrGen> {
    (
        prop_oneof![3 => (1..=cpus).prop_map(|c| c * 1000), 1 => (1u32..=25).prop_map(|c| c * 100)],
        prop_oneof![Just(0u64), (1..=memory_mib / 256).prop_map(|h| h * 256)],
        prop_oneof![plain => Just(0u64), 1 => 1u64..=8],
        prop_oneof![plain => Just(0u32), 1 => 1u32..=3],
        any::<bool>(),
        prop_oneof![
            2 * plain => Just(None),
            1 => Just(Some(CpuPolicy::Exclusive)),
            1 => Just(Some(CpuPolicy::Immovable)),
            1 => Just(Some(CpuPolicy::Numa)),
            1 => Just(Some(CpuPolicy::Shared)),
        ],
    )
        .prop_map(|(cpu_millis, memory_mib, hugepages, devices, limits_above, policy)| CtrGen {
            cpu_millis,
            memory_mib,
            hugepages,
            devices,
            limits_above,
            policy,
        })
}

fn pod_gen(cpus: u32, memory_mib: u64, plain: u32) -> impl Strategy<Value = PodGen> {
    (
        prop_oneof![3 => Just(Qos::Guaranteed), 1 => Just(Qos::Burstable), 1 => Just(Qos::BestEffort)],
        proptest::collection::vec(ctr_gen(cpus, memory_mib, plain), 1..=2),
        proptest::option::weighted(0.3, policy()),
        proptest::option::weighted(0.3, scope()),
    )
        .prop_map(|(qos, containers, policy, scope)| PodGen { qos, containers, policy, scope })
}

fn case_gen() -> impl Strategy<Value = Case> {
    // Small pods already there (so that several fit and fragment the machine),
    // then a pod of any size.
    let existing = proptest::collection::vec((pod_gen(3, 1024, 8), proptest::bool::weighted(0.4)), 0..=10);
    (node_gen(), existing, pod_gen(6, 6144, 3)).prop_map(|(node, existing, pod)| Case { node, existing, pod })
}

/// The machine and settings: Linux numbering (first threads of every core, then
/// their siblings), NUMA node `i` on socket `i` unless `one_socket`.
fn build_node(g: &NodeGen) -> (NodeTopology, NodeSettings) {
    let threads = if g.smt { 2 } else { 1 };
    let total_cores: u32 = g.numa.iter().map(|n| n.cores).sum();
    let n = g.numa.len();
    let mut t = NodeTopology::default();
    let mut core = 0;
    for (i, numa) in g.numa.iter().enumerate() {
        let id = i as u32;
        let socket = if g.one_socket { 0 } else { id };
        let mut ids = Vec::new();
        for _ in 0..numa.cores {
            for th in 0..threads {
                let cpu = core + th * total_cores;
                ids.push(cpu);
                t.cpus.push(Cpu { id: cpu, core, socket, die: None, numa: Some(id), uncore_cache: None });
            }
            core += 1;
        }
        t.numa_nodes.push(NumaNode {
            kind: Default::default(),
            id,
            cpus: CpuSet::from_ids(ids).expect("id within MAX_ID"),
            memory_bytes: numa.memory_mib * MI,
            distances: (0..n).map(|j| if j == i { 10 } else { 20 }).collect(),
            hugepages: vec![HugePages { page_size_bytes: PAGE, total: numa.hugepages }],
        });
    }
    if g.loose && n > 1 {
        for c in t.cpus.iter_mut().filter(|c| c.numa == Some(0)) {
            c.numa = None;
        }
        t.numa_nodes[0].cpus = CpuSet::new();
    }
    t.cpus.sort_by_key(|c| c.id);
    let all = t.cpus.len() as u32;
    let mut settings = NodeSettings {
        topology_policy: g.policy,
        topology_scope: g.scope,
        cpu_manager: CpuManagerOptions {
            full_pcpus_only: g.options[0],
            distribute_cpus_across_numa: g.options[1],
            align_by_socket: g.options[2],
            ..CpuManagerOptions::default()
        },
        prefer_closest_numa_nodes: g.options[3],
        ..NodeSettings::default()
    };
    if all > 0 {
        settings.reserved_cpus = CpuSet::from_ids(g.reserved.iter().map(|r| r % all)).expect("id within MAX_ID");
    }
    let mut addrs = Vec::new();
    for (k, numa) in g.devices.iter().enumerate() {
        let address = format!("0000:3b:00.{k}");
        t.devices.push(PciDevice {
            address: address.clone(),
            class: "0x020000".into(),
            numa: numa.map(|x| x % n as u32),
            ..Default::default()
        });
        addrs.push(address);
    }
    if !addrs.is_empty() {
        settings.devices.insert(VF.into(), addrs);
    }
    (t, settings)
}

fn build_pod(name: &str, g: &PodGen) -> Pod {
    let containers = g
        .containers
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let mut requests = BTreeMap::new();
            let mut limits = BTreeMap::new();
            let cpu = Quantity::from_millis(i64::from(c.cpu_millis));
            let memory = Quantity::from_units((c.memory_mib.max(256) * MI) as i64);
            match g.qos {
                Qos::Guaranteed => {
                    for (k, q) in [("cpu", cpu), ("memory", memory)] {
                        requests.insert(k.to_string(), q.clone());
                        limits.insert(k.to_string(), q);
                    }
                }
                Qos::Burstable => {
                    requests.insert("cpu".to_string(), cpu);
                    if c.memory_mib > 0 {
                        requests.insert("memory".to_string(), Quantity::from_units((c.memory_mib * MI) as i64));
                    }
                    if c.limits_above {
                        limits.insert("cpu".to_string(), Quantity::from_millis(i64::from(c.cpu_millis) + 500));
                    }
                }
                Qos::BestEffort => {}
            }
            // Huge pages and devices: requests equal to limits, as Kubernetes wants them.
            if c.hugepages > 0 {
                let q = Quantity::from_units((c.hugepages * PAGE) as i64);
                requests.insert("hugepages-2Mi".to_string(), q.clone());
                limits.insert("hugepages-2Mi".to_string(), q);
            }
            if c.devices > 0 {
                let q = Quantity::from_units(i64::from(c.devices));
                requests.insert(VF.to_string(), q.clone());
                limits.insert(VF.to_string(), q);
            }
            Container {
                name: format!("c{j}"),
                resources: ResourceRequirements { requests, limits },
                cpu_policy: c.policy,
                ..Container::default()
            }
        })
        .collect();
    let topology = (g.policy.is_some() || g.scope.is_some()).then_some(TopologySpec {
        policy: g.policy,
        scope: g.scope,
        ..Default::default()
    });
    Pod::new(name, PodSpec { containers, topology, ..PodSpec::default() })
}

#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    engine_admits: usize,
    filter_passes: usize,
    /// The filters passed and the engine rejected (allowed: the filters are
    /// necessary conditions, not sufficient ones).
    filter_passes_engine_rejects: usize,
}

/// The state the engine built, then the scheduler's pre-filters and the engine
/// on the candidate pod.
fn check(case: &Case, tally: &mut Tally) -> Result<(), TestCaseError> {
    let (topology, settings) = build_node(&case.node);
    let mut allocations = Allocations::default();
    for (i, (g, _)) in case.existing.iter().enumerate() {
        let key = format!("default/old-{i}");
        if let Ok(p) = ENGINE(&topology, &settings, &allocations, &key, &build_pod(&key, g)) {
            allocations.apply(&key, p);
        }
    }
    // Pods that finished leave holes the engine's packing alone would not make.
    for (i, _) in case.existing.iter().enumerate().filter(|(_, (_, gone))| *gone) {
        allocations.release(&format!("default/old-{i}"));
    }
    let mut info = node("n", &[1]);
    info.topology = Arc::new(topology);
    info.settings = settings;
    info.allocations = allocations;
    // The allocations arrive as the node's report: the scheduler knows no demands.
    let mut s = scheduler(SchedulerConfig::default(), vec![info]);

    let pod = build_pod("new", &case.pod);
    let demand = Demand::of(&pod);
    let n = &s.nodes[0].info;
    // The engine as `schedule` calls it: the node's mirror, the pod key.
    let engine = (s.admit)(&n.topology, &n.settings, &n.allocations, "default/new", &pod);
    let quick = filter::quick(&s.hot[0], &demand, true);
    let full = s.check_summary(0, &demand);
    match quick {
        Quick::Fit => prop_assert_eq!(&full, &Ok(()), "the hot summary fits, the full one does not"),
        Quick::NoFit => prop_assert!(full.is_err(), "the hot summary rules out what the full one admits"),
        Quick::Unknown => {}
    }
    let passes = match quick {
        Quick::Fit => true,
        Quick::NoFit => false,
        Quick::Unknown => full.is_ok(),
    };
    tally.cases += 1;
    tally.engine_admits += usize::from(engine.is_ok());
    tally.filter_passes += usize::from(passes);
    match (&engine, &full) {
        (Ok(placement), Err(d)) => {
            return Err(TestCaseError::fail(format!(
                "the pre-filters rule out a node the engine admits the pod on: {d} ({d:?}); the engine's placement: {placement:?}"
            )))
        }
        (Ok(placement), Ok(())) => {
            // The whole pipeline on this one node binds the engine's answer.
            let b = s.schedule("default/new", &pod, std::time::Instant::now());
            prop_assert_eq!(b.map(|b| b.placement), Ok(placement.clone()));
        }
        (Err(_), Ok(())) => tally.filter_passes_engine_rejects += 1,
        (Err(_), Err(_)) => {}
    }
    Ok(())
}

#[test]
fn prefilters_never_rule_out_a_node_the_engine_admits() {
    // A few seconds in a debug build; PROPTEST_CASES=100000 for a longer search.
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let tally = std::cell::RefCell::new(Tally::default());
    let result = runner.run(&case_gen(), |case| check(&case, &mut tally.borrow_mut()));
    let t = tally.into_inner();
    eprintln!(
        "{} cases (shrinking included): engine admits {}, filters pass {}, filters pass and the engine rejects {} \
         ({:.1}% of passes)",
        t.cases,
        t.engine_admits,
        t.filter_passes,
        t.filter_passes_engine_rejects,
        100.0 * t.filter_passes_engine_rejects as f64 / t.filter_passes.max(1) as f64,
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
