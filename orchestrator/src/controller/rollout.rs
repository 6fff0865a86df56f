//! The Deployments' decider: a Deployment and its pods as stored, the nodes'
//! conditions, the time and drawn suffixes in, the pods to create, delete
//! and mark replaced, the status and when to look again out
//! (`specs::rollout::reconcile` makes every choice of count and order,
//! `specs::node_lost` every choice about a silent node; this module only
//! says what the store's pods and the nodes mean to them). No I/O, no clock.

use std::collections::HashMap;

use specs::deployment::{Deployment, DeploymentStatus};
use specs::node_lost::{self, LostVerdict, NodeCondition, NodeStanding, ReplaceAfter, REPLACED_ANNOTATION};
use specs::rollout::ObservedPod;
use specs::{Pod, PodPhase};

use crate::cluster::deployments::is_pod_of;

/// What the controller knows of the nodes, for the node-lost rule.
#[derive(Debug, Clone)]
pub(super) struct Nodes {
    /// Each node's condition by name. A node not listed (deleted, or not
    /// known yet) counts as Ready: a pod is never replaced on a guess.
    pub(super) conditions: HashMap<String, NodeCondition>,
    /// The cluster's `nodeLostReplaceAfterSeconds` for a pod that sets none.
    pub(super) default: ReplaceAfter,
}

impl Nodes {
    fn condition(&self, node: Option<&str>) -> NodeCondition {
        node.and_then(|n| self.conditions.get(n)).copied().unwrap_or(NodeCondition::Ready)
    }
}

/// A pod replaced because its node was lost: marked `REPLACED_ANNOTATION`
/// in the write that creates its replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Replaced {
    pub(super) pod: String,
    pub(super) node: String,
}

/// One of two duplicates stopped after a lost node came back, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stopped {
    pub(super) pod: String,
    pub(super) why: &'static str,
}

/// What to do for one Deployment now.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Decision {
    pub(super) create: Vec<Pod>,
    pub(super) delete: Vec<String>,
    /// Pods to mark replaced (their node lost past their time), in the same
    /// write as the creates.
    pub(super) replaced: Vec<Replaced>,
    /// Of `delete`, those stopped as a duplicate of a returning node's pod
    /// (for the log: which one, and why).
    pub(super) duplicates: Vec<Stopped>,
    pub(super) status: DeploymentStatus,
    /// Unix seconds: look again then even if nothing changes (a pod becomes
    /// available, the progress deadline falls, a silent node's pod is due
    /// for replacement).
    pub(super) requeue_at: Option<u64>,
}

/// When the pod was created, unix seconds (0 when unknown).
pub(super) fn created(pod: &Pod) -> u64 {
    pod.metadata
        .creation_timestamp
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .and_then(|t| u64::try_from(t.timestamp()).ok())
        .unwrap_or(0)
}

/// A stored pod as the rollout sees it. Its readiness is its node's `Ready`
/// condition; a node that says nothing of readiness (no condition at all:
/// a node from before readiness was reported) has it ready while Running,
/// since its creation.
pub(super) fn observed(pod: &Pod) -> ObservedPod {
    let mut o = ObservedPod::of(pod);
    o.created = created(pod);
    let status = pod.status.clone().unwrap_or_default();
    o.ready_since = match status.ready_since() {
        Some(t) => Some(t),
        None if status.conditions.is_empty() && status.phase == PodPhase::Running => Some(o.created),
        None => None,
    };
    o
}

/// The decision for `d` from the stored pods (those not its own are left
/// out) on `nodes`, at `now`, naming new pods by `suffixes`.
///
/// A pod on a node NotReady past its `nodeLostReplaceAfterSeconds` (the
/// cluster's default when unset) is `Lost`: not counted, so the reconcile
/// makes a replacement (the scheduler places nothing on a NotReady node), and
/// marked replaced. Before that time it counts as it was, Unknown, and the
/// Deployment looks again when the time falls. `never` waits for the node.
///
/// When the node comes back its marked pod is `Returned` and the Deployment
/// has one too many: exactly one of the two goes, in
/// `specs::rollout::deletion_order`. The rule: a pod of an older revision
/// goes first in a rollout anyway; otherwise the pod on the returning node
/// stops, unless the replacement is the one not yet placed or not ready.
/// Why: the replacement already serves and was placed on the cluster as it is
/// now, while the returned pod ran unsupervised, its node's report is
/// only just coming in (it is still Unknown until then) and its node may go
/// silent again; stopping the one that serves nothing never lowers what is
/// available. Never both: the reconcile deletes only what exceeds `replicas`.
pub(super) fn decide(
    d: &Deployment,
    pods: &[Pod],
    nodes: &Nodes,
    now: u64,
    suffixes: impl IntoIterator<Item = u64>,
) -> Decision {
    let setting = |p: &Pod| p.spec.node_lost_replace_after_seconds;
    let mut replaced = Vec::new();
    let mut replace_at: Option<u64> = None;
    let mine: Vec<ObservedPod> = pods
        .iter()
        .filter(|p| is_pod_of(p, d))
        .map(|p| {
            let mut o = observed(p);
            if o.phase.is_terminal() {
                return o;
            }
            let verdict = node_lost::verdict(setting(p), nodes.default, nodes.condition(o.node.as_deref()), now);
            let marked = p.metadata.annotations.contains_key(REPLACED_ANNOTATION);
            o.standing = node_lost::standing(verdict, marked);
            match verdict {
                LostVerdict::Replace if !marked => {
                    replaced.push(Replaced { pod: o.name.clone(), node: o.node.clone().unwrap_or_default() })
                }
                // Marked too: a pod that outlived its return (its
                // replacement was the one stopped) and whose node went
                // silent again is replaced again at its time.
                LostVerdict::ReplaceAt(at) if !o.deleting => replace_at = Some(replace_at.map_or(at, |t| t.min(at))),
                _ => {}
            }
            o
        })
        .collect();
    let plan = specs::rollout::reconcile(d, &mine, now);
    let returned = mine.iter().any(|p| p.standing == NodeStanding::Returned && !p.deleting);
    let duplicates = if returned {
        plan.delete
            .iter()
            .filter_map(|name| mine.iter().find(|p| p.name == *name))
            .filter(|p| !p.phase.is_terminal())
            .map(|p| Stopped {
                pod: p.name.clone(),
                why: if p.standing == NodeStanding::Returned {
                    "its node came back after its replacement took over: the pod on the returning node stops"
                } else if p.ready_since.is_none() {
                    "a lost node's pod came back ready: its replacement, not ready yet, stops"
                } else {
                    "a lost node's pod came back: this one goes first by revision or readiness"
                },
            })
            .collect()
    } else {
        Vec::new()
    };
    Decision {
        create: plan.new_pods(d, suffixes),
        delete: plan.delete.clone(),
        replaced,
        duplicates,
        status: plan.status,
        requeue_at: [plan.requeue_at, replace_at].into_iter().flatten().min(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::deployment::{DEPLOYMENT_LABEL, TEMPLATE_HASH_LABEL};
    use specs::node_lost::{NodeCondition, ReplaceAfter};

    fn deployment(replicas: u32) -> Deployment {
        let yaml = format!(
            "apiVersion: pinion.io/v1\nkind: Deployment\nmetadata: {{name: web, owner: alice, generation: 3}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: c, rootfs: host, command: [sleep, inf]}}]\n"
        );
        serde_yaml_ng::from_str(&yaml).expect("deployment")
    }

    fn pod_of(d: &Deployment, suffix: u64, phase: PodPhase) -> Pod {
        let (history, cur) = specs::deployment::next_history(d);
        let mut p = specs::deployment::new_pod(d, &history[cur], suffix);
        p.metadata.creation_timestamp = Some("2026-01-01T00:00:00Z".into());
        p.status = Some(specs::PodStatus { phase, ..Default::default() });
        p
    }

    /// (replicas, pods' phases, owner of the pods) -> (created, deleted, ready in the status)
    fn check(replicas: u32, phases: &[PodPhase], owner: &str, expected: (usize, usize, u32)) {
        let d = deployment(replicas);
        let pods: Vec<Pod> = phases
            .iter()
            .enumerate()
            .map(|(i, ph)| {
                let mut p = pod_of(&d, i as u64, *ph);
                p.metadata.owner = Some(owner.into());
                p
            })
            .collect();
        let got = decide(&d, &pods, &ready_nodes(), 1_800_000_000, 100..);
        assert_eq!(
            (got.create.len(), got.delete.len(), got.status.ready_replicas),
            expected,
            "{replicas} replicas, {phases:?} of {owner}"
        );
        for p in &got.create {
            assert_eq!(p.metadata.labels.get(DEPLOYMENT_LABEL).map(String::as_str), Some("web"));
            assert_eq!(p.metadata.labels.get("app").map(String::as_str), Some("web"));
            let hash = &p.metadata.labels[TEMPLATE_HASH_LABEL];
            assert!(p.metadata.name.starts_with(&format!("web-{hash}-")), "{}", p.metadata.name);
            assert_eq!(p.metadata.owner.as_deref(), Some("alice"));
        }
        assert_eq!(got.status.observed_generation, 3);
    }

    fn ready_nodes() -> Nodes {
        Nodes { conditions: HashMap::new(), default: ReplaceAfter::Seconds(node_lost::DEFAULT_REPLACE_AFTER_SECONDS) }
    }

    #[test]
    fn decisions() {
        use PodPhase::*;
        check(3, &[], "alice", (3, 0, 0));
        // A node that says nothing of readiness: Running is ready.
        check(3, &[Running, Running, Pending], "alice", (0, 0, 2));
        check(1, &[Running, Running, Pending], "alice", (0, 2, 2));
        // Another's pods with the label are not the Deployment's.
        check(2, &[Running, Running], "mallory", (2, 0, 0));
        // An ended pod goes and is replaced.
        check(1, &[Failed], "alice", (1, 1, 0));
    }

    /// The node-lost cases' clock: node `c` falls silent at `T`.
    const T: u64 = 1_800_000_000;

    /// One pod of the node-lost cases: `(name, node, phase, ready, marked replaced)`.
    type P = (&'static str, &'static str, PodPhase, bool, bool);

    /// What one node-lost case expects: pods created, deleted (by name),
    /// marked replaced (by name), the requeue time.
    #[derive(Debug, PartialEq)]
    struct Want {
        create: usize,
        delete: Vec<String>,
        replaced: Vec<String>,
        requeue_at: Option<u64>,
    }

    fn want(create: usize, delete: &[&'static str], replaced: &[&'static str], requeue_at: Option<u64>) -> Want {
        let own = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        Want { create, delete: own(delete), replaced: own(replaced), requeue_at }
    }

    /// 3 replicas; `setting` the pods' own `nodeLostReplaceAfterSeconds`,
    /// `default` the cluster's, node `c` in condition `c`, at `now`.
    fn check_lost(
        what: &str,
        setting: Option<ReplaceAfter>,
        default: ReplaceAfter,
        c: NodeCondition,
        pods: &[P],
        now: u64,
        expected: Want,
    ) {
        let d = deployment(3);
        let pods: Vec<Pod> = pods
            .iter()
            .enumerate()
            .map(|(i, &(name, node, phase, ready, marked))| {
                let mut p = pod_of(&d, i as u64, phase);
                p.metadata.name = name.into();
                p.metadata.owner = Some("alice".into());
                p.spec.node_name = Some(node.into());
                p.spec.node_lost_replace_after_seconds = setting;
                if marked {
                    p.metadata.annotations.insert(REPLACED_ANNOTATION.into(), (T + 60).to_string());
                }
                if let Some(s) = p.status.as_mut() {
                    s.conditions.push(specs::status::PodCondition {
                        kind: specs::status::POD_READY.into(),
                        status: if ready {
                            specs::api::ConditionStatus::True
                        } else {
                            specs::api::ConditionStatus::False
                        },
                        last_transition_time: Some(T - 3600),
                    });
                }
                p
            })
            .collect();
        let nodes = Nodes {
            conditions: [("a", NodeCondition::Ready), ("b", NodeCondition::Ready), ("c", c)]
                .into_iter()
                .map(|(n, c)| (n.to_string(), c))
                .collect(),
            default,
        };
        let got = decide(&d, &pods, &nodes, now, 100..);
        let got = Want {
            create: got.create.len(),
            delete: got.delete,
            replaced: got.replaced.into_iter().map(|r| r.pod).collect(),
            // A rollout not complete also looks again at its progress
            // deadline (600 s from its first status): not these cases' point.
            requeue_at: got.requeue_at.filter(|&t| t != now + 600),
        };
        assert_eq!(got, expected, "{what}");
    }

    #[test]
    fn a_silent_nodes_pods() {
        use PodPhase::{Pending, Running, Unknown};
        use ReplaceAfter::{Never, Seconds};
        let lost = |since| NodeCondition::NotReady { since };
        let five = Seconds(300);
        // Steady: one pod per node, node c's Unknown since T.
        let steady: &[P] =
            &[("a1", "a", Running, true, false), ("b1", "b", Running, true, false), ("c1", "c", Unknown, true, false)];
        let s60 = Some(Seconds(60));
        check_lost("not before the timer", s60, five, lost(T), steady, T + 59, want(0, &[], &[], Some(T + 60)));
        check_lost("just lost: the timer set", s60, five, lost(T), steady, T, want(0, &[], &[], Some(T + 60)));
        check_lost(
            "at the timer: replaced and marked",
            s60,
            five,
            lost(T),
            steady,
            T + 60,
            want(1, &[], &["c1"], None),
        );
        check_lost("late: the same", s60, five, lost(T), steady, T + 999, want(1, &[], &["c1"], None));
        check_lost("the cluster's default", None, five, lost(T), steady, T + 299, want(0, &[], &[], Some(T + 300)));
        check_lost("the cluster's default, on time", None, five, lost(T), steady, T + 300, want(1, &[], &["c1"], None));
        check_lost("never", Some(Never), five, lost(T), steady, T + 1_000_000, want(0, &[], &[], None));
        check_lost("the cluster says never", None, Never, lost(T), steady, T + 1_000_000, want(0, &[], &[], None));
        check_lost(
            "the pod's own seconds beat never",
            s60,
            Never,
            lost(T),
            steady,
            T + 60,
            want(1, &[], &["c1"], None),
        );
        check_lost("a Ready node", s60, five, NodeCondition::Ready, steady, T + 999, want(0, &[], &[], None));

        // Replaced already: the replacement r1 runs on a; nothing more, no timer.
        let replaced: &[P] = &[
            ("a1", "a", Running, true, false),
            ("b1", "b", Running, true, false),
            ("c1", "c", Unknown, true, true),
            ("r1", "a", Running, true, false),
        ];
        check_lost("lost and replaced: left alone", s60, five, lost(T), replaced, T + 999, want(0, &[], &[], None));
        // The node is back, its pod still Unknown until its first report:
        // exactly one goes, the returning node's.
        check_lost(
            "the node back: its pod stops",
            s60,
            five,
            NodeCondition::Ready,
            replaced,
            T + 999,
            want(0, &["c1"], &[], None),
        );
        let reported: &[P] = &[
            ("a1", "a", Running, true, false),
            ("b1", "b", Running, true, false),
            ("c1", "c", Running, true, true),
            ("r1", "a", Running, true, false),
        ];
        check_lost(
            "back and reported Running: still its pod",
            s60,
            five,
            NodeCondition::Ready,
            reported,
            T + 999,
            want(0, &["c1"], &[], None),
        );
        let unplaced: &[P] = &[
            ("a1", "a", Running, true, false),
            ("b1", "b", Running, true, false),
            ("c1", "c", Running, true, true),
            ("r1", "a", Pending, false, false),
        ];
        check_lost(
            "the replacement not ready: it stops instead",
            s60,
            five,
            NodeCondition::Ready,
            unplaced,
            T + 999,
            want(0, &["r1"], &[], None),
        );

        // A flapping node. Back, then silent again at T + 500 before the
        // duplicate went: the marked pod is counted (its replacement exists),
        // so one of the two still goes, and no second replacement is made.
        check_lost(
            "flap after the replacement",
            s60,
            five,
            lost(T + 500),
            replaced,
            T + 501,
            want(0, &["c1"], &[], Some(T + 560)),
        );
        // A pod that outlived its return (its replacement was the one
        // stopped), silent again: timed again, and replaced again, with no
        // second mark.
        let outlived: &[P] =
            &[("a1", "a", Running, true, false), ("b1", "b", Running, true, false), ("c1", "c", Unknown, true, true)];
        check_lost(
            "outlived its return, silent again",
            s60,
            five,
            lost(T + 500),
            outlived,
            T + 501,
            want(0, &[], &[], Some(T + 560)),
        );
        check_lost(
            "outlived its return, lost again",
            s60,
            five,
            lost(T + 500),
            outlived,
            T + 560,
            want(1, &[], &[], None),
        );
        // Back before its time, then silent again: the timer starts over.
        check_lost("flap before the timer", s60, five, lost(T + 40), steady, T + 60, want(0, &[], &[], Some(T + 100)));
    }
}
