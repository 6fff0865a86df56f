//! What this host can do for tests with real containers.

/// Whether this process runs as root (real containers need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Whether CPUs 0 and 1 are online (CPU 0 reserved, CPU 1 exclusive).
pub fn has_two_cpus() -> bool {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| specs::CpuSet::parse_list(s.trim()).ok())
        .is_some_and(|cpus| cpus.contains(0) && cpus.contains(1))
}

/// Whether `program` is an executable file in one of `PATH`'s folders.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
