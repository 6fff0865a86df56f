//! The server's control loops around the scheduler: the queue of pending pods
//! (with exponential backoff and a reason for every wait), the binding writes,
//! the scheduler's per-node mirrors (the node's reported truth plus bindings it
//! has not reported yet), and node lifecycle (heartbeats, NotReady after a grace
//! period, pods marked Unknown, reconciled when the node reports again).
//!
//! The scheduler itself (`scheduler::Scheduler`) decides; this module feeds it
//! and writes its decisions. The mirror is updated under one lock before the
//! binding is written, so two concurrent binds never overcommit a node.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use specs::api::{Event, Node, NodeCondition, ObjectRef, PodPlan};
use specs::pod::ObjectMeta;
use specs::{Allocations, Placement, Pod, PodPhase, PodStatus};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::api::error::Refused;
use crate::scheduler::{NodeInfo, Scheduler};
use crate::store::{Store, StoreError};

#[derive(Debug, Clone, Copy)]
pub struct ControllerConfig {
    /// A node that sends no heartbeat for this long becomes NotReady.
    pub heartbeat_grace: Duration,
    /// First retry delay of a pod that could not be placed or was rejected
    /// (doubling per try up to `backoff_max`); the rejection delay is the
    /// scheduler's (`on_rejection`), set from these.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub scheduler: crate::scheduler::SchedulerConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            heartbeat_grace: Duration::from_secs(40),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            scheduler: Default::default(),
        }
    }
}

/// Most pods taken from the queue per scheduling pass.
const PASS: usize = 2048;
/// Binding writes in flight at once (the store folds them into shared flushes).
const WRITES_IN_FLIGHT: usize = 4096;

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub fn event(kind: &str, name: &str, event_type: &str, reason: &str, message: impl Into<String>) -> Event {
    Event {
        metadata: ObjectMeta::default(),
        involved_object: ObjectRef { kind: kind.into(), name: name.into() },
        event_type: event_type.into(),
        reason: reason.into(),
        message: message.into(),
        timestamp: now_rfc3339(),
    }
}

struct NodeState {
    node: Node,
    /// Shared with the scheduler's mirror; rebuilt only when the node re-registers.
    topology: Arc<specs::NodeTopology>,
    ready: bool,
    last_seen: Instant,
    /// Status reports received; a rejected pod waits for the next one.
    reports: u64,
    truth: Allocations,
    /// Bindings not yet in the node's reported allocations.
    inflight: BTreeMap<String, Placement>,
}

struct QueueEntry {
    not_before: Instant,
    failures: u32,
    /// Placed nowhere: retried early when a node changes.
    unschedulable: bool,
    /// Rejected by this node at this report count: not retried there on the same
    /// stale mirror (waits for the node's next report, or for it to go NotReady).
    wait_report: Option<(String, u64)>,
}

struct Inner {
    sched: Scheduler,
    nodes: HashMap<String, NodeState>,
    queue: BTreeMap<String, QueueEntry>,
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
}

impl Controller {
    /// Loads nodes and pods from the store and starts the loops; they end when
    /// `shutdown` turns true.
    pub fn start(
        store: Store,
        config: ControllerConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(Arc<Controller>, Vec<tokio::task::JoinHandle<()>>), StoreError> {
        let now = Instant::now();
        let c = Arc::new(Controller {
            store: store.clone(),
            config,
            inner: Mutex::new(Inner {
                // One backoff: a node's rejection is timed by the scheduler
                // (which also keeps the pod off that node's current state),
                // with the controller's settings.
                sched: Scheduler::new(crate::scheduler::SchedulerConfig {
                    backoff_initial: config.backoff_base,
                    backoff_max: config.backoff_max,
                    ..config.scheduler
                }),
                nodes: HashMap::new(),
                queue: BTreeMap::new(),
            }),
            wake: Notify::new(),
            writes: Arc::new(Semaphore::new(WRITES_IN_FLIGHT)),
            transitions: tokio::sync::Mutex::new(()),
        });
        {
            let mut inner = c.lock();
            let (_, nodes) = store.list::<Node>()?;
            for node in nodes {
                let name = node.metadata.name.clone();
                let truth = node.status.allocations.clone();
                let ready = node.status.condition == NodeCondition::Ready;
                // A restart is not a missed heartbeat: every node gets a fresh grace period.
                inner.nodes.insert(
                    name,
                    NodeState {
                        topology: Arc::new(node.spec.topology.clone()),
                        node,
                        ready,
                        last_seen: now,
                        reports: 0,
                        truth,
                        inflight: BTreeMap::new(),
                    },
                );
            }
            let (_, pods) = store.list::<Pod>()?;
            for pod in pods {
                let phase = pod.status.as_ref().map(|s| s.phase).unwrap_or_default();
                match (&pod.spec.node_name, pod.status.as_ref().and_then(|s| s.plan.as_ref())) {
                    (Some(node), Some(plan)) if phase == PodPhase::Scheduled => {
                        if let Some(n) = inner.nodes.get_mut(node) {
                            if !n.truth.pods.contains_key(&pod.metadata.name) {
                                n.inflight.insert(pod.metadata.name.clone(), plan.placement.clone());
                            }
                        }
                    }
                    (None, _) if !phase.is_terminal() => {
                        inner.queue.insert(
                            pod.metadata.name.clone(),
                            QueueEntry { not_before: now, failures: 0, unschedulable: false, wait_report: None },
                        );
                    }
                    _ => {}
                }
            }
            let names: Vec<String> = inner.nodes.keys().cloned().collect();
            for n in names {
                inner.sync_mirror(&n);
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

    pub fn pod_created(&self, pod: &Pod) {
        if pod.spec.node_name.is_some() {
            return;
        }
        self.lock().queue.insert(
            pod.metadata.name.clone(),
            QueueEntry { not_before: Instant::now(), failures: 0, unschedulable: false, wait_report: None },
        );
        self.wake.notify_one();
    }

    pub fn pod_deleted(&self, pod: &Pod) {
        let mut inner = self.lock();
        inner.queue.remove(&pod.metadata.name);
        // A later pod of the same name is a new pod: no backoff, no stale marks.
        inner.sched.release(&pod.metadata.name);
        if let Some(node) = &pod.spec.node_name {
            if let Some(n) = inner.nodes.get_mut(node) {
                n.inflight.remove(&pod.metadata.name);
                // The node frees it in its truth and reports; until then keep the
                // mirror conservative only for what the node still reports.
            }
            let node = node.clone();
            inner.sync_mirror(&node);
        }
        drop(inner);
        self.wake_unschedulable();
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
            reports: 0,
            truth: node.status.allocations.clone(),
            inflight: BTreeMap::new(),
        });
        if entry.node.spec.topology != node.spec.topology {
            entry.topology = Arc::new(node.spec.topology.clone());
        }
        entry.node = node.clone();
        entry.ready = node.status.condition == NodeCondition::Ready;
        entry.last_seen = now;
        inner.sync_mirror(&name);
        drop(inner);
        self.wake_unschedulable();
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
    pub async fn heartbeat(&self, name: &str) -> Result<bool, Refused> {
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
            .write(move |t| -> Result<Option<Node>, Refused> {
                let Some(mut node) = t.get::<Node>(&n)? else { return Ok(None) };
                node.status.condition = NodeCondition::Ready;
                t.put(&mut node)?;
                t.add_event(event("Node", &n, "Normal", "NodeReady", "heartbeats resumed"))?;
                Ok(Some(node))
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
        let mut inner = self.lock();
        let name = node.metadata.name.clone();
        let Some(n) = inner.nodes.get_mut(&name) else {
            drop(inner);
            return self.node_registered(node);
        };
        n.node = node.clone();
        n.ready = node.status.condition == NodeCondition::Ready;
        n.last_seen = Instant::now();
        if reported {
            n.reports += 1;
            n.truth = node.status.allocations.clone();
            let truth = &n.truth;
            n.inflight.retain(|pod, _| !truth.pods.contains_key(pod));
        }
        inner.sync_mirror(&name);
        drop(inner);
        self.wake_unschedulable();
    }

    /// A nodelet refused a binding: the pod goes back to the queue with backoff.
    /// The scheduler also marks the node stale for this pod, so the retry goes
    /// elsewhere until that node's state changes (in topology-blind mode the
    /// node's totals would otherwise invite the same binding again).
    pub fn pod_rejected(&self, pod: &str, node: &str, reason: &str, failures: u32) {
        let mut inner = self.lock();
        let reports = match inner.nodes.get_mut(node) {
            Some(n) => {
                n.inflight.remove(pod);
                n.reports
            }
            None => 0,
        };
        inner.sync_mirror(node);
        let retry_at = inner.sched.on_rejection(pod, node, reason, std::time::Instant::now());
        inner.queue.insert(
            pod.to_string(),
            QueueEntry {
                not_before: Instant::from_std(retry_at),
                failures,
                unschedulable: false,
                wait_report: Some((node.to_string(), reports)),
            },
        );
        drop(inner);
        self.wake.notify_one();
    }

    fn backoff(&self, failures: u32) -> Duration {
        let f = self.config.backoff_base.saturating_mul(1u32 << failures.min(16));
        f.min(self.config.backoff_max)
    }

    fn wake_unschedulable(&self) {
        let now = Instant::now();
        let mut inner = self.lock();
        let mut any = false;
        for e in inner.queue.values_mut().filter(|e| e.unschedulable) {
            e.not_before = e.not_before.min(now);
            any = true;
        }
        drop(inner);
        if any {
            self.wake.notify_one();
        }
    }

    /// Pods waiting in the queue (for status and tests).
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
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

    /// One scheduling pass over due pods; returns when the next one is due.
    async fn pass(self: &Arc<Self>) -> Option<Instant> {
        loop {
            let now = Instant::now();
            let due: Vec<String> = {
                let inner = self.lock();
                inner
                    .queue
                    .iter()
                    .filter(|(_, e)| e.not_before <= now && !inner.waits_for_report(e))
                    .map(|(k, _)| k.clone())
                    .take(PASS)
                    .collect()
            };
            if due.is_empty() {
                let inner = self.lock();
                return inner.queue.values().filter(|e| !inner.waits_for_report(e)).map(|e| e.not_before).min().or(
                    // Rejected pods wait for a report; look again now and then.
                    if inner.queue.is_empty() { None } else { Some(now + Duration::from_secs(1)) },
                );
            }
            for name in due {
                let pod = match self.store.get::<Pod>(&name) {
                    Ok(Some(p)) if p.spec.node_name.is_none() => p,
                    Ok(_) => {
                        self.lock().queue.remove(&name);
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(pod = %name, error = %e, "cannot read a queued pod");
                        continue;
                    }
                };
                let decision = {
                    let mut inner = self.lock();
                    let r = inner.sched.schedule(&name, &pod);
                    match &r {
                        Ok(b) => {
                            inner.queue.remove(&name);
                            if let Some(n) = inner.nodes.get_mut(&b.node) {
                                n.inflight.insert(name.clone(), b.placement.clone());
                            }
                        }
                        Err(_) => {
                            let failures = inner.queue.get(&name).map(|e| e.failures).unwrap_or(0);
                            let delay = self.backoff(failures);
                            if let Some(e) = inner.queue.get_mut(&name) {
                                e.failures = failures.saturating_add(1);
                                e.not_before = now + delay;
                                e.unschedulable = true;
                                e.wait_report = None;
                            }
                        }
                    }
                    r
                };
                let Ok(permit) = self.writes.clone().acquire_owned().await else { return None };
                let this = self.clone();
                tokio::spawn(async move {
                    match decision {
                        Ok(binding) => this.write_binding(name, binding).await,
                        Err(u) => this.write_unschedulable(name, u).await,
                    }
                    drop(permit);
                });
            }
        }
    }

    async fn write_binding(&self, name: String, binding: crate::scheduler::Binding) {
        let b = binding.clone();
        let pod_name = name.clone();
        let r = self
            .store
            .write(move |t| -> Result<(), Refused> {
                let Some(mut pod) = t.get::<Pod>(&pod_name)? else {
                    return Err(Refused(crate::api::error::not_found("Pod", &pod_name)));
                };
                if pod.spec.node_name.is_some() {
                    return Err(Refused(crate::api::error::conflict("already bound")));
                }
                let mut status = pod.status.take().unwrap_or_default();
                status.phase = PodPhase::Scheduled;
                status.node_name = Some(b.node.clone());
                status.reason = Some("Scheduled".into());
                let cpus: Vec<String> =
                    b.placement.containers.iter().map(|c| format!("{}={}", c.name, c.cpus)).collect();
                status.message =
                    Some(format!("bound to {} (NUMA {}; cpus {})", b.node, b.placement.numa_affinity, cpus.join(" ")));
                status.placement = Some(b.placement.summary());
                status.plan = Some(PodPlan { epoch: b.epoch, placement: b.placement.clone() });
                status.attempts = status.attempts.saturating_add(1);
                let message = status.message.clone().unwrap_or_default();
                pod.spec.node_name = Some(b.node.clone());
                pod.status = Some(status);
                t.put(&mut pod)?;
                t.add_event(event("Pod", &pod_name, "Normal", "Scheduled", message))?;
                Ok(())
            })
            .await;
        if let Err(Refused(e)) = r {
            tracing::debug!(pod = %name, error = %e, "binding not stored; releasing it");
            let mut inner = self.lock();
            if let Some(n) = inner.nodes.get_mut(&binding.node) {
                n.inflight.remove(&name);
            }
            inner.sync_mirror(&binding.node);
        }
    }

    async fn write_unschedulable(&self, name: String, u: crate::scheduler::Unschedulable) {
        let r = self
            .store
            .write(move |t| -> Result<(), Refused> {
                let Some(mut pod) = t.get::<Pod>(&name)? else { return Ok(()) };
                let mut message = u.message.clone();
                if !u.per_node.is_empty() {
                    let per: Vec<String> = u.per_node.iter().map(|(n, m)| format!("{n}: {m}")).collect();
                    message = format!("{message}: {}", per.join("; "));
                }
                let status = pod.status.get_or_insert_with(PodStatus::default);
                if status.reason.as_deref() == Some("Unschedulable") && status.message.as_deref() == Some(&message) {
                    return Ok(()); // Nothing new to say: no write, no event.
                }
                status.phase = PodPhase::Pending;
                status.reason = Some("Unschedulable".into());
                status.message = Some(message.clone());
                t.put(&mut pod)?;
                t.add_event(event("Pod", &name, "Warning", "FailedScheduling", message))?;
                Ok(())
            })
            .await;
        if let Err(Refused(e)) = r {
            tracing::warn!(error = %e, "cannot record why a pod is pending");
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
            let now = Instant::now();
            let lost: Vec<String> = {
                let inner = self.lock();
                inner
                    .nodes
                    .iter()
                    .filter(|(_, n)| n.ready && now.duration_since(n.last_seen) > self.config.heartbeat_grace)
                    .map(|(k, _)| k.clone())
                    .collect()
            };
            for name in lost {
                self.mark_not_ready(&name).await;
            }
        }
    }

    async fn mark_not_ready(&self, name: &str) {
        let grace = self.config.heartbeat_grace;
        let _g = self.transitions.lock().await;
        let still_lost =
            self.lock().nodes.get(name).is_some_and(|n| n.ready && Instant::now().duration_since(n.last_seen) > grace);
        if !still_lost {
            return;
        }
        let pods = match self.store.list::<Pod>() {
            Ok((_, pods)) => pods,
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
            .write(move |t| -> Result<Option<Node>, Refused> {
                let Some(mut node) = t.get::<Node>(&node_name)? else { return Ok(None) };
                node.status.condition = NodeCondition::NotReady;
                t.put(&mut node)?;
                let msg = format!(
                    "no heartbeat for more than {}s; its pods are left running and marked Unknown",
                    grace.as_secs_f64()
                );
                t.add_event(event("Node", &node_name, "Warning", "NodeNotReady", msg))?;
                for p in &mine {
                    let Some(mut pod) = t.get::<Pod>(p)? else { continue };
                    if pod.spec.node_name.as_deref() != Some(&node_name) {
                        continue;
                    }
                    let s = pod.status.get_or_insert_with(PodStatus::default);
                    if s.phase.is_terminal() {
                        continue;
                    }
                    s.phase = PodPhase::Unknown;
                    s.reason = Some("NodeLost".into());
                    s.message = Some(format!("node {node_name} stopped reporting"));
                    t.put(&mut pod)?;
                    t.add_event(event("Pod", p, "Warning", "NodeLost", format!("node {node_name} is NotReady")))?;
                }
                Ok(Some(node))
            })
            .await;
        match r {
            Ok(Some(node)) => self.node_updated(&node, false),
            Ok(None) => {}
            Err(Refused(e)) => tracing::error!(node = %name, error = %e, "cannot mark node NotReady"),
        }
    }
}

impl Inner {
    fn waits_for_report(&self, e: &QueueEntry) -> bool {
        match &e.wait_report {
            Some((node, at)) => self.nodes.get(node).is_some_and(|n| n.ready && n.reports == *at),
            None => false,
        }
    }

    /// Pushes the node's mirror (truth plus in-flight bindings) to the scheduler.
    fn sync_mirror(&mut self, name: &str) {
        let Some(n) = self.nodes.get(name) else {
            self.sched.remove_node(name);
            return;
        };
        let mut allocations = n.truth.clone();
        for (pod, placement) in &n.inflight {
            if !allocations.pods.contains_key(pod) {
                allocations.apply(pod, placement.clone());
            }
        }
        self.sched.upsert_node(NodeInfo {
            name: name.to_string(),
            labels: n.node.metadata.labels.clone(),
            topology: n.topology.clone(),
            settings: n.node.spec.settings.clone(),
            allocations,
            ready: n.ready,
        });
    }
}
