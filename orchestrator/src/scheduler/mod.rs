//! The topology-aware scheduler: filter stages, then score stages, over the
//! admission engine in `specs`, on per-node mirrors of the nodes' allocations.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use specs::{Allocations, NodeSettings, NodeTopology, Placement, Pod};

/// What the scheduler knows about one node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub topology: Arc<NodeTopology>,
    pub settings: NodeSettings,
    pub allocations: Allocations,
    pub ready: bool,
}

/// A pod bound to a node with the full plan and the epoch it was computed against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    pub node: String,
    pub epoch: u64,
    pub placement: Placement,
}

/// No node can take the pod: a summary line and each node's best option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unschedulable {
    pub message: String,
    pub per_node: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
pub struct Scheduler {
    nodes: BTreeMap<String, NodeInfo>,
}

impl Scheduler {
    pub fn upsert_node(&mut self, node: NodeInfo) {
        self.nodes.insert(node.name.clone(), node);
    }

    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Picks a node for the pod and records the allocation in that node's mirror.
    pub fn schedule(&mut self, pod_key: &str, pod: &Pod) -> Result<Binding, Unschedulable> {
        let mut per_node = BTreeMap::new();
        for node in self.nodes.values_mut().filter(|n| n.ready) {
            match specs::admit(&node.topology, &node.settings, &node.allocations, pod_key, pod) {
                Ok(placement) => {
                    let epoch = node.allocations.epoch;
                    node.allocations.apply(pod_key, placement.clone());
                    return Ok(Binding { node: node.name.clone(), epoch, placement });
                }
                Err(r) => {
                    per_node.insert(node.name.clone(), r.message);
                }
            }
        }
        Err(Unschedulable { message: format!("0/{} nodes can run the pod", self.nodes.len()), per_node })
    }
}
