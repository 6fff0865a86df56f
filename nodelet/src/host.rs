//! The seam under the real runtime and the pod networks: every cgroup, mount,
//! namespace and CNI-plugin call they make goes through [`Host`] (youki's
//! `Syscall` trait is the model). [`RealHost`] makes the calls, as the code
//! did before the seam; [`Recorder`] (tests only) records each call that
//! changes something, answers queries from a small scripted file tree and
//! can be told to fail a given call, so the runtime's decisions (which cgroup
//! file gets which value, which mount is made, what is undone after a
//! failure) are unit-tested without root.
//!
//! What stays outside: the bundle, records and logs under the data
//! directory (plain files, a temporary folder in tests), libcontainer's own
//! create and start inside the shim, and the processes the runtime signals.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use libcgroups::common::{create_cgroup_manager, CgroupConfig, CgroupManager, CgroupSetup, ControllerOpt};
use libcgroups::v1::ControllerType;
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use oci_spec::runtime::LinuxResources;

#[cfg(test)]
mod recorder;
#[cfg(test)]
pub(crate) use recorder::{Call, Recorder};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One mount(2): the overlay of an image container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountRequest<'a> {
    pub source: &'a str,
    pub target: &'a Path,
    pub fstype: &'a str,
    pub flags: MsFlags,
    pub data: &'a str,
}

/// One CNI plugin run: the executable, its `CNI_*` environment, its stdin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PluginRun<'a> {
    pub bin: &'a Path,
    pub env: &'a [(&'static str, String)],
    pub stdin: &'a [u8],
    /// Past it the plugin's process group is killed.
    pub timeout: Duration,
}

/// What a plugin that ran to its end left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PluginOutput {
    /// The exit code; `None` when a signal killed it.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl PluginOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

#[derive(Debug)]
pub(crate) enum PluginFailure {
    /// It could not be started or waited for.
    Io(io::Error),
    /// It ran past its time limit (and was killed).
    TimedOut,
}

/// The calls the runtime and the pod networks make on the host. Paths of
/// cgroup files are absolute host paths (`/sys/fs/cgroup/...`); a
/// container's cgroup is relative to each hierarchy's root, written absolute
/// (see `runtime::libcontainer::cgroups`).
pub(crate) trait Host: Send + Sync {
    // Files of the cgroup and proc file systems.

    /// Whether the host runs cgroup v2 alone (neither v1 nor hybrid).
    fn cgroup_v2_only(&self) -> bool;
    /// Where a v1 controller's hierarchy is mounted.
    fn v1_mount_point(&self, controller: &ControllerType) -> Result<PathBuf, String>;
    fn read_file(&self, path: &Path) -> io::Result<String>;
    /// Writes a cgroup file (a limit, `cgroup.procs`, `cgroup.subtree_control`).
    fn write_file(&self, path: &Path, value: &str) -> io::Result<()>;
    /// mkdir(2): one directory, an existing one is `AlreadyExists`.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    fn is_dir(&self, path: &Path) -> bool;
    fn is_file(&self, path: &Path) -> bool;
    /// The entries of a directory, as full paths.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    fn xattr(&self, path: &Path, name: &str) -> Option<Vec<u8>>;

    // Whole cgroups, through libcgroups (v1 and v2 alike).

    /// Applies `resources` to an existing cgroup (youki's `update`).
    fn apply_cgroup(&self, cgroup: &Path, resources: &LinuxResources) -> Result<(), String>;
    /// Kills what is left inside and removes the cgroup in every hierarchy.
    fn remove_cgroup(&self, cgroup: &Path) -> Result<(), String>;

    // Mounts and namespaces.

    fn mount(&self, m: &MountRequest<'_>) -> Result<(), Errno>;
    /// umount2(2) with `MNT_DETACH`.
    fn unmount(&self, target: &Path) -> Result<(), Errno>;
    /// The mount points of this mount namespace, in mountinfo's order.
    fn mount_points(&self) -> Vec<PathBuf>;
    /// A new network namespace bind-mounted on `pin` (an existing empty
    /// file), with `lo` up; made by a thread of its own, which alone enters
    /// the namespace. Blocks.
    fn pin_new_netns(&self, pin: &Path) -> Result<(), String>;

    /// A new user namespace whose root is host id `base`, pinned on
    /// `user_pin`, and a new network namespace it owns, pinned on `net_pin`
    /// with `lo` up (a `hostUsers: false` pod's). Both pins exist, empty.
    fn pin_pod_netns(&self, base: u32, user_pin: &Path, net_pin: &Path) -> Result<(), String>;

    /// How many sockets the pinned network namespace still holds (TCP in
    /// any state, TIME_WAIT included, UDP, raw); read by a thread of its
    /// own that enters it. Blocks.
    fn netns_sockets(&self, pin: &Path) -> Result<usize, String>;

    // CNI plugins.

    fn run_plugin<'a>(&'a self, run: PluginRun<'a>) -> BoxFuture<'a, Result<PluginOutput, PluginFailure>>;
}

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The host itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RealHost;

impl Host for RealHost {
    fn cgroup_v2_only(&self) -> bool {
        matches!(libcgroups::common::get_cgroup_setup(), Ok(CgroupSetup::Unified))
    }

    fn v1_mount_point(&self, controller: &ControllerType) -> Result<PathBuf, String> {
        libcgroups::v1::util::get_subsystem_mount_point(controller).map_err(|e| e.to_string())
    }

    fn read_file(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn write_file(&self, path: &Path, value: &str) -> io::Result<()> {
        std::fs::write(path, value.as_bytes())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn is_file(&self, path: &Path) -> bool {
        path.is_file()
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        Ok(std::fs::read_dir(path)?.flatten().map(|e| e.path()).collect())
    }

    fn xattr(&self, path: &Path, name: &str) -> Option<Vec<u8>> {
        xattr::get(path, name).ok().flatten()
    }

    fn apply_cgroup(&self, cgroup: &Path, resources: &LinuxResources) -> Result<(), String> {
        cgroup_manager(cgroup)?
            .apply(&ControllerOpt { resources, disable_oom_killer: false, oom_score_adj: None, freezer_state: None })
            .map_err(|e| format!("applying cgroup resources: {e}"))
    }

    fn remove_cgroup(&self, cgroup: &Path) -> Result<(), String> {
        cgroup_manager(cgroup)?.remove().map_err(|e| format!("removing cgroup {}: {e}", cgroup.display()))
    }

    fn mount(&self, m: &MountRequest<'_>) -> Result<(), Errno> {
        nix::mount::mount(Some(m.source), m.target, Some(m.fstype), m.flags, Some(m.data))
    }

    fn unmount(&self, target: &Path) -> Result<(), Errno> {
        nix::mount::umount2(target, MntFlags::MNT_DETACH)
    }

    fn mount_points(&self) -> Vec<PathBuf> {
        let Ok(text) = std::fs::read_to_string(MOUNTINFO) else { return Vec::new() };
        text.lines().filter_map(|l| l.split(' ').nth(4)).map(|m| PathBuf::from(unescape_mountinfo(m))).collect()
    }

    fn pin_new_netns(&self, pin: &Path) -> Result<(), String> {
        let target = pin.to_path_buf();
        std::thread::spawn(move || -> Result<(), String> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare: {e}"))?;
            let own = format!("/proc/self/task/{}/ns/net", nix::unistd::gettid());
            nix::mount::mount(Some(own.as_str()), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .map_err(|e| format!("bind mount: {e}"))?;
            crate::runtime::libcontainer::net::loopback_up_here().map_err(|e| format!("bringing lo up: {e}"))
        })
        .join()
        .unwrap_or_else(|_| Err("the namespace thread panicked".into()))
    }

    fn pin_pod_netns(&self, base: u32, user_pin: &Path, net_pin: &Path) -> Result<(), String> {
        crate::runtime::userns::pin_pod_namespaces(base, user_pin, net_pin)?;
        let pinned = std::fs::File::open(net_pin).map_err(|e| format!("{}: {e}", net_pin.display()))?;
        // Host root may enter a namespace a child user namespace owns.
        std::thread::spawn(move || -> Result<(), String> {
            nix::sched::setns(&pinned, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))?;
            crate::runtime::libcontainer::net::loopback_up_here().map_err(|e| format!("bringing lo up: {e}"))
        })
        .join()
        .unwrap_or_else(|_| Err("the namespace thread panicked".into()))
    }

    fn netns_sockets(&self, pin: &Path) -> Result<usize, String> {
        let pinned = std::fs::File::open(pin).map_err(|e| format!("{}: {e}", pin.display()))?;
        std::thread::spawn(move || -> Result<usize, String> {
            nix::sched::setns(&pinned, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))?;
            // This thread's view: /proc/self/net is the process's namespace.
            // The namespace's own counters (not /proc/net/tcp, which walks
            // the kernel's whole connection table, a few milliseconds).
            let mut n = 0;
            for table in ["sockstat", "sockstat6"] {
                match std::fs::read_to_string(format!("/proc/thread-self/net/{table}")) {
                    Ok(text) => n += sockets_in(&text),
                    // A kernel without IPv6 has no `sockstat6`.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("/proc/thread-self/net/{table}: {e}")),
                }
            }
            Ok(n)
        })
        .join()
        .unwrap_or_else(|_| Err("the namespace thread panicked".into()))
    }

    fn run_plugin<'a>(&'a self, run: PluginRun<'a>) -> BoxFuture<'a, Result<PluginOutput, PluginFailure>> {
        Box::pin(run_plugin(run))
    }
}

/// Sockets counted in a `sockstat` or `sockstat6` text: every protocol's
/// `inuse` and TCP's `tw` (connections in TIME_WAIT); `FRAG` is not a socket.
fn sockets_in(sockstat: &str) -> usize {
    let mut n = 0;
    for line in sockstat.lines() {
        let Some((proto, fields)) = line.split_once(':') else { continue };
        if proto.starts_with("FRAG") || proto == "sockets" {
            continue;
        }
        let words: Vec<&str> = fields.split_whitespace().collect();
        for pair in words.chunks(2) {
            if let ["inuse" | "tw", value] = pair {
                n += value.parse::<usize>().unwrap_or(0);
            }
        }
    }
    n
}

fn cgroup_manager(cgroup: &Path) -> Result<libcgroups::common::AnyCgroupManager, String> {
    let name = cgroup.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    create_cgroup_manager(CgroupConfig {
        cgroup_path: cgroup.to_path_buf(),
        systemd_cgroup: false,
        container_name: name,
    })
    .map_err(|e| format!("cgroup manager for {}: {e}", cgroup.display()))
}

async fn run_plugin(run: PluginRun<'_>) -> Result<PluginOutput, PluginFailure> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(run.bin);
    cmd.envs(run.env.iter().map(|(k, v)| (*k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its own group: at the timeout everything it started goes with it.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(PluginFailure::Io)?;
    let pid = child.id();
    let wait = async {
        if let Some(mut input) = child.stdin.take() {
            // A plugin that exits without reading is judged by its exit.
            let _ = input.write_all(run.stdin).await;
        }
        child.wait_with_output().await
    };
    match tokio::time::timeout(run.timeout, wait).await {
        Ok(out) => {
            let out = out.map_err(PluginFailure::Io)?;
            Ok(PluginOutput { code: out.status.code(), stdout: out.stdout, stderr: out.stderr })
        }
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            Err(PluginFailure::TimedOut)
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/a\040b\134c"), "/a b\\c");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn sockets_are_every_inuse_and_time_wait_but_not_fragments() {
        let v4 = "sockets: used 9\nTCP: inuse 1 orphan 4 tw 53 alloc 1 mem 0\nUDP: inuse 2 mem 0\n\
                  UDPLITE: inuse 0\nRAW: inuse 3\nFRAG: inuse 7 memory 0\n";
        assert_eq!(sockets_in(v4), 1 + 53 + 2 + 3);
        let v6 = "TCP6: inuse 0\nUDP6: inuse 1\nUDPLITE6: inuse 0\nRAW6: inuse 0\nFRAG6: inuse 2 memory 0\n";
        assert_eq!(sockets_in(v6), 1);
        let empty = "sockets: used 9\nTCP: inuse 0 orphan 0 tw 0 alloc 0 mem 0\nUDP: inuse 0 mem 0\n";
        assert_eq!(sockets_in(empty), 0);
    }
}
