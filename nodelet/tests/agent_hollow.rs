//! The agent with the real admission engine and the hollow runtime on
//! multi-NUMA machines: a hand-built 2x10 machine and the sysfs fixtures.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nodelet::agent::resettle::{OnSettingsChange, SETTINGS_MISFIT};
use nodelet::agent::{AgentConfig, AgentError};
use nodelet::runtime::hollow::HollowRuntime;
use nodelet::runtime::Runtime;
use nodelet::source::{DesiredChange, NodeReport};
use specs::topology::{Cpu, NumaNode};
use specs::{CpuSet, NodeSettings, NodeTopology, NumaSet, Pod, PodPhase, RestartPolicy, TopologyPolicy};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Two sockets, one NUMA node each, ten cores each, no SMT.
fn two_by_ten() -> NodeTopology {
    NodeTopology {
        cpus: (0..20)
            .map(|id| Cpu { id, core: id, socket: id / 10, die: None, numa: Some(id / 10), uncore_cache: None })
            .collect(),
        numa_nodes: (0..2)
            .map(|id| NumaNode {
                kind: Default::default(),
                id,
                cpus: CpuSet::range(id * 10, id * 10 + 9).expect("id within MAX_ID"),
                memory_bytes: 64 << 30,
                distances: if id == 0 { vec![10, 21] } else { vec![21, 10] },
                hugepages: vec![],
            })
            .collect(),
        ..Default::default()
    }
}

/// The real machines' sysfs trees kept in the repository (`e2e/fixtures/sysfs`).
fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/fixtures/sysfs")
}

/// Extracts a sysfs fixture and discovers its topology.
fn fixture(name: &str, into: &Path) -> NodeTopology {
    let tarball = fixtures_dir().join(format!("{name}.tar.gz"));
    assert!(tarball.is_file(), "fixture {} missing", tarball.display());
    let status = std::process::Command::new("tar").arg("xzf").arg(&tarball).arg("-C").arg(into).status().unwrap();
    assert!(status.success(), "tar xzf {}", tarball.display());
    nodelet::discovery::discover(into).unwrap()
}

fn pod(name: &str, cpus: u32) -> Pod {
    sleeper(name, &cpus.to_string())
}

/// `sleep inf` on the host's binaries with a CPU limit of `cpu`.
fn sleeper(name: &str, cpu: &str) -> Pod {
    specs::testing::pod(name).grace_seconds(0).host_rootfs().command(&["sleep", "inf"]).limits(cpu, "1Gi").build()
}

struct Agent {
    rt: Arc<HollowRuntime>,
    tx: mpsc::Sender<DesiredChange>,
    report: watch::Receiver<NodeReport>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AgentError>>,
}

fn start(data: &Path, topology: NodeTopology, settings: NodeSettings) -> Agent {
    start_with(data, topology, settings, OnSettingsChange::Keep)
}

fn start_with(data: &Path, topology: NodeTopology, settings: NodeSettings, on_change: OnSettingsChange) -> Agent {
    let mut cfg = AgentConfig::new("n1".into(), data.to_path_buf(), topology, settings);
    cfg.recheck_interval = Duration::from_millis(500);
    cfg.on_settings_change = on_change;
    let rt = Arc::new(HollowRuntime::new(data).unwrap());
    let (tx, rx) = mpsc::channel(64);
    let (report_tx, report) = watch::channel(NodeReport::default());
    let (stop, stop_rx) = oneshot::channel();
    let task = tokio::spawn(nodelet::agent::run(cfg, rt.clone(), rx, report_tx, async {
        let _ = stop_rx.await;
    }));
    Agent { rt, tx, report, stop, task }
}

impl Agent {
    async fn apply(&self, key: &str, pod: Pod) {
        self.tx.send(DesiredChange::Apply { key: key.into(), pod: Box::new(pod), plan: None }).await.unwrap();
    }

    async fn wait(&mut self, what: &str, pred: impl Fn(&NodeReport) -> bool) -> NodeReport {
        let r = tokio::time::timeout(Duration::from_secs(10), self.report.wait_for(|r| pred(r)))
            .await
            .map(|r| r.map(|r| r.clone()));
        match r {
            Ok(Ok(r)) => r,
            _ => panic!("timed out waiting for {what}; last report: {:#?}", *self.report.borrow()),
        }
    }

    async fn shutdown(self) -> Arc<HollowRuntime> {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
        self.rt
    }
}

fn running(r: &NodeReport, key: &str) -> bool {
    r.pods.get(key).is_some_and(|p| p.phase == PodPhase::Running)
}

fn placed(r: &NodeReport, key: &str) -> (CpuSet, NumaSet) {
    let c = &r.pods[key].placement.as_ref().unwrap().containers[0];
    (c.cpus.clone(), c.mems.clone())
}

/// The NUMA nodes whose CPUs `cpus` touches.
fn nodes_of(t: &NodeTopology, cpus: &CpuSet) -> NumaSet {
    NumaSet::from_ids(cpus.iter().filter_map(|c| t.cpu(c)?.numa)).expect("ids within MAX_ID")
}

#[tokio::test]
async fn single_numa_node_on_two_by_ten_and_retry_after_removal() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_by_ten();
    let settings = NodeSettings { topology_policy: TopologyPolicy::SingleNumaNode, ..Default::default() };
    let mut a = start(dir.path(), t.clone(), settings);
    a.apply("static/a", pod("a", 8)).await;
    a.apply("static/b", pod("b", 8)).await;
    let r = a.wait("a and b running", |r| running(r, "static/a") && running(r, "static/b")).await;
    let (ca, ma) = placed(&r, "static/a");
    let (cb, mb) = placed(&r, "static/b");
    assert_eq!((ca.len(), cb.len()), (8, 8));
    assert_eq!(nodes_of(&t, &ca).len(), 1, "a on one NUMA node: {ca}");
    assert_eq!(nodes_of(&t, &cb).len(), 1, "b on one NUMA node: {cb}");
    assert_ne!(nodes_of(&t, &ca), nodes_of(&t, &cb), "one pod per node");
    assert_eq!(ma, nodes_of(&t, &ca), "memory bound to the pod's node");
    assert_eq!(mb, nodes_of(&t, &cb));

    // 4 CPUs are free in total, but only 2 per node: single-numa-node says no.
    a.apply("static/c", pod("c", 4)).await;
    let r = a.wait("c rejected", |r| r.pods.get("static/c").is_some_and(|p| p.reason.is_some())).await;
    let c = &r.pods["static/c"];
    assert_eq!((c.phase, c.reason.as_deref(), c.attempts), (PodPhase::Pending, Some("TopologyAffinity"), 1), "{c:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.report.borrow().pods["static/c"].attempts, 1, "not retried while nothing changes");

    a.tx.send(DesiredChange::Remove { key: "static/a".into() }).await.unwrap();
    let r = a.wait("c running", |r| running(r, "static/c")).await;
    let (cc, mc) = placed(&r, "static/c");
    assert_eq!(r.pods["static/c"].attempts, 2);
    assert_eq!(nodes_of(&t, &cc), nodes_of(&t, &ca), "c takes the node a left");
    assert_eq!(mc, nodes_of(&t, &cc));
    let container = a.rt.all().into_values().find(|c| c.config.pod == "static/c").unwrap();
    assert_eq!((container.cpus, container.config.bind_memory), (cc, true));
    a.shutdown().await;
}

#[tokio::test]
async fn restarted_agent_keeps_every_pod_on_its_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_by_ten();
    let settings = || NodeSettings {
        topology_policy: TopologyPolicy::SingleNumaNode,
        reserved_cpus: CpuSet::single(0).expect("id within MAX_ID"),
        ..Default::default()
    };
    let mut a = start(dir.path(), t.clone(), settings());
    let keys: Vec<String> = (0..6).map(|i| format!("static/p{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        a.apply(k, pod(&format!("p{i}"), 3)).await;
    }
    let before = a.wait("all running", |r| keys.iter().all(|k| running(r, k))).await;
    let ids_before: Vec<String> = a.rt.list().unwrap_or_default();
    drop(a.shutdown().await);

    let mut a = start(dir.path(), t, settings());
    let after = a.wait("all adopted", |r| keys.iter().all(|k| running(r, k))).await;
    for k in &keys {
        assert_eq!(placed(&after, k), placed(&before, k), "{k} kept its CPUs");
    }
    assert_eq!(after.allocations, before.allocations, "nothing re-allocated");
    assert_eq!(a.rt.list().unwrap(), ids_before, "the same containers");
    a.shutdown().await;
}

#[tokio::test]
async fn fixture_machine_admits_on_one_numa_node() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // 2 sockets x 8 cores, one NUMA node each, HT off.
    let t = fixture("32em64t-2n8c+dax+nvme+mic+dimms", &root);
    assert_eq!((t.cpus.len(), t.numa_nodes.len()), (16, 2));
    let settings = NodeSettings { topology_policy: TopologyPolicy::SingleNumaNode, ..Default::default() };
    let data = dir.path().join("data");
    let mut a = start(&data, t.clone(), settings);
    a.apply("static/p1", pod("p1", 6)).await;
    a.apply("static/p2", pod("p2", 6)).await;
    let r = a.wait("p1 and p2 running", |r| running(r, "static/p1") && running(r, "static/p2")).await;
    for k in ["static/p1", "static/p2"] {
        let (cpus, mems) = placed(&r, k);
        assert_eq!(cpus.len(), 6);
        assert_eq!(nodes_of(&t, &cpus), mems, "{k}: CPUs and memory on the same node");
        assert_eq!(mems.len(), 1, "{k}");
    }
    assert_ne!(placed(&r, "static/p1").1, placed(&r, "static/p2").1, "one pod per node");
    // 4 CPUs free, 2 per node: 3 do not fit on one node.
    a.apply("static/p3", pod("p3", 3)).await;
    let r = a.wait("p3 rejected", |r| r.pods.get("static/p3").is_some_and(|p| p.reason.is_some())).await;
    assert_eq!(r.pods["static/p3"].reason.as_deref(), Some("TopologyAffinity"), "{:?}", r.pods["static/p3"]);
    a.shutdown().await;
}

/// Throughput of the loop itself: `true` jobs of one CPU each through a
/// 64-CPU synthetic node on the hollow runtime. A measurement, not a test of
/// speed (it asserts only that every job finished): run it with
/// `cargo test -p nodelet --release --test agent_hollow -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn hollow_job_throughput_on_64_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let t = NodeTopology {
        cpus: (0..64)
            .map(|id| Cpu { id, core: id, socket: id / 32, die: None, numa: Some(id / 32), uncore_cache: None })
            .collect(),
        numa_nodes: (0..2)
            .map(|id| NumaNode {
                kind: Default::default(),
                id,
                cpus: CpuSet::range(id * 32, id * 32 + 31).expect("id within MAX_ID"),
                memory_bytes: 256 << 30,
                distances: if id == 0 { vec![10, 21] } else { vec![21, 10] },
                hugepages: vec![],
            })
            .collect(),
        ..Default::default()
    };
    let settings = NodeSettings { reserved_cpus: CpuSet::single(0).expect("id within MAX_ID"), ..Default::default() };
    let mut a = start(dir.path(), t, settings);
    let n: usize = std::env::var("JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let job = |i: usize| {
        specs::testing::pod(&format!("j{i}"))
            .restart(RestartPolicy::Never)
            .command(&["true"])
            .limits("1", "64Mi")
            .build()
    };
    let started = std::time::Instant::now();
    for i in 0..n {
        a.apply(&format!("j{i}"), job(i)).await;
    }
    let done = |r: &NodeReport| r.pods.values().filter(|p| p.phase == PodPhase::Succeeded).count() == n;
    let r = tokio::time::timeout(Duration::from_secs(600), a.report.wait_for(|r| done(r))).await.map(|r| r.is_ok());
    assert_eq!(r, Ok(true), "not every job finished");
    let took = started.elapsed();
    println!("{n} jobs in {took:?}: {:.0} jobs/s", n as f64 / took.as_secs_f64());
    a.shutdown().await;
}

/// A sysfs tree of four single-thread CPUs in one package, no NUMA folder.
fn four_cpu_sysfs(root: &Path) {
    let cpu = root.join("sys/devices/system/cpu");
    for id in 0..4 {
        let topo = cpu.join(format!("cpu{id}/topology"));
        std::fs::create_dir_all(&topo).unwrap();
        std::fs::write(topo.join("physical_package_id"), "0\n").unwrap();
        std::fs::write(topo.join("core_id"), format!("{id}\n")).unwrap();
        std::fs::write(topo.join("thread_siblings_list"), format!("{id}\n")).unwrap();
        std::fs::write(cpu.join(format!("cpu{id}/online")), "1\n").unwrap();
    }
    std::fs::write(cpu.join("online"), "0-3\n").unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::write(root.join("proc/meminfo"), "MemTotal: 16777216 kB\n").unwrap();
}

/// What the kernel shows when CPU `id` goes offline (`on` false) or comes back.
fn set_online(root: &Path, id: u32, on: bool, online_list: &str) {
    let cpu = root.join("sys/devices/system/cpu");
    std::fs::write(cpu.join(format!("cpu{id}/online")), if on { "1\n" } else { "0\n" }).unwrap();
    std::fs::write(cpu.join("online"), format!("{online_list}\n")).unwrap();
}

/// Issue 12 (the node's /sys changing under the agent): a CPU a running pod
/// holds goes offline. The agent keeps the pod running, reports the CPU
/// offline, never hands it out while it is, and uses it again once it is back.
#[tokio::test]
async fn a_cpu_going_offline_under_a_pod_is_reported_and_not_handed_out_until_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    four_cpu_sysfs(&root);
    let topology = nodelet::discovery::discover(&root).unwrap();
    let data = dir.path().join("data");
    let settings = NodeSettings { reserved_cpus: CpuSet::single(0).expect("cpus"), ..Default::default() };
    let mut cfg = AgentConfig::new("n1".into(), data.clone(), topology, settings);
    cfg.sysfs_root = Some(root.clone());
    // A short poll keeps the test quick; nothing below depends on its timing.
    cfg.cpu_recheck_interval = Duration::from_millis(20);
    let rt = Arc::new(HollowRuntime::new(&data).unwrap());
    let (tx, rx) = mpsc::channel(64);
    let (report_tx, report) = watch::channel(NodeReport::default());
    let (stop, stop_rx) = oneshot::channel();
    let task = tokio::spawn(nodelet::agent::run(cfg, rt.clone(), rx, report_tx, async {
        let _ = stop_rx.await;
    }));
    let mut a = Agent { rt, tx, report, stop, task };

    // A shared pod first: its cpuset is the pool, CPU 1 included when it
    // was admitted, but it holds no CPU of its own.
    let shared = sleeper("s", "500m");
    a.apply("static/s", shared).await;
    a.wait("s running", |r| running(r, "static/s")).await;
    a.apply("static/a", pod("a", 1)).await;
    let r = a.wait("a running", |r| running(r, "static/a")).await;
    let held = placed(&r, "static/a").0;
    assert_eq!(held, CpuSet::single(1).expect("cpus"), "the first free CPU after the reserved one");

    set_online(&root, 1, false, "0,2-3");
    let r = a.wait("CPU 1 reported offline", |r| r.offline_cpus == CpuSet::single(1).expect("cpus")).await;
    let st = &r.pods["static/a"];
    assert_eq!(st.phase, PodPhase::Running, "the pod keeps running: {st:?}");
    assert!(st.message.as_deref().is_some_and(|m| m.contains("offline")), "the pod's status says so: {st:?}");
    let s = &r.pods["static/s"];
    assert!(s.message.as_deref().is_none_or(|m| !m.contains("offline")), "a shared pod holds no CPU: {s:?}");
    a.tx.send(DesiredChange::Remove { key: "static/s".into() }).await.unwrap();

    // Once its pod is gone CPU 1 is free but offline: a pod asking for three
    // CPUs does not get it; one asking for two gets the online ones.
    a.tx.send(DesiredChange::Remove { key: "static/a".into() }).await.unwrap();
    a.wait("a gone", |r| !r.pods.contains_key("static/a") && r.allocations.pods.is_empty()).await;
    a.apply("static/big", pod("big", 3)).await;
    let r = a.wait("big refused", |r| r.pods.get("static/big").is_some_and(|p| p.reason.is_some())).await;
    assert_eq!(r.pods["static/big"].phase, PodPhase::Pending, "{:?}", r.pods["static/big"]);
    a.apply("static/two", pod("two", 2)).await;
    let r = a.wait("two running", |r| running(r, "static/two")).await;
    assert_eq!(placed(&r, "static/two").0, CpuSet::range(2, 3).expect("cpus"));
    a.tx.send(DesiredChange::Remove { key: "static/two".into() }).await.unwrap();

    // Back online: usable again, and the refused pod is tried again.
    set_online(&root, 1, true, "0-3");
    let r = a.wait("big running on CPUs 1-3", |r| running(r, "static/big")).await;
    assert!(r.offline_cpus.is_empty(), "{:?}", r.offline_cpus);
    assert_eq!(placed(&r, "static/big").0, CpuSet::range(1, 3).expect("cpus"));
    a.shutdown().await;
}

/// Each pod's container id and the process it runs, as the runtime holds them.
fn processes(rt: &HollowRuntime) -> std::collections::BTreeMap<String, (String, nodelet::runtime::ContainerState)> {
    rt.all().into_iter().map(|(id, c)| (c.config.pod.clone(), (id, c.state))).collect()
}

fn misfit(r: &NodeReport, key: &str) -> Option<String> {
    let st = r.pods.get(key)?;
    (st.reason.as_deref() == Some(SETTINGS_MISFIT)).then(|| st.message.clone().unwrap_or_default())
}

fn reserved(list: &str) -> NodeSettings {
    NodeSettings { reserved_cpus: CpuSet::parse_list(list).expect("cpus"), ..Default::default() }
}

/// Issue 13 (kubernetes#79603): the agent restarts over its data dir with
/// more reserved CPUs, one of them held by a running pod. It starts; the pod
/// that still fits keeps its container and CPUs; the other is reported with
/// the reason and, by default, left running. Restarted again with
/// `--on-settings-change restart`, that pod is stopped and admitted again on
/// CPUs the settings allow; and when no CPU is left for it at all, the
/// engine's rejection is reported (the scheduler gets it back).
#[tokio::test]
async fn a_restart_with_more_reserved_cpus_reports_the_pod_holding_one_and_restarts_it_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_by_ten();
    let mut a = start(dir.path(), t.clone(), reserved("0"));
    a.apply("static/a", pod("a", 3)).await;
    a.wait("a running", |r| running(r, "static/a")).await;
    a.apply("static/b", pod("b", 3)).await;
    let before = a.wait("b running", |r| running(r, "static/b")).await;
    assert_eq!(placed(&before, "static/a").0, CpuSet::range(1, 3).unwrap());
    let procs = processes(&a.rt);
    drop(a.shutdown().await);

    // CPU 1 is reserved now; the default is to keep the pod running.
    let mut a = start(dir.path(), t.clone(), reserved("0-1"));
    let r = a.wait("a reported", |r| misfit(r, "static/a").is_some() && running(r, "static/b")).await;
    let said = misfit(&r, "static/a").unwrap();
    assert!(said.starts_with("ReservedCpus: container main holds CPUs 1, which are reserved now"), "{said}");
    assert!(said.contains("keeps running"), "{said}");
    assert!(running(&r, "static/a"), "kept running: {:?}", r.pods["static/a"]);
    assert_eq!(misfit(&r, "static/b"), None, "b fits: {:?}", r.pods["static/b"]);
    assert_eq!(r.allocations.pods, before.allocations.pods, "nothing re-allocated");
    assert_eq!(processes(&a.rt), procs, "the same containers, the same processes");
    let cp = nodelet::checkpoint::Checkpoint::load(dir.path()).unwrap();
    assert_eq!(cp.settings, Some(reserved("0-1")), "the checkpoint records the settings it was made under");
    drop(a.shutdown().await);

    // The same settings, now restarting misfits: a moves, b stays.
    let mut a = start_with(dir.path(), t.clone(), reserved("0-1"), OnSettingsChange::Restart);
    let r = a.wait("a admitted again", |r| running(r, "static/a") && misfit(r, "static/a").is_none()).await;
    let (moved, _) = placed(&r, "static/a");
    assert_eq!(moved.len(), 3);
    assert!(moved.is_disjoint(&CpuSet::range(0, 1).unwrap()), "a on CPUs the settings allow: {moved}");
    assert_eq!(placed(&r, "static/b"), placed(&before, "static/b"), "b kept its CPUs");
    let now = processes(&a.rt);
    assert_eq!(now["static/b"], procs["static/b"], "b's container untouched");
    assert_ne!(now["static/a"].1, procs["static/a"].1, "a runs a new process");
    assert_eq!(a.rt.get(&now["static/a"].0).unwrap().cpus, moved, "the new container has the new CPUs");
    drop(a.shutdown().await);

    // Every CPU reserved: a cannot be placed anywhere here; the engine says so.
    let all = format!("0-{}", t.cpus.len() - 1);
    let mut a = start_with(dir.path(), t, reserved(&all), OnSettingsChange::Restart);
    let r = a.wait("a and b refused", |r| r.rejections.len() == 2).await;
    for key in ["static/a", "static/b"] {
        assert_eq!(r.pods[key].phase, PodPhase::Pending, "{key}: {:?}", r.pods[key]);
        assert_eq!(r.rejections[key].reason, specs::RejectReason::InsufficientCpu, "{key}: {:?}", r.rejections[key]);
    }
    assert!(r.allocations.pods.is_empty(), "{:?}", r.allocations);
    let rt = a.shutdown().await;
    assert!(rt.list().unwrap().is_empty(), "their containers are gone: {:?}", rt.list());
}

/// A new `single-numa-node` policy: the pod spread over both NUMA nodes is
/// reported, then (restart) placed on one node; the aligned one stays.
#[tokio::test]
async fn a_restart_under_single_numa_node_moves_only_the_pod_spanning_two_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_by_ten();
    let mut a = start(dir.path(), t.clone(), reserved("0"));
    a.apply("static/a", pod("a", 8)).await;
    a.wait("a running", |r| running(r, "static/a")).await;
    a.apply("static/b", pod("b", 4)).await;
    let before = a.wait("b running", |r| running(r, "static/b")).await;
    assert_eq!(nodes_of(&t, &placed(&before, "static/b").0).len(), 2, "b spans both nodes: {before:?}");
    let procs = processes(&a.rt);
    drop(a.shutdown().await);

    let single = NodeSettings { topology_policy: TopologyPolicy::SingleNumaNode, ..reserved("0") };
    let mut a = start(dir.path(), t.clone(), single.clone());
    let r = a.wait("b reported", |r| misfit(r, "static/b").is_some()).await;
    let said = misfit(&r, "static/b").unwrap();
    assert!(said.starts_with("TopologyAffinity: container main spans NUMA nodes 0-1"), "{said}");
    assert_eq!(misfit(&r, "static/a"), None);
    assert_eq!(processes(&a.rt), procs, "keep: nothing restarted");
    drop(a.shutdown().await);

    let mut a = start_with(dir.path(), t.clone(), single, OnSettingsChange::Restart);
    let r = a.wait("b on one node", |r| running(r, "static/b") && misfit(r, "static/b").is_none()).await;
    assert_eq!(nodes_of(&t, &placed(&r, "static/b").0).len(), 1, "{:?}", r.pods["static/b"]);
    assert_eq!(placed(&r, "static/a"), placed(&before, "static/a"));
    assert_eq!(processes(&a.rt)["static/a"], procs["static/a"], "a untouched");
    a.shutdown().await;
}
