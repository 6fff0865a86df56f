//! Agent benchmark: `pinion agent` as a user runs it.
//!
//! 1. Hollow: 20 pods (10 exclusive, 10 shared) on a simulated 2x10 machine;
//!    the agent's RSS once they all run and it is idle.
//! 2. Pod start, side by side in one run: for each of `--runs` rounds, in a
//!    rotating order, one pinion pod (its manifest renamed into the watched
//!    folder -> the container's first output byte in its log file), one
//!    `crun run` and one `runc run` of the same bundle (spawn -> first byte on
//!    the container's stdout pipe). The bundle is the `config.json` the agent
//!    itself wrote for a warm-up pod (host rootfs, `sh -c 'echo hi; exec sleep
//!    1000'`, the shared pool's CPU 1, a 100m CPU limit: 102 shares and a CFS
//!    quota of 10 ms per 100 ms, 32 MiB), the quota put back into the spec
//!    (pinion's shim sets it between create and start). Pinion's pods
//!    stay running (as pods do), the peers' containers are killed once they
//!    printed. Everything, the agent included, runs in one private mount
//!    namespace (crun needs it on this hybrid host, see `e2e::peers`).
//!    The log file is watched with inotify (`e2e::firstbyte`): no sleep.
//!    Also the agent's RSS, idle, with 20 real pods running.
//! 3. Where pinion's time goes: the agent's pod-start step histograms
//!    (`pinion_pod_start_step_duration_seconds`, see `docs/metrics.md`),
//!    scraped from its `--local-listen` before and after the measured pods;
//!    per step, the mean and the p99 bucket of what the measured pods added.
//!
//! Usage (as root): `bench_agent [--runs N] [--pinion PATH]` (default 50 runs,
//! `target/release/pinion`); installs Debian `crun` and `runc` when missing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::firstbyte::LogWatch;
use e2e::peers;
use e2e::stats::{load_average, percentile, Summary};
use nodelet::runtime::libcontainer::records::{read_json, Layout};
use nodelet::runtime::libcontainer::{filter, rootfs, spec};
use nodelet::runtime::ContainerConfig;
use oci_spec::runtime::Spec;
use specs::topology::{Cpu, NumaNode};
use specs::{CpuSet, NodeTopology};

const IDLE: Duration = Duration::from_secs(3);
/// The pod-start steps (the histogram's `step` label) in the order a start
/// passes them, with the words the table shows.
const STAGES: &[(&str, &str)] = &[
    ("Admitted", "pod admitted"),
    ("CheckpointWritten", "checkpoint written"),
    ("BundlePrepared", "bundle prepared"),
    ("NetworkReady", "pod network ready"),
    ("ShimSpawned", "shim spawned"),
    ("ShimRunning", "shim running"),
    ("ContainerBuilt", "container built"),
    ("ContainerStarted", "container started"),
    ("ShimReported", "shim reported"),
    ("StartReturned", "runtime start returned"),
];
const STEP_METRIC: &str = "pinion_pod_start_step_duration_seconds";
const RUNTIMES: [&str; 3] = ["pinion", "crun", "runc"];

fn main() -> anyhow::Result<()> {
    let (runs, pinion) = peers::bench_setup()?;
    hollow_rss(&pinion)?;
    real(&pinion, runs.max(20))?;
    Ok(())
}

struct Agent {
    child: Child,
    data: PathBuf,
    /// Its `--local-listen` (plain-HTTP `/metrics`).
    metrics: SocketAddr,
}

impl Agent {
    fn start(pinion: &Path, manifests: &Path, data: &Path, extra: &[&str], log: Stdio) -> anyhow::Result<Agent> {
        // A free loopback port (the agent does not say which it took for port 0).
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let child = Command::new(pinion)
            .args(["agent", "--reserved-cpus", "0"])
            .arg("--manifests")
            .arg(manifests)
            .arg("--data-dir")
            .arg(data)
            .arg("--local-listen")
            .arg(metrics.to_string())
            .args(extra)
            .env("PINION_LOG", "warn,libcgroups=error,libcontainer=error")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting pinion agent")?;
        Ok(Agent { child, data: data.to_path_buf(), metrics })
    }

    /// The step histograms now: per step, its buckets (upper bound, cumulative
    /// count), sum and count.
    fn steps(&self) -> anyhow::Result<BTreeMap<String, Steps>> {
        let scrape = e2e::scrape::scrape(self.metrics)?;
        let mut out: BTreeMap<String, Steps> = BTreeMap::new();
        for s in scrape.samples {
            let Some(step) = s.labels.get("step") else { continue };
            let entry = out.entry(step.to_string()).or_default();
            match s.value {
                prometheus_parse::Value::Histogram(b) if s.metric == STEP_METRIC => {
                    entry.buckets = b.iter().map(|c| (c.less_than, c.count)).collect()
                }
                prometheus_parse::Value::Untyped(v) if s.metric == format!("{STEP_METRIC}_sum") => entry.sum = v,
                prometheus_parse::Value::Untyped(v) if s.metric == format!("{STEP_METRIC}_count") => entry.count = v,
                _ => {}
            }
        }
        Ok(out)
    }

    fn status(&self) -> Option<serde_json::Value> {
        let bytes = std::fs::read(self.data.join("status.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn running(&self) -> usize {
        self.status()
            .and_then(|v| v["pods"].as_object().map(|p| p.values().filter(|p| p["phase"] == "Running").count()))
            .unwrap_or(0)
    }

    fn wait(&self, what: &str, pred: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !pred(self) {
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}: {:?}", self.status());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// VmRSS and VmHWM in KiB.
    fn rss(&self) -> anyhow::Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok((field("VmRSS:"), field("VmHWM:")))
    }

    fn stop(mut self) -> anyhow::Result<()> {
        Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status()?;
        self.child.wait()?;
        Ok(())
    }
}

fn two_by_ten() -> NodeTopology {
    NodeTopology {
        cpus: (0..20)
            .map(|id| Cpu { id, core: id, socket: id / 10, die: None, numa: Some(id / 10), uncore_cache: None })
            .collect(),
        numa_nodes: (0..2)
            .map(|id| NumaNode {
                kind: Default::default(),
                id,
                cpus: CpuSet::range(id * 10, id * 10 + 9).expect("id within MAX_ID"),
                memory_bytes: 64 << 30,
                distances: if id == 0 { vec![10, 21] } else { vec![21, 10] },
                hugepages: vec![],
            })
            .collect(),
        ..Default::default()
    }
}

/// A pod limited to `cpu`: whole CPUs are Guaranteed (exclusive); a fraction
/// is a shared pod that requests 10m, because with CPU 0 reserved this host
/// offers one allocatable CPU and the bench keeps up to 50 pods running.
fn manifest(name: &str, cpu: &str, command: &str) -> String {
    let requests = if cpu.ends_with('m') { "requests: {cpu: 10m}, " } else { "" };
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, '{command}']\n    resources: {{{requests}limits: {{cpu: '{cpu}', memory: 32Mi}}}}\n"
    )
}

/// Writes a manifest the way a careful tool does: a hidden temp file, then
/// `commit` renames it into place.
struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
}

impl Staged {
    fn new(dir: &Path, stem: &str, text: &str) -> anyhow::Result<Staged> {
        let tmp = dir.join(format!(".{stem}.tmp"));
        std::fs::write(&tmp, text)?;
        Ok(Staged { tmp, dest: dir.join(format!("{stem}.yaml")) })
    }

    fn commit(self) -> anyhow::Result<()> {
        std::fs::rename(&self.tmp, &self.dest)?;
        Ok(())
    }
}

fn place(dir: &Path, stem: &str, text: &str) -> anyhow::Result<()> {
    Staged::new(dir, stem, text)?.commit()
}

fn hollow_rss(pinion: &Path) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("pinion-bench-agent-").tempdir()?;
    let manifests = work.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    let topology = work.path().join("topology.json");
    std::fs::write(&topology, serde_json::to_vec(&two_by_ten())?)?;
    for i in 0..20 {
        let cpu = if i < 10 { "1" } else { "500m" };
        place(&manifests, &format!("p{i}"), &manifest(&format!("p{i}"), cpu, "sleep 1000"))?;
    }
    let data = work.path().join("data");
    let topo = topology.to_string_lossy().to_string();
    let agent = Agent::start(pinion, &manifests, &data, &["--runtime", "hollow", "--topology", &topo], Stdio::null())?;
    agent.wait("20 hollow pods running", |a| a.running() == 20)?;
    std::thread::sleep(IDLE);
    let (rss, hwm) = agent.rss()?;
    println!(
        "hollow: 20 pods running (10 exclusive, 10 shared, 2x10 machine): agent VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    agent.stop()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One step's histogram: buckets (upper bound in seconds, cumulative count), sum, count.
#[derive(Debug, Clone, Default)]
struct Steps {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Steps {
    /// What was observed after `before`.
    fn since(&self, before: Option<&Steps>) -> Steps {
        let Some(b) = before else { return self.clone() };
        let earlier = |le: f64| b.buckets.iter().find(|(x, _)| *x == le).map_or(0.0, |(_, c)| *c);
        Steps {
            buckets: self.buckets.iter().map(|(le, c)| (*le, c - earlier(*le))).collect(),
            sum: self.sum - b.sum,
            count: self.count - b.count,
        }
    }

    fn mean_ms(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count * 1000.0
        } else {
            0.0
        }
    }

    /// The upper bound of the bucket holding the 99th percentile, in ms.
    fn p99_ms(&self) -> f64 {
        let want = self.count * 0.99;
        self.buckets.iter().find(|(_, c)| *c >= want).map_or(f64::INFINITY, |(le, _)| le * 1000.0)
    }
}

/// One pinion pod start, measured.
struct PodStart {
    first_byte: Duration,
}

/// Starts pod `stem` through the manifest folder; waits for its first byte.
fn start_pod(manifests: &Path, data: &Path, stem: &str) -> anyhow::Result<PodStart> {
    let text = manifest(stem, "100m", "echo hi; exec sleep 1000");
    // The log folder is the pod's own (key and spec hash for a static pod).
    let pod = nodelet::manifests::parse_manifest(&format!("{stem}.yaml"), &text).map_err(anyhow::Error::msg)?.remove(0);
    let log = nodelet::agent::reconcile::pod_container_log_path(data, &format!("static/{stem}"), &pod, "main");
    // The agent creates the same folder (create_dir_all) before its start.
    let watch = LogWatch::new(&log)?;
    let staged = Staged::new(manifests, stem, &text)?;
    let t0 = Instant::now();
    staged.commit()?;
    let seen = watch.wait_first_byte(t0 + Duration::from_secs(30)).with_context(|| format!("pod {stem}"))?;
    Ok(PodStart { first_byte: seen - t0 })
}

/// The runtime id the agent gave pod `stem`'s container (from its folder name).
fn runtime_id(data: &Path, stem: &str) -> anyhow::Result<String> {
    let prefix = format!("static-{stem}_main_");
    std::fs::read_dir(data.join("containers"))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n.starts_with(&prefix))
        .with_context(|| format!("no container of pod {stem}"))
}

/// The bundle the peers run: the agent's own `config.json` for the warm-up
/// pod, with a rootfs prepared the same way; `cgroupsPath` is set per run.
struct PeerBundle {
    dir: PathBuf,
    spec: Spec,
}

impl PeerBundle {
    fn copy_from(data: &Path, id: &str, dir: &Path) -> anyhow::Result<PeerBundle> {
        let layout = Layout::new(data);
        let src = layout.bundle(id).join("config.json");
        let mut spec = Spec::load(&src).with_context(|| format!("{}", src.display()))?;
        // The peers compile the same seccomp profile themselves.
        filter::restore_profile(&mut spec, &layout.bundle(id))?;
        // Pinion's shim sets the CFS quota between create and start; the peers
        // apply every limit at create, so theirs goes into the spec.
        let cfg: ContainerConfig = read_json(&layout.config(id))?.context("container.json")?;
        if let Some(quota) = cfg.cpu_quota {
            spec = spec::with_cpu_quota(spec, quota);
        }
        rootfs::prepare_host(&dir.join("rootfs"))?;
        Ok(PeerBundle { dir: dir.to_path_buf(), spec })
    }

    fn run(&mut self, tool: &str, id: &str) -> anyhow::Result<Duration> {
        if let Some(l) = self.spec.linux_mut().as_mut() {
            l.set_cgroups_path(Some(PathBuf::from(format!("/pinion-bench/{id}"))));
        }
        self.spec.save(self.dir.join("config.json"))?;
        peers::run_first_byte_then_kill(tool, &self.dir, id)
    }
}

fn real(pinion: &Path, runs: usize) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("pinion-bench-agent-").tempdir()?;
    let manifests = work.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    let data = work.path().join("data");
    let agent_log = work.path().join("agent.log");
    let log = std::fs::File::create(&agent_log)?;
    let agent = Agent::start(pinion, &manifests, &data, &["--runtime", "libcontainer"], Stdio::from(log))?;
    agent.wait("the agent's first status", |a| a.status().is_some())?;
    let result = (|| -> anyhow::Result<()> {
        let pid = std::process::id();
        // Warm-up (not counted): the page cache, the agent's first pass, the
        // bundle the peers run, one run of each peer.
        let warm = format!("w{pid}");
        start_pod(&manifests, &data, &warm)?;
        let mut bundle = PeerBundle::copy_from(&data, &runtime_id(&data, &warm)?, &work.path().join("bundle"))?;
        for tool in peers::TOOLS {
            bundle.run(tool, &format!("bench-{tool}-{pid}-warm"))?;
        }
        let mut pods = 1;
        let steps_before = agent.steps()?;
        let load_before = load_average();
        let mut firsts: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut starts = Vec::new();
        for i in 0..runs {
            for k in 0..RUNTIMES.len() {
                // Rotate the order so no runtime always runs right after another.
                let name = RUNTIMES[(i + k) % RUNTIMES.len()];
                let first = if name == "pinion" {
                    let s = start_pod(&manifests, &data, &format!("b{pid}-{i}"))?;
                    let first = s.first_byte;
                    starts.push(s);
                    pods += 1;
                    if pods == 20 {
                        agent.wait("20 real pods running", |a| a.running() == 20)?;
                        std::thread::sleep(IDLE);
                        let (rss, hwm) = agent.rss()?;
                        println!(
                            "real: 20 pods running (libcontainer, this host): agent VmRSS {:.1} MiB, VmHWM {:.1} MiB",
                            rss as f64 / 1024.0,
                            hwm as f64 / 1024.0
                        );
                    }
                    first
                } else {
                    bundle.run(name, &format!("bench-{name}-{pid}-{i}"))?
                };
                firsts.entry(name).or_default().push(ms(first));
            }
        }
        let load_after = load_average();
        println!(
            "pod start, {runs} of each, interleaved (load average {load_before:.2} before, {load_after:.2} after); ms"
        );
        println!("{:<46} {:>8} {:>8} {:>8}", "", "median", "p99", "min");
        let label = |name: &str| match name {
            "pinion" => "pinion agent: manifest renamed -> first byte".to_string(),
            tool => format!("{tool} run: spawn -> first byte"),
        };
        for name in RUNTIMES {
            let s = Summary::of(&firsts[name]);
            println!("{:<46} {:>8.1} {:>8.1} {:>8.1}", label(name), s.median, s.p99, s.min);
        }
        let (ours, crun) = (Summary::of(&firsts["pinion"]).median, Summary::of(&firsts["crun"]).median);
        println!("pinion median / crun median: {:.2}x (goal: within 1.5x)", ours / crun);
        println!("versions: {} / {}", peers::version("crun"), peers::version("runc"));
        let steps_after = agent.steps()?;
        breakdown(&steps_before, &steps_after, &starts)
    })();
    peers::remove_parent_cgroup("pinion-bench");
    // Clean up whatever happened: remove every manifest, let the agent stop them.
    for e in std::fs::read_dir(&manifests)?.flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let cleaned = agent
        .wait("every pod stopped", |a| a.status().is_some_and(|v| v["pods"].as_object().is_some_and(|p| p.is_empty())));
    agent.stop()?;
    result?;
    cleaned
}

/// Prints, per step, the mean time since the arrival (the sum of the steps'
/// means up to it) and the step's mean and p99 bucket, over what the
/// measured pods added to the agent's histograms.
fn breakdown(
    before: &BTreeMap<String, Steps>,
    after: &BTreeMap<String, Steps>,
    starts: &[PodStart],
) -> anyhow::Result<()> {
    println!(
        "where pinion's time goes ({} pods; the agent's step histograms, ms since the pod's arrival, means):",
        starts.len()
    );
    println!("{:<30} {:>8} {:>8} {:>8}", "stage", "at", "step", "step p99");
    let mut at = 0.0;
    for (label, words) in STAGES {
        let Some(s) = after.get(*label).map(|a| a.since(before.get(*label))).filter(|s| s.count > 0.0) else {
            continue;
        };
        at += s.mean_ms();
        println!("{:<30} {:>8.1} {:>8.1} {:>8.1}", words, at, s.mean_ms(), s.p99_ms());
    }
    // From the rename: the step holds the manifest's way to the agent
    // (inotify, the read) and the shim's copy of the first output.
    let seen: Vec<f64> = starts.iter().map(|s| ms(s.first_byte)).collect();
    if !seen.is_empty() {
        let mean = seen.iter().sum::<f64>() / seen.len() as f64;
        let p99 = percentile(&seen, 99.0);
        println!("{:<30} {:>8.1} {:>8.1} {:>8.1}", "first byte seen by the bench", mean, mean - at, p99 - at);
    }
    Ok(())
}
