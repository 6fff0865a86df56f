//! Jobs in the store: creating a job with its member pods in one write,
//! deleting them together, and carrying out what `specs::job::judge` decides
//! once a member ends. Each function runs inside one store write (`Txn`), so
//! a job and its members never disagree after a crash.

use specs::job::{self, Job, JobAction, JobPhase, JobStatus};
use specs::{Pod, PodPhase, PodStatus};

use super::{event, now_rfc3339, ClusterError};
use crate::store::Txn;

/// What a job write did to pods, for the controller's queue.
#[derive(Debug, Default)]
pub struct MemberChanges {
    pub created: Vec<Pod>,
    pub deleted: Vec<Pod>,
}

impl MemberChanges {
    fn merge(&mut self, other: MemberChanges) {
        self.created.extend(other.created);
        self.deleted.extend(other.deleted);
    }
}

/// What a job create did.
#[derive(Debug)]
pub struct Created {
    /// False: the same job was stored already, and is answered again.
    pub new: bool,
    pub job: Job,
}

/// Stores a new job and its members in one write. An ended job's name is free
/// again: it and its members go in this write. A job not ended is answered
/// again when the create repeats it, else refused. `never`: why no cluster
/// could ever hold the gang at once, decided before the write.
pub fn create(t: &mut Txn<'_>, given: &Job, uid: &str, never: Option<&str>) -> Result<Created, ClusterError> {
    let mut job = given.clone();
    let name = job.metadata.name.clone();
    if let Some(existing) = t.get::<Job>(&name)? {
        if existing.metadata.owner != job.metadata.owner {
            return Err(ClusterError::Conflict(format!(
                "the job name {name:?} is taken by another's job: pick another name"
            )));
        }
        let ended = existing.status.as_ref().is_some_and(|s| s.phase.is_terminal());
        if !ended && existing.spec == job.spec && existing.metadata.labels == job.metadata.labels {
            return Ok(Created { new: false, job: existing });
        }
        if !ended {
            return Err(ClusterError::Conflict(format!(
                "job {name:?} already exists with a different spec and has not ended (delete it first)"
            )));
        }
        delete(t, &name)?;
    }
    if let Some(message) = never {
        return Err(ClusterError::Unschedulable(message.to_string()));
    }
    job.metadata.uid = Some(uid.to_string());
    job.metadata.creation_timestamp = Some(now_rfc3339());
    job.status = Some(JobStatus::default());
    if job.spec.dependency.is_some() {
        // The members are made once the dependency is met (`reconcile`,
        // which the controller runs for every new job): until then the job
        // waits with Slurm's reason.
        job.status = Some(JobStatus {
            reason: Some(job::DEPENDENCY.into()),
            message: job.spec.dependency.as_ref().map(|d| format!("waiting for {d}")),
            ..Default::default()
        });
        t.put(&mut job)?;
        return Ok(Created { new: true, job });
    }
    t.put(&mut job)?;
    create_members(t, &job)?;
    Ok(Created { new: true, job })
}

/// Puts a new job in its partition (`specs::partition::place`, over the
/// partitions as this write sees them): the name, the default time and the
/// node selector it gets, or its refusal at the field over the limit.
/// `admin`: the submitter may use every partition.
pub fn place_in_partition(t: &Txn<'_>, job: &mut Job, admin: bool) -> Result<(), ClusterError> {
    let partitions = t.list::<specs::partition::Partition>()?;
    let who = specs::partition::Submitter { name: job.metadata.owner.as_deref(), admin };
    let mut placed = job.clone();
    specs::partition::place(&mut placed, &partitions, who).map_err(ClusterError::Invalid)?;
    *job = placed;
    Ok(())
}

/// Stores the job's members for its current attempt: a pod of a member's name
/// that is finished, or belongs to this job, is replaced; any other is a
/// conflict that refuses the whole write.
pub fn create_members(t: &mut Txn<'_>, job: &Job) -> Result<MemberChanges, ClusterError> {
    let mut out = MemberChanges::default();
    let (priority, eligible) = priority_now(t, job)?;
    for mut pod in job::members(job) {
        let a = &mut pod.metadata.annotations;
        a.insert(job::PRIORITY_ANNOTATION.into(), priority.to_string());
        a.insert(job::ELIGIBLE_ANNOTATION.into(), eligible.to_string());
        let name = pod.metadata.name.clone();
        if let Some(existing) = t.get::<Pod>(&name)? {
            let ours = job::membership(&existing).is_some_and(|(j, _, _)| j == job.metadata.name);
            let finished = existing.status.as_ref().is_some_and(|s| s.phase.is_terminal());
            if existing.metadata.owner != job.metadata.owner {
                return Err(ClusterError::Conflict(format!(
                    "pod {name:?} is another's: job {:?} needs its name for a member",
                    job.metadata.name
                )));
            }
            if !ours && !finished {
                return Err(ClusterError::Conflict(format!(
                    "pod {name:?} exists and is not finished: job {:?} needs its name for a member",
                    job.metadata.name
                )));
            }
            if let Some(old) = t.delete::<Pod>(&name)? {
                out.deleted.push(old);
            }
        }
        pod.metadata.uid = Some(super::new_uid()?);
        pod.metadata.creation_timestamp = Some(now_rfc3339());
        pod.status = Some(PodStatus { phase: PodPhase::Pending, ..PodStatus::default() });
        t.put(&mut pod)?;
        out.created.push(pod);
    }
    Ok(out)
}

/// The job's priority as it becomes eligible now (its site priority, size
/// and its user's and account's fair share, `specs::fairshare`) and now,
/// in Unix seconds: its members carry both, and the controller orders them
/// by them, their age included.
fn priority_now(t: &Txn<'_>, job: &Job) -> Result<(i32, i64), ClusterError> {
    use specs::fairshare::{base_priority, Factors, Ledger, DEFAULT_WEIGHTS as W};
    let now = chrono::Utc::now().timestamp();
    let ledger = Ledger::new(&t.list::<specs::fairshare::Usage>()?, now, &W);
    let cluster_cpus = super::nodes::cluster_cpus(t)?;
    let cpus = specs::partition::job_millicpus(job) as f64 / 1000.0;
    let user = job.metadata.owner.as_deref().unwrap_or("admin");
    let fairshare = ledger.factor(user, job.metadata.labels.get(specs::batch::ACCOUNT_LABEL).map(String::as_str));
    let factors = Factors::new(0, cpus, cluster_cpus as f64, fairshare, &W);
    let base = base_priority(job.spec.priority, &factors, &W);
    Ok((base.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32, now))
}

/// Records the CPU-seconds a job used (its CPUs times the time since its
/// start) against its user and its account, decayed with the half-life:
/// at its end, or when it is deleted while it runs.
fn charge_usage(t: &mut Txn<'_>, job: &Job) -> Result<(), ClusterError> {
    use specs::fairshare::{Holder, Usage, DEFAULT_WEIGHTS as W};
    let status = job.status.clone().unwrap_or_default();
    let started = status.start_time.as_deref().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    let Some(started) = started else { return Ok(()) };
    let now = chrono::Utc::now();
    let ended = status
        .completion_time
        .as_deref()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map_or(now.timestamp_millis(), |e| e.timestamp_millis());
    let seconds = (ended - started.timestamp_millis()).max(0) as f64 / 1000.0;
    let now = now.timestamp();
    let cpu_seconds = specs::partition::job_millicpus(job) as f64 / 1000.0 * seconds;
    let user = job.metadata.owner.as_deref().unwrap_or("admin");
    let mut holders = vec![Holder::User(user)];
    if let Some(a) = job.metadata.labels.get(specs::batch::ACCOUNT_LABEL) {
        holders.push(Holder::Account(a));
    }
    for h in holders {
        let name = h.record();
        let mut record = t.get::<Usage>(&name)?.unwrap_or_else(|| Usage {
            api_version: specs::pod::API_VERSION.into(),
            kind: "Usage".into(),
            metadata: specs::pod::ObjectMeta { name: name.clone(), ..Default::default() },
            usage: Default::default(),
        });
        record.usage = record.usage.charge(cpu_seconds, now, W.half_life_seconds);
        t.put(&mut record)?;
    }
    Ok(())
}

/// Removes the job and its members (pods named as its members and labelled
/// with it); returns the job as it was, `None` when there is none. A job
/// deleted while it runs (cancelled) is charged for what it used.
pub fn delete(t: &mut Txn<'_>, name: &str) -> Result<Option<(Job, MemberChanges)>, ClusterError> {
    let Some(job) = t.delete::<Job>(name)? else { return Ok(None) };
    if job.status.as_ref().is_some_and(|s| s.phase == JobPhase::Running) {
        charge_usage(t, &job)?;
    }
    let ended = job.status.as_ref().is_some_and(|s| s.phase.is_terminal());
    if !ended {
        let current = current_members(t, &job)?;
        let refs: Vec<&Pod> = current.iter().flatten().collect();
        super::acct::job_ended(t, &job, &refs, true)?;
    }
    let members = delete_members(t, &job)?;
    if !ended {
        for p in members.deleted.iter().filter(|p| !super::pods::is_finished(p)) {
            super::acct::pod_ended(t, p, true)?;
        }
    }
    Ok(Some((job, members)))
}

/// Removes the job and its members for `id`, who must own it (a user) or
/// may delete anything.
pub fn delete_for(
    t: &mut Txn<'_>,
    id: &crate::tls::Identity,
    name: &str,
) -> Result<Option<(Job, MemberChanges)>, ClusterError> {
    let Some(job) = t.get::<Job>(name)? else { return Ok(None) };
    let owner = job.metadata.owner.as_deref();
    super::authorize(id, super::Request::Owned { kind: "Job", name, owner, access: super::Access::Write })?;
    delete(t, name)
}

fn delete_members(t: &mut Txn<'_>, job: &Job) -> Result<MemberChanges, ClusterError> {
    let name = &job.metadata.name;
    let mut out = MemberChanges::default();
    for rank in 0..job.spec.parallelism.min(job::MAX_MEMBERS) {
        let member = job::member_name(name, rank);
        let ours = t.get::<Pod>(&member)?.is_some_and(|p| job::membership(&p).is_some_and(|(j, _, _)| j == name));
        if ours {
            if let Some(p) = t.delete::<Pod>(&member)? {
                out.deleted.push(p);
            }
        }
    }
    Ok(out)
}

/// The job's current members by rank: a pod of the member's name labelled
/// with the job and of its current attempt, else `None`.
fn current_members(t: &Txn<'_>, job: &Job) -> Result<Vec<Option<Pod>>, ClusterError> {
    let attempt = job.status.as_ref().map_or(0, |s| s.attempt);
    let mut out = Vec::with_capacity(job.spec.parallelism as usize);
    for rank in 0..job.spec.parallelism.min(job::MAX_MEMBERS) {
        let pod = t.get::<Pod>(&job::member_name(&job.metadata.name, rank))?;
        out.push(
            pod.filter(|p| specs::job::Gang::of(p).is_some_and(|g| g.job == job.metadata.name && g.attempt == attempt)),
        );
    }
    Ok(out)
}

/// A job waiting for its dependency: its members made once it is met (in
/// this write), the job ended once it can never be; `None`: the job does not wait.
fn start_when_met(t: &mut Txn<'_>, job: &mut Job) -> Result<Option<MemberChanges>, ClusterError> {
    let status = job.status.clone().unwrap_or_default();
    if status.phase.is_terminal() || status.reason.as_deref() != Some(job::DEPENDENCY) {
        return Ok(None);
    }
    let Some(text) = job.spec.dependency.clone() else { return Ok(None) };
    let verdict = match specs::dependency::parse(&text) {
        // Validation refused a bad one at create; one stored before is never met.
        Err(e) => specs::dependency::Verdict::Never(e.to_string()),
        Ok(dep) => {
            let mut seen = std::collections::BTreeMap::new();
            for j in dep.jobs() {
                let s = match t.get::<Job>(j)? {
                    Some(other) => specs::dependency::Seen::of(other.status.unwrap_or_default().phase),
                    None => specs::dependency::Seen::Gone,
                };
                seen.insert(j.to_string(), s);
            }
            let busy = dep.has_singleton() && singleton_busy(t, job)?;
            specs::dependency::decide(&dep, &|j| seen.get(j).copied().unwrap_or(specs::dependency::Seen::Gone), busy)
        }
    };
    let name = job.metadata.name.clone();
    match verdict {
        specs::dependency::Verdict::Wait => Ok(Some(MemberChanges::default())),
        specs::dependency::Verdict::Met => {
            job.status = Some(JobStatus::default());
            t.put(job)?;
            t.add_event(event(
                "Job",
                &name,
                "Normal",
                "DependencyMet",
                format!("{text} is met: its members are made"),
            ))?;
            Ok(Some(create_members(t, job)?))
        }
        specs::dependency::Verdict::Never(why) => {
            job.status = Some(JobStatus {
                phase: JobPhase::Failed,
                reason: Some(job::DEPENDENCY_NEVER_SATISFIED.into()),
                message: Some(why.clone()),
                completion_time: Some(now_rfc3339()),
                ..Default::default()
            });
            t.put(job)?;
            t.add_event(event("Job", &name, "Warning", job::DEPENDENCY_NEVER_SATISFIED, why))?;
            Ok(Some(MemberChanges::default()))
        }
    }
}

/// Slurm's `singleton`: whether a job of the same name (`singleton_name`)
/// and owner, submitted before this one, has not ended.
fn singleton_busy(t: &Txn<'_>, job: &Job) -> Result<bool, ClusterError> {
    let name = job::singleton_name(job);
    let mine = (job.metadata.creation_timestamp.clone(), job.metadata.name.clone());
    Ok(t.list::<Job>()?.iter().any(|other| {
        let theirs = (other.metadata.creation_timestamp.clone(), other.metadata.name.clone());
        other.metadata.name != job.metadata.name
            && other.metadata.owner == job.metadata.owner
            && job::singleton_name(other) == name
            && theirs < mine
            && !other.status.as_ref().is_some_and(|s| s.phase.is_terminal())
    }))
}

/// Holds a pending job (`hold`) or releases a held one, for `id`, who must
/// own it or be an admin (Slurm's `scontrol hold/release`). A held job has
/// no members: the unplaced ones are removed in this write, so the queue
/// forgets them; a job with a placed member is refused, as Slurm holds only
/// pending jobs. Released, its members are made again in this write, or it
/// waits for its dependency again.
pub fn hold_for(t: &mut Txn<'_>, id: &crate::tls::Identity, name: &str, hold: bool) -> Result<Job, ClusterError> {
    let Some(mut job) = t.get::<Job>(name)? else { return Err(ClusterError::not_found("Job", name)) };
    let owner = job.metadata.owner.as_deref();
    super::authorize(id, super::Request::Owned { kind: "Job", name, owner, access: super::Access::Write })?;
    let status = job.status.clone().unwrap_or_default();
    let held = status.reason.as_deref() == Some(job::HELD);
    if status.phase.is_terminal() {
        return Err(ClusterError::Conflict(format!("job {name:?} has ended ({:?})", status.phase)));
    }
    if hold {
        if held {
            return Ok(job);
        }
        let placed = current_members(t, &job)?.into_iter().flatten().any(|p| p.spec.node_name.is_some());
        if status.phase == JobPhase::Running || placed {
            return Err(ClusterError::Conflict(format!(
                "job {name:?} has started: only a pending job can be held (cancel it instead)"
            )));
        }
        delete_members(t, &job)?;
        job.status = Some(JobStatus {
            attempt: status.attempt,
            reason: Some(job::HELD.into()),
            message: Some("held: `pinion release` lets it start".into()),
            ..Default::default()
        });
        t.put(&mut job)?;
        t.add_event(event("Job", name, "Normal", "Held", "held until released"))?;
        return Ok(job);
    }
    if !held {
        return Err(ClusterError::Conflict(format!("job {name:?} is not held")));
    }
    t.add_event(event("Job", name, "Normal", "Released", "released"))?;
    if let Some(d) = job.spec.dependency.clone() {
        job.status = Some(JobStatus {
            attempt: status.attempt,
            reason: Some(job::DEPENDENCY.into()),
            message: Some(format!("waiting for {d}")),
            ..Default::default()
        });
        t.put(&mut job)?;
        start_when_met(t, &mut job)?;
        return Ok(job);
    }
    job.status = Some(JobStatus { attempt: status.attempt, ..Default::default() });
    t.put(&mut job)?;
    create_members(t, &job)?;
    Ok(job)
}

/// Judges the job from its members and carries the verdict out in this write:
/// the status, and the members stopped (deleted) or started again.
/// `past_deadline`: the controller's timer says its time limit ran out.
pub fn reconcile(t: &mut Txn<'_>, name: &str, past_deadline: bool) -> Result<MemberChanges, ClusterError> {
    let Some(mut job) = t.get::<Job>(name)? else { return Ok(MemberChanges::default()) };
    // Held: no members, nothing to judge until it is released.
    if job.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some(job::HELD) && !s.phase.is_terminal()) {
        return Ok(MemberChanges::default());
    }
    if let Some(changes) = start_when_met(t, &mut job)? {
        return Ok(changes);
    }
    let members = current_members(t, &job)?;
    let refs: Vec<Option<&Pod>> = members.iter().map(Option::as_ref).collect();
    let running_for = job.spec.active_deadline_seconds.filter(|_| past_deadline);
    let verdict = job::judge(&job, &refs, running_for);
    let mut out = MemberChanges::default();
    let old = job.status.clone().unwrap_or_default();
    match &verdict.action {
        JobAction::None => {}
        JobAction::Stop(pods) => {
            for p in pods {
                if let Some(pod) = t.delete::<Pod>(p)? {
                    // A member stopped because its job ended: Slurm's
                    // CANCELLED step.
                    if !super::pods::is_finished(&pod) {
                        super::acct::pod_ended(t, &pod, true)?;
                    }
                    out.deleted.push(pod);
                }
            }
        }
        JobAction::Retry => {
            job.status = Some(verdict.status.clone());
            out.merge(create_members(t, &job)?);
        }
    }
    let mut status: JobStatus = verdict.status;
    if status.phase.is_terminal() && status.completion_time.is_none() {
        status.completion_time = Some(now_rfc3339());
    }
    if status != old {
        let what = match (&verdict.action, status.phase) {
            (JobAction::Retry, _) => Some(("Warning", "Retrying", status.first_failure.clone().unwrap_or_default())),
            (_, JobPhase::Failed) if status.reason.as_deref() == Some(job::DEADLINE_EXCEEDED) => {
                Some(("Warning", job::DEADLINE_EXCEEDED, status.message.clone().unwrap_or_default()))
            }
            (_, JobPhase::Failed) => Some(("Warning", "Failed", status.first_failure.clone().unwrap_or_default())),
            (_, JobPhase::Succeeded) => Some(("Normal", "Succeeded", "every member succeeded".to_string())),
            _ => None,
        };
        if old.phase != status.phase || matches!(verdict.action, JobAction::Retry) {
            if let Some((kind, reason, message)) = what {
                t.add_event(event("Job", name, kind, reason, message))?;
            }
        }
        let ended_now = status.phase.is_terminal() && !old.phase.is_terminal();
        job.status = Some(status);
        t.put(&mut job)?;
        if ended_now {
            charge_usage(t, &job)?;
            let ended: Vec<&Pod> = members.iter().flatten().collect();
            super::acct::job_ended(t, &job, &ended, false)?;
        }
    }
    Ok(out)
}

/// The job is placed (at least its minimum of members): Pending becomes Running.
pub fn mark_running(t: &mut Txn<'_>, name: &str) -> Result<(), ClusterError> {
    let Some(mut job) = t.get::<Job>(name)? else { return Ok(()) };
    let status = job.status.get_or_insert_with(JobStatus::default);
    if status.phase == JobPhase::Pending {
        status.phase = JobPhase::Running;
        // Where a time limit counts from (kept across a retry's attempts).
        if status.start_time.is_none() {
            status.start_time = Some(now_rfc3339());
        }
        t.put(&mut job)?;
    }
    Ok(())
}
