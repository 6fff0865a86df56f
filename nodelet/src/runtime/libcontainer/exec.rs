//! `Runtime::exec` for real containers: a command run inside a running
//! container by a helper process, `pinion shim --data-dir D --id ID exec --
//! CMD...`, which joins the container through libcontainer's tenant builder
//! (as `youki exec` does). A helper of its own because libcontainer changes
//! the working directory of the process that builds and forks; the agent's
//! threads must not see that (see [`super::shim`]).
//!
//! The helper's file descriptors: 0 is the cancel pipe (the agent holds its
//! write end: its end, by a drop or by the agent's death, means the caller
//! went away), 1 the report pipe (`started PID`, then `exit CODE`; or
//! `error MESSAGE`), 2 its own log (`exec.log`), 3 and 4 the write ends of the
//! command's stdout and stderr. It widens its CPU affinity before joining (the
//! command inherits no mask; the container's cpuset alone decides where it
//! runs), confines itself to the reserved CPUs once the command runs, waits
//! for the command or the cancel, and then kills every process left in the
//! command's session: the tenant's process calls `setsid`, so its session id
//! is its pid, and whatever it started (even reparented to the container's
//! init) keeps that session unless it made its own. The kernel never reuses a
//! pid while it names a session, so the sweep cannot hit a stranger.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ::libcontainer::container::builder::ContainerBuilder;
use ::libcontainer::syscall::syscall::SyscallType;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use oci_spec::runtime::Spec;

use super::records::{read_json, Layout};
use super::{cannot_run_code, cerr, check_command, check_id, ioerr, spec, LibcontainerRuntime, Report};
use crate::host::Host;
use crate::runtime::{ContainerConfig, ContainerState, ExecProcess, Runtime, RuntimeError};

/// How long the agent waits for the helper to say the command runs.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Sweeps of the session, 10 ms apart, before the helper gives up on a
/// process that keeps forking (SIGKILL wins within a few).
const SWEEPS: u32 = 200;
const TENANT_NOTIFY: &str = "tenant-notify-";
/// Set on the helper of a probe's exec: the command runs on the reserved
/// CPUs (an environment variable, so the helper's command line stays the
/// one `pinion shim` parses).
const ON_RESERVED_ENV: &str = "PINION_EXEC_ON_RESERVED";
/// Set on the helper of an exec with stdin: fd `STDIN_FD` is the read end
/// of the command's stdin (else the command reads `/dev/null`).
const STDIN_ENV: &str = "PINION_EXEC_STDIN";
/// Set on the helper of an exec on a terminal: the command takes it as its
/// controlling terminal (`take_terminal`).
const TTY_ENV: &str = "PINION_EXEC_TTY";

/// The fds the command's stdout and stderr arrive on in the helper.
const STDOUT_FD: RawFd = 3;
const STDERR_FD: RawFd = 4;
/// The fd the command's stdin arrives on in the helper (with `STDIN_ENV`).
const STDIN_FD: RawFd = 5;

/// What an exec's command reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdin {
    /// `/dev/null`.
    Null,
    /// A pipe whose write end the caller holds.
    Pipe,
    /// A pty of the container's own devpts (so that `tty` inside names it),
    /// of this size, its stdin, stdout and stderr; the caller holds the master.
    Tty(specs::api::TerminalSize),
}

/// A new pty in the devpts of the container whose init is `init`: its
/// `dev/pts/ptmx` opened beneath `/proc/INIT/root` with every symlink
/// resolved inside that root (the container's processes may own what lies
/// on the path; a plain open from the host would follow an absolute link
/// of theirs to the host's own files), unlocked, its peer opened from the
/// master (`TIOCGPTPEER`, no path lookup). `(master, slave)`.
fn container_pty(id: &str, init: i32) -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let root = format!("/proc/{init}/root");
    let dir = nix::fcntl::open(
        root.as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| cerr(id, format!("{root}: {e}")))?;
    // SAFETY: `open` returned this fd and nothing else owns it.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    let how = OpenHow::new()
        .flags(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let master = nix::fcntl::openat2(dir.as_raw_fd(), "dev/pts/ptmx", how)
        .map_err(|e| cerr(id, format!("{root}/dev/pts/ptmx: {e}")))?;
    // SAFETY: `openat2` returned this fd and nothing else owns it.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // The pty multiplexer is character device 5:2; anything else is not opened for a terminal.
    let st = nix::sys::stat::fstat(master.as_raw_fd()).map_err(|e| cerr(id, format!("fstat of ptmx: {e}")))?;
    let is_ptmx =
        st.st_mode & libc::S_IFMT == libc::S_IFCHR && libc::major(st.st_rdev) == 5 && libc::minor(st.st_rdev) == 2;
    if !is_ptmx {
        return Err(cerr(id, format!("{root}/dev/pts/ptmx is not the pty multiplexer")));
    }
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which is valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(cerr(id, format!("unlocking the pty: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new fd.
    let slave =
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if slave < 0 {
        return Err(cerr(id, format!("opening the pty's peer: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: the ioctl returned this new fd and nothing else owns it.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

impl LibcontainerRuntime {
    /// `on_reserved`: a probe's exec, run on the node's reserved CPUs (see
    /// `join`); `stdin`: what the command reads (see `Stdin`).
    pub(super) fn exec_in(
        &self,
        id: &str,
        command: &[String],
        on_reserved: bool,
        stdin: Stdin,
    ) -> Result<ExecProcess, RuntimeError> {
        check_id(id)?;
        // Until the helper said it started: its move into the container's
        // cgroups is in there (see `moves`). Not for a probe: probes come
        // every few seconds from every probed pod and wait on nobody, and
        // would keep the warming on for good.
        let _moves = (!on_reserved).then(|| self.moves.hold());
        if !matches!(self.state(id)?, ContainerState::Running { .. }) {
            return Err(cerr(id, "cannot exec: the container is not running"));
        }
        let layout = &self.layout;
        let cfg: ContainerConfig = read_json(&layout.config(id))?
            .ok_or_else(|| cerr(id, format!("{} is missing", layout.config(id).display())))?;
        let spec_path = layout.bundle(id).join("config.json");
        let spec = Spec::load(&spec_path).map_err(|e| cerr(id, format!("{}: {e}", spec_path.display())))?;
        let process = spec.process().as_ref();
        // As `execvp` would inside: a clear 126/127 before any namespace is joined.
        let probe = spec::ProcessSpec {
            args: command.to_vec(),
            env: process.and_then(|p| p.env().clone()).unwrap_or_default(),
            cwd: process.map(|p| p.cwd().to_string_lossy().into_owned()).unwrap_or_else(|| "/".into()),
            // The command runs as the container's process does (the spec's
            // user, which the tenant builder takes below); the probe only
            // looks for the file.
            user: Default::default(),
        };
        check_command(id, &self.command_root(id, &cfg), &probe)?;

        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| cerr(id, format!("pipe: {e}")));
        let (err_read, err_write) = pipe()?;
        let (out_read, out_write, in_read, in_write) = match stdin {
            Stdin::Null => {
                let (r, w) = pipe()?;
                (r, w, None, None)
            }
            Stdin::Pipe => {
                let (r, w) = pipe()?;
                let (ir, iw) = pipe()?;
                (r, w, Some(ir), Some(iw))
            }
            Stdin::Tty(size) => {
                let started: super::records::StartedRecord = read_json(&layout.started(id))?
                    .ok_or_else(|| cerr(id, format!("{} is missing", layout.started(id).display())))?;
                let (master, slave) = container_pty(id, started.init.pid)?;
                crate::runtime::set_window_size(&master, size);
                let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| cerr(id, format!("dup: {e}")));
                // All output on the terminal: stderr's pipe stays empty.
                let (master_in, slave_in) = (dup(&master)?, dup(&slave)?);
                nix::unistd::dup3(slave.as_raw_fd(), err_write.as_raw_fd(), nix::fcntl::OFlag::O_CLOEXEC)
                    .map_err(|e| cerr(id, format!("dup3: {e}")))?;
                (master, slave, Some(slave_in), Some(master_in))
            }
        };
        let in_fd = in_read.as_ref().map(|r| r.as_raw_fd());
        let log_path = layout.exec_log(id);
        let log = crate::fsutil::create_private(&log_path, true).map_err(ioerr(&log_path))?;
        let (out_fd, err_fd) = (out_write.as_raw_fd(), err_write.as_raw_fd());
        let mut helper = self.shim_command(id, log);
        helper.arg("exec").arg("--").args(command).stdin(Stdio::piped());
        if on_reserved {
            helper.env(ON_RESERVED_ENV, "1");
        }
        if stdin != Stdin::Null {
            helper.env(STDIN_ENV, "1");
        }
        if matches!(stdin, Stdin::Tty(_)) {
            helper.env(TTY_ENV, "1");
        }
        // SAFETY: the closure runs in the forked child before exec and makes
        // only async-signal-safe calls (fcntl, dup2) on fds this process owns
        // until `spawn` returns.
        unsafe {
            helper.pre_exec(move || {
                // Out of 3, 4 and 5's way first: a source may be any of them.
                let out = libc::fcntl(out_fd, libc::F_DUPFD_CLOEXEC, 10);
                let err = libc::fcntl(err_fd, libc::F_DUPFD_CLOEXEC, 10);
                let input = in_fd.map(|fd| libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10));
                if out < 0 || err < 0 || input.is_some_and(|i| i < 0) {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::dup2(out, STDOUT_FD) < 0 || libc::dup2(err, STDERR_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(i) = input {
                    if libc::dup2(i, STDIN_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = helper
            .spawn()
            .map_err(|e| cerr(id, format!("starting the exec helper {}: {e}", self.shim_exe.display())))?;
        drop((out_write, err_write, in_read));
        let (Some(cancel), Some(out)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(cerr(id, "the exec helper has no pipes"));
        };
        let mut report = Report::new(out);
        let first = report.line(Some(START_TIMEOUT));
        let pid = match &first {
            Ok(Some(line)) if line.starts_with("started ") => line["started ".len()..].trim().to_string(),
            _ => {
                drop(cancel);
                let _ = child.kill();
                let _ = child.wait();
                return Err(match first {
                    Ok(Some(line)) => match line.strip_prefix("error ") {
                        Some(msg) => match cannot_run_code(msg) {
                            Some(code) => {
                                RuntimeError::CannotRun { id: id.to_string(), code, message: msg.to_string() }
                            }
                            None => cerr(id, format!("exec: {msg}")),
                        },
                        None => cerr(id, format!("the exec helper reported {line:?}")),
                    },
                    Ok(None) => {
                        cerr(id, format!("the exec helper exited without reporting (see {})", log_path.display()))
                    }
                    Err(e) => cerr(id, format!("exec: {e}")),
                });
            }
        };
        tracing::debug!(id, pid, "exec started");
        let id = id.to_string();
        let mut child = Reaped(Some(child));
        let wait = move || {
            let mut code = None;
            let mut trouble = None;
            loop {
                match report.line(None) {
                    Ok(Some(line)) => match line.strip_prefix("exit ").map(|c| c.trim().parse::<i32>()) {
                        Some(Ok(c)) => code = Some(c),
                        _ => trouble = Some(format!("the exec helper reported {line:?}")),
                    },
                    Ok(None) => break,
                    Err(e) => {
                        trouble = Some(e);
                        break;
                    }
                }
            }
            if let Some(mut c) = child.0.take() {
                let _ = c.wait();
            }
            code.ok_or_else(|| {
                let why = trouble.unwrap_or_else(|| "the exec helper ended without an exit code".into());
                cerr(&id, why)
            })
        };
        Ok(ExecProcess {
            stdout: out_read,
            stderr: err_read,
            stdin: in_write,
            tty: matches!(stdin, Stdin::Tty(_)),
            wait: Box::new(wait),
            cancel: Box::new(cancel),
        })
    }
}

/// The helper process, reaped even when `ExecProcess::wait` is never called
/// (the caller went away while the exec started): by a thread, since the
/// helper ends only once the cancel handle, dropped after this, is gone.
struct Reaped(Option<std::process::Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = std::thread::Builder::new().name("exec-reaper".into()).spawn(move || c.wait());
        }
    }
}

/// The helper: `pinion shim --data-dir D --id ID exec -- CMD...`. Returns its
/// own exit code (the command's travels on the report pipe).
pub fn run(data_dir: &Path, id: &str, command: &[String]) -> i32 {
    let mut report = match super::shim::take_report_pipe() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("exec in {id}: {e}");
            return 1;
        }
    };
    let on_reserved = std::env::var_os(ON_RESERVED_ENV).is_some();
    let started = join(data_dir, id, command, on_reserved);
    let (pid, system_cpus) = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(report, "error {}", e.replace('\n', "; "));
            return 1;
        }
    };
    let _ = writeln!(report, "started {pid}");
    // From here on the helper only waits: off the pods' CPUs.
    if !system_cpus.is_empty() {
        if let Err(e) = crate::affinity::confine_thread(&system_cpus) {
            tracing::warn!(error = %e, cpus = %system_cpus, "cannot confine the exec helper to the reserved CPUs");
        }
    }
    let code = supervise(pid);
    let _ = writeln!(report, "exit {code}");
    0
}

/// Joins the container with the command; its host pid and the node's reserved CPUs.
/// `on_reserved` (a probe) with reserved CPUs: the command joins the
/// container's namespaces and is confined to the reserved CPUs before it
/// execs, so it never runs on the pod's CPUs (the path of `hostUsers: false`
/// containers, which does this by hand). On cgroup v1 it joins every cgroup
/// of the container but its cpuset (it stays in the helper's, the agent's,
/// which holds the reserved CPUs). On cgroup v2 a process cannot leave one
/// controller of its cgroup, so it joins none of the container's: it joins
/// the container's probe cgroup, which holds the reserved CPUs and bounds
/// its memory and pids (`cgroups::settle_probe_cgroup`, where the module
/// comment says why one per container). It is still in the container's pid
/// namespace, so it ends with the container at the latest.
fn join(data_dir: &Path, id: &str, command: &[String], on_reserved: bool) -> Result<(Pid, specs::CpuSet), String> {
    let out = take_fd(STDOUT_FD)?;
    let err = take_fd(STDERR_FD)?;
    let stdin = match std::env::var_os(STDIN_ENV) {
        Some(_) => File::from(take_fd(STDIN_FD)?),
        None => File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?,
    };
    if let Err(e) = crate::affinity::widen_thread() {
        tracing::warn!(error = %e, "cannot widen the exec helper's CPU affinity; the command may inherit the agent's");
    }
    let layout = Layout::new(data_dir);
    let cfg: ContainerConfig = read_json(&layout.config(id))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is missing", layout.config(id).display()))?;
    let spec_path = layout.bundle(id).join("config.json");
    let spec = Spec::load(&spec_path).map_err(|e| format!("{}: {e}", spec_path.display()))?;
    let process = spec.process().as_ref();
    let cwd = process.map(|p| p.cwd().clone()).unwrap_or_else(|| "/".into());
    let user = process.map(|p| p.user().clone()).unwrap_or_default();
    // The container's own filter: an exec'd command is held to it too.
    let program = super::filter::read_for(&spec, &layout.bundle(id)).map_err(|e| e.to_string())?;
    let cgroup = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()).unwrap_or_default();
    let mut dirs = super::cgroups::existing_dirs(&crate::host::RealHost, &cgroup);
    let cpuset_root = Path::new("/sys/fs/cgroup/cpuset");
    let host = crate::host::RealHost;
    let reserved = on_reserved && !cfg.system_cpus.is_empty() && !dirs.is_empty();
    let off_pod_cpus_v1 = reserved && dirs.iter().any(|d| d.starts_with(cpuset_root));
    let off_pod_cpus_v2 = reserved && !off_pod_cpus_v1 && host.cgroup_v2_only();
    if cfg.userns.is_some() || off_pod_cpus_v1 || off_pod_cpus_v2 {
        let started: super::records::StartedRecord = read_json(&layout.started(id))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{} is missing", layout.started(id).display()))?;
        let confine = if off_pod_cpus_v1 {
            // Left in the helper's cpuset (the agent's, which holds the
            // reserved CPUs), then pinned to them.
            dirs.retain(|d| !d.starts_with(cpuset_root));
            Some(&cfg.system_cpus)
        } else if off_pod_cpus_v2 {
            dirs = vec![super::cgroups::settle_probe_cgroup(&host, &cgroup, &cfg.system_cpus)?];
            Some(&cfg.system_cpus)
        } else {
            None
        };
        let pid = super::exec_userns::join(
            Pid::from_raw(started.init.pid),
            &dirs,
            &spec,
            program.as_ref().map(|p| p.as_slice()),
            command,
            stdin,
            out,
            err,
            confine,
        )?;
        return Ok((pid, cfg.system_cpus));
    }
    // libcontainer leaves a notify socket per exec in the container's state
    // folder: one exec joins at a time, so the socket that appeared is ours.
    let state = layout.state_root().join(id);
    let lock_path = layout.exec_lock(id);
    let lock = crate::fsutil::create_private(&lock_path, false).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}: {e}", lock_path.display()))?;
    let before = notify_sockets(&state);
    let built = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_root_path(layout.state_root())
        .and_then(|b| b.validate_id())
        .map(|b| b.with_stdin(stdin).with_stdout(out).with_stderr(err))
        .map(|b| match (program, std::env::var_os(TTY_ENV).is_some()) {
            (program, true) => b.with_executor(OnTerminal { program }),
            (Some(program), false) => b.with_executor(super::filter::WithFilter { program }),
            (None, false) => b,
        })
        .and_then(|b| {
            b.as_tenant()
                .with_detach(false)
                .with_cwd(Some(cwd))
                .with_user(Some(user.uid()))
                .with_group(Some(user.gid()))
                .with_additional_gids(user.additional_gids().clone().unwrap_or_default())
                .with_container_args(command.to_vec())
                .build()
        });
    for s in notify_sockets(&state).difference(&before) {
        let _ = std::fs::remove_file(state.join(s));
    }
    let pid = built.map_err(|e| format!("joining the container: {e}"))?;
    Ok((pid, cfg.system_cpus))
}

/// Makes the terminal on stdin the calling process's controlling one (it
/// leads a new session: the tenant's process and `exec_userns`'s command
/// called `setsid`), so that ^C is SIGINT to its foreground and a shell
/// there has job control. A failure leaves the terminal a plain one.
pub(super) fn take_terminal() {
    // SAFETY: TIOCSCTTY takes an int by value; fd 0 is this process's own.
    if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "exec: the terminal is not the command's controlling one");
    }
}

/// The executor of an exec on a terminal: `take_terminal`, then the
/// container's filter (when it has one) and `execve` as `WithFilter` does.
#[derive(Clone)]
struct OnTerminal {
    program: Option<std::sync::Arc<Vec<u8>>>,
}

impl ::libcontainer::workload::Executor for OnTerminal {
    fn exec(&self, spec: &Spec) -> Result<(), ::libcontainer::workload::ExecutorError> {
        take_terminal();
        match &self.program {
            Some(program) => super::filter::WithFilter { program: program.clone() }.exec(spec),
            None => ::libcontainer::workload::default::DefaultExecutor {}.exec(spec),
        }
    }

    fn validate(&self, spec: &Spec) -> Result<(), ::libcontainer::workload::ExecutorValidationError> {
        ::libcontainer::workload::default::DefaultExecutor {}.validate(spec)
    }
}

fn notify_sockets(dir: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Default::default() };
    entries.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with(TENANT_NOTIFY)).collect()
}

/// Takes an fd the agent passed; refuses one that is not open.
fn take_fd(fd: RawFd) -> Result<OwnedFd, String> {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).map_err(|e| format!("fd {fd} was not passed: {e}"))?;
    // Not inherited by anything this process starts but the command, which
    // gets its own copy from libcontainer.
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
        .map_err(|e| format!("fd {fd}: {e}"))?;
    // SAFETY: the fd is open (checked above), was handed to this process for
    // this purpose and nothing else in it refers to it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits for the command or for the cancel pipe's end (the caller went
/// away), sweeps the command's session, reaps it; its exit code. The sweep
/// comes before the reap: the unreaped command keeps its pid, so the session
/// id cannot name a newer process yet.
fn supervise(pid: Pid) -> i32 {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let pidfd = if raw >= 0 {
        // SAFETY: the kernel just returned this fd to us.
        Some(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
    } else {
        tracing::warn!("pidfd_open failed: {}", std::io::Error::last_os_error());
        None
    };
    // SAFETY: fd 0 is the cancel pipe, open for this process's whole life.
    let cancel = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let exited = || {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        !matches!(waitid(Id::Pid(pid), flags), Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR))
    };
    loop {
        let mut fds = vec![PollFd::new(cancel, PollFlags::POLLIN)];
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        // Without a pidfd (a kernel before 5.3), look at the command every 100 ms.
        let timeout = if pidfd.is_some() { PollTimeout::NONE } else { PollTimeout::from(100u16) };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!(error = %e, "exec helper: poll failed; ending the command");
                break;
            }
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            let mut buf = [0u8; 64];
            match nix::unistd::read(0, &mut buf) {
                // The agent never writes: anything but data is the end.
                Ok(n) if n > 0 => {}
                Err(nix::errno::Errno::EINTR) => {}
                _ => break,
            }
        }
        if exited() {
            break;
        }
    }
    kill_session(pid);
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "exec helper: waitpid failed");
                return super::records::UNKNOWN_EXIT_CODE;
            }
        }
    }
}

/// SIGKILL to every live process of session `sid`, again until none is left.
fn kill_session(sid: Pid) {
    for _ in 0..SWEEPS {
        let members = session_members(sid);
        if members.is_empty() {
            return;
        }
        for p in members {
            let _ = kill(p, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    tracing::error!(session = sid.as_raw(), "processes of the exec's session survived {SWEEPS} sweeps");
}

/// Live processes (not zombies) whose session is `sid`, from `/proc`.
fn session_members(sid: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The command name may hold spaces and parentheses: fields follow the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // state, ppid, pgrp, session
        let (Some(state), Some(session)) = (fields.first(), fields.get(3)) else { continue };
        if session.parse::<i32>().ok() == Some(sid.as_raw()) && !matches!(*state, "Z" | "X") {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A session with a child that outlives its parent (reparented, as a
    /// background job of an exec'd shell is) is swept whole.
    #[test]
    fn a_session_is_swept_whole() {
        let mut leader = Command::new("setsid")
            .args(["sh", "-c", "sleep 1000 & sleep 1000 & exec sleep 1000"])
            .stdin(Stdio::null())
            .spawn()
            .expect("setsid sh");
        let sid = Pid::from_raw(leader.id() as i32);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while session_members(sid).len() < 3 {
            assert!(std::time::Instant::now() < deadline, "the session never had 3 members");
            std::thread::sleep(Duration::from_millis(10));
        }
        kill_session(sid);
        let _ = leader.wait();
        assert_eq!(session_members(sid), Vec::<Pid>::new());
    }
}
