//! Per-pod CPU tuning (`spec.tuning`): the pod's exclusive CPUs are kept quiet
//! while it runs (no device interrupts, no CFS quota, no load balancing, no
//! deep C-states, a fixed frequency governor) and every setting is given back
//! when the pod ends, as CRI-O's high-performance hooks do.
//!
//! Every file is reached under a root (`/` on a node, a fake tree in tests),
//! so the tuner works on a fake `/proc`, `/sys` and `/etc`.
//!
//! Durability, as `crate::cni` records its attachments: before the first
//! write for a pod, what will change and the original values are recorded in
//! `<state>/<sandbox>.json` (0600, written atomically with fsync); only then
//! are the settings applied. A restore puts the recorded values back and then
//! removes the record, so an agent killed with `kill -9` anywhere in between
//! finds the record at its next start and gives the settings back (the first
//! pass restores every record whose pod is gone, `Tuner::unwanted`).
//!
//! Two pods never share a CPU: per-CPU files belong to one pod. Interrupt
//! masks are shared by every CPU, so a pod records the CPUs it took out of
//! each mask and gives back exactly those (a set difference, then a union),
//! never a whole mask that would undo another pod's. irqbalance's banned
//! list is the node's original configuration plus the CPUs of every pod
//! that has a record, and the original file itself once none has.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use specs::pod::{CStates, Disabled, IrqLoadBalancing, Tuning};
use specs::{CpuSet, NodeTopology};

use crate::fsutil::write_atomic;

/// irqbalance's configuration on Debian and Ubuntu, relative to the root.
pub const IRQBALANCE_CONFIG: &str = "etc/default/irqbalance";
/// The variable Debian 12's irqbalance (1.9) reads: a CPU list.
const BANNED_CPULIST: &str = "IRQBALANCE_BANNED_CPULIST";
/// The one older irqbalance reads: a hex mask.
const BANNED_CPUS: &str = "IRQBALANCE_BANNED_CPUS";
/// The record of the irqbalance configuration before any pod changed it.
const IRQBALANCE_RECORD: &str = "irqbalance.orig.json";
/// The real-time budget of a container with `SYS_NICE` where the cgroup v1
/// cpu controller has `cpu.rt_runtime_us` (`CONFIG_RT_GROUP_SCHED`): 100 ms
/// in every period (1 s by default) on each CPU. Without one,
/// `sched_setscheduler(SCHED_FIFO)` fails with EPERM inside the container;
/// the root's 950 ms leave room for nine such containers. The shim gives it
/// (before the process runs) and raises the containers' parent, Pinion's
/// own cgroup, to hold it; it goes with the container's cgroup.
pub const RT_BUDGET_US: u64 = 100_000;
/// How long restarting irqbalance may take.
const RESTART_TIMEOUT: Duration = Duration::from_secs(10);
/// Linux's `EIO`: what the kernel answers for an interrupt whose affinity
/// cannot be set from user space (a managed or per-CPU one).
const EIO: i32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: malformed tuning record: {reason}")]
    Record { path: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> TuningError + '_ {
    move |source| TuningError::Io { path: path.to_path_buf(), source }
}

/// What one pod asks for, at one of its containers' start.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneRequest {
    /// The record's name: the pod's sandbox id (`cni::sandbox_id`), unique
    /// per pod incarnation.
    pub sandbox: String,
    /// The pod's key, for logs.
    pub key: String,
    /// The pod's exclusive CPUs.
    pub cpus: CpuSet,
    /// Those of `cpus` that keep taking interrupts (`housekeeping`).
    pub housekeeping: CpuSet,
    pub tuning: Tuning,
    /// A container has `SYS_NICE`: its cgroup gets a real-time budget.
    pub realtime: bool,
    /// The started container's cgroup folders as the host names them
    /// (`/sys/fs/cgroup/cpu/pinion/<id>`); read under the tuner's root.
    pub cgroups: Vec<PathBuf>,
}

impl TuneRequest {
    /// The request for a pod with these exclusive CPUs; `None` when it asks
    /// for nothing or has no exclusive CPU.
    pub fn new(
        sandbox: String,
        key: String,
        cpus: CpuSet,
        tuning: &Tuning,
        realtime: bool,
        topology: &NodeTopology,
    ) -> Option<Self> {
        if (tuning.is_empty() || cpus.is_empty()) && !realtime {
            return None;
        }
        let housekeeping = match tuning.irq_load_balancing {
            Some(IrqLoadBalancing::Housekeeping) => housekeeping_cpus(topology, &cpus),
            _ => CpuSet::new(),
        };
        Some(TuneRequest { sandbox, key, cpus, housekeeping, tuning: tuning.clone(), realtime, cgroups: Vec::new() })
    }
}

/// CRI-O's `housekeeping`: the first of the pod's CPUs and its hyperthread
/// siblings (the CPUs of the same physical core) among the pod's CPUs.
pub fn housekeeping_cpus(topology: &NodeTopology, cpus: &CpuSet) -> CpuSet {
    let Some(first) = cpus.first() else { return CpuSet::new() };
    let core = topology.cpu(first).map(|c| c.core);
    cpus.filter(|id| id == first || (core.is_some() && topology.cpu(id).map(|c| c.core) == core))
}

/// What was changed for a pod, and what it was before.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Record {
    key: String,
    cpus: CpuSet,
    /// Interrupt (`default` or its number) -> the CPUs the pod took out of
    /// its affinity.
    #[serde(default)]
    irqs: BTreeMap<String, CpuSet>,
    /// The CPUs the pod added to irqbalance's banned list.
    #[serde(default)]
    irqbalance: CpuSet,
    /// An ancestor cgroup's `cpuset.cpus.exclusive` -> the CPUs the pod
    /// added to it (cgroup v2, a remote isolated partition).
    #[serde(default)]
    exclusive: BTreeMap<PathBuf, CpuSet>,
    /// File (relative to the root) -> its content before the pod.
    #[serde(default)]
    files: BTreeMap<PathBuf, String>,
}

/// The irqbalance configuration before any pod: `None` when there was none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct IrqbalanceRecord {
    original: Option<String>,
}

/// How irqbalance is restarted once its configuration changed (only when
/// one runs); a test passes one that counts.
pub type RestartIrqbalance = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How a value is written to a kernel file; a test passes one that answers
/// `EIO` for some, as the kernel does for interrupts it will not move.
pub type WriteFile = Arc<dyn Fn(&Path, &str) -> io::Result<()> + Send + Sync>;

/// The tuner of one node.
pub struct Tuner {
    root: PathBuf,
    state_dir: PathBuf,
    restart_irqbalance: RestartIrqbalance,
    write: WriteFile,
    /// One change at a time: interrupt masks and irqbalance's file are the
    /// node's, not one pod's.
    lock: Mutex<()>,
    /// The records being restored now, left out of `unwanted`.
    restoring: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for Tuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuner").field("root", &self.root).field("state_dir", &self.state_dir).finish()
    }
}

impl Tuner {
    /// A tuner of the files under `root`, recording under `state_dir` (made
    /// 0700), restarting irqbalance with `systemctl` when it runs.
    pub fn new(root: PathBuf, state_dir: PathBuf) -> Result<Self, TuningError> {
        let write: WriteFile = Arc::new(|path, value| std::fs::write(path, value));
        Self::with_hooks(root, state_dir, Arc::new(systemctl_restart_irqbalance), write)
    }

    pub fn with_hooks(
        root: PathBuf,
        state_dir: PathBuf,
        restart_irqbalance: RestartIrqbalance,
        write: WriteFile,
    ) -> Result<Self, TuningError> {
        crate::fsutil::private_dir(&state_dir).map_err(io_err(&state_dir))?;
        // A record a killed agent never renamed into place was never acted on.
        crate::fsutil::remove_temporaries(&state_dir).map_err(io_err(&state_dir))?;
        Ok(Tuner {
            root,
            state_dir,
            restart_irqbalance,
            write,
            lock: Mutex::new(()),
            restoring: Mutex::new(BTreeSet::new()),
        })
    }

    fn at(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.root.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    fn record_path(&self, sandbox: &str) -> PathBuf {
        self.state_dir.join(format!("{sandbox}.json"))
    }

    /// The pods that hold a record now (by sandbox).
    pub fn recorded(&self) -> Result<Vec<String>, TuningError> {
        let rd = std::fs::read_dir(&self.state_dir).map_err(io_err(&self.state_dir))?;
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == IRQBALANCE_RECORD || name.starts_with('.') {
                continue;
            }
            if let Some(sandbox) = name.strip_suffix(".json") {
                out.push(sandbox.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// The records whose pod is not in `wanted` and that no restore holds
    /// yet; each is marked as being restored until [`Tuner::restore`] ends.
    pub fn unwanted(&self, wanted: &BTreeSet<String>) -> Vec<String> {
        let recorded = match self.recorded() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the tuning records");
                return Vec::new();
            }
        };
        let mut restoring = self.restoring.lock().unwrap_or_else(|p| p.into_inner());
        let out: Vec<String> = recorded.into_iter().filter(|s| !wanted.contains(s) && !restoring.contains(s)).collect();
        restoring.extend(out.iter().cloned());
        out
    }

    fn read_record(&self, sandbox: &str) -> Result<Option<Record>, TuningError> {
        let path = self.record_path(sandbox);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| TuningError::Record { path, reason: e.to_string() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(TuningError::Io { path, source: e }),
        }
    }

    fn write_record(&self, sandbox: &str, rec: &Record) -> Result<(), TuningError> {
        let path = self.record_path(sandbox);
        let bytes = serde_json::to_vec_pretty(rec)
            .map_err(|e| TuningError::Record { path: path.clone(), reason: e.to_string() })?;
        write_atomic(&path, &bytes).map_err(io_err(&path))
    }

    /// Applies `req` (again: every container start comes here, and only the
    /// first records a file's original value). The notes say what could not
    /// be done, for the pod's events.
    pub fn tune(&self, req: &TuneRequest) -> Result<Vec<String>, TuningError> {
        let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut notes = Vec::new();
        // A gone pod's record on these CPUs is given back first, so its
        // tuned values are never taken for this pod's originals.
        for other in self.recorded()? {
            if other == req.sandbox {
                continue;
            }
            if let Some(rec) = self.read_record(&other)? {
                if !rec.cpus.is_disjoint(&req.cpus) {
                    tracing::info!(pod = req.key, gone = rec.key, cpus = %rec.cpus, "giving back a gone pod's tuning first");
                    self.restore_locked(&other, rec)?;
                }
            }
        }
        let mut rec = self.read_record(&req.sandbox)?.unwrap_or_else(|| Record {
            key: req.key.clone(),
            cpus: req.cpus.clone(),
            ..Default::default()
        });
        let before = rec.clone();
        // Plan every write, with the value to give back.
        let mut writes: Vec<(PathBuf, String)> = Vec::new();
        let mut irq_writes: Vec<(String, PathBuf, CpuSet, String)> = Vec::new();
        let t = &req.tuning;
        if t.irq_load_balancing.is_some() {
            let quiet = req.cpus.difference(&req.housekeeping);
            for (name, rel) in self.irqs(&mut notes) {
                let path = self.at(&rel);
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                let Ok(mask) = CpuSet::parse_mask(&text) else {
                    notes.push(format!("interrupt {name}: cannot read its affinity {:?}", text.trim()));
                    continue;
                };
                let take = mask.intersection(&quiet);
                if take.is_empty() {
                    continue;
                }
                let left = mask.difference(&take);
                if left.is_empty() {
                    notes.push(format!(
                        "interrupt {name} keeps its affinity (CPUs {mask}): it allows only the pod's CPUs"
                    ));
                    continue;
                }
                rec.irqs.entry(name.clone()).or_default().union_with(&take);
                irq_writes.push((name, rel, left, text));
            }
            if !quiet.is_empty() {
                rec.irqbalance.union_with(&quiet);
            }
        }
        // Ancestors' `cpuset.cpus.exclusive`, top down: shared by every pod
        // below them, so given back as the interrupts are (a difference).
        let mut exclusive_writes: Vec<(PathBuf, CpuSet)> = Vec::new();
        for dir in &req.cgroups {
            if req.realtime {
                if let Some(why) = self.realtime_missing(&dir.join("cpu.rt_runtime_us")) {
                    notes.push(why);
                }
            }
            if t.cpu_quota == Some(Disabled::Disabled) {
                // v1 takes -1 for no quota; v2's `max` keeps the period.
                self.plan_if_exists(&mut writes, dir.join("cpu.cfs_quota_us"), "-1");
                self.plan_if_exists(&mut writes, dir.join("cpu.max"), "max");
            }
            if t.cpu_load_balancing == Some(Disabled::Disabled) {
                self.plan_if_exists(&mut writes, dir.join("cpuset.sched_load_balance"), "0");
                if self.at(dir.join("cpuset.cpus.partition")).exists() {
                    self.plan_exclusive(dir, &req.cpus, &mut rec, &mut exclusive_writes, &mut writes, &mut notes);
                }
                self.plan_if_exists(&mut writes, dir.join("cpuset.cpus.partition"), "isolated");
            }
        }
        let cpu_dir = |cpu: u32| PathBuf::from(format!("sys/devices/system/cpu/cpu{cpu}"));
        for cpu in req.cpus.iter() {
            if let Some(c) = t.cpu_c_states {
                let rel = cpu_dir(cpu).join("power/pm_qos_resume_latency_us");
                if self.at(&rel).exists() {
                    writes.push((rel, pm_qos_value(c)));
                } else {
                    notes.push(format!("cpu {cpu}: no power/pm_qos_resume_latency_us, its C-states are left alone"));
                }
            }
            if let Some(g) = &t.cpu_freq_governor {
                let rel = cpu_dir(cpu).join("cpufreq/scaling_governor");
                let avail = std::fs::read_to_string(self.at(cpu_dir(cpu).join("cpufreq/scaling_available_governors")));
                match avail {
                    Err(_) => notes.push(format!("cpu {cpu}: no cpufreq, its frequency governor is left alone")),
                    Ok(list) if !list.split_whitespace().any(|a| a == g) => notes.push(format!(
                        "cpu {cpu}: governor {g:?} is not available (scaling_available_governors: {})",
                        list.trim()
                    )),
                    Ok(_) => writes.push((rel, g.clone())),
                }
            }
        }
        for (rel, _) in &writes {
            if !rec.files.contains_key(rel) {
                match std::fs::read_to_string(self.at(rel)) {
                    Ok(v) => {
                        rec.files.insert(rel.clone(), v.trim().to_string());
                    }
                    Err(e) => notes.push(format!("{}: cannot read it: {e}", self.at(rel).display())),
                }
            }
        }
        writes.retain(|(rel, _)| rec.files.contains_key(rel));
        // Durable first: a kill -9 from here on finds what to give back.
        if rec != before {
            self.write_record(&req.sandbox, &rec)?;
        }
        for (rel, set) in &exclusive_writes {
            let path = self.at(rel);
            if let Err(e) = (self.write)(&path, &set.to_string()) {
                notes.push(format!("{}: cannot write {set}: {e}", path.display()));
            }
        }
        let mut refused: Vec<String> = Vec::new();
        for (name, rel, left, text) in irq_writes {
            let path = self.at(&rel);
            if let Err(e) = (self.write)(&path, &format_mask(&left, &text)) {
                if e.raw_os_error() == Some(EIO) {
                    notes.push(format!(
                        "interrupt {name}: the kernel refused a new affinity (EIO), it keeps {}",
                        text.trim()
                    ));
                } else {
                    notes.push(format!("interrupt {name}: {}: {e}", path.display()));
                }
                refused.push(name);
            }
        }
        for (rel, value) in &writes {
            let path = self.at(rel);
            if let Err(e) = (self.write)(&path, value) {
                notes.push(format!("{}: cannot write {value:?}: {e}", path.display()));
                continue;
            }
            if rel.ends_with("cpuset.cpus.partition") {
                // The kernel takes the word and says afterwards whether the
                // partition is valid (`isolated invalid (reason)`).
                let now = std::fs::read_to_string(&path).unwrap_or_default();
                if now.trim() != "isolated" {
                    notes.push(format!(
                        "{}: cannot make an isolated partition, load balancing stays on: {}",
                        path.display(),
                        now.trim()
                    ));
                    if let Some(orig) = rec.files.get(rel) {
                        let _ = (self.write)(&path, orig);
                    }
                }
            }
            if rel.ends_with("cpuset.sched_load_balance") {
                if let Some(on) = self.balancing_ancestor(rel) {
                    notes.push(format!(
                        "{} is 1: the kernel still balances load over its CPUs, the pod's among them",
                        on.display()
                    ));
                }
            }
        }
        if !refused.is_empty() {
            // Nothing was taken from those: nothing to give back.
            for name in &refused {
                rec.irqs.remove(name);
            }
            self.write_record(&req.sandbox, &rec)?;
        }
        if rec.irqbalance != before.irqbalance {
            self.sync_irqbalance(&mut notes)?;
        }
        Ok(notes)
    }

    /// The reason a container of a `SYS_NICE` pod has no real-time budget
    /// (the shim gives it one before the process runs, `RT_BUDGET_US`), or
    /// `None` when it has one.
    fn realtime_missing(&self, file: &Path) -> Option<String> {
        let read = |path: &Path| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
        if read(&self.at(file)).is_none_or(|v| v > 0) {
            return None;
        }
        let dir = file.parent()?;
        let parent = dir.parent()?;
        let has = read(&self.at(parent.join("cpu.rt_runtime_us"))).unwrap_or(0);
        let held: u64 = std::fs::read_dir(self.at(parent))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path() != self.at(dir))
            .filter_map(|e| read(&e.path().join("cpu.rt_runtime_us")))
            .sum();
        Some(format!(
            "no real-time budget, SCHED_FIFO and SCHED_RR fail with EPERM: {} holds {has} us, {held} of them \
             other pods', and could not be raised by {RT_BUDGET_US} us (its own parent has no more free)",
            self.at(parent).display()
        ))
    }

    /// A remote isolated partition (cgroup v2, Linux 6.7 and later): its
    /// CPUs declared exclusive on every ancestor below the root and then on
    /// the container's own cgroup, before the partition is asked for. An
    /// older kernel has no `cpuset.cpus.exclusive`: nothing is planned and
    /// the partition is refused and reported as before.
    fn plan_exclusive(
        &self,
        dir: &Path,
        pod_cpus: &CpuSet,
        rec: &mut Record,
        ancestors: &mut Vec<(PathBuf, CpuSet)>,
        writes: &mut Vec<(PathBuf, String)>,
        notes: &mut Vec<String>,
    ) {
        const FILE: &str = "cpuset.cpus.exclusive";
        if !self.at(dir.join(FILE)).exists() {
            return;
        }
        // The container's own CPUs: siblings may never declare the same
        // exclusive CPU, and each container of a pod has its own.
        let cpus = std::fs::read_to_string(self.at(dir.join("cpuset.cpus")))
            .ok()
            .and_then(|t| CpuSet::parse_list(t.trim()).ok())
            .map_or_else(|| pod_cpus.clone(), |c| c.intersection(pod_cpus));
        if cpus.is_empty() {
            return;
        }
        // The root cgroup has no such file: the walk stops below it.
        let mut chain: Vec<PathBuf> =
            dir.ancestors().skip(1).take_while(|d| self.at(d.join(FILE)).exists()).map(|d| d.join(FILE)).collect();
        chain.reverse();
        for rel in chain {
            let text = match std::fs::read_to_string(self.at(&rel)) {
                Ok(t) => t,
                Err(e) => {
                    notes.push(format!("{}: cannot read it: {e}", self.at(&rel).display()));
                    return;
                }
            };
            let Ok(now) = CpuSet::parse_list(text.trim()) else {
                notes.push(format!("{}: cannot read {:?}", self.at(&rel).display(), text.trim()));
                return;
            };
            let add = cpus.difference(&now);
            if !add.is_empty() {
                rec.exclusive.entry(rel.clone()).or_default().union_with(&add);
                ancestors.push((rel, now.union(&add)));
            }
        }
        writes.push((dir.join(FILE), cpus.to_string()));
    }

    fn plan_if_exists(&self, writes: &mut Vec<(PathBuf, String)>, dir_file: PathBuf, value: &str) {
        if self.at(&dir_file).exists() {
            writes.push((dir_file, value.to_string()));
        }
    }

    /// The nearest ancestor of a cgroup file's folder whose
    /// `cpuset.sched_load_balance` is still 1 (v1 balances a cpuset's CPUs
    /// when any cpuset above it does).
    fn balancing_ancestor(&self, rel: &Path) -> Option<PathBuf> {
        let mut dir = rel.parent()?.parent();
        while let Some(d) = dir {
            let file = self.at(d.join("cpuset.sched_load_balance"));
            match std::fs::read_to_string(&file) {
                Ok(v) if v.trim() == "1" => return Some(file),
                Ok(_) => {}
                Err(_) => return None,
            }
            dir = d.parent();
        }
        None
    }

    /// Every interrupt's affinity file: `default` first.
    fn irqs(&self, notes: &mut Vec<String>) -> Vec<(String, PathBuf)> {
        let mut out = vec![("default".to_string(), PathBuf::from("proc/irq/default_smp_affinity"))];
        let dir = self.at("proc/irq");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                notes.push(format!("{}: {e}: interrupts are left alone", dir.display()));
                return Vec::new();
            }
        };
        let mut numbered: Vec<u32> =
            rd.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())).collect();
        numbered.sort_unstable();
        out.extend(numbered.into_iter().map(|n| (n.to_string(), PathBuf::from(format!("proc/irq/{n}/smp_affinity")))));
        out
    }

    /// Gives back everything recorded for `sandbox`, then forgets the record.
    pub fn restore(&self, sandbox: &str) -> Result<(), TuningError> {
        let result = (|| {
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            match self.read_record(sandbox)? {
                Some(rec) => self.restore_locked(sandbox, rec),
                None => Ok(()),
            }
        })();
        self.restoring.lock().unwrap_or_else(|p| p.into_inner()).remove(sandbox);
        result
    }

    fn restore_locked(&self, sandbox: &str, rec: Record) -> Result<(), TuningError> {
        for (name, taken) in &rec.irqs {
            let rel = if name == "default" {
                PathBuf::from("proc/irq/default_smp_affinity")
            } else {
                PathBuf::from(format!("proc/irq/{name}/smp_affinity"))
            };
            let path = self.at(&rel);
            // An interrupt gone since (its device removed) has nothing to give back.
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let Ok(mask) = CpuSet::parse_mask(&text) else { continue };
            let back = mask.union(taken);
            if back != mask {
                if let Err(e) = (self.write)(&path, &format_mask(&back, &text)) {
                    tracing::warn!(pod = rec.key, irq = name, error = %e, "cannot give an interrupt its CPUs back");
                }
            }
        }
        for (rel, value) in &rec.files {
            let path = self.at(rel);
            match (self.write)(&path, &kernel_value(value)) {
                Ok(()) => {}
                // A container's cgroup goes with the container.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(pod = rec.key, file = %path.display(), error = %e, "cannot give a setting back")
                }
            }
        }
        // After the partition is given back (above), deepest first: a
        // parent keeps the CPUs its children still declare.
        for (rel, taken) in rec.exclusive.iter().rev() {
            let path = self.at(rel);
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let Ok(now) = CpuSet::parse_list(text.trim()) else { continue };
            let back = now.difference(taken);
            if back != now {
                if let Err(e) = (self.write)(&path, &kernel_value(&back.to_string())) {
                    tracing::warn!(pod = rec.key, file = %path.display(), error = %e, "cannot give exclusive CPUs back");
                }
            }
        }
        let path = self.record_path(sandbox);
        std::fs::remove_file(&path).map_err(io_err(&path))?;
        crate::fsutil::sync_dir(&self.state_dir).map_err(io_err(&self.state_dir))?;
        tracing::info!(pod = rec.key, cpus = %rec.cpus, "tuning given back");
        if !rec.irqbalance.is_empty() {
            let mut notes = Vec::new();
            self.sync_irqbalance(&mut notes)?;
            for n in notes {
                tracing::warn!(pod = rec.key, "{n}");
            }
        }
        Ok(())
    }

    /// Brings irqbalance's configuration in line with the records: the
    /// original plus every recorded pod's CPUs banned, or the original
    /// itself once no pod bans any; restarts irqbalance when it changed and
    /// one runs.
    pub fn sync_irqbalance(&self, notes: &mut Vec<String>) -> Result<(), TuningError> {
        let mut banned = CpuSet::new();
        for sandbox in self.recorded()? {
            if let Some(rec) = self.read_record(&sandbox)? {
                banned.union_with(&rec.irqbalance);
            }
        }
        let config = self.at(IRQBALANCE_CONFIG);
        let orig_path = self.state_dir.join(IRQBALANCE_RECORD);
        let orig: Option<IrqbalanceRecord> = match std::fs::read(&orig_path) {
            Ok(b) => Some(
                serde_json::from_slice(&b)
                    .map_err(|e| TuningError::Record { path: orig_path.clone(), reason: e.to_string() })?,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(TuningError::Io { path: orig_path, source: e }),
        };
        let current = match std::fs::read_to_string(&config) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(TuningError::Io { path: config, source: e }),
        };
        let wanted = match (&orig, banned.is_empty()) {
            (None, true) => return Ok(()),
            (Some(o), true) => o.original.clone(),
            (o, false) => {
                let base = match o {
                    Some(o) => o.original.clone(),
                    None => {
                        // Recorded before the first change.
                        let rec = IrqbalanceRecord { original: current.clone() };
                        let bytes = serde_json::to_vec(&rec)
                            .map_err(|e| TuningError::Record { path: orig_path.clone(), reason: e.to_string() })?;
                        write_atomic(&orig_path, &bytes).map_err(io_err(&orig_path))?;
                        current.clone()
                    }
                };
                Some(banned_config(base.as_deref().unwrap_or(""), &banned))
            }
        };
        if wanted != current {
            match &wanted {
                Some(text) => {
                    if let Some(dir) = config.parent() {
                        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
                    }
                    std::fs::write(&config, text).map_err(io_err(&config))?;
                }
                None => std::fs::remove_file(&config).map_err(io_err(&config))?,
            }
            if self.irqbalance_runs() {
                if let Err(e) = (self.restart_irqbalance)() {
                    notes.push(format!("irqbalance runs and could not be restarted: {e}"));
                }
            }
        }
        if banned.is_empty() {
            std::fs::remove_file(&orig_path).map_err(io_err(&orig_path))?;
        }
        Ok(())
    }

    /// Whether a process named `irqbalance` runs (under the root's `/proc`).
    fn irqbalance_runs(&self) -> bool {
        let Ok(rd) = std::fs::read_dir(self.at("proc")) else { return false };
        rd.flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .any(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "irqbalance"))
    }
}

/// An empty value as a kernel file takes it: a write of no bytes never
/// reaches the kernel's handler, so an empty `cpuset.cpus.exclusive` is
/// written as a newline.
fn kernel_value(value: &str) -> std::borrow::Cow<'_, str> {
    if value.is_empty() {
        "\n".into()
    } else {
        value.into()
    }
}

/// `pm_qos_resume_latency_us` for a `cpuCStates` value. The kernel's ABI
/// (Documentation/ABI/testing/sysfs-devices-power, and
/// `pm_qos_resume_latency_us_store`): a number N > 0 allows only idle states
/// that resume within N microseconds; `n/a` means no resume latency is
/// acceptable at all (the CPU only polls: no C-state), and 0 means no
/// constraint (read back as `0`). So `disabled` is `n/a`, as CRI-O writes
/// it, and not 0, which would allow every C-state.
pub fn pm_qos_value(c: CStates) -> String {
    match c {
        CStates::Disabled => "n/a".into(),
        CStates::MaxLatencyUs(n) => n.to_string(),
    }
}

/// `set` as a kernel hex mask, as wide as `like` (the kernel prints
/// `nr_cpu_ids` bits: comma-separated 32-bit words, the first one only as
/// wide as it needs, `3` on two CPUs, `00000000,00000003` on 64), and wider
/// when the set needs it.
pub fn format_mask(set: &CpuSet, like: &str) -> String {
    let like: Vec<&str> = like.trim().split(',').collect();
    let top = set.iter().last().map_or(0, |id| id / 32 + 1) as usize;
    let words = like.len().max(top).max(1);
    let first_width = if words == like.len() { like[0].len().clamp(1, 8) } else { 8 };
    let mut out = Vec::with_capacity(words);
    for w in (0..words).rev() {
        let mut v: u32 = 0;
        for b in 0..32u32 {
            if set.contains(w as u32 * 32 + b) {
                v |= 1 << b;
            }
        }
        let width = if w + 1 == words { first_width } else { 8 };
        out.push(format!("{v:0width$x}"));
    }
    out.join(",")
}

/// irqbalance's configuration `base` with both banned variables set to
/// what `base` banned plus `banned`.
fn banned_config(base: &str, banned: &CpuSet) -> String {
    let value = |line: &str, var: &str| {
        let rest = line.trim().strip_prefix(var)?.trim_start().strip_prefix('=')?;
        Some(rest.trim().trim_matches(['"', '\'']).to_string())
    };
    let mut all = banned.clone();
    let mut kept = Vec::new();
    for line in base.lines() {
        if let Some(v) = value(line, BANNED_CPULIST) {
            all.union_with(&CpuSet::parse_list(&v).unwrap_or_default());
        } else if let Some(v) = value(line, BANNED_CPUS) {
            all.union_with(&CpuSet::parse_mask(&v).unwrap_or_default());
        } else {
            kept.push(line);
        }
    }
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str("# Pinion: the exclusive CPUs of pods with spec.tuning.irqLoadBalancing\n");
    out.push_str(&format!("{BANNED_CPULIST}=\"{all}\"\n{BANNED_CPUS}=\"{}\"\n", format_mask(&all, "")));
    out
}

/// `systemctl try-restart irqbalance.service`: restarts it only if it runs.
fn systemctl_restart_irqbalance() -> Result<(), String> {
    let mut child = std::process::Command::new("systemctl")
        .args(["try-restart", "irqbalance.service"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("systemctl: {e}"))?;
    let deadline = Instant::now() + RESTART_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("systemctl try-restart irqbalance.service: {st}")),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("systemctl try-restart irqbalance.service: no answer in {RESTART_TIMEOUT:?}"));
            }
            Err(e) => return Err(format!("systemctl: {e}")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;
    use specs::topology::Cpu;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fake node: four CPUs (two cores of two), five interrupts, cpufreq,
    /// PM QoS, a container's v1 cgroups, irqbalance running.
    struct Node {
        dir: tempfile::TempDir,
        restarts: Arc<AtomicUsize>,
    }

    const FILES: &[(&str, &str)] = &[
        ("proc/irq/default_smp_affinity", "f\n"),
        ("proc/irq/1/smp_affinity", "0000000f\n"),
        // Only CPU 2: it would be left with none.
        ("proc/irq/2/smp_affinity", "00000004\n"),
        // The kernel refuses to move it (the write hook answers EIO).
        ("proc/irq/3/smp_affinity", "0000000e\n"),
        ("proc/irq/4/smp_affinity", "00000003\n"),
        ("proc/4242/comm", "irqbalance\n"),
        ("etc/default/irqbalance", "# irqbalance\nIRQBALANCE_ONESHOT=\n"),
        ("sys/fs/cgroup/cpu/pinion/c1/cpu.cfs_quota_us", "100000\n"),
        ("sys/fs/cgroup/cpuset/cpuset.sched_load_balance", "1\n"),
        ("sys/fs/cgroup/cpuset/pinion/cpuset.sched_load_balance", "1\n"),
        ("sys/fs/cgroup/cpuset/pinion/c1/cpuset.sched_load_balance", "1\n"),
    ];

    impl Node {
        fn new() -> Node {
            let dir = tempfile::tempdir().unwrap();
            let mut files: Vec<(String, String)> = FILES.iter().map(|(p, v)| (p.to_string(), v.to_string())).collect();
            for cpu in 0..4 {
                let d = format!("sys/devices/system/cpu/cpu{cpu}");
                files.push((format!("{d}/power/pm_qos_resume_latency_us"), "0\n".into()));
                files.push((format!("{d}/cpufreq/scaling_governor"), "powersave\n".into()));
                files.push((format!("{d}/cpufreq/scaling_available_governors"), "performance powersave\n".into()));
            }
            for (p, v) in files {
                let path = dir.path().join("root").join(p);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, v).unwrap();
            }
            Node { dir, restarts: Arc::new(AtomicUsize::new(0)) }
        }

        fn root(&self) -> PathBuf {
            self.dir.path().join("root")
        }

        /// A tuner as an agent (re)started on this node has.
        fn tuner(&self) -> Tuner {
            self.tuner_writing(Arc::new(|path: &Path, value: &str| {
                if path.ends_with("irq/3/smp_affinity") {
                    return Err(io::Error::from_raw_os_error(EIO));
                }
                // As a kernel file: a write of no bytes changes nothing.
                if value.is_empty() {
                    return Ok(());
                }
                std::fs::write(path, value)
            }))
        }

        fn tuner_writing(&self, write: WriteFile) -> Tuner {
            let restarts = self.restarts.clone();
            let restart: RestartIrqbalance = Arc::new(move || {
                restarts.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            Tuner::with_hooks(self.root(), self.dir.path().join("state"), restart, write).unwrap()
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.root().join(rel)).unwrap().trim().to_string()
        }

        /// Every file of the fake root and its content.
        fn snapshot(&self) -> BTreeMap<String, String> {
            fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
                for e in std::fs::read_dir(dir).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        walk(&p, base, out);
                    } else {
                        let rel = p.strip_prefix(base).unwrap().display().to_string();
                        out.insert(rel, std::fs::read_to_string(&p).unwrap().trim().to_string());
                    }
                }
            }
            let mut out = BTreeMap::new();
            walk(&self.root(), &self.root(), &mut out);
            out
        }
    }

    fn topology() -> NodeTopology {
        let cpus = (0..4)
            .map(|id| Cpu { id, core: id / 2, socket: 0, die: None, numa: Some(0), uncore_cache: None })
            .collect();
        NodeTopology { cpus, ..Default::default() }
    }

    fn every_setting(irq: IrqLoadBalancing, c_states: CStates) -> Tuning {
        Tuning {
            irq_load_balancing: Some(irq),
            cpu_quota: Some(Disabled::Disabled),
            cpu_load_balancing: Some(Disabled::Disabled),
            cpu_c_states: Some(c_states),
            cpu_freq_governor: Some("performance".into()),
        }
    }

    fn request(sandbox: &str, cpus: &str, tuning: Tuning, cgroups: &[&str]) -> TuneRequest {
        let cpus = CpuSet::parse_list(cpus).unwrap();
        let mut r =
            TuneRequest::new(sandbox.into(), format!("default/{sandbox}"), cpus, &tuning, false, &topology()).unwrap();
        r.cgroups = cgroups.iter().map(PathBuf::from).collect();
        r
    }

    const CGROUPS: &[&str] = &["/sys/fs/cgroup/cpu/pinion/c1", "/sys/fs/cgroup/cpuset/pinion/c1"];

    #[test]
    fn every_setting_is_written_and_given_back() {
        let node = Node::new();
        let before = node.snapshot();
        let tuner = node.tuner();
        let req = request("a", "2-3", every_setting(IrqLoadBalancing::Disabled, CStates::Disabled), CGROUPS);
        let notes = tuner.tune(&req).unwrap();
        let want: &[(&str, &str)] = &[
            ("proc/irq/default_smp_affinity", "3"),
            ("proc/irq/1/smp_affinity", "00000003"),
            ("proc/irq/2/smp_affinity", "00000004"),
            ("proc/irq/3/smp_affinity", "0000000e"),
            ("proc/irq/4/smp_affinity", "00000003"),
            ("sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us", "0"),
            ("sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us", "n/a"),
            ("sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us", "n/a"),
            ("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave"),
            ("sys/devices/system/cpu/cpu2/cpufreq/scaling_governor", "performance"),
            ("sys/devices/system/cpu/cpu3/cpufreq/scaling_governor", "performance"),
            ("sys/fs/cgroup/cpu/pinion/c1/cpu.cfs_quota_us", "-1"),
            ("sys/fs/cgroup/cpuset/pinion/c1/cpuset.sched_load_balance", "0"),
            (
                "etc/default/irqbalance",
                "# irqbalance\nIRQBALANCE_ONESHOT=\n# Pinion: the exclusive CPUs of pods with \
                 spec.tuning.irqLoadBalancing\nIRQBALANCE_BANNED_CPULIST=\"2-3\"\nIRQBALANCE_BANNED_CPUS=\"c\"",
            ),
        ];
        for (file, value) in want {
            assert_eq!(node.read(file), *value, "{file}");
        }
        assert_eq!(
            notes,
            [
                "interrupt 2 keeps its affinity (CPUs 2): it allows only the pod's CPUs",
                "interrupt 3: the kernel refused a new affinity (EIO), it keeps 0000000e",
                &format!(
                    "{} is 1: the kernel still balances load over its CPUs, the pod's among them",
                    node.root().join("sys/fs/cgroup/cpuset/pinion/cpuset.sched_load_balance").display()
                ),
            ]
        );
        assert_eq!(node.restarts.load(Ordering::SeqCst), 1, "irqbalance runs: restarted once");
        // The record: private, and what it holds.
        let record = node.dir.path().join("state/a.json");
        assert_eq!(std::fs::metadata(&record).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(node.dir.path().join("state")).unwrap().permissions().mode() & 0o777, 0o700);
        let rec: Record = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        let irqs: Vec<(&str, String)> = rec.irqs.iter().map(|(k, v)| (k.as_str(), v.to_string())).collect();
        assert_eq!(irqs, [("1", "2-3".to_string()), ("default", "2-3".to_string())], "no EIO or kept one");
        assert_eq!(
            rec.files.get(Path::new("sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us")).unwrap(),
            "0"
        );

        // A second container (or a restart): nothing recorded twice, the
        // originals stay the first ones.
        assert_eq!(tuner.tune(&req).unwrap().len(), 3);
        let again: Record = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(again, rec);
        assert_eq!(node.restarts.load(Ordering::SeqCst), 1, "irqbalance's file did not change");

        // The pod ends.
        assert_eq!(tuner.unwanted(&BTreeSet::from(["a".to_string()])), Vec::<String>::new());
        assert_eq!(tuner.unwanted(&BTreeSet::new()), ["a"]);
        assert_eq!(tuner.unwanted(&BTreeSet::new()), Vec::<String>::new(), "being restored");
        tuner.restore("a").unwrap();
        assert_eq!(node.snapshot(), before);
        assert_eq!(tuner.recorded().unwrap(), Vec::<String>::new());
        assert!(!node.dir.path().join("state").join(IRQBALANCE_RECORD).exists());
        assert_eq!(node.restarts.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn two_pods_give_back_only_their_own_cpus() {
        let node = Node::new();
        let before = node.snapshot();
        let tuner = node.tuner();
        let irq = |c| Tuning {
            irq_load_balancing: Some(IrqLoadBalancing::Disabled),
            cpu_c_states: Some(c),
            ..Default::default()
        };
        tuner.tune(&request("a", "2", irq(CStates::Disabled), &[])).unwrap();
        tuner.tune(&request("b", "3", irq(CStates::MaxLatencyUs(10)), &[])).unwrap();
        let check = |want: &[(&str, &str)]| {
            for (file, value) in want {
                assert_eq!(node.read(file), *value, "{file}");
            }
        };
        let banned = |list: &str| {
            let text = node.read(IRQBALANCE_CONFIG);
            assert!(text.contains(&format!("IRQBALANCE_BANNED_CPULIST=\"{list}\"")), "{text}");
        };
        check(&[
            ("proc/irq/1/smp_affinity", "00000003"),
            ("proc/irq/default_smp_affinity", "3"),
            ("sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us", "n/a"),
            ("sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us", "10"),
        ]);
        banned("2-3");
        tuner.restore("a").unwrap();
        // CPU 2 is back in the masks; CPU 3 is still b's.
        check(&[
            ("proc/irq/1/smp_affinity", "00000007"),
            ("proc/irq/default_smp_affinity", "7"),
            ("sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us", "0"),
            ("sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us", "10"),
        ]);
        banned("3");
        tuner.restore("b").unwrap();
        assert_eq!(node.snapshot(), before);
    }

    #[test]
    fn a_gone_pods_settings_never_become_the_next_pods_originals() {
        let node = Node::new();
        let before = node.snapshot();
        let tuner = node.tuner();
        let c_states = |c| Tuning { cpu_c_states: Some(c), ..Default::default() };
        tuner.tune(&request("a", "2", c_states(CStates::Disabled), &[])).unwrap();
        // a is gone but not given back yet; b gets CPU 2.
        tuner.tune(&request("b", "2-3", c_states(CStates::MaxLatencyUs(5)), &[])).unwrap();
        assert_eq!(tuner.recorded().unwrap(), ["b"]);
        assert_eq!(node.read("sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us"), "5");
        tuner.restore("b").unwrap();
        assert_eq!(node.snapshot(), before);
    }

    #[test]
    fn a_restarted_agent_gives_back_what_a_killed_one_left() {
        let every = every_setting(IrqLoadBalancing::Disabled, CStates::MaxLatencyUs(20));
        // Killed after applying: the record is there, the settings too.
        let node = Node::new();
        let before = node.snapshot();
        node.tuner().tune(&request("a", "2-3", every.clone(), CGROUPS)).unwrap();
        assert_ne!(node.snapshot(), before);
        let restarted = node.tuner();
        let gone = restarted.unwanted(&BTreeSet::new());
        assert_eq!(gone, ["a"]);
        restarted.restore("a").unwrap();
        assert_eq!(node.snapshot(), before);

        // Killed while writing a record: its temporary goes at the next start.
        let node = Node::new();
        let tmp = node.dir.path().join("state/.a.json.tmp");
        node.tuner();
        std::fs::write(&tmp, b"{").unwrap();
        let restarted = node.tuner();
        assert!(!tmp.exists());
        assert_eq!(restarted.recorded().unwrap(), Vec::<String>::new());

        // Killed after the record, before any write (every write is lost):
        // giving back what was never applied changes nothing.
        let node = Node::new();
        let before = node.snapshot();
        let lost: WriteFile = Arc::new(|_: &Path, _: &str| Err(io::Error::from_raw_os_error(EIO)));
        node.tuner_writing(lost).tune(&request("a", "2-3", every, CGROUPS)).unwrap();
        let restarted = node.tuner();
        for sandbox in restarted.unwanted(&BTreeSet::new()) {
            restarted.restore(&sandbox).unwrap();
        }
        assert_eq!(node.snapshot(), before);
        // A pod the restarted agent adopted keeps its settings.
        let node = Node::new();
        node.tuner()
            .tune(&request("a", "2", Tuning { cpu_quota: Some(Disabled::Disabled), ..Default::default() }, CGROUPS))
            .unwrap();
        assert_eq!(node.tuner().unwanted(&BTreeSet::from(["a".to_string()])), Vec::<String>::new());
        assert_eq!(node.read("sys/fs/cgroup/cpu/pinion/c1/cpu.cfs_quota_us"), "-1");
    }

    /// Two pods' containers on cgroup v2 of Linux 6.7 or later: each an
    /// isolated partition whose CPUs every ancestor below the root declares
    /// exclusive; each pod gives back only its own, a restarted agent too.
    #[test]
    fn v2_partitions_declare_their_cpus_on_every_ancestor_and_give_them_back() {
        let node = Node::new();
        let mut files: Vec<(String, &str)> = vec![
            ("sys/fs/cgroup/cpuset.cpus.effective".into(), "0-3\n"),
            ("sys/fs/cgroup/pinion/cpuset.cpus.exclusive".into(), "\n"),
            ("sys/fs/cgroup/pinion/cpuset.cpus".into(), "\n"),
        ];
        for (c, cpu) in [("c1", "2\n"), ("c2", "3\n")] {
            for (f, v) in [
                ("cpuset.cpus", cpu),
                ("cpuset.cpus.exclusive", "\n"),
                ("cpuset.cpus.partition", "member\n"),
                ("cpu.max", "max 100000\n"),
            ] {
                files.push((format!("sys/fs/cgroup/pinion/{c}/{f}"), v));
            }
        }
        for (rel, v) in files {
            let path = node.root().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, v).unwrap();
        }
        let before = node.snapshot();
        let balance = Tuning { cpu_load_balancing: Some(Disabled::Disabled), ..Default::default() };
        let tuner = node.tuner();
        let notes = tuner.tune(&request("a", "2", balance.clone(), &["/sys/fs/cgroup/pinion/c1"])).unwrap();
        assert_eq!(notes, Vec::<String>::new());
        tuner.tune(&request("b", "3", balance.clone(), &["/sys/fs/cgroup/pinion/c2"])).unwrap();
        let check = |want: &[(&str, &str)]| {
            for (file, value) in want {
                assert_eq!(node.read(file), *value, "{file}");
            }
        };
        check(&[
            ("sys/fs/cgroup/pinion/cpuset.cpus.exclusive", "2-3"),
            ("sys/fs/cgroup/pinion/c1/cpuset.cpus.exclusive", "2"),
            ("sys/fs/cgroup/pinion/c1/cpuset.cpus.partition", "isolated"),
            ("sys/fs/cgroup/pinion/c2/cpuset.cpus.exclusive", "3"),
            ("sys/fs/cgroup/pinion/c2/cpuset.cpus.partition", "isolated"),
        ]);
        assert!(!node.root().join("sys/fs/cgroup/cpuset.cpus.exclusive").exists(), "the root has none");
        // Again (a second start): nothing declared twice.
        tuner.tune(&request("a", "2", balance, &["/sys/fs/cgroup/pinion/c1"])).unwrap();
        check(&[("sys/fs/cgroup/pinion/cpuset.cpus.exclusive", "2-3")]);
        tuner.restore("a").unwrap();
        check(&[
            ("sys/fs/cgroup/pinion/cpuset.cpus.exclusive", "3"),
            ("sys/fs/cgroup/pinion/c1/cpuset.cpus.exclusive", ""),
            ("sys/fs/cgroup/pinion/c1/cpuset.cpus.partition", "member"),
            ("sys/fs/cgroup/pinion/c2/cpuset.cpus.partition", "isolated"),
        ]);
        // Killed with b tuned: a restarted agent gives b's back.
        drop(tuner);
        let restarted = node.tuner();
        assert_eq!(restarted.unwanted(&BTreeSet::new()), ["b"]);
        restarted.restore("b").unwrap();
        assert_eq!(node.snapshot(), before);
    }

    #[test]
    fn a_missing_governor_or_file_is_reported_and_left_alone() {
        let node = Node::new();
        std::fs::remove_dir_all(node.root().join("sys/devices/system/cpu/cpu3/cpufreq")).unwrap();
        std::fs::remove_dir_all(node.root().join("sys/devices/system/cpu/cpu3/power")).unwrap();
        let tuning = |g: &str| Tuning {
            cpu_freq_governor: Some(g.into()),
            cpu_c_states: Some(CStates::Disabled),
            ..Default::default()
        };
        let notes = node.tuner().tune(&request("a", "2-3", tuning("ondemand"), &[])).unwrap();
        assert_eq!(
            notes,
            [
                "cpu 2: governor \"ondemand\" is not available (scaling_available_governors: performance powersave)",
                "cpu 3: no power/pm_qos_resume_latency_us, its C-states are left alone",
                "cpu 3: no cpufreq, its frequency governor is left alone",
            ]
        );
        assert_eq!(node.read("sys/devices/system/cpu/cpu2/cpufreq/scaling_governor"), "powersave");
        assert_eq!(node.read("sys/devices/system/cpu/cpu2/power/pm_qos_resume_latency_us"), "n/a");
    }

    #[test]
    fn a_sys_nice_container_without_a_real_time_budget_is_reported() {
        let node = Node::new();
        let cpu = node.root().join("sys/fs/cgroup/cpu");
        for (dir, v) in [("pinion", "100000"), ("pinion/c0", "100000"), ("pinion/c1", "0")] {
            std::fs::create_dir_all(cpu.join(dir)).unwrap();
            std::fs::write(cpu.join(dir).join("cpu.rt_runtime_us"), format!("{v}\n")).unwrap();
        }
        let cpus = CpuSet::parse_list("2").unwrap();
        let mut req =
            TuneRequest::new("a".into(), "default/a".into(), cpus, &Tuning::default(), true, &topology()).unwrap();
        req.cgroups = CGROUPS.iter().map(PathBuf::from).collect();
        let notes = node.tuner().tune(&req).unwrap();
        let parent = node.root().join("sys/fs/cgroup/cpu/pinion");
        assert_eq!(
            notes,
            [format!(
                "no real-time budget, SCHED_FIFO and SCHED_RR fail with EPERM: {} holds 100000 us, 100000 of them \
                 other pods', and could not be raised by 100000 us (its own parent has no more free)",
                parent.display()
            )]
        );
        // With its budget: nothing to say.
        std::fs::write(cpu.join("pinion/c1/cpu.rt_runtime_us"), "100000\n").unwrap();
        assert_eq!(node.tuner().tune(&req).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn housekeeping_keeps_the_first_core() {
        // Cores: {0,1}, {2,3}.
        let cases: &[(&str, &str)] = &[("2-3", "2-3"), ("1-3", "1"), ("0-3", "0-1"), ("3", "3"), ("", "")];
        for (cpus, want) in cases {
            let got = housekeeping_cpus(&topology(), &CpuSet::parse_list(cpus).unwrap());
            assert_eq!(got.to_string(), *want, "{cpus}");
        }
        // With housekeeping on CPUs 1-3 only 2-3 leave the masks.
        let node = Node::new();
        let irq = Tuning { irq_load_balancing: Some(IrqLoadBalancing::Housekeeping), ..Default::default() };
        node.tuner().tune(&request("a", "1-3", irq, &[])).unwrap();
        assert_eq!(node.read("proc/irq/1/smp_affinity"), "00000003");
    }

    #[test]
    fn values_as_the_kernel_reads_them() {
        assert_eq!(pm_qos_value(CStates::Disabled), "n/a");
        assert_eq!(pm_qos_value(CStates::MaxLatencyUs(7)), "7");
        let cases: &[(&str, &str, &str)] = &[
            ("0-1", "f", "3"),
            ("0-1", "0000000f", "00000003"),
            ("0-1", "00000000,0000000f", "00000000,00000003"),
            ("33", "f", "00000002,00000000"),
            ("", "ff", "00"),
            ("0-7", "", "ff"),
        ];
        for (set, like, want) in cases {
            assert_eq!(format_mask(&CpuSet::parse_list(set).unwrap(), like), *want, "{set} like {like}");
        }
    }
}
