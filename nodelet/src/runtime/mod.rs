//! Container runtimes behind one trait: `libcontainer` (real containers, created
//! by a single-threaded shim process per container) and `hollow` (everything but
//! the processes, for simulating big machines).
//!
//! Calls are blocking; the agent calls them from `spawn_blocking`. Exits are
//! pushed, not polled: `watch_exits` hands the runtime a channel on which it
//! sends an `ExitEvent` as soon as a container's process has ended.

pub mod hollow;
pub mod init;
pub mod libcontainer;
pub mod output;
pub mod userns;
pub mod users;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use specs::{CpuSet, NumaSet};

/// Everything needed to create one container. The runtime id is unique per node
/// and safe as a file name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerConfig {
    pub id: String,
    pub pod: String,
    pub container: String,
    /// argv: the manifest's command followed by its args.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub rootfs: RootfsConfig,
    pub cpus: CpuSet,
    /// Memory NUMA nodes; empty means every node of the machine.
    pub mems: NumaSet,
    /// Apply `MPOL_BIND` on `mems` (placements with memory NUMA nodes).
    pub bind_memory: bool,
    pub memory_limit_bytes: Option<u64>,
    /// CFS quota for shared containers with a CPU limit.
    pub cpu_quota: Option<CpuQuota>,
    /// Relative CPU weight from the CPU request (cgroup v1 shares).
    pub cpu_shares: Option<u64>,
    /// Page size in bytes -> limit in bytes.
    pub hugepage_limits: BTreeMap<u64, u64>,
    /// Device nodes to make visible (e.g. `/dev/vfio/42`).
    pub device_nodes: Vec<PathBuf>,
    pub host_network: bool,
    /// The pod's network namespace (pinned by `crate::cni`), which the
    /// container joins; `None` without `host_network`: a namespace of its
    /// own holding only `lo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// Capabilities on top of the default set, and ones taken away (`CAP_X`
    /// names; `ALL` in `cap_drop` empties the default set first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_drop: Vec<String>,
    /// The node's reserved CPUs: where the shim runs once its container has
    /// started; empty: anywhere.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub system_cpus: CpuSet,
    /// Combined stdout+stderr log, rotated by the runtime.
    pub log_path: PathBuf,
    /// Run a minimal init as PID 1 (signal forwarding, zombie reaping), as
    /// `docker run --init`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub init: bool,
    /// Host folders bound into the container (the pod's hostPath volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<BindMount>,
    /// The most processes and threads the container may hold (its cgroup's
    /// `pids.max`): the pod's `spec.pidsLimit`, else the node's
    /// `--pod-pids-limit`; `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    /// The real-time budget of the container's cgroup (v1
    /// `cpu.rt_runtime_us`), given before its process runs: a container with
    /// `SYS_NICE` (`crate::tuning::RT_BUDGET_US`); `None`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime_budget_us: Option<u64>,
    /// Who the container's processes are (the pod's `securityContext`);
    /// the default, root, is what every container was before.
    #[serde(default, skip_serializing_if = "RunAs::is_unset")]
    pub run_as: RunAs,
    /// `hostUsers: false`: the container runs in a user namespace whose
    /// root is host id `base` (see [`userns`]); `None`: the host's users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<UserNamespace>,
    /// Host files the container's output is appended to besides its log (a
    /// batch job's `-o`/`-e`, the pod's `pinion.io/output` and
    /// `pinion.io/error`), opened by the shim as the container's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputFiles>,
}

/// Where a container's stdout and stderr are appended on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputFiles {
    pub stdout: PathBuf,
    /// `None`: stderr goes with stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<PathBuf>,
}

/// A pod's user namespace, as its containers use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserNamespace {
    /// The pod's sandbox id: what its block of host ids is claimed under.
    pub sandbox: String,
    /// The host id of its root, once the agent has claimed the block (0
    /// until then: the plan does not claim).
    pub base: u32,
    /// The pinned namespace the pod's network belongs to, which every
    /// container joins; `None`: each container makes one with the same map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PathBuf>,
}

/// Who a container's processes are, as the pod says it: the container's
/// `runAsUser`/`runAsGroup` over the pod's, the pod's `supplementalGroups`,
/// and `runAsUserName`, which the runtime looks up on the node when no uid
/// is given ([`users::resolve`]). All unset: root.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supplemental_groups: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
}

impl RunAs {
    fn is_unset(&self) -> bool {
        *self == RunAs::default()
    }
}

/// A host folder seen inside a container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: PathBuf,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RootfsConfig {
    /// Host `/usr`, `/bin`, `/lib*`, `/etc` read-only, private writable `/tmp`.
    Host,
    /// An image imported with `pinion image import`, by `NAME:TAG`.
    Image(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuQuota {
    pub quota_us: i64,
    pub period_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerState {
    Running {
        pid: i32,
    },
    Exited {
        code: i32,
        oom_killed: bool,
    },
    /// The runtime has no such container.
    Missing,
}

/// A container's process ended, as the runtime recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitEvent {
    pub(crate) id: String,
    /// The exit code, or 128 + signal when killed by a signal.
    pub(crate) code: i32,
    pub(crate) oom_killed: bool,
    /// What it used, read from its cgroup as it ended (`None`: a runtime
    /// without cgroups).
    pub(crate) usage: Option<specs::status::ContainerUsage>,
}

/// Where a runtime sends exit events; sending never blocks.
pub(crate) type ExitSender = tokio::sync::mpsc::UnboundedSender<ExitEvent>;

/// Exit code of a command that does not exist (the shells' and Docker's).
const NOT_FOUND_CODE: i32 = 127;
/// Exit code of a command that exists but cannot be executed.
const NOT_EXECUTABLE_CODE: i32 = 126;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The command cannot be executed: the job's own failure, never retried
    /// as a runtime fault. `code` is 127 (not found) or 126 (not executable).
    #[error("container {id}: {message}")]
    CannotRun { id: String, code: i32, message: String },
    #[error("container {id}: {message}")]
    Container { id: String, message: String },
    #[error("image {reference}: {message}")]
    Image { reference: String, message: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// This runtime cannot do what was asked (the hollow runtime runs no processes).
    #[error("{0}")]
    Unsupported(&'static str),
}

/// A command running inside a container (`Runtime::exec`): its output as
/// it comes, how it ended, and the handle that ends it.
pub struct ExecProcess {
    /// Read ends of the command's stdout and stderr; they reach their end
    /// once the command and everything it started are gone.
    pub stdout: std::os::fd::OwnedFd,
    pub stderr: std::os::fd::OwnedFd,
    /// The write end of the command's stdin, when it was asked for
    /// (`Runtime::exec_with_stdin`); closing it is end of file.
    pub stdin: Option<std::os::fd::OwnedFd>,
    /// `stdout` and `stdin` are a pty's master (non-blocking; not pipes: a
    /// window size is set on it, and its read fails with EIO at the end),
    /// `stderr` an empty pipe.
    pub tty: bool,
    /// Blocks until the command has ended; its exit code (128 + N for
    /// signal N). Call it from the blocking pool.
    pub wait: Box<dyn FnOnce() -> Result<i32, RuntimeError> + Send>,
    /// Dropping it ends the command and every process it started, at once
    /// (the caller went away). Kept until `wait` returned, it does nothing.
    pub cancel: Box<dyn Send>,
}

/// Sets the terminal's window size on its master (the command gets SIGWINCH).
pub fn set_window_size(master: &impl std::os::fd::AsRawFd, size: specs::api::TerminalSize) {
    let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot set a terminal's size");
    }
}

/// The message of a start whose `ready` said no (the pod's network failed;
/// the agent reports that failure, not this).
pub const ABANDONED: &str = "start abandoned: the pod's network was not made";

pub trait Runtime: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Where images are unpacked (`image::resolve` reads them there); `None`:
    /// this runtime runs no images (nothing is pulled for it).
    fn images(&self) -> Option<PathBuf> {
        None
    }
    /// Removes images no container uses while the image store's disk is
    /// fuller than `high` percent, down to `low` (`image::collect_garbage`).
    fn collect_images(&self, high: u8, low: u8) -> Result<Vec<String>, RuntimeError> {
        let _ = (high, low);
        Ok(Vec::new())
    }
    /// Creates and starts the container; returns once its process runs. On error
    /// nothing is left behind (no state dir, cgroup, mount or process). The
    /// runtime stamps the steps of its own in `trace` (the pod-start metrics).
    fn start(&self, cfg: &ContainerConfig, trace: &mut crate::metrics::StartTrace) -> Result<(), RuntimeError>;
    /// A pod arrived and may start soon: a runtime whose starts wait on
    /// something slow gets it going (see `libcontainer::moves`). Never blocks.
    fn expect_start(&self) {}
    /// `start`, calling `ready` once all that does not need the pod's
    /// network is done (the bundle, the image's overlay) and nothing runs
    /// yet: the agent makes the network meanwhile, off the start's critical
    /// path. `ready` returning `false` abandons the start, leaving nothing
    /// behind. A runtime with nothing to prepare asks first.
    fn start_when_ready(
        &self,
        cfg: &ContainerConfig,
        trace: &mut crate::metrics::StartTrace,
        ready: &mut dyn FnMut() -> bool,
    ) -> Result<(), RuntimeError> {
        if !ready() {
            return Err(RuntimeError::Container { id: cfg.id.clone(), message: ABANDONED.into() });
        }
        trace.mark(crate::metrics::Step::NetworkReady);
        self.start(cfg, trace)
    }
    fn state(&self, id: &str) -> Result<ContainerState, RuntimeError>;
    /// What an exited container used, as read from its cgroup when it
    /// ended (the exit event carries the same); `None` when unknown.
    fn usage(&self, _id: &str) -> Option<specs::status::ContainerUsage> {
        None
    }
    /// Changes a running container's cpuset in place (no restart).
    fn update_cpuset(&self, id: &str, cpus: &CpuSet, mems: &NumaSet) -> Result<(), RuntimeError>;
    /// SIGTERM, then SIGKILL after `grace`; returns once the process is gone.
    fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError>;
    /// Removes every trace of a stopped container (state, cgroup, rootfs, shim files).
    fn remove(&self, id: &str) -> Result<(), RuntimeError>;
    /// Starts `command` (argv) inside the running container `id`: its
    /// namespaces, cgroup and CPUs, its environment, working directory and
    /// user. Returns once the command runs; `CannotRun` (126/127) when it
    /// cannot be executed. When it ends, whatever it started in its session
    /// ends too (a process that made its own session with `setsid` is the
    /// container's, as with `docker exec`).
    fn exec(&self, id: &str, command: &[String]) -> Result<ExecProcess, RuntimeError>;
    /// `exec` whose command reads a pipe the caller writes
    /// (`ExecProcess::stdin`), or (`tty`) runs on a pty of the container's
    /// own whose master the caller reads and writes.
    /// `tty`: on a terminal of this size.
    fn exec_with_stdin(
        &self,
        _id: &str,
        _command: &[String],
        _tty: Option<specs::api::TerminalSize>,
    ) -> Result<ExecProcess, RuntimeError> {
        Err(RuntimeError::Unsupported("this runtime does not forward an exec's stdin"))
    }
    /// `exec` for a probe: the command runs on the node's reserved CPUs,
    /// not on the container's (an exec probe must not disturb a pinned
    /// workload). A runtime that cannot place it so runs it as `exec` does.
    fn exec_probe(&self, id: &str, command: &[String]) -> Result<ExecProcess, RuntimeError> {
        self.exec(id, command)
    }
    /// Ids of every container this runtime holds, running or not (for adoption).
    fn list(&self) -> Result<Vec<String>, RuntimeError>;
    /// The host folders of container `id`'s cgroup, one per hierarchy, for
    /// the settings a pod's tuning writes there (`crate::tuning`); none for
    /// a runtime without cgroups.
    fn cgroups(&self, _id: &str) -> Vec<PathBuf> {
        Vec::new()
    }
    /// The agent stops: what the runtime made for all its containers and no
    /// container uses any more goes (the cgroup parent, once empty).
    fn tidy_at_stop(&self) {}
    /// From now on, sends an `ExitEvent` on `tx` as soon as a container exits
    /// (events for containers the receiver does not know are its to ignore).
    /// A runtime without notifications keeps the default: the agent's slow
    /// safety re-check of `state` then finds the exits.
    fn watch_exits(&self, tx: ExitSender) -> Result<(), RuntimeError> {
        drop(tx);
        Ok(())
    }
}
