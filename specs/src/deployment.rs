//! The Deployment: N replicas of one pod template, kept running and rolled
//! from one revision of the template to the next (`kind: Deployment`,
//! `pinion.io/v1`, Kubernetes-shaped, without ReplicaSets).
//!
//! Where Kubernetes keeps one ReplicaSet per revision, a Deployment here
//! keeps its revisions in its own status (`status.history`): a revision is a
//! number, the template's stable hash and the template, so that `undo` finds
//! an old template and one write of the Deployment changes its history. Its
//! pods are ordinary pods named `NAME-HASH-XXXXX` and labelled with the
//! selector, the Deployment, the revision and the hash; the hash (not the
//! number, which an undo renumbers) says which revision a pod runs. This
//! module holds the object, its checks, the hash, the pods' names and
//! labels, and the history's rules (`next_history`, `undo`, `restart`); the
//! reconcile is `rollout`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::job::PodTemplate;
use crate::limits::{
    MAX_PROGRESS_DEADLINE_SECONDS, MAX_REPLICAS, MAX_REVISION_HISTORY, MAX_WORKLOAD_NAME_LEN, MAX_WORKLOAD_SECONDS,
};
use crate::pod::{ObjectMeta, Pod, RestartPolicy, API_VERSION};
use crate::validate::FieldError;

/// Label on every pod of a Deployment: the Deployment's name.
pub const DEPLOYMENT_LABEL: &str = "pinion.io/deployment";
/// Label: the revision number the pod was made for (informative: an undo
/// gives an old template a new number, and its pods keep their old one).
pub const REVISION_LABEL: &str = "pinion.io/revision";
/// Label: the stable hash of the pod's template, which says its revision.
pub const TEMPLATE_HASH_LABEL: &str = "pinion.io/template-hash";
/// Template annotation `pinion rollout restart` sets (to the time of the
/// restart): a new template, so a new revision, with nothing else changed.
pub const RESTARTED_AT_ANNOTATION: &str = "pinion.io/restartedAt";

pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 600;
pub const DEFAULT_REVISION_HISTORY_LIMIT: u32 = 10;
/// Kubernetes' default `maxUnavailable` and `maxSurge`.
pub const DEFAULT_MAX_UNAVAILABLE: IntOrPercent = IntOrPercent::Percent(25);
pub const DEFAULT_MAX_SURGE: IntOrPercent = IntOrPercent::Percent(25);

/// Characters of a template hash: no vowels (no words in names) and no
/// look-alikes, as Kubernetes' `SafeEncodeString`.
const ALPHABET: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";
/// Characters of a template hash in names (27^10 is about 2^47).
pub const HASH_LEN: usize = 10;
/// Characters of a pod's own suffix.
pub const SUFFIX_LEN: usize = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Deployment {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: DeploymentSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DeploymentStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentSpec {
    #[serde(default = "one")]
    pub replicas: u32,
    pub selector: LabelSelector,
    pub template: PodTemplate,
    #[serde(default)]
    pub strategy: DeploymentStrategy,
    /// Seconds a pod must have been ready to count as available.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_ready_seconds: u32,
    /// Seconds a rollout may go without progress before it stops
    /// (`DEFAULT_PROGRESS_DEADLINE_SECONDS` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<u32>,
    /// Old revisions kept for `undo` (`DEFAULT_REVISION_HISTORY_LIMIT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<u32>,
    /// A paused Deployment keeps its replica count with its current
    /// revision and does not roll out template changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn one() -> u32 {
    1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl DeploymentSpec {
    pub fn progress_deadline_seconds(&self) -> u32 {
        self.progress_deadline_seconds.unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS)
    }

    pub fn revision_history_limit(&self) -> u32 {
        self.revision_history_limit.unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentStrategy {
    #[serde(rename = "type", default)]
    pub kind: StrategyType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StrategyType {
    /// Replace pods a few at a time, within `maxUnavailable` and `maxSurge`.
    #[default]
    RollingUpdate,
    /// Stop every old pod before the first new one starts (a workload that
    /// must never run two versions at once).
    Recreate,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollingUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrPercent>,
}

/// A count, or a percent of the replicas written `"25%"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(u32),
    Percent(u32),
}

impl IntOrPercent {
    /// The count for `total` replicas; a percent rounds up or down as
    /// Kubernetes rounds it (`maxSurge` up, `maxUnavailable` down, so both
    /// err on the side of availability).
    pub fn resolve(self, total: u32, round_up: bool) -> u32 {
        match self {
            IntOrPercent::Int(n) => n,
            IntOrPercent::Percent(p) => {
                let scaled = u64::from(total) * u64::from(p);
                let n = if round_up { scaled.div_ceil(100) } else { scaled / 100 };
                u32::try_from(n).unwrap_or(u32::MAX)
            }
        }
    }
}

impl Serialize for IntOrPercent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            IntOrPercent::Int(n) => s.serialize_u32(*n),
            IntOrPercent::Percent(p) => s.serialize_str(&format!("{p}%")),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrPercent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = IntOrPercent;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number or a percent such as \"25%\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<IntOrPercent, E> {
                u32::try_from(n).map(IntOrPercent::Int).map_err(|_| E::custom("too large"))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<IntOrPercent, E> {
                u32::try_from(n).map(IntOrPercent::Int).map_err(|_| E::custom("must not be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<IntOrPercent, E> {
                let digits = s.strip_suffix('%').filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
                match digits.and_then(|d| d.parse::<u32>().ok()) {
                    Some(p) => Ok(IntOrPercent::Percent(p)),
                    None => Err(E::custom(format!("{s:?}: want a whole number or a percent such as \"25%\""))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentStatus {
    /// The `metadata.generation` this status was computed for.
    #[serde(default)]
    pub observed_generation: u64,
    /// Pods counted (on a node not lost, not being deleted, not ended).
    #[serde(default)]
    pub replicas: u32,
    #[serde(default)]
    pub ready_replicas: u32,
    /// Pods of the current revision.
    #[serde(default)]
    pub updated_replicas: u32,
    /// Pods ready for at least `minReadySeconds`.
    #[serde(default)]
    pub available_replicas: u32,
    #[serde(default)]
    pub unavailable_replicas: u32,
    /// The current revision's number (0: none yet).
    #[serde(default)]
    pub revision: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template_hash: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The current revision and up to `revisionHistoryLimit` older ones,
    /// oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Revision>,
}

impl DeploymentStatus {
    pub fn condition(&self, kind: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Revision {
    pub number: u64,
    pub template_hash: String,
    pub template: PodTemplate,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the condition last said something new (the progress clock),
    /// unix seconds.
    pub last_update_time: u64,
    /// When `status` last changed, unix seconds.
    pub last_transition_time: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    /// At least `replicas - maxUnavailable` pods are available.
    Available,
    /// The rollout moves (or has ended well, `NewReplicaSetAvailable`), or
    /// has stopped (`ProgressDeadlineExceeded`).
    Progressing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// Reasons, in Kubernetes' words (the ReplicaSet in them is a revision here).
pub mod reason {
    pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
    pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
    pub const NEW_REVISION_CREATED: &str = "NewReplicaSetCreated";
    pub const REVISION_UPDATED: &str = "ReplicaSetUpdated";
    pub const NEW_REVISION_AVAILABLE: &str = "NewReplicaSetAvailable";
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const PAUSED: &str = "DeploymentPaused";
}

/// FNV-1a, 64 bits: fixed by its definition, so a hash computed by one
/// server (or Rust version) is the hash another computes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `len` characters of `ALPHABET` from `n`.
fn encode(mut n: u64, len: usize) -> String {
    let mut s = String::with_capacity(len);
    for _ in 0..len {
        s.push(char::from(ALPHABET[(n % 27) as usize]));
        n /= 27;
    }
    s
}

/// The template's stable hash: FNV-1a over its canonical JSON (fields in
/// declaration order, maps sorted, unset fields left out), so the same
/// template hashes the same in every process, and a field added unset to
/// the types later leaves old templates' hashes alone.
pub fn template_hash(template: &PodTemplate) -> String {
    // Serializing a template cannot fail: every map has string keys and no
    // type has a fallible `Serialize`.
    let json = serde_json::to_vec(template).unwrap_or_default();
    encode(fnv1a64(&json), HASH_LEN)
}

/// A pod's own 5 characters, from a number the caller draws (a random
/// number, or a counter): the decider stays pure.
pub fn pod_suffix(n: u64) -> String {
    encode(n, SUFFIX_LEN)
}

/// `NAME-HASH-XXXXX`.
pub fn pod_name(deployment: &str, hash: &str, suffix: u64) -> String {
    format!("{deployment}-{hash}-{}", pod_suffix(suffix))
}

/// The template hash a pod carries, if it carries one.
pub fn pod_template_hash(pod: &Pod) -> Option<&str> {
    pod.metadata.labels.get(TEMPLATE_HASH_LABEL).map(String::as_str)
}

/// A new pod of revision `rev`: the revision's template, its labels plus the
/// selector's, the Deployment's, the revision's and the hash; the
/// Deployment's owner. Unbound: the scheduler places it (each replica gets
/// its own placement plan).
pub fn new_pod(d: &Deployment, rev: &Revision, suffix: u64) -> Pod {
    let name = &d.metadata.name;
    let mut pod = Pod::new(pod_name(name, &rev.template_hash, suffix), rev.template.spec.clone());
    if let Some(m) = &rev.template.metadata {
        pod.metadata.labels = m.labels.clone();
        pod.metadata.annotations = m.annotations.clone();
    }
    let l = &mut pod.metadata.labels;
    l.extend(d.spec.selector.match_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    l.insert(DEPLOYMENT_LABEL.into(), name.clone());
    l.insert(REVISION_LABEL.into(), rev.number.to_string());
    l.insert(TEMPLATE_HASH_LABEL.into(), rev.template_hash.clone());
    pod.metadata.owner = d.metadata.owner.clone();
    pod
}

/// The history after the controller has seen `d`'s template
/// (`advance_history`). A paused Deployment's history does not move.
/// Returns the history and the current revision's index in it.
pub fn next_history(d: &Deployment) -> (Vec<Revision>, usize) {
    let status = d.status.clone().unwrap_or_default();
    if d.spec.paused {
        if let Some(i) = status.history.iter().position(|r| r.number == status.revision) {
            return (status.history, i);
        }
    }
    advance_history(status.history, status.revision, &d.spec.template, d.spec.revision_history_limit())
}

/// The revision rules every workload with a template shares (Deployments
/// and DaemonSets): given its `history` (oldest first) and `current`
/// revision number, the history once `template` is the current one:
/// unchanged when it is the current revision's; the template as a new
/// revision (one past the highest) when it is new, or when it is an older
/// revision's (an undo, or a manual return to an old template: Kubernetes
/// renumbers the old ReplicaSet or ControllerRevision the same way); then
/// trimmed to `limit` old revisions. Returns the history and the current
/// revision's index in it.
pub fn advance_history(
    mut history: Vec<Revision>,
    current: u64,
    template: &PodTemplate,
    limit: u32,
) -> (Vec<Revision>, usize) {
    let hash = template_hash(template);
    if let Some(i) = history.iter().position(|r| r.number == current && r.template_hash == hash) {
        return (history, i);
    }
    let next = history.iter().map(|r| r.number).max().unwrap_or(0) + 1;
    history.retain(|r| r.template_hash != hash);
    history.push(Revision { number: next, template_hash: hash, template: template.clone() });
    let keep = limit as usize + 1;
    if history.len() > keep {
        history.drain(..history.len() - keep);
    }
    let last = history.len() - 1;
    (history, last)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    #[error("{kind} {name} has no revision before its current one")]
    NoPrevious { kind: &'static str, name: String },
    #[error("{kind} {name} has no revision {revision} (kept: {kept})")]
    NoSuchRevision { kind: &'static str, name: String, revision: u64, kept: String },
    #[error("revision {0} is the current one already")]
    AlreadyCurrent(u64),
}

/// The template `pinion rollout undo` puts back: revision `to`, or the one
/// before the current when `None`. The caller writes it as the spec's
/// template; the next reconcile makes it the newest revision.
pub fn undo(d: &Deployment, to: Option<u64>) -> Result<PodTemplate, RolloutError> {
    let status = d.status.clone().unwrap_or_default();
    template_to_undo("deployment", &d.metadata.name, &status.history, status.revision, to)
}

/// `undo` for any workload that keeps a history (`advance_history`): the
/// template of revision `to`, or of the one before `current` when `None`.
/// `kind` and `name` are for the error's words.
pub fn template_to_undo(
    kind: &'static str,
    name: &str,
    history: &[Revision],
    current: u64,
    to: Option<u64>,
) -> Result<PodTemplate, RolloutError> {
    let found = match to {
        Some(n) if n == current => return Err(RolloutError::AlreadyCurrent(n)),
        Some(n) => history.iter().find(|r| r.number == n).ok_or_else(|| RolloutError::NoSuchRevision {
            kind,
            name: name.to_string(),
            revision: n,
            kept: history.iter().map(|r| r.number.to_string()).collect::<Vec<_>>().join(", "),
        })?,
        None => history
            .iter()
            .filter(|r| r.number < current)
            .max_by_key(|r| r.number)
            .ok_or_else(|| RolloutError::NoPrevious { kind, name: name.to_string() })?,
    };
    Ok(found.template.clone())
}

/// `pinion rollout restart`: the template with `RESTARTED_AT_ANNOTATION` set
/// to `at` (the caller's time in words), a new revision whose pods replace
/// every pod under the strategy's rules.
pub fn restart(template: &PodTemplate, at: &str) -> PodTemplate {
    let mut t = template.clone();
    t.metadata.get_or_insert_with(Default::default).annotations.insert(RESTARTED_AT_ANNOTATION.into(), at.into());
    t
}

/// `PUT /api/v1/deployments/NAME/scale` body (`pinion scale`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scale {
    pub replicas: u32,
}

/// `POST /api/v1/deployments/NAME/undo` body (`pinion rollout undo`): the
/// revision to go back to, or (absent) the one before the current.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Undo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_revision: Option<u64>,
}

/// Labels only the server sets on a workload's pods.
pub(crate) const RESERVED_LABELS: [&str; 4] =
    [DEPLOYMENT_LABEL, REVISION_LABEL, TEMPLATE_HASH_LABEL, crate::daemonset::DAEMONSET_LABEL];

/// Every problem of the Deployment, each with its field path.
pub fn validate_deployment(d: &Deployment) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut push = |field: &str, message: String| e.push(FieldError { field: field.into(), message });
    if d.api_version != API_VERSION {
        push("apiVersion", format!("must be {API_VERSION:?}, got {:?}", d.api_version));
    }
    if d.kind != "Deployment" {
        push("kind", format!("must be \"Deployment\", got {:?}", d.kind));
    }
    let s = &d.spec;
    if s.replicas > MAX_REPLICAS {
        push("spec.replicas", format!("must be at most {MAX_REPLICAS}, got {}", s.replicas));
    }
    match (s.strategy.kind, &s.strategy.rolling_update) {
        (StrategyType::Recreate, Some(_)) => {
            push("spec.strategy.rollingUpdate", "only with type RollingUpdate".into());
        }
        (StrategyType::RollingUpdate, ru) => {
            let ru = ru.clone().unwrap_or_default();
            let unavailable = ru.max_unavailable.unwrap_or(DEFAULT_MAX_UNAVAILABLE);
            let surge = ru.max_surge.unwrap_or(DEFAULT_MAX_SURGE);
            for (field, v) in [
                ("spec.strategy.rollingUpdate.maxUnavailable", unavailable),
                ("spec.strategy.rollingUpdate.maxSurge", surge),
            ] {
                match v {
                    IntOrPercent::Percent(p) if p > 100 => push(field, format!("must be at most 100%, got {p}%")),
                    IntOrPercent::Int(n) if n > MAX_REPLICAS => {
                        push(field, format!("must be at most {MAX_REPLICAS}, got {n}"))
                    }
                    _ => {}
                }
            }
            // Kubernetes refuses the pair on the values as written: with
            // neither room to add nor leave to remove, no rollout can move.
            let zero = |v: IntOrPercent| matches!(v, IntOrPercent::Int(0) | IntOrPercent::Percent(0));
            if zero(unavailable) && zero(surge) {
                push("spec.strategy.rollingUpdate.maxUnavailable", "may not be 0 when maxSurge is 0".into());
            }
        }
        (StrategyType::Recreate, None) => {}
    }
    if s.min_ready_seconds > MAX_WORKLOAD_SECONDS {
        push("spec.minReadySeconds", format!("must be at most {MAX_WORKLOAD_SECONDS} (a day)"));
    }
    if let Some(p) = s.progress_deadline_seconds {
        if p == 0 || p > MAX_PROGRESS_DEADLINE_SECONDS {
            push("spec.progressDeadlineSeconds", format!("must be 1 to {MAX_PROGRESS_DEADLINE_SECONDS} (a week)"));
        }
    }
    if s.progress_deadline_seconds() <= s.min_ready_seconds {
        push("spec.progressDeadlineSeconds", "must be greater than minReadySeconds".into());
    }
    if s.revision_history_limit.is_some_and(|r| r > MAX_REVISION_HISTORY) {
        push("spec.revisionHistoryLimit", format!("must be at most {MAX_REVISION_HISTORY}"));
    }
    e.extend(validate_workload(&d.metadata, &s.selector, &s.template));
    e
}

/// What a Deployment and a DaemonSet share: the name (its pods' names must
/// stay DNS-1123 labels), the selector and the template.
pub(crate) fn validate_workload(
    meta: &ObjectMeta,
    selector: &LabelSelector,
    template: &PodTemplate,
) -> Vec<FieldError> {
    let mut e = Vec::new();
    let mut push = |field: &str, message: String| e.push(FieldError { field: field.into(), message });
    let name = &meta.name;
    if !crate::validate::is_dns1123_label(name) {
        push(
            "metadata.name",
            format!("{name:?} is not a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)"),
        );
    } else if name.len() > MAX_WORKLOAD_NAME_LEN {
        push(
            "metadata.name",
            format!("at most {MAX_WORKLOAD_NAME_LEN} characters, so its pods' names fit 63, got {}", name.len()),
        );
    }
    e.extend(crate::validate::meta_problems(meta));
    let mut push = |field: &str, message: String| e.push(FieldError { field: field.into(), message });
    let sel = &selector.match_labels;
    if sel.is_empty() {
        push("spec.selector.matchLabels", "must name at least one label".into());
    }
    let labels = template.metadata.as_ref().map(|m| m.labels.clone()).unwrap_or_default();
    if !sel.is_empty() && !selector.matches(&labels) {
        push("spec.selector.matchLabels", "must match spec.template.metadata.labels".into());
    }
    for k in sel.keys().chain(labels.keys()) {
        if RESERVED_LABELS.contains(&k.as_str()) {
            let at = if sel.contains_key(k) { "spec.selector.matchLabels" } else { "spec.template.metadata.labels" };
            push(at, format!("{k} is set by the server"));
        }
    }
    if template.spec.restart_policy != RestartPolicy::Always {
        push("spec.template.spec.restartPolicy", "a workload's pods run until stopped: Always".into());
    }
    if template.spec.node_name.is_some() {
        push("spec.template.spec.nodeName", "the controller places a workload's pods: leave it unset".into());
    }
    // The pods are pods: a template problem is reported at its place in the
    // workload (a sample pod speaks for all).
    let mut sample = Pod::new("sample", template.spec.clone());
    if let Some(m) = &template.metadata {
        sample.metadata.labels = m.labels.clone();
        sample.metadata.annotations = m.annotations.clone();
    }
    sample.metadata.labels.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
    for f in crate::validate::validate_pod(&sample) {
        let field = match f.field.strip_prefix("metadata.") {
            Some("name") => continue,
            Some(rest) => format!("spec.template.metadata.{rest}"),
            None => match f.field.strip_prefix("spec.") {
                Some(rest) => format!("spec.template.spec.{rest}"),
                None => continue,
            },
        };
        e.push(FieldError { field, message: f.message });
    }
    e
}

#[cfg(test)]
pub(crate) mod tests;
