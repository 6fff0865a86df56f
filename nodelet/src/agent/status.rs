//! The agent's report: each pod's phase, container states, CPUs, memory NUMA
//! nodes and last error, built from the agent's memory after every change and
//! written atomically (not fsynced: it is rebuilt from memory at every change
//! and at start), by a task that follows the published report, to
//! `<data>/status.json`, where `pinion agent status` reads it.

use std::path::{Path, PathBuf};

use specs::api::ConditionStatus;
use specs::status::{ContainerState as ShownState, ContainerStatus, PlacementSummary, PodCondition, POD_READY};
use specs::{PodPhase, PodStatus};

use super::plan::{CtrState, Stage, State};
use super::{reconcile, AgentError};
use crate::fsutil::replace_atomic;
use crate::source::NodeReport;

const FILE_NAME: &str = "status.json";

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{path}: {source} (is an agent running with this --data-dir?)")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a status file: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// Reads the last report an agent wrote under `data_dir`.
pub fn read(data_dir: &Path) -> Result<NodeReport, StatusError> {
    let path = path(data_dir);
    let bytes = std::fs::read(&path).map_err(|source| StatusError::Io { path: path.clone(), source })?;
    serde_json::from_slice(&bytes).map_err(|e| StatusError::Malformed { path, reason: e.to_string() })
}

/// Whether an agent runs on `data_dir` now (it holds `agent.lock` while it
/// runs); `None` when that cannot be told (no lock file: no agent ever ran).
pub fn agent_running(data_dir: &Path) -> Option<bool> {
    let file = std::fs::File::open(data_dir.join("agent.lock")).ok()?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
        Ok(_free) => Some(false),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Some(true),
        Err(_) => None,
    }
}

/// At most this many status file writes a second: the file is for people and
/// scripts, and with jobs finishing by the thousand a write per change (every
/// pod, pretty-printed) would take the CPU the pods' starts need.
const WRITES_PER_SECOND: u32 = 10;

/// Writes the reports published on `rx` to `<data>/status.json`, the latest
/// one when several came meanwhile, until the sender is gone. A file that
/// cannot be written (disk full) must not stop the agent: the pods matter
/// more than their report; the next change tries again.
/// `lock` keeps two writers (this task's last write, still running after the
/// task was aborted, and the agent's final one) from sharing the temp file.
pub(super) async fn follow(
    data_dir: PathBuf,
    mut rx: tokio::sync::watch::Receiver<NodeReport>,
    lock: std::sync::Arc<std::sync::Mutex<()>>,
) {
    while rx.changed().await.is_ok() {
        // The pause comes before the write: a pod's start is a burst of
        // changes on the agent's reserved CPU, and writing the first at once
        // competes with the start for that CPU (a one-liner's whole start
        // fits in the pause; it is written once, after).
        tokio::time::sleep(std::time::Duration::from_secs(1) / WRITES_PER_SECOND).await;
        let report = rx.borrow_and_update().clone();
        let dir = data_dir.clone();
        let lock = lock.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
            write(&dir, &report)
        });
        match written.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot write the status file"),
            Err(e) => tracing::warn!(error = %e, "status file writer failed"),
        }
    }
}

pub(super) fn write(data_dir: &Path, report: &NodeReport) -> Result<(), AgentError> {
    let path = path(data_dir);
    let bytes = serde_json::to_vec_pretty(report).map_err(|e| AgentError::Io {
        path: path.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    })?;
    replace_atomic(&path, &bytes).map_err(|source| AgentError::Io { path, source })
}

/// Whether every container of `key`'s pod runs and is ready (`probes`):
/// the pod's Ready condition.
pub(super) fn pod_ready(e: &super::plan::PodEntry) -> bool {
    matches!(e.stage, Stage::Admitted)
        && !e.ctrs.is_empty()
        && e.ctrs.iter().all(|c| matches!(c.state, CtrState::Running { .. }) && c.probes.ready())
}

/// Brings each pod's Ready condition up to date, stamping a change with the
/// wall clock (unix seconds): the one clock read of the report, here and
/// not in the planner. A pod seen for the first time starts not ready.
pub(super) fn stamp_ready(agent: &mut State) {
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let pods = &agent.pods;
    agent.ready.retain(|k, _| pods.contains_key(k));
    for (key, e) in &agent.pods {
        let ready = pod_ready(e);
        match agent.ready.get_mut(key) {
            Some((was, _)) if *was == ready => {}
            Some(slot) => *slot = (ready, now()),
            None => {
                agent.ready.insert(key.clone(), (ready, now()));
            }
        }
    }
}

pub(super) fn build(agent: &State) -> NodeReport {
    let mut report = NodeReport {
        node_name: agent.cfg.node_name.clone(),
        allocations: agent.alloc.clone(),
        pods: Default::default(),
        rejections: Default::default(),
        offline_cpus: agent.offline.clone(),
        running: Default::default(),
        conditions: agent.network_down.iter().map(crate::netcheck::Unfit::condition).collect(),
        terminating: Vec::new(),
    };
    let (wall, mono) = (chrono::Utc::now(), tokio::time::Instant::now());
    // The end of a stop's grace in wall-clock time; none once it has passed.
    let grace_ends = |kill_at: Option<tokio::time::Instant>| {
        let left = kill_at?.checked_duration_since(mono)?;
        let at = wall + chrono::Duration::from_std(left).ok()?;
        Some(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    };
    for (key, e) in &agent.pods {
        let mut st = PodStatus {
            node_name: Some(agent.cfg.node_name.clone()),
            attempts: e.attempts,
            message: e.message.clone(),
            pod_uid: e.pod.metadata.uid.clone(),
            ..Default::default()
        };
        if let Some((sandbox, ips)) = agent.pod_ips.get(key) {
            // Only this pod's, not one of the same name before it.
            if sandbox == e.sandbox(key) {
                st.pod_ip = ips.first().cloned();
                st.pod_ips = ips.clone();
            }
        }
        let ever_started = e.ctrs.iter().any(|c| matches!(c.state, CtrState::Running { .. }) || c.restart_count > 0);
        match &e.stage {
            Stage::Pending { rejected } => {
                st.phase = PodPhase::Pending;
                if let Some((_, r)) = rejected {
                    st.reason = Some(format!("{:?}", r.reason));
                    st.message = Some(r.message.clone());
                    report.rejections.insert(key.clone(), r.clone());
                }
            }
            Stage::Admitted if ever_started => st.phase = PodPhase::Running,
            Stage::Admitted => {
                st.phase = PodPhase::Pending;
                // A pull that failed says so (the message has the registry's words).
                let pull = e.ctrs.iter().find_map(|c| match &c.state {
                    CtrState::Waiting { reason: Some(r), .. } if r == "ImagePullBackOff" => Some("ErrImagePull"),
                    CtrState::Waiting { reason: Some(r), .. } if r == "ErrImageNeverPull" => Some("ErrImageNeverPull"),
                    _ => None,
                });
                st.reason = Some(pull.unwrap_or("ContainerCreating").into());
            }
            Stage::Terminating { .. } => {
                st.phase = PodPhase::Running;
                st.reason = Some(specs::status::TERMINATING.into());
                st.grace_ends = grace_ends(e.kill_at);
                report.terminating.push(specs::api::TerminatingPod {
                    name: key.clone(),
                    owner: e.pod.metadata.owner.clone(),
                    labels: e.pod.metadata.labels.clone(),
                    grace_ends: st.grace_ends.clone(),
                });
            }
            Stage::Finished(phase) => st.phase = *phase,
        }
        if let Some(p) = agent.alloc.pods.get(key) {
            // Show the live cpusets: shared containers follow the pool.
            let mut summary: PlacementSummary = p.summary();
            for (shown, c) in summary.containers.iter_mut().zip(&p.containers) {
                shown.cpus = agent.alloc.cpuset_for(&agent.cfg.topology, &agent.cfg.settings, c);
            }
            st.placement = Some(summary);
            if !agent.offline.is_empty() && st.message.is_none() {
                let held = p.pinned_cpus().intersection(&agent.offline);
                if !held.is_empty() {
                    st.message = Some(format!("CPUs {held} of this pod went offline; it keeps running on the others"));
                }
            }
        }
        let running: std::collections::BTreeMap<String, String> = e
            .ctrs
            .iter()
            .filter(|c| matches!(c.state, CtrState::Running { .. }))
            .filter_map(|c| Some((c.name.clone(), c.runtime_id.clone()?)))
            .collect();
        if !running.is_empty() {
            report.running.insert(key.clone(), running);
        }
        st.container_statuses = e
            .ctrs
            .iter()
            .map(|c| {
                let last_reason = || {
                    c.last_reason
                        .clone()
                        .or_else(|| c.last_exit.map(|(code, oom)| reconcile::exit_reason(code, oom).into()))
                };
                let (state, reason) = match &c.state {
                    CtrState::Waiting { reason, .. } => (ShownState::Waiting, reason.clone()),
                    CtrState::Committing { .. } | CtrState::Starting { .. } => {
                        (ShownState::Waiting, Some("ContainerCreating".to_string()))
                    }
                    CtrState::Running { .. } => (ShownState::Running, None),
                    CtrState::Terminated => (ShownState::Terminated, last_reason()),
                };
                // A running or waiting container still says how it last ended.
                let reason = reason.or_else(last_reason);
                ContainerStatus {
                    name: c.name.clone(),
                    state,
                    restart_count: c.restart_count,
                    last_exit_code: c.last_exit.map(|x| x.0),
                    reason,
                    ready: state == ShownState::Running && c.probes.ready(),
                    usage: c.last_usage.clone(),
                }
            })
            .collect();
        if let Some((ready, since)) = agent.ready.get(key) {
            st.conditions.push(PodCondition {
                kind: POD_READY.into(),
                status: if *ready { ConditionStatus::True } else { ConditionStatus::False },
                last_transition_time: Some(*since),
            });
        }
        if st.message.is_none() {
            if let Some(c) = e.ctrs.iter().find(|c| c.last_exit.is_some_and(|x| x.1)) {
                let code = c.last_exit.map_or(0, |x| x.0);
                st.message = Some(format!("container {} was OOM-killed (exit code {code})", c.name));
            }
        }
        if !e.tuning_notes.is_empty() && st.reason.is_none() && st.message.is_none() {
            st.reason = Some(specs::status::TUNING_INCOMPLETE.into());
            st.message = Some(format!("spec.tuning: {}", e.tuning_notes.join("; ")));
        }
        if let Some(m) = &e.misfit {
            st.reason = Some(super::resettle::SETTINGS_MISFIT.into());
            st.message = Some(super::resettle::status_message(m, agent.cfg.on_settings_change));
        }
        if let Some(msg) = agent.invalid.get(key) {
            st.message = Some(format!("manifest skipped, the previous version keeps running: {msg}"));
        }
        report.pods.insert(key.clone(), st);
    }
    for (key, msg) in &agent.invalid {
        report.pods.entry(key.clone()).or_insert_with(|| PodStatus {
            phase: PodPhase::Pending,
            node_name: Some(agent.cfg.node_name.clone()),
            reason: Some("InvalidManifest".into()),
            message: Some(msg.clone()),
            ..Default::default()
        });
    }
    report
}
