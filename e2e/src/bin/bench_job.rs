//! Job-path benchmark: submission to completion as an HPC user sees it, beside
//! Slurm (Debian `slurm-wlm`, set up here by `e2e::slurm`), in one pass.
//!
//! 1. One-liner: `pinion run bj --cpus 1 --rm -- true` against `srun
//!    --cpu-bind=cores -c1 true`, interleaved, `--runs` times each: the wall
//!    time of the client command, from its spawn to its exit.
//! 2. Queue: `--queue` one-CPU `true` jobs submitted at once onto this host's
//!    one allocatable CPU (CPU 0 reserved on both sides), so each job waits for
//!    the previous one's CPU: `pinion run q --array 1-N --cpus 1 -- true`
//!    (returns when every task ended) against `sbatch --array=1-N -c1 --wrap
//!    true` followed by `squeue` every 10 ms until the queue is empty. Jobs per
//!    second from the submission to the last completion.
//! 3. Control path alone: the same queue with the hollow runtime on a
//!    synthetic 64-CPU node (`true` ends at once there), `--hollow-jobs`
//!    tasks, twice: submitted with `run --array -d` and their completions
//!    counted from one label watch the benchmark opens before the submission
//!    (the control path: API, scheduler, node, reports), and with `run
//!    --array` following every task's attach stream as a user would.
//!
//! Usage (as root): `bench_job [--runs N] [--queue N] [--hollow-jobs N]
//! [--pinion PATH] [--no-slurm]` (defaults 50, 200, 1000,
//! `target/release/pinion`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::slurm::Slurm;
use e2e::stats::{load_average, Summary};

struct Opts {
    runs: usize,
    queue: usize,
    hollow_jobs: usize,
    pinion: PathBuf,
    slurm: bool,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o =
        Opts { runs: 50, queue: 200, hollow_jobs: 1000, pinion: PathBuf::from("target/release/pinion"), slurm: true };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> anyhow::Result<usize> {
            args.next().with_context(|| format!("{what} N"))?.parse().with_context(|| what.to_string())
        };
        match a.as_str() {
            "--runs" => o.runs = num("--runs")?,
            "--queue" => o.queue = num("--queue")?,
            "--hollow-jobs" => o.hollow_jobs = num("--hollow-jobs")?,
            "--pinion" => o.pinion = PathBuf::from(args.next().context("--pinion PATH")?),
            "--no-slurm" => o.slurm = false,
            other => bail!("unknown argument {other}"),
        }
    }
    o.pinion = std::fs::canonicalize(&o.pinion).with_context(|| o.pinion.display().to_string())?;
    Ok(o)
}

/// `pinion up` in a temporary folder: its own data dir, port and credentials.
struct Up {
    child: Child,
    dir: tempfile::TempDir,
    pinion: PathBuf,
}

impl Up {
    fn start(pinion: &Path, extra: &[&str]) -> anyhow::Result<Up> {
        let dir = tempfile::Builder::new().prefix("pinion-bench-job-").tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::File::create(dir.path().join("up.log"))?;
        let child = Command::new(pinion)
            .arg("up")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("PINION_CONFIG", dir.path().join("config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting pinion up")?;
        let up = Up { child, dir, pinion: pinion.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = up.cmd().args(["get", "nodes"]).output()?;
            let table = String::from_utf8_lossy(&out.stdout);
            if table.lines().skip(1).any(|l| l.split_whitespace().any(|w| w == "Ready")) {
                return Ok(up);
            }
            if Instant::now() > deadline {
                bail!("no Ready node after 60 s (log: {})", up.dir.path().join("up.log").display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.pinion);
        c.env("PINION_CONFIG", self.dir.path().join("config"));
        c
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command to its end; milliseconds from spawn to exit. A failure is
/// an error with the command's output: a benchmark of failing jobs says nothing.
fn timed(cmd: &mut Command) -> anyhow::Result<f64> {
    let start = Instant::now();
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("{cmd:?}"))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "{cmd:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(ms)
}

fn one_liner(up: &Up, slurm: Option<&Slurm>, runs: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let pinion_run = || {
        let mut c = up.cmd();
        c.args(["run", "bj", "--cpus", "1", "--memory", "64Mi", "--rm", "--", "true"]);
        c
    };
    let srun = |s: &Slurm| {
        let mut c = s.command("srun");
        c.args(["--cpu-bind=cores", "-c1", "--mem=64", "true"]);
        c
    };
    // Warm-up: page cache, the first TLS session, Slurm's first step.
    for _ in 0..3 {
        timed(&mut pinion_run())?;
        if let Some(s) = slurm {
            timed(&mut srun(s))?;
        }
    }
    let (mut p, mut s) = (Vec::new(), Vec::new());
    for i in 0..runs {
        // Alternate which goes first, so neither always follows the other's tail.
        if i % 2 == 0 {
            p.push(timed(&mut pinion_run())?);
        }
        if let Some(sl) = slurm {
            s.push(timed(&mut srun(sl))?);
        }
        if i % 2 == 1 {
            p.push(timed(&mut pinion_run())?);
        }
    }
    Ok((p, s))
}

/// Jobs per second of an array of `n` one-CPU `true` jobs through `pinion run`.
fn pinion_queue(up: &Up, name: &str, n: usize) -> anyhow::Result<f64> {
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
    Ok(n as f64 / (ms / 1e3))
}

/// Jobs per second of an array submitted with `run -d`, counted done by a
/// watch on its label opened before the submission: no polling.
fn pinion_queue_watched(up: &Up, name: &str, n: usize) -> anyhow::Result<f64> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let creds = orchestrator::tls::Credentials::load(&up.dir.path().join("config"))?;
        let client = orchestrator::client::Client::new(&creds)?;
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

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    let slurm = if o.slurm { Some(Slurm::start("0", Duration::from_secs(60))?) } else { None };
    let load_before = load_average();

    let up = Up::start(&o.pinion, &["--reserved-cpus", "0"])?;
    let (p, s) = one_liner(&up, slurm.as_ref(), o.runs)?;
    let (pq, sq) = {
        let pq = pinion_queue(&up, "q", o.queue)?;
        let sq = match &slurm {
            Some(sl) => Some(slurm_queue(sl, o.queue)?),
            None => None,
        };
        (pq, sq)
    };
    drop(up);

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
    let hq = pinion_queue(&hollow, "h", o.hollow_jobs)?;
    drop(hollow);
    let load_after = load_average();

    println!("job path, one pass (load average {load_before:.2} before, {load_after:.2} after)");
    println!("1. one-liner, {} runs each, interleaved", o.runs);
    let ps = Summary::of(&p);
    println!("{}", line("pinion run --cpus 1 --rm -- true", &ps));
    if !s.is_empty() {
        let ss = Summary::of(&s);
        println!("{}", line("srun --cpu-bind=cores -c1 true", &ss));
        println!("   ratio of medians pinion/srun: {:.2}", ps.median / ss.median);
    }
    println!("2. queue of {} one-CPU true jobs on one allocatable CPU", o.queue);
    println!("   pinion run --array: {pq:.1} jobs/s ({:.1} ms per job)", 1e3 / pq);
    if let Some(sq) = sq {
        println!("   sbatch --array:     {sq:.1} jobs/s ({:.1} ms per job)", 1e3 / sq);
    }
    println!("3. hollow runtime, synthetic 64-CPU node, {} jobs", o.hollow_jobs);
    println!("   run --array -d, one watch: {hw:.1} jobs/s (the control path)");
    println!("   run --array, following:   {hq:.1} jobs/s (every task's attach stream)");
    Ok(())
}
