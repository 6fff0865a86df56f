//! A local Slurm (Debian `slurm-wlm` 22.05), the HPC peer of the job-path
//! benchmarks: `munged`, `slurmctld` and one `slurmd` on loopback ports, state
//! in a temporary folder, configured as `../shared/notes/peers-on-this-host.md`
//! found it works on this host (cons_tres per core, cgroup v1 task and process
//! tracking, no scheduling delay). `CpuSpecList` keeps the same CPUs out of
//! Slurm's hands as Pinion reserves for the system, so both schedule onto the
//! same CPUs.
//!
//! Everything is installed by apt-get when missing and stopped when the
//! [`Slurm`] is dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

const MUNGE_SOCKET_DIR: &str = "/run/munge";

pub struct Slurm {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<Child>,
}

impl Slurm {
    /// Starts a one-node cluster whose node is this host, with `reserved` (a
    /// Linux cpulist such as `0`) kept out of jobs' reach; returns once the
    /// node is idle, or fails after `limit`.
    pub fn start(reserved: &str, limit: Duration) -> anyhow::Result<Slurm> {
        ensure_installed()?;
        ensure_munged()?;
        let dir = tempfile::Builder::new().prefix("pinion-slurm-").tempdir()?;
        let conf = dir.path().join("slurm.conf");
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let host = nix::unistd::gethostname()?.to_string_lossy().into_owned();
        let state = dir.path().join("state");
        let spool = dir.path().join("spool");
        std::fs::create_dir_all(&state)?;
        std::fs::create_dir_all(&spool)?;
        let (ctld_port, d_port) = (free_port()?, free_port()?);
        let d = dir.path().display();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=pinionbench\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n\
                 StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldPort={ctld_port}\nSlurmdPort={d_port}\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\nDefMemPerCPU=100\n\
                 TaskPlugin=task/affinity,task/cgroup\nProctrackType=proctrack/cgroup\n\
                 SchedulerParameters=batch_sched_delay=0,sched_min_interval=0\n\
                 ReturnToService=2\nMpiDefault=none\n\
                 SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 CpuSpecList={reserved} State=UNKNOWN\n\
                 PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
                state = state.display(),
                spool = spool.display(),
            ),
        )?;
        std::fs::write(
            dir.path().join("cgroup.conf"),
            "CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainRAMSpace=yes\n",
        )?;
        let mut slurm = Slurm { conf, dir, daemons: Vec::new() };
        for daemon in ["slurmctld", "slurmd"] {
            let out = std::fs::File::create(slurm.dir.path().join(format!("{daemon}.out")))?;
            let child = Command::new(format!("/usr/sbin/{daemon}"))
                .args(["-D", "-f"])
                .arg(&slurm.conf)
                .env("SLURM_CONF", &slurm.conf)
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .with_context(|| format!("starting {daemon}"))?;
            slurm.daemons.push(child);
        }
        let deadline = Instant::now() + limit;
        loop {
            let out = slurm.command("sinfo").args(["-h", "-o", "%T"]).output()?;
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if state == "idle" {
                return Ok(slurm);
            }
            if Instant::now() > deadline {
                bail!("slurm's node is {state:?}, not idle, after {limit:?} (logs in {})", slurm.dir.path().display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A Slurm client command (`srun`, `sbatch`, `squeue`) for this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// Whether no job is queued or running.
    pub fn queue_empty(&self) -> anyhow::Result<bool> {
        let out = self.command("squeue").args(["-h", "-o", "%i"]).output().context("squeue")?;
        if !out.status.success() {
            bail!("squeue: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(out.stdout.iter().all(u8::is_ascii_whitespace))
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for child in &mut self.daemons {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM);
        }
        for child in &mut self.daemons {
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Installs `slurm-wlm` (with munge) when `slurmctld` is missing.
fn ensure_installed() -> anyhow::Result<()> {
    if Path::new("/usr/sbin/slurmctld").exists() && Path::new("/usr/sbin/slurmd").exists() {
        return Ok(());
    }
    eprintln!("installing slurm-wlm (apt-get)");
    let ok = Command::new("apt-get").args(["update", "-qq"]).status()?.success()
        && Command::new("apt-get")
            .args(["install", "-y", "-qq", "slurm-wlm"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success();
    if !ok {
        bail!("apt-get install slurm-wlm failed");
    }
    Ok(())
}

/// Starts `munged` as its own user when its socket is missing (no systemd here).
fn ensure_munged() -> anyhow::Result<()> {
    let socket = Path::new(MUNGE_SOCKET_DIR).join("munge.socket.2");
    if socket.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(MUNGE_SOCKET_DIR)?;
    let status = Command::new("chown").args(["munge:munge", MUNGE_SOCKET_DIR]).status()?;
    if !status.success() {
        bail!("chown munge {MUNGE_SOCKET_DIR} failed");
    }
    let status = Command::new("runuser").args(["-u", "munge", "--", "/usr/sbin/munged"]).status()?;
    if !status.success() {
        bail!("munged did not start");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            bail!("munged started but {} did not appear", socket.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
