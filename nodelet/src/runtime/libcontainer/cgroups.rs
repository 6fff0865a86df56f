//! The container's cgroups through libcgroups (v1 and v2 alike): in-place cpuset
//! updates, the CFS quota the shim sets before start, removal, OOM-kill
//! detection, and the list of directories that exist (for leak checks).

use std::path::{Path, PathBuf};

use libcgroups::common::{create_cgroup_manager, CgroupConfig, CgroupManager, CgroupSetup, ControllerOpt};
use oci_spec::runtime::LinuxResources;

use super::spec::cgroup_path;
use crate::runtime::CpuQuota;

const ROOT: &str = "/sys/fs/cgroup";

fn manager(id: &str) -> Result<libcgroups::common::AnyCgroupManager, String> {
    create_cgroup_manager(CgroupConfig {
        cgroup_path: cgroup_path(id),
        systemd_cgroup: false,
        container_name: id.to_string(),
    })
    .map_err(|e| format!("cgroup manager for {}: {e}", cgroup_path(id).display()))
}

/// Applies `resources` to the running container's cgroup (youki's `update`).
pub fn apply(id: &str, resources: &LinuxResources) -> Result<(), String> {
    let m = manager(id)?;
    m.apply(&ControllerOpt { resources, disable_oom_killer: false, oom_score_adj: None, freezer_state: None })
        .map_err(|e| format!("applying cgroup resources: {e}"))
}

/// Sets the CFS bandwidth limit of the container's cgroup: v1
/// `cpu.cfs_period_us` then `cpu.cfs_quota_us`, v2 `cpu.max`. Two file
/// writes, no controller walk: the shim calls it between create and start.
pub fn set_cpu_quota(id: &str, quota: CpuQuota) -> Result<(), String> {
    let rel = cgroup_path(id);
    let rel = rel.strip_prefix("/").unwrap_or(&rel).to_path_buf();
    let write = |path: PathBuf, value: String| {
        std::fs::write(&path, value.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
    };
    match setup() {
        Some(CgroupSetup::Unified) => {
            write(Path::new(ROOT).join(&rel).join("cpu.max"), format!("{} {}", quota.quota_us, quota.period_us))
        }
        _ => {
            let mount = libcgroups::v1::util::get_subsystem_mount_point(&libcgroups::v1::ControllerType::Cpu)
                .map_err(|e| format!("the cpu cgroup hierarchy: {e}"))?;
            let dir = mount.join(&rel);
            write(dir.join("cpu.cfs_period_us"), quota.period_us.to_string())?;
            write(dir.join("cpu.cfs_quota_us"), quota.quota_us.to_string())
        }
    }
}

/// Kills what is left inside and removes the cgroup in every hierarchy; a cgroup
/// that does not exist is not an error.
pub fn remove(id: &str) -> Result<(), String> {
    if existing_dirs(id).is_empty() {
        return Ok(());
    }
    manager(id)?.remove().map_err(|e| format!("removing cgroup {}: {e}", cgroup_path(id).display()))
}

fn v1_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(ROOT) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink() && p.join("cgroup.procs").exists())
        .collect()
}

fn setup() -> Option<CgroupSetup> {
    libcgroups::common::get_cgroup_setup().ok()
}

/// Every directory of this container's cgroup that exists now, in any hierarchy.
pub fn existing_dirs(id: &str) -> Vec<PathBuf> {
    let rel = cgroup_path(id);
    let rel = rel.strip_prefix("/").unwrap_or(&rel).to_path_buf();
    let mut roots = vec![PathBuf::from(ROOT)];
    roots.extend(v1_dirs());
    if Path::new(ROOT).join("unified").exists() {
        roots.push(Path::new(ROOT).join("unified"));
    }
    roots.sort();
    roots.dedup();
    roots.into_iter().map(|r| r.join(&rel)).filter(|p| p.is_dir()).collect()
}

/// Whether the kernel's OOM killer killed a process of this container.
pub fn oom_killed(id: &str) -> bool {
    let rel = cgroup_path(id);
    let rel = rel.strip_prefix("/").unwrap_or(&rel).to_path_buf();
    let (file, key) = match setup() {
        Some(CgroupSetup::Unified) => (Path::new(ROOT).join(&rel).join("memory.events"), "oom_kill"),
        _ => (Path::new(ROOT).join("memory").join(&rel).join("memory.oom_control"), "oom_kill"),
    };
    let Ok(text) = std::fs::read_to_string(&file) else { return false };
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .any(|(k, v)| k == key && v.trim().parse::<u64>().map(|n| n > 0).unwrap_or(false))
}
