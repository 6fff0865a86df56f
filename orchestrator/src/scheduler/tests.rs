//! Scheduler behaviour, table-driven where it fits.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specs::pod::SchedulingStrategy;
use specs::topology::{Cpu, NumaNode};
use specs::{
    Allocations, ContainerPlacement, CpuPolicy, CpuSet, NodeSettings, NodeTopology, NumaSet, Placement, Pod, Quantity,
    RejectReason, TopologyPolicy,
};

use super::*;

const GI: u64 = 1 << 30;

/// A machine with one socket per NUMA node, one thread per core, CPUs numbered
/// in order, 64Gi per NUMA node.
pub(crate) fn machine(cores_per_numa: &[u32]) -> NodeTopology {
    let mut t = NodeTopology::default();
    let mut next = 0;
    let n = cores_per_numa.len();
    for (numa, &cores) in cores_per_numa.iter().enumerate() {
        let numa = numa as u32;
        let ids: Vec<u32> = (next..next + cores).collect();
        for &id in &ids {
            t.cpus.push(Cpu { id, core: id, socket: numa, die: None, numa: Some(numa), uncore_cache: None });
        }
        next += cores;
        t.numa_nodes.push(NumaNode {
            kind: Default::default(),
            id: numa,
            cpus: CpuSet::from_ids(ids).expect("id within MAX_ID"),
            memory_bytes: 64 * GI,
            distances: (0..n).map(|j| if j as u32 == numa { 10 } else { 20 }).collect(),
            hugepages: Vec::new(),
        });
    }
    t
}

pub(super) fn node(name: &str, cores_per_numa: &[u32]) -> NodeInfo {
    NodeInfo {
        name: name.to_string(),
        labels: BTreeMap::new(),
        topology: Arc::new(machine(cores_per_numa)),
        settings: NodeSettings::default(),
        allocations: Allocations::default(),
        ready: true,
    }
}

/// A Guaranteed pod of one container with `cpus` whole CPUs (exclusive) and
/// `mem_gi` Gi, under the given topology policy.
pub(super) fn pod(name: &str, cpus: u32, mem_gi: u64, policy: Option<TopologyPolicy>) -> Pod {
    let mut p = specs::testing::pod(name).guaranteed(&cpus.to_string(), &format!("{mem_gi}Gi"));
    if let Some(policy) = policy {
        p = p.policy(policy);
    }
    p.build()
}

fn snn(name: &str, cpus: u32) -> Pod {
    pod(name, cpus, 1, Some(TopologyPolicy::SingleNumaNode))
}

/// The engine these tests confirm with: the real one, so that the summary
/// pre-filters are checked against what the engine admits.
pub(super) const ENGINE: AdmitFn = specs::admit;

pub(super) fn scheduler(config: SchedulerConfig, nodes: Vec<NodeInfo>) -> Scheduler {
    let mut s = Scheduler::with_engine(config, ENGINE);
    for n in nodes {
        s.upsert_node(n);
    }
    s
}

fn seed_cluster() -> Scheduler {
    scheduler(SchedulerConfig::default(), vec![node("node-a", &[10, 10]), node("node-b", &[20, 20])])
}

#[test]
fn seed_twenty_cpu_single_numa_pod_lands_on_the_2x20_node_every_time() {
    for strategy in [
        SchedulingStrategy::LeastAllocated,
        SchedulingStrategy::MostAllocated,
        SchedulingStrategy::Balanced,
        SchedulingStrategy::LeastNumaNodes,
    ] {
        let mut s = scheduler(
            SchedulerConfig { default_strategy: strategy, ..SchedulerConfig::default() },
            vec![node("node-a", &[10, 10]), node("node-b", &[20, 20])],
        );
        for i in 0..50 {
            let key = format!("default/seed-{i}");
            let b = s.schedule(&key, &snn("seed", 20), std::time::Instant::now()).unwrap();
            assert_eq!(b.node, "node-b", "{strategy:?} attempt {i}");
            assert_eq!(b.placement.numa_affinity.len(), 1);
            assert_eq!(b.placement.containers[0].cpus.len(), 20);
            assert!(b.has_plan());
            assert_eq!(s.release(&key).as_deref(), Some("node-b"));
        }
    }
}

/// Nodes with pods already bound, then one pod under each strategy.
#[test]
fn strategies_order_nodes() {
    // busy: 2x8 with 12 exclusive CPUs held; idle: 2x8 empty; big: 4x8 with one
    // NUMA node full.
    fn cluster(strategy: SchedulingStrategy) -> Scheduler {
        let labeled = |name: &str, cores: &[u32]| {
            let mut n = node(name, cores);
            n.labels.insert("name".into(), name.into());
            n
        };
        let mut s = scheduler(
            SchedulerConfig { default_strategy: strategy, ..SchedulerConfig::default() },
            vec![labeled("busy", &[8, 8]), labeled("idle", &[8, 8]), labeled("big", &[8, 8, 8, 8])],
        );
        for (key, cpus, on) in [("b1", 6, "busy"), ("b2", 6, "busy"), ("g1", 8, "big")] {
            let mut p = snn(key, cpus);
            p.spec.node_selector.insert("name".into(), on.into());
            assert_eq!(s.schedule(key, &p, std::time::Instant::now()).unwrap().node, on);
        }
        s
    }
    let check = |strategy, pod: Pod, expected: &str| {
        let mut s = cluster(strategy);
        assert_eq!(s.schedule("x", &pod, std::time::Instant::now()).unwrap().node, expected, "{strategy:?}");
    };
    // Spread: the least used node (idle: 0%; big: 25%; busy: 75%).
    check(SchedulingStrategy::LeastAllocated, snn("x", 2), "idle");
    // Pack: the fullest node that still fits.
    check(SchedulingStrategy::MostAllocated, snn("x", 2), "busy");
    // Balanced: 1 CPU and 100Gi leave busy at 81% CPU / 80% memory, big at 28% / 39%.
    check(SchedulingStrategy::Balanced, pod("x", 1, 100, None), "busy");
    // A pod's own strategy overrides the cluster default.
    let mut p = snn("x", 2);
    p.spec.scheduling_strategy = Some(SchedulingStrategy::MostAllocated);
    check(SchedulingStrategy::LeastAllocated, p, "busy");
}

/// A node holding `cpus` exclusively for one pod (as a node's report would say).
pub(super) fn holding(mut n: NodeInfo, cpus: CpuSet) -> NodeInfo {
    let c = ContainerPlacement {
        name: "main".into(),
        cpu_policy: CpuPolicy::Exclusive,
        cpus,
        mems: NumaSet::new(),
        memory: BTreeMap::new(),
        hugepages: BTreeMap::new(),
        devices: BTreeMap::new(),
    };
    n.allocations.apply("held", Placement { numa_affinity: NumaSet::new(), containers: vec![c], ..Default::default() });
    n
}

#[test]
fn least_numa_nodes_prefers_a_placement_on_fewer_numa_nodes() {
    // Both nodes are half full; a-split has 4+4 free, b-whole 0+8.
    let check = |strategy, expected: &str| {
        let mut s = scheduler(
            SchedulerConfig { default_strategy: strategy, ..SchedulerConfig::default() },
            vec![
                holding(
                    node("a-split", &[8, 8]),
                    CpuSet::from_ids([0, 1, 2, 3, 8, 9, 10, 11]).expect("id within MAX_ID"),
                ),
                holding(node("b-whole", &[8, 8]), CpuSet::range(0, 7).expect("id within MAX_ID")),
            ],
        );
        let b = s.schedule("x", &pod("x", 8, 1, None), std::time::Instant::now()).unwrap();
        assert_eq!(b.node, expected, "{strategy:?}");
    };
    // Equal load: spreading falls to the name tie-break.
    check(SchedulingStrategy::LeastAllocated, "a-split");
    check(SchedulingStrategy::LeastNumaNodes, "b-whole");
}

#[test]
fn node_selector_filters_nodes() {
    let check = |selector: &[(&str, &str)], expected: Result<&str, &str>| {
        let mut a = node("a", &[4]);
        a.labels.insert("zone".into(), "edge".into());
        let mut b = node("b", &[4]);
        b.labels.insert("zone".into(), "core".into());
        b.labels.insert("gpu".into(), "yes".into());
        let mut s = scheduler(SchedulerConfig::default(), vec![a, b]);
        let mut p = pod("p", 1, 1, None);
        p.spec.node_selector = selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        match (s.schedule("p", &p, std::time::Instant::now()), expected) {
            (Ok(b), Ok(n)) => assert_eq!(b.node, n, "{selector:?}"),
            (Err(u), Err(m)) => assert_eq!(u.message, m, "{selector:?}"),
            (got, _) => panic!("{selector:?}: got {got:?}"),
        }
    };
    check(&[], Ok("a"));
    check(&[("zone", "core")], Ok("b"));
    check(&[("zone", "core"), ("gpu", "yes")], Ok("b"));
    check(&[("zone", "edge"), ("gpu", "yes")], Err("0/2 nodes fit: 2 node selector mismatch"));
    check(&[("zone", "moon")], Err("0/2 nodes fit: 2 node selector mismatch"));
}

#[test]
fn binds_until_full_never_overcommit() {
    let mut s =
        scheduler(SchedulerConfig::default(), vec![node("a", &[10, 10]), node("b", &[20, 20]), node("c", &[3, 5, 7])]);
    let sizes = [1u32, 3, 2, 5, 4, 1, 7, 2];
    let mut bound: BTreeMap<String, CpuSet> = BTreeMap::new();
    let mut i = 0;
    let mut failures = 0;
    // Keep going until every size has failed once in a row.
    while failures < sizes.len() {
        let cpus = sizes[i % sizes.len()];
        let policy = if i % 2 == 0 { Some(TopologyPolicy::SingleNumaNode) } else { None };
        match s.schedule(&format!("p{i}"), &pod("p", cpus, 1, policy), std::time::Instant::now()) {
            Ok(b) => {
                failures = 0;
                let held = bound.entry(b.node.clone()).or_default();
                let cpus = &b.placement.containers[0].cpus;
                assert!(held.is_disjoint(cpus), "CPU handed out twice on {}: {cpus} vs {held}", b.node);
                held.union_with(cpus);
            }
            Err(_) => failures += 1,
        }
        i += 1;
    }
    // Every CPU was handed out (1-CPU pods fill the last holes), each once.
    assert_eq!(bound["a"].len(), 20);
    assert_eq!(bound["b"].len(), 40);
    assert_eq!(bound["c"].len(), 15);
}

#[test]
fn topology_blind_mode_binds_where_the_engine_would_reject() {
    let mut s =
        scheduler(SchedulerConfig { topology_aware: false, ..SchedulerConfig::default() }, vec![node("a", &[10, 10])]);
    let p = snn("p", 20);
    let b = s.schedule("p", &p, std::time::Instant::now()).unwrap();
    assert_eq!(b.node, "a");
    assert!(!b.has_plan(), "a blind binding carries no plan");
    // The engine on the node's truth says no.
    let n = s.node("a").unwrap();
    let truth = ENGINE(&n.topology, &n.settings, &Allocations::default(), "p", &p).unwrap_err();
    assert_eq!(truth.reason, RejectReason::TopologyAffinity);
    // Totals are counted: a second 20-CPU pod does not fit by totals.
    assert_eq!(
        s.schedule("q", &snn("q", 20), std::time::Instant::now()).unwrap_err().message,
        "0/1 nodes fit: 1 insufficient cpu"
    );
    // The nodelet rejects; the pod is not offered to the same state again, so
    // attempts are bounded.
    let now = Instant::now();
    s.on_rejection("p", "a", &truth.message, now);
    let u = s.schedule("p", &p, std::time::Instant::now()).unwrap_err();
    assert_eq!(u.message, "0/1 nodes fit: 1 rejected by the node at this state");
    assert_eq!(s.attempts("p"), 1);
}

#[test]
fn rejection_backs_off_and_skips_the_stale_state() {
    let mut s = seed_cluster();
    let p = snn("p", 10);
    let b = s.schedule("p", &p, std::time::Instant::now()).unwrap();
    assert_eq!(b.node, "node-b");
    let t0 = Instant::now();
    let mut expected_delays = Vec::new();
    let mut delays = Vec::new();
    for attempt in 1..=8u32 {
        let at = s.on_rejection("p", "node-b", "state moved on", t0);
        delays.push(at - t0);
        expected_delays.push(Duration::from_secs((1u64 << (attempt - 1)).min(60)));
    }
    assert_eq!(delays, expected_delays);
    assert!(s.is_backing_off("p", t0));
    assert_eq!(s.next_retry(), Some(t0 + Duration::from_secs(60)));
    assert!(s.due(t0 + Duration::from_secs(59)).is_empty());
    assert_eq!(s.due(t0 + Duration::from_secs(60)), vec!["p".to_string()]);
    assert!(s.due(t0 + Duration::from_secs(61)).is_empty(), "a due pod is returned once");

    // node-b's state is unchanged since it rejected: the pod goes to node-a.
    let b = s.schedule("p", &p, std::time::Instant::now()).unwrap();
    assert_eq!(b.node, "node-a");
    s.on_rejection("p", "node-a", "state moved on", t0);
    let u = s.schedule("p", &p, std::time::Instant::now()).unwrap_err();
    assert_eq!(u.counts.get(&ReasonKind::RejectedAtThisState), Some(&2));
    assert!(u.per_node["node-b"].ends_with("state moved on"), "{}", u.per_node["node-b"]);

    // A heartbeat re-sending the same node and truth is not a new state.
    s.upsert_node(node("node-b", &[20, 20]));
    assert!(s.schedule("p", &p, std::time::Instant::now()).is_err());

    // A report from node-b that changes its state makes it eligible again.
    let mut truth = Allocations::default();
    truth.apply("other", Placement::default());
    s.on_node_report("node-b", truth);
    assert_eq!(s.schedule("p", &p, std::time::Instant::now()).unwrap().node, "node-b");
}

#[test]
fn reports_keep_assumed_pods_until_reflected_or_expired() {
    let expiry = Duration::from_secs(30);
    let mut s =
        scheduler(SchedulerConfig { assume_expiry: expiry, ..SchedulerConfig::default() }, vec![node("a", &[4, 4])]);
    let t0 = Instant::now();
    let b1 = s.schedule("p1", &snn("p1", 4), t0).unwrap();
    let b2 = s.schedule("p2", &snn("p2", 4), t0 + Duration::from_secs(1)).unwrap();
    assert_eq!((b1.epoch, b2.epoch), (0, 1), "the second binding is computed on top of the first");
    assert_ne!(b1.placement.numa_affinity, b2.placement.numa_affinity);
    assert_eq!(s.next_expiry(), Some(t0 + expiry));

    // The node reports p1 (it adopted it) but not yet p2.
    let mut truth = Allocations::default();
    truth.apply("p1", b1.placement.clone());
    assert!(s.on_node_report("a", truth.clone()));
    let mirror = &s.node("a").unwrap().allocations;
    assert_eq!(mirror.pods.len(), 2, "p2 is still assumed");
    assert_eq!(mirror.epoch, 2);
    assert_eq!(s.next_expiry(), Some(t0 + Duration::from_secs(1) + expiry), "p1 is no longer in flight");
    // The node is full in the mirror: nothing else fits.
    assert!(s.schedule("p3", &snn("p3", 1), t0).is_err());

    // Reports without p2 do not expire it; time does, to the instant.
    assert!(!s.on_node_report("a", truth.clone()));
    assert!(s.expire_assumed(t0 + expiry).is_empty());
    assert_eq!(s.expire_assumed(t0 + Duration::from_secs(1) + expiry), vec![("p2".to_string(), "a".to_string())]);
    assert!(s.binding("p2").is_none());
    assert_eq!(s.next_expiry(), None);
    assert_eq!(s.node("a").unwrap().allocations, truth);
    assert!(s.schedule("p3", &snn("p3", 4), t0).is_ok());
}

#[test]
fn a_confirmed_binding_leaves_the_in_flight_record() {
    let mut s = scheduler(SchedulerConfig::default(), vec![node("a", &[4])]);
    let t0 = Instant::now();
    s.schedule("p1", &snn("p1", 4), t0).unwrap();
    // The node ran and finished p1 between two reports: its truth never held it.
    assert!(s.confirm("p1"));
    assert!(!s.confirm("p1"), "confirmed once");
    assert_eq!(s.next_expiry(), None);
    assert!(s.binding("p1").is_none());
    assert!(s.schedule("p2", &snn("p2", 4), t0).is_ok(), "its CPUs are free again");
}

#[test]
fn never_fits_names_each_node_and_ignores_what_is_allocated() {
    let mut s = scheduler(SchedulerConfig::default(), vec![node("a", &[2]), node("b", &[4])]);
    let t0 = Instant::now();
    assert_eq!(s.never_fits("x", &snn("x", 4)), None, "b could run it");
    // Filling b does not make a 4-CPU pod impossible: it waits.
    s.schedule("fill", &snn("fill", 4), t0).unwrap();
    assert_eq!(s.never_fits("x", &snn("x", 4)), None);
    let why = s.never_fits("x", &snn("x", 8)).expect("no node has 8 CPUs");
    assert_eq!(why.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(why["a"], "needs 8 exclusive CPUs, 2 allocatable");
    // What was remembered as fitting goes with the node that could run it.
    s.remove_node("b");
    assert!(s.never_fits("x", &snn("x", 4)).is_some());
    assert_eq!(Scheduler::default().never_fits("x", &snn("x", 8)), None, "no node registered yet");
}

#[test]
fn schedule_is_idempotent_and_release_frees() {
    let mut s = seed_cluster();
    let b = s.schedule("p", &snn("p", 20), std::time::Instant::now()).unwrap();
    assert_eq!(s.schedule("p", &snn("p", 20), std::time::Instant::now()).unwrap(), b);
    assert_eq!(s.binding("p"), Some(b));
    assert_eq!(s.release("p").as_deref(), Some("node-b"));
    assert_eq!(s.release("p"), None);
    assert!(s.node("node-b").unwrap().allocations.pods.is_empty());
    s.remove_node("node-b");
    assert_eq!(
        s.schedule("p", &snn("p", 20), std::time::Instant::now()).unwrap_err().message,
        "0/1 nodes fit: 1 topology affinity"
    );
}

#[test]
fn no_nodes_says_so() {
    let mut s = scheduler(SchedulerConfig::default(), vec![]);
    assert_eq!(
        s.schedule("p", &snn("p", 1), std::time::Instant::now()).unwrap_err().message,
        "0/0 nodes fit: no nodes registered"
    );
}

/// The packed fast path and the full summary checks must agree on every node:
/// the scan trusts one, the explanation reads the other.
#[test]
fn hot_summary_agrees_with_full_summary() {
    let mut s = scheduler(
        SchedulerConfig::default(),
        vec![node("a", &[10, 10]), node("b", &[20, 20]), node("c", &[3, 5, 7]), node("d", &[2; 10])],
    );
    let policies = [None, Some(TopologyPolicy::SingleNumaNode), Some(TopologyPolicy::BestEffort)];
    let mut checked = 0;
    for i in 0..200u32 {
        let p = pod("p", 1 + i % 9, u64::from(1 + i % 40), policies[i as usize % 3]);
        let demand = Demand::of(&p);
        for n in 0..s.nodes.len() {
            let quick = filter::quick(&s.hot[n], &demand, true);
            let full = s.check_summary(n, &demand);
            match quick {
                Quick::Fit => assert_eq!(full, Ok(()), "pod {i} node {n}"),
                Quick::NoFit => assert!(full.is_err(), "pod {i} node {n}"),
                Quick::Unknown => {}
            }
            checked += 1;
        }
        let _ = s.schedule(&format!("p{i}"), &p, std::time::Instant::now());
    }
    assert_eq!(checked, 800);
}

fn with(mut p: Pod, resource: &str, quantity: &str) -> Pod {
    let q = Quantity::parse(quantity).unwrap();
    let r = &mut p.spec.containers[0].resources;
    r.requests.insert(resource.into(), q.clone());
    r.limits.insert(resource.into(), q);
    p
}

pub(super) const VF: &str = "pinion.io/sriov-vf";

/// A 2x8 node with 512 2Mi huge pages per NUMA node, two VFs on NUMA node 1,
/// CPU 0 reserved, and `held` CPUs taken exclusively.
fn rich_node(held: CpuSet) -> NodeInfo {
    let mut n = holding(node("x", &[8, 8]), held);
    let mut t = machine(&[8, 8]);
    for numa in &mut t.numa_nodes {
        numa.hugepages = vec![specs::topology::HugePages { page_size_bytes: 2 << 20, total: 512 }];
    }
    for addr in ["0000:3b:00.1", "0000:3b:00.2"] {
        t.devices.push(specs::topology::PciDevice {
            address: addr.into(),
            class: "0x020000".into(),
            numa: Some(1),
            ..Default::default()
        });
    }
    n.topology = Arc::new(t);
    n.settings.reserved_cpus = CpuSet::single(0).expect("id within MAX_ID");
    n.settings.devices.insert(VF.into(), vec!["0000:3b:00.1".into(), "0000:3b:00.2".into()]);
    n
}

/// The summary stages alone (totals, then per NUMA node) on one node.
#[test]
fn summary_filters_rule_out_what_cannot_fit() {
    let check = |held: CpuSet, pod: Pod, expected: Result<(), &str>| {
        let n = rich_node(held);
        let s = NodeSummary::compute(&n.topology, &n.settings, &n.allocations, std::iter::empty());
        let d = Demand::of(&pod);
        let got = filter::totals(&s, &d).and_then(|()| filter::numa(&s, &d, &n.settings)).map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_string), "{:?}", d.total);
    };
    let none = CpuSet::new();
    let snn = |cpus| pod("p", cpus, 1, Some(TopologyPolicy::SingleNumaNode));
    let restricted = |cpus| pod("p", cpus, 1, Some(TopologyPolicy::Restricted));
    // Reserved CPU 0 is never handed out: 15 allocatable, NUMA node 0 has 7.
    check(none.clone(), pod("p", 15, 1, None), Ok(()));
    check(none.clone(), pod("p", 16, 1, None), Err("needs 16 exclusive CPUs; 15 free"));
    check(none.clone(), snn(8), Ok(()));
    // Holding CPU 8 (NUMA node 1) leaves 7 on each NUMA node.
    check(
        CpuSet::range(8, 8).expect("id within MAX_ID"),
        snn(8),
        Err("no single NUMA node has 8 free exclusive CPUs; best is node 0 with 7"),
    );
    // Memory aligns for a Guaranteed pod: 64Gi per NUMA node.
    check(
        none.clone(),
        pod("p", 1, 100, Some(TopologyPolicy::SingleNumaNode)),
        Err("no single NUMA node has 100Gi free memory; best is node 0 with 64Gi"),
    );
    check(none.clone(), pod("p", 1, 100, None), Ok(()));
    // Huge pages: 1Gi per NUMA node.
    check(none.clone(), with(snn(1), "hugepages-2Mi", "1Gi"), Ok(()));
    check(
        none.clone(),
        with(snn(1), "hugepages-2Mi", "2Gi"),
        Err("no single NUMA node has 2Gi free hugepages-2Mi; best is node 0 with 1Gi"),
    );
    check(none.clone(), with(snn(1), "hugepages-2Mi", "3Gi"), Err("needs 3Gi of hugepages-2Mi; 2Gi free"));
    // Devices: two VFs, both on NUMA node 1.
    check(none.clone(), with(snn(4), VF, "2"), Ok(()));
    check(none.clone(), with(snn(4), VF, "3"), Err("needs 3 pinion.io/sriov-vf; 2 free"));
    check(
        CpuSet::range(8, 13).expect("id within MAX_ID"),
        with(snn(4), VF, "1"),
        Err("no single NUMA node has all the pod's aligned resources at once"),
    );
    check(
        CpuSet::range(8, 13).expect("id within MAX_ID"),
        with(pod("p", 4, 1, Some(TopologyPolicy::BestEffort)), VF, "1"),
        Ok(()),
    );
    // Restricted: the narrowest possible span must have room.
    check(none.clone(), restricted(8), Ok(()));
    check(CpuSet::range(1, 4).expect("id within MAX_ID"), restricted(6), Ok(()));
    check(
        CpuSet::from_ids([1, 2, 3, 8, 9, 10]).expect("id within MAX_ID"),
        restricted(6),
        Err("restricted policy: the request needs 1 NUMA node(s) at best; the freest 1 have 5 of 6 exclusive CPUs"),
    );
    check(none.clone(), restricted(12), Ok(()));
}

#[test]
fn container_scope_aligns_each_container_alone() {
    let n = node("x", &[8, 8]);
    let s = NodeSummary::compute(&n.topology, &n.settings, &n.allocations, std::iter::empty());
    let mut p = pod("p", 6, 1, Some(TopologyPolicy::SingleNumaNode));
    let mut second = p.spec.containers[0].clone();
    second.name = "second".into();
    p.spec.containers.push(second);
    let check = |scope, expected: Result<(), &str>| {
        let mut p = p.clone();
        p.spec.topology.as_mut().unwrap().scope = Some(scope);
        let got = filter::numa(&s, &Demand::of(&p), &n.settings).map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_string), "{scope:?}");
    };
    check(specs::TopologyScope::Container, Ok(()));
    check(specs::TopologyScope::Pod, Err("no single NUMA node has 12 free exclusive CPUs; best is node 0 with 8"));
}

/// A caller that keeps its own in-flight bindings pushes truth plus in-flight
/// pods through `upsert_node`; when it drops a refused pod from that mirror, the
/// old binding is gone and the pod is scheduled afresh.
#[test]
fn a_binding_the_node_no_longer_holds_is_scheduled_afresh() {
    let mut s = seed_cluster();
    let b = s.schedule("p", &snn("p", 20), std::time::Instant::now()).unwrap();
    assert_eq!(b.node, "node-b");
    // The caller's mirror push includes the in-flight pod: still bound.
    let mut with_p = Allocations::default();
    with_p.apply("p", b.placement.clone());
    s.upsert_node(NodeInfo { allocations: with_p, ..node("node-b", &[20, 20]) });
    assert_eq!(s.schedule("p", &snn("p", 20), std::time::Instant::now()).unwrap(), b);
    // The node refused it; the caller pushes the mirror without it.
    s.upsert_node(node("node-b", &[20, 20]));
    assert_eq!(s.binding("p"), None);
    let again = s.schedule("p", &snn("p", 20), std::time::Instant::now()).unwrap();
    assert_eq!(again.node, "node-b");
    assert_eq!(s.node("node-b").unwrap().allocations.pods.len(), 1);
}

/// `restricted` widens the affinity to what the widest resource needs at best:
/// memory or devices that no single NUMA node holds make an exclusive-CPU
/// request that one node could hold span several, so the free CPUs of that many
/// nodes count. The first row is the property test's shrunk counterexample
/// (`props`), where the summary used to rule out a node the engine admits on.
#[test]
fn restricted_counts_the_width_every_resource_needs() {
    let check = |n: NodeInfo, pod: Pod, expected: Result<(), &str>| {
        let s = NodeSummary::compute(&n.topology, &n.settings, &n.allocations, std::iter::empty());
        let d = Demand::of(&pod);
        let got = filter::totals(&s, &d).and_then(|()| filter::numa(&s, &d, &n.settings)).map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_string), "{:?}", d.total);
        let engine = ENGINE(&n.topology, &n.settings, &n.allocations, "p", &pod);
        assert_eq!(engine.is_ok(), expected.is_ok(), "the engine says {engine:?}");
    };
    let restricted = |cpus, memory: &str| with(pod("p", cpus, 1, Some(TopologyPolicy::Restricted)), "memory", memory);

    // NUMA nodes of 4, 3 and 1 cores with 1.5Gi, 1.5Gi and 2.5Gi; CPU 0 reserved,
    // CPUs 1-2 held: 1, 3 and 1 free. 4352Mi needs all three nodes, and so the
    // 5 CPUs may come from all three.
    let mut shrunk = holding(node("x", &[4, 3, 1]), CpuSet::range(1, 2).expect("id within MAX_ID"));
    let mut t = machine(&[4, 3, 1]);
    for (numa, mib) in t.numa_nodes.iter_mut().zip([1536u64, 1536, 2560]) {
        numa.memory_bytes = mib << 20;
    }
    shrunk.topology = Arc::new(t);
    shrunk.settings.reserved_cpus = CpuSet::single(0).expect("id within MAX_ID");
    shrunk.settings.topology_policy = TopologyPolicy::Restricted;
    check(shrunk, restricted(5, "4352Mi"), Ok(()));

    // 2x4 with 64Gi each, 2 CPUs free on each NUMA node.
    let half = || holding(node("x", &[4, 4]), CpuSet::from_ids([0, 1, 4, 5]).expect("id within MAX_ID"));
    check(half(), restricted(4, "100Gi"), Ok(()));
    check(
        half(),
        restricted(3, "1Gi"),
        Err("restricted policy: the request needs 1 NUMA node(s) at best; the freest 1 have 2 of 3 exclusive CPUs"),
    );
    // One VF on each NUMA node: two VFs need both nodes, and so may 3 CPUs.
    let mut vfs = half();
    let mut t = machine(&[4, 4]);
    for (numa, addr) in [(0, "0000:3b:00.1"), (1, "0000:5e:00.1")] {
        t.devices.push(specs::topology::PciDevice {
            address: addr.into(),
            class: "0x020000".into(),
            numa: Some(numa),
            ..Default::default()
        });
    }
    vfs.topology = Arc::new(t);
    vfs.settings.devices.insert(VF.into(), vec!["0000:3b:00.1".into(), "0000:5e:00.1".into()]);
    check(vfs, with(restricted(3, "1Gi"), VF, "2"), Ok(()));
}

/// `place_on`: the pod goes on the node it names or nowhere; what it gets
/// is held, so `schedule` never hands those CPUs to another pod.
#[test]
fn place_on_places_on_that_node_only_and_holds_what_it_gets() {
    let check = |node_name: &str, cpus: u32, selector: &[(&str, &str)], expected: Result<(), &str>| {
        let mut a = node("a", &[4]);
        a.labels.insert("ptp".into(), "yes".into());
        let mut down = node("down", &[4]);
        down.ready = false;
        let mut s = scheduler(SchedulerConfig::default(), vec![a, node("b", &[8]), down]);
        let mut p = pod("d", cpus, 1, None);
        p.spec.node_selector = selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let now = std::time::Instant::now();
        match (s.place_on(node_name, "d", &p, now), expected) {
            (Ok(b), Ok(())) => {
                assert_eq!(b.node, node_name);
                assert!(b.has_plan());
                // Held: the same again is the same binding, and the rest of
                // the node is all another pod can get.
                assert_eq!(s.place_on(node_name, "d", &p, now).map(|x| x.placement), Ok(b.placement.clone()));
                let total = s.node(node_name).map_or(0, |n| n.topology.cpus.len() as u32);
                let other = s.place_on(node_name, "e", &pod("e", total, 1, None), now);
                assert!(other.is_err(), "{node_name}: the CPUs of d handed out again: {other:?}");
            }
            (Err(why), Err(part)) => assert!(why.contains(part), "{node_name}: {why:?} lacks {part:?}"),
            (got, want) => panic!("{node_name} {cpus} {selector:?}: got {got:?}, want {want:?}"),
        }
    };
    check("a", 2, &[("ptp", "yes")], Ok(()));
    check("b", 8, &[], Ok(()));
    check("b", 2, &[("ptp", "yes")], Err("selector"));
    check("a", 6, &[], Err("CPUs"));
    check("down", 1, &[], Err("ready"));
    check("gone", 1, &[], Err("not registered"));
}
