//! The pending queue against a real server (127.0.0.1:0, real TLS, real sled)
//! with tokio's clock stopped: a task spins on `yield_now`, so the runtime is
//! never idle and the clock moves only by `tokio::time::advance`. Whatever
//! happens without an `advance` happened without any timer firing; whatever
//! a timer should do happens at the `advance` that reaches it, not before.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::server::ServerOptions;
use orchestrator::testing::server::TestServer;
use orchestrator::tls::Credentials;
use pinion_wire::{Client, ClientError, PodWatch};
use specs::api::{Node, NodeSpec, NodeStatus};
use specs::pod::ObjectMeta;
use specs::topology::{Cpu, NumaNode};
use specs::{Allocations, NodeTopology, Pod, PodPhase};
use tokio::task::JoinHandle;

/// What these tests ask of the server beyond `TestServer`'s own calls.
trait Queue {
    /// A node of one NUMA node with `cpus` CPUs, joined and registered.
    async fn node(&self, dir: &Path, name: &str, cpus: u32) -> Client;
    /// Registers a joined node (again, after a restart: the server's port moved).
    async fn register(&self, creds: Credentials, name: &str, cpus: u32) -> Client;
    async fn create(&self, name: &str, meta: &str, spec: &str) -> Pod;
    /// Every pod change from now on (a list, then a watch from its version).
    async fn watch_from_now(&self) -> PodWatch;
    async fn reason(&self, name: &str) -> Option<String>;
    async fn event_reasons(&self, name: &str) -> Vec<String>;
}

impl Queue for TestServer {
    async fn node(&self, dir: &Path, name: &str, cpus: u32) -> Client {
        let creds = self.join(dir, name).await;
        self.register(creds, name, cpus).await
    }

    async fn register(&self, mut creds: Credentials, name: &str, cpus: u32) -> Client {
        creds.servers = vec![self.url.clone()];
        let n = Client::new(&creds).expect("node client");
        let mut t = NodeTopology::default();
        for id in 0..cpus {
            t.cpus.push(Cpu { id, core: id, socket: 0, die: None, numa: Some(0), uncore_cache: None });
        }
        t.numa_nodes.push(NumaNode {
            kind: Default::default(),
            id: 0,
            cpus: specs::CpuSet::from_ids(0..cpus).expect("ids within MAX_ID"),
            memory_bytes: 64 << 30,
            distances: vec![10],
            hugepages: Vec::new(),
        });
        let node = Node {
            api_version: "pinion.io/v1".into(),
            kind: "Node".into(),
            metadata: ObjectMeta { name: name.into(), ..Default::default() },
            spec: NodeSpec { topology: t, settings: Default::default(), ..Default::default() },
            status: NodeStatus::default(),
        };
        let body = Bytes::from(serde_json::to_vec(&node).expect("encode"));
        n.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await.expect("register");
        n
    }

    async fn create(&self, name: &str, meta: &str, spec: &str) -> Pod {
        let (code, pod) = self.admin.create_pod(one_cpu(name, meta, spec)).await.expect("create");
        assert_eq!(code, 201, "{pod:?}");
        pod
    }

    async fn watch_from_now(&self) -> PodWatch {
        let from = self.admin.list_pods(None).await.expect("list").resource_version;
        self.admin.watch_pods(None, None, Some(from)).await.expect("watch")
    }

    async fn reason(&self, name: &str) -> Option<String> {
        self.admin.get_pod(name).await.expect("get").status.and_then(|s| s.reason)
    }

    async fn event_reasons(&self, name: &str) -> Vec<String> {
        self.admin.events("Pod", name).await.expect("events").items.into_iter().map(|e| e.reason).collect()
    }
}

/// A Guaranteed pod of one exclusive CPU.
fn one_cpu(name: &str, meta: &str, spec: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata:\n  name: {name}\n{meta}spec:\n{spec}  restartPolicy: Never\n  containers:\n  - name: main\n    image: busybox:latest\n    resources: {{requests: {{cpu: \"1\", memory: 64Mi}}, limits: {{cpu: \"1\", memory: 64Mi}}}}\n"
    ))
}

/// Waits for `f` on wall time only: the stopped clock cannot end the wait, so
/// a step that needed a timer fails here instead of passing late.
async fn unaided<T>(what: &str, f: impl Future<Output = T>) -> T {
    // A detached thread, not `spawn_blocking`: the runtime would wait for it on drop.
    let (tx, wall) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        let _ = tx.send(());
    });
    tokio::select! {
        v = f => v,
        _ = wall => panic!("{what}: did not happen without the clock moving"),
    }
}

/// The next pod the watch shows bound to a node.
async fn next_bound(w: &mut PodWatch) -> Pod {
    loop {
        match w.next().await.expect("watch") {
            Some((_, p))
                if p.spec.node_name.is_some() && p.status.as_ref().map(|s| s.phase) == Some(PodPhase::Scheduled) =>
            {
                return p
            }
            Some(_) => {}
            None => panic!("the watch ended"),
        }
    }
}

/// Waits (without the clock) until the pod's status reason is `reason`.
async fn until_reason(s: &TestServer, name: &str, reason: &str) {
    unaided(&format!("{name} becomes {reason}"), async {
        while s.reason(name).await.as_deref() != Some(reason) {
            tokio::task::yield_now().await;
        }
    })
    .await
}

/// A node's status report: it holds `running` (their planned placements) and
/// reports `phases`.
async fn report(node: &Client, name: &str, epoch: &mut u64, running: &[&Pod], phases: &[(&str, &str)]) {
    let mut allocations = Allocations::default();
    for p in running {
        let plan = p.status.as_ref().and_then(|s| s.plan.clone()).expect("a bound pod has a plan");
        allocations.pods.insert(p.metadata.name.clone(), plan.placement);
    }
    *epoch += 1;
    allocations.epoch = *epoch;
    let pods: BTreeMap<&str, serde_json::Value> =
        phases.iter().map(|(n, phase)| (*n, serde_json::json!({ "phase": phase }))).collect();
    let body = serde_json::json!({"nodeName": name, "allocations": allocations, "pods": pods});
    let body = Bytes::from(serde_json::to_vec(&body).expect("encode"));
    node.call::<NodeStatus>(Method::PUT, &format!("/api/v1/nodes/{name}/status"), Some(("application/json", body)))
        .await
        .expect("report");
}

/// Keeps a runtime thread busy, so that the paused clock never jumps ahead
/// while a test waits; stops with the test.
struct Spinner(JoinHandle<()>);

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Backoff and heartbeat grace are an hour: with the clock stopped, a pod
/// that needed either would never move.
async fn server(dir: &Path, configure: impl FnOnce(&mut ServerOptions)) -> (TestServer, Spinner) {
    let spinner = Spinner(tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    }));
    let s = TestServer::start(dir, |o| {
        o.controller.heartbeat_grace = Duration::from_secs(3600);
        o.controller.backoff_base = Duration::from_secs(3600);
        configure(o);
    })
    .await;
    (s, spinner)
}

#[tokio::test(start_paused = true)]
async fn a_queue_drains_in_submission_order_each_pod_bound_on_the_previous_ones_completion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let node = s.node(dir.path(), "one", 1).await;
    let start = tokio::time::Instant::now();
    let mut w = s.watch_from_now().await;
    // Submission order is not name order.
    let order = ["job-3", "job-1", "job-4", "job-0", "job-2"];
    for name in order {
        s.create(name, "", "").await;
    }
    let mut epoch = 0;
    for (i, name) in order.iter().enumerate() {
        let bound = unaided(&format!("{name} bound"), next_bound(&mut w)).await;
        assert_eq!(&bound.metadata.name, name, "bound out of submission order");
        for waiting in &order[i + 1..] {
            until_reason(&s, waiting, "Unschedulable").await;
        }
        // It runs, then finishes: the report that frees its CPU is the event
        // that binds the next one.
        report(&node, "one", &mut epoch, &[&bound], &[(name, "Running")]).await;
        report(&node, "one", &mut epoch, &[], &[(name, "Succeeded")]).await;
    }
    for name in order {
        let reasons = s.event_reasons(name).await;
        assert_eq!(reasons.iter().filter(|r| *r == "Scheduled").count(), 1, "{name}: {reasons:?}");
    }
    assert_eq!(tokio::time::Instant::now(), start, "no timer could have fired");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unconfirmed_binding_expires_its_capacity_returns_and_the_pod_is_requeued() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |o| o.controller.binding_timeout = Duration::from_secs(30)).await;
    let node = s.node(dir.path(), "one", 1).await;
    let mut w = s.watch_from_now().await;
    s.create("lost", "", "").await;
    s.create("next", "", "").await;
    let bound = unaided("lost bound", next_bound(&mut w)).await;
    assert_eq!(bound.metadata.name, "lost");
    until_reason(&s, "next", "Unschedulable").await;

    // The node reports, but never the binding: at 29 s it still holds the CPU.
    let mut epoch = 0;
    report(&node, "one", &mut epoch, &[], &[]).await;
    tokio::time::advance(Duration::from_secs(29)).await;
    report(&node, "one", &mut epoch, &[], &[]).await;
    assert_eq!(s.reason("lost").await.as_deref(), Some("Scheduled"));
    assert_eq!(s.reason("next").await.as_deref(), Some("Unschedulable"));

    // At 30 s it expires: requeued with the reason, and (first in the queue)
    // bound again on the capacity it gave back.
    tokio::time::advance(Duration::from_secs(1)).await;
    let again = unaided("lost bound again", next_bound(&mut w)).await;
    assert_eq!(again.metadata.name, "lost");
    let reasons = s.event_reasons("lost").await;
    assert_eq!(reasons, ["Scheduled", "BindingExpired", "Scheduled"], "{reasons:?}");
    assert_eq!(s.reason("next").await.as_deref(), Some("Unschedulable"));

    // Confirmed this time (running): it no longer expires.
    report(&node, "one", &mut epoch, &[&again], &[("lost", "Running")]).await;
    tokio::time::advance(Duration::from_secs(60)).await;
    report(&node, "one", &mut epoch, &[&again], &[("lost", "Running")]).await;
    assert_eq!(s.event_reasons("lost").await.len(), 3);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn finished_pods_stay_queryable_until_their_ttl_then_go_with_their_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |o| {
        o.controller.finished_pod_ttl = Some(Duration::from_secs(120));
        o.controller.acct_retention = Some(Duration::from_secs(1));
    })
    .await;
    let node = s.node(dir.path(), "two", 2).await;
    let mut w = s.watch_from_now().await;
    s.create("own", "", "  ttlSecondsAfterFinished: 60\n").await;
    s.create("default", "", "").await;
    let a = unaided("bound", next_bound(&mut w)).await;
    let b = unaided("bound", next_bound(&mut w)).await;
    let mut epoch = 0;
    report(&node, "two", &mut epoch, &[&a, &b], &[("own", "Running"), ("default", "Running")]).await;
    report(&node, "two", &mut epoch, &[], &[("own", "Succeeded"), ("default", "Failed")]).await;

    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(s.admin.get_pod("own").await.expect("kept").status.map(|s| s.phase), Some(PodPhase::Succeeded));
    assert!(s.event_reasons("own").await.contains(&"Scheduled".to_string()));
    tokio::time::advance(Duration::from_secs(1)).await;
    unaided("own removed at 60 s", async {
        while s.admin.get_pod("own").await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(s.event_reasons("own").await.is_empty(), "its events went with it");
    assert_eq!(s.admin.get_pod("default").await.expect("kept").status.map(|s| s.phase), Some(PodPhase::Failed));

    tokio::time::advance(Duration::from_secs(60)).await;
    unaided("default removed at the server's 120 s", async {
        while s.admin.get_pod("default").await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Their accounting records outlive them, each written as its pod ended;
    // a user sees none of another's (`pinion acct`).
    let mut records = s.admin.list_acct().await.expect("acct").items;
    records.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    let seen: Vec<(&str, specs::acct::State, &str)> =
        records.iter().map(|r| (r.job_id.as_str(), r.state, r.user.as_str())).collect();
    use specs::acct::State::{Completed, Failed};
    assert_eq!(seen, [("default", Failed, "admin"), ("own", Completed, "admin")]);
    assert!(records.iter().all(|r| r.start.is_some() && r.nodes == ["two"]), "{records:?}");
    let alice = s.person("alice", specs::api::Role::User).await;
    assert!(alice.list_acct().await.expect("her acct").items.is_empty());
    // Past their retention (a second, on the wall clock records keep), the
    // controller's hourly pass prunes them.
    std::thread::sleep(Duration::from_millis(2100));
    tokio::time::advance(Duration::from_secs(3600)).await;
    unaided("the records pruned", async {
        while !s.admin.list_acct().await.expect("acct").items.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn creating_a_pod_again_repeats_replaces_a_finished_one_or_conflicts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let node = s.node(dir.path(), "one", 1).await;
    let mut w = s.watch_from_now().await;
    let first = s.create("hello", "", "").await;
    let bound = unaided("bound", next_bound(&mut w)).await;
    assert_eq!(bound.spec.node_name.as_deref(), Some("one"));

    // The same manifest again: the scheduler's nodeName is not a difference.
    let (code, same) = s.admin.create_pod(one_cpu("hello", "", "")).await.expect("repeat");
    assert_eq!((code, &same.metadata.uid), (200, &first.metadata.uid));
    // A different spec while it is unfinished: conflict.
    let changed = s.admin.create_pod(one_cpu("hello", "", "  init: true\n")).await;
    assert!(matches!(changed, Err(ClientError::Api(ref e)) if e.code == 409), "{changed:?}");

    // Finished: the create replaces it, new uid, old events gone.
    let mut epoch = 0;
    report(&node, "one", &mut epoch, &[], &[("hello", "Succeeded")]).await;
    let (code, new) = s.admin.create_pod(one_cpu("hello", "", "  init: true\n")).await.expect("replace");
    assert_eq!(code, 201);
    assert_ne!(new.metadata.uid, first.metadata.uid);
    assert_eq!(new.status.map(|s| s.phase), Some(PodPhase::Pending));
    let again = unaided("the new pod bound", next_bound(&mut w)).await;
    assert_eq!(again.metadata.uid, new.metadata.uid);
    assert_eq!(s.event_reasons("hello").await, ["Scheduled"], "only the new pod's events");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_array_binds_at_most_its_parallelism_in_task_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let mut w = s.watch_from_now().await;
    // Submitted last task first, before any node (a cluster still starting);
    // a pod outside the array after them.
    for task in (0..5).rev() {
        let meta = format!(
            "  labels: {{pinion.io/array: sweep}}\n  annotations: {{pinion.io/array-task: \"{task}\", pinion.io/array-parallelism: \"2\"}}\n"
        );
        s.create(&format!("sweep-{task}"), &meta, "").await;
    }
    s.create("other", "", "").await;
    let node = s.node(dir.path(), "four", 4).await;
    let mut bound = Vec::new();
    for _ in 0..3 {
        bound.push(unaided("bound", next_bound(&mut w)).await);
    }
    let names: Vec<&str> = bound.iter().map(|p| p.metadata.name.as_str()).collect();
    assert_eq!(names, ["sweep-0", "sweep-1", "other"], "two tasks by index, then the next pod in line");
    for task in 2..5 {
        until_reason(&s, &format!("sweep-{task}"), "ArrayThrottled").await;
    }
    let mut epoch = 0;
    for (done, next) in [("sweep-1", "sweep-2"), ("sweep-0", "sweep-3"), ("sweep-2", "sweep-4")] {
        report(&node, "four", &mut epoch, &[], &[(done, "Succeeded")]).await;
        let p = unaided(&format!("{next} bound"), next_bound(&mut w)).await;
        assert_eq!(p.metadata.name, next);
    }
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_an_unconfirmed_binding_still_holds_its_capacity_until_it_expires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let creds = s.join(dir.path(), "one").await;
    s.register(creds.clone(), "one", 1).await;
    let mut w = s.watch_from_now().await;
    for name in ["c", "a", "b"] {
        s.create(name, "", "").await;
        // Creation timestamps have millisecond resolution; the reloaded queue
        // orders by them.
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(unaided("c bound", next_bound(&mut w)).await.metadata.name, "c");
    drop(w);
    s.stop().await;

    let (s, _spinner) = server(dir.path(), |o| o.controller.binding_timeout = Duration::from_secs(30)).await;
    let mut w = s.watch_from_now().await;
    // The node's truth is empty, but the binding of c is still in flight.
    let node = s.register(creds, "one", 1).await;
    let mut epoch = 0;
    report(&node, "one", &mut epoch, &[], &[]).await;
    assert_eq!(s.reason("a").await.as_deref(), Some("Unschedulable"));
    tokio::time::advance(Duration::from_secs(30)).await;
    // c expires and goes back in line, behind nothing: it was first.
    let again = unaided("c bound again", next_bound(&mut w)).await;
    assert_eq!(again.metadata.name, "c");
    assert!(s.event_reasons("c").await.contains(&"BindingExpired".to_string()));
    report(&node, "one", &mut epoch, &[], &[("c", "Succeeded")]).await;
    assert_eq!(unaided("a bound", next_bound(&mut w)).await.metadata.name, "a");
    report(&node, "one", &mut epoch, &[], &[("a", "Succeeded")]).await;
    assert_eq!(unaided("b bound", next_bound(&mut w)).await.metadata.name, "b");
    s.stop().await;
}

/// Issue 12 (a CPU going offline under the agent): CPUs a node reports
/// offline are not the scheduler's to place on; once they are reported back,
/// the pod waiting for them is bound (the report is the event, no timer).
#[tokio::test(start_paused = true)]
async fn cpus_a_node_reports_offline_are_not_scheduled_until_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let node = s.node(dir.path(), "two", 2).await;
    let status = |epoch: u64, offline: &str| {
        let body = serde_json::json!({
            "nodeName": "two",
            "allocations": {"epoch": epoch, "pods": {}},
            "pods": {},
            "offlineCpus": specs::CpuSet::parse_list(offline).expect("cpus"),
        });
        Bytes::from(serde_json::to_vec(&body).expect("encode"))
    };
    let put = |body: Bytes| {
        let node = node.clone();
        async move {
            node.call::<NodeStatus>(Method::PUT, "/api/v1/nodes/two/status", Some(("application/json", body)))
                .await
                .expect("report")
        }
    };
    let (_, shown) = put(status(1, "0-1")).await;
    assert_eq!(
        shown.offline_cpus,
        specs::CpuSet::range(0, 1).expect("cpus"),
        "the node's status keeps what it reported"
    );
    assert!(shown.numa.iter().all(|z| z.free_cpus.is_empty()), "offline CPUs are not free: {:?}", shown.numa);

    let mut w = s.watch_from_now().await;
    s.create("p", "", "").await;
    until_reason(&s, "p", "Unschedulable").await;

    // Same allocations: the CPUs coming back is the event on its own.
    put(status(1, "")).await;
    let bound = unaided("p bound once the CPUs are back", next_bound(&mut w)).await;
    assert_eq!(bound.spec.node_name.as_deref(), Some("two"));
    s.stop().await;
}

/// A job of `n` one-CPU members, YAML.
fn job(name: &str, n: u32, extra: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  parallelism: {n}\n{extra}  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox:latest\n        resources: {{requests: {{cpu: \"1\", memory: 64Mi}}, limits: {{cpu: \"1\", memory: 64Mi}}}}\n"
    ))
}

fn env_of(p: &Pod, key: &str) -> Option<String> {
    p.spec.containers[0].env.iter().find(|e| e.name == key).map(|e| e.value.clone())
}

async fn api_code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api(e)) => (e.code, format!("{} {:?}", e.message, e.details)),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_and_its_members_are_made_bound_and_deleted_together_and_one_that_could_never_fit_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let _node = s.node(dir.path(), "one", 4).await;
    let mut w = s.watch_from_now().await;

    let (code, why) = api_code(s.admin.create_job(job("big", 5, "")).await).await;
    assert_eq!(code, 422, "{why}");
    assert!(why.contains("can never run") && why.contains("4 fit"), "{why}");
    assert_eq!(api_code(s.admin.get_pod("big-0").await).await.0, 404, "nothing of a refused job is stored");
    let (code, why) = api_code(s.admin.create_job(job("zero", 0, "")).await).await;
    assert!(code == 422 && why.contains("spec.parallelism"), "{code} {why}");

    let (code, created) = s.admin.create_job(job("pair", 2, "")).await.expect("create");
    assert_eq!(code, 201, "{created:?}");
    assert_eq!(s.admin.create_job(job("pair", 2, "")).await.expect("again").0, 200, "the same job again");
    assert_eq!(api_code(s.admin.create_job(job("pair", 3, "")).await).await.0, 409, "a different job of that name");

    let mut bound = Vec::new();
    for _ in 0..2 {
        bound.push(unaided("a member bound", next_bound(&mut w)).await);
    }
    bound.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for (rank, p) in bound.iter().enumerate() {
        assert_eq!(p.metadata.name, format!("pair-{rank}"));
        assert_eq!(p.spec.node_name.as_deref(), Some("one"));
        assert_eq!(env_of(p, "PINION_JOB").as_deref(), Some("pair"));
        assert_eq!(env_of(p, "PINION_RANK"), Some(rank.to_string()));
        assert_eq!(env_of(p, "PINION_WORLD_SIZE").as_deref(), Some("2"));
        assert_eq!(env_of(p, "PINION_LOCAL_RANK"), Some(rank.to_string()), "both on one node");
        assert_eq!(env_of(p, "PINION_NODES").as_deref(), Some("one,one"));
    }
    let phase = s.admin.get_job("pair").await.expect("job").status.map(|st| st.phase);
    assert_eq!(phase, Some(specs::job::JobPhase::Running));

    s.admin.delete_job("pair").await.expect("delete");
    assert_eq!(api_code(s.admin.get_job("pair").await).await.0, 404);
    for m in ["pair-0", "pair-1"] {
        assert_eq!(api_code(s.admin.get_pod(m).await).await.0, 404, "{m} deleted with its job");
    }
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn gangs_wait_whole_a_higher_priority_goes_first_and_nothing_passes_a_waiting_gang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let node = s.node(dir.path(), "one", 2).await;
    let mut w = s.watch_from_now().await;
    s.admin.create_job(job("a", 2, "")).await.expect("a");
    let a = [unaided("a bound", next_bound(&mut w)).await, unaided("a bound", next_bound(&mut w)).await];
    s.admin.create_job(job("b", 2, "")).await.expect("b");
    until_reason(&s, "b-0", "Unschedulable").await;
    until_reason(&s, "b-1", "Unschedulable").await;
    // One CPU would be enough for it, but it came after a waiting gang.
    s.create("p", "", "").await;
    until_reason(&s, "p", "Queued").await;
    s.admin.create_job(job("c", 2, "  priority: 5\n")).await.expect("c");
    until_reason(&s, "c-0", "Unschedulable").await;

    let mut epoch = 0;
    report(&node, "one", &mut epoch, &[&a[0], &a[1]], &[("a-0", "Running"), ("a-1", "Running")]).await;
    report(&node, "one", &mut epoch, &[], &[("a-0", "Succeeded"), ("a-1", "Succeeded")]).await;
    let next: Vec<String> = vec![
        unaided("c bound", next_bound(&mut w)).await.metadata.name,
        unaided("c bound", next_bound(&mut w)).await.metadata.name,
    ];
    assert!(next.iter().all(|n| n.starts_with("c-")), "the higher priority first: {next:?}");
    // b was Queued behind c while c waited; its reason is written by the pass
    // that bound c, and may land just after c's binding does.
    until_reason(&s, "b-0", "Unschedulable").await;
    assert!(s.admin.get_pod("b-0").await.expect("b-0").spec.node_name.is_none(), "b holds nothing");
    unaided("a succeeded", async {
        while s.admin.get_job("a").await.expect("a").status.map(|st| st.phase) != Some(specs::job::JobPhase::Succeeded)
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn one_member_failing_stops_the_others_and_the_job_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let node = s.node(dir.path(), "one", 2).await;
    let mut w = s.watch_from_now().await;
    s.admin.create_job(job("solver", 2, "")).await.expect("create");
    let m = [unaided("bound", next_bound(&mut w)).await, unaided("bound", next_bound(&mut w)).await];
    let mut epoch = 0;
    report(&node, "one", &mut epoch, &[&m[0], &m[1]], &[("solver-0", "Running"), ("solver-1", "Running")]).await;
    report(&node, "one", &mut epoch, &[&m[0]], &[("solver-1", "Failed")]).await;
    let status = unaided("the job fails", async {
        loop {
            let st = s.admin.get_job("solver").await.expect("job").status.unwrap_or_default();
            if st.phase == specs::job::JobPhase::Failed {
                return st;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let first = status.first_failure.unwrap_or_default();
    assert!(first.contains("rank 1 (solver-1) on one failed"), "{first}");
    unaided("rank 0 stopped", async {
        while s.admin.get_pod("solver-0").await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_gang_with_a_retry_left_starts_again_whole_as_its_next_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let node = s.node(dir.path(), "one", 2).await;
    let mut w = s.watch_from_now().await;
    s.admin.create_job(job("again", 2, "  backoffLimit: 1\n")).await.expect("create");
    let first = [unaided("bound", next_bound(&mut w)).await, unaided("bound", next_bound(&mut w)).await];
    let mut epoch = 0;
    report(&node, "one", &mut epoch, &[&first[0], &first[1]], &[("again-0", "Running"), ("again-1", "Running")]).await;
    // Rank 0 fails; its peer is still running on the node.
    report(&node, "one", &mut epoch, &[&first[1]], &[("again-0", "Failed")]).await;
    // The old members go and new ones (attempt 1) are made; once the node
    // reports the old rank 1 gone too, the new gang is bound whole.
    unaided("attempt 1 made", async {
        loop {
            if let Ok(p) = s.admin.get_pod("again-1").await {
                if p.metadata.uid != first[1].metadata.uid {
                    assert_eq!(
                        p.metadata.annotations.get(specs::job::ATTEMPT_ANNOTATION).map(String::as_str),
                        Some("1")
                    );
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    report(&node, "one", &mut epoch, &[], &[]).await;
    let second = [unaided("bound again", next_bound(&mut w)).await, unaided("bound again", next_bound(&mut w)).await];
    for p in &second {
        assert!(first.iter().all(|f| f.metadata.uid != p.metadata.uid), "a new incarnation: {p:?}");
    }
    let st = s.admin.get_job("again").await.expect("job").status.expect("status");
    assert_eq!((st.attempt, st.phase), (1, specs::job::JobPhase::Running));
    assert!(st.first_failure.unwrap_or_default().contains("attempt 0: rank 0"));
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn backfill_lets_a_job_ahead_of_a_waiting_gang_only_if_it_ends_by_the_gangs_reservation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _spinner) = server(dir.path(), |_| {}).await;
    let _node = s.node(dir.path(), "one", 4).await;
    let mut w = s.watch_from_now().await;
    // a holds 2 of the 4 CPUs for at most 600 s: the gang b of 4 waits for it.
    s.admin.create_job(job("a", 2, "  activeDeadlineSeconds: 600\n")).await.expect("a");
    unaided("a bound", next_bound(&mut w)).await;
    unaided("a bound", next_bound(&mut w)).await;
    unaided("a running", async {
        while s.admin.get_job("a").await.expect("a").status.map(|st| st.phase) != Some(specs::job::JobPhase::Running) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    s.admin.create_job(job("b", 4, "")).await.expect("b");
    until_reason(&s, "b-0", "Unschedulable").await;
    // Would end after b's reservation (600 s), or has no limit: they wait.
    s.admin.create_job(job("long", 1, "  activeDeadlineSeconds: 1200\n")).await.expect("long");
    until_reason(&s, "long-0", "Queued").await;
    s.create("p", "", "").await;
    until_reason(&s, "p", "Queued").await;
    // Ends by then: it goes ahead, on a CPU b could not use before a ends.
    s.admin.create_job(job("short", 1, "  activeDeadlineSeconds: 60\n")).await.expect("short");
    let bound = unaided("short bound", next_bound(&mut w)).await;
    assert_eq!(bound.metadata.name, "short-0");
    assert_eq!(s.reason("long-0").await.as_deref(), Some("Queued"), "long still waits");
    assert!(s.admin.get_pod("b-0").await.expect("b-0").spec.node_name.is_none(), "b holds nothing yet");
    s.stop().await;
}
