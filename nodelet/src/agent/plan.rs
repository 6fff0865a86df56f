//! The agent's planner: `plan(state, event, now) -> Vec<Action>`, the
//! reconciler's pure step (kube-runtime's shape). It folds one event (desired
//! changes, a container exit, the result of an action) into the agent's memory
//! and returns what must happen next; it reads no clock (`now` comes in), calls
//! no runtime and touches no file, so every decision is table-tested. The
//! executor (`super::execute`) runs each action as its own task with its own
//! timeout and feeds the result back as an event, so a slow start never delays
//! another pod's admission, start, stop or exit.
//!
//! After the event, one pass: stop pods being deleted or replaced, admit
//! pending pods (the engine on the node's truth), move shared containers'
//! cpusets with the pool, give due containers a runtime id, and write ONE
//! checkpoint covering every allocation and runtime id of the pass (group
//! commit). A container starts only when the write that holds its id is
//! durable (`Event::CheckpointWritten`); one write is in flight at a time, and
//! what a pass adds meanwhile goes into the next one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use specs::probe::{ProbeKind, ProbeResult};
use specs::{Allocations, CpuSet, NodeTopology, NumaSet, Pod, PodPhase, RejectReason, Rejection};
use tokio::time::Instant;

use super::prober::ProbeTarget;
use super::probes::{Outcome, Probes};
use super::reconcile;
use super::AgentConfig;
use crate::checkpoint::{spec_hash, Checkpoint, ContainerRecord, PodRecord, VERSION};
use crate::metrics::Step;
use crate::runtime::{ContainerConfig, ContainerState};
use crate::source::{BoundPlan, DesiredChange, SourceKind};

/// How long a failed checkpoint write, cpuset update or stop waits before it
/// is tried again (each failure is also an event: retrying at once would spin).
const RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(crate) enum Stage {
    /// Not admitted. `rejected`: the epoch and rejection of the last failed try.
    Pending {
        rejected: Option<(u64, Rejection)>,
    },
    Admitted,
    /// Being stopped; `then` replaces it once every container is gone.
    /// `stopping`: a stop is in flight; `not_before`: a failed stop's retry time.
    Terminating {
        then: Option<Box<Desired>>,
        stopping: bool,
        not_before: Option<Instant>,
    },
    Finished(PodPhase),
}

#[derive(Debug, Clone)]
pub(crate) struct Desired {
    pub(crate) pod: Pod,
    pub(crate) plan: Option<BoundPlan>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CtrState {
    /// Not running; start at `at` (`reason`: why it waits, e.g. `CrashLoopBackOff`).
    Waiting {
        at: Instant,
        reason: Option<String>,
    },
    /// Has a runtime id, not yet durable: in the checkpoint write `generation`
    /// (`None`: the next one).
    Committing {
        generation: Option<u64>,
    },
    /// The runtime start is in flight. An exit the runtime reported before
    /// the start's own result (a command that ends at once) waits here.
    Starting {
        early_exit: Option<(i32, bool)>,
    },
    Running {
        since: Instant,
    },
    /// Exited and will not run again.
    Terminated,
}

#[derive(Debug, Clone)]
pub(crate) struct Ctr {
    pub(crate) name: String,
    /// The current incarnation's runtime id (it may have exited but not been removed).
    pub(crate) runtime_id: Option<String>,
    pub(crate) restart_count: u32,
    /// Consecutive crashes, for the backoff (not persisted: a restarted agent is lenient).
    streak: u32,
    pub(crate) state: CtrState,
    pub(crate) last_exit: Option<(i32, bool)>,
    /// What its last run used (cgroup figures from its exit event).
    pub(crate) last_usage: Option<specs::status::ContainerUsage>,
    /// Why the last run ended, when the exit code alone does not say (`ContainerCannotRun`).
    pub(crate) last_reason: Option<String>,
    /// The cpuset last given to the runtime; `None` forces an update.
    pub(crate) applied: Option<(CpuSet, NumaSet)>,
    /// A cpuset update is in flight.
    updating: bool,
    /// A failed cpuset update is not retried before this.
    update_after: Option<Instant>,
    /// The probes of the running incarnation (`super::probes`), made again
    /// at each start.
    pub(crate) probes: Probes,
    /// A failed liveness or startup probe is stopping it: why, recorded as
    /// the exit's reason when the exit comes.
    probe_kill: Option<String>,
    /// Failed pulls in a row, for the pull's own backoff.
    pull_failures: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct PodEntry {
    /// Shared with the checkpoints taken of it (see `PodRecord::pod`).
    pub(crate) pod: Arc<Pod>,
    pub(crate) hash: String,
    plan: Option<BoundPlan>,
    pub(crate) stage: Stage,
    pub(crate) ctrs: Vec<Ctr>,
    /// The last error worth showing (runtime failure, checkpoint failure).
    pub(crate) message: Option<String>,
    pub(crate) attempts: u32,
    /// When the agent learned of it (`State::arrivals`): pods waiting for
    /// admission are tried in this order, first come first served, as the
    /// scheduler's queue bound them.
    arrival: u64,
    /// Its placement does not fit the settings the agent restarted with
    /// (`super::resettle`); reported until the pod goes.
    pub(crate) misfit: Option<specs::engine::Misfit>,
    /// Its first start, timed for the metrics; `None` for a pod adopted
    /// after a restart, and once its last container started.
    start: Option<StartClock>,
    /// Being stopped: when the grace of the stop in flight ends (the runtime
    /// kills what is left then); reported so that a deleted pod shows its
    /// grace left while it still holds its resources.
    pub(crate) kill_at: Option<Instant>,
    /// What its `spec.tuning` could not do on this node, from the last
    /// start (`Event::Tuned`); reported in its status.
    pub(crate) tuning_notes: Vec<String>,
    /// `crate::cni::sandbox_id` of it, computed once: every report names
    /// each pod's network by it, finished pods included.
    sandbox: std::sync::OnceLock<String>,
}

/// When a pod's start passed the planner's steps (`crate::metrics::Step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StartClock {
    received: Instant,
    admitted: Option<Instant>,
    /// The checkpoint step is timed once per pod, at its first container.
    checkpointed: bool,
}

impl PodEntry {
    pub(crate) fn new(d: Desired, now: Instant) -> Self {
        let ctrs = d
            .pod
            .spec
            .containers
            .iter()
            .map(|c| Ctr {
                probes: Probes::new(c, now),
                probe_kill: None,
                name: c.name.clone(),
                runtime_id: None,
                restart_count: 0,
                streak: 0,
                state: CtrState::Waiting { at: now, reason: None },
                last_exit: None,
                last_usage: None,
                last_reason: None,
                applied: None,
                updating: false,
                update_after: None,
                pull_failures: 0,
            })
            .collect();
        PodEntry {
            hash: spec_hash(&d.pod),
            pod: Arc::new(d.pod),
            plan: d.plan,
            stage: Stage::Pending { rejected: None },
            ctrs,
            message: None,
            attempts: 0,
            arrival: 0,
            misfit: None,
            start: None,
            kill_at: None,
            tuning_notes: Vec::new(),
            sandbox: std::sync::OnceLock::new(),
        }
    }

    /// Its network's sandbox id (`crate::cni::sandbox_id`) under `key`.
    pub(crate) fn sandbox(&self, key: &str) -> &str {
        self.sandbox.get_or_init(|| crate::cni::sandbox_id(key, &reconcile::log_uid(&self.pod, &self.hash)))
    }

    fn grace(&self, default: Duration) -> Duration {
        self.pod.spec.termination_grace_period_seconds.map_or(default, Duration::from_secs)
    }

    /// The pod's log folder (see `reconcile::pod_log_dir`).
    fn log_dir(&self, data_dir: &std::path::Path, key: &str) -> PathBuf {
        reconcile::pod_log_dir(data_dir, key, &reconcile::log_uid(&self.pod, &self.hash))
    }
}

/// Why a start failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartFailure {
    /// The command cannot be executed: the job's failure, with its exit code.
    CannotRun { code: i32, message: String },
    /// Anything else (runtime fault, timeout): recorded as `START_ERROR_CODE`.
    Other(String),
    /// The pod network failed for a reason of the host (`netcheck::Unfit`):
    /// the node runs its pods with `lo` only from now on and says so.
    HostNetwork { unfit: crate::netcheck::Unfit, message: String },
    /// The image could not be pulled (or may not be: `Never`): tried again
    /// after a backoff, no container ran, not a restart.
    ImagePull { message: String, never: bool },
}

/// The pod's message while its image is pulled (then the image's name).
pub(crate) const PULLING: &str = "pulling image ";

#[derive(Debug)]
pub(crate) enum Event {
    /// Desired changes, everything queued at once (one pass, one checkpoint).
    Changes(Vec<DesiredChange>),
    /// The runtime says a container's process ended.
    Exited {
        id: String,
        code: i32,
        oom_killed: bool,
        usage: Option<specs::status::ContainerUsage>,
    },
    /// The safety re-check's view of the running containers.
    /// With what an exited one used (`Runtime::usage`).
    Observed(Vec<(String, Result<ContainerState, String>, Option<specs::status::ContainerUsage>)>),
    Started {
        key: String,
        container: String,
        id: String,
        result: Result<(), StartFailure>,
    },
    /// A start is pulling its image (it was not on the node): said in the
    /// pod's message until the start ends.
    Pulling {
        key: String,
        reference: String,
    },
    /// A pod's stop finished; `errors` is empty when every container is gone.
    Stopped {
        key: String,
        errors: Vec<String>,
    },
    CheckpointWritten {
        generation: u64,
        result: Result<(), String>,
    },
    CpusetUpdated {
        key: String,
        container: String,
        id: String,
        cpus: CpuSet,
        mems: NumaSet,
        result: Result<(), String>,
    },
    /// The CPUs online now (read again from sysfs, see `AgentConfig::sysfs_root`).
    CpusOnline(CpuSet),
    /// A `Remove` returned: the id is free again, or, when it failed, its
    /// removal is tried again after `RETRY_AFTER`, the id staying busy.
    Removed {
        id: String,
        ok: bool,
    },
    /// A pod's network was set up (its addresses) or removed (none: every
    /// entry of that sandbox goes, whatever `key`).
    PodNetwork {
        key: String,
        sandbox: String,
        ips: Vec<String>,
    },
    /// A pod's CPUs were tuned at a container's start: what could not be
    /// done, or why nothing was (`crate::tuning`).
    Tuned {
        key: String,
        notes: Vec<String>,
    },
    /// A probe's run that began at `at` ended (`super::prober`).
    Probed {
        key: String,
        container: String,
        id: String,
        kind: ProbeKind,
        at: Instant,
        result: ProbeResult,
        message: Option<String>,
    },
    /// A timer: backoffs, retries, the safety re-check, probes.
    Tick,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Write (and fsync) this checkpoint; answered by `CheckpointWritten`.
    WriteCheckpoint { generation: u64, checkpoint: Box<Checkpoint> },
    /// Start a container whose id is durable; answered by `Started`.
    /// With `network`, the pod's network is set up first (`crate::cni`).
    /// An image container's image is made present first, as `pull` says.
    /// With `tuning`, the pod's CPUs are tuned once it runs (`crate::tuning`).
    Start {
        key: String,
        config: Box<ContainerConfig>,
        network: Option<Box<crate::cni::PodNetRequest>>,
        pull: specs::pod::PullPolicy,
        tuning: Option<Box<crate::tuning::TuneRequest>>,
    },
    /// Stop every container of a pod; answered by `Stopped`. Their removal
    /// follows once a checkpoint without the pod is durable.
    Stop { key: String, ids: Vec<String>, grace: Duration },
    /// Remove a dead incarnation, once no durable checkpoint names it;
    /// answered by `Removed`.
    Remove { id: String },
    /// Answered by `CpusetUpdated`.
    UpdateCpuset { key: String, container: String, id: String, cpus: CpuSet, mems: NumaSet },
    /// Read the state of these running containers; answered by `Observed`.
    Recheck { ids: Vec<String> },
    /// A forgotten pod's log folder.
    RemoveLogs { dir: PathBuf },
    /// Run one probe of a running container; answered by `Probed`.
    Probe {
        key: String,
        container: String,
        id: String,
        kind: ProbeKind,
        at: Instant,
        probe: Box<specs::probe::Probe>,
        target: ProbeTarget,
    },
    /// Stop one container whose liveness or startup probe failed; its exit
    /// event then goes through the restart policy as any exit does.
    Kill { key: String, id: String, grace: Duration },
}

impl Action {
    /// A one-line summary, for logs and the planner's tests.
    pub(crate) fn summary(&self) -> String {
        match self {
            Action::WriteCheckpoint { generation, checkpoint } => {
                let ids: Vec<&str> = checkpoint
                    .pods
                    .values()
                    .flat_map(|p| p.containers.values())
                    .filter_map(|c| c.runtime_id.as_deref())
                    .collect();
                let pods: Vec<&str> = checkpoint.allocations.pods.keys().map(String::as_str).collect();
                format!("checkpoint {generation} alloc={} ids={}", pods.join(","), ids.join(","))
            }
            Action::Start { key, config, .. } => {
                format!("start {key}/{} {} cpus={}", config.container, config.id, config.cpus)
            }
            Action::Stop { key, ids, grace } => format!("stop {key} {} grace={}s", ids.join(","), grace.as_secs()),
            Action::Remove { id } => format!("remove {id}"),
            Action::UpdateCpuset { key, container, cpus, .. } => format!("cpuset {key}/{container} {cpus}"),
            Action::Recheck { ids } => format!("recheck {}", ids.join(",")),
            Action::RemoveLogs { dir } => format!("remove logs {}", dir.display()),
            Action::Probe { key, container, kind, .. } => format!("probe {key}/{container} {}", kind.field()),
            Action::Kill { key, id, grace } => format!("kill {key} {id} grace={}s", grace.as_secs()),
        }
    }
}

/// The agent's memory: the node's allocations and every pod it knows.
pub(crate) struct State {
    pub(crate) cfg: AgentConfig,
    pub(crate) alloc: Allocations,
    pub(crate) pods: BTreeMap<String, PodEntry>,
    /// Keys whose latest manifest is malformed: the message, shown in the status.
    pub(crate) invalid: BTreeMap<String, String>,
    /// The checkpoint in memory differs from the file.
    pub(crate) dirty: bool,
    /// The checkpoint write in flight, and the last generation handed out.
    pub(crate) writing: Option<u64>,
    generation: u64,
    /// After a failed write, the next one waits until then.
    write_retry_at: Option<Instant>,
    recheck_in_flight: bool,
    next_recheck: Instant,
    /// The allocation epoch the latest release left (see `reconcile::retry_admission`).
    released_at: u64,
    /// The machine as discovered at start; `cfg.topology` is its online part.
    discovered: NodeTopology,
    /// CPUs of `discovered` offline now: never handed out while offline.
    pub(crate) offline: CpuSet,
    /// Dead incarnations to remove once a checkpoint that no longer names
    /// them is durable, and the ones each write in flight clears. Removed
    /// earlier, a crash before that write would leave the checkpoint naming
    /// a container the runtime lacks, which a restarted agent must be able
    /// to read as "never created" (its start is still to come).
    pub(crate) doomed: Vec<String>,
    pub(crate) doomed_by: BTreeMap<u64, Vec<String>>,
    /// Removals in flight. An id is not used again (a pod replaced by an
    /// equal spec gets the same ids) before its old container is gone.
    pub(crate) removing: BTreeSet<String>,
    /// Removals that failed (their ids still in `removing`), tried again at
    /// these times.
    pub(crate) remove_retry: BTreeMap<String, Instant>,
    /// Pods learned of so far (see `PodEntry::arrival`).
    arrivals: u64,
    /// Pod key -> its network's sandbox and addresses (`Event::PodNetwork`),
    /// kept after the network is gone while the pod is known (a finished
    /// pod still shows the address it had).
    pub(crate) pod_ips: BTreeMap<String, (String, Vec<String>)>,
    /// Why this host cannot run the pod network, once known (from
    /// `AgentConfig::network_unfit`, or a pod's setup that failed for a
    /// reason of the host): pods start with `lo` only until the agent
    /// restarts, and the report carries it as a node condition.
    pub(crate) network_down: Option<crate::netcheck::Unfit>,
    /// Pod key -> its Ready condition as last reported and since when (unix
    /// seconds); kept by the loop (`super::status::stamp_ready`), which has
    /// the wall clock this planner does not read.
    pub(crate) ready: BTreeMap<String, (bool, u64)>,
}

impl State {
    /// Frees a pod's allocation; pods the engine rejected are tried again.
    pub(crate) fn release(&mut self, key: &str) {
        if self.alloc.release(key).is_some() {
            self.released_at = self.alloc.epoch;
        }
    }

    pub(crate) fn new(cfg: AgentConfig, alloc: Allocations, now: Instant) -> Self {
        let next_recheck = now + cfg.recheck_interval;
        let cfg_unfit = cfg.network_unfit.clone();
        let discovered = cfg.topology.clone();
        State {
            discovered,
            offline: CpuSet::new(),
            cfg,
            alloc,
            pods: BTreeMap::new(),
            invalid: BTreeMap::new(),
            dirty: false,
            writing: None,
            generation: 0,
            write_retry_at: None,
            recheck_in_flight: false,
            next_recheck,
            released_at: 0,
            doomed: Vec::new(),
            doomed_by: BTreeMap::new(),
            removing: BTreeSet::new(),
            remove_retry: BTreeMap::new(),
            arrivals: 0,
            pod_ips: BTreeMap::new(),
            network_down: cfg_unfit,
            ready: BTreeMap::new(),
        }
    }

    /// The checkpoint as a projection of memory: allocations plus every admitted,
    /// terminating or finished pod.
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        let mut cp = Checkpoint {
            version: VERSION,
            allocations: self.alloc.clone(),
            pods: BTreeMap::new(),
            settings: Some(self.cfg.settings.clone()),
        };
        for (key, e) in &self.pods {
            let finished = match &e.stage {
                // A pending pod holds nothing the checkpoint must protect.
                Stage::Pending { .. } => continue,
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

    /// When the loop must wake up at the latest with no event: the next due
    /// start, retry or safety re-check.
    pub(crate) fn next_wake(&self) -> Instant {
        let mut wake = self.next_recheck;
        if let Some(t) = self.write_retry_at {
            wake = wake.min(t);
        }
        if let Some(t) = self.remove_retry.values().min() {
            wake = wake.min(*t);
        }
        for e in self.pods.values() {
            let admitted = matches!(e.stage, Stage::Admitted);
            for c in &e.ctrs {
                match (&c.state, c.update_after) {
                    (CtrState::Waiting { at, .. }, _) if admitted => wake = wake.min(*at),
                    (_, Some(t)) => wake = wake.min(t),
                    _ => {}
                }
            }
            if let Stage::Terminating { not_before: Some(t), .. } = &e.stage {
                wake = wake.min(*t);
            }
            if admitted {
                for c in e.ctrs.iter().filter(|c| matches!(c.state, CtrState::Running { .. }) && c.probe_kill.is_none())
                {
                    if let Some(t) = c.probes.next_wake() {
                        wake = wake.min(t);
                    }
                }
            }
        }
        wake
    }
}

/// Folds `event` into `state` and plans what follows (see the module docs).
pub(crate) fn plan(state: &mut State, event: Event, now: Instant) -> Vec<Action> {
    plan_batch(state, vec![event], now)
}

/// `plan` for every event already queued, with one pass (and so at most one
/// checkpoint write) after all of them.
pub(crate) fn plan_batch(state: &mut State, events: Vec<Event>, now: Instant) -> Vec<Action> {
    let mut out = Vec::new();
    for event in events {
        on_event(state, event, now, &mut out);
    }
    pass(state, now, &mut out);
    out
}

fn on_event(st: &mut State, event: Event, now: Instant, out: &mut Vec<Action>) {
    match event {
        Event::Changes(changes) => {
            for ch in changes {
                on_change(st, ch, now, out);
            }
        }
        Event::Exited { id, code, oom_killed, usage } => {
            keep_usage(st, &id, usage);
            on_exit(st, &id, code, oom_killed, now)
        }
        Event::Observed(states) => {
            st.recheck_in_flight = false;
            for (id, state, usage) in states {
                match state {
                    Ok(ContainerState::Running { .. }) => {}
                    Ok(ContainerState::Exited { code, oom_killed }) => {
                        keep_usage(st, &id, usage);
                        on_exit(st, &id, code, oom_killed, now)
                    }
                    Ok(ContainerState::Missing) => on_exit(st, &id, reconcile::LOST_CODE, false, now),
                    Err(err) => {
                        if let Some((key, _)) = find(st, &id) {
                            if let Some(e) = st.pods.get_mut(&key) {
                                e.message = Some(err);
                            }
                        }
                    }
                }
            }
        }
        Event::Started { key, container, id, result } => on_started(st, &key, &container, &id, result, now, out),
        Event::Pulling { key, reference } => {
            if let Some(e) = st.pods.get_mut(&key) {
                e.message = Some(format!("{PULLING}{reference}"));
            }
        }
        Event::PodNetwork { key, sandbox, ips } => {
            if !ips.is_empty() {
                st.pod_ips.insert(key, (sandbox, ips));
            } else {
                // A pod still known keeps the address it had (a finished
                // pod's status shows it, as in Kubernetes); it goes with the pod.
                let pods = &st.pods;
                st.pod_ips.retain(|k, (s, _)| *s != sandbox || pods.contains_key(k));
            }
        }
        Event::Tuned { key, notes } => {
            if let Some(e) = st.pods.get_mut(&key) {
                for n in &notes {
                    tracing::warn!(key, "tuning: {n}");
                }
                e.tuning_notes = notes;
            }
        }
        Event::Stopped { key, errors } => on_stopped(st, &key, errors, now, out),
        Event::CheckpointWritten { generation, result } => on_written(st, generation, result, now, out),
        Event::CpusetUpdated { key, container, id, cpus, mems, result } => {
            let Some(e) = st.pods.get_mut(&key) else { return };
            // An update of an incarnation that has since ended says nothing.
            let Some(c) = e.ctrs.iter_mut().find(|c| c.name == container && c.runtime_id.as_deref() == Some(&id))
            else {
                return;
            };
            c.updating = false;
            match result {
                Ok(()) => {
                    tracing::debug!(key, container, %cpus, "cpuset updated");
                    c.applied = Some((cpus, mems));
                    c.update_after = None;
                }
                // The container may have just exited; its exit event follows.
                Err(err) => {
                    c.applied = None;
                    c.update_after = Some(now + RETRY_AFTER);
                    e.message = Some(err);
                }
            }
        }
        Event::CpusOnline(online) => on_cpus_online(st, &online),
        Event::Probed { key, container, id, kind, at, result, message } => {
            on_probed(st, &key, &container, &id, kind, at, result, message, out)
        }
        Event::Removed { id, ok: true } => {
            st.removing.remove(&id);
        }
        // Still in `removing`: busy until a removal succeeds.
        Event::Removed { id, ok: false } => {
            st.remove_retry.insert(id, now + RETRY_AFTER);
        }
        Event::Tick => {}
    }
}

/// A CPU went offline (or came back) under the agent. The engine sees only
/// the online part of the machine from now on, so an offline CPU is never
/// handed out; containers holding one keep running (the kernel moved their
/// threads to their other CPUs) and the report says which CPUs are offline.
/// Shared containers follow the smaller pool at this pass's cpuset sync.
/// The allocation epoch moves, so a scheduler's plan made before is checked
/// against the engine again, and a pod refused before is tried again.
fn on_cpus_online(st: &mut State, online: &CpuSet) {
    // A CPU that was offline when the machine was discovered is unknown here
    // (no core, no NUMA node): it waits for a restart of the agent.
    let offline = st.discovered.all_cpus().difference(online);
    if offline == st.offline {
        return;
    }
    let gone = offline.difference(&st.offline);
    let back = st.offline.difference(&offline);
    for (key, p) in &st.alloc.pods {
        let held = p.pinned_cpus().intersection(&gone);
        if !held.is_empty() {
            tracing::warn!(key, cpus = %held, "CPUs held by a pod went offline; it keeps running on the others");
        }
    }
    if !gone.is_empty() {
        tracing::warn!(cpus = %gone, "CPUs went offline; not handed out until they are back");
    }
    if !back.is_empty() {
        tracing::info!(cpus = %back, "CPUs are online again");
    }
    st.cfg.topology = st.discovered.without_cpus(&offline);
    st.offline = offline;
    // Older plans were made on another machine; waiting pods are tried
    // again only when there is more room, not less.
    st.alloc.epoch += 1;
    if !back.is_empty() {
        st.released_at = st.alloc.epoch;
    }
}

/// The pod key and container index holding runtime id `id`.
fn find(st: &State, id: &str) -> Option<(String, usize)> {
    st.pods
        .iter()
        .find_map(|(key, e)| e.ctrs.iter().position(|c| c.runtime_id.as_deref() == Some(id)).map(|i| (key.clone(), i)))
}

/// What an ended container used goes into the status that says it ended.
fn keep_usage(st: &mut State, id: &str, usage: Option<specs::status::ContainerUsage>) {
    if let (Some(usage), Some((key, i))) = (usage, find(st, id)) {
        if let Some(c) = st.pods.get_mut(&key).and_then(|e| e.ctrs.get_mut(i)) {
            c.last_usage = Some(usage);
        }
    }
}

fn on_exit(st: &mut State, id: &str, code: i32, oom: bool, now: Instant) {
    let Some((key, i)) = find(st, id) else {
        tracing::debug!(id, code, "exit of a container the agent does not run");
        return;
    };
    let Some(e) = st.pods.get_mut(&key) else { return };
    match (&e.stage, e.ctrs[i].state.clone()) {
        (Stage::Admitted, CtrState::Running { since }) => {
            let reason = e.ctrs[i].probe_kill.take();
            after_exit(st, &key, i, code, oom, reason, Some(now.saturating_duration_since(since)), now);
            finish_if_done(st, &key);
        }
        (Stage::Admitted, CtrState::Starting { .. }) => {
            e.ctrs[i].state = CtrState::Starting { early_exit: Some((code, oom)) };
        }
        // Its stop removes it; the status still says how it ended.
        (Stage::Terminating { .. }, _) => {
            tracing::info!(key, container = e.ctrs[i].name, code, oom, "container exited while stopping");
            e.ctrs[i].last_exit = Some((code, oom));
        }
        _ => {}
    }
}

/// A container ended (or could not start): record it, remove the dead
/// incarnation, and wait to restart it or mark it terminated.
#[allow(clippy::too_many_arguments)]
pub(crate) fn after_exit(
    st: &mut State,
    key: &str,
    i: usize,
    code: i32,
    oom: bool,
    reason: Option<String>,
    ran: Option<Duration>,
    now: Instant,
) {
    let backoff = st.cfg.backoff;
    let Some(e) = st.pods.get_mut(key) else { return };
    let policy = e.pod.spec.restart_policy;
    let ctr = &mut e.ctrs[i];
    tracing::info!(key, container = ctr.name, code, oom, "container exited");
    ctr.last_exit = Some((code, oom));
    ctr.last_reason = reason;
    ctr.applied = None;
    ctr.updating = false;
    ctr.update_after = None;
    if ran.is_some_and(|r| backoff.resets_after(r)) {
        ctr.streak = 0;
    }
    let dead = ctr.runtime_id.take();
    if reconcile::restarts(policy, code) {
        let delay = backoff.delay(ctr.streak);
        ctr.streak = ctr.streak.saturating_add(1);
        ctr.restart_count += 1;
        st.cfg.metrics.restarted();
        ctr.state = CtrState::Waiting { at: now + delay, reason: Some("CrashLoopBackOff".into()) };
    } else {
        ctr.state = CtrState::Terminated;
    }
    // Removed after the write that records the exit (see `State::doomed`).
    st.doomed.extend(dead);
    // Runtime id, restart count and exit code changed.
    st.dirty = true;
}

/// An admitted pod none of whose containers will run again is finished: its
/// allocation is free at once (every process of it has exited).
fn finish_if_done(st: &mut State, key: &str) {
    let Some(e) = st.pods.get_mut(key) else { return };
    if !matches!(e.stage, Stage::Admitted) || !e.ctrs.iter().all(|c| c.state == CtrState::Terminated) {
        return;
    }
    let codes: Vec<i32> = e.ctrs.iter().map(|c| c.last_exit.map_or(0, |x| x.0)).collect();
    let phase = reconcile::finished_phase(&codes);
    tracing::info!(key, ?phase, "pod finished");
    e.stage = Stage::Finished(phase);
    st.release(key);
    st.dirty = true;
}

fn on_started(
    st: &mut State,
    key: &str,
    container: &str,
    id: &str,
    result: Result<(), StartFailure>,
    now: Instant,
    out: &mut Vec<Action>,
) {
    let found = st.pods.get(key).and_then(|e| {
        e.ctrs.iter().position(|c| {
            c.name == container && c.runtime_id.as_deref() == Some(id) && matches!(c.state, CtrState::Starting { .. })
        })
    });
    let Some(i) = found else {
        // Nothing planned this start any more: whatever it left must not run.
        if result.is_ok() {
            st.removing.insert(id.to_string());
            out.push(Action::Remove { id: id.to_string() });
        }
        return;
    };
    let Some(e) = st.pods.get_mut(key) else { return };
    let early = match e.ctrs[i].state {
        CtrState::Starting { early_exit } => early_exit,
        _ => None,
    };
    match result {
        Ok(()) => {
            tracing::info!(key, container, id, "container started");
            tracing::debug!(target: "podstart", key, id, "runtime start returned");
            e.ctrs[i].state = CtrState::Running { since: now };
            let pulled = e.message.as_deref().is_some_and(|m| m.starts_with(PULLING));
            if std::mem::take(&mut e.ctrs[i].pull_failures) > 0 || pulled {
                e.message = None;
            }
            e.ctrs[i].probes = Probes::new(&e.pod.spec.containers[i], now);
            e.ctrs[i].probe_kill = None;
            let all_started = e.ctrs.iter().all(|c| matches!(c.state, CtrState::Running { .. } | CtrState::Terminated));
            if let Some(clock) = e.start.take_if(|_| all_started) {
                st.cfg.metrics.pod_started(now.saturating_duration_since(clock.received).as_secs_f64());
            }
            if let Some((code, oom)) = early {
                if matches!(e.stage, Stage::Admitted) {
                    after_exit(st, key, i, code, oom, None, Some(Duration::ZERO), now);
                    finish_if_done(st, key);
                } else {
                    e.ctrs[i].last_exit = Some((code, oom));
                }
            }
        }
        Err(failure) => {
            // A failed start leaves nothing behind in the runtime.
            e.ctrs[i].runtime_id = None;
            let (code, reason, message) = match failure {
                StartFailure::CannotRun { code, message } => {
                    let msg = format!("container {container}: {message} (exit code {code})");
                    (code, Some("ContainerCannotRun".to_string()), msg)
                }
                StartFailure::Other(message) => {
                    // Nothing should be left, but a start that timed out may
                    // still finish after it was given up on.
                    st.removing.insert(id.to_string());
                    out.push(Action::Remove { id: id.to_string() });
                    (reconcile::START_ERROR_CODE, None, message)
                }
                StartFailure::ImagePull { message, never } => {
                    // Kubernetes' words: ErrImageNeverPull, or ErrImagePull
                    // and ImagePullBackOff while the next try waits.
                    let ctr = &mut e.ctrs[i];
                    // 10 s, then doubling to the cap, as the kubelet's pull backoff.
                    ctr.pull_failures = ctr.pull_failures.saturating_add(1);
                    let delay = st.cfg.backoff.delay(ctr.pull_failures);
                    let reason = if never { "ErrImageNeverPull" } else { "ImagePullBackOff" };
                    tracing::warn!(key, container, error = message, "image not pulled");
                    e.message =
                        Some(format!("{}: {message}", if never { "ErrImageNeverPull" } else { "ErrImagePull" }));
                    ctr.state = CtrState::Waiting { at: now + delay, reason: Some(reason.into()) };
                    return;
                }
                StartFailure::HostNetwork { unfit, message } => {
                    // No container ran: started again at once, with `lo`
                    // only. Not a crash loop, not a restart.
                    e.message = Some(format!("started without its pod network: {message}"));
                    e.ctrs[i].state = CtrState::Waiting { at: now, reason: None };
                    if st.network_down.is_none() {
                        tracing::warn!(error = %unfit, "the host cannot run the pod network; pods get only lo");
                        st.network_down = Some(unfit);
                    }
                    return;
                }
            };
            tracing::warn!(key, container, error = message, "container did not start");
            e.message = Some(message);
            if matches!(e.stage, Stage::Admitted) {
                after_exit(st, key, i, code, false, reason, None, now);
                finish_if_done(st, key);
            } else {
                e.ctrs[i].state = CtrState::Waiting { at: now, reason: None };
            }
        }
    }
}

fn on_stopped(st: &mut State, key: &str, errors: Vec<String>, now: Instant, out: &mut Vec<Action>) {
    let Some(e) = st.pods.get_mut(key) else { return };
    let Stage::Terminating { stopping, not_before, .. } = &mut e.stage else { return };
    *stopping = false;
    if !errors.is_empty() {
        // Keep the allocation: a process may still hold the CPUs.
        *not_before = Some(now + RETRY_AFTER);
        e.message = Some(errors.join("; "));
        return;
    }
    finish_termination(st, key, now, out);
}

/// Every container of a terminating pod is gone: free its allocation, forget
/// it (and its logs), and admit what replaces it.
fn finish_termination(st: &mut State, key: &str, now: Instant, out: &mut Vec<Action>) {
    let Some(e) = st.pods.remove(key) else { return };
    st.pod_ips.remove(key);
    tracing::info!(key, "pod stopped");
    st.release(key);
    // Stopped, not removed: see `State::doomed`.
    st.doomed.extend(e.ctrs.iter().filter_map(|c| c.runtime_id.clone()));
    st.dirty = true;
    let old_logs = e.log_dir(&st.cfg.data_dir, key);
    let next = match e.stage {
        Stage::Terminating { then: Some(d), .. } => Some(arrived(st, *d, now)),
        _ => None,
    };
    // A static pod deleted and re-created unchanged keeps its log folder.
    if next.as_ref().map(|n| n.log_dir(&st.cfg.data_dir, key)) != Some(old_logs.clone()) {
        out.push(Action::RemoveLogs { dir: old_logs });
    }
    if let Some(n) = next {
        st.pods.insert(key.to_string(), n);
    }
}

fn on_written(st: &mut State, generation: u64, result: Result<(), String>, now: Instant, out: &mut Vec<Action>) {
    if st.writing == Some(generation) {
        st.writing = None;
    }
    if let Some(ids) = st.doomed_by.remove(&generation) {
        match result {
            Ok(()) => {
                for id in ids {
                    st.removing.insert(id.clone());
                    out.push(Action::Remove { id });
                }
            }
            // The next write clears them.
            Err(_) => st.doomed.extend(ids),
        }
    }
    if let Err(err) = &result {
        tracing::error!(error = err, "cannot write the checkpoint");
        st.dirty = true;
        st.write_retry_at = Some(now + RETRY_AFTER);
    }
    let covered: Vec<(String, usize)> = st
        .pods
        .iter()
        .flat_map(|(key, e)| {
            e.ctrs
                .iter()
                .enumerate()
                .filter(|(_, c)| c.state == CtrState::Committing { generation: Some(generation) })
                .map(move |(i, _)| (key.clone(), i))
        })
        .collect();
    for (key, i) in covered {
        let config = match (&result, st.pods.get(&key).map(|e| matches!(e.stage, Stage::Admitted))) {
            (Ok(()), Some(true)) => start_config(st, &key, i),
            _ => None,
        };
        let tuning = config.as_ref().and_then(|_| tune_request(st, &key)).map(Box::new);
        let Some(e) = st.pods.get_mut(&key) else { continue };
        let ctr = &mut e.ctrs[i];
        match (config, &result) {
            (Some((config, network)), _) => {
                tracing::debug!(target: "podstart", key, id = config.id, "checkpoint written");
                if let Some(StartClock { admitted: Some(at), checkpointed, .. }) = &mut e.start {
                    if !std::mem::replace(checkpointed, true) {
                        let waited = now.saturating_duration_since(*at).as_secs_f64();
                        st.cfg.metrics.step(Step::CheckpointWritten, waited);
                    }
                }
                ctr.applied = Some((config.cpus.clone(), config.mems.clone()));
                ctr.state = CtrState::Starting { early_exit: None };
                let pull = e.pod.spec.containers.get(i).and_then(|c| c.image_pull_policy).unwrap_or_default();
                out.push(Action::Start {
                    key: key.clone(),
                    config: Box::new(config),
                    network: network.map(Box::new),
                    pull,
                    tuning,
                });
            }
            (None, Ok(())) => {
                // The pod is no longer admitted: the id was never used.
                ctr.runtime_id = None;
                ctr.state = CtrState::Waiting { at: now, reason: None };
            }
            (None, Err(err)) => {
                ctr.runtime_id = None;
                ctr.state = CtrState::Waiting { at: now + RETRY_AFTER, reason: Some("CheckpointError".into()) };
                e.message = Some(err.clone());
            }
        }
    }
}

/// The config of container `i` of an admitted pod, with the cpuset it gets
/// now, and the pod's network (the container joins its namespace).
/// Whether the container adds `SYS_NICE` (it may ask for real-time scheduling).
fn has_sys_nice(c: &specs::Container) -> bool {
    let caps = c.security_context.as_ref().and_then(|s| s.capabilities.as_ref());
    caps.is_some_and(|caps| caps.add.iter().any(|a| specs::pod::capability_name(a).as_deref() == Some("CAP_SYS_NICE")))
}

/// The tuning a pod asks for, on its exclusive CPUs (`crate::tuning`);
/// `None` when it asks for none.
pub(crate) fn tune_request(st: &State, key: &str) -> Option<crate::tuning::TuneRequest> {
    let e = st.pods.get(key)?;
    let placement = st.alloc.pods.get(key)?;
    let mut cpus = CpuSet::new();
    for c in placement.containers.iter().filter(|c| c.cpu_policy == specs::CpuPolicy::Exclusive) {
        cpus.union_with(&c.cpus);
    }
    let sandbox = e.sandbox(key).to_string();
    let realtime = e.pod.spec.containers.iter().any(has_sys_nice);
    let none = specs::pod::Tuning::default();
    let tuning = e.pod.spec.tuning.as_ref().unwrap_or(&none);
    crate::tuning::TuneRequest::new(sandbox, key.to_string(), cpus, tuning, realtime, &st.cfg.topology)
}

fn start_config(st: &State, key: &str, i: usize) -> Option<(ContainerConfig, Option<crate::cni::PodNetRequest>)> {
    let e = st.pods.get(key)?;
    let placement = st.alloc.pods.get(key)?;
    let spec = e.pod.spec.containers.get(i)?;
    let cp = reconcile::placement_of(placement, &spec.name)?;
    let id = e.ctrs[i].runtime_id.clone()?;
    let cpus = st.alloc.cpuset_for(&st.cfg.topology, &st.cfg.settings, cp);
    let mut cfg = reconcile::container_config(
        &st.cfg.data_dir,
        &st.cfg.device_nodes,
        key,
        &e.pod,
        spec,
        cp,
        cpus,
        id,
        st.cfg.pod_pids_limit,
    );
    cfg.system_cpus = st.cfg.settings.reserved_cpus.clone();
    if has_sys_nice(spec) {
        cfg.realtime_budget_us = Some(crate::tuning::RT_BUDGET_US);
    }
    let mut network = reconcile::pod_network(st.cfg.cni.as_ref(), &st.cfg.topology, key, &e.pod, &e.hash, placement);
    // The host cannot run the pod network: `lo` only, unless this pod's
    // network was made before (its other containers are in it).
    if st.network_down.is_some() {
        let made = |net: &crate::cni::PodNetRequest| st.pod_ips.get(key).is_some_and(|(s, _)| *s == net.sandbox);
        network = network.filter(made);
    }
    if e.pod.spec.host_users == Some(false) {
        let sandbox = e.sandbox(key).to_string();
        // With a pod network, the pod's user namespace is pinned beside it
        // (it owns the network namespace, so containers may join that).
        let pinned = match (&mut network, &st.cfg.cni) {
            (Some(net), Some(cni)) => {
                net.userns = Some(0);
                Some(cni.userns_path(&net.sandbox))
            }
            _ => None,
        };
        cfg.userns = Some(crate::runtime::UserNamespace { sandbox, base: 0, pinned });
    }
    if let (Some(net), Some(cni)) = (&network, &st.cfg.cni) {
        cfg.netns = Some(cni.netns_path(&net.sandbox));
    }
    Some((cfg, network))
}

// ---- desired changes ----

fn on_change(st: &mut State, ch: DesiredChange, now: Instant, out: &mut Vec<Action>) {
    match ch {
        DesiredChange::Apply { key, pod, plan } => {
            tracing::debug!(target: "podstart", key, "change received");
            apply(st, key, Desired { pod: *pod, plan }, now, out)
        }
        DesiredChange::Remove { key } => {
            st.invalid.remove(&key);
            remove(st, &key, out);
        }
        DesiredChange::Invalid { key, message } => {
            tracing::warn!(key, message, "manifest skipped");
            st.invalid.insert(key, message);
        }
        DesiredChange::Resync { source, pods } => {
            let listed: BTreeSet<String> = pods.iter().map(|(k, _, _)| k.clone()).collect();
            let stale: Vec<String> = st
                .pods
                .keys()
                .filter(|k| SourceKind::of_key(k) == source && !listed.contains(*k) && !is_invalid(st, k))
                .cloned()
                .collect();
            for key in stale {
                remove(st, &key, out);
            }
            for (key, pod, plan) in pods {
                apply(st, key, Desired { pod, plan }, now, out);
            }
        }
    }
}

/// Whether the key's manifest (or the file holding it, `static/<stem>` for
/// `static/<stem>/<name>`) is currently malformed: its pods keep running.
fn is_invalid(st: &State, key: &str) -> bool {
    st.invalid.contains_key(key) || key.rsplit_once('/').is_some_and(|(file, _)| st.invalid.contains_key(file))
}

/// A new entry for a pod the agent just learned of, numbered in arrival order.
fn arrived(st: &mut State, d: Desired, now: Instant) -> PodEntry {
    st.arrivals += 1;
    let start = Some(StartClock { received: now, admitted: None, checkpointed: false });
    PodEntry { arrival: st.arrivals, start, ..PodEntry::new(d, now) }
}

fn apply(st: &mut State, key: String, d: Desired, now: Instant, out: &mut Vec<Action>) {
    st.invalid.remove(&key);
    let hash = spec_hash(&d.pod);
    let Some(e) = st.pods.get_mut(&key) else {
        let e = arrived(st, d, now);
        st.pods.insert(key, e);
        return;
    };
    let same_uid = e.pod.metadata.uid == d.pod.metadata.uid;
    if e.hash == hash && same_uid {
        if let Stage::Terminating { then, .. } = &mut e.stage {
            // Deleted and re-created with the same spec: run it again once stopped.
            *then = Some(Box::new(d));
        } else {
            e.plan = d.plan;
        }
        return;
    }
    match &mut e.stage {
        Stage::Pending { .. } | Stage::Finished(_) => {
            let old_logs = e.log_dir(&st.cfg.data_dir, &key);
            let next = arrived(st, d, now);
            if next.log_dir(&st.cfg.data_dir, &key) != old_logs {
                out.push(Action::RemoveLogs { dir: old_logs });
            }
            st.pods.insert(key, next);
            st.dirty = true;
        }
        Stage::Admitted => e.stage = Stage::Terminating { then: Some(Box::new(d)), stopping: false, not_before: None },
        Stage::Terminating { then, .. } => *then = Some(Box::new(d)),
    }
}

fn remove(st: &mut State, key: &str, out: &mut Vec<Action>) {
    let Some(e) = st.pods.get_mut(key) else { return };
    match &mut e.stage {
        Stage::Pending { .. } | Stage::Finished(_) => {
            let logs = e.log_dir(&st.cfg.data_dir, key);
            st.pods.remove(key);
            st.pod_ips.remove(key);
            st.dirty = true;
            out.push(Action::RemoveLogs { dir: logs });
        }
        Stage::Admitted => e.stage = Stage::Terminating { then: None, stopping: false, not_before: None },
        Stage::Terminating { then, .. } => *then = None,
    }
}

// ---- the pass ----

fn pass(st: &mut State, now: Instant, out: &mut Vec<Action>) {
    let keys: Vec<String> = st.pods.keys().cloned().collect();
    for key in &keys {
        begin_termination(st, key, now, out);
    }
    // First come, first served (ties, as at recovery, in key order).
    let mut waiting: Vec<(u64, String)> = st.pods.iter().map(|(k, e)| (e.arrival, k.clone())).collect();
    waiting.sort();
    for (_, key) in &waiting {
        try_admit(st, key, now);
    }
    // Issued in the same pass as the admission that moved the pool, before
    // the checkpoint write that gates the new containers' starts, so they
    // normally land first; not waited for, as a slow update must not hold
    // back every start.
    sync_cpusets(st, now, out);
    for key in &keys {
        assign_due(st, key, now);
    }
    write_checkpoint(st, now, out);
    let due: Vec<String> = st.remove_retry.iter().filter(|(_, at)| **at <= now).map(|(id, _)| id.clone()).collect();
    for id in due {
        st.remove_retry.remove(&id);
        out.push(Action::Remove { id });
    }
    probe_due(st, now, out);
    if now >= st.next_recheck {
        st.next_recheck = now + st.cfg.recheck_interval;
        if !st.recheck_in_flight {
            let ids: Vec<String> = st
                .pods
                .values()
                .filter(|e| matches!(e.stage, Stage::Admitted))
                .flat_map(|e| &e.ctrs)
                .filter(|c| matches!(c.state, CtrState::Running { .. }))
                .filter_map(|c| c.runtime_id.clone())
                .collect();
            if !ids.is_empty() {
                st.recheck_in_flight = true;
                out.push(Action::Recheck { ids });
            }
        }
    }
}

fn begin_termination(st: &mut State, key: &str, now: Instant, out: &mut Vec<Action>) {
    let default_grace = st.cfg.default_grace;
    let Some(e) = st.pods.get_mut(key) else { return };
    let Stage::Terminating { stopping: false, not_before, .. } = &e.stage else { return };
    if not_before.is_some_and(|t| t > now) {
        return;
    }
    // A start in flight is waited for: stopping before it returns could miss
    // the container it creates.
    if e.ctrs.iter().any(|c| matches!(c.state, CtrState::Starting { .. })) {
        return;
    }
    for c in &mut e.ctrs {
        if matches!(c.state, CtrState::Committing { .. }) {
            // Never started: nothing to stop.
            c.runtime_id = None;
            c.state = CtrState::Waiting { at: now, reason: None };
        }
    }
    let ids: Vec<String> = e.ctrs.iter().filter_map(|c| c.runtime_id.clone()).collect();
    if ids.is_empty() {
        finish_termination(st, key, now, out);
        return;
    }
    let grace = e.grace(default_grace);
    tracing::info!(key, ?grace, "stopping pod");
    if let Stage::Terminating { stopping, not_before, .. } = &mut e.stage {
        *stopping = true;
        *not_before = None;
    }
    e.kill_at = Some(now + grace);
    out.push(Action::Stop { key: key.to_string(), ids, grace });
}

fn try_admit(st: &mut State, key: &str, now: Instant) {
    let epoch = st.alloc.epoch;
    let Some(e) = st.pods.get_mut(key) else { return };
    let Stage::Pending { rejected } = &e.stage else { return };
    if !reconcile::retry_admission(rejected.as_ref().map(|r| r.0), st.released_at) {
        return;
    }
    e.attempts += 1;
    let adopted = e.plan.as_ref().and_then(|plan| {
        match reconcile::check_plan(&st.cfg.topology, &st.cfg.settings.reserved_cpus, &st.alloc, &e.pod, plan) {
            Ok(()) => Some(plan.placement.clone()),
            Err(why) => {
                tracing::debug!(key, why, "re-running the engine instead of adopting the plan");
                None
            }
        }
    });
    let decided = match adopted {
        Some(p) => Ok(p),
        None => (st.cfg.admit)(&st.cfg.topology, &st.cfg.settings, &st.alloc, key, &e.pod),
    };
    let placement = match decided {
        Ok(p) => p,
        Err(rejection) => {
            st.cfg.metrics.rejected(rejection.reason);
            // Retried at every change of the allocations: say it once.
            if rejected.as_ref().map(|r| &r.1) != Some(&rejection) {
                tracing::info!(key, reason = ?rejection.reason, message = rejection.message, "pod rejected");
            }
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
    e.stage = Stage::Admitted;
    e.message = None;
    st.cfg.metrics.admitted();
    if let Some(c) = &mut e.start {
        c.admitted = Some(now);
        st.cfg.metrics.step(Step::Admitted, now.saturating_duration_since(c.received).as_secs_f64());
    }
    st.alloc.apply(key, placement);
    // Durable before anything uses it: the pass's checkpoint write holds it,
    // and the pod's containers start only once that write is done.
    st.dirty = true;
    tracing::info!(key, "pod admitted");
    tracing::debug!(target: "podstart", key, "pod admitted");
}

/// Gives every running container the cpuset it should have now (the shared
/// pool moves when exclusive CPUs are taken or freed). In place: no restart.
fn sync_cpusets(st: &mut State, now: Instant, out: &mut Vec<Action>) {
    let State { pods, alloc, cfg, .. } = st;
    for (key, e) in pods.iter_mut() {
        if !matches!(e.stage, Stage::Admitted | Stage::Terminating { .. }) {
            continue;
        }
        let Some(placement) = alloc.pods.get(key) else { continue };
        for ctr in &mut e.ctrs {
            let (CtrState::Running { .. }, Some(id)) = (&ctr.state, &ctr.runtime_id) else { continue };
            if ctr.updating || ctr.update_after.is_some_and(|t| t > now) {
                continue;
            }
            let Some(cp) = reconcile::placement_of(placement, &ctr.name) else { continue };
            let want = (alloc.cpuset_for(&cfg.topology, &cfg.settings, cp), cp.mems.clone());
            if ctr.applied.as_ref() != Some(&want) {
                ctr.updating = true;
                out.push(Action::UpdateCpuset {
                    key: key.clone(),
                    container: ctr.name.clone(),
                    id: id.clone(),
                    cpus: want.0,
                    mems: want.1,
                });
            }
        }
    }
}

/// Gives every due container of an admitted pod its runtime id; it starts
/// once a checkpoint holding the id is written.
fn assign_due(st: &mut State, key: &str, now: Instant) {
    let State { pods, doomed, doomed_by, removing, .. } = st;
    let Some(e) = pods.get_mut(key) else { return };
    if !matches!(e.stage, Stage::Admitted) {
        return;
    }
    // The id's old container is still to be removed: wait for its `Removed`.
    let busy = |id: &String| removing.contains(id) || doomed.contains(id) || doomed_by.values().any(|d| d.contains(id));
    for ctr in &mut e.ctrs {
        if matches!(ctr.state, CtrState::Waiting { at, .. } if at <= now) {
            let id = reconcile::runtime_id(key, &ctr.name, &e.hash, ctr.restart_count);
            if busy(&id) {
                continue;
            }
            ctr.runtime_id = Some(id);
            ctr.state = CtrState::Committing { generation: None };
        }
    }
}

fn write_checkpoint(st: &mut State, now: Instant, out: &mut Vec<Action>) {
    if st.writing.is_some() || st.write_retry_at.is_some_and(|t| t > now) {
        return;
    }
    let mut waiting = false;
    for e in st.pods.values() {
        waiting |= e.ctrs.iter().any(|c| c.state == CtrState::Committing { generation: None });
    }
    if !st.dirty && !waiting && st.doomed.is_empty() {
        return;
    }
    st.generation += 1;
    let generation = st.generation;
    if !st.doomed.is_empty() {
        st.doomed_by.insert(generation, std::mem::take(&mut st.doomed));
    }
    for e in st.pods.values_mut() {
        for c in &mut e.ctrs {
            if c.state == (CtrState::Committing { generation: None }) {
                c.state = CtrState::Committing { generation: Some(generation) };
            }
        }
    }
    st.dirty = false;
    st.write_retry_at = None;
    st.writing = Some(generation);
    out.push(Action::WriteCheckpoint { generation, checkpoint: Box::new(st.checkpoint()) });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

/// Where a network probe of `key`'s containers connects: its pod address
/// from the host, 127.0.0.1 for `hostNetwork`, else inside its namespace.
fn probe_target(st: &State, key: &str, e: &PodEntry) -> ProbeTarget {
    if e.pod.spec.host_network {
        return ProbeTarget::host();
    }
    let sandbox = e.sandbox(key).to_string();
    st.pod_ips
        .get(key)
        .filter(|(s, _)| *s == sandbox)
        .and_then(|(_, ips)| ips.iter().find_map(|ip| ip.split('/').next()?.parse().ok()))
        .map_or(ProbeTarget::InsideNetns, ProbeTarget::Addr)
}

/// Starts every probe due now, of every running container of an admitted pod.
fn probe_due(st: &mut State, now: Instant, out: &mut Vec<Action>) {
    let keys: Vec<String> = st
        .pods
        .iter()
        .filter(|(_, e)| matches!(e.stage, Stage::Admitted) && e.ctrs.iter().any(|c| c.probes.any()))
        .map(|(k, _)| k.clone())
        .collect();
    for key in keys {
        let Some(e) = st.pods.get(&key) else { continue };
        let target = probe_target(st, &key, e);
        let Some(e) = st.pods.get_mut(&key) else { continue };
        for c in &mut e.ctrs {
            let Some(id) = c.runtime_id.clone() else { continue };
            if !matches!(c.state, CtrState::Running { .. }) || c.probe_kill.is_some() {
                continue;
            }
            for (kind, at, probe) in c.probes.take_due(now) {
                out.push(Action::Probe {
                    key: key.clone(),
                    container: c.name.clone(),
                    id: id.clone(),
                    kind,
                    at,
                    probe: Box::new(probe),
                    target: target.clone(),
                });
            }
        }
    }
}

/// A probe's result: readiness follows it; a liveness or startup probe at
/// its failure threshold stops the container, whose exit then takes the
/// restart policy's path (restart count, backoff) with the probe's reason.
#[allow(clippy::too_many_arguments)]
fn on_probed(
    st: &mut State,
    key: &str,
    container: &str,
    id: &str,
    kind: ProbeKind,
    at: Instant,
    result: ProbeResult,
    message: Option<String>,
    out: &mut Vec<Action>,
) {
    let grace = st.cfg.default_grace;
    let Some(e) = st.pods.get_mut(key) else { return };
    let grace = e.grace(grace);
    // A result of an incarnation that has ended says nothing.
    let Some(c) = e.ctrs.iter_mut().find(|c| {
        c.name == container && c.runtime_id.as_deref() == Some(id) && matches!(c.state, CtrState::Running { .. })
    }) else {
        return;
    };
    if result != ProbeResult::Success {
        tracing::debug!(key, container, probe = kind.field(), ?result, message, "probe failed");
    }
    if c.probes.record(kind, at, result) == Outcome::Restart && c.probe_kill.is_none() {
        let what = match kind {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Startup => "Startup",
            ProbeKind::Readiness => "Readiness",
        };
        let why = format!("{what} probe failed: {}", message.unwrap_or_else(|| format!("{result:?}")));
        tracing::info!(key, container, reason = why, "container will be restarted");
        e.message = Some(format!("container {container}: {why}"));
        c.probe_kill = Some(why);
        out.push(Action::Kill { key: key.to_string(), id: id.to_string(), grace });
    }
}
