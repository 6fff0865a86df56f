//! The topology-aware scheduler: filter stages, then score stages, over the
//! admission engine in `specs`, on per-node mirrors of the nodes' allocations.
//!
//! Pure logic, no I/O and no clock of its own (callers pass `now`). The
//! scheduler is a plain `&mut self` state machine: the server owns it in one
//! task (or behind one `Mutex`) and calls [`Scheduler::schedule`] for one pod at
//! a time. Each call records the chosen placement in the node's mirror before it
//! returns, so the next call already sees it: binds are serialized, and two pods
//! can never be handed the same CPU. If the server fails to persist a binding
//! it calls [`Scheduler::release`] to give the allocation back.
//!
//! The mirror of a node is the node's last reported truth plus the pods bound
//! here and not yet reflected in a report ("assumed" pods, as in
//! kube-scheduler's cache). This is the one record of in-flight bindings: an
//! assumed pod leaves when a report shows it ([`Scheduler::on_node_report`]),
//! when the node confirms it otherwise ([`Scheduler::confirm`]), when the node
//! rejects it, or when [`Scheduler::expire_assumed`] finds it older than
//! `SchedulerConfig::assume_expiry` (its capacity returns to the mirror and the
//! caller requeues the pod).

mod demand;
mod filter;
mod gang;
mod score;
mod summary;

#[cfg(test)]
mod props;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinion_wire::backoff::Doubling;
use serde::{Deserialize, Serialize};
use specs::pod::SchedulingStrategy;
use specs::{Allocations, NodeSettings, NodeTopology, Placement, Pod, Rejection};

use demand::Demand;
pub use filter::ReasonKind;
use filter::{Detail, Quick};
pub use gang::GangRequest;
use summary::{Hot, NodeSummary};

/// What the scheduler knows about one node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub topology: Arc<NodeTopology>,
    pub settings: NodeSettings,
    pub allocations: Allocations,
    pub ready: bool,
}

/// A pod bound to a node with the full plan and the epoch it was computed against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    pub node: String,
    pub epoch: u64,
    pub placement: Placement,
}

impl Binding {
    /// The epoch of a binding made without a plan (topology-blind mode): it never
    /// matches a node's epoch, so the nodelet always runs the engine on its truth.
    pub const NO_PLAN: u64 = u64::MAX;

    /// Whether the binding carries a placement the nodelet may adopt as is.
    pub fn has_plan(&self) -> bool {
        self.epoch != Self::NO_PLAN
    }
}

/// No node can take the pod: a summary line and each node's best option.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{message}")]
pub struct Unschedulable {
    /// "0/3 nodes fit: 2 topology affinity, 1 not ready".
    pub message: String,
    /// Node name -> why it cannot take the pod, with its best option.
    pub per_node: BTreeMap<String, String>,
    /// How many nodes were ruled out for each reason.
    #[serde(default)]
    pub counts: BTreeMap<ReasonKind, usize>,
    /// The nodes ruled out for what they have free (CPUs, memory, huge
    /// pages, devices, their alignment): where a pod still stopping may be
    /// what the pod waits for.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub short_of_resources: BTreeSet<String>,
}

/// One node's figures per NUMA node (`Scheduler::capacity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCapacity {
    pub name: String,
    pub numa: Vec<NumaFigures>,
}

/// One NUMA node's capacity and what is free of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaFigures {
    pub id: u32,
    /// CPUs that may be handed out (not reserved).
    pub cpus: u32,
    /// Of those, not held exclusively.
    pub free_cpus: u32,
    pub memory_bytes: u64,
    pub free_memory_bytes: u64,
    /// All page sizes together.
    pub hugepages_bytes: u64,
    pub free_hugepages_bytes: u64,
}

/// The engine the scheduler confirms candidates with: `specs::admit` in
/// production; passed in explicitly so that a unit test can substitute its own.
pub type AdmitFn = fn(&NodeTopology, &NodeSettings, &Allocations, &str, &Pod) -> Result<Placement, Rejection>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Off: see only node totals and bind without a plan, as the Kubernetes
    /// scheduler does (for showing the knowledge gap; the nodelet decides).
    pub topology_aware: bool,
    /// The cluster's strategy; a pod's `spec.schedulingStrategy` overrides it.
    pub default_strategy: SchedulingStrategy,
    /// How long a binding may stay unconfirmed (not in the node's reports, not
    /// rejected) before it expires and its capacity returns to the mirror.
    pub assume_expiry: Duration,
    /// First delay after a node rejects a pod; doubles per rejection up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            topology_aware: true,
            default_strategy: SchedulingStrategy::LeastAllocated,
            assume_expiry: Duration::from_secs(30),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }
}

#[derive(Debug)]
struct NodeState {
    /// `info.allocations` is the mirror: truth plus assumed pods.
    info: NodeInfo,
    /// The node's last reported allocations.
    truth: Allocations,
    /// The summary of the node with nothing allocated (what it could ever admit).
    empty: NodeSummary,
    /// Pods bound here and not yet in a report, in bind order (so that re-applying
    /// them on top of a report advances the epoch as the nodelet will).
    assumed: Vec<Assumed>,
    summary: NodeSummary,
    /// Advanced on every change of the mirror; a pod the node rejected is not
    /// sent back to it until this moves on.
    generation: u64,
}

impl NodeState {
    /// The mirror again from the truth plus the assumed pods in bind order, so
    /// its epoch is the one the node will have once it adopts them.
    fn rebuild_mirror(&mut self) {
        let mut old = std::mem::take(&mut self.info.allocations);
        let mut mirror = self.truth.clone();
        for a in &self.assumed {
            if let Some(p) = old.pods.remove(&a.pod_key) {
                mirror.apply(&a.pod_key, p);
            }
        }
        self.info.allocations = mirror;
    }
}

#[derive(Debug)]
struct Assumed {
    pod_key: String,
    /// When the binding expires unless the node confirms it first.
    expires: Instant,
}

#[derive(Debug)]
struct PodRecord {
    node: String,
    epoch: u64,
    demand: Demand,
    /// Bound without a placement (topology-blind mode).
    blind: bool,
}

#[derive(Debug, Default)]
struct Retry {
    attempts: u32,
    retry_at: Option<Instant>,
    last_reason: String,
    /// Node -> its generation right after it rejected this pod.
    stale: Vec<(String, u64)>,
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    admit: AdmitFn,
    nodes: Vec<NodeState>,
    /// `hot[i]` is `nodes[i]`'s packed summary (see `Hot`).
    hot: Vec<Hot>,
    /// `rank[i]`: position of `nodes[i]`'s name in name order, the tie-break.
    rank: Vec<u32>,
    ranks_dirty: bool,
    index: HashMap<String, usize>,
    pods: HashMap<String, PodRecord>,
    retries: HashMap<String, Retry>,
    /// Hashes of specs some node could run when empty (`never_fits`); cleared
    /// when a node leaves or its machine or labels change.
    fits_some_node: std::collections::HashSet<u64>,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new(SchedulerConfig::default())
    }
}

/// A node that passed the filters, with its score.
#[derive(Clone, Copy)]
struct Candidate {
    /// Finite (capacities are integers, reciprocals of non-zero integers).
    score: f64,
    rank: u32,
    node: usize,
}

impl Candidate {
    /// Highest score first, then the name that sorts first.
    fn better_than(&self, other: &Candidate) -> bool {
        self.score > other.score || (self.score == other.score && self.rank < other.rank)
    }
}

trait BestSoFar {
    fn is_none_or_worse_than(&self, c: &Candidate) -> bool;
}

impl BestSoFar for Option<Candidate> {
    fn is_none_or_worse_than(&self, c: &Candidate) -> bool {
        match self {
            None => true,
            Some(b) => c.better_than(b),
        }
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler::with_engine(config, specs::admit)
    }

    pub fn with_engine(config: SchedulerConfig, admit: AdmitFn) -> Self {
        Scheduler {
            config,
            admit,
            nodes: Vec::new(),
            hot: Vec::new(),
            rank: Vec::new(),
            ranks_dirty: false,
            index: HashMap::new(),
            pods: HashMap::new(),
            retries: HashMap::new(),
            fits_some_node: Default::default(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Adds a node, or updates one: labels, topology, settings and readiness are
    /// replaced, and its allocations are taken as a report of its truth.
    pub fn upsert_node(&mut self, node: NodeInfo) {
        match self.index.get(&node.name).copied() {
            Some(i) => {
                let n = &mut self.nodes[i];
                // Only a change that can alter the engine's answer counts as a new
                // state (a heartbeat re-sending the same node does not).
                let same_machine = (Arc::ptr_eq(&n.info.topology, &node.topology) || n.info.topology == node.topology)
                    && n.info.settings == node.settings;
                if !same_machine || n.info.labels != node.labels {
                    self.fits_some_node.clear();
                }
                if !same_machine {
                    n.generation += 1;
                    n.empty = NodeSummary::compute(
                        &node.topology,
                        &node.settings,
                        &Allocations::default(),
                        std::iter::empty(),
                    );
                }
                n.info.labels = node.labels;
                n.info.topology = node.topology;
                n.info.settings = node.settings;
                n.info.ready = node.ready;
                self.report(i, node.allocations);
            }
            None => {
                let i = self.nodes.len();
                self.index.insert(node.name.clone(), i);
                let empty =
                    NodeSummary::compute(&node.topology, &node.settings, &Allocations::default(), std::iter::empty());
                self.nodes.push(NodeState {
                    truth: node.allocations.clone(),
                    empty,
                    info: node,
                    assumed: Vec::new(),
                    summary: NodeSummary::default(),
                    generation: 0,
                });
                self.hot.push(Hot::of(&NodeSummary::default(), false, false, &NodeSettings::default()));
                self.rank.push(0);
                self.ranks_dirty = true;
                self.refresh(i);
            }
        }
    }

    /// Forgets a node and the bindings this scheduler made to it.
    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.index.remove(name) else { return };
        self.fits_some_node.clear();
        self.nodes.swap_remove(i);
        self.hot.swap_remove(i);
        self.rank.swap_remove(i);
        self.ranks_dirty = true;
        if let Some(moved) = self.nodes.get(i) {
            self.index.insert(moved.info.name.clone(), i);
        }
        self.pods.retain(|_, p| p.node != name);
    }

    /// The node's truth arrived: its mirror becomes that truth plus the pods bound
    /// here and not yet in it. Returns whether the mirror changed.
    pub fn on_node_report(&mut self, name: &str, allocations: Allocations) -> bool {
        match self.index.get(name) {
            Some(&i) => self.report(i, allocations),
            None => false,
        }
    }

    fn report(&mut self, i: usize, truth: Allocations) -> bool {
        let node = &mut self.nodes[i];
        let mut old_mirror = std::mem::take(&mut node.info.allocations);
        let mut mirror = truth.clone();
        let mut changed = truth != node.truth;
        node.assumed.retain_mut(|a| {
            if truth.pods.contains_key(&a.pod_key) {
                changed = true;
                return false; // reflected: the node holds it now
            }
            if let Some(p) = old_mirror.pods.remove(&a.pod_key) {
                mirror.apply(&a.pod_key, p);
            }
            true
        });
        node.info.allocations = mirror;
        node.truth = truth;
        if changed {
            node.generation += 1;
        }
        self.refresh(i);
        changed
    }

    /// The node reported the pod's status (it knows the binding) in a report
    /// whose allocations were taken at the same moment: the assumed entry goes,
    /// and the pod weighs on the mirror only as far as that truth holds it (a
    /// short pod may start and finish between two reports). Returns whether the
    /// pod was assumed.
    pub fn confirm(&mut self, pod_key: &str) -> bool {
        let Some(rec) = self.pods.get(pod_key) else { return false };
        let Some(&i) = self.index.get(&rec.node) else { return false };
        let node = &mut self.nodes[i];
        let before = node.assumed.len();
        node.assumed.retain(|a| a.pod_key != pod_key);
        if node.assumed.len() == before {
            return false;
        }
        node.rebuild_mirror();
        if !node.truth.pods.contains_key(pod_key) {
            self.pods.remove(pod_key);
        }
        node.generation += 1;
        self.refresh(i);
        true
    }

    /// Drops the bindings no node confirmed within `assume_expiry`: their
    /// capacity returns to the mirrors. Returns `(pod, node)` for each, for the
    /// caller to requeue.
    pub fn expire_assumed(&mut self, now: Instant) -> Vec<(String, String)> {
        let mut expired = Vec::new();
        for i in 0..self.nodes.len() {
            if !self.nodes[i].assumed.iter().any(|a| a.expires <= now) {
                continue;
            }
            let name = self.nodes[i].info.name.clone();
            let keys: Vec<String> =
                self.nodes[i].assumed.iter().filter(|a| a.expires <= now).map(|a| a.pod_key.clone()).collect();
            for key in keys {
                tracing::warn!(pod = %key, node = %name, "binding expired: the node never confirmed it");
                self.unbind(&key);
                expired.push((key, name.clone()));
            }
        }
        expired
    }

    /// When the oldest unconfirmed binding expires (for the caller's timer).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.nodes.iter().flat_map(|n| n.assumed.iter().map(|a| a.expires)).min()
    }

    /// Records a binding made before (a restarted server reloading a bound pod
    /// the node has not reported yet): the pod is assumed on `node` with the
    /// placement of its plan (none in topology-blind mode), expiring
    /// `assume_expiry` after `now`. Returns false for an unknown node.
    pub fn assume(
        &mut self,
        pod_key: &str,
        pod: &Pod,
        node: &str,
        plan: Option<(u64, Placement)>,
        now: Instant,
    ) -> bool {
        let Some(&i) = self.index.get(node) else { return false };
        if self.pods.contains_key(pod_key) || self.nodes[i].truth.pods.contains_key(pod_key) {
            return true;
        }
        let demand = Demand::of(pod);
        let n = &mut self.nodes[i];
        let (epoch, blind) = match plan {
            Some((epoch, placement)) => {
                n.info.allocations.apply(pod_key, placement);
                (epoch, false)
            }
            None => (Binding::NO_PLAN, true),
        };
        n.assumed.push(Assumed { pod_key: pod_key.to_string(), expires: now + self.config.assume_expiry });
        n.generation += 1;
        self.pods.insert(pod_key.to_string(), PodRecord { node: node.to_string(), epoch, demand, blind });
        self.refresh(i);
        true
    }

    /// Why no registered node could ever admit the pod, even with nothing
    /// allocated (labels, then totals, then per NUMA node, then the engine on
    /// the empty node): node name -> reason. `None` when some node could, or
    /// when no node is registered (a cluster still starting). Readiness is
    /// ignored: it is transient.
    pub fn never_fits(&mut self, pod_key: &str, pod: &Pod) -> Option<BTreeMap<String, String>> {
        if self.nodes.is_empty() {
            return None;
        }
        // Most pods fit the first node tried, but that try runs the engine:
        // remembered per spec, so a stream of equal pods pays it once.
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            serde_json::to_string(&pod.spec).unwrap_or_default().hash(&mut h);
            h.finish()
        };
        if self.fits_some_node.contains(&key) {
            return None;
        }
        let reasons = self.never_fits_uncached(pod_key, pod);
        if reasons.is_none() {
            self.fits_some_node.insert(key);
        }
        reasons
    }

    fn never_fits_uncached(&self, pod_key: &str, pod: &Pod) -> Option<BTreeMap<String, String>> {
        let demand = Demand::of(pod);
        let empty = Allocations::default();
        let mut reasons = BTreeMap::new();
        for node in &self.nodes {
            let why = match filter::node_selector(pod, &node.info.labels)
                .and_then(|()| filter::totals(&node.empty, &demand))
                .and_then(|()| {
                    if self.config.topology_aware {
                        filter::numa(&node.empty, &demand, &node.info.settings)
                    } else {
                        Ok(())
                    }
                }) {
                Err(d) => filter::OnEmptyNode(d).to_string(),
                Ok(()) if !self.config.topology_aware => return None,
                Ok(()) => match (self.admit)(&node.info.topology, &node.info.settings, &empty, pod_key, pod) {
                    Ok(_) => return None,
                    Err(r) => r.message,
                },
            };
            reasons.insert(node.info.name.clone(), why);
        }
        Some(reasons)
    }

    /// Recomputes a node's summary from its mirror.
    fn refresh(&mut self, i: usize) {
        let node = &self.nodes[i];
        let pods = &self.pods;
        let name = &node.info.name;
        let blind = node
            .assumed
            .iter()
            .filter_map(|a| pods.get(&a.pod_key))
            .filter(|p| p.blind && &p.node == name)
            .map(|p| &p.demand.total);
        let s = NodeSummary::compute(&node.info.topology, &node.info.settings, &node.info.allocations, blind);
        self.hot[i] = Hot::of(&s, node.info.ready, !node.info.labels.is_empty(), &node.info.settings);
        self.nodes[i].summary = s;
    }

    fn rerank(&mut self) {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_unstable_by(|a, b| self.nodes[*a].info.name.cmp(&self.nodes[*b].info.name));
        for (rank, i) in order.into_iter().enumerate() {
            self.rank[i] = rank as u32;
        }
        self.ranks_dirty = false;
    }

    /// The binding this scheduler made for a pod, while the node's mirror still
    /// holds the pod (assumed, or in the node's truth). A binding the node has
    /// dropped (it refused or finished the pod) is no binding.
    pub fn binding(&self, pod_key: &str) -> Option<Binding> {
        let rec = self.pods.get(pod_key)?;
        let node = &self.nodes[*self.index.get(&rec.node)?];
        let held = node.info.allocations.pods.get(pod_key);
        let placement = if rec.blind {
            if held.is_none() && !node.assumed.iter().any(|a| a.pod_key == pod_key) {
                return None;
            }
            Placement::default()
        } else {
            held?.clone()
        };
        Some(Binding { node: rec.node.clone(), epoch: rec.epoch, placement })
    }

    /// Every node's capacity and what is free per NUMA node, from the
    /// summaries the filters read (the mirror: in-flight bindings count as
    /// taken), for the metrics' scrape.
    pub fn capacity(&self) -> Vec<NodeCapacity> {
        let hugepages = |h: &[(u64, u64)]| h.iter().map(|(_, bytes)| *bytes).sum::<u64>();
        self.nodes
            .iter()
            .map(|n| NodeCapacity {
                name: n.info.name.clone(),
                numa: n
                    .empty
                    .numa
                    .iter()
                    .zip(&n.summary.numa)
                    .map(|(all, free)| NumaFigures {
                        id: all.id,
                        cpus: all.cpu_capacity,
                        free_cpus: free.free_cpus,
                        memory_bytes: all.free_memory,
                        free_memory_bytes: free.free_memory,
                        hugepages_bytes: hugepages(&all.free_hugepages),
                        free_hugepages_bytes: hugepages(&free.free_hugepages),
                    })
                    .collect(),
            })
            .collect()
    }

    /// A node's mirror (truth plus assumed pods).
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|&i| &self.nodes[i].info)
    }

    /// The pod is gone (deleted, finished, or its binding could not be stored):
    /// forget its binding and backoff. Resources it holds in the node's reported
    /// truth stay counted until the node reports them free. Returns its node.
    pub fn release(&mut self, pod_key: &str) -> Option<String> {
        self.retries.remove(pod_key);
        self.unbind(pod_key)
    }

    fn unbind(&mut self, pod_key: &str) -> Option<String> {
        let rec = self.pods.remove(pod_key)?;
        if let Some(&i) = self.index.get(&rec.node) {
            let node = &mut self.nodes[i];
            let before = node.assumed.len();
            node.assumed.retain(|a| a.pod_key != pod_key);
            if node.assumed.len() != before {
                node.rebuild_mirror();
            }
            node.generation += 1;
            self.refresh(i);
        }
        Some(rec.node)
    }

    /// The node refused the binding (its state had moved on). The pod leaves the
    /// node's mirror, goes back to the queue with exponential backoff, and is not
    /// offered to that node again until the node's state changes. Returns when
    /// the pod may be retried.
    pub fn on_rejection(&mut self, pod_key: &str, node: &str, reason: &str, now: Instant) -> Instant {
        if self.pods.get(pod_key).is_some_and(|p| p.node == node) {
            self.unbind(pod_key);
        }
        let generation = self.index.get(node).map(|&i| self.nodes[i].generation);
        let r = self.retries.entry(pod_key.to_string()).or_default();
        r.attempts += 1;
        let delay =
            Doubling::new(self.config.backoff_initial, self.config.backoff_max).delay(r.attempts.saturating_sub(1));
        let at = now + delay;
        r.retry_at = Some(at);
        r.last_reason = reason.to_string();
        r.stale.retain(|(n, _)| n != node);
        if let Some(g) = generation {
            r.stale.push((node.to_string(), g));
        }
        tracing::info!(pod = %pod_key, node, reason, attempts = r.attempts, ?delay, "node rejected binding; backing off");
        at
    }

    /// Pods whose backoff has run out, earliest first; each is returned once.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let mut due: Vec<(Instant, String)> = self
            .retries
            .iter_mut()
            .filter_map(|(k, r)| match r.retry_at {
                Some(at) if at <= now => {
                    r.retry_at = None;
                    Some((at, k.clone()))
                }
                _ => None,
            })
            .collect();
        due.sort();
        due.into_iter().map(|(_, k)| k).collect()
    }

    /// The earliest time a backed-off pod becomes due (for the caller's timer).
    pub fn next_retry(&self) -> Option<Instant> {
        self.retries.values().filter_map(|r| r.retry_at).min()
    }

    /// Whether the pod is waiting out a backoff at `now`.
    pub fn is_backing_off(&self, pod_key: &str, now: Instant) -> bool {
        self.retries.get(pod_key).and_then(|r| r.retry_at).is_some_and(|at| at > now)
    }

    /// How many times nodes have rejected this pod.
    pub fn attempts(&self, pod_key: &str) -> u32 {
        self.retries.get(pod_key).map_or(0, |r| r.attempts)
    }

    /// Picks a node for the pod and records the allocation in that node's mirror.
    ///
    /// The pipeline, cheapest first so that most nodes leave before anything
    /// costly runs: readiness (a flag), nodeSelector (a few map lookups), a
    /// node that rejected this pod at its current state, free totals (a few
    /// integer comparisons), then per-NUMA summaries (a pass over the node's
    /// NUMA nodes). Survivors are scored from their summaries and the engine, the
    /// only costly step, confirms them in score order until one admits the pod.
    /// Ties go to the node name that sorts first. A pod already bound gets its
    /// binding back.
    ///
    /// `now` starts the binding's expiry (`SchedulerConfig::assume_expiry`).
    pub fn schedule(&mut self, pod_key: &str, pod: &Pod, now: Instant) -> Result<Binding, Unschedulable> {
        self.place(pod_key, pod, now, None)
    }

    /// `schedule` restricted to `node`, for a pod whose node is chosen by
    /// name (a DaemonSet's): the same checks in the same order (readiness,
    /// node selector, the summary) and the same engine on that node's mirror;
    /// on success the pod is held there as any binding is, so the scheduler
    /// never gives its CPUs to another pod. Err: why it does not fit now.
    pub fn place_on(&mut self, node: &str, pod_key: &str, pod: &Pod, now: Instant) -> Result<Binding, String> {
        if let Some(b) = self.binding(pod_key) {
            if b.node == node {
                return Ok(b);
            }
            self.release(pod_key);
        }
        self.pods.remove(pod_key);
        let Some(&i) = self.index.get(node) else { return Err(format!("node {node} is not registered")) };
        let demand = Demand::of(pod);
        let n = &self.nodes[i];
        if !n.info.ready {
            return Err(Detail::NotReady.to_string());
        }
        filter::node_selector(pod, &n.info.labels).map_err(|d| d.to_string())?;
        self.check_summary(i, &demand).map_err(|d| d.to_string())?;
        if !self.config.topology_aware {
            return Ok(self.bind(i, pod_key, None, demand, now));
        }
        let n = &self.nodes[i];
        match (self.admit)(&n.info.topology, &n.info.settings, &n.info.allocations, pod_key, pod) {
            Ok(placement) => Ok(self.bind(i, pod_key, Some(placement), demand, now)),
            Err(r) => Err(Detail::Engine { reason: r.reason, message: r.message }.to_string()),
        }
    }

    /// `schedule`, for a gang's member when `gang` is given: under `spread` the
    /// nodes already holding a member are ruled out, under `pack` they come
    /// first (the others by the pod's strategy, most room first by default).
    fn place(
        &mut self,
        pod_key: &str,
        pod: &Pod,
        now: Instant,
        gang: Option<&gang::Members>,
    ) -> Result<Binding, Unschedulable> {
        if let Some(b) = self.binding(pod_key) {
            return Ok(b);
        }
        // A record whose node no longer holds the pod is history: schedule afresh.
        self.pods.remove(pod_key);
        if self.ranks_dirty {
            self.rerank();
        }
        let demand = Demand::of(pod);
        let strategy = demand.strategy.unwrap_or(self.config.default_strategy);
        let aware = self.config.topology_aware;
        let retry = self.retries.get(pod_key).filter(|r| !r.stale.is_empty());
        let has_selector = !pod.spec.node_selector.is_empty();

        // The scan reads `hot` in order and touches a node's full state only for
        // a selector, a past rejection, or what the hot summary cannot decide.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut best: Option<Candidate> = None;
        let mut ruled_out: Vec<usize> = Vec::new();
        let mut held: Vec<usize> = Vec::new();
        for (i, h) in self.hot.iter().enumerate() {
            if gang.is_some_and(|g| g.rules_out(i)) {
                held.push(i);
                continue;
            }
            let fit = h.ready
                && (!has_selector || (h.has_labels && filter::node_selector(pod, &self.nodes[i].info.labels).is_ok()))
                && retry.is_none_or_fresh(&self.nodes[i])
                && match filter::quick(h, &demand, aware) {
                    Quick::Fit => true,
                    Quick::NoFit => false,
                    Quick::Unknown => self.check_summary(i, &demand).is_ok(),
                };
            if fit {
                let c = Candidate {
                    score: score::score(strategy, h, &self.nodes[i].summary, &demand)
                        + gang.map_or(0.0, |g| g.bonus(i)),
                    rank: self.rank[i],
                    node: i,
                };
                if best.is_none_or_worse_than(&c) {
                    best = Some(c);
                }
                candidates.push(c);
            } else {
                ruled_out.push(i);
            }
        }

        // The best was found during the scan; the others are searched only when
        // the engine turns a candidate down.
        let mut engine_rejected: Vec<(usize, Rejection)> = Vec::new();
        while let Some(c) = best {
            if !aware {
                return Ok(self.bind(c.node, pod_key, None, demand, now));
            }
            let node = &self.nodes[c.node];
            match (self.admit)(&node.info.topology, &node.info.settings, &node.info.allocations, pod_key, pod) {
                Ok(placement) => return Ok(self.bind(c.node, pod_key, Some(placement), demand, now)),
                Err(r) => engine_rejected.push((c.node, r)),
            }
            candidates.retain(|x| x.node != c.node);
            best = None;
            for x in &candidates {
                if best.is_none_or_worse_than(x) {
                    best = Some(*x);
                }
            }
        }
        Err(self.unschedulable(pod_key, pod, &demand, &ruled_out, &held, engine_rejected))
    }

    /// The summary checks in full (totals, then per NUMA node), with the reason.
    fn check_summary<'a>(&self, i: usize, demand: &'a Demand) -> Result<(), Detail<'a>> {
        let node = &self.nodes[i];
        filter::totals(&node.summary, demand)?;
        if self.config.topology_aware {
            filter::numa(&node.summary, demand, &node.info.settings)?;
        }
        Ok(())
    }

    /// Why node `i` was ruled out: the filter stages again, one at a time, in
    /// pipeline order, this time keeping the reason (only for unschedulable pods).
    fn explain<'a>(&self, i: usize, pod_key: &str, pod: &'a Pod, demand: &'a Demand) -> Detail<'a> {
        let node = &self.nodes[i];
        if !node.info.ready {
            return Detail::NotReady;
        }
        if let Err(d) = filter::node_selector(pod, &node.info.labels) {
            return d;
        }
        if let Some(r) = self.retries.get(pod_key) {
            if !Some(r).is_none_or_fresh(node) {
                return Detail::RejectedAtThisState { message: r.last_reason.clone() };
            }
        }
        match self.check_summary(i, demand) {
            Err(d) => d,
            Ok(()) => {
                debug_assert!(false, "the hot summary ruled out {} but the full summary admits it", node.info.name);
                Detail::Engine {
                    reason: specs::RejectReason::InvalidRequest,
                    message: "ruled out by its summary".into(),
                }
            }
        }
    }

    fn bind(&mut self, i: usize, pod_key: &str, placement: Option<Placement>, demand: Demand, now: Instant) -> Binding {
        let expires = now + self.config.assume_expiry;
        let node = &mut self.nodes[i];
        let blind = placement.is_none();
        let epoch = if blind { Binding::NO_PLAN } else { node.info.allocations.epoch };
        if let Some(p) = &placement {
            node.info.allocations.apply(pod_key, p.clone());
        }
        node.assumed.push(Assumed { pod_key: pod_key.to_string(), expires });
        node.generation += 1;
        let name = node.info.name.clone();
        self.pods.insert(pod_key.to_string(), PodRecord { node: name.clone(), epoch, demand, blind });
        self.refresh(i);
        Binding { node: name, epoch, placement: placement.unwrap_or_default() }
    }

    fn unschedulable(
        &self,
        pod_key: &str,
        pod: &Pod,
        demand: &Demand,
        ruled_out: &[usize],
        held: &[usize],
        engine_rejected: Vec<(usize, Rejection)>,
    ) -> Unschedulable {
        let mut counts: BTreeMap<ReasonKind, usize> = BTreeMap::new();
        let mut per_node = BTreeMap::new();
        let explained = ruled_out.iter().map(|&i| (i, self.explain(i, pod_key, pod, demand)));
        let engine =
            engine_rejected.into_iter().map(|(i, r)| (i, Detail::Engine { reason: r.reason, message: r.message }));
        let held = held.iter().map(|&i| (i, Detail::GangSpread));
        let mut short_of_resources = BTreeSet::new();
        for (i, d) in explained.chain(held).chain(engine) {
            *counts.entry(d.kind()).or_default() += 1;
            if d.kind().is_about_resources() {
                short_of_resources.insert(self.nodes[i].info.name.clone());
            }
            per_node.insert(self.nodes[i].info.name.clone(), d.to_string());
        }
        let mut order: Vec<(&ReasonKind, &usize)> = counts.iter().collect();
        order.sort_by(|a, b| b.1.cmp(a.1).then(a.0.label().cmp(b.0.label())));
        let reasons: Vec<String> = order.iter().map(|(k, n)| format!("{n} {}", k.label())).collect();
        let message = if self.nodes.is_empty() {
            "0/0 nodes fit: no nodes registered".to_string()
        } else {
            format!("0/{} nodes fit: {}", self.nodes.len(), reasons.join(", "))
        };
        Unschedulable { message, per_node, counts, short_of_resources }
    }
}

/// A pod's past rejections against a node's current state.
trait StaleCheck {
    /// True unless this node rejected the pod and has not changed since.
    fn is_none_or_fresh(&self, node: &NodeState) -> bool;
}

impl StaleCheck for Option<&Retry> {
    fn is_none_or_fresh(&self, node: &NodeState) -> bool {
        match self {
            None => true,
            Some(r) => !r.stale.iter().any(|(n, g)| *g == node.generation && *n == node.info.name),
        }
    }
}
