//! `NodeTopology` from JSON (what a node registers), then `validate_topology`.
//! `validate_topology` promises that a topology passing it never makes the
//! engine panic, so a valid one is also drawn and offered a few pods.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use specs::engine::{admit, Allocations, NodeSettings};
use specs::{NodeTopology, Pod, TopologyPolicy};

const PODS: &str = "\
apiVersion: pinion.io/v1
kind: Pod
metadata: {name: pinned}
spec:
  topology: {policy: single-numa-node}
  containers:
  - {name: c, rootfs: host, resources: {limits: {cpu: '2', memory: 1Gi, hugepages-2Mi: 4Mi}}}
---
apiVersion: pinion.io/v1
kind: Pod
metadata: {name: shared}
spec:
  containers:
  - {name: c, rootfs: host, resources: {requests: {cpu: 500m, memory: 64Mi}}}
";

fn pods() -> &'static [Pod] {
    static PODS_CELL: OnceLock<Vec<Pod>> = OnceLock::new();
    PODS_CELL.get_or_init(|| specs::manifest::parse_pods(PODS).expect("the target's own pods parse"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(topology) = serde_json::from_slice::<NodeTopology>(data) else { return };
    if !specs::validate::validate_topology(&topology).is_empty() {
        return;
    }
    let _ = specs::topology::draw::draw(&topology, &Default::default());
    for policy in [TopologyPolicy::None, TopologyPolicy::Restricted, TopologyPolicy::SingleNumaNode] {
        let settings = NodeSettings { topology_policy: policy, ..Default::default() };
        for (i, pod) in pods().iter().enumerate() {
            let _ = admit(&topology, &settings, &Allocations::default(), &format!("default/p{i}"), pod);
        }
    }
});
