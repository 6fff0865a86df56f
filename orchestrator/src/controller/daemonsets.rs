//! The DaemonSets' decider: a DaemonSet, the nodes and its pods as stored,
//! the time and a fit check in, the pods to create (each with its binding),
//! the pods to delete, the status and when to look again out.
//! `specs::daemonset::reconcile` makes every choice of node; this module
//! says what the store's nodes and pods mean to it and asks `place` whether
//! each new pod fits its node. No I/O, no clock.
//!
//! Why a fit check here: a DaemonSet's pod names its node (`new_pod`), and a
//! pod that names its node skips the scheduler's queue. Left at that, its
//! CPUs would be missing from the scheduler's mirror until the node reports,
//! and a node that cannot admit it would reject it back to the queue, from
//! where any node could take it. So the controller asks the scheduler to
//! place the pod on that node only (`Scheduler::place_on`: the same filters
//! and the same `specs::engine::admit` on the node's mirror, held there as a
//! binding); the pod is made with that plan, which the node adopts as it
//! adopts any binding's (or runs the same engine on its truth). A node where
//! it does not fit gets no pod: the status names it (`unfit`) and the
//! DaemonSet is looked at again after `UNFIT_RETRY_SECONDS`.

use specs::api::{Node, NodeCondition};
use specs::daemonset::{new_pod, reconcile, DaemonPod, DaemonSet, DaemonSetStatus, ObservedNode, UnfitNode};
use specs::limits::MAX_STATUS_NODES;
use specs::{Pod, PodPhase};

use crate::cluster::daemonsets::is_pod_of;
use crate::scheduler::Binding;

/// How long a node where the pod does not fit waits before it is tried
/// again (also tried at every change of the DaemonSet, its pods or nodes).
pub(super) const UNFIT_RETRY_SECONDS: u64 = 5;

/// What to do for one DaemonSet now.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Decision {
    /// New pods, bound to their node by name, with the plan made there.
    pub(super) create: Vec<(Pod, Binding)>,
    pub(super) delete: Vec<String>,
    pub(super) status: DaemonSetStatus,
    /// Unix seconds: look again then even if nothing changes.
    pub(super) requeue_at: Option<u64>,
}

/// A stored node as the DaemonSet sees it: its labels, and Ready.
pub(super) fn observed_node(node: &Node) -> ObservedNode {
    ObservedNode {
        name: node.metadata.name.clone(),
        labels: node.metadata.labels.clone(),
        ready: node.status.condition == NodeCondition::Ready,
    }
}

/// A stored pod as the DaemonSet sees it (`None`: bound to no node, which
/// no DaemonSet makes). Readiness as a Deployment's pods'
/// (`rollout::observed`): a node that says nothing of it has a Running pod
/// ready since its creation.
pub(super) fn observed(pod: &Pod) -> Option<DaemonPod> {
    let mut o = DaemonPod::of(pod)?;
    o.created = super::rollout::created(pod);
    let status = pod.status.clone().unwrap_or_default();
    o.ready_since = match status.ready_since() {
        Some(t) => Some(t),
        None if status.conditions.is_empty() && status.phase == PodPhase::Running => Some(o.created),
        None => None,
    };
    Some(o)
}

/// The decision for `d` from the stored nodes and pods (pods not its own
/// are left out), at `now`; `place(node, pod)` places a new pod on its node
/// or says why it does not fit there.
pub(super) fn decide(
    d: &DaemonSet,
    nodes: &[Node],
    pods: &[Pod],
    now: u64,
    mut place: impl FnMut(&str, &Pod) -> Result<Binding, String>,
) -> Decision {
    let nodes: Vec<ObservedNode> = nodes.iter().map(observed_node).collect();
    let mine: Vec<DaemonPod> = pods.iter().filter(|p| is_pod_of(p, d)).filter_map(observed).collect();
    let plan = reconcile(d, &nodes, &mine, now);
    let mut status = plan.status;
    let mut create = Vec::with_capacity(plan.create.len());
    for node in plan.create {
        let pod = new_pod(d, &node);
        match place(&node, &pod) {
            Ok(b) => create.push((pod, b)),
            Err(message) => {
                status.number_unfit = status.number_unfit.saturating_add(1);
                if status.unfit.len() < MAX_STATUS_NODES {
                    status.unfit.push(UnfitNode { node, message });
                }
            }
        }
    }
    let retry = (status.number_unfit > 0).then(|| now.saturating_add(UNFIT_RETRY_SECONDS));
    let requeue_at = match (plan.requeue_at, retry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Decision { create, delete: plan.delete, status, requeue_at }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::daemonset::DAEMONSET_LABEL;

    const NOW: u64 = 1_800_000_000;

    fn daemonset() -> DaemonSet {
        let yaml = "apiVersion: pinion.io/v1\nkind: DaemonSet\nmetadata: {name: ptp, owner: alice, generation: 2}\nspec:\n  selector: {matchLabels: {app: ptp}}\n  template:\n    metadata: {labels: {app: ptp}}\n    spec:\n      nodeSelector: {ptp: \"yes\"}\n      containers: [{name: c, rootfs: host, command: [sleep, inf]}]\n";
        serde_yaml_ng::from_str(yaml).expect("daemonset")
    }

    fn node(name: &str, matches: bool, ready: bool) -> Node {
        let mut n = Node {
            api_version: "pinion.io/v1".into(),
            kind: "Node".into(),
            metadata: specs::pod::ObjectMeta { name: name.into(), ..Default::default() },
            spec: Default::default(),
            status: Default::default(),
        };
        if matches {
            n.metadata.labels.insert("ptp".into(), "yes".into());
        }
        n.status.condition = if ready { NodeCondition::Ready } else { NodeCondition::NotReady };
        n
    }

    fn pod_on(d: &DaemonSet, node: &str, phase: PodPhase, owner: &str) -> Pod {
        let mut p = new_pod(d, node);
        p.metadata.owner = Some(owner.into());
        p.metadata.creation_timestamp = Some("2026-01-01T00:00:00Z".into());
        p.status = Some(specs::PodStatus { phase, ..Default::default() });
        p
    }

    /// (nodes as (name, matches, ready), pods as (node, phase, owner), nodes
    /// where nothing fits) -> (nodes given a pod, pods deleted, unfit nodes,
    /// a requeue)
    #[allow(clippy::type_complexity)]
    fn check(
        nodes: &[(&str, bool, bool)],
        pods: &[(&str, PodPhase, &str)],
        full: &[&str],
        expected: (&[&str], usize, &[&str], bool),
    ) {
        let d = daemonset();
        let nodes: Vec<Node> = nodes.iter().map(|(n, m, r)| node(n, *m, *r)).collect();
        let pods: Vec<Pod> = pods.iter().map(|(n, ph, o)| pod_on(&d, n, *ph, o)).collect();
        let got = decide(&d, &nodes, &pods, NOW, |node, _| {
            if full.contains(&node) {
                Err("insufficient cpu".into())
            } else {
                Ok(Binding { node: node.into(), epoch: 7, placement: Default::default() })
            }
        });
        let created: Vec<&str> = got.create.iter().map(|(_, b)| b.node.as_str()).collect();
        let unfit: Vec<&str> = got.status.unfit.iter().map(|u| u.node.as_str()).collect();
        assert_eq!(
            (created.as_slice(), got.delete.len(), unfit.as_slice(), got.requeue_at.is_some()),
            expected,
            "{nodes:?} {pods:?} full {full:?}"
        );
        assert_eq!(got.status.number_unfit as usize, unfit.len());
        assert_eq!(got.status.observed_generation, 2);
        for (p, b) in &got.create {
            assert_eq!(p.spec.node_name.as_deref(), Some(b.node.as_str()), "bound by name");
            assert_eq!(p.metadata.labels.get(DAEMONSET_LABEL).map(String::as_str), Some("ptp"));
            assert_eq!(p.metadata.owner.as_deref(), Some("alice"));
        }
    }

    #[test]
    fn decisions() {
        use PodPhase::*;
        // One pod per matching Ready node; the other nodes get none.
        check(&[("a", true, true), ("b", true, true), ("c", false, true)], &[], &[], (&["a", "b"], 0, &[], false));
        // A NotReady matching node waits for Ready.
        check(&[("a", true, false)], &[], &[], (&[], 0, &[], false));
        // A node that has its pod gets none; one that stopped matching loses it.
        check(
            &[("a", true, true), ("b", false, true)],
            &[("a", Running, "alice"), ("b", Running, "alice")],
            &[],
            (&[], 1, &[], false),
        );
        // A node that left takes its pod with it.
        check(&[("a", true, true)], &[("a", Running, "alice"), ("gone", Running, "alice")], &[], (&[], 1, &[], false));
        // Where the pod does not fit it is not made: the status says so and
        // the DaemonSet is looked at again.
        check(&[("a", true, true), ("b", true, true)], &[], &["b"], (&["a"], 0, &["b"], true));
        // Another's pods with the label are not the DaemonSet's.
        check(&[("a", true, true)], &[("a", Running, "mallory")], &[], (&["a"], 0, &[], false));
        // An ended pod goes; its node gets a new one once it is gone.
        check(&[("a", true, true)], &[("a", Failed, "alice")], &[], (&[], 1, &[], false));
    }
}
