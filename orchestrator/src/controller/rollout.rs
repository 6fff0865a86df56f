//! The Deployments' decider: a Deployment and its pods as stored, the time
//! and drawn suffixes in, the pods to create and delete, the status and when
//! to look again out (`specs::rollout::reconcile` makes every choice; this
//! module only says what the store's pods mean to it). No I/O, no clock.

use specs::deployment::{Deployment, DeploymentStatus};
use specs::rollout::ObservedPod;
use specs::{Pod, PodPhase};

use crate::cluster::deployments::is_pod_of;

/// What to do for one Deployment now.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Decision {
    pub(super) create: Vec<Pod>,
    pub(super) delete: Vec<String>,
    pub(super) status: DeploymentStatus,
    /// Unix seconds: look again then even if nothing changes.
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
/// out), at `now`, naming new pods by `suffixes`.
pub(super) fn decide(d: &Deployment, pods: &[Pod], now: u64, suffixes: impl IntoIterator<Item = u64>) -> Decision {
    let mine: Vec<ObservedPod> = pods.iter().filter(|p| is_pod_of(p, d)).map(observed).collect();
    let plan = specs::rollout::reconcile(d, &mine, now);
    Decision {
        create: plan.new_pods(d, suffixes),
        delete: plan.delete.clone(),
        status: plan.status,
        requeue_at: plan.requeue_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::deployment::{DEPLOYMENT_LABEL, TEMPLATE_HASH_LABEL};

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
        let got = decide(&d, &pods, 1_800_000_000, 100..);
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
}
