//! Where the agent's desired pods come from: the static manifest folder, and
//! (when joined) the orchestrator's binding stream. Both feed one channel of
//! `DesiredChange`s; the agent reconciles against it and publishes a `NodeReport`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use specs::{Allocations, CpuSet, Placement, Pod, PodStatus, Rejection};

/// A plan the scheduler computed, with the allocation epoch it was computed
/// against. The agent adopts it as is when the epoch still matches and re-runs
/// the engine on its own truth when not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundPlan {
    pub(crate) epoch: u64,
    pub(crate) placement: Placement,
}

#[derive(Debug, Clone)]
pub enum DesiredChange {
    /// Run this pod (new or changed). `key` is unique per source: static pods are
    /// `static/<file stem>`, orchestrator pods `<name>`.
    Apply { key: String, pod: Box<Pod>, plan: Option<BoundPlan> },
    /// Stop the pod and free its resources.
    Remove { key: String },
    /// The source holds a malformed version of this pod (`message` names the file
    /// and field). The agent reports it and keeps running the previous version,
    /// and a `Resync` that omits the key does not remove it.
    Invalid { key: String, message: String },
    /// The complete desired set of one source (`static/` or orchestrator): keys of
    /// that source not listed are removed. Sent on (re)connect.
    Resync { source: SourceKind, pods: Vec<(String, Pod, Option<BoundPlan>)> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceKind {
    Static,
    Orchestrator,
}

impl SourceKind {
    pub(crate) fn of_key(key: &str) -> SourceKind {
        if key.starts_with("static/") {
            SourceKind::Static
        } else {
            SourceKind::Orchestrator
        }
    }
}

/// What the agent publishes after every change (and on a timer): read by
/// `pinion agent status` from the data dir and sent to the orchestrator when joined.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node_name: String,
    pub allocations: Allocations,
    pub pods: BTreeMap<String, PodStatus>,
    /// The engine's refusal of each pod it did not admit on this node's truth,
    /// by key: the only thing the link reports to the server as a refusal
    /// (which unbinds the pod). A local step that failed (a checkpoint write,
    /// a runtime call) is the node's own trouble, retried here: it shows in
    /// the pod's status text and container reason, never in this map.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rejections: BTreeMap<String, Rejection>,
    /// CPUs of the machine as discovered that are offline now: none is
    /// handed out until it is back (see `AgentConfig::sysfs_root`).
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub offline_cpus: CpuSet,
    /// The runtime id of every running container, by pod key and container
    /// name: where the node's endpoint runs an exec.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) running: BTreeMap<String, BTreeMap<String, String>>,
    /// What is not fine on this node (`specs::api::Condition`): the pod
    /// network the host cannot run, say. Sent whole with every report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<specs::api::Condition>,
    /// The pods being stopped (`specs::api::TerminatingPod`), whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terminating: Vec<specs::api::TerminatingPod>,
}
