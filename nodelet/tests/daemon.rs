//! The node daemon in-process against a real orchestrator `Server` (both on
//! 127.0.0.1:0), with the hollow runtime: join with the token alone (its CA
//! pin), register, run a bound pod, report it Running, serve its logs to the
//! server's proxy, stop it when deleted and report the freed CPUs. A counting
//! relay in front of the server sees the link's connections: the join's, then
//! one for the watch, every report and every heartbeat; another in front of the
//! node's endpoint sees the server's proxy keep one connection to the node.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use nodelet::agent::resettle::OnSettingsChange;
use nodelet::agent::AgentConfig;
use nodelet::daemon::{DaemonConfig, JoinConfig, RuntimeChoice};
use orchestrator::testing::server::TestServer;
use pinion_wire::testing::{eventually, Relay};
use pinion_wire::{Client, ClientError};
use specs::api::NodeCondition;
use specs::topology::{Cpu, NumaNode};
use specs::{CpuSet, NodeSettings, NodeTopology, PodPhase};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// How long the node and the server have to converge on what a test awaits.
const CONVERGE: Duration = Duration::from_secs(60);

/// A real server in this process, on loopback. Its heartbeat grace is a
/// minute: a node a test stops or restarts is not declared lost meanwhile.
async fn start_server(dir: &std::path::Path) -> TestServer {
    TestServer::start(dir, |o| o.controller.heartbeat_grace = Duration::from_secs(60)).await
}

/// A join to `server` with `token`, an endpoint on any loopback port, 16
/// connections at most.
fn plain_join(server: impl Into<String>, token: impl Into<String>) -> JoinConfig {
    JoinConfig {
        servers: vec![server.into()],
        token: Some(token.into()),
        ca: None,
        labels: BTreeMap::new(),
        endpoint_listen: "127.0.0.1:0".into(),
        advertise_address: None,
        node_address: None,
        liveness: Default::default(),
        endpoint_max_connections: 16,
    }
}

/// Two NUMA nodes of four CPUs, one thread per core.
fn topology() -> NodeTopology {
    NodeTopology {
        cpus: (0..8)
            .map(|id| Cpu { id, core: id, socket: id / 4, die: None, numa: Some(id / 4), uncore_cache: None })
            .collect(),
        numa_nodes: (0..2)
            .map(|id| NumaNode {
                kind: Default::default(),
                id,
                cpus: CpuSet::range(id * 4, id * 4 + 3).expect("id within MAX_ID"),
                memory_bytes: 16 << 30,
                distances: if id == 0 { vec![10, 21] } else { vec![21, 10] },
                hugepages: vec![],
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_daemon_runs_a_bound_pod_reports_it_and_stops_it_when_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_server(&dir.path().join("server")).await;
    let (token, admin) = (server.token.clone(), server.admin.clone());
    let relay = Relay::start(server.addr).expect("relay");
    let port = relay.addr.port();
    // The server reaches the node's endpoint through a counting relay too: the
    // node advertises the relay's address (127.0.0.1:P) and listens on
    // 127.0.0.2:P, where the relay forwards.
    let endpoint_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the endpoint relay");
    let p = endpoint_listener.local_addr().expect("relay addr").port();
    let endpoint_relay = Relay::serve(endpoint_listener, ([127, 0, 0, 2], p).into()).expect("endpoint relay");

    let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0").expect("cpus"), ..Default::default() };
    let config = DaemonConfig {
        ready: None,
        local_listen: None,
        net_view: None,
        agent: AgentConfig::new("edge".into(), dir.path().join("node"), topology(), settings),
        runtime: RuntimeChoice::Hollow,
        manifests: None,
        join: Some(JoinConfig {
            servers: vec![format!("https://127.0.0.1:{port}")],
            token: Some(token),
            ca: None,
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            endpoint_listen: format!("127.0.0.2:{p}"),
            advertise_address: Some([127, 0, 0, 1].into()),
            node_address: None,
            liveness: Default::default(),
            endpoint_max_connections: 16,
        }),
    };
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config, rx));

    let node = eventually("the node registers", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    assert_eq!(node.metadata.labels.get("zone").map(String::as_str), Some("a"));
    assert!(dir.path().join("node/node.conf").is_file(), "the node keeps its credentials");

    let manifest = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, inf]\n    resources:\n      limits: {cpu: 2, memory: 1Gi}\n";
    admin.create_pod(Bytes::from(manifest)).await.expect("create the pod");
    let running = eventually("the pod runs", CONVERGE, || async {
        admin.get_pod("web").await.ok().filter(|p| p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running))
    })
    .await;
    assert_eq!(running.spec.node_name.as_deref(), Some("edge"));
    assert!(dir.path().join("node/agent.lock").is_file(), "the agent runs on the node's data dir");
    // The report carried the node's allocations with the pod's status.
    let node = admin.get_node("edge").await.expect("node");
    let held = node.status.allocations.pods.get("web").expect("the pod's allocation is reported");
    assert_eq!(held.containers[0].cpus.len(), 2, "{held:?}");

    // The server reaches the node's endpoint through its proxy: a hollow
    // container's log is empty (no process writes it), and it comes back each
    // time over the one connection the server keeps to this node.
    for _ in 0..3 {
        let mut log = admin.get_stream("/api/v1/pods/web/log").await.expect("the pod's log");
        let mut bytes = Vec::new();
        while let Some(chunk) = log.next().await.expect("log bytes") {
            bytes.extend_from_slice(&chunk);
        }
        assert!(bytes.is_empty(), "a hollow container's log: {bytes:?}");
    }
    // A container the pod does not have is refused, naming it.
    match admin.get_stream("/api/v1/pods/web/log?container=other").await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 400, "{e}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    assert_eq!(endpoint_relay.connections(), 1, "connections from the server to the node");

    admin.delete_pod("web").await.expect("delete the pod");
    eventually("the node frees the pod's CPUs", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.allocations.pods.is_empty())
    })
    .await;
    assert!(matches!(admin.get_pod("web").await, Err(ClientError::Api(e)) if e.code == 404));

    // The join's connection, then one for everything the link sent since.
    assert_eq!(relay.connections(), 2, "connections from the node to the server");

    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");
    server.stop().await;
}

/// Issue 27: node certificates that live six seconds. The node renews each
/// two thirds into its life, writes it to node.conf and presents it on every
/// new connection, with no restart: its pod keeps running, its reports and
/// heartbeats keep coming long after the first certificate expired, a pod
/// created then still reaches it, and a connection cut after the first
/// certificate expired is made again with a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_renews_its_short_lived_certificate_and_keeps_working() {
    use pinion_wire::tls::{CertificateFacts, Credentials};
    const LIFETIME: Duration = Duration::from_secs(6);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(&dir.path().join("server"), |o| {
        o.controller.heartbeat_grace = Duration::from_secs(60);
        o.lifetimes.node = LIFETIME;
    })
    .await;
    let admin = server.admin.clone();
    let relay = Relay::start(server.addr).expect("relay");
    let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0").expect("cpus"), ..Default::default() };
    let config = DaemonConfig {
        ready: None,
        local_listen: None,
        net_view: None,
        agent: AgentConfig::new("edge".into(), dir.path().join("node"), topology(), settings),
        runtime: RuntimeChoice::Hollow,
        manifests: None,
        join: Some(plain_join(format!("https://127.0.0.1:{}", relay.addr.port()), server.token.clone())),
    };
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config, rx));
    let conf = dir.path().join("node/node.conf");
    let facts = || {
        let creds = Credentials::load(&conf).expect("node.conf");
        CertificateFacts::from_pem(&creds.client_cert, "node.conf").expect("facts")
    };
    eventually("the node registers", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    let first = facts();
    let pod = |name: &str| {
        format!("apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: main\n    image: busybox\n    resources:\n      limits: {{cpu: 1, memory: 1Gi}}\n")
    };
    let running = |name: &'static str| {
        let admin = admin.clone();
        async move {
            eventually("the pod runs", CONVERGE, || async {
                admin
                    .get_pod(name)
                    .await
                    .ok()
                    .filter(|p| p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running))
            })
            .await
        }
    };
    admin.create_pod(Bytes::from(pod("before"))).await.expect("create");
    running("before").await;

    // Past the first certificate's end, and several renewals on.
    let mut renewals = std::collections::BTreeSet::new();
    let until = tokio::time::Instant::now() + 2 * LIFETIME;
    while tokio::time::Instant::now() < until {
        let f = facts();
        assert_eq!((&f.common_name, &f.incarnation), (&first.common_name, &first.incarnation), "the same identity");
        renewals.insert(f.not_after);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(std::time::SystemTime::now() > first.not_after, "the first certificate has expired");
    assert!(renewals.len() >= 3, "renewals seen in node.conf: {}", renewals.len());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&conf).expect("stat").permissions());
    assert_eq!(mode & 0o777, 0o600);

    // Every connection from the node is cut: it connects again, presenting
    // a certificate valid now, and keeps reporting.
    let before_cut = relay.connections();
    relay.set_cut(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.set_cut(false);
    let reported = admin.get_node("edge").await.expect("node").status.last_report;
    eventually("the node reports again", CONVERGE, || async {
        admin
            .get_node("edge")
            .await
            .ok()
            .filter(|n| n.status.last_report != reported && n.status.condition == NodeCondition::Ready)
    })
    .await;
    assert!(relay.connections() > before_cut, "the node connected again");
    admin.create_pod(Bytes::from(pod("after"))).await.expect("create");
    running("after").await;
    running("before").await;

    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");
    server.stop().await;
}

/// Two nodes of one server learn their pod ranges (the server's choice, a
/// /24 each, kept on disk for the default network) and each other's range
/// and address, through `peers::NetView`; a node deleted is a peer no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_learns_its_range_and_its_peers() {
    use nodelet::peers::{NetView, Peer};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_server(&dir.path().join("server")).await;
    let url = format!("https://{}", server.addr);
    let start = |name: &str, node_address: Option<std::net::IpAddr>| {
        let (view_tx, view) = watch::channel(NetView::default());
        let config = DaemonConfig {
            ready: None,
            local_listen: None,
            net_view: Some(view_tx),
            agent: AgentConfig::new(name.into(), dir.path().join(name), topology(), NodeSettings::default()),
            runtime: RuntimeChoice::Hollow,
            manifests: None,
            join: Some(JoinConfig { node_address, ..plain_join(url.clone(), server.token.clone()) }),
        };
        let (stop, rx) = watch::channel(false);
        (tokio::spawn(nodelet::daemon::run(config, rx)), stop, view)
    };
    // a says where it is reached; b is reached where it reaches the server from.
    let (a_task, stop_a, a_view) = start("a", Some([192, 0, 2, 1].into()));
    let (b_task, stop_b, b_view) = start("b", None);
    let settled = |view: &watch::Receiver<NetView>| {
        let v = view.borrow().clone();
        (v.own_cidr.is_some() && !v.peers.is_empty()).then_some(v)
    };
    let a = eventually("a knows its range and b", CONVERGE, || async { settled(&a_view) }).await;
    let b = eventually("b knows its range and a", CONVERGE, || async { settled(&b_view) }).await;
    let (a_range, b_range) = (a.own_cidr.expect("a's range"), b.own_cidr.expect("b's range"));
    let mut ranges = [a_range.to_string(), b_range.to_string()];
    ranges.sort();
    assert_eq!(ranges, ["10.213.0.0/24", "10.213.1.0/24"], "a /24 each of the default cluster range");
    assert_eq!(a.peers, [Peer { name: "b".into(), pod_cidr: b_range, address: [127, 0, 0, 1].into() }]);
    assert_eq!(b.peers, [Peer { name: "a".into(), pod_cidr: a_range, address: [192, 0, 2, 1].into() }]);
    let stored = server.admin.get_node("a").await.expect("node a");
    assert_eq!(stored.spec.address.as_deref(), Some("192.0.2.1"));
    let recorded = std::fs::read_to_string(dir.path().join("a/cni/pod-cidr")).expect("a's range on disk");
    assert_eq!(recorded.trim(), a_range.to_string());

    // b goes: a's peers follow.
    let _ = stop_b.send(true);
    b_task.await.expect("b's task").expect("b stops cleanly");
    server.admin.delete_node("b").await.expect("delete b");
    eventually("b is a peer no more", CONVERGE, || async { a_view.borrow().peers.is_empty() }).await;
    assert_eq!(a_view.borrow().own_cidr, Some(a_range), "a keeps its range");
    let _ = stop_a.send(true);
    a_task.await.expect("a's task").expect("a stops cleanly");
    server.stop().await;
}

#[tokio::test]
async fn a_token_without_a_pin_and_no_ca_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = DaemonConfig {
        ready: None,
        local_listen: None,
        net_view: None,
        agent: AgentConfig::new("edge".into(), dir.path().join("node"), topology(), NodeSettings::default()),
        runtime: RuntimeChoice::Hollow,
        manifests: None,
        join: Some(JoinConfig {
            // Nothing listens there: the refusal must come before any connection.
            servers: vec!["https://127.0.0.1:9".into()],
            token: Some("s3cret".into()),
            ca: None,
            labels: BTreeMap::new(),
            endpoint_listen: "127.0.0.1:0".into(),
            advertise_address: None,
            node_address: None,
            liveness: Default::default(),
            endpoint_max_connections: 16,
        }),
    };
    let (_stop, rx) = watch::channel(false);
    let e = nodelet::daemon::run(config, rx).await.expect_err("no pin, no CA");
    assert!(e.to_string().contains("--ca FILE"), "{e}");
    assert!(!dir.path().join("node/node.conf").exists());
    assert!(!dir.path().join("node/agent.lock").exists(), "the agent never started");
}

/// A flood of connections that never start TLS cannot keep the server's
/// proxy (here the admin) out: they sit in the handshake pool, whose oldest
/// seat goes to each newcomer (`pinion_wire::door`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_keep_callers_out_of_the_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_server(&dir.path().join("server")).await;
    let (token, admin) = (server.token.clone(), server.admin.clone());
    let url = format!("https://{}", server.addr);
    let config = DaemonConfig {
        ready: None,
        local_listen: None,
        net_view: None,
        agent: AgentConfig::new("edge".into(), dir.path().join("node"), topology(), NodeSettings::default()),
        runtime: RuntimeChoice::Hollow,
        manifests: None,
        join: Some(JoinConfig { endpoint_max_connections: 2, ..plain_join(url, token) }),
    };
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config, rx));
    let node = eventually("the node registers", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    let endpoint = node.spec.endpoint.expect("the node's endpoint");

    // Two connections that never start TLS fill the handshake pool (of 2).
    let mut hogs = [
        TcpStream::connect(&endpoint).await.expect("first connection"),
        TcpStream::connect(&endpoint).await.expect("second connection"),
    ];
    let client =
        Client::with_tls(&[format!("https://{endpoint}")], Some("edge"), server.creds.client_config().expect("tls"))
            .expect("endpoint client");
    let status = tokio::time::timeout(Duration::from_secs(10), client.get("/logs?pod=none&container=main"))
        .await
        .expect("served beside the silent connections")
        .expect("served")
        .status();
    assert_eq!(status.as_u16(), 404, "the node's refusal: no such pod");
    let mut buf = [0u8; 16];
    let oldest = tokio::time::timeout(Duration::from_secs(1), hogs[0].read(&mut buf)).await;
    assert!(matches!(oldest, Ok(Ok(0)) | Ok(Err(_))), "the oldest silent connection was let go: {oldest:?}");

    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");
    server.stop().await;
}

/// Hole 3 of issue 12: a local step that fails (here the checkpoint write) is
/// the node's own trouble, not the engine refusing the pod, so the server must
/// keep the binding while the node retries; only an engine refusal unbinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_checkpoint_write_keeps_the_binding_while_the_node_retries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_server(&dir.path().join("server")).await;
    let (token, admin, addr) = (server.token.clone(), server.admin.clone(), server.addr);

    let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0").expect("cpus"), ..Default::default() };
    let node_dir = dir.path().join("node");
    let config = DaemonConfig {
        ready: None,
        local_listen: None,
        net_view: None,
        agent: AgentConfig::new("edge".into(), node_dir.clone(), topology(), settings),
        runtime: RuntimeChoice::Hollow,
        manifests: None,
        join: Some(JoinConfig { endpoint_max_connections: 256, ..plain_join(format!("https://{addr}"), token) }),
    };
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config, rx));
    eventually("the node registers", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    let checkpoint = node_dir.join("checkpoint.json");
    eventually("the agent writes its first checkpoint", CONVERGE, || async { checkpoint.is_file().then_some(()) })
        .await;
    // A folder where the checkpoint goes makes every write fail (rename(2)
    // onto a non-empty folder), root or not, until it is taken away.
    std::fs::remove_file(&checkpoint).expect("remove the checkpoint");
    std::fs::create_dir_all(checkpoint.join("in-the-way")).expect("block the checkpoint");

    let manifest = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, inf]\n    resources:\n      limits: {cpu: 2, memory: 1Gi}\n";
    admin.create_pod(Bytes::from(manifest)).await.expect("create the pod");
    let failing =
        eventually("the node reports the failed checkpoint write", CONVERGE, || async {
            admin.get_pod("web").await.ok().filter(|p| {
                p.status.as_ref().and_then(|s| s.message.as_deref()).is_some_and(|m| m.contains("checkpoint"))
            })
        })
        .await;
    assert_eq!(failing.spec.node_name.as_deref(), Some("edge"), "still bound while the node retries: {failing:?}");

    std::fs::remove_dir_all(&checkpoint).expect("unblock the checkpoint");
    let running = eventually("the node's retry runs the pod", CONVERGE, || async {
        admin.get_pod("web").await.ok().filter(|p| p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running))
    })
    .await;
    assert_eq!(running.spec.node_name.as_deref(), Some("edge"));
    let events = admin.events("Pod", "web").await.expect("the pod's events");
    let refusals: Vec<_> = events.items.iter().filter(|e| e.reason == "Rejected").map(|e| &e.message).collect();
    assert!(refusals.is_empty(), "a failed local step was reported as a refusal: {refusals:?}");
    assert!(checkpoint.is_file(), "the retried write made the allocation durable");

    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");
    server.stop().await;
}

/// Issue 13: the node restarts with more reserved CPUs, one of them held by
/// a running pod. The server's node object has the new settings as soon as
/// the node registers again, and the scheduler counts with them; the pod is
/// reported with the reason and an event. Restarted again asking for misfits
/// to be restarted, with no room left for the pod, it goes back to the
/// scheduler through the node's rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_other_reserved_cpus_shows_them_at_once_and_reports_its_misfit_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_server(&dir.path().join("server")).await;
    let (token, admin, addr) = (server.token.clone(), server.admin.clone(), server.addr);
    let node_dir = dir.path().join("node");
    let config = |reserved: &str, on_change| {
        let settings =
            NodeSettings { reserved_cpus: CpuSet::parse_list(reserved).expect("cpus"), ..Default::default() };
        let mut agent = AgentConfig::new("edge".into(), node_dir.clone(), topology(), settings);
        agent.on_settings_change = on_change;
        DaemonConfig {
            ready: None,
            local_listen: None,
            net_view: None,
            agent,
            runtime: RuntimeChoice::Hollow,
            manifests: None,
            join: Some(plain_join(format!("https://{addr}"), token.clone())),
        }
    };
    let reserved_of = |n: &specs::api::Node| n.spec.settings.reserved_cpus.to_string();

    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config("0", OnSettingsChange::Keep), rx));
    let manifest = |name: &str, cpu: u32| {
        Bytes::from(format!("apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, inf]\n    resources:\n      limits: {{cpu: {cpu}, memory: 1Gi}}\n"))
    };
    eventually("the node registers", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    admin.create_pod(manifest("web", 2)).await.expect("create the pod");
    let running = eventually("the pod runs", CONVERGE, || async {
        admin.get_pod("web").await.ok().filter(|p| p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running))
    })
    .await;
    let held = running.status.and_then(|s| s.placement).expect("placement").containers[0].cpus.clone();
    assert_eq!(held.to_string(), "1-2");
    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");

    // CPU 1 is reserved now.
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config("0-1", OnSettingsChange::Keep), rx));
    let node = eventually("the node registers its new settings", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| reserved_of(n) == "0-1")
    })
    .await;
    let offered = specs::engine::allocatable(&node.spec.topology, &node.spec.settings);
    assert_eq!(offered.cpu_millis, 6000, "8 CPUs less 2 reserved");
    assert!(node.status.numa.iter().all(|n| !n.free_cpus.contains(1)), "CPU 1 is not free: {:?}", node.status.numa);
    let pod =
        eventually("the node reports the misfit", CONVERGE, || async {
            admin.get_pod("web").await.ok().filter(|p| {
                p.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some(specs::engine::SETTINGS_MISFIT))
            })
        })
        .await;
    let status = pod.status.expect("status");
    assert_eq!(status.phase, PodPhase::Running, "kept running: {status:?}");
    let message = status.message.unwrap_or_default();
    assert!(message.starts_with("ReservedCpus: container main holds CPUs 1, which are reserved now"), "{message}");
    let events = admin.events("Pod", "web").await.expect("the pod's events");
    let warned: Vec<_> = events.items.iter().filter(|e| e.reason == "SettingsMisfit").collect();
    assert_eq!(warned.len(), 1, "one event: {:?}", events.items);
    assert_eq!(warned[0].message, message);
    // The scheduler counts with 6 allocatable CPUs, 2 of them requested: a
    // pod of 5 would have fit on the node as it was, and does not now.
    admin.create_pod(manifest("big", 5)).await.expect("create big");
    let big = eventually("the scheduler says why big does not fit", CONVERGE, || async {
        admin
            .get_pod("big")
            .await
            .ok()
            .filter(|p| p.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some("Unschedulable")))
    })
    .await;
    assert_eq!(big.spec.node_name, None, "{big:?}");
    admin.delete_pod("big").await.expect("delete big");
    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");

    // One CPU left for pods, misfits restarted: web (2 CPUs) fits nowhere
    // here any more; the node's rejection hands it back to the scheduler.
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config("0-6", OnSettingsChange::Restart), rx));
    let pod = eventually("web is handed back", CONVERGE, || async {
        admin.get_pod("web").await.ok().filter(|p| p.spec.node_name.is_none())
    })
    .await;
    assert_ne!(pod.status.as_ref().map(|s| s.phase), Some(PodPhase::Running), "{pod:?}");
    let node = admin.get_node("edge").await.expect("node");
    assert_eq!(reserved_of(&node), "0-6");
    eventually("the node freed web's CPUs", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.allocations.pods.is_empty())
    })
    .await;
    let events = admin.events("Pod", "web").await.expect("the pod's events");
    assert!(events.items.iter().any(|e| e.reason == "Rejected"), "{:?}", events.items);

    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the daemon stops cleanly");
    server.stop().await;
}

/// One documented metric (a row of `docs/metrics.md`): its name as queried
/// (a counter's with `_total`), type and where it is served.
struct Documented {
    name: String,
    kind: String,
    server: bool,
}

fn documented_metrics() -> Vec<Documented> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let text = std::fs::read_to_string(&path).expect("docs/metrics.md");
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let server = match *cells.get(3)? {
                "server" => true,
                "node" => false,
                other => panic!("{name}: where is {other:?}? (server or node)"),
            };
            Some(Documented { name: name.to_string(), kind: cells[2].to_string(), server })
        })
        .collect()
}

/// A scrape, checked line by line with the Prometheus text parser (so a
/// line it cannot read fails here instead of being skipped), then parsed
/// whole. Returns the samples and each metric family's type by name.
fn parse_scrape(what: &str, text: &str) -> (Vec<prometheus_parse::Sample>, BTreeMap<String, String>) {
    use prometheus_parse::LineInfo;
    assert!(text.ends_with("# EOF\n"), "{what}: an OpenMetrics exposition ends with # EOF");
    let mut types = BTreeMap::new();
    for line in text.lines() {
        match LineInfo::parse(line) {
            LineInfo::Doc { .. } => {}
            LineInfo::Type { .. } => {
                let mut words = line.split_whitespace().skip(2);
                let (Some(name), Some(kind)) = (words.next(), words.next()) else { panic!("{what}: {line:?}") };
                types.insert(name.to_string(), kind.to_string());
            }
            LineInfo::Sample { value, .. } => {
                assert!(value.parse::<f64>().is_ok(), "{what}: a sample's value: {line:?}")
            }
            LineInfo::Empty | LineInfo::Ignored => {
                assert!(
                    line.starts_with("# UNIT ") || line == "# EOF",
                    "{what}: a line the parser cannot read: {line:?}"
                )
            }
        }
    }
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
    (scrape.samples, types)
}

/// Whether the family `name` (as documented) has a sample, and a moved one.
fn sampled(samples: &[prometheus_parse::Sample], doc: &Documented) -> (bool, bool) {
    use prometheus_parse::Value;
    let mut present = false;
    let mut moved = false;
    for s in samples {
        let v = match (&s.value, doc.kind.as_str()) {
            (Value::Histogram(_), "histogram") if s.metric == doc.name => Some(0.0),
            (Value::Untyped(v), "histogram") if s.metric == format!("{}_count", doc.name) => Some(*v),
            (Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v), _) if s.metric == doc.name => Some(*v),
            _ => None,
        };
        if let Some(v) = v {
            present = true;
            moved |= v > 0.0;
        }
    }
    (present, moved)
}

/// Sends `GET path` in plain HTTP/1.1 to `addr`; the status and the body.
async fn plain_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.expect("connect to the local listener");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.expect("send");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut reply))
        .await
        .expect("the reply within 30 s")
        .expect("read");
    let reply = String::from_utf8(reply).expect("text");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status");
    (status, body.to_string())
}

/// firecracker's unused-metrics check: a small real workload (pods that
/// bind, one that fits nowhere, one that crashes and restarts, a static pod
/// the node refuses), then both scrapes parsed with a Prometheus text
/// parser: every metric of `docs/metrics.md` is in its scrape, every counter
/// and histogram moved, and the scrapes hold no `pinion_` metric it lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_is_scraped_and_moved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_server(&dir.path().join("server")).await;
    let admin = server.admin.clone();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests");
    // More CPUs than the node has: the node's engine refuses it.
    std::fs::write(
        manifests.join("huge.yaml"),
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: huge}\nspec:\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, inf]\n    resources:\n      limits: {cpu: 64, memory: 1Gi}\n",
    )
    .expect("write the manifest");
    // A free port for the local listener (the daemon does not say which it took).
    let local = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
    let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0").expect("cpus"), ..Default::default() };
    let config = DaemonConfig {
        ready: None,
        local_listen: Some(local),
        net_view: None,
        agent: AgentConfig::new("edge".into(), dir.path().join("node"), topology(), settings),
        runtime: RuntimeChoice::Hollow,
        manifests: Some((manifests, Duration::from_secs(1))),
        join: Some(plain_join(format!("https://{}", server.addr), server.token.clone())),
    };
    let (stop_node, rx) = watch::channel(false);
    let node_task = tokio::spawn(nodelet::daemon::run(config, rx));
    eventually("the node registers", CONVERGE, || async {
        admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;

    let pod = |name: &str, cpu: u32, command: &str| {
        format!("apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: busybox\n    command: [{command}]\n    resources:\n      limits: {{cpu: {cpu}, memory: 1Gi}}\n")
    };
    // 7 CPUs are not reserved: `first` takes 4, `second` (4) fits nowhere
    // until `first` goes, `crash` (1) exits at once and restarts.
    for (name, cpu, command) in [("first", 4, "sleep, inf"), ("second", 4, "sleep, inf"), ("crash", 1, "'false'")] {
        admin.create_pod(Bytes::from(pod(name, cpu, command))).await.expect("create a pod");
    }
    let restarted =
        |p: &specs::Pod| p.status.as_ref().is_some_and(|s| s.container_statuses.iter().any(|c| c.restart_count > 0));
    eventually("`first` runs, `crash` restarts", CONVERGE, || async {
        let first = admin.get_pod("first").await.ok()?;
        let crash = admin.get_pod("crash").await.ok()?;
        (first.status.as_ref()?.phase == PodPhase::Running && restarted(&crash)).then_some(())
    })
    .await;
    eventually("`second` waits, unschedulable", CONVERGE, || async {
        let second = admin.get_pod("second").await.ok()?;
        (second.status.as_ref()?.reason.as_deref() == Some("Unschedulable")).then_some(())
    })
    .await;
    let node_scrape = eventually("the node refuses the static pod", CONVERGE, || async {
        let (status, body) = plain_get(local, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        body.contains("pinion_pod_rejections_total{reason=\"InsufficientCpu\"}").then_some(body)
    })
    .await;
    let (status, _) = plain_get(local, "/other").await;
    assert_eq!(status, 404, "the local listener serves /metrics only");

    let mut stream = admin.get_stream("/metrics").await.expect("the server's scrape");
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await.expect("scrape bytes") {
        bytes.extend_from_slice(&chunk);
    }
    let server_scrape = String::from_utf8(bytes).expect("text");
    // Authenticated as every other route: no client certificate, no metrics.
    let anonymous = Client::anonymous(&[format!("https://{}", server.addr)], &server.creds.ca_cert).expect("client");
    match anonymous.get_stream("/metrics").await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 401, "{e}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }

    let docs = documented_metrics();
    assert!(docs.len() > 20, "the table of docs/metrics.md: {} rows", docs.len());
    let mut problems = Vec::new();
    for (what, text, on_server) in [("server", &server_scrape, true), ("node", &node_scrape, false)] {
        let (samples, types) = parse_scrape(what, text);
        for doc in docs.iter().filter(|d| d.server == on_server) {
            let (present, moved) = sampled(&samples, doc);
            if !present {
                problems.push(format!("{what}: {} is documented but not in the scrape", doc.name));
            } else if doc.kind != "gauge" && !moved {
                problems.push(format!("{what}: {} ({}) never moved in this workload", doc.name, doc.kind));
            }
        }
        for (family, kind) in types.iter().filter(|(f, _)| f.starts_with("pinion_")) {
            let name = if kind == "counter" { format!("{family}_total") } else { family.clone() };
            match docs.iter().find(|d| d.name == name) {
                None => problems.push(format!("{what}: {name} ({kind}) is not in docs/metrics.md")),
                Some(d) if d.kind != *kind || d.server != on_server => {
                    problems.push(format!("{what}: {name} is a {kind} here, documented otherwise"))
                }
                Some(_) => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let _ = stop_node.send(true);
    node_task.await.expect("node task").expect("the node stops cleanly");
    server.stop().await;
}

/// `--local-listen` serves without authentication: anything but a loopback
/// address is refused before the daemon starts anything, naming the flag.
#[tokio::test]
async fn a_local_listener_off_loopback_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests");
    let config = DaemonConfig {
        ready: None,
        local_listen: Some(([0, 0, 0, 0], 0).into()),
        net_view: None,
        agent: AgentConfig::new("edge".into(), dir.path().join("node"), topology(), NodeSettings::default()),
        runtime: RuntimeChoice::Hollow,
        manifests: Some((manifests, Duration::from_secs(1))),
        join: None,
    };
    let (_stop, rx) = watch::channel(false);
    let err = nodelet::daemon::run(config, rx).await.expect_err("a wildcard address is refused");
    let message = err.to_string();
    assert!(message.starts_with("--local-listen 0.0.0.0:0: only a loopback address"), "{message}");
    assert!(!dir.path().join("node").exists(), "refused before the data dir is made");
}
