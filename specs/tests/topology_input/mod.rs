//! What the `topology_json` fuzz target does with one input, shared with the
//! regression tests (`tests/fuzz_regressions.rs`) so a kept input is checked
//! exactly as the target checked it: `NodeTopology` from JSON (what a node
//! registers), then `validate_topology`, which promises that a topology
//! passing it never makes the engine panic, so a valid one is also drawn and
//! offered a few pods.

use std::sync::OnceLock;

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

/// Runs one input; a panic is the finding. Returns the validation problems
/// of an input that deserializes (`None` for one that does not).
pub fn check(data: &[u8]) -> Option<Vec<specs::validate::FieldError>> {
    let topology = serde_json::from_slice::<NodeTopology>(data).ok()?;
    let problems = specs::validate::validate_topology(&topology);
    if problems.is_empty() {
        let _ = specs::topology::draw::draw(&topology, &Default::default());
        for policy in [TopologyPolicy::None, TopologyPolicy::Restricted, TopologyPolicy::SingleNumaNode] {
            let settings = NodeSettings { topology_policy: policy, ..Default::default() };
            for (i, pod) in pods().iter().enumerate() {
                let _ = admit(&topology, &settings, &Allocations::default(), &format!("default/p{i}"), pod);
            }
        }
    }
    Some(problems)
}
