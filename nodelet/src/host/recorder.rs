//! The recording double of [`Host`]: each call that changes something is
//! recorded in order ([`Call`]); queries are answered from a scripted tree
//! (directories, files, extended attributes, mount points) that the
//! recorded calls keep up to date, as the kernel would; any call can be told
//! to fail with an errno.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libcgroups::v1::ControllerType;
use nix::errno::Errno;
use oci_spec::runtime::LinuxResources;

use super::{BoxFuture, Host, MountRequest, PluginFailure, PluginOutput, PluginRun};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The v1 controllers of [`Recorder::v1`], with their mount points' names.
const V1_HIERARCHIES: [(&str, &str); 5] =
    [("cpu", "cpu,cpuacct"), ("cpuset", "cpuset"), ("memory", "memory"), ("pids", "pids"), ("hugetlb", "hugetlb")];

/// A call that changed something, as the double recorded it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    WriteFile {
        path: PathBuf,
        value: String,
    },
    CreateDir(PathBuf),
    ApplyCgroup {
        cgroup: PathBuf,
        resources: Box<LinuxResources>,
    },
    RemoveCgroup(PathBuf),
    Mount {
        source: String,
        target: PathBuf,
        fstype: String,
        data: String,
    },
    Unmount(PathBuf),
    PinNetns(PathBuf),
    /// `plugin` is the executable's file name, `command` its `CNI_COMMAND`.
    Plugin {
        plugin: String,
        command: String,
        ifname: String,
    },
}

impl Call {
    pub fn write(path: impl Into<PathBuf>, value: &str) -> Call {
        Call::WriteFile { path: path.into(), value: value.to_string() }
    }

    pub fn plugin(plugin: &str, command: &str, ifname: &str) -> Call {
        Call::Plugin { plugin: plugin.into(), command: command.into(), ifname: ifname.into() }
    }
}

type Matcher = Box<dyn Fn(usize, &Call) -> bool + Send>;

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    failures: Vec<(Matcher, Errno)>,
    v2_only: bool,
    v1_mounts: BTreeMap<String, PathBuf>,
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<PathBuf, String>,
    xattrs: BTreeMap<(PathBuf, String), Vec<u8>>,
    mounts: Vec<PathBuf>,
    plugins: BTreeMap<(String, String), PluginOutput>,
    /// Each plugin call's CNI_NETNS, in order.
    plugin_netns: Vec<String>,
}

impl State {
    fn has_dir(&self, p: &Path) -> bool {
        self.dirs.contains(p)
    }

    /// Records `call`; the errno it is told to fail with, if any.
    fn record(&mut self, call: Call) -> Result<(), Errno> {
        let n = self.calls.len();
        let hit = self.failures.iter().position(|(m, _)| m(n, &call));
        self.calls.push(call);
        match hit {
            Some(i) => Err(self.failures.remove(i).1),
            None => Ok(()),
        }
    }
}

/// See the module comment. Empty: no cgroup file system at all.
#[derive(Default)]
pub(crate) struct Recorder {
    state: Mutex<State>,
}

impl Recorder {
    /// A cgroup v1 host (as these machines are, hybrid aside): one
    /// hierarchy per controller under `/sys/fs/cgroup`, `cpu` at `cpu,cpuacct`.
    pub fn v1() -> Recorder {
        let r = Recorder::default();
        {
            let mut s = r.lock();
            s.dirs.insert(PathBuf::from(CGROUP_ROOT));
            for (controller, dir) in V1_HIERARCHIES {
                let mount = Path::new(CGROUP_ROOT).join(dir);
                s.files.insert(mount.join("cgroup.procs"), String::new());
                s.dirs.insert(mount.clone());
                s.v1_mounts.insert(controller.to_string(), mount);
            }
        }
        r
    }

    /// A cgroup v2 host: one hierarchy at `/sys/fs/cgroup`.
    pub fn v2() -> Recorder {
        let r = Recorder::default();
        {
            let mut s = r.lock();
            s.v2_only = true;
            s.dirs.insert(PathBuf::from(CGROUP_ROOT));
            s.files.insert(Path::new(CGROUP_ROOT).join("cgroup.procs"), String::new());
            s.files.insert(Path::new(CGROUP_ROOT).join("cgroup.controllers"), "cpuset cpu io memory pids".into());
            s.files.insert(Path::new(CGROUP_ROOT).join("cgroup.subtree_control"), "cpu memory pids".into());
        }
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A directory, and its missing parents.
    pub fn dir(self, path: impl AsRef<Path>) -> Recorder {
        {
            let mut s = self.lock();
            for p in path.as_ref().ancestors() {
                s.dirs.insert(p.to_path_buf());
            }
        }
        self
    }

    /// A file (its directory is made too).
    pub fn file(self, path: impl AsRef<Path>, text: &str) -> Recorder {
        let path = path.as_ref().to_path_buf();
        let this = match path.parent() {
            Some(parent) => self.dir(parent),
            None => self,
        };
        this.lock().files.insert(path, text.to_string());
        this
    }

    pub fn xattr(self, path: impl AsRef<Path>, name: &str, value: &[u8]) -> Recorder {
        self.lock().xattrs.insert((path.as_ref().to_path_buf(), name.to_string()), value.to_vec());
        self
    }

    /// What plugin `plugin` prints and exits with on `command` (`ADD`, ...);
    /// unscripted, ADD prints `{"cniVersion":"1.0.0"}` and the others nothing.
    pub fn plugin(self, plugin: &str, command: &str, output: PluginOutput) -> Recorder {
        self.lock().plugins.insert((plugin.to_string(), command.to_string()), output);
        self
    }

    /// The call recorded as `calls()[n]` fails with `errno`.
    pub fn fail_call(self, n: usize, errno: Errno) -> Recorder {
        self.lock().failures.push((Box::new(move |i, _| i == n), errno));
        self
    }

    /// The first call `which` picks fails with `errno`.
    pub fn fail_first(self, which: impl Fn(&Call) -> bool + Send + 'static, errno: Errno) -> Recorder {
        self.lock().failures.push((Box::new(move |_, c| which(c)), errno));
        self
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The calls so far, forgotten.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    pub fn is_mounted(&self, path: &Path) -> bool {
        self.lock().mounts.iter().any(|m| m == path)
    }

    /// The CNI_NETNS each plugin was run with so far, in order.
    pub fn plugin_netns(&self) -> Vec<String> {
        self.lock().plugin_netns.clone()
    }
}

impl Host for Recorder {
    fn cgroup_v2_only(&self) -> bool {
        self.lock().v2_only
    }

    fn v1_mount_point(&self, controller: &ControllerType) -> Result<PathBuf, String> {
        let name = controller.to_string();
        self.lock().v1_mounts.get(&name).cloned().ok_or_else(|| format!("no {name} hierarchy"))
    }

    fn read_file(&self, path: &Path) -> io::Result<String> {
        let s = self.lock();
        s.files.get(path).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn write_file(&self, path: &Path, value: &str) -> io::Result<()> {
        let mut s = self.lock();
        s.record(Call::write(path, value))?;
        // A cgroup file system holds no file a process creates.
        if !path.parent().is_some_and(|d| s.has_dir(d)) {
            return Err(io::ErrorKind::NotFound.into());
        }
        let value = if path.ends_with("cgroup.subtree_control") {
            // `+c` enables, `-c` disables: the file lists what is enabled.
            let old = s.files.get(path).cloned().unwrap_or_default();
            let mut on: Vec<&str> = old.split_whitespace().collect();
            for word in value.split_whitespace() {
                match word.split_at(1) {
                    ("+", c) if !on.contains(&c) => on.push(c),
                    ("-", c) => on.retain(|x| *x != c),
                    _ => {}
                }
            }
            on.join(" ")
        } else {
            value.to_string()
        };
        s.files.insert(path.to_path_buf(), value);
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.record(Call::CreateDir(path.to_path_buf()))?;
        if s.has_dir(path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        if !path.parent().is_some_and(|d| s.has_dir(d)) {
            return Err(io::ErrorKind::NotFound.into());
        }
        s.dirs.insert(path.to_path_buf());
        if path.starts_with(CGROUP_ROOT) {
            // A new cgroup comes with its interface files; on v2 its
            // controllers are what the parent enabled for its children.
            s.files.insert(path.join("cgroup.procs"), String::new());
            if s.v2_only {
                let parent = path.parent().map(|p| p.join("cgroup.subtree_control")).unwrap_or_default();
                let controllers = s.files.get(&parent).cloned().unwrap_or_default();
                s.files.insert(path.join("cgroup.controllers"), controllers);
                s.files.insert(path.join("cgroup.subtree_control"), String::new());
            }
        }
        Ok(())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.lock().has_dir(path)
    }

    fn is_file(&self, path: &Path) -> bool {
        self.lock().files.contains_key(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let s = self.lock();
        if !s.has_dir(path) {
            return Err(io::ErrorKind::NotFound.into());
        }
        let children = s.dirs.iter().chain(s.files.keys()).filter(|p| p.parent() == Some(path));
        Ok(children.cloned().collect())
    }

    fn xattr(&self, path: &Path, name: &str) -> Option<Vec<u8>> {
        self.lock().xattrs.get(&(path.to_path_buf(), name.to_string())).cloned()
    }

    fn apply_cgroup(&self, cgroup: &Path, resources: &LinuxResources) -> Result<(), String> {
        let mut s = self.lock();
        s.record(Call::ApplyCgroup { cgroup: cgroup.to_path_buf(), resources: Box::new(resources.clone()) })
            .map_err(|e| format!("applying cgroup resources: {e}"))
    }

    fn remove_cgroup(&self, cgroup: &Path) -> Result<(), String> {
        let mut s = self.lock();
        s.record(Call::RemoveCgroup(cgroup.to_path_buf()))
            .map_err(|e| format!("removing cgroup {}: {e}", cgroup.display()))?;
        let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
        let gone: Vec<PathBuf> = s.dirs.iter().filter(|d| d.ends_with(rel)).cloned().collect();
        for d in gone {
            s.dirs.retain(|x| !x.starts_with(&d));
            s.files.retain(|x, _| !x.starts_with(&d));
        }
        Ok(())
    }

    fn mount(&self, m: &MountRequest<'_>) -> Result<(), Errno> {
        let mut s = self.lock();
        s.record(Call::Mount {
            source: m.source.into(),
            target: m.target.to_path_buf(),
            fstype: m.fstype.into(),
            data: m.data.into(),
        })?;
        s.mounts.push(m.target.to_path_buf());
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<(), Errno> {
        let mut s = self.lock();
        s.record(Call::Unmount(target.to_path_buf()))?;
        // The latest mount on `target` goes, as umount2 does.
        match s.mounts.iter().rposition(|m| m == target) {
            Some(i) => {
                s.mounts.remove(i);
                Ok(())
            }
            None => Err(Errno::EINVAL),
        }
    }

    fn mount_points(&self) -> Vec<PathBuf> {
        self.lock().mounts.clone()
    }

    fn pin_new_netns(&self, pin: &Path) -> Result<(), String> {
        let mut s = self.lock();
        s.record(Call::PinNetns(pin.to_path_buf())).map_err(|e| format!("unshare: {e}"))?;
        s.mounts.push(pin.to_path_buf());
        Ok(())
    }

    fn pin_pod_netns(&self, _base: u32, user_pin: &Path, net_pin: &Path) -> Result<(), String> {
        let mut s = self.lock();
        s.record(Call::PinNetns(net_pin.to_path_buf())).map_err(|e| format!("unshare: {e}"))?;
        s.mounts.extend([user_pin.to_path_buf(), net_pin.to_path_buf()]);
        Ok(())
    }

    fn netns_sockets(&self, _pin: &Path) -> Result<usize, String> {
        Ok(0)
    }

    fn run_plugin<'a>(&'a self, run: PluginRun<'a>) -> BoxFuture<'a, Result<PluginOutput, PluginFailure>> {
        let var = |name: &str| run.env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone()).unwrap_or_default();
        let plugin = run.bin.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let command = var("CNI_COMMAND");
        let mut s = self.lock();
        s.plugin_netns.push(var("CNI_NETNS"));
        let recorded =
            s.record(Call::Plugin { plugin: plugin.clone(), command: command.clone(), ifname: var("CNI_IFNAME") });
        let result = match recorded {
            Err(errno) => Err(PluginFailure::Io(errno.into())),
            Ok(()) => Ok(s.plugins.get(&(plugin, command.clone())).cloned().unwrap_or_else(|| PluginOutput {
                code: Some(0),
                stdout: if command == "ADD" { br#"{"cniVersion":"1.0.0"}"#.to_vec() } else { Vec::new() },
                stderr: Vec::new(),
            })),
        };
        Box::pin(std::future::ready(result))
    }
}
