//! Deployments in the store: a create that repeats or changes the stored
//! one (`pinion apply` again), the changes of `scale`, `rollout undo` and
//! `rollout restart` (each bumps `metadata.generation`, as every change of
//! the spec does), a delete that takes the Deployment's pods with it, and the
//! controller's plan carried out in one write (`carry_out`). The plan itself
//! is `specs::rollout::reconcile`'s; nothing here decides what a rollout does.

use specs::deployment::{Deployment, DEPLOYMENT_LABEL};
use specs::node_lost::REPLACED_ANNOTATION;
use specs::Pod;

use super::authorize::{authorize, Access, Request};
use super::{now_rfc3339, pods, ClusterError};
use crate::store::Txn;
use crate::tls::Identity;

/// What a create did.
#[derive(Debug)]
pub struct Applied {
    /// 201 when new; 200 when it repeated or changed the stored one.
    pub new: bool,
    pub deployment: Deployment,
}

/// Stores a new Deployment (generation 1), or changes the stored one of
/// that name and owner: its spec, labels and annotations are the given
/// ones, its generation one more when the spec differs, its status kept.
/// A name held by another's Deployment is a conflict.
pub fn apply(t: &mut Txn<'_>, given: &Deployment, uid: &str) -> Result<Applied, ClusterError> {
    let name = given.metadata.name.clone();
    if let Some(mut existing) = t.get::<Deployment>(&name)? {
        if existing.metadata.owner != given.metadata.owner {
            return Err(ClusterError::Conflict(format!(
                "the deployment name {name:?} is taken by another's deployment: pick another name"
            )));
        }
        let same = existing.spec == given.spec
            && existing.metadata.labels == given.metadata.labels
            && existing.metadata.annotations == given.metadata.annotations;
        if same {
            return Ok(Applied { new: false, deployment: existing });
        }
        if existing.spec != given.spec {
            bump(&mut existing);
        }
        existing.spec = given.spec.clone();
        existing.metadata.labels = given.metadata.labels.clone();
        existing.metadata.annotations = given.metadata.annotations.clone();
        t.put(&mut existing)?;
        return Ok(Applied { new: false, deployment: existing });
    }
    let mut d = given.clone();
    d.metadata.uid = Some(uid.to_string());
    d.metadata.creation_timestamp = Some(now_rfc3339());
    d.metadata.generation = Some(1);
    d.status = None;
    t.put(&mut d)?;
    Ok(Applied { new: true, deployment: d })
}

fn bump(d: &mut Deployment) {
    d.metadata.generation = Some(d.metadata.generation.unwrap_or(0) + 1);
}

/// A change `id` asks of a stored Deployment.
#[derive(Debug, Clone)]
pub enum Change {
    Scale(u32),
    /// Back to this revision, or the one before the current.
    Undo(Option<u64>),
    /// A new revision of the same template; the time in words.
    Restart(String),
}

/// Changes the Deployment `id` may change; returns it as stored after.
pub fn change(t: &mut Txn<'_>, id: &Identity, name: &str, what: &Change) -> Result<Deployment, ClusterError> {
    let mut d = owned(t, id, name, Access::Write)?;
    let before = d.spec.clone();
    match what {
        Change::Scale(n) => {
            if *n > specs::limits::MAX_REPLICAS {
                return Err(ClusterError::Invalid(vec![specs::validate::FieldError {
                    field: "replicas".into(),
                    message: format!("must be at most {}, got {n}", specs::limits::MAX_REPLICAS),
                }]));
            }
            d.spec.replicas = *n;
        }
        Change::Undo(to) => {
            d.spec.template = specs::deployment::undo(&d, *to).map_err(|e| ClusterError::Conflict(e.to_string()))?;
        }
        Change::Restart(at) => d.spec.template = specs::deployment::restart(&d.spec.template, at),
    }
    if d.spec != before {
        bump(&mut d);
        t.put(&mut d)?;
    }
    Ok(d)
}

/// The stored Deployment, when `id` may act on it as `access` says (a
/// user's own; another's is not found).
pub fn owned(t: &Txn<'_>, id: &Identity, name: &str, access: Access) -> Result<Deployment, ClusterError> {
    let d = t.get::<Deployment>(name)?.ok_or_else(|| ClusterError::not_found("Deployment", name))?;
    let owner = d.metadata.owner.as_deref();
    authorize(id, Request::Owned { kind: "Deployment", name, owner, access })?;
    Ok(d)
}

/// Whether the pod is one of the Deployment's: labelled with it and of its owner.
pub fn is_pod_of(pod: &Pod, d: &Deployment) -> bool {
    pod.metadata.labels.get(DEPLOYMENT_LABEL) == Some(&d.metadata.name) && pod.metadata.owner == d.metadata.owner
}

/// Removes the Deployment `id` may delete and those of `pods` that are its
/// pods (the caller lists them; one made meanwhile is the controller's to
/// remove, as a pod of a Deployment that is gone). Returns the Deployment
/// and the pods removed.
pub fn delete_for(
    t: &mut Txn<'_>,
    id: &Identity,
    name: &str,
    pods: &[String],
) -> Result<(Deployment, Vec<Pod>), ClusterError> {
    let d = owned(t, id, name, Access::Write)?;
    t.delete::<Deployment>(name)?;
    let removed = delete_pods(t, &d, pods)?;
    Ok((d, removed))
}

fn delete_pods(t: &mut Txn<'_>, d: &Deployment, names: &[String]) -> Result<Vec<Pod>, ClusterError> {
    pods::delete_owned_by(t, names, |p| is_pod_of(p, d))
}

/// What the controller decided for one Deployment, from the Deployment at
/// `resource_version`: carried out only if it is still that version.
#[derive(Debug, Clone)]
pub struct Decided {
    pub name: String,
    pub resource_version: Option<u64>,
    /// Pods to create, named and labelled (`DeploymentPlan::new_pods`),
    /// each with a new uid.
    pub create: Vec<(Pod, String)>,
    pub delete: Vec<String>,
    /// Pods whose node has been NotReady past their time: marked
    /// `node_lost::REPLACED_ANNOTATION` (value `replaced_at`), so that when
    /// their node returns they are known as the duplicate.
    pub mark_replaced: Vec<String>,
    /// Unix seconds of the decision.
    pub replaced_at: u64,
    pub status: specs::deployment::DeploymentStatus,
}

/// What a carried-out plan did to pods.
#[derive(Debug, Default)]
pub struct Carried {
    /// False: the Deployment changed after the decision; nothing was done.
    pub current: bool,
    pub created: Vec<Pod>,
    pub deleted: Vec<Pod>,
}

/// Carries a decision out in one write: the pods created as any pod is
/// (`pods::create`: Pending, for the scheduler), the pods deleted as a
/// person's delete does, the pods replaced after their node was lost marked
/// (with an event), the status written when it changed.
pub fn carry_out(t: &mut Txn<'_>, decided: &Decided) -> Result<Carried, ClusterError> {
    let Some(mut d) = t.get::<Deployment>(&decided.name)? else { return Ok(Carried::default()) };
    if d.metadata.resource_version != decided.resource_version {
        return Ok(Carried::default());
    }
    let mut out = Carried { current: true, ..Default::default() };
    for name in &decided.mark_replaced {
        let Some(mut pod) = t.get::<Pod>(name)? else { continue };
        if !is_pod_of(&pod, &d) || pod.metadata.annotations.contains_key(REPLACED_ANNOTATION) {
            continue;
        }
        pod.metadata.annotations.insert(REPLACED_ANNOTATION.into(), decided.replaced_at.to_string());
        t.put(&mut pod)?;
        let node = pod.spec.node_name.as_deref().unwrap_or("?");
        let message = format!("node {node} NotReady past nodeLostReplaceAfterSeconds: replaced elsewhere");
        t.add_event(super::event("Pod", name, "Warning", "ReplacedAfterNodeLost", message))?;
    }
    for (pod, uid) in &decided.create {
        let created = pods::create(t, pod, uid, None)?;
        if created.new {
            out.created.push(created.pod);
        }
    }
    out.deleted = delete_pods(t, &d, &decided.delete)?;
    if d.status.as_ref() != Some(&decided.status) {
        d.status = Some(decided.status.clone());
        t.put(&mut d)?;
    }
    Ok(out)
}

/// The pods of a Deployment that is gone (`name`, labelled with it and
/// owned by `owner`): removed, as its delete would have.
pub fn delete_orphans(
    t: &mut Txn<'_>,
    name: &str,
    pods: &[(String, Option<String>)],
) -> Result<Vec<Pod>, ClusterError> {
    if t.get::<Deployment>(name)?.is_some() {
        return Ok(Vec::new());
    }
    pods::delete_left_by(t, DEPLOYMENT_LABEL, name, pods)
}
