//! Brings `lo` up in a new container's network namespace: the shim enters the
//! namespace only long enough to open a socket there, then sets the interface
//! flag with an ioctl on that socket (a socket stays bound to its namespace).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sched::{setns, CloneFlags};

pub fn loopback_up(pid: i32) -> Result<(), String> {
    let target = File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("/proc/{pid}/ns/net: {e}"))?;
    let own = File::open("/proc/self/ns/net").map_err(|e| format!("/proc/self/ns/net: {e}"))?;
    setns(&target, CloneFlags::CLONE_NEWNET).map_err(|e| format!("entering the container's netns: {e}"))?;
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let sock_err = std::io::Error::last_os_error();
    if let Err(e) = setns(&own, CloneFlags::CLONE_NEWNET) {
        // Staying in the container's namespace would be wrong for everything after.
        eprintln!("cannot return to the shim's own netns: {e}");
        std::process::exit(1);
    }
    if fd < 0 {
        return Err(format!("socket: {sock_err}"));
    }
    // SAFETY: `fd` is a fresh socket owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
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
