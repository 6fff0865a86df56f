//! DaemonSets in the store: a create that repeats or changes the stored one
//! (`pinion apply` again; `metadata.generation` one more per change of the
//! spec), the changes of `rollout undo` and `rollout restart` (the
//! Deployment's, `deployments::Change`), a delete that takes the DaemonSet's pods with it, and the
//! controller's plan carried out in one write (`carry_out`). The plan itself
//! is `specs::daemonset::reconcile`'s; nothing here decides which node runs
//! a pod.

use specs::api::PodPlan;
use specs::daemonset::{DaemonSet, DaemonSetStatus, DAEMONSET_LABEL};
use specs::{Pod, PodPhase};

use super::authorize::{authorize, Access, Request};
use super::deployments::Change;
use super::{event, now_rfc3339, pods, ClusterError};
use crate::scheduler::Binding;
use crate::store::Txn;
use crate::tls::Identity;

/// What a create did.
#[derive(Debug)]
pub struct Applied {
    /// 201 when new; 200 when it repeated or changed the stored one.
    pub new: bool,
    pub daemonset: DaemonSet,
}

/// Stores a new DaemonSet (generation 1), or changes the stored one of that
/// name and owner: its spec, labels and annotations are the given ones, its
/// generation one more when the spec differs, its status kept. A name held by
/// another's DaemonSet is a conflict.
pub fn apply(t: &mut Txn<'_>, given: &DaemonSet, uid: &str) -> Result<Applied, ClusterError> {
    let name = given.metadata.name.clone();
    if let Some(mut existing) = t.get::<DaemonSet>(&name)? {
        if existing.metadata.owner != given.metadata.owner {
            return Err(ClusterError::Conflict(format!(
                "the daemonset name {name:?} is taken by another's daemonset: pick another name"
            )));
        }
        let same = existing.spec == given.spec
            && existing.metadata.labels == given.metadata.labels
            && existing.metadata.annotations == given.metadata.annotations;
        if same {
            return Ok(Applied { new: false, daemonset: existing });
        }
        if existing.spec != given.spec {
            existing.metadata.generation = Some(existing.metadata.generation.unwrap_or(0) + 1);
        }
        existing.spec = given.spec.clone();
        existing.metadata.labels = given.metadata.labels.clone();
        existing.metadata.annotations = given.metadata.annotations.clone();
        t.put(&mut existing)?;
        return Ok(Applied { new: false, daemonset: existing });
    }
    let mut d = given.clone();
    d.metadata.uid = Some(uid.to_string());
    d.metadata.creation_timestamp = Some(now_rfc3339());
    d.metadata.generation = Some(1);
    d.status = None;
    t.put(&mut d)?;
    Ok(Applied { new: true, daemonset: d })
}

/// Changes the DaemonSet `id` may change (`rollout undo` or `restart`: a new
/// template, which the controller records as a new revision and rolls out
/// under the update strategy); returns it as stored after. A DaemonSet has
/// no replicas: a scale is refused.
pub fn change(t: &mut Txn<'_>, id: &Identity, name: &str, what: &Change) -> Result<DaemonSet, ClusterError> {
    let mut d = owned(t, id, name, Access::Write)?;
    let before = d.spec.clone();
    match what {
        Change::Scale(_) => {
            return Err(ClusterError::Invalid(vec![specs::validate::FieldError {
                field: "replicas".into(),
                message: "a daemonset runs one pod per matching node: it has no replicas to scale".into(),
            }]))
        }
        Change::Undo(to) => {
            d.spec.template = specs::daemonset::undo(&d, *to).map_err(|e| ClusterError::Conflict(e.to_string()))?;
        }
        Change::Restart(at) => d.spec.template = specs::deployment::restart(&d.spec.template, at),
    }
    if d.spec != before {
        d.metadata.generation = Some(d.metadata.generation.unwrap_or(0) + 1);
        t.put(&mut d)?;
    }
    Ok(d)
}

/// The stored DaemonSet, when `id` may act on it as `access` says (a user's
/// own; another's is not found).
pub fn owned(t: &Txn<'_>, id: &Identity, name: &str, access: Access) -> Result<DaemonSet, ClusterError> {
    let d = t.get::<DaemonSet>(name)?.ok_or_else(|| ClusterError::not_found("DaemonSet", name))?;
    let owner = d.metadata.owner.as_deref();
    authorize(id, Request::Owned { kind: "DaemonSet", name, owner, access })?;
    Ok(d)
}

/// Whether the pod is one of the DaemonSet's: labelled with it and of its owner.
pub fn is_pod_of(pod: &Pod, d: &DaemonSet) -> bool {
    pod.metadata.labels.get(DAEMONSET_LABEL) == Some(&d.metadata.name) && pod.metadata.owner == d.metadata.owner
}

/// Whether the pod is a DaemonSet's: its node was chosen by name, so it is
/// never sent back to the queue (`pods::reject`, `pods::expire_binding`).
pub fn is_daemon_pod(pod: &Pod) -> bool {
    pod.metadata.labels.contains_key(DAEMONSET_LABEL)
}

/// Removes the DaemonSet `id` may delete and those of `pods` that are its
/// pods (the caller lists them; one made meanwhile is the controller's to
/// remove, as a pod of a DaemonSet that is gone). Returns the DaemonSet and
/// the pods removed.
pub fn delete_for(
    t: &mut Txn<'_>,
    id: &Identity,
    name: &str,
    pods: &[String],
) -> Result<(DaemonSet, Vec<Pod>), ClusterError> {
    let d = owned(t, id, name, Access::Write)?;
    t.delete::<DaemonSet>(name)?;
    let removed = delete_pods(t, &d, pods)?;
    Ok((d, removed))
}

fn delete_pods(t: &mut Txn<'_>, d: &DaemonSet, names: &[String]) -> Result<Vec<Pod>, ClusterError> {
    pods::delete_owned_by(t, names, |p| is_pod_of(p, d))
}

/// What the controller decided for one DaemonSet, from the DaemonSet at
/// `resource_version`: carried out only if it is still that version.
#[derive(Debug, Clone)]
pub struct Decided {
    pub name: String,
    pub resource_version: Option<u64>,
    /// Pods to create (`specs::daemonset::new_pod`, bound to their node by
    /// name), each with a new uid and the scheduler's binding on that node.
    pub create: Vec<(Pod, String, Binding)>,
    pub delete: Vec<String>,
    pub status: DaemonSetStatus,
}

/// What a carried-out plan did to pods.
#[derive(Debug, Default)]
pub struct Carried {
    /// False: the DaemonSet changed after the decision; nothing was done.
    pub current: bool,
    pub created: Vec<Pod>,
    pub deleted: Vec<Pod>,
}

/// Carries a decision out in one write: each pod created as any pod is
/// (`pods::create`: Scheduled on the node it names) and given the plan the
/// scheduler made on that node, as a binding is (the node adopts it, or runs
/// the same engine on its truth); the pods deleted as a person's delete
/// does; the status written when it changed.
pub fn carry_out(t: &mut Txn<'_>, decided: &Decided) -> Result<Carried, ClusterError> {
    let Some(mut d) = t.get::<DaemonSet>(&decided.name)? else { return Ok(Carried::default()) };
    if d.metadata.resource_version != decided.resource_version {
        return Ok(Carried::default());
    }
    let mut out = Carried { current: true, ..Default::default() };
    for (pod, uid, binding) in &decided.create {
        let created = pods::create(t, pod, uid, None)?;
        if created.new {
            let mut p = created.pod;
            let cpus: Vec<String> =
                binding.placement.containers.iter().map(|c| format!("{}={}", c.name, c.cpus)).collect();
            let message = format!(
                "bound to {} by the daemonset {} (NUMA {}; cpus {})",
                binding.node,
                d.metadata.name,
                binding.placement.numa_affinity,
                cpus.join(" ")
            );
            let s = p.status.get_or_insert_with(Default::default);
            s.phase = PodPhase::Scheduled;
            s.message = Some(message.clone());
            s.placement = Some(binding.placement.summary());
            s.plan = Some(PodPlan { epoch: binding.epoch, placement: binding.placement.clone() });
            t.put(&mut p)?;
            let name = p.metadata.name.clone();
            t.add_event(event("Pod", &name, "Normal", "Scheduled", message))?;
            out.created.push(p);
        }
    }
    out.deleted = delete_pods(t, &d, &decided.delete)?;
    if d.status.as_ref() != Some(&decided.status) {
        d.status = Some(decided.status.clone());
        t.put(&mut d)?;
    }
    Ok(out)
}

/// The pods of a DaemonSet that is gone (`name`, labelled with it and owned
/// by `owner`): removed, as its delete would have.
pub fn delete_orphans(
    t: &mut Txn<'_>,
    name: &str,
    pods: &[(String, Option<String>)],
) -> Result<Vec<Pod>, ClusterError> {
    if t.get::<DaemonSet>(name)?.is_some() {
        return Ok(Vec::new());
    }
    pods::delete_left_by(t, DAEMONSET_LABEL, name, pods)
}
