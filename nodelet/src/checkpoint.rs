//! The agent's durable memory: what it has handed out (`specs::Allocations`) and
//! what it needs to find its containers again after a restart (each pod's spec
//! fingerprint, the pod itself, runtime container ids, restart counts, and the
//! final phase of pods that finished). One JSON file under the data dir, written
//! atomically before any container starts, so that a restarted agent never
//! allocates a CPU twice. A corrupt file is an error naming the file, never a
//! silent reset: resetting would hand out CPUs that running containers hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use specs::{Allocations, NodeSettings, Pod, PodPhase};

use crate::fsutil::write_atomic;

pub(crate) const FILE_NAME: &str = "checkpoint.json";
/// Bumped on incompatible changes; an unknown version is refused, not guessed.
pub(crate) const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: corrupt checkpoint: {reason} (move it away to start from nothing; running containers would then be treated as leaks)")]
    Corrupt { path: PathBuf, reason: String },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Checkpoint {
    pub version: u32,
    pub allocations: Allocations,
    /// Pod key -> what the agent knows about it (admitted pods and finished ones).
    pub pods: BTreeMap<String, PodRecord>,
    /// The settings the allocations were made under, so that an agent
    /// restarted with others knows (absent from an older agent's file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<NodeSettings>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodRecord {
    /// `spec_hash(pod)`: a source re-sending the same pod is not a change.
    pub spec_hash: String,
    /// The pod as admitted, so that restart policies apply before the source
    /// resyncs. Shared with the agent's entry: a checkpoint is taken at every
    /// write, and copying every pod each time made the write's cost grow with
    /// the pods held.
    pub pod: std::sync::Arc<Pod>,
    /// Container name -> its runtime record.
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerRecord>,
    /// Set once the pod finished (Succeeded/Failed) and its resources were freed;
    /// the same spec is then not run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<PodPhase>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerRecord {
    /// The runtime id of the current incarnation (recorded before it starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
    #[serde(default)]
    pub restart_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
}

impl Checkpoint {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(FILE_NAME)
    }

    /// Loads the checkpoint; a missing file is an empty checkpoint (first start).
    pub fn load(data_dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let path = Self::path(data_dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint { version: VERSION, ..Default::default() })
            }
            Err(source) => return Err(CheckpointError::Io { path, source }),
        };
        let cp: Checkpoint = serde_json::from_slice(&bytes)
            .map_err(|e| CheckpointError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        if cp.version != VERSION {
            return Err(CheckpointError::Corrupt {
                path,
                reason: format!("version {} (this agent reads version {VERSION})", cp.version),
            });
        }
        cp.check().map_err(|reason| CheckpointError::Corrupt { path, reason })?;
        Ok(cp)
    }

    /// Writes atomically (temp file, fsync, rename, fsync dir). Compact JSON:
    /// it is written before every start, and it holds every pod the agent
    /// remembers, finished ones included (`jq` prints it for people).
    pub fn save(&self, data_dir: &Path) -> Result<(), CheckpointError> {
        let path = Self::path(data_dir);
        let bytes = serde_json::to_vec(self)
            .map_err(|e| CheckpointError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        write_atomic(&path, &bytes).map_err(|source| CheckpointError::Io { path, source })
    }

    /// Invariants a well-formed checkpoint holds: no CPU held exclusively twice,
    /// every allocation belongs to a known pod.
    fn check(&self) -> Result<(), String> {
        let mut seen = specs::CpuSet::new();
        for (key, p) in &self.allocations.pods {
            if !self.pods.contains_key(key) {
                return Err(format!("allocation for pod {key:?} has no pod record"));
            }
            for c in &p.containers {
                if c.cpu_policy == specs::CpuPolicy::Exclusive {
                    if !seen.is_disjoint(&c.cpus) {
                        return Err(format!(
                            "pod {key:?} container {:?}: CPUs {} are allocated twice",
                            c.name,
                            seen.intersection(&c.cpus)
                        ));
                    }
                    seen.union_with(&c.cpus);
                }
            }
        }
        for (key, rec) in &self.pods {
            if rec.finished.is_none() && !self.allocations.pods.contains_key(key) {
                return Err(format!("pod {key:?} is neither finished nor allocated"));
            }
        }
        Ok(())
    }
}

/// A stable fingerprint of what makes a pod: its name and spec (status and
/// server-set metadata do not count, so a status update is not a change).
pub(crate) fn spec_hash(pod: &Pod) -> String {
    let mut text = pod.metadata.name.clone();
    text.push('\n');
    // Serializing a struct of BTreeMaps and Vecs is deterministic.
    text.push_str(&serde_json::to_string(&pod.spec).unwrap_or_default());
    text.push('\n');
    text.push_str(&serde_json::to_string(&pod.metadata.labels).unwrap_or_default());
    format!("{:016x}", crate::fsutil::fnv1a64(text.as_bytes()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use specs::{ContainerPlacement, CpuPolicy, CpuSet, NumaSet, Placement};

    fn pod(name: &str) -> Pod {
        specs::testing::pod(name).command(&["sleep", "inf"]).build()
    }

    fn placement(cpus: &str) -> Placement {
        Placement {
            numa_affinity: NumaSet::single(0).expect("id within MAX_ID"),
            containers: vec![ContainerPlacement {
                name: "main".into(),
                cpu_policy: CpuPolicy::Exclusive,
                cpus: CpuSet::parse_list(cpus).unwrap(),
                mems: NumaSet::single(0).expect("id within MAX_ID"),
                memory: Default::default(),
                hugepages: Default::default(),
                devices: Default::default(),
            }],
            ..Default::default()
        }
    }

    fn sample() -> Checkpoint {
        let mut cp = Checkpoint { version: VERSION, ..Default::default() };
        cp.allocations.apply("static/a", placement("1-2"));
        cp.pods.insert(
            "static/a".into(),
            PodRecord {
                spec_hash: spec_hash(&pod("a")),
                pod: std::sync::Arc::new(pod("a")),
                containers: [(
                    "main".to_string(),
                    ContainerRecord {
                        runtime_id: Some("static.a_main_0".into()),
                        restart_count: 3,
                        last_exit_code: Some(1),
                    },
                )]
                .into(),
                finished: None,
            },
        );
        cp
    }

    #[test]
    fn missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::load(dir.path()).unwrap();
        assert_eq!(cp.allocations, Allocations::default());
        assert!(cp.pods.is_empty());
    }

    #[test]
    fn round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let cp = sample();
        cp.save(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path()).unwrap(), cp);
    }

    /// An agent from before the checkpoint recorded its settings wrote no
    /// `settings`: its file still loads (a restart then re-checks every pod),
    /// and one written with settings reads them back.
    #[test]
    fn settings_are_optional_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut cp = sample();
        let old = serde_json::to_string(&cp).unwrap();
        assert!(!old.contains("settings"), "{old}");
        std::fs::write(Checkpoint::path(dir.path()), &old).unwrap();
        assert_eq!(Checkpoint::load(dir.path()).unwrap().settings, None);
        cp.settings =
            Some(specs::NodeSettings { reserved_cpus: CpuSet::parse_list("0,8").unwrap(), ..Default::default() });
        cp.save(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path()).unwrap(), cp);
    }

    /// Each corruption is refused with the file's path in the message.
    #[test]
    fn corrupt_files_are_errors_naming_the_file() {
        let check = |content: &str, expected: &str| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(Checkpoint::path(dir.path()), content).unwrap();
            let err = Checkpoint::load(dir.path()).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{content}: {msg}");
            assert!(msg.contains(&Checkpoint::path(dir.path()).display().to_string()), "{msg}");
            assert!(msg.contains(expected), "{content}: {msg} lacks {expected:?}");
        };
        let good = serde_json::to_string(&sample()).unwrap();
        check("", "EOF");
        check(&good[..good.len() / 2], "EOF");
        check("{\"version\":1}", "missing field");
        check(&good.replace("\"version\":1", "\"version\":7"), "version 7");
        check(&good.replace("\"allocations\"", "\"allocationz\""), "unknown field");
        // Two pods holding the same exclusive CPU.
        let mut twice = sample();
        twice.allocations.apply("static/b", placement("2-3"));
        twice.pods.insert("static/b".into(), twice.pods["static/a"].clone());
        check(&serde_json::to_string(&twice).unwrap(), "CPUs 2 are allocated twice");
        let mut orphan = sample();
        orphan.pods.clear();
        check(&serde_json::to_string(&orphan).unwrap(), "has no pod record");
        let mut unallocated = sample();
        unallocated.allocations.release("static/a");
        check(&serde_json::to_string(&unallocated).unwrap(), "neither finished nor allocated");
    }

    #[test]
    fn save_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let mut cp = sample();
        cp.save(dir.path()).unwrap();
        cp.allocations.release("static/a");
        cp.pods.clear();
        cp.save(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path()).unwrap(), cp);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn spec_hash_ignores_status_and_server_metadata() {
        let a = pod("a");
        let mut b = a.clone();
        b.metadata.resource_version = Some(9);
        b.status = Some(Default::default());
        assert_eq!(spec_hash(&a), spec_hash(&b));
        let mut c = a.clone();
        c.spec.containers[0].args.push("x".into());
        assert_ne!(spec_hash(&a), spec_hash(&c));
        assert_ne!(spec_hash(&a), spec_hash(&pod("b")));
    }
}
