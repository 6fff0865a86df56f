//! A silent node's replicas replaced, with the real binary: `pinion server`
//! (heartbeat grace 4 s: the agents beat every 3 s) and `--nodes` hollow agents (2 NUMA nodes of 8
//! cores each, `single-numa-node`), a Deployment of `--replicas` 2-CPU pods
//! with `nodeLostReplaceAfterSeconds: --after`. The agent holding the most
//! replicas is killed with SIGKILL; the figure is the time from the node's
//! timer firing (the first replacement seen in the store: it is created in
//! the write that marks the lost pods) to every replica Running on the other
//! nodes. Also printed: NotReady seen to the timer firing (the setting, plus
//! up to a second: the server counts from NotReady rounded up to a whole
//! second). Polled through the API every 10 ms. `--runs` clusters in a row.
//!
//! Usage: `bench_node_lost [--nodes N] [--replicas R] [--after S] [--runs K] [--pinion PATH]`
//! (defaults 4, 12, 2, 3, `target/release/pinion`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::hollow::{HollowCluster, NodeShape};
use specs::deployment::DEPLOYMENT_LABEL;
use specs::node_lost::REPLACED_ANNOTATION;
use specs::{Pod, PodPhase};

const POLL: Duration = Duration::from_millis(10);
const WITHIN: Duration = Duration::from_secs(120);

fn main() -> anyhow::Result<()> {
    let (mut nodes, mut replicas, mut after, mut runs) = (4usize, 12u32, 2u64, 3usize);
    let mut pinion = PathBuf::from("target/release/pinion");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--nodes" => nodes = value()?.parse()?,
            "--replicas" => replicas = value()?.parse()?,
            "--after" => after = value()?.parse()?,
            "--runs" => runs = value()?.parse()?,
            "--pinion" => pinion = PathBuf::from(value()?),
            other => bail!("unknown argument {other}"),
        }
    }
    if nodes < 2 {
        bail!("--nodes: at least 2 (one to lose, one to take its replicas)");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut figures = Vec::new();
    for run in 1..=runs {
        let (fire, running, moved) = rt.block_on(once(&pinion, nodes, replicas, after))?;
        println!(
            "run {run}: {moved} replicas lost; NotReady seen -> timer fired {:.2}s; timer fired -> all Running elsewhere {:.0} ms",
            fire.as_secs_f64(),
            running.as_secs_f64() * 1000.0
        );
        figures.push(running.as_secs_f64() * 1000.0);
    }
    figures.sort_by(f64::total_cmp);
    let median = figures.get(figures.len() / 2).copied().unwrap_or_default();
    println!(
        "{nodes} nodes, {replicas} replicas, nodeLostReplaceAfterSeconds {after}: timer fired -> all Running elsewhere, median {median:.0} ms of {runs} (min {:.0}, max {:.0})",
        figures.first().copied().unwrap_or_default(),
        figures.last().copied().unwrap_or_default()
    );
    Ok(())
}

fn node(p: &Pod) -> &str {
    p.spec.node_name.as_deref().unwrap_or_default()
}

/// One cluster: (NotReady seen -> timer fired, timer fired -> all Running
/// elsewhere, replicas lost).
async fn once(
    pinion: &std::path::Path,
    nodes: usize,
    replicas: u32,
    after: u64,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let shape = NodeShape {
        synthetic: "pack:1 numa:2 core:8 pu:1".into(),
        reserved_cpus: "0".into(),
        policy: "single-numa-node".into(),
    };
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut c = HollowCluster::start(pinion, &["--heartbeat-grace", "4"], &refs, shape)?;
    let creds = orchestrator::tls::Credentials::load(&c.config)?;
    let client = pinion_wire::Client::new(&creds)?;
    let selector = format!("{DEPLOYMENT_LABEL}=bench");
    let pods = || async { client.list_pods(Some(&selector)).await.map(|l| l.items) };
    let start = Instant::now();
    while !wait_ready(&client, &names).await {
        if start.elapsed() > WITHIN {
            bail!("the nodes did not all become Ready");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.apply(
        "bench",
        &format!(
            "apiVersion: pinion.io/v1\nkind: Deployment\nmetadata: {{name: bench}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: bench}}}}\n  template:\n    metadata: {{labels: {{app: bench}}}}\n    spec:\n      terminationGracePeriodSeconds: 0\n      nodeLostReplaceAfterSeconds: {after}\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, inf]\n        resources:\n          limits: {{cpu: \"2\", memory: 64Mi}}\n"
        ),
    )?;
    let running = |p: &Pod| p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running);
    let placed = loop {
        let p = pods().await?;
        if p.len() == replicas as usize && p.iter().all(running) {
            break p;
        }
        if start.elapsed() > WITHIN {
            bail!("the replicas did not all run: {} pods", p.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let victim =
        names.iter().max_by_key(|n| placed.iter().filter(|p| node(p) == n.as_str()).count()).context("a node")?.clone();
    let moved = placed.iter().filter(|p| node(p) == victim).count();
    c.kill_agent(&victim);
    let not_ready = loop {
        let n = client.get_node(&victim).await?;
        if n.status.condition == specs::api::NodeCondition::NotReady {
            break Instant::now();
        }
        if start.elapsed() > WITHIN * 2 {
            bail!("{victim} did not become NotReady");
        }
        tokio::time::sleep(POLL).await;
    };
    let fired = loop {
        let p = pods().await?;
        if p.len() > replicas as usize || p.iter().any(|p| p.metadata.annotations.contains_key(REPLACED_ANNOTATION)) {
            break Instant::now();
        }
        if not_ready.elapsed() > WITHIN {
            bail!("nothing replaced");
        }
        tokio::time::sleep(POLL).await;
    };
    loop {
        let p = pods().await?;
        let elsewhere: Vec<&Pod> = p.iter().filter(|p| node(p) != victim).collect();
        if elsewhere.len() == replicas as usize && elsewhere.iter().all(|p| running(p)) {
            return Ok((fired - not_ready, fired.elapsed(), moved));
        }
        if fired.elapsed() > WITHIN {
            let seen: Vec<String> = p
                .iter()
                .map(|p| format!("{} {} {:?}", p.metadata.name, node(p), p.status.as_ref().map(|s| s.phase)))
                .collect();
            bail!("the replacements did not all run: {seen:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_ready(client: &pinion_wire::Client, names: &[String]) -> bool {
    for n in names {
        match client.get_node(n).await {
            Ok(node) if node.status.condition == specs::api::NodeCondition::Ready => {}
            _ => return false,
        }
    }
    true
}
