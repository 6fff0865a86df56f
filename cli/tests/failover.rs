//! Clients and nodelets that know several servers: one real server reached
//! through two loopback relays (`pinion_wire::testing::Relay`), A and B, standing for two
//! servers of one cluster (they share its resource versions, as the servers
//! of an etcd cluster do). A is cut (or its port refuses connections) and
//! everything carries on through B:
//! - the client: calls move to B (a create too, since its connection to A
//!   failed) and a refusal does not move;
//! - a pod watch through A resumes through B from the version it reached:
//!   no change missed or repeated, no replay of the current pods;
//! - a hollow nodelet keeps its pod, registers once, and what it runs and
//!   reports after the cut goes through B;
//! - `pinion get pods --server A --server B` answers with A down.
//!
//! Before clients knew several servers, none of this could reach B.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{lines_until, Cluster, SOON};
use pinion_wire::testing::{eventually, Relay};
use pinion_wire::{Client, ClientError};
use specs::api::{NodeCondition, WatchEventType};
use specs::PodPhase;

fn url(relay: &Relay) -> String {
    format!("https://{}", relay.addr)
}

/// A URL on which nothing listens: connections to it are refused.
fn refusing_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    format!("https://127.0.0.1:{port}")
}

/// The admin's client for these servers, in this order.
fn client_of(c: &Cluster, servers: Vec<String>) -> Client {
    let mut creds = c.creds.clone();
    creds.servers = servers;
    Client::new(&creds).expect("client").with_liveness(common::liveness())
}

/// A pod with no node to go to: it stays Pending, so its only changes are the test's.
fn manifest(name: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}, annotations: {{pinion.io/wait-for-nodes: \"true\"}}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources:\n      limits: {{cpu: 1, memory: 64Mi}}\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_moves_to_the_next_server_when_one_is_cut_or_refuses() {
    let c = Cluster::start().await;
    let b = Relay::start(c.addr).expect("relay B");
    let (a_url, b_url) = (url(&c.relay), url(&b));
    let client = client_of(&c, vec![a_url.clone(), b_url.clone()]);
    let (code, _) = client.create_pod(manifest("first")).await.expect("create through A");
    assert_eq!(code, 201);
    assert_eq!(client.authority(), c.relay.addr.to_string(), "A worked: it stays first");
    assert_eq!(b.connections(), 0, "nothing went to B while A worked");

    c.relay.set_cut(true);
    let pods = client.list_pods(None).await.expect("a list with A cut");
    assert_eq!(pods.items.len(), 1);
    assert_eq!(client.authority(), b.addr.to_string(), "B answered: it is tried first now");
    // B's connection is pooled: later calls share it (no handshake each).
    let to_b = b.connections();
    for _ in 0..5 {
        client.list_pods(None).await.expect("a list through B");
    }
    assert_eq!(b.connections(), to_b, "a new connection to B per call");
    // A fresh client's first connection to A fails: even a create (not
    // idempotent) goes to B, since it never reached A.
    let fresh = client_of(&c, vec![a_url.clone(), b_url.clone()]);
    let (code, _) = fresh.create_pod(manifest("second")).await.expect("create with A cut");
    assert_eq!(code, 201, "created once");
    assert_eq!(fresh.authority(), b.addr.to_string());
    // A refusal is the answer: it does not move to the next server.
    let both = client_of(&c, vec![b_url.clone(), a_url.clone()]);
    match both.get_pod("nothing-here").await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 404, "{e:?}"),
        other => panic!("expected 404, got {:?}", other.map(|p| p.metadata.name)),
    }
    assert_eq!(both.authority(), b.addr.to_string(), "a 404 moved the client");

    // A whose port refuses connections.
    let refused = client_of(&c, vec![refusing_url(), b_url.clone()]);
    assert_eq!(refused.get_pod("second").await.expect("get with A refusing").metadata.name, "second");
    assert_eq!(refused.authority(), b.addr.to_string());
    // Every server down: the error names the last one tried.
    let none = client_of(&c, vec![refusing_url(), a_url.clone()]);
    match none.list_pods(None).await {
        Err(ClientError::Connect { addr, .. }) => assert_eq!(addr, c.relay.addr.to_string()),
        other => panic!("expected a connect error, got {:?}", other.map(|l| l.items.len())),
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_watch_resumes_on_the_next_server_from_its_version() {
    let c = Cluster::start().await;
    let b = Relay::start(c.addr).expect("relay B");
    let client = client_of(&c, vec![url(&c.relay), url(&b)]);
    client.create_pod(manifest("before")).await.expect("create before");
    let list = client.list_pods(None).await.expect("list");
    let mut watch = client.watch_pods(None, None, Some(list.resource_version)).await.expect("watch through A");
    // (type, pod, version) of every change the watch gives.
    let mut seen = Vec::new();
    client.create_pod(manifest("during")).await.expect("create during");
    let during = loop {
        let (ty, pod) = watch.next().await.expect("a change through A").expect("the stream goes on");
        let rv = pod.metadata.resource_version.expect("a version");
        seen.push((ty, pod.metadata.name.clone(), rv));
        if pod.metadata.name == "during" {
            break rv;
        }
    };
    assert_eq!(b.connections(), 0, "the watch went through A");

    c.relay.set_cut(true);
    let lost = tokio::time::timeout(SOON, async {
        loop {
            match watch.next().await {
                Ok(Some((ty, pod))) => {
                    seen.push((ty, pod.metadata.name.clone(), pod.metadata.resource_version.expect("a version")))
                }
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    })
    .await
    .expect("the watch through A ends once A is cut");
    if let Some(e) = &lost {
        assert!(e.is_dead_stream(), "{e}");
    }
    let from = watch.resource_version().expect("the version the watch reached");
    assert!(from >= during, "the watch reached {from}, before the last change it gave ({during})");
    client.create_pod(manifest("after")).await.expect("create with A cut");
    let mut resumed = client.watch_pods(None, None, Some(from)).await.expect("resume through B");
    assert_eq!(client.authority(), b.addr.to_string());
    let first_after = seen.len();
    loop {
        let (ty, pod) = tokio::time::timeout(SOON, resumed.next())
            .await
            .expect("the change after the cut within the bound")
            .expect("a change through B")
            .expect("the stream goes on");
        seen.push((ty, pod.metadata.name.clone(), pod.metadata.resource_version.expect("a version")));
        if pod.metadata.name == "after" && ty == WatchEventType::Added {
            break;
        }
    }
    // Each change once, in order: no version twice, none going back.
    let versions: Vec<u64> = seen.iter().map(|(_, _, v)| *v).collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "a change repeated or out of order: {seen:?}");
    // No full resync: the resumed watch did not replay the pods there
    // before it (a watch from no version starts with every pod as ADDED).
    // A newer change of one of them (the controller's own write after the
    // cut) is no replay: only versions the first watch had reached are.
    let replayed: Vec<_> = seen[first_after..].iter().filter(|(_, name, v)| name != "after" && *v <= from).collect();
    assert!(replayed.is_empty(), "the resumed watch replayed {replayed:?}");
    assert!(seen[first_after].2 > from, "the first change after the switch is newer than {from}: {seen:?}");
    assert!(
        seen[..first_after].iter().any(|(ty, n, _)| n == "during" && *ty == WatchEventType::Added),
        "the change before the cut came through A: {seen:?}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodelet_whose_server_is_cut_keeps_its_pods_and_reports_through_the_next() {
    let mut c = Cluster::start().await;
    let b = Relay::start(c.addr).expect("relay B");
    let servers = vec![url(&c.relay), url(&b)];
    let data = c.node_of(servers.clone());
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    c.create("before").await;
    let before = c.running("before", SOON).await;
    assert_eq!(b.connections(), 0, "the node used A while A worked");
    let saved = orchestrator::tls::Credentials::load(&data.join("node.conf")).expect("the node's credentials");
    assert_eq!(saved.servers, servers, "the node keeps the list it joined with");

    c.relay.set_cut(true);
    let cut_at = c.admin.get_node("edge").await.expect("the node").status.last_report;
    // A pod bound after the cut reaches the node through B, and its status
    // comes back through B.
    c.create("after").await;
    let after = c.running("after", SOON).await;
    assert_eq!(after.spec.node_name.as_deref(), Some("edge"));
    assert!(b.connections() > 0, "the node moved to B");
    let node = eventually("a report after the cut", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.last_report > cut_at)
    })
    .await;
    assert_eq!(node.status.condition, NodeCondition::Ready, "{:?}", node.status);
    // The pod from before the cut kept running, untouched.
    let kept = c.admin.get_pod("before").await.expect("the pod from before");
    let (was, is) = (before.status.expect("status"), kept.status.expect("status"));
    assert_eq!(is.phase, PodPhase::Running);
    assert_eq!(is.container_statuses, was.container_statuses, "the pod was not restarted");
    assert_eq!(is.pod_uid, was.pod_uid);
    // One registration: the switch resumed the watch, it did not start over.
    let registered = c.admin.events("Node", "edge").await.expect("the node's events");
    let n = registered.items.iter().filter(|e| e.reason == "Registered").count();
    assert_eq!(n, 1, "registrations: {:?}", registered.items);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pods_answers_through_the_second_server_when_the_first_is_down() {
    let c = Cluster::start().await;
    c.create("web").await;
    let direct = format!("https://{}", c.addr);
    let repeated = vec!["--server".to_string(), refusing_url(), "--server".to_string(), direct.clone()];
    let listed = vec![format!("--server={},{direct}", refusing_url())];
    for servers in [repeated, listed] {
        let mut args = vec!["get", "pods"];
        args.extend(servers.iter().map(String::as_str));
        let (_get, rx) = c.cli(&args);
        let seen = lines_until(&rx, "the pod's row", Duration::from_secs(30), |l| l.starts_with("web "));
        assert!(seen[0].starts_with("NAME"), "{seen:?}");
    }
    c.stop().await;
}
