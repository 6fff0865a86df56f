//! Batch benchmark: `pinion batch` beside `sbatch` on a local Slurm tuned as
//! its high-throughput guide says (`e2e::slurm`, `Tuning::HighThroughput`),
//! in one pass, both scheduling onto this host's one allocatable CPU (CPU 0
//! kept for the system on both sides).
//!
//! 1. Submission to start: a one-CPU job script whose first command prints
//!    the clock (`date +%s%N`) into its output file; from just before the
//!    submitting command is spawned to that instant, read back from the file.
//!    Interleaved, `--runs` times each, each on an idle cluster (the previous
//!    job ended). The submitting command's own wall time is reported too.
//! 2. Submissions per second: `--burst` job scripts submitted one after the
//!    other, each its own `pinion batch` or `sbatch` process, as a user's
//!    loop does; then the time until the last of them ended (jobs per
//!    second). One side's burst drains before the other's starts.
//!
//! Usage (as root): `bench_batch [--runs N] [--burst N] [--pinion PATH]`
//! (defaults 20, 100, `target/release/pinion`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use e2e::slurm::{Slurm, Tuning};
use e2e::stats::{load_average, Summary};
use e2e::up::{timed, Up};

struct Opts {
    runs: usize,
    burst: usize,
    pinion: PathBuf,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts { runs: 20, burst: 100, pinion: PathBuf::from("target/release/pinion") };
    let mut args = e2e::args::Args::from_env();
    while let Some(a) = args.flag() {
        match a.as_str() {
            "--runs" => o.runs = args.num("--runs")?,
            "--burst" => o.burst = args.num("--burst")?,
            "--pinion" => o.pinion = args.path("--pinion")?,
            other => bail!("unknown argument {other}"),
        }
    }
    o.pinion = std::fs::canonicalize(&o.pinion).with_context(|| o.pinion.display().to_string())?;
    Ok(o)
}

/// How long a job may take to start, or a burst to drain, before the
/// benchmark gives up.
const START_LIMIT: Duration = Duration::from_secs(60);
const DRAIN_LIMIT: Duration = Duration::from_secs(1800);

fn now_ns() -> anyhow::Result<u128> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos())
}

/// Which batch system a submission goes to.
enum Side<'a> {
    Pinion(&'a Up),
    Slurm(&'a Slurm),
}

impl Side<'_> {
    /// The submitting command for `script`, its output to `out`.
    fn submit(&self, name: &str, script: &Path, out: &Path) -> Command {
        let out = out.display().to_string();
        let flags = ["-J", name, "-c", "1", "-t", "5", "-o", &out];
        match self {
            Side::Pinion(up) => {
                let mut c = up.cmd();
                c.arg("batch").args(flags).args(["--mem", "16M"]).arg(script);
                c
            }
            Side::Slurm(sl) => {
                let mut c = sl.command("sbatch");
                c.args(flags).arg("--mem=16").arg(script);
                c
            }
        }
    }

    /// Whether nothing is queued or running.
    fn idle(&self) -> anyhow::Result<bool> {
        match self {
            Side::Pinion(up) => {
                let out = up.cmd().arg("queue").output().context("pinion queue")?;
                if !out.status.success() {
                    bail!("pinion queue: {}", String::from_utf8_lossy(&out.stderr).trim());
                }
                Ok(String::from_utf8_lossy(&out.stdout).lines().skip(1).all(|l| l.trim().is_empty()))
            }
            Side::Slurm(sl) => sl.queue_empty(),
        }
    }

    fn wait_idle(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while !self.idle()? {
            if Instant::now() > deadline {
                bail!("the queue did not drain in {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

fn write_script(path: &Path, body: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}\n"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Milliseconds from the submission to the job's first command, and the
/// submitting command's own wall time.
fn to_start(side: &Side<'_>, name: &str, script: &Path, out: &Path) -> anyhow::Result<(f64, f64)> {
    let before = now_ns()?;
    let submit_ms = timed(&mut side.submit(name, script, out))?;
    let deadline = Instant::now() + START_LIMIT;
    let started: u128 = loop {
        if let Some(line) = std::fs::read_to_string(out).ok().and_then(|t| t.lines().next().map(str::to_string)) {
            break line.trim().parse().with_context(|| format!("{}: {line:?}", out.display()))?;
        }
        if Instant::now() > deadline {
            bail!("{name} did not start in {START_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    side.wait_idle(START_LIMIT)?;
    Ok(((started.saturating_sub(before)) as f64 / 1e6, submit_ms))
}

/// Submissions per second of `n` scripts submitted one by one, and jobs per
/// second from the first submission until the queue is empty again.
fn burst(side: &Side<'_>, tag: &str, n: usize, script: &Path, dir: &Path) -> anyhow::Result<(f64, f64)> {
    let start = Instant::now();
    for i in 0..n {
        let name = format!("{tag}{i}");
        timed(&mut side.submit(&name, script, &dir.join(format!("{name}.out"))))?;
    }
    let submitted = start.elapsed().as_secs_f64();
    side.wait_idle(DRAIN_LIMIT)?;
    Ok((n as f64 / submitted, n as f64 / start.elapsed().as_secs_f64()))
}

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    // The jobs' output lands here: the same path on both sides, readable by
    // the jobs' user (root for the admin's jobs, as for sbatch run as root).
    let dir = tempfile::Builder::new().prefix("pinion-bench-batch-").tempdir()?;
    let stamp = dir.path().join("stamp.sh");
    write_script(&stamp, "date +%s%N")?;
    let noop = dir.path().join("noop.sh");
    write_script(&noop, "true")?;

    let slurm = Slurm::start("0", Tuning::HighThroughput, Duration::from_secs(60))?;
    let up = Up::start(&o.pinion, &["--reserved-cpus", "0"])?;
    let load_before = load_average();
    let (pinion, sbatch) = (Side::Pinion(&up), Side::Slurm(&slurm));
    // One of each first, unmeasured: the first image unpack and the first
    // slurmstepd are not what a submission costs.
    to_start(&pinion, "pw", &stamp, &dir.path().join("pw.out"))?;
    to_start(&sbatch, "sw", &stamp, &dir.path().join("sw.out"))?;
    let (mut p_start, mut p_submit, mut s_start, mut s_submit) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..o.runs {
        let (a, b) = to_start(&pinion, &format!("p{i}"), &stamp, &dir.path().join(format!("p{i}.out")))?;
        p_start.push(a);
        p_submit.push(b);
        let (a, b) = to_start(&sbatch, &format!("s{i}"), &stamp, &dir.path().join(format!("s{i}.out")))?;
        s_start.push(a);
        s_submit.push(b);
    }
    let p_burst = burst(&pinion, "pb", o.burst, &noop, dir.path())?;
    let s_burst = burst(&sbatch, "sb", o.burst, &noop, dir.path())?;
    let load_after = load_average();
    drop(up);
    drop(slurm);

    println!("batch path, one pass (load average {load_before:.2} before, {load_after:.2} after)");
    println!("1. submission to the job's first command, {} runs each, interleaved, idle cluster", o.runs);
    let line = |name: &str, s: &Summary| {
        format!("{name:<34} median {:>7.1} ms  p99 {:>7.1} ms  min {:>7.1} ms", s.median, s.p99, s.min)
    };
    let (ps, ss) = (Summary::of(&p_start), Summary::of(&s_start));
    println!("{}", line("pinion batch: to start", &ps));
    println!("{}", line("sbatch (Slurm tuned): to start", &ss));
    println!("   ratio of medians pinion/sbatch: {:.2}", ps.median / ss.median);
    println!("{}", line("pinion batch: the command itself", &Summary::of(&p_submit)));
    println!("{}", line("sbatch: the command itself", &Summary::of(&s_submit)));
    println!("2. {} submissions, one process each, then drained", o.burst);
    println!("   pinion batch: {:.1} submissions/s, {:.1} jobs/s to the last end", p_burst.0, p_burst.1);
    println!("   sbatch      : {:.1} submissions/s, {:.1} jobs/s to the last end", s_burst.0, s_burst.1);
    Ok(())
}
