//! A local Slurm (Debian `slurm-wlm` 22.05), the HPC peer of the job-path
//! benchmarks: `munged`, `slurmctld` and one `slurmd` per node (all on this
//! host, as `../shared/notes/peers-on-this-host.md` found works) on loopback ports, state
//! in a temporary folder, configured as `../shared/notes/peers-on-this-host.md`
//! found it works on this host (cons_tres per core, cgroup v1 process
//! tracking), as installed or tuned as Slurm's high-throughput guide says
//! ([`Tuning`]). `CpuSpecList` keeps the same CPUs out of
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

/// How Slurm is configured beyond what it needs to run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tuning {
    /// What an admin starting from `slurm.conf`'s defaults has: the backfill
    /// scheduler with its default delays (`batch_sched_delay` 3 s), jobs kept
    /// 300 s after they end, info logging, task/cgroup with
    /// `ConstrainRAMSpace`.
    AsInstalled,
    /// Slurm's own high-throughput guide (`high_throughput.html`, 22.05),
    /// for short jobs: no accounting storage, gathering or completion
    /// records, `MinJobAge=2`, the FIFO `sched/builtin` scheduler and
    /// `priority/basic`, `SchedulerParameters` with no batch delay and no
    /// minimum interval (a one-CPU queue is latency-bound: each job waits
    /// for the one before; the guide's `sched_min_interval=2000000` batches
    /// many submissions instead), error-level logs, and `task/affinity`
    /// without `task/cgroup` (the guide: task/cgroup with ConstrainRAMSpace
    /// is slower).
    HighThroughput,
}

impl Tuning {
    /// The `slurm.conf` lines of this tuning.
    fn lines(self) -> &'static str {
        match self {
            Tuning::AsInstalled => {
                "TaskPlugin=task/affinity,task/cgroup\n\
                 SlurmctldDebug=info\nSlurmdDebug=info\n"
            }
            Tuning::HighThroughput => {
                "TaskPlugin=task/affinity\n\
                 AccountingStorageType=accounting_storage/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 JobCompType=jobcomp/none\n\
                 MinJobAge=2\n\
                 SchedulerType=sched/builtin\n\
                 PriorityType=priority/basic\n\
                 SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=100\n\
                 SlurmctldDebug=error\nSlurmdDebug=error\n"
            }
        }
    }
}

impl Slurm {
    /// Starts a one-node cluster whose node is this host, with `reserved` (a
    /// Linux cpulist such as `0`) kept out of jobs' reach; returns once the
    /// node is idle, or fails after `limit`.
    pub fn start(reserved: &str, tuning: Tuning, limit: Duration) -> anyhow::Result<Slurm> {
        Slurm::start_nodes(&[reserved], tuning, limit)
    }

    /// Starts a cluster of one `slurmd` per entry of `reserved`, all on this
    /// host (one entry: the node is named after the host; several: `n1`,
    /// `n2`... each on its own port, `slurmd -N nI`), each node keeping its
    /// entry's CPUs out of jobs' reach (`CpuSpecList`), so that two nodes with
    /// `0` and `1` reserved each give jobs the other CPU, as two Pinion agents
    /// with `--reserved-cpus 0` and `1` do. Returns once every node is idle.
    pub fn start_nodes(reserved: &[&str], tuning: Tuning, limit: Duration) -> anyhow::Result<Slurm> {
        ensure_installed()?;
        ensure_munged()?;
        let dir = tempfile::Builder::new().prefix("pinion-slurm-").tempdir()?;
        let conf = dir.path().join("slurm.conf");
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let host = nix::unistd::gethostname()?.to_string_lossy().into_owned();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state)?;
        let ctld_port = free_port()?;
        let d = dir.path().display();
        let single = reserved.len() == 1;
        let names: Vec<String> =
            if single { vec![host.clone()] } else { (1..=reserved.len()).map(|i| format!("n{i}")).collect() };
        let mut node_lines = String::new();
        for (name, r) in names.iter().zip(reserved) {
            std::fs::create_dir_all(dir.path().join(format!("spool-{name}")))?;
            let port = free_port()?;
            node_lines.push_str(&format!(
                "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=2000 CpuSpecList={r} State=UNKNOWN\n"
            ));
        }
        std::fs::write(
            &conf,
            format!(
                "ClusterName=pinionbench\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n\
                 StateSaveLocation={state}\nSlurmdSpoolDir={d}/spool-%n\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
                 SlurmctldPort={ctld_port}\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\nDefMemPerCPU=100\n\
                 ProctrackType=proctrack/cgroup\n\
                 {tuning}\
                 ReturnToService=2\nMpiDefault=none\n\
                 SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n\
                 {node_lines}\
                 PartitionName=main Nodes={nodes} Default=YES MaxTime=INFINITE State=UP\n",
                state = state.display(),
                nodes = names.join(","),
                tuning = tuning.lines(),
            ),
        )?;
        std::fs::write(
            dir.path().join("cgroup.conf"),
            "CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainRAMSpace=yes\n",
        )?;
        let mut slurm = Slurm { conf, dir, daemons: Vec::new() };
        let mut daemons: Vec<(String, Vec<String>)> = vec![("slurmctld".into(), Vec::new())];
        for name in &names {
            let args = if single { Vec::new() } else { vec!["-N".to_string(), name.clone()] };
            daemons.push(("slurmd".into(), args));
        }
        for (i, (daemon, args)) in daemons.iter().enumerate() {
            let out = std::fs::File::create(slurm.dir.path().join(format!("{daemon}-{i}.out")))?;
            let child = Command::new(format!("/usr/sbin/{daemon}"))
                .args(["-D", "-f"])
                .arg(&slurm.conf)
                .args(args)
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
            let out = slurm.command("sinfo").args(["-h", "-N", "-o", "%T"]).output()?;
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if state.lines().filter(|l| *l == "idle").count() == names.len() {
                return Ok(slurm);
            }
            if Instant::now() > deadline {
                bail!(
                    "slurm's nodes are {state:?}, not all idle, after {limit:?} (logs in {})",
                    slurm.dir.path().display()
                );
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

/// Starts `munged` as its own user when nothing answers on its socket (no
/// systemd here). A socket file left by a munged that died answers nothing:
/// Slurm's daemons then wait on it silently, so `--force` takes it over.
fn ensure_munged() -> anyhow::Result<()> {
    let socket = Path::new(MUNGE_SOCKET_DIR).join("munge.socket.2");
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        return Ok(());
    }
    let _ = std::fs::remove_file(&socket);
    std::fs::create_dir_all(MUNGE_SOCKET_DIR)?;
    let status = Command::new("chown").args(["munge:munge", MUNGE_SOCKET_DIR]).status()?;
    if !status.success() {
        bail!("chown munge {MUNGE_SOCKET_DIR} failed");
    }
    let status = Command::new("runuser").args(["-u", "munge", "--", "/usr/sbin/munged", "--force"]).status()?;
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
