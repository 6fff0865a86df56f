//! Connection reuse between the shared client and the server: the server
//! offers HTTP/2 over ALPN, and a client keeps one pooled connection, so many
//! calls (one after another, at once, and beside an open watch) cross a single
//! TCP connection and a single TLS handshake. A counting relay in front of the
//! server sees every connection. HTTP/1.1 still works for a client that asks
//! only for it, and a new connection resumes the TLS session of the last.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use orchestrator::server::{Server, ServerOptions};
use orchestrator::tls::Credentials;
use pinion_wire::Client;
use tokio::net::{TcpListener, TcpStream};

/// Forwards `127.0.0.1:PORT` to `to`, counting accepted connections.
async fn counting_relay(to: std::net::SocketAddr) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let port = listener.local_addr().expect("relay addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (port, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_reuses_one_connection_for_every_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::bind(ServerOptions::new(dir.path(), "127.0.0.1:0")).await.expect("bind");
    let mut creds = Credentials::load(&server.admin_config).expect("admin config");
    let (port, connections) = counting_relay(server.local_addr()).await;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(rx));
    creds.servers = vec![format!("https://127.0.0.1:{port}")];
    let client = Client::new(&creds).expect("client");

    for _ in 0..10 {
        client.list_pods(None).await.expect("list");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "ten calls one after another");

    // A watch stays open while other calls go at once: with HTTP/2 they all
    // share the connection (HTTP/1.1 would need one connection each).
    let mut watch = client.watch_pods(None, None, None).await.expect("watch");
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move {
                let manifest = format!(
                    "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  containers:\n  - name: main\n    image: busybox\n"
                );
                c.create_pod(Bytes::from(manifest)).await.map(|_| ())
            })
        })
        .collect();
    for c in calls {
        c.await.expect("task").expect("create");
    }
    let mut seen = 0;
    while seen < 10 {
        let next = tokio::time::timeout(Duration::from_secs(30), watch.next()).await.expect("watch in time");
        next.expect("watch line").expect("still open");
        seen += 1;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "a watch and ten calls at once");

    let _ = stop.send(true);
    task.await.expect("server task").expect("server");
}

/// One HTTP/1.1 connection with `config`: two requests on it, and the way
/// its TLS handshake went.
async fn http1_calls(addr: std::net::SocketAddr, config: Arc<rustls::ClientConfig>) -> rustls::HandshakeKind {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let kind = tls.get_ref().1.handshake_kind().expect("handshake done");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.expect("http1");
    tokio::spawn(conn);
    for _ in 0..2 {
        let req = hyper::Request::get("/api/v1/pods")
            .header(hyper::header::HOST, "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .expect("request");
        // The connection takes the next request once it has finished the last.
        sender.ready().await.expect("the connection stays open for the next request");
        let resp = sender.send_request(req).await.expect("reply");
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(body.starts_with(b"{"), "{body:?}");
    }
    kind
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_is_served_and_a_second_connection_resumes_the_tls_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::bind(ServerOptions::new(dir.path(), "127.0.0.1:0")).await.expect("bind");
    let creds = Credentials::load(&server.admin_config).expect("admin config");
    let addr = server.local_addr();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(rx));

    // As `Client` does: every connection shares one configuration, and so its
    // session cache.
    let mut config = creds.client_config().expect("client config");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);
    assert_eq!(http1_calls(addr, config.clone()).await, rustls::HandshakeKind::Full);
    assert_eq!(http1_calls(addr, config).await, rustls::HandshakeKind::Resumed);

    let _ = stop.send(true);
    task.await.expect("server task").expect("server");
}

/// A stream read line by line, each as JSON.
struct JsonLines {
    stream: pinion_wire::ByteStream,
    buf: Vec<u8>,
}

impl JsonLines {
    async fn next(&mut self) -> serde_json::Value {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return serde_json::from_slice(&line).expect("a JSON line");
            }
            let next = tokio::time::timeout(Duration::from_secs(30), self.stream.next()).await.expect("a line in time");
            self.buf.extend_from_slice(&next.expect("stream").expect("still open"));
        }
    }
}

/// An idle watch that asked for bookmarks carries one every heartbeat, at
/// the version the watch reached, so a reader can tell a dead stream from a
/// quiet cluster; one that did not ask (an older client) sees only changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_watch_carries_bookmarks_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = ServerOptions::new(dir.path(), "127.0.0.1:0");
    opts.api.liveness = specs::api::Liveness { heartbeat: Duration::from_millis(100) };
    let server = Server::bind(opts).await.expect("bind");
    let client = Client::new(&Credentials::load(&server.admin_config).expect("admin config")).expect("client");
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(rx));
    let manifest = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: main\n    image: busybox\n";
    let (_, a) = client.create_pod(Bytes::from(manifest)).await.expect("create");
    let version = a.metadata.resource_version.expect("a version");

    let path = "/api/v1/pods?watch=true&resourceVersion=0";
    let stream = client.get_stream(&format!("{path}&allowWatchBookmarks=true")).await.expect("watch");
    let mut asked = JsonLines { stream, buf: Vec::new() };
    let mut old = JsonLines { stream: client.get_stream(path).await.expect("watch"), buf: Vec::new() };
    // The changes so far (the create, the scheduler's verdict), then a bookmark
    // at least as new as every one of them.
    let mut newest = 0;
    let bookmark = loop {
        let line = asked.next().await;
        if line["type"] == "BOOKMARK" {
            break line;
        }
        newest = newest.max(line["object"]["metadata"]["resourceVersion"].as_u64().expect("a version"));
    };
    let reached = bookmark["object"]["metadata"]["resourceVersion"].as_u64().expect("the bookmark's version");
    assert!(reached >= newest && newest >= version, "{bookmark} after version {newest}");
    // Heartbeats later, the old client has seen only changes, up to the delete.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.delete_pod("a").await.expect("delete");
    loop {
        let line = old.next().await;
        assert_ne!(line["type"], "BOOKMARK", "a bookmark to a watcher that did not ask");
        if line["type"] == "DELETED" {
            break;
        }
    }

    let _ = stop.send(true);
    task.await.expect("server task").expect("server");
}

/// Connections that never start TLS sit in the handshake pool, whose oldest
/// seat goes to a newcomer: they cannot keep the admin out. Known callers
/// are counted in their own pool, which refuses beyond its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_keep_the_admin_out() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = ServerOptions::new(dir.path(), "127.0.0.1:0");
    opts.api.max_handshakes = 2;
    opts.api.max_admin_connections = 1;
    let server = Server::bind(opts).await.expect("bind");
    let addr = server.local_addr();
    let creds = Credentials::load(&server.admin_config).expect("admin config");
    let client = Client::new(&creds).expect("client");
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(rx));
    // Two connections that never start TLS fill the handshake pool.
    let mut hogs = [TcpStream::connect(addr).await.expect("first"), TcpStream::connect(addr).await.expect("second")];
    let listed = tokio::time::timeout(Duration::from_secs(10), client.list_pods(None)).await;
    assert_eq!(listed.expect("served in time").expect("served").items.len(), 0);
    let mut buf = [0u8; 16];
    let first = tokio::time::timeout(Duration::from_secs(1), hogs[0].read(&mut buf)).await;
    assert!(matches!(first, Ok(Ok(0)) | Ok(Err(_))), "the oldest silent connection was let go: {first:?}");
    // The admin's one seat is the pooled connection `client` holds; a second
    // admin connection is refused, not queued.
    let other = Client::new(&creds).expect("second client");
    let refused = tokio::time::timeout(Duration::from_secs(10), other.list_pods(None)).await.expect("answered");
    assert!(refused.is_err(), "a second admin connection was served beyond the cap of one");
    drop(client);
    let _ = stop.send(true);
    task.await.expect("server task").expect("server");
}

/// A peer that sends a stream line without end: the client refuses it once
/// it passes the cap (a clear error, the stream dropped) instead of
/// buffering it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_line_longer_than_the_cap_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().expect("tempdir");
    let (pki, _) = orchestrator::tls::Pki::load_or_create(dir.path()).expect("pki");
    let mut tls = pki.server_config(&["127.0.0.1".to_string()]).expect("server tls");
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        let Ok((tcp, _)) = listener.accept().await else { return };
        let Ok(mut s) = acceptor.accept(tcp).await else { return };
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&b[..n]),
            }
        }
        let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n";
        if s.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
        // 64 MiB of one line, then silence with the connection open.
        let chunk = format!("{:x}\r\n{}\r\n", 1 << 16, "x".repeat(1 << 16));
        for _ in 0..1024 {
            if s.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
            counter.fetch_add(1 << 16, Ordering::SeqCst);
        }
        std::future::pending::<()>().await;
    });
    let creds = pki
        .credentials(&format!("https://{addr}"), "admin", None, std::time::Duration::from_secs(3600))
        .expect("credentials");
    let client = Client::new(&creds).expect("client");
    let mut watch = client.watch_pods(None, None, Some(0)).await.expect("the reply's head");
    let next = tokio::time::timeout(Duration::from_secs(60), watch.next()).await.expect("refused in time");
    match next {
        Err(pinion_wire::ClientError::LineTooLong(e)) => assert_eq!(e.max, specs::api::MAX_STREAM_LINE),
        other => panic!("expected LineTooLong, got {:?}", other.map(|o| o.map(|(t, _)| t))),
    }
    assert!(sent.load(Ordering::SeqCst) < 64 << 20, "the client stopped reading before the line's end");
}
