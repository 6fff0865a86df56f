//! Each node's pod range, through the API, on sled and on etcd: nodes that
//! register get ranges of their own, keep theirs when they register again
//! and cannot choose it; a deleted node's range goes to the next node; a
//! full cluster range refuses a registration, naming the flag. Nodes read
//! one another's ranges and addresses, never their status.

use std::path::Path;

use bytes::Bytes;
use hyper::Method;
use orchestrator::testing::server::TestServer;
use pinion_wire::{Client, ClientError};
use specs::api::{ApiError, List, Node};
use specs::net::PodRanges;

/// A valid registration of `name` at `address`, sending `pod_cidr` as its
/// range (which the server ignores).
fn node_body(name: &str, address: &str, pod_cidr: Option<&str>) -> Bytes {
    let mut node = serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {
            "topology": {
                "cpus": [{"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 1, "core": 1, "socket": 0, "numa": 0}],
                "numaNodes": [{"id": 0, "cpus": [0, 1], "memoryBytes": 8589934592u64, "distances": [10]}]
            },
            "address": address
        }
    });
    if let Some(r) = pod_cidr {
        node["spec"]["podCIDR"] = r.into();
    }
    Bytes::from(node.to_string())
}

async fn register(node: &Client, name: &str, address: &str, pod_cidr: Option<&str>) -> Result<Node, ApiError> {
    let body = node_body(name, address, pod_cidr);
    match node.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await {
        Ok((_, n)) => Ok(n),
        Err(ClientError::Api(e)) => Err(e),
        Err(e) => panic!("registering {name}: no HTTP answer: {e}"),
    }
}

fn range(n: &Node) -> &str {
    n.spec.pod_cidr.as_deref().unwrap_or("none")
}

/// The scenario, on a server whose cluster range holds two /24s.
async fn two_ranges_for_three_nodes(s: &TestServer, dir: &Path) {
    let (a, b, c) = (s.node_client(dir, "a").await, s.node_client(dir, "b").await, s.node_client(dir, "c").await);
    let first = register(&a, "a", "192.0.2.1", None).await.expect("a registers");
    assert_eq!((range(&first), first.spec.address.as_deref()), ("10.213.0.0/24", Some("192.0.2.1")));
    // b asks for a's range: the range is the server's choice.
    let second = register(&b, "b", "192.0.2.2", Some("10.213.0.0/24")).await.expect("b registers");
    assert_eq!(range(&second), "10.213.1.0/24");
    // a again, from another address, asking for another range: its own kept.
    let again = register(&a, "a", "192.0.2.11", Some("10.99.0.0/24")).await.expect("a registers again");
    assert_eq!((range(&again), again.spec.address.as_deref()), ("10.213.0.0/24", Some("192.0.2.11")));
    assert_eq!(range(&s.admin.get_node("a").await.expect("get a")), "10.213.0.0/24", "as stored");

    let full = register(&c, "c", "192.0.2.3", None).await.expect_err("no range left for c");
    assert_eq!((full.code, full.reason.as_str()), (503, "PodRangesExhausted"), "{full}");
    assert!(full.message.contains("10.213.0.0/23") && full.message.contains("--pod-cidr"), "{}", full.message);
    let bad = register(&c, "c", "not-an-ip", None).await.expect_err("a bad address");
    assert_eq!(bad.code, 422, "{bad}");
    assert_eq!(bad.details.iter().map(|d| d.field.as_str()).collect::<Vec<_>>(), ["spec.address"]);

    // A node lists the nodes' specs (ranges, addresses), not their status.
    let (_, raw) = b.request(Method::GET, "/api/v1/nodes", None).await.expect("b lists the nodes");
    let listed: serde_json::Value = serde_json::from_slice(&raw).expect("a list");
    let items = listed["items"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|n| n.get("status").is_none()), "{listed}");
    let peers: List<Node> = serde_json::from_slice(&raw).expect("a node list");
    let seen: Vec<(&str, &str, Option<&str>)> =
        peers.items.iter().map(|n| (n.metadata.name.as_str(), range(n), n.spec.address.as_deref())).collect();
    assert_eq!(seen, [("a", "10.213.0.0/24", Some("192.0.2.11")), ("b", "10.213.1.0/24", Some("192.0.2.2"))]);
    // Its watch too.
    let mut watch = b.get_stream("/api/v1/nodes?watch=true").await.expect("b watches the nodes");
    let mut lines = String::new();
    while lines.lines().count() < 2 {
        let chunk = watch.next().await.expect("watch bytes").expect("the watch goes on");
        lines.push_str(&String::from_utf8_lossy(&chunk));
    }
    for line in lines.lines() {
        let event: serde_json::Value = serde_json::from_str(line).expect("a watch line");
        assert!(event["object"]["spec"]["podCIDR"].is_string() && event["object"].get("status").is_none(), "{line}");
    }
    // An admin reads them whole.
    let whole = s.admin.list_nodes(None).await.expect("admin lists");
    assert!(whole.items.iter().all(|n| n.status.last_report.is_some()));

    // a goes: its range is c's.
    s.admin.delete_node("a").await.expect("delete a");
    let third = register(&c, "c", "192.0.2.3", None).await.expect("c registers");
    assert_eq!(range(&third), "10.213.0.0/24");
}

fn two_ranges(o: &mut orchestrator::server::ServerOptions) {
    o.pod_ranges = PodRanges::parse("10.213.0.0/23", 24).expect("ranges");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sled_each_node_gets_a_range_of_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), two_ranges).await;
    two_ranges_for_three_nodes(&s, dir.path()).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_each_node_gets_a_range_of_its_own() {
    use orchestrator::testing::etcd::{available, EtcdCluster};
    if !available("pod ranges on etcd") {
        return;
    }
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| {
        two_ranges(o);
        o.etcd = Some(etcd.config("/pod-ranges"));
    })
    .await;
    // A registration goes to the leader: this server, once it leads. The
    // probe that waits for it is deleted, its range with it.
    let node = s.node_client(dir.path(), "probe").await;
    pinion_wire::testing::eventually("the server leads", std::time::Duration::from_secs(20), || async {
        register(&node, "probe", "192.0.2.9", None).await.is_ok()
    })
    .await;
    s.admin.delete_node("probe").await.expect("delete the probe");
    two_ranges_for_three_nodes(&s, dir.path()).await;
    s.stop().await;
}
