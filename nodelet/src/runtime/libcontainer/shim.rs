//! The per-container shim: `pinion shim --data-dir D --id ID`, re-executed by
//! [`super::LibcontainerRuntime::start`]. Single-threaded on purpose: libcontainer
//! changes the process's working directory and forks, which is unsafe next to
//! other threads. The shim detaches (new session, double fork, so the agent's
//! `kill -9` does not reach it), closes every inherited fd, creates and starts
//! the container (setting its CFS quota between create and start, see
//! `spec::build`), reports `ok PID` or `error MESSAGE` on its stdout pipe, then
//! copies the container's output into the rotated log, reaps the init and
//! records its exit status in `exit.json` and then in `<data>/exits/<id>.json`,
//! the notice the agent's exit watcher waits for.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use ::libcontainer::container::builder::ContainerBuilder;
use ::libcontainer::container::Container;
use ::libcontainer::syscall::syscall::SyscallType;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, setsid, ForkResult, Pid};

use super::logs::{RotatingLog, DEFAULT_KEEP, DEFAULT_MAX_BYTES};
use super::records::{read_json, write_json, ExitRecord, Layout, ProcId, StartedRecord, UNKNOWN_EXIT_CODE};
use super::{cgroups, cleanup_libcontainer};
use crate::runtime::ContainerConfig;

/// Runs the shim; returns the process exit code. The first process returns 0 at
/// once (it only detaches); the detached one returns when the container is gone.
pub fn run(data_dir: &Path, id: &str) -> i32 {
    tracing::debug!(target: "podstart", id, "shim running");
    let running = crate::metrics::monotonic_ns();
    // Before the detach: the agent that started this shim (for `PINION_FAULT`).
    let agent = nix::unistd::getppid().as_raw();
    let _ = setsid();
    // SAFETY: the shim is single-threaded (main runs it before any other thread
    // exists), so the child may do anything after fork.
    match unsafe { fork() } {
        Ok(ForkResult::Parent { .. }) => return 0,
        Ok(ForkResult::Child) => {}
        Err(e) => {
            println!("error cannot fork the shim: {e}");
            return 1;
        }
    }
    let _ = std::env::set_current_dir("/");
    widen_affinity();
    let layout = Layout::new(data_dir);
    let mut report = match take_report_pipe() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("shim {id}: {e}");
            return 1;
        }
    };
    close_fds_except(report.as_raw_fd());
    if let Some(me) = ProcId::of(std::process::id() as i32) {
        if let Err(e) = write_json(&layout.shim(id), &me) {
            let _ = writeln!(report, "error {}", one_line(&e.to_string()));
            return 1;
        }
    }
    let created = create(&layout, id, &mut report, agent);
    let (_container, pipes, log, init, system_cpus, [built, started]) = match created {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(report, "error {}", one_line(&e));
            return 1;
        }
    };
    // The steps' stamps go to the agent with the report (`SHIM_STEPS`).
    let stamps: String = super::SHIM_STEPS
        .iter()
        .zip([running, built, started])
        .map(|((word, _), ns)| format!(" {word}={ns}"))
        .collect();
    let _ = writeln!(report, "ok {}{stamps}", init.pid);
    drop(report);
    // From here on the shim only copies output: keep that off the pods' CPUs.
    if !system_cpus.is_empty() {
        if let Err(e) = crate::affinity::confine_thread(&system_cpus) {
            tracing::warn!(error = %e, cpus = %system_cpus, "cannot confine the shim to the reserved CPUs");
        }
    }
    let status = supervise(id, pipes, log, init.pid);
    let record = exit_record(&layout, id, status);
    if let Err(e) = write_json(&layout.exit(id), &record) {
        eprintln!("shim {id}: {e}");
    }
    // After `exit.json`, so that an agent woken by the notice reads the same
    // state from `state`. Renamed into place: the watcher never sees half.
    if let Err(e) = write_json(&layout.exit_notice(id), &record) {
        eprintln!("shim {id}: {e}");
    }
    0
}

/// Asks for every CPU, so that the container's cpuset alone decides where it
/// runs (see `crate::affinity`).
fn widen_affinity() {
    if let Err(e) = crate::affinity::widen_thread() {
        tracing::warn!(error = %e, "cannot widen the shim's CPU affinity; the container may inherit the agent's");
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', "; ")
}

/// Moves the report pipe off fd 1 (so the container cannot inherit it) and
/// points fd 1 at /dev/null.
pub(super) fn take_report_pipe() -> Result<File, String> {
    let fd = nix::fcntl::fcntl(1, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3)).map_err(|e| format!("dup stdout: {e}"))?;
    // SAFETY: `fd` was just created by F_DUPFD_CLOEXEC and is owned by nobody else.
    let report = unsafe { File::from_raw_fd(fd) };
    let null = File::options().read(true).write(true).open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    nix::unistd::dup2(null.as_raw_fd(), 1).map_err(|e| format!("dup2 /dev/null: {e}"))?;
    Ok(report)
}

/// Closes every fd above stderr except `keep`: nothing the agent had open may
/// reach the container.
fn close_fds_except(keep: RawFd) {
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect(),
        Err(_) => return,
    };
    for fd in fds.into_iter().filter(|fd| *fd > 2 && *fd != keep) {
        let _ = nix::unistd::close(fd);
    }
}

/// The container, its output pipes (each with the output file it is also
/// appended to), its log file, its init, the reserved CPUs, and when it
/// was built and started (monotonic nanoseconds).
type Created = (Container, Vec<Pipe>, Option<RotatingLog>, ProcId, specs::CpuSet, [u64; 2]);

/// The read end of one of the container's output pipes and the batch output
/// file its data also goes to.
type Pipe = (OwnedFd, Option<File>);

/// A batch job's output files, opened as the container's user (see
/// `runtime::output`): stdout's, and stderr's when it has its own.
fn open_outputs(cfg: &ContainerConfig) -> Result<(Option<File>, Option<File>), String> {
    let Some(files) = &cfg.output else { return Ok((None, None)) };
    if cfg.userns.is_some() {
        return Err(crate::runtime::output::OutputError::UserNamespace.to_string());
    }
    let user = crate::runtime::users::resolve(&cfg.run_as).map_err(|e| e.to_string())?;
    let out = crate::runtime::output::open_as(&files.stdout, &user).map_err(|e| e.to_string())?;
    let err = match &files.stderr {
        Some(path) => Some(crate::runtime::output::open_as(path, &user).map_err(|e| e.to_string())?),
        None => None,
    };
    Ok((Some(out), err))
}

fn create(layout: &Layout, id: &str, report: &mut File, agent: i32) -> Result<Created, String> {
    let cfg: ContainerConfig = read_json(&layout.config(id))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is missing", layout.config(id).display()))?;
    let log = RotatingLog::open(&cfg.log_path, DEFAULT_MAX_BYTES, DEFAULT_KEEP)
        .map_err(|e| format!("log file {}: {e}", cfg.log_path.display()))?;
    // Before the container exists: a job whose output cannot be written
    // does not start, and says why.
    let (out_file, err_file) = open_outputs(&cfg)?;
    let (log_read, log_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("creating the log pipe: {e}"))?;
    // stderr has a pipe of its own only when it has a file of its own.
    let (err_pipe, log_write2) = match err_file {
        Some(f) => {
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| format!("creating the stderr pipe: {e}"))?;
            (Some((r, Some(f))), w)
        }
        None => (None, log_write.try_clone().map_err(|e| format!("dup of the log pipe: {e}"))?),
    };
    let mut pipes = vec![(log_read, out_file)];
    pipes.extend(err_pipe);
    let program = super::filter::read_for(&load_spec(layout, id)?, &layout.bundle(id)).map_err(|e| e.to_string())?;
    let built = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_root_path(layout.state_root())
        .and_then(|b| b.validate_id())
        .map(|b| b.with_stdout(log_write).with_stderr(log_write2))
        .map(|b| match program {
            Some(program) => b.with_executor(super::filter::WithFilter { program }),
            None => b,
        })
        .and_then(|b| b.as_init(layout.bundle(id)).with_systemd(false).with_detach(true).build());
    let mut container = match built {
        Ok(c) => {
            tracing::debug!(target: "podstart", id, "container built");
            c
        }
        Err(e) => {
            cleanup_libcontainer(layout, id);
            return Err(format!("creating the container: {e}"));
        }
    };
    let built = crate::metrics::monotonic_ns();
    let started = (|| -> Result<(ProcId, u64), String> {
        let pid = container.pid().ok_or("the created container has no pid")?;
        if std::env::var_os("PINION_SHIM_CRASH_AFTER_BUILD").is_some() {
            // Fault injection for the startup-sweep test: die like a killed shim,
            // after a success report, leaving a Created container behind.
            let _ = writeln!(report, "ok {pid}");
            std::process::exit(101);
        }
        crate::fault::kill_agent_at(crate::fault::Fault::AfterCreate, agent);
        let init = ProcId::of(pid.as_raw()).ok_or("the container's init vanished")?;
        // A pod's namespace (`cfg.netns`) came with `lo` up.
        if !cfg.host_network && cfg.netns.is_none() {
            super::net::loopback_up(pid.as_raw()).map_err(|e| format!("bringing lo up: {e}"))?;
        }
        // Not in the spec (see `spec::build`): the setup is done, the
        // container's own process has not run yet.
        if let Some(quota) = cfg.cpu_quota {
            let cgroup = cgroups::of(layout, id, Path::new(cgroups::DEFAULT_PARENT));
            cgroups::set_cpu_quota(&crate::host::RealHost, &cgroup, quota)
                .map_err(|e| format!("setting the CPU quota: {e}"))?;
        }
        if let Some(budget) = cfg.realtime_budget_us {
            let cgroup = cgroups::of(layout, id, Path::new(cgroups::DEFAULT_PARENT));
            // Not a failed start: the container runs without real-time
            // scheduling, and the agent's tuning says so in the pod's status.
            if let Err(e) = cgroups::grant_realtime(&crate::host::RealHost, &cgroup, budget) {
                tracing::warn!(id, error = e, "no real-time budget for the container");
            }
        }
        container.start().map_err(|e| format!("starting the container: {e}"))?;
        tracing::debug!(target: "podstart", id, "container started");
        let started_at = crate::metrics::monotonic_ns();
        let shim = ProcId::of(std::process::id() as i32).ok_or("cannot read the shim's own /proc entry")?;
        write_json(&layout.started(id), &StartedRecord { init, shim }).map_err(|e| e.to_string())?;
        Ok((init, started_at))
    })();
    match started {
        Ok((init, started)) => Ok((container, pipes, Some(log), init, cfg.system_cpus.clone(), [built, started])),
        Err(e) => {
            let _ = container.delete(true);
            cleanup_libcontainer(layout, id);
            Err(e)
        }
    }
}

/// The bundle's spec, as libcontainer will read it.
pub(super) fn load_spec(layout: &Layout, id: &str) -> Result<oci_spec::runtime::Spec, String> {
    let path = layout.bundle(id).join("config.json");
    oci_spec::runtime::Spec::load(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Copies the container's output to the log (and each pipe's output file)
/// until every writer is gone, then reaps the init.
fn supervise(id: &str, pipes: Vec<Pipe>, mut log: Option<RotatingLog>, pid: i32) -> Option<WaitStatus> {
    let mut open: Vec<(File, Option<File>)> = pipes.into_iter().map(|(fd, out)| (File::from(fd), out)).collect();
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = true;
    while !open.is_empty() {
        // One pipe (the usual case) is read directly; two are polled.
        let ready: Vec<usize> = if open.len() == 1 {
            vec![0]
        } else {
            use std::os::fd::AsFd;
            let mut fds: Vec<nix::poll::PollFd<'_>> =
                open.iter().map(|(p, _)| nix::poll::PollFd::new(p.as_fd(), nix::poll::PollFlags::POLLIN)).collect();
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) => fds
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.revents().is_some_and(|r| !r.is_empty()))
                    .map(|(i, _)| i)
                    .collect(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        };
        let mut closed = Vec::new();
        for i in ready {
            let (pipe, out) = &mut open[i];
            match pipe.read(&mut buf) {
                Ok(0) => closed.push(i),
                Ok(n) => {
                    if let Some(l) = log.as_mut() {
                        if let Err(e) = l.write_all(&buf[..n]) {
                            // Keep draining so the container never blocks on a full pipe.
                            eprintln!("log write failed, dropping further output: {e}");
                            log = None;
                        }
                    }
                    if let Some(f) = out.as_mut() {
                        if let Err(e) = f.write_all(&buf[..n]) {
                            eprintln!("output file write failed, dropping further output there: {e}");
                            *out = None;
                        }
                    }
                    if std::mem::take(&mut first) {
                        tracing::debug!(target: "podstart", id, "first output copied");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => closed.push(i),
            }
        }
        for i in closed.into_iter().rev() {
            open.remove(i);
        }
    }
    loop {
        match waitpid(Pid::from_raw(pid), None) {
            Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return Some(status),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// How the container ended, with what it used: read here, after its init
/// is reaped (so every process of its PID namespace is gone) and before
/// anyone removes its cgroup.
fn exit_record(layout: &Layout, id: &str, status: Option<WaitStatus>) -> ExitRecord {
    let cgroup = cgroups::of(layout, id, Path::new(cgroups::DEFAULT_PARENT));
    let oom_killed = cgroups::oom_killed(&crate::host::RealHost, &cgroup);
    let usage = Some(cgroups::usage(&crate::host::RealHost, &cgroup));
    match status {
        Some(WaitStatus::Exited(_, code)) => ExitRecord { code, signal: None, oom_killed, usage },
        Some(WaitStatus::Signaled(_, sig, _)) => {
            ExitRecord { code: 128 + sig as i32, signal: Some(sig as i32), oom_killed, usage }
        }
        _ => ExitRecord { code: UNKNOWN_EXIT_CODE, signal: None, oom_killed, usage },
    }
}
