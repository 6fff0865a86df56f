//! Agent benchmark: `pinion agent` as a user runs it.
//!
//! 1. Hollow: 20 pods (10 exclusive, 10 shared) on a simulated 2x10 machine;
//!    the agent's RSS once they all run and it is idle.
//! 2. Real containers (libcontainer, this host, CPU 0 reserved): pods started
//!    one at a time by writing a manifest into the folder (rename into place);
//!    the time from the rename to the container's first output byte in its log,
//!    median and p99 over `--runs`; and the agent's RSS, idle, with 20 of them
//!    running.
//!
//! Usage (as root): `bench_agent [--runs N] [--pinion PATH]` (default 50 runs,
//! `target/release/pinion`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use specs::topology::{Cpu, NumaNode};
use specs::{CpuSet, NodeTopology};

const IDLE: Duration = Duration::from_secs(3);

fn main() -> anyhow::Result<()> {
    let mut runs = 50usize;
    let mut pinion = PathBuf::from("target/release/pinion");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().context("--runs N")?.parse()?,
            "--pinion" => pinion = PathBuf::from(args.next().context("--pinion PATH")?),
            other => bail!("unknown argument {other}"),
        }
    }
    let pinion = std::fs::canonicalize(&pinion).with_context(|| format!("{}", pinion.display()))?;
    hollow_rss(&pinion)?;
    real(&pinion, runs.max(20))?;
    Ok(())
}

struct Agent {
    child: Child,
    data: PathBuf,
}

impl Agent {
    fn start(pinion: &Path, manifests: &Path, data: &Path, extra: &[&str]) -> anyhow::Result<Agent> {
        let child = Command::new(pinion)
            .args(["agent", "--reserved-cpus", "0"])
            .arg("--manifests")
            .arg(manifests)
            .arg("--data-dir")
            .arg(data)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting pinion agent")?;
        Ok(Agent { child, data: data.to_path_buf() })
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
        cpus: (0..20).map(|id| Cpu { id, core: id, socket: id / 10, die: None, numa: id / 10 }).collect(),
        numa_nodes: (0..2)
            .map(|id| NumaNode {
                id,
                cpus: CpuSet::range(id * 10, id * 10 + 9),
                memory_bytes: 64 << 30,
                distances: if id == 0 { vec![10, 21] } else { vec![21, 10] },
                hugepages: vec![],
            })
            .collect(),
        ..Default::default()
    }
}

fn manifest(name: &str, cpu: &str, command: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, '{command}']\n    resources: {{limits: {{cpu: '{cpu}', memory: 32Mi}}}}\n"
    )
}

/// Writes a manifest the way a careful tool does: a hidden temp file renamed in.
fn place(dir: &Path, stem: &str, text: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{stem}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(format!("{stem}.yaml")))?;
    Ok(())
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
    let agent = Agent::start(pinion, &manifests, &data, &["--runtime", "hollow", "--topology", &topo])?;
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn real(pinion: &Path, runs: usize) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("pinion-bench-agent-").tempdir()?;
    let manifests = work.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    let data = work.path().join("data");
    let agent = Agent::start(pinion, &manifests, &data, &["--runtime", "libcontainer"])?;
    agent.wait("the agent's first status", |a| a.status().is_some())?;
    let result = (|| -> anyhow::Result<()> {
        let mut lat = Vec::new();
        for i in 0..runs {
            let stem = format!("b{}-{i}", std::process::id());
            let log = data.join(format!("logs/static_{stem}/main.log"));
            let t = Instant::now();
            place(&manifests, &stem, &manifest(&stem, "100m", "echo hi; exec sleep 1000"))?;
            let deadline = t + Duration::from_secs(30);
            while std::fs::metadata(&log).map_or(true, |m| m.len() == 0) {
                if Instant::now() > deadline {
                    bail!(
                        "pod {stem}: no output after 30 s: {:?}",
                        agent.status().map(|s| s["pods"][format!("static/{stem}")].clone())
                    );
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            if i == 19 {
                agent.wait("20 real pods running", |a| a.running() == 20)?;
                std::thread::sleep(IDLE);
                let (rss, hwm) = agent.rss()?;
                println!(
                    "real: 20 pods running (libcontainer, this host): agent VmRSS {:.1} MiB, VmHWM {:.1} MiB",
                    rss as f64 / 1024.0,
                    hwm as f64 / 1024.0
                );
            }
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        println!(
            "real: manifest renamed into the folder -> first output byte, {} pods one at a time: median {:.1} ms, p99 {:.1} ms, min {:.1} ms",
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[0]
        );
        Ok(())
    })();
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
