//! The `hollow` runtime: everything a runtime does except creating processes.
//! It records each container's config, cpuset and state in memory and in
//! `<data>/hollow/containers.json` (written atomically on every change, not
//! fsynced, like a real runtime's process records: a restarted agent finds its
//! "running" containers exactly as a real runtime's would be found). Used to
//! simulate big machines from sysfs fixtures and for benchmarks of everything
//! around the runtime.
//!
//! Containers end on their own as their command says, so that benchmarks can
//! run jobs: `true` exits 0 at once, `false` 1, `sleep N` 0 after N seconds
//! (one timer thread for every container, not a thread each); anything else
//! runs until stopped, or until `exit` makes it end as if its process had
//! exited, which is how tests drive restart policies. Every exit is sent at
//! once to the channel given to `watch_exits`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use specs::{CpuSet, NumaSet};

use super::{ContainerConfig, ContainerState, ExitEvent, ExitSender, Runtime, RuntimeError};
use crate::fsutil::replace_atomic;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HollowContainer {
    pub config: ContainerConfig,
    /// The live cpuset (follows `update_cpuset`).
    pub cpus: CpuSet,
    mems: NumaSet,
    pub state: ContainerState,
    /// How many times `update_cpuset` changed it (tests check "no restart").
    #[serde(default)]
    pub(crate) cpuset_updates: u32,
    /// When a `sleep N` container ends (milliseconds since the Unix epoch), so
    /// that a reopened runtime ends it on time too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ends_at_ms: Option<u64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    next_pid: i32,
    containers: BTreeMap<String, HollowContainer>,
    /// Each container's JSON, so that a change serializes one container and
    /// the file is put together from the others as they are (with a thousand
    /// jobs a second, serializing every container at every change was the
    /// runtime's whole cost).
    #[serde(skip)]
    json: BTreeMap<String, String>,
}

/// What an operation does to the one container it is about.
enum Change {
    Keep,
    Put(Box<HollowContainer>),
    Delete,
}

fn json_err(e: serde_json::Error) -> RuntimeError {
    cerr("-", format!("serializing the hollow state: {e}"))
}

/// The state file's bytes: `cached` with `id` replaced by `new` (or left out).
fn render(cached: &BTreeMap<String, String>, next_pid: i32, id: &str, new: Option<&str>) -> Vec<u8> {
    let mut out = format!("{{\"next_pid\":{next_pid},\"containers\":{{");
    let mut first = true;
    let mut push = |k: &str, v: &str| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        out.push_str(&serde_json::Value::String(k.to_string()).to_string());
        out.push(':');
        out.push_str(v);
    };
    let mut placed = new.is_none();
    for (k, v) in cached {
        if k == id {
            if let Some(n) = new {
                push(k, n);
            }
            placed = true;
            continue;
        }
        if !placed && k.as_str() > id {
            push(id, new.unwrap_or_default());
            placed = true;
        }
        push(k, v);
    }
    if !placed {
        push(id, new.unwrap_or_default());
    }
    out.push_str("}}");
    out.into_bytes()
}

/// What a hollow container's command does on its own.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Course {
    ExitNow(i32),
    ExitAfter(Duration),
    Forever,
}

/// `true`, `false`, `sleep N` (seconds, with an optional s/m/h/d suffix as
/// coreutils takes it); anything else (a shell, `sleep inf`) runs until stopped.
fn course(args: &[String]) -> Course {
    let name = args.first().map(|a| a.rsplit('/').next().unwrap_or(a)).unwrap_or("");
    match (name, args.len()) {
        ("true", _) => Course::ExitNow(0),
        ("false", _) => Course::ExitNow(1),
        ("sleep", 2) => {
            let arg = args[1].as_str();
            let (num, unit) = match arg.char_indices().last() {
                Some((i, c @ ('s' | 'm' | 'h' | 'd'))) => (&arg[..i], c),
                _ => (arg, 's'),
            };
            let scale = match unit {
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86400.0,
                _ => 1.0,
            };
            match num.parse::<f64>() {
                Ok(n) if n.is_finite() && n >= 0.0 && n * scale < 1e9 => {
                    Course::ExitAfter(Duration::from_secs_f64(n * scale))
                }
                _ => Course::Forever,
            }
        }
        _ => Course::Forever,
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Inner {
    path: PathBuf,
    state: Mutex<State>,
    exits: Mutex<Option<ExitSender>>,
    /// Pending `sleep` ends, earliest first; the timer thread waits on `wake`.
    timers: Mutex<BinaryHeap<Reverse<(Instant, String)>>>,
    wake: Condvar,
}

pub struct HollowRuntime {
    inner: Arc<Inner>,
}

fn cerr(id: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Container { id: id.to_string(), message: message.into() }
}

impl Inner {
    /// Applies `f` to container `id` and keeps the change only once it is on
    /// disk, so memory and file never disagree (a failed save changes nothing).
    fn with<T>(
        &self,
        id: &str,
        f: impl FnOnce(Option<&HollowContainer>, &mut i32) -> Result<(T, Change), RuntimeError>,
    ) -> Result<T, RuntimeError> {
        // A poisoned lock means another thread panicked between lock and unlock;
        // the state is only changed after a successful save, so it is consistent.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut next_pid = st.next_pid;
        let (out, change) = f(st.containers.get(id), &mut next_pid)?;
        let new = match &change {
            Change::Keep => return Ok(out),
            Change::Put(c) => Some(serde_json::to_string(c).map_err(json_err)?),
            Change::Delete => None,
        };
        let bytes = render(&st.json, next_pid, id, new.as_deref());
        replace_atomic(&self.path, &bytes).map_err(|source| RuntimeError::Io { path: self.path.clone(), source })?;
        st.next_pid = next_pid;
        match (change, new) {
            (Change::Put(c), Some(json)) => {
                st.containers.insert(id.to_string(), *c);
                st.json.insert(id.to_string(), json);
            }
            _ => {
                st.containers.remove(id);
                st.json.remove(id);
            }
        }
        Ok(out)
    }

    fn notify(&self, id: &str, code: i32, oom_killed: bool) {
        let tx = self.exits.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = tx.as_ref() {
            // A closed channel: nobody listens any more, which is fine.
            let _ = tx.send(ExitEvent { id: id.to_string(), code, oom_killed, usage: None });
        }
    }

    /// Ends a running container; `Ok(false)` when it was not running.
    fn end(&self, id: &str, code: i32, oom_killed: bool) -> Result<bool, RuntimeError> {
        let ended = self.with(id, |c, _| {
            let c = c.ok_or_else(|| cerr(id, "no such container"))?;
            if !matches!(c.state, ContainerState::Running { .. }) {
                return Ok((false, Change::Keep));
            }
            let mut c = c.clone();
            c.state = ContainerState::Exited { code, oom_killed };
            c.ends_at_ms = None;
            Ok((true, Change::Put(Box::new(c))))
        })?;
        if ended {
            self.notify(id, code, oom_killed);
        }
        Ok(ended)
    }

    fn arm(self: &Arc<Self>, id: &str, at: Instant) {
        let mut timers = self.timers.lock().unwrap_or_else(|p| p.into_inner());
        let first = timers.is_empty();
        timers.push(Reverse((at, id.to_string())));
        drop(timers);
        if first {
            // The thread exits when the heap is empty; (re)start it.
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new().name("hollow-timer".into()).spawn(move || timer_thread(weak));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the hollow timer thread; sleeps will not end");
            }
        } else {
            self.wake.notify_one();
        }
    }
}

/// Ends `sleep` containers when their time comes; returns when no timer is
/// left (the next `arm` starts a new one) or the runtime is gone.
fn timer_thread(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let mut timers = inner.timers.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match timers.peek() {
            None => return,
            Some(Reverse((at, _))) if *at <= now => {
                let Some(Reverse((_, id))) = timers.pop() else { continue };
                drop(timers);
                if let Err(e) = inner.end(&id, 0, false) {
                    tracing::debug!(id, error = %e, "hollow sleep ended a container that is gone");
                }
            }
            Some(Reverse((at, _))) => {
                // Wake at the deadline, on a new earlier timer, or every second
                // to notice that the runtime was dropped.
                let wait = (*at - now).min(Duration::from_secs(1));
                drop(inner.wake.wait_timeout(timers, wait).unwrap_or_else(|p| p.into_inner()));
            }
        }
    }
}

impl HollowRuntime {
    /// Opens (or creates) the hollow runtime's state under `data_dir/hollow`.
    pub fn new(data_dir: &Path) -> Result<Self, RuntimeError> {
        let dir = data_dir.join("hollow");
        crate::fsutil::private_dir(&dir).map_err(|source| RuntimeError::Io { path: dir.clone(), source })?;
        let path = dir.join("containers.json");
        let mut state: State = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("corrupt hollow state: {e}")),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State { next_pid: 1_000_000, ..Default::default() },
            Err(source) => return Err(RuntimeError::Io { path, source }),
        };
        for (id, c) in &state.containers {
            let json = serde_json::to_string(c).map_err(json_err)?;
            state.json.insert(id.clone(), json);
        }
        let sleeping: Vec<(String, u64)> = state
            .containers
            .iter()
            .filter(|(_, c)| matches!(c.state, ContainerState::Running { .. }))
            .filter_map(|(id, c)| c.ends_at_ms.map(|ms| (id.clone(), ms)))
            .collect();
        let inner = Arc::new(Inner {
            path,
            state: Mutex::new(state),
            exits: Mutex::new(None),
            timers: Mutex::new(BinaryHeap::new()),
            wake: Condvar::new(),
        });
        let (now, now_ms) = (Instant::now(), unix_ms(SystemTime::now()));
        for (id, ms) in sleeping {
            inner.arm(&id, now + Duration::from_millis(ms.saturating_sub(now_ms)));
        }
        Ok(Self { inner })
    }

    /// A snapshot of one container (tests and benchmarks look at cpusets).
    pub fn get(&self, id: &str) -> Option<HollowContainer> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).containers.get(id).cloned()
    }

    /// Every container, by id.
    pub fn all(&self) -> BTreeMap<String, HollowContainer> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).containers.clone()
    }

    /// Makes a running container end as if its process exited with `code`.
    #[cfg(test)]
    pub(crate) fn exit(&self, id: &str, code: i32, oom_killed: bool) -> Result<(), RuntimeError> {
        if self.inner.end(id, code, oom_killed)? {
            Ok(())
        } else {
            Err(cerr(id, "not running"))
        }
    }
}

impl Runtime for HollowRuntime {
    fn name(&self) -> &'static str {
        "hollow"
    }

    fn start(&self, cfg: &ContainerConfig, _trace: &mut crate::metrics::StartTrace) -> Result<(), RuntimeError> {
        if cfg.cpus.is_empty() {
            return Err(cerr(&cfg.id, "empty cpuset"));
        }
        let course = course(&cfg.args);
        // No process writes it, but a container that runs a while has its log,
        // as a real one does: `logs -f` and attach follow it from the start.
        // One that ends at once (`true`, `false`) gets none: the file and its
        // folder cost the control-path benchmark 15% (960-1,008 jobs/s
        // without, 809-855 with) for a log nobody could read anything in.
        if let Some(dir) = cfg
            .log_path
            .parent()
            .filter(|d| !matches!(course, Course::ExitNow(_)) && !d.as_os_str().is_empty())
            .filter(|_| !cfg.log_path.starts_with("/dev"))
        {
            crate::fsutil::private_dir(dir)
                .and_then(|()| crate::fsutil::create_private(&cfg.log_path, true))
                .map_err(|e| cerr(&cfg.id, format!("{}: {e}", cfg.log_path.display())))?;
        }
        let ends_at = match course {
            Course::ExitAfter(d) => Some((Instant::now() + d, unix_ms(SystemTime::now() + d))),
            _ => None,
        };
        self.inner.with(&cfg.id, |c, next_pid| {
            if c.is_some() {
                return Err(cerr(&cfg.id, "already exists"));
            }
            *next_pid += 1;
            let state = match course {
                Course::ExitNow(code) => ContainerState::Exited { code, oom_killed: false },
                _ => ContainerState::Running { pid: *next_pid },
            };
            let c = HollowContainer {
                config: cfg.clone(),
                cpus: cfg.cpus.clone(),
                mems: cfg.mems.clone(),
                state,
                cpuset_updates: 0,
                ends_at_ms: ends_at.map(|e| e.1),
            };
            Ok(((), Change::Put(Box::new(c))))
        })?;
        match (course, ends_at) {
            (Course::ExitNow(code), _) => self.inner.notify(&cfg.id, code, false),
            (_, Some((at, _))) => self.inner.arm(&cfg.id, at),
            _ => {}
        }
        Ok(())
    }

    fn state(&self, id: &str) -> Result<ContainerState, RuntimeError> {
        Ok(self.get(id).map_or(ContainerState::Missing, |c| c.state))
    }

    fn update_cpuset(&self, id: &str, cpus: &CpuSet, mems: &NumaSet) -> Result<(), RuntimeError> {
        if cpus.is_empty() {
            return Err(cerr(id, "empty cpuset"));
        }
        self.inner.with(id, |c, _| {
            let c = c.ok_or_else(|| cerr(id, "no such container"))?;
            if !matches!(c.state, ContainerState::Running { .. }) {
                return Err(cerr(id, "not running"));
            }
            let mut c = c.clone();
            c.cpus = cpus.clone();
            c.mems = mems.clone();
            c.cpuset_updates += 1;
            Ok(((), Change::Put(Box::new(c))))
        })
    }

    /// Idempotent, like a real runtime's: a container already gone is stopped.
    fn stop(&self, id: &str, _grace: Duration) -> Result<(), RuntimeError> {
        // 128 + SIGTERM: what a process that honours SIGTERM reports.
        match self.inner.end(id, 143, false) {
            Ok(_) => Ok(()),
            Err(_) if self.get(id).is_none() => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.inner.with(id, |c, _| match c {
            None => Ok(((), Change::Keep)),
            Some(c) if matches!(c.state, ContainerState::Running { .. }) => {
                Err(cerr(id, "still running; stop it first"))
            }
            Some(_) => Ok(((), Change::Delete)),
        })
    }

    fn exec(&self, _id: &str, _command: &[String]) -> Result<crate::runtime::ExecProcess, RuntimeError> {
        Err(RuntimeError::Unsupported("the hollow runtime runs no processes, so it cannot exec a command"))
    }

    fn list(&self) -> Result<Vec<String>, RuntimeError> {
        Ok(self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).containers.keys().cloned().collect())
    }

    fn watch_exits(&self, tx: ExitSender) -> Result<(), RuntimeError> {
        *self.inner.exits.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::runtime::RootfsConfig;

    /// A container `main` of pod `static/p` on `cpus`, running `sleep inf`
    /// on the host's root, nothing else set: what the runtimes' tests start from.
    pub(crate) fn config(id: &str, cpus: &str) -> ContainerConfig {
        ContainerConfig {
            mounts: Vec::new(),
            pids_limit: None,
            realtime_budget_us: None,
            id: id.into(),
            pod: "static/p".into(),
            container: "main".into(),
            args: vec!["sleep".into(), "inf".into()],
            env: vec![],
            cwd: "/".into(),
            rootfs: RootfsConfig::Host,
            cpus: CpuSet::parse_list(cpus).unwrap(),
            mems: NumaSet::single(0).expect("id within MAX_ID"),
            bind_memory: false,
            memory_limit_bytes: None,
            cpu_quota: None,
            cpu_shares: None,
            hugepage_limits: Default::default(),
            device_nodes: vec![],
            host_network: false,
            netns: None,
            cap_add: vec![],
            cap_drop: vec![],
            system_cpus: Default::default(),
            log_path: "/dev/null".into(),
            init: false,
            run_as: Default::default(),
            userns: None,
            output: None,
        }
    }

    fn with_args(id: &str, args: &[&str]) -> ContainerConfig {
        ContainerConfig { args: args.iter().map(|a| a.to_string()).collect(), ..config(id, "1") }
    }

    #[test]
    fn commands_decide_how_a_container_ends() {
        let s = |args: &[&str]| course(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&["true"]), Course::ExitNow(0));
        assert_eq!(s(&["/bin/false"]), Course::ExitNow(1));
        assert_eq!(s(&["sleep", "2"]), Course::ExitAfter(Duration::from_secs(2)));
        assert_eq!(s(&["sleep", "0.5"]), Course::ExitAfter(Duration::from_millis(500)));
        assert_eq!(s(&["sleep", "1m"]), Course::ExitAfter(Duration::from_secs(60)));
        assert_eq!(s(&["sleep", "inf"]), Course::Forever);
        assert_eq!(s(&["sleep", "-1"]), Course::Forever);
        assert_eq!(s(&["sh", "-c", "true"]), Course::Forever);
        assert_eq!(s(&[]), Course::Forever);
    }

    #[test]
    fn exits_are_sent_as_they_happen() {
        let dir = tempfile::tempdir().unwrap();
        let rt = HollowRuntime::new(dir.path()).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        rt.watch_exits(tx).unwrap();
        rt.start(&with_args("t", &["true"]), &mut Default::default()).unwrap();
        assert_eq!(rx.blocking_recv(), Some(ExitEvent { id: "t".into(), code: 0, oom_killed: false, usage: None }));
        rt.start(&with_args("f", &["false"]), &mut Default::default()).unwrap();
        assert_eq!(rx.blocking_recv(), Some(ExitEvent { id: "f".into(), code: 1, oom_killed: false, usage: None }));
        rt.start(&with_args("s", &["sleep", "0.01"]), &mut Default::default()).unwrap();
        rt.start(&with_args("forever", &["sleep", "inf"]), &mut Default::default()).unwrap();
        assert_eq!(rx.blocking_recv(), Some(ExitEvent { id: "s".into(), code: 0, oom_killed: false, usage: None }));
        assert_eq!(rt.state("s").unwrap(), ContainerState::Exited { code: 0, oom_killed: false });
        rt.exit("forever", 7, false).unwrap();
        assert_eq!(
            rx.blocking_recv(),
            Some(ExitEvent { id: "forever".into(), code: 7, oom_killed: false, usage: None })
        );
        // Stopping a container that is already gone is not an error.
        rt.remove("forever").unwrap();
        rt.stop("forever", Duration::ZERO).unwrap();
    }

    #[test]
    fn lifecycle_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let rt = HollowRuntime::new(dir.path()).unwrap();
        rt.start(&config("a", "1"), &mut Default::default()).unwrap();
        rt.start(&config("b", "0-3"), &mut Default::default()).unwrap();
        assert!(rt.start(&config("a", "1"), &mut Default::default()).is_err(), "duplicate id");
        rt.update_cpuset("b", &CpuSet::parse_list("0,2-3").unwrap(), &NumaSet::single(0).expect("id within MAX_ID"))
            .unwrap();
        drop(rt);

        let rt = HollowRuntime::new(dir.path()).unwrap();
        assert_eq!(rt.list().unwrap(), vec!["a".to_string(), "b".to_string()]);
        assert!(matches!(rt.state("a").unwrap(), ContainerState::Running { .. }));
        let b = rt.get("b").unwrap();
        assert_eq!((b.cpus.to_string(), b.cpuset_updates), ("0,2-3".to_string(), 1));

        assert!(rt.remove("a").is_err(), "remove of a running container");
        rt.exit("a", 3, true).unwrap();
        assert_eq!(rt.state("a").unwrap(), ContainerState::Exited { code: 3, oom_killed: true });
        rt.stop("b", Duration::ZERO).unwrap();
        assert_eq!(rt.state("b").unwrap(), ContainerState::Exited { code: 143, oom_killed: false });
        assert!(rt
            .update_cpuset(
                "b",
                &CpuSet::single(0).expect("id within MAX_ID"),
                &NumaSet::single(0).expect("id within MAX_ID")
            )
            .is_err());
        rt.remove("a").unwrap();
        rt.remove("b").unwrap();
        rt.remove("b").unwrap();
        assert_eq!(rt.state("a").unwrap(), ContainerState::Missing);
        drop(rt);
        assert!(HollowRuntime::new(dir.path()).unwrap().list().unwrap().is_empty());
        // The file is the whole state as plain JSON.
        let rt = HollowRuntime::new(dir.path()).unwrap();
        rt.start(&config("b", "1"), &mut Default::default()).unwrap();
        rt.start(&config("a", "2"), &mut Default::default()).unwrap();
        rt.start(&config("c", "3"), &mut Default::default()).unwrap();
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("hollow/containers.json")).unwrap()).unwrap();
        let ids: Vec<&String> = file["containers"].as_object().unwrap().keys().collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(
            serde_json::from_value::<HollowContainer>(file["containers"]["a"].clone()).unwrap(),
            rt.get("a").unwrap()
        );
    }

    #[test]
    fn corrupt_state_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("hollow")).unwrap();
        std::fs::write(dir.path().join("hollow/containers.json"), "{").unwrap();
        let err = HollowRuntime::new(dir.path()).err().unwrap().to_string();
        assert!(err.contains("hollow/containers.json") && err.contains("corrupt"), "{err}");
    }
}
