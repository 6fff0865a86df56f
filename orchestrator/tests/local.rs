//! The local listener (`--local-listen`) over plain HTTP/1.1, as a browser or
//! a scraper on this machine reaches it: the web view's files, the read-only
//! routes (a list and a watch of nodes, through the same handlers as the
//! HTTPS API), and everything else refused.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::server::LocalListen;
use orchestrator::testing::server::TestServer;
use specs::api::{Node, NodeSpec, NodeStatus};
use specs::pod::ObjectMeta;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const WITHIN: Duration = Duration::from_secs(30);

async fn server(dir: &std::path::Path) -> (TestServer, SocketAddr) {
    let s = TestServer::start(dir, |o| {
        o.local_listen = Some(LocalListen { addr: "127.0.0.1:0".into(), if_free: false });
    })
    .await;
    let local = s.local.expect("a local listener");
    assert!(local.ip().is_loopback() && local.port() != 0, "{local}");
    (s, local)
}

/// Sends one request (`Connection: close`) and reads the whole reply:
/// status code, head and body.
async fn request(addr: SocketAddr, method: &str, path: &str, host: &str) -> (u16, String, String) {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("send");
    let mut reply = Vec::new();
    tokio::time::timeout(WITHIN, tcp.read_to_end(&mut reply)).await.expect("a reply in time").expect("read");
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").expect("a head and a body");
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status code");
    (code, head.to_ascii_lowercase(), body.to_string())
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    request(addr, "GET", path, &addr.to_string()).await
}

#[tokio::test]
async fn serves_the_web_view_and_refuses_the_rest() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (s, local) = server(tmp.path()).await;

    let (code, head, _) = get(local, "/").await;
    assert_eq!(code, 302, "{head}");
    assert!(head.contains("\r\nlocation: /ui/"), "{head}");
    let (code, head, body) = get(local, "/ui/").await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(head.contains("content-security-policy: default-src 'self'"), "{head}");
    assert!(body.contains("<script src=\"app.js\""), "{body}");
    for (path, kind) in [("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css")] {
        let (code, head, body) = get(local, path).await;
        assert_eq!(code, 200, "{path}");
        assert!(head.contains(kind) && !body.is_empty(), "{path}: {head}");
    }
    assert_eq!(get(local, "/ui/missing.js").await.0, 404);
    assert_eq!(request(local, "POST", "/ui/", &local.to_string()).await.0, 405);

    // The API's read routes, as the admin would read them.
    let (code, _, body) = get(local, "/api/v1/pods").await;
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("a JSON list");
    assert_eq!(list["items"], serde_json::json!([]));
    assert_eq!(get(local, "/healthz").await.0, 200);
    // The server's metrics, for a scraper on this machine.
    let (code, head, body) = get(local, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.contains("pinion_store_commit_duration_seconds"), "{body}");

    // Nothing else: no write, no other read, whatever the route does on the HTTPS API.
    let manifest = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: main, image: busybox}]\n";
    let mut tcp = TcpStream::connect(local).await.expect("connect");
    let req = format!(
        "POST /api/v1/pods HTTP/1.1\r\nHost: {local}\r\nContent-Type: application/yaml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{manifest}",
        manifest.len()
    );
    tcp.write_all(req.as_bytes()).await.expect("send");
    let mut reply = String::new();
    tokio::time::timeout(WITHIN, tcp.read_to_string(&mut reply)).await.expect("in time").expect("read");
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(s.admin.list_pods(None).await.expect("list").items.is_empty(), "no pod was created");
    for (method, path, code) in [
        ("DELETE", "/api/v1/pods/web", 404),
        ("GET", "/api/v1/pods/web", 404),
        ("GET", "/api/v1/pods/web/log", 404),
        ("POST", "/api/v1/join", 404),
        ("PUT", "/api/v1/nodes/n1/status", 404),
        ("POST", "/api/v1/nodes", 405),
        ("GET", "/api/v1/jobs", 404),
    ] {
        assert_eq!(request(local, method, path, &local.to_string()).await.0, code, "{method} {path}");
    }

    // A page elsewhere that points its own name at 127.0.0.1 (DNS rebinding) is refused.
    for host in ["evil.example", &format!("evil.example:{}", local.port())] {
        let (code, _, body) = request(local, "GET", "/api/v1/pods", host).await;
        assert_eq!(code, 403, "Host {host}: {body}");
    }
    assert_eq!(request(local, "GET", "/api/v1/pods", &format!("localhost:{}", local.port())).await.0, 200);
    s.stop().await;
}

/// The next watch event that is not a BOOKMARK (other lines are the head
/// and the chunk sizes of the chunked reply).
async fn next_event(lines: &mut tokio::io::Lines<BufReader<TcpStream>>) -> serde_json::Value {
    loop {
        let line = tokio::time::timeout(WITHIN, lines.next_line()).await.expect("a line in time").expect("read");
        let line = line.expect("the stream goes on");
        // A chunk size of digits alone reads as a JSON number: only objects count.
        if let Ok(v @ serde_json::Value::Object(_)) = serde_json::from_str::<serde_json::Value>(&line) {
            if v["type"] != "BOOKMARK" {
                return v;
            }
        }
    }
}

/// `GET /api/v1/nodes?watch=true` on the local listener: the nodes there as
/// ADDED, then a node registered later, then its change, in the watch's
/// wire form (the same stream the HTTPS API serves).
#[tokio::test]
async fn watches_nodes_through_the_shared_handler() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (s, local) = server(tmp.path()).await;
    let register = |name: &'static str, cpus: &'static str| {
        let s = &s;
        let dir = tmp.path();
        async move {
            let node = Node {
                api_version: "pinion.io/v1".into(),
                kind: "Node".into(),
                metadata: ObjectMeta { name: name.into(), ..Default::default() },
                spec: NodeSpec {
                    topology: specs::topology::synthetic::parse(cpus).expect("synthetic"),
                    ..Default::default()
                },
                status: NodeStatus::default(),
            };
            let body = Bytes::from(serde_json::to_vec(&node).expect("encode"));
            let n = s.node_client(dir, name).await;
            n.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await.expect("register");
        }
    };
    register("first", "pack:1 numa:1 core:2 pu:1").await;

    let mut tcp = TcpStream::connect(local).await.expect("connect");
    let req = format!("GET /api/v1/nodes?watch=true&allowWatchBookmarks=true HTTP/1.1\r\nHost: {local}\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("send");
    let mut lines = BufReader::new(tcp).lines();
    let first = next_event(&mut lines).await;
    assert_eq!((first["type"].as_str(), first["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("first")));
    register("second", "pack:2 numa:2 core:2 pu:2").await;
    let second = next_event(&mut lines).await;
    assert_eq!(
        (second["type"].as_str(), second["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("second"))
    );
    assert_eq!(second["object"]["spec"]["topology"]["cpus"].as_array().map(Vec::len), Some(16));
    s.stop().await;
}

/// `pinion up`'s default port, taken by another cluster on this machine,
/// means no local listener and a started server; the port asked for by
/// `--local-listen` and taken is an error naming the flag.
#[tokio::test]
async fn a_taken_port_is_an_error_unless_only_wished_for() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (first, local) = server(&tmp.path().join("first")).await;
    let wished = TestServer::start(&tmp.path().join("wished"), |o| {
        o.local_listen = Some(LocalListen { addr: local.to_string(), if_free: true });
    })
    .await;
    assert_eq!(wished.local, None);
    let mut opts = orchestrator::server::ServerOptions::new(tmp.path().join("asked"), "127.0.0.1:0");
    opts.local_listen = Some(LocalListen { addr: local.to_string(), if_free: false });
    let e = orchestrator::server::Server::bind(opts).await.err().expect("the port is taken").to_string();
    assert!(e.starts_with(&format!("--local-listen {local}: ")), "{e}");
    assert!(!tmp.path().join("asked").exists(), "a refused listener leaves no data dir");
    wished.stop().await;
    first.stop().await;
}
