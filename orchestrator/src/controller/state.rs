//! The controller's view of the cluster, kept in memory under one lock: the
//! queue of pending pods and its order, job arrays and gangs, the nodes'
//! last reports, finished pods' expiry, and the scheduler with its per-node
//! mirrors. Its methods keep that bookkeeping consistent; what to do about it
//! is `decide`'s, and the store writes are the executor's (`mod.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use specs::api::Node;
use specs::Pod;
use tokio::time::Instant;

use super::expiry::Expiry;
use crate::cluster::ClusterError;
use crate::metrics::ControllerMetrics;
use crate::scheduler::{NodeInfo, Scheduler};

/// A node as the controller last saw it.
pub(super) struct NodeState {
    /// The stored node; `node.status.allocations` is its last reported truth.
    pub(super) node: Node,
    /// Shared with the scheduler's mirror; rebuilt only when the node re-registers.
    pub(super) topology: Arc<specs::NodeTopology>,
    pub(super) ready: bool,
    pub(super) last_seen: Instant,
    /// Unix seconds (rounded up) since it is NotReady: where a workload's
    /// node-lost timer starts. The store's (`NodeStatus::not_ready_since`)
    /// when it has one, so a server that starts, or becomes the leader, and
    /// finds a node NotReady keeps its timer; without one (a node marked
    /// before the field existed) from when this controller saw it: a pod is
    /// replaced late rather than early.
    pub(super) not_ready_since: Option<u64>,
}

impl NodeState {
    pub(super) fn new(node: Node, now: Instant, now_unix: u64) -> NodeState {
        let mut n = NodeState {
            topology: Arc::new(node.spec.topology.clone()),
            node,
            ready: true,
            last_seen: now,
            not_ready_since: None,
        };
        n.set_ready(n.node.status.condition == specs::api::NodeCondition::Ready, now_unix);
        n
    }

    /// Ready or not, keeping when it stopped being Ready: the earliest of
    /// what this controller saw and what the stored node says.
    pub(super) fn set_ready(&mut self, ready: bool, now_unix: u64) {
        self.ready = ready;
        let stored = self.node.status.not_ready_since;
        self.not_ready_since = match (ready, self.not_ready_since.or(stored)) {
            (true, _) => None,
            (false, Some(t)) => Some(stored.map_or(t, |s| s.min(t))),
            (false, None) => Some(now_unix),
        };
    }

    /// The node as the node-lost rule sees it.
    pub(super) fn condition(&self, now_unix: u64) -> specs::node_lost::NodeCondition {
        match (self.ready, self.not_ready_since) {
            (true, _) => specs::node_lost::NodeCondition::Ready,
            (false, since) => specs::node_lost::NodeCondition::NotReady { since: since.unwrap_or(now_unix) },
        }
    }
}

/// The pod's creation, Unix seconds (0 when unstamped: the oldest).
fn created_at(pod: &Pod) -> i64 {
    let stamp = pod.metadata.creation_timestamp.as_deref();
    stamp.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map_or(0, |t| t.timestamp())
}

/// Where a pod stands in the queue: submission order, except that the tasks
/// of a job array go together (at the array's first submission) by task index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Order {
    /// A job's priority, its age included (`specs::fairshare::order_key`):
    /// a higher one sorts first. A pod outside a job has priority 0 and
    /// ages from its creation.
    pub(super) priority: std::cmp::Reverse<i64>,
    pub(super) group: u64,
    pub(super) task: u64,
    pub(super) seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Tried at the next pass.
    Now,
    /// A node rejected it: tried again from then on.
    Backoff(Instant),
    /// Fits nowhere now: tried again on the next cluster event.
    Unschedulable,
    /// Its array has as many unfinished tasks bound as it allows.
    Throttled,
}

/// A pod in the queue.
pub(super) struct QueueEntry {
    pub(super) order: Order,
    pub(super) pod: Arc<Pod>,
    pub(super) wait: Wait,
    /// The spec's hash: in one pass, a pod whose twin fit nowhere is not tried
    /// again (binds in a pass only take capacity away).
    pub(super) twin: u64,
    /// A node rejected it: the scheduler keeps per-pod marks, so no twin shortcut.
    pub(super) rejected: bool,
    /// `(array, parallelism)` when the pod is a throttled array task.
    pub(super) array: Option<(String, usize)>,
    /// The reason last written to its status (not written again while unchanged).
    pub(super) said: Option<Arc<str>>,
}

impl QueueEntry {
    pub(super) fn due(&self, now: Instant) -> bool {
        match self.wait {
            Wait::Now => true,
            Wait::Backoff(at) => at <= now,
            Wait::Unschedulable | Wait::Throttled => false,
        }
    }
}

#[derive(Default)]
pub(super) struct ArrayState {
    /// Queue group of the array (its first task's submission).
    pub(super) group: u64,
    /// The array's place by priority and age, taken from its first task seen:
    /// every task shares it, so tasks submitted across a second boundary
    /// still go by index rather than by their own submission times.
    pub(super) priority: std::cmp::Reverse<i64>,
    /// Unfinished tasks bound to a node.
    pub(super) bound: HashSet<String>,
    /// Unfinished tasks known (queued or bound); at zero the array is forgotten,
    /// so a new array of that name queues at its own submission.
    pub(super) members: usize,
}

/// A job attempt's members while any is queued or bound.
#[derive(Default)]
pub(super) struct GangState {
    /// Queue group of the gang (its first member's submission).
    pub(super) group: u64,
    /// Members waiting in the queue, by rank.
    pub(super) queued: BTreeMap<u32, String>,
    /// Members known (queued or bound, unfinished); at zero it is forgotten.
    pub(super) members: usize,
    /// Its minimum was placed once: the rest are placed as they fit.
    pub(super) started: bool,
}

pub(super) struct State {
    pub(super) sched: Scheduler,
    /// Gangs by `job#attempt`.
    pub(super) gangs: HashMap<String, GangState>,
    /// The first gang in line that did not fit, and its place: what queued
    /// behind it waits until it is placed or gone, but a job that ends by its
    /// reservation (`specs::backfill`).
    pub(super) blocked_by: Option<(Order, String)>,
    /// Jobs whose members changed: judged again at the next pass.
    pub(super) dirty_jobs: BTreeSet<String>,
    /// Running jobs with a time limit: when it runs out, on this clock.
    pub(super) job_deadlines: BTreeMap<String, Instant>,
    /// Running jobs' CPUs (millicores), for the first waiting job's
    /// reservation (`specs::backfill`).
    pub(super) running_jobs: BTreeMap<String, i128>,
    /// Jobs whose time limit ran out (their reconcile ends them).
    pub(super) jobs_past_deadline: BTreeSet<String>,
    /// Jobs waiting for their dependency: judged again at any job's change.
    pub(super) jobs_waiting_on_others: BTreeSet<String>,
    /// Deployments to reconcile at the next pass (they or their pods changed).
    pub(super) dirty_deployments: BTreeSet<String>,
    /// Deployments being reconciled now: at most one reconcile per
    /// Deployment at a time (a second waits, dirty, for the first's end).
    pub(super) reconciling: HashSet<String>,
    /// Deployments to reconcile at a time even if nothing changes (a pod
    /// becomes available, the progress deadline falls).
    pub(super) deployment_timers: HashMap<String, Instant>,
    /// DaemonSets to reconcile at the next pass (they, their pods or the
    /// nodes changed).
    pub(super) dirty_daemonsets: BTreeSet<String>,
    /// DaemonSets being reconciled now (one reconcile each at a time).
    pub(super) reconciling_daemonsets: HashSet<String>,
    /// DaemonSets to reconcile at a time even if nothing changes (a pod
    /// becomes available, a node where the pod did not fit is tried again).
    pub(super) daemonset_timers: HashMap<String, Instant>,
    /// The DaemonSets stored: a node's change makes every one dirty.
    pub(super) daemonsets: BTreeSet<String>,
    /// What DaemonSets see of each node (labels, Ready), so that a node's
    /// report that changes neither reconciles none.
    pub(super) daemonset_nodes: HashMap<String, (BTreeMap<String, String>, bool)>,
    /// DaemonSet pods (by name, which is the same for the same node and
    /// template) their node rejected: not made again there before this
    /// time, so that a node and the scheduler's mirror that disagree cannot
    /// spin a make-reject loop. The node's words kept for the status.
    pub(super) daemon_rejected: HashMap<String, (Instant, String)>,
    pub(super) nodes: HashMap<String, NodeState>,
    pub(super) queue: HashMap<String, QueueEntry>,
    /// The queue in the order pods are tried.
    pub(super) order: BTreeMap<Order, String>,
    /// Every unfinished pod's place in the queue (kept when bound, so a pod
    /// sent back keeps its place).
    pub(super) orders: HashMap<String, Order>,
    pub(super) arrays: HashMap<String, ArrayState>,
    /// Finished pods and when each goes.
    pub(super) expiry: Expiry,
    pub(super) seq: u64,
    pub(super) metrics: ControllerMetrics,
}

pub(super) fn is_terminal(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.phase.is_terminal())
}

/// Where the scheduler's mirror keeps the CPUs a node reports offline: a key
/// no pod can have (names have no `/`), as the node's static pods do.
const OFFLINE_KEY: &str = "node/offline-cpus";

/// The node's reported allocations, plus its offline CPUs held as one
/// exclusive allocation: the scheduler places nothing on them and does not
/// count them free, while the submission check, which asks whether the
/// registered machine could ever run a pod, still sees every CPU.
pub(super) fn mirror_allocations(node: &Node) -> specs::Allocations {
    let mut a = node.status.allocations.clone();
    let offline = node
        .status
        .offline_cpus
        .difference(&a.exclusive_cpus())
        .difference(&node.spec.settings.reserved_cpus)
        .difference(&node.spec.topology.reserved_cpus);
    if !offline.is_empty() {
        let held = specs::ContainerPlacement {
            name: "offline".into(),
            cpu_policy: specs::CpuPolicy::Exclusive,
            cpus: offline,
            mems: Default::default(),
            memory: Default::default(),
            hugepages: Default::default(),
            devices: Default::default(),
        };
        a.pods.insert(OFFLINE_KEY.into(), specs::Placement { containers: vec![held], ..Default::default() });
    }
    a
}

/// The key of a gang in `State::gangs`.
pub(super) fn gang_key(g: &specs::job::Gang) -> String {
    format!("{}#{}", g.job, g.attempt)
}

/// Hash of what placing the pod depends on: its spec less what only the
/// node's runtime reads (commands, environment, images, ...), so that the
/// tasks of an array, which differ in their environment, are twins.
pub(super) fn twin_hash(pod: &Pod) -> u64 {
    let mut spec = pod.spec.clone();
    spec.termination_grace_period_seconds = None;
    spec.ttl_seconds_after_finished = None;
    spec.init = false;
    for c in &mut spec.containers {
        c.image = None;
        c.rootfs = None;
        c.command.clear();
        c.args.clear();
        c.env.clear();
        c.working_dir = None;
        c.security_context = None;
    }
    let mut h = DefaultHasher::new();
    serde_json::to_string(&spec).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// `(array, parallelism)` of a task pod that names a valid parallelism.
pub(super) fn array_limit(pod: &Pod) -> Option<(String, usize)> {
    let array = pod.metadata.labels.get(specs::pod::ARRAY_LABEL)?;
    let n: usize = pod.metadata.annotations.get(specs::pod::ARRAY_PARALLELISM_ANNOTATION)?.parse().ok()?;
    (n > 0).then(|| (array.clone(), n))
}

impl State {
    pub(super) fn new(sched: Scheduler, metrics: ControllerMetrics) -> State {
        State {
            sched,
            gangs: HashMap::new(),
            blocked_by: None,
            dirty_jobs: BTreeSet::new(),
            job_deadlines: BTreeMap::new(),
            running_jobs: BTreeMap::new(),
            jobs_past_deadline: BTreeSet::new(),
            jobs_waiting_on_others: BTreeSet::new(),
            dirty_deployments: BTreeSet::new(),
            reconciling: HashSet::new(),
            deployment_timers: HashMap::new(),
            dirty_daemonsets: BTreeSet::new(),
            reconciling_daemonsets: HashSet::new(),
            daemonset_timers: HashMap::new(),
            daemonsets: BTreeSet::new(),
            daemonset_nodes: HashMap::new(),
            daemon_rejected: HashMap::new(),
            nodes: HashMap::new(),
            queue: HashMap::new(),
            order: BTreeMap::new(),
            orders: HashMap::new(),
            arrays: HashMap::new(),
            expiry: Expiry::default(),
            seq: 0,
            metrics,
        }
    }

    /// A pod's place in the queue, assigned once per pod.
    pub(super) fn order_of(&mut self, pod: &Pod) -> Order {
        if let Some(o) = self.orders.get(&pod.metadata.name) {
            return *o;
        }
        self.seq += 1;
        let seq = self.seq;
        if let Some(g) = specs::job::Gang::of(pod) {
            let st = self.gangs.entry(gang_key(&g)).or_insert_with(|| GangState { group: seq, ..Default::default() });
            st.members += 1;
            let eligible = g.eligible.unwrap_or_else(|| created_at(pod));
            let key = specs::fairshare::order_key(i64::from(g.priority), eligible, &specs::fairshare::DEFAULT_WEIGHTS);
            return Order { priority: std::cmp::Reverse(key), group: st.group, task: u64::from(g.rank), seq };
        }
        let key = specs::fairshare::order_key(0, created_at(pod), &specs::fairshare::DEFAULT_WEIGHTS);
        let priority = std::cmp::Reverse(key);
        match pod.metadata.labels.get(specs::pod::ARRAY_LABEL) {
            Some(array) => {
                let a = self.arrays.entry(array.clone()).or_insert_with(|| ArrayState {
                    group: seq,
                    priority,
                    ..Default::default()
                });
                a.members += 1;
                let task = pod
                    .metadata
                    .annotations
                    .get(specs::pod::ARRAY_TASK_ANNOTATION)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(u64::MAX);
                Order { priority: a.priority, group: a.group, task, seq }
            }
            None => Order { priority, group: seq, task: 0, seq },
        }
    }

    /// The pod finished or was deleted: out of the queue, its array and the
    /// queue order, and the scheduler forgets it (a later pod of the same
    /// name is a new pod: no backoff, no stale marks).
    pub(super) fn let_go(&mut self, pod: &Pod) {
        if let Some(g) = specs::job::Gang::of(pod) {
            if self.blocked_by.as_ref().is_some_and(|(_, k)| *k == gang_key(&g)) {
                self.blocked_by = None;
            }
        }
        self.dequeue(&pod.metadata.name);
        self.leave_array(pod);
        self.forget_order(pod);
        self.sched.release(&pod.metadata.name);
    }

    /// The pod is finished or gone: it leaves the queue order (and its array).
    pub(super) fn forget_order(&mut self, pod: &Pod) {
        if self.orders.remove(&pod.metadata.name).is_none() {
            return;
        }
        if let Some(g) = specs::job::Gang::of(pod) {
            let key = gang_key(&g);
            if let Some(st) = self.gangs.get_mut(&key) {
                st.members = st.members.saturating_sub(1);
                if st.members == 0 && st.queued.is_empty() {
                    self.gangs.remove(&key);
                }
            }
            return;
        }
        let Some(array) = pod.metadata.labels.get(specs::pod::ARRAY_LABEL) else { return };
        if let Some(a) = self.arrays.get_mut(array) {
            a.members = a.members.saturating_sub(1);
            if a.members == 0 && a.bound.is_empty() {
                self.arrays.remove(array);
            }
        }
    }

    pub(super) fn enqueue(&mut self, pod: Arc<Pod>, wait: Wait, rejected: bool) {
        let name = pod.metadata.name.clone();
        let order = match self.orders.get(&name) {
            Some(o) => *o,
            None => {
                let o = self.order_of(&pod);
                self.orders.insert(name.clone(), o);
                o
            }
        };
        self.dequeue(&name);
        let entry =
            QueueEntry { order, twin: twin_hash(&pod), array: array_limit(&pod), pod, wait, rejected, said: None };
        if let Some(g) = specs::job::Gang::of(&entry.pod) {
            self.gangs.entry(gang_key(&g)).or_default().queued.insert(g.rank, name.clone());
        }
        self.order.insert(order, name.clone());
        self.queue.insert(name, entry);
    }

    pub(super) fn dequeue(&mut self, name: &str) -> Option<QueueEntry> {
        let e = self.queue.remove(name)?;
        self.order.remove(&e.order);
        if let Some(g) = specs::job::Gang::of(&e.pod) {
            if let Some(st) = self.gangs.get_mut(&gang_key(&g)) {
                st.queued.remove(&g.rank);
            }
        }
        Some(e)
    }

    /// The store did not take `binding`: the scheduler lets go of it (only
    /// this one: a new pod of the name may be bound by now). When the store
    /// itself refused (5xx: disk full, unavailable, not the leader) and the
    /// pod is still known and not queued again meanwhile, it goes back to the
    /// queue after `retry`, so it never waits unbound and forgotten until a
    /// restart. A refusal about the pod (gone, replaced, bound) leaves it.
    pub(super) fn binding_not_stored(
        &mut self,
        pod: &Pod,
        binding: &crate::scheduler::Binding,
        e: &ClusterError,
        retry: Duration,
    ) {
        let name = &pod.metadata.name;
        if self.sched.binding(name).is_some_and(|held| held == *binding) {
            self.sched.release(name);
        }
        if e.is_server_fault() && self.orders.contains_key(name) && !self.queue.contains_key(name) {
            self.enqueue(Arc::new(pod.clone()), Wait::Backoff(Instant::now() + retry), false);
        }
    }

    /// A member of a job finished or left: the job is judged again.
    pub(super) fn member_changed(&mut self, pod: &Pod) {
        if let Some(g) = specs::job::Gang::of(pod) {
            self.dirty_jobs.insert(g.job);
        }
    }

    /// The pod no longer counts against its array's parallelism.
    pub(super) fn leave_array(&mut self, pod: &Pod) {
        let Some(array) = pod.metadata.labels.get(specs::pod::ARRAY_LABEL) else { return };
        if let Some(a) = self.arrays.get_mut(array) {
            if a.bound.remove(&pod.metadata.name) {
                let array = array.clone();
                self.wake_array(&array);
            }
        }
    }

    /// A cluster event: every pod waiting for capacity is tried again at once.
    pub(super) fn wake_waiting(&mut self) {
        for e in self.queue.values_mut() {
            if e.wait == Wait::Unschedulable {
                e.wait = Wait::Now;
            }
        }
    }

    pub(super) fn wake_array(&mut self, array: &str) {
        for e in self.queue.values_mut() {
            if e.wait == Wait::Throttled && e.array.as_ref().is_some_and(|(a, _)| a == array) {
                e.wait = Wait::Now;
            }
        }
    }

    /// Pushes the node's reported truth to the scheduler, which keeps the
    /// in-flight bindings on top of it.
    pub(super) fn sync_mirror(&mut self, name: &str) {
        let Some(n) = self.nodes.get(name) else {
            self.sched.remove_node(name);
            return;
        };
        self.sched.upsert_node(NodeInfo {
            name: name.to_string(),
            labels: n.node.metadata.labels.clone(),
            topology: n.topology.clone(),
            settings: n.node.spec.settings.clone(),
            allocations: mirror_allocations(&n.node),
            ready: n.ready,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::api::{NodeCondition, NodeSpec, NodeStatus};
    use specs::node_lost::NodeCondition as Seen;

    fn node(condition: NodeCondition, not_ready_since: Option<u64>) -> Node {
        Node {
            api_version: "pinion.io/v1".into(),
            kind: "Node".into(),
            metadata: specs::pod::ObjectMeta { name: "n1".into(), ..Default::default() },
            spec: NodeSpec::default(),
            status: NodeStatus { condition, not_ready_since, ..Default::default() },
        }
    }

    /// A controller that starts (a server restarted, a new leader) and finds
    /// a node NotReady keeps the stored time: the node-lost timer does not
    /// start over. Without a stored time, it starts when this controller saw it.
    #[test]
    fn a_nodes_not_ready_time_comes_from_the_store() {
        let check = |stored: Node, now: u64, want: Seen| {
            let n = NodeState::new(stored, Instant::now(), now);
            assert_eq!(n.condition(now), want);
        };
        check(node(NodeCondition::NotReady, Some(1_000)), 5_000, Seen::NotReady { since: 1_000 });
        check(node(NodeCondition::NotReady, None), 5_000, Seen::NotReady { since: 5_000 });
        check(node(NodeCondition::Ready, None), 5_000, Seen::Ready);
        // Seen NotReady here first, then the stored node says earlier: the earlier.
        let mut n = NodeState::new(node(NodeCondition::NotReady, None), Instant::now(), 5_000);
        n.node = node(NodeCondition::NotReady, Some(4_000));
        n.set_ready(false, 6_000);
        assert_eq!(n.condition(6_000), Seen::NotReady { since: 4_000 });
        // Ready again: no time kept.
        n.node = node(NodeCondition::Ready, None);
        n.set_ready(true, 7_000);
        assert_eq!(n.condition(7_000), Seen::Ready);
    }
}
