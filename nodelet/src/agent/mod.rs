//! The node agent's loop: it owns the node's allocations and its pods' lives.
//!
//! Desired pods arrive as `DesiredChange`s (from the static manifest folder, or
//! from the orchestrator when joined); the agent admits them with the engine on
//! the node's truth, checkpoints the allocation before any container starts,
//! starts containers through a `Runtime`, applies restart policies with backoff,
//! keeps shared containers' cpusets in step with the shared pool, and publishes
//! a `NodeReport` (also written to `<data>/status.json`) after every change.
//!
//! Event-driven, in kube-runtime's reconciler shape: every input is an
//! `plan::Event` (desired changes; exits pushed by the runtime through
//! `Runtime::watch_exits`; the result of an action; a timer), the pure
//! `plan::plan` turns it into `plan::Action`s, and `execute` runs each action
//! as its own task with its own timeout, whose result comes back as an event.
//! The loop itself never waits on the runtime or the disk. A slow safety
//! re-check of the running containers' state (`recheck_interval`) catches an
//! exit whose notification was lost; it is not on any pod's critical path.
//!
//! Each pod is in one `plan::Stage`: `Pending` (not admitted; a rejection is
//! retried only once something was freed since), `Admitted` (holds its
//! allocation; each container is waiting, committing its runtime id, starting,
//! running or terminated), `Terminating` (being stopped in a background task;
//! keeps its allocation until every container is gone, so a CPU is never
//! handed out while a process may still run on it), `Finished`.
//!
//! Restart safety: on start the agent loads the checkpoint, adopts containers
//! the runtime still runs (same CPUs), frees the allocations of pods whose
//! containers all died meanwhile (then applies their restart policy) and removes
//! runtime containers the checkpoint does not know. Every runtime call has a
//! timeout. The pods it adopts are re-checked against the settings it starts
//! with, which may differ from the checkpoint's (`resettle`): the node never
//! refuses to start over them.

pub(crate) mod backoff;
pub(crate) mod plan;
pub(crate) mod prober;
pub(crate) mod probes;
pub mod reconcile;
pub mod resettle;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use specs::Rejection;
use specs::{Allocations, CpuPolicy, NodeSettings, NodeTopology, Placement, Pod};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::fault::Fault;
use crate::runtime::{ContainerState, ExitEvent, RootfsConfig, Runtime, RuntimeError};
use crate::source::{DesiredChange, NodeReport};
use plan::{Action, CtrState, Desired, Event, PodEntry, Stage, StartFailure, State};

pub(crate) use backoff::Backoff;

/// The engine's signature; the agent calls `specs::admit` unless a test passes
/// another function.
type AdmitFn = fn(&NodeTopology, &NodeSettings, &Allocations, &str, &Pod) -> Result<Placement, Rejection>;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub(crate) node_name: String,
    /// Checkpoint, status file and container logs live here.
    pub(crate) data_dir: PathBuf,
    pub(crate) topology: NodeTopology,
    pub(crate) settings: NodeSettings,
    backoff: Backoff,
    /// Grace between SIGTERM and SIGKILL when the pod does not say.
    default_grace: Duration,
    /// How often the state of running containers is read as a safety net
    /// for a lost exit notification. Exits themselves are pushed by the
    /// runtime at once; this is off every pod's critical path.
    pub recheck_interval: Duration,
    /// Limit on one runtime start.
    start_timeout: Duration,
    /// Limit on other runtime calls (state, update, remove, list) and on a
    /// checkpoint write; stop gets its grace on top.
    op_timeout: Duration,
    /// PCI address -> device nodes handed to a container that is allocated the device.
    pub device_nodes: BTreeMap<String, Vec<PathBuf>>,
    admit: AdmitFn,
    /// The sysfs root `topology` was discovered from, when it was: its CPUs'
    /// online state is read again every `cpu_recheck_interval`, so that a CPU
    /// taken offline while the agent runs is never handed out (and one
    /// brought back is). `None` (a synthetic or saved topology): fixed.
    pub sysfs_root: Option<PathBuf>,
    /// How often `sysfs_root` is read again. sysfs sends no inotify events,
    /// so this is a poll; a CPU going offline is rare, and until it is seen
    /// the engine may only plan a pod onto it, whose start then fails and is
    /// retried.
    pub cpu_recheck_interval: Duration,
    /// What a restart does with a running pod whose placement the settings
    /// no longer allow (see `resettle`): report it, and restart it or not.
    pub on_settings_change: resettle::OnSettingsChange,
    /// The node's metrics, which the planner and the executor update.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The node's CNI network (`crate::cni`): each pod without
    /// `hostNetwork` gets a pinned namespace and an address. `None` (no
    /// configuration, or the hollow runtime): a namespace per container
    /// holding only `lo`.
    pub cni: Option<crate::cni::CniConfig>,
    /// Why the host cannot run the pod network, when that is known before
    /// the agent starts (`pinion up` checks, `crate::netcheck`): pods get
    /// only `lo`, and the node reports a `PodNetwork=False` condition. A
    /// pod network that fails for such a reason later does the same.
    pub network_unfit: Option<crate::netcheck::Unfit>,
    /// The pids limit of each container whose pod sets no `spec.pidsLimit`
    /// (`--pod-pids-limit`); `None`: no limit.
    pub pod_pids_limit: Option<u64>,
    /// How the default pod network reaches other nodes' pods
    /// (`crate::routes`); `None`: Pinion makes no routes to them.
    pub pod_routes: Option<crate::routes::Mode>,
    /// Pod networks kept made ahead (`--warm-pod-networks`): a pod takes one
    /// instead of waiting for the CNI plugins at its start. 0: none.
    pub warm_networks: usize,
    /// How images are pulled (`crate::registry`): insecure registries,
    /// mirrors; credentials and CAs are files in the data dir.
    pub registry: crate::registry::RegistryConfig,
    /// Where the pods' `spec.tuning` writes (`crate::tuning`): `/` on a
    /// node that runs real containers; `None` (the hollow runtime): no
    /// tuning, and a pod that asks is told so in its status.
    pub tuning_root: Option<PathBuf>,
}

/// The default `--warm-pod-networks`: a one-liner and the next job of a
/// queue find one waiting; each costs an address and a veth pair.
pub const DEFAULT_WARM_NETWORKS: usize = 2;
/// How long after a pod took a warm network the pool is refilled: the
/// plugins then run after the pod's own start, not beside it on the
/// node's reserved CPUs.
const REFILL_AFTER: Duration = Duration::from_millis(250);

/// The default `--pod-pids-limit`: above what a real workload holds (a
/// 256-rank MPI job with 8 threads each is 2,048), and a fork bomb stopped
/// there costs the host about 64 MiB of kernel stacks, where the kernel's
/// own bound (`pid_max`: 32,768, or systemd's 4,194,304) leaves it unusable.
/// The kubelet has no default; CRI-O's 1,024 is too few for a threaded job.
pub const DEFAULT_POD_PIDS_LIMIT: u64 = 4096;

impl AgentConfig {
    pub fn new(node_name: String, data_dir: PathBuf, topology: NodeTopology, settings: NodeSettings) -> Self {
        AgentConfig {
            node_name,
            registry: crate::registry::RegistryConfig::new(&data_dir),
            data_dir,
            topology,
            settings,
            backoff: Backoff::default(),
            default_grace: Duration::from_secs(30),
            recheck_interval: Duration::from_secs(5),
            start_timeout: Duration::from_secs(90),
            op_timeout: Duration::from_secs(30),
            device_nodes: BTreeMap::new(),
            admit: specs::admit,
            sysfs_root: None,
            cpu_recheck_interval: Duration::from_secs(10),
            on_settings_change: resettle::OnSettingsChange::Keep,
            metrics: crate::metrics::Metrics::new(),
            cni: None,
            network_unfit: None,
            pod_pids_limit: Some(DEFAULT_POD_PIDS_LIMIT),
            pod_routes: Some(crate::routes::Mode::Auto),
            warm_networks: DEFAULT_WARM_NETWORKS,
            tuning_root: None,
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
    #[error("pod networks: {0}")]
    Network(String),
    #[error(transparent)]
    Tuning(#[from] crate::tuning::TuningError),
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
    crate::fsutil::private_dir(&config.data_dir)
        .map_err(|source| AgentError::Io { path: config.data_dir.clone(), source })?;
    let _lock = lock_data_dir(&config)?;
    // Watching before recovery: an exit during it is not lost (the planner
    // ignores exits of containers it does not run).
    let (exit_tx, mut exits) = mpsc::unbounded_channel::<ExitEvent>();
    let rt = runtime.clone();
    call(&runtime, "watch exits", config.op_timeout, move |_| rt.watch_exits(exit_tx)).await?;
    let networks = match &config.cni {
        Some(cni) => Some(Arc::new(
            crate::cni::PodNetworks::new(cni.clone(), config.data_dir.join("cni"))
                .map_err(|e| AgentError::Network(e.to_string()))?,
        )),
        None => None,
    };
    let tuner = match &config.tuning_root {
        Some(root) => Some(Arc::new(crate::tuning::Tuner::new(root.clone(), config.data_dir.join("tuning"))?)),
        None => None,
    };
    let warm = if config.network_unfit.is_none() { config.warm_networks } else { 0 };
    let mut state = recover(config, &runtime).await?;
    if let Some(nets) = &networks {
        adopt_networks(&mut state, nets).await;
        nets.keep_warm(warm);
        let nets = nets.clone();
        tokio::spawn(async move { nets.refill().await });
    }
    let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
    let blocks = crate::runtime::userns::Blocks::new(&state.cfg.data_dir);
    let claimed =
        blocks.claimed().map_err(|source| AgentError::Io { path: state.cfg.data_dir.join("userns"), source })?;
    let exec = Executor {
        networks,
        tuner,
        userns: Arc::new(UserBlocks {
            blocks,
            claimed: std::sync::Mutex::new(claimed.into_iter().map(|(_, s)| s).collect()),
        }),
        runtime,
        events: events_tx,
        write_lock: Arc::new(std::sync::Mutex::new(())),
        data_dir: state.cfg.data_dir.clone(),
        start_timeout: state.cfg.start_timeout,
        op_timeout: state.cfg.op_timeout,
        metrics: state.cfg.metrics.clone(),
        puller: Arc::new(crate::registry::Puller::new(state.cfg.registry.clone())),
    };
    // Unused images go when the disk fills (aborted with `run`, as below).
    let _image_gc = {
        let (rt, reg) = (exec.runtime.clone(), state.cfg.registry.clone());
        AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::registry::GC_INTERVAL).await;
                let (high, low) = (reg.gc_high, reg.gc_low);
                match call(&rt, "image garbage collection", reg.timeout, move |rt| rt.collect_images(high, low)).await {
                    Ok(removed) if !removed.is_empty() => tracing::info!(?removed, "unused images removed"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "image garbage collection failed"),
                }
            }
        }))
    };
    // Aborted when `run` returns (the guard's drop).
    let _cpu_watch = state.cfg.sysfs_root.clone().map(|root| {
        AbortOnDrop(tokio::spawn(watch_cpus(
            root,
            state.cfg.cpu_recheck_interval,
            state.cfg.op_timeout,
            state.cfg.topology.all_cpus(),
            exec.events.clone(),
        )))
    });
    let status_lock = Arc::new(std::sync::Mutex::new(()));
    let status_file = tokio::spawn(status::follow(state.cfg.data_dir.clone(), report.subscribe(), status_lock.clone()));
    for a in plan::plan(&mut state, Event::Tick, Instant::now()) {
        exec.spawn(a);
    }
    exec.remove_networks(&state);
    exec.release_user_blocks(&state);
    exec.restore_tunings(&state);
    publish(&mut state, &report);
    tokio::pin!(shutdown);
    let mut changes_open = true;
    loop {
        let wake = state.next_wake();
        let mut batch = Vec::new();
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            Some(ev) = events.recv() => batch.push(ev),
            Some(ExitEvent { id, code, oom_killed, usage }) = exits.recv() => batch.push(Event::Exited { id, code, oom_killed, usage }),
            ch = changes.recv(), if changes_open => match ch {
                Some(ch) => batch.push(Event::Changes(vec![ch])),
                // The sources are gone; keep running what we have until shutdown.
                None => changes_open = false,
            },
            _ = tokio::time::sleep_until(wake) => batch.push(Event::Tick),
        }
        // Everything already queued goes into the same pass: one checkpoint
        // write for every pod it admits or starts (group commit).
        let mut queued = Vec::new();
        while let Ok(ch) = changes.try_recv() {
            queued.push(ch);
        }
        if !queued.is_empty() {
            batch.push(Event::Changes(queued));
        }
        while let Ok(ExitEvent { id, code, oom_killed, usage }) = exits.try_recv() {
            batch.push(Event::Exited { id, code, oom_killed, usage });
        }
        while let Ok(ev) = events.try_recv() {
            batch.push(ev);
        }
        // Before the pass: a runtime's slow first step overlaps the checkpoint.
        let arrived = |e: &Event| match e {
            Event::Changes(chs) => chs.iter().any(|c| matches!(c, DesiredChange::Apply { .. })),
            _ => false,
        };
        if batch.iter().any(arrived) {
            exec.runtime.expect_start();
        }
        for a in plan::plan_batch(&mut state, batch, Instant::now()) {
            exec.spawn(a);
        }
        exec.remove_networks(&state);
        exec.release_user_blocks(&state);
        exec.restore_tunings(&state);
        publish(&mut state, &report);
    }
    // What memory knows that the file does not (a finished or removed pod)
    // is written before returning, after any write still in flight.
    let doomed: Vec<String> =
        state.doomed.drain(..).chain(std::mem::take(&mut state.doomed_by).into_values().flatten()).collect();
    // Failed removals due again later are tried once more now.
    for id in std::mem::take(&mut state.remove_retry).into_keys() {
        exec.spawn(Action::Remove { id });
    }
    let mut durable = true;
    if state.dirty || state.writing.is_some() || !doomed.is_empty() {
        let checkpoint = state.checkpoint();
        if let Err(e) = exec.write(checkpoint).await {
            tracing::error!(error = e, "cannot write the checkpoint at shutdown");
            durable = false;
        }
    }
    // A graceful stop leaves no dead container behind: the ones waiting for
    // that write go now that it is durable (else a restart removes them),
    // and removals already running are waited for, each within its bound.
    if durable {
        for id in doomed {
            exec.spawn(Action::Remove { id: id.clone() });
            state.removing.insert(id);
        }
    }
    let removals = async {
        while !state.removing.is_empty() {
            match events.recv().await {
                Some(Event::Removed { id, .. }) => {
                    state.removing.remove(&id);
                }
                Some(_) => {}
                None => break,
            }
        }
    };
    let bound = state.cfg.op_timeout + Duration::from_secs(2);
    if tokio::time::timeout(bound, removals).await.is_err() {
        tracing::warn!(after = ?bound, "containers still being removed at shutdown; a restart removes them");
    }
    let runtime = exec.runtime.clone();
    if tokio::time::timeout(bound, tokio::task::spawn_blocking(move || runtime.tidy_at_stop())).await.is_err() {
        tracing::warn!(after = ?bound, "the runtime's tidying at shutdown did not end in time");
    }
    if let Some(nets) = &exec.networks {
        if tokio::time::timeout(bound, nets.drain_warm()).await.is_err() {
            tracing::warn!(after = ?bound, "pod networks made ahead still being removed at shutdown; a restart removes them");
        }
    }
    // The file ends up with the last report, whatever the follower had done.
    status_file.abort();
    let _ = status_file.await;
    let last = report.borrow().clone();
    let dir = state.cfg.data_dir.clone();
    let written = tokio::task::spawn_blocking(move || {
        let _guard = status_lock.lock().unwrap_or_else(|p| p.into_inner());
        status::write(&dir, &last)
    });
    match written.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot write the status file"),
        Err(e) => tracing::warn!(error = %e, "cannot write the status file"),
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
        .mode(crate::fsutil::PRIVATE_FILE)
        .open(&path)
        .map_err(|source| AgentError::Io { path: path.clone(), source })?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| AgentError::Locked { path })
}

/// Runs a blocking runtime call on the blocking pool with a time limit.
async fn call<T: Send + 'static>(
    runtime: &Arc<dyn Runtime>,
    what: &str,
    limit: Duration,
    f: impl FnOnce(&dyn Runtime) -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, AgentError> {
    let rt = runtime.clone();
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

/// Makes a pod's network (before its containers join it) and tells the loop
/// its addresses; the failure the start reports otherwise.
async fn pod_network(
    tx: &mpsc::UnboundedSender<Event>,
    key: &str,
    networks: &Arc<crate::cni::PodNetworks>,
    net: &crate::cni::PodNetRequest,
    limit: Duration,
) -> Result<(), StartFailure> {
    let made = match tokio::time::timeout(limit, networks.setup(net)).await {
        Ok(Ok(ips)) => Ok(ips),
        // The host's fault (a plugin, a program or a kernel feature
        // missing): the planner starts the pod again with `lo` only.
        Ok(Err(e)) => Err(match crate::netcheck::Unfit::of(&e) {
            Some(unfit) => StartFailure::HostNetwork { unfit, message: format!("pod network: {e}") },
            None => StartFailure::Other(format!("pod network: {e}")),
        }),
        Err(_) => Err(StartFailure::Other(format!("pod network: timed out after {limit:?}"))),
    };
    match made {
        Ok(ips) => {
            let _ = tx.send(Event::PodNetwork { key: key.to_string(), sandbox: net.sandbox.clone(), ips });
            let networks = networks.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REFILL_AFTER).await;
                networks.refill().await
            });
            Ok(())
        }
        Err(failure) => {
            tracing::warn!(key, error = ?failure, "cannot set up the pod's network");
            Err(failure)
        }
    }
}

/// Runs actions, each as its own task with its own timeout; results come
/// back to the loop as events.
struct Executor {
    /// The pods' networks, when the node has a CNI network.
    networks: Option<Arc<crate::cni::PodNetworks>>,
    /// The pods' CPU tuning, on a node that runs real containers.
    tuner: Option<Arc<crate::tuning::Tuner>>,
    /// The blocks of host ids that `hostUsers: false` pods hold.
    userns: Arc<UserBlocks>,
    runtime: Arc<dyn Runtime>,
    events: mpsc::UnboundedSender<Event>,
    /// Checkpoint writes one at a time, even when one outlived its timeout.
    write_lock: Arc<std::sync::Mutex<()>>,
    data_dir: PathBuf,
    start_timeout: Duration,
    op_timeout: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    puller: Arc<crate::registry::Puller>,
}

impl Executor {
    fn spawn(&self, action: Action) {
        tracing::trace!(action = action.summary(), "executing");
        let rt = self.runtime.clone();
        let tx = self.events.clone();
        let op = self.op_timeout;
        match action {
            Action::WriteCheckpoint { generation, checkpoint } => {
                let (lock, dir) = (self.write_lock.clone(), self.data_dir.clone());
                let ids = if crate::fault::is(Fault::AfterCheckpoint) { held_ids(&checkpoint) } else { Vec::new() };
                tokio::spawn(async move {
                    let result = write_checkpoint(lock, dir, *checkpoint, op).await;
                    if !ids.is_empty() && result.is_ok() {
                        // An id the runtime does not hold yet: this write is the one its start waits for.
                        let listed = call(&rt, "list containers", op, |rt| rt.list()).await.unwrap_or_default();
                        if ids.iter().any(|id| !listed.contains(id)) {
                            crate::fault::hit(Fault::AfterCheckpoint);
                        }
                    }
                    let _ = tx.send(Event::CheckpointWritten { generation, result });
                });
            }
            Action::Start { key, mut config, mut network, pull, tuning } => {
                let limit = self.start_timeout;
                let tuner = self.tuner.clone();
                let metrics = self.metrics.clone();
                let networks = self.networks.clone();
                let userns = self.userns.clone();
                let puller = self.puller.clone();
                tokio::spawn(async move {
                    let (container, id) = (config.container.clone(), config.id.clone());
                    // The image first (it bounds its own time): nothing else is made for a pod that cannot run.
                    if let (RootfsConfig::Image(reference), Some(images)) = (&config.rootfs, rt.images()) {
                        let (tell, key2, r2) = (tx.clone(), key.clone(), reference.clone());
                        let told = move || {
                            let _ = tell.send(Event::Pulling { key: key2, reference: r2 });
                        };
                        if let Err(e) = puller.ensure_telling(&images, reference, pull, told).await {
                            let never = matches!(e, crate::registry::PullError::NeverPull { .. });
                            let result = Err(StartFailure::ImagePull { message: e.to_string(), never });
                            let _ = tx.send(Event::Started { key, container, id, result });
                            return;
                        }
                    }
                    if let Some(ns) = config.userns.as_mut() {
                        // Before the network: its namespace is made inside the pod's user namespace.
                        match userns.claim(&ns.sandbox) {
                            Ok(base) => {
                                ns.base = base;
                                if let Some(net) = network.as_mut().filter(|n| n.userns.is_some()) {
                                    net.userns = Some(base);
                                }
                            }
                            Err(e) => {
                                tracing::warn!(key, error = %e, "cannot claim host ids for the pod's user namespace");
                                let result = Err(StartFailure::Other(format!("pod user namespace: {e}")));
                                let _ = tx.send(Event::Started { key, container, id, result });
                                return;
                            }
                        }
                    }
                    if let Some(dir) = config.log_path.parent() {
                        let made = tokio::fs::DirBuilder::new()
                            .recursive(true)
                            .mode(crate::fsutil::PRIVATE_DIR)
                            .create(dir)
                            .await;
                        if let Err(e) = made {
                            tracing::warn!(key, dir = %dir.display(), error = %e, "cannot create the log folder");
                        }
                    }
                    let network = network.zip(networks);
                    // A pod in its own user namespace: its network namespace is
                    // made inside it, and the bundle's idmapped image needs it.
                    let beside = network.is_some() && config.userns.is_none();
                    if let Some((net, networks)) = network.as_ref().filter(|_| !beside) {
                        if let Err(failure) = pod_network(&tx, &key, networks, net, limit).await {
                            let _ = tx.send(Event::Started { key, container, id, result: Err(failure) });
                            return;
                        }
                    }
                    let mut trace = crate::metrics::StartTrace::begin();
                    let what = format!("start {id}");
                    let (go, gate) = tokio::sync::oneshot::channel::<bool>();
                    // The network is made while the runtime prepares the
                    // bundle; the container's process waits for it (the gate).
                    let made = async {
                        match network.as_ref().filter(|_| beside) {
                            Some((net, networks)) => {
                                let made = pod_network(&tx, &key, networks, net, limit).await;
                                let _ = go.send(made.is_ok());
                                made
                            }
                            None => {
                                drop(go);
                                Ok(())
                            }
                        }
                    };
                    // Beside the network the start may wait for it, up to its own limit.
                    let bound = if beside { limit + limit } else { limit };
                    let started = call(&rt, &what, bound, move |rt| {
                        let r = if beside {
                            let mut gate = Some(gate);
                            let mut ready = || gate.take().is_some_and(|g| g.blocking_recv().unwrap_or(false));
                            rt.start_when_ready(&config, &mut trace, &mut ready)
                        } else {
                            rt.start(&config, &mut trace)
                        };
                        r.map(|()| trace)
                    });
                    let (made, started) = tokio::join!(made, started);
                    let result = match (made, started) {
                        (Err(failure), _) => Err(failure),
                        (Ok(()), Ok(mut trace)) => {
                            trace.mark(crate::metrics::Step::StartReturned);
                            metrics.trace(&trace);
                            crate::fault::hit(Fault::AfterStart);
                            Ok(())
                        }
                        (
                            Ok(()),
                            Err(AgentError::Runtime { source: RuntimeError::CannotRun { code, message, .. }, .. }),
                        ) => Err(StartFailure::CannotRun { code, message }),
                        (Ok(()), Err(e)) => Err(StartFailure::Other(e.to_string())),
                    };
                    let started = result.is_ok();
                    let _ = tx.send(Event::Started { key: key.clone(), container, id: id.clone(), result });
                    if let Some(req) = tuning.filter(|_| started) {
                        let notes = tune(rt, tuner, *req, id, op).await;
                        let _ = tx.send(Event::Tuned { key, notes });
                    }
                });
            }
            Action::Stop { key, ids, grace } => {
                let limit = grace + op;
                tokio::spawn(async move {
                    // All containers of the pod stop together, each within its grace.
                    let mut set = tokio::task::JoinSet::new();
                    for id in ids {
                        let rt = rt.clone();
                        let key = key.clone();
                        set.spawn(async move {
                            let rid = id.clone();
                            let ended = call(&rt, &format!("stop {id}"), limit, move |rt| {
                                rt.stop(&rid, grace)?;
                                // How it ended (143: it honoured SIGTERM; 137: killed after the grace).
                                let ended = rt.state(&rid).ok();
                                crate::fault::hit(Fault::DuringStop);
                                Ok(ended)
                            })
                            .await
                            .map_err(|e| e.to_string())?;
                            if let Some(ContainerState::Exited { code, oom_killed }) = ended {
                                tracing::info!(key, id, code, oom_killed, "container stopped");
                            }
                            Ok::<(), String>(())
                        });
                    }
                    let mut errors = Vec::new();
                    while let Some(r) = set.join_next().await {
                        match r {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => errors.push(e),
                            Err(j) => errors.push(j.to_string()),
                        }
                    }
                    let _ = tx.send(Event::Stopped { key, errors });
                });
            }
            Action::Remove { id } => {
                tokio::spawn(async move {
                    let rid = id.clone();
                    let grace = Duration::from_secs(1);
                    let r = call(&rt, &format!("remove {id}"), op + grace, move |rt| {
                        rt.stop(&rid, grace)?;
                        rt.remove(&rid)
                    })
                    .await;
                    if let Err(e) = &r {
                        tracing::warn!(id, error = %e, "cannot remove container; trying again later");
                    }
                    let _ = tx.send(Event::Removed { id, ok: r.is_ok() });
                });
            }
            Action::UpdateCpuset { key, container, id, cpus, mems } => {
                tokio::spawn(async move {
                    let (c2, m2, rid) = (cpus.clone(), mems.clone(), id.clone());
                    let r =
                        call(&rt, &format!("update cpuset of {id}"), op, move |rt| rt.update_cpuset(&rid, &c2, &m2))
                            .await
                            .map_err(|e| e.to_string());
                    let _ = tx.send(Event::CpusetUpdated { key, container, id, cpus, mems, result: r });
                });
            }
            Action::Recheck { ids } => {
                let all = ids.clone();
                tokio::spawn(async move {
                    // One trip through the blocking pool for every container.
                    let r = call(&rt, "state of the running containers", op, move |rt| {
                        Ok(ids
                            .into_iter()
                            .map(|id| {
                                let s = rt.state(&id).map_err(|e| format!("state of {id}: {e}"));
                                let usage =
                                    matches!(s, Ok(ContainerState::Exited { .. })).then(|| rt.usage(&id)).flatten();
                                (id, s, usage)
                            })
                            .collect::<Vec<_>>())
                    })
                    .await;
                    let states = match r {
                        Ok(states) => states,
                        Err(err) => all.into_iter().map(|id| (id, Err(err.to_string()), None)).collect(),
                    };
                    let _ = tx.send(Event::Observed(states));
                });
            }
            Action::Probe { key, container, id, kind, at, probe, target } => {
                tokio::spawn(async move {
                    let (result, message) = prober::run(rt, id.clone(), *probe, target).await;
                    let _ = tx.send(Event::Probed { key, container, id, kind, at, result, message });
                });
            }
            Action::Kill { key, id, grace } => {
                tokio::spawn(async move {
                    let rid = id.clone();
                    // The exit event the runtime sends (or the safety
                    // re-check) takes it from here.
                    if let Err(e) = call(&rt, &format!("stop {id}"), grace + op, move |rt| rt.stop(&rid, grace)).await {
                        tracing::warn!(key, id, error = %e, "cannot stop a container whose probe failed");
                    }
                });
            }
            Action::RemoveLogs { dir } => {
                tokio::spawn(async move {
                    match tokio::fs::remove_dir_all(&dir).await {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a pod's logs"),
                    }
                });
            }
        }
    }

    /// Gives back the tuning of pods that no longer run (gone, finished, or
    /// back to pending with every container dead; at the first pass also
    /// what an agent killed meanwhile left), each on the blocking pool.
    fn restore_tunings(&self, state: &State) {
        let Some(tuner) = &self.tuner else { return };
        let wanted = wanted_tunings(state);
        for sandbox in tuner.unwanted(&wanted) {
            let tuner = tuner.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = tuner.restore(&sandbox) {
                    tracing::warn!(sandbox, error = %e, "cannot give a pod's tuning back; trying again later");
                }
            });
        }
    }

    /// Gives back the host id blocks of pods that no longer run (as
    /// `remove_networks`, whose pinned user namespaces go with the network).
    fn release_user_blocks(&self, state: &State) {
        // Every pass of the loop comes here: nothing to compute when no pod holds a block.
        if self.userns.claimed.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return;
        }
        let wanted = wanted_user_blocks(state);
        for sandbox in self.userns.unwanted(&wanted) {
            let userns = self.userns.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = userns.release(&sandbox) {
                    tracing::warn!(sandbox, error = %e, "cannot release a pod's host ids; trying again later");
                }
            });
        }
    }

    /// Removes the networks no pod holds any more (a pod gone, finished, or
    /// back to pending with every container dead), each in its own task.
    /// A pod keeps its network while admitted (its containers restart in
    /// it) and while terminating (its processes may still run).
    fn remove_networks(&self, state: &State) {
        let Some(networks) = &self.networks else { return };
        let wanted = wanted_networks(state);
        let unwanted = networks.unwanted(&wanted);
        if unwanted.is_empty() {
            return;
        }
        let reusable = reusable_networks(state);
        for sandbox in unwanted {
            let (networks, tx) = (networks.clone(), self.events.clone());
            let reusable = reusable.contains(&sandbox);
            tokio::spawn(async move {
                match networks.release(&sandbox, reusable).await {
                    Ok(()) => {
                        // Only the pod_ips entry of this sandbox goes.
                        let _ = tx.send(Event::PodNetwork { key: String::new(), sandbox, ips: Vec::new() });
                    }
                    Err(e) => tracing::warn!(sandbox, error = %e, "cannot remove a pod's network; trying again later"),
                }
            });
        }
    }

    /// A checkpoint write as `run` waits for it at shutdown.
    async fn write(&self, checkpoint: Checkpoint) -> Result<(), String> {
        write_checkpoint(self.write_lock.clone(), self.data_dir.clone(), checkpoint, self.op_timeout).await
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads the online CPUs under `root` every `every` (each read bounded by
/// `limit`, on the blocking pool) and sends them to the loop when they differ
/// from the last ones sent. A read that fails keeps the last view: a sysfs
/// that cannot be read says nothing about the CPUs.
async fn watch_cpus(
    root: PathBuf,
    every: Duration,
    limit: Duration,
    mut last: specs::CpuSet,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut failing = false;
    loop {
        tokio::time::sleep(every).await;
        let dir = root.clone();
        let read =
            tokio::time::timeout(limit, tokio::task::spawn_blocking(move || crate::discovery::online_cpus(&dir))).await;
        let online = match read {
            Ok(Ok(Ok(online))) => online,
            Ok(Ok(Err(e))) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read which CPUs are online; keeping the last view");
                }
                failing = true;
                continue;
            }
            Ok(Err(join)) => {
                tracing::warn!(error = %join, "reading which CPUs are online failed");
                continue;
            }
            Err(_) => {
                tracing::warn!(after = ?limit, "reading which CPUs are online timed out");
                continue;
            }
        };
        failing = false;
        if online != last {
            last = online.clone();
            if events.send(Event::CpusOnline(online)).is_err() {
                return;
            }
        }
    }
}

/// The runtime ids a checkpoint holds (for `PINION_FAULT=after-checkpoint`).
fn held_ids(checkpoint: &Checkpoint) -> Vec<String> {
    checkpoint.pods.values().flat_map(|p| p.containers.values().filter_map(|c| c.runtime_id.clone())).collect()
}

/// Writes (and fsyncs) the checkpoint on the blocking pool, one write at a
/// time; off the loop thread, which keeps taking events meanwhile.
async fn write_checkpoint(
    lock: Arc<std::sync::Mutex<()>>,
    dir: PathBuf,
    checkpoint: Checkpoint,
    limit: Duration,
) -> Result<(), String> {
    let task = tokio::task::spawn_blocking(move || {
        // A poisoned lock: a write panicked; the file is whole either way (rename).
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        checkpoint.save(&dir)
    });
    match tokio::time::timeout(limit, task).await {
        Err(_) => Err(format!("checkpoint write: timed out after {limit:?}")),
        Ok(Err(join)) => Err(format!("checkpoint write panicked: {join}")),
        Ok(Ok(r)) => r.map_err(|e| e.to_string()),
    }
}

/// Publishes the report when it changed, compared with the published one in
/// place (no second copy of a report that grows with the pods held).
/// `<data>/status.json` follows it from its own task (`status::follow`):
/// serializing every pod at every change on the loop thread cost more than
/// the rest of a pass.
fn publish(state: &mut State, tx: &watch::Sender<NodeReport>) {
    status::stamp_ready(state);
    let report = status::build(state);
    tx.send_if_modified(|current| {
        if *current == report {
            return false;
        }
        *current = report;
        true
    });
}

/// The sandboxes of the pods that hold a network now.
/// The claimed blocks of host ids, and which pods (sandboxes) hold them.
struct UserBlocks {
    blocks: crate::runtime::userns::Blocks,
    /// The sandboxes with a claim, as on disk; a release in flight is gone from it.
    claimed: std::sync::Mutex<BTreeSet<String>>,
}

impl UserBlocks {
    /// One claim at a time: the containers of one pod start side by side,
    /// and two claims racing would give them two blocks.
    fn claim(&self, sandbox: &str) -> std::io::Result<u32> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let base = self.blocks.claim(sandbox)?;
        claimed.insert(sandbox.to_string());
        Ok(base)
    }

    /// Claimed sandboxes not `wanted`, dropped from the set (put back if their release fails).
    fn unwanted(&self, wanted: &BTreeSet<String>) -> Vec<String> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = claimed.iter().filter(|s| !wanted.contains(*s)).cloned().collect();
        for s in &gone {
            claimed.remove(s);
        }
        gone
    }

    fn release(&self, sandbox: &str) -> std::io::Result<()> {
        self.blocks.release(sandbox).inspect_err(|_| {
            self.claimed.lock().unwrap_or_else(|p| p.into_inner()).insert(sandbox.to_string());
        })
    }
}

/// The sandboxes of `hostUsers: false` pods that hold their ids: as long as
/// they hold a network (admitted or terminating).
fn wanted_user_blocks(state: &State) -> BTreeSet<String> {
    state
        .pods
        .iter()
        .filter(|(_, e)| matches!(e.stage, Stage::Admitted | Stage::Terminating { .. }))
        .filter(|(_, e)| e.pod.spec.host_users == Some(false))
        .map(|(key, e)| e.sandbox(key).to_string())
        .collect()
}

fn wanted_networks(state: &State) -> BTreeSet<String> {
    state
        .pods
        .iter()
        .filter(|(_, e)| matches!(e.stage, Stage::Admitted | Stage::Terminating { .. }))
        .filter_map(|(key, e)| {
            let placement = state.alloc.pods.get(key)?;
            reconcile::pod_network(state.cfg.cni.as_ref(), &state.cfg.topology, key, &e.pod, &e.hash, placement)
        })
        .map(|net| net.sandbox)
        .collect()
}

/// The networks of finished pods none of whose containers held a capability
/// beyond the runtime's default set (which has no `NET_ADMIN`): they could
/// not change their namespace's addresses, routes, rules or interfaces, so
/// the next pod may have it (`PodNetworks::release`). A deleted pod's
/// network is not among them: its spec is gone, and it is removed.
fn reusable_networks(state: &State) -> BTreeSet<String> {
    state
        .pods
        .iter()
        .filter(|(_, e)| matches!(e.stage, Stage::Finished(_)))
        .filter(|(_, e)| e.pod.spec.host_users != Some(false))
        .filter(|(_, e)| {
            e.pod.spec.containers.iter().all(|c| {
                c.security_context.as_ref().and_then(|s| s.capabilities.as_ref()).is_none_or(|caps| caps.add.is_empty())
            })
        })
        .map(|(key, e)| e.sandbox(key).to_string())
        .collect()
}

/// The tuning records the pods that may still run hold (admitted or
/// terminating, as their networks).
fn wanted_tunings(state: &State) -> BTreeSet<String> {
    state
        .pods
        .iter()
        .filter(|(_, e)| matches!(e.stage, Stage::Admitted | Stage::Terminating { .. }))
        .filter_map(|(key, _)| plan::tune_request(state, key))
        .map(|req| req.sandbox)
        .collect()
}

/// Tunes a pod's CPUs once its container `id` runs, on the blocking pool
/// within `limit`; what could not be done, in words.
async fn tune(
    rt: Arc<dyn Runtime>,
    tuner: Option<Arc<crate::tuning::Tuner>>,
    mut req: crate::tuning::TuneRequest,
    id: String,
    limit: Duration,
) -> Vec<String> {
    let Some(tuner) = tuner else {
        // A real-time budget alone is a cgroup's: a runtime without cgroups needs none.
        if req.tuning.is_empty() {
            return Vec::new();
        }
        return vec!["this node does not tune CPUs (its runtime runs no real containers)".into()];
    };
    let job = tokio::task::spawn_blocking(move || {
        req.cgroups = rt.cgroups(&id);
        tuner.tune(&req)
    });
    match tokio::time::timeout(limit, job).await {
        Ok(Ok(Ok(notes))) => notes,
        Ok(Ok(Err(e))) => vec![format!("cannot tune: {e}")],
        Ok(Err(e)) => vec![format!("cannot tune: {e}")],
        Err(_) => vec![format!("cannot tune: no answer within {limit:?}")],
    }
}

/// After recovery: the networks of adopted pods are CHECKed (and their
/// addresses reported again); the others an earlier agent left are removed
/// by the first pass (`Executor::remove_networks`).
async fn adopt_networks(state: &mut State, networks: &crate::cni::PodNetworks) {
    let leftovers: BTreeSet<String> = networks.leftovers().into_iter().collect();
    let adopted: Vec<(String, String)> = state
        .pods
        .iter()
        .filter(|(_, e)| matches!(e.stage, Stage::Admitted))
        .filter_map(|(key, e)| {
            let placement = state.alloc.pods.get(key)?;
            let net =
                reconcile::pod_network(state.cfg.cni.as_ref(), &state.cfg.topology, key, &e.pod, &e.hash, placement)?;
            leftovers.contains(&net.sandbox).then(|| (key.clone(), net.sandbox))
        })
        .collect();
    for (key, sandbox) in adopted {
        match networks.check(&sandbox).await {
            Ok(ips) => {
                state.pod_ips.insert(key, (sandbox, ips));
            }
            Err(e) => {
                tracing::warn!(key, sandbox, error = %e, "the adopted pod's network failed its CHECK");
                if let Some(entry) = state.pods.get_mut(&key) {
                    entry.message = Some(format!("pod network: {e}"));
                }
            }
        }
    }
}

/// Loads the checkpoint and brings it in line with what the runtime holds.
async fn recover(cfg: AgentConfig, runtime: &Arc<dyn Runtime>) -> Result<State, AgentError> {
    let cp = Checkpoint::load(&cfg.data_dir)?;
    let op = cfg.op_timeout;
    let mut st = State::new(cfg, cp.allocations.clone(), Instant::now());
    let listed: BTreeSet<String> = call(runtime, "list containers", op, |rt| rt.list()).await?.into_iter().collect();
    let mut known = BTreeSet::new();
    for (key, rec) in cp.pods {
        let mut entry =
            PodEntry::new(Desired { pod: std::sync::Arc::unwrap_or_clone(rec.pod), plan: None }, Instant::now());
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
            st.pods.insert(key, entry);
            continue;
        }
        entry.stage = Stage::Admitted;
        st.pods.insert(key.clone(), entry);
        adopt(&mut st, runtime, &key).await;
    }
    // The pods still running meet the settings this agent starts with.
    resettle::resettle(&mut st, cp.settings.as_ref());
    // Containers the checkpoint does not know: left by a crash between a
    // runtime start and a checkpoint write that never happened, or by another
    // tool. They hold no allocation, so they must not keep running.
    for id in listed.difference(&known) {
        tracing::warn!(id, "removing a container the checkpoint does not know");
        let rid = id.clone();
        let grace = Duration::from_secs(5);
        if let Err(e) = call(runtime, &format!("stop leaked container {id}"), grace + op, move |rt| {
            rt.stop(&rid, grace)?;
            rt.remove(&rid)
        })
        .await
        {
            tracing::error!(id, error = %e, "cannot remove a leaked container");
        }
    }
    st.checkpoint().save(&st.cfg.data_dir)?;
    st.dirty = false;
    // Dead incarnations go only now that no durable checkpoint names them
    // (see `State::doomed`).
    for id in std::mem::take(&mut st.doomed) {
        let rid = id.clone();
        let grace = Duration::from_secs(1);
        if let Err(e) = call(runtime, &format!("remove {id}"), op + grace, move |rt| {
            rt.stop(&rid, grace)?;
            rt.remove(&rid)
        })
        .await
        {
            tracing::warn!(id, error = %e, "cannot remove container");
        }
    }
    Ok(st)
}

/// What recovery found of one checkpointed container.
#[derive(Debug, Clone, Copy)]
enum Found {
    Running,
    Exited(i32, bool),
    /// The checkpoint names it, the runtime never had it: the agent died
    /// between the checkpoint write and the start (a dead incarnation is
    /// removed only after a write that no longer names it). It never ran, so
    /// it starts now, with no restart counted, whatever the restart policy.
    NeverCreated,
}

/// Re-finds one checkpointed pod's containers. Running ones are adopted with
/// their CPUs; a pod none of whose containers runs gives its allocation back
/// and goes through its restart policy (re-admitted, or finished); a
/// container that was never created starts as if for the first time.
async fn adopt(st: &mut State, runtime: &Arc<dyn Runtime>, key: &str) {
    let now = Instant::now();
    let op = st.cfg.op_timeout;
    let Some(ids) = st.pods.get(key).map(|e| e.ctrs.iter().map(|c| c.runtime_id.clone()).collect::<Vec<_>>()) else {
        return;
    };
    let mut found = vec![None; ids.len()];
    for (i, id) in ids.into_iter().enumerate() {
        let Some(id) = id else { continue };
        let rid = id.clone();
        let r = call(runtime, &format!("state of {id}"), op, move |rt| {
            let state = rt.state(&rid)?;
            // What an exited one used, for the status that says it ended.
            let usage = matches!(state, ContainerState::Exited { .. }).then(|| rt.usage(&rid)).flatten();
            Ok((state, usage))
        })
        .await;
        let Some(e) = st.pods.get_mut(key) else { return };
        found[i] = Some(match r {
            Ok((ContainerState::Running { .. }, _)) => Found::Running,
            Ok((ContainerState::Exited { code, oom_killed }, usage)) => {
                e.ctrs[i].last_usage = usage;
                Found::Exited(code, oom_killed)
            }
            Ok((ContainerState::Missing, _)) => {
                tracing::info!(key, id, "the checkpoint names a container that was never created; starting it");
                Found::NeverCreated
            }
            Err(err) => {
                // Unknown is treated as running: freeing CPUs a live process
                // may hold is the one mistake that cannot be undone.
                tracing::error!(key, id, error = %err, "cannot read container state; keeping it");
                e.message = Some(err.to_string());
                Found::Running
            }
        });
    }
    let any_running = found.iter().any(|f| matches!(f, Some(Found::Running)));
    let placement = st.alloc.pods.get(key).cloned();
    let Some(e) = st.pods.get_mut(key) else { return };
    for (ctr, f) in e.ctrs.iter_mut().zip(&found) {
        match f {
            Some(Found::Running) => {
                ctr.state = CtrState::Running { since: now };
                // Adopted: its probes start over, as after a kubelet restart.
                if let Some(c) = e.pod.spec.containers.iter().find(|c| c.name == ctr.name) {
                    ctr.probes = probes::Probes::new(c, now);
                }
                // Exclusive containers already have their CPUs; shared ones get
                // the current pool on the first pass (applied = None).
                let cp = placement.as_ref().and_then(|p| reconcile::placement_of(p, &ctr.name));
                if let Some(cp) = cp.filter(|cp| matches!(cp.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable)) {
                    ctr.applied = Some((cp.cpus.clone(), cp.mems.clone()));
                }
            }
            Some(Found::NeverCreated) => {
                ctr.runtime_id = None;
                ctr.state = CtrState::Waiting { at: now, reason: None };
            }
            _ => {}
        }
    }
    if any_running {
        // Siblings of running containers restart in place, on the same CPUs.
        for (i, f) in found.iter().enumerate() {
            if let Some(Found::Exited(code, oom)) = f {
                plan::after_exit(st, key, i, *code, *oom, None, None, now);
            }
        }
        return;
    }
    // Nothing runs: give the CPUs back now, then restart policy decides.
    st.release(key);
    let Some(e) = st.pods.get_mut(key) else { return };
    let policy = e.pod.spec.restart_policy;
    let mut dead = Vec::new();
    for (ctr, f) in e.ctrs.iter_mut().zip(&found) {
        if let Some(Found::Exited(code, oom)) = f {
            ctr.last_exit = Some((*code, *oom));
            dead.extend(ctr.runtime_id.take());
        }
    }
    let again = e.ctrs.iter().zip(&found).any(|(c, f)| match (f, c.last_exit) {
        (Some(Found::NeverCreated), _) => true,
        (_, Some((code, _))) => reconcile::restarts(policy, code),
        (_, None) => true,
    });
    if again {
        let delay = st.cfg.backoff.delay(0);
        for (ctr, f) in e.ctrs.iter_mut().zip(&found) {
            if ctr.last_exit.is_some() && !matches!(f, Some(Found::NeverCreated)) {
                ctr.restart_count += 1;
                ctr.state = CtrState::Waiting { at: now + delay, reason: Some("CrashLoopBackOff".into()) };
            }
        }
        e.stage = Stage::Pending { rejected: None };
    } else {
        let codes: Vec<i32> = e.ctrs.iter().map(|c| c.last_exit.map_or(0, |x| x.0)).collect();
        for ctr in &mut e.ctrs {
            ctr.state = CtrState::Terminated;
        }
        e.stage = Stage::Finished(reconcile::finished_phase(&codes));
    }
    // Removed by `recover` once the checkpoint that no longer names them is saved.
    st.doomed.extend(dead);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
