//! The front door (issue 25), tried as an attacker with a route to the server
//! would: who asks is known before anything they send is read, decoding is
//! bounded and off the async workers, every connection is bounded in its
//! handshake, its first byte, its writes and its idleness, anonymous callers
//! cannot starve the admin, failed joins are limited, the local listener
//! shows no env values, and the data dir is the server's only.
//! A real server on 127.0.0.1:0 with a real sled store in a temp dir.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::testing::server::TestServer;
use orchestrator::tls::Credentials;
use pinion_wire::ClientError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The body that froze the server for 125 s: `{"k":` then 160,000 `[` and `]`.
fn nested(depth: usize) -> Bytes {
    Bytes::from(format!("{{\"k\": {}{}}}", "[".repeat(depth), "]".repeat(depth)))
}

fn code<T: std::fmt::Debug>(r: Result<(u16, T), ClientError>) -> u16 {
    match r {
        Ok((c, _)) => c,
        Err(ClientError::Api(e)) => e.code,
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

/// A TLS connection to the server speaking HTTP/1.1, with `creds`' identity
/// or none.
async fn tls_connection(
    s: &TestServer,
    dir: &std::path::Path,
    creds: Option<&Credentials>,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut config = match creds {
        Some(c) => c.client_config().expect("client config"),
        None => {
            let ca = std::fs::read_to_string(dir.join("pki/ca.crt")).expect("ca");
            let mut roots = rustls::RootCertStore::empty();
            roots.add(pinion_wire::tls::pem_cert(&ca, "ca").expect("ca pem")).expect("root");
            rustls::ClientConfig::builder_with_provider(pinion_wire::tls::provider())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let addr = s.url.trim_start_matches("https://");
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("handshake")
}

/// Reads until the peer closes (or fails); `None` if it is still open after `within`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> Option<usize> {
    let mut total = 0;
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    })
    .await
    .ok()
}

/// Finding 1: an anonymous nested body is refused before it is read, an
/// admin's is refused before the YAML parser sees it, and a JSON body is
/// decoded as JSON; meanwhile the admin's calls are answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_body_is_refused_at_once_while_the_admin_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The admin lists nodes throughout; each answer must come within 5 s.
    let prober = {
        let (admin, stop) = (s.admin.clone(), stop.clone());
        tokio::spawn(async move {
            let mut answered = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let r = tokio::time::timeout(Duration::from_secs(5), admin.list_nodes(None)).await;
                assert!(matches!(r, Ok(Ok(_))), "get nodes failed while the nested bodies were sent: {r:?}");
                answered += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answered
        })
    };
    let anonymous = s.anonymous(dir.path());
    let body = nested(160_000);
    for path in ["/api/v1/pods", "/api/v1/jobs"] {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            anonymous.request(Method::POST, path, Some(("application/yaml", body.clone()))),
        )
        .await
        .expect("an anonymous nested body is answered at once");
        assert_eq!(r.expect("answered").0, 401, "{path}: who asks is known before the body is read");
        for content_type in ["application/yaml", "application/json"] {
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                s.admin.request(Method::POST, path, Some((content_type, body.clone()))),
            )
            .await
            .expect("an admin's nested body is answered at once");
            let (code, reply) = r.expect("answered");
            assert!((400..500).contains(&code), "{path} {content_type}: {code} {}", String::from_utf8_lossy(&reply));
            let e: specs::api::ApiError = serde_json::from_slice(&reply).expect("an API error");
            assert!(
                e.details.iter().any(|d| d.field == "(body)"),
                "{path} {content_type}: the refusal names the body: {e:?}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(prober.await.expect("prober") > 0);
    s.stop().await;
}

/// Finding 2: an anonymous caller's big body is never read: the 401 comes
/// while the body has not even been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_body_is_refused_before_it_arrives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let mut tls = tls_connection(&s, dir.path(), None).await;
    let head = "POST /api/v1/pods HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/yaml\r\ncontent-length: 1000000\r\n\r\n";
    tls.write_all(head.as_bytes()).await.expect("head");
    tls.write_all(b"apiVersion: pinion.io/v1\n").await.expect("a little body");
    let mut reply = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut reply))
        .await
        .expect("answered without the body")
        .expect("read");
    let text = String::from_utf8_lossy(&reply[..n]);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    // A join's body is held to the anonymous limit (16 KiB), not the admin's 1 MiB.
    let big = Bytes::from(format!("{{\"nodeName\":\"n\",\"attempt\":\"{}\"}}", "a".repeat(64 << 10)));
    let r = s.anonymous(dir.path()).request(Method::POST, "/api/v1/join", Some(("application/json", big))).await;
    assert_eq!(code(r), 413);
    s.stop().await;
}

/// A refusal sent before the body is read reaches the client whole: the
/// small body it is still sending is thrown away unread, so the server
/// never closes with bytes unread (a reset that loses the refusal: the TLS
/// EOF Schemathesis saw on anonymous POSTs), and the connection carries the
/// next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_small_body_keeps_the_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let mut tls = tls_connection(&s, dir.path(), None).await;
    let body = format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: p, annotations: {{a: {}}}}}\n",
        "x".repeat(8000)
    );
    let head = format!(
        "POST /api/v1/pods HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/yaml\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("head");
    tls.flush().await.expect("flush");
    // The body comes after the server had the head (and could answer it).
    tokio::time::sleep(Duration::from_millis(200)).await;
    tls.write_all(body.as_bytes()).await.expect("the body is taken");
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.expect("a second request");
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 4096];
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&seen).matches("HTTP/1.1 ").count() >= 2 {
                return true;
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(matches!(answered, Ok(true)), "the connection ended after the refusal: {text}");
    assert!(text.contains("HTTP/1.1 200"), "{text}");
    s.stop().await;
}

/// Finding 2: raw connections that never finish a handshake, anonymous TLS
/// connections that send nothing and a caller that stops reading a large
/// reply are all let go at their bounds, and the admin is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_at_their_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| {
        o.api.max_handshakes = 8;
        o.api.max_anonymous_connections = 8;
        o.api.first_byte_timeout = Duration::from_secs(1);
        o.api.write_timeout = Duration::from_secs(1);
        o.api.anonymous_lifetime = Duration::from_secs(3);
    })
    .await;
    let addr = s.url.trim_start_matches("https://").to_string();
    // 64 connections that never start TLS: eight times the handshake pool.
    let mut hogs = Vec::new();
    for _ in 0..64 {
        hogs.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    let r = tokio::time::timeout(Duration::from_secs(10), s.admin.list_pods(None)).await;
    assert!(matches!(r, Ok(Ok(_))), "the admin is served beside 64 silent connections: {r:?}");
    // The oldest ones were let go to make room.
    let mut evicted = 0;
    for h in &mut hogs {
        if closed_within(h, Duration::from_millis(100)).await.is_some() {
            evicted += 1;
        }
    }
    assert!(evicted >= 56, "only {evicted} of 64 silent connections were let go");
    drop(hogs);

    // An anonymous TLS connection that sends nothing is closed at the first-byte bound.
    let mut idle = tls_connection(&s, dir.path(), None).await;
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await.is_some(), "an idle anonymous connection stayed");
    // One that keeps asking for health is still closed at its lifetime.
    let mut chatty = tls_connection(&s, dir.path(), None).await;
    let ask = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
    let mut closed = false;
    for _ in 0..20 {
        if chatty.write_all(ask).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(500), chatty.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(closed, "an anonymous connection outlived its 3 s lifetime");

    // The admin asks for a large list and never reads it: its connection ends
    // at the write bound instead of holding the reply in memory.
    let annotation = "x".repeat(200_000);
    for i in 0..30 {
        let pod = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: big{i}, annotations: {{blob: {annotation}}}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n"
        );
        s.admin.create_pod(Bytes::from(pod)).await.expect("create");
    }
    let creds = Credentials::load(&dir.path().join("admin.conf")).expect("admin creds");
    let mut slow = tls_connection(&s, dir.path(), Some(&creds)).await;
    slow.write_all(b"GET /api/v1/pods HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.expect("ask");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let read = closed_within(&mut slow, Duration::from_secs(10)).await.expect("the connection ended");
    assert!(read < 6_000_000, "the whole 6 MB reply was delivered to a reader that stalled ({read} bytes)");
    let r = tokio::time::timeout(Duration::from_secs(10), s.admin.list_nodes(None)).await;
    assert!(matches!(r, Ok(Ok(_))), "the admin is served after: {r:?}");
    s.stop().await;
}

/// A request under way when an anonymous connection reaches its lifetime is
/// answered (with `connection: close`) before the connection ends: cut, it
/// looked to the caller like a network fault (Schemathesis's TLS EOF on a
/// POST it could not repeat). The body arrives across the bound; the answer
/// still comes, and then the connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_under_way_at_the_lifetime_is_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| {
        o.api.first_byte_timeout = Duration::from_secs(3);
        o.api.anonymous_lifetime = Duration::from_secs(2);
    })
    .await;
    let mut conn = tls_connection(&s, dir.path(), None).await;
    let body = br#"{"token": "not-a-token", "node": "n1"}"#;
    let head = format!(
        "POST /api/v1/join HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn.write_all(&body[..10]).await.expect("first part");
    // Bytes keep moving (the idle bound is 3 s) while the lifetime passes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    conn.write_all(&body[10..20]).await.expect("second part");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Past the 2 s lifetime: the rest of the body still arrives and is read.
    conn.write_all(&body[20..]).await.expect("the body's end is taken after the lifetime");
    let mut reply = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 "), "no answer to the request under way at the lifetime: {reply:?}");
    assert!(!reply.starts_with("HTTP/1.1 2"), "a made-up token was accepted: {reply:?}");
    assert!(
        reply.to_ascii_lowercase().contains("connection: close"),
        "the answer did not say the connection ends: {reply:?}"
    );
    assert!(ended.is_ok(), "the connection stayed open after its last answer");
    s.stop().await;
}

/// Finding 6: failed joins are limited per source (429 with Retry-After),
/// and a good token from that source waits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_joins_are_limited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let anonymous = s.anonymous(dir.path());
    for i in 0..10 {
        let r = anonymous.join("not-the-token", &format!("guess{i}"), None).await;
        assert!(matches!(&r, Err(ClientError::Api(e)) if e.code == 401), "guess {i}: {r:?}");
    }
    let r = anonymous.join("not-the-token", "guess10", None).await;
    assert!(matches!(&r, Err(ClientError::Api(e)) if e.code == 429), "the eleventh guess: {r:?}");
    let r = anonymous.join(&s.token, "honest", None).await;
    assert!(matches!(&r, Err(ClientError::Api(e)) if e.code == 429), "the source waits out its window: {r:?}");
    s.stop().await;
}

/// Finding 4: the local listener's pod list and watch carry env names,
/// never their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_listener_shows_no_env_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| {
        o.local_listen = Some(orchestrator::server::LocalListen { addr: "127.0.0.1:0".into(), if_free: false })
    })
    .await;
    let pod = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: secretive}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    env: [{name: DB_PASSWORD, value: hunter2-s3cret}]\n";
    s.admin.create_pod(Bytes::from(pod)).await.expect("create");
    let local = s.local.expect("local listener");
    for path in ["/api/v1/pods", "/api/v1/pods?watch=true"] {
        let mut tcp = TcpStream::connect(local).await.expect("connect");
        let ask = format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
        tcp.write_all(ask.as_bytes()).await.expect("ask");
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        // The list ends; the watch's first event is enough.
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while let Ok(n) = tcp.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&got).contains("DB_PASSWORD") && path.contains("watch") {
                    break;
                }
            }
        })
        .await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.contains("DB_PASSWORD"), "{path}: the env name is shown: {text}");
        assert!(!text.contains("hunter2-s3cret"), "{path}: the env value is shown: {text}");
    }
    // The admin, over TLS, still reads it whole.
    let p = s.admin.get_pod("secretive").await.expect("get");
    assert_eq!(p.spec.containers[0].env[0].value, "hunter2-s3cret");
    s.stop().await;
}

/// Finding 4: the data dir is 0700 and nothing in it is readable by other
/// users, and a data dir an older version made looser is tightened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_is_the_servers_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(data.join("left-by-an-older-version"), "x").expect("write");
    std::fs::set_permissions(data.join("left-by-an-older-version"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let s = TestServer::start(&data, |_| {}).await;
    let pod = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    env: [{name: TOKEN, value: t0ps3cret}]\n";
    s.admin.create_pod(Bytes::from(pod)).await.expect("create");
    s.stop().await;
    let mode = |p: &std::path::Path| std::fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    let mut open = Vec::new();
    let mut stack = vec![data.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            if mode(&p) & 0o077 != 0 {
                open.push(format!("{} {:o}", p.display(), mode(&p)));
            }
        }
    }
    assert!(open.is_empty(), "readable by others: {open:?}");
}

/// Finding 2: callers that never read a large list cannot make the server
/// hold a copy each: the local listener holds at most its reply budget of
/// lists at once; one more waits for room (here 2 s) and is answered 503,
/// and room comes back when a reader goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_lists_hold_at_most_the_reply_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| {
        o.local_listen = Some(orchestrator::server::LocalListen { addr: "127.0.0.1:0".into(), if_free: false });
        o.api.local_reply_budget_mib = 13;
        o.api.read_timeout = Duration::from_secs(2);
    })
    .await;
    let annotation = "x".repeat(200_000);
    // 12 MB: more than the kernel buffers of a loopback connection hold.
    for i in 0..60 {
        let pod = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: big{i}, annotations: {{blob: {annotation}}}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n"
        );
        s.admin.create_pod(Bytes::from(pod)).await.expect("create");
    }
    let local = s.local.expect("local listener");
    let ask = |tcp: TcpStream| async move {
        let mut tcp = tcp;
        tcp.write_all(b"GET /api/v1/pods HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.expect("ask");
        tcp
    };
    // A list (12 MB: 12 MiB of the budget of 13 once its size is known) read
    // whole, so the next one's estimate is right.
    let mut first = ask(TcpStream::connect(local).await.expect("connect")).await;
    let mut whole = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = first.read(&mut buf).await {
            if n == 0 {
                break;
            }
            whole.extend_from_slice(&buf[..n]);
            if whole.len() > 12_000_000 {
                break;
            }
        }
    })
    .await;
    assert!(whole.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&whole[..whole.len().min(200)]));
    drop(first);
    // One reader that never reads holds the budget...
    let hog = ask(TcpStream::connect(local).await.expect("connect")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // ...so the next is refused once its wait for room ends.
    let mut next = ask(TcpStream::connect(local).await.expect("connect")).await;
    let mut head = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), next.read(&mut head)).await.expect("answered").expect("read");
    assert!(head[..n].starts_with(b"HTTP/1.1 503"), "{}", String::from_utf8_lossy(&head[..n]));
    drop(hog);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut after = ask(TcpStream::connect(local).await.expect("connect")).await;
    let n =
        tokio::time::timeout(Duration::from_secs(10), after.read(&mut head)).await.expect("answered").expect("read");
    assert!(head[..n].starts_with(b"HTTP/1.1 200"), "room came back: {}", String::from_utf8_lossy(&head[..n]));
    s.stop().await;
}
