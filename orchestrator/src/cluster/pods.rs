//! The rules of pods: a create over a finished pod, a create that repeats the
//! stored one, a node's status merged into what the scheduler wrote, a
//! rejected binding sent back to the queue, the controller's bindings, the
//! reasons a pod waits, a finished pod removed after its time to live. Each
//! command runs inside one store write, so a pod is never half-changed.

use specs::api::{PodPlan, PodRejection};
use specs::engine::SETTINGS_MISFIT;
use specs::{Pod, PodPhase, PodStatus};

use super::authorize::{authorize, Access, Request};
use super::{event, now_rfc3339, ClusterError};
use crate::store::Txn;
use crate::tls::Identity;

/// What a create did.
#[derive(Debug)]
pub struct Created {
    /// False: the same pod was stored already, and is answered again.
    pub new: bool,
    pub pod: Pod,
}

/// Stores a new pod, Pending (or Scheduled when it names its node). A finished
/// pod's name is free again: it and its events go in this same write. A pod
/// not finished is answered again when the create repeats it, else refused.
/// `never`: why no node of the cluster could ever hold it, decided before the
/// write (the scheduler's lock is not taken inside the store's committer).
pub fn create(t: &mut Txn<'_>, given: &Pod, uid: &str, never: Option<&str>) -> Result<Created, ClusterError> {
    let mut pod = given.clone();
    let name = pod.metadata.name.clone();
    if let Some(existing) = t.get::<Pod>(&name)? {
        // Names are the cluster's, not a person's: a name held by another's
        // pod, finished or not, stays theirs (with its status and events).
        if existing.metadata.owner != pod.metadata.owner {
            return Err(ClusterError::Conflict(format!(
                "the pod name {name:?} is taken by another's pod: pick another name"
            )));
        }
        if is_finished(&existing) {
            t.delete::<Pod>(&name)?;
        } else if same_user_spec(&existing, &pod) {
            return Ok(Created { new: false, pod: existing });
        } else {
            return Err(ClusterError::Conflict(format!(
                "pod {name:?} already exists with a different spec (pods are immutable; delete it first)"
            )));
        }
    }
    if let Some(message) = never {
        return Err(ClusterError::Unschedulable(format!("{message} ({})", specs::pod::WAIT_FOR_NODES_HINT)));
    }
    pod.metadata.uid = Some(uid.to_string());
    pod.metadata.creation_timestamp = Some(now_rfc3339());
    let phase = if pod.spec.node_name.is_some() { PodPhase::Scheduled } else { PodPhase::Pending };
    pod.status = Some(PodStatus {
        phase,
        node_name: pod.spec.node_name.clone(),
        reason: pod.spec.node_name.as_ref().map(|_| "NodeNameSet".to_string()),
        ..PodStatus::default()
    });
    t.put(&mut pod)?;
    Ok(Created { new: true, pod })
}

/// What a delete removed.
#[derive(Debug)]
pub enum Deleted {
    Pod(Box<Pod>),
    /// A record no longer readable (lists skip it): only its name is known.
    Unreadable,
}

/// Deletes a pod `id` may delete (a user's own; an unreadable record, whose
/// owner nobody knows, an admin's only).
pub fn delete(t: &mut Txn<'_>, id: &Identity, name: &str) -> Result<Deleted, ClusterError> {
    let owner = match t.get::<Pod>(name) {
        Ok(Some(p)) => p.metadata.owner,
        Ok(None) => return Err(ClusterError::not_found("Pod", name)),
        Err(_) => None,
    };
    authorize(id, Request::Owned { kind: "Pod", name, owner: owner.as_deref(), access: Access::Write })?;
    if t.purge_unreadable::<Pod>(name)? {
        return Ok(Deleted::Unreadable);
    }
    let pod = t.delete::<Pod>(name)?.ok_or_else(|| ClusterError::not_found("Pod", name))?;
    if !is_finished(&pod) {
        super::acct::pod_ended(t, &pod, true)?;
    }
    Ok(Deleted::Pod(Box::new(pod)))
}

/// A node's report of one pod's status, merged into the stored pod. Returns
/// the pod and whether this report finished it.
pub fn report_status(
    t: &mut Txn<'_>,
    id: &Identity,
    name: &str,
    status: &PodStatus,
) -> Result<(Pod, bool), ClusterError> {
    let Some(mut pod) = t.get::<Pod>(name)? else { return Err(ClusterError::not_found("Pod", name)) };
    authorize(id, Request::ReportPod(&pod))?;
    if !reported_for(status, &pod) {
        return Err(ClusterError::Conflict(format!("the status is about an earlier pod {name:?}")));
    }
    let was_finished = is_finished(&pod);
    merge_status(&mut pod, status.clone())?;
    t.put(&mut pod)?;
    let finished = !was_finished && is_finished(&pod);
    if finished {
        super::acct::pod_ended(t, &pod, false)?;
    }
    Ok((pod, finished))
}

/// The node would not admit the pod: it goes back to Pending, unbound, with
/// the node's reason (a DaemonSet's pod Failed instead, on its node). Returns the pod and the node that rejected it.
pub fn reject(
    t: &mut Txn<'_>,
    id: &Identity,
    name: &str,
    rejection: &PodRejection,
) -> Result<(Pod, String), ClusterError> {
    let Some(mut pod) = t.get::<Pod>(name)? else { return Err(ClusterError::not_found("Pod", name)) };
    authorize(id, Request::ReportPod(&pod))?;
    let Some(node) = pod.spec.node_name.clone() else {
        return Err(ClusterError::Conflict(format!("pod {name:?} is not bound to a node")));
    };
    let message = format!("node {node} rejected the binding: {}: {}", rejection.reason, rejection.message);
    if super::daemonsets::is_daemon_pod(&pod) {
        // A DaemonSet's pod belongs to its node: it fails there, and its
        // DaemonSet makes the node another once this one is gone and the
        // scheduler finds that it fits.
        let s = pod.status.get_or_insert_with(PodStatus::default);
        s.phase = PodPhase::Failed;
        s.reason = Some("Rejected".into());
        s.message = Some(message.clone());
        t.put(&mut pod)?;
        t.add_event(event("Pod", name, "Warning", "Rejected", message))?;
        return Ok((pod, node));
    }
    unbind(t, &mut pod, "Rejected", message)?;
    Ok((pod, node))
}

/// A binding the node neither confirmed nor rejected within `timeout`: the
/// pod goes back to Pending, unless it moved on or the node reported it
/// meanwhile (`None` then).
pub fn expire_binding(
    t: &mut Txn<'_>,
    name: &str,
    node: &str,
    timeout: std::time::Duration,
) -> Result<Option<Pod>, ClusterError> {
    let Some(mut pod) = t.get::<Pod>(name)? else { return Ok(None) };
    let phase = pod.status.as_ref().map(|s| s.phase).unwrap_or_default();
    // A DaemonSet's pod stays on its node: the node admits it when it hears
    // (its capacity is back in the mirror meanwhile, as for any expiry).
    if pod.spec.node_name.as_deref() != Some(node)
        || phase != PodPhase::Scheduled
        || super::daemonsets::is_daemon_pod(&pod)
    {
        return Ok(None);
    }
    let message = format!(
        "node {node} neither confirmed nor rejected the binding within {}s; scheduling again",
        timeout.as_secs_f64()
    );
    unbind(t, &mut pod, "BindingExpired", message)?;
    Ok(Some(pod))
}

/// Sends a bound pod back to the queue: unbound, Pending, the scheduler's
/// plan gone, with one Warning event saying why.
fn unbind(t: &mut Txn<'_>, pod: &mut Pod, reason: &str, message: String) -> Result<(), ClusterError> {
    pod.spec.node_name = None;
    let s = pod.status.get_or_insert_with(PodStatus::default);
    s.phase = PodPhase::Pending;
    s.node_name = None;
    s.plan = None;
    s.placement = None;
    s.reason = Some(reason.into());
    s.message = Some(message.clone());
    t.put(pod)?;
    let name = pod.metadata.name.clone();
    t.add_event(event("Pod", &name, "Warning", reason, message))?;
    Ok(())
}

/// What a gang's member learns at its binding: `PINION_LOCAL_RANK` (its rank
/// among the members on its node) and `PINION_NODES` (every member's node
/// address, in rank order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangPlace {
    pub local_rank: u32,
    pub nodes: String,
}

/// Binds the stored pod `name` (this incarnation, `uid`) as the scheduler
/// decided: Scheduled, on its node, with the plan the node may adopt and one
/// Normal event. A pod gone, replaced or already bound is refused, so a
/// decision made on a stale view never lands.
pub fn bind(
    t: &mut Txn<'_>,
    name: &str,
    uid: &Option<String>,
    b: &crate::scheduler::Binding,
    gang: Option<&GangPlace>,
) -> Result<(), ClusterError> {
    let Some(mut pod) = t.get::<Pod>(name)? else {
        return Err(ClusterError::not_found("Pod", name));
    };
    if pod.metadata.uid != *uid {
        return Err(ClusterError::Conflict("replaced by a new pod of the same name".into()));
    }
    if pod.spec.node_name.is_some() {
        return Err(ClusterError::Conflict("already bound".into()));
    }
    let mut status = pod.status.take().unwrap_or_default();
    status.phase = PodPhase::Scheduled;
    status.node_name = Some(b.node.clone());
    status.reason = Some("Scheduled".into());
    let cpus: Vec<String> = b.placement.containers.iter().map(|c| format!("{}={}", c.name, c.cpus)).collect();
    let message = format!("bound to {} (NUMA {}; cpus {})", b.node, b.placement.numa_affinity, cpus.join(" "));
    status.message = Some(message.clone());
    status.placement = Some(b.placement.summary());
    status.plan = Some(PodPlan { epoch: b.epoch, placement: b.placement.clone() });
    status.attempts = status.attempts.saturating_add(1);
    pod.spec.node_name = Some(b.node.clone());
    if let Some(g) = gang {
        for c in &mut pod.spec.containers {
            specs::job::set_env(&mut c.env, "PINION_LOCAL_RANK", &g.local_rank.to_string());
            specs::job::set_env(&mut c.env, "PINION_NODES", &g.nodes);
        }
    }
    pod.status = Some(status);
    t.put(&mut pod)?;
    t.add_event(event("Pod", name, "Normal", "Scheduled", message))?;
    Ok(())
}

/// Why a queued pod waits, as its status and one event say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The status reason: `Unschedulable`, `ArrayThrottled`, `Queued`.
    pub reason: &'static str,
    pub event_type: &'static str,
    pub event_reason: &'static str,
    pub message: String,
}

/// Records why the unbound pod `name` waits. Nothing is written when the pod
/// is gone or bound meanwhile, or when its status already says this: a pod
/// that waits long gets one event per change of reason, not one per pass.
pub fn say_waiting(t: &mut Txn<'_>, name: &str, why: &Waiting) -> Result<bool, ClusterError> {
    let Some(mut pod) = t.get::<Pod>(name)? else { return Ok(false) };
    if pod.spec.node_name.is_some() {
        return Ok(false);
    }
    let status = pod.status.get_or_insert_with(PodStatus::default);
    if status.reason.as_deref() == Some(why.reason) && status.message.as_deref() == Some(why.message.as_str()) {
        return Ok(false);
    }
    status.phase = PodPhase::Pending;
    status.reason = Some(why.reason.into());
    status.message = Some(why.message.clone());
    t.put(&mut pod)?;
    t.add_event(event("Pod", name, why.event_type, why.event_reason, why.message.clone()))?;
    Ok(true)
}

/// A finished pod `id` asked to be deleted at its end (`run --rm`, through its
/// attach stream), if `id` may delete it; `None`, as `remove_finished`, when
/// the pod of that name is another incarnation or not finished.
pub fn delete_finished(t: &mut Txn<'_>, id: &Identity, name: &str, uid: &str) -> Result<Option<Pod>, ClusterError> {
    let Some(pod) = t.get::<Pod>(name)? else { return Ok(None) };
    authorize(id, Request::Owned { kind: "Pod", name, owner: pod.metadata.owner.as_deref(), access: Access::Write })?;
    remove_finished(t, name, uid)
}

/// A finished pod's time to live ran out: it goes, with its events. `None`
/// when the pod of that name is another incarnation (`uid`) or not finished.
pub fn remove_finished(t: &mut Txn<'_>, name: &str, uid: &str) -> Result<Option<Pod>, ClusterError> {
    let Some(pod) = t.get::<Pod>(name)? else { return Ok(None) };
    if pod.metadata.uid.as_deref().unwrap_or_default() != uid || !is_finished(&pod) {
        return Ok(None);
    }
    Ok(t.delete::<Pod>(name)?)
}

/// The container a log, attach or exec means: the one named, or the pod's only one.
pub fn pick_container(pod: &Pod, container: Option<String>) -> Result<String, ClusterError> {
    let name = &pod.metadata.name;
    let names: Vec<&str> = pod.spec.containers.iter().map(|c| c.name.as_str()).collect();
    match (container, names.as_slice()) {
        (Some(c), _) if names.contains(&c.as_str()) => Ok(c),
        (Some(c), _) => Err(ClusterError::BadField {
            field: "container",
            message: format!("pod {name:?} has no container {c:?} (it has: {})", names.join(", ")),
        }),
        (None, [only]) => Ok(only.to_string()),
        (None, _) => Err(ClusterError::BadField {
            field: "container",
            message: format!("pod {name:?} has {} containers: name one ({})", names.len(), names.join(", ")),
        }),
    }
}

pub fn is_finished(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.phase.is_terminal())
}

/// Whether a create repeats the stored pod: the same user-given spec, labels
/// and annotations, ignoring what the system sets (the scheduler's
/// `spec.nodeName` unless the caller named a node, the status, uid, versions).
fn same_user_spec(stored: &Pod, given: &Pod) -> bool {
    let mut spec = stored.spec.clone();
    if given.spec.node_name.is_none() {
        spec.node_name = None;
    }
    spec == given.spec
        && stored.metadata.labels == given.metadata.labels
        && stored.metadata.annotations == given.metadata.annotations
}

/// A reported status replaces the observed parts; the scheduler's parts (plan,
/// attempts, placement when not reported) stay. A terminal phase is final.
pub(super) fn merge_status(pod: &mut Pod, mut reported: PodStatus) -> Result<(), ClusterError> {
    let current = pod.status.clone().unwrap_or_default();
    if !current.phase.can_become(reported.phase) {
        return Err(ClusterError::Conflict(format!(
            "pod {:?} is {:?}; it cannot become {:?}",
            pod.metadata.name, current.phase, reported.phase
        )));
    }
    reported.plan = current.plan;
    reported.attempts = current.attempts;
    if reported.placement.is_none() {
        reported.placement = current.placement;
    }
    // A finished pod keeps the address it had, as in Kubernetes: its
    // network is gone by the time the node reports the end (a node from
    // before it kept the address says none).
    if reported.phase.is_terminal() && reported.pod_ip.is_none() && reported.pod_ips.is_empty() {
        reported.pod_ip = current.pod_ip;
        reported.pod_ips = current.pod_ips;
    }
    // When it first ran (or ended, for one too short to be seen running):
    // where its accounting record's Start and Elapsed count from.
    let ran = matches!(reported.phase, PodPhase::Running | PodPhase::Succeeded | PodPhase::Failed);
    reported.start_time = current.start_time.or_else(|| ran.then(super::now_rfc3339));
    reported.node_name = pod.spec.node_name.clone();
    // The node's tag, checked by the caller; not part of the stored status.
    reported.pod_uid = None;
    pod.status = Some(reported);
    Ok(())
}

/// The reasons of a node's report that become a pod's Warning events: its
/// placement no longer fits the node's settings (after the node restarted
/// with others); its tuning could not all be applied.
pub(super) const WARNING_REASONS: [&str; 2] = [SETTINGS_MISFIT, specs::status::TUNING_INCOMPLETE];

/// The message of a node's report with the warning `reason` (one of
/// `WARNING_REASONS`), when it did not say so before: one event per
/// finding, not one per report.
pub(super) fn new_warning(before: Option<&PodStatus>, now: Option<&PodStatus>, reason: &str) -> Option<String> {
    newly_said(before, now, |r| r == reason)
}

/// A failed image pull a report newly shows (`ErrImagePull`,
/// `ErrImageNeverPull`, or a new message for one): its message, the
/// registry's words, for a `Failed` event as kubectl shows one.
pub(super) fn new_pull_failure(before: Option<&PodStatus>, now: Option<&PodStatus>) -> Option<String> {
    newly_said(before, now, |r| r.starts_with("ErrImage"))
}

/// The message of a report whose reason `is` says, when the reason or the
/// message differ from the last report's.
fn newly_said(before: Option<&PodStatus>, now: Option<&PodStatus>, is: impl Fn(&str) -> bool) -> Option<String> {
    let now = now.filter(|s| s.reason.as_deref().is_some_and(&is))?;
    let said = |s: &PodStatus| (s.reason.clone(), s.message.clone());
    (before.map(said) != Some(said(now))).then(|| now.message.clone().unwrap_or_default())
}

/// The containers a report shows started since the last one (running now,
/// and not running before or restarted since), as kubectl's `Started`
/// events name them.
pub(super) fn newly_started(before: Option<&PodStatus>, now: Option<&PodStatus>) -> Vec<String> {
    let Some(now) = now else { return Vec::new() };
    let was = |name: &str| before.and_then(|b| b.container_statuses.iter().find(|c| c.name == name));
    now.container_statuses
        .iter()
        .filter(|c| c.state == specs::status::ContainerState::Running)
        .filter(|c| {
            was(&c.name)
                .is_none_or(|b| b.state != specs::status::ContainerState::Running || b.restart_count != c.restart_count)
        })
        .map(|c| c.name.clone())
        .collect()
}

/// Whether a node's status report is about this incarnation of the pod: a
/// report naming another uid (the pod was replaced under the same name) is
/// about a pod that is gone.
pub(super) fn reported_for(status: &PodStatus, pod: &Pod) -> bool {
    status.pod_uid.is_none() || status.pod_uid == pod.metadata.uid
}

/// Deletes those of `names` that are a workload's (`ours`), each by the
/// path a person's delete takes, as the cluster's admin; the pods removed.
pub fn delete_owned_by(
    t: &mut Txn<'_>,
    names: &[String],
    ours: impl Fn(&Pod) -> bool,
) -> Result<Vec<Pod>, ClusterError> {
    let mut out = Vec::new();
    for name in names {
        if t.get::<Pod>(name)?.is_some_and(|p| ours(&p)) {
            if let Deleted::Pod(p) = delete(t, &Identity::Admin, name)? {
                out.push(*p);
            }
        }
    }
    Ok(out)
}

/// The pods a deleted workload left: those of `pods` (name, owner as
/// listed) still labelled `label=name` and still that owner's.
pub fn delete_left_by(
    t: &mut Txn<'_>,
    label: &str,
    name: &str,
    pods: &[(String, Option<String>)],
) -> Result<Vec<Pod>, ClusterError> {
    let mut out = Vec::new();
    for (pod, owner) in pods {
        let left = t.get::<Pod>(pod)?.is_some_and(|p| {
            p.metadata.labels.get(label).map(String::as_str) == Some(name) && p.metadata.owner == *owner
        });
        if left {
            if let Deleted::Pod(p) = delete(t, &Identity::Admin, pod)? {
                out.push(*p);
            }
        }
    }
    Ok(out)
}
