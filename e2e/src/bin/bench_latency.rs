//! Latency benchmark: what an exclusive CPU buys a latency-sensitive pod.
//!
//! `cyclictest` runs as a pinion pod through the real `pinion agent`
//! (libcontainer runtime, `rootfs: host`, CPU 0 reserved) in four cases,
//! interleaved round by round (the order rotates so no case always follows
//! another):
//!
//! - `exclusive+load`: a Guaranteed pod with one exclusive CPU (it lands on
//!   CPU 1) while two `stress-ng` pods (one Burstable, one BestEffort) load the
//!   shared pool, which is then CPU 0 alone;
//! - `shared+load`: cyclictest itself in the shared pool (a 500m request), the
//!   same stress pods beside it on CPUs 0-1;
//! - `exclusive, idle`: the exclusive pod with no stress pods;
//! - `exclusive+load, tuned`: as `exclusive+load`, the pod also asking for
//!   `spec.tuning` (interrupts, CFS quota, load balancing and C-states off
//!   its CPU; this host has no cpufreq driver, so no governor).
//!
//! Realtime priority: cyclictest refuses to run at all unless it may switch to
//! SCHED_FIFO, and a pod cannot ask for that (no capabilities in the pod spec;
//! containers get Docker's default set, without CAP_SYS_NICE, and on a kernel
//! with `CONFIG_RT_GROUP_SCHED` a cgroup v1 `cpu` group has no realtime budget
//! until someone writes `cpu.rt_runtime_us`). So the bench grants it from
//! outside, as a host administrator would: it gives the pod's `cpu` cgroup (and
//! `/pinion` above it) a realtime budget and moves the pod's shell to
//! SCHED_FIFO 80 with `chrt -p`; the shell waits for that, then execs
//! `cyclictest -p80`, which inherits the policy (a SCHED_FIFO task may keep its
//! own priority without privilege). The old budget of `/pinion` is put back at
//! the end.
//!
//! The bench itself polls from the reserved CPU 0 (the agent is left unpinned:
//! see `run_all`), and holds `/dev/cpu_dma_latency` at 0 for the whole run, as
//! cyclictest would on the host. Figures come from cyclictest's histogram
//! (`-h`, 1 µs buckets, overflows counted above the range), pooled over the
//! rounds of each case. The stress pods run `stress-ng --cpu 2` (Burstable,
//! limit 2 CPUs) and `stress-ng --switch 1 --vm 1 --sock 1` (BestEffort:
//! the last is TCP traffic over loopback, a network load); the bench
//! checks that both ran through each case and reports the CPUs they had.
//!
//! Usage (as root): `bench_latency [--duration SECS] [--rounds N] [--interval US]
//! [--policy fifo|other] [--png PATH] [--pinion PATH]` (defaults 15 s, 3 rounds,
//! 200 µs, fifo, `docs/latency.png`, `target/release/pinion`). `--policy other`
//! measures a SCHED_OTHER thread instead (the pod's shell is still made FIFO so
//! that cyclictest starts). Installs Debian `rt-tests`, `stress-ng` and
//! `fonts-dejavu-core` (the chart's font) when missing.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Histogram range (µs); later wake-ups count as overflows.
const HIST_US: usize = 10_000;
/// The realtime priority cyclictest runs at.
const RT_PRIORITY: u32 = 80;
/// Realtime budget (µs per 1 s period) granted to `/pinion` and to each
/// cyclictest pod's `cpu` cgroup; cyclictest uses a few percent of a CPU.
const RT_BUDGET_US: u64 = 500_000;
/// The font the chart's text is drawn with (Debian `fonts-dejavu-core`).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// How long stress pods run before cyclictest starts.
const WARMUP: Duration = Duration::from_secs(1);

struct Config {
    duration_s: u64,
    rounds: usize,
    interval_us: u64,
    policy: Policy,
    png: PathBuf,
    pinion: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let mut cfg = Config {
        duration_s: 15,
        rounds: 3,
        interval_us: 200,
        policy: Policy::Fifo,
        png: PathBuf::from("docs/latency.png"),
        pinion: PathBuf::from("target/release/pinion"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--duration" => cfg.duration_s = args.next().context("--duration SECS")?.parse()?,
            "--rounds" => cfg.rounds = args.next().context("--rounds N")?.parse()?,
            "--interval" => cfg.interval_us = args.next().context("--interval US")?.parse()?,
            "--policy" => {
                cfg.policy = match args.next().as_deref() {
                    Some("fifo") => Policy::Fifo,
                    Some("other") => Policy::Other,
                    _ => bail!("--policy fifo|other"),
                }
            }
            "--png" => cfg.png = PathBuf::from(args.next().context("--png PATH")?),
            "--pinion" => cfg.pinion = PathBuf::from(args.next().context("--pinion PATH")?),
            other => bail!("unknown argument {other}"),
        }
    }
    if cfg.duration_s == 0 || cfg.rounds == 0 || cfg.interval_us == 0 {
        bail!("--duration, --rounds and --interval must be positive");
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("bench_latency needs root (containers, cgroups, chrt)");
    }
    cfg.pinion = std::fs::canonicalize(&cfg.pinion).with_context(|| format!("{}", cfg.pinion.display()))?;
    ensure_tools()?;

    let _pm_qos = hold_pm_qos()?;
    let load_start = loadavg();
    let started = Instant::now();
    let results = run_all(&cfg)?;
    let load_end = loadavg();

    println!(
        "\ncyclictest -m -t1 {} -i{} -D{} -h{HIST_US}, {} round(s) per case, µs (pooled histogram):",
        cfg.policy.cyclictest_args(),
        cfg.interval_us,
        cfg.duration_s,
        cfg.rounds
    );
    println!(
        "{:<16} {:>8} {:>5} {:>5} {:>6} {:>6} {:>6}  {:<18} {:<10} {:<10}",
        "case", "samples", "avg", "p99", "p99.9", "p99.99", "max", "p99.99 per round", "CPUs", "stress on"
    );
    for r in &results {
        let h = &r.hist;
        let rounds: Vec<String> = r.rounds.iter().map(|h| h.percentile(0.9999).to_string()).collect();
        println!(
            "{:<16} {:>8} {:>5.1} {:>5} {:>6} {:>6} {:>6}  {:<18} {:<10} {:<10}",
            r.case.label(),
            h.samples(),
            h.avg(),
            h.percentile(0.99).to_string(),
            h.percentile(0.999).to_string(),
            h.percentile(0.9999).to_string(),
            h.max_us,
            rounds.join(" "),
            r.cpus,
            r.stress_cpus.as_deref().unwrap_or("-"),
        );
    }
    println!(
        "load average (1, 5, 15 min): {load_start} at start, {load_end} at end; 1-min load after each run: {}; {:.0} s in all",
        results.iter().flat_map(|r| r.loads.iter().map(|l| format!("{l:.2}"))).collect::<Vec<_>>().join(" "),
        started.elapsed().as_secs_f64()
    );

    if let Some(dir) = cfg.png.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    draw(&cfg, &results, &load_end)?;
    println!("chart: {}", cfg.png.display());
    Ok(())
}

// ---------------------------------------------------------------------------
// Cases and results.

/// The scheduling policy of cyclictest's measurement thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// SCHED_FIFO at `RT_PRIORITY`: preempts every normal task at once.
    Fifo,
    /// SCHED_OTHER (CFS, nice 0), like most latency-sensitive services that do
    /// not run realtime; the shell is still made SCHED_FIFO first, because
    /// cyclictest checks at start that it could be.
    Other,
}

impl Policy {
    fn cyclictest_args(self) -> String {
        match self {
            Policy::Fifo => format!("-p{RT_PRIORITY}"),
            Policy::Other => "--policy=other".to_string(),
        }
    }

    fn describe(self) -> String {
        match self {
            Policy::Fifo => format!("SCHED_FIFO {RT_PRIORITY}"),
            Policy::Other => "SCHED_OTHER".to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    ExclusiveLoaded,
    SharedLoaded,
    ExclusiveIdle,
    ExclusiveTuned,
}

impl Case {
    const ALL: [Case; 4] = [Case::ExclusiveLoaded, Case::SharedLoaded, Case::ExclusiveIdle, Case::ExclusiveTuned];

    fn label(self) -> &'static str {
        match self {
            Case::ExclusiveLoaded => "exclusive+load",
            Case::SharedLoaded => "shared+load",
            Case::ExclusiveIdle => "exclusive, idle",
            Case::ExclusiveTuned => "exclusive+load, tuned",
        }
    }

    fn legend(self) -> &'static str {
        match self {
            Case::ExclusiveLoaded => "(a) exclusive CPU 1, stress-ng on the shared pool",
            Case::SharedLoaded => "(b) shared pool (500m), same stress-ng",
            Case::ExclusiveIdle => "(c) exclusive CPU 1, no stress pods",
            Case::ExclusiveTuned => "(d) as (a), with spec.tuning",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Case::ExclusiveLoaded => "a",
            Case::SharedLoaded => "b",
            Case::ExclusiveIdle => "c",
            Case::ExclusiveTuned => "d",
        }
    }

    fn loaded(self) -> bool {
        self != Case::ExclusiveIdle
    }

    /// `resources` of the cyclictest container.
    fn resources(self) -> &'static str {
        match self {
            Case::SharedLoaded => "{requests: {cpu: 500m, memory: 64Mi}, limits: {cpu: '1', memory: 64Mi}}",
            _ => "{requests: {cpu: '1', memory: 64Mi}, limits: {cpu: '1', memory: 64Mi}}",
        }
    }

    fn color(self) -> RGBColor {
        match self {
            Case::ExclusiveLoaded => RGBColor(0x1f, 0x77, 0xb4),
            Case::SharedLoaded => RGBColor(0xd6, 0x27, 0x28),
            Case::ExclusiveIdle => RGBColor(0x2c, 0xa0, 0x2c),
            Case::ExclusiveTuned => RGBColor(0x94, 0x67, 0xbd),
        }
    }

    /// The pod's `spec.tuning`: every setting this host can apply (its
    /// CPUs have no cpufreq driver, so no governor).
    fn tuning(self) -> &'static str {
        match self {
            Case::ExclusiveTuned => {
                "  tuning: {irqLoadBalancing: disabled, cpuQuota: disabled, cpuLoadBalancing: disabled, cpuCStates: disabled}\n"
            }
            _ => "",
        }
    }
}

struct CaseResult {
    case: Case,
    hist: Histogram,
    rounds: Vec<Histogram>,
    /// cyclictest's `Cpus_allowed_list`, as the container saw it.
    cpus: String,
    /// The first stress pod's `Cpus_allowed_list`, when this case had them.
    stress_cpus: Option<String>,
    /// 1-minute load average read after each run.
    loads: Vec<f64>,
}

/// A percentile: a histogram bucket, or beyond the histogram's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Latency {
    Us(u64),
    Over(u64),
}

impl Latency {
    fn value(self) -> u64 {
        match self {
            Latency::Us(v) | Latency::Over(v) => v,
        }
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Latency::Us(v) => write!(f, "{v}"),
            Latency::Over(v) => write!(f, ">{v}"),
        }
    }
}

/// cyclictest's histogram of one thread: `buckets[i]` wake-ups `i` µs late.
#[derive(Debug, Clone, PartialEq)]
struct Histogram {
    buckets: Vec<u64>,
    overflows: u64,
    max_us: u64,
    /// Sum of cyclictest's per-run average times the run's samples.
    avg_weighted: f64,
}

impl Histogram {
    fn empty() -> Histogram {
        Histogram { buckets: vec![0; HIST_US], overflows: 0, max_us: 0, avg_weighted: 0.0 }
    }

    /// Parses cyclictest's `-h` output (one thread) among other log lines.
    fn parse(text: &str) -> anyhow::Result<Histogram> {
        let mut h = Histogram::empty();
        let mut total = None;
        let mut avg = None;
        let mut max = None;
        for line in text.lines() {
            let summary = |prefix: &str| -> Option<anyhow::Result<u64>> {
                let rest = line.strip_prefix(prefix)?;
                let first = rest.split_whitespace().next().unwrap_or("");
                Some(first.parse::<u64>().with_context(|| format!("{prefix} {rest:?}")))
            };
            if let Some(v) = summary("# Total:") {
                total = Some(v?);
            } else if let Some(v) = summary("# Avg Latencies:") {
                avg = Some(v?);
            } else if let Some(v) = summary("# Max Latencies:") {
                max = Some(v?);
            } else if let Some(v) = summary("# Histogram Overflows:") {
                h.overflows = v?;
            } else if let Some((bucket, count)) = line.split_once(' ') {
                let (Ok(bucket), Ok(count)) = (bucket.parse::<usize>(), count.trim().parse::<u64>()) else {
                    continue;
                };
                if bucket >= h.buckets.len() {
                    bail!("histogram bucket {bucket} beyond -h{HIST_US}");
                }
                h.buckets[bucket] = count;
            }
        }
        let (Some(total), Some(avg), Some(max)) = (total, avg, max) else {
            bail!("no cyclictest summary (# Total, # Avg Latencies, # Max Latencies) in the log");
        };
        let counted: u64 = h.buckets.iter().sum();
        if counted != total {
            bail!("histogram holds {counted} samples, cyclictest's total says {total}");
        }
        h.max_us = max;
        h.avg_weighted = avg as f64 * h.samples() as f64;
        Ok(h)
    }

    fn samples(&self) -> u64 {
        self.buckets.iter().sum::<u64>() + self.overflows
    }

    fn avg(&self) -> f64 {
        self.avg_weighted / self.samples().max(1) as f64
    }

    /// Mean of the samples inside the histogram's range (overflows left out).
    fn bucket_mean(&self) -> f64 {
        let inside: u64 = self.buckets.iter().sum();
        let sum: u64 = self.buckets.iter().enumerate().map(|(us, n)| us as u64 * n).sum();
        sum as f64 / inside.max(1) as f64
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.overflows += other.overflows;
        self.max_us = self.max_us.max(other.max_us);
        self.avg_weighted += other.avg_weighted;
    }

    /// The smallest latency at or below which a share `p` of the wake-ups fell.
    fn percentile(&self, p: f64) -> Latency {
        let rank = (p * self.samples() as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (us, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Latency::Us(us as u64);
            }
        }
        Latency::Over(self.buckets.len() as u64)
    }

    /// Share of wake-ups at least `us` late (overflows count as late).
    fn share_at_least(&self, us: usize) -> f64 {
        let late: u64 = self.buckets.iter().skip(us).sum::<u64>() + self.overflows;
        late as f64 / self.samples().max(1) as f64
    }
}

// ---------------------------------------------------------------------------
// Running the cases through the agent.

fn run_all(cfg: &Config) -> anyhow::Result<Vec<CaseResult>> {
    let work = tempfile::Builder::new().prefix("pinion-bench-latency-").tempdir()?;
    let manifests = work.path().join("manifests");
    std::fs::create_dir(&manifests)?;
    let data = work.path().join("data");
    let cpu_root = cpu_cgroup_root()?;
    let budget = RtBudget::grant(cpu_root.as_deref())?;
    let agent = Agent::start(&cfg.pinion, &manifests, &data)?;
    // Only the bench itself moves to the reserved CPU: a container inherits its
    // creator's affinity mask within its cpuset (Linux 6.2+ keeps a mask set by
    // sched_setaffinity), so a pinned agent would keep shared-pool pods on CPU 0.
    pin_to_reserved_cpu()?;
    agent.wait("the agent's first status", Duration::from_secs(30), |a| a.status().is_some())?;

    let result = (|| -> anyhow::Result<Vec<CaseResult>> {
        let mut results: Vec<CaseResult> = Case::ALL
            .iter()
            .map(|&case| CaseResult {
                case,
                hist: Histogram::empty(),
                rounds: Vec::new(),
                cpus: String::new(),
                stress_cpus: None,
                loads: Vec::new(),
            })
            .collect();
        for round in 0..cfg.rounds {
            for k in 0..Case::ALL.len() {
                let case = Case::ALL[(round + k) % Case::ALL.len()];
                eprintln!("round {}/{}: {} ({} s)", round + 1, cfg.rounds, case.label(), cfg.duration_s);
                let run = run_case(cfg, &agent, &manifests, cpu_root.as_deref(), case, round)?;
                eprintln!(
                    "  {} samples on CPUs {}: avg {:.0} (buckets' mean {:.1}), p99 {}, p99.99 {}, max {}",
                    run.hist.samples(),
                    run.cpus,
                    run.hist.avg(),
                    run.hist.bucket_mean(),
                    run.hist.percentile(0.99),
                    run.hist.percentile(0.9999),
                    run.hist.max_us
                );
                let r = results.iter_mut().find(|r| r.case == case).context("case")?;
                r.hist.merge(&run.hist);
                r.rounds.push(run.hist);
                r.cpus = run.cpus;
                r.stress_cpus = run.stress_cpus.or(r.stress_cpus.take());
                r.loads.push(loadavg_1min());
            }
        }
        Ok(results)
    })();

    // Clean up whatever happened: remove every manifest, let the agent stop them.
    clear(&manifests)?;
    let cleaned = agent.wait("every pod stopped", Duration::from_secs(60), |a| a.pods().is_some_and(|p| p == 0));
    agent.stop()?;
    let restored = budget.restore();
    let results = result?;
    cleaned?;
    restored?;
    Ok(results)
}

struct Run {
    hist: Histogram,
    cpus: String,
    stress_cpus: Option<String>,
}

fn run_case(
    cfg: &Config,
    agent: &Agent,
    manifests: &Path,
    cpu_root: Option<&Path>,
    case: Case,
    round: usize,
) -> anyhow::Result<Run> {
    let mut stress_cpus: Option<String> = None;
    if case.loaded() {
        place(manifests, "stress-burstable", &stress_burstable())?;
        place(manifests, "stress-besteffort", &stress_besteffort())?;
        for stem in ["stress-burstable", "stress-besteffort"] {
            agent.first_line(stem, Duration::from_secs(60))?;
        }
        std::thread::sleep(WARMUP);
    }

    let stem = format!("lat-{}-{round}", case.tag());
    let marker = format!("pinion-bench-latency-{}-{stem}", std::process::id());
    place(manifests, &stem, &cyclictest_pod(cfg, case, &stem, &marker))?;
    make_realtime(&marker, cpu_root)?;
    let cpus = agent.first_line(&stem, Duration::from_secs(30))?;
    if case.loaded() {
        // The stress pods started on the whole shared pool; the agent shrinks
        // their cpusets when an exclusive pod arrives. What they have now:
        let mut now = Vec::new();
        for stem in ["stress-burstable", "stress-besteffort"] {
            let pid = find_process(&stress_marker(stem)).with_context(|| format!("{stem}'s shell"))?;
            now.push(cpus_allowed(pid)?);
        }
        stress_cpus = Some(now.join(" & "));
    }
    let budget = Duration::from_secs(cfg.duration_s + 60);
    agent.wait(&format!("{stem} to finish"), budget, |a| {
        a.phase(&stem).is_some_and(|p| p == "Succeeded" || p == "Failed")
    })?;
    let log = std::fs::read_to_string(agent.log(&stem))?;
    if agent.phase(&stem).as_deref() != Some("Succeeded") {
        bail!("{stem} failed; its log:\n{log}");
    }
    let hist = Histogram::parse(&log).with_context(|| format!("{stem}'s log:\n{log}"))?;
    if case.loaded() {
        // The load was there all along: both stress pods still run, never restarted.
        for stem in ["stress-burstable", "stress-besteffort"] {
            let c = agent.status().map(|s| s["pods"][format!("static/{stem}")]["containerStatuses"][0].clone());
            if !c.as_ref().is_some_and(|c| c["state"] == "Running" && c["restartCount"] == 0) {
                bail!("{stem} did not run through the case: {c:?}\n{}", read_log(&agent.log(stem)));
            }
        }
    }

    clear(manifests)?;
    agent.wait("the case's pods to stop", Duration::from_secs(60), |a| a.pods().is_some_and(|p| p == 0))?;
    Ok(Run { hist, cpus, stress_cpus })
}

fn cyclictest_pod(cfg: &Config, case: Case, name: &str, marker: &str) -> String {
    // The shell prints its CPUs, waits until the bench has made it SCHED_FIFO,
    // then becomes cyclictest. `marker` ($0) is how the bench finds it.
    let script = format!(
        "grep Cpus_allowed_list /proc/self/status; \
         until chrt -p $$ | grep -q SCHED_FIFO; do sleep 0.02; done; \
         exec cyclictest -m -t1 {} -i{} -D{} -q -h{HIST_US}",
        cfg.policy.cyclictest_args(),
        cfg.interval_us,
        cfg.duration_s
    );
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 0\n{}  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, '{script}', {marker}]\n    resources: {}\n",
        case.tuning(),
        case.resources()
    )
}

/// Burstable: up to two CPUs used, two CPU hogs; no CPU requested, because
/// with CPU 0 reserved this host offers one allocatable CPU and the exclusive
/// cyclictest pod requests it (the node's allocatable check would refuse more).
fn stress_burstable() -> String {
    stress_pod(
        "stress-burstable",
        "stress-ng --cpu 2 --timeout 1h --temp-path /tmp",
        "\n    resources: {requests: {cpu: '0', memory: 64Mi}, limits: {cpu: '2', memory: 256Mi}}",
    )
}

/// BestEffort: no resources; context switches (pipe ping-pong), page
/// faults over 64 MiB and TCP over loopback (the network's softirqs), the
/// kernel-heavy kind of noise.
fn stress_besteffort() -> String {
    stress_pod(
        "stress-besteffort",
        "stress-ng --switch 1 --vm 1 --vm-bytes 64M --sock 1 --timeout 1h --temp-path /tmp",
        "",
    )
}

/// The stress pod's shell stays (no `exec`) so that the bench can find it by
/// its `$0` and read the CPUs its container has now.
fn stress_pod(name: &str, command: &str, resources: &str) -> String {
    let marker = stress_marker(name);
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, 'grep Cpus_allowed_list /proc/self/status; {command}; exit $?', {marker}]{resources}\n"
    )
}

fn stress_marker(name: &str) -> String {
    format!("pinion-bench-latency-{}-{name}", std::process::id())
}

fn cpus_allowed(pid: u32) -> anyhow::Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
        .with_context(|| format!("no Cpus_allowed_list in /proc/{pid}/status"))
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()))
}

/// Writes a manifest the way a careful tool does: a hidden temp file renamed in.
fn place(dir: &Path, stem: &str, text: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{stem}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(format!("{stem}.yaml")))?;
    Ok(())
}

fn clear(dir: &Path) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        std::fs::remove_file(e.path())?;
    }
    Ok(())
}

/// Finds the pod's shell by its `$0`, gives its `cpu` cgroup a realtime budget
/// and makes it SCHED_FIFO (see the module comment for why from outside).
fn make_realtime(marker: &str, cpu_root: Option<&Path>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(pid) = find_process(marker) {
            break pid;
        }
        if Instant::now() > deadline {
            bail!("no process {marker} after 30 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if let Some(root) = cpu_root {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let rel = cgroup
            .lines()
            .filter_map(|l| {
                // `ID:CONTROLLERS:PATH`
                let mut f = l.splitn(3, ':').skip(1);
                f.next().zip(f.next())
            })
            .find(|(controllers, _)| controllers.split(',').any(|c| c == "cpu"))
            .map(|(_, path)| path.trim_start_matches('/').to_string())
            .context("the pod's cpu cgroup")?;
        let file = root.join(rel).join("cpu.rt_runtime_us");
        std::fs::write(&file, RT_BUDGET_US.to_string()).with_context(|| format!("writing {}", file.display()))?;
    }
    let ok = Command::new("chrt")
        .args(["-f", "-p", &RT_PRIORITY.to_string(), &pid.to_string()])
        .status()
        .context("running chrt")?
        .success();
    if !ok {
        bail!("chrt -f -p {RT_PRIORITY} {pid} failed");
    }
    Ok(())
}

fn find_process(marker: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        cmdline.split(|b| *b == 0).any(|arg| arg == marker.as_bytes()).then_some(pid)
    })
}

/// Where the cgroup v1 `cpu` controller is mounted, when its groups have a
/// realtime budget (`CONFIG_RT_GROUP_SCHED`); `None` when none is needed.
fn cpu_cgroup_root() -> anyhow::Result<Option<PathBuf>> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let root = mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpu")).then(|| PathBuf::from(f[1]))
    });
    Ok(root.filter(|r| r.join("cpu.rt_runtime_us").exists()))
}

/// The realtime budget of the `/pinion` cgroup, granted for the run.
struct RtBudget {
    file: Option<(PathBuf, String)>,
}

impl RtBudget {
    fn grant(cpu_root: Option<&Path>) -> anyhow::Result<RtBudget> {
        let Some(root) = cpu_root else { return Ok(RtBudget { file: None }) };
        let dir = root.join("pinion");
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("cpu.rt_runtime_us");
        let old = std::fs::read_to_string(&file)?.trim().to_string();
        std::fs::write(&file, RT_BUDGET_US.to_string()).with_context(|| format!("writing {}", file.display()))?;
        Ok(RtBudget { file: Some((file, old)) })
    }

    fn restore(self) -> anyhow::Result<()> {
        if let Some((file, old)) = self.file {
            match std::fs::write(&file, &old) {
                // The agent removes its emptied `/pinion` cgroup when it
                // stops, and the budget goes with it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r.with_context(|| format!("restoring {} to {old}", file.display()))?,
            }
        }
        Ok(())
    }
}

struct Agent {
    child: Child,
    data: PathBuf,
}

impl Agent {
    fn start(pinion: &Path, manifests: &Path, data: &Path) -> anyhow::Result<Agent> {
        let child = Command::new(pinion)
            .args(["agent", "--runtime", "libcontainer", "--reserved-cpus", "0"])
            .arg("--manifests")
            .arg(manifests)
            .arg("--data-dir")
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting pinion agent")?;
        Ok(Agent { child, data: data.to_path_buf() })
    }

    fn status(&self) -> Option<serde_json::Value> {
        let bytes = std::fs::read(self.data.join("status.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn pods(&self) -> Option<usize> {
        self.status().and_then(|v| v["pods"].as_object().map(|p| p.len()))
    }

    fn phase(&self, stem: &str) -> Option<String> {
        self.status().and_then(|v| v["pods"][format!("static/{stem}")]["phase"].as_str().map(str::to_string))
    }

    fn log(&self, stem: &str) -> PathBuf {
        nodelet::endpoint::newest_log(&self.data, &format!("static/{stem}"), "main")
    }

    /// The value on the first line a pod printed (`Cpus_allowed_list:\tN`).
    fn first_line(&self, stem: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            // Found anew each time: the pod's log folder appears with its start.
            if let Ok(text) = std::fs::read_to_string(self.log(stem)) {
                if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
                    return Ok(line.split_once(':').map_or(line, |(_, v)| v).trim().to_string());
                }
            }
            if Instant::now() > deadline {
                bail!("{stem}: no output after {timeout:?}: {:?}", self.status().map(|s| s["pods"].clone()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait(&self, what: &str, timeout: Duration, pred: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !pred(self) {
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}: {:?}", self.status());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn stop(mut self) -> anyhow::Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM)?;
        self.child.wait()?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The host.

fn ensure_tools() -> anyhow::Result<()> {
    let present = |tool: &str| Command::new(tool).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status();
    let missing = ["cyclictest", "stress-ng", "chrt"].iter().any(|t| present(t).is_err()) || !Path::new(FONT).exists();
    if !missing {
        return Ok(());
    }
    eprintln!("installing rt-tests, stress-ng and fonts-dejavu-core (apt-get)");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "rt-tests", "stress-ng", "fonts-dejavu-core", "util-linux"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
    };
    // Update the package lists only when the install cannot find the packages.
    let ok = install()? || (Command::new("apt-get").args(["update", "-qq"]).status()?.success() && install()?);
    if !ok {
        bail!("apt-get install rt-tests stress-ng fonts-dejavu-core failed");
    }
    Ok(())
}

/// Runs this process (its polling, `chrt`) on the reserved CPU 0.
fn pin_to_reserved_cpu() -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(0)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).context("pinning the bench to CPU 0")?;
    Ok(())
}

/// Asks the kernel for zero wake-up latency from idle states while the file
/// stays open, as cyclictest does when it runs on the host (inside a pod it
/// has no `/dev/cpu_dma_latency`). On this VM that keeps an idle vCPU polling
/// instead of halting, the same for every case.
fn hold_pm_qos() -> anyhow::Result<Option<std::fs::File>> {
    use std::io::Write;
    let path = Path::new("/dev/cpu_dma_latency");
    if !path.exists() {
        return Ok(None);
    }
    let mut f = std::fs::OpenOptions::new().write(true).open(path).context("opening /dev/cpu_dma_latency")?;
    f.write_all(&0i32.to_ne_bytes()).context("writing /dev/cpu_dma_latency")?;
    Ok(Some(f))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn loadavg_1min() -> f64 {
    loadavg().split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

// ---------------------------------------------------------------------------
// The chart.

fn draw(cfg: &Config, results: &[CaseResult], load: &str) -> anyhow::Result<()> {
    let font = std::fs::read(FONT).with_context(|| format!("reading {FONT}"))?;
    // plotters' ab_glyph backend keeps fonts for the whole process.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| anyhow::anyhow!("{FONT} is not a font plotters can read"))?;

    let root = BitMapBackend::new(&cfg.png, (1400, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let title = format!(
        "cyclictest in a pinion pod: {} x {} s per case, -i{} µs, {}, PM QoS 0; 2-vCPU VM, CPU 0 reserved; load avg {load}",
        cfg.rounds,
        cfg.duration_s,
        cfg.interval_us,
        cfg.policy.describe()
    );
    let root = root.titled(&title, ("sans-serif", 20)).map_err(plot_err)?;
    let (left, right) = root.split_horizontally(720);
    draw_tail(&left, results)?;
    draw_bars(&right, results)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}

/// Left: share of wake-ups at least x late, log-log (the tail, where p99,
/// p99.9 and p99.99 are where a curve crosses 1e-2, 1e-3 and 1e-4).
fn draw_tail(area: &DrawingArea<BitMapBackend<'_>, Shift>, results: &[CaseResult]) -> anyhow::Result<()> {
    let min_share = results.iter().map(|r| 1.0 / r.hist.samples().max(1) as f64).fold(1.0, f64::min) / 2.0;
    let mut chart = ChartBuilder::on(area)
        .caption("Latency tail, all rounds pooled (wake-ups over 10 ms end at the right edge)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(125)
        .build_cartesian_2d((1f64..HIST_US as f64).log_scale(), (min_share..1f64).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("wake-up latency (µs)")
        .y_desc("share of wake-ups at least this late")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .y_label_formatter(&|v| match format!("{v:.0e}").as_str() {
            "1e-2" => "1% (p99)".into(),
            "1e-3" => "0.1% (p99.9)".into(),
            "1e-4" => "0.01% (p99.99)".into(),
            other => other.into(),
        })
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(plot_err)?;
    for r in results {
        let color = r.case.color();
        let points: Vec<(f64, f64)> = (1..HIST_US)
            .map(|us| (us as f64, r.hist.share_at_least(us)))
            .take_while(|(_, share)| *share > 0.0)
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(plot_err)?
            .label(r.case.legend())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// Right: grouped bars, one group per statistic, one bar per case (log scale).
fn draw_bars(area: &DrawingArea<BitMapBackend<'_>, Shift>, results: &[CaseResult]) -> anyhow::Result<()> {
    const STATS: [&str; 5] = ["avg", "p99", "p99.9", "p99.99", "max"];
    let value = |h: &Histogram, stat: usize| -> f64 {
        match stat {
            0 => h.avg(),
            1 => h.percentile(0.99).value() as f64,
            2 => h.percentile(0.999).value() as f64,
            3 => h.percentile(0.9999).value() as f64,
            _ => h.max_us as f64,
        }
    };
    let top = results.iter().map(|r| r.hist.max_us as f64).fold(10.0, f64::max) * 3.0;
    let mut chart = ChartBuilder::on(area)
        .caption("Summary per case (log scale)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..STATS.len() as f64, (1f64..top).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        // Ticks every 0.5; only the middle of each group is named.
        .x_labels(STATS.len() * 2 + 1)
        .x_label_formatter(&|x| match STATS.get(x.floor() as usize) {
            Some(name) if (x.fract() - 0.5).abs() < 0.01 => name.to_string(),
            _ => String::new(),
        })
        .x_desc("statistic")
        .y_desc("wake-up latency (µs)")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(plot_err)?;
    let width = 0.8 / results.len() as f64;
    for (k, r) in results.iter().enumerate() {
        let color = r.case.color();
        chart
            .draw_series((0..STATS.len()).map(|s| {
                let x0 = s as f64 + 0.1 + k as f64 * width;
                Rectangle::new([(x0, 1.0), (x0 + width * 0.9, value(&r.hist, s).max(1.0))], color.filled())
            }))
            .map_err(plot_err)?
            .label(r.case.label())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart
            .draw_series((0..STATS.len()).map(|s| {
                let v = value(&r.hist, s);
                let x = s as f64 + 0.1 + k as f64 * width;
                Text::new(format!("{v:.0}"), (x, v.max(1.0) * 1.15), ("sans-serif", 11))
            }))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "Cpus_allowed_list:\t1\nWARN: stat /dev/cpu_dma_latency failed: No such file or directory\n\
        000000 000000\n000001 000000\n000002 000005\n000003 000003\n000004 000001\n\
        # Total: 000000009\n# Min Latencies: 00002\n# Avg Latencies: 00003\n# Max Latencies: 12000\n\
        # Histogram Overflows: 00001\n# Histogram Overflow at cycle number:\n# Thread 0: 00042\n";

    fn check(p: f64, expected: Latency) {
        let h = Histogram::parse(LOG).expect("parses");
        assert_eq!(h.percentile(p), expected, "p{p}");
    }

    #[test]
    fn percentiles_from_the_histogram() {
        // 10 samples: 5 at 2 µs, 3 at 3 µs, 1 at 4 µs, 1 overflow.
        check(0.5, Latency::Us(2));
        check(0.8, Latency::Us(3));
        check(0.9, Latency::Us(4));
        check(0.99, Latency::Over(HIST_US as u64));
    }

    #[test]
    fn parse_and_merge() {
        let h = Histogram::parse(LOG).expect("parses");
        assert_eq!((h.samples(), h.overflows, h.max_us), (10, 1, 12_000));
        let mut m = h.clone();
        m.merge(&h);
        assert_eq!(m.samples(), 20);
        assert!((m.avg() - 3.0).abs() < 1e-9);
        assert!((m.share_at_least(3) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_log_without_summary_is_an_error() {
        let err =
            Histogram::parse("Cpus_allowed_list:\t1\nUnable to change scheduling policy!\n").expect_err("no summary");
        assert!(err.to_string().contains("no cyclictest summary"), "{err}");
    }

    #[test]
    fn a_total_that_disagrees_is_an_error() {
        let err = Histogram::parse(&LOG.replace("# Total: 000000009", "# Total: 000000010")).expect_err("wrong total");
        assert!(err.to_string().contains("cyclictest's total says 10"), "{err}");
    }
}
