//! Job-path benchmark: submission to completion as an HPC user sees it, beside
//! Slurm (Debian `slurm-wlm`, set up here by `e2e::slurm`), in one pass.
//!
//! 1. One-liner: `pinion run bj --cpus 1 --rm -- true` against `srun
//!    --cpu-bind=cores -c1 true` and `runc run` of the same `true` pinned to
//!    CPU 1 (a bundle made here: a busybox-static rootfs, `runc spec` with
//!    `cpus` "1"; and a second bundle that also carries what a Pinion pod
//!    does: Docker's seccomp profile, the 64 MiB memory and the pids limit),
//!    interleaved, `--runs` times each: the wall time of the client command,
//!    from its spawn to its exit.
//! 2. Queue: `--queue` one-CPU `true` jobs submitted at once onto this host's
//!    one allocatable CPU (CPU 0 reserved on both sides), so each job waits for
//!    the previous one's CPU: `pinion run q --array 1-N --cpus 1 -- true`
//!    (returns when every task ended) against `sbatch --array=1-N -c1 --wrap
//!    true` followed by `squeue` every 10 ms until the queue is empty. Jobs per
//!    second from the submission to the last completion.
//!    Slurm runs tuned as its high-throughput guide says (`Tuning::
//!    HighThroughput`) for both; afterwards a Slurm as installed
//!    (`Tuning::AsInstalled`) runs its one-liner and queue alone.
//!    `--queue-rounds N` runs pinion's queue N times on the same cluster, one
//!    after another (each round's finished pods are still held by the node
//!    during the next), with the share of CPU 0 (the reserved CPU, where the
//!    server, the agent and the plugins run) that was busy during each.
//! 3. Control path alone: the same queue with the hollow runtime on a
//!    synthetic 64-CPU node (`true` ends at once there), `--hollow-jobs`
//!    tasks, twice: submitted with `run --array -d` and their completions
//!    counted from one label watch the benchmark opens before the submission
//!    (the control path: API, scheduler, node, reports), and with `run
//!    --array` following every task's attach stream as a user would.
//! 4. Two ranks on two nodes (`--two-nodes N`, instead of 1-3): this host as
//!    two nodes of one CPU each on both sides. Pinion: a server and two
//!    `pinion agent --runtime libcontainer`, one with `--reserved-cpus 0`, the
//!    other `1`; Slurm: two `slurmd` (`n1`, `n2`) with `CpuSpecList=0` and
//!    `1`. `pinion run bN -N 2 --cpus 1 -- sh -c 'echo rank $PINION_RANK'`
//!    against `srun -N 2 -c 1 --label sh -c 'echo rank $SLURM_PROCID'`,
//!    interleaved, N times each: from the client's spawn to both ranks' lines
//!    read from its stdout, and to its exit.
//!
//! `--pause-ms N` waits N ms before each one-liner: every start then comes
//! to an idle host, none within a second of another (the agent keeps the
//! kernel's cgroup-move lock ready for a second after a start, which would
//! otherwise serve the peers' runs between its own too).
//!
//! Usage (as root): `bench_job [--runs N] [--pause-ms N] [--queue N]
//! [--queue-rounds N] [--hollow-jobs N] [--two-nodes N] [--pinion PATH]
//! [--no-slurm] [--no-runc]` (defaults 50, 0, 200, 1, 1000, none,
//! `target/release/pinion`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::process::Proc;
use e2e::slurm::{Slurm, Tuning};
use e2e::stats::{load_average, Summary};
use e2e::up::{timed, Up};

struct Opts {
    runs: usize,
    pause: Duration,
    queue: usize,
    queue_rounds: usize,
    hollow_jobs: usize,
    two_nodes: usize,
    pinion: PathBuf,
    slurm: bool,
    runc: bool,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        runs: 50,
        pause: Duration::ZERO,
        queue: 200,
        queue_rounds: 1,
        hollow_jobs: 1000,
        two_nodes: 0,
        pinion: PathBuf::from("target/release/pinion"),
        slurm: true,
        runc: true,
    };
    let mut args = e2e::args::Args::from_env();
    while let Some(a) = args.flag() {
        match a.as_str() {
            "--runs" => o.runs = args.num("--runs")?,
            "--pause-ms" => o.pause = Duration::from_millis(args.num("--pause-ms")? as u64),
            "--queue" => o.queue = args.num("--queue")?,
            "--queue-rounds" => o.queue_rounds = args.num("--queue-rounds")?.max(1),
            "--hollow-jobs" => o.hollow_jobs = args.num("--hollow-jobs")?,
            "--two-nodes" => o.two_nodes = args.num("--two-nodes")?,
            "--pinion" => o.pinion = args.path("--pinion")?,
            "--no-slurm" => o.slurm = false,
            "--no-runc" => o.runc = false,
            other => bail!("unknown argument {other}"),
        }
    }
    o.pinion = std::fs::canonicalize(&o.pinion).with_context(|| o.pinion.display().to_string())?;
    Ok(o)
}

/// A runc bundle running `/bin/true` pinned to CPU 1, as a one-CPU job is on
/// a host whose CPU 0 is reserved: busybox-static's `/bin/busybox` as the
/// rootfs if the host has it, else the host's `true` and its libraries.
fn runc_bundle(equal: bool) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("pinion-bench-runc-").tempdir()?;
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    let busybox = Path::new("/bin/busybox");
    if busybox.exists() {
        std::fs::copy(busybox, rootfs.join("bin/busybox"))?;
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/true"))?;
    } else {
        let host_true = std::fs::canonicalize("/bin/true")?;
        std::fs::copy(&host_true, rootfs.join("bin/true"))?;
        let ldd = Command::new("ldd").arg(&host_true).output().context("ldd")?;
        for lib in String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
            let to = rootfs.join(lib.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().context("lib path")?)?;
            std::fs::copy(lib, to)?;
        }
    }
    let spec = Command::new("runc").arg("spec").current_dir(dir.path()).status().context("runc spec")?;
    if !spec.success() {
        bail!("runc spec: {spec}");
    }
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    config["process"]["args"] = serde_json::json!(["/bin/true"]);
    config["process"]["terminal"] = serde_json::json!(false);
    config["linux"]["resources"]["cpu"] = serde_json::json!({ "cpus": "1" });
    if equal {
        // What a Pinion pod carries besides: its seccomp profile (Docker's,
        // which runc compiles at each start) and its memory and pids limits.
        config["linux"]["seccomp"] = serde_json::to_value(nodelet::runtime::libcontainer::spec::default_seccomp(&[])?)?;
        config["linux"]["resources"]["memory"] = serde_json::json!({ "limit": 64u64 << 20 });
        config["linux"]["resources"]["pids"] = serde_json::json!({ "limit": nodelet::agent::DEFAULT_POD_PIDS_LIMIT });
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    Ok(dir)
}

/// `pinion run`, `srun` and `runc run` one-liners, interleaved: milliseconds each.
struct OneLiner {
    pinion: Vec<f64>,
    srun: Vec<f64>,
    runc: Vec<f64>,
    /// runc with the pod's seccomp profile and limits.
    runc_equal: Vec<f64>,
}

fn one_liner(up: &Up, slurm: Option<&Slurm>, runc: bool, runs: usize, pause: Duration) -> anyhow::Result<OneLiner> {
    let pinion_run = || {
        std::thread::sleep(pause);
        let mut c = up.cmd();
        c.args(["run", "bj", "--cpus", "1", "--memory", "64Mi", "--rm", "--", "true"]);
        c
    };
    let srun = |s: &Slurm| {
        std::thread::sleep(pause);
        let mut c = s.command("srun");
        c.args(["--cpu-bind=cores", "-c1", "--mem=64", "true"]);
        c
    };
    let bundle = if runc { Some(runc_bundle(false)?) } else { None };
    let equal = if runc { Some(runc_bundle(true)?) } else { None };
    let mut n = 0usize;
    // The wall time of `runc run` alone; `runc delete -f` after is not timed.
    let mut runc_run = |b: &Path| -> anyhow::Result<f64> {
        n += 1;
        let id = format!("pinion-bench-{}-{n}", std::process::id());
        std::thread::sleep(pause);
        let ms = timed(Command::new("runc").args(["run", "--bundle"]).arg(b).arg(&id));
        let _ = Command::new("runc").args(["delete", "-f", &id]).output();
        ms
    };
    // Warm-up: page cache, the first TLS session, Slurm's first step.
    for _ in 0..3 {
        timed(&mut pinion_run())?;
        if let Some(s) = slurm {
            timed(&mut srun(s))?;
        }
        for b in bundle.iter().chain(&equal) {
            runc_run(b.path())?;
        }
    }
    let mut o = OneLiner { pinion: Vec::new(), srun: Vec::new(), runc: Vec::new(), runc_equal: Vec::new() };
    for i in 0..runs {
        // Alternate which goes first, so none always follows another's tail.
        if i % 2 == 0 {
            o.pinion.push(timed(&mut pinion_run())?);
        }
        if let Some(sl) = slurm {
            o.srun.push(timed(&mut srun(sl))?);
        }
        if let Some(b) = &bundle {
            o.runc.push(runc_run(b.path())?);
        }
        if let Some(b) = &equal {
            o.runc_equal.push(runc_run(b.path())?);
        }
        if i % 2 == 1 {
            o.pinion.push(timed(&mut pinion_run())?);
        }
    }
    Ok(o)
}

/// CPU 0's busy and total time so far, in clock ticks (`/proc/stat`).
fn cpu0_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().find(|l| l.starts_with("cpu0 ")).context("/proc/stat has no cpu0 line")?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// Jobs per second of an array of `n` one-CPU `true` jobs through `pinion
/// run`, and the share of CPU 0 that was busy meanwhile.
fn pinion_queue(up: &Up, name: &str, n: usize) -> anyhow::Result<(f64, f64)> {
    let before = cpu0_ticks()?;
    let ms = timed(up.cmd().args([
        "run",
        name,
        "--array",
        &format!("1-{n}"),
        "--cpus",
        "1",
        "--memory",
        "16Mi",
        "--",
        "true",
    ]))?;
    let after = cpu0_ticks()?;
    let busy = (after.0 - before.0) as f64 / (after.1 - before.1).max(1) as f64;
    Ok((n as f64 / (ms / 1e3), busy))
}

/// Jobs per second of an array submitted with `run -d`, counted done by a
/// watch on its label opened before the submission: no polling.
fn pinion_queue_watched(up: &Up, name: &str, n: usize) -> anyhow::Result<f64> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let creds = orchestrator::tls::Credentials::load(&up.dir.path().join("config"))?;
        let client = pinion_wire::Client::new(&creds)?;
        let selector = format!("{}={name}", specs::pod::ARRAY_LABEL);
        let list = client.list_pods(Some(&selector)).await?;
        let mut watch = client.watch_pods(None, Some(&selector), Some(list.resource_version)).await?;
        let start = Instant::now();
        let submit = up
            .cmd()
            .args(["run", name, "--array", &format!("1-{n}"), "--cpus", "1", "--memory", "16Mi", "-d", "--", "true"])
            .stdout(Stdio::null())
            .status()?;
        if !submit.success() {
            bail!("pinion run --array -d: {submit}");
        }
        let mut done = std::collections::BTreeSet::new();
        while done.len() < n {
            let next = tokio::time::timeout(Duration::from_secs(120), watch.next()).await;
            let Ok(Some((_, pod))) = next.context("no change for 120 s")?.map_err(anyhow::Error::from) else {
                bail!("the watch ended after {} of {n} jobs", done.len());
            };
            match pod.status.as_ref().map(|s| s.phase) {
                Some(specs::PodPhase::Succeeded) => {
                    done.insert(pod.metadata.name);
                }
                Some(specs::PodPhase::Failed) => bail!("{} failed: {:?}", pod.metadata.name, pod.status),
                _ => {}
            }
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    })
}

fn slurm_queue(s: &Slurm, n: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let out = s
        .command("sbatch")
        .args(["--array", &format!("1-{n}"), "-c1", "--mem=16", "-o", "/dev/null", "--wrap", "true"])
        .output()
        .context("sbatch")?;
    if !out.status.success() {
        bail!("sbatch: {}", String::from_utf8_lossy(&out.stderr));
    }
    let deadline = start + Duration::from_secs(1800);
    while !s.queue_empty()? {
        if Instant::now() > deadline {
            bail!("slurm's queue did not drain in 30 min");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn line(name: &str, s: &Summary) -> String {
    format!("{name:<34} median {:>7.1} ms  p99 {:>7.1} ms  min {:>7.1} ms", s.median, s.p99, s.min)
}

/// A server and two agents on this host (real containers, libcontainer),
/// node `a` keeping CPU 0 for the system and `b` CPU 1, so each has one CPU
/// for jobs; as `e2e/scenarios/14-gang-real.yaml` sets it up.
struct TwoNodes {
    dir: tempfile::TempDir,
    pinion: PathBuf,
    // Agents first: they drop (are killed) before the server.
    agents: Vec<Proc>,
    _server: Proc,
}

impl TwoNodes {
    fn start(pinion: &Path) -> anyhow::Result<TwoNodes> {
        let dir = tempfile::Builder::new().prefix("pinion-bench-two-").tempdir()?;
        let log = dir.path().join("server.log");
        let file = std::fs::File::create(&log)?;
        let server = Proc(
            Command::new(pinion)
                .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
                .arg(dir.path().join("srv"))
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .spawn()
                .context("starting pinion server")?,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(a) = text.lines().find_map(|l| l.strip_prefix("listening on ")) {
                break a.split_whitespace().next().unwrap_or_default().to_string();
            }
            if Instant::now() > deadline {
                bail!("the server did not listen within 20 s (log: {})", log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let token = std::fs::read_to_string(dir.path().join("srv/join-token"))?;
        let mut nodes = TwoNodes { pinion: pinion.to_path_buf(), agents: Vec::new(), _server: server, dir };
        for (name, reserved) in [("a", "0"), ("b", "1")] {
            let file = std::fs::File::create(nodes.dir.path().join(format!("node-{name}.log")))?;
            let child = Command::new(pinion)
                .args(["agent", "--server", &format!("https://{addr}"), "--token", token.trim(), "--ca"])
                .arg(nodes.dir.path().join("srv/pki/ca.crt"))
                .arg("--data-dir")
                .arg(nodes.dir.path().join(format!("node-{name}")))
                .args(["--node-name", name, "--endpoint-listen", "127.0.0.1:0", "--runtime", "libcontainer"])
                .args(["--reserved-cpus", reserved])
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .spawn()
                .with_context(|| format!("starting agent {name}"))?;
            nodes.agents.push(Proc(child));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = nodes.cmd().args(["get", "nodes"]).output()?;
            let table = String::from_utf8_lossy(&out.stdout);
            let ready = table.lines().skip(1).filter(|l| l.split_whitespace().any(|w| w == "Ready")).count();
            if ready == 2 {
                return Ok(nodes);
            }
            if Instant::now() > deadline {
                bail!("{ready} of 2 nodes Ready after 60 s (logs in {})", nodes.dir.path().display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.pinion);
        c.env("PINION_CONFIG", self.dir.path().join("srv/admin.conf"));
        c
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        self.agents.clear();
        // Containers outlive their agent: whatever is left goes through the runtime.
        for name in ["a", "b"] {
            let data = self.dir.path().join(format!("node-{name}"));
            if let Ok(rt) = nodelet::runtime::libcontainer::LibcontainerRuntime::new(&data, &self.pinion) {
                use nodelet::runtime::Runtime;
                for id in rt.list().unwrap_or_default() {
                    let _ = rt.stop(&id, Duration::ZERO);
                    let _ = rt.remove(&id);
                }
            }
        }
    }
}

/// Runs a two-rank client command: milliseconds from its spawn to both
/// ranks' lines (`0: rank 0`, `1: rank 1`, as `--label` prints them) read
/// from its stdout, and to its exit. Fails on a missing line, a failed exit,
/// or after 60 s.
fn two_ranks(cmd: &mut Command) -> anyhow::Result<(f64, f64)> {
    use std::io::BufRead;
    let start = Instant::now();
    let mut child = Proc(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("{cmd:?}"))?,
    );
    let stdout = child.0.stdout.take().context("stdout")?;
    let stderr = child.0.stderr.take().context("stderr")?;
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let deadline = start + Duration::from_secs(60);
    let mut seen = [false, false];
    let mut first_lines: Option<Instant> = None;
    let mut output = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((at, line)) => {
                for (rank, s) in seen.iter_mut().enumerate() {
                    if line == format!("{rank}: rank {rank}") {
                        *s = true;
                    }
                }
                if first_lines.is_none() && seen == [true, true] {
                    first_lines = Some(at);
                }
                output.push_str(&line);
                output.push('\n');
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => bail!("{cmd:?}: no end after 60 s; output:\n{output}"),
        }
    }
    let status = child.0.wait()?;
    let exited = start.elapsed().as_secs_f64() * 1e3;
    let errors = errors.join().unwrap_or_default();
    let Some(first) = first_lines else { bail!("{cmd:?}: {status}, not both ranks' lines:\n{output}{errors}") };
    if !status.success() {
        bail!("{cmd:?}: {status}\n{output}{errors}");
    }
    Ok(((first - start).as_secs_f64() * 1e3, exited))
}

/// Part 4: `pinion run -N 2` against `srun -N 2`, interleaved, `runs` each.
fn two_node_pass(pinion: &Path, runs: usize, with_slurm: bool) -> anyhow::Result<()> {
    let slurm = if with_slurm {
        Some(Slurm::start_nodes(&["0", "1"], Tuning::HighThroughput, Duration::from_secs(60))?)
    } else {
        None
    };
    let nodes = TwoNodes::start(pinion)?;
    let load_before = load_average();
    let mut n = 0usize;
    let mut pinion_run = || {
        n += 1;
        let mut c = nodes.cmd();
        c.args(["run", &format!("b{n}"), "-N", "2", "--cpus", "1", "--", "sh", "-c", "echo rank $PINION_RANK"]);
        c
    };
    let srun = |s: &Slurm| {
        let mut c = s.command("srun");
        c.args(["-N", "2", "-c", "1", "--label", "sh", "-c", "echo rank $SLURM_PROCID"]);
        c
    };
    // Warm-up: page cache, the first TLS session, Slurm's first step.
    for _ in 0..3 {
        two_ranks(&mut pinion_run())?;
        if let Some(s) = &slurm {
            two_ranks(&mut srun(s))?;
        }
    }
    let (mut p, mut s) = (Vec::new(), Vec::new());
    for i in 0..runs {
        // Alternate which goes first, so neither always follows the other's tail.
        if i % 2 == 0 {
            p.push(two_ranks(&mut pinion_run())?);
        }
        if let Some(sl) = &slurm {
            s.push(two_ranks(&mut srun(sl))?);
        }
        if i % 2 == 1 {
            p.push(two_ranks(&mut pinion_run())?);
        }
    }
    let load_after = load_average();
    println!("two ranks on two one-CPU nodes of this host, {runs} runs each, interleaved (load average {load_before:.2} before, {load_after:.2} after)");
    let show = |name: &str, v: &[(f64, f64)]| {
        let first: Vec<f64> = v.iter().map(|x| x.0).collect();
        let exit: Vec<f64> = v.iter().map(|x| x.1).collect();
        let (f, e) = (Summary::of(&first), Summary::of(&exit));
        let (fp95, ep95) = (e2e::stats::percentile(&first, 95.0), e2e::stats::percentile(&exit, 95.0));
        println!(
            "{name:<62} both ranks' first line: p50 {:>6.1} ms  p95 {:>6.1} ms  min {:>6.1} ms | exit: p50 {:>6.1} ms  p95 {:>6.1} ms  min {:>6.1} ms",
            f.median, fp95, f.min, e.median, ep95, e.min
        );
        f.median
    };
    let pm = show("pinion run bN -N 2 --cpus 1 -- sh -c 'echo rank $PINION_RANK'", &p);
    if !s.is_empty() {
        let sm = show("srun -N 2 -c 1 --label sh -c 'echo rank $SLURM_PROCID'", &s);
        println!("   ratio of first-line medians pinion/srun: {:.2}", pm / sm);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    if o.two_nodes > 0 {
        return two_node_pass(&o.pinion, o.two_nodes, o.slurm);
    }
    let slurm = if o.slurm { Some(Slurm::start("0", Tuning::HighThroughput, Duration::from_secs(60))?) } else { None };
    let load_before = load_average();

    let up = Up::start(&o.pinion, &["--reserved-cpus", "0"])?;
    let one = one_liner(&up, slurm.as_ref(), o.runc, o.runs, o.pause)?;
    let (pq, sq) = {
        let pq = pinion_queue(&up, "q", o.queue)?;
        let sq = match &slurm {
            Some(sl) => Some(slurm_queue(sl, o.queue)?),
            None => None,
        };
        (pq, sq)
    };
    let mut rounds = vec![pq];
    for r in 1..o.queue_rounds {
        rounds.push(pinion_queue(&up, &format!("q{r}"), o.queue)?);
    }
    let (pq, _) = pq;
    drop(up);
    drop(slurm);
    // Slurm as installed, after: its one-liner alone, then its queue.
    let untuned = if o.slurm {
        let sl = Slurm::start("0", Tuning::AsInstalled, Duration::from_secs(60))?;
        let mut runs = Vec::new();
        for i in 0..o.runs + 3 {
            std::thread::sleep(o.pause);
            let ms = timed(sl.command("srun").args(["--cpu-bind=cores", "-c1", "--mem=64", "true"]))?;
            if i >= 3 {
                runs.push(ms);
            }
        }
        Some((runs, slurm_queue(&sl, o.queue)?))
    } else {
        None
    };

    let hollow = Up::start(
        &o.pinion,
        &["--runtime", "hollow", "--synthetic", "pack:1 numa:1 core:64 pu:1", "--reserved-cpus", "0"],
    )?;
    let hw = pinion_queue_watched(&hollow, "hw", o.hollow_jobs)?;
    drop(hollow);
    let hollow = Up::start(
        &o.pinion,
        &["--runtime", "hollow", "--synthetic", "pack:1 numa:1 core:64 pu:1", "--reserved-cpus", "0"],
    )?;
    let (hq, _) = pinion_queue(&hollow, "h", o.hollow_jobs)?;
    drop(hollow);
    let load_after = load_average();

    println!("job path, one pass (load average {load_before:.2} before, {load_after:.2} after)");
    match o.pause.as_millis() {
        0 => println!("1. one-liner, {} runs each, interleaved", o.runs),
        ms => println!("1. one-liner, {} runs each, interleaved, each after {ms} ms idle", o.runs),
    }
    let ps = Summary::of(&one.pinion);
    println!("{}", line("pinion run --cpus 1 --rm -- true", &ps));
    if !one.srun.is_empty() {
        let ss = Summary::of(&one.srun);
        println!("{}", line("srun (Slurm tuned)", &ss));
        println!("   ratio of medians pinion/srun: {:.2}", ps.median / ss.median);
    }
    if !one.runc.is_empty() {
        let rs = Summary::of(&one.runc);
        println!("{}", line("runc run (true, cpus 1)", &rs));
        println!("   ratio of medians pinion/runc: {:.2}", ps.median / rs.median);
    }
    if !one.runc_equal.is_empty() {
        let rs = Summary::of(&one.runc_equal);
        println!("{}", line("runc run, the pod's seccomp, memory and pids limits", &rs));
        println!("   ratio of medians pinion/runc (equal work): {:.2}", ps.median / rs.median);
    }
    println!("2. queue of {} one-CPU true jobs on one allocatable CPU", o.queue);
    println!("   pinion run --array: {pq:.1} jobs/s ({:.1} ms per job)", 1e3 / pq);
    for (i, (q, busy)) in rounds.iter().enumerate() {
        println!("   round {}: {q:.1} jobs/s, CPU 0 busy {:.0}%", i + 1, busy * 100.0);
    }
    if let Some(sq) = sq {
        println!("   sbatch --array (Slurm tuned): {sq:.1} jobs/s ({:.1} ms per job)", 1e3 / sq);
    }
    if let Some((runs, q)) = &untuned {
        println!("Slurm as installed (after the rest, not interleaved):");
        println!("{}", line("srun --cpu-bind=cores -c1 true", &Summary::of(runs)));
        println!("   sbatch --array: {q:.1} jobs/s ({:.1} ms per job)", 1e3 / q);
    }
    println!("3. hollow runtime, synthetic 64-CPU node, {} jobs", o.hollow_jobs);
    println!("   run --array -d, one watch: {hw:.1} jobs/s (the control path)");
    println!("   run --array, following:   {hq:.1} jobs/s (every task's attach stream)");
    Ok(())
}
