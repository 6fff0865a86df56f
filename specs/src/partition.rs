//! Partitions (`kind: Partition`, `pinion.io/v1`): named sets of nodes,
//! chosen by label, with a default and a maximum time limit, a maximum of
//! CPUs per job and the people who may use them; Slurm's `PartitionName=`
//! lines as objects an admin applies. One partition may be the cluster's
//! default (`spec.default`), where a job that names none goes.
//!
//! `place` is the one decision, made when a job is submitted: which
//! partition it goes to, what that adds to it (the partition's name, its
//! default time, its node selector) and why it is refused, at the field that
//! says so. Pure: the server passes the stored partitions in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::job::Job;
use crate::pod::{ObjectMeta, API_VERSION};
use crate::validate::FieldError;

pub const KIND: &str = "Partition";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Partition {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PartitionSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PartitionSpec {
    /// The partition's nodes: those with every one of these labels (every
    /// node when empty). A job's members get them as their node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The time limit of a job that sets none (Slurm's `DefaultTime`); the
    /// maximum when unset, as in Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_time_seconds: Option<u64>,
    /// The longest time limit a job may ask for (Slurm's `MaxTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_time_seconds: Option<u64>,
    /// The most CPUs one job may ask for, all its members together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus_per_job: Option<u32>,
    /// Who may submit to it (people's names); everyone when empty (Slurm's
    /// `AllowAccounts=ALL`). Admins may always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_users: Vec<String>,
    /// Where a job that names no partition goes (Slurm's `Default=YES`); at
    /// most one partition of the cluster.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// Every problem of a partition, at its field.
pub fn validate_partition(p: &Partition) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut push = |field: String, message: String| e.push(FieldError { field, message });
    if p.api_version != API_VERSION {
        push("apiVersion".into(), format!("must be {API_VERSION:?}, got {:?}", p.api_version));
    }
    if p.kind != KIND {
        push("kind".into(), format!("must be {KIND:?}, got {:?}", p.kind));
    }
    if !crate::validate::is_dns1123_label(&p.metadata.name) {
        push(
            "metadata.name".into(),
            format!("{:?} is not a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)", p.metadata.name),
        );
    }
    e.extend(crate::validate::meta_problems(&p.metadata));
    let mut push = |field: String, message: String| e.push(FieldError { field, message });
    let s = &p.spec;
    if s.node_selector.len() > crate::limits::MAX_LABELS {
        push("spec.nodeSelector".into(), format!("at most {} entries", crate::limits::MAX_LABELS));
    }
    for (k, v) in &s.node_selector {
        if !crate::validate::is_label_key(k) || !crate::validate::is_label_value(v) {
            push(format!("spec.nodeSelector[{k}]"), format!("{k}={v} is not a label a node can carry"));
        }
    }
    let max = crate::limits::MAX_TTL_SECONDS;
    for (field, t) in [("spec.defaultTimeSeconds", s.default_time_seconds), ("spec.maxTimeSeconds", s.max_time_seconds)]
    {
        if t.is_some_and(|t| t == 0 || t > max) {
            push(field.into(), format!("1 to {max} seconds (a year)"));
        }
    }
    if let (Some(d), Some(m)) = (s.default_time_seconds, s.max_time_seconds) {
        if d > m {
            push(
                "spec.defaultTimeSeconds".into(),
                format!("{} is over the partition's maximum time {}", time(d), time(m)),
            );
        }
    }
    if s.max_cpus_per_job == Some(0) {
        push("spec.maxCpusPerJob".into(), "must be at least 1 (leave it unset for no limit)".into());
    }
    if s.allowed_users.len() > crate::limits::MAX_PARTITION_USERS {
        push("spec.allowedUsers".into(), format!("at most {} names", crate::limits::MAX_PARTITION_USERS));
    }
    for (i, u) in s.allowed_users.iter().enumerate() {
        if let Some(why) = crate::validate::user_name_problem(u) {
            push(format!("spec.allowedUsers[{i}]"), why);
        }
    }
    e
}

/// Who submits a job, as a partition sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitter<'a> {
    /// The person's name; `None` for the bootstrap admin certificate.
    pub name: Option<&'a str>,
    /// Admins may use every partition.
    pub admin: bool,
}

/// The CPUs a job asks for, all members together, in millicores: each
/// member's containers' requests (else limits), times its members.
pub fn job_millicpus(job: &Job) -> i128 {
    crate::backfill::pod_millicpus(&job.spec.template.spec) * i128::from(job.spec.parallelism)
}

/// Puts `job` in its partition: the one it names (`spec.partition`), else
/// the cluster's default, else none (a cluster without partitions, or
/// without a default, places a job that names none anywhere). The job gets
/// the partition's name, its default time when it set none (its maximum
/// when it has no default), and the partition's node selector added to its
/// members'. Refused, at the field that asks for too much: a partition that
/// does not exist or is not the submitter's, a time over the maximum, more
/// CPUs than the maximum per job, a node selector outside the partition.
pub fn place(job: &mut Job, partitions: &[Partition], who: Submitter<'_>) -> Result<(), Vec<FieldError>> {
    let refuse = |field: &str, message: String| Err(vec![FieldError { field: field.into(), message }]);
    let chosen = match job.spec.partition.as_deref() {
        Some(name) => match partitions.iter().find(|p| p.metadata.name == name) {
            Some(p) => p,
            None => {
                let names: Vec<&str> = partitions.iter().map(|p| p.metadata.name.as_str()).collect();
                let have = if names.is_empty() {
                    "the cluster has no partitions".to_string()
                } else {
                    format!("the cluster's partitions are {}", names.join(", "))
                };
                return refuse("spec.partition", format!("no partition {name:?}: {have}"));
            }
        },
        None => match partitions.iter().filter(|p| p.spec.default).min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
        {
            Some(p) => p,
            None => return Ok(()),
        },
    };
    let name = chosen.metadata.name.as_str();
    let s = &chosen.spec;
    if !who.admin && !s.allowed_users.is_empty() && !who.name.is_some_and(|n| s.allowed_users.iter().any(|u| u == n)) {
        let whom = who.name.map_or_else(|| "this identity".to_string(), |n| format!("user {n:?}"));
        return refuse("spec.partition", format!("{whom} may not use partition {name:?} (its allowedUsers)"));
    }
    let mut problems = Vec::new();
    match (job.spec.active_deadline_seconds, s.max_time_seconds) {
        (Some(t), Some(m)) if t > m => problems.push(FieldError {
            field: "spec.activeDeadlineSeconds".into(),
            message: format!(
                "a time limit of {} is over partition {name:?}'s maximum {} (maxTimeSeconds)",
                time(t),
                time(m)
            ),
        }),
        (Some(_), _) => {}
        (None, m) => job.spec.active_deadline_seconds = s.default_time_seconds.or(m),
    }
    if let Some(most) = s.max_cpus_per_job {
        let asked = job_millicpus(job);
        if asked > i128::from(most) * 1000 {
            problems.push(FieldError {
                field: "spec.template.spec.containers[*].resources.requests.cpu".into(),
                message: format!(
                    "the job asks for {} CPUs ({} members of {}); partition {name:?} allows at most {most} per job (maxCpusPerJob)",
                    cpus(asked),
                    job.spec.parallelism,
                    cpus(asked / i128::from(job.spec.parallelism.max(1))),
                ),
            });
        }
    }
    let selector = &mut job.spec.template.spec.node_selector;
    for (k, v) in &s.node_selector {
        match selector.get(k) {
            Some(own) if own != v => problems.push(FieldError {
                field: format!("spec.template.spec.nodeSelector[{k}]"),
                message: format!("{k}={own} is outside partition {name:?}, whose nodes have {k}={v}"),
            }),
            _ => {
                selector.insert(k.clone(), v.clone());
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    job.spec.partition = Some(name.to_string());
    Ok(())
}

/// CPUs as Slurm's `sinfo` counts them: allocated, idle, other (reserved,
/// offline, or on a node that is not Ready) and total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCounts {
    pub allocated: usize,
    pub idle: usize,
    pub other: usize,
    pub total: usize,
}

impl CpuCounts {
    /// A node's: `idle` the CPUs no pod holds exclusively.
    pub fn of(node: &crate::api::Node) -> CpuCounts {
        let total = node.spec.topology.cpus.len();
        if node.status.condition != crate::api::NodeCondition::Ready {
            return CpuCounts { allocated: 0, idle: 0, other: total, total };
        }
        let offline = &node.status.offline_cpus;
        let unusable = node.spec.settings.reserved(&node.spec.topology).union(offline);
        let idle: usize = node.status.numa.iter().map(|z| z.free_cpus.difference(offline).len()).sum();
        let other = unusable.len().min(total);
        CpuCounts { allocated: total.saturating_sub(idle + other), idle: idle.min(total - other), other, total }
    }

    fn add(&mut self, o: CpuCounts) {
        self.allocated += o.allocated;
        self.idle += o.idle;
        self.other += o.other;
        self.total += o.total;
    }

    /// `A/I/O/T`.
    pub fn slashed(&self) -> String {
        format!("{}/{}/{}/{}", self.allocated, self.idle, self.other, self.total)
    }
}

/// A node's state in Slurm's words: `down` (not Ready), `idle` (nothing
/// allocated), `alloc` (nothing idle), else `mix`.
pub fn node_state(c: &CpuCounts, ready: bool) -> &'static str {
    match (ready, c.allocated, c.idle) {
        (false, _, _) => "down",
        (true, 0, _) => "idle",
        (true, _, 0) => "alloc",
        _ => "mix",
    }
}

/// One line of `pinion nodes` (Slurm's `sinfo`): a partition's nodes in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodesRow {
    /// The partition's name, `*` after the default's; `all` without partitions.
    pub partition: String,
    pub time_limit: Option<u64>,
    pub state: &'static str,
    pub nodes: Vec<String>,
    pub cpus: CpuCounts,
    /// NUMA nodes per node: `2`, or `1-2` where they differ.
    pub numa: String,
}

/// `sinfo`'s lines: per partition (by name; every node as `all` when the
/// cluster has none), per state (`alloc`, `down`, `idle`, `mix`).
pub fn nodes_rows(partitions: &[Partition], nodes: &[crate::api::Node]) -> Vec<NodesRow> {
    let all = [Partition {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: ObjectMeta { name: "all".into(), ..Default::default() },
        spec: PartitionSpec::default(),
    }];
    let mut sorted: Vec<&Partition> =
        if partitions.is_empty() { all.iter().collect() } else { partitions.iter().collect() };
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for p in sorted {
        let mut by_state: BTreeMap<&'static str, Vec<&crate::api::Node>> = BTreeMap::new();
        for n in nodes.iter().filter(|n| p.spec.node_selector.iter().all(|(k, v)| n.metadata.labels.get(k) == Some(v)))
        {
            let ready = n.status.condition == crate::api::NodeCondition::Ready;
            by_state.entry(node_state(&CpuCounts::of(n), ready)).or_default().push(n);
        }
        for (state, mut members) in by_state {
            members.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let mut cpus = CpuCounts::default();
            members.iter().for_each(|n| cpus.add(CpuCounts::of(n)));
            let numa: std::collections::BTreeSet<usize> =
                members.iter().map(|n| n.spec.topology.numa_nodes.len()).collect();
            let numa = match (numa.first(), numa.last()) {
                (Some(lo), Some(hi)) if lo != hi => format!("{lo}-{hi}"),
                (Some(lo), _) => lo.to_string(),
                _ => "-".into(),
            };
            out.push(NodesRow {
                partition: format!("{}{}", p.metadata.name, if p.spec.default { "*" } else { "" }),
                time_limit: p.spec.max_time_seconds,
                state,
                nodes: members.iter().map(|n| n.metadata.name.clone()).collect(),
                cpus,
                numa,
            });
        }
    }
    out
}

/// Millicores as CPUs: `4`, `2.5`.
fn cpus(millis: i128) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{}", millis as f64 / 1000.0)
    }
}

/// Seconds as Slurm writes a time: `MM:SS`, `H:MM:SS`, `D-HH:MM:SS`.
pub fn time(seconds: u64) -> String {
    let (d, h, m, s) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    match (d, h) {
        (0, 0) => format!("{m}:{s:02}"),
        (0, h) => format!("{h}:{m:02}:{s:02}"),
        (d, h) => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

#[cfg(test)]
mod tests;
