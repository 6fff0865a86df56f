//! Table tests of `engine::recheck`: pods are admitted by the engine under
//! the settings a node had, then re-checked against the settings (and online
//! CPUs) it restarted with. One row per case, one `check` helper.

use std::collections::BTreeMap;

use specs::engine::{admit, recheck, Allocations, MisfitReason, NodeSettings};
use specs::pod::{Container, Pod, TopologyPolicy, TopologyScope, TopologySpec};
use specs::topology::{NodeTopology, PciDevice};
use specs::{CpuSet, Quantity};

use MisfitReason::*;
use TopologyPolicy::{BestEffort, Restricted, SingleNumaNode};

const M2X10: &str = "pack:2 numa:1 core:10 pu:1";
const M4: &str = "pack:2 numa:2 core:4 pu:2";
const TWO: &str = "core:2 pu:1";
const NIC: &str = "0000:3b:00.0";

fn machine(desc: &str) -> NodeTopology {
    specs::topology::synthetic::parse(desc).expect(desc)
}

/// A container whose requests equal its limits when `guaranteed`.
fn ctr(name: &str, res: &[(&str, &str)], guaranteed: bool) -> Container {
    let map: BTreeMap<String, Quantity> =
        res.iter().map(|(k, v)| (k.to_string(), Quantity::parse(v).expect("test quantity"))).collect();
    let mut c = Container { name: name.into(), ..Default::default() };
    c.resources.requests = map.clone();
    if guaranteed {
        c.resources.limits = map;
    }
    c
}

fn pod_of(containers: Vec<Container>) -> Pod {
    specs::testing::pod("p").containers(containers).build()
}

/// A Guaranteed pod of one container with `cpus` exclusive CPUs.
fn exclusive(cpus: &str) -> Pod {
    specs::testing::pod("p").guaranteed(cpus, "1Gi").build()
}

/// A Burstable pod: its container runs on the shared pool.
fn shared() -> Pod {
    pod_of(vec![ctr("main", &[("memory", "64Mi")], false)])
}

fn reserved(list: &str) -> NodeSettings {
    NodeSettings { reserved_cpus: CpuSet::parse_list(list).expect("cpulist"), ..Default::default() }
}

fn with(mut s: NodeSettings, f: impl FnOnce(&mut NodeSettings)) -> NodeSettings {
    f(&mut s);
    s
}

fn policy(p: TopologyPolicy) -> impl FnOnce(&mut NodeSettings) {
    move |s| s.topology_policy = p
}

struct Case {
    name: &'static str,
    machine: NodeTopology,
    /// The settings every pod was admitted under.
    before: NodeSettings,
    /// Admitted first, in order; re-checked before `pod` (they are its `others`).
    others: Vec<Pod>,
    pod: Pod,
    /// The settings the node restarted with.
    after: NodeSettings,
    /// CPUs offline at the restart.
    offline: &'static str,
    /// `None`: still fits; else the reason and a part of the message.
    expect: Option<(MisfitReason, &'static str)>,
}

fn case(name: &'static str, desc: &str, before: NodeSettings, pod: Pod, after: NodeSettings) -> Case {
    Case { name, machine: machine(desc), before, others: vec![], pod, after, offline: "", expect: None }
}

impl Case {
    fn others(mut self, pods: Vec<Pod>) -> Case {
        self.others = pods;
        self
    }
    fn offline(mut self, cpus: &'static str) -> Case {
        self.offline = cpus;
        self
    }
    fn misfit(mut self, reason: MisfitReason, part: &'static str) -> Case {
        self.expect = Some((reason, part));
        self
    }
}

fn check(c: Case) {
    let mut alloc = Allocations::default();
    for (i, p) in c.others.iter().chain([&c.pod]).enumerate() {
        let key = format!("pod-{i}");
        let placed = admit(&c.machine, &c.before, &alloc, &key, p)
            .unwrap_or_else(|r| panic!("{}: pod {i} not admitted: {r}", c.name));
        alloc.apply(&key, placed);
    }
    let key = format!("pod-{}", c.others.len());
    let placement = alloc.release(&key).expect("the pod was admitted");
    let offline = CpuSet::parse_list(c.offline).expect("cpulist");
    let now = c.machine.without_cpus(&offline);
    // The pods before it are re-checked first and must still fit.
    let mut others = Allocations::default();
    for (k, p) in &alloc.pods {
        let i: usize = k.trim_start_matches("pod-").parse().expect("key");
        let got = recheck(&now, &c.after, &others, &c.others[i], p);
        assert_eq!(got, Ok(()), "{}: pod {k} before the one checked", c.name);
        others.apply(k, p.clone());
    }
    let got = recheck(&now, &c.after, &others, &c.pod, &placement);
    match (c.expect, got) {
        (None, Ok(())) => {}
        (Some((reason, part)), Err(m)) => {
            assert_eq!(m.reason, reason, "{}: {m}", c.name);
            assert!(m.message.contains(part), "{}: message {:?} lacks {part:?}", c.name, m.message);
        }
        (want, got) => panic!("{}: expected {want:?}, got {got:?} (placement {placement:?})", c.name),
    }
}

#[test]
fn cpus_reserved_or_offline_since() {
    for c in [
        case("unchanged settings", M2X10, reserved("0"), exclusive("2"), reserved("0")),
        case("more reserved CPUs, none of them the pod's", M2X10, reserved("0"), exclusive("2"), reserved("0,10")),
        case("fewer reserved CPUs", M2X10, reserved("0-1"), exclusive("2"), reserved("0")),
        case("its CPU reserved now", M2X10, reserved("0"), exclusive("2"), reserved("0-1"))
            .misfit(ReservedCpus, "CPUs 1, which are reserved now (reserved CPUs 0-1)"),
        case("this host: CPU 1 reserved too", TWO, reserved("0"), exclusive("1"), reserved("0-1"))
            .misfit(ReservedCpus, "container main holds CPUs 1"),
        case("a shared pod holds no CPU of its own", TWO, reserved("0"), shared(), reserved("0-1")),
        case("its CPU offline at the restart", M2X10, reserved("0"), exclusive("2"), reserved("0"))
            .offline("2")
            .misfit(OfflineCpus, "CPUs 2, which are not online"),
        case("another CPU offline", M2X10, reserved("0"), exclusive("2"), reserved("0")).offline("5"),
    ] {
        check(c);
    }
}

#[test]
fn alignment_under_a_new_policy() {
    let single = || with(reserved("0"), policy(SingleNumaNode));
    let own_policy = {
        let mut p = exclusive("12");
        p.spec.topology = Some(TopologySpec { policy: Some(BestEffort), scope: None, ..Default::default() });
        p
    };
    // Two containers of 6 CPUs: under scope container each is on one node.
    let two = || {
        pod_of(vec![
            ctr("a", &[("cpu", "6"), ("memory", "1Gi")], true),
            ctr("b", &[("cpu", "6"), ("memory", "1Gi")], true),
        ])
    };
    let by_container = |s: NodeSettings| with(s, |s| s.topology_scope = TopologyScope::Container);
    let by_pod = |s: NodeSettings| with(s, |s| s.topology_scope = TopologyScope::Pod);
    for c in [
        case("fits one node: single-numa-node allows it", M2X10, reserved("0"), exclusive("4"), single()),
        case("spans both nodes: single-numa-node forbids it", M2X10, reserved("0"), exclusive("12"), single()).misfit(
            TopologyAffinity,
            "container main spans NUMA nodes 0-1, and topology policy single-numa-node allows one",
        ),
        case("the pod's own policy still wins", M2X10, reserved("0"), own_policy, single()),
        case(
            "needs both nodes: restricted allows it",
            M2X10,
            reserved("0"),
            exclusive("12"),
            with(reserved("0"), policy(Restricted)),
        ),
        case(
            "spread where one node would do: restricted forbids it",
            M2X10,
            with(reserved("0"), policy(BestEffort)),
            exclusive("4"),
            with(reserved("0"), policy(Restricted)),
        )
        .others(vec![exclusive("7"), exclusive("8")])
        .misfit(TopologyAffinity, "where 1 could hold it, and topology policy restricted"),
        case(
            "scope container: each container on one node",
            M2X10,
            by_container(with(reserved("0"), policy(BestEffort))),
            two(),
            by_container(single()),
        )
        .others(vec![exclusive("3")]),
        case(
            "the same placement under scope pod",
            M2X10,
            by_container(with(reserved("0"), policy(BestEffort))),
            two(),
            by_pod(single()),
        )
        .others(vec![exclusive("3")])
        .misfit(TopologyAffinity, "the pod spans NUMA nodes 0-1"),
        case(
            "memory on the other node",
            M2X10,
            reserved("0"),
            pod_of(vec![ctr("main", &[("cpu", "2"), ("memory", "100Gi")], true)]),
            single(),
        )
        .misfit(TopologyAffinity, "single-numa-node"),
    ] {
        check(c);
    }
}

#[test]
fn full_pcpus_only_and_strict_reservation() {
    let full = |s: NodeSettings| with(s, |s| s.cpu_manager.full_pcpus_only = true);
    let strict = |s: NodeSettings| with(s, |s| s.cpu_manager.strict_cpu_reservation = true);
    for c in [
        case(
            "whole cores: full-pcpus-only allows them",
            M4,
            full(reserved("0,16")),
            exclusive("2"),
            full(reserved("0,16")),
        ),
        case("whole cores taken before the option", M4, reserved("0,16"), exclusive("2"), full(reserved("0,16"))),
        case("half a core: full-pcpus-only forbids it", M4, reserved("0,16"), exclusive("1"), full(reserved("0,16")))
            .misfit(SmtAlignment, "without their core siblings 17"),
        case("strict: a shared pod beside free CPUs", TWO, reserved("0"), shared(), strict(reserved("0"))),
        case("strict: the shared pod would have no CPU left", TWO, reserved("0"), shared(), strict(reserved("0")))
            .others(vec![exclusive("1")])
            .misfit(NoSharedCpus, "strict-cpu-reservation keeps reserved CPUs 0 out of it"),
        case("not strict: the reserved CPU stays in the pool", TWO, reserved("0"), shared(), reserved("0"))
            .others(vec![exclusive("1")]),
    ] {
        check(c);
    }
}

#[test]
fn devices_removed_from_the_settings() {
    let offering = |addrs: &[&str]| {
        with(reserved("0"), |s| {
            s.devices.insert("pinion.io/nic".into(), addrs.iter().map(|a| a.to_string()).collect());
        })
    };
    let nic = || pod_of(vec![ctr("main", &[("cpu", "2"), ("memory", "1Gi"), ("pinion.io/nic", "1")], true)]);
    let mut cases = vec![
        case("still offered", M2X10, offering(&[NIC]), nic(), offering(&[NIC, "0000:af:00.0"])),
        case("the device is gone", M2X10, offering(&[NIC]), nic(), offering(&["0000:af:00.0"]))
            .misfit(DeviceRemoved, "holds pinion.io/nic device 0000:3b:00.0, which this node no longer offers"),
        case("the resource is gone", M2X10, offering(&[NIC]), nic(), reserved("0"))
            .misfit(DeviceRemoved, "0000:3b:00.0"),
        case(
            "a device on the pod's node under single-numa-node",
            M2X10,
            offering(&[NIC]),
            nic(),
            with(offering(&[NIC]), policy(SingleNumaNode)),
        ),
    ];
    for c in &mut cases {
        c.machine.devices = vec![
            PciDevice { address: NIC.into(), class: "0x020000".into(), numa: Some(0), ..PciDevice::default() },
            PciDevice {
                address: "0000:af:00.0".into(),
                class: "0x020000".into(),
                numa: Some(1),
                ..PciDevice::default()
            },
        ];
    }
    for c in cases {
        check(c);
    }
}

/// What `admit` places under a policy, `recheck` accepts under the same
/// settings, on machines of every shape the engine tests use.
#[test]
fn what_admit_places_recheck_accepts() {
    let pods = [exclusive("1"), exclusive("2"), exclusive("4"), exclusive("12"), shared()];
    for desc in [M2X10, M4, TWO, "pack:2 numa:2 core:8 pu:2", "pack:4 numa:2 core:4 pu:2"] {
        let t = machine(desc);
        for p in [BestEffort, Restricted, SingleNumaNode] {
            for full in [false, true] {
                let s = with(reserved("0"), |s| {
                    s.topology_policy = p;
                    s.cpu_manager.full_pcpus_only = full;
                });
                let mut alloc = Allocations::default();
                for (i, pod) in pods.iter().cycle().take(12).enumerate() {
                    let key = format!("pod-{i}");
                    let Ok(placed) = admit(&t, &s, &alloc, &key, pod) else { continue };
                    let got = recheck(&t, &s, &alloc, pod, &placed);
                    assert_eq!(got, Ok(()), "{desc} {p:?} full={full} {key}: {placed:?}");
                    alloc.apply(&key, placed);
                }
            }
        }
    }
}
