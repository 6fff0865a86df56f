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
use orchestrator::client::Client;
use orchestrator::server::{Server, ServerOptions};
use orchestrator::tls::Credentials;
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
    creds.server = format!("https://127.0.0.1:{port}");
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
