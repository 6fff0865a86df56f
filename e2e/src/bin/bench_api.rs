//! Scheduling through the API, with the real `pinion server` in its own process:
//! registers `--nodes` hollow nodes (synthetic machines of 2 to 8 NUMA nodes,
//! CPU 0 reserved), creates `--pods` pods over `--connections` HTTPS
//! connections (each reply after the store's flush), and waits until the server
//! has bound every pod. Prints the create rate, the bound rate (first create to
//! last binding), and the server's RSS with all of it in memory.
//!
//! Usage: `bench_api [--nodes N] [--pods P] [--connections C] [--store-cache-mib M] [--etcd MEMBERS] [--pinion PATH]`
//! (defaults 5000, 50000, 64, sled, `target/release/pinion`). `--etcd 3`
//! starts a three-member etcd on this host (loopback, a data dir each) and
//! runs the server on it.
//!
//! Gangs: `--job-size K --jobs J` creates J jobs of K members each (one
//! exclusive CPU and 1 GiB per member, `gang.placement: pack`) instead of pods,
//! and waits until every member is bound; prints gangs/s and members/s (first
//! create to the last member's binding), the nodes per gang, and the RSS.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

// A few shapes shared by many nodes, as a real fleet has (NUMA nodes x cores).
const SHAPES: [&str; 6] = [
    "pack:2 numa:1 core:16 pu:2",
    "pack:2 numa:1 core:32 pu:2",
    "pack:2 numa:2 core:8 pu:2",
    "pack:2 numa:2 core:16 pu:2",
    "pack:2 numa:4 core:8 pu:2",
    "pack:2 numa:4 core:12 pu:2",
];

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small deterministic generator (xorshift), so runs compare.
struct Rng(u64);

impl Rng {
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo + 1)
    }
}

fn main() -> anyhow::Result<()> {
    let (mut nodes, mut pods, mut conns) = (5000usize, 50_000usize, 64usize);
    let mut pinion = PathBuf::from("target/release/pinion");
    let mut cache_mib: Option<String> = None;
    let mut etcd_members = 0usize;
    let (mut job_size, mut jobs) = (0usize, 0usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--nodes" => nodes = value()?.parse()?,
            "--pods" => pods = value()?.parse()?,
            "--connections" => conns = value()?.parse::<usize>()?.max(1),
            "--pinion" => pinion = PathBuf::from(value()?),
            "--store-cache-mib" => cache_mib = Some(value()?),
            "--etcd" => etcd_members = value()?.parse()?,
            "--job-size" => job_size = value()?.parse()?,
            "--jobs" => jobs = value()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    let gangs = match (job_size, jobs) {
        (0, 0) => None,
        (k, j) if k > 0 && j > 0 => Some((k, j)),
        _ => bail!("--job-size and --jobs go together, both above 0"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(pinion, nodes, pods, conns, cache_mib, etcd_members, gangs))
}

/// The store's commit latency histogram (docs/metrics.md).
const COMMIT_METRIC: &str = "pinion_store_commit_duration_seconds";

async fn run(
    pinion: PathBuf,
    nodes: usize,
    pods: usize,
    conns: usize,
    cache: Option<String>,
    etcd_members: usize,
    gangs: Option<(usize, usize)>,
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("srv");
    let mut cmd = Command::new(&pinion);
    cmd.args(["server", "--listen", "127.0.0.1:0", "--heartbeat-grace", "3600", "--data-dir"]).arg(&data);
    // A pod range for each of more nodes than the default /16 holds (256).
    cmd.args(["--pod-cidr", "10.0.0.0/8"]);
    // Its plain-HTTP /metrics: the store's commits, counted and timed.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    cmd.arg("--local-listen").arg(metrics.to_string());
    if let Some(mib) = cache {
        cmd.args(["--store-cache-mib", &mib]);
    }
    let etcd = match etcd_members {
        0 => None,
        n => Some(orchestrator::testing::etcd::EtcdCluster::start(n).await.map_err(anyhow::Error::msg)?),
    };
    if let Some(cluster) = &etcd {
        use orchestrator::testing::etcd::{MAX_REQUEST_BYTES, MAX_TXN_OPS};
        cmd.args(["--etcd", &cluster.endpoints().join(",")]);
        match std::env::var("BENCH_ETCD_DEFAULT_LIMITS") {
            Ok(_) => println!("etcd limits: the members' raised ones unused (128 ops, 1.5 MiB per commit)"),
            Err(_) => {
                cmd.args(["--etcd-max-txn-ops", &MAX_TXN_OPS.to_string()]);
                cmd.args(["--etcd-max-request-bytes", &MAX_REQUEST_BYTES.to_string()]);
            }
        }
        let depth = std::env::var("BENCH_ETCD_PIPELINE_DEPTH").ok();
        if let Some(depth) = &depth {
            cmd.args(["--etcd-pipeline-depth", depth]);
        }
        println!(
            "store: etcd, {etcd_members} members on this host, pipeline depth {}",
            depth.as_deref().unwrap_or("1 (default)")
        );
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", pinion.display()))?;
    let stdout = child.stdout.take().context("server stdout")?;
    let server = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("listening on") => break,
            Some(Ok(_)) => continue,
            other => bail!("the server did not start: {other:?}"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let creds = orchestrator_creds(&data.join("admin.conf"))?;
    let client = pinion_wire::Client::new(&creds)?;

    let t = Instant::now();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let bodies: Vec<String> =
        (0..nodes).map(|i| node_json(i, SHAPES[rng.range(0, 5) as usize])).collect::<Result<_, _>>()?;
    parallel(&creds, conns, bodies, "/api/v1/nodes").await?;
    let pid = server.0.id();
    println!(
        "registered {nodes} nodes in {:.1}s; server RSS {:.1} MiB",
        t.elapsed().as_secs_f64(),
        e2e::process::memory_mib(pid, "VmRSS:")
    );

    if let Some((size, jobs)) = gangs {
        return run_gangs(&creds, &client, pid, conns, nodes, size, jobs).await;
    }
    let bodies: Vec<String> = (0..pods).map(|i| pod_json(i, &mut rng)).collect();
    let commits_before = e2e::scrape::scrape(metrics)?;
    // Bound = the server wrote the binding (spec.nodeName), seen on a watch
    // opened before the first create (polling full lists would itself cost the
    // server memory and time).
    let from = client.list_pods(None).await?.resource_version;
    let mut watch = client.watch_pods(None, None, Some(from)).await?;
    let counter = tokio::spawn(async move {
        let mut bound = std::collections::HashSet::new();
        let mut unschedulable = std::collections::HashSet::new();
        while bound.len() + unschedulable.len() < pods {
            match watch.next().await? {
                Some((_, p)) if p.spec.node_name.is_some() => {
                    unschedulable.remove(&p.metadata.name);
                    bound.insert(p.metadata.name);
                }
                Some((_, p)) if p.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some("Unschedulable")) => {
                    unschedulable.insert(p.metadata.name);
                }
                Some(_) => {}
                None => bail!("the watch ended"),
            }
        }
        Ok::<_, anyhow::Error>((bound.len(), unschedulable.len()))
    });
    let start = Instant::now();
    parallel(&creds, conns, bodies, "/api/v1/pods").await?;
    let created = start.elapsed();
    println!(
        "created {pods} pods over {conns} connections in {:.2}s = {:.0} pods/s (durable before each reply); server RSS {:.1} MiB",
        created.as_secs_f64(),
        pods as f64 / created.as_secs_f64(),
        e2e::process::memory_mib(pid, "VmRSS:")
    );
    let (bound, pending) =
        tokio::time::timeout(Duration::from_secs(600), counter).await.context("binding timed out")???;
    let all = start.elapsed();
    println!(
        "bound {bound} pods ({pending} left unschedulable) {:.2}s after the first create = {:.0} pods/s end to end",
        all.as_secs_f64(),
        bound as f64 / all.as_secs_f64()
    );
    let (count, sum) = e2e::scrape::count_and_sum(&e2e::scrape::scrape(metrics)?, COMMIT_METRIC);
    let (count0, sum0) = e2e::scrape::count_and_sum(&commits_before, COMMIT_METRIC);
    let commits = (count - count0).max(1.0);
    println!(
        "store commits: {commits:.0} ({:.1} per second), mean {:.1} ms each, {:.1} pod writes (creates and bindings) per commit",
        commits / all.as_secs_f64(),
        (sum - sum0) * 1000.0 / commits,
        (pods + bound) as f64 / commits
    );
    println!(
        "server RSS with {nodes} nodes and {pods} pods: {:.1} MiB (peak {:.1} MiB)",
        e2e::process::memory_mib(pid, "VmRSS:"),
        e2e::process::memory_mib(pid, "VmHWM:")
    );
    Ok(())
}

/// Creates `jobs` jobs of `size` members and waits until every member is
/// bound, counted on a watch opened before the first create.
async fn run_gangs(
    creds: &orchestrator::tls::Credentials,
    client: &pinion_wire::Client,
    pid: u32,
    conns: usize,
    nodes: usize,
    size: usize,
    jobs: usize,
) -> anyhow::Result<()> {
    let members = size * jobs;
    let bodies: Vec<String> = (0..jobs).map(|i| job_json(i, size)).collect();
    let from = client.list_pods(None).await?.resource_version;
    let mut watch = client.watch_pods(None, None, Some(from)).await?;
    let counter = tokio::spawn(async move {
        // Per job: the nodes its bound members are on.
        let mut bound: std::collections::HashMap<String, std::collections::HashMap<String, String>> =
            std::collections::HashMap::new();
        let (mut total, mut complete) = (0usize, 0usize);
        // Members bound before their whole gang was placed: their
        // PINION_NODES lacks the node of a rank placed later.
        let mut in_pieces = std::collections::HashSet::new();
        while complete < jobs {
            match watch.next().await? {
                Some((_, p)) => {
                    let (Some(node), Some(job)) = (&p.spec.node_name, p.metadata.labels.get(specs::job::JOB_LABEL))
                    else {
                        continue;
                    };
                    let nodes_env = p
                        .spec
                        .containers
                        .first()
                        .and_then(|c| c.env.iter().find(|e| e.name == "PINION_NODES").map(|e| e.value.clone()));
                    if nodes_env.is_none_or(|v| v.split(',').any(str::is_empty)) {
                        in_pieces.insert(job.clone());
                    }
                    let held = bound.entry(job.clone()).or_default();
                    if held.insert(p.metadata.name.clone(), node.clone()).is_none() {
                        total += 1;
                        if held.len() == size {
                            complete += 1;
                        }
                    }
                }
                None => bail!("the watch ended"),
            }
        }
        let spans: usize =
            bound.values().map(|held| held.values().collect::<std::collections::HashSet<_>>().len()).sum();
        Ok::<_, anyhow::Error>((total, spans as f64 / jobs as f64, in_pieces.len()))
    });
    let start = Instant::now();
    parallel(creds, conns, bodies, "/api/v1/jobs").await?;
    let created = start.elapsed();
    println!(
        "created {jobs} jobs of {size} members ({members} pods) over {conns} connections in {:.2}s = {:.0} jobs/s; server RSS {:.1} MiB",
        created.as_secs_f64(),
        jobs as f64 / created.as_secs_f64(),
        e2e::process::memory_mib(pid, "VmRSS:")
    );
    let (bound, nodes_per_gang, in_pieces) =
        tokio::time::timeout(Duration::from_secs(600), counter).await.context("binding timed out")???;
    let all = start.elapsed().as_secs_f64();
    println!(
        "gangs of {size} at {nodes} nodes: {jobs} gangs ({bound} members) bound {all:.2}s after the first create = {:.1} gangs/s, {:.0} members/s; {nodes_per_gang:.2} nodes per gang; {in_pieces} gangs bound in pieces",
        jobs as f64 / all,
        bound as f64 / all
    );
    println!(
        "server RSS with {nodes} nodes and {jobs} jobs ({members} pods): {:.1} MiB (peak {:.1} MiB)",
        e2e::process::memory_mib(pid, "VmRSS:"),
        e2e::process::memory_mib(pid, "VmHWM:")
    );
    Ok(())
}

fn orchestrator_creds(path: &std::path::Path) -> anyhow::Result<orchestrator::tls::Credentials> {
    Ok(orchestrator::tls::Credentials::load(path)?)
}

fn node_json(i: usize, shape: &str) -> anyhow::Result<String> {
    let topology = specs::topology::synthetic::parse(shape)?;
    let node = serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Node",
        "metadata": {"name": format!("node-{i:05}"), "labels": {"rack": format!("r{}", i % 40)}},
        "spec": {"topology": topology, "settings": {"reservedCpus": [0]}},
    });
    Ok(node.to_string())
}

fn pod_json(i: usize, rng: &mut Rng) -> String {
    let cpus = rng.range(1, 8);
    let mem = rng.range(1, 8);
    let policy = if i.is_multiple_of(2) { "single-numa-node" } else { "best-effort" };
    serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Pod",
        "metadata": {"name": format!("pod-{i}")},
        "spec": {
            "topology": {"policy": policy},
            "containers": [{
                "name": "main",
                "rootfs": "host",
                "command": ["true"],
                "resources": {
                    "requests": {"cpu": cpus.to_string(), "memory": format!("{mem}Gi")},
                    "limits": {"cpu": cpus.to_string(), "memory": format!("{mem}Gi")},
                },
            }],
        },
    })
    .to_string()
}

fn job_json(i: usize, size: usize) -> String {
    serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Job",
        "metadata": {"name": format!("job-{i}")},
        "spec": {
            "parallelism": size,
            "gang": {"placement": "pack"},
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "main",
                    "rootfs": "host",
                    "command": ["true"],
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                }],
            }},
        },
    })
    .to_string()
}

/// POSTs every body, `conns` kept-alive connections at a time (a client, and
/// so a pool, per connection); any non-2xx fails.
async fn parallel(
    creds: &orchestrator::tls::Credentials,
    conns: usize,
    bodies: Vec<String>,
    path: &'static str,
) -> anyhow::Result<()> {
    let mut shards: Vec<Vec<String>> = vec![Vec::new(); conns];
    for (i, b) in bodies.into_iter().enumerate() {
        shards[i % conns].push(b);
    }
    let mut tasks = Vec::new();
    for shard in shards {
        let conn = pinion_wire::Client::new(creds)?;
        tasks.push(tokio::spawn(async move {
            for body in shard {
                let body = bytes::Bytes::from(body);
                // On etcd a node's registration waits for the server to lead (503 NotLeader until then).
                let deadline = Instant::now() + Duration::from_secs(20);
                let (code, reply) = loop {
                    let (code, reply) =
                        conn.request(hyper::Method::POST, path, Some(("application/json", body.clone()))).await?;
                    if code != 503 || Instant::now() > deadline {
                        break (code, reply);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                if !(200..300).contains(&code) {
                    bail!("POST {path}: {code}: {}", String::from_utf8_lossy(&reply));
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
