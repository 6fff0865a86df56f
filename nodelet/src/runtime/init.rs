//! `pinion init -- CMD...`: the minimal init a container with `spec.init` runs
//! as its PID 1, as `docker run --init` (tini) does. The kernel gives PID 1 no
//! default signal actions, so a plain `sleep 1000` as PID 1 ignores SIGTERM and
//! waits out the whole grace for SIGKILL; this init forwards the signals to its
//! child, reaps every zombie re-parented to it, and exits with the child's
//! code (128 + N when a signal N killed it).
//!
//! Single-threaded and synchronous: `main` dispatches it before any async
//! runtime exists (a forked child of a threaded process may only exec).

use std::ffi::CString;

use nix::errno::Errno;
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{execvp, fork, ForkResult, Pid};

use super::{NOT_EXECUTABLE_CODE, NOT_FOUND_CODE};

/// Signals passed on to the child; SIGCHLD is the init's own business, and
/// SIGKILL/SIGSTOP cannot be caught.
const FORWARDED: &[Signal] = &[
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGTERM,
    Signal::SIGALRM,
    Signal::SIGCONT,
    Signal::SIGWINCH,
];

/// The exit code for a child's wait status: its own code, or 128 + signal.
fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// The exit code of a command that could not be executed (as a shell's).
fn exec_error_code(e: Errno) -> i32 {
    if e == Errno::ENOENT {
        NOT_FOUND_CODE
    } else {
        NOT_EXECUTABLE_CODE
    }
}

/// Runs `argv` as the child and returns the code to exit with.
pub fn run(argv: &[String]) -> i32 {
    let Some(first) = argv.first() else {
        eprintln!("pinion init: no command");
        return 2;
    };
    let args: Result<Vec<CString>, _> = argv.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(args) = args else {
        eprintln!("pinion init: an argument holds a NUL byte");
        return 2;
    };
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(*s);
    }
    set.add(Signal::SIGCHLD);
    // Blocked before the fork, so nothing sent between fork and the first wait
    // is lost: blocked signals stay pending even for a PID 1 (the kernel drops
    // only unblocked ones without a handler).
    let mut old = SigSet::empty();
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old)) {
        eprintln!("pinion init: blocking signals: {e}");
        return 1;
    }
    // SAFETY: single-threaded (see the module docs); the child only restores
    // its signal mask and execs.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            let e = match execvp(&args[0], &args) {
                Err(e) => e,
                Ok(never) => match never {},
            };
            eprintln!("pinion init: cannot execute {first:?}: {e}");
            std::process::exit(exec_error_code(e));
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            eprintln!("pinion init: fork: {e}");
            return 1;
        }
    };
    loop {
        let sig = match set.wait() {
            Ok(sig) => sig,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("pinion init: waiting for signals: {e}");
                return 1;
            }
        };
        if sig != Signal::SIGCHLD {
            // The child may have just exited: ESRCH then, and SIGCHLD follows.
            let _ = kill(child, sig);
            continue;
        }
        if let Some(code) = reap(child) {
            return code;
        }
    }
}

/// Reaps every exited process; the child's exit code once it is among them.
fn reap(child: Pid) -> Option<i32> {
    let mut code = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return code,
            Ok(status) if status.pid() == Some(child) => {
                if let Some(c) = exit_code(status) {
                    code = Some(c);
                }
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                eprintln!("pinion init: waitpid: {e}");
                return code;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_shells() {
        let pid = Pid::from_raw(7);
        assert_eq!(exit_code(WaitStatus::Exited(pid, 3)), Some(3));
        assert_eq!(exit_code(WaitStatus::Signaled(pid, Signal::SIGTERM, false)), Some(143));
        assert_eq!(exit_code(WaitStatus::Signaled(pid, Signal::SIGKILL, true)), Some(137));
        assert_eq!(exit_code(WaitStatus::StillAlive), None);
        assert_eq!(exec_error_code(Errno::ENOENT), 127);
        assert_eq!(exec_error_code(Errno::EACCES), 126);
    }
}
