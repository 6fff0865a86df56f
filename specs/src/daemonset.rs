//! The DaemonSet: one pod per node that matches its template's
//! `nodeSelector`, nodes that join later included (`kind: DaemonSet`,
//! `pinion.io/v1`, Kubernetes-shaped). Its pods are bound to their node by
//! name when made (`new_pod`): a DaemonSet's pod is never replaced on
//! another node, whatever becomes of its own. This module holds the object,
//! its checks, its pure reconcile (`reconcile`) and its revisions
//! (`next_history`, `undo`): kept in its status as a Deployment keeps its own
//! (`crate::deployment::advance_history`), where Kubernetes keeps
//! ControllerRevisions, so `pinion rollout history|undo|restart daemonset`
//! work as they do for a Deployment.
//!
//! Rules of the reconcile:
//! - A Ready matching node without a pod gets one; a node that is NotReady
//!   keeps its pod, and gets one only once Ready (a binding it cannot hear
//!   would only wait).
//! - A pod on a node that left, or no longer matches, is deleted; so is an
//!   ended pod (the next reconcile makes its node a new one), and all but
//!   one of several pods on one node (current revision first, then ready,
//!   then oldest).
//! - A node gets its new pod only once its old one is gone: the two would
//!   share the node's exclusive CPUs.
//! - RollingUpdate deletes old pods node by node (by node name), at most
//!   `maxUnavailable` nodes without an available pod at once; an old pod
//!   that is not available goes at any time. OnDelete never deletes an old
//!   pod: a new one comes when someone deletes it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::deployment::{
    advance_history, fnv1a64, template_hash, IntOrPercent, LabelSelector, Revision, RolloutError,
    DEFAULT_REVISION_HISTORY_LIMIT, TEMPLATE_HASH_LABEL,
};
use crate::job::PodTemplate;
use crate::limits::{MAX_NAME_LEN, MAX_REPLICAS, MAX_REVISION_HISTORY, MAX_WORKLOAD_SECONDS};
use crate::pod::{ObjectMeta, Pod, API_VERSION};
use crate::status::PodPhase;
use crate::validate::FieldError;

/// Label on every pod of a DaemonSet: the DaemonSet's name.
pub const DAEMONSET_LABEL: &str = "pinion.io/daemonset";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSet {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: DaemonSetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DaemonSetStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSetSpec {
    pub selector: LabelSelector,
    /// Its `spec.nodeSelector` says which nodes run a pod.
    pub template: PodTemplate,
    #[serde(default)]
    pub update_strategy: DaemonSetUpdateStrategy,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_ready_seconds: u32,
    /// Old revisions kept for `undo` (`DEFAULT_REVISION_HISTORY_LIMIT`, as
    /// a Deployment's and Kubernetes' DaemonSet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<u32>,
}

impl DaemonSetSpec {
    pub fn revision_history_limit(&self) -> u32 {
        self.revision_history_limit.unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSetUpdateStrategy {
    #[serde(rename = "type", default)]
    pub kind: DaemonSetStrategyType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<DaemonSetRollingUpdate>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DaemonSetStrategyType {
    #[default]
    RollingUpdate,
    OnDelete,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSetRollingUpdate {
    /// Nodes without an available pod at once during an update (1 when
    /// unset; a percent of the matching nodes rounds up, as Kubernetes').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSetStatus {
    #[serde(default)]
    pub observed_generation: u64,
    /// Matching nodes.
    #[serde(default)]
    pub desired_number_scheduled: u32,
    /// Matching nodes with a pod.
    #[serde(default)]
    pub current_number_scheduled: u32,
    /// Pods on nodes that left or no longer match.
    #[serde(default)]
    pub number_misscheduled: u32,
    #[serde(default)]
    pub number_ready: u32,
    /// Matching nodes whose pod runs the current template.
    #[serde(default)]
    pub updated_number_scheduled: u32,
    #[serde(default)]
    pub number_available: u32,
    #[serde(default)]
    pub number_unavailable: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template_hash: String,
    /// Matching nodes that get no pod because it does not fit there now (the
    /// server's fit check, before the pod is made), at most
    /// `MAX_STATUS_NODES` of them; `number_unfit` counts them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfit: Vec<UnfitNode>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub number_unfit: u32,
    /// The current revision's number (0: none yet).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub revision: u64,
    /// The current revision and up to `revisionHistoryLimit` older ones,
    /// oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Revision>,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The history once the controller has seen `ds`'s template
/// (`crate::deployment::advance_history`), and the current revision's index in it.
pub fn next_history(ds: &DaemonSet) -> (Vec<Revision>, usize) {
    let status = ds.status.clone().unwrap_or_default();
    advance_history(status.history, status.revision, &ds.spec.template, ds.spec.revision_history_limit())
}

/// The template `pinion rollout undo daemonset` puts back: revision `to`,
/// or the one before the current when `None`. The caller writes it as the
/// spec's template; the next reconcile makes it the newest revision and
/// rolls the nodes to it under the update strategy.
pub fn undo(ds: &DaemonSet, to: Option<u64>) -> Result<PodTemplate, RolloutError> {
    let status = ds.status.clone().unwrap_or_default();
    crate::deployment::template_to_undo("daemonset", &ds.metadata.name, &status.history, status.revision, to)
}

/// A matching node the DaemonSet's pod does not fit now, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnfitNode {
    pub node: String,
    pub message: String,
}

/// The pod name on `node`: the DaemonSet's name, as much of the node's name
/// as fits (dots made dashes), and 5 characters of a hash of the node's
/// name and the template's hash, so a node's next revision has another name
/// (the old pod may still be stopping) and two nodes whose names shorten
/// alike still differ.
pub fn pod_name(daemonset: &str, node: &str, hash: &str) -> String {
    let tag = {
        let key = format!("{node}/{hash}");
        crate::deployment::pod_suffix(fnv1a64(key.as_bytes()))
    };
    let room = MAX_NAME_LEN.saturating_sub(daemonset.len() + tag.len() + 2);
    let part: String =
        node.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(room).collect();
    let part = part.trim_matches('-');
    if part.is_empty() {
        format!("{daemonset}-{tag}")
    } else {
        format!("{daemonset}-{part}-{tag}")
    }
}

/// The pod for `node`: the template, bound to the node, labelled with the
/// selector, the DaemonSet and the template's hash.
pub fn new_pod(ds: &DaemonSet, node: &str) -> Pod {
    let t = &ds.spec.template;
    let hash = template_hash(t);
    let mut pod = Pod::new(pod_name(&ds.metadata.name, node, &hash), t.spec.clone());
    if let Some(m) = &t.metadata {
        pod.metadata.labels = m.labels.clone();
        pod.metadata.annotations = m.annotations.clone();
    }
    let l = &mut pod.metadata.labels;
    l.extend(ds.spec.selector.match_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    l.insert(DAEMONSET_LABEL.into(), ds.metadata.name.clone());
    l.insert(TEMPLATE_HASH_LABEL.into(), hash);
    pod.metadata.owner = ds.metadata.owner.clone();
    pod.spec.node_name = Some(node.to_string());
    pod
}

/// Every problem of the DaemonSet, each with its field path.
pub fn validate_daemonset(ds: &DaemonSet) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut push = |field: &str, message: String| e.push(FieldError { field: field.into(), message });
    if ds.api_version != API_VERSION {
        push("apiVersion", format!("must be {API_VERSION:?}, got {:?}", ds.api_version));
    }
    if ds.kind != "DaemonSet" {
        push("kind", format!("must be \"DaemonSet\", got {:?}", ds.kind));
    }
    let s = &ds.spec;
    let at = "spec.updateStrategy.rollingUpdate.maxUnavailable";
    match (s.update_strategy.kind, &s.update_strategy.rolling_update) {
        (DaemonSetStrategyType::OnDelete, Some(_)) => {
            push("spec.updateStrategy.rollingUpdate", "only with type RollingUpdate".into())
        }
        (_, Some(DaemonSetRollingUpdate { max_unavailable: Some(v) })) => match *v {
            IntOrPercent::Int(0) | IntOrPercent::Percent(0) => push(at, "must be at least 1 (or 1%)".into()),
            IntOrPercent::Percent(p) if p > 100 => push(at, format!("must be at most 100%, got {p}%")),
            IntOrPercent::Int(n) if n > MAX_REPLICAS => push(at, format!("must be at most {MAX_REPLICAS}, got {n}")),
            _ => {}
        },
        _ => {}
    }
    if s.min_ready_seconds > MAX_WORKLOAD_SECONDS {
        push("spec.minReadySeconds", format!("must be at most {MAX_WORKLOAD_SECONDS} (a day)"));
    }
    if s.revision_history_limit.is_some_and(|r| r > MAX_REVISION_HISTORY) {
        push("spec.revisionHistoryLimit", format!("must be at most {MAX_REVISION_HISTORY}"));
    }
    if s.template.spec.node_lost_replace_after_seconds.is_some() {
        push(
            "spec.template.spec.nodeLostReplaceAfterSeconds",
            "a DaemonSet's pod belongs to its node and is never replaced on another: leave it unset".into(),
        );
    }
    e.extend(crate::deployment::validate_workload(&ds.metadata, &s.selector, &s.template));
    e
}

/// A node as the DaemonSet controller sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
}

/// One of the DaemonSet's pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonPod {
    pub name: String,
    pub node: String,
    pub template_hash: String,
    pub phase: PodPhase,
    pub created: u64,
    pub ready_since: Option<u64>,
    pub deleting: bool,
}

impl DaemonPod {
    /// What the pod says of itself (`None` for a pod bound to no node, which
    /// no DaemonSet makes); the caller adds `created`, `ready_since` and
    /// `deleting`.
    pub fn of(pod: &Pod) -> Option<DaemonPod> {
        Some(DaemonPod {
            name: pod.metadata.name.clone(),
            node: pod.spec.node_name.clone()?,
            template_hash: crate::deployment::pod_template_hash(pod).unwrap_or_default().to_string(),
            phase: pod.status.as_ref().map(|s| s.phase).unwrap_or_default(),
            ..Default::default()
        })
    }

    fn available(&self, now: u64, min_ready: u64) -> bool {
        !self.deleting && self.ready_since.is_some_and(|t| now >= t.saturating_add(min_ready))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DaemonSetPlan {
    /// Nodes to make a pod for (`new_pod`), by name.
    pub create: Vec<String>,
    /// Pods to delete.
    pub delete: Vec<String>,
    pub status: DaemonSetStatus,
    /// Reconcile again then: a pod becomes available.
    pub requeue_at: Option<u64>,
}

/// The reconcile: see the module's rules.
pub fn reconcile(ds: &DaemonSet, nodes: &[ObservedNode], pods: &[DaemonPod], now: u64) -> DaemonSetPlan {
    let hash = template_hash(&ds.spec.template);
    let (history, current) = next_history(ds);
    let min_ready = u64::from(ds.spec.min_ready_seconds);
    let selector = &ds.spec.template.spec.node_selector;
    let matching: BTreeMap<&str, &ObservedNode> = nodes
        .iter()
        .filter(|n| selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
        .map(|n| (n.name.as_str(), n))
        .collect();
    let mut delete: Vec<String> = Vec::new();
    let mut per_node: BTreeMap<&str, Vec<&DaemonPod>> = BTreeMap::new();
    let mut misscheduled = 0;
    for p in pods {
        if !matching.contains_key(p.node.as_str()) {
            if !p.deleting {
                misscheduled += 1;
                delete.push(p.name.clone());
            }
        } else if p.phase.is_terminal() {
            if !p.deleting {
                delete.push(p.name.clone());
            }
            per_node.entry(&p.node).or_default().push(p);
        } else {
            per_node.entry(&p.node).or_default().push(p);
        }
    }
    let mut create = Vec::new();
    // The one pod each matching node keeps, when it has a live one.
    let mut kept: BTreeMap<&str, &DaemonPod> = BTreeMap::new();
    for (node, n) in &matching {
        let mut here: Vec<&DaemonPod> = per_node.get(node).cloned().unwrap_or_default();
        let live: Vec<&DaemonPod> = here.iter().copied().filter(|p| !p.deleting && !p.phase.is_terminal()).collect();
        if live.is_empty() {
            // A node with any pod still stopping waits for it to go.
            if here.is_empty() && n.ready {
                create.push(node.to_string());
            }
            continue;
        }
        here = live;
        here.sort_by_key(|p| (p.template_hash != hash, p.ready_since.is_none(), p.created, p.name.clone()));
        kept.insert(node, here[0]);
        delete.extend(here[1..].iter().map(|p| p.name.clone()));
    }

    let desired = matching.len() as u32;
    let available_nodes = kept.values().filter(|p| p.available(now, min_ready)).count() as u32;
    if ds.spec.update_strategy.kind == DaemonSetStrategyType::RollingUpdate {
        let max_unavailable = ds
            .spec
            .update_strategy
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_unavailable)
            .unwrap_or(IntOrPercent::Int(1))
            .resolve(desired, true)
            .max(1);
        let mut unavailable = desired - available_nodes;
        for p in kept.values().filter(|p| p.template_hash != hash) {
            if !p.available(now, min_ready) {
                // Serves nothing: replacing it costs no availability.
                delete.push(p.name.clone());
            } else if unavailable < max_unavailable {
                delete.push(p.name.clone());
                unavailable += 1;
            }
        }
    }

    let status = DaemonSetStatus {
        observed_generation: ds.metadata.generation.unwrap_or(0),
        desired_number_scheduled: desired,
        current_number_scheduled: kept.len() as u32,
        number_misscheduled: misscheduled,
        number_ready: kept.values().filter(|p| p.ready_since.is_some()).count() as u32,
        updated_number_scheduled: kept.values().filter(|p| p.template_hash == hash).count() as u32,
        number_available: available_nodes,
        number_unavailable: desired - available_nodes,
        template_hash: hash,
        revision: history[current].number,
        history,
        ..Default::default()
    };
    let requeue_at =
        kept.values().filter_map(|p| p.ready_since.map(|t| t.saturating_add(min_ready))).filter(|t| *t > now).min();
    DaemonSetPlan { create, delete, status, requeue_at }
}

#[cfg(test)]
mod tests;
