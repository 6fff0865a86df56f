//! Exec into a container that runs in a user namespace of its pod's own.
//! libcontainer's tenant builder joins every namespace of the container
//! but its user namespace, so a command exec'd that way would be the host's
//! root inside the pod's other namespaces: everything `hostUsers: false`
//! exists to prevent. This path joins the user namespace first, then the
//! others, and then becomes the container's process as its spec says
//! (groups, uid, capabilities, `no_new_privs`, rlimits, seccomp last).
//!
//! Runs in the exec helper (`pinion shim ... exec`), a single-threaded
//! process, which the command ends up a child of: the helper is a child
//! subreaper, and the intermediate child, which joined the pid namespace
//! (only its children enter it), exits once the command is forked.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use oci_spec::runtime::Spec;

/// The order runc joins in: the user namespace first (it owns the others,
/// so joining it is what lets the rest be joined), the mount namespace last
/// (it changes the root that `/proc` paths resolve in).
const ORDER: [(&str, CloneFlags); 7] = [
    ("user", CloneFlags::CLONE_NEWUSER),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

/// Starts `command` in the container whose init is `init` (host pid), with
/// its cgroup directories `cgroups`, as `spec`'s process; stdout and stderr
/// to `out` and `err`. Returns the command's host pid, a child of this process.
/// `confine`: the CPUs the command is pinned to before it execs (a probe's,
/// on the reserved CPUs). A container in the host's user namespace (a
/// probe's exec takes this path too) has no user namespace to join.
#[allow(clippy::too_many_arguments)]
pub(super) fn join(
    init: Pid,
    cgroups: &[PathBuf],
    spec: &Spec,
    program: Option<&[u8]>,
    command: &[String],
    stdin: File,
    out: OwnedFd,
    err: OwnedFd,
    confine: Option<&specs::CpuSet>,
) -> Result<Pid, String> {
    let process = spec.process().as_ref().ok_or("the container's spec has no process")?;
    let cstr = |s: &str| CString::new(s).map_err(|_| format!("{s:?}: a NUL byte"));
    let argv = command.iter().map(|a| cstr(a)).collect::<Result<Vec<_>, _>>()?;
    let env = process.env().clone().unwrap_or_default();
    let envp = env.iter().map(|a| cstr(a)).collect::<Result<Vec<_>, _>>()?;
    let cwd = CString::new(process.cwd().as_os_str().as_bytes()).map_err(|_| "cwd: a NUL byte".to_string())?;
    let Some(prog) = argv.first().cloned() else { return Err("no command".into()) };
    // Opened now, from the host's view: after the mount namespace, /proc is the container's.
    let mut namespaces = Vec::new();
    for (name, flag) in ORDER {
        let path = format!("/proc/{init}/ns/{name}");
        let f = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // Joining the namespace one is in fails (EINVAL for a user namespace).
        if same_namespace(&f, &format!("/proc/self/ns/{name}")) {
            continue;
        }
        namespaces.push((f, flag));
    }
    // The container's root as its init sees it, entered once the mount
    // namespace is joined (as `nsenter --root`): joining a mount namespace
    // sets the root to the namespace's root mount, which is the container's
    // only when its runtime could `pivot_root`; under a chroot (a host whose
    // own root is an initramfs, as the QEMU guest's) it is the host's.
    let root_path = format!("/proc/{init}/root");
    let root = File::open(&root_path).map_err(|e| format!("{root_path}: {e}"))?;
    // Tells the helper the command's pid (from the intermediate), then
    // carries a failure's words (from the command's side; its close on exec
    // says it ran).
    let (pid_r, pid_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("PR_SET_CHILD_SUBREAPER: {e}"))?;

    // SAFETY: this process is single-threaded (the exec helper), so the
    // child may allocate and run ordinary Rust code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop((pid_r, err_r));
            let fail = |what: String| -> ! {
                let _ = nix::unistd::write(&err_w, what.as_bytes());
                // SAFETY: ends this child without running the helper's destructors.
                unsafe { libc::_exit(1) }
            };
            let own = std::process::id().to_string();
            for dir in cgroups {
                let procs = dir.join("cgroup.procs");
                if let Err(e) = std::fs::write(&procs, &own) {
                    fail(format!("joining the cgroup {}: {e}", procs.display()));
                }
            }
            for (f, flag) in &namespaces {
                if let Err(e) = setns(f, *flag) {
                    fail(format!("joining the container's {flag:?} namespace: {e}"));
                }
            }
            if let Err(e) = nix::unistd::fchdir(root.as_raw_fd()).and_then(|()| nix::unistd::chroot(".")) {
                fail(format!("entering the container's root {root_path}: {e}"));
            }
            // SAFETY: as above; the grandchild is the command.
            match unsafe { fork() } {
                Err(e) => fail(format!("fork: {e}")),
                Ok(ForkResult::Parent { child }) => {
                    let _ = nix::unistd::write(&pid_w, child.as_raw().to_string().as_bytes());
                    // SAFETY: the command is reparented to the helper (a subreaper).
                    unsafe { libc::_exit(0) }
                }
                Ok(ForkResult::Child) => {
                    drop(pid_w);
                    if let Some(cpus) = confine {
                        if let Err(e) = crate::affinity::confine_thread(cpus) {
                            fail(format!("confining the command to CPUs {cpus}: {e}"));
                        }
                    }
                    let why = become_process(process, &cwd, &stdin, &out, &err, spec, program);
                    let why = match why {
                        Err(e) => e,
                        Ok(()) => match nix::unistd::execvpe(&prog, &argv, &envp) {
                            Err(e) => format!("exec {}: {e}", command[0]),
                            Ok(never) => match never {},
                        },
                    };
                    fail(why)
                }
            }
        }
        ForkResult::Parent { child } => {
            drop((pid_w, err_w, out, err, stdin, root));
            let status = loop {
                match waitpid(child, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other,
                }
            };
            let mut said = String::new();
            let mut pid_text = String::new();
            let _ = File::from(pid_r).take(32).read_to_string(&mut pid_text);
            // EOF once the command has exec'd (close on exec) or failed.
            let _ = File::from(err_r).take(4096).read_to_string(&mut said);
            if !said.is_empty() {
                return Err(said);
            }
            if !matches!(status, Ok(WaitStatus::Exited(_, 0))) {
                return Err(format!("the exec's intermediate process ended with {status:?}"));
            }
            pid_text.trim().parse().map(Pid::from_raw).map_err(|_| format!("the command's pid {pid_text:?}"))
        }
    }
}

/// Whether the namespace file `f` is the one at `path` (same inode).
fn same_namespace(f: &File, path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// In the command's process, inside every namespace: who it is, then what
/// it may do.
fn become_process(
    process: &oci_spec::runtime::Process,
    cwd: &CString,
    stdin: &File,
    out: &OwnedFd,
    err: &OwnedFd,
    spec: &Spec,
    program: Option<&[u8]>,
) -> Result<(), String> {
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    nix::unistd::chdir(cwd.as_c_str()).map_err(|e| format!("cwd {cwd:?}: {e}"))?;
    for (fd, to) in [(stdin.as_raw_fd(), 0), (out.as_raw_fd(), 1), (err.as_raw_fd(), 2)] {
        nix::unistd::dup2(fd, to).map_err(|e| format!("dup2: {e}"))?;
    }
    if nix::unistd::isatty(0).unwrap_or(false) {
        super::exec::take_terminal();
    }
    if let Some(rlimits) = process.rlimits() {
        for r in rlimits {
            let limit = libc::rlimit { rlim_cur: r.soft(), rlim_max: r.hard() };
            let resource = match r.typ() {
                oci_spec::runtime::PosixRlimitType::RlimitNofile => libc::RLIMIT_NOFILE,
                _ => continue,
            };
            // SAFETY: setrlimit with a valid struct.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
            }
        }
    }
    let user = process.user();
    // Kept across the uid change; the spec's sets are put in place after it.
    nix::sys::prctl::set_keepcaps(true).map_err(|e| format!("keepcaps: {e}"))?;
    let groups: Vec<nix::unistd::Gid> =
        user.additional_gids().clone().unwrap_or_default().into_iter().map(nix::unistd::Gid::from_raw).collect();
    nix::unistd::setgroups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    let (gid, uid) = (nix::unistd::Gid::from_raw(user.gid()), nix::unistd::Uid::from_raw(user.uid()));
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setgid {gid}: {e}"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setuid {uid}: {e}"))?;
    let syscall = ::libcontainer::syscall::syscall::create_syscall();
    if let Some(caps) = process.capabilities() {
        ::libcontainer::capabilities::drop_privileges(caps, syscall.as_ref())
            .map_err(|e| format!("capabilities: {e}"))?;
    }
    nix::sys::prctl::set_keepcaps(false).map_err(|e| format!("keepcaps: {e}"))?;
    if process.no_new_privileges() != Some(false) {
        nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    }
    if let Some(seccomp) = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref()) {
        ::libcontainer::seccomp::initialize_seccomp(seccomp).map_err(|e| format!("seccomp: {e}"))?;
    }
    if let Some(program) = program {
        super::filter::load(program).map_err(|e| e.to_string())?;
    }
    Ok(())
}
