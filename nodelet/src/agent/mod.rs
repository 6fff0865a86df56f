//! The node agent's loop: it owns the node's allocations and its pods' lives.
//!
//! Desired pods arrive as `DesiredChange`s (from the static manifest folder, or
//! from the orchestrator when joined); the agent admits them with the engine on
//! the node's truth, checkpoints the allocation before any container starts,
//! starts containers through a `Runtime`, applies restart policies with backoff,
//! keeps shared containers' cpusets in step with the shared pool, and publishes
//! a `NodeReport` (also written to `<data>/status.json`) after every change.
//!
//! Each pod is in one `Stage`: `Pending` (not admitted; a rejection is retried
//! only when the allocation epoch moves), `Admitted` (holds its allocation; each
//! container is waiting, running or terminated), `Terminating` (being stopped in
//! a background task; keeps its allocation until every container is gone, so a
//! CPU is never handed out while a process may still run on it), `Finished`.
//!
//! Restart safety: on start the agent loads the checkpoint, adopts containers
//! the runtime still runs (same CPUs), frees the allocations of pods whose
//! containers all died meanwhile (then applies their restart policy) and removes
//! runtime containers the checkpoint does not know. Every runtime call has a
//! timeout.

pub mod backoff;
pub mod reconcile;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use specs::{Allocations, CpuPolicy, CpuSet, NodeSettings, NodeTopology, NumaSet, Placement, Pod, PodPhase};
use specs::{RejectReason, Rejection};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::checkpoint::{spec_hash, Checkpoint, CheckpointError, ContainerRecord, PodRecord, VERSION};
use crate::runtime::{ContainerState, Runtime, RuntimeError};
use crate::source::{BoundPlan, DesiredChange, NodeReport, SourceKind};

pub use backoff::Backoff;

/// The engine's signature; the agent calls `specs::admit` unless a test passes
/// another function.
pub type AdmitFn = fn(&NodeTopology, &NodeSettings, &Allocations, &str, &Pod) -> Result<Placement, Rejection>;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    /// Checkpoint, status file and container logs live here.
    pub data_dir: PathBuf,
    pub topology: NodeTopology,
    pub settings: NodeSettings,
    pub backoff: Backoff,
    /// Grace between SIGTERM and SIGKILL when the pod does not say.
    pub default_grace: Duration,
    /// How often running containers are polled for exits. A quarter second:
    /// `pinion run` waits on it to see its command end, and a poll reads a
    /// couple of small files per container.
    pub poll_interval: Duration,
    /// Limit on one runtime start.
    pub start_timeout: Duration,
    /// Limit on other runtime calls (state, update, remove, list); stop gets its grace on top.
    pub op_timeout: Duration,
    /// PCI address -> device nodes handed to a container that is allocated the device.
    pub device_nodes: BTreeMap<String, Vec<PathBuf>>,
    pub admit: AdmitFn,
}

impl AgentConfig {
    pub fn new(node_name: String, data_dir: PathBuf, topology: NodeTopology, settings: NodeSettings) -> Self {
        AgentConfig {
            node_name,
            data_dir,
            topology,
            settings,
            backoff: Backoff::default(),
            default_grace: Duration::from_secs(30),
            poll_interval: Duration::from_millis(250),
            start_timeout: Duration::from_secs(90),
            op_timeout: Duration::from_secs(30),
            device_nodes: BTreeMap::new(),
            admit: specs::admit,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{what}: {source}")]
    Runtime { what: String, source: RuntimeError },
    #[error("{what}: timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: another agent is running on this data dir")]
    Locked { path: PathBuf },
}

/// Runs the agent until `shutdown` resolves. Containers keep running after it
/// returns (they outlive the agent); a restarted agent adopts them.
pub async fn run(
    config: AgentConfig,
    runtime: Arc<dyn Runtime>,
    mut changes: mpsc::Receiver<DesiredChange>,
    report: watch::Sender<NodeReport>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|source| AgentError::Io { path: config.data_dir.clone(), source })?;
    let _lock = lock_data_dir(&config)?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut agent = Agent::recover(config, runtime, done_tx).await?;
    agent.reconcile().await;
    agent.publish_or_log(&report);
    tokio::pin!(shutdown);
    let mut changes_open = true;
    loop {
        let wake = agent.next_wake();
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            ch = changes.recv(), if changes_open => match ch {
                Some(ch) => {
                    agent.on_change(ch);
                    // Take everything already queued before reconciling once.
                    while let Ok(ch) = changes.try_recv() {
                        agent.on_change(ch);
                    }
                }
                // The sources are gone; keep running what we have until shutdown.
                None => changes_open = false,
            },
            Some(done) = done_rx.recv() => agent.on_terminated(done),
            _ = tokio::time::sleep_until(wake) => {}
        }
        agent.reconcile().await;
        agent.publish_or_log(&report);
    }
    tracing::info!("agent stopping; containers keep running");
    Ok(())
}

/// One agent per data dir: a second one would allocate the same CPUs twice.
/// The lock is released by the kernel when the process dies, `kill -9` included.
fn lock_data_dir(config: &AgentConfig) -> Result<nix::fcntl::Flock<std::fs::File>, AgentError> {
    let path = config.data_dir.join("agent.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| AgentError::Io { path: path.clone(), source })?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| AgentError::Locked { path })
}

#[derive(Debug, Clone)]
enum Stage {
    /// Not admitted. `rejected`: the epoch and rejection of the last failed try.
    Pending {
        rejected: Option<(u64, Rejection)>,
    },
    Admitted,
    /// Being stopped; `then` replaces it once every container is gone.
    Terminating {
        then: Option<Box<Desired>>,
    },
    Finished(PodPhase),
}

#[derive(Debug, Clone)]
struct Desired {
    pod: Pod,
    plan: Option<BoundPlan>,
}

#[derive(Debug, Clone, PartialEq)]
enum CtrState {
    /// Not running; start at `at` (`reason`: why it waits, e.g. `CrashLoopBackOff`).
    Waiting {
        at: Instant,
        reason: Option<String>,
    },
    Running {
        since: Instant,
    },
    /// Exited and will not run again.
    Terminated,
}

#[derive(Debug, Clone)]
struct Ctr {
    name: String,
    /// The current incarnation's runtime id (it may have exited but not been removed).
    runtime_id: Option<String>,
    restart_count: u32,
    /// Consecutive crashes, for the backoff (not persisted: a restarted agent is lenient).
    streak: u32,
    state: CtrState,
    last_exit: Option<(i32, bool)>,
    /// The cpuset last given to the runtime; `None` forces an update.
    applied: Option<(CpuSet, NumaSet)>,
}

#[derive(Debug, Clone)]
struct PodEntry {
    pod: Pod,
    hash: String,
    plan: Option<BoundPlan>,
    stage: Stage,
    ctrs: Vec<Ctr>,
    /// The last error worth showing (runtime failure, checkpoint failure).
    message: Option<String>,
    attempts: u32,
}

impl PodEntry {
    fn new(d: Desired) -> Self {
        let ctrs = d
            .pod
            .spec
            .containers
            .iter()
            .map(|c| Ctr {
                name: c.name.clone(),
                runtime_id: None,
                restart_count: 0,
                streak: 0,
                state: CtrState::Waiting { at: Instant::now(), reason: None },
                last_exit: None,
                applied: None,
            })
            .collect();
        PodEntry {
            hash: spec_hash(&d.pod),
            pod: d.pod,
            plan: d.plan,
            stage: Stage::Pending { rejected: None },
            ctrs,
            message: None,
            attempts: 0,
        }
    }

    fn grace(&self, default: Duration) -> Duration {
        self.pod.spec.termination_grace_period_seconds.map_or(default, Duration::from_secs)
    }
}

/// What a background termination reports back.
#[derive(Debug)]
struct Terminated {
    key: String,
    /// Errors of stop/remove calls; empty when every container is gone.
    errors: Vec<String>,
}

struct Agent {
    cfg: AgentConfig,
    runtime: Arc<dyn Runtime>,
    alloc: Allocations,
    pods: BTreeMap<String, PodEntry>,
    /// Keys whose latest manifest is malformed: the message, shown in the status.
    invalid: BTreeMap<String, String>,
    /// Keys with a termination task in flight.
    terminating: BTreeSet<String>,
    done_tx: mpsc::UnboundedSender<Terminated>,
    /// The last report published (to write the status file only on change).
    last_report: Option<NodeReport>,
    /// The checkpoint in memory differs from the file (a write failed or a
    /// finished pod was forgotten); written at the end of the next reconcile.
    dirty: bool,
    /// When running containers were last polled.
    last_observe: Instant,
}

impl Agent {
    /// Loads the checkpoint and brings it in line with what the runtime holds.
    async fn recover(
        cfg: AgentConfig,
        runtime: Arc<dyn Runtime>,
        done_tx: mpsc::UnboundedSender<Terminated>,
    ) -> Result<Agent, AgentError> {
        let cp = Checkpoint::load(&cfg.data_dir)?;
        let mut agent = Agent {
            alloc: cp.allocations.clone(),
            cfg,
            runtime,
            pods: BTreeMap::new(),
            invalid: BTreeMap::new(),
            terminating: BTreeSet::new(),
            done_tx,
            last_report: None,
            dirty: false,
            last_observe: Instant::now(),
        };
        let listed: BTreeSet<String> =
            agent.call("list containers", agent.cfg.op_timeout, |rt| rt.list()).await?.into_iter().collect();
        let mut known = BTreeSet::new();
        for (key, rec) in cp.pods {
            let mut entry = PodEntry::new(Desired { pod: rec.pod, plan: None });
            entry.hash = rec.spec_hash;
            for ctr in &mut entry.ctrs {
                let r = rec.containers.get(&ctr.name).cloned().unwrap_or_default();
                ctr.restart_count = r.restart_count;
                ctr.runtime_id = r.runtime_id.clone();
                ctr.last_exit = r.last_exit_code.map(|c| (c, false));
                if let Some(id) = &r.runtime_id {
                    known.insert(id.clone());
                }
            }
            if let Some(phase) = rec.finished {
                for ctr in &mut entry.ctrs {
                    ctr.state = CtrState::Terminated;
                }
                entry.stage = Stage::Finished(phase);
                agent.pods.insert(key, entry);
                continue;
            }
            entry.stage = Stage::Admitted;
            agent.adopt(&key, &mut entry).await;
            agent.pods.insert(key, entry);
        }
        // Containers the checkpoint does not know: left by a crash between a
        // runtime start and a checkpoint write that never happened, or by another
        // tool. They hold no allocation, so they must not keep running.
        for id in listed.difference(&known) {
            tracing::warn!(id, "removing a container the checkpoint does not know");
            let rid = id.clone();
            let grace = Duration::from_secs(5);
            if let Err(e) = agent
                .call(&format!("stop leaked container {id}"), grace + agent.cfg.op_timeout, move |rt| {
                    rt.stop(&rid, grace)?;
                    rt.remove(&rid)
                })
                .await
            {
                tracing::error!(id, error = %e, "cannot remove a leaked container");
            }
        }
        agent.persist()?;
        Ok(agent)
    }

    /// Re-finds one checkpointed pod's containers. Running ones are adopted with
    /// their CPUs; a pod none of whose containers runs gives its allocation back
    /// and goes through its restart policy (re-admitted, or finished).
    async fn adopt(&mut self, key: &str, entry: &mut PodEntry) {
        let now = Instant::now();
        let mut any_running = false;
        let mut dead = vec![false; entry.ctrs.len()];
        for (ctr, dead) in entry.ctrs.iter_mut().zip(dead.iter_mut()) {
            let Some(id) = ctr.runtime_id.clone() else { continue };
            let rid = id.clone();
            match self.call(&format!("state of {id}"), self.cfg.op_timeout, move |rt| rt.state(&rid)).await {
                Ok(ContainerState::Running { .. }) => {
                    any_running = true;
                    ctr.state = CtrState::Running { since: now };
                }
                Ok(ContainerState::Exited { code, oom_killed }) => {
                    *dead = true;
                    ctr.last_exit = Some((code, oom_killed));
                }
                Ok(ContainerState::Missing) => {
                    *dead = true;
                    ctr.last_exit = Some((reconcile::LOST_CODE, false));
                }
                Err(e) => {
                    // Unknown is treated as running: freeing CPUs a live process
                    // may hold is the one mistake that cannot be undone.
                    tracing::error!(key, id, error = %e, "cannot read container state; keeping it");
                    entry.message = Some(e.to_string());
                    any_running = true;
                    ctr.state = CtrState::Running { since: now };
                }
            }
        }
        let policy = entry.pod.spec.restart_policy;
        let placement = self.alloc.pods.get(key).cloned();
        for ctr in &mut entry.ctrs {
            if let (CtrState::Running { .. }, Some(p)) = (&ctr.state, &placement) {
                // Exclusive containers already have their CPUs; shared ones get
                // the current pool on the first reconcile (applied = None).
                if let Some(cp) = reconcile::placement_of(p, &ctr.name) {
                    if matches!(cp.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable) {
                        ctr.applied = Some((cp.cpus.clone(), cp.mems.clone()));
                    }
                }
            }
        }
        if any_running {
            // Siblings of running containers restart in place, on the same CPUs.
            for (ctr, was_dead) in entry.ctrs.iter_mut().zip(dead) {
                if was_dead {
                    let (code, oom) = ctr.last_exit.unwrap_or((reconcile::LOST_CODE, false));
                    self.after_exit(key, policy, ctr, code, oom, None).await;
                }
            }
            return;
        }
        // Nothing runs: give the CPUs back now, then restart policy decides.
        self.alloc.release(key);
        for ctr in &mut entry.ctrs {
            if let Some(id) = ctr.runtime_id.take() {
                self.remove_quietly(&id).await;
            }
        }
        let again = entry.ctrs.iter().any(|c| match c.last_exit {
            Some((code, _)) => reconcile::restarts(policy, code),
            None => true,
        });
        if again {
            for ctr in &mut entry.ctrs {
                if ctr.last_exit.is_some() {
                    ctr.restart_count += 1;
                    ctr.state = CtrState::Waiting {
                        at: now + self.cfg.backoff.delay(0),
                        reason: Some("CrashLoopBackOff".into()),
                    };
                }
            }
            entry.stage = Stage::Pending { rejected: None };
        } else {
            let codes: Vec<i32> = entry.ctrs.iter().map(|c| c.last_exit.map_or(0, |e| e.0)).collect();
            for ctr in &mut entry.ctrs {
                ctr.state = CtrState::Terminated;
            }
            entry.stage = Stage::Finished(reconcile::finished_phase(&codes));
        }
    }

    /// Runs a blocking runtime call on the blocking pool with a time limit.
    async fn call<T: Send + 'static>(
        &self,
        what: &str,
        limit: Duration,
        f: impl FnOnce(&dyn Runtime) -> Result<T, RuntimeError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let rt = self.runtime.clone();
        let task = tokio::task::spawn_blocking(move || f(rt.as_ref()));
        match tokio::time::timeout(limit, task).await {
            Err(_) => Err(AgentError::Timeout { what: what.to_string(), after: limit }),
            Ok(Err(join)) => Err(AgentError::Runtime {
                what: what.to_string(),
                source: RuntimeError::Container { id: "-".into(), message: format!("runtime call panicked: {join}") },
            }),
            Ok(Ok(r)) => r.map_err(|source| AgentError::Runtime { what: what.to_string(), source }),
        }
    }

    async fn remove_quietly(&self, id: &str) {
        let rid = id.to_string();
        let grace = Duration::from_secs(1);
        if let Err(e) = self
            .call(&format!("remove {id}"), self.cfg.op_timeout + grace, move |rt| {
                rt.stop(&rid, grace)?;
                rt.remove(&rid)
            })
            .await
        {
            tracing::warn!(id, error = %e, "cannot remove container");
        }
    }

    /// The checkpoint as a projection of memory: allocations plus every admitted,
    /// terminating or finished pod.
    fn checkpoint(&self) -> Checkpoint {
        let mut cp = Checkpoint { version: VERSION, allocations: self.alloc.clone(), pods: BTreeMap::new() };
        for (key, e) in &self.pods {
            let finished = match &e.stage {
                Stage::Pending { .. } => {
                    // A pending pod is only remembered while it still holds
                    // runtime history worth keeping (restart counts).
                    continue;
                }
                Stage::Finished(phase) => Some(*phase),
                Stage::Admitted | Stage::Terminating { .. } => None,
            };
            let containers = e
                .ctrs
                .iter()
                .map(|c| {
                    (
                        c.name.clone(),
                        ContainerRecord {
                            runtime_id: c.runtime_id.clone(),
                            restart_count: c.restart_count,
                            last_exit_code: c.last_exit.map(|x| x.0),
                        },
                    )
                })
                .collect();
            cp.pods
                .insert(key.clone(), PodRecord { spec_hash: e.hash.clone(), pod: e.pod.clone(), containers, finished });
        }
        cp
    }

    fn persist(&self) -> Result<(), CheckpointError> {
        self.checkpoint().save(&self.cfg.data_dir)
    }

    // ---- changes from the sources ----

    fn on_change(&mut self, ch: DesiredChange) {
        match ch {
            DesiredChange::Apply { key, pod, plan } => {
                tracing::debug!(target: "podstart", key, "change received");
                self.apply(key, Desired { pod: *pod, plan })
            }
            DesiredChange::Remove { key } => {
                self.invalid.remove(&key);
                self.remove(&key);
            }
            DesiredChange::Invalid { key, message } => {
                tracing::warn!(key, message, "manifest skipped");
                self.invalid.insert(key, message);
            }
            DesiredChange::Resync { source, pods } => {
                let listed: BTreeSet<String> = pods.iter().map(|(k, _, _)| k.clone()).collect();
                let stale: Vec<String> = self
                    .pods
                    .keys()
                    .filter(|k| SourceKind::of_key(k) == source && !listed.contains(*k) && !self.is_invalid(k))
                    .cloned()
                    .collect();
                for key in stale {
                    self.remove(&key);
                }
                for (key, pod, plan) in pods {
                    self.apply(key, Desired { pod, plan });
                }
            }
        }
    }

    /// Whether the key's manifest (or the file holding it, `static/<stem>` for
    /// `static/<stem>/<name>`) is currently malformed: its pods keep running.
    fn is_invalid(&self, key: &str) -> bool {
        self.invalid.contains_key(key) || key.rsplit_once('/').is_some_and(|(file, _)| self.invalid.contains_key(file))
    }

    fn apply(&mut self, key: String, d: Desired) {
        self.invalid.remove(&key);
        let hash = spec_hash(&d.pod);
        let Some(e) = self.pods.get_mut(&key) else {
            self.pods.insert(key, PodEntry::new(d));
            return;
        };
        if e.hash == hash {
            if let Stage::Terminating { then } = &mut e.stage {
                // Deleted and re-created with the same spec: run it again once stopped.
                *then = Some(Box::new(d));
            } else {
                e.plan = d.plan;
            }
            return;
        }
        match &mut e.stage {
            Stage::Pending { .. } | Stage::Finished(_) => {
                self.pods.insert(key, PodEntry::new(d));
                self.dirty = true;
            }
            Stage::Admitted => e.stage = Stage::Terminating { then: Some(Box::new(d)) },
            Stage::Terminating { then } => *then = Some(Box::new(d)),
        }
    }

    fn remove(&mut self, key: &str) {
        let Some(e) = self.pods.get_mut(key) else { return };
        match &mut e.stage {
            Stage::Pending { .. } | Stage::Finished(_) => {
                self.pods.remove(key);
                self.dirty = true;
            }
            Stage::Admitted => e.stage = Stage::Terminating { then: None },
            Stage::Terminating { then } => *then = None,
        }
    }

    fn on_terminated(&mut self, done: Terminated) {
        self.terminating.remove(&done.key);
        let Some(e) = self.pods.get_mut(&done.key) else { return };
        if !done.errors.is_empty() {
            // Keep the allocation; the next reconcile tries again.
            e.message = Some(done.errors.join("; "));
            return;
        }
        let then = match &mut e.stage {
            Stage::Terminating { then } => then.take(),
            _ => None,
        };
        self.alloc.release(&done.key);
        self.pods.remove(&done.key);
        if let Some(d) = then {
            self.pods.insert(done.key.clone(), PodEntry::new(*d));
        }
        if let Err(e) = self.persist() {
            tracing::error!(error = %e, "cannot write the checkpoint after a pod was removed");
            self.dirty = true;
        }
    }

    // ---- reconcile ----

    /// When the loop must wake up at the latest: the next poll or the next due start.
    fn next_wake(&self) -> Instant {
        let mut wake = Instant::now() + self.cfg.poll_interval;
        for e in self.pods.values() {
            if matches!(e.stage, Stage::Admitted) {
                for c in &e.ctrs {
                    if let CtrState::Waiting { at, .. } = c.state {
                        wake = wake.min(at);
                    }
                }
            }
        }
        wake
    }

    /// One pass: observe exits, finish and terminate pods, admit, resize the
    /// shared pool, start what is due. Idempotent.
    async fn reconcile(&mut self) {
        let keys: Vec<String> = self.pods.keys().cloned().collect();
        // 1. Observe running containers, once per poll interval: a pass that a
        //    change triggered must not pay for polling every container first.
        if self.last_observe.elapsed() >= self.cfg.poll_interval {
            self.last_observe = Instant::now();
            let states = self.poll_states().await;
            for key in &keys {
                self.observe(key, &states).await;
            }
        }
        // 2. Stop pods being deleted or replaced (in the background).
        for key in &keys {
            if matches!(self.pods.get(key).map(|e| &e.stage), Some(Stage::Terminating { .. }))
                && !self.terminating.contains(key)
            {
                self.start_termination(key);
            }
        }
        // 3. Admit pending pods, in key order (deterministic).
        for key in &keys {
            self.try_admit(key);
        }
        // 4. The shared pool follows exclusive allocations, before anything new starts.
        self.sync_cpusets().await;
        // 5. Start containers whose time has come.
        for key in &keys {
            self.start_due(key).await;
        }
        if self.dirty {
            match self.persist() {
                Ok(()) => self.dirty = false,
                Err(err) => tracing::error!(error = %err, "cannot write the checkpoint"),
            }
        }
    }

    /// The runtime state of every running container of admitted pods, read in
    /// one blocking call: one trip through the blocking pool per poll instead
    /// of one per container, which under load kept a pod that arrived during
    /// the poll waiting for its admission.
    async fn poll_states(&self) -> BTreeMap<String, Result<ContainerState, String>> {
        let ids: Vec<String> = self
            .pods
            .values()
            .filter(|e| matches!(e.stage, Stage::Admitted))
            .flat_map(|e| &e.ctrs)
            .filter(|c| matches!(c.state, CtrState::Running { .. }))
            .filter_map(|c| c.runtime_id.clone())
            .collect();
        if ids.is_empty() {
            return BTreeMap::new();
        }
        let all = ids.clone();
        let polled = self
            .call("state of the running containers", self.cfg.op_timeout, move |rt| {
                Ok(ids
                    .into_iter()
                    .map(|id| (id.clone(), rt.state(&id).map_err(|e| format!("state of {id}: {e}"))))
                    .collect())
            })
            .await;
        match polled {
            Ok(states) => states,
            Err(err) => all.into_iter().map(|id| (id, Err(err.to_string()))).collect(),
        }
    }

    async fn observe(&mut self, key: &str, states: &BTreeMap<String, Result<ContainerState, String>>) {
        let Some(mut e) = self.pods.remove(key) else { return };
        if matches!(e.stage, Stage::Admitted) {
            let policy = e.pod.spec.restart_policy;
            for ctr in &mut e.ctrs {
                let (CtrState::Running { since }, Some(id)) = (&ctr.state, ctr.runtime_id.clone()) else { continue };
                let since = *since;
                match states.get(&id) {
                    // Started after the poll: the next one sees it.
                    None | Some(Ok(ContainerState::Running { .. })) => {}
                    Some(Ok(ContainerState::Exited { code, oom_killed })) => {
                        self.after_exit(key, policy, ctr, *code, *oom_killed, Some(since)).await
                    }
                    Some(Ok(ContainerState::Missing)) => {
                        self.after_exit(key, policy, ctr, reconcile::LOST_CODE, false, Some(since)).await
                    }
                    Some(Err(err)) => e.message = Some(err.clone()),
                }
            }
            if e.ctrs.iter().all(|c| c.state == CtrState::Terminated) {
                let codes: Vec<i32> = e.ctrs.iter().map(|c| c.last_exit.map_or(0, |x| x.0)).collect();
                let phase = reconcile::finished_phase(&codes);
                tracing::info!(key, ?phase, "pod finished");
                e.stage = Stage::Finished(phase);
                self.alloc.release(key);
                self.pods.insert(key.to_string(), e);
                if let Err(err) = self.persist() {
                    tracing::error!(error = %err, "cannot write the checkpoint after a pod finished");
                    self.dirty = true;
                }
                return;
            }
        }
        self.pods.insert(key.to_string(), e);
    }

    /// A container ended (or could not start): record it, remove the dead
    /// incarnation, and wait to restart it or mark it terminated.
    async fn after_exit(
        &self,
        key: &str,
        policy: specs::RestartPolicy,
        ctr: &mut Ctr,
        code: i32,
        oom: bool,
        ran_since: Option<Instant>,
    ) {
        tracing::info!(key, container = ctr.name, code, oom, "container exited");
        ctr.last_exit = Some((code, oom));
        ctr.applied = None;
        if let Some(since) = ran_since {
            if self.cfg.backoff.resets_after(since.elapsed()) {
                ctr.streak = 0;
            }
        }
        if let Some(id) = ctr.runtime_id.take() {
            self.remove_quietly(&id).await;
        }
        if reconcile::restarts(policy, code) {
            let delay = self.cfg.backoff.delay(ctr.streak);
            ctr.streak = ctr.streak.saturating_add(1);
            ctr.restart_count += 1;
            ctr.state = CtrState::Waiting { at: Instant::now() + delay, reason: Some("CrashLoopBackOff".into()) };
        } else {
            ctr.state = CtrState::Terminated;
        }
    }

    fn start_termination(&mut self, key: &str) {
        let Some(e) = self.pods.get(key) else { return };
        let grace = e.grace(self.cfg.default_grace);
        let ids: Vec<String> = e.ctrs.iter().filter_map(|c| c.runtime_id.clone()).collect();
        let rt = self.runtime.clone();
        let limit = grace + self.cfg.op_timeout;
        let tx = self.done_tx.clone();
        let key = key.to_string();
        self.terminating.insert(key.clone());
        tracing::info!(key, ?grace, "stopping pod");
        tokio::spawn(async move {
            let mut errors = Vec::new();
            // All containers of the pod stop together, each within its grace.
            let mut set = tokio::task::JoinSet::new();
            for id in ids {
                let rt = rt.clone();
                set.spawn(async move {
                    let rid = id.clone();
                    let task = tokio::task::spawn_blocking(move || {
                        rt.stop(&rid, grace)?;
                        rt.remove(&rid)
                    });
                    match tokio::time::timeout(limit, task).await {
                        Err(_) => Err(format!("stop {id}: timed out after {limit:?}")),
                        Ok(Err(j)) => Err(format!("stop {id}: {j}")),
                        Ok(Ok(Err(e))) => Err(format!("stop {id}: {e}")),
                        Ok(Ok(Ok(()))) => Ok(()),
                    }
                });
            }
            while let Some(r) = set.join_next().await {
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => errors.push(e),
                    Err(j) => errors.push(j.to_string()),
                }
            }
            let _ = tx.send(Terminated { key, errors });
        });
    }

    fn try_admit(&mut self, key: &str) {
        let epoch = self.alloc.epoch;
        let Some(e) = self.pods.get_mut(key) else { return };
        let Stage::Pending { rejected } = &e.stage else { return };
        if !reconcile::retry_admission(rejected.as_ref().map(|r| r.0), epoch) {
            return;
        }
        e.attempts += 1;
        let adopted = e.plan.as_ref().and_then(|plan| {
            match reconcile::check_plan(&self.cfg.topology, &self.cfg.settings.reserved_cpus, &self.alloc, &e.pod, plan)
            {
                Ok(()) => Some(plan.placement.clone()),
                Err(why) => {
                    tracing::debug!(key, why, "re-running the engine instead of adopting the plan");
                    None
                }
            }
        });
        let decided = match adopted {
            Some(p) => Ok(p),
            None => (self.cfg.admit)(&self.cfg.topology, &self.cfg.settings, &self.alloc, key, &e.pod),
        };
        let placement = match decided {
            Ok(p) => p,
            Err(rejection) => {
                tracing::info!(key, reason = ?rejection.reason, message = rejection.message, "pod rejected");
                e.stage = Stage::Pending { rejected: Some((epoch, rejection)) };
                return;
            }
        };
        if let Some(missing) =
            e.ctrs.iter().find(|c| reconcile::placement_of(&placement, &c.name).is_none()).map(|c| c.name.clone())
        {
            let rejection = Rejection {
                reason: RejectReason::InvalidRequest,
                message: format!("the placement has no container {missing:?}"),
            };
            e.stage = Stage::Pending { rejected: Some((epoch, rejection)) };
            return;
        }
        self.alloc.apply(key, placement);
        let e = self.pods.get_mut(key).expect("entry looked up above");
        e.stage = Stage::Admitted;
        e.message = None;
        // Durable before anything uses it: `start_due` writes the checkpoint
        // (allocation and runtime id) right before the first container starts,
        // and the end of this pass writes it for pods that start later. One
        // fsync per start instead of two keeps manifest-to-running short (and
        // `start_due` clears `dirty` once it wrote).
        self.dirty = true;
        tracing::info!(key, "pod admitted");
        tracing::debug!(target: "podstart", key, "pod admitted");
    }

    /// Gives every running container the cpuset it should have now (the shared
    /// pool moves when exclusive CPUs are taken or freed). In place: no restart.
    async fn sync_cpusets(&mut self) {
        let mut updates = Vec::new();
        for (key, e) in &self.pods {
            if !matches!(e.stage, Stage::Admitted | Stage::Terminating { .. }) {
                continue;
            }
            let Some(placement) = self.alloc.pods.get(key) else { continue };
            for (i, ctr) in e.ctrs.iter().enumerate() {
                let (CtrState::Running { .. }, Some(id)) = (&ctr.state, &ctr.runtime_id) else { continue };
                let Some(cp) = reconcile::placement_of(placement, &ctr.name) else { continue };
                let want = (self.alloc.cpuset_for(&self.cfg.topology, cp), cp.mems.clone());
                if ctr.applied.as_ref() != Some(&want) {
                    updates.push((key.clone(), i, id.clone(), want));
                }
            }
        }
        for (key, i, id, (cpus, mems)) in updates {
            let (c2, m2, rid) = (cpus.clone(), mems.clone(), id.clone());
            let r = self
                .call(&format!("update cpuset of {id}"), self.cfg.op_timeout, move |rt| {
                    rt.update_cpuset(&rid, &c2, &m2)
                })
                .await;
            let Some(e) = self.pods.get_mut(&key) else { continue };
            match r {
                Ok(()) => {
                    tracing::debug!(key, id, %cpus, "cpuset updated");
                    e.ctrs[i].applied = Some((cpus, mems));
                }
                // The container may have just exited; the next observe sees it.
                Err(err) => e.message = Some(err.to_string()),
            }
        }
    }

    async fn start_due(&mut self, key: &str) {
        let now = Instant::now();
        let Some(e) = self.pods.get(key) else { return };
        if !matches!(e.stage, Stage::Admitted) {
            return;
        }
        let Some(placement) = self.alloc.pods.get(key).cloned() else { return };
        let due: Vec<usize> = (0..e.ctrs.len())
            .filter(|&i| matches!(e.ctrs[i].state, CtrState::Waiting { at, .. } if at <= now))
            .collect();
        for i in due {
            let Some(e) = self.pods.get_mut(key) else { return };
            let spec = e.pod.spec.containers[i].clone();
            let Some(cp) = reconcile::placement_of(&placement, &spec.name) else { continue };
            let id = reconcile::runtime_id(key, &spec.name, &e.hash, e.ctrs[i].restart_count);
            let cpus = self.alloc.cpuset_for(&self.cfg.topology, cp);
            let mut cfg = reconcile::container_config(
                &self.cfg.data_dir,
                &self.cfg.device_nodes,
                key,
                &e.pod,
                &spec,
                cp,
                cpus.clone(),
                id.clone(),
            );
            cfg.system_cpus = self.cfg.settings.reserved_cpus.clone();
            // The id is durable before the container exists, so a crash right
            // after the start still finds (and adopts or removes) it.
            e.ctrs[i].runtime_id = Some(id.clone());
            if let Err(err) = self.persist() {
                tracing::error!(key, error = %err, "cannot checkpoint before a start");
                let e = self.pods.get_mut(key).expect("present");
                e.ctrs[i].runtime_id = None;
                e.message = Some(err.to_string());
                e.ctrs[i].state =
                    CtrState::Waiting { at: now + self.cfg.poll_interval, reason: Some("CheckpointError".into()) };
                continue;
            }
            // Memory and file agree now: the end of this pass need not write
            // the same checkpoint (and fsync) again.
            self.dirty = false;
            tracing::debug!(target: "podstart", key, id, "checkpoint written");
            if let Some(dir) = cfg.log_path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let r = self.call(&format!("start {id}"), self.cfg.start_timeout, move |rt| rt.start(&cfg)).await;
            let policy = self.pods.get(key).map(|e| e.pod.spec.restart_policy).unwrap_or_default();
            let mut ctr = self.pods.get(key).expect("present").ctrs[i].clone();
            tracing::debug!(target: "podstart", key, id, "runtime start returned");
            let message = match r {
                Ok(()) => {
                    tracing::info!(key, container = ctr.name, id, %cpus, "container started");
                    ctr.state = CtrState::Running { since: Instant::now() };
                    ctr.applied = Some((cpus, cp.mems.clone()));
                    None
                }
                Err(err) => {
                    tracing::warn!(key, container = ctr.name, error = %err, "container did not start");
                    self.after_exit(key, policy, &mut ctr, reconcile::START_ERROR_CODE, false, None).await;
                    // The runtime id, restart count and exit code changed.
                    self.dirty = true;
                    Some(err.to_string())
                }
            };
            let e = self.pods.get_mut(key).expect("present");
            e.ctrs[i] = ctr;
            if message.is_some() {
                e.message = message;
            }
        }
    }

    // ---- status ----

    fn report(&self) -> NodeReport {
        status::build(self)
    }

    /// A status file that cannot be written (disk full) must not stop the agent:
    /// the pods matter more than their report. Retried on the next pass.
    fn publish_or_log(&mut self, tx: &watch::Sender<NodeReport>) {
        if let Err(e) = self.publish(tx) {
            tracing::warn!(error = %e, "cannot publish the node report");
        }
    }

    /// Publishes the report and writes `<data>/status.json` when it changed.
    fn publish(&mut self, tx: &watch::Sender<NodeReport>) -> Result<(), AgentError> {
        let report = self.report();
        if self.last_report.as_ref() == Some(&report) {
            return Ok(());
        }
        status::write(&self.cfg.data_dir, &report)?;
        tx.send_replace(report.clone());
        self.last_report = Some(report);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
