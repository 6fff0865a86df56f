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
//!
//! Exec probes on cgroup v2 (`settle_probe_cgroup`): a probe's command must
//! not run on a pinned pod's exclusive CPUs. On v1 it joins every cgroup of
//! its container but the cpuset (the `exec` module). On v2 a process is in
//! one cgroup for every controller, and the container's cpuset is the pod's
//! CPUs, so the command joins the container's namespaces but a cgroup of its
//! own beside the containers': `PARENT/.probes/ID` for the container
//! `PARENT/ID` (no container id starts with a dot), with the node's reserved
//! CPUs and its own memory and pids bounds. One per container, not one for
//! the node, so that a probe that forks or grows without end fails its own
//! container's probes only, never another pod's liveness. It is not charged
//! to the pod's memory limit (the kubelet charges it there); the bounds here
//! take that place. It goes when its container's cgroup goes (`remove`).

use std::path::{Path, PathBuf};

use oci_spec::runtime::LinuxResources;

use super::records::Layout;
use super::spec::cgroup_path;
use crate::host::Host;
use crate::runtime::CpuQuota;

const ROOT: &str = "/sys/fs/cgroup";
/// Where containers' cgroups go when the agent has no delegated subtree.
pub(crate) const DEFAULT_PARENT: &str = "/pinion";
/// The v2 controllers a container's limits use; those the delegated subtree
/// has are enabled below it, the others are left alone.
const CONTROLLERS: [&str; 6] = ["cpuset", "cpu", "io", "memory", "hugetlb", "pids"];
/// The extended attributes systemd sets on a delegated cgroup.
const DELEGATE_XATTRS: [&str; 2] = ["trusted.delegate", "user.delegate"];
/// The folder of the exec probes' cgroups, beside the containers' (see the
/// module comment): a container id never starts with a dot.
const PROBES: &str = ".probes";
/// `memory.max` of one container's exec probes (v2): a health check is a
/// small program; this is room for an interpreter, not for the workload.
pub(crate) const PROBE_MEMORY_BYTES: u64 = 128 << 20;
/// `pids.max` of one container's exec probes (v2): a shell and a few children.
pub(crate) const MAX_PROBE_PIDS: u32 = 64;

/// Where the agent puts its containers' cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parent {
    /// Relative to each hierarchy's root, written absolute (`/pinion`).
    pub(crate) path: PathBuf,
    /// Inside a delegated v2 subtree: the agent creates each container's
    /// directory itself (see the module comment).
    pub(crate) delegated: bool,
}

impl Parent {
    pub(crate) fn default_parent() -> Self {
        Self { path: PathBuf::from(DEFAULT_PARENT), delegated: false }
    }
}

/// Decides where containers' cgroups go and, inside a delegated subtree,
/// prepares it (moves this process into `supervisor`, enables controllers).
/// Called once by the agent at start.
pub(crate) fn settle_parent() -> Result<Parent, String> {
    settle_parent_on(&crate::host::RealHost, std::process::id())
}

/// [`settle_parent`] on `host`, for the process `pid`.
pub(crate) fn settle_parent_on(host: &dyn Host, pid: u32) -> Result<Parent, String> {
    if !host.cgroup_v2_only() {
        return Ok(Parent::default_parent());
    }
    let proc_self = Path::new("/proc/self/cgroup");
    let text = host.read_file(proc_self).map_err(|e| format!("{}: {e}", proc_self.display()))?;
    let Some(own) = unified_path(&text) else { return Ok(Parent::default_parent()) };
    let root = Path::new(ROOT);
    let Some(delegated) = delegated_root(&own, |p| is_delegated(host, &root.join(rel(p)))) else {
        return Ok(Parent::default_parent());
    };
    enter(host, root, &delegated, pid)?;
    Ok(Parent { path: delegated.join("pods"), delegated: true })
}

/// This process's own `cgroup.procs` on the unified hierarchy:
/// `/sys/fs/cgroup` on a v2 host, its `unified` folder on a hybrid one; none
/// on a host without it. (The agent moves itself there to keep the kernel's
/// cgroup-move lock ready, `moves`: the lock is one for every hierarchy.)
pub(crate) fn own_procs(host: &dyn Host) -> Option<PathBuf> {
    let own = unified_path(&host.read_file(Path::new("/proc/self/cgroup")).ok()?)?;
    let root = if host.cgroup_v2_only() { PathBuf::from(ROOT) } else { Path::new(ROOT).join("unified") };
    let procs = root.join(rel(&own)).join("cgroup.procs");
    host.is_file(&procs).then_some(procs)
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

fn is_delegated(host: &dyn Host, dir: &Path) -> bool {
    DELEGATE_XATTRS.iter().any(|name| host.xattr(dir, name).is_some_and(|v| v.as_slice() == b"1"))
}

fn rel(p: &Path) -> &Path {
    p.strip_prefix("/").unwrap_or(p)
}

/// Moves this process into `D/supervisor` and gives `D/pods` the controllers.
fn enter(host: &dyn Host, root: &Path, delegated: &Path, pid: u32) -> Result<(), String> {
    let d = root.join(rel(delegated));
    let supervisor = d.join("supervisor");
    mkdir(host, &supervisor)?;
    write(host, &supervisor.join("cgroup.procs"), &pid.to_string())?;
    let pods = d.join("pods");
    enable(host, &d)?;
    mkdir(host, &pods)?;
    enable(host, &pods)?;
    tracing::info!(subtree = %delegated.display(), "cgroups: inside the delegated subtree (agent in supervisor/, containers in pods/)");
    Ok(())
}

/// Enables in `dir/cgroup.subtree_control` the wanted controllers `dir` has
/// and has not enabled yet; writes nothing when there is nothing to add.
fn enable(host: &dyn Host, dir: &Path) -> Result<(), String> {
    let read = |name: &str| {
        let p = dir.join(name);
        host.read_file(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let (available, enabled) = (read("cgroup.controllers")?, read("cgroup.subtree_control")?);
    let add = to_enable(&available, &enabled);
    if add.is_empty() {
        return Ok(());
    }
    let path = dir.join("cgroup.subtree_control");
    write(host, &path, &add)
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

fn mkdir(host: &dyn Host, dir: &Path) -> Result<(), String> {
    match host.create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn write(host: &dyn Host, path: &Path, value: &str) -> Result<(), String> {
    host.write_file(path, value).map_err(|e| format!("{}: {e}", path.display()))
}

/// Creates a new container's cgroup directory inside the delegated subtree
/// (see the module comment); elsewhere libcgroups creates it.
pub(crate) fn precreate(host: &dyn Host, parent: &Parent, id: &str) -> Result<(), String> {
    if !parent.delegated {
        return Ok(());
    }
    mkdir(host, &Path::new(ROOT).join(rel(&cgroup_path(&parent.path, id))))
}

/// A container's cgroup: what its bundle's `config.json` records (so a
/// container keeps its cgroup across agents placing new ones elsewhere), else
/// under `parent`.
pub(crate) fn of(layout: &Layout, id: &str, parent: &Path) -> PathBuf {
    oci_spec::runtime::Spec::load(layout.bundle(id).join("config.json"))
        .ok()
        .and_then(|s| s.linux().as_ref().and_then(|l| l.cgroups_path().clone()))
        .unwrap_or_else(|| cgroup_path(parent, id))
}

/// Applies `resources` to the running container's cgroup (youki's `update`).
pub(crate) fn apply(host: &dyn Host, cgroup: &Path, resources: &LinuxResources) -> Result<(), String> {
    host.apply_cgroup(cgroup, resources)
}

/// Sets the CFS bandwidth limit of the container's cgroup: v1
/// `cpu.cfs_period_us` then `cpu.cfs_quota_us`, v2 `cpu.max`. Two file
/// writes, no controller walk: the shim calls it between create and start.
pub(crate) fn set_cpu_quota(host: &dyn Host, cgroup: &Path, quota: CpuQuota) -> Result<(), String> {
    let rel = rel(cgroup);
    if host.cgroup_v2_only() {
        return write(
            host,
            &Path::new(ROOT).join(rel).join("cpu.max"),
            &format!("{} {}", quota.quota_us, quota.period_us),
        );
    }
    let mount = host
        .v1_mount_point(&libcgroups::v1::ControllerType::Cpu)
        .map_err(|e| format!("the cpu cgroup hierarchy: {e}"))?;
    let dir = mount.join(rel);
    write(host, &dir.join("cpu.cfs_period_us"), &quota.period_us.to_string())?;
    write(host, &dir.join("cpu.cfs_quota_us"), &quota.quota_us.to_string())
}

/// Gives the container's v1 cpu cgroup `budget_us` of real-time runtime
/// (`cpu.rt_runtime_us`), raising its parent (Pinion's own cgroup) to hold
/// it beside its other children's first, as the kernel requires. Nothing
/// where the hierarchy has no such file (no `CONFIG_RT_GROUP_SCHED`, or v2,
/// which has no real-time groups): real-time threads need no budget there.
pub(crate) fn grant_realtime(host: &dyn Host, cgroup: &Path, budget_us: u64) -> Result<(), String> {
    if host.cgroup_v2_only() {
        return Ok(());
    }
    let mount = host
        .v1_mount_point(&libcgroups::v1::ControllerType::Cpu)
        .map_err(|e| format!("the cpu cgroup hierarchy: {e}"))?;
    let dir = mount.join(rel(cgroup));
    let file = dir.join("cpu.rt_runtime_us");
    let read = |p: &Path| host.read_file(p).ok().and_then(|v| v.trim().parse::<u64>().ok());
    if read(&file).is_none() {
        return Ok(());
    }
    let parent = dir.parent().ok_or("a cgroup without a parent")?;
    let held: u64 = host
        .read_dir(parent)
        .unwrap_or_default()
        .into_iter()
        .filter(|d| *d != dir)
        .filter_map(|d| read(&d.join("cpu.rt_runtime_us")))
        .sum();
    let parent_file = parent.join("cpu.rt_runtime_us");
    if read(&parent_file).unwrap_or(0) < held + budget_us {
        write(host, &parent_file, &(held + budget_us).to_string())?;
    }
    write(host, &file, &budget_us.to_string())
}

/// Kills what is left inside and removes the cgroup in every hierarchy, and
/// the cgroup of its exec probes (v2); a cgroup that does not exist is not an
/// error.
pub(crate) fn remove(host: &dyn Host, cgroup: &Path) -> Result<(), String> {
    if let Some(probes) = probe_cgroup_of(cgroup) {
        if host.is_dir(&Path::new(ROOT).join(rel(&probes))) {
            host.remove_cgroup(&probes)?;
        }
    }
    if existing_dirs(host, cgroup).is_empty() {
        return Ok(());
    }
    host.remove_cgroup(cgroup)
}

/// The cgroup of the exec probes of the container whose cgroup is
/// `cgroup` (`PARENT/ID` -> `PARENT/.probes/ID`), written as `cgroup` is.
pub(crate) fn probe_cgroup_of(cgroup: &Path) -> Option<PathBuf> {
    let id = cgroup.file_name()?;
    Some(cgroup.parent()?.join(PROBES).join(id))
}

/// Makes (or brings up to date) the v2 cgroup of container `cgroup`'s exec
/// probes: the reserved CPUs, `PROBE_MEMORY_BYTES`, `MAX_PROBE_PIDS` (see
/// the module comment). Returns its directory, for the probe to join.
/// Written at every probe: the reserved CPUs may have changed since the last.
pub(crate) fn settle_probe_cgroup(host: &dyn Host, cgroup: &Path, reserved: &specs::CpuSet) -> Result<PathBuf, String> {
    let (Some(probes), Some(parent)) = (probe_cgroup_of(cgroup), cgroup.parent()) else {
        return Err(format!("the container's cgroup {} has no parent", cgroup.display()));
    };
    let root = Path::new(ROOT);
    let folder = root.join(rel(parent)).join(PROBES);
    mkdir(host, &folder)?;
    // Holds no process, only the containers' probe cgroups.
    enable(host, &folder)?;
    let dir = root.join(rel(&probes));
    mkdir(host, &dir)?;
    write(host, &dir.join("cpuset.cpus"), &reserved.to_string())?;
    write(host, &dir.join("memory.max"), &PROBE_MEMORY_BYTES.to_string())?;
    write(host, &dir.join("pids.max"), &MAX_PROBE_PIDS.to_string())?;
    Ok(dir)
}

/// The v1 hierarchies: the directories under the root holding a
/// `cgroup.procs` (the controllers' symlinks such as `cpu -> cpu,cpuacct`
/// are left out: their target is listed itself).
fn v1_dirs(host: &dyn Host) -> Vec<PathBuf> {
    let Ok(entries) = host.read_dir(Path::new(ROOT)) else { return Vec::new() };
    entries.into_iter().filter(|p| host.is_dir(p) && !p.is_symlink() && host.is_file(&p.join("cgroup.procs"))).collect()
}

/// Every directory of this container's cgroup that exists now, in any hierarchy.
pub(crate) fn existing_dirs(host: &dyn Host, cgroup: &Path) -> Vec<PathBuf> {
    let rel = rel(cgroup);
    let mut roots = vec![PathBuf::from(ROOT)];
    roots.extend(v1_dirs(host));
    if host.is_dir(&Path::new(ROOT).join("unified")) {
        roots.push(Path::new(ROOT).join("unified"));
    }
    roots.sort();
    roots.dedup();
    roots.into_iter().map(|r| r.join(rel)).filter(|p| host.is_dir(p)).collect()
}

/// Removes the containers' parent cgroup from every hierarchy where it is
/// empty (a container still there keeps it: rmdir refuses); the ones removed.
pub(crate) fn remove_parent_if_empty(host: &dyn Host, parent: &Path) -> Vec<PathBuf> {
    remove_if_empty(existing_dirs(host, parent))
}

/// Each of `dirs` whose only child is an empty `.probes` (what a probe that
/// ran leaves: its own cgroup goes when it ends, the folder for them stays)
/// or none, removed; the ones removed.
fn remove_if_empty(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    dirs.into_iter()
        .filter(|d| {
            // rmdir refuses a `.probes` with a probe still in it, and then the parent.
            let _ = std::fs::remove_dir(d.join(PROBES));
            std::fs::remove_dir(d).is_ok()
        })
        .collect()
}

/// Whether the kernel's OOM killer killed a process of this container.
pub(crate) fn oom_killed(host: &dyn Host, cgroup: &Path) -> bool {
    let rel = rel(cgroup);
    let (file, key) = if host.cgroup_v2_only() {
        (Path::new(ROOT).join(rel).join("memory.events"), "oom_kill")
    } else {
        (Path::new(ROOT).join("memory").join(rel).join("memory.oom_control"), "oom_kill")
    };
    let Ok(text) = host.read_file(&file) else { return false };
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .any(|(k, v)| k == key && v.trim().parse::<u64>().map(|n| n > 0).unwrap_or(false))
}

/// What the container used, read from its cgroup as it ends (before the
/// cgroup goes): CPU time and the memory high-water mark. cgroup v1:
/// `cpuacct.usage` (nanoseconds) and `memory.max_usage_in_bytes`; v2:
/// `cpu.stat`'s `usage_usec` and `memory.peak` (Linux 5.19 on). A file
/// that cannot be read is named in `missing`, its figure left out.
pub(crate) fn usage(host: &dyn Host, cgroup: &Path) -> specs::status::ContainerUsage {
    let rel = rel(cgroup);
    let root = Path::new(ROOT);
    let read_u64 = |p: &Path| host.read_file(p).ok().and_then(|t| t.trim().parse::<u64>().ok());
    let mut missing = Vec::new();
    let (cpu, rss) = if host.cgroup_v2_only() {
        let stat = root.join(rel).join("cpu.stat");
        let cpu = host.read_file(&stat).ok().and_then(|t| {
            t.lines().filter_map(|l| l.split_once(' ')).find(|(k, _)| *k == "usage_usec")?.1.trim().parse::<u64>().ok()
        });
        if cpu.is_none() {
            missing.push(format!("{}: no usage_usec", stat.display()));
        }
        let peak = root.join(rel).join("memory.peak");
        let rss = read_u64(&peak);
        if rss.is_none() {
            missing.push(format!("{}: absent (a kernel before 5.19 keeps no peak)", peak.display()));
        }
        (cpu.map(|us| us.saturating_mul(1000)), rss)
    } else {
        // `cpuacct` is a link to the shared `cpu,cpuacct` hierarchy on most hosts.
        let cpu_files = ["cpuacct", "cpu,cpuacct"].map(|h| root.join(h).join(rel).join("cpuacct.usage"));
        let cpu = cpu_files.iter().find_map(|p| read_u64(p));
        if cpu.is_none() {
            missing.push(format!("{}: unreadable", cpu_files[0].display()));
        }
        let max = root.join("memory").join(rel).join("memory.max_usage_in_bytes");
        let rss = read_u64(&max);
        if rss.is_none() {
            missing.push(format!("{}: unreadable", max.display()));
        }
        (cpu, rss)
    };
    let missing = (!missing.is_empty()).then(|| missing.join("; "));
    specs::status::ContainerUsage { cpu_nanos: cpu, max_rss_bytes: rss, missing }
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::*;
    use crate::host::{Call, Recorder};

    const QUOTA: CpuQuota = CpuQuota { quota_us: 50_000, period_us: 100_000 };

    /// Plain folders stand in for cgroups: rmdir refuses a non-empty one in both.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_parent_goes_with_its_empty_probes_folder_and_stays_while_anything_is_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |p: &str| {
            let d = tmp.path().join(p);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        let bare = dir("cpu/pinion");
        let probed = dir("memory/pinion/.probes");
        let probe_running = dir("pids/pinion/.probes/c1");
        let container_left = dir("cpuset/pinion/c2");
        dir("cpuset/pinion/.probes");
        let parent = |d: &Path| d.ancestors().find(|a| a.ends_with("pinion")).unwrap().to_path_buf();
        let removed =
            remove_if_empty(vec![bare.clone(), parent(&probed), parent(&probe_running), parent(&container_left)]);
        assert_eq!(removed, [bare.clone(), parent(&probed)]);
        assert!(!bare.exists() && !parent(&probed).exists());
        assert!(probe_running.is_dir(), "a running probe's cgroup is never touched");
        assert!(container_left.is_dir());
        // An empty .probes beside a container goes too: the next probe's
        // cgroup is made with its folders.
        assert!(!tmp.path().join("cpuset/pinion/.probes").exists());
    }

    #[test]
    fn a_real_time_budget_raises_the_parent_first() {
        let v1 = "/sys/fs/cgroup/cpu,cpuacct/pinion";
        let host = |parent: &str| {
            Recorder::v1()
                .dir(format!("{v1}/c0"))
                .dir(format!("{v1}/c1"))
                .file(format!("{v1}/cpu.rt_runtime_us"), parent)
                .file(format!("{v1}/c0/cpu.rt_runtime_us"), "100000\n")
                .file(format!("{v1}/c1/cpu.rt_runtime_us"), "0\n")
        };
        // The parent holds c0's budget only: raised to hold c1's too.
        let h = host("100000\n");
        grant_realtime(&h, Path::new("/pinion/c1"), 100_000).expect("granted");
        assert_eq!(
            h.calls(),
            [
                Call::write(format!("{v1}/cpu.rt_runtime_us"), "200000"),
                Call::write(format!("{v1}/c1/cpu.rt_runtime_us"), "100000"),
            ]
        );
        // Room enough: the container's alone.
        let h = host("300000\n");
        grant_realtime(&h, Path::new("/pinion/c1"), 100_000).expect("granted");
        assert_eq!(h.calls(), [Call::write(format!("{v1}/c1/cpu.rt_runtime_us"), "100000")]);
        // The kernel refuses the parent: said, the container's left alone.
        let h = host("100000\n").fail_call(0, Errno::EINVAL);
        let e = grant_realtime(&h, Path::new("/pinion/c1"), 100_000).expect_err("refused");
        assert!(e.contains("pinion/cpu.rt_runtime_us: Invalid argument"), "{e}");
        // No real-time groups (no file), or v2: nothing.
        let h = Recorder::v1().dir(format!("{v1}/c1"));
        grant_realtime(&h, Path::new("/pinion/c1"), 100_000).expect("granted");
        assert_eq!(h.calls(), []);
        let h = Recorder::v2().dir("/sys/fs/cgroup/pinion/c1");
        grant_realtime(&h, Path::new("/pinion/c1"), 100_000).expect("granted");
        assert_eq!(h.calls(), []);
    }

    #[test]
    fn the_cpu_quota_goes_to_the_files_of_each_layout() {
        let check = |host: Recorder, want: Result<(), &str>, calls: &[Call]| {
            let got = set_cpu_quota(&host, Path::new("/pinion/c1"), QUOTA);
            match (&got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(text)) => assert!(e.contains(text), "{e}"),
                _ => panic!("got {got:?}, want {want:?}"),
            }
            assert_eq!(host.calls(), calls);
        };
        let v1 = "/sys/fs/cgroup/cpu,cpuacct/pinion/c1";
        check(
            Recorder::v1().dir(v1),
            Ok(()),
            &[
                Call::write(format!("{v1}/cpu.cfs_period_us"), "100000"),
                Call::write(format!("{v1}/cpu.cfs_quota_us"), "50000"),
            ],
        );
        let v2 = "/sys/fs/cgroup/pinion/c1";
        check(Recorder::v2().dir(v2), Ok(()), &[Call::write(format!("{v2}/cpu.max"), "50000 100000")]);
        // The period first: a failed write stops there, naming the file.
        check(
            Recorder::v1().dir(v1).fail_call(0, Errno::EINVAL),
            Err("cpu,cpuacct/pinion/c1/cpu.cfs_period_us: Invalid argument"),
            &[Call::write(format!("{v1}/cpu.cfs_period_us"), "100000")],
        );
        // No such cgroup.
        check(
            Recorder::v2(),
            Err("/sys/fs/cgroup/pinion/c1/cpu.max"),
            &[Call::write(format!("{v2}/cpu.max"), "50000 100000")],
        );
    }

    /// A v2 host whose agent runs in `own`, with `marked` carrying systemd's
    /// delegation mark; the unit's cgroup has every controller.
    fn delegated_host(own: &str, marked: &str) -> Recorder {
        let unit = "/sys/fs/cgroup/system.slice/pinion.service";
        Recorder::v2()
            .file("/proc/self/cgroup", &format!("0::{own}\n"))
            .file(format!("{unit}/cgroup.controllers"), "cpuset cpu io memory pids")
            .file(format!("{unit}/cgroup.subtree_control"), "")
            .xattr(format!("/sys/fs/cgroup{marked}"), "trusted.delegate", b"1")
    }

    #[test]
    fn the_agent_settles_into_a_delegated_subtree_or_stays_out() {
        let unit = "/sys/fs/cgroup/system.slice/pinion.service";
        let into_subtree = [
            Call::CreateDir(format!("{unit}/supervisor").into()),
            Call::write(format!("{unit}/supervisor/cgroup.procs"), "4242"),
            Call::write(format!("{unit}/cgroup.subtree_control"), "+cpuset +cpu +io +memory +pids"),
            Call::CreateDir(format!("{unit}/pods").into()),
            Call::write(format!("{unit}/pods/cgroup.subtree_control"), "+cpuset +cpu +io +memory +pids"),
        ];
        let delegated = Parent { path: "/system.slice/pinion.service/pods".into(), delegated: true };
        let check = |host: Recorder, want: Result<&Parent, &str>, calls: &[Call]| {
            let got = settle_parent_on(&host, 4242);
            match (&got, want) {
                (Ok(p), Ok(w)) => assert_eq!(p, w),
                (Err(e), Err(text)) => assert!(e.contains(text), "{e}"),
                _ => panic!("got {got:?}, want {want:?}"),
            }
            assert_eq!(host.calls(), calls);
        };
        let svc = "/system.slice/pinion.service";
        // cgroup v1 (or hybrid): /pinion of each hierarchy, nothing written.
        check(Recorder::v1(), Ok(&Parent::default_parent()), &[]);
        // v2 without a delegation mark, or only the root marked.
        check(delegated_host(svc, "/other.slice"), Ok(&Parent::default_parent()), &[]);
        check(delegated_host(svc, ""), Ok(&Parent::default_parent()), &[]);
        check(delegated_host(svc, svc), Ok(&delegated), &into_subtree);
        // Already in supervisor/ (an earlier run): the same subtree.
        let again = delegated_host(&format!("{svc}/supervisor"), svc).dir(format!("{unit}/supervisor"));
        check(again, Ok(&delegated), &into_subtree);
        // The unit's cgroup still holds a process: enabling is refused.
        let busy = delegated_host(svc, svc).fail_call(2, Errno::EBUSY);
        check(busy, Err("a delegated cgroup must hold no process but the agent"), &into_subtree[..3]);
    }

    #[test]
    fn the_agents_own_cgroup_procs_is_on_the_unified_hierarchy() {
        let own = "/proc/self/cgroup";
        let cases: [(Recorder, Option<&str>); 5] = [
            (
                Recorder::v2().file(own, "0::/system.slice/x\n").file("/sys/fs/cgroup/system.slice/x/cgroup.procs", ""),
                Some("/sys/fs/cgroup/system.slice/x/cgroup.procs"),
            ),
            (Recorder::v2().file(own, "0::/\n"), Some("/sys/fs/cgroup/cgroup.procs")),
            // Hybrid: the unified hierarchy's folder.
            (
                Recorder::v1().file(own, "4:pids:/\n0::/\n").file("/sys/fs/cgroup/unified/cgroup.procs", ""),
                Some("/sys/fs/cgroup/unified/cgroup.procs"),
            ),
            // v1 only, or a cgroup not there (another cgroup namespace): none.
            (Recorder::v1().file(own, "4:pids:/\n0::/\n"), None),
            (Recorder::v2().file(own, "0::/gone\n"), None),
        ];
        for (host, want) in cases {
            assert_eq!(own_procs(&host), want.map(PathBuf::from));
        }
    }

    #[test]
    fn a_cgroup_is_precreated_only_in_a_delegated_subtree() {
        let host = Recorder::v2().dir("/sys/fs/cgroup/d/pods");
        precreate(&host, &Parent::default_parent(), "c1").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(host.calls(), []);
        let parent = Parent { path: "/d/pods".into(), delegated: true };
        precreate(&host, &parent, "c1").unwrap_or_else(|e| panic!("{e}"));
        // Once more (a retried start): the directory is there already.
        precreate(&host, &parent, "c1").unwrap_or_else(|e| panic!("{e}"));
        let mkdir = Call::CreateDir("/sys/fs/cgroup/d/pods/c1".into());
        assert_eq!(host.calls(), [mkdir.clone(), mkdir]);
    }

    #[test]
    fn a_cgroup_is_found_and_removed_in_every_hierarchy() {
        let cgroup = Path::new("/pinion/c1");
        let check = |host: Recorder, dirs: &[&str]| {
            let want: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
            assert_eq!(existing_dirs(&host, cgroup), want);
            remove(&host, cgroup).unwrap_or_else(|e| panic!("{e}"));
            let removed = if dirs.is_empty() { vec![] } else { vec![Call::RemoveCgroup(cgroup.into())] };
            assert_eq!(host.calls(), removed, "{dirs:?}");
            assert_eq!(existing_dirs(&host, cgroup), Vec::<PathBuf>::new());
        };
        check(Recorder::v1(), &[]);
        check(
            Recorder::v1().dir("/sys/fs/cgroup/cpuset/pinion/c1").dir("/sys/fs/cgroup/memory/pinion/c1"),
            &["/sys/fs/cgroup/cpuset/pinion/c1", "/sys/fs/cgroup/memory/pinion/c1"],
        );
        // Hybrid: the v2 hierarchy at unified/ counts too.
        check(
            Recorder::v1().dir("/sys/fs/cgroup/unified/pinion/c1").dir("/sys/fs/cgroup/pids/pinion/c1"),
            &["/sys/fs/cgroup/pids/pinion/c1", "/sys/fs/cgroup/unified/pinion/c1"],
        );
        check(Recorder::v2().dir("/sys/fs/cgroup/pinion/c1"), &["/sys/fs/cgroup/pinion/c1"]);
    }

    #[test]
    fn exec_probes_get_a_cgroup_of_their_own_beside_the_containers() {
        let reserved: specs::CpuSet = "0-1".parse().unwrap_or_else(|e| panic!("{e:?}"));
        // /pinion gives its children cpuset, memory and pids, as libcgroups
        // left it for the container.
        let host = Recorder::v2()
            .dir("/sys/fs/cgroup/pinion/c1")
            .file("/sys/fs/cgroup/pinion/cgroup.subtree_control", "cpuset memory pids");
        let dir = settle_probe_cgroup(&host, Path::new("/pinion/c1"), &reserved).unwrap_or_else(|e| panic!("{e}"));
        let probes = "/sys/fs/cgroup/pinion/.probes";
        assert_eq!(dir, PathBuf::from(format!("{probes}/c1")));
        let settle = [
            Call::CreateDir(format!("{probes}/c1").into()),
            Call::write(format!("{probes}/c1/cpuset.cpus"), "0-1"),
            Call::write(format!("{probes}/c1/memory.max"), "134217728"),
            Call::write(format!("{probes}/c1/pids.max"), "64"),
        ];
        let first: Vec<Call> = [
            Call::CreateDir(probes.into()),
            Call::write(format!("{probes}/cgroup.subtree_control"), "+cpuset +memory +pids"),
        ]
        .into_iter()
        .chain(settle.clone())
        .collect();
        assert_eq!(host.calls(), first);
        // The next probe: the folders exist and have their controllers; the
        // limits are written again.
        let calls_before = host.calls().len();
        settle_probe_cgroup(&host, Path::new("/pinion/c1"), &reserved).unwrap_or_else(|e| panic!("{e}"));
        let again: Vec<Call> = std::iter::once(Call::CreateDir(probes.into())).chain(settle).collect();
        assert_eq!(host.calls()[calls_before..], again[..]);
        // Removing the container removes its probes' cgroup too.
        let calls_before = host.calls().len();
        remove(&host, Path::new("/pinion/c1")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            host.calls()[calls_before..],
            [Call::RemoveCgroup("/pinion/.probes/c1".into()), Call::RemoveCgroup("/pinion/c1".into())]
        );
        assert!(!host.is_dir(Path::new("/sys/fs/cgroup/pinion/.probes/c1")));
        // Inside a delegated subtree: beside the containers, in pods/.
        assert_eq!(
            probe_cgroup_of(Path::new("/system.slice/pinion.service/pods/c2")),
            Some(PathBuf::from("/system.slice/pinion.service/pods/.probes/c2"))
        );
    }

    #[test]
    fn usage_is_read_from_each_layout_and_a_missing_file_is_named() {
        use specs::status::ContainerUsage;
        let c1 = Path::new("/pinion/c1");
        let v1_cpu = "/sys/fs/cgroup/cpu,cpuacct/pinion/c1/cpuacct.usage";
        let v1_mem = "/sys/fs/cgroup/memory/pinion/c1/memory.max_usage_in_bytes";
        let got = usage(&Recorder::v1().file(v1_cpu, "1500000000\n").file(v1_mem, "1048576\n"), c1);
        assert_eq!(got, ContainerUsage { cpu_nanos: Some(1_500_000_000), max_rss_bytes: Some(1 << 20), missing: None });
        let got = usage(&Recorder::v1().file(v1_mem, "4096\n"), c1);
        assert_eq!((got.cpu_nanos, got.max_rss_bytes), (None, Some(4096)));
        assert!(got.missing.is_some_and(|m| m.contains("cpuacct.usage")));
        let stat = "/sys/fs/cgroup/pinion/c1/cpu.stat";
        let peak = "/sys/fs/cgroup/pinion/c1/memory.peak";
        let v2 = || Recorder::v2().file(stat, "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n");
        let got = usage(&v2().file(peak, "8192\n"), c1);
        assert_eq!(got, ContainerUsage { cpu_nanos: Some(2_500_000), max_rss_bytes: Some(8192), missing: None });
        // A kernel before 5.19: no memory.peak, said so; the CPU time stays.
        let got = usage(&v2(), c1);
        assert_eq!((got.cpu_nanos, got.max_rss_bytes), (Some(2_500_000), None));
        assert!(got.missing.is_some_and(|m| m.contains("memory.peak") && m.contains("5.19")));
    }

    #[test]
    fn oom_kills_are_read_from_each_layout() {
        let check = |host: Recorder, want: bool| assert_eq!(oom_killed(&host, Path::new("/pinion/c1")), want);
        let v1 = "/sys/fs/cgroup/memory/pinion/c1/memory.oom_control";
        let v2 = "/sys/fs/cgroup/pinion/c1/memory.events";
        check(Recorder::v1(), false);
        check(Recorder::v1().file(v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"), false);
        check(Recorder::v1().file(v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), true);
        check(Recorder::v2().file(v2, "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), true);
        check(Recorder::v2().file(v2, "oom 1\noom_kill 0\n"), false);
        // The v1 file on a v2 host is not read.
        check(Recorder::v2().file(v1, "oom_kill 1\n"), false);
    }

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
