//! The peer runtimes the benchmarks compare with: Debian's `crun` and `runc`,
//! installed with apt-get when missing. crun 1.8 refuses this hybrid-cgroup
//! host ("cgroups in hybrid mode not supported") unless
//! `unified/cgroup.controllers` is hidden, so a benchmark enters one private
//! mount namespace that hides it ([`private_mount_namespace`]) before it starts
//! anything, and every runtime it compares (pinion's included) runs in it: none
//! pays for the trick alone.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The peers, in the order the benchmarks print them.
pub const TOOLS: [&str; 2] = ["crun", "runc"];

/// The side-by-side benchmarks' command line (`--runs N`, `--pinion PATH`) and
/// their setup: the peers installed, the private mount namespace entered.
/// Returns the run count and the canonical path of the pinion binary.
pub fn bench_setup() -> anyhow::Result<(usize, std::path::PathBuf)> {
    let mut runs = 50usize;
    let mut pinion = std::path::PathBuf::from("target/release/pinion");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().context("--runs N")?.parse()?,
            "--pinion" => pinion = std::path::PathBuf::from(args.next().context("--pinion PATH")?),
            other => bail!("unknown argument {other}"),
        }
    }
    let pinion = std::fs::canonicalize(&pinion).with_context(|| format!("{}", pinion.display()))?;
    ensure_tools()?;
    private_mount_namespace()?;
    Ok((runs, pinion))
}

/// Installs Debian's `crun` and `runc` when either is missing.
pub fn ensure_tools() -> anyhow::Result<()> {
    let missing = TOOLS.iter().any(|t| Command::new(t).arg("--version").output().is_err());
    if missing {
        eprintln!("installing crun and runc (apt-get)");
        let ok = Command::new("apt-get").args(["update", "-qq"]).status()?.success()
            && Command::new("apt-get")
                .args(["install", "-y", "-qq", "crun", "runc"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()?
                .success();
        if !ok {
            bail!("apt-get install crun runc failed");
        }
    }
    Ok(())
}

/// The first line of `TOOL --version`.
pub fn version(tool: &str) -> String {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Moves this process (and every child it starts afterwards) into a private
/// mount namespace with the cgroup2 controllers file hidden, so that crun
/// treats the host as cgroup v1. The host's own mounts are untouched.
pub fn private_mount_namespace() -> anyhow::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("making / private")?;
    let controllers = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    if controllers.exists() {
        let empty = std::env::temp_dir().join(format!("pinion-bench-empty-{}", std::process::id()));
        std::fs::write(&empty, b"")?;
        mount(Some(&empty), controllers, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .context("hiding cgroup.controllers")?;
        let _ = std::fs::remove_file(&empty);
    }
    Ok(())
}

/// Removes the (empty) parent cgroup `name` the peers' containers ran under,
/// in every hierarchy.
pub fn remove_parent_cgroup(name: &str) {
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join(name));
    }
}

/// One `TOOL run`: from spawn to the first byte on the container's stdout, and
/// to the end of the run.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub first_byte: Duration,
    pub total: Duration,
}

fn spawn_run(tool: &str, bundle: &Path, id: &str) -> anyhow::Result<Child> {
    Command::new(tool)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))
}

fn failed(tool: &str, id: &str, child: &mut Child, why: &str) -> anyhow::Error {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    anyhow::anyhow!("{tool} run {id}: {why}: {}", err.trim())
}

/// Spawns the run and blocks until its first output byte (or end of output):
/// the child, the rest of its stdout, and how many bytes the first read got.
fn spawn_until_first_byte(
    tool: &str,
    bundle: &Path,
    id: &str,
) -> anyhow::Result<(Child, std::process::ChildStdout, usize)> {
    let mut child = spawn_run(tool, bundle, id)?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut byte = [0u8; 1];
    let n = out.read(&mut byte)?;
    Ok((child, out, n))
}

/// `TOOL run --bundle BUNDLE ID` in the foreground with stdout a pipe (the
/// container writes straight into it): the blocking read of the first byte
/// returns as soon as the container writes. The bundle's process must exit by
/// itself; its whole output is read.
pub fn run_to_exit(tool: &str, bundle: &Path, id: &str) -> anyhow::Result<Timed> {
    let t0 = Instant::now();
    let (mut child, mut out, n) = spawn_until_first_byte(tool, bundle, id)?;
    let first_byte = t0.elapsed();
    let mut rest = Vec::new();
    out.read_to_end(&mut rest)?;
    let status = child.wait()?;
    let total = t0.elapsed();
    if n == 0 || !status.success() {
        return Err(failed(tool, id, &mut child, &format!("{status}, output {n} bytes")));
    }
    Ok(Timed { first_byte, total })
}

/// `TOOL run` of a bundle whose process keeps running: the time to its first
/// output byte; then, untimed, `TOOL kill ID KILL` (retried: the run may not
/// have recorded the container as running yet when it already printed) and
/// the run, which deletes the container as it exits, is waited for.
pub fn run_first_byte_then_kill(tool: &str, bundle: &Path, id: &str) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let (mut child, out, n) = spawn_until_first_byte(tool, bundle, id)?;
    let first_byte = t0.elapsed();
    drop(out);
    if n == 0 {
        let _ = child.wait();
        return Err(failed(tool, id, &mut child, "no output"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut killed = false;
    let exited = loop {
        if !killed {
            killed = Command::new(tool)
                .args(["kill", id, "KILL"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        }
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    // A run that could not clean up leaves its state behind.
    let _ = Command::new(tool).args(["delete", "--force", id]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    if exited.is_none() {
        bail!("{tool} run {id}: still running 10 s after `{tool} kill`");
    }
    Ok(first_byte)
}
