//! The Deployment's reconcile: from the Deployment and its pods as observed,
//! the pods to create and delete and the new status. Pure: no clock (`now`
//! and every time here are unix seconds the caller passes: they are kept in
//! the status, so every server must read them alike), no names drawn (the
//! caller names the pods it creates with `deployment::new_pod`).
//!
//! The rules, Kubernetes' own applied to pods rather than ReplicaSets:
//! - A pod counts toward `replicas + maxSurge` from its creation until it is
//!   gone, being deleted included: a pod that is stopping still holds its
//!   exclusive CPUs and NUMA memory, so a new one may not fit beside it.
//!   A pod on a node lost past its time (`NodeStanding::Lost`) and an ended
//!   pod count for nothing.
//! - A pod is available once ready for `minReadySeconds`; a rolling update
//!   deletes an available old pod only while at least
//!   `replicas - maxUnavailable` stay available, and old pods that are not
//!   available at any time (they serve nothing).
//! - Recreate deletes every old pod and creates the first new one only when
//!   the last old one is gone.
//! - A rollout that has made no progress for `progressDeadlineSeconds` stops
//!   (`Progressing=False`, `ProgressDeadlineExceeded`): it holds, replacing
//!   only pods that vanished, until its template changes (`undo`,
//!   `restart`, a new template) or its pods complete it by themselves. A
//!   paused Deployment holds the same way.
//! - Which pods go first: see `deletion_order`.

use std::cmp::Reverse;

use crate::deployment::{
    next_history, reason, Condition, ConditionStatus, ConditionType, Deployment, DeploymentStatus, Revision,
    StrategyType, DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE,
};
use crate::node_lost::NodeStanding;
use crate::pod::Pod;
use crate::status::PodPhase;

/// One of the Deployment's pods as the controller sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedPod {
    pub name: String,
    /// Its `pinion.io/template-hash` label: which revision it runs.
    pub template_hash: String,
    pub phase: PodPhase,
    /// When it was created, unix seconds (newer ones go first).
    pub created: u64,
    /// Since when it has been Ready (its readiness probe passing, or running
    /// when it has none); `None` while not ready.
    pub ready_since: Option<u64>,
    pub node: Option<String>,
    /// Deleted, and not gone yet.
    pub deleting: bool,
    /// What its node's state means (`node_lost::standing`).
    pub standing: NodeStanding,
}

impl ObservedPod {
    /// What the pod says of itself; the caller adds what the store and the
    /// node say (`created`, `ready_since`, `deleting`, `standing`).
    pub fn of(pod: &Pod) -> ObservedPod {
        ObservedPod {
            name: pod.metadata.name.clone(),
            template_hash: crate::deployment::pod_template_hash(pod).unwrap_or_default().to_string(),
            phase: pod.status.as_ref().map(|s| s.phase).unwrap_or_default(),
            node: pod.spec.node_name.clone(),
            ..Default::default()
        }
    }

    fn available(&self, now: u64, min_ready: u64) -> bool {
        !self.deleting && self.ready_since.is_some_and(|t| now >= t.saturating_add(min_ready))
    }
}

/// What to do for a Deployment now.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentPlan {
    /// Create this many pods of the current revision (`status.revision`,
    /// its template in `status.history`; see `new_pods`).
    pub create: u32,
    /// Delete these pods, in this order.
    pub delete: Vec<String>,
    /// The status to write (with the history: a new revision is recorded here).
    pub status: DeploymentStatus,
    /// Reconcile again at this time even if nothing changes: a pod becomes
    /// available, or the progress deadline falls.
    pub requeue_at: Option<u64>,
}

impl DeploymentPlan {
    /// The revision new pods are made of.
    pub fn revision(&self) -> Option<&Revision> {
        self.status.history.iter().find(|r| r.number == self.status.revision)
    }

    /// The pods to create, one per number `suffixes` gives (a random number
    /// or a counter each; see `deployment::pod_suffix`).
    pub fn new_pods(&self, d: &Deployment, suffixes: impl IntoIterator<Item = u64>) -> Vec<Pod> {
        let Some(rev) = self.revision() else { return Vec::new() };
        suffixes.into_iter().take(self.create as usize).map(|s| crate::deployment::new_pod(d, rev, s)).collect()
    }
}

/// `maxSurge` and `maxUnavailable` as counts for `replicas` (Recreate: no
/// surge, nothing unavailable by choice). Never both 0 (validation refuses
/// it; a stored object from before is given one unavailable so it moves).
pub fn budget(d: &Deployment) -> (u32, u32) {
    let r = d.spec.replicas.min(crate::limits::MAX_REPLICAS);
    if d.spec.strategy.kind == StrategyType::Recreate {
        return (0, 0);
    }
    let ru = d.spec.strategy.rolling_update.clone().unwrap_or_default();
    let surge = ru.max_surge.unwrap_or(DEFAULT_MAX_SURGE).resolve(r, true);
    let unavailable = ru.max_unavailable.unwrap_or(DEFAULT_MAX_UNAVAILABLE).resolve(r, false);
    match (surge, unavailable) {
        (0, 0) => (0, 1),
        pair => pair,
    }
}

/// The order in which pods go when some must (Kubernetes' `ActivePods`):
/// not yet placed before placed; Pending before Unknown before Running; not
/// ready before ready; then a pod back from a lost node before the others
/// (its replacement took over: it is the duplicate); then ready for less
/// time before ready for longer; then newer before older; then by name, so
/// the order is total.
///
/// On a lost node's return this means: when its pod and the replacement are
/// both ready, the pod on the returning node stops (the replacement serves
/// already, and is placed by the current view of the cluster); when only one
/// of the two is ready, the other stops. One of them always stays: the
/// reconcile deletes only what exceeds `replicas`.
pub fn deletion_order(pods: &mut [&ObservedPod]) {
    fn phase_rank(p: PodPhase) -> u8 {
        match p {
            PodPhase::Pending | PodPhase::Scheduled => 0,
            PodPhase::Unknown => 1,
            _ => 2,
        }
    }
    pods.sort_by_key(|p| {
        (
            p.node.is_some(),
            phase_rank(p.phase),
            p.ready_since.is_some(),
            p.standing != NodeStanding::Returned,
            Reverse(p.ready_since),
            Reverse(p.created),
            p.name.clone(),
        )
    });
}

fn names(pods: Vec<&ObservedPod>) -> Vec<String> {
    pods.into_iter().map(|p| p.name.clone()).collect()
}

fn ordered(mut pods: Vec<&ObservedPod>) -> Vec<&ObservedPod> {
    deletion_order(&mut pods);
    pods
}

/// The reconcile: see the module's rules.
pub fn reconcile(d: &Deployment, pods: &[ObservedPod], now: u64) -> DeploymentPlan {
    let (history, cur) = next_history(d);
    let rev = &history[cur];
    let prev = d.status.clone().unwrap_or_default();
    let new_revision = prev.template_hash != rev.template_hash || prev.revision != rev.number;
    // An object stored before a bound changed is held to it here too.
    let r = d.spec.replicas.min(crate::limits::MAX_REPLICAS);
    let min_ready = u64::from(d.spec.min_ready_seconds);
    let (surge, unavailable) = budget(d);

    let mut delete: Vec<String> = Vec::new();
    let mut ended: Vec<&ObservedPod> = pods.iter().filter(|p| p.phase.is_terminal() && !p.deleting).collect();
    ended.sort_by(|a, b| a.name.cmp(&b.name));
    delete.extend(ended.iter().map(|p| p.name.clone()));

    let counted: Vec<&ObservedPod> =
        pods.iter().filter(|p| !p.phase.is_terminal() && p.standing != NodeStanding::Lost).collect();
    let total = counted.len() as u32;
    let is_new = |p: &&ObservedPod| p.template_hash == rev.template_hash;
    let up: Vec<&ObservedPod> = counted.iter().copied().filter(|p| !p.deleting).collect();
    let new_up: Vec<&ObservedPod> = up.iter().copied().filter(is_new).collect();
    let old_up: Vec<&ObservedPod> = up.iter().copied().filter(|p| !is_new(p)).collect();
    let old_all = counted.iter().filter(|p| !is_new(p)).count() as u32;
    let available = up.iter().filter(|p| p.available(now, min_ready)).count() as u32;
    let new_available = new_up.iter().filter(|p| p.available(now, min_ready)).count() as u32;

    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation.unwrap_or(0),
        replicas: up.len() as u32,
        ready_replicas: up.iter().filter(|p| p.ready_since.is_some()).count() as u32,
        updated_replicas: new_up.len() as u32,
        available_replicas: available,
        unavailable_replicas: r.saturating_sub(available),
        revision: rev.number,
        template_hash: rev.template_hash.clone(),
        conditions: prev.conditions.clone(),
        history: history.clone(),
    };
    let complete = new_up.len() as u32 == r && total == r && old_all == 0 && new_available == r;
    let min_available = r.saturating_sub(unavailable);
    let (ok, why) = if available >= min_available {
        (ConditionStatus::True, reason::MINIMUM_REPLICAS_AVAILABLE)
    } else {
        (ConditionStatus::False, reason::MINIMUM_REPLICAS_UNAVAILABLE)
    };
    set_condition(
        &mut status.conditions,
        ConditionType::Available,
        ok,
        why,
        format!("{available} of {r} available, at least {min_available} wanted"),
        now,
    );
    let deadline_at = progress(d, &prev, &mut status, new_revision, complete, now);
    let progressing = status.condition(ConditionType::Progressing);
    let stalled = progressing.is_some_and(|c| c.reason == reason::PROGRESS_DEADLINE_EXCEEDED);
    let hold = stalled || d.spec.paused;

    let room = r.saturating_add(surge).saturating_sub(total);
    let (n_up, n_new) = (up.len() as u32, new_up.len() as u32);
    let mut create = 0;
    if hold {
        // Keep the count, move nothing: replace only pods that vanished.
        create = r.saturating_sub(n_up).min(room);
    } else {
        match d.spec.strategy.kind {
            StrategyType::Recreate if old_all > 0 => delete.extend(names(ordered(old_up.clone()))),
            StrategyType::Recreate => create = r.saturating_sub(n_new).min(room),
            StrategyType::RollingUpdate => {
                let (old_ok, old_bad): (Vec<_>, Vec<_>) =
                    old_up.iter().copied().partition(|p| p.available(now, min_ready));
                delete.extend(names(ordered(old_bad)));
                let may_go = available.saturating_sub(min_available) as usize;
                delete.extend(names(ordered(old_ok).into_iter().take(may_go).collect()));
                create = r.saturating_sub(n_new).min(room);
            }
        }
    }
    if n_new > r {
        // More of the current revision than wanted: a scale-down, or a lost
        // node's pod back beside its replacement.
        delete.extend(names(ordered(new_up).into_iter().take((n_new - r) as usize).collect()));
        create = 0;
    } else if hold && n_up > r {
        // A scale-down while holding: the extra go, old or new.
        let left: Vec<&ObservedPod> = up.iter().copied().filter(|p| !delete.contains(&p.name)).collect();
        delete.extend(names(ordered(left).into_iter().take((n_up - r) as usize).collect()));
    }

    let becomes_available =
        counted.iter().filter_map(|p| p.ready_since.map(|t| t.saturating_add(min_ready))).filter(|t| *t > now).min();
    let requeue_at = [becomes_available, deadline_at].into_iter().flatten().min();
    DeploymentPlan { create, delete, status, requeue_at }
}

/// Sets the Progressing condition in `status` from the previous status and
/// returns when the deadline falls, if it still can. Progress is Kubernetes'
/// `DeploymentProgressing`: more updated, ready or available pods, or fewer
/// old ones, than the previous status said.
fn progress(
    d: &Deployment,
    prev: &DeploymentStatus,
    status: &mut DeploymentStatus,
    new_revision: bool,
    complete: bool,
    now: u64,
) -> Option<u64> {
    use ConditionStatus::*;
    let before = prev.condition(ConditionType::Progressing).cloned();
    let deadline = u64::from(d.spec.progress_deadline_seconds());
    let revision = status.revision;
    let set = |st: &mut DeploymentStatus, s: ConditionStatus, why: &str, message: String| {
        set_condition(&mut st.conditions, ConditionType::Progressing, s, why, message, now)
    };
    if d.spec.paused {
        set(status, Unknown, reason::PAUSED, "paused: template changes wait".into());
        return None;
    }
    let old_before = prev.replicas.saturating_sub(prev.updated_replicas);
    let old_now = status.replicas.saturating_sub(status.updated_replicas);
    let moved = status.updated_replicas > prev.updated_replicas
        || old_now < old_before
        || status.ready_replicas > prev.ready_replicas
        || status.available_replicas > prev.available_replicas;
    let was = before.as_ref().map(|c| c.reason.as_str());
    // Progress restarts the deadline's clock even when the words stay.
    let touch = |st: &mut DeploymentStatus| {
        if let Some(c) = st.conditions.iter_mut().find(|c| c.kind == ConditionType::Progressing) {
            c.last_update_time = now;
        }
    };
    if complete {
        if was != Some(reason::NEW_REVISION_AVAILABLE) || new_revision {
            set(status, True, reason::NEW_REVISION_AVAILABLE, format!("revision {revision} is available"));
        }
        return None;
    } else if new_revision {
        set(status, True, reason::NEW_REVISION_CREATED, format!("revision {revision} is rolling out"));
        touch(status);
    } else if was == Some(reason::PROGRESS_DEADLINE_EXCEEDED) {
        // Stopped stays stopped until the template changes: a pod made to
        // replace one that vanished must not restart a failed rollout.
        return None;
    } else if moved || before.is_none() {
        set(status, True, reason::REVISION_UPDATED, format!("revision {revision} is progressing"));
        touch(status);
    } else if was == Some(reason::NEW_REVISION_AVAILABLE) {
        // A finished rollout is not timed again: a pod that dies later is
        // replica upkeep (Kubernetes' rule).
        return None;
    } else if let Some(c) = &before {
        let at = c.last_update_time.saturating_add(deadline);
        if now >= at {
            set(
                status,
                False,
                reason::PROGRESS_DEADLINE_EXCEEDED,
                format!("revision {revision} made no progress for {deadline} s"),
            );
            return None;
        }
        return Some(at);
    }
    status.condition(ConditionType::Progressing).map(|c| c.last_update_time.saturating_add(deadline))
}

/// Sets a condition: `last_update_time` moves when it says something new,
/// `last_transition_time` when its status changes.
fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: ConditionType,
    status: ConditionStatus,
    why: &str,
    message: String,
    now: u64,
) {
    match conditions.iter_mut().find(|c| c.kind == kind) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            if c.status != status || c.reason != why || c.message != message {
                c.last_update_time = now;
            }
            c.status = status;
            c.reason = why.into();
            c.message = message;
        }
        None => conditions.push(Condition {
            kind,
            status,
            reason: why.into(),
            message,
            last_update_time: now,
            last_transition_time: now,
        }),
    }
}

#[cfg(test)]
mod tests;
