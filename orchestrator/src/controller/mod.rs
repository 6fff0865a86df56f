//! The server's control loops around the scheduler: the queue of pending pods,
//! the binding writes, the scheduler's per-node mirrors, node lifecycle
//! (heartbeats, NotReady after a grace period, pods marked Unknown, reconciled
//! when the node reports again), job-array throttling, the removal of
//! finished pods after their TTL, and the workload controllers: Deployments
//! (`rollout`, the replicas of a silent node included) and DaemonSets
//! (`daemonsets`), each reconciled from the store as it is now and carried
//! out in one write.
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
//! The shape: the controller learns every change from the store's watch (and
//! from the node's calls it serves); its view lives in `state`; pure
//! deciders turn that view into effects: `decide` (the queue: bind, bind a
//! gang, say why a pod waits), `State::timers` (bindings expired, finished
//! pods past their TTL, jobs to judge again) and `lifecycle` (nodes gone
//! silent); one executor (`Controller::execute`) carries each effect out as
//! one store write through a `cluster` command and feeds what it found back.
//! The scheduler itself (`scheduler::Scheduler`) places pods.
//!
//! Every write here is `Txn::as_leader`: on a store shared by several servers
//! (etcd) it commits only under the leader's lease, so a leader deposed a
//! moment ago cannot bind or unbind anything. The mirror is updated under one
//! lock before the binding is written, so two concurrent binds never
//! overcommit a node.

mod daemonsets;
mod decide;
mod effect;
mod expiry;
mod lifecycle;
mod rollout;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use specs::api::{Node, NodeCondition, WatchEventType};
use specs::{Pod, PodPhase};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::cluster::pods::{self, GangPlace};
use crate::cluster::ClusterError;
use crate::metrics::ControllerMetrics;
use crate::scheduler::Scheduler;
use crate::store::{Change, Kind, Store, StoreError};
use effect::{Effect, GangBind};
use state::{array_limit, is_terminal, NodeState, State, Wait};

/// Locks the nodes' condition changes are striped over (`transitions`).
const TRANSITION_STRIPES: usize = 64;

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
    /// How long accounting records (`specs::acct`) are kept after their
    /// end; `None` keeps them until deleted.
    pub acct_retention: Option<Duration>,
    /// How long a Deployment's pod on a NotReady node is waited for before
    /// it is replaced elsewhere, when its template sets no
    /// `nodeLostReplaceAfterSeconds` (`never`: wait for the node).
    pub node_lost_replace_after: specs::node_lost::ReplaceAfter,
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
            acct_retention: Some(Duration::from_secs(specs::acct::DEFAULT_RETENTION_DAYS * 86_400)),
            node_lost_replace_after: specs::node_lost::ReplaceAfter::Seconds(
                specs::node_lost::DEFAULT_REPLACE_AFTER_SECONDS,
            ),
            scheduler: Default::default(),
        }
    }
}

/// How often accounting records past their retention are looked for.
const ACCT_PRUNE_PERIOD: Duration = Duration::from_secs(3600);
/// Accounting records removed per write: each is two operations (the
/// record and its log entry), well under etcd's 128 per transaction.
const ACCT_PRUNE_CHUNK: usize = 32;

/// Most pods taken from the queue per scheduling pass.
const PASS: usize = 2048;
/// Queued pods decided under one lock.
const DECIDE_CHUNK: usize = 32;
/// Binding writes in flight at once (the store folds them into shared flushes).
const WRITES_IN_FLIGHT: usize = 4096;

/// The instant unix second `at` begins: a workload's requeue time, to its
/// second rather than `at - now` whole seconds from a `now` rounded down,
/// which fired a timer up to a second late.
fn at_unix_second(at: u64) -> Instant {
    let wait = (std::time::UNIX_EPOCH + Duration::from_secs(at))
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    Instant::now() + wait
}

/// Now in unix seconds, as Deployments' statuses keep time.
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Now in unix seconds rounded up: when a node stopped being Ready, so that
/// a timer counted from it never falls before its time.
fn unix_now_ceil() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// The Deployments owning any of `pods`.
fn deployments_of(pods: &[Pod]) -> std::collections::BTreeSet<String> {
    pods.iter().filter_map(|p| p.metadata.labels.get(specs::deployment::DEPLOYMENT_LABEL).cloned()).collect()
}

/// Seconds left of a running job's time limit, from its `startTime` and the
/// realtime clock: read once, when the controller learns of the job; its
/// timer runs on the monotonic clock from there.
fn time_left(job: &specs::job::Job) -> Option<u64> {
    let start = job.status.as_ref()?.start_time.as_deref()?;
    let start = chrono::DateTime::parse_from_rfc3339(start).ok()?;
    let running_for = (chrono::Utc::now() - start.with_timezone(&chrono::Utc)).num_seconds().max(0);
    specs::job::time_left(job, Some(running_for as u64))
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
    inner: Mutex<State>,
    wake: Notify,
    writes: Arc<Semaphore>,
    /// Serializes one node's condition changes (NotReady, Ready, status
    /// reports) so a heartbeat racing the NotReady marking cannot be lost.
    /// Striped by node name: one lock for all nodes made every report wait
    /// for the one before it to be durable, so a thousand nodes' reports
    /// committed one fsync at a time instead of together.
    transitions: Vec<tokio::sync::Mutex<()>>,
    /// The store version its pods were loaded at: `follow` watches from it.
    loaded_at: std::sync::atomic::AtomicU64,
    /// Bindings counted outside the lock (`State` has the same handles).
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
            // One backoff: a node's rejection is timed by the scheduler (which
            // also keeps the pod off that node's current state), with the
            // controller's settings; one record of in-flight bindings, the
            // scheduler's, with the controller's expiry.
            inner: Mutex::new(State::new(
                Scheduler::new(crate::scheduler::SchedulerConfig {
                    backoff_initial: config.backoff_base,
                    backoff_max: config.backoff_max,
                    assume_expiry: config.binding_timeout,
                    ..config.scheduler
                }),
                metrics.clone(),
            )),
            wake: Notify::new(),
            writes: Arc::new(Semaphore::new(WRITES_IN_FLIGHT)),
            transitions: (0..TRANSITION_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            loaded_at: std::sync::atomic::AtomicU64::new(0),
            metrics,
        });
        {
            let mut inner = c.lock();
            for node in store.list::<Node>()?.items {
                let name = node.metadata.name.clone();
                // A restart is not a missed heartbeat: every node gets a fresh grace period.
                inner.nodes.insert(name.clone(), NodeState::new(node, now, unix_now_ceil()));
                inner.sync_mirror(&name);
            }
            // A pod may have changed while no server was leading: every
            // Deployment is reconciled once at the start.
            for d in store.list::<specs::deployment::Deployment>()?.items {
                inner.dirty_deployments.insert(d.metadata.name);
            }
            // The same for DaemonSets (a node may have joined or left too).
            for d in store.list::<specs::daemonset::DaemonSet>()?.items {
                inner.daemonsets.insert(d.metadata.name.clone());
                inner.dirty_daemonsets.insert(d.metadata.name);
            }
            // A member may have ended while no server was leading: judged again.
            for job in store.list::<specs::job::Job>()?.items {
                if !job.status.as_ref().is_some_and(|s| s.phase.is_terminal()) {
                    inner.learn_job(&job, time_left(&job), now);
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
                        inner.expiry.set(now + ttl, &name, pod.metadata.uid.clone().unwrap_or_default());
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

    fn lock(&self) -> MutexGuard<'_, State> {
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

    /// The pods each node is stopping (`NodeStatus::terminating`), by node.
    pub fn terminating(&self) -> Vec<(String, specs::api::TerminatingPod)> {
        let inner = self.lock();
        let mut out: Vec<_> = inner
            .nodes
            .iter()
            .flat_map(|(name, n)| n.node.status.terminating.iter().map(move |t| (name.clone(), t.clone())))
            .collect();
        out.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        out
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
        inner.expiry.forget(name);
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
            inner.expiry.set(Instant::now() + ttl, name, uid);
        }
        inner.wake_waiting();
        drop(inner);
        self.wake.notify_one();
    }

    pub fn node_registered(&self, node: &Node) {
        let mut inner = self.lock();
        let name = node.metadata.name.clone();
        let now = Instant::now();
        let entry =
            inner.nodes.entry(name.clone()).or_insert_with(|| NodeState::new(node.clone(), now, unix_now_ceil()));
        if entry.node.spec.topology != node.spec.topology {
            entry.topology = Arc::new(node.spec.topology.clone());
        }
        entry.node = node.clone();
        entry.set_ready(node.status.condition == NodeCondition::Ready, unix_now_ceil());
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

    /// Held while node `name`'s condition is written (see `transitions`).
    pub async fn transition_guard(&self, name: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let stripe = specs::deployment::fnv1a64(name.as_bytes()) % TRANSITION_STRIPES as u64;
        self.transitions[stripe as usize].lock().await
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
        let _g = self.transition_guard(name).await;
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
                // Its pods count again: a Deployment with one replaced may
                // have one too many, and one waiting on a timer has none.
                match self.store.list::<Pod>() {
                    Ok(listed) => {
                        let on: Vec<Pod> =
                            listed.items.into_iter().filter(|p| p.spec.node_name.as_deref() == Some(name)).collect();
                        self.mark_dirty(deployments_of(&on));
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "cannot list a returning node's pods"),
                }
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
        n.set_ready(node.status.condition == NodeCondition::Ready, unix_now_ceil());
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

    /// A node rejected a DaemonSet's pod, which failed there
    /// (`pods::reject`): it leaves the mirror as a finished pod does, and
    /// the same pod (same node, same template) is not made there again for
    /// `UNFIT_RETRY_SECONDS`.
    pub fn daemon_pod_rejected(&self, pod: &Pod) {
        let why = pod.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_else(|| "rejected by its node".into());
        let until = Instant::now() + Duration::from_secs(daemonsets::UNFIT_RETRY_SECONDS);
        self.lock().daemon_rejected.insert(pod.metadata.name.clone(), (until, why));
        self.pod_finished(pod);
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
            (Kind::Job, event_type) => match serde_json::from_str::<specs::job::Job>(&change.object) {
                Ok(mut job) => {
                    if event_type == WatchEventType::Deleted {
                        // Gone: as an ended job, for the timers and for the
                        // dependencies that name it.
                        job.status.get_or_insert_with(Default::default).phase = specs::job::JobPhase::Failed;
                    } else if event_type == WatchEventType::Added && job.spec.dependency.is_some() {
                        // A new job with a dependency: judged once the write is seen.
                        self.lock().dirty_jobs.insert(job.metadata.name.clone());
                    }
                    self.lock().learn_job(&job, time_left(&job), Instant::now());
                    self.wake.notify_one();
                }
                Err(e) => tracing::warn!(job = %change.name, error = %e, "a job change that does not decode: skipped"),
            },
            _ => {}
        }
        // A Deployment learns of itself and of its pods here, whatever changed.
        let deployment = match change.kind {
            Kind::Deployment => Some(change.name.clone()),
            Kind::Pod => change.labels.get(specs::deployment::DEPLOYMENT_LABEL).cloned(),
            _ => None,
        };
        if let Some(name) = deployment {
            self.lock().dirty_deployments.insert(name);
            self.wake.notify_one();
        }
        self.daemonsets_learn(change);
    }

    /// A DaemonSet learns of itself and of its pods; every DaemonSet learns
    /// of a node that joins, leaves, or changes its labels or readiness.
    fn daemonsets_learn(&self, change: &Change) {
        let mut inner = self.lock();
        match change.kind {
            Kind::DaemonSet => {
                if change.event_type == WatchEventType::Deleted {
                    inner.daemonsets.remove(&change.name);
                } else {
                    inner.daemonsets.insert(change.name.clone());
                }
                // Deleted too: its pods left behind go.
                inner.dirty_daemonsets.insert(change.name.clone());
            }
            Kind::Pod => match change.labels.get(specs::daemonset::DAEMONSET_LABEL) {
                Some(name) => {
                    inner.dirty_daemonsets.insert(name.clone());
                }
                None => return,
            },
            Kind::Node => {
                let seen = if change.event_type == WatchEventType::Deleted {
                    None
                } else {
                    match serde_json::from_str::<Node>(&change.object) {
                        Ok(n) => Some((n.metadata.labels, n.status.condition == NodeCondition::Ready)),
                        Err(e) => {
                            tracing::warn!(node = %change.name, error = %e, "a node change that does not decode");
                            None
                        }
                    }
                };
                let before = match &seen {
                    Some(s) => inner.daemonset_nodes.insert(change.name.clone(), s.clone()),
                    None => inner.daemonset_nodes.remove(&change.name),
                };
                if before == seen {
                    return;
                }
                let all: Vec<String> = inner.daemonsets.iter().cloned().collect();
                inner.dirty_daemonsets.extend(all);
            }
            _ => return,
        }
        drop(inner);
        self.wake.notify_one();
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

    /// Timers due (expired bindings, finished pods past their TTL, jobs to
    /// judge), then scheduling passes over the due pods; every effect goes to
    /// the executor. Returns when the next timer is due.
    async fn pass(self: &Arc<Self>) -> Option<Instant> {
        loop {
            let now = Instant::now();
            let due = self.lock().timers(now);
            for effect in due {
                self.spawn(effect).await?;
            }
            let due = self.lock().due_pods(now, PASS);
            if due.is_empty() {
                return self.lock().next_timer();
            }
            // Twins (equal specs) that fit nowhere in this pass.
            let mut failed: HashMap<u64, Arc<str>> = HashMap::new();
            // A few pods per lock: most retries of waiting pods end at a twin's
            // failure, and a create must not wait for a whole pass.
            for chunk in due.chunks(DECIDE_CHUNK) {
                let effects: Vec<Effect> = {
                    let mut inner = self.lock();
                    chunk.iter().flat_map(|name| inner.decide_any(name, now, &mut failed)).collect()
                };
                for effect in effects {
                    self.spawn(effect).await?;
                }
            }
        }
    }

    /// Carries `effect` out in its own task, at most `WRITES_IN_FLIGHT` at
    /// once (the store folds concurrent writes into shared flushes). `None`
    /// when the controller is closing.
    async fn spawn(self: &Arc<Self>, effect: Effect) -> Option<()> {
        let permit = self.writes.clone().acquire_owned().await.ok()?;
        let this = self.clone();
        tokio::spawn(async move {
            this.execute(effect).await;
            drop(permit);
        });
        Some(())
    }

    /// The one executor: each effect is one store write through a `cluster`
    /// command, and what the write found goes back into the state.
    async fn execute(&self, effect: Effect) {
        match effect {
            Effect::Bind { pod, binding } => self.bind(&pod, binding).await,
            Effect::BindGang(members) => self.bind_gang(members).await,
            Effect::SayWaiting { pod, why } => self.say_waiting(pod, why).await,
            Effect::ExpireBinding { pod, node } => self.expire_binding(pod, node).await,
            Effect::RemoveFinished { pod, uid } => self.remove_finished(pod, uid).await,
            Effect::ReconcileJob(job) => self.reconcile_job(job).await,
            Effect::MarkLost(node) => self.mark_lost(&node).await,
            Effect::ReconcileDaemonSet(name) => {
                self.reconcile_daemonset(&name).await;
                let mut inner = self.lock();
                inner.reconciling_daemonsets.remove(&name);
                let again = inner.dirty_daemonsets.contains(&name);
                drop(inner);
                if again {
                    self.wake.notify_one();
                }
            }
            Effect::ReconcileDeployment(name) => {
                self.reconcile_deployment(&name).await;
                let mut inner = self.lock();
                inner.reconciling.remove(&name);
                let again = inner.dirty_deployments.contains(&name);
                drop(inner);
                if again {
                    self.wake.notify_one();
                }
            }
        }
    }

    /// One Deployment: its plan from the store as it is now
    /// (`rollout::decide`), carried out in one write. A plan made from a
    /// Deployment that changed meanwhile is dropped and made again.
    async fn reconcile_deployment(&self, name: &str) {
        use crate::cluster::deployments::{self, Decided};
        let read = || -> Result<(Option<specs::deployment::Deployment>, Vec<Pod>), StoreError> {
            let d = self.store.get::<specs::deployment::Deployment>(name)?;
            Ok((d, self.pods_labelled(specs::deployment::DEPLOYMENT_LABEL, name)?))
        };
        let (d, pods) = match read() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(deployment = %name, error = %e, "cannot read a deployment; trying again");
                self.retry_deployment(name);
                return;
            }
        };
        let Some(d) = d else {
            // Gone: its pods that are left go too.
            if pods.is_empty() {
                return;
            }
            let left: Vec<(String, Option<String>)> =
                pods.into_iter().map(|p| (p.metadata.name, p.metadata.owner)).collect();
            let n = name.to_string();
            let r = self
                .store
                .write(move |t| {
                    t.as_leader();
                    deployments::delete_orphans(t, &n, &left)
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(deployment = %name, error = %e, "cannot remove a deleted deployment's pods");
                self.retry_deployment(name);
            }
            return;
        };
        let now = unix_now();
        let suffixes =
            std::iter::from_fn(|| crate::tls::random_token().ok()).map(|t| specs::deployment::fnv1a64(t.as_bytes()));
        let nodes = {
            let inner = self.lock();
            let on = pods.iter().filter_map(|p| p.spec.node_name.as_deref());
            let conditions =
                on.filter_map(|n| inner.nodes.get(n).map(|st| (n.to_string(), st.condition(now)))).collect();
            rollout::Nodes { conditions, default: self.config.node_lost_replace_after }
        };
        let decision = rollout::decide(&d, &pods, &nodes, now, suffixes);
        let mut create = Vec::with_capacity(decision.create.len());
        for pod in decision.create {
            match crate::cluster::new_uid() {
                Ok(uid) => create.push((pod, uid)),
                Err(e) => return tracing::error!(error = %e, "cannot draw a pod's uid"),
            }
        }
        let decided = Decided {
            name: name.to_string(),
            resource_version: d.metadata.resource_version,
            create,
            delete: decision.delete,
            mark_replaced: decision.replaced.iter().map(|r| r.pod.clone()).collect(),
            replaced_at: now,
            status: decision.status,
        };
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                deployments::carry_out(t, &decided)
            })
            .await;
        match r {
            Ok(c) if !c.current => {
                self.lock().dirty_deployments.insert(name.to_string());
            }
            Ok(_) => {
                for r in &decision.replaced {
                    tracing::info!(
                        deployment = %name, pod = %r.pod, node = %r.node,
                        "pod replaced elsewhere: its node has been NotReady past its nodeLostReplaceAfterSeconds"
                    );
                }
                for s in &decision.duplicates {
                    tracing::info!(deployment = %name, pod = %s.pod, why = s.why, "duplicate stopped");
                }
                let mut inner = self.lock();
                match decision.requeue_at {
                    Some(at) => {
                        inner.deployment_timers.insert(name.to_string(), at_unix_second(at));
                    }
                    None => {
                        inner.deployment_timers.remove(name);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(deployment = %name, error = %e, "cannot carry out a deployment's plan; trying again");
                self.retry_deployment(name);
            }
        }
    }

    /// One DaemonSet: its plan from the store as it is now
    /// (`daemonsets::decide`), each new pod placed on its node by the
    /// scheduler under its lock, the plan carried out in one write. A plan
    /// made from a DaemonSet that changed meanwhile is dropped (its
    /// placements given back) and made again.
    async fn reconcile_daemonset(&self, name: &str) {
        use crate::cluster::daemonsets::{self as cluster_ds, Decided};
        use specs::daemonset::{DaemonSet, DAEMONSET_LABEL};
        type Read = (Option<DaemonSet>, Vec<Node>, Vec<Pod>);
        let read = || -> Result<Read, StoreError> {
            let d = self.store.get::<DaemonSet>(name)?;
            let nodes = if d.is_some() { self.store.list::<Node>()?.items } else { Vec::new() };
            Ok((d, nodes, self.pods_labelled(DAEMONSET_LABEL, name)?))
        };
        let (d, nodes, pods) = match read() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(daemonset = %name, error = %e, "cannot read a daemonset; trying again");
                self.retry_daemonset(name);
                return;
            }
        };
        let Some(d) = d else {
            // Gone: its pods that are left go too.
            if pods.is_empty() {
                return;
            }
            let left: Vec<(String, Option<String>)> =
                pods.into_iter().map(|p| (p.metadata.name, p.metadata.owner)).collect();
            let n = name.to_string();
            let r = self
                .store
                .write(move |t| {
                    t.as_leader();
                    cluster_ds::delete_orphans(t, &n, &left)
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(daemonset = %name, error = %e, "cannot remove a deleted daemonset's pods");
                self.retry_daemonset(name);
            }
            return;
        };
        let now = unix_now();
        let decision = {
            let mut inner = self.lock();
            let at = Instant::now();
            inner.daemon_rejected.retain(|_, (until, _)| *until > at);
            daemonsets::decide(&d, &nodes, &pods, now, |node, pod| {
                if let Some((_, why)) = inner.daemon_rejected.get(&pod.metadata.name) {
                    return Err(why.clone());
                }
                inner.sched.place_on(node, &pod.metadata.name, pod, at.into_std())
            })
        };
        let placed: Vec<String> = decision.create.iter().map(|(p, _)| p.metadata.name.clone()).collect();
        let give_back = |this: &Self| {
            let mut inner = this.lock();
            for p in &placed {
                inner.sched.release(p);
            }
            inner.wake_waiting();
        };
        let mut create = Vec::with_capacity(decision.create.len());
        for (pod, binding) in decision.create {
            match crate::cluster::new_uid() {
                Ok(uid) => create.push((pod, uid, binding)),
                Err(e) => {
                    give_back(self);
                    tracing::error!(error = %e, "cannot draw a pod's uid");
                    self.retry_daemonset(name);
                    return;
                }
            }
        }
        let decided = Decided {
            name: name.to_string(),
            resource_version: d.metadata.resource_version,
            create,
            delete: decision.delete,
            status: decision.status,
        };
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                cluster_ds::carry_out(t, &decided)
            })
            .await;
        match r {
            Ok(c) if !c.current => {
                give_back(self);
                self.lock().dirty_daemonsets.insert(name.to_string());
            }
            Ok(_) => {
                let mut inner = self.lock();
                match decision.requeue_at {
                    Some(at) => {
                        // Whole seconds from now: the rejection pause it waits
                        // out is counted on the monotonic clock from its
                        // rejection, so the start of a unix second can fall
                        // short of it.
                        let wait = Duration::from_secs(at.saturating_sub(now));
                        inner.daemonset_timers.insert(name.to_string(), Instant::now() + wait);
                    }
                    None => {
                        inner.daemonset_timers.remove(name);
                    }
                }
            }
            Err(e) => {
                give_back(self);
                tracing::warn!(daemonset = %name, error = %e, "cannot carry out a daemonset's plan; trying again");
                self.retry_daemonset(name);
            }
        }
    }

    /// A workload's pods (labelled `label=name`) as the store has them now.
    fn pods_labelled(&self, label: &str, name: &str) -> Result<Vec<Pod>, StoreError> {
        let pods = self.store.list::<Pod>()?.items;
        Ok(pods.into_iter().filter(|p| p.metadata.labels.get(label).map(String::as_str) == Some(name)).collect())
    }

    /// A DaemonSet whose reconcile failed: tried again after the backoff's
    /// first step.
    fn retry_daemonset(&self, name: &str) {
        let at = Instant::now() + self.config.backoff_base;
        self.lock().daemonset_timers.insert(name.to_string(), at);
    }

    /// A Deployment whose reconcile failed on the store: tried again after
    /// the backoff's first step.
    fn retry_deployment(&self, name: &str) {
        let at = Instant::now() + self.config.backoff_base;
        self.lock().deployment_timers.insert(name.to_string(), at);
    }

    async fn bind(&self, pod: &Pod, binding: crate::scheduler::Binding) {
        let b = binding.clone();
        let name = pod.metadata.name.clone();
        let (pod_name, uid) = (name.clone(), pod.metadata.uid.clone());
        let r = self
            .store
            .write(move |t| -> Result<(), ClusterError> {
                t.as_leader();
                pods::bind(t, &pod_name, &uid, &b, None)
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
    async fn bind_gang(&self, members: Vec<GangBind>) {
        let Some(job) = members.first().and_then(|m| specs::job::Gang::of(&m.pod)).map(|g| g.job) else { return };
        let plan: Vec<(String, Option<String>, crate::scheduler::Binding, GangPlace)> = members
            .iter()
            .map(|m| (m.pod.metadata.name.clone(), m.pod.metadata.uid.clone(), m.binding.clone(), m.place.clone()))
            .collect();
        let j = job.clone();
        let r = self
            .store
            .write(move |t| -> Result<(), ClusterError> {
                t.as_leader();
                for (name, uid, b, place) in &plan {
                    pods::bind(t, name, uid, b, Some(place))?;
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

    /// A member of the job changed, or its time limit ran out, or a job its
    /// dependency names changed: the job's verdict, carried out in one write.
    async fn reconcile_job(&self, name: String) {
        let n = name.clone();
        let past_deadline = self.lock().jobs_past_deadline.contains(&name);
        let r = self
            .store
            .write(move |t| -> Result<crate::cluster::jobs::MemberChanges, ClusterError> {
                t.as_leader();
                crate::cluster::jobs::reconcile(t, &n, past_deadline)
            })
            .await;
        match r {
            Ok(changes) => {
                for p in &changes.deleted {
                    self.pod_deleted(p);
                }
                self.pods_created(&changes.created);
            }
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "cannot record a job's progress");
                if past_deadline {
                    // A job past its time limit must end: tried again shortly.
                    self.lock().job_deadlines.insert(name, Instant::now() + Duration::from_secs(1));
                    self.wake.notify_one();
                }
            }
        }
    }

    async fn say_waiting(&self, name: String, why: pods::Waiting) {
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                pods::say_waiting(t, &name, &why)
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot record why a pod is pending");
        }
    }

    /// A binding expired unconfirmed (the scheduler already gave its capacity
    /// back): the pod is unbound in the store and queued again, unless the node
    /// has reported it meanwhile.
    async fn expire_binding(&self, name: String, node: String) {
        let timeout = self.config.binding_timeout;
        let n = name.clone();
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                pods::expire_binding(t, &n, &node, timeout)
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
            .write(move |t| {
                t.as_leader();
                pods::remove_finished(t, &n, &uid)
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

    /// Removes the accounting records past the retention, a chunk per write.
    async fn prune_acct(&self) {
        let Some(retention) = self.config.acct_retention else { return };
        let now = chrono::Utc::now().timestamp();
        let listed = match self.store.list::<specs::acct::Record>() {
            Ok(l) => l.items,
            Err(e) => return tracing::error!(error = %e, "cannot list accounting records"),
        };
        let names: Vec<String> = listed
            .into_iter()
            .filter(|r| specs::acct::expired(r, now, retention.as_secs()))
            .map(|r| r.metadata.name)
            .collect();
        for chunk in names.chunks(ACCT_PRUNE_CHUNK) {
            let chunk = chunk.to_vec();
            let secs = retention.as_secs();
            let r = self
                .store
                .write(move |t| {
                    t.as_leader();
                    crate::cluster::acct::prune(t, &chunk, now, secs)
                })
                .await;
            match r {
                Ok(n) => tracing::debug!(records = n, "accounting records past their retention removed"),
                Err(e) => return tracing::error!(error = %e, "cannot remove old accounting records"),
            }
        }
    }

    async fn lifecycle_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let period = (self.config.heartbeat_grace / 4).max(Duration::from_millis(50));
        // The first pass at start: a server down for long prunes at once.
        let mut next_prune = Instant::now();
        loop {
            if Instant::now() >= next_prune {
                next_prune = Instant::now() + ACCT_PRUNE_PERIOD;
                self.prune_acct().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let lost = self.lock().silent(Instant::now(), self.config.heartbeat_grace);
            for effect in lost {
                self.execute(effect).await;
            }
        }
    }

    /// A node silent past the grace: NotReady, its pods Unknown. Judged again
    /// under the transitions lock, so a heartbeat that arrived meanwhile wins.
    async fn mark_lost(&self, name: &str) {
        let grace = self.config.heartbeat_grace;
        let _g = self.transition_guard(name).await;
        let still_lost = {
            let inner = self.lock();
            let seen = inner.nodes.get(name).map(|n| (name, n.ready, n.last_seen));
            !lifecycle::silent_nodes(seen.into_iter(), Instant::now(), grace).is_empty()
        };
        if !still_lost {
            return;
        }
        // Not Ready in memory before the store says so: a heartbeat that lands
        // while the write is in flight then waits for this transition and
        // writes Ready after it, instead of finding the node Ready in memory
        // and leaving the stored NotReady for the next heartbeat to undo.
        self.set_ready(name, false);
        let pods = match self.store.list::<Pod>() {
            Ok(listed) => listed.items,
            Err(e) => {
                self.set_ready(name, true);
                return tracing::error!(error = %e, "cannot list pods");
            }
        };
        let on_node: Vec<Pod> = pods
            .into_iter()
            .filter(|p| p.spec.node_name.as_deref() == Some(name))
            .filter(|p| !is_terminal(p))
            .collect();
        let deployments = deployments_of(&on_node);
        let mine: Vec<String> = on_node.into_iter().map(|p| p.metadata.name).collect();
        let node_name = name.to_string();
        // The time `set_ready` above recorded, stored with the NotReady.
        let since = self.lock().nodes.get(name).and_then(|n| n.not_ready_since).unwrap_or_else(unix_now_ceil);
        let r = self
            .store
            .write(move |t| {
                t.as_leader();
                crate::cluster::nodes::mark_lost(t, &node_name, &mine, grace, since)
            })
            .await;
        match r {
            Ok(Some(node)) => {
                self.node_updated(&node, false);
                // Their node-lost timers start now.
                self.mark_dirty(deployments);
            }
            Ok(None) => {}
            Err(e) => {
                // Still Ready in the store: the next lifecycle pass tries again.
                self.set_ready(name, true);
                tracing::error!(node = %name, error = %e, "cannot mark node NotReady");
            }
        }
    }

    /// These Deployments are reconciled at the next pass.
    fn mark_dirty(&self, deployments: std::collections::BTreeSet<String>) {
        if deployments.is_empty() {
            return;
        }
        self.lock().dirty_deployments.extend(deployments);
        self.wake.notify_one();
    }

    fn set_ready(&self, name: &str, ready: bool) {
        if let Some(n) = self.lock().nodes.get_mut(name) {
            n.set_ready(ready, unix_now_ceil());
        }
    }
}
