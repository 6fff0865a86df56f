//! The server's control loops around the scheduler: the queue of pending pods,
//! the binding writes, the scheduler's per-node mirrors, node lifecycle
//! (heartbeats, NotReady after a grace period, pods marked Unknown, reconciled
//! when the node reports again), job-array throttling and the removal of
//! finished pods after their TTL.
//!
//! The queue is event-driven, like the Kubernetes scheduler's active and
//! unschedulable queues: waiting for capacity is not a failure. A pod that
//! fits nowhere now waits, with no timer, until a cluster event could make it
//! fit (a report that changes a node's allocations, a node registering or
//! becoming Ready, a pod deleted or finished, a binding expired or given back),
//! and is then tried at once. Only a node's rejection of a binding backs off.
//! Pods are tried in submission order; the tasks of a job array together, at
//! the array's first submission, by task index; a job's members together as
//! a gang (`scheduler::gang`), a higher job priority first. A gang that does
//! not fit holds nothing and blocks what queued behind it (no backfill), so a
//! big job is never starved by smaller ones arriving after it.
//!
//! In-flight bindings live in one place, the scheduler's assumed pods (see
//! `scheduler`), which expire after `ControllerConfig::binding_timeout`; the
//! controller then returns the pod to the queue (reason `BindingExpired`).
//!
//! The scheduler itself (`scheduler::Scheduler`) decides; this module feeds it
//! and writes its decisions. Every write here is `Txn::as_leader`: on a store shared by
//! several servers (etcd) it commits only under the leader's lease, so a
//! leader deposed a moment ago cannot bind or unbind anything. The mirror is updated under one lock before the
//! binding is written, so two concurrent binds never overcommit a node.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use specs::api::{Node, NodeCondition, PodPlan, WatchEventType};
use specs::{Pod, PodPhase, PodStatus};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::cluster::{event, ClusterError};
use crate::metrics::{ControllerMetrics, Outcome};
use crate::scheduler::{GangRequest, NodeInfo, Scheduler};
use crate::store::{Change, Kind, Store, StoreError};

#[derive(Debug, Clone, Copy)]
pub struct ControllerConfig {
    /// A node that sends no heartbeat for this long becomes NotReady.
    pub heartbeat_grace: Duration,
    /// First retry delay after a node rejects a binding (doubling per
    /// rejection up to `backoff_max`). A pod that fits nowhere now does not
    /// back off: it waits for a cluster event.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// A binding the node neither reports nor rejects within this expires: its
    /// capacity returns to the mirror and the pod is queued again.
    pub binding_timeout: Duration,
    /// How long a finished pod (and its events) is kept when its spec sets no
    /// `ttlSecondsAfterFinished`; `None` keeps it until deleted.
    pub finished_pod_ttl: Option<Duration>,
    pub scheduler: crate::scheduler::SchedulerConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            heartbeat_grace: Duration::from_secs(40),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            binding_timeout: Duration::from_secs(30),
            finished_pod_ttl: Some(Duration::from_secs(3600)),
            scheduler: Default::default(),
        }
    }
}

/// Most pods taken from the queue per scheduling pass.
const PASS: usize = 2048;
/// Queued pods decided under one lock.
const DECIDE_CHUNK: usize = 32;
/// Binding writes in flight at once (the store folds them into shared flushes).
const WRITES_IN_FLIGHT: usize = 4096;

struct NodeState {
    /// The stored node; `node.status.allocations` is its last reported truth.
    node: Node,
    /// Shared with the scheduler's mirror; rebuilt only when the node re-registers.
    topology: Arc<specs::NodeTopology>,
    ready: bool,
    last_seen: Instant,
}

/// Where a pod stands in the queue: submission order, except that the tasks
/// of a job array go together (at the array's first submission) by task index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Order {
    /// A job's priority: a higher one sorts first.
    priority: std::cmp::Reverse<i32>,
    group: u64,
    task: u64,
    seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Tried at the next pass.
    Now,
    /// A node rejected it: tried again from then on.
    Backoff(Instant),
    /// Fits nowhere now: tried again on the next cluster event.
    Unschedulable,
    /// Its array has as many unfinished tasks bound as it allows.
    Throttled,
}

struct QueueEntry {
    order: Order,
    pod: Arc<Pod>,
    wait: Wait,
    /// The spec's hash: in one pass, a pod whose twin fit nowhere is not tried
    /// again (binds in a pass only take capacity away).
    twin: u64,
    /// A node rejected it: the scheduler keeps per-pod marks, so no twin shortcut.
    rejected: bool,
    /// `(array, parallelism)` when the pod is a throttled array task.
    array: Option<(String, usize)>,
    /// The reason last written to its status (not written again while unchanged).
    said: Option<Arc<str>>,
}

impl QueueEntry {
    fn due(&self, now: Instant) -> bool {
        match self.wait {
            Wait::Now => true,
            Wait::Backoff(at) => at <= now,
            Wait::Unschedulable | Wait::Throttled => false,
        }
    }
}

#[derive(Default)]
struct ArrayState {
    /// Queue group of the array (its first task's submission).
    group: u64,
    /// Unfinished tasks bound to a node.
    bound: HashSet<String>,
    /// Unfinished tasks known (queued or bound); at zero the array is forgotten,
    /// so a new array of that name queues at its own submission.
    members: usize,
}

/// A job attempt's members while any is queued or bound.
#[derive(Default)]
struct GangState {
    /// Queue group of the gang (its first member's submission).
    group: u64,
    /// Members waiting in the queue, by rank.
    queued: BTreeMap<u32, String>,
    /// Members known (queued or bound, unfinished); at zero it is forgotten.
    members: usize,
    /// Its minimum was placed once: the rest are placed as they fit.
    started: bool,
}

struct Inner {
    sched: Scheduler,
    /// Gangs by `job#attempt`.
    gangs: HashMap<String, GangState>,
    /// The first gang in line that did not fit, and its place: what queued
    /// behind it waits (no backfill) until it is placed or gone.
    blocked_by: Option<(Order, String)>,
    /// Jobs whose members changed: judged again at the next pass.
    dirty_jobs: BTreeSet<String>,
    nodes: HashMap<String, NodeState>,
    queue: HashMap<String, QueueEntry>,
    /// The queue in the order pods are tried.
    order: BTreeMap<Order, String>,
    /// Every unfinished pod's place in the queue (kept when bound, so a pod
    /// sent back keeps its place).
    orders: HashMap<String, Order>,
    arrays: HashMap<String, ArrayState>,
    /// Finished pods to remove: (when, name, uid).
    expiring: BTreeSet<(Instant, String, String)>,
    /// Name -> its entry in `expiring` (a deleted pod's entry goes with it).
    expiry_of: HashMap<String, (Instant, String)>,
    seq: u64,
    metrics: ControllerMetrics,
}

enum Decision {
    Bind(crate::scheduler::Binding, Option<String>),
    /// A gang's members bound together, with each one's identity in the gang.
    BindGang(Vec<GangBind>),
    /// Why the pod waits: status reason, event type and reason, message.
    Pending(&'static str, &'static str, &'static str, String),
}

struct GangBind {
    pod: Arc<Pod>,
    binding: crate::scheduler::Binding,
    /// `PINION_LOCAL_RANK`: its rank among the members on its node.
    local_rank: u32,
    /// `PINION_NODES`: every member's node address, rank order (empty where not placed).
    nodes: String,
}

/// Why a pod (or a gang) fits nowhere, as its status says it: the summary,
/// then each node's reason.
fn unschedulable_words(u: crate::scheduler::Unschedulable) -> Arc<str> {
    if u.per_node.is_empty() {
        return u.message.into();
    }
    let per: Vec<String> = u.per_node.iter().map(|(n, m)| format!("{n}: {m}")).collect();
    format!("{}: {}", u.message, per.join("; ")).into()
}

/// The key of a gang in `Inner::gangs`.
fn gang_key(g: &specs::job::Gang) -> String {
    format!("{}#{}", g.job, g.attempt)
}

/// A node's address as members see it: its endpoint's host (`HOST:PORT`),
/// else its name.
fn node_address(node: &Node) -> String {
    node.spec
        .endpoint
        .as_deref()
        .and_then(|e| e.rsplit_once(':'))
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .filter(|h| !h.is_empty())
        .map_or_else(|| node.metadata.name.clone(), str::to_string)
}

/// Hash of what placing the pod depends on: its spec less what only the
/// node's runtime reads (commands, environment, images, ...), so that the
/// tasks of an array, which differ in their environment, are twins.
fn twin_hash(pod: &Pod) -> u64 {
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
fn array_limit(pod: &Pod) -> Option<(String, usize)> {
    let array = pod.metadata.labels.get(specs::pod::ARRAY_LABEL)?;
    let n: usize = pod.metadata.annotations.get(specs::pod::ARRAY_PARALLELISM_ANNOTATION)?.parse().ok()?;
    (n > 0).then(|| (array.clone(), n))
}

fn is_terminal(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.phase.is_terminal())
}

/// Where the scheduler's mirror keeps the CPUs a node reports offline: a key
/// no pod can have (names have no `/`), as the node's static pods do.
const OFFLINE_KEY: &str = "node/offline-cpus";

/// The node's reported allocations, plus its offline CPUs held as one
/// exclusive allocation: the scheduler places nothing on them and does not
/// count them free, while the submission check, which asks whether the
/// registered machine could ever run a pod, still sees every CPU.
fn mirror_allocations(node: &Node) -> specs::Allocations {
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

fn creation_order(a: &Pod, b: &Pod) -> std::cmp::Ordering {
    (&a.metadata.creation_timestamp, a.metadata.resource_version, &a.metadata.name).cmp(&(
        &b.metadata.creation_timestamp,
        b.metadata.resource_version,
        &b.metadata.name,
    ))
}

pub struct Controller {
    store: Store,
    config: ControllerConfig,
    inner: Mutex<Inner>,
    wake: Notify,
    writes: Arc<Semaphore>,
    /// Serializes node condition changes (NotReady, Ready, status reports) so a
    /// heartbeat racing the NotReady marking cannot be lost.
    transitions: tokio::sync::Mutex<()>,
    /// The store version its pods were loaded at: `follow` watches from it.
    loaded_at: std::sync::atomic::AtomicU64,
    /// Bindings counted outside the lock (`Inner` has the same handles).
    metrics: ControllerMetrics,
}

impl Controller {
    /// Loads nodes and pods from the store and starts the loops; they end when
    /// `shutdown` turns true.
    pub fn start(
        store: Store,
        config: ControllerConfig,
        metrics: ControllerMetrics,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(Arc<Controller>, Vec<tokio::task::JoinHandle<()>>), StoreError> {
        let now = Instant::now();
        let c = Arc::new(Controller {
            store: store.clone(),
            config,
            inner: Mutex::new(Inner {
                // One backoff: a node's rejection is timed by the scheduler
                // (which also keeps the pod off that node's current state),
                // with the controller's settings; one record of in-flight
                // bindings, the scheduler's, with the controller's expiry.
                sched: Scheduler::new(crate::scheduler::SchedulerConfig {
                    backoff_initial: config.backoff_base,
                    backoff_max: config.backoff_max,
                    assume_expiry: config.binding_timeout,
                    ..config.scheduler
                }),
                gangs: HashMap::new(),
                blocked_by: None,
                dirty_jobs: BTreeSet::new(),
                nodes: HashMap::new(),
                queue: HashMap::new(),
                order: BTreeMap::new(),
                orders: HashMap::new(),
                arrays: HashMap::new(),
                expiring: BTreeSet::new(),
                expiry_of: HashMap::new(),
                seq: 0,
                metrics: metrics.clone(),
            }),
            wake: Notify::new(),
            writes: Arc::new(Semaphore::new(WRITES_IN_FLIGHT)),
            transitions: tokio::sync::Mutex::new(()),
            loaded_at: std::sync::atomic::AtomicU64::new(0),
            metrics,
        });
        {
            let mut inner = c.lock();
            for node in store.list::<Node>()?.items {
                let name = node.metadata.name.clone();
                let ready = node.status.condition == NodeCondition::Ready;
                // A restart is not a missed heartbeat: every node gets a fresh grace period.
                inner.nodes.insert(
                    name.clone(),
                    NodeState { topology: Arc::new(node.spec.topology.clone()), node, ready, last_seen: now },
                );
                inner.sync_mirror(&name);
            }
            // A member may have ended while no server was leading: judged again.
            for job in store.list::<specs::job::Job>()?.items {
                if !job.status.as_ref().is_some_and(|s| s.phase.is_terminal()) {
                    inner.dirty_jobs.insert(job.metadata.name);
                }
            }
            let listed = store.list::<Pod>()?;
            c.loaded_at.store(listed.rv, std::sync::atomic::Ordering::Release);
            let mut pods = listed.items;
            pods.sort_by(creation_order);
            for pod in pods {
                let name = pod.metadata.name.clone();
                if is_terminal(&pod) {
                    // The finish time is not stored: a restart starts the TTL again.
                    if let Some(ttl) = c.ttl_of(&pod) {
                        inner.expire_at(now + ttl, &name, pod.metadata.uid.clone().unwrap_or_default());
                    }
                    continue;
                }
                let order = inner.order_of(&pod);
                inner.orders.insert(name.clone(), order);
                let phase = pod.status.as_ref().map(|s| s.phase).unwrap_or_default();
                match &pod.spec.node_name {
                    Some(node) => {
                        if let Some((array, _)) = array_limit(&pod) {
                            inner.arrays.entry(array).or_default().bound.insert(name.clone());
                        }
                        if phase == PodPhase::Scheduled {
                            let plan = pod.status.as_ref().and_then(|s| s.plan.as_ref());
                            let plan = plan.filter(|p| p.epoch != crate::scheduler::Binding::NO_PLAN);
                            let plan = plan.map(|p| (p.epoch, p.placement.clone()));
                            inner.sched.assume(&name, &pod, node, plan, now.into_std());
                        }
                    }
                    None => inner.enqueue(Arc::new(pod), Wait::Now, false),
                }
            }
        }
        let loops = vec![
            tokio::spawn(c.clone().schedule_loop(shutdown.clone())),
            tokio::spawn(c.clone().lifecycle_loop(shutdown)),
        ];
        Ok((c, loops))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a finished pod is kept: its spec's TTL, else the server's.
    fn ttl_of(&self, pod: &Pod) -> Option<Duration> {
        match pod.spec.ttl_seconds_after_finished {
            Some(s) => Some(Duration::from_secs(s)),
            None => self.config.finished_pod_ttl,
        }
    }

    /// Why no registered node could ever run the pod, even empty, as the
    /// message of a refused submission; `None` when some node could, or when
    /// no node is registered yet.
    pub fn never_fits(&self, pod: &Pod) -> Option<String> {
        let reasons = self.lock().sched.never_fits(&pod.metadata.name, pod)?;
        let per: Vec<String> = reasons.iter().map(|(n, m)| format!("node {n}: {m}")).collect();
        Some(format!("no node can ever run this pod: {}", per.join("; ")))
    }

    /// Why no cluster could ever hold the job's gang at once (every node
    /// empty), as the message of a refused submission; `None` when one could.
    pub fn gang_never_fits(&self, job: &specs::job::Job) -> Option<String> {
        let member = specs::job::member(job, 0);
        let g = &job.spec.gang;
        let min = g.min_members.unwrap_or(job.spec.parallelism) as usize;
        let why = self.lock().sched.gang_never_fits(
            &member.metadata.name,
            &member,
            min,
            g.placement,
            g.nodes.map(|n| n as usize),
            g.per_node.map(|n| n as usize),
        )?;
        Some(format!("job {:?} can never run: {why}", job.metadata.name))
    }

    pub fn pod_created(&self, pod: &Pod) {
        self.pods_created(std::slice::from_ref(pod));
    }

    /// Pods created in one write (a job's members), queued under one lock: a
    /// scheduling pass between two of them would see part of a gang and place
    /// that part as if it were the whole (a gang "started" with some members,
    /// holding their CPUs while the rest wait).
    pub fn pods_created(&self, pods: &[Pod]) {
        let mut inner = self.lock();
        for pod in pods.iter().filter(|p| p.spec.node_name.is_none()) {
            let order = inner.order_of(pod);
            inner.orders.insert(pod.metadata.name.clone(), order);
            inner.enqueue(Arc::new(pod.clone()), Wait::Now, false);
        }
        drop(inner);
        self.wake.notify_one();
    }

    pub fn pod_deleted(&self, pod: &Pod) {
        let mut inner = self.lock();
        let name = &pod.metadata.name;
        inner.let_go(pod);
        inner.member_changed(pod);
        if let Some((at, uid)) = inner.expiry_of.remove(name) {
            inner.expiring.remove(&(at, name.clone(), uid));
        }
        inner.wake_waiting();
        drop(inner);
        self.wake.notify_one();
    }

    /// A pod reached Succeeded or Failed: its array may bind another task, and
    /// it is removed after its TTL.
    pub fn pod_finished(&self, pod: &Pod) {
        let mut inner = self.lock();
        let name = &pod.metadata.name;
        inner.let_go(pod);
        inner.member_changed(pod);
        if let Some(ttl) = self.ttl_of(pod) {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            inner.expire_at(Instant::now() + ttl, name, uid);
        }
        inner.wake_waiting();
        drop(inner);
        self.wake.notify_one();
    }

    pub fn node_registered(&self, node: &Node) {
        let mut inner = self.lock();
        let name = node.metadata.name.clone();
        let now = Instant::now();
        let entry = inner.nodes.entry(name.clone()).or_insert_with(|| NodeState {
            topology: Arc::new(node.spec.topology.clone()),
            node: node.clone(),
            ready: node.status.condition == NodeCondition::Ready,
            last_seen: now,
        });
        if entry.node.spec.topology != node.spec.topology {
            entry.topology = Arc::new(node.spec.topology.clone());
        }
        entry.node = node.clone();
        entry.ready = node.status.condition == NodeCondition::Ready;
        entry.last_seen = now;
        inner.sync_mirror(&name);
        inner.wake_waiting();
        drop(inner);
        self.wake.notify_one();
    }

    pub fn node_deleted(&self, name: &str) {
        let mut inner = self.lock();
        inner.nodes.remove(name);
        inner.sched.remove_node(name);
    }

    /// Held while a node's condition is written (see `transitions`).
    pub async fn transition_guard(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.transitions.lock().await
    }

    /// Records a heartbeat; a NotReady node is stored Ready again. `Ok(false)`
    /// when the node is unknown.
    pub async fn heartbeat(&self, name: &str) -> Result<bool, ClusterError> {
        {
            let mut inner = self.lock();
            let Some(n) = inner.nodes.get_mut(name) else { return Ok(false) };
            n.last_seen = Instant::now();
            if n.ready {
                return Ok(true);
            }
        }
        let _g = self.transitions.lock().await;
        if self.lock().nodes.get(name).is_none_or(|n| n.ready) {
            return Ok(true);
        }
        let n = name.to_string();
        let node = self
            .store
            .write(move |t| {
                t.as_leader();
                crate::cluster::nodes::mark_ready(t, &n)
            })
            .await?;
        match node {
            Some(node) => {
                self.node_updated(&node, false);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The node's stored object changed (Ready again, or its status report).
    pub fn node_updated(&self, node: &Node, reported: bool) {
        self.node_reported(node, reported, &[]);
    }

    /// A node's status report was stored: its allocations are the node's truth,
    /// and `confirmed` are the pods it reported as admitted (Running or
    /// finished), which leave the in-flight record.
    pub fn node_reported(&self, node: &Node, reported: bool, confirmed: &[String]) {
        let mut inner = self.lock();
        let name = node.metadata.name.clone();
        let Some(n) = inner.nodes.get_mut(&name) else {
            drop(inner);
            return self.node_registered(node);
        };
        let was_ready = n.ready;
        // CPUs back online are capacity, as freed ones are.
        let truth_changed = reported
            && (n.node.status.allocations != node.status.allocations
                || n.node.status.offline_cpus != node.status.offline_cpus);
        // The spec (topology, settings) changes only by registering again
        // (`node_registered`); `n.topology` stays shared with the mirror.
        if !reported {
            // Only a report changes the truth (a NotReady/Ready write carries the old one).
            let truth = n.node.status.allocations.clone();
            n.node = node.clone();
            n.node.status.allocations = truth;
        } else {
            n.node = node.clone();
        }
        n.ready = node.status.condition == NodeCondition::Ready;
        n.last_seen = Instant::now();
        let became_ready = n.ready && !was_ready;
        inner.sync_mirror(&name);
        let mut freed = false;
        for pod in confirmed {
            freed |= inner.sched.confirm(pod);
        }
        if truth_changed || became_ready || freed {
            inner.wake_waiting();
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// A nodelet refused a binding: the pod goes back to the queue with backoff.
    /// The scheduler also marks the node stale for this pod, so the retry goes
    /// elsewhere until that node's state changes (in topology-blind mode the
    /// node's totals would otherwise invite the same binding again).
    pub fn pod_rejected(&self, pod: &Pod, node: &str, reason: &str) {
        let mut inner = self.lock();
        let name = &pod.metadata.name;
        let retry_at = inner.sched.on_rejection(name, node, reason, Instant::now().into_std());
        inner.leave_array(pod);
        if !inner.orders.contains_key(name) {
            let order = inner.order_of(pod);
            inner.orders.insert(name.clone(), order);
        }
        inner.enqueue(Arc::new(pod.clone()), Wait::Backoff(Instant::from_std(retry_at)), true);
        // The node's mirror no longer holds the pod: others may fit now.
        inner.wake_waiting();
        drop(inner);
        self.wake.notify_one();
    }

    /// The users' changes made through any server (pods and jobs' members
    /// created or deleted, nodes deleted) reach the controller here, from the
    /// store's watch, on sled as on etcd (see `leading`). Returns when
    /// `shutdown` turns true, or with the error that ended the watch (the
    /// leader then starts a fresh controller from the store).
    pub async fn follow(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) -> Result<(), StoreError> {
        let mut changes = self.store.watch(self.loaded_at.load(std::sync::atomic::Ordering::Acquire)).await?;
        loop {
            let change = tokio::select! {
                c = changes.next() => c?,
                _ = shutdown.changed() => return Ok(()),
            };
            self.on_change(&change);
        }
    }

    fn on_change(&self, change: &Change) {
        let pod = || match serde_json::from_str::<Pod>(&change.object) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(pod = %change.name, error = %e, "a pod change that does not decode: skipped");
                None
            }
        };
        match (change.kind, change.event_type) {
            (Kind::Pod, WatchEventType::Added) => {
                if let Some(p) = pod() {
                    self.pod_created(&p);
                }
            }
            (Kind::Pod, WatchEventType::Deleted) => {
                if let Some(p) = pod() {
                    self.pod_deleted(&p);
                }
            }
            (Kind::Node, WatchEventType::Deleted) => self.node_deleted(&change.name),
            _ => {}
        }
    }

    /// Pods waiting in the queue (for status and tests).
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// Pods in the queue by why they wait: `Scheduling` (due now),
    /// `Backoff` (a node rejected it), `Unschedulable` (fits nowhere now, or
    /// queued behind a gang that does not fit), `ArrayThrottled`.
    pub fn pending_by_reason(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for e in self.lock().queue.values() {
            let reason = match e.wait {
                Wait::Now => "Scheduling",
                Wait::Backoff(_) => "Backoff",
                Wait::Unschedulable => "Unschedulable",
                Wait::Throttled => "ArrayThrottled",
            };
            *out.entry(reason).or_default() += 1;
        }
        out
    }

    /// Every node's capacity and free figures per NUMA node (the scheduler's mirror).
    pub fn capacity(&self) -> Vec<crate::scheduler::NodeCapacity> {
        self.lock().sched.capacity()
    }

    async fn schedule_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow() {
                break;
            }
            let next = self.pass().await;
            let sleep = match next {
                Some(t) => tokio::time::sleep_until(t),
                None => tokio::time::sleep(Duration::from_secs(3600)),
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = sleep => {}
                _ = shutdown.changed() => {}
            }
        }
        // Let the binding writes in flight finish before the store closes.
        let _ = self.writes.acquire_many(WRITES_IN_FLIGHT as u32).await;
    }

    /// Expired bindings and finished pods past their TTL, then scheduling
    /// passes over the due pods; returns when the next timer is due.
    async fn pass(self: &Arc<Self>) -> Option<Instant> {
        loop {
            let now = Instant::now();
            let (expired, finished) = {
                let mut inner = self.lock();
                let expired = inner.sched.expire_assumed(now.into_std());
                let mut finished = Vec::new();
                while let Some(first) = inner.expiring.first() {
                    if first.0 > now {
                        break;
                    }
                    if let Some((_, name, uid)) = inner.expiring.pop_first() {
                        inner.expiry_of.remove(&name);
                        finished.push((name, uid));
                    }
                }
                (expired, finished)
            };
            for (pod, node) in expired {
                let Ok(permit) = self.writes.clone().acquire_owned().await else { return None };
                let this = self.clone();
                tokio::spawn(async move {
                    this.requeue_expired(pod, node).await;
                    drop(permit);
                });
            }
            for (pod, uid) in finished {
                let Ok(permit) = self.writes.clone().acquire_owned().await else { return None };
                let this = self.clone();
                tokio::spawn(async move {
                    this.remove_finished(pod, uid).await;
                    drop(permit);
                });
            }
            let jobs = std::mem::take(&mut self.lock().dirty_jobs);
            for job in jobs {
                let Ok(permit) = self.writes.clone().acquire_owned().await else { return None };
                let this = self.clone();
                tokio::spawn(async move {
                    this.reconcile_job(job).await;
                    drop(permit);
                });
            }
            let due: Vec<String> = {
                let inner = self.lock();
                inner
                    .order
                    .values()
                    .filter(|name| inner.queue.get(*name).is_some_and(|e| e.due(now)))
                    .take(PASS)
                    .cloned()
                    .collect()
            };
            if due.is_empty() {
                let inner = self.lock();
                let backoff = inner.queue.values().filter_map(|e| match e.wait {
                    Wait::Backoff(at) => Some(at),
                    _ => None,
                });
                let expiry = inner.sched.next_expiry().map(Instant::from_std);
                let ttl = inner.expiring.first().map(|(at, _, _)| *at);
                return backoff.chain(expiry).chain(ttl).min();
            }
            // Twins (equal specs) that fit nowhere in this pass.
            let mut failed: HashMap<u64, Arc<str>> = HashMap::new();
            // A few pods per lock: most retries of waiting pods end at a twin's
            // failure, and a create must not wait for a whole pass.
            for chunk in due.chunks(DECIDE_CHUNK) {
                let decisions: Vec<(Decision, Arc<Pod>)> = {
                    let mut inner = self.lock();
                    chunk.iter().flat_map(|name| inner.decide_any(name, now, &mut failed)).collect()
                };
                for (decision, pod) in decisions {
                    let Ok(permit) = self.writes.clone().acquire_owned().await else { return None };
                    let this = self.clone();
                    tokio::spawn(async move {
                        match decision {
                            Decision::Bind(binding, uid) => this.write_binding(&pod, binding, uid).await,
                            Decision::BindGang(members) => this.write_gang_binding(members).await,
                            Decision::Pending(reason, event_type, event_reason, message) => {
                                let name = pod.metadata.name.clone();
                                this.write_pending(name, reason, event_type, event_reason, message).await
                            }
                        }
                        drop(permit);
                    });
                }
            }
        }
    }

    async fn write_binding(&self, pod: &Pod, binding: crate::scheduler::Binding, uid: Option<String>) {
        let b = binding.clone();
        let name = pod.metadata.name.clone();
        let pod_name = name.clone();
        let r = self
            .store
            .write(move |t| -> Result<(), ClusterError> {
                t.as_leader();
                bind_in_txn(t, &pod_name, &uid, &b, None)
            })
            .await;
        if r.is_ok() {
            self.metrics.bound(1);
        }
        if let Err(e) = r {
            tracing::debug!(pod = %name, error = %e, "binding not stored; releasing it");
            let mut inner = self.lock();
            inner.binding_not_stored(pod, &binding, &e, self.config.backoff_base);
            if let Some((array, _)) = array_limit(pod) {
                if let Some(a) = inner.arrays.get_mut(&array) {
                    a.bound.remove(&name);
                }
                inner.wake_array(&array);
            }
            inner.wake_waiting();
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// A gang's bindings in one write: every member bound, or (a member gone
    /// or replaced meanwhile) none, and the scheduler lets go of them all.
    async fn write_gang_binding(&self, members: Vec<GangBind>) {
        let Some(job) = members.first().and_then(|m| specs::job::Gang::of(&m.pod)).map(|g| g.job) else { return };
        let plan: Vec<(String, Option<String>, crate::scheduler::Binding, u32, String)> = members
            .iter()
            .map(|m| {
                let p = &m.pod;
                (p.metadata.name.clone(), p.metadata.uid.clone(), m.binding.clone(), m.local_rank, m.nodes.clone())
            })
            .collect();
        let j = job.clone();
        let r = self
            .store
            .write(move |t| -> Result<(), ClusterError> {
                t.as_leader();
                for (name, uid, b, local_rank, nodes) in &plan {
                    bind_in_txn(t, name, uid, b, Some((*local_rank, nodes)))?;
                }
                crate::cluster::jobs::mark_running(t, &j)
            })
            .await;
        if r.is_ok() {
            self.metrics.bound(members.len() as u64);
        }
        if let Err(e) = r {
            tracing::info!(job = %job, error = %e, "gang binding not stored; releasing every member");
            let mut inner = self.lock();
            for m in &members {
                inner.binding_not_stored(&m.pod, &m.binding, &e, self.config.backoff_base);
            }
            inner.wake_waiting();
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// A member of the job changed: the job's verdict, carried out in one write.
    async fn reconcile_job(&self, name: String) {
        let n = name.clone();
        let r = self
            .store
            .write(move |t| -> Result<crate::cluster::jobs::MemberChanges, ClusterError> {
                t.as_leader();
                crate::cluster::jobs::reconcile(t, &n)
            })
            .await;
        match r {
            Ok(changes) => {
                for p in &changes.deleted {
                    self.pod_deleted(p);
                }
                self.pods_created(&changes.created);
            }
            Err(e) => tracing::warn!(job = %name, error = %e, "cannot record a job's progress"),
        }
    }

    async fn write_pending(
        &self,
        name: String,
        reason: &'static str,
        event_type: &'static str,
        event_reason: &'static str,
        message: String,
    ) {
        let r = self
            .store
            .write(move |t| -> Result<(), ClusterError> {
                t.as_leader();
                let Some(mut pod) = t.get::<Pod>(&name)? else { return Ok(()) };
                if pod.spec.node_name.is_some() {
                    return Ok(());
                }
                let status = pod.status.get_or_insert_with(PodStatus::default);
                if status.reason.as_deref() == Some(reason) && status.message.as_deref() == Some(&message) {
                    return Ok(()); // Nothing new to say: no write, no event.
                }
                status.phase = PodPhase::Pending;
                status.reason = Some(reason.into());
                status.message = Some(message.clone());
                t.put(&mut pod)?;
                t.add_event(event("Pod", &name, event_type, event_reason, message.clone()))?;
                Ok(())
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot record why a pod is pending");
        }
    }

    /// A binding expired unconfirmed (the scheduler already gave its capacity
    /// back): the pod is unbound in the store and queued again, unless the node
    /// has reported it meanwhile.
    async fn requeue_expired(&self, name: String, node: String) {
        let timeout = self.config.binding_timeout;
        let n = name.clone();
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                crate::cluster::pods::expire_binding(t, &n, &node, timeout)
            })
            .await;
        match r {
            Ok(Some(pod)) => {
                let mut inner = self.lock();
                inner.leave_array(&pod);
                if !inner.orders.contains_key(&name) {
                    let order = inner.order_of(&pod);
                    inner.orders.insert(name.clone(), order);
                }
                inner.enqueue(Arc::new(pod), Wait::Now, false);
                inner.wake_waiting();
                drop(inner);
                self.wake.notify_one();
            }
            Ok(None) => {
                // The capacity came back to the mirror all the same.
                self.lock().wake_waiting();
                self.wake.notify_one();
            }
            Err(e) => tracing::error!(pod = %name, error = %e, "cannot requeue an expired binding"),
        }
    }

    /// A finished pod's TTL ran out: it goes with its events.
    async fn remove_finished(&self, name: String, uid: String) {
        let n = name.clone();
        let r = self
            .store
            .write(move |t| -> Result<Option<Pod>, ClusterError> {
                t.as_leader();
                let Some(pod) = t.get::<Pod>(&n)? else { return Ok(None) };
                if pod.metadata.uid.clone().unwrap_or_default() != uid || !is_terminal(&pod) {
                    return Ok(None); // A new pod of that name.
                }
                Ok(t.delete::<Pod>(&n)?)
            })
            .await;
        match r {
            Ok(Some(pod)) => {
                tracing::debug!(pod = %name, "finished pod removed after its TTL");
                self.pod_deleted(&pod);
            }
            Ok(None) => {}
            Err(e) => tracing::error!(pod = %name, error = %e, "cannot remove a finished pod"),
        }
    }

    async fn lifecycle_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let period = (self.config.heartbeat_grace / 4).max(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let lost = {
                let inner = self.lock();
                let seen = inner.nodes.iter().map(|(k, n)| (k.as_str(), n.ready, n.last_seen));
                silent_nodes(seen, Instant::now(), self.config.heartbeat_grace)
            };
            for name in lost {
                self.mark_not_ready(&name).await;
            }
        }
    }

    async fn mark_not_ready(&self, name: &str) {
        let grace = self.config.heartbeat_grace;
        let _g = self.transitions.lock().await;
        let still_lost = {
            let inner = self.lock();
            let seen = inner.nodes.get(name).map(|n| (name, n.ready, n.last_seen));
            !silent_nodes(seen.into_iter(), Instant::now(), grace).is_empty()
        };
        if !still_lost {
            return;
        }
        let pods = match self.store.list::<Pod>() {
            Ok(listed) => listed.items,
            Err(e) => return tracing::error!(error = %e, "cannot list pods"),
        };
        let mine: Vec<String> = pods
            .into_iter()
            .filter(|p| p.spec.node_name.as_deref() == Some(name))
            .filter(|p| !p.status.as_ref().map(|s| s.phase.is_terminal()).unwrap_or(false))
            .map(|p| p.metadata.name)
            .collect();
        let node_name = name.to_string();
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                crate::cluster::nodes::mark_lost(t, &node_name, &mine, grace)
            })
            .await;
        match r {
            Ok(Some(node)) => self.node_updated(&node, false),
            Ok(None) => {}
            Err(e) => tracing::error!(node = %name, error = %e, "cannot mark node NotReady"),
        }
    }
}

/// The Ready nodes whose last heartbeat is older than `grace` at `now`: the
/// node-lifecycle decision, apart from the store write that carries it out
/// (`cluster::nodes::mark_lost`).
fn silent_nodes<'a>(
    seen: impl Iterator<Item = (&'a str, bool, Instant)>,
    now: Instant,
    grace: Duration,
) -> Vec<String> {
    seen.filter(|&(_, ready, last)| ready && now.saturating_duration_since(last) > grace)
        .map(|(name, _, _)| name.to_string())
        .collect()
}

/// Binds the stored pod `name` (this incarnation, `uid`) as `b` says; a
/// gang's member also gets `PINION_LOCAL_RANK` and `PINION_NODES`.
fn bind_in_txn(
    t: &mut crate::store::Txn<'_>,
    name: &str,
    uid: &Option<String>,
    b: &crate::scheduler::Binding,
    gang: Option<(u32, &str)>,
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
    status.message = Some(format!("bound to {} (NUMA {}; cpus {})", b.node, b.placement.numa_affinity, cpus.join(" ")));
    status.placement = Some(b.placement.summary());
    status.plan = Some(PodPlan { epoch: b.epoch, placement: b.placement.clone() });
    status.attempts = status.attempts.saturating_add(1);
    let message = status.message.clone().unwrap_or_default();
    pod.spec.node_name = Some(b.node.clone());
    if let Some((local_rank, nodes)) = gang {
        for c in &mut pod.spec.containers {
            specs::job::set_env(&mut c.env, "PINION_LOCAL_RANK", &local_rank.to_string());
            specs::job::set_env(&mut c.env, "PINION_NODES", nodes);
        }
    }
    pod.status = Some(status);
    t.put(&mut pod)?;
    t.add_event(event("Pod", name, "Normal", "Scheduled", message))?;
    Ok(())
}

impl Inner {
    /// A pod's place in the queue, assigned once per pod.
    fn order_of(&mut self, pod: &Pod) -> Order {
        if let Some(o) = self.orders.get(&pod.metadata.name) {
            return *o;
        }
        self.seq += 1;
        let seq = self.seq;
        if let Some(g) = specs::job::Gang::of(pod) {
            let st = self.gangs.entry(gang_key(&g)).or_insert_with(|| GangState { group: seq, ..Default::default() });
            st.members += 1;
            return Order { priority: std::cmp::Reverse(g.priority), group: st.group, task: u64::from(g.rank), seq };
        }
        let priority = std::cmp::Reverse(0);
        match pod.metadata.labels.get(specs::pod::ARRAY_LABEL) {
            Some(array) => {
                let a =
                    self.arrays.entry(array.clone()).or_insert_with(|| ArrayState { group: seq, ..Default::default() });
                a.members += 1;
                let task = pod
                    .metadata
                    .annotations
                    .get(specs::pod::ARRAY_TASK_ANNOTATION)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(u64::MAX);
                Order { priority, group: a.group, task, seq }
            }
            None => Order { priority, group: seq, task: 0, seq },
        }
    }

    /// Removes the finished pod `name` (this incarnation, `uid`) at `at`.
    fn expire_at(&mut self, at: Instant, name: &str, uid: String) {
        if let Some((old_at, old_uid)) = self.expiry_of.insert(name.to_string(), (at, uid.clone())) {
            self.expiring.remove(&(old_at, name.to_string(), old_uid));
        }
        self.expiring.insert((at, name.to_string(), uid));
    }

    /// The pod finished or was deleted: out of the queue, its array and the
    /// queue order, and the scheduler forgets it (a later pod of the same
    /// name is a new pod: no backoff, no stale marks).
    fn let_go(&mut self, pod: &Pod) {
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
    fn forget_order(&mut self, pod: &Pod) {
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

    fn enqueue(&mut self, pod: Arc<Pod>, wait: Wait, rejected: bool) {
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

    fn dequeue(&mut self, name: &str) -> Option<QueueEntry> {
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
    fn binding_not_stored(
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
    fn member_changed(&mut self, pod: &Pod) {
        if let Some(g) = specs::job::Gang::of(pod) {
            self.dirty_jobs.insert(g.job);
        }
    }

    /// `decide` for any queued pod: one queued behind a gang that did not fit
    /// waits; a gang's member brings its whole gang.
    fn decide_any(
        &mut self,
        name: &str,
        now: Instant,
        failed: &mut HashMap<u64, Arc<str>>,
    ) -> Vec<(Decision, Arc<Pod>)> {
        let Some(e) = self.queue.get(name).filter(|e| e.due(now)) else { return Vec::new() };
        let pod = e.pod.clone();
        let gang = specs::job::Gang::of(&pod);
        if let Some((first, key)) = &self.blocked_by {
            let same = gang.as_ref().is_some_and(|g| gang_key(g) == *key);
            if !same && e.order > *first {
                let job = key.split('#').next().unwrap_or_default();
                let message: Arc<str> =
                    format!("queued behind job {job}, which is first in line and does not fit yet (no backfill)")
                        .into();
                let Some(e) = self.queue.get_mut(name) else { return Vec::new() };
                e.wait = Wait::Unschedulable;
                return Self::say(e, "Queued", "Normal", "Queued", message).map(|d| (d, pod)).into_iter().collect();
            }
        }
        match gang {
            Some(g) => self.decide_gang(g, now),
            None => self.decide(name, now, failed).into_iter().collect(),
        }
    }

    /// Places the gang's queued members together (see `Scheduler::schedule_gang`).
    fn decide_gang(&mut self, g: specs::job::Gang, now: Instant) -> Vec<(Decision, Arc<Pod>)> {
        let key = gang_key(&g);
        let Some(st) = self.gangs.get(&key) else { return Vec::new() };
        let members: Vec<(u32, String, Arc<Pod>)> = st
            .queued
            .iter()
            .filter_map(|(rank, n)| self.queue.get(n).map(|e| (*rank, n.clone(), e.pod.clone())))
            .collect();
        let Some(first) = members.first().and_then(|(_, n, _)| self.queue.get(n)).map(|e| e.order) else {
            return Vec::new();
        };
        let size = g.size as usize;
        let mut nodes_by_rank = vec![String::new(); size];
        let mut held = Vec::new();
        for rank in 0..g.size {
            if st.queued.contains_key(&rank) {
                continue;
            }
            if let Some(b) = self.sched.binding(&specs::job::member_name(&g.job, rank)) {
                held.push(b.node.clone());
                nodes_by_rank[rank as usize] = b.node;
            }
        }
        let started = st.started || !held.is_empty();
        let min = g.min_members as usize;
        if !started && members.len() < min {
            // Members arrive one store change at a time on a shared store (the
            // leader follows etcd's watch): a part of a gang is never placed as
            // if it were the whole. The next member's arrival tries again; no
            // status is written meanwhile (the rest are a moment away, and a
            // write per arrival would cost a gang of n about n*n/2 writes).
            for (_, n, _) in &members {
                if let Some(e) = self.queue.get_mut(n) {
                    e.wait = Wait::Unschedulable;
                }
            }
            return Vec::new();
        }
        // A gang already started (its minimum placed) places the rest as they fit.
        let min = if started { 1 } else { min };
        let request = GangRequest {
            members: members.iter().map(|(_, n, p)| (n.clone(), p.clone())).collect(),
            placement: g.placement,
            min_members: min,
            max_nodes: g.max_nodes.map(|n| n as usize),
            per_node: g.per_node.map(|n| n as usize),
            nodes_held: held,
        };
        let started_at = std::time::Instant::now();
        let decided = self.sched.schedule_gang(&request, now.into_std());
        let outcome = if decided.is_ok() { Outcome::Bound } else { Outcome::Unschedulable };
        self.metrics.attempt(outcome, started_at.elapsed().as_secs_f64());
        match decided {
            Ok(bound) => {
                if self.blocked_by.as_ref().is_some_and(|(_, k)| *k == key) {
                    self.blocked_by = None;
                }
                if let Some(st) = self.gangs.get_mut(&key) {
                    st.started = true;
                }
                let ranks: HashMap<&str, u32> = members.iter().map(|(r, n, _)| (n.as_str(), *r)).collect();
                for (n, b) in &bound {
                    if let Some(r) = ranks.get(n.as_str()) {
                        nodes_by_rank[*r as usize] = b.node.clone();
                    }
                }
                let addresses: Vec<String> = nodes_by_rank
                    .iter()
                    .map(|n| match self.nodes.get(n) {
                        Some(s) => node_address(&s.node),
                        None => n.clone(),
                    })
                    .collect();
                let nodes = addresses.join(",");
                let mut binds = Vec::with_capacity(bound.len());
                for (n, binding) in bound {
                    let Some(e) = self.dequeue(&n) else { continue };
                    let rank = ranks.get(n.as_str()).copied().unwrap_or(0) as usize;
                    let local_rank = nodes_by_rank[..rank].iter().filter(|x| **x == binding.node).count() as u32;
                    binds.push(GangBind { pod: e.pod, binding, local_rank, nodes: nodes.clone() });
                }
                match binds.first().map(|b| b.pod.clone()) {
                    Some(pod) => vec![(Decision::BindGang(binds), pod)],
                    None => Vec::new(),
                }
            }
            Err(u) => {
                self.metrics.rejected(&u.counts);
                let message = unschedulable_words(u);
                if self.blocked_by.as_ref().is_none_or(|(o, _)| first < *o) {
                    self.blocked_by = Some((first, key));
                }
                let mut out = Vec::new();
                for (_, n, pod) in members {
                    let Some(e) = self.queue.get_mut(&n) else { continue };
                    e.wait = Wait::Unschedulable;
                    if let Some(d) = Self::say(e, "Unschedulable", "Warning", "FailedScheduling", message.clone()) {
                        out.push((d, pod));
                    }
                }
                out
            }
        }
    }

    /// The pod no longer counts against its array's parallelism.
    fn leave_array(&mut self, pod: &Pod) {
        let Some(array) = pod.metadata.labels.get(specs::pod::ARRAY_LABEL) else { return };
        if let Some(a) = self.arrays.get_mut(array) {
            if a.bound.remove(&pod.metadata.name) {
                let array = array.clone();
                self.wake_array(&array);
            }
        }
    }

    /// A cluster event: every pod waiting for capacity is tried again at once.
    fn wake_waiting(&mut self) {
        for e in self.queue.values_mut() {
            if e.wait == Wait::Unschedulable {
                e.wait = Wait::Now;
            }
        }
    }

    fn wake_array(&mut self, array: &str) {
        for e in self.queue.values_mut() {
            if e.wait == Wait::Throttled && e.array.as_ref().is_some_and(|(a, _)| a == array) {
                e.wait = Wait::Now;
            }
        }
    }

    /// Throttle, then schedule (or reuse a twin's failure in this pass).
    fn decide(
        &mut self,
        name: &str,
        now: Instant,
        failed: &mut HashMap<u64, Arc<str>>,
    ) -> Option<(Decision, Arc<Pod>)> {
        let e = self.queue.get(name).filter(|e| e.due(now))?;
        let pod = e.pod.clone();
        if let Some((array, limit)) = &e.array {
            let bound = self.arrays.get(array).map_or(0, |a| a.bound.len());
            if bound >= *limit {
                let message: Arc<str> =
                    format!("array {array} has {bound} unfinished tasks bound, its parallelism is {limit}").into();
                let e = self.queue.get_mut(name)?;
                e.wait = Wait::Throttled;
                return Self::say(e, "ArrayThrottled", "Normal", "ArrayThrottled", message).map(|d| (d, pod));
            }
        }
        let (twin, rejected) = (e.twin, e.rejected);
        if let Some(message) = failed.get(&twin).filter(|_| !rejected).cloned() {
            let e = self.queue.get_mut(name)?;
            e.wait = Wait::Unschedulable;
            return Self::say(e, "Unschedulable", "Warning", "FailedScheduling", message).map(|d| (d, pod));
        }
        let started_at = std::time::Instant::now();
        let decided = self.sched.schedule(name, &pod, now.into_std());
        let outcome = if decided.is_ok() { Outcome::Bound } else { Outcome::Unschedulable };
        self.metrics.attempt(outcome, started_at.elapsed().as_secs_f64());
        match decided {
            Ok(binding) => {
                self.dequeue(name);
                if let Some((array, _)) = array_limit(&pod) {
                    self.arrays.entry(array).or_default().bound.insert(name.to_string());
                }
                Some((Decision::Bind(binding, pod.metadata.uid.clone()), pod))
            }
            Err(u) => {
                self.metrics.rejected(&u.counts);
                let message = unschedulable_words(u);
                if !rejected {
                    failed.insert(twin, message.clone());
                }
                let e = self.queue.get_mut(name)?;
                e.wait = Wait::Unschedulable;
                Self::say(e, "Unschedulable", "Warning", "FailedScheduling", message).map(|d| (d, pod))
            }
        }
    }

    /// A status write only when the reason changed since the last one.
    fn say(
        e: &mut QueueEntry,
        reason: &'static str,
        event_type: &'static str,
        event_reason: &'static str,
        message: Arc<str>,
    ) -> Option<Decision> {
        if e.said.as_deref() == Some(&*message) {
            return None;
        }
        let text = message.to_string();
        e.said = Some(message);
        Some(Decision::Pending(reason, event_type, event_reason, text))
    }

    /// Pushes the node's reported truth to the scheduler, which keeps the
    /// in-flight bindings on top of it.
    fn sync_mirror(&mut self, name: &str) {
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

    #[test]
    fn a_node_is_lost_when_ready_and_silent_past_the_grace() {
        let now = Instant::now();
        let grace = Duration::from_secs(40);
        let ago = |s: u64| now - Duration::from_secs(s);
        // (name, ready, last heartbeat): lost?
        let table = [
            ("fresh", true, ago(1), false),
            ("at-grace", true, ago(40), false),
            ("silent", true, ago(41), true),
            ("already-not-ready", false, ago(500), false),
        ];
        let lost = silent_nodes(table.iter().map(|&(n, r, t, _)| (n, r, t)), now, grace);
        let want: Vec<String> = table.iter().filter(|r| r.3).map(|r| r.0.to_string()).collect();
        assert_eq!(lost, want);
        // A heartbeat from the future (a clock read across threads) is not silence.
        assert!(silent_nodes([("n", true, now + Duration::from_secs(5))].into_iter(), now, grace).is_empty());
    }

    fn pod(name: &str) -> Pod {
        specs::testing::pod(name).image("busybox:1").build()
    }

    /// A binding the store refused goes back to the queue only when the
    /// store was at fault (5xx), after the retry delay; a refusal about the
    /// pod (404 gone, 409 replaced) leaves it out.
    #[tokio::test]
    async fn a_binding_the_store_refused_is_queued_again_only_for_the_stores_own_faults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), Default::default()).expect("store");
        let (_stop, stopped) = watch::channel(false);
        let (c, _loops) =
            Controller::start(store, ControllerConfig::default(), Default::default(), stopped).expect("start");
        let binding = crate::scheduler::Binding { node: "n1".into(), epoch: 1, placement: Default::default() };
        let disk_full = || StoreError::DiskFull { dir: "/d".into(), available: 0, needed: 1 };
        let refusals = [
            ("full", ClusterError::Store(disk_full()), true),
            ("leader", ClusterError::NotLeader, true),
            ("gone", ClusterError::not_found("Pod", "x"), false),
            ("bound", ClusterError::Conflict("already bound".into()), false),
        ];
        for (code, e, requeued) in refusals {
            let p = pod(&format!("p{code}"));
            c.pod_created(&p);
            let mut inner = c.lock();
            // As `decide` leaves a pod it bound: out of the queue, its place kept.
            assert!(inner.dequeue(&p.metadata.name).is_some());
            inner.binding_not_stored(&p, &binding, &e, Duration::from_secs(60));
            let wait = inner.queue.get(&p.metadata.name).map(|e| e.wait);
            assert_eq!(matches!(wait, Some(Wait::Backoff(_))), requeued, "{code}: {wait:?}");
        }
    }
}
