//! Gangs, table-driven, and a property: no CPU given twice across every
//! member of every gang, and a gang is wholly bound or holds nothing.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use proptest::prelude::*;
use specs::job::GangPlacement;
use specs::{CpuSet, Pod, TopologyPolicy};

use super::super::tests::{holding, node, pod, scheduler};
use super::super::{NodeInfo, Scheduler, SchedulerConfig};
use super::GangRequest;

fn gang(job: &str, size: usize, member: &Pod, placement: GangPlacement, min: usize) -> GangRequest {
    let members = (0..size)
        .map(|r| {
            let mut p = member.clone();
            p.metadata.name = format!("{job}-{r}");
            (p.metadata.name.clone(), Arc::new(p))
        })
        .collect();
    GangRequest { members, placement, min_members: min, max_nodes: None, per_node: None, nodes_held: Vec::new() }
}

/// Node of each member placed, in rank order.
fn nodes_of(s: &mut Scheduler, g: &GangRequest) -> Result<Vec<String>, String> {
    s.schedule_gang(g, Instant::now()).map(|b| b.into_iter().map(|(_, b)| b.node).collect()).map_err(|u| u.message)
}

fn cluster(nodes: Vec<NodeInfo>) -> Scheduler {
    scheduler(SchedulerConfig::default(), nodes)
}

#[test]
fn placement_table() {
    struct Case {
        what: &'static str,
        nodes: Vec<NodeInfo>,
        size: usize,
        member: Pod,
        placement: GangPlacement,
        min: usize,
        /// The nodes in rank order, or the words the refusal must hold.
        want: Result<Vec<&'static str>, &'static str>,
    }
    let two = |c| pod("m", c, 1, None);
    let snn = |c| pod("m", c, 1, Some(TopologyPolicy::SingleNumaNode));
    // Four CPUs per NUMA node, one taken on each: three free per NUMA node.
    let dented = |name| holding(node(name, &[4, 4]), CpuSet::from_ids([0, 4]).unwrap());
    let cases = vec![
        Case {
            what: "fits only packed: one node holds all four, spread needs four nodes",
            nodes: vec![node("n1", &[8]), node("n2", &[1])],
            size: 4,
            member: two(2),
            placement: GangPlacement::Pack,
            min: 4,
            want: Ok(vec!["n1", "n1", "n1", "n1"]),
        },
        Case {
            what: "the same gang spread does not fit, and holds nothing",
            nodes: vec![node("n1", &[8]), node("n2", &[1])],
            size: 4,
            member: two(2),
            placement: GangPlacement::Spread,
            min: 4,
            want: Err("holding another member of the gang"),
        },
        Case {
            what: "pack fills the roomiest node, then opens the next",
            nodes: vec![node("n1", &[4]), node("n2", &[6])],
            size: 4,
            member: two(2),
            placement: GangPlacement::Pack,
            min: 4,
            want: Ok(vec!["n2", "n2", "n2", "n1"]),
        },
        Case {
            what: "spread: one per node",
            nodes: vec![node("n1", &[8]), node("n2", &[8]), node("n3", &[8])],
            size: 3,
            member: two(1),
            placement: GangPlacement::Spread,
            min: 3,
            want: Ok(vec!["n1", "n2", "n3"]),
        },
        Case {
            what: "fits only spread: a member needs a whole node",
            nodes: vec![node("n1", &[4]), node("n2", &[4])],
            size: 2,
            member: two(4),
            placement: GangPlacement::Spread,
            min: 2,
            want: Ok(vec!["n1", "n2"]),
        },
        Case {
            what: "each member on one NUMA node: three per node by CPU count, two by NUMA",
            nodes: vec![dented("n1"), dented("n2")],
            size: 4,
            member: snn(2),
            placement: GangPlacement::Pack,
            min: 4,
            want: Ok(vec!["n1", "n1", "n2", "n2"]),
        },
        Case {
            what: "each member on one NUMA node: a third on one node does not fit",
            nodes: vec![dented("n1")],
            size: 3,
            member: snn(2),
            placement: GangPlacement::Pack,
            min: 3,
            want: Err("topology affinity"),
        },
        Case {
            what: "the same three members without the NUMA rule fit the node",
            nodes: vec![dented("n1")],
            size: 3,
            member: two(2),
            placement: GangPlacement::Pack,
            min: 3,
            want: Ok(vec!["n1", "n1", "n1"]),
        },
        Case {
            what: "minMembers: two of four are enough to start",
            nodes: vec![node("n1", &[4])],
            size: 4,
            member: two(2),
            placement: GangPlacement::Pack,
            min: 2,
            want: Ok(vec!["n1", "n1"]),
        },
        Case {
            what: "minMembers not reached: nothing held",
            nodes: vec![node("n1", &[4])],
            size: 4,
            member: two(2),
            placement: GangPlacement::Pack,
            min: 3,
            want: Err("at least 3 of 4 at once"),
        },
    ];
    for c in cases {
        let mut s = cluster(c.nodes);
        let g = gang("job", c.size, &c.member, c.placement, c.min);
        match (nodes_of(&mut s, &g), c.want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{}", c.what),
            (Err(got), Err(words)) => {
                assert!(got.contains(words), "{}: {got}", c.what);
                for (key, _) in &g.members {
                    assert!(s.binding(key).is_none(), "{}: {key} still held after a refusal", c.what);
                }
            }
            (got, want) => panic!("{}: got {got:?}, want {want:?}", c.what),
        }
    }
}

#[test]
fn two_gangs_that_together_do_not_fit_never_deadlock() {
    // Member by member, A-0 and B-0 would each take a node and A-1 and B-1
    // would wait forever for the other's node.
    let mut s = cluster(vec![node("n1", &[4]), node("n2", &[4])]);
    let member = pod("m", 4, 1, None);
    let a = gang("a", 2, &member, GangPlacement::Pack, 2);
    let b = gang("b", 2, &member, GangPlacement::Pack, 2);
    assert_eq!(nodes_of(&mut s, &a).unwrap(), ["n1", "n2"]);
    let refused = nodes_of(&mut s, &b).unwrap_err();
    assert!(refused.contains("insufficient cpu"), "{refused}");
    assert!(s.binding("b-0").is_none() && s.binding("b-1").is_none());
    // A ends: B fits whole.
    for (k, _) in &a.members {
        s.release(k);
    }
    assert_eq!(nodes_of(&mut s, &b).unwrap(), ["n1", "n2"]);
}

#[test]
fn a_refused_gang_leaves_room_for_what_comes_after() {
    let mut s = cluster(vec![node("n1", &[4])]);
    let big = gang("big", 3, &pod("m", 2, 1, None), GangPlacement::Pack, 3);
    assert!(nodes_of(&mut s, &big).is_err());
    let b = s.schedule("small", &pod("small", 4, 1, None), Instant::now()).unwrap();
    assert_eq!(b.node, "n1");
}

#[test]
fn a_gang_that_can_never_fit_is_known_at_once() {
    let mut s = cluster(vec![node("n1", &[8]), node("n2", &[8])]);
    let m = pod("m", 4, 1, None);
    assert_eq!(s.gang_never_fits("m", &m, 4, GangPlacement::Pack, None, None), None);
    let five = s.gang_never_fits("m", &m, 5, GangPlacement::Pack, None, None).unwrap();
    assert!(five.contains("never hold 5 members") && five.contains("4 fit"), "{five}");
    let spread = s.gang_never_fits("m", &m, 3, GangPlacement::Spread, None, None).unwrap();
    assert!(spread.contains("2 fit (one per node)"), "{spread}");
    let huge = s.gang_never_fits("m", &pod("m", 9, 1, None), 1, GangPlacement::Pack, None, None).unwrap();
    assert!(huge.contains("no node can ever run a member"), "{huge}");
    // What is allocated now does not matter: it is the empty cluster's question.
    let _ = nodes_of(&mut s, &gang("x", 4, &m, GangPlacement::Pack, 4)).unwrap();
    assert_eq!(s.gang_never_fits("m", &m, 4, GangPlacement::Pack, None, None), None);
}

#[test]
fn slurm_shapes_nodes_and_tasks_per_node() {
    // -N 2 --ntasks-per-node 2: two on each of two nodes, though one node holds all four.
    let mut s = cluster(vec![node("n1", &[8]), node("n2", &[8]), node("n3", &[8])]);
    let mut g = gang("j", 4, &pod("m", 2, 1, None), GangPlacement::Pack, 4);
    g.max_nodes = Some(2);
    g.per_node = Some(2);
    assert_eq!(nodes_of(&mut s, &g).unwrap(), ["n1", "n1", "n2", "n2"]);
    // -N 1 with room for three on each node: four never fit one node.
    let mut s = cluster(vec![node("n1", &[6]), node("n2", &[6])]);
    let mut one = gang("k", 4, &pod("m", 2, 1, None), GangPlacement::Pack, 4);
    one.max_nodes = Some(1);
    assert!(nodes_of(&mut s, &one).is_err());
    let m = pod("m", 2, 1, None);
    let never = s.gang_never_fits("m", &m, 4, GangPlacement::Pack, Some(1), None).unwrap();
    assert!(never.contains("3 fit (packed on at most 1 nodes)"), "{never}");
    assert_eq!(s.gang_never_fits("m", &m, 4, GangPlacement::Pack, Some(2), None), None);
    assert!(s.gang_never_fits("m", &m, 4, GangPlacement::Pack, Some(2), Some(1)).is_some());
}

#[test]
fn the_rest_of_a_started_gang_prefers_or_avoids_its_nodes() {
    let mut s = cluster(vec![node("n1", &[8]), node("n2", &[8])]);
    let m = pod("m", 1, 1, None);
    let mut rest = gang("j", 1, &m, GangPlacement::Spread, 1);
    rest.nodes_held = vec!["n1".into()];
    assert_eq!(nodes_of(&mut s, &rest).unwrap(), ["n2"]);
    let mut packed = gang("k", 1, &m, GangPlacement::Pack, 1);
    packed.nodes_held = vec!["n2".into()];
    assert_eq!(nodes_of(&mut s, &packed).unwrap(), ["n2"]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn gangs_are_whole_or_absent_and_no_cpu_is_given_twice(
        nodes in prop::collection::vec(prop::collection::vec(1u32..6, 1..3), 1..4),
        gangs in prop::collection::vec((1usize..5, 1u32..4, any::<bool>(), any::<bool>(), 0usize..5), 1..8),
        releases in prop::collection::vec(any::<bool>(), 8),
    ) {
        let infos = nodes.iter().enumerate().map(|(i, numa)| node(&format!("n{i}"), numa)).collect();
        let mut s = cluster(infos);
        let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (g, (size, cpus, spread, snn, min)) in gangs.iter().enumerate() {
            let policy = snn.then_some(TopologyPolicy::SingleNumaNode);
            let member = pod("m", *cpus, 1, policy);
            let placement = if *spread { GangPlacement::Spread } else { GangPlacement::Pack };
            let mut req = gang(&format!("g{g}"), *size, &member, placement, (*min).clamp(1, *size));
            req.max_nodes = (g % 3 == 2).then_some(2);
            req.per_node = (g % 4 == 3).then_some(2);
            match s.schedule_gang(&req, Instant::now()) {
                Ok(b) => {
                    prop_assert!(b.len() >= req.min_members);
                    let keys: Vec<String> = b.iter().map(|(k, _)| k.clone()).collect();
                    let mut per: BTreeMap<&String, usize> = BTreeMap::new();
                    for (_, x) in &b {
                        *per.entry(&x.node).or_default() += 1;
                    }
                    let cap = if *spread { 1 } else { req.per_node.unwrap_or(usize::MAX) };
                    prop_assert!(per.values().all(|n| *n <= cap), "more than {} members on a node: {:?}", cap, per);
                    prop_assert!(per.len() <= req.max_nodes.unwrap_or(usize::MAX), "too many nodes: {:?}", per);
                    bound.insert(format!("g{g}"), keys);
                }
                Err(_) => {
                    for (k, _) in &req.members {
                        prop_assert!(s.binding(k).is_none(), "{} held after its gang was refused", k);
                    }
                }
            }
            // Now and then a gang ends, freeing its CPUs for the next.
            if releases[g % releases.len()] {
                if let Some((_, keys)) = bound.pop_first() {
                    for k in keys {
                        s.release(&k);
                    }
                }
            }
            // No CPU in two members' exclusive allocations, on any node.
            for n in 0..nodes.len() {
                let info = s.node(&format!("n{n}")).unwrap();
                let mut seen = CpuSet::default();
                for p in info.allocations.pods.values() {
                    for c in &p.containers {
                        prop_assert!(seen.intersection(&c.cpus).is_empty(), "CPU given twice on n{}", n);
                        seen = seen.union(&c.cpus);
                    }
                }
            }
            for keys in bound.values() {
                for k in keys {
                    prop_assert!(s.binding(k).is_some(), "{} of a bound gang lost its binding", k);
                }
            }
        }
    }
}
