//! The front door's attacks (issue 25) against a real `pinion server` (and,
//! for the node endpoint, a real `pinion agent` on the hollow runtime), each
//! on a fresh server, with the figures `RELIABILITY.md` keeps: seconds the
//! admin waited, the server's RSS, connections still held.
//!
//! Usage: `bench_attack [--pinion PATH] [ATTACK...]`, attacks: nested, idle,
//! bodies, slow-local, endpoint, joins (default: all). Build the binary with
//! `cargo build --release -p cli` and pass `--pinion target/release/pinion`.
//! `BENCH_ATTACK_WAIT=SECONDS` caps how long an idle connection is watched
//! (for a server that never lets it go).
//! Traffic goes to 127.0.0.1 only.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use e2e::process::Proc;
use hyper::Method;
use orchestrator::tls::Credentials;
use pinion_wire::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Server {
    proc: Proc,
    url: String,
    local: std::net::SocketAddr,
    data: PathBuf,
    creds: Credentials,
    admin: Client,
    log: PathBuf,
}

impl Server {
    fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    fn anonymous(&self) -> anyhow::Result<Client> {
        Ok(Client::anonymous(std::slice::from_ref(&self.url), &self.creds.ca_cert)?)
    }
}

fn start(pinion: &Path, dir: &Path) -> anyhow::Result<Server> {
    let data = dir.join("srv");
    let local = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let log = dir.join("server.log");
    let mut child = Command::new(pinion)
        .args(["server", "--listen", "127.0.0.1:0", "--heartbeat-grace", "3600", "--data-dir"])
        .arg(&data)
        .arg("--local-listen")
        .arg(local.to_string())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", pinion.display()))?;
    let stdout = child.stdout.take().context("server stdout")?;
    let proc = Proc(child);
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("listening on") => {
                break l.split_once('(').and_then(|(_, u)| u.strip_suffix(')')).context("no URL")?.to_string()
            }
            Some(Ok(_)) => continue,
            other => bail!("the server did not start: {other:?}"),
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let creds = Credentials::load(&data.join("admin.conf"))?;
    let admin = Client::new(&creds)?;
    Ok(Server { proc, url, local, data, creds, admin, log })
}

/// The admin's `get nodes` every 100 ms until stopped: (calls, failures, slowest).
struct Prober {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64, Duration)>,
}

impl Prober {
    fn start(admin: Client) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut calls, mut failed, mut slowest) = (0, 0, Duration::ZERO);
            while !flag.load(Ordering::SeqCst) {
                let t = Instant::now();
                let r = tokio::time::timeout(Duration::from_secs(30), admin.list_nodes(None)).await;
                slowest = slowest.max(t.elapsed());
                calls += 1;
                if !matches!(r, Ok(Ok(_))) {
                    failed += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (calls, failed, slowest)
        });
        Prober { stop, task }
    }

    async fn finish(self) -> anyhow::Result<String> {
        self.stop.store(true, Ordering::SeqCst);
        let (calls, failed, slowest) = self.task.await?;
        Ok(format!("admin get nodes: {calls} calls, {failed} failed, slowest {:.3} s", slowest.as_secs_f64()))
    }
}

/// A TLS connection speaking HTTP/1.1 to `addr`, trusting `ca`, with no identity.
async fn anonymous_tls(addr: String, ca: String) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pinion_wire::tls::pem_cert(&ca, "ca")?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(pinion_wire::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    // A server that stopped accepting leaves a connect in its backlog forever.
    tokio::time::timeout(Duration::from_secs(30), async {
        let tcp = TcpStream::connect(addr.trim_start_matches("https://")).await?;
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?)
    })
    .await
    .context("connect and handshake within 30 s")?
}

/// Whether the peer has closed `s` (a read answers at once with EOF or an error).
async fn closed<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut buf = [0u8; 4096];
    matches!(tokio::time::timeout(Duration::from_millis(5), s.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
}

/// How many of `conns` the peer has not closed.
async fn still_open<S: tokio::io::AsyncRead + Unpin>(conns: &mut [S]) -> usize {
    let mut open = 0;
    for c in conns {
        if !closed(c).await {
            open += 1;
        }
    }
    open
}

async fn nested(s: &Server) -> anyhow::Result<()> {
    let body = Bytes::from(format!("{{\"k\": {}{}}}", "[".repeat(160_000), "]".repeat(160_000)));
    let probe = Prober::start(s.admin.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let anonymous = s.anonymous()?;
    for (who, client, content_type) in [
        ("anonymous", &anonymous, "application/yaml"),
        ("admin", &s.admin, "application/yaml"),
        ("admin", &s.admin, "application/json"),
    ] {
        for path in ["/api/v1/pods", "/api/v1/jobs"] {
            let t = Instant::now();
            let r = tokio::time::timeout(
                Duration::from_secs(300),
                client.request(Method::POST, path, Some((content_type, body.clone()))),
            )
            .await;
            let answer = match r {
                Ok(Ok((code, _))) => code.to_string(),
                Ok(Err(e)) => format!("error {e}"),
                Err(_) => "no answer in 300 s".into(),
            };
            let took = t.elapsed();
            println!(
                "nested 160,000 deep, {who} {content_type} POST {path}: {answer} after {:.3} s",
                took.as_secs_f64()
            );
            if took > Duration::from_secs(30) {
                println!("nested: the rest skipped (each would take as long)");
                println!("nested: {}", probe.finish().await?);
                return Ok(());
            }
        }
    }
    println!("nested: {}", probe.finish().await?);
    Ok(())
}

async fn idle(s: &Server) -> anyhow::Result<()> {
    const N: usize = 4100;
    let t = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::with_capacity(N);
    for _ in 0..N {
        let (gate, url, ca) = (gate.clone(), s.url.clone(), s.creds.ca_cert.clone());
        tasks.push(tokio::spawn(async move {
            let _p = gate.acquire().await;
            anonymous_tls(url, ca).await
        }));
    }
    let mut held = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await? {
            Ok(c) => held.push(c),
            Err(_) => failed += 1,
        }
    }
    println!(
        "idle: {} anonymous TLS connections made in {:.1} s ({failed} refused or evicted during the handshake)",
        held.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), s.admin.list_nodes(None)).await;
    println!(
        "idle: the admin's get nodes beside them: {} after {:.3} s",
        if matches!(r, Ok(Ok(_))) { "answered" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    let open = still_open(&mut held).await;
    println!("idle: {open} of {} still open at once", held.len());
    tokio::time::sleep(Duration::from_secs(15)).await;
    let open = still_open(&mut held).await;
    println!(
        "idle: {open} of {} still open 15 s later; server RSS {:.1} MiB",
        held.len(),
        e2e::process::memory_mib(s.pid(), "VmRSS:")
    );
    drop(held);
    // One alone, timed to its close.
    let mut one = anonymous_tls(s.url.clone(), s.creds.ca_cert.clone()).await?;
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(longest_wait(), one.read(&mut buf)).await;
    println!(
        "idle: one anonymous connection that sends nothing: {} after {:.1} s",
        if r.is_ok() { "closed by the server" } else { "STILL OPEN" },
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How long an attack waits for the server to let go of a connection
/// (`BENCH_ATTACK_WAIT` seconds, default 700: longer than any bound).
fn longest_wait() -> Duration {
    let secs = std::env::var("BENCH_ATTACK_WAIT").ok().and_then(|v| v.parse().ok()).unwrap_or(700);
    Duration::from_secs(secs)
}

async fn bodies(s: &Server) -> anyhow::Result<()> {
    const N: usize = 1500;
    const SIZE: usize = 1 << 20;
    let before = e2e::process::memory_mib(s.pid(), "VmRSS:");
    let probe = Prober::start(s.admin.clone());
    let body = Arc::new(vec![b'a'; SIZE]);
    let answered = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(N);
    for _ in 0..N {
        let (addr, ca, body, answered) = (s.url.clone(), s.creds.ca_cert.clone(), body.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = anonymous_tls(addr, ca).await.ok()?;
            let head = format!(
                "POST /api/v1/pods HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/yaml\r\ncontent-length: {SIZE}\r\n\r\n"
            );
            c.write_all(head.as_bytes()).await.ok()?;
            let _ = tokio::time::timeout(Duration::from_secs(60), c.write_all(&body)).await;
            let mut reply = [0u8; 64];
            if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(60), c.read(&mut reply)).await {
                if reply[..n].starts_with(b"HTTP/1.1 401") {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            }
            Some(())
        }));
    }
    let mut peak = 0f64;
    while tasks.iter().any(|t| !t.is_finished()) {
        peak = peak.max(e2e::process::memory_mib(s.pid(), "VmRSS:"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "bodies: {N} anonymous POST /api/v1/pods of 1 MiB in {:.1} s, {} answered 401; server RSS {before:.1} -> peak {peak:.1} MiB (VmHWM {:.1})",
        t.elapsed().as_secs_f64(),
        answered.load(Ordering::SeqCst),
        e2e::process::memory_mib(s.pid(), "VmHWM:")
    );
    println!("bodies: {}", probe.finish().await?);
    Ok(())
}

async fn slow_local(s: &Server) -> anyhow::Result<()> {
    let blob = "x".repeat(200_000);
    for i in 0..300 {
        let pod = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: big{i}, annotations: {{blob: {blob}}}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n"
        );
        s.admin.create_pod(Bytes::from(pod)).await?;
    }
    let before = e2e::process::memory_mib(s.pid(), "VmRSS:");
    let mut conns = Vec::new();
    for _ in 0..40 {
        let mut c = TcpStream::connect(s.local).await?;
        c.write_all(b"GET /api/v1/pods HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await?;
        conns.push(c);
    }
    let t = Instant::now();
    let mut peak = 0f64;
    while t.elapsed() < Duration::from_secs(45) {
        peak = peak.max(e2e::process::memory_mib(s.pid(), "VmRSS:"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Whatever the kernel buffered is read first; a closed connection then ends.
    let mut open = 0;
    for c in &mut conns {
        let mut buf = vec![0u8; 1 << 20];
        let ended = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        if ended.is_err() {
            open += 1;
        }
    }
    println!(
        "slow-local: 40 readers of a 60 MB pod list (300 pods of 200 KB) that never read: server RSS {before:.1} -> peak {peak:.1} MiB over 45 s; {open} of 40 still open after"
    );
    Ok(())
}

async fn endpoint(s: &Server, pinion: &Path, dir: &Path) -> anyhow::Result<()> {
    let token = s.data.join("join-token");
    let node = dir.join("node");
    let _agent = Proc(
        Command::new(pinion)
            .args(["agent", "--server", &s.url, "--token-file"])
            .arg(&token)
            .args(["--runtime", "hollow", "--synthetic", "pack:1 numa:1 core:4 pu:1", "--node-name", "n1"])
            .args(["--endpoint-listen", "127.0.0.1:0", "--data-dir"])
            .arg(&node)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let endpoint = loop {
        if let Ok(n) = s.admin.get_node("n1").await {
            if let Some(e) = n.spec.endpoint {
                break e;
            }
        }
        if Instant::now() > deadline {
            bail!("the node did not register");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pod = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: talker}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, \"3600\"]\n";
    s.admin.create_pod(Bytes::from(pod)).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.admin.get_pod("talker").await?.status.map(|st| st.phase) != Some(specs::status::PodPhase::Running) {
        if Instant::now() > deadline {
            bail!("the pod did not run");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut raw = Vec::new();
    for _ in 0..1500 {
        raw.push(TcpStream::connect(&endpoint).await?);
    }
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), s.admin.get("/api/v1/pods/talker/log?container=main")).await;
    let answer = match r {
        Ok(Ok(resp)) => resp.status().as_u16().to_string(),
        Ok(Err(e)) => format!("error {e}"),
        Err(_) => "no answer in 60 s".into(),
    };
    let open = still_open(&mut raw).await;
    println!(
        "endpoint: the admin's logs through the server beside 1,500 raw connections to the node endpoint: {answer} after {:.3} s; {open} of 1,500 still open",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn joins(s: &Server) -> anyhow::Result<()> {
    let anonymous = s.anonymous()?;
    let t = Instant::now();
    let (mut refused, mut limited, mut other) = (0, 0, 0);
    for i in 0..5000 {
        match anonymous.join("0000.guess", &format!("g{i}"), None).await {
            Err(pinion_wire::ClientError::Api(e)) if e.code == 401 => refused += 1,
            Err(pinion_wire::ClientError::Api(e)) if e.code == 429 => limited += 1,
            _ => other += 1,
        }
    }
    let took = t.elapsed().as_secs_f64();
    let logged = std::fs::read_to_string(&s.log)?.lines().filter(|l| l.contains("join")).count();
    println!(
        "joins: 5,000 wrong tokens in {took:.1} s ({:.0}/s): {refused} looked at (401), {limited} limited (429), {other} other; {logged} log lines about joins",
        5000.0 / took
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut pinion = None;
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pinion" => pinion = Some(PathBuf::from(args.next().context("--pinion needs a path")?)),
            name => only.push(name.to_string()),
        }
    }
    let pinion = match pinion {
        Some(p) => p,
        None => e2e::binary::pinion()?,
    };
    let all = ["nested", "idle", "bodies", "slow-local", "endpoint", "joins"];
    if let Some(bad) = only.iter().find(|n| !all.contains(&n.as_str())) {
        bail!("unknown attack {bad} (one of {all:?})");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        for name in all {
            if !only.is_empty() && !only.iter().any(|n| n == name) {
                continue;
            }
            let tmp = tempfile::tempdir()?;
            let s = start(&pinion, tmp.path())?;
            let r = match name {
                "nested" => nested(&s).await,
                "idle" => idle(&s).await,
                "bodies" => bodies(&s).await,
                "slow-local" => slow_local(&s).await,
                "endpoint" => endpoint(&s, &pinion, tmp.path()).await,
                _ => joins(&s).await,
            };
            if let Err(e) = r {
                println!("{name}: failed: {e:#}");
            }
        }
        Ok(())
    })
}
