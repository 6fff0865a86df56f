//! Hostile input and faults at the API (issue 12): a node's registration is
//! bounded like a pod's, a node name is minted once, a watch from a version the
//! store has not reached is refused, the API's limits are the engine's, and one
//! unreadable record on disk neither stops the server nor fails a list.
//! A real server on 127.0.0.1:0 with a real sled store in a temp dir.

use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::testing::server::TestServer;
use orchestrator::tls::Credentials;
use pinion_wire::testing::eventually;
use pinion_wire::{Client, ClientError};
use serde_json::{json, Value};
use specs::api::Node;

/// A node of `numa_ids.len()` NUMA nodes with one CPU each (CPU i on the i-th node).
fn node_json(name: &str, numa_ids: &[u64]) -> Value {
    let cpus: Vec<Value> =
        numa_ids.iter().enumerate().map(|(i, &n)| json!({"id": i, "core": i, "socket": 0, "numa": n})).collect();
    let nodes: Vec<Value> = numa_ids
        .iter()
        .enumerate()
        .map(|(i, &n)| json!({"id": n, "cpus": [i], "memoryBytes": 1u64 << 30, "distances": []}))
        .collect();
    json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"topology": {"cpus": cpus, "numaNodes": nodes}},
    })
}

async fn register(node: &Client, body: &Value) -> Result<(u16, Node), ClientError> {
    let body = Bytes::from(serde_json::to_vec(body).expect("encode"));
    node.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await
}

/// The refusal's status and the fields it names.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, Vec<String>) {
    match r {
        Err(ClientError::Api(e)) => (e.code, e.details.iter().map(|d| d.field.clone()).collect()),
        other => panic!("expected an API refusal, got {other:?}"),
    }
}

fn pod(name: &str, extra: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n{extra}"
    ))
}

/// How long the controller may take to bind, mark or explain.
const SOON: Duration = Duration::from_secs(10);

/// The attack: a node registered with NUMA id 4000000000 was accepted,
/// the first pod bound to it grew the server by gigabytes, and every later pod
/// read failed to decode. It is refused now, naming the field, as is a topology
/// that contradicts itself; pods keep being placed and read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_an_unbounded_or_incoherent_topology_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let n = s.node_client(dir.path(), "evil").await;
    let (code, fields) = refusal(register(&n, &node_json("evil", &[4_000_000_000])).await);
    assert_eq!(code, 422);
    assert!(fields.contains(&"spec.topology.numaNodes[0].id".to_string()), "{fields:?}");
    // Coherent ids, but node 0 claims a CPU that says it is on node 1.
    let mut incoherent = node_json("evil", &[0, 1]);
    incoherent["spec"]["topology"]["numaNodes"][0]["cpus"] = json!([0, 1]);
    let (code, fields) = refusal(register(&n, &incoherent).await);
    assert_eq!(code, 422);
    assert_eq!(fields, ["spec.topology.numaNodes[0].cpus"]);
    let mut orphan = node_json("evil", &[0]);
    orphan["spec"]["topology"]["cpus"][0]["numa"] = json!(7);
    let (code, fields) = refusal(register(&n, &orphan).await);
    assert_eq!(code, 422);
    assert!(fields.contains(&"spec.topology.cpus[0].numa".to_string()), "{fields:?}");

    // A sane registration of the same node works, and pods bind and read back.
    assert_eq!(register(&n, &node_json("evil", &[0, 1])).await.expect("register").0, 201);
    s.admin.create_pod(pod("after", "")).await.expect("create");
    eventually("the pod bound", SOON, || async {
        s.admin.get_pod("after").await.is_ok_and(|p| p.spec.node_name.as_deref() == Some("evil"))
    })
    .await;
    assert_eq!(s.admin.list_pods(None).await.expect("list").items.len(), 1);
    s.stop().await;
}

/// Many joins race for one name: exactly one is given a certificate, every
/// other one is 409; deleting the node frees the name for one join again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_joins_mint_one_certificate_per_node_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let anon = s.anonymous(dir.path());
    let tries: Vec<_> = (0..16)
        .map(|_| {
            let (anon, token) = (anon.clone(), s.token.clone());
            tokio::spawn(async move { anon.join(&token, "twin", None).await })
        })
        .collect();
    let (mut won, mut conflicts) = (0, 0);
    for t in tries {
        match t.await.expect("task") {
            Ok(_) => won += 1,
            Err(ClientError::Api(e)) if e.code == 409 => conflicts += 1,
            Err(e) => panic!("unexpected join failure: {e}"),
        }
    }
    assert_eq!((won, conflicts), (1, 15));
    // Joined, never registered: an admin can still free the name.
    s.admin.delete_node("twin").await.expect("delete the joined name");
    anon.join(&s.token, "twin", None).await.expect("the name is free again");
    assert_eq!(refusal(anon.join(&s.token, "twin", None).await).0, 409);
    s.stop().await;
}

/// A resourceVersion the store has not reached would skip every change up to it
/// in silence: it is a 400 naming the field, for a watch and for an attach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_version_from_the_future_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let (_, p) = s.admin.create_pod(pod("now", "")).await.expect("create");
    let (code, fields) = refusal(s.admin.watch_pods(None, None, Some(999_999_999)).await.map(|_| ()));
    assert_eq!((code, fields), (400, vec!["resourceVersion".to_string()]));
    let (code, fields) = refusal(s.admin.attach_pod("now", Some(999_999_999), 0, false).await.map(|_| ()));
    assert_eq!((code, fields), (400, vec!["resourceVersion".to_string()]));
    // The current version itself is fine (nothing newer yet is not an error).
    let current = s.admin.list_pods(None).await.expect("list").resource_version;
    assert!(current >= p.metadata.resource_version.expect("rv"));
    s.admin.watch_pods(None, None, Some(current)).await.expect("a watch from now");
    s.stop().await;
}

/// A join whose reply was lost: the same join record, retried, is given
/// credentials again, with no token and no use spent, before and after the
/// node registered (a node whose certificate expired rejoins this way);
/// another record is 409; a record shorter than 128 bits stands for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_join_attempt_gets_its_credentials_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let anon = s.anonymous(dir.path());
    let record = "3f1c0ffee0ddba11".repeat(4);
    let attempt = Some(record.as_str());
    let first = anon.join(&s.token, "edge", attempt).await.expect("first join (reply lost)");
    let again = anon.join("", "edge", attempt).await.expect("the same record joins again, without a token");
    let incarnation = |pem: &str| pinion_wire::tls::CertificateFacts::from_pem(pem, "node").expect("facts").incarnation;
    assert_eq!(incarnation(&first.client_cert), incarnation(&again.client_cert), "the same incarnation");
    assert_eq!(refusal(anon.join(&s.token, "edge", Some(&"0badcafe".repeat(8))).await).0, 409);
    assert_eq!(refusal(anon.join(&s.token, "edge", None).await).0, 409);
    assert_eq!(refusal(anon.join("", "edge", Some("3f1c0ffee0ddba11")).await).0, 401, "a short record is no proof");
    let (code, fields) = refusal(anon.join(&s.token, "edge", Some("no spaces")).await);
    assert_eq!((code, fields), (422, vec!["attempt".to_string()]));
    let creds = Credentials {
        servers: vec![s.url.clone()],
        ca_cert: again.ca_cert,
        client_cert: again.client_cert,
        client_key: again.client_key,
    };
    let node = Client::new(&creds).expect("node client");
    assert_eq!(register(&node, &node_json("edge", &[0])).await.expect("register").0, 201);
    let after = anon.join("", "edge", attempt).await.expect("the record joins again after registration");
    assert_eq!(incarnation(&after.client_cert), incarnation(&first.client_cert));
    s.stop().await;
}
/// The API refuses a node exactly where the engine would: a node at the NUMA
/// node limit registers and runs a pod; one NUMA node more is refused at
/// registration, not accepted and then unable to run anything. Device and
/// CPU requests at the limit are accepted, one more is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_exactly_where_the_engine_does() {
    use specs::validate::{MAX_CPU_NANOS, MAX_DEVICE_NANOS, MAX_NUMA_NODES};
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let n = s.node_client(dir.path(), "wide").await;
    let over: Vec<u64> = (0..=MAX_NUMA_NODES as u64).collect();
    let (code, fields) = refusal(register(&n, &node_json("wide", &over)).await);
    assert_eq!((code, fields), (422, vec!["spec.topology.numaNodes".to_string()]));
    register(&n, &node_json("wide", &over[..MAX_NUMA_NODES])).await.expect("at the limit");
    s.admin.create_pod(pod("fits", "    resources: {requests: {cpu: \"1\"}}\n")).await.expect("create");
    eventually("the pod placed on the widest node", SOON, || async {
        s.admin.get_pod("fits").await.is_ok_and(|p| p.spec.node_name.as_deref() == Some("wide"))
    })
    .await;

    // Annotated to wait for nodes: the request is checked against the limits
    // alone, not against the nodes registered now.
    let limited = |name: &str, res: &str, n: i128| {
        Bytes::from(format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations: {{pinion.io/wait-for-nodes: \"true\"}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    resources: {{requests: {{{res}: \"{n}\"}}, limits: {{{res}: \"{n}\"}}}}\n"
        ))
    };
    let nano = 1_000_000_000;
    for (name, res, max) in
        [("cpus", "cpu", MAX_CPU_NANOS / nano), ("devices", "example.com/gpu", MAX_DEVICE_NANOS / nano)]
    {
        s.admin.create_pod(limited(name, res, max)).await.unwrap_or_else(|e| panic!("{res}: {max}: {e}"));
        let (code, fields) = refusal(s.admin.create_pod(limited(&format!("{name}-over"), res, max + 1)).await);
        assert_eq!(code, 422, "{res}: {}", max + 1);
        assert!(!fields.is_empty() && fields.iter().all(|f| f.ends_with(res)), "{res}: {fields:?}");
    }
    s.stop().await;
}

/// One record on disk that does not decode: the server still starts, lists
/// skip it and say how many they skipped, and everything else is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_is_skipped_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    s.admin.create_pod(pod("good", "")).await.expect("create");
    s.stop().await;
    {
        // As the server made it: sled refuses another segment size than the one in `conf`.
        let db =
            sled::Config::new().path(dir.path().join("store")).segment_size(16 << 20).open().expect("open the store");
        let tree = db.open_tree("objects").expect("tree");
        // What the server wrote: a placement naming NUMA id 4000000000.
        let good = tree.get("pod/good").expect("read").expect("the pod");
        let mut bad: Value = serde_json::from_slice(&good).expect("json");
        bad["metadata"]["name"] = json!("poisoned");
        bad["status"]["placement"] = json!({"numaAffinity": [4_000_000_000u64], "containers": []});
        tree.insert("pod/poisoned", serde_json::to_vec(&bad).expect("encode")).expect("insert");
        tree.insert("node/garbage", &b"{not json"[..]).expect("insert");
        db.flush().expect("flush");
    }
    let s = TestServer::start(dir.path(), |_| {}).await;
    let (_, pods) = s.admin.call::<Value>(Method::GET, "/api/v1/pods", None).await.expect("list pods");
    let names: Vec<&str> =
        pods["items"].as_array().expect("items").iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    assert_eq!(names, ["good"]);
    assert_eq!(pods["unreadable"], json!(1));
    let (_, nodes) = s.admin.call::<Value>(Method::GET, "/api/v1/nodes", None).await.expect("list nodes");
    assert_eq!(nodes["unreadable"], json!(1));
    // Still serving writes and watches.
    s.admin.create_pod(pod("later", "")).await.expect("create after");
    let mut w = s.admin.watch_pods(None, None, None).await.expect("watch");
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(w.next().await.expect("next").expect("some").1.metadata.name);
    }
    seen.sort();
    assert_eq!(seen, ["good", "later"]);
    // An operator can remove what cannot be read; the lists are whole again.
    assert_eq!(s.admin.delete_pod("poisoned").await.expect("delete the unreadable pod").metadata.name, "poisoned");
    assert_eq!(s.admin.delete_node("garbage").await.expect("delete the unreadable node").metadata.name, "garbage");
    let (_, pods) = s.admin.call::<Value>(Method::GET, "/api/v1/pods", None).await.expect("list pods");
    assert_eq!(pods["unreadable"], Value::Null);
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(2));
    let (_, nodes) = s.admin.call::<Value>(Method::GET, "/api/v1/nodes", None).await.expect("list nodes");
    assert_eq!(nodes["unreadable"], Value::Null);
    s.stop().await;
}
