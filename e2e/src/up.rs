//! `pinion up` for the benchmarks: the all-in-one cluster in a temporary
//! folder (its own data dir, port and credentials), stopped when dropped, and
//! the wall time of a command run to its end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// `pinion up` in a temporary folder: its own data dir, port and credentials.
pub struct Up {
    child: Child,
    pub dir: tempfile::TempDir,
    pinion: PathBuf,
}

impl Up {
    pub fn start(pinion: &Path, extra: &[&str]) -> anyhow::Result<Up> {
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

    /// A `pinion` command speaking to this cluster.
    pub fn cmd(&self) -> Command {
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
pub fn timed(cmd: &mut Command) -> anyhow::Result<f64> {
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
