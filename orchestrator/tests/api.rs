//! In-process API tests: a real server on 127.0.0.1:0 with real TLS and a real
//! sled store in a temp dir, driven through the real client.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::testing::server::TestServer;
use pinion_wire::testing::eventually;
use pinion_wire::{Client, ClientError};
use specs::api::{Node, NodeCondition, NodeSpec, NodeStatus, WatchEventType};
use specs::pod::ObjectMeta;
use specs::topology::{Cpu, NumaNode};
use specs::{NodeTopology, Pod, PodPhase};

/// A node that joined `s` and registered `numa` NUMA nodes of `cpus` CPUs.
async fn registered_node(s: &TestServer, dir: &Path, name: &str, numa: u32, cpus: u32) -> Client {
    let n = s.node_client(dir, name).await;
    n.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", node_object(name, numa, cpus))))
        .await
        .expect("register");
    n
}

/// A server with this heartbeat grace, a fast backoff and a small body limit.
async fn server(dir: &Path, grace: Duration) -> TestServer {
    TestServer::start(dir, |o| {
        o.controller.heartbeat_grace = grace;
        o.controller.backoff_base = Duration::from_millis(50);
        o.api.body_limit = 64 * 1024;
    })
    .await
}

fn manifest(name: &str, extra_spec: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: web}}\nspec:\n{extra_spec}  containers:\n  - name: main\n    image: busybox:latest\n"
    ))
}

/// `numa` NUMA nodes of `cpus` CPUs each, one thread per core.
fn topology(numa: u32, cpus: u32) -> NodeTopology {
    let mut t = NodeTopology::default();
    for n in 0..numa {
        let ids: Vec<u32> = (n * cpus..(n + 1) * cpus).collect();
        for id in &ids {
            t.cpus.push(Cpu { id: *id, core: *id, socket: n, die: None, numa: Some(n), uncore_cache: None });
        }
        t.numa_nodes.push(NumaNode {
            kind: Default::default(),
            id: n,
            cpus: specs::CpuSet::from_ids(ids).expect("ids within MAX_ID"),
            memory_bytes: 64 << 30,
            distances: (0..numa).map(|m| if m == n { 10 } else { 20 }).collect(),
            hugepages: Vec::new(),
        });
    }
    t
}

fn node_object(name: &str, numa: u32, cpus: u32) -> Bytes {
    let node = Node {
        api_version: "pinion.io/v1".into(),
        kind: "Node".into(),
        metadata: ObjectMeta { name: name.into(), ..Default::default() },
        spec: NodeSpec { topology: topology(numa, cpus), settings: Default::default(), ..Default::default() },
        status: NodeStatus::default(),
    };
    Bytes::from(serde_json::to_vec(&node).expect("encode"))
}

fn api_code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u16 {
    match r {
        Err(ClientError::Api(e)) => e.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// How long the controller may take to bind, mark or explain.
const SOON: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_pods_survive_a_restart_with_monotonic_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let mut versions = Vec::new();
    for i in 0..10 {
        let (code, pod) = s.admin.create_pod(manifest(&format!("p{i}"), "")).await.expect("create");
        assert_eq!(code, 201);
        assert_eq!(pod.status.as_ref().map(|s| s.phase), Some(PodPhase::Pending));
        versions.push(pod.metadata.resource_version.expect("rv"));
    }
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    // Same manifest again: unchanged; a different spec under the same name: conflict.
    assert_eq!(s.admin.create_pod(manifest("p0", "")).await.expect("again").0, 200);
    assert_eq!(api_code(s.admin.create_pod(manifest("p0", "  hostNetwork: true\n")).await), 409);
    let before = s.admin.list_pods(None).await.expect("list");
    s.stop().await;

    let s = server(dir.path(), Duration::from_secs(60)).await;
    let list = s.admin.list_pods(None).await.expect("list");
    assert_eq!(list.items.len(), 10);
    assert!(list.resource_version >= *versions.last().expect("some"));
    for p in &before.items {
        let now = list.items.iter().find(|q| q.metadata.name == p.metadata.name).expect("still there");
        assert!(now.metadata.resource_version >= p.metadata.resource_version);
        assert_eq!(now.spec, p.spec);
    }
    let (_, after) = s.admin.create_pod(manifest("later", "")).await.expect("create");
    assert!(after.metadata.resource_version > Some(list.resource_version));
    assert_eq!(s.admin.delete_pod("p3").await.expect("delete").metadata.name, "p3");
    assert_eq!(api_code(s.admin.get_pod("p3").await), 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_from_a_resource_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let (_, a) = s.admin.create_pod(manifest("a", "")).await.expect("a");
    s.admin.create_pod(manifest("b", "")).await.expect("b");
    let mut w = s.admin.watch_pods(None, Some("app=web"), a.metadata.resource_version).await.expect("watch");
    // The scheduler also writes (why a pod is pending): skip MODIFIED lines.
    let (ty, pod) = loop {
        let (ty, pod) = w.next().await.expect("next").expect("some");
        if ty != WatchEventType::Modified {
            break (ty, pod);
        }
    };
    assert_eq!((ty, pod.metadata.name.as_str()), (WatchEventType::Added, "b"));
    s.admin.create_pod(manifest("c", "")).await.expect("c");
    s.admin.delete_pod("a").await.expect("delete a");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let (ty, pod) = w.next().await.expect("next").expect("some");
        if ty != WatchEventType::Modified {
            seen.push((ty, pod.metadata.name));
        }
    }
    assert_eq!(seen, [(WatchEventType::Added, "c".to_string()), (WatchEventType::Deleted, "a".to_string())]);
    // Without a version: the current pods first, as ADDED.
    let mut w = s.admin.watch_pods(None, None, None).await.expect("watch");
    let mut names = Vec::new();
    for _ in 0..2 {
        names.push(w.next().await.expect("next").expect("some").1.metadata.name);
    }
    names.sort();
    assert_eq!(names, ["b", "c"]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_are_enforced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let ca = std::fs::read_to_string(dir.path().join("pki/ca.crt")).expect("ca");
    let anon = Client::anonymous(std::slice::from_ref(&s.url), &ca).expect("anon");
    assert_eq!(api_code(anon.list_pods(None).await), 401);
    assert_eq!(api_code(anon.join("not-the-token", "edge-1", None).await), 401);

    // The URL and the token are enough: the token pins the CA.
    let token = orchestrator::tls::JoinToken::parse(&s.token).expect("token");
    let pin = token.ca_pin.expect("the printed token carries the CA pin");
    assert_eq!(pin, orchestrator::tls::ca_pin(&ca).expect("pin of ca.crt"));
    let joined = Client::pinned(std::slice::from_ref(&s.url), pin)
        .expect("pinned")
        .join(&s.token, "edge-0", None)
        .await
        .expect("pinned join");
    assert_eq!(joined.ca_cert.trim(), ca.trim());
    // The bare secret still joins (with --ca).
    anon.join(&token.secret, "edge-9", None).await.expect("a bare secret joins");
    // Another pin: the handshake fails, so the secret is never sent.
    let mut wrong = pin;
    wrong[0] ^= 1;
    match Client::pinned(std::slice::from_ref(&s.url), wrong).expect("pinned").join(&s.token, "edge-8", None).await {
        Err(pinion_wire::ClientError::Connect { source, .. }) => {
            assert!(source.to_string().contains("not the one the join token pins"), "{source}")
        }
        other => panic!("expected a refused handshake, got {:?}", other.map(|_| ())),
    }

    let n1 = s.node_client(dir.path(), "edge-1").await;
    let n2 = s.node_client(dir.path(), "edge-2").await;
    // Once a node has registered, the token cannot mint a second identity for it.
    let own = node_object("edge-1", 1, 2);
    n1.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", own))).await.expect("register");
    assert_eq!(api_code(anon.join(&s.token, "edge-1", None).await), 409);
    s.admin.create_pod(manifest("on-1", "  nodeName: edge-1\n")).await.expect("create");
    s.admin.create_pod(manifest("on-2", "  nodeName: edge-2\n")).await.expect("create");
    assert_eq!(n1.get_pod("on-1").await.expect("own pod").metadata.name, "on-1");
    assert_eq!(api_code(n1.get_pod("on-2").await), 403);
    let own = n1.list_pods(None).await.expect("own list");
    assert_eq!(own.items.iter().map(|p| p.metadata.name.as_str()).collect::<Vec<_>>(), ["on-1"]);
    assert_eq!(api_code(n1.call::<serde_json::Value>(Method::GET, "/api/v1/pods?nodeName=edge-2", None).await), 403);
    assert_eq!(api_code(n1.watch_pods(Some("edge-2"), None, None).await.map(|_| ())), 403);
    assert_eq!(api_code(n1.create_pod(manifest("sneaky", "")).await), 403);
    assert_eq!(api_code(n1.delete_pod("on-1").await), 403);
    // Nodes write only their own node.
    let body = node_object("edge-2", 1, 2);
    assert_eq!(
        api_code(n1.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body.clone()))).await),
        403
    );
    assert_eq!(
        n2.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await.expect("own").0,
        201
    );
    let status = Bytes::from_static(b"{\"phase\":\"Running\"}");
    assert_eq!(
        api_code(
            n1.call::<Pod>(Method::PUT, "/api/v1/pods/on-2/status", Some(("application/json", status.clone()))).await
        ),
        403
    );
    let (_, p) = n2
        .call::<Pod>(Method::PUT, "/api/v1/pods/on-2/status", Some(("application/json", status)))
        .await
        .expect("own status");
    assert_eq!(p.status.map(|s| s.phase), Some(PodPhase::Running));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_lists_every_problem_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let check = |body: &'static str, code: u16, fields: &'static [&'static str]| {
        let admin = s.admin.clone();
        async move {
            match admin.create_pod(Bytes::from_static(body.as_bytes())).await {
                Err(ClientError::Api(e)) => {
                    assert_eq!(e.code, code, "{body}: {e}");
                    let got: Vec<&str> = e.details.iter().map(|d| d.field.as_str()).collect();
                    assert_eq!(got, fields, "{body}: {e}");
                }
                other => panic!("{body}: expected a refusal, got {other:?}"),
            }
        }
    };
    check("{\"apiVersion\": ", 422, &["(body)"]).await;
    check(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, bogus: 1}]}\n",
        422,
        &["spec.containers[0].bogus", "spec.containers[0].image"],
    )
    .await;
    check(
        "apiVersion: pinion.io/v2\nkind: Pod\nmetadata: {name: Bad_Name}\nspec: {containers: [{name: c, rootfs: host, resources: {limits: {cpu: \"9999999\", memory: 9Ei}}}]}\n",
        422,
        &[
            "apiVersion",
            "metadata.name",
            "spec.containers[0].resources.limits.cpu",
            "spec.containers[0].resources.limits.memory",
        ],
    )
    .await;
    // Over the body limit (64 KiB in this test): 413.
    let big = Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: big, annotations: {{a: \"{}\"}}}}\nspec: {{containers: [{{name: c, rootfs: host}}]}}\n",
        "x".repeat(100_000)
    ));
    assert_eq!(api_code(s.admin.create_pod(big).await), 413);
    assert!(s.admin.list_pods(None).await.expect("list").items.is_empty());
    assert_eq!(api_code(s.admin.get_pod("UPPER").await), 400);
    assert_eq!(api_code(s.admin.call::<serde_json::Value>(Method::PATCH, "/api/v1/pods/x", None).await), 405);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplaceable_pods_stay_pending_with_a_reason_and_lost_nodes_become_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_millis(300)).await;
    let n = registered_node(&s, dir.path(), "small", 1, 2).await;
    let huge = "  topology: {policy: single-numa-node}\n";
    let body = |meta: &str| {
        format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: huge{meta}}}\nspec:\n{huge}  containers:\n  - name: c\n    rootfs: host\n    resources: {{requests: {{cpu: \"64\", memory: 1Gi}}, limits: {{cpu: \"64\", memory: 1Gi}}}}\n"
    )
    };
    // No registered node could ever run it: refused at submission, per node.
    let refused = s.admin.create_pod(Bytes::from(body(""))).await;
    let Err(ClientError::Api(e)) = refused else { panic!("expected a refusal, got {refused:?}") };
    assert_eq!(e.code, 422, "{e:?}");
    assert!(e.message.contains("no node can ever run this pod: node small: "), "{e:?}");
    assert!(s.admin.get_pod("huge").await.is_err(), "nothing stored");
    // Unless it asks to wait for nodes.
    let waiting = ", annotations: {pinion.io/wait-for-nodes: \"true\"}";
    s.admin.create_pod(Bytes::from(body(waiting))).await.expect("create");
    s.admin.create_pod(manifest("pinned", "  nodeName: small\n")).await.expect("bound pod");
    let admin = s.admin.clone();
    eventually("an Unschedulable reason", SOON, || {
        let admin = admin.clone();
        async move {
            let p = admin.get_pod("huge").await.expect("get");
            p.status.and_then(|s| s.reason).as_deref() == Some("Unschedulable")
        }
    })
    .await;
    let pod = s.admin.get_pod("huge").await.expect("get");
    let status = pod.status.expect("status");
    assert_eq!(status.phase, PodPhase::Pending);
    assert!(status.message.as_deref().unwrap_or("").contains("small"), "{status:?}");
    let events = s.admin.events("Pod", "huge").await.expect("events");
    assert!(events.items.iter().any(|e| e.reason == "FailedScheduling"), "{events:?}");

    // No heartbeats: NotReady after the grace period, its pod Unknown (not deleted).
    eventually("NotReady", SOON, || {
        let admin = admin.clone();
        async move { admin.get_node("small").await.expect("node").status.condition == NodeCondition::NotReady }
    })
    .await;
    let pinned = s.admin.get_pod("pinned").await.expect("pinned still there");
    assert_eq!(pinned.status.map(|s| s.phase), Some(PodPhase::Unknown));
    // A heartbeat brings it back.
    n.call::<serde_json::Value>(Method::POST, "/api/v1/nodes/small/heartbeat", None).await.expect("heartbeat");
    assert_eq!(s.admin.get_node("small").await.expect("node").status.condition, NodeCondition::Ready);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_reaches_the_nodes_watch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let n = registered_node(&s, dir.path(), "n1", 2, 4).await;
    let mut w = n.watch_pods(None, None, None).await.expect("watch");
    s.admin.create_pod(manifest("web", "")).await.expect("create");
    let (ty, pod) =
        tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("in time").expect("ok").expect("some");
    assert_eq!(ty, WatchEventType::Added);
    assert_eq!(pod.spec.node_name.as_deref(), Some("n1"));
    let status = pod.status.expect("status");
    assert_eq!(status.phase, PodPhase::Scheduled);
    assert!(status.plan.is_some());
    s.stop().await;
}

/// 48 creates at once, over 16 connections, for one node with 8 CPUs: at most
/// 8 pods of one exclusive CPU are bound, their planned CPUs never overlap,
/// and the rest wait Pending with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_overcommit_a_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let _n = registered_node(&s, dir.path(), "n1", 2, 4).await;
    let guaranteed =
        "  containers:\n  - name: main\n    image: busybox:latest\n    resources: {limits: {cpu: '1', memory: 64Mi}}\n";
    let mut tasks = Vec::new();
    for c in 0..16 {
        let admin = s.admin.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..3 {
                let name = format!("p{c}-{i}");
                let body =
                    format!("apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{guaranteed}");
                admin.create_pod(Bytes::from(body)).await.expect("create");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    eventually("every pod bound or pending with a reason", SOON, || {
        let admin = s.admin.clone();
        async move {
            let pods = admin.list_pods(None).await.expect("list").items;
            pods.len() == 48
                && pods.iter().all(|p| {
                    let st = p.status.clone().unwrap_or_default();
                    st.phase == PodPhase::Scheduled || (st.phase == PodPhase::Pending && st.message.is_some())
                })
        }
    })
    .await;
    let pods = s.admin.list_pods(None).await.expect("list").items;
    let bound: Vec<&Pod> = pods.iter().filter(|p| p.spec.node_name.is_some()).collect();
    assert_eq!(bound.len(), 8, "one pod per CPU");
    let mut cpus = std::collections::BTreeSet::new();
    for p in bound {
        let plan = p.status.as_ref().and_then(|s| s.plan.clone()).expect("a bound pod has a plan");
        for c in &plan.placement.containers {
            for cpu in c.cpus.iter() {
                assert!(cpus.insert(cpu), "CPU {cpu} planned twice");
            }
        }
    }
    assert_eq!(cpus.len(), 8);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_update_pods_and_rejections_requeue_with_an_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let n = registered_node(&s, dir.path(), "edge", 2, 4).await;
    let other = s.node_client(dir.path(), "other").await;
    s.admin.create_pod(manifest("run", "  nodeName: edge\n")).await.expect("create");
    s.admin.create_pod(manifest("refused", "  nodeName: edge\n")).await.expect("create");

    // A status report: allocations (per-NUMA free CPUs follow) and pod phases.
    let report = serde_json::json!({
        "nodeName": "edge",
        "allocations": {"epoch": 3, "pods": {"run": {"numaAffinity": [1], "containers": [
            {"name": "main", "cpuPolicy": "exclusive", "cpus": [4, 5], "mems": [1], "memory": {"1": 1048576}}
        ]}}},
        "pods": {"run": {"phase": "Running"}, "refused": {"phase": "Pending"}}
    });
    let body = Bytes::from(serde_json::to_vec(&report).expect("encode"));
    let (_, status) = n
        .call::<NodeStatus>(Method::PUT, "/api/v1/nodes/edge/status", Some(("application/json", body.clone())))
        .await
        .expect("report");
    let free: Vec<usize> = status.numa.iter().map(|z| z.free_cpus.len()).collect();
    assert_eq!(free, [4, 2]);
    assert_eq!(status.allocations.epoch, 3);
    assert_eq!(s.admin.get_pod("run").await.expect("run").status.map(|s| s.phase), Some(PodPhase::Running));
    assert_eq!(
        api_code(
            other.call::<NodeStatus>(Method::PUT, "/api/v1/nodes/edge/status", Some(("application/json", body))).await
        ),
        403
    );

    // The node refuses a binding: back to Pending with the reason and an event.
    let rejection =
        Bytes::from_static(b"{\"reason\":\"TopologyAffinity\",\"message\":\"no single NUMA node has 2 free CPUs\"}");
    assert_eq!(
        api_code(
            other
                .call::<Pod>(
                    Method::POST,
                    "/api/v1/pods/refused/rejection",
                    Some(("application/json", rejection.clone()))
                )
                .await
        ),
        403
    );
    let (_, pod) = n
        .call::<Pod>(Method::POST, "/api/v1/pods/refused/rejection", Some(("application/json", rejection)))
        .await
        .expect("reject");
    let st = pod.status.expect("status");
    assert_eq!((st.phase, st.reason.as_deref()), (PodPhase::Pending, Some("Rejected")));
    assert!(pod.spec.node_name.is_none());
    assert!(st.message.unwrap_or_default().contains("TopologyAffinity"));
    let events = s.admin.events("Pod", "refused").await.expect("events");
    assert!(events.items.iter().any(|e| e.reason == "Rejected"), "{events:?}");
    // No longer bound to edge: its node may not read it.
    assert_eq!(api_code(n.get_pod("refused").await), 403);

    // A pod deleted and created again under its name is another pod: a
    // report still about the first (its uid) neither ends nor starts the new one.
    let first = s.admin.get_pod("run").await.expect("run").metadata.uid.expect("uid");
    s.admin.delete_pod("run").await.expect("delete");
    s.admin.create_pod(manifest("run", "  nodeName: edge\n")).await.expect("create again");
    let stale = serde_json::json!({
        "nodeName": "edge", "allocations": {"epoch": 4, "pods": {}},
        "pods": {"run": {"phase": "Failed", "podUid": first}}
    });
    n.call::<NodeStatus>(
        Method::PUT,
        "/api/v1/nodes/edge/status",
        Some(("application/json", Bytes::from(serde_json::to_vec(&stale).expect("encode")))),
    )
    .await
    .expect("report");
    let again = s.admin.get_pod("run").await.expect("run");
    assert_ne!(again.status.as_ref().map(|s| s.phase), Some(PodPhase::Failed), "{again:?}");
    let current = serde_json::json!({
        "nodeName": "edge", "allocations": {"epoch": 5, "pods": {}},
        "pods": {"run": {"phase": "Running", "podUid": again.metadata.uid}}
    });
    n.call::<NodeStatus>(
        Method::PUT,
        "/api/v1/nodes/edge/status",
        Some(("application/json", Bytes::from(serde_json::to_vec(&current).expect("encode")))),
    )
    .await
    .expect("report");
    let status = s.admin.get_pod("run").await.expect("run").status.expect("status");
    assert_eq!((status.phase, status.pod_uid), (PodPhase::Running, None));
    s.stop().await;
}

/// A job's members are queued together: no scheduling pass sees part of a
/// gang and binds that part alone. A member bound before its gang was whole
/// has a rank's node missing from its PINION_NODES (`a,,b`). Without the
/// members queued under one lock, about 1 gang in 150 was bound in pieces
/// under `bench_api`; this creates many gangs at once so that one would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangs_are_bound_whole_never_in_pieces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    for i in 0..8 {
        registered_node(&s, dir.path(), &format!("n{i}"), 1, 8).await;
    }
    let (jobs, size) = (160usize, 16usize);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let admin = s.admin.clone();
        tasks.push(tokio::spawn(async move {
            for j in (t..jobs).step_by(8) {
                let manifest = format!(
                    "apiVersion: pinion.io/v1\nkind: Job\nmetadata: {{name: j{j}}}\nspec:\n  parallelism: {size}\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox:latest\n        resources: {{requests: {{cpu: 10m, memory: 1Mi}}}}\n"
                );
                assert_eq!(admin.create_job(Bytes::from(manifest)).await.expect("create job").0, 201);
            }
        }));
    }
    for t in tasks {
        t.await.expect("creator");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let pods = loop {
        let pods = s.admin.list_pods(None).await.expect("list").items;
        if pods.len() == jobs * size && pods.iter().all(|p| p.spec.node_name.is_some()) {
            break pods;
        }
        assert!(tokio::time::Instant::now() < deadline, "not every member bound within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for p in &pods {
        let nodes = p.spec.containers[0].env.iter().find(|e| e.name == "PINION_NODES").map(|e| e.value.clone());
        let nodes = nodes.unwrap_or_default();
        assert!(
            nodes.split(',').filter(|n| !n.is_empty()).count() == size,
            "{} was bound before its whole gang: PINION_NODES={nodes:?}",
            p.metadata.name
        );
    }
    s.stop().await;
}

/// A node follows its peers (their pod ranges and addresses) on a watch of
/// nodes without their status. A peer's status report changes only its
/// status: that watch is not sent it (with a thousand nodes, every report
/// sent to every node was a million events a rollout), while a new node, or
/// a peer registering with other labels, still arrives. The admin's watch,
/// which shows status, is sent every report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_watch_of_its_peers_is_not_sent_their_status_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), Duration::from_secs(60)).await;
    let a = registered_node(&s, dir.path(), "a", 1, 4).await;
    let b = registered_node(&s, dir.path(), "b", 1, 4).await;
    let from = s.admin.list_nodes(None).await.expect("list").resource_version;
    let mut peers = a.watch_nodes(Some(from)).await.expect("a's watch");
    let mut all = s.admin.watch_nodes(Some(from)).await.expect("the admin's watch");
    for epoch in 1..=3 {
        let report = serde_json::json!({"nodeName": "b", "allocations": {"epoch": epoch, "pods": {}}});
        let body = Bytes::from(serde_json::to_vec(&report).expect("encode"));
        b.call::<NodeStatus>(Method::PUT, "/api/v1/nodes/b/status", Some(("application/json", body)))
            .await
            .expect("report");
    }
    for epoch in 1..=3 {
        let (ty, n) = next_node(&mut all).await;
        assert_eq!((ty, n.metadata.name.as_str(), n.status.allocations.epoch), (WatchEventType::Modified, "b", epoch));
    }
    // The first line a's watch is sent is the next node, not b's reports.
    registered_node(&s, dir.path(), "c", 1, 4).await;
    let (ty, n) = next_node(&mut peers).await;
    assert_eq!((ty, n.metadata.name.as_str()), (WatchEventType::Added, "c"));
    assert_eq!(n.status, NodeStatus::default(), "no status on a node's watch");
    // A change a peer reads (its labels) is sent.
    let mut relabelled: Node = serde_json::from_slice(&node_object("b", 1, 4)).expect("decode");
    relabelled.metadata.labels.insert("zone".into(), "edge".into());
    let body = Bytes::from(serde_json::to_vec(&relabelled).expect("encode"));
    b.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await.expect("register again");
    let (ty, n) = next_node(&mut peers).await;
    assert_eq!((ty, n.metadata.name.as_str()), (WatchEventType::Modified, "b"));
    assert_eq!(n.metadata.labels.get("zone").map(String::as_str), Some("edge"));
    s.stop().await;
}

/// The next line of a nodes' watch that is not a bookmark.
async fn next_node(w: &mut pinion_wire::NodeWatch) -> (WatchEventType, Node) {
    loop {
        let (ty, n) =
            tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("in time").expect("ok").expect("some");
        if ty != WatchEventType::Bookmark {
            return (ty, n);
        }
    }
}
