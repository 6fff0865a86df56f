//! Brings `lo` up in a network namespace: a new container's (the shim enters
//! the namespace only long enough to open a socket there, then sets the
//! interface flag with an ioctl on that socket, which stays bound to its
//! namespace), or the calling thread's own (a pod's namespace, made by
//! `crate::cni`).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sched::{setns, CloneFlags};

pub(crate) fn loopback_up(pid: i32) -> Result<(), String> {
    let target = File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("/proc/{pid}/ns/net: {e}"))?;
    let own = File::open("/proc/self/ns/net").map_err(|e| format!("/proc/self/ns/net: {e}"))?;
    setns(&target, CloneFlags::CLONE_NEWNET).map_err(|e| format!("entering the container's netns: {e}"))?;
    let sock = socket();
    if let Err(e) = setns(&own, CloneFlags::CLONE_NEWNET) {
        // Staying in the container's namespace would be wrong for everything after.
        eprintln!("cannot return to the shim's own netns: {e}");
        std::process::exit(1);
    }
    set_lo_up(&sock?)
}

/// `lo` up in the calling thread's network namespace.
pub(crate) fn loopback_up_here() -> Result<(), String> {
    set_lo_up(&socket()?)
}

fn socket() -> Result<OwnedFd, String> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh socket owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_lo_up(sock: &OwnedFd) -> Result<(), String> {
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `req`, which outlives the calls.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(format!("SIOCGIFFLAGS lo: {}", std::io::Error::last_os_error()));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(format!("SIOCSIFFLAGS lo: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}
