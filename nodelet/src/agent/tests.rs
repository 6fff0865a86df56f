//! The loop driven end to end on the hollow runtime. Admission here is a small
//! first-fit double (`first_fit`) so that these tests exercise the loop, not the
//! engine; `nodelet/tests/agent_hollow.rs` runs the real engine.

use std::sync::Arc;
use std::time::Duration;

use specs::qos::{effective_cpu_policy, qos_class};
use specs::testing;
use specs::topology::{Cpu, NumaNode};
use specs::{ContainerPlacement, PodPhase, RejectReason, RestartPolicy};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::*;
use crate::runtime::hollow::HollowRuntime;
use crate::source::{BoundPlan, SourceKind};
use specs::{CpuSet, NumaSet};

/// First-fit admission: exclusive containers take the lowest free CPUs outside
/// the reserved set, shared ones the pool. Enough to drive the loop.
fn first_fit(
    t: &NodeTopology,
    s: &NodeSettings,
    a: &Allocations,
    key: &str,
    pod: &Pod,
) -> Result<Placement, Rejection> {
    if a.pods.contains_key(key) {
        return Err(Rejection { reason: RejectReason::AlreadyAllocated, message: key.into() });
    }
    let qos = qos_class(pod);
    let mut free = t.all_cpus().difference(&a.exclusive_cpus()).difference(&s.reserved_cpus);
    let mut containers = Vec::new();
    for c in &pod.spec.containers {
        let policy = effective_cpu_policy(qos, c);
        let cpus = if policy == CpuPolicy::Exclusive {
            let n = c.resources.request("cpu").map_or(0, |q| q.units_ceil()) as usize;
            if free.len() < n {
                return Err(Rejection {
                    reason: RejectReason::InsufficientCpu,
                    message: format!("{n} exclusive CPUs wanted, {} free", free.len()),
                });
            }
            let take = CpuSet::from_ids(free.iter().take(n)).expect("ids of a set");
            free.difference_with(&take);
            take
        } else {
            a.shared_pool(t, s)
        };
        containers.push(ContainerPlacement {
            name: c.name.clone(),
            cpu_policy: policy,
            cpus,
            mems: NumaSet::new(),
            memory: Default::default(),
            hugepages: Default::default(),
            devices: Default::default(),
        });
    }
    Ok(Placement { numa_affinity: t.numa_ids(), containers, ..Default::default() })
}

fn topology(n: u32) -> NodeTopology {
    NodeTopology {
        cpus: (0..n).map(|id| Cpu { id, core: id, socket: 0, die: None, numa: Some(0), uncore_cache: None }).collect(),
        numa_nodes: vec![NumaNode {
            kind: Default::default(),
            id: 0,
            cpus: CpuSet::range(0, n - 1).expect("id within MAX_ID"),
            memory_bytes: 1 << 30,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn pod(name: &str, cpu: &str, policy: RestartPolicy) -> Pod {
    testing::pod(name).restart(policy).grace_seconds(0).command(&["sleep", "inf"]).limits(cpu, "64Mi").build()
}

fn exclusive(name: &str, cpus: u32) -> Pod {
    pod(name, &cpus.to_string(), RestartPolicy::Always)
}

fn shared(name: &str) -> Pod {
    // A fractional CPU limit makes the container shared.
    pod(name, "500m", RestartPolicy::Always)
}

fn config(dir: &Path, cpus: u32) -> AgentConfig {
    let mut c = AgentConfig::new(
        "n1".into(),
        dir.to_path_buf(),
        topology(cpus),
        NodeSettings { reserved_cpus: CpuSet::single(0).expect("id within MAX_ID"), ..Default::default() },
    );
    c.admit = first_fit;
    c.recheck_interval = Duration::from_millis(500);
    // No streak reset: a slow test machine must not make a crash loop look healthy.
    c.backoff = Backoff { base: Duration::from_millis(20), cap: Duration::from_millis(80), reset_after: Duration::MAX };
    c.op_timeout = Duration::from_secs(5);
    c
}

use std::path::Path;

struct Harness {
    rt: Arc<HollowRuntime>,
    tx: mpsc::Sender<DesiredChange>,
    report: watch::Receiver<NodeReport>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AgentError>>,
}

fn start(cfg: AgentConfig) -> Harness {
    let rt = Arc::new(HollowRuntime::new(&cfg.data_dir).unwrap());
    start_with(cfg, rt)
}

fn start_with(cfg: AgentConfig, rt: Arc<HollowRuntime>) -> Harness {
    let (tx, rx) = mpsc::channel(64);
    let (report_tx, report) = watch::channel(NodeReport::default());
    let (stop, stop_rx) = oneshot::channel();
    let task = tokio::spawn(run(cfg, rt.clone(), rx, report_tx, async {
        let _ = stop_rx.await;
    }));
    Harness { rt, tx, report, stop, task }
}

impl Harness {
    async fn apply(&self, key: &str, pod: Pod) {
        self.tx.send(DesiredChange::Apply { key: key.into(), pod: Box::new(pod), plan: None }).await.unwrap();
    }

    async fn remove(&self, key: &str) {
        self.tx.send(DesiredChange::Remove { key: key.into() }).await.unwrap();
    }

    /// Waits (at most 10 s) for a report that satisfies `pred`.
    async fn wait(&mut self, what: &str, pred: impl Fn(&NodeReport) -> bool) -> NodeReport {
        let r = tokio::time::timeout(Duration::from_secs(10), self.report.wait_for(|r| pred(r)))
            .await
            .map(|r| r.map(|r| r.clone()));
        match r {
            Ok(Ok(r)) => r,
            _ => panic!("timed out waiting for {what}; last report: {:#?}", *self.report.borrow()),
        }
    }

    /// Waits (at most 10 s) until the runtime satisfies `pred`.
    async fn wait_runtime(&self, what: &str, pred: impl Fn(&HollowRuntime) -> bool) {
        for _ in 0..1000 {
            if pred(&self.rt) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}; runtime: {:#?}", self.rt.all());
    }

    async fn shutdown(self) -> Arc<HollowRuntime> {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
        self.rt
    }

    fn container(&self, key: &str) -> (String, crate::runtime::hollow::HollowContainer) {
        let mut found: Vec<_> = self.rt.all().into_iter().filter(|(_, c)| c.config.pod == key).collect();
        assert_eq!(found.len(), 1, "{key}: {found:?}");
        found.remove(0)
    }
}

fn phase(r: &NodeReport, key: &str) -> Option<PodPhase> {
    r.pods.get(key).map(|p| p.phase)
}

fn running(r: &NodeReport, key: &str) -> bool {
    r.pods.get(key).is_some_and(|p| {
        p.phase == PodPhase::Running
            && p.container_statuses.iter().all(|c| c.state == specs::status::ContainerState::Running)
    })
}

fn cpus_of(r: &NodeReport, key: &str) -> String {
    r.pods[key].placement.as_ref().map(|p| p.containers[0].cpus.to_string()).unwrap_or_default()
}

#[tokio::test]
async fn shared_pool_follows_exclusive_pods_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    h.apply("static/shared", shared("shared")).await;
    h.wait("shared running", |r| running(r, "static/shared")).await;
    let (sid, s) = h.container("static/shared");
    assert_eq!(s.cpus.to_string(), "0-3");

    h.apply("static/excl", exclusive("excl", 2)).await;
    let r = h.wait("excl running", |r| running(r, "static/excl")).await;
    assert_eq!(cpus_of(&r, "static/excl"), "1-2", "reserved CPU 0 is never exclusive");
    assert_eq!(cpus_of(&r, "static/shared"), "0,3");
    let (_, e) = h.container("static/excl");
    assert_eq!(e.cpus.to_string(), "1-2");
    // Cpuset updates are tasks of their own: the report does not wait for them.
    h.wait_runtime("shared shrunk", |rt| rt.get(&sid).is_some_and(|s| s.cpuset_updates == 1)).await;
    let (sid2, s) = h.container("static/shared");
    assert_eq!((sid2.as_str(), s.cpus.to_string(), s.cpuset_updates), (sid.as_str(), "0,3".to_string(), 1));

    h.remove("static/excl").await;
    h.wait("excl gone", |r| !r.pods.contains_key("static/excl")).await;
    h.wait_runtime("shared grown", |rt| rt.get(&sid).is_some_and(|s| s.cpuset_updates == 2)).await;
    let (sid3, s) = h.container("static/shared");
    assert_eq!((sid3, s.cpus.to_string(), s.cpuset_updates), (sid, "0-3".to_string(), 2), "grown back, not restarted");
    // Removed once the checkpoint without it is durable: its own action, after the report.
    h.wait_runtime("the exclusive container removed", |rt| rt.all().len() == 1).await;
    let r = h.shutdown().await;
    let cp = Checkpoint::load(dir.path()).unwrap();
    assert_eq!(cp.allocations.pods.keys().collect::<Vec<_>>(), vec!["static/shared"]);
    assert_eq!(r.all().len(), 1, "shutdown leaves containers running");
}

#[tokio::test]
async fn rejection_is_retried_only_when_allocations_change() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    h.apply("static/a", exclusive("a", 2)).await;
    h.wait("a running", |r| running(r, "static/a")).await;
    h.apply("static/b", exclusive("b", 2)).await;
    let r = h.wait("b rejected", |r| r.pods.get("static/b").is_some_and(|p| p.reason.is_some())).await;
    let b = &r.pods["static/b"];
    assert_eq!((b.phase, b.reason.as_deref(), b.attempts), (PodPhase::Pending, Some("InsufficientCpu"), 1));
    assert!(b.message.as_deref().unwrap_or("").contains("2 exclusive CPUs wanted, 1 free"), "{b:?}");

    // Many loop passes and unrelated changes later, still one attempt.
    for _ in 0..5 {
        h.apply("static/b", exclusive("b", 2)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.report.borrow().pods["static/b"].attempts, 1, "no retry without a change in allocations");

    h.remove("static/a").await;
    let r = h.wait("b running", |r| running(r, "static/b")).await;
    assert_eq!(r.pods["static/b"].attempts, 2);
    assert_eq!(cpus_of(&r, "static/b"), "1-2");
    h.shutdown().await;
}

#[tokio::test]
async fn restart_policies_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 8));
    h.apply("static/always", pod("always", "1", RestartPolicy::Always)).await;
    h.apply("static/never", pod("never", "1", RestartPolicy::Never)).await;
    h.apply("static/onfail", pod("onfail", "1", RestartPolicy::OnFailure)).await;
    h.apply("static/oom", pod("oom", "1", RestartPolicy::Never)).await;
    h.wait("all running", |r| ["always", "never", "onfail", "oom"].iter().all(|k| running(r, &format!("static/{k}"))))
        .await;
    let cpus_before = cpus_of(&h.report.borrow(), "static/always");

    let (id, _) = h.container("static/always");
    h.rt.exit(&id, 1, false).unwrap();
    let r = h
        .wait("always restarted", |r| {
            running(r, "static/always") && r.pods["static/always"].container_statuses[0].restart_count == 1
        })
        .await;
    let c = &r.pods["static/always"].container_statuses[0];
    assert_eq!((c.last_exit_code, c.reason.as_deref()), (Some(1), Some("Error")));
    assert_eq!(cpus_of(&r, "static/always"), cpus_before, "a restart keeps the allocation");
    let (id2, _) = h.container("static/always");
    assert_ne!(id, id2, "a new incarnation");

    let (id, _) = h.container("static/onfail");
    h.rt.exit(&id, 3, false).unwrap();
    h.wait("onfail restarted", |r| {
        running(r, "static/onfail") && r.pods["static/onfail"].container_statuses[0].restart_count == 1
    })
    .await;
    let (id, _) = h.container("static/onfail");
    h.rt.exit(&id, 0, false).unwrap();
    let r = h.wait("onfail done", |r| phase(r, "static/onfail") == Some(PodPhase::Succeeded)).await;
    assert!(r.pods["static/onfail"].placement.is_none(), "a finished pod frees its CPUs");

    let (id, _) = h.container("static/never");
    h.rt.exit(&id, 2, false).unwrap();
    let r = h.wait("never failed", |r| phase(r, "static/never") == Some(PodPhase::Failed)).await;
    assert_eq!(r.pods["static/never"].container_statuses[0].last_exit_code, Some(2));

    let (id, _) = h.container("static/oom");
    h.rt.exit(&id, 137, true).unwrap();
    let r = h.wait("oom failed", |r| phase(r, "static/oom") == Some(PodPhase::Failed)).await;
    let p = &r.pods["static/oom"];
    assert_eq!(p.container_statuses[0].reason.as_deref(), Some("OOMKilled"));
    assert!(p.message.as_deref().unwrap_or("").contains("OOM-killed"), "{p:?}");
    assert_eq!(r.allocations.pods.keys().collect::<Vec<_>>(), vec!["static/always"]);

    // Crash-looping: the first restart was at once, each next one waits
    // longer (20, 40, 80, 80 ms, capped).
    let mut waits = Vec::new();
    for n in 2..=5u32 {
        let (id, _) = h.container("static/always");
        let t = Instant::now();
        h.rt.exit(&id, 1, false).unwrap();
        h.wait("restart", |r| {
            running(r, "static/always") && r.pods["static/always"].container_statuses[0].restart_count == n
        })
        .await;
        waits.push(t.elapsed());
    }
    for (w, min) in waits.iter().zip([20u64, 40, 80, 80]) {
        // 3/4 of the backoff: under load the test's clock starts a poll tick before
        // the agent's (seen once at 77.7 ms for an 80 ms backoff).
        let floor = Duration::from_millis(min * 3 / 4);
        assert!(*w >= floor, "restart came after {w:?}, before the {min} ms backoff: {waits:?}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn restarted_agent_adopts_frees_and_cleans() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 8));
    h.apply("static/a", exclusive("a", 2)).await;
    h.apply("static/b", exclusive("b", 2)).await;
    h.apply("static/s", shared("s")).await;
    let before = h.wait("all running", |r| ["a", "b", "s"].iter().all(|k| running(r, &format!("static/{k}")))).await;
    let rt = h.shutdown().await;
    let (a_id, _) = rt.all().into_iter().find(|(_, c)| c.config.pod == "static/a").unwrap();
    let (b_id, _) = rt.all().into_iter().find(|(_, c)| c.config.pod == "static/b").unwrap();

    // While the agent is away: b dies, and someone leaves a container behind.
    rt.exit(&b_id, 1, false).unwrap();
    let mut leak = rt.get(&a_id).unwrap().config;
    leak.id = "leaked_1".into();
    rt.start(&leak, &mut Default::default()).unwrap();
    drop(rt);

    // The same data dir, a fresh runtime object (as after a process restart).
    let mut h = start(config(dir.path(), 8));
    let r = h
        .wait("recovered", |r| {
            ["a", "b", "s"].iter().all(|k| running(r, &format!("static/{k}")))
                && r.pods["static/b"].container_statuses[0].restart_count == 1
        })
        .await;
    assert_eq!(cpus_of(&r, "static/a"), cpus_of(&before, "static/a"), "adopted with the same CPUs");
    let (a_id2, a) = h.container("static/a");
    assert_eq!((a_id2, a.cpuset_updates), (a_id, 0), "adopted, not restarted");
    assert_eq!(r.pods["static/b"].container_statuses[0].last_exit_code, Some(1));
    assert!(h.rt.get("leaked_1").is_none(), "the unknown container is removed");
    assert_eq!(h.rt.all().len(), 3);
    // Nothing allocated twice: exclusive CPUs of a and b are disjoint.
    let cp = Checkpoint::load(dir.path()).unwrap();
    let ex: Vec<CpuSet> = cp
        .allocations
        .pods
        .values()
        .flat_map(|p| p.containers.iter())
        .filter(|c| c.cpu_policy == CpuPolicy::Exclusive)
        .map(|c| c.cpus.clone())
        .collect();
    assert_eq!(ex.len(), 2);
    assert!(ex[0].is_disjoint(&ex[1]), "{ex:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn replaced_manifest_restarts_the_pod_and_resync_removes_stale_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    h.apply("static/a", exclusive("a", 1)).await;
    h.apply("static/keep", shared("keep")).await;
    h.apply("static/bad", shared("bad")).await;
    h.apply("static/many/x", shared("x")).await;
    h.wait("running", |r| ["a", "keep", "bad", "many/x"].iter().all(|k| running(r, &format!("static/{k}")))).await;
    let (old_id, _) = h.container("static/a");

    h.apply("static/a", exclusive("a", 2)).await;
    let r = h.wait("a replaced", |r| running(r, "static/a") && cpus_of(r, "static/a") == "1-2").await;
    let (new_id, _) = h.container("static/a");
    assert!(h.rt.get(&old_id).is_none());
    assert_ne!(old_id, new_id);
    assert_eq!(r.pods["static/a"].container_statuses[0].restart_count, 0);

    // "bad" now has a malformed manifest: it keeps running; "keep" is listed; "a" is gone.
    h.tx.send(DesiredChange::Invalid { key: "static/bad".into(), message: "bad.yaml: spec: oops".into() })
        .await
        .unwrap();
    // A broken file that held several pods: they keep running too.
    h.tx.send(DesiredChange::Invalid { key: "static/many".into(), message: "many.yaml: oops".into() }).await.unwrap();
    h.tx.send(DesiredChange::Resync {
        source: SourceKind::Static,
        pods: vec![("static/keep".into(), shared("keep"), None)],
    })
    .await
    .unwrap();
    let r = h.wait("a removed", |r| !r.pods.contains_key("static/a")).await;
    assert!(running(&r, "static/keep") && running(&r, "static/bad") && running(&r, "static/many/x"));
    assert_eq!(r.pods["static/many"].reason.as_deref(), Some("InvalidManifest"));
    assert!(r.pods["static/bad"].message.as_deref().unwrap_or("").contains("bad.yaml: spec: oops"));
    h.shutdown().await;
}

#[tokio::test]
async fn plans_at_the_current_epoch_are_adopted_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    let placement = |cpus: &str| Placement {
        numa_affinity: NumaSet::single(0).expect("id within MAX_ID"),
        containers: vec![ContainerPlacement {
            name: "main".into(),
            cpu_policy: CpuPolicy::Exclusive,
            cpus: CpuSet::parse_list(cpus).unwrap(),
            mems: NumaSet::new(),
            memory: Default::default(),
            hugepages: Default::default(),
            devices: Default::default(),
        }],
        ..Default::default()
    };
    let plan = Some(BoundPlan { epoch: 0, placement: placement("3") });
    h.tx.send(DesiredChange::Apply { key: "p".into(), pod: Box::new(exclusive("p", 1)), plan }).await.unwrap();
    let r = h.wait("p running", |r| running(r, "p")).await;
    assert_eq!(cpus_of(&r, "p"), "3", "the scheduler's choice, not first-fit's");
    // A stale plan (epoch 0, node now at 1) goes through the engine.
    let plan = Some(BoundPlan { epoch: 0, placement: placement("3") });
    h.tx.send(DesiredChange::Apply { key: "q".into(), pod: Box::new(exclusive("q", 1)), plan }).await.unwrap();
    let r = h.wait("q running", |r| running(r, "q")).await;
    assert_eq!(cpus_of(&r, "q"), "1");
    h.shutdown().await;
}

#[tokio::test]
async fn corrupt_checkpoint_and_second_agent_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("checkpoint.json"), "{\"version\":1,").unwrap();
    let h = start(config(dir.path(), 4));
    let err = h.task.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains(&dir.path().join("checkpoint.json").display().to_string()) && err.contains("corrupt"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("checkpoint.json")).unwrap(), "{\"version\":1,", "left as is");

    let dir = tempfile::tempdir().unwrap();
    let mut first = start(config(dir.path(), 4));
    first.wait("first up", |r| r.node_name == "n1").await;
    let second = start(config(dir.path(), 4));
    let err = second.task.await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::Locked { .. }), "{err}");
    first.shutdown().await;
}

#[tokio::test]
async fn status_file_mirrors_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    h.apply("static/a", exclusive("a", 1)).await;
    let r = h.wait("a running", |r| running(r, "static/a")).await;
    // The file follows the report from its own task.
    let mut on_disk = None;
    for _ in 0..500 {
        on_disk = status::read(dir.path()).ok();
        if on_disk.as_ref() == Some(&r) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(on_disk, Some(r));
    h.apply("static/b", exclusive("b", 1)).await;
    let r = h.wait("b running", |r| running(r, "static/b")).await;
    h.shutdown().await;
    // At shutdown the file holds the last report.
    assert_eq!(status::read(dir.path()).unwrap(), r);
    let err = status::read(&dir.path().join("nope")).unwrap_err().to_string();
    assert!(err.contains("nope/status.json"), "{err}");
}

fn job(name: &str, command: &[&str]) -> Pod {
    testing::pod(name).restart(RestartPolicy::Never).command(command).limits("1", "64Mi").build()
}

#[tokio::test]
async fn jobs_pass_through_one_cpu_as_each_one_exits() {
    let dir = tempfile::tempdir().unwrap();
    // CPU 0 reserved: one allocatable CPU, so the jobs run strictly one at a time.
    let mut h = start(config(dir.path(), 2));
    let keys: Vec<String> = (0..30).map(|i| format!("static/j{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let command: &[&str] = match i % 3 {
            0 => &["true"],
            1 => &["false"],
            _ => &["sleep", "0.01"],
        };
        h.apply(k, job(&format!("j{i}"), command)).await;
    }
    let r = h
        .wait("every job finished", |r| {
            keys.iter().all(|k| matches!(phase(r, k), Some(PodPhase::Succeeded | PodPhase::Failed)))
        })
        .await;
    for (i, k) in keys.iter().enumerate() {
        let want = if i % 3 == 1 { PodPhase::Failed } else { PodPhase::Succeeded };
        assert_eq!(phase(&r, k), Some(want), "{k}");
        assert_eq!(r.pods[k].container_statuses[0].restart_count, 0, "{k}: no restart under Never");
    }
    assert!(r.allocations.pods.is_empty(), "every CPU free again: {:?}", r.allocations);
    // The last exit frees its CPU at once; removing the dead container is an
    // action of its own that may still be in flight when the report says so.
    h.wait_runtime("every finished container removed", |rt| rt.all().is_empty()).await;
    h.shutdown().await;
    let cp = Checkpoint::load(dir.path()).unwrap();
    assert!(cp.allocations.pods.is_empty());
    assert_eq!(cp.pods.values().filter(|p| p.finished.is_some()).count(), 30);
}

#[tokio::test]
async fn a_pod_log_folder_goes_with_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    h.apply("static/a", exclusive("a", 1)).await;
    h.wait("a running", |r| running(r, "static/a")).await;
    let (_, c) = h.container("static/a");
    let logs = c.config.log_path.parent().unwrap().to_path_buf();
    assert!(logs.is_dir(), "{}", logs.display());
    assert!(logs.starts_with(dir.path().join("logs")), "{}", logs.display());
    assert_eq!(crate::endpoint::newest_log(dir.path(), "static/a", "main"), c.config.log_path);
    h.remove("static/a").await;
    h.wait("a gone", |r| !r.pods.contains_key("static/a")).await;
    // Removed by its own task, right after the pod was forgotten.
    for _ in 0..500 {
        if !logs.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!logs.exists(), "{} outlived its pod", logs.display());
    h.shutdown().await;
}

/// The hollow runtime whose start of one pod waits until the test lets it go:
/// a start stuck in an image unpack or a libcontainer build under load.
struct StuckStart {
    inner: Arc<HollowRuntime>,
    pod: String,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Runtime for StuckStart {
    fn name(&self) -> &'static str {
        "stuck-start"
    }
    fn start(
        &self,
        cfg: &crate::runtime::ContainerConfig,
        trace: &mut crate::metrics::StartTrace,
    ) -> Result<(), RuntimeError> {
        if cfg.pod == self.pod {
            let rx = self.release.lock().unwrap_or_else(|p| p.into_inner());
            let _ = rx.recv_timeout(Duration::from_secs(30));
        }
        self.inner.start(cfg, trace)
    }
    fn state(&self, id: &str) -> Result<ContainerState, RuntimeError> {
        self.inner.state(id)
    }
    fn update_cpuset(&self, id: &str, cpus: &CpuSet, mems: &NumaSet) -> Result<(), RuntimeError> {
        self.inner.update_cpuset(id, cpus, mems)
    }
    fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.stop(id, grace)
    }
    fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.inner.remove(id)
    }
    fn exec(&self, id: &str, command: &[String]) -> Result<crate::runtime::ExecProcess, RuntimeError> {
        self.inner.exec(id, command)
    }
    fn list(&self) -> Result<Vec<String>, RuntimeError> {
        self.inner.list()
    }
    fn watch_exits(&self, tx: crate::runtime::ExitSender) -> Result<(), RuntimeError> {
        self.inner.watch_exits(tx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_start_holds_up_no_other_pod() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 8);
    let hollow = Arc::new(HollowRuntime::new(&cfg.data_dir).unwrap());
    let (release, rx) = std::sync::mpsc::channel();
    let rt =
        Arc::new(StuckStart { inner: hollow.clone(), pod: "static/slow".into(), release: std::sync::Mutex::new(rx) });
    let (tx, changes) = mpsc::channel(64);
    let (report_tx, report) = watch::channel(NodeReport::default());
    let (stop, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(run(cfg, rt, changes, report_tx, async {
        let _ = stop_rx.await;
    }));
    let mut h = Harness { rt: hollow, tx, report, stop, task };
    h.apply("static/done", job("done", &["sleep", "inf"])).await;
    h.wait("done running", |r| running(r, "static/done")).await;
    h.apply("static/slow", exclusive("slow", 1)).await;
    h.wait("slow starting", |r| {
        r.pods.get("static/slow").is_some_and(|p| p.reason.as_deref() == Some("ContainerCreating"))
    })
    .await;
    // While slow's start hangs: another pod is admitted and started, a
    // running one's exit is reported (and frees its CPU), a third is deleted.
    h.apply("static/fast", exclusive("fast", 1)).await;
    h.apply("static/gone", exclusive("gone", 1)).await;
    h.wait("fast and gone running", |r| running(r, "static/fast") && running(r, "static/gone")).await;
    let (id, _) = h.container("static/done");
    h.rt.exit(&id, 0, false).unwrap();
    let r = h.wait("done finished", |r| phase(r, "static/done") == Some(PodPhase::Succeeded)).await;
    assert!(r.pods["static/done"].placement.is_none(), "its CPU is free");
    h.remove("static/gone").await;
    h.wait("gone gone", |r| !r.pods.contains_key("static/gone")).await;
    assert_eq!(h.report.borrow().pods["static/slow"].reason.as_deref(), Some("ContainerCreating"), "still stuck");
    release.send(()).unwrap();
    h.wait("slow running", |r| running(r, "static/slow")).await;
    h.shutdown().await;
}

/// A fake `/sys` with each CPU's PM QoS file at "0" (no constraint).
fn fake_cpus(root: &Path, n: u32) {
    for cpu in 0..n {
        let dir = root.join(format!("sys/devices/system/cpu/cpu{cpu}/power"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pm_qos_resume_latency_us"), "0\n").unwrap();
    }
}

fn pm_qos(root: &Path) -> Vec<String> {
    (0..4)
        .map(|cpu| {
            let f = root.join(format!("sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"));
            std::fs::read_to_string(f).unwrap().trim().to_string()
        })
        .collect()
}

async fn wait_files(root: &Path, want: &[&str]) {
    for _ in 0..1000 {
        if pm_qos(root) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("pm_qos files {:?}, want {want:?}", pm_qos(root));
}

fn tuned(name: &str, cpus: u32) -> Pod {
    let mut p = exclusive(name, cpus);
    p.spec.tuning =
        Some(specs::pod::Tuning { cpu_c_states: Some(specs::pod::CStates::Disabled), ..Default::default() });
    p
}

#[tokio::test]
async fn a_pods_tuning_is_applied_at_start_and_given_back_when_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fake_cpus(&root, 4);
    let data = dir.path().join("data");
    // What an agent killed with -9 left: a gone pod's record on CPU 3.
    {
        let tuner = crate::tuning::Tuner::new(root.clone(), data.join("tuning")).unwrap();
        let ghost = tuned("ghost", 1);
        let t = ghost.spec.tuning.as_ref().unwrap();
        let cpus = CpuSet::single(3).unwrap();
        let req = crate::tuning::TuneRequest::new("ghost".into(), "static/ghost".into(), cpus, t, false, &topology(4));
        assert_eq!(tuner.tune(&req.unwrap()).unwrap(), Vec::<String>::new());
    }
    assert_eq!(pm_qos(&root), ["0", "0", "0", "n/a"]);
    let mut cfg = config(&data, 4);
    cfg.tuning_root = Some(root.clone());
    let mut h = start(cfg);
    // The first pass gives it back.
    wait_files(&root, &["0", "0", "0", "0"]).await;

    h.apply("static/t", tuned("t", 2)).await;
    h.wait("t running", |r| running(r, "static/t")).await;
    wait_files(&root, &["0", "n/a", "n/a", "0"]).await;
    // A restarted agent adopts the pod and keeps its tuning.
    let rt = h.shutdown().await;
    let mut cfg = config(&data, 4);
    cfg.tuning_root = Some(root.clone());
    let mut h = start_with(cfg, rt);
    h.apply("static/t", tuned("t", 2)).await;
    h.wait("t adopted", |r| running(r, "static/t")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pm_qos(&root), ["0", "n/a", "n/a", "0"]);
    assert_eq!(h.report.borrow().pods["static/t"].reason, None, "all of it applied");

    h.remove("static/t").await;
    h.wait("t gone", |r| !r.pods.contains_key("static/t")).await;
    wait_files(&root, &["0", "0", "0", "0"]).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_node_that_cannot_tune_says_so_in_the_pods_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(config(dir.path(), 4));
    h.apply("static/t", tuned("t", 1)).await;
    let told = |r: &NodeReport| r.pods.get("static/t").is_some_and(|p| p.reason.as_deref() == Some("TuningIncomplete"));
    let r = h.wait("t told", told).await;
    let p = &r.pods["static/t"];
    assert_eq!(p.reason.as_deref(), Some(specs::status::TUNING_INCOMPLETE));
    assert_eq!(
        p.message.as_deref(),
        Some("spec.tuning: this node does not tune CPUs (its runtime runs no real containers)")
    );
    h.shutdown().await;
}
