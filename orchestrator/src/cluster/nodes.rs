//! The rules of nodes: one join per name, a registration that keeps the
//! node's history, and a node's status report merged into the node and its
//! pods (the "confirmed" rule: a pod reported running or done is no longer a
//! binding in flight). Each command runs inside one store write.

use specs::api::{Node, NodeCondition, NodeStatus, NodeStatusReport};
use specs::net::{Ipv4Net, PodRanges};
use specs::{Pod, PodPhase};

use super::pods::{
    is_finished, merge_status, new_pull_failure, new_warning, newly_started, reported_for, WARNING_REASONS,
};
use super::{event, now_rfc3339, ClusterError};
use crate::store::{Claim, Store, Txn};

/// The claim space of node names taken by a join (`Txn::claim`).
const JOIN_CLAIMS: &str = "join";

/// The claim space of pod ranges: one claim per node name, held by the
/// node's range (`A.B.C.D/N`); taken in the registration's write, released
/// in the delete's, so no two nodes hold overlapping ranges, on sled or etcd.
const POD_RANGE_CLAIMS: &str = "podcidr";

/// The claim space of the nodes' CPU counts: one claim per node name, held
/// by its count in decimal, written with its registration and released with
/// its delete, so a job's size against the cluster (fair share) is read from
/// small records instead of every node's whole topology.
const NODE_CPUS: &str = "node-cpus";

/// The CPUs of every registered node together, from their counts; every
/// node's topology only when some node has no count (registered before the
/// counts were kept).
pub fn cluster_cpus(t: &Txn<'_>) -> Result<usize, ClusterError> {
    let counts = t.claims(NODE_CPUS)?;
    if counts.len() == t.count::<Node>()? {
        let parsed: Option<Vec<usize>> =
            counts.iter().map(|(_, c)| std::str::from_utf8(c).ok().and_then(|c| c.parse().ok())).collect();
        if let Some(parsed) = parsed {
            return Ok(parsed.iter().sum());
        }
    }
    Ok(t.list::<Node>()?.iter().map(|n| n.spec.topology.cpus.len()).sum())
}

/// The shortest join record (`JoinRequest::attempt`) that may stand in for a
/// token: 128 random bits in hex. Nodes make 256 (`new_join_attempt`).
const JOIN_RECORD_HEX_DIGITS: usize = 32;

/// A join claim's holder: the SHA-256 of the node's join record (the record
/// itself, a secret, is never stored) and the incarnation its certificates
/// carry, `DIGEST/INCARNATION`. The incarnation is fresh at each new claim,
/// so a node deleted and joined again, even with the same record, makes the
/// certificates of its earlier life useless.
fn holder(attempt: &str, incarnation: &str) -> Vec<u8> {
    format!("{}/{incarnation}", pinion_wire::tls::sha256_hex(attempt.as_bytes())).into_bytes()
}

/// Whether `attempt` is the join record of the claim's holder. A claim made
/// before holders carried a digest holds the attempt itself.
fn held_by(held: &[u8], attempt: &str) -> bool {
    let held = String::from_utf8_lossy(held);
    match held.split_once('/') {
        Some((digest, _)) => crate::tls::token_matches(&pinion_wire::tls::sha256_hex(attempt.as_bytes()), digest),
        None => !attempt.is_empty() && crate::tls::token_matches(attempt, &held),
    }
}

/// The incarnation a claim's holder stands for: empty for a claim made
/// before incarnations (its certificates carry none).
fn incarnation_of(held: &[u8]) -> String {
    let held = String::from_utf8_lossy(held);
    held.split_once('/').map(|(_, i)| i.to_string()).unwrap_or_default()
}

/// The incarnation a certificate of node `name` must carry (its subject's
/// OU; empty: none) to act for it now; `None` when no join holds the name
/// (deleted, or never joined): then no certificate of that name may.
pub fn incarnation(store: &Store, name: &str) -> Result<Option<String>, ClusterError> {
    Ok(store.claim_holder(JOIN_CLAIMS, name)?.map(|h| incarnation_of(&h)))
}

/// What a join proved: a token (checked and spent in the same write), or
/// nothing but its join record.
#[derive(Debug, Clone)]
pub struct JoinProof {
    /// `(token id, hex SHA-256 of its secret)`; the id `None` for the
    /// bootstrap token's form `PIN.SECRET`.
    pub token: Option<(Option<String>, String)>,
    /// The node's join record (`JoinRequest::attempt`).
    pub attempt: String,
    /// The incarnation a new claim takes (random, chosen by the caller).
    pub new_incarnation: String,
}

/// A join's outcome: whether the name was claimed now, and the incarnation
/// the node's certificate carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub claim: Claim,
    pub incarnation: String,
}

/// A join, in one write: a node presenting the join record that holds its
/// name's claim joins again (a lost reply's retry, or a node whose
/// certificate expired while it was cut off), registered or not, with no
/// token; anyone else needs a valid token, which is spent (one use) only
/// when the name is free and claimed now. A node joins only under a name not
/// already held.
pub fn join(
    t: &mut Txn<'_>,
    name: &str,
    proof: &JoinProof,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Joined, ClusterError> {
    let held = t.claim_holder(JOIN_CLAIMS, name)?;
    let record_ok = proof.attempt.len() >= JOIN_RECORD_HEX_DIGITS;
    if let Some(h) = &held {
        if record_ok && held_by(h, &proof.attempt) {
            return Ok(Joined { claim: Claim::Again, incarnation: incarnation_of(h) });
        }
    }
    let Some((id, digest)) = &proof.token else {
        return Err(ClusterError::Unauthorized(
            "join needs a join token as `Authorization: Bearer TOKEN` (or this node's join record, for a name it holds)".into(),
        ));
    };
    super::tokens::spend(t, id.as_deref(), digest, now)?;
    let claim = claim_name(t, name, proof)?;
    Ok(Joined { claim, incarnation: proof.new_incarnation.clone() })
}

/// Claims `name` for a join's record. The token admits new machines; it must
/// not mint a second identity for a node that already joined (that would be
/// impersonation), so of two joins racing for a name exactly one gets it.
fn claim_name(t: &mut Txn<'_>, name: &str, proof: &JoinProof) -> Result<Claim, ClusterError> {
    // A node registered before claims existed has no claim.
    let claim = match t.get::<Node>(name)? {
        Some(_) => Claim::Taken,
        None => t.claim(JOIN_CLAIMS, name, &holder(&proof.attempt, &proof.new_incarnation))?,
    };
    if claim == Claim::Taken {
        return Err(ClusterError::Conflict(format!(
            "node {name:?} has already joined; to join a machine again under that name, delete the node first (pinion delete node {name})"
        )));
    }
    Ok(claim)
}

/// Frees a name a join claimed and issued nothing for.
pub fn release_name(t: &mut Txn<'_>, name: &str) -> Result<bool, ClusterError> {
    Ok(t.release(JOIN_CLAIMS, name)?)
}

/// Stores a node's registration, Ready. Registering again brings new
/// topology, settings, labels and address, and keeps the node's history
/// (uid, age, allocations) and its pod range. The range (`spec.podCIDR`) is
/// the server's: a new node gets the lowest free one of `ranges`, and what
/// the node sent there is ignored. Returns whether the node is new.
pub fn register(t: &mut Txn<'_>, given: &Node, ranges: &PodRanges) -> Result<(bool, Node), ClusterError> {
    let mut node = given.clone();
    let name = node.metadata.name.clone();
    let (range, replaced) = pod_range(t, &name, ranges)?;
    node.spec.pod_cidr = Some(range.to_string());
    let new = match t.get::<Node>(&name)? {
        Some(existing) => {
            node.metadata.uid = existing.metadata.uid;
            node.metadata.creation_timestamp = existing.metadata.creation_timestamp;
            node.status.allocations = existing.status.allocations;
            false
        }
        None => {
            node.metadata.creation_timestamp = Some(now_rfc3339());
            true
        }
    };
    node.status.condition = NodeCondition::Ready;
    node.status.last_report = Some(now_rfc3339());
    summarize(&mut node);
    t.put(&mut node)?;
    t.release(NODE_CPUS, &name)?;
    t.claim(NODE_CPUS, &name, node.spec.topology.cpus.len().to_string().as_bytes())?;
    t.add_event(event("Node", &name, "Normal", "Registered", "node registered"))?;
    if let Some(old) = replaced {
        let message = format!(
            "its pod range {old} is not a /{} of the cluster range {} (--pod-cidr, --node-cidr-mask-size); it has {range} now",
            ranges.node_prefix(),
            ranges.cluster()
        );
        t.add_event(event("Node", &name, "Warning", "PodCIDRChanged", message))?;
    }
    Ok((new, node))
}

/// The node's pod range: the one it holds while that is one of `ranges`,
/// else the lowest one no other node's range overlaps, claimed now (with
/// the range it replaces, one of other flags). Every server of a cluster is
/// meant to run with the same ranges.
fn pod_range(t: &mut Txn<'_>, name: &str, ranges: &PodRanges) -> Result<(Ipv4Net, Option<Ipv4Net>), ClusterError> {
    let claims = t.claims(POD_RANGE_CLAIMS)?;
    let mut held = None;
    let mut taken = Vec::with_capacity(claims.len());
    for (holder, range) in &claims {
        let Some(range) = std::str::from_utf8(range).ok().and_then(|r| r.parse::<Ipv4Net>().ok()) else {
            tracing::warn!(node = %holder, "a stored pod range claim cannot be read; it is ignored");
            continue;
        };
        if holder == name {
            held = Some(range);
        } else {
            taken.push(range);
        }
    }
    if let Some(range) = held.filter(|r| ranges.holds(*r)) {
        return Ok((range, None));
    }
    let Some(range) = ranges.next_free(&taken) else {
        return Err(ClusterError::PodRangesExhausted(format!(
            "no free /{} pod range is left in the cluster range {} ({} nodes hold one): delete a node that is gone, or run the servers with a larger --pod-cidr or a longer --node-cidr-mask-size",
            ranges.node_prefix(),
            ranges.cluster(),
            taken.len()
        )));
    };
    t.release(POD_RANGE_CLAIMS, name)?;
    t.claim(POD_RANGE_CLAIMS, name, range.to_string().as_bytes())?;
    Ok((range, held))
}

/// What a node delete removed.
#[derive(Debug)]
pub enum Deleted {
    Node(Box<Node>),
    /// Joined but never registered (only its name was held), or unreadable.
    NameOnly,
}

/// Removes the node, its join claim (so the machine can join again) and
/// its pod range (the next node may get it); an unreadable record (lists
/// skip it) is removed as well.
pub fn delete(t: &mut Txn<'_>, name: &str) -> Result<Deleted, ClusterError> {
    let purged = t.purge_unreadable::<Node>(name)?;
    let node = if purged { None } else { t.delete::<Node>(name)? };
    t.release(POD_RANGE_CLAIMS, name)?;
    t.release(NODE_CPUS, name)?;
    let claimed = t.release(JOIN_CLAIMS, name)? || purged;
    match (node, claimed) {
        (Some(node), _) => Ok(Deleted::Node(Box::new(node))),
        (None, true) => Ok(Deleted::NameOnly),
        (None, false) => Err(ClusterError::not_found("Node", name)),
    }
}

/// What a node's status report changed.
#[derive(Debug)]
pub struct Reported {
    pub node: Node,
    /// Pods the node admitted (running or done): their bindings are no longer in flight.
    pub confirmed: Vec<String>,
    /// Pods this report finished.
    pub finished: Vec<Pod>,
}

/// A node's report: its allocations are the node's truth, it is Ready, and
/// each pod still bound to it takes the reported status (one event when a
/// placement stops fitting the node's settings). A pod bound elsewhere, or a
/// report about an earlier pod of the name, is left alone.
pub fn report(t: &mut Txn<'_>, name: &str, report: &NodeStatusReport) -> Result<Reported, ClusterError> {
    let Some(mut node) = t.get::<Node>(name)? else { return Err(ClusterError::not_found("Node", name)) };
    let (mut confirmed, mut finished) = (Vec::new(), Vec::new());
    let was_ready = node.status.condition == NodeCondition::Ready;
    node.status.allocations = report.allocations.clone();
    node.status.condition = NodeCondition::Ready;
    node.status.last_report = Some(now_rfc3339());
    node.status.offline_cpus = report.offline_cpus.clone();
    // One event per condition the node did not report before (not one per report).
    let new_conditions: Vec<_> =
        report.conditions.iter().filter(|c| !node.status.conditions.contains(c)).cloned().collect();
    node.status.conditions = report.conditions.clone();
    node.status.terminating = report.terminating.clone();
    summarize(&mut node);
    t.put(&mut node)?;
    if !was_ready {
        t.add_event(event("Node", name, "Normal", "NodeReady", "status reports resumed"))?;
    }
    for c in new_conditions {
        let message = match &c.fix {
            Some(fix) => format!("{}: {} (fix: {fix})", c.short(), c.message),
            None => format!("{}: {}", c.short(), c.message),
        };
        t.add_event(event("Node", name, "Warning", &c.reason, message))?;
    }
    for (pod_name, status) in &report.pods {
        let Some(mut pod) = t.get::<Pod>(pod_name)? else { continue };
        if pod.spec.node_name.as_deref() != Some(name) || !reported_for(status, &pod) {
            continue;
        }
        if matches!(status.phase, PodPhase::Running | PodPhase::Succeeded | PodPhase::Failed) {
            confirmed.push(pod_name.clone());
        }
        let before = pod.status.clone();
        let was_finished = is_finished(&pod);
        if merge_status(&mut pod, status.clone()).is_ok() && pod.status != before {
            for reason in WARNING_REASONS {
                if let Some(message) = new_warning(before.as_ref(), pod.status.as_ref(), reason) {
                    t.add_event(event("Pod", pod_name, "Warning", reason, message))?;
                }
            }
            if let Some(message) = new_pull_failure(before.as_ref(), pod.status.as_ref()) {
                t.add_event(event("Pod", pod_name, "Warning", "Failed", format!("on {name}: {message}")))?;
            }
            for c in newly_started(before.as_ref(), pod.status.as_ref()) {
                t.add_event(event("Pod", pod_name, "Normal", "Started", format!("started container {c} on {name}")))?;
            }
            t.put(&mut pod)?;
            if !was_finished && is_finished(&pod) {
                super::acct::pod_ended(t, &pod, false)?;
                finished.push(pod);
            }
        }
    }
    Ok(Reported { node, confirmed, finished })
}

/// Stores a node's report in as few writes as the store takes. A report
/// whose pods make one write larger than the store allows (etcd's operations
/// per transaction: each finished pod is its status, its accounting record
/// and its events) goes in halves, each with the node's own fields, so a node
/// that finished many pods at once is not refused on every retry.
pub async fn report_in_writes(store: &Store, name: &str, whole: NodeStatusReport) -> Result<Reported, ClusterError> {
    let mut parts = vec![whole];
    let mut out: Option<Reported> = None;
    while let Some(part) = parts.pop() {
        let (n, p) = (name.to_string(), part.clone());
        match store.write(move |t| report(t, &n, &p)).await {
            Ok(r) => match &mut out {
                None => out = Some(r),
                Some(o) => {
                    o.node = r.node;
                    o.confirmed.extend(r.confirmed);
                    o.finished.extend(r.finished);
                }
            },
            Err(ClusterError::Store(crate::store::StoreError::TooLarge { .. })) if part.pods.len() > 1 => {
                let mut first = part.clone();
                let second_pods = first.pods.split_off(&nth_key(&part.pods, part.pods.len() / 2));
                parts.push(NodeStatusReport { pods: second_pods, ..part });
                parts.push(first);
            }
            Err(e) => return Err(e),
        }
    }
    out.ok_or_else(|| ClusterError::Internal("a node report of no parts".into()))
}

/// The `n`th key of a map (`n` < its length).
fn nth_key<V>(map: &std::collections::BTreeMap<String, V>, n: usize) -> String {
    map.keys().nth(n).cloned().unwrap_or_default()
}

/// Heartbeats resumed: a NotReady node is Ready again. `None` for a node not stored.
pub fn mark_ready(t: &mut Txn<'_>, name: &str) -> Result<Option<Node>, ClusterError> {
    let Some(mut node) = t.get::<Node>(name)? else { return Ok(None) };
    node.status.condition = NodeCondition::Ready;
    node.status.not_ready_since = None;
    t.put(&mut node)?;
    t.add_event(event("Node", name, "Normal", "NodeReady", "heartbeats resumed"))?;
    Ok(Some(node))
}

/// No heartbeat within `grace`: the node is NotReady, and each of `pods`
/// still bound to it and not finished is Unknown (`NodeLost`), left running
/// where it is. `since` (unix seconds) is recorded as when it went
/// NotReady, unless an earlier time is. `None` for a node not stored.
pub fn mark_lost(
    t: &mut Txn<'_>,
    name: &str,
    pods: &[String],
    grace: std::time::Duration,
    since: u64,
) -> Result<Option<Node>, ClusterError> {
    let Some(mut node) = t.get::<Node>(name)? else { return Ok(None) };
    node.status.condition = NodeCondition::NotReady;
    node.status.not_ready_since = Some(node.status.not_ready_since.map_or(since, |t| t.min(since)));
    t.put(&mut node)?;
    let message =
        format!("no heartbeat for more than {}s; its pods are left running and marked Unknown", grace.as_secs_f64());
    t.add_event(event("Node", name, "Warning", "NodeNotReady", message))?;
    for p in pods {
        let Some(mut pod) = t.get::<Pod>(p)? else { continue };
        if pod.spec.node_name.as_deref() != Some(name) {
            continue;
        }
        let s = pod.status.get_or_insert_with(specs::PodStatus::default);
        if s.phase.is_terminal() {
            continue;
        }
        s.phase = PodPhase::Unknown;
        s.reason = Some("NodeLost".into());
        s.message = Some(format!("node {name} stopped reporting"));
        // Nobody vouches for it now (the kubelet's pods turn Ready=False
        // too): a rollout must not count it as available. The node's first
        // report after it is back is a full one and says again.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        for c in s.conditions.iter_mut().filter(|c| c.kind == specs::status::POD_READY) {
            if c.status != specs::api::ConditionStatus::False {
                c.status = specs::api::ConditionStatus::False;
                c.last_transition_time = Some(now);
            }
        }
        for c in &mut s.container_statuses {
            c.ready = false;
        }
        t.put(&mut pod)?;
        t.add_event(event("Pod", p, "Warning", "NodeLost", format!("node {name} is NotReady")))?;
    }
    Ok(Some(node))
}

/// What a delete answers for a node that joined but never registered.
pub fn joined_only(name: &str) -> Node {
    Node {
        api_version: specs::pod::API_VERSION.to_string(),
        kind: "Node".into(),
        metadata: specs::pod::ObjectMeta { name: name.to_string(), ..Default::default() },
        spec: Default::default(),
        status: Default::default(),
    }
}

fn summarize(node: &mut Node) {
    node.status.numa = NodeStatus::numa_summary(
        &node.spec.topology,
        &node.spec.settings,
        &node.status.allocations,
        &node.status.offline_cpus,
    );
}

/// A deleted pod its node is still stopping, as a pod to list: `Terminating`,
/// on its node, with its grace's end, so that `get pods` shows what still
/// holds the node's CPUs (it left the store when it was deleted).
pub fn stopping_pod(node: &str, t: &specs::api::TerminatingPod) -> Pod {
    Pod {
        api_version: specs::pod::API_VERSION.to_string(),
        kind: "Pod".into(),
        metadata: specs::pod::ObjectMeta {
            name: t.name.clone(),
            owner: t.owner.clone(),
            labels: t.labels.clone(),
            ..Default::default()
        },
        spec: specs::pod::PodSpec { node_name: Some(node.to_string()), ..Default::default() },
        status: Some(specs::PodStatus {
            phase: PodPhase::Running,
            node_name: Some(node.to_string()),
            reason: Some(specs::status::TERMINATING.into()),
            message: Some(format!("deleted; node {node} is stopping it and holds its resources until it has")),
            grace_ends: t.grace_ends.clone(),
            ..Default::default()
        }),
    }
}

/// The pods each stored node is stopping, by node (what a server that does
/// not run the controller reads; the controller keeps them in memory).
pub fn terminating(store: &Store) -> Result<Vec<(String, specs::api::TerminatingPod)>, crate::store::StoreError> {
    let nodes = store.list::<Node>()?.items;
    Ok(nodes
        .into_iter()
        .flat_map(|n| {
            let name = n.metadata.name;
            n.status.terminating.into_iter().map(move |t| (name.clone(), t))
        })
        .collect())
}
