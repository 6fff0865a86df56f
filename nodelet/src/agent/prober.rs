//! Runs one probe (the executor's side of `super::probes`) and says how it
//! went. Nothing here runs on a pod's CPUs:
//!
//! - TCP, HTTP(S) and gRPC probes connect from a fresh thread of the agent,
//!   which runs on the node's reserved CPUs like the rest of the agent
//!   (`crate::affinity`). A pod with its own address (CNI) is reached at that
//!   address through the pod bridge; a `hostNetwork` pod at 127.0.0.1; a pod
//!   with `lo` only from inside its network namespace: the thread joins the
//!   container's (`setns`) and ends with the probe, so no other work runs in it.
//! - Exec probes go through `Runtime::exec_probe`, the path `pinion exec`
//!   takes, with the command kept on the reserved CPUs (see
//!   `crate::runtime::libcontainer::exec`).
//!
//! HTTP is a hand-written HTTP/1.1 GET on a blocking socket, so the same
//! code runs in a joined namespace; HTTPS is the same GET through rustls
//! without verifying the certificate, as the kubelet (`tls`). gRPC is the
//! health checking protocol over HTTP/2 (`grpc`), on a socket connected the
//! same way.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use specs::probe::{HttpGetAction, Probe, ProbeAction, ProbeResult, Scheme};

use crate::runtime::{ContainerState, Runtime};

mod grpc;
mod tls;

/// Where a network probe connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeTarget {
    /// The pod's address, from the host (CNI pods; 127.0.0.1 for `hostNetwork`).
    Addr(IpAddr),
    /// 127.0.0.1 inside the network namespace of the container's process
    /// (pods with `lo` only).
    InsideNetns,
}

impl ProbeTarget {
    pub(crate) fn host() -> ProbeTarget {
        ProbeTarget::Addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}

/// Runs `probe` against container `id`; the result and, unless it
/// succeeded, what went wrong (for the pod's message).
pub(crate) async fn run(
    rt: Arc<dyn Runtime>,
    id: String,
    probe: Probe,
    target: ProbeTarget,
) -> (ProbeResult, Option<String>) {
    let timeout = probe.timeout();
    let limit = super::probes::limit(&probe);
    let task = tokio::task::spawn_blocking(move || run_blocking(rt.as_ref(), &id, &probe, &target, timeout));
    match tokio::time::timeout(limit, task).await {
        Err(_) => (ProbeResult::Timeout, Some(format!("timed out after {timeout:?}"))),
        Ok(Err(join)) => (ProbeResult::Failure, Some(format!("probe panicked: {join}"))),
        Ok(Ok(r)) => r,
    }
}

fn run_blocking(
    rt: &dyn Runtime,
    id: &str,
    probe: &Probe,
    target: &ProbeTarget,
    timeout: Duration,
) -> (ProbeResult, Option<String>) {
    match probe.action() {
        Some(ProbeAction::Exec(x)) => exec(rt, id, &x.command, timeout),
        Some(ProbeAction::TcpSocket(t)) => {
            let port = t.port;
            net(rt, id, target, move |ip| tcp(SocketAddr::new(ip, port), timeout).map(|_| ()))
        }
        Some(ProbeAction::HttpGet(h)) => {
            let h = h.clone();
            net(rt, id, target, move |ip| http(ip, &h, timeout))
        }
        Some(ProbeAction::Grpc(g)) => {
            let (port, service) = (g.port, g.service.clone().unwrap_or_default());
            net(rt, id, target, move |ip| {
                let started = Instant::now();
                let addr = SocketAddr::new(ip, port);
                let stream = tcp(addr, timeout)?;
                grpc::check(stream, addr, &service, timeout.saturating_sub(started.elapsed()))
            })
        }
        _ => (ProbeResult::Failure, Some("no probe action".into())),
    }
}

/// The result of a network check run where `target` says.
fn net(
    rt: &dyn Runtime,
    id: &str,
    target: &ProbeTarget,
    check: impl FnOnce(IpAddr) -> Result<(), Failed> + Send + 'static,
) -> (ProbeResult, Option<String>) {
    let outcome = match target {
        ProbeTarget::Addr(ip) => check(*ip),
        ProbeTarget::InsideNetns => match rt.state(id) {
            Ok(ContainerState::Running { pid }) => in_netns(pid, check),
            Ok(other) => Err(Failed::Error(format!("the container is not running ({other:?})"))),
            Err(e) => Err(Failed::Error(e.to_string())),
        },
    };
    match outcome {
        Ok(()) => (ProbeResult::Success, None),
        Err(Failed::Timeout(m)) => (ProbeResult::Timeout, Some(m)),
        Err(Failed::Error(m)) => (ProbeResult::Failure, Some(m)),
    }
}

#[derive(Debug)]
enum Failed {
    Timeout(String),
    Error(String),
}

/// Runs `check` against 127.0.0.1 on a thread of its own that joins the
/// network namespace of process `pid` and ends with the check.
fn in_netns(pid: i32, check: impl FnOnce(IpAddr) -> Result<(), Failed> + Send + 'static) -> Result<(), Failed> {
    let path = format!("/proc/{pid}/ns/net");
    let thread = std::thread::Builder::new()
        .name("probe-netns".into())
        .spawn(move || {
            let ns = std::fs::File::open(&path).map_err(|e| Failed::Error(format!("{path}: {e}")))?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| Failed::Error(format!("joining {path}: {e}")))?;
            check(IpAddr::V4(Ipv4Addr::LOCALHOST))
        })
        .map_err(|e| Failed::Error(format!("probe thread: {e}")))?;
    thread.join().unwrap_or_else(|_| Err(Failed::Error("probe thread panicked".into())))
}

fn tcp(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, Failed> {
    match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => Ok(s),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
            Err(Failed::Timeout(format!("dial tcp {addr}: timed out after {timeout:?}")))
        }
        Err(e) => Err(Failed::Error(format!("dial tcp {addr}: {e}"))),
    }
}

/// Most bytes of an answer read to find its status line.
const MAX_STATUS_LINE: usize = 1024;

/// A GET whose answer's status is 200 to 399 (as the kubelet; redirects are
/// not followed, a 3xx is success). With `scheme: HTTPS`, over TLS without
/// verifying the certificate (`tls`).
fn http(ip: IpAddr, h: &HttpGetAction, timeout: Duration) -> Result<(), Failed> {
    let deadline = Instant::now() + timeout;
    let addr = SocketAddr::new(ip, h.port);
    let stream = tcp(addr, timeout)?;
    let get = Get { h, addr, deadline, timeout };
    if h.scheme == Some(Scheme::Https) {
        let config = tls::config().map_err(Failed::Error)?;
        let conn = rustls::ClientConnection::new(config, rustls::pki_types::ServerName::IpAddress(ip.into()))
            .map_err(|e| Failed::Error(format!("GET {}: {e}", get.url())))?;
        // The handshake happens within the first write and read, under their timeouts.
        get.run(rustls::StreamOwned::new(conn, stream), |s| &s.sock)
    } else {
        get.run(stream, |s| s)
    }
}

/// One probe's GET, over whichever stream its scheme asks for.
struct Get<'a> {
    h: &'a HttpGetAction,
    addr: SocketAddr,
    deadline: Instant,
    timeout: Duration,
}

impl Get<'_> {
    fn url(&self) -> String {
        let scheme = if self.h.scheme == Some(Scheme::Https) { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, self.h.path.as_deref().unwrap_or("/"))
    }

    /// Sends the request on `stream` and reads the status line; `sock` is
    /// its TCP socket, whose timeouts bound every read and write.
    fn run<S: Read + Write>(&self, mut stream: S, sock: impl Fn(&S) -> &TcpStream) -> Result<(), Failed> {
        let (h, addr, timeout) = (self.h, self.addr, self.timeout);
        let left = || self.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let io = |e: std::io::Error| {
            if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) {
                Failed::Timeout(format!("GET {}: timed out after {timeout:?}", self.url()))
            } else {
                Failed::Error(format!("GET {}: {e}", self.url()))
            }
        };
        let path = h.path.as_deref().unwrap_or("/");
        let host = match addr.ip() {
            IpAddr::V6(v6) => format!("[{v6}]:{}", h.port),
            IpAddr::V4(v4) => format!("{v4}:{}", h.port),
        };
        let mut req = format!("GET {path} HTTP/1.1\r\n");
        let has = |name: &str| h.http_headers.iter().any(|x| x.name.eq_ignore_ascii_case(name));
        if !has("host") {
            req.push_str(&format!("Host: {host}\r\n"));
        }
        if !has("user-agent") {
            req.push_str("User-Agent: pinion-probe\r\n");
        }
        if !has("accept") {
            req.push_str("Accept: */*\r\n");
        }
        for x in &h.http_headers {
            // Validation refused CR and LF in names and values.
            req.push_str(&format!("{}: {}\r\n", x.name, x.value));
        }
        req.push_str("Connection: close\r\n\r\n");
        sock(&stream).set_write_timeout(Some(left())).map_err(io)?;
        sock(&stream).set_read_timeout(Some(left())).map_err(io)?;
        stream.write_all(req.as_bytes()).map_err(io)?;
        stream.flush().map_err(io)?;
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while !got.contains(&b'\n') && got.len() < MAX_STATUS_LINE {
            sock(&stream).set_read_timeout(Some(left())).map_err(io)?;
            let n = match stream.read(&mut buf) {
                Ok(n) => n,
                // A TLS server that closes without close_notify after its answer.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !got.is_empty() => 0,
                Err(e) => return Err(io(e)),
            };
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let line = String::from_utf8_lossy(got.split(|b| *b == b'\n').next().unwrap_or_default()).trim().to_string();
        match status_of(&line) {
            Some(code) if (200..400).contains(&code) => Ok(()),
            Some(code) => Err(Failed::Error(format!("HTTP probe failed with statuscode: {code}"))),
            None => Err(Failed::Error(format!("GET {}: not an HTTP answer: {line:?}", self.url()))),
        }
    }
}

/// The code of an HTTP/1.x status line.
fn status_of(line: &str) -> Option<u16> {
    let mut parts = line.split_whitespace();
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// Most bytes of a failed exec probe's output kept for its message.
const MAX_OUTPUT: usize = 512;

/// Runs `command` in the container; exit status 0 is success. Past
/// `timeout` the command and everything it started are killed.
fn exec(rt: &dyn Runtime, id: &str, command: &[String], timeout: Duration) -> (ProbeResult, Option<String>) {
    let started = Instant::now();
    let process = match rt.exec_probe(id, command) {
        Ok(p) => p,
        Err(e) => return (ProbeResult::Failure, Some(e.to_string())),
    };
    let crate::runtime::ExecProcess { stdout, stderr, wait, cancel, .. } = process;
    // Drained as it comes: a command writing more than a pipe holds must not
    // block on it. The tail kept is what the message shows.
    let drain = |fd: std::os::fd::OwnedFd| {
        std::thread::spawn(move || {
            let mut f = std::fs::File::from(fd);
            let mut kept = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > MAX_OUTPUT {
                    kept.drain(..kept.len() - MAX_OUTPUT);
                }
            }
            kept
        })
    };
    let (out, err) = (drain(stdout), drain(stderr));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(wait());
    });
    let left = timeout.saturating_sub(started.elapsed());
    let ended = rx.recv_timeout(left);
    // On a timeout, this kills the command and its session at once.
    drop(cancel);
    let output = || {
        let mut o = out.join().unwrap_or_default();
        o.extend(err.join().unwrap_or_default());
        String::from_utf8_lossy(&o).trim().to_string()
    };
    match ended {
        Ok(Ok(0)) => (ProbeResult::Success, None),
        Ok(Ok(code)) => {
            let o = output();
            let tail = if o.is_empty() { String::new() } else { format!(": {o}") };
            (ProbeResult::Failure, Some(format!("command {command:?} exited with {code}{tail}")))
        }
        Ok(Err(e)) => (ProbeResult::Failure, Some(e.to_string())),
        Err(_) => (ProbeResult::Timeout, Some(format!("command {command:?} timed out after {timeout:?}"))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use specs::probe::{HttpHeader, TcpSocketAction};

    fn http_probe(port: u16, path: &str) -> Probe {
        Probe {
            http_get: Some(HttpGetAction {
                path: Some(path.into()),
                port,
                scheme: None,
                http_headers: vec![HttpHeader { name: "X-Probe".into(), value: "yes".into() }],
            }),
            ..Default::default()
        }
    }

    /// A one-shot server answering each connection with `status`; the
    /// requests it read come back on the channel.
    fn serve(status: &'static str, answers: usize) -> (u16, std::sync::mpsc::Receiver<String>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..answers {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 2048];
                let n = s.read(&mut buf).unwrap();
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
            }
        });
        (port, rx)
    }

    /// A runtime the network probes never call (their target is an address).
    fn runtime() -> Arc<dyn Runtime> {
        let dir = tempfile::tempdir().unwrap();
        let rt = crate::runtime::hollow::HollowRuntime::new(dir.path()).unwrap();
        // The folder outlives the test's runtime; it is a temp folder.
        std::mem::forget(dir);
        Arc::new(rt)
    }

    #[tokio::test]
    async fn http_status_decides_the_result() {
        for (status, expected) in [
            ("200 OK", ProbeResult::Success),
            ("302 Found", ProbeResult::Success),
            ("404 Not Found", ProbeResult::Failure),
            ("500 Internal Server Error", ProbeResult::Failure),
        ] {
            let (port, requests) = serve(status, 1);
            let (got, msg) = run(runtime(), "x".into(), http_probe(port, "/healthz"), ProbeTarget::host()).await;
            assert_eq!(got, expected, "{status}: {msg:?}");
            let req = requests.recv_timeout(Duration::from_secs(5)).unwrap();
            assert!(req.starts_with("GET /healthz HTTP/1.1\r\n"), "{req}");
            assert!(req.contains("\r\nX-Probe: yes\r\n"), "{req}");
        }
    }

    #[tokio::test]
    async fn tcp_to_a_closed_port_fails_and_to_an_open_one_succeeds() {
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let tcp = |port| Probe { tcp_socket: Some(TcpSocketAction { port }), ..Default::default() };
        let (r, msg) = run(runtime(), "x".into(), tcp(closed), ProbeTarget::host()).await;
        assert_eq!(r, ProbeResult::Failure);
        assert!(msg.unwrap().contains("refused"));
        let (r, _) = run(runtime(), "x".into(), tcp(open.local_addr().unwrap().port()), ProbeTarget::host()).await;
        assert_eq!(r, ProbeResult::Success);
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut p = http_probe(port, "/");
        p.timeout_seconds = Some(1);
        let t = std::time::Instant::now();
        let (r, _) = run(runtime(), "x".into(), p, ProbeTarget::host()).await;
        assert_eq!(r, ProbeResult::Timeout);
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        drop(l);
    }

    /// A loopback HTTPS server with a self-signed certificate, answering
    /// each connection with `status`; the requests it read come back.
    fn serve_tls(status: &'static str, answers: usize) -> (u16, std::sync::mpsc::Receiver<String>) {
        let cert = rcgen::generate_simple_self_signed(vec!["pod.invalid".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(pinion_wire::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        let config = Arc::new(config);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..answers {
                let (s, _) = l.accept().unwrap();
                let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut buf = [0u8; 2048];
                // A client that refuses the handshake ends here.
                let Ok(n) = tls.read(&mut buf) else { continue };
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = tls.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn https_probes_skip_verification_and_judge_the_status() {
        for (status, expected) in [("200 OK", ProbeResult::Success), ("503 Service Unavailable", ProbeResult::Failure)]
        {
            let (port, requests) = serve_tls(status, 1);
            let mut p = http_probe(port, "/healthz");
            p.http_get.as_mut().unwrap().scheme = Some(Scheme::Https);
            let (got, msg) = run(runtime(), "x".into(), p, ProbeTarget::host()).await;
            assert_eq!(got, expected, "{status}: {msg:?}");
            let req = requests.recv_timeout(Duration::from_secs(5)).unwrap();
            assert!(req.starts_with("GET /healthz HTTP/1.1\r\n"), "{req}");
            assert!(req.contains("\r\nX-Probe: yes\r\n"), "{req}");
        }
        // Plain HTTP to a TLS server is not an answer.
        let (port, _) = serve_tls("200 OK", 1);
        let mut p = http_probe(port, "/");
        p.timeout_seconds = Some(2);
        let (got, msg) = run(runtime(), "x".into(), p, ProbeTarget::host()).await;
        assert_ne!(got, ProbeResult::Success, "{msg:?}");
        // TLS to a plain HTTP server fails its handshake.
        let (port, _) = serve("200 OK", 1);
        let mut p = http_probe(port, "/");
        p.http_get.as_mut().unwrap().scheme = Some(Scheme::Https);
        let (got, msg) = run(runtime(), "x".into(), p, ProbeTarget::host()).await;
        assert_eq!(got, ProbeResult::Failure, "{msg:?}");
    }

    /// How the test's gRPC server answers a health check.
    #[derive(Clone, Copy)]
    enum Answer {
        /// A HealthCheckResponse with this status and grpc-status 0.
        Status(u8),
        /// A trailers-only answer with this grpc-status.
        Code(u32),
        /// Never.
        Hang,
        /// An HTTP/2 answer that is not gRPC's.
        Plain,
    }

    /// A real HTTP/2 (prior knowledge) server on loopback answering every
    /// call with `answer`, or with grpc-status 5 (as grpc-go's health
    /// server) for a service other than `known`; the services asked for come
    /// back on the channel.
    async fn serve_grpc(known: &'static str, answer: Answer) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use http_body_util::{BodyExt, StreamBody};
        use hyper::body::Frame;
        type Body = StreamBody<
            futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<bytes::Bytes>, std::convert::Infallible>>>,
        >;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let tx = tx.clone();
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        // The request is `0, len, 0x0a, len, service` (or empty).
                        let service = String::from_utf8_lossy(body.get(7..).unwrap_or_default()).into_owned();
                        let _ = tx.send(service.clone());
                        let grpc = |b: hyper::http::response::Builder| b.header("content-type", "application/grpc");
                        let reply = |b: hyper::http::response::Builder, frames: Vec<Frame<bytes::Bytes>>| {
                            b.body(StreamBody::new(futures_util::stream::iter(
                                frames.into_iter().map(Ok).collect::<Vec<_>>(),
                            )))
                        };
                        let answer = if service != known { Answer::Code(5) } else { answer };
                        assert_eq!(path, "/grpc.health.v1.Health/Check");
                        let resp: Result<hyper::Response<Body>, _> = match answer {
                            Answer::Status(v) => {
                                let mut trailers = hyper::HeaderMap::new();
                                trailers.insert("grpc-status", "0".parse().unwrap());
                                let data = bytes::Bytes::from(vec![0, 0, 0, 0, 2, 0x08, v]);
                                reply(
                                    grpc(hyper::Response::builder()),
                                    vec![Frame::data(data), Frame::trailers(trailers)],
                                )
                            }
                            Answer::Code(c) => reply(
                                grpc(hyper::Response::builder())
                                    .header("grpc-status", c.to_string())
                                    .header("grpc-message", "unknown service"),
                                vec![],
                            ),
                            Answer::Hang => std::future::pending().await,
                            Answer::Plain => reply(
                                hyper::Response::builder().header("content-type", "text/plain"),
                                vec![Frame::data(bytes::Bytes::from_static(b"ok"))],
                            ),
                        };
                        resp
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                        .await;
                });
            }
        });
        (port, rx)
    }

    fn grpc_probe(port: u16, service: Option<&str>) -> Probe {
        Probe {
            grpc: Some(specs::probe::GrpcAction { port, service: service.map(str::to_string) }),
            timeout_seconds: Some(1),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn grpc_health_checks_judge_the_servers_answer() {
        // (the server's service and answer, the probe's service, the result, words of its message)
        let cases: [(&str, Answer, Option<&str>, ProbeResult, &str); 6] = [
            ("", Answer::Status(1), None, ProbeResult::Success, ""),
            ("upf", Answer::Status(1), Some("upf"), ProbeResult::Success, ""),
            ("upf", Answer::Status(2), Some("upf"), ProbeResult::Failure, "responded with NOT_SERVING"),
            ("upf", Answer::Status(0), Some("upf"), ProbeResult::Failure, "responded with UNKNOWN"),
            ("upf", Answer::Status(1), Some("smf"), ProbeResult::Failure, "grpc-status 5"),
            ("", Answer::Code(12), None, ProbeResult::Failure, "does not implement the grpc health protocol"),
        ];
        for (known, answer, service, expected, words) in cases {
            let (port, mut asked) = serve_grpc(known, answer).await;
            let (got, msg) = run(runtime(), "x".into(), grpc_probe(port, service), ProbeTarget::host()).await;
            assert_eq!(got, expected, "{service:?}: {msg:?}");
            assert!(msg.as_deref().unwrap_or("").contains(words), "{service:?}: {msg:?}");
            assert_eq!(asked.recv().await.as_deref(), Some(service.unwrap_or("")), "the service sent");
        }
    }

    #[tokio::test]
    async fn grpc_probes_time_out_and_refuse_what_is_not_grpc() {
        let (port, _asked) = serve_grpc("", Answer::Hang).await;
        let t = std::time::Instant::now();
        let (got, msg) = run(runtime(), "x".into(), grpc_probe(port, None), ProbeTarget::host()).await;
        assert_eq!(got, ProbeResult::Timeout, "{msg:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // HTTP/2 but not gRPC.
        let (port, _asked) = serve_grpc("", Answer::Plain).await;
        let (got, msg) = run(runtime(), "x".into(), grpc_probe(port, None), ProbeTarget::host()).await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(msg.as_deref().unwrap_or("").contains("not a gRPC answer"), "{msg:?}");
        // An HTTP/1.1 server: the HTTP/2 preface gets no HTTP/2 answer.
        let (port, _) = serve("200 OK", 1);
        let (got, msg) = run(runtime(), "x".into(), grpc_probe(port, None), ProbeTarget::host()).await;
        assert_eq!(got, ProbeResult::Failure, "{msg:?}");
        // Nobody listening.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (got, msg) = run(runtime(), "x".into(), grpc_probe(closed, None), ProbeTarget::host()).await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(msg.unwrap().contains("refused"));
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_of("HTTP/1.1 204 No Content"), Some(204));
        assert_eq!(status_of("HTTP/1.0 301"), Some(301));
        assert_eq!(status_of("SSH-2.0-OpenSSH"), None);
        assert_eq!(status_of(""), None);
    }
}
