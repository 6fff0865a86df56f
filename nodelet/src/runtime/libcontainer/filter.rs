//! The container's seccomp filter, compiled once per profile by the agent and
//! loaded as ready BPF just before the command runs.
//!
//! libcontainer compiles the OCI profile with libseccomp inside every new
//! container, on the pod's own CPUs: 8 ms of each start on the build host for
//! the default profile, and the same every `pinion exec`. The profile depends
//! only on the capabilities a pod adds, so the agent compiles each distinct
//! profile once (on its reserved CPUs), keeps the program, and writes it into
//! the bundle beside the spec. The spec libcontainer reads then has no
//! `linux.seccomp` but an annotation naming the program, and the shim and the
//! exec helper hand libcontainer an executor that loads it (the kernel's
//! `seccomp(SECCOMP_SET_MODE_FILTER)`, microseconds) right before `execve`.
//! A bundle whose annotation names a program that cannot be read or loaded
//! never runs: nothing falls back to running without a filter.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use libseccomp::{ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompOperator, Spec};
use sha2::{Digest, Sha256};

/// The compiled program's file in the bundle.
pub const FILTER_FILE: &str = "seccomp.bpf";
/// The profile it was compiled from, in OCI form, beside it (what a peer
/// runtime or a person reads; nothing of Pinion's reads it back).
pub const PROFILE_FILE: &str = "seccomp.json";
/// The spec's annotation saying the filter is the bundle's [`FILTER_FILE`].
pub const ANNOTATION: &str = "pinion.io/seccomp-filter";

/// The kernel's bound on a classic BPF program (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;
/// One `struct sock_filter`.
const INSTRUCTION_BYTES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// The profile uses what this compiler leaves to libcontainer.
    #[error("seccomp profile: {0} is not precompiled")]
    Unsupported(String),
    #[error("seccomp profile: {0}")]
    Compile(String),
    #[error("seccomp program {path}: {reason}")]
    Program { path: String, reason: String },
    #[error("loading the seccomp program: {0}")]
    Load(std::io::Error),
}

/// Compiled programs by profile, for the agent's life.
#[derive(Default)]
pub struct Filters {
    by_profile: Mutex<HashMap<[u8; 32], Arc<Vec<u8>>>>,
}

impl Filters {
    /// The program for `profile`, compiled on first use.
    pub fn program(&self, profile: &LinuxSeccomp) -> Result<Arc<Vec<u8>>, FilterError> {
        let json = serde_json::to_vec(profile).map_err(|e| FilterError::Compile(e.to_string()))?;
        let key: [u8; 32] = Sha256::digest(&json).into();
        if let Some(p) = self.by_profile.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        // Compiled outside the lock: two first starts may both compile, and
        // both programs are the same.
        let program = Arc::new(compile(profile)?);
        self.by_profile.lock().unwrap_or_else(|p| p.into_inner()).insert(key, program.clone());
        Ok(program)
    }
}

/// Takes `linux.seccomp` out of `spec` and marks it as precompiled; `None`
/// (and `spec` unchanged) when it has none.
pub fn take_profile(spec: &mut Spec) -> Option<LinuxSeccomp> {
    let profile = spec.linux_mut().as_mut()?.seccomp_mut().take()?;
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    annotations.insert(ANNOTATION.to_string(), FILTER_FILE.to_string());
    spec.set_annotations(Some(annotations));
    Some(profile)
}

/// Puts the profile the bundle's program was compiled from back into `spec`
/// (for a runtime that compiles its own, such as crun or runc).
pub fn restore_profile(spec: &mut Spec, bundle: &Path) -> Result<(), FilterError> {
    if spec.annotations().as_ref().and_then(|a| a.get(ANNOTATION)).is_none() {
        return Ok(());
    }
    let path = bundle.join(PROFILE_FILE);
    let program_error = |reason: String| FilterError::Program { path: path.display().to_string(), reason };
    let text = std::fs::read(&path).map_err(|e| program_error(e.to_string()))?;
    let profile: LinuxSeccomp = serde_json::from_slice(&text).map_err(|e| program_error(e.to_string()))?;
    if let Some(linux) = spec.linux_mut().as_mut() {
        linux.set_seccomp(Some(profile));
    }
    if let Some(a) = spec.annotations_mut().as_mut() {
        a.remove(ANNOTATION);
    }
    Ok(())
}

/// Compiles an OCI profile to the BPF program libseccomp would load.
pub fn compile(profile: &LinuxSeccomp) -> Result<Vec<u8>, FilterError> {
    let ctx = context(profile)?;
    // libseccomp 2.5 exports to a file descriptor only.
    // SAFETY: memfd_create takes a NUL-terminated name and flags, and returns
    // a new descriptor owned by nobody else, or -1.
    let fd = unsafe { libc::memfd_create(c"pinion-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(FilterError::Compile(format!("memfd_create: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: `fd` was just returned by memfd_create and is open.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    ctx.export_bpf(&file).map_err(|e| FilterError::Compile(e.to_string()))?;
    let mut program = Vec::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut program))
        .map_err(|e| FilterError::Compile(format!("reading the exported program: {e}")))?;
    check_program(&program).map_err(FilterError::Compile)?;
    Ok(program)
}

/// The profile as a libseccomp filter.
fn context(profile: &LinuxSeccomp) -> Result<ScmpFilterContext, FilterError> {
    let bad = |e: libseccomp::error::SeccompError| FilterError::Compile(e.to_string());
    if profile.flags().as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(FilterError::Unsupported("flags".into()));
    }
    let default = action(profile.default_action(), profile.default_errno_ret())?;
    let mut ctx = ScmpFilterContext::new(default).map_err(bad)?;
    // The container's spec decides no_new_privs; libseccomp must not.
    ctx.set_ctl_nnp(false).map_err(bad)?;
    for a in profile.architectures().iter().flatten() {
        ctx.add_arch(arch(*a)?).map_err(bad)?;
    }
    for rule in profile.syscalls().iter().flatten() {
        let act = action(rule.action(), rule.errno_ret())?;
        if act == default {
            // libseccomp refuses a rule that only restates the default.
            continue;
        }
        let args = rule.args().as_deref().unwrap_or_default();
        let compares: Vec<ScmpArgCompare> = args.iter().map(compare).collect();
        let mut indices: Vec<usize> = args.iter().map(|a| a.index()).collect();
        indices.sort_unstable();
        indices.dedup();
        // OCI: comparisons on distinct arguments must all hold; several on one
        // argument are alternatives (runc's reading), so each is a rule.
        let alternatives = indices.len() < compares.len();
        for name in rule.names() {
            // A name this architecture lacks (the profile lists every ABI's).
            let Ok(sc) = ScmpSyscall::from_name(name) else { continue };
            if compares.is_empty() {
                ctx.add_rule(act, sc).map_err(bad)?;
            } else if alternatives {
                for c in &compares {
                    ctx.add_rule_conditional(act, sc, std::slice::from_ref(c)).map_err(bad)?;
                }
            } else {
                ctx.add_rule_conditional(act, sc, &compares).map_err(bad)?;
            }
        }
    }
    Ok(ctx)
}

fn check_program(program: &[u8]) -> Result<(), String> {
    let n = program.len() / INSTRUCTION_BYTES;
    if program.is_empty() || !program.len().is_multiple_of(INSTRUCTION_BYTES) || n > MAX_INSTRUCTIONS {
        return Err(format!("{} bytes is not a program of 1 to {MAX_INSTRUCTIONS} instructions", program.len()));
    }
    Ok(())
}

/// The program a spec's annotation names, read from `bundle`; `None` when the
/// spec carries no annotation (its filter, if any, is in `linux.seccomp`).
pub fn read_for(spec: &Spec, bundle: &Path) -> Result<Option<Arc<Vec<u8>>>, FilterError> {
    let Some(name) = spec.annotations().as_ref().and_then(|a| a.get(ANNOTATION)) else { return Ok(None) };
    let path = bundle.join(name);
    let program_error = |reason: String| FilterError::Program { path: path.display().to_string(), reason };
    if name != FILTER_FILE {
        return Err(program_error(format!("the annotation {ANNOTATION} must be {FILTER_FILE}")));
    }
    let program = std::fs::read(&path).map_err(|e| program_error(e.to_string()))?;
    check_program(&program).map_err(program_error)?;
    Ok(Some(Arc::new(program)))
}

/// Loads `program` into the calling thread. Needs no_new_privs (or
/// CAP_SYS_ADMIN), as every filter does.
pub fn load(program: &[u8]) -> Result<(), FilterError> {
    check_program(program).map_err(|r| FilterError::Load(std::io::Error::new(std::io::ErrorKind::InvalidInput, r)))?;
    let prog = libc::sock_fprog {
        len: (program.len() / INSTRUCTION_BYTES) as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, whole instructions (checked above),
    // alive for the call; the kernel copies the program.
    let rc =
        unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog as *const libc::sock_fprog) };
    if rc != 0 {
        return Err(FilterError::Load(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// libcontainer's default executor with the program loaded first: after
/// every other step of the container's setup, right before `execve`.
#[derive(Clone)]
pub struct WithFilter {
    pub program: Arc<Vec<u8>>,
}

impl Executor for WithFilter {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        load(&self.program).map_err(|e| ExecutorError::Other(e.to_string()))?;
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }
}

fn action(a: LinuxSeccompAction, errno: Option<u32>) -> Result<ScmpAction, FilterError> {
    Ok(match a {
        LinuxSeccompAction::ScmpActKill => ScmpAction::KillThread,
        LinuxSeccompAction::ScmpActKillThread => ScmpAction::KillThread,
        LinuxSeccompAction::ScmpActKillProcess => ScmpAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => ScmpAction::Trap,
        LinuxSeccompAction::ScmpActErrno => ScmpAction::Errno(errno.unwrap_or(libc::EPERM as u32) as i32),
        LinuxSeccompAction::ScmpActTrace => ScmpAction::Trace(errno.unwrap_or(libc::EPERM as u32) as u16),
        LinuxSeccompAction::ScmpActAllow => ScmpAction::Allow,
        LinuxSeccompAction::ScmpActLog => ScmpAction::Log,
        // A listener needs the container's process to hand its fd over.
        LinuxSeccompAction::ScmpActNotify => return Err(FilterError::Unsupported("SCMP_ACT_NOTIFY".into())),
    })
}

fn compare(a: &LinuxSeccompArg) -> ScmpArgCompare {
    let (index, value, two) = (a.index() as u32, a.value(), a.value_two().unwrap_or(0));
    let op = match a.op() {
        LinuxSeccompOperator::ScmpCmpNe => ScmpCompareOp::NotEqual,
        LinuxSeccompOperator::ScmpCmpLt => ScmpCompareOp::Less,
        LinuxSeccompOperator::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        LinuxSeccompOperator::ScmpCmpEq => ScmpCompareOp::Equal,
        LinuxSeccompOperator::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        LinuxSeccompOperator::ScmpCmpGt => ScmpCompareOp::Greater,
        // OCI (runc, Docker's profile): (arg & value) == valueTwo. The mask
        // is `value`; libseccomp masks the datum too, so the other way round
        // (libcontainer 0.7's) makes `(arg & 0) == 0`, always true.
        LinuxSeccompOperator::ScmpCmpMaskedEq => {
            return ScmpArgCompare::new(index, ScmpCompareOp::MaskedEqual(value), two)
        }
    };
    ScmpArgCompare::new(index, op, value)
}

fn arch(a: Arch) -> Result<ScmpArch, FilterError> {
    Ok(match a {
        Arch::ScmpArchNative => ScmpArch::Native,
        Arch::ScmpArchX86 => ScmpArch::X86,
        Arch::ScmpArchX86_64 => ScmpArch::X8664,
        Arch::ScmpArchX32 => ScmpArch::X32,
        Arch::ScmpArchArm => ScmpArch::Arm,
        Arch::ScmpArchAarch64 => ScmpArch::Aarch64,
        Arch::ScmpArchRiscv64 => ScmpArch::Riscv64,
        other => return Err(FilterError::Unsupported(format!("architecture {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_profile(cap_add: &[&str]) -> LinuxSeccomp {
        let caps: Vec<String> = cap_add.iter().map(|c| c.to_string()).collect();
        match super::super::spec::default_seccomp(&caps) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `probe` in a forked child under `program` (with no_new_privs, as a
    /// container has it); the child's exit code.
    fn under(program: &[u8], probe: fn() -> i32) -> i32 {
        // SAFETY: the child only makes raw system calls and leaves with _exit.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                // SAFETY: prctl and _exit are async-signal-safe.
                unsafe {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || load(program).is_err() {
                        libc::_exit(100);
                    }
                    libc::_exit(probe())
                }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
                other => panic!("child: {other:?}"),
            },
            Err(e) => panic!("fork: {e}"),
        }
    }

    /// The errno of a system call that failed, 0 if it succeeded (a child it
    /// made exits at once and is reaped).
    fn errno_of(rc: libc::c_long) -> i32 {
        if rc == 0 {
            // SAFETY: in the clone's child: leave at once.
            unsafe { libc::_exit(0) }
        }
        if rc > 0 {
            // SAFETY: reaping the clone's child by its pid.
            unsafe { libc::waitpid(rc as i32, std::ptr::null_mut(), 0) };
            return 0;
        }
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }

    fn clone_with(flags: libc::c_long) -> i32 {
        // SAFETY: a fork-like clone (no new stack, no CLONE_VM): the child returns 0 and exits.
        errno_of(unsafe { libc::syscall(libc::SYS_clone, flags | libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) })
    }

    #[test]
    fn the_default_profile_refuses_what_it_lists_and_allows_the_rest() {
        let program = match compile(&default_profile(&[])) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        // A plain fork (clone without namespace flags) is allowed.
        assert_eq!(under(&program, || clone_with(0)), 0);
        // clone with a namespace flag is refused: OCI's masked comparison is
        // (flags & value) == valueTwo (libcontainer 0.7 reads it the other
        // way round and lets every clone through).
        assert_eq!(under(&program, || clone_with(libc::CLONE_NEWUTS as libc::c_long)), libc::EPERM);
        assert_eq!(under(&program, || clone_with(libc::CLONE_NEWUSER as libc::c_long)), libc::EPERM);
        // clone3 answers ENOSYS so that libc falls back to clone.
        // SAFETY: clone3 with a null argument is refused before it is read.
        assert_eq!(under(&program, || errno_of(unsafe { libc::syscall(libc::SYS_clone3, 0, 0) })), libc::ENOSYS);
        // Not in the profile: the default action's EPERM.
        // SAFETY: unshare(CLONE_NEWUTS) has no memory arguments.
        assert_eq!(
            under(&program, || errno_of(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS) })),
            libc::EPERM
        );
        // SAFETY: personality(0xffffffff) only queries.
        let query = || errno_of(unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) }.min(0));
        assert_eq!(under(&program, query), libc::EPERM, "personality is allowed only for PER_LINUX");
    }

    #[test]
    fn an_added_capability_opens_its_calls_and_each_profile_compiles_once() {
        let filters = Filters::default();
        let plain = filters.program(&default_profile(&[])).map_err(|e| e.to_string());
        let again = filters.program(&default_profile(&[])).map_err(|e| e.to_string());
        let admin = filters.program(&default_profile(&["CAP_SYS_ADMIN"])).map_err(|e| e.to_string());
        let (Ok(plain), Ok(again), Ok(admin)) = (plain, again, admin) else { panic!("compile failed") };
        assert!(Arc::ptr_eq(&plain, &again), "the same profile is compiled once");
        assert!(plain != admin, "CAP_SYS_ADMIN adds calls");
        // SAFETY: unshare(CLONE_NEWUTS) has no memory arguments.
        let unshare = || errno_of(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS) });
        assert_eq!(under(&plain, unshare), libc::EPERM);
        // With SYS_ADMIN's calls in the filter, the kernel decides (root here):
        // new namespaces, by unshare and by clone, as Docker's profile has it.
        assert_ne!(under(&admin, unshare), libc::EPERM);
        assert_eq!(under(&admin, || clone_with(libc::CLONE_NEWUTS as libc::c_long)), 0);
    }

    #[test]
    fn a_spec_names_its_program_and_a_missing_or_torn_one_is_an_error() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let mut spec = Spec::default();
        assert!(matches!(read_for(&spec, dir.path()), Ok(None)), "no annotation: the spec's own filter");
        assert!(take_profile(&mut spec).is_none(), "no profile: nothing to take");
        if let Some(linux) = spec.linux_mut().as_mut() {
            linux.set_seccomp(Some(default_profile(&[])));
        }
        assert!(take_profile(&mut spec).is_some());
        assert!(spec.linux().as_ref().is_some_and(|l| l.seccomp().is_none()));
        assert!(matches!(read_for(&spec, dir.path()), Err(FilterError::Program { .. })), "missing file");
        let _ = std::fs::write(dir.path().join(FILTER_FILE), [0u8; 12]);
        assert!(matches!(read_for(&spec, dir.path()), Err(FilterError::Program { .. })), "not whole instructions");
        let program = compile(&default_profile(&[])).unwrap_or_default();
        let _ = std::fs::write(dir.path().join(FILTER_FILE), &program);
        assert!(matches!(read_for(&spec, dir.path()), Ok(Some(p)) if *p == program), "the program as written");
        // A peer runtime gets the profile back from the file beside it.
        let _ = std::fs::write(
            dir.path().join(PROFILE_FILE),
            serde_json::to_vec(&default_profile(&[])).unwrap_or_default(),
        );
        assert!(restore_profile(&mut spec, dir.path()).is_ok());
        assert_eq!(spec.linux().as_ref().and_then(|l| l.seccomp().clone()), Some(default_profile(&[])));
        assert!(matches!(read_for(&spec, dir.path()), Ok(None)), "the annotation went with it");
        // A notify action stays with libcontainer.
        let mut notify = default_profile(&[]);
        notify.set_default_action(LinuxSeccompAction::ScmpActNotify);
        assert!(matches!(compile(&notify), Err(FilterError::Unsupported(_))));
    }
}
