//! A Deployment at fleet size: the real `pinion server` in its own process,
//! `--nodes` hollow nodes (real nodelets, the hollow runtime: everything but
//! the processes) in this one, each joining with the server's token over
//! TLS, heartbeating and reporting as a node does. Then one Deployment of
//! `--replicas` single-numa-node replicas (one exclusive CPU and 256 MiB
//! each) is applied, and the time from the apply to every replica bound and
//! to every replica Running (as the nodes report it, seen on a watch opened
//! before the apply) and to the Deployment's status saying all ready is
//! printed, with the server's RSS.
//!
//! Usage: `bench_deploy [--nodes N] [--replicas R] [--pinion PATH]`
//! (defaults 1000, 1000, `target/release/pinion`).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nodelet::agent::AgentConfig;
use nodelet::daemon::{DaemonConfig, JoinConfig, RuntimeChoice};
use specs::{CpuSet, NodeSettings, PodPhase};

/// Nodes joined at once: the server's front door bounds new connections.
const JOIN_BATCH: usize = 100;
/// Every wait of this bench gives up after this.
const WAIT: Duration = Duration::from_secs(900);

/// The store's commit latency histogram (docs/metrics.md).
const COMMIT_METRIC: &str = "pinion_store_commit_duration_seconds";

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> anyhow::Result<()> {
    let (mut nodes, mut replicas) = (1000usize, 1000usize);
    let mut pinion = PathBuf::from("target/release/pinion");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--nodes" => nodes = value()?.parse()?,
            "--replicas" => replicas = value()?.parse()?,
            "--pinion" => pinion = PathBuf::from(value()?),
            other => bail!("unknown argument {other}"),
        }
    }
    // The nodes' own log, when a figure needs explaining (`BENCH_NODES_LOG=FILE`).
    if let Some(f) = std::env::var_os("BENCH_NODES_LOG") {
        let file = std::fs::File::create(f)?;
        tracing_subscriber::fmt().with_writer(std::sync::Mutex::new(file)).with_ansi(false).init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(pinion, nodes, replicas))
}

async fn run(pinion: PathBuf, nodes: usize, replicas: usize) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("srv");
    // Its plain-HTTP /metrics: the store's commits, counted and timed.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut child = Command::new(&pinion)
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        // A pod range for each of more nodes than the default /16 holds (256).
        .args(["--pod-cidr", "10.0.0.0/8"])
        .arg("--local-listen")
        .arg(metrics.to_string())
        .stdout(Stdio::piped())
        // Kept for a look when a figure surprises (`BENCH_SERVER_LOG=FILE`).
        .stderr(match std::env::var_os("BENCH_SERVER_LOG") {
            Some(f) => Stdio::from(std::fs::File::create(f)?),
            None => Stdio::null(),
        })
        .spawn()
        .with_context(|| format!("starting {}", pinion.display()))?;
    let stdout = child.stdout.take().context("server stdout")?;
    let server = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("listening on") => {
                let addr = l.trim_start_matches("listening on").split_whitespace().next().unwrap_or_default();
                break format!("https://{addr}");
            }
            Some(Ok(_)) => continue,
            other => bail!("the server did not start: {other:?}"),
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(data.join("join-token")).context("the join token")?.trim().to_string();
    let creds = orchestrator::tls::Credentials::load(&data.join("admin.conf"))?;
    let client = pinion_wire::Client::new(&creds)?;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let topology = specs::topology::synthetic::parse("pack:2 numa:2 core:8 pu:1")?;
    let t = Instant::now();
    let mut daemons = Vec::new();
    for i in 0..nodes {
        let name = format!("hollow-{i:04}");
        let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0")?, ..Default::default() };
        let config = DaemonConfig {
            ready: None,
            local_listen: None,
            net_view: None,
            agent: AgentConfig::new(name.clone(), tmp.path().join(&name), topology.clone(), settings),
            runtime: RuntimeChoice::Hollow,
            manifests: None,
            join: Some(JoinConfig {
                servers: vec![url.clone()],
                token: Some(token.clone()),
                ca: None,
                labels: BTreeMap::new(),
                endpoint_listen: "127.0.0.1:0".into(),
                advertise_address: Some("127.0.0.1".parse()?),
                node_address: Some("127.0.0.1".parse()?),
                liveness: Default::default(),
                endpoint_max_connections: 4,
            }),
        };
        let rx = stopped.clone();
        daemons.push(tokio::spawn(async move { nodelet::daemon::run(config, rx).await }));
        if (i + 1) % JOIN_BATCH == 0 || i + 1 == nodes {
            wait_for(&format!("{} nodes Ready", i + 1), || async {
                let listed = client.list_nodes(None).await.ok()?;
                let ready =
                    listed.items.iter().filter(|n| n.status.condition == specs::api::NodeCondition::Ready).count();
                (ready > i).then_some(())
            })
            .await?;
        }
    }
    println!(
        "{nodes} hollow nodes joined and Ready in {:.1}s; server RSS {:.1} MiB, this process (the nodes) {:.1} MiB",
        t.elapsed().as_secs_f64(),
        e2e::process::memory_mib(server.0.id(), "VmRSS:"),
        e2e::process::memory_mib(std::process::id(), "VmRSS:")
    );

    let from = client.list_pods(None).await?.resource_version;
    let mut watch = client.watch_pods(None, None, Some(from)).await?;
    let counter = tokio::spawn(async move {
        let (mut bound, mut running) = (HashSet::new(), HashSet::new());
        let (mut all_bound, mut all_running) = (None, None);
        let mut nodes_used = HashSet::new();
        let mut said = Instant::now();
        while all_running.is_none() {
            if said.elapsed() > Duration::from_secs(5) {
                said = Instant::now();
                println!("  ... {} bound, {} Running", bound.len(), running.len());
            }
            let Some((_, p)) = watch.next().await? else { bail!("the watch ended") };
            if let Some(node) = &p.spec.node_name {
                nodes_used.insert(node.clone());
                bound.insert(p.metadata.name.clone());
            }
            if p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running) {
                running.insert(p.metadata.name);
            }
            if bound.len() >= replicas && all_bound.is_none() {
                all_bound = Some(Instant::now());
            }
            if running.len() >= replicas {
                all_running = Some(Instant::now());
            }
        }
        Ok::<_, anyhow::Error>((all_bound, all_running, nodes_used.len()))
    });
    let manifest = deployment(replicas);
    let commits_before = e2e::scrape::scrape(metrics)?;
    let start = Instant::now();
    let (code, _) = client.apply_deployment(bytes::Bytes::from(manifest)).await?;
    let applied = start.elapsed();
    if !(200..300).contains(&code) {
        bail!("apply: {code}");
    }
    let (bound, running, used) = tokio::time::timeout(WAIT, counter).await.context("the replicas timed out")???;
    let since = |t: Option<Instant>| t.map(|t| t.duration_since(start).as_secs_f64()).unwrap_or(f64::NAN);
    println!(
        "apply of a {replicas}-replica Deployment answered in {:.0} ms; all bound after {:.2}s, all Running after {:.2}s ({used} nodes used)",
        applied.as_secs_f64() * 1000.0,
        since(bound),
        since(running),
    );
    let (count, sum) = e2e::scrape::count_and_sum(&e2e::scrape::scrape(metrics)?, COMMIT_METRIC);
    let (count0, sum0) = e2e::scrape::count_and_sum(&commits_before, COMMIT_METRIC);
    let commits = (count - count0).max(1.0);
    println!("store commits meanwhile: {commits:.0}, mean {:.1} ms each", (sum - sum0) * 1000.0 / commits);
    wait_for("the Deployment's status all ready", || async {
        let d = client.get_deployment("fleet").await.ok()?;
        (d.status?.ready_replicas as usize >= replicas).then_some(())
    })
    .await?;
    println!(
        "status readyReplicas = {replicas} after {:.2}s; server RSS {:.1} MiB (peak {:.1} MiB)",
        start.elapsed().as_secs_f64(),
        e2e::process::memory_mib(server.0.id(), "VmRSS:"),
        e2e::process::memory_mib(server.0.id(), "VmHWM:")
    );
    let _ = stop.send(true);
    for d in daemons {
        let _ = tokio::time::timeout(Duration::from_secs(10), d).await;
    }
    Ok(())
}

/// Polls `check` every 200 ms until it gives a value, for at most `WAIT`.
async fn wait_for<T, F, Fut>(what: &str, check: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn deployment(replicas: usize) -> String {
    serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Deployment",
        "metadata": {"name": "fleet"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "fleet"}},
            "template": {
                "metadata": {"labels": {"app": "fleet"}},
                "spec": {
                    "topology": {"policy": "single-numa-node"},
                    "containers": [{
                        "name": "upf",
                        "rootfs": "host",
                        "command": ["sleep", "inf"],
                        "resources": {"limits": {"cpu": "1", "memory": "256Mi"}},
                    }],
                },
            },
        },
    })
    .to_string()
}
