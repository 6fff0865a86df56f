//! A child process the test owns: killed (SIGKILL) and reaped when dropped,
//! so a failing test leaves no server, agent or client behind.

use std::process::Child;

pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A memory figure of a process from `/proc/PID/status` (`VmRSS:`,
/// `VmHWM:`), in MiB; 0 when unreadable.
pub fn memory_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}
