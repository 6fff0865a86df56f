//! The `hollow` runtime: everything a runtime does except creating processes.
//! It records each container's config, cpuset and state in memory and in
//! `<data>/hollow/containers.json` (written atomically on every change, so a
//! restarted agent finds its "running" containers exactly as a real runtime's
//! would be found). Containers run until stopped. Used to simulate big machines
//! from sysfs fixtures and for benchmarks of everything around the runtime.
//!
//! `exit` makes a container end as if its process had exited, which is how tests
//! drive restart policies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use specs::{CpuSet, NumaSet};

use super::{ContainerConfig, ContainerState, Runtime, RuntimeError};
use crate::fsutil::write_atomic;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HollowContainer {
    pub config: ContainerConfig,
    /// The live cpuset (follows `update_cpuset`).
    pub cpus: CpuSet,
    pub mems: NumaSet,
    pub state: ContainerState,
    /// How many times `update_cpuset` changed it (tests check "no restart").
    #[serde(default)]
    pub cpuset_updates: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    next_pid: i32,
    containers: BTreeMap<String, HollowContainer>,
}

pub struct HollowRuntime {
    path: PathBuf,
    state: Mutex<State>,
}

fn cerr(id: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Container { id: id.to_string(), message: message.into() }
}

impl HollowRuntime {
    /// Opens (or creates) the hollow runtime's state under `data_dir/hollow`.
    pub fn new(data_dir: &Path) -> Result<Self, RuntimeError> {
        let dir = data_dir.join("hollow");
        std::fs::create_dir_all(&dir).map_err(|source| RuntimeError::Io { path: dir.clone(), source })?;
        let path = dir.join("containers.json");
        let state = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("corrupt hollow state: {e}")),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State { next_pid: 1_000_000, ..Default::default() },
            Err(source) => return Err(RuntimeError::Io { path, source }),
        };
        Ok(Self { path, state: Mutex::new(state) })
    }

    /// Applies `f` to a copy of the state and keeps the copy only once it is on
    /// disk, so memory and file never disagree (a failed save changes nothing).
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<(T, bool), RuntimeError>) -> Result<T, RuntimeError> {
        // A poisoned lock means another thread panicked between lock and unlock;
        // the state itself is only ever replaced whole, so it is consistent.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = State { next_pid: st.next_pid, containers: st.containers.clone() };
        let (out, changed) = f(&mut next)?;
        if changed {
            let bytes = serde_json::to_vec(&next).map_err(|e| cerr("-", e.to_string()))?;
            write_atomic(&self.path, &bytes).map_err(|source| RuntimeError::Io { path: self.path.clone(), source })?;
            *st = next;
        }
        Ok(out)
    }

    /// A snapshot of one container (tests and benchmarks look at cpusets).
    pub fn get(&self, id: &str) -> Option<HollowContainer> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).containers.get(id).cloned()
    }

    /// Every container, by id.
    pub fn all(&self) -> BTreeMap<String, HollowContainer> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).containers.clone()
    }

    /// Makes a running container end as if its process exited with `code`.
    pub fn exit(&self, id: &str, code: i32, oom_killed: bool) -> Result<(), RuntimeError> {
        self.with(|st| {
            let c = st.containers.get_mut(id).ok_or_else(|| cerr(id, "no such container"))?;
            if !matches!(c.state, ContainerState::Running { .. }) {
                return Err(cerr(id, "not running"));
            }
            c.state = ContainerState::Exited { code, oom_killed };
            Ok(((), true))
        })
    }
}

impl Runtime for HollowRuntime {
    fn name(&self) -> &'static str {
        "hollow"
    }

    fn start(&self, cfg: &ContainerConfig) -> Result<(), RuntimeError> {
        if cfg.cpus.is_empty() {
            return Err(cerr(&cfg.id, "empty cpuset"));
        }
        self.with(|st| {
            if st.containers.contains_key(&cfg.id) {
                return Err(cerr(&cfg.id, "already exists"));
            }
            st.next_pid += 1;
            let pid = st.next_pid;
            st.containers.insert(
                cfg.id.clone(),
                HollowContainer {
                    config: cfg.clone(),
                    cpus: cfg.cpus.clone(),
                    mems: cfg.mems.clone(),
                    state: ContainerState::Running { pid },
                    cpuset_updates: 0,
                },
            );
            Ok(((), true))
        })
    }

    fn state(&self, id: &str) -> Result<ContainerState, RuntimeError> {
        Ok(self.get(id).map_or(ContainerState::Missing, |c| c.state))
    }

    fn update_cpuset(&self, id: &str, cpus: &CpuSet, mems: &NumaSet) -> Result<(), RuntimeError> {
        if cpus.is_empty() {
            return Err(cerr(id, "empty cpuset"));
        }
        self.with(|st| {
            let c = st.containers.get_mut(id).ok_or_else(|| cerr(id, "no such container"))?;
            if !matches!(c.state, ContainerState::Running { .. }) {
                return Err(cerr(id, "not running"));
            }
            c.cpus = cpus.clone();
            c.mems = mems.clone();
            c.cpuset_updates += 1;
            Ok(((), true))
        })
    }

    fn stop(&self, id: &str, _grace: Duration) -> Result<(), RuntimeError> {
        self.with(|st| {
            let c = st.containers.get_mut(id).ok_or_else(|| cerr(id, "no such container"))?;
            if matches!(c.state, ContainerState::Running { .. }) {
                // 128 + SIGTERM: what a process that honours SIGTERM reports.
                c.state = ContainerState::Exited { code: 143, oom_killed: false };
                return Ok(((), true));
            }
            Ok(((), false))
        })
    }

    fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.with(|st| match st.containers.get(id) {
            None => Ok(((), false)),
            Some(c) if matches!(c.state, ContainerState::Running { .. }) => {
                Err(cerr(id, "still running; stop it first"))
            }
            Some(_) => {
                st.containers.remove(id);
                Ok(((), true))
            }
        })
    }

    fn list(&self) -> Result<Vec<String>, RuntimeError> {
        Ok(self.state.lock().unwrap_or_else(|p| p.into_inner()).containers.keys().cloned().collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::runtime::RootfsConfig;

    pub fn config(id: &str, cpus: &str) -> ContainerConfig {
        ContainerConfig {
            id: id.into(),
            pod: "static/p".into(),
            container: "main".into(),
            args: vec!["sleep".into(), "inf".into()],
            env: vec![],
            cwd: "/".into(),
            rootfs: RootfsConfig::Host,
            cpus: CpuSet::parse_list(cpus).unwrap(),
            mems: NumaSet::single(0),
            bind_memory: false,
            memory_limit_bytes: None,
            cpu_quota: None,
            cpu_shares: None,
            hugepage_limits: Default::default(),
            device_nodes: vec![],
            host_network: false,
            cap_add: vec![],
            cap_drop: vec![],
            system_cpus: Default::default(),
            log_path: "/dev/null".into(),
        }
    }

    #[test]
    fn lifecycle_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let rt = HollowRuntime::new(dir.path()).unwrap();
        rt.start(&config("a", "1")).unwrap();
        rt.start(&config("b", "0-3")).unwrap();
        assert!(rt.start(&config("a", "1")).is_err(), "duplicate id");
        rt.update_cpuset("b", &CpuSet::parse_list("0,2-3").unwrap(), &NumaSet::single(0)).unwrap();
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
        assert!(rt.update_cpuset("b", &CpuSet::single(0), &NumaSet::single(0)).is_err());
        rt.remove("a").unwrap();
        rt.remove("b").unwrap();
        rt.remove("b").unwrap();
        assert_eq!(rt.state("a").unwrap(), ContainerState::Missing);
        drop(rt);
        assert!(HollowRuntime::new(dir.path()).unwrap().list().unwrap().is_empty());
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
