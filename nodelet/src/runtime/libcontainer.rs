//! The real container runtime: each container is created by its own shim
//! process (`pinion shim`, see [`shim`]) through youki's libcontainer, which
//! outlives the agent, pumps the container's output into a rotated log and
//! records the exit status. This side prepares the bundle (OCI spec, rootfs),
//! launches the shim and reads what it recorded; it never calls libcontainer's
//! create/start itself, so it is safe from the agent's threads.
//!
//! Layout under the data directory: `containers/<id>/` (bundle, rootfs, overlay
//! upper/work, `container.json`, `shim.json`, `started.json`, `exit.json`,
//! `shim.log`), `libcontainer/<id>/` (libcontainer's state), `exits/<id>.json`
//! (the exit notices `watch_exits` waits for with inotify) and `images/`.

pub(crate) mod cgroups;
pub mod exec;
mod exec_userns;
pub mod filter;
pub mod image;
pub(crate) mod logs;
pub(crate) mod moves;
pub(crate) mod net;
pub mod records;
pub mod rootfs;
pub mod shim;
pub mod spec;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::libcontainer::container::{Container, ContainerStatus};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxCpuBuilder, LinuxResourcesBuilder, Spec};
use pinion_wire::backoff::Doubling;
use specs::{CpuSet, NumaSet};

use crate::host::{Host, RealHost};
use crate::metrics::{StartTrace, Step};

use self::records::{read_json, write_json, ExitRecord, Layout, ProcId, StartedRecord, UNKNOWN_EXIT_CODE};
use super::{ContainerConfig, ContainerState, ExitEvent, ExitSender, RootfsConfig, Runtime, RuntimeError};
use super::{NOT_EXECUTABLE_CODE, NOT_FOUND_CODE};

/// How long `start` waits for the shim's report before giving up.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a dead container's shim gets to record the exit status.
const RECORD_GRACE: Duration = Duration::from_secs(3);
/// How long a SIGKILLed process may take to disappear.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

pub struct LibcontainerRuntime {
    layout: Layout,
    shim_exe: PathBuf,
    /// Where new containers' cgroups go (`/pinion` unless the agent settled
    /// into a delegated subtree).
    cgroups: cgroups::Parent,
    /// Cgroups and mounts go through it (the host itself, or a test's double).
    host: Arc<dyn Host>,
    /// Seccomp programs compiled so far (see [`filter`]).
    filters: filter::Filters,
    /// Keeps the kernel's cgroup-move lock ready while a start is in flight
    /// (see [`moves`]); a no-op on a test's host double.
    moves: moves::Warmer,
}

fn cerr(id: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Container { id: id.to_string(), message: message.into() }
}

fn ioerr(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io { path: path.to_path_buf(), source }
}

/// Ids become file names and cgroup names: keep them plain.
pub(crate) fn check_id(id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with(['.', '-'])
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(cerr(id, "invalid container id (1-128 of [A-Za-z0-9._-], not starting with . or -)"))
    }
}

impl LibcontainerRuntime {
    /// `shim_exe` is the `pinion` binary (run as `pinion shim`). Creates the data
    /// directories and removes containers whose creation never finished.
    pub fn new(data_dir: &Path, shim_exe: &Path) -> Result<Self, RuntimeError> {
        let mut rt = Self::with_host(data_dir, shim_exe, Arc::new(RealHost))?;
        rt.moves = moves::Warmer::for_host();
        Ok(rt)
    }

    /// [`Self::new`] with its cgroup and mount calls made on `host`.
    pub(crate) fn with_host(data_dir: &Path, shim_exe: &Path, host: Arc<dyn Host>) -> Result<Self, RuntimeError> {
        let layout = Layout::new(data_dir);
        // Containers run as root: their overlay upper folders (and so any
        // setuid file they make) must be out of other users' reach. (The
        // daemon has already checked the folder and tightened what an older
        // version left, `datadir::prepare`, before anything else ran.)
        crate::fsutil::private_dir(data_dir).map_err(ioerr(data_dir))?;
        for dir in [layout.containers(), layout.state_root(), layout.images(), layout.exits()] {
            crate::fsutil::private_dir(&dir).map_err(ioerr(&dir))?;
        }
        for dir in image::remove_leftovers(&layout.images()).map_err(ioerr(&layout.images()))? {
            tracing::warn!(dir = %dir.display(), "removed what an interrupted image import left");
        }
        let rt = Self {
            layout,
            shim_exe: shim_exe.to_path_buf(),
            cgroups: cgroups::Parent::default_parent(),
            host,
            filters: filter::Filters::default(),
            moves: moves::Warmer::default(),
        };
        for id in rt.sweep()? {
            tracing::warn!(id, "removed a container whose creation did not finish");
        }
        Ok(rt)
    }

    /// Puts new containers' cgroups under `parent` (the agent's
    /// [`cgroups::settle_parent`]); containers already there keep theirs.
    pub(crate) fn with_cgroup_parent(mut self, parent: cgroups::Parent) -> Self {
        self.cgroups = parent;
        self
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The cgroup of container `id` (relative to each hierarchy's root).
    pub(crate) fn cgroup_of(&self, id: &str) -> PathBuf {
        cgroups::of(&self.layout, id, &self.cgroups.path)
    }

    /// Removes half-created containers: no `started.json` and no live shim.
    pub fn sweep(&self) -> Result<Vec<String>, RuntimeError> {
        let mut removed = Vec::new();
        for id in self.list()? {
            let started = self.layout.started(&id).exists();
            let shim_alive = read_json::<ProcId>(&self.layout.shim(&id)).ok().flatten().is_some_and(|p| p.alive());
            if !started && !shim_alive {
                self.remove(&id)?;
                removed.push(id);
            }
        }
        Ok(removed)
    }

    /// The host directories of this container's cgroup that exist now.
    pub fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        cgroups::existing_dirs(&*self.host, &self.cgroup_of(id))
    }

    fn process_spec(
        cfg: &ContainerConfig,
        image: Option<&image::ImageRecord>,
        user: super::users::ProcessUser,
    ) -> spec::ProcessSpec {
        let mut env: Vec<(String, String)> =
            vec![("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into())];
        let mut set = |k: &str, v: &str| match env.iter_mut().find(|(ek, _)| ek == k) {
            Some(slot) => slot.1 = v.to_string(),
            None => env.push((k.to_string(), v.to_string())),
        };
        if let Some(img) = image {
            for kv in &img.env {
                let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
                set(k, v);
            }
        }
        // A user looked up by name is at home in its node's home folder,
        // unless the pod says otherwise just below.
        if let Some(home) = &user.home {
            set("HOME", home);
        }
        for (k, v) in &cfg.env {
            set(k, v);
        }
        let args = match image {
            Some(img) if cfg.args.is_empty() => img.entrypoint.iter().chain(&img.cmd).cloned().collect(),
            _ => cfg.args.clone(),
        };
        let cwd = if !cfg.cwd.is_empty() {
            cfg.cwd.clone()
        } else {
            image.map(|i| i.working_dir.clone()).filter(|w| !w.is_empty()).unwrap_or_else(|| "/".into())
        };
        spec::ProcessSpec { args, env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(), cwd, user }
    }

    fn prepare(&self, cfg: &ContainerConfig) -> Result<(), RuntimeError> {
        let id = cfg.id.as_str();
        let rootfs = self.layout.rootfs(id);
        // Before anything is mounted: a user the node does not know fails
        // the start with its name, and leaves nothing to undo.
        let user = super::users::resolve(&cfg.run_as).map_err(|e| cerr(id, e.to_string()))?;
        // A pod's own user namespace: its map, for the idmapped image layer.
        let userns = match &cfg.userns {
            Some(ns) => Some(
                match &ns.pinned {
                    Some(pin) => super::userns::open_pinned(pin),
                    None => super::userns::new_userns(ns.base),
                }
                .map_err(|e| cerr(id, format!("the pod's user namespace: {e}")))?,
            ),
            None => None,
        };
        let (mut process, binds) = match &cfg.rootfs {
            RootfsConfig::Host => {
                let binds = rootfs::prepare_host(&rootfs).map_err(ioerr(&rootfs))?;
                if let Some(ns) = &cfg.userns {
                    // Its root makes mount points in `/` (the host's folders
                    // stay the host's: read-only, owned by nobody inside).
                    nix::unistd::chown(&rootfs, Some(ns.base.into()), Some(ns.base.into()))
                        .map_err(|e| cerr(id, format!("{}: {e}", rootfs.display())))?;
                }
                (Self::process_spec(cfg, None, user), binds)
            }
            RootfsConfig::Image(reference) => {
                let (rec, lower) = image::resolve(&self.layout.images(), reference)?;
                let dir = self.layout.container(id);
                let (upper, work) = (dir.join("upper"), dir.join("work"));
                let lower = match (&cfg.userns, &userns) {
                    (Some(ns), Some(fd)) => {
                        rootfs::idmapped_layers(&lower, fd.as_fd(), ns.base, &dir.join("lower"), &upper)
                            .map_err(|e| cerr(id, format!("the image {reference} for a user namespace: {e}")))?
                    }
                    _ => lower,
                };
                rootfs::mount_overlay(&*self.host, &lower, &upper, &work, &rootfs)
                    .map_err(|e| cerr(id, format!("mounting the image {reference} overlay: {e}")))?;
                (Self::process_spec(cfg, Some(&rec), user), Vec::new())
            }
        };
        if process.args.is_empty() {
            return Err(cerr(id, "no command: the container config and the image give none"));
        }
        // Before libcontainer's own check (which it makes inside the new
        // container, after the whole setup): a missing command is the job's
        // failure with a one-line reason, and `init` would otherwise hide it.
        check_command(id, &self.command_root(id, cfg), &process)?;
        // Said here in words: libcontainer only says it failed to prepare the rootfs.
        for m in &cfg.mounts {
            if !m.source.exists() {
                let dest = m.destination.display();
                return Err(cerr(
                    id,
                    format!("volume for {dest}: host path {} does not exist on this node", m.source.display()),
                ));
            }
        }
        let use_init = cfg.init && matches!(cfg.rootfs, RootfsConfig::Host);
        if cfg.init && !use_init {
            // The init is this (dynamically linked) binary: an image need not
            // hold the C library it needs, so image containers run without it.
            tracing::warn!(id, "init is only available to rootfs: host containers; running the command as PID 1");
        }
        if use_init {
            let mut args = vec![spec::INIT_PATH.to_string(), "init".to_string(), "--".to_string()];
            args.append(&mut process.args);
            process.args = args;
            // The bind mount's target must exist: the host rootfs is read-only.
            let target = rootfs.join(spec::INIT_PATH.trim_start_matches('/'));
            File::create(&target).map_err(ioerr(&target))?;
        }
        let mut spec = spec::build(cfg, &process, &binds, &self.cgroups.path)?;
        if use_init {
            spec = spec::with_init(spec, &self.shim_exe).map_err(|e| cerr(id, format!("init mount: {e}")))?;
        }
        if cfg.userns.is_some() {
            // The pod's root is nobody to the host: it cannot walk the
            // private data dir to its rootfs, so it gets the rootfs where it can.
            let open = rootfs::open_to_pod(&*self.host, &rootfs, &self.layout.pod_root(id))
                .map_err(|e| cerr(id, format!("the rootfs for a user namespace: {e}")))?;
            if let Some(root) = spec.root_mut() {
                root.set_path(open);
            }
        }
        self.precompile_filter(id, &mut spec)?;
        let spec_path = self.layout.bundle(id).join("config.json");
        save_spec(&spec, &spec_path).map_err(|e| cerr(id, format!("{}: {e}", spec_path.display())))?;
        // After the spec is saved: a cleanup finds the cgroup through it.
        cgroups::precreate(&*self.host, &self.cgroups, id)
            .map_err(|e| cerr(id, format!("the container's cgroup: {e}")))?;
        write_json(&self.layout.config(id), cfg)
    }

    /// Moves the spec's seccomp profile into a compiled program in the
    /// bundle (see [`filter`]), written before the spec that names it. A
    /// profile the compiler leaves to libcontainer stays in the spec.
    fn precompile_filter(&self, id: &str, spec: &mut Spec) -> Result<(), RuntimeError> {
        let Some(profile) = spec.linux().as_ref().and_then(|l| l.seccomp().clone()) else { return Ok(()) };
        let program = match self.filters.program(&profile) {
            Ok(p) => p,
            Err(filter::FilterError::Unsupported(what)) => {
                tracing::debug!(id, what, "seccomp profile left to libcontainer");
                return Ok(());
            }
            Err(e) => return Err(cerr(id, e.to_string())),
        };
        let bundle = self.layout.bundle(id);
        let write = |name: &str, bytes: &[u8]| -> Result<(), RuntimeError> {
            let path = bundle.join(name);
            let mut f = crate::fsutil::create_private(&path, false).map_err(ioerr(&path))?;
            std::io::Write::write_all(&mut f, bytes).map_err(ioerr(&path))
        };
        write(filter::FILTER_FILE, &program)?;
        let json = serde_json::to_vec_pretty(&profile).map_err(|e| cerr(id, format!("seccomp profile: {e}")))?;
        write(filter::PROFILE_FILE, &json)?;
        filter::take_profile(spec);
        Ok(())
    }

    /// Where a container's command is looked up before it runs (as `execvp`
    /// would inside): the host's root, or the image's unpacked rootfs.
    fn command_root(&self, id: &str, cfg: &ContainerConfig) -> PathBuf {
        match cfg.rootfs {
            RootfsConfig::Host => PathBuf::from("/"),
            RootfsConfig::Image(_) => self.layout.rootfs(id),
        }
    }

    /// `pinion shim --data-dir D --id ID`, logging to `log` (the shim's own
    /// file, or the exec helper's), stdout piped for its report.
    fn shim_command(&self, id: &str, log: File) -> Command {
        let mut cmd = Command::new(&self.shim_exe);
        cmd.arg("shim")
            .arg("--data-dir")
            .arg(&self.layout.root)
            .arg("--id")
            .arg(id)
            .stdout(Stdio::piped())
            .stderr(log)
            // libcontainer warns at every create on a hybrid host: errors only,
            // plain text (the log is a file).
            .env("PINION_LOG", std::env::var("PINION_SHIM_LOG").unwrap_or_else(|_| "error".into()))
            .env("NO_COLOR", "1");
        cmd
    }

    /// The start, with the agent's gate (see `Runtime::start_when_ready`)
    /// between the bundle and the shim.
    fn start_gated(
        &self,
        cfg: &ContainerConfig,
        trace: &mut StartTrace,
        ready: Option<&mut dyn FnMut() -> bool>,
    ) -> Result<(), RuntimeError> {
        let id = cfg.id.as_str();
        check_id(id)?;
        // Until the shim reported: the container's move into its cgroups is
        // in there (libcontainer's intermediate process).
        let _moves = self.moves.hold();
        let dir = self.layout.container(id);
        if dir.exists() || self.layout.state_root().join(id).exists() {
            return Err(cerr(id, "a container with this id already exists"));
        }
        crate::fsutil::private_dir(&self.layout.bundle(id)).map_err(ioerr(&dir))?;
        let result = self.prepare(cfg).and_then(|()| {
            tracing::debug!(target: "podstart", id, "bundle prepared");
            trace.mark(Step::BundlePrepared);
            if let Some(ready) = ready {
                if !ready() {
                    return Err(cerr(id, super::ABANDONED));
                }
                trace.mark(Step::NetworkReady);
            }
            self.launch_shim(id, trace)
        });
        match result {
            Ok(pid) => {
                tracing::debug!(id, pid, "container started");
                Ok(())
            }
            Err(e) => {
                if let Err(cleanup) = self.remove(id) {
                    tracing::error!(id, "cleanup after a failed start: {cleanup}");
                }
                Err(e)
            }
        }
    }

    fn launch_shim(&self, id: &str, trace: &mut StartTrace) -> Result<i32, RuntimeError> {
        let log_path = self.layout.shim_log(id);
        let log = crate::fsutil::create_private(&log_path, false).map_err(ioerr(&log_path))?;
        // Stamped as the spawn begins: the shim stamps `running` on its own,
        // and a stamp taken after `spawn` returned could come after it (the
        // agent descheduled between the fork and its stamp: seen under the
        // suite's load as a `ShimRunning` step of 0 s). The fork and exec
        // count towards `ShimRunning`, the shim's own start.
        trace.mark(Step::ShimSpawned);
        let mut child = self
            .shim_command(id, log)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| cerr(id, format!("starting the shim {}: {e}", self.shim_exe.display())))?;
        tracing::debug!(target: "podstart", id, "shim spawned");
        let report = child.stdout.take().map(|out| read_report(out, START_TIMEOUT));
        let reported_at = crate::metrics::monotonic_ns();
        tracing::debug!(target: "podstart", id, "shim reported");
        // The first shim process only detaches and exits at once.
        let _ = child.wait();
        // The last lines the shim (and libcontainer's helper processes) logged.
        let shim_log = || {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
            lines[lines.len().saturating_sub(8)..].join("; ")
        };
        match report {
            Some(Ok(line)) => {
                if let Some(rest) = line.strip_prefix("ok ") {
                    // `ok PID STEP=NS...`: the shim's own steps on the monotonic clock.
                    let mut words = rest.split_whitespace();
                    let pid = words.next().and_then(|p| p.parse().ok());
                    let pid = pid.ok_or_else(|| cerr(id, format!("the shim reported {line:?}")))?;
                    for (step, ns) in words.filter_map(|w| w.split_once('=')) {
                        if let (Some(step), Ok(ns)) = (shim_step(step), ns.parse()) {
                            trace.mark_at(step, ns);
                        }
                    }
                    trace.mark_at(Step::ShimReported, reported_at);
                    Ok(pid)
                } else if let Some(msg) = line.strip_prefix("error ") {
                    if let Some(code) = cannot_run_code(msg) {
                        return Err(RuntimeError::CannotRun { id: id.to_string(), code, message: msg.to_string() });
                    }
                    let log = shim_log();
                    Err(cerr(id, if log.is_empty() { msg.to_string() } else { format!("{msg} (shim log: {log})") }))
                } else {
                    Err(cerr(id, format!("the shim exited without reporting: {}", shim_log())))
                }
            }
            Some(Err(e)) => Err(cerr(id, format!("{e}; shim log: {}", shim_log()))),
            None => Err(cerr(id, "the shim has no stdout pipe")),
        }
    }

    fn started(&self, id: &str) -> Option<StartedRecord> {
        read_json(&self.layout.started(id)).ok().flatten()
    }

    /// Waits while the shim is alive for it to write the exit record.
    fn wait_exit_record(&self, id: &str, shim: Option<ProcId>) -> Option<ExitRecord> {
        let path = self.layout.exit(id);
        poll_until(RECORD_GRACE, || path.exists() || !shim.is_some_and(|s| s.alive()));
        read_json(&path).ok().flatten()
    }
}

/// The bundle's `config.json` (it holds the container's env): 0600, where
/// `Spec::save` would leave it as the umask says.
fn save_spec(spec: &Spec, path: &Path) -> Result<(), RuntimeError> {
    let bytes =
        serde_json::to_vec(spec).map_err(|e| RuntimeError::Io { path: path.to_path_buf(), source: e.into() })?;
    records::write_atomic(path, &bytes)
}

/// The steps a shim stamps in its `ok` line, by the word it uses.
pub(crate) const SHIM_STEPS: [(&str, Step); 3] =
    [("running", Step::ShimRunning), ("built", Step::ContainerBuilt), ("started", Step::ContainerStarted)];

fn shim_step(word: &str) -> Option<Step> {
    SHIM_STEPS.iter().find(|(w, _)| *w == word).map(|(_, s)| *s)
}

/// Reads the shim's one-line report, waiting at most `timeout`.
fn read_report(out: std::process::ChildStdout, timeout: Duration) -> Result<String, String> {
    Ok(Report::new(out).line(Some(timeout))?.unwrap_or_default())
}

/// A helper's report pipe, read line by line: what arrived after a line is
/// kept for the next (an exec's `started` and `exit` may come in one read).
struct Report {
    out: std::process::ChildStdout,
    buf: Vec<u8>,
}

impl Report {
    fn new(out: std::process::ChildStdout) -> Report {
        Report { out, buf: Vec::new() }
    }

    /// The next line; the unfinished rest at the end of the pipe, `None` when
    /// nothing is left. `timeout`: give up after that long.
    fn line(&mut self, timeout: Option<Duration>) -> Result<Option<String>, String> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line = String::from_utf8_lossy(&self.buf[..pos]).into_owned();
                self.buf.drain(..=pos);
                return Ok(Some(line));
            }
            let ms = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(format!("the shim did not report within {:?}", timeout.unwrap_or_default()));
                    }
                    PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [PollFd::new(self.out.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(format!("waiting for the shim: {e}")),
            }
            match self.out.read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Ok(Some(String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned())),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading the shim's report: {e}")),
            }
        }
    }
}

/// libcontainer validates the command inside the new container and reports it
/// in words only (`executable 'x' not found in $PATH`, `... does not have
/// correct permissions`): the exit code a shell would give, if that is the error.
pub(crate) fn cannot_run_code(message: &str) -> Option<i32> {
    if message.contains("not found in $PATH") {
        Some(NOT_FOUND_CODE)
    } else if message.contains("does not have correct permissions")
        || message.contains("failed to check permissions for executable")
    {
        Some(NOT_EXECUTABLE_CODE)
    } else {
        None
    }
}

/// Finds the command as `execvp` inside the container would (`PATH` from the
/// process's environment, `root` as `/`): `CannotRun` 127 when nothing is
/// there, 126 when it is a regular file without an execute bit or a folder.
/// Lenient where the host cannot tell: anything behind a symlink counts as
/// found (an absolute link inside an image points into the image, not the
/// host), and libcontainer's own check still runs.
fn check_command(id: &str, root: &Path, process: &spec::ProcessSpec) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(cmd) = process.args.first() else { return Ok(()) };
    let path_var = process.env.iter().find_map(|e| e.strip_prefix("PATH=")).unwrap_or("");
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let candidates: Vec<PathBuf> = if cmd.contains('/') {
        let p = Path::new(cmd);
        vec![if p.is_absolute() { inside(p) } else { inside(&Path::new(&process.cwd).join(p)) }]
    } else {
        path_var.split(':').filter(|d| !d.is_empty()).map(|d| inside(&Path::new(d).join(cmd))).collect()
    };
    let mut not_executable = None;
    for c in &candidates {
        let Ok(meta) = fs::symlink_metadata(c) else { continue };
        if meta.file_type().is_symlink() || (meta.is_file() && meta.permissions().mode() & 0o111 != 0) {
            return Ok(());
        }
        not_executable.get_or_insert(c);
    }
    let (code, why) = match not_executable {
        Some(_) => (NOT_EXECUTABLE_CODE, "is not executable"),
        None if cmd.contains('/') => (NOT_FOUND_CODE, "not found"),
        None => (NOT_FOUND_CODE, "not found in $PATH"),
    };
    Err(RuntimeError::CannotRun { id: id.to_string(), code, message: format!("command {cmd:?} {why}") })
}

/// Reads every exit notice in `dir` (names `<id>.json`; `.`-names are a
/// writer's temporaries).
fn read_notices(dir: &Path, names: impl IntoIterator<Item = std::ffi::OsString>) -> BTreeMap<String, ExitRecord> {
    let mut out = BTreeMap::new();
    for name in names {
        let Some(name) = name.to_str() else { continue };
        let Some(id) = name.strip_suffix(".json").filter(|_| !name.starts_with('.')) else { continue };
        if let Ok(Some(rec)) = read_json::<ExitRecord>(&dir.join(name)) {
            out.insert(id.to_string(), rec);
        }
    }
    out
}

/// The exit watcher's thread: inotify on `<data>/exits`, one event per notice
/// renamed into place; returns once the receiver is gone (checked every second).
fn watch_exit_notices(ino: nix::sys::inotify::Inotify, dir: PathBuf, tx: ExitSender) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let send = |found: BTreeMap<String, ExitRecord>| {
        for (id, rec) in found {
            let _ = tx.send(ExitEvent { id, code: rec.code, oom_killed: rec.oom_killed, usage: rec.usage });
        }
    };
    // Exits from before the watch: the receiver ignores the ones it knows of.
    let existing = fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>());
    send(read_notices(&dir, existing.unwrap_or_default()));
    while !tx.is_closed() {
        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "exit watcher: poll failed; exits are found by the re-check only");
                return;
            }
        }
        match ino.read_events() {
            Ok(events) => send(read_notices(&dir, events.into_iter().filter_map(|e| e.name))),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!(error = %e, "exit watcher: read failed; exits are found by the re-check only");
                return;
            }
        }
    }
}

/// Deletes libcontainer's state of `id` (killing a never-started init) and the
/// cgroup; tolerant of anything already gone. `init_dead`: our records say the
/// init has exited, so libcontainer must not signal its (possibly reused) PID.
pub(crate) fn cleanup_libcontainer_with(host: &dyn Host, layout: &Layout, id: &str, cgroup: &Path, init_dead: bool) {
    let dir = layout.state_root().join(id);
    if dir.exists() {
        match Container::load(dir.clone()) {
            Ok(mut c) => {
                if init_dead {
                    c.set_status(ContainerStatus::Stopped);
                }
                if let Err(e) = c.delete(true) {
                    tracing::warn!(id, "libcontainer delete: {e}");
                }
            }
            Err(e) => tracing::warn!(id, "loading libcontainer state: {e}"),
        }
        let _ = fs::remove_dir_all(&dir);
    }
    if let Err(e) = cgroups::remove(host, cgroup) {
        tracing::warn!(id, "{e}");
    }
}

/// The shim's cleanup: the container's cgroup is the one its bundle records.
pub(crate) fn cleanup_libcontainer(layout: &Layout, id: &str) {
    let cgroup = cgroups::of(layout, id, Path::new(cgroups::DEFAULT_PARENT));
    cleanup_libcontainer_with(&RealHost, layout, id, &cgroup, false)
}

/// The pause between two polls: from 100 us to 5 ms, so short waits stay
/// short and long ones stay cheap.
const POLL: Doubling = Doubling::new(Duration::from_micros(100), Duration::from_millis(5));

/// Polls `done` until it holds or `timeout` passes, pausing as `POLL` says.
fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = POLL.base;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = POLL.after(pause);
    }
}

fn wait_gone(p: ProcId, timeout: Duration) -> bool {
    poll_until(timeout, || !p.alive())
}

fn signal(p: ProcId, sig: Signal) {
    if p.alive() {
        let _ = kill(Pid::from_raw(p.pid), sig);
    }
}

impl Runtime for LibcontainerRuntime {
    fn cgroups(&self, id: &str) -> Vec<PathBuf> {
        self.cgroup_dirs(id)
    }
    fn name(&self) -> &'static str {
        "libcontainer"
    }

    fn images(&self) -> Option<PathBuf> {
        Some(self.layout.images())
    }

    fn collect_images(&self, high: u8, low: u8) -> Result<Vec<String>, RuntimeError> {
        let in_use = image::in_use(&self.layout)?;
        image::collect_garbage(&self.layout.images(), &in_use, high, low)
    }

    fn start(&self, cfg: &ContainerConfig, trace: &mut StartTrace) -> Result<(), RuntimeError> {
        self.start_gated(cfg, trace, None)
    }

    fn expect_start(&self) {
        self.moves.expect();
    }

    fn start_when_ready(
        &self,
        cfg: &ContainerConfig,
        trace: &mut StartTrace,
        ready: &mut dyn FnMut() -> bool,
    ) -> Result<(), RuntimeError> {
        self.start_gated(cfg, trace, Some(ready))
    }

    fn state(&self, id: &str) -> Result<ContainerState, RuntimeError> {
        check_id(id)?;
        if !self.layout.container(id).exists() {
            return Ok(ContainerState::Missing);
        }
        if let Some(rec) = read_json::<ExitRecord>(&self.layout.exit(id))? {
            return Ok(ContainerState::Exited { code: rec.code, oom_killed: rec.oom_killed });
        }
        if let Some(started) = read_json::<StartedRecord>(&self.layout.started(id))? {
            if started.init.alive() {
                return Ok(ContainerState::Running { pid: started.init.pid });
            }
            return Ok(match self.wait_exit_record(id, Some(started.shim)) {
                Some(rec) => ContainerState::Exited { code: rec.code, oom_killed: rec.oom_killed },
                // The shim died before the container: nobody saw the exit.
                None => ContainerState::Exited {
                    code: UNKNOWN_EXIT_CODE,
                    oom_killed: cgroups::oom_killed(&*self.host, &self.cgroup_of(id)),
                },
            });
        }
        let shim = read_json::<ProcId>(&self.layout.shim(id)).ok().flatten();
        if shim.is_some_and(|s| s.alive()) {
            return Err(cerr(id, "still being created"));
        }
        Ok(ContainerState::Exited { code: UNKNOWN_EXIT_CODE, oom_killed: false })
    }

    fn usage(&self, id: &str) -> Option<specs::status::ContainerUsage> {
        check_id(id).ok()?;
        read_json::<ExitRecord>(&self.layout.exit(id)).ok().flatten()?.usage
    }

    fn update_cpuset(&self, id: &str, cpus: &CpuSet, mems: &NumaSet) -> Result<(), RuntimeError> {
        check_id(id)?;
        if !matches!(self.state(id)?, ContainerState::Running { .. }) {
            return Err(cerr(id, "cannot update the cpuset: the container is not running"));
        }
        if cpus.is_empty() {
            return Err(cerr(id, "cannot update the cpuset: empty CPU set"));
        }
        let mems = if mems.is_empty() { spec::all_mems() } else { mems.to_string() };
        let cpu = LinuxCpuBuilder::default()
            .cpus(cpus.to_string())
            .mems(mems.clone())
            .build()
            .map_err(|e| cerr(id, format!("cpuset: {e}")))?;
        let resources = LinuxResourcesBuilder::default().cpu(cpu).build().map_err(|e| cerr(id, format!("{e}")))?;
        cgroups::apply(&*self.host, &self.cgroup_of(id), &resources).map_err(|e| cerr(id, e))?;
        // Keep the bundle's spec in step so it tells the truth.
        let spec_path = self.layout.bundle(id).join("config.json");
        if let Ok(mut spec) = Spec::load(&spec_path) {
            if let Some(cpu) =
                spec.linux_mut().as_mut().and_then(|l| l.resources_mut().as_mut()).and_then(|r| r.cpu_mut().as_mut())
            {
                cpu.set_cpus(Some(cpus.to_string()));
                cpu.set_mems(Some(mems));
            }
            let _ = save_spec(&spec, &spec_path);
        }
        Ok(())
    }

    fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        check_id(id)?;
        let Some(started) = self.started(id) else { return Ok(()) };
        if started.init.alive() {
            signal(started.init, Signal::SIGTERM);
            if !wait_gone(started.init, grace) {
                signal(started.init, Signal::SIGKILL);
                if !wait_gone(started.init, KILL_TIMEOUT) {
                    return Err(cerr(id, format!("pid {} survived SIGKILL for {KILL_TIMEOUT:?}", started.init.pid)));
                }
            }
        }
        let _ = self.wait_exit_record(id, Some(started.shim));
        Ok(())
    }

    fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        check_id(id)?;
        let started = self.started(id);
        let mut init_dead = false;
        if let Some(s) = started {
            signal(s.init, Signal::SIGKILL);
            if !wait_gone(s.init, KILL_TIMEOUT) {
                return Err(cerr(id, format!("pid {} survived SIGKILL", s.init.pid)));
            }
            init_dead = true;
        }
        if let Some(shim) = read_json::<ProcId>(&self.layout.shim(id)).ok().flatten() {
            if !wait_gone(shim, if init_dead { RECORD_GRACE } else { Duration::ZERO }) {
                signal(shim, Signal::SIGKILL);
                let _ = wait_gone(shim, KILL_TIMEOUT);
            }
        }
        let cgroup = self.cgroup_of(id);
        cleanup_libcontainer_with(&*self.host, &self.layout, id, &cgroup, init_dead);
        let left = cgroups::existing_dirs(&*self.host, &cgroup);
        if !left.is_empty() {
            return Err(cerr(id, format!("cgroup directories remain: {left:?}")));
        }
        rootfs::close_to_pod(&*self.host, &self.layout.pod_root(id)).map_err(|e| cerr(id, e.to_string()))?;
        let dir = self.layout.container(id);
        rootfs::unmount_all(&*self.host, &dir).map_err(|e| cerr(id, e.to_string()))?;
        match fs::remove_file(self.layout.exit_notice(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RuntimeError::Io { path: self.layout.exit_notice(id), source: e }),
        }
        if !rootfs::mounts_under(&*self.host, &dir).is_empty() {
            return Err(cerr(id, format!("{} is still mounted", dir.display())));
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::Io { path: dir, source: e }),
        }
    }

    fn exec(&self, id: &str, command: &[String]) -> Result<super::ExecProcess, RuntimeError> {
        self.exec_in(id, command, false, exec::Stdin::Null)
    }

    fn exec_with_stdin(
        &self,
        id: &str,
        command: &[String],
        tty: Option<specs::api::TerminalSize>,
    ) -> Result<super::ExecProcess, RuntimeError> {
        let stdin = tty.map_or(exec::Stdin::Pipe, exec::Stdin::Tty);
        self.exec_in(id, command, false, stdin)
    }

    fn exec_probe(&self, id: &str, command: &[String]) -> Result<super::ExecProcess, RuntimeError> {
        self.exec_in(id, command, true, exec::Stdin::Null)
    }

    fn tidy_at_stop(&self) {
        // A delegated subtree is systemd's to remove; `/pinion` is ours.
        if !self.cgroups.delegated {
            for dir in cgroups::remove_parent_if_empty(self.host.as_ref(), &self.cgroups.path) {
                tracing::info!(cgroup = %dir.display(), "removed the containers' cgroup parent, empty");
            }
        }
    }

    fn list(&self) -> Result<Vec<String>, RuntimeError> {
        let mut ids = Vec::new();
        for dir in [self.layout.containers(), self.layout.state_root()] {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(RuntimeError::Io { path: dir, source: e }),
            };
            for e in entries.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    if check_id(name).is_ok() && e.path().is_dir() {
                        ids.push(name.to_string());
                    }
                }
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    fn watch_exits(&self, tx: ExitSender) -> Result<(), RuntimeError> {
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        let dir = self.layout.exits();
        let io = |e: nix::errno::Errno| RuntimeError::Io { path: dir.clone(), source: e.into() };
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(io)?;
        // Set up before the first scan, so no exit falls between the two.
        // Renames only: the shim's writer closes its file after the rename,
        // and that close would be a second event under the final name.
        ino.add_watch(&dir, F::IN_MOVED_TO).map_err(io)?;
        let d = dir.clone();
        std::thread::Builder::new()
            .name("exit-watcher".into())
            .spawn(move || watch_exit_notices(ino, d, tx))
            .map_err(|source| RuntimeError::Io { path: dir, source })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        let check = |id: &str, ok: bool| assert_eq!(check_id(id).is_ok(), ok, "{id}");
        check("pod-a_c.1", true);
        check("", false);
        check("../x", false);
        check(".hidden", false);
        check("a/b", false);
        check(&"x".repeat(129), false);
    }

    #[test]
    fn exit_notices_become_exit_events() -> Result<(), RuntimeError> {
        let dir = tempfile::tempdir().map_err(ioerr(Path::new("tmp")))?;
        let layout = Layout::new(dir.path());
        fs::create_dir_all(layout.exits()).map_err(ioerr(&layout.exits()))?;
        let before = ExitRecord { code: 3, signal: None, oom_killed: false, usage: None };
        write_json(&layout.exit_notice("old_1"), &before)?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        let ino =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(|e| ioerr(dir.path())(e.into()))?;
        ino.add_watch(&layout.exits(), F::IN_MOVED_TO).map_err(|e| ioerr(dir.path())(e.into()))?;
        let exits = layout.exits();
        let watcher = std::thread::spawn(move || watch_exit_notices(ino, exits, tx));
        // An exit from before the watch, then one while it watches.
        assert_eq!(rx.blocking_recv(), Some(ExitEvent { id: "old_1".into(), code: 3, oom_killed: false, usage: None }));
        let rec = ExitRecord { code: 143, signal: Some(15), oom_killed: false, usage: None };
        write_json(&layout.exit_notice("new_1"), &rec)?;
        assert_eq!(
            rx.blocking_recv(),
            Some(ExitEvent { id: "new_1".into(), code: 143, oom_killed: false, usage: None })
        );
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(rx.try_recv().ok(), None, "one event per exit");
        drop(rx);
        let _ = watcher.join();
        Ok(())
    }

    /// A runtime on a double of the host, in a folder of its own, whose
    /// "shim" is a script that reports `report` (`error ...`, as a failed
    /// create would).
    struct Fixture {
        dir: tempfile::TempDir,
        host: Arc<crate::host::Recorder>,
        rt: LibcontainerRuntime,
    }

    /// The delegated subtree the fixtures' cgroups go in.
    const PODS: &str = "/system.slice/pinion.service/pods";

    fn fixture(host: crate::host::Recorder, report: &str) -> Fixture {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let shim = dir.path().join("shim");
        fs::write(&shim, format!("#!/bin/sh\necho '{report}'\n")).unwrap_or_else(|e| panic!("{e}"));
        fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
        let host = Arc::new(host);
        let rt = LibcontainerRuntime::with_host(&dir.path().join("data"), &shim, host.clone())
            .unwrap_or_else(|e| panic!("{e}"))
            .with_cgroup_parent(cgroups::Parent { path: PODS.into(), delegated: true });
        Fixture { dir, host, rt }
    }

    fn config(id: &str, rootfs: RootfsConfig, args: &[&str]) -> ContainerConfig {
        ContainerConfig {
            pids_limit: Some(64),
            args: args.iter().map(|a| a.to_string()).collect(),
            rootfs,
            memory_limit_bytes: Some(64 << 20),
            ..crate::runtime::hollow::tests::config(id, "1")
        }
    }

    /// An image `busybox:1` with an empty rootfs, recorded as an import leaves it.
    fn image(fx: &Fixture) -> PathBuf {
        let images = fx.rt.layout.images();
        let rec = image::ImageRecord {
            reference: "busybox:1".into(),
            digest: "sha256:ab".into(),
            entrypoint: vec![],
            cmd: vec!["sh".into()],
            env: vec![],
            working_dir: String::new(),
            layers: 1,
        };
        let full = image::normalize_reference("busybox:1").unwrap_or_else(|e| panic!("{e}"));
        fs::create_dir_all(images.join("ab/rootfs")).unwrap_or_else(|e| panic!("{e}"));
        write_json(&images.join("ab/image.json"), &rec).unwrap_or_else(|e| panic!("{e}"));
        write_json(&images.join("refs.json"), &serde_json::json!({ "refs": { full: "ab" } }))
            .unwrap_or_else(|e| panic!("{e}"));
        images.join("ab/rootfs")
    }

    #[test]
    fn a_start_that_fails_midway_undoes_what_it_did_in_reverse() {
        use crate::host::{Call, Recorder};
        use nix::errno::Errno;
        let pods = Path::new("/sys/fs/cgroup").join(PODS.trim_start_matches('/'));
        let delegated = || Recorder::v2().dir(&pods);
        /// The calls, by what they do (their paths are the fixture's).
        #[derive(Clone, Copy)]
        enum Did {
            MakeCgroup,
            RemoveCgroup,
            MountOverlay,
            Unmount,
        }
        use Did::*;
        struct Case {
            name: &'static str,
            host: Recorder,
            image: bool,
            args: &'static [&'static str],
            error: &'static str,
            calls: &'static [Did],
        }
        let cases = [
            Case {
                name: "the shim fails: the cgroup goes",
                host: delegated(),
                image: false,
                args: &["true"],
                error: "creating the container: boom",
                calls: &[MakeCgroup, RemoveCgroup],
            },
            Case {
                name: "no cgroup directory: nothing to remove",
                host: delegated().fail_first(|c| matches!(c, Call::CreateDir(_)), Errno::EACCES),
                image: false,
                args: &["true"],
                error: "the container's cgroup",
                calls: &[MakeCgroup],
            },
            Case {
                name: "the command is not in the image: the overlay goes",
                host: delegated(),
                image: true,
                args: &["/bin/missing"],
                error: "command \"/bin/missing\" not found",
                calls: &[MountOverlay, Unmount],
            },
            Case {
                name: "the overlay mount fails: nothing to undo",
                host: delegated().fail_first(|c| matches!(c, Call::Mount { .. }), Errno::ENODEV),
                image: true,
                args: &["/bin/missing"],
                error: "mounting the image busybox:1 overlay",
                calls: &[MountOverlay],
            },
        ];
        for case in cases {
            let fx = fixture(case.host, "error creating the container: boom");
            let rootfs = if case.image { RootfsConfig::Image("busybox:1".into()) } else { RootfsConfig::Host };
            let lower = image(&fx);
            let err = match fx.rt.start(&config("c1", rootfs, case.args), &mut StartTrace::default()) {
                Ok(()) => panic!("{}: started", case.name),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(case.error), "{}: {err}", case.name);
            let dir = fx.rt.layout.container("c1");
            let target = fx.rt.layout.rootfs("c1");
            let call = |step: &Did| match step {
                MakeCgroup => Call::CreateDir(pods.join("c1")),
                RemoveCgroup => Call::RemoveCgroup(Path::new(PODS).join("c1")),
                MountOverlay => Call::Mount {
                    source: "overlay".into(),
                    target: target.clone(),
                    fstype: "overlay".into(),
                    data: format!(
                        "lowerdir={},upperdir={},workdir={}",
                        lower.display(),
                        dir.join("upper").display(),
                        dir.join("work").display()
                    ),
                },
                Unmount => Call::Unmount(target.clone()),
            };
            let want: Vec<Call> = case.calls.iter().map(call).collect();
            assert_eq!(fx.host.calls(), want, "{}", case.name);
            assert!(!dir.exists(), "{}: {} is left", case.name, dir.display());
            assert!(fx.host.mount_points().is_empty(), "{}", case.name);
            drop(fx.dir);
        }
    }

    #[test]
    fn a_cpuset_update_applies_cpus_and_mems_to_the_running_container() {
        use crate::host::{Call, Recorder};
        let fx = fixture(Recorder::v1(), "unused");
        let id = "c1";
        fs::create_dir_all(fx.rt.layout.bundle(id)).unwrap_or_else(|e| panic!("{e}"));
        let check = |cpus: &str, mems: &str, want: Result<(&str, String), &str>| {
            let (c, m) = (CpuSet::parse_list(cpus).unwrap_or_default(), NumaSet::parse_list(mems).unwrap_or_default());
            let got = fx.rt.update_cpuset(id, &c, &m);
            let calls = fx.host.take_calls();
            match (got, want) {
                (Ok(()), Ok((cpus, mems))) => {
                    let [Call::ApplyCgroup { cgroup, resources }] = calls.as_slice() else {
                        panic!("{cpus}/{mems}: {calls:?}")
                    };
                    assert_eq!(cgroup, &Path::new(PODS).join(id));
                    let cpu = resources.cpu().clone().unwrap_or_default();
                    assert_eq!((cpu.cpus().as_deref(), cpu.mems().as_deref()), (Some(cpus), Some(mems.as_str())));
                    assert!(resources.memory().is_none() && resources.pids().is_none(), "the cpuset only");
                }
                (Err(e), Err(text)) => {
                    assert!(e.to_string().contains(text), "{e}");
                    assert_eq!(calls, [], "{cpus}/{mems}");
                }
                (got, want) => panic!("{cpus}/{mems}: got {got:?}, want {want:?}"),
            }
        };
        check("2-3", "0", Err("the container is not running"));
        // Running: its init is this test's own process.
        let me = ProcId::of(std::process::id() as i32).unwrap_or_else(|| panic!("no /proc/self"));
        write_json(&fx.rt.layout.started(id), &StartedRecord { init: me, shim: me }).unwrap_or_else(|e| panic!("{e}"));
        check("2-3", "0", Ok(("2-3", "0".into())));
        check("0,2", "", Ok(("0,2", spec::all_mems())));
        check("", "0", Err("empty CPU set"));
    }

    #[test]
    fn commands_that_cannot_run_are_typed_with_their_exit_code() -> Result<(), RuntimeError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().map_err(ioerr(Path::new("tmp")))?;
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).map_err(ioerr(&bin))?;
        for (name, mode) in [("ok", 0o755), ("plain", 0o644)] {
            let p = bin.join(name);
            fs::write(&p, "#!/bin/sh\n").map_err(ioerr(&p))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(ioerr(&p))?;
        }
        let process = |cmd: &str| spec::ProcessSpec {
            args: vec![cmd.to_string()],
            env: vec!["PATH=/nowhere:/bin".into()],
            cwd: "/".into(),
            user: Default::default(),
        };
        let check = |cmd: &str, expected: Option<(i32, &str)>| {
            let got = check_command("c", dir.path(), &process(cmd));
            match (got, expected) {
                (Ok(()), None) => {}
                (Err(RuntimeError::CannotRun { code, message, .. }), Some((want, text))) => {
                    assert_eq!(code, want, "{cmd}: {message}");
                    assert!(message.contains(text), "{cmd}: {message}");
                }
                (got, want) => panic!("{cmd}: got {got:?}, want {want:?}"),
            }
        };
        check("ok", None);
        check("/bin/ok", None);
        check("nope", Some((127, "\"nope\" not found in $PATH")));
        check("/bin/nope", Some((127, "\"/bin/nope\" not found")));
        check("plain", Some((126, "is not executable")));
        check("/bin", Some((126, "is not executable")));
        assert_eq!(cannot_run_code("starting the container: executable 'x' not found in $PATH"), Some(127));
        assert_eq!(cannot_run_code("executable 'x' at path '/x' does not have correct permissions"), Some(126));
        assert_eq!(cannot_run_code("creating the container: cgroup busy"), None);
        Ok(())
    }
}
