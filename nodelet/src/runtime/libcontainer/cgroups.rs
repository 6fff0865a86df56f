//! The containers' cgroups through libcgroups (v1 and v2 alike): where they go
//! (`settle_parent`), in-place cpuset updates, the CFS quota the shim sets
//! before start, removal, OOM-kill detection, and the list of directories that
//! exist (for leak checks). Every function but `settle_parent` takes the
//! container's cgroup path (relative to each hierarchy's root, written
//! absolute), as its bundle records it: see `of`.
//!
//! Where: on cgroup v2, an agent whose cgroup (or an ancestor) is marked
//! delegated (systemd's `trusted.delegate` / `user.delegate` extended
//! attribute, set for `Delegate=yes` units since systemd 251) keeps
//! everything inside that subtree D, as systemd's delegation rules ask: it
//! moves itself into `D/supervisor` (a cgroup holding processes cannot give
//! controllers to children), enables the controllers it needs in
//! `D/cgroup.subtree_control` and `D/pods/cgroup.subtree_control`, and
//! creates each container's `D/pods/ID` itself before libcontainer sees it,
//! because libcgroups, finding the directory missing, would enable
//! controllers in every ancestor from the hierarchy's root down. Anywhere
//! else (cgroup v1 or hybrid, or v2 without delegation) containers go under
//! `/pinion` of each hierarchy, as before.

use std::path::{Path, PathBuf};

use libcgroups::common::{create_cgroup_manager, CgroupConfig, CgroupManager, CgroupSetup, ControllerOpt};
use oci_spec::runtime::LinuxResources;

use super::records::Layout;
use super::spec::cgroup_path;
use crate::runtime::CpuQuota;

const ROOT: &str = "/sys/fs/cgroup";
/// Where containers' cgroups go when the agent has no delegated subtree.
pub const DEFAULT_PARENT: &str = "/pinion";
/// The v2 controllers a container's limits use; those the delegated subtree
/// has are enabled below it, the others are left alone.
const CONTROLLERS: [&str; 6] = ["cpuset", "cpu", "io", "memory", "hugetlb", "pids"];
/// The extended attributes systemd sets on a delegated cgroup.
const DELEGATE_XATTRS: [&str; 2] = ["trusted.delegate", "user.delegate"];

/// Where the agent puts its containers' cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    /// Relative to each hierarchy's root, written absolute (`/pinion`).
    pub path: PathBuf,
    /// Inside a delegated v2 subtree: the agent creates each container's
    /// directory itself (see the module comment).
    pub delegated: bool,
}

impl Parent {
    pub fn default_parent() -> Self {
        Self { path: PathBuf::from(DEFAULT_PARENT), delegated: false }
    }
}

/// Decides where containers' cgroups go and, inside a delegated subtree,
/// prepares it (moves this process into `supervisor`, enables controllers).
/// Called once by the agent at start.
pub fn settle_parent() -> Result<Parent, String> {
    if !matches!(setup(), Some(CgroupSetup::Unified)) {
        return Ok(Parent::default_parent());
    }
    let text = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let Some(own) = unified_path(&text) else { return Ok(Parent::default_parent()) };
    let root = Path::new(ROOT);
    let Some(delegated) = delegated_root(&own, |p| is_delegated(&root.join(rel(p)))) else {
        return Ok(Parent::default_parent());
    };
    enter(root, &delegated)?;
    Ok(Parent { path: delegated.join("pods"), delegated: true })
}

/// This process's cgroup on the unified hierarchy (the `0::PATH` line).
fn unified_path(proc_self_cgroup: &str) -> Option<PathBuf> {
    proc_self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(|p| PathBuf::from(p.trim()))
}

/// The delegated cgroup holding `own`: `own` itself or its nearest marked
/// ancestor, never the root (which no manager delegates). An agent already in
/// a `supervisor` (moved there by an earlier run, or started there by
/// systemd's `DelegateSubgroup=supervisor`) looks from the parent: its own
/// cgroup must stay a leaf, or systemd could not start the next agent in it.
fn delegated_root(own: &Path, marked: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let start = match own.file_name() {
        Some(name) if name == "supervisor" => own.parent().unwrap_or(own),
        _ => own,
    };
    start
        .ancestors()
        .filter(|p| *p != Path::new("/") && !p.as_os_str().is_empty())
        .find(|p| marked(p))
        .map(Path::to_path_buf)
}

fn is_delegated(dir: &Path) -> bool {
    DELEGATE_XATTRS.iter().any(|name| matches!(xattr::get(dir, name), Ok(Some(v)) if v.as_slice() == b"1"))
}

fn rel(p: &Path) -> &Path {
    p.strip_prefix("/").unwrap_or(p)
}

/// Moves this process into `D/supervisor` and gives `D/pods` the controllers.
fn enter(root: &Path, delegated: &Path) -> Result<(), String> {
    let d = root.join(rel(delegated));
    let supervisor = d.join("supervisor");
    mkdir(&supervisor)?;
    write(&supervisor.join("cgroup.procs"), &std::process::id().to_string())?;
    let pods = d.join("pods");
    enable(&d)?;
    mkdir(&pods)?;
    enable(&pods)?;
    tracing::info!(subtree = %delegated.display(), "cgroups: inside the delegated subtree (agent in supervisor/, containers in pods/)");
    Ok(())
}

/// Enables in `dir/cgroup.subtree_control` the wanted controllers `dir` has
/// and has not enabled yet; writes nothing when there is nothing to add.
fn enable(dir: &Path) -> Result<(), String> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let (available, enabled) = (read("cgroup.controllers")?, read("cgroup.subtree_control")?);
    let add = to_enable(&available, &enabled);
    if add.is_empty() {
        return Ok(());
    }
    let path = dir.join("cgroup.subtree_control");
    write(&path, &add)
        .map_err(|e| format!("{e} (a delegated cgroup must hold no process but the agent, which moved to supervisor/)"))
}

/// `+c` for each wanted controller listed in `available` and not in `enabled`.
fn to_enable(available: &str, enabled: &str) -> String {
    let has = |list: &str, c: &str| list.split_whitespace().any(|x| x == c);
    CONTROLLERS
        .iter()
        .filter(|c| has(available, c) && !has(enabled, c))
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn mkdir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Creates a new container's cgroup directory inside the delegated subtree
/// (see the module comment); elsewhere libcgroups creates it.
pub fn precreate(parent: &Parent, id: &str) -> Result<(), String> {
    if !parent.delegated {
        return Ok(());
    }
    mkdir(&Path::new(ROOT).join(rel(&cgroup_path(&parent.path, id))))
}

/// A container's cgroup: what its bundle's `config.json` records (so a
/// container keeps its cgroup across agents placing new ones elsewhere), else
/// under `parent`.
pub fn of(layout: &Layout, id: &str, parent: &Path) -> PathBuf {
    oci_spec::runtime::Spec::load(layout.bundle(id).join("config.json"))
        .ok()
        .and_then(|s| s.linux().as_ref().and_then(|l| l.cgroups_path().clone()))
        .unwrap_or_else(|| cgroup_path(parent, id))
}

fn manager(cgroup: &Path) -> Result<libcgroups::common::AnyCgroupManager, String> {
    let name = cgroup.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    create_cgroup_manager(CgroupConfig {
        cgroup_path: cgroup.to_path_buf(),
        systemd_cgroup: false,
        container_name: name,
    })
    .map_err(|e| format!("cgroup manager for {}: {e}", cgroup.display()))
}

/// Applies `resources` to the running container's cgroup (youki's `update`).
pub fn apply(cgroup: &Path, resources: &LinuxResources) -> Result<(), String> {
    let m = manager(cgroup)?;
    m.apply(&ControllerOpt { resources, disable_oom_killer: false, oom_score_adj: None, freezer_state: None })
        .map_err(|e| format!("applying cgroup resources: {e}"))
}

/// Sets the CFS bandwidth limit of the container's cgroup: v1
/// `cpu.cfs_period_us` then `cpu.cfs_quota_us`, v2 `cpu.max`. Two file
/// writes, no controller walk: the shim calls it between create and start.
pub fn set_cpu_quota(cgroup: &Path, quota: CpuQuota) -> Result<(), String> {
    let rel = rel(cgroup);
    match setup() {
        Some(CgroupSetup::Unified) => {
            write(&Path::new(ROOT).join(rel).join("cpu.max"), &format!("{} {}", quota.quota_us, quota.period_us))
        }
        _ => {
            let mount = libcgroups::v1::util::get_subsystem_mount_point(&libcgroups::v1::ControllerType::Cpu)
                .map_err(|e| format!("the cpu cgroup hierarchy: {e}"))?;
            let dir = mount.join(rel);
            write(&dir.join("cpu.cfs_period_us"), &quota.period_us.to_string())?;
            write(&dir.join("cpu.cfs_quota_us"), &quota.quota_us.to_string())
        }
    }
}

/// Kills what is left inside and removes the cgroup in every hierarchy; a cgroup
/// that does not exist is not an error.
pub fn remove(cgroup: &Path) -> Result<(), String> {
    if existing_dirs(cgroup).is_empty() {
        return Ok(());
    }
    manager(cgroup)?.remove().map_err(|e| format!("removing cgroup {}: {e}", cgroup.display()))
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
pub fn existing_dirs(cgroup: &Path) -> Vec<PathBuf> {
    let rel = rel(cgroup);
    let mut roots = vec![PathBuf::from(ROOT)];
    roots.extend(v1_dirs());
    if Path::new(ROOT).join("unified").exists() {
        roots.push(Path::new(ROOT).join("unified"));
    }
    roots.sort();
    roots.dedup();
    roots.into_iter().map(|r| r.join(rel)).filter(|p| p.is_dir()).collect()
}

/// Whether the kernel's OOM killer killed a process of this container.
pub fn oom_killed(cgroup: &Path) -> bool {
    let rel = rel(cgroup);
    let (file, key) = match setup() {
        Some(CgroupSetup::Unified) => (Path::new(ROOT).join(rel).join("memory.events"), "oom_kill"),
        _ => (Path::new(ROOT).join("memory").join(rel).join("memory.oom_control"), "oom_kill"),
    };
    let Ok(text) = std::fs::read_to_string(&file) else { return false };
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .any(|(k, v)| k == key && v.trim().parse::<u64>().map(|n| n > 0).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cgroup_is_the_unified_line() {
        let cases = [
            ("0::/system.slice/pinion-agent.service\n", Some("/system.slice/pinion-agent.service")),
            ("12:cpuset:/pinion\n1:name=systemd:/x\n0::/user.slice\n", Some("/user.slice")),
            ("12:cpuset:/\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(unified_path(text), want.map(PathBuf::from), "{text:?}");
        }
    }

    #[test]
    fn the_nearest_marked_ancestor_is_the_delegated_root() {
        let marked = ["/system.slice/pinion-agent.service", "/system.slice/pinion-agent.service/supervisor", "/"];
        let is = |p: &Path| marked.iter().any(|m| Path::new(m) == p);
        let cases = [
            // Started by systemd into the unit's cgroup, or already in supervisor/.
            ("/system.slice/pinion-agent.service", Some("/system.slice/pinion-agent.service")),
            ("/system.slice/pinion-agent.service/supervisor", Some("/system.slice/pinion-agent.service")),
            // A shell's session: nothing delegated; the root never counts.
            ("/user.slice/user-0.slice/session-1.scope", None),
            ("/", None),
        ];
        for (own, want) in cases {
            assert_eq!(delegated_root(Path::new(own), is), want.map(PathBuf::from), "{own}");
        }
    }

    #[test]
    fn only_wanted_missing_controllers_are_enabled() {
        let cases = [
            ("cpuset cpu io memory hugetlb pids rdma misc", "", "+cpuset +cpu +io +memory +hugetlb +pids"),
            ("cpuset cpu memory pids", "cpu memory", "+cpuset +pids"),
            ("cpu memory", "cpu memory", ""),
            ("", "", ""),
        ];
        for (available, enabled, want) in cases {
            assert_eq!(to_enable(available, enabled), want, "{available:?} / {enabled:?}");
        }
    }
}
