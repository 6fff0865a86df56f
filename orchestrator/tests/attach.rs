//! `GET /api/v1/pods/{name}/attach` in process: a real server on 127.0.0.1:0
//! with TLS and a sled store in a temp dir, a node played by the test through
//! its status reports, and the real client reading the frames.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::server::{Server, ServerOptions};
use orchestrator::tls::Credentials;
use pinion_wire::{AttachStream, Client, ClientError};
use specs::api::{AttachFrame, Node, NodeSpec, NodeStatus};
use specs::pod::ObjectMeta;
use specs::topology::{Cpu, NumaNode};
use specs::{NodeTopology, PodPhase};

async fn node_client(url: &str, token: &str, dir: &Path, name: &str) -> Client {
    let ca = std::fs::read_to_string(dir.join("pki/ca.crt")).expect("ca");
    let joined = Client::anonymous(&[url.to_string()], &ca).expect("anon").join(token, name, None).await.expect("join");
    let creds = Credentials {
        servers: vec![url.to_string()],
        ca_cert: joined.ca_cert,
        client_cert: joined.client_cert,
        client_key: joined.client_key,
    };
    let n = Client::new(&creds).expect("node client");
    let mut topology = NodeTopology::default();
    for id in 0..2 {
        topology.cpus.push(Cpu { id, core: id, socket: 0, die: None, numa: Some(0), uncore_cache: None });
    }
    topology.numa_nodes.push(NumaNode {
        kind: Default::default(),
        id: 0,
        cpus: specs::CpuSet::range(0, 1).expect("ids within MAX_ID"),
        memory_bytes: 8 << 30,
        distances: vec![10],
        hugepages: Vec::new(),
    });
    // No endpoint: its containers' output cannot be read, which attach says.
    let node = Node {
        api_version: "pinion.io/v1".into(),
        kind: "Node".into(),
        metadata: ObjectMeta { name: name.into(), ..Default::default() },
        spec: NodeSpec { topology, settings: Default::default(), ..Default::default() },
        status: NodeStatus::default(),
    };
    let body = Bytes::from(serde_json::to_vec(&node).expect("encode"));
    n.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await.expect("register");
    n
}

async fn report(n: &Client, node: &str, pods: serde_json::Value) {
    let body = serde_json::json!({"nodeName": node, "pods": pods});
    let body = Bytes::from(serde_json::to_vec(&body).expect("encode"));
    n.call::<NodeStatus>(Method::PUT, &format!("/api/v1/nodes/{node}/status"), Some(("application/json", body)))
        .await
        .expect("report");
}

fn manifest(name: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: edge\n  restartPolicy: Never\n  containers:\n  - name: main\n    rootfs: host\n    command: [\"true\"]\n"
    ))
}

/// The next frame other than a heartbeat, within a bound.
async fn next(stream: &mut AttachStream) -> Option<AttachFrame> {
    loop {
        let f = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("a frame or the end within 20s")
            .expect("a readable frame");
        if f != Some(AttachFrame::Heartbeat) {
            return f;
        }
    }
}

fn phase(f: &Option<AttachFrame>) -> Option<PodPhase> {
    match f {
        Some(AttachFrame::Status { status, .. }) => Some(status.phase),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_streams_status_changes_then_the_exit_and_says_when_output_cannot_be_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::bind(ServerOptions::new(dir.path(), "127.0.0.1:0")).await.expect("bind");
    let (url, token) = (server.server_url(), server.join_token.to_string());
    let admin = Client::new(&Credentials::load(&server.admin_config).expect("admin config")).expect("client");
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(rx));
    let n = node_client(&url, &token, dir.path(), "edge").await;

    // Created and attached (on the client's one pooled connection), from the
    // created version: the pod as created is not sent again.
    let (code, created) = admin.create_pod(manifest("job")).await.expect("create");
    assert_eq!(code, 201);
    let mut stream = admin.attach_pod("job", created.metadata.resource_version, 0, false).await.expect("attach");
    // A quiet pod: the stream says it is alive.
    let first = tokio::time::timeout(Duration::from_secs(20), stream.next()).await.expect("a heartbeat");
    assert_eq!(first.expect("frame"), Some(AttachFrame::Heartbeat));

    report(
        &n,
        "edge",
        serde_json::json!({"job": {"phase": "Running", "containerStatuses": [{"name": "main", "state": "Running"}]}}),
    )
    .await;
    let f = next(&mut stream).await;
    assert_eq!(phase(&f), Some(PodPhase::Running), "{f:?}");
    let f = next(&mut stream).await;
    match &f {
        Some(AttachFrame::Notice { message }) => assert!(message.contains("no endpoint"), "{message}"),
        other => panic!("expected a notice that the output cannot be read, got {other:?}"),
    }
    report(
        &n,
        "edge",
        serde_json::json!({"job": {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": "Terminated", "lastExitCode": 3, "reason": "Error"}]}}),
    )
    .await;
    let f = next(&mut stream).await;
    assert_eq!(phase(&f), Some(PodPhase::Failed), "{f:?}");
    assert_eq!(
        next(&mut stream).await,
        Some(AttachFrame::Exit {
            phase: PodPhase::Failed,
            exit_code: Some(3),
            reason: Some("Error".into()),
            message: None,
            removed: false,
        })
    );
    assert_eq!(next(&mut stream).await, None, "the stream ends after the exit");

    // A finished pod: its status, then at once its exit.
    let mut again = admin.attach_pod("job", None, 0, false).await.expect("attach again");
    assert_eq!(phase(&next(&mut again).await), Some(PodPhase::Failed));
    assert!(matches!(next(&mut again).await, Some(AttachFrame::Exit { exit_code: Some(3), .. })));

    // Deleted while followed.
    let (_, other) = admin.create_pod(manifest("gone")).await.expect("create");
    let mut followed = admin.attach_pod("gone", other.metadata.resource_version, 0, false).await.expect("attach");
    admin.delete_pod("gone").await.expect("delete");
    assert_eq!(next(&mut followed).await, Some(AttachFrame::Deleted));

    // Unknown pod, bad parameters: refused before any stream.
    match admin.attach_pod("nope", None, 0, false).await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 404),
        Err(e) => panic!("expected 404, got {e}"),
        Ok(_) => panic!("expected 404, got a stream"),
    }
    let (code, body) = admin.request(Method::GET, "/api/v1/pods/job/attach?offset=-1", None).await.expect("request");
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("offset"));

    let _ = stop.send(true);
    task.await.expect("join").expect("server run");
}

/// The status frames up to the exit frame, within a bound.
async fn exit_of(stream: &mut AttachStream) -> Option<AttachFrame> {
    loop {
        match next(stream).await {
            Some(AttachFrame::Status { .. } | AttachFrame::Notice { .. }) => continue,
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rm_deletes_the_finished_pod_before_its_exit_frame_for_whoever_may_delete_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = orchestrator::testing::server::TestServer::start(dir.path(), |_| {}).await;
    let n = node_client(&s.url, &s.token, dir.path(), "edge").await;
    let finished = serde_json::json!({"phase": "Succeeded", "containerStatuses": [
        {"name": "main", "state": "Terminated", "lastExitCode": 0, "reason": "Completed"}]});

    // Followed with rm: deleted by the time the exit frame says so.
    let (_, created) = s.admin.create_pod(manifest("tidy")).await.expect("create");
    let mut stream = s.admin.attach_pod("tidy", created.metadata.resource_version, 0, true).await.expect("attach");
    report(&n, "edge", serde_json::json!({ "tidy": finished })).await;
    match exit_of(&mut stream).await {
        Some(AttachFrame::Exit { exit_code: Some(0), removed: true, .. }) => {}
        other => panic!("expected an exit frame saying the pod was removed, got {other:?}"),
    }
    match s.admin.get_pod("tidy").await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 404, "{e}"),
        other => panic!("the pod should be gone: {other:?}"),
    }

    // Without rm the finished pod stays, and the exit frame says so.
    let (_, first) = s.admin.create_pod(manifest("again")).await.expect("create");
    report(&n, "edge", serde_json::json!({ "again": finished })).await;
    let mut late = s.admin.attach_pod("again", first.metadata.resource_version, 0, false).await.expect("attach");
    assert!(matches!(exit_of(&mut late).await, Some(AttachFrame::Exit { removed: false, .. })));
    assert!(s.admin.get_pod("again").await.is_ok(), "without rm the finished pod stays");

    // Someone who may read the pod but not delete it is refused rm before
    // any stream, and the pod stays.
    let viewer = s.person("audit", specs::api::Role::Viewer).await;
    assert!(viewer.attach_pod("again", None, 0, false).await.is_ok(), "a viewer follows any pod");
    match viewer.attach_pod("again", None, 0, true).await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 403, "{e}"),
        Err(e) => panic!("expected 403, got {e}"),
        Ok(_) => panic!("expected 403, got a stream"),
    }
    assert!(s.admin.get_pod("again").await.is_ok(), "a refused rm deletes nothing");
    s.stop().await;
}
