//! Runs one probe (the executor's side of `super::probes`) and says how it
//! went. Nothing here runs on a pod's CPUs:
//!
//! - TCP and HTTP probes connect from a fresh thread of the agent, which runs
//!   on the node's reserved CPUs like the rest of the agent
//!   (`crate::affinity`). A pod with its own address (CNI) is reached at that
//!   address through the pod bridge; a `hostNetwork` pod at 127.0.0.1; a pod
//!   with `lo` only from inside its network namespace: the thread joins the
//!   container's (`setns`) and ends with the probe, so no other work runs in it.
//! - Exec probes go through `Runtime::exec`, the path `pinion exec` takes; its
//!   helper waits on the reserved CPUs, the command itself runs in the
//!   container's cgroup (see `ProbeTarget` and the README's caveat).
//!
//! HTTP is a hand-written HTTP/1.1 GET on a blocking socket, so the same
//! code runs in a joined namespace; HTTPS and gRPC are not run yet: the
//! result says so (see `unsupported`).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use specs::probe::{HttpGetAction, Probe, ProbeAction, ProbeResult, Scheme};

use crate::runtime::{ContainerState, Runtime};

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

/// Why a probe kind is not run by this node, or `None` when it is.
pub(crate) fn unsupported(probe: &Probe) -> Option<&'static str> {
    match probe.action()? {
        ProbeAction::Grpc(_) => Some("grpc probes are not supported by this node yet"),
        ProbeAction::HttpGet(h) if h.scheme == Some(Scheme::Https) => {
            Some("httpGet probes with scheme HTTPS are not supported by this node yet")
        }
        _ => None,
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
    if let Some(why) = unsupported(probe) {
        return (ProbeResult::Failure, Some(why.into()));
    }
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
/// not followed, a 3xx is success).
fn http(ip: IpAddr, h: &HttpGetAction, timeout: Duration) -> Result<(), Failed> {
    let deadline = Instant::now() + timeout;
    let addr = SocketAddr::new(ip, h.port);
    let mut stream = tcp(addr, timeout)?;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let io = |e: std::io::Error| {
        if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) {
            Failed::Timeout(format!("GET http://{addr}: timed out after {timeout:?}"))
        } else {
            Failed::Error(format!("GET http://{addr}: {e}"))
        }
    };
    let path = h.path.as_deref().unwrap_or("/");
    let host = match ip {
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
    stream.set_write_timeout(Some(left())).map_err(io)?;
    stream.write_all(req.as_bytes()).map_err(io)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.contains(&b'\n') && got.len() < MAX_STATUS_LINE {
        stream.set_read_timeout(Some(left())).map_err(io)?;
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(got.split(|b| *b == b'\n').next().unwrap_or_default()).trim().to_string();
    match status_of(&line) {
        Some(code) if (200..400).contains(&code) => Ok(()),
        Some(code) => Err(Failed::Error(format!("HTTP probe failed with statuscode: {code}"))),
        None => Err(Failed::Error(format!("GET http://{addr}{path}: not an HTTP answer: {line:?}"))),
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
    let crate::runtime::ExecProcess { stdout, stderr, wait, cancel } = process;
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

    #[tokio::test]
    async fn grpc_and_https_say_they_are_not_supported() {
        let grpc = Probe { grpc: Some(specs::probe::GrpcAction { port: 1, service: None }), ..Default::default() };
        let (r, msg) = run(runtime(), "x".into(), grpc, ProbeTarget::host()).await;
        assert_eq!(r, ProbeResult::Failure);
        assert!(msg.unwrap().contains("not supported"));
        let mut https = http_probe(1, "/");
        https.http_get.as_mut().unwrap().scheme = Some(Scheme::Https);
        assert!(unsupported(&https).is_some());
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_of("HTTP/1.1 204 No Content"), Some(204));
        assert_eq!(status_of("HTTP/1.0 301"), Some(301));
        assert_eq!(status_of("SSH-2.0-OpenSSH"), None);
        assert_eq!(status_of(""), None);
    }
}
