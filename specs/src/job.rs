//! The Job: a gang of member pods made from one template, placed together or
//! not at all (`kind: Job`, `pinion.io/v1`, Kubernetes-shaped).
//!
//! A job's members are ordinary pods named `JOB-RANK`, labelled with the job
//! and annotated with what the scheduler needs to place them as a gang, so the
//! scheduler and the nodelet see nothing new. This module builds them
//! (`members`), checks a job (`validate_job`) and judges a job's progress from
//! its members (`judge`); all pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pod::{EnvVar, ObjectMeta, Pod, PodSpec, RestartPolicy, API_VERSION};
use crate::status::PodPhase;
use crate::validate::FieldError;

/// Label on every member pod: the job's name.
pub const JOB_LABEL: &str = "pinion.io/job";
/// Annotation: the member's rank (0-based, its index in the job).
pub const RANK_ANNOTATION: &str = "pinion.io/job-rank";
/// The environment variable naming a member's job (or allocation).
pub const JOB_ENV: &str = "PINION_JOB";
/// A member's (or a step's task's) rank, 0 first (Slurm's `SLURM_PROCID`).
pub const RANK_ENV: &str = "PINION_RANK";
/// How many ranks there are (Slurm's `SLURM_NTASKS`).
pub const WORLD_SIZE_ENV: &str = "PINION_WORLD_SIZE";
/// Annotation: how many members the job has (its `parallelism`).
pub const SIZE_ANNOTATION: &str = "pinion.io/job-size";
/// Annotation: the fewest members placed at once (`gang.minMembers`).
pub const MIN_MEMBERS_ANNOTATION: &str = "pinion.io/job-min-members";
/// Annotation: the gang's placement (`pack`, `spread`).
pub const PLACEMENT_ANNOTATION: &str = "pinion.io/job-placement";
/// Annotation: at most this many nodes hold the gang.
pub const NODES_ANNOTATION: &str = "pinion.io/job-nodes";
/// Annotation: at most this many members on one node.
pub const PER_NODE_ANNOTATION: &str = "pinion.io/job-per-node";
/// Annotation: the job's priority (a higher one is placed first): its
/// `spec.priority`, to which the server adds its size and fair-share
/// factors when it makes the members (`crate::fairshare::base_priority`).
pub const PRIORITY_ANNOTATION: &str = "pinion.io/job-priority";
/// Annotation: when the job became eligible (its members made), Unix
/// seconds: where its age counts from.
pub const ELIGIBLE_ANNOTATION: &str = "pinion.io/job-eligible";
/// Annotation: the job's time limit in seconds (`activeDeadlineSeconds`),
/// for backfill: a job behind the first waiting one may go ahead only if
/// it ends by that one's reservation.
pub const TIME_LIMIT_ANNOTATION: &str = "pinion.io/job-time-limit";
/// Annotation: which attempt of the job the member belongs to (0, then one
/// more per retry under `backoffLimit`).
pub const ATTEMPT_ANNOTATION: &str = "pinion.io/job-attempt";

pub use crate::limits::MAX_JOB_MEMBERS as MAX_MEMBERS;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Job {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: JobSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<JobStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    pub template: PodTemplate,
    /// How many members run at once: the gang's size.
    pub parallelism: u32,
    /// How many members must succeed; a gang runs them all at once, so this is
    /// `parallelism` (the default) and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completions: Option<u32>,
    #[serde(default)]
    pub completion_mode: CompletionMode,
    /// How many times the whole gang is started again after a failure.
    #[serde(default)]
    pub backoff_limit: u32,
    #[serde(default)]
    pub gang: GangSpec,
    /// A higher priority is placed before jobs submitted earlier.
    #[serde(default)]
    pub priority: i32,
    /// What one member's failure does to the others.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Seconds the job and its members are kept once the job ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// The job's time limit (Slurm's `--time`), counted from its start (its
    /// `status.startTime`, when its gang was placed), as Slurm counts it;
    /// Kubernetes' name, which counts from the job's creation. At the
    /// deadline the server deletes the unfinished members (SIGTERM, then
    /// SIGKILL after their grace) and the job ends `Failed`, reason
    /// `DeadlineExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Slurm's `--dependency` (`afterok:J1:J2,afterany:J3`, see
    /// `crate::dependency`): the members are made once it is met; until then
    /// the job waits with reason `Dependency`, and one never met ends it
    /// `Failed`, reason `DependencyNeverSatisfied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// Slurm's `--partition` (see `crate::partition`): the server sets the
    /// cluster's default when none is named, and refuses a job over the
    /// partition's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Kubernetes' completion modes; a gang's members are ranks, so only `Indexed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompletionMode {
    #[default]
    Indexed,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GangSpec {
    /// Place the job once this many members fit (the rest follow as room
    /// frees); all of them when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_members: Option<u32>,
    #[serde(default)]
    pub placement: GangPlacement,
    /// At most this many nodes (Slurm's `-N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// At most this many members on one node (Slurm's `--ntasks-per-node`;
    /// `spread` is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_node: Option<u32>,
}

/// Where a gang's members go, within what each member's own topology policy allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GangPlacement {
    /// The fewest nodes: fill a node before opening another (MPI's default).
    #[default]
    Pack,
    /// One member per node.
    Spread,
}

impl GangPlacement {
    pub fn as_str(self) -> &'static str {
        match self {
            GangPlacement::Pack => "pack",
            GangPlacement::Spread => "spread",
        }
    }

    pub fn parse(s: &str) -> Option<GangPlacement> {
        match s {
            "pack" => Some(GangPlacement::Pack),
            "spread" => Some(GangPlacement::Spread),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// One member's failure stops the others (`srun --kill-on-bad-exit`).
    #[default]
    StopAll,
    /// The others run to their end; the job still fails.
    KeepRunning,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobPhase {
    /// Some member is not placed yet.
    #[default]
    Pending,
    /// Every member placed (or `minMembers` of them), none failed.
    Running,
    /// Every member succeeded.
    Succeeded,
    /// A member failed and no retry is left.
    Failed,
}

impl JobPhase {
    pub fn is_terminal(self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Failed)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobStatus {
    pub phase: JobPhase,
    /// The current attempt (0 first; one more per retry).
    #[serde(default)]
    pub attempt: u32,
    /// The first member that failed, in words: rank, pod, node, exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// Per rank, as the job's end found them (while it runs, `get`/`describe`
    /// read the member pods themselves).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// When the gang was placed (RFC 3339): where `activeDeadlineSeconds`
    /// counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// Why the job waits or ended, in Slurm's words where it has them:
    /// `Dependency`, `DependencyNeverSatisfied`, `DeadlineExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberStatus {
    pub rank: u32,
    pub pod: String,
    pub phase: PodPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The member pod name of `rank`.
pub fn member_name(job: &str, rank: u32) -> String {
    format!("{job}-{rank}")
}

/// What a member pod says of itself: `(job, rank, size)`.
pub fn membership(pod: &Pod) -> Option<(&str, u32, u32)> {
    let job = pod.metadata.labels.get(JOB_LABEL)?;
    let a = &pod.metadata.annotations;
    let rank = a.get(RANK_ANNOTATION)?.parse().ok()?;
    let size = a.get(SIZE_ANNOTATION)?.parse().ok()?;
    (rank < size).then_some((job.as_str(), rank, size))
}

/// The name `singleton` counts by: the name given at submission
/// (`pinion batch -J`, or the script's; label `pinion.io/batch-name`), else
/// the job's own.
pub fn singleton_name(job: &Job) -> &str {
    job.metadata.labels.get(crate::batch::NAME_LABEL).map_or(job.metadata.name.as_str(), String::as_str)
}

/// A member pod's gang: how many must be placed at once, how, and its priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    pub job: String,
    pub attempt: u32,
    pub rank: u32,
    pub size: u32,
    pub min_members: u32,
    pub placement: GangPlacement,
    pub max_nodes: Option<u32>,
    pub per_node: Option<u32>,
    pub priority: i32,
    /// `ELIGIBLE_ANNOTATION`, when set.
    pub eligible: Option<i64>,
    /// `TIME_LIMIT_ANNOTATION`, when set.
    pub time_limit: Option<u64>,
}

impl Gang {
    /// The gang a member pod belongs to; `None` for any other pod.
    pub fn of(pod: &Pod) -> Option<Gang> {
        let (job, rank, size) = membership(pod)?;
        let a = &pod.metadata.annotations;
        let num = |k: &str| a.get(k).and_then(|v| v.parse::<i64>().ok());
        Some(Gang {
            job: job.to_string(),
            attempt: num(ATTEMPT_ANNOTATION).and_then(|v| u32::try_from(v).ok()).unwrap_or(0),
            rank,
            size,
            min_members: num(MIN_MEMBERS_ANNOTATION).and_then(|v| u32::try_from(v).ok()).unwrap_or(size).clamp(1, size),
            placement: a.get(PLACEMENT_ANNOTATION).and_then(|p| GangPlacement::parse(p)).unwrap_or_default(),
            max_nodes: num(NODES_ANNOTATION).and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0),
            per_node: num(PER_NODE_ANNOTATION).and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0),
            priority: num(PRIORITY_ANNOTATION).and_then(|v| i32::try_from(v).ok()).unwrap_or(0),
            eligible: num(ELIGIBLE_ANNOTATION),
            time_limit: num(TIME_LIMIT_ANNOTATION).and_then(|v| u64::try_from(v).ok()),
        })
    }
}

/// Every problem with the job, each with its field path.
pub fn validate_job(job: &Job) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut push = |field: &str, message: String| e.push(FieldError { field: field.into(), message });
    if job.api_version != API_VERSION {
        push("apiVersion", format!("must be {API_VERSION:?}, got {:?}", job.api_version));
    }
    if job.kind != "Job" {
        push("kind", format!("must be \"Job\", got {:?}", job.kind));
    }
    e.extend(crate::validate::meta_problems(&job.metadata));
    let mut push = |field: &str, message: String| e.push(FieldError { field: field.into(), message });
    let s = &job.spec;
    if s.parallelism == 0 || s.parallelism > MAX_MEMBERS {
        push("spec.parallelism", format!("must be 1 to {MAX_MEMBERS}, got {}", s.parallelism));
    }
    if let Some(c) = s.completions.filter(|c| *c != s.parallelism) {
        push(
            "spec.completions",
            format!("a gang runs all its members at once: must equal parallelism ({}), got {c}", s.parallelism),
        );
    }
    if let Some(m) = s.gang.min_members.filter(|m| *m == 0 || *m > s.parallelism.max(1)) {
        push("spec.gang.minMembers", format!("must be 1 to parallelism ({}), got {m}", s.parallelism));
    }
    let (nodes, per_node) = (s.gang.nodes.unwrap_or(s.parallelism), s.gang.per_node.unwrap_or(s.parallelism));
    if s.gang.nodes == Some(0) || s.gang.nodes.is_some_and(|n| n > s.parallelism.max(1)) {
        push("spec.gang.nodes", format!("must be 1 to parallelism ({}), got {nodes}", s.parallelism));
    }
    if s.gang.per_node == Some(0) {
        push("spec.gang.perNode", "must be at least 1".into());
    } else if u64::from(nodes) * u64::from(per_node) < u64::from(s.parallelism) {
        push(
            "spec.gang.perNode",
            format!("{nodes} nodes of at most {per_node} members hold fewer than parallelism ({})", s.parallelism),
        );
    }
    if s.ttl_seconds_after_finished.is_some_and(|t| t > crate::limits::MAX_TTL_SECONDS) {
        push("spec.ttlSecondsAfterFinished", format!("at most {} seconds (a year)", crate::limits::MAX_TTL_SECONDS));
    }
    if s.active_deadline_seconds.is_some_and(|t| t == 0 || t > crate::limits::MAX_TTL_SECONDS) {
        push("spec.activeDeadlineSeconds", format!("1 to {} seconds (a year)", crate::limits::MAX_TTL_SECONDS));
    }
    if let Some(d) = &s.dependency {
        match crate::dependency::parse(d) {
            Err(why) => push("spec.dependency", why.to_string()),
            Ok(dep) if dep.jobs().contains(&job.metadata.name.as_str()) => push(
                "spec.dependency",
                format!("names the job itself ({:?}): it would wait forever", job.metadata.name),
            ),
            Ok(_) => {}
        }
    }
    if let Some(p) = s.partition.as_deref().filter(|p| !crate::validate::is_dns1123_label(p)) {
        push("spec.partition", format!("{p:?} is not a partition name (a DNS-1123 label)"));
    }
    if s.template.spec.restart_policy == RestartPolicy::Always {
        push("spec.template.spec.restartPolicy", "a job's members must end: Never or OnFailure".into());
    }
    if s.template.spec.node_name.is_some() {
        push("spec.template.spec.nodeName", "the scheduler places a job's members: leave it unset".into());
    }
    let name = &job.metadata.name;
    let longest = member_name(name, s.parallelism.saturating_sub(1));
    if !crate::validate::is_dns1123_label(name) {
        push(
            "metadata.name",
            format!("{name:?} is not a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)"),
        );
    } else if longest.len() > crate::limits::MAX_NAME_LEN {
        push(
            "metadata.name",
            format!("too long: its last member's name {longest:?} exceeds {} characters", crate::limits::MAX_NAME_LEN),
        );
    }
    for (k, _) in job.metadata.labels.iter().chain(template_meta(job).0) {
        if k == JOB_LABEL {
            push("metadata.labels", format!("{JOB_LABEL} is set by the server"));
        }
    }
    // The members are pods: a template problem is reported at its place in the
    // job. Members differ only in their identity, so rank 0 speaks for all.
    for f in crate::validate::validate_pod(&member(job, 0)) {
        let field = match f.field.strip_prefix("metadata.") {
            Some(rest) => format!("spec.template.metadata.{rest}"),
            None => match f.field.strip_prefix("spec.") {
                Some(rest) => format!("spec.template.spec.{rest}"),
                None => continue,
            },
        };
        if field == "spec.template.metadata.name" {
            continue;
        }
        e.push(FieldError { field, message: f.message });
    }
    e
}

fn template_meta(job: &Job) -> (&BTreeMap<String, String>, &BTreeMap<String, String>) {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    match &job.spec.template.metadata {
        Some(m) => (&m.labels, &m.annotations),
        None => (&EMPTY, &EMPTY),
    }
}

/// The member pods of the job's current attempt, rank order (see `member`).
pub fn members(job: &Job) -> Vec<Pod> {
    (0..job.spec.parallelism.min(MAX_MEMBERS)).map(|rank| member(job, rank)).collect()
}

/// The member pod of `rank` for the job's current attempt: the template with
/// the job's label, the gang's annotations and the rank's identity in every
/// container's environment (`PINION_JOB`, `PINION_RANK`, `PINION_WORLD_SIZE`;
/// the binding adds `PINION_LOCAL_RANK` and `PINION_NODES`, the node
/// `PINION_CPUS`).
pub fn member(job: &Job, rank: u32) -> Pod {
    let s = &job.spec;
    let name = &job.metadata.name;
    let attempt = job.status.as_ref().map_or(0, |st| st.attempt);
    let (labels, annotations) = template_meta(job);
    let mut pod = Pod::new(member_name(name, rank), s.template.spec.clone());
    pod.metadata.labels = labels.clone();
    pod.metadata.labels.insert(JOB_LABEL.into(), name.clone());
    pod.metadata.annotations = annotations.clone();
    // A member is its job's owner's: they read, follow and delete it.
    pod.metadata.owner = job.metadata.owner.clone();
    let a = &mut pod.metadata.annotations;
    a.insert(RANK_ANNOTATION.into(), rank.to_string());
    a.insert(SIZE_ANNOTATION.into(), s.parallelism.to_string());
    a.insert(PLACEMENT_ANNOTATION.into(), s.gang.placement.as_str().into());
    a.insert(PRIORITY_ANNOTATION.into(), s.priority.to_string());
    a.insert(ATTEMPT_ANNOTATION.into(), attempt.to_string());
    if let Some(m) = s.gang.min_members {
        a.insert(MIN_MEMBERS_ANNOTATION.into(), m.to_string());
    }
    if let Some(t) = s.active_deadline_seconds {
        a.insert(TIME_LIMIT_ANNOTATION.into(), t.to_string());
    }
    if let Some(n) = s.gang.nodes {
        a.insert(NODES_ANNOTATION.into(), n.to_string());
    }
    if let Some(k) = s.gang.per_node {
        a.insert(PER_NODE_ANNOTATION.into(), k.to_string());
    }
    pod.spec.ttl_seconds_after_finished = s.ttl_seconds_after_finished;
    for c in &mut pod.spec.containers {
        set_env(&mut c.env, JOB_ENV, name);
        set_env(&mut c.env, RANK_ENV, &rank.to_string());
        set_env(&mut c.env, WORLD_SIZE_ENV, &s.parallelism.to_string());
    }
    pod
}

/// Sets `name` in `env`, replacing an earlier value.
pub fn set_env(env: &mut Vec<EnvVar>, name: &str, value: &str) {
    env.retain(|v| v.name != name);
    env.push(EnvVar { name: name.into(), value: value.into() });
}

/// What the job's members mean for the job.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub status: JobStatus,
    pub action: JobAction,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobAction {
    /// Nothing to do.
    None,
    /// Stop (delete) these unfinished members: the job failed.
    Stop(Vec<String>),
    /// Start the gang again as attempt `status.attempt` (delete every member,
    /// create new ones).
    Retry,
}

/// Reason of a job that outran its `activeDeadlineSeconds` (Slurm's TIMEOUT).
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Reason of a job waiting for its dependency (Slurm's word).
pub const DEPENDENCY: &str = "Dependency";
/// Reason of a job its owner (or an admin) holds (Slurm's word).
pub const HELD: &str = "JobHeldUser";
/// Reason of a job whose dependency can never be met (Slurm's word).
pub const DEPENDENCY_NEVER_SATISFIED: &str = "DependencyNeverSatisfied";

/// Seconds left before the job's time limit, given how long it has been
/// running; `None` without a limit or before it started.
pub fn time_left(job: &Job, running_for: Option<u64>) -> Option<u64> {
    let limit = job.spec.active_deadline_seconds?;
    Some(limit.saturating_sub(running_for?))
}

/// The job's status and what to do, from its members (`members[rank]`, `None`
/// for a member that is gone) and how long it has been running (seconds
/// since `status.startTime`; `None` before it started). Pure: the controller
/// runs it after a member finished, at the job's deadline, and again at
/// start for every job not ended.
pub fn judge(job: &Job, members: &[Option<&Pod>], running_for: Option<u64>) -> Verdict {
    let old = job.status.clone().unwrap_or_default();
    if old.phase.is_terminal() {
        return Verdict { status: old, action: JobAction::None };
    }
    let view: Vec<MemberStatus> =
        members.iter().enumerate().map(|(rank, pod)| member_status(&job.metadata.name, rank as u32, *pod)).collect();
    let mut status = JobStatus {
        attempt: old.attempt,
        first_failure: old.first_failure.clone(),
        start_time: old.start_time.clone(),
        ..Default::default()
    };
    if time_left(job, running_for) == Some(0) && !view.iter().all(|m| m.phase == PodPhase::Succeeded) {
        let limit = job.spec.active_deadline_seconds.unwrap_or_default();
        status.phase = JobPhase::Failed;
        status.reason = Some(DEADLINE_EXCEEDED.into());
        status.message = Some(format!("the job ran past its time limit of {limit} s"));
        let unfinished: Vec<String> = view.iter().filter(|m| !m.phase.is_terminal()).map(|m| m.pod.clone()).collect();
        status.members = view
            .into_iter()
            .map(|mut m| {
                if !m.phase.is_terminal() {
                    m.phase = PodPhase::Failed;
                    m.reason = Some(DEADLINE_EXCEEDED.into());
                }
                m
            })
            .collect();
        let action = if unfinished.is_empty() { JobAction::None } else { JobAction::Stop(unfinished) };
        return Verdict { status, action };
    }
    let failed = view.iter().find(|m| m.phase == PodPhase::Failed);
    if let Some(f) = failed {
        if status.first_failure.is_none() {
            let words = failure_words(f);
            let retried = job.spec.backoff_limit > 0;
            status.first_failure = Some(if retried { format!("attempt {}: {words}", old.attempt) } else { words });
        }
        if old.attempt < job.spec.backoff_limit {
            status.attempt = old.attempt + 1;
            status.phase = JobPhase::Pending;
            return Verdict { status, action: JobAction::Retry };
        }
        status.phase = JobPhase::Failed;
        let unfinished: Vec<String> = view.iter().filter(|m| !m.phase.is_terminal()).map(|m| m.pod.clone()).collect();
        let action = match job.spec.failure_policy {
            FailurePolicy::StopAll if !unfinished.is_empty() => JobAction::Stop(unfinished),
            // The others run on; the job ends as failed once they all have.
            FailurePolicy::KeepRunning if !unfinished.is_empty() => {
                status.phase = JobPhase::Running;
                JobAction::None
            }
            _ => JobAction::None,
        };
        if status.phase == JobPhase::Failed {
            status.members = view.into_iter().map(|m| stopped(m, &job.spec.failure_policy)).collect();
        }
        return Verdict { status, action };
    }
    if !view.is_empty() && view.iter().all(|m| m.phase == PodPhase::Succeeded) {
        status.phase = JobPhase::Succeeded;
        status.members = view;
        return Verdict { status, action: JobAction::None };
    }
    let placed = view.iter().filter(|m| m.node.is_some()).count() as u32;
    let min = job.spec.gang.min_members.unwrap_or(job.spec.parallelism);
    status.phase = if placed >= min && placed > 0 { JobPhase::Running } else { JobPhase::Pending };
    Verdict { status, action: JobAction::None }
}

fn stopped(mut m: MemberStatus, policy: &FailurePolicy) -> MemberStatus {
    if !m.phase.is_terminal() && *policy == FailurePolicy::StopAll {
        m.phase = PodPhase::Failed;
        m.reason = Some("StoppedByJob".into());
    }
    m
}

fn failure_words(m: &MemberStatus) -> String {
    let mut s = format!("rank {} ({})", m.rank, m.pod);
    if let Some(n) = &m.node {
        s.push_str(&format!(" on {n}"));
    }
    match (m.exit_code, &m.reason) {
        (Some(c), Some(r)) => s.push_str(&format!(" failed: exit code {c} ({r})")),
        (Some(c), None) => s.push_str(&format!(" failed: exit code {c}")),
        (None, Some(r)) => s.push_str(&format!(" failed: {r}")),
        (None, None) => s.push_str(" failed"),
    }
    s
}

/// One member as `get`/`describe` and the job's status show it.
pub fn member_status(job: &str, rank: u32, pod: Option<&Pod>) -> MemberStatus {
    let name = member_name(job, rank);
    let Some(pod) = pod else {
        return MemberStatus {
            rank,
            pod: name,
            phase: PodPhase::Failed,
            reason: Some("Deleted".into()),
            ..Default::default()
        };
    };
    let st = pod.status.as_ref();
    let ended = st.is_some_and(|s| s.phase.is_terminal());
    // The container that failed speaks for the member, else the first one.
    let containers = st.map(|s| s.container_statuses.as_slice()).unwrap_or_default();
    let speaker = containers.iter().find(|c| c.last_exit_code.is_some_and(|x| x != 0)).or(containers.first());
    MemberStatus {
        rank,
        pod: name,
        phase: st.map(|s| s.phase).unwrap_or_default(),
        node: pod.spec.node_name.clone(),
        exit_code: speaker.and_then(|c| c.last_exit_code).filter(|_| ended),
        reason: speaker.and_then(|c| c.reason.clone()).or_else(|| st.and_then(|s| s.reason.clone())).filter(|_| ended),
    }
}

#[cfg(test)]
mod tests;
