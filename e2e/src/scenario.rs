//! The scenario runner: a scenario is a YAML file under `e2e/scenarios/` that
//! names the nodes, the pods to submit in order, and what must hold afterwards.
//! [`run`] starts a fresh cluster from the real `pinion` binary (`pinion
//! server` and one `pinion agent` per node, each reaching the server through a
//! [`Relay`] the scenario can cut), drives it with the CLI, and returns every
//! expectation that failed with what it saw. Everything the processes printed,
//! and every CLI call with its output, stays under the output directory.
//!
//! The file format, by example (every key is checked: a typo is an error):
//!
//! ```yaml
//! description: A 20-CPU pod lands on the node where one NUMA node holds it.
//! server: {topologyBlind: false, heartbeatGrace: 40}
//! requires: [root, twoCpus]          # else skipped (failed under CI=true)
//! nodes:
//! - name: b
//!   synthetic: "pack:2 numa:1 core:20 pu:1"   # or sysfs: FIXTURE, or host: true
//!   runtime: hollow                           # or libcontainer
//!   reservedCpus: "0"
//!   policy: single-numa-node
//!   scope: container
//!   cpuManagerOptions: [full-pcpus-only=true]
//!   devices: {example.com/nic: [{address: "0000:81:00.0"}]}
//!   labels: {zone: edge}
//!   startLater: true                          # started by a `startNode` step
//!   onSettingsChange: keep                    # or restart
//! steps:
//! - apply:
//!   - {name: p20, cpu: 20, memory: 1Gi}       # shorthand, or a full manifest
//! - expect:
//!   - {pod: p20, phase: Running, onNode: b, numaAffinity: [1], cpuCount: 20}
//! - hold: {seconds: 2, expect: [{pod: p30, phase: Pending}]}
//! - delete: [p20]
//! - repeat: {times: 50, steps: [...]}
//! - expectAttempts: {totalAtLeast: 60, totalAtMost: 150}  # over pods seen Running
//! - expectQueue: {pods: [q1, q2, q3], jobSeconds: 1, maxGapSeconds: 0.4}
//! - killServer / restartServer / killNode: b / restartNode: b / cutNode: b / restoreNode: b / startNode: b
//! - faultNode: {node: b, fault: after-checkpoint}   # agent restarted with PINION_FAULT
//! - reconfigureNode: {node: b, reservedCpus: "0-1", onSettingsChange: restart}  # restarted with these
//! - recordProcesses: [p20]                    # then `sameProcesses: true` in an expectation
//! - awaitNodeKilled: b / expectNodeClean: b
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pinion_wire::testing::{has_two_cpus, is_root, on_path, under_ci, Relay};
use serde::Deserialize;
use serde_json::Value;

use crate::process::Proc;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    pub description: String,
    #[serde(default)]
    pub server: ServerDef,
    #[serde(default)]
    pub requires: Vec<Requirement>,
    pub nodes: Vec<NodeDef>,
    pub steps: Vec<Step>,
}

/// Where the scenario's server keeps the cluster's state: sled in its data
/// dir, or a one-member etcd on loopback that outlives the server's kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StoreKind {
    #[default]
    Sled,
    Etcd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Requirement {
    Root,
    TwoCpus,
    /// OpenMPI (`mpicc`, `mpirun`: Debian's openmpi-bin and libopenmpi-dev).
    Mpi,
}

/// A command a step runs on the host (`sh -c`), as a user of the cluster:
/// `$PINION` is the binary, `$PINION_CONFIG` the admin credentials,
/// `$SCENARIO_DIR` the scenario's scratch folder (it holds no server or node
/// state of its own), `$REPO` the repository.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Shell {
    pub run: String,
    /// The exit status it must end with [default 0].
    #[serde(default)]
    pub exit: i32,
    /// Its stdout and stderr together hold each of these.
    #[serde(default)]
    pub output_contains: Vec<String>,
    /// Seconds it may take before it is killed and fails [default 60].
    pub within: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerDef {
    #[serde(default)]
    pub topology_blind: bool,
    pub heartbeat_grace: Option<u64>,
    pub scheduling_strategy: Option<String>,
    #[serde(default)]
    pub store: StoreKind,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeDef {
    pub name: String,
    pub synthetic: Option<String>,
    /// A fixture under `e2e/fixtures/sysfs/` (the name without `.tar.gz`).
    pub sysfs: Option<String>,
    /// This host's own /sys.
    #[serde(default)]
    pub host: bool,
    #[serde(default = "hollow")]
    pub runtime: String,
    pub reserved_cpus: Option<String>,
    pub policy: Option<String>,
    pub scope: Option<String>,
    #[serde(default)]
    pub cpu_manager_options: Vec<String>,
    pub devices: Option<Value>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub start_later: bool,
    /// `--on-settings-change`: what a restart does with a pod the settings no longer allow.
    pub on_settings_change: Option<String>,
}

fn hollow() -> String {
    "hollow".into()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum Step {
    Apply(Vec<Value>),
    Delete(Vec<String>),
    Expect(Vec<Expectation>),
    /// After `seconds`, every expectation must hold (for "stays Pending").
    Hold {
        seconds: f64,
        expect: Vec<Expectation>,
    },
    Sleep(f64),
    /// Bounds on the scheduling attempts of every pod seen Running so far.
    ExpectAttempts {
        total_at_least: Option<u32>,
        total_at_most: Option<u32>,
    },
    Repeat {
        times: u32,
        steps: Vec<Step>,
    },
    KillServer,
    RestartServer,
    KillNode(String),
    RestartNode(String),
    StartNode(String),
    CutNode(String),
    RestoreNode(String),
    /// Restarts a node's agent (kill -9 first) with `PINION_FAULT=<fault>`
    /// (see `nodelet::fault`): it kills itself with SIGKILL at that point of
    /// the next pod start or stop.
    FaultNode {
        node: String,
        fault: String,
    },
    /// Restarts a node's agent (kill -9 first) with these settings changed
    /// (kept for later restarts); the others stay as they were.
    ReconfigureNode {
        node: String,
        reserved_cpus: Option<String>,
        policy: Option<String>,
        scope: Option<String>,
        cpu_manager_options: Option<Vec<String>>,
        on_settings_change: Option<String>,
    },
    /// Notes the processes of each pod's containers (real containers), for
    /// `sameProcesses` expectations later.
    RecordProcesses(Vec<String>),
    /// The node's agent died by SIGKILL (its fault fired), within 30 s.
    AwaitNodeKilled(String),
    /// Nothing leaked on the node, within 30 s: its runtime holds exactly the
    /// containers its checkpoint names (no second container of a pod, none
    /// orphaned), and with real containers no cgroup directory, process
    /// (container or shim) or mount is left of a container it does not hold.
    ExpectNodeClean(String),
    /// A queue drains as an event-driven system drains it: `pods` (already
    /// applied, in submission order, each running about `jobSeconds` and
    /// needing the capacity the previous one frees) are first seen running in
    /// that order; the median gap between one's end and the next one's start
    /// is at most `maxGapSeconds`, and no gap is longer than that plus one job.
    /// A polling interval or a backoff on the path breaks the bound.
    ExpectQueue {
        pods: Vec<String>,
        job_seconds: f64,
        max_gap_seconds: f64,
    },
    Shell(Shell),
}

/// What must hold about one pod (`pod:`) or one node (`node:` without `pod:`).
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expectation {
    pub pod: Option<String>,
    pub node: Option<String>,
    /// The container the CPU fields are about [default: the first].
    pub container: Option<String>,
    #[serde(default)]
    pub absent: bool,
    pub phase: Option<String>,
    pub on_node: Option<String>,
    pub numa_affinity: Option<Vec<u32>>,
    pub cpus: Option<String>,
    pub cpus_one_of: Option<Vec<String>>,
    pub cpus_within: Option<String>,
    pub cpus_disjoint_from: Option<String>,
    pub cpu_count: Option<u32>,
    pub mems: Option<Vec<u32>>,
    pub cpu_policy: Option<String>,
    pub devices: Option<Vec<String>>,
    pub reason: Option<String>,
    pub message_contains: Option<Vec<String>>,
    pub attempts_at_most: Option<u32>,
    pub attempts_at_least: Option<u32>,
    pub restart_count: Option<u32>,
    pub describe_contains: Option<Vec<String>>,
    /// `pinion logs POD` (through the server and the node's endpoint) contains these.
    pub logs_contain: Option<Vec<String>>,
    pub condition: Option<String>,
    /// A node's `spec.settings.reservedCpus` (what the scheduler counts with).
    pub reserved_cpus: Option<String>,
    /// The pod's containers run the very processes `recordProcesses` noted.
    #[serde(default)]
    pub same_processes: bool,
    /// Seconds to wait for this to hold [default 30].
    pub within: Option<f64>,
}

/// The pod shorthand: one container `main` unless `containers` is given.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodShort {
    name: String,
    #[serde(flatten)]
    main: ContainerShort,
    containers: Option<Vec<ContainerShort>>,
    policy: Option<String>,
    scope: Option<String>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    restart_policy: Option<String>,
    scheduling_strategy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ContainerShort {
    name: Option<String>,
    /// Request and limit (Guaranteed when memory is given too).
    cpu: Option<String>,
    memory: Option<String>,
    /// Request only (Burstable).
    cpu_request: Option<String>,
    memory_request: Option<String>,
    hugepages2_mi: Option<String>,
    #[serde(default)]
    devices: BTreeMap<String, u32>,
    cpu_policy: Option<String>,
    command: Option<Vec<String>>,
}

fn container_json(c: &ContainerShort, default_name: &str) -> Value {
    let mut requests = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    for (k, v) in [("cpu", &c.cpu), ("memory", &c.memory), ("hugepages-2Mi", &c.hugepages2_mi)] {
        if let Some(v) = v {
            requests.insert(k.into(), v.clone().into());
            limits.insert(k.into(), v.clone().into());
        }
    }
    for (k, v) in [("cpu", &c.cpu_request), ("memory", &c.memory_request)] {
        if let Some(v) = v {
            requests.insert(k.into(), v.clone().into());
        }
    }
    for (k, n) in &c.devices {
        requests.insert(k.clone(), n.to_string().into());
        limits.insert(k.clone(), n.to_string().into());
    }
    let mut ctr = serde_json::json!({
        "name": c.name.clone().unwrap_or_else(|| default_name.to_string()),
        "rootfs": "host",
        "command": c.command.clone().unwrap_or_else(|| vec!["sleep".into(), "inf".into()]),
        "resources": {"requests": requests, "limits": limits},
    });
    if let Some(p) = &c.cpu_policy {
        ctr["cpuPolicy"] = p.clone().into();
    }
    ctr
}

/// A manifest from the shorthand, or the full manifest as written.
fn manifest(json: &Value) -> anyhow::Result<(String, Value)> {
    let json = json.clone();
    if json.get("apiVersion").is_some() {
        let name = json["metadata"]["name"].as_str().context("a manifest without metadata.name")?.to_string();
        return Ok((name, json));
    }
    let p: PodShort = serde_json::from_value(json).context("pod shorthand")?;
    let containers: Vec<Value> = match &p.containers {
        Some(cs) => cs.iter().enumerate().map(|(i, c)| container_json(c, &format!("c{i}"))).collect(),
        None => vec![container_json(&p.main, "main")],
    };
    let mut spec = serde_json::json!({"containers": containers, "terminationGracePeriodSeconds": 1});
    if p.policy.is_some() || p.scope.is_some() {
        spec["topology"] = serde_json::json!({"policy": p.policy, "scope": p.scope});
    }
    if !p.node_selector.is_empty() {
        spec["nodeSelector"] = serde_json::to_value(&p.node_selector)?;
    }
    if let Some(r) = &p.restart_policy {
        spec["restartPolicy"] = r.clone().into();
    }
    if let Some(s) = &p.scheduling_strategy {
        spec["schedulingStrategy"] = s.clone().into();
    }
    let pod = serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Pod",
        "metadata": {"name": p.name, "labels": p.labels, "annotations": p.annotations},
        "spec": spec,
    });
    Ok((p.name, pod))
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Each failed expectation: where, what was expected, what was seen.
    pub failures: Vec<String>,
    /// (pod, attempts) for every pod seen Running by an expectation.
    pub attempts: Vec<(String, u32)>,
    pub skipped: Option<String>,
    pub out_dir: PathBuf,
}

impl Outcome {
    pub fn attempts_summary(&self) -> String {
        if self.attempts.is_empty() {
            return "no pod seen running".into();
        }
        let total: u32 = self.attempts.iter().map(|a| a.1).sum();
        let max = self.attempts.iter().map(|a| a.1).max().unwrap_or(0);
        format!(
            "{} pods placed with {total} scheduling attempts in all (mean {:.2}, max {max})",
            self.attempts.len(),
            f64::from(total) / self.attempts.len() as f64
        )
    }
}

pub fn load(path: &Path) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // Through a JSON value: serde_yaml wants enum variants as `!tags`, and a
    // step reads better as a one-key map (`- apply: [...]`).
    let v: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("{}: not YAML", path.display()))?;
    serde_path_to_error::deserialize(v).map_err(|e| anyhow::anyhow!("{}: {}: {}", path.display(), e.path(), e.inner()))
}

/// The daemons log at info level: their output is kept for reading.
const DAEMON_LOG: &str = "info,libcgroups=error,libcontainer=error";

struct NodeRun {
    def: NodeDef,
    relay: Relay,
    proc: Option<Proc>,
}

struct Cluster {
    pinion: PathBuf,
    dir: PathBuf,
    out: PathBuf,
    /// The folder of sysfs fixture tarballs.
    fixtures: PathBuf,
    server_def_flags: Vec<String>,
    server: Option<Proc>,
    server_addr: SocketAddr,
    nodes: BTreeMap<String, NodeRun>,
    commands: std::fs::File,
    restarts: u32,
    /// `status.attempts` of the pod the last passing check read.
    last_attempts: u32,
    /// Every pod name applied: a container id (and its cgroup) starts with
    /// `NAME_`, which tells this scenario's leftovers from other tests'.
    applied: std::collections::BTreeSet<String>,
    /// Pod -> the processes `recordProcesses` noted.
    processes: BTreeMap<String, std::collections::BTreeSet<u32>>,
    /// The etcd the server runs on (`StoreKind::Etcd`), held for its Drop,
    /// which comes after the server's (fields drop in order).
    _etcd: Option<orchestrator::testing::etcd::EtcdCluster>,
}

/// Runs the scenario at `path` with the `pinion` binary; `out_dir` is emptied
/// first and keeps every process's output and the CLI transcript.
pub fn run(path: &Path, pinion: &Path, fixtures: &Path, out_dir: &Path) -> anyhow::Result<Outcome> {
    run_on(path, pinion, fixtures, out_dir, None)
}

/// `run`, with the server's store chosen here (`None`: the scenario's own).
pub fn run_on(
    path: &Path,
    pinion: &Path,
    fixtures: &Path,
    out_dir: &Path,
    store: Option<StoreKind>,
) -> anyhow::Result<Outcome> {
    let mut scenario = load(path)?;
    if let Some(store) = store {
        scenario.server.store = store;
    }
    let mut outcome = Outcome { out_dir: out_dir.to_path_buf(), ..Outcome::default() };
    for r in &scenario.requires {
        let missing = match r {
            Requirement::Root => !is_root(),
            Requirement::TwoCpus => !has_two_cpus(),
            Requirement::Mpi => !["mpicc", "mpirun"].iter().all(|p| on_path(p)),
        };
        // Not `requires`: the runner reports a skip in its outcome and a
        // failure as its error, naming the scenario file.
        if missing {
            let why = format!("needs {r:?}");
            if under_ci() {
                bail!("{}: {why}, and CI=true", path.display());
            }
            outcome.skipped = Some(why);
            return Ok(outcome);
        }
    }
    if scenario.server.store == StoreKind::Etcd && !orchestrator::testing::etcd::available(&path.display().to_string())
    {
        outcome.skipped = Some("needs etcd".into());
        return Ok(outcome);
    }
    let _ = std::fs::remove_dir_all(out_dir);
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let tmp = tempfile::Builder::new().prefix("pinion-scenario-").tempdir()?;
    // What the host holds before: a scenario with real containers (one at
    // a time on a host) must leave no more.
    let real = scenario.nodes.iter().any(|n| n.runtime == "libcontainer");
    let before = real.then(HostState::now);
    let mut cluster = Cluster::start(&scenario, pinion, fixtures, tmp.path(), out_dir)?;
    let mut failures = Vec::new();
    cluster.steps(&scenario.steps, "", &mut failures, &mut outcome.attempts)?;
    cluster.stop_cleanly();
    drop(cluster);
    let left = before.map(|b| HostState::now().added_since(&b)).unwrap_or_default();
    if !left.is_empty() {
        failures.push(format!("left on the host after the scenario: {}", left.join(", ")));
    }
    outcome.failures = failures;
    Ok(outcome)
}

/// What a real scenario could leave on the host outside its temp dir: pod
/// network namespaces pinned under `/run/pinion/netns`, and the bridge
/// plugin's NAT chains (`CNI-...`).
struct HostState {
    pins: std::collections::BTreeSet<String>,
    chains: std::collections::BTreeSet<String>,
}

impl HostState {
    fn now() -> HostState {
        let dir = Path::new(nodelet::cni::DEFAULT_NETNS_DIR);
        let pins = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(Path::new))
            .filter(|p| p.parent() == Some(dir))
            .map(|p| p.display().to_string())
            .collect();
        // Only root may read the nat table; a scenario without root makes none.
        let listed = Command::new("iptables")
            .args(["-w", "5", "-t", "nat", "-S"])
            .stderr(std::process::Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let chains = listed
            .lines()
            .filter_map(|l| l.strip_prefix("-N "))
            .filter(|c| c.starts_with("CNI-"))
            .map(str::to_string)
            .collect();
        HostState { pins, chains }
    }

    /// What is here now and was not at `before`, named.
    fn added_since(&self, before: &HostState) -> Vec<String> {
        let pins = self.pins.difference(&before.pins).map(|p| format!("mount {p}"));
        let chains = self.chains.difference(&before.chains).map(|c| format!("NAT chain {c}"));
        pins.chain(chains).collect()
    }
}

/// Waits for a line starting with `prefix` in a file another process writes.
fn wait_line(path: &Path, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with(prefix)) {
            return Ok(l.to_string());
        }
        if Instant::now() > deadline {
            bail!("no {prefix:?} line in {} after {timeout:?}:\n{text}", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Cluster {
    fn start(s: &Scenario, pinion: &Path, fixtures: &Path, dir: &Path, out: &Path) -> anyhow::Result<Cluster> {
        let mut flags = Vec::new();
        if s.server.topology_blind {
            flags.push("--topology-blind".to_string());
        }
        if let Some(g) = s.server.heartbeat_grace {
            flags.extend(["--heartbeat-grace".to_string(), g.to_string()]);
        }
        if let Some(st) = &s.server.scheduling_strategy {
            flags.extend(["--scheduling-strategy".to_string(), st.clone()]);
        }
        let etcd = match s.server.store {
            StoreKind::Sled => None,
            StoreKind::Etcd => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let cluster = rt.block_on(orchestrator::testing::etcd::EtcdCluster::start(1));
                let cluster = cluster.map_err(|e| anyhow::anyhow!("starting etcd: {e}"))?;
                flags.extend(["--etcd".to_string(), cluster.endpoints().join(",")]);
                Some(cluster)
            }
        };
        let commands = std::fs::File::create(out.join("commands.log"))?;
        let mut c = Cluster {
            pinion: pinion.to_path_buf(),
            dir: dir.to_path_buf(),
            out: out.to_path_buf(),
            fixtures: fixtures.to_path_buf(),
            server_def_flags: flags,
            server: None,
            server_addr: "127.0.0.1:0".parse()?,
            nodes: BTreeMap::new(),
            commands,
            restarts: 0,
            last_attempts: 0,
            applied: Default::default(),
            processes: BTreeMap::new(),
            _etcd: etcd,
        };
        c.start_server()?;
        for def in &s.nodes {
            if c.nodes.contains_key(&def.name) {
                bail!("node {} is defined twice", def.name);
            }
            let relay = Relay::start(c.server_addr)?;
            c.nodes.insert(def.name.clone(), NodeRun { def: def.clone(), relay, proc: None });
            if !def.start_later {
                c.start_node(&def.name)?;
            }
        }
        Ok(c)
    }

    fn start_server(&mut self) -> anyhow::Result<()> {
        let log = self.out.join(format!(
            "server{}.out",
            if self.restarts > 0 { format!(".{}", self.restarts) } else { String::new() }
        ));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(&self.pinion)
            .args(["server", "--listen", &self.server_addr.to_string(), "--data-dir"])
            .arg(self.dir.join("srv"))
            .args(&self.server_def_flags)
            .env("PINION_LOG", DAEMON_LOG)
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting pinion server")?;
        self.server = Some(Proc(child));
        let line = wait_line(&log, "listening on", Duration::from_secs(20))?;
        let addr = line.split_whitespace().nth(2).context("listening line")?;
        self.server_addr = addr.parse().with_context(|| format!("server address {addr}"))?;
        Ok(())
    }

    fn config(&self) -> PathBuf {
        self.dir.join("srv/admin.conf")
    }

    fn start_node(&mut self, name: &str) -> anyhow::Result<()> {
        self.start_node_with(name, None)
    }

    /// `fault`: the `PINION_FAULT` point the agent dies at.
    fn start_node_with(&mut self, name: &str, fault: Option<&str>) -> anyhow::Result<()> {
        let n = self.nodes.get(name).with_context(|| format!("no node {name} in the scenario"))?;
        let def = n.def.clone();
        let url = format!("https://127.0.0.1:{}", n.relay.addr.port());
        let data = self.dir.join(format!("node-{name}"));
        let token = std::fs::read_to_string(self.dir.join("srv/join-token"))?;
        let mut cmd = Command::new(&self.pinion);
        cmd.args(["agent", "--server", &url, "--token", token.trim(), "--ca"])
            .arg(self.dir.join("srv/pki/ca.crt"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--node-name", name, "--endpoint-listen", "127.0.0.1:0", "--runtime", &def.runtime]);
        match (&def.synthetic, &def.sysfs, def.host) {
            (Some(s), None, false) => {
                cmd.args(["--synthetic", s]);
            }
            (None, Some(f), false) => {
                cmd.arg("--sysfs-root").arg(self.fixture(f)?);
            }
            (None, None, true) => {}
            _ => bail!("node {name}: give exactly one of synthetic, sysfs, host"),
        }
        for (flag, v) in [
            ("--reserved-cpus", &def.reserved_cpus),
            ("--topology-policy", &def.policy),
            ("--topology-scope", &def.scope),
        ] {
            if let Some(v) = v {
                cmd.args([flag, v]);
            }
        }
        for o in &def.cpu_manager_options {
            cmd.args(["--cpu-manager-option", o]);
        }
        if let Some(w) = &def.on_settings_change {
            cmd.args(["--on-settings-change", w]);
        }
        for (k, v) in &def.labels {
            cmd.args(["--label", &format!("{k}={v}")]);
        }
        if let Some(d) = &def.devices {
            let path = self.dir.join(format!("devices-{name}.yaml"));
            std::fs::write(&path, serde_yaml_ng::to_string(d)?)?;
            cmd.arg("--devices").arg(path);
        }
        // A folder of the scenario's own, empty: real containers get only
        // `lo`, whatever pod network a host's `pinion up` wrote in /etc/cni/net.d.
        cmd.arg("--cni-conf-dir").arg(self.dir.join(format!("cni-{name}")));
        let restarts = self.restarts;
        let log = self.out.join(format!("node-{name}.{restarts}.out"));
        self.restarts += 1;
        let file = std::fs::File::create(&log)?;
        cmd.env("PINION_LOG", DAEMON_LOG).env_remove(nodelet::fault::ENV).stdout(file.try_clone()?).stderr(file);
        if let Some(f) = fault {
            cmd.env(nodelet::fault::ENV, f);
        }
        let child = cmd.spawn().with_context(|| format!("starting node {name}"))?;
        if let Some(n) = self.nodes.get_mut(name) {
            n.proc = Some(Proc(child));
        }
        let expect = Expectation {
            node: Some(name.to_string()),
            condition: Some("Ready".into()),
            within: Some(30.0),
            ..Expectation::default()
        };
        if let Err(saw) = self.eventually(&expect) {
            bail!("node {name} did not become Ready: {saw} (see {})", log.display());
        }
        Ok(())
    }

    /// Extracts a fixture once per scenario.
    fn fixture(&self, name: &str) -> anyhow::Result<PathBuf> {
        let root = self.dir.join("fixtures").join(name);
        if !root.exists() {
            let tarball = self.fixtures.join(format!("{name}.tar.gz"));
            std::fs::create_dir_all(&root)?;
            let ok = Command::new("tar").arg("xzf").arg(&tarball).arg("-C").arg(&root).status()?.success();
            if !ok {
                bail!("cannot extract {}", tarball.display());
            }
        }
        Ok(root)
    }

    /// Runs a `shell` step; its transcript goes to the scenario's commands log.
    fn shell(&mut self, sh: &Shell) -> Result<(), String> {
        let limit = Duration::from_secs_f64(sh.within.unwrap_or(60.0));
        let out = Command::new("timeout")
            .args(["-s", "KILL", &format!("{}", limit.as_secs_f64())])
            .args(["sh", "-c", &sh.run])
            .env("PINION", &self.pinion)
            .env("PINION_CONFIG", self.config())
            .env("SCENARIO_DIR", &self.dir)
            .env("REPO", crate::binary::repo_root())
            .output()
            .map_err(|e| format!("cannot run sh: {e}"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let _ = writeln!(self.commands, "$ {}\n{text}", sh.run);
        let code = out.status.code().unwrap_or(137);
        if code != sh.exit {
            return Err(format!("exit {code}, want {} (137: killed after {limit:?}); output:\n{text}", sh.exit));
        }
        let missing: Vec<&String> = sh.output_contains.iter().filter(|w| !text.contains(w.as_str())).collect();
        if !missing.is_empty() {
            return Err(format!("output lacks {missing:?}; output:\n{text}"));
        }
        Ok(())
    }

    fn cli(&mut self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(&self.pinion).args(args).arg("--config").arg(self.config()).output();
        let (ok, stdout, stderr) = match out {
            Ok(o) => (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ),
            Err(e) => (false, String::new(), e.to_string()),
        };
        let _ = writeln!(self.commands, "$ pinion {}\n{stdout}{stderr}", args.join(" "));
        (ok, stdout, stderr)
    }

    fn get_json(&mut self, kind: &str, name: &str) -> Option<Value> {
        let (ok, out, _) = self.cli(&["get", kind, name, "-o", "json"]);
        if !ok {
            return None;
        }
        serde_json::from_str(&out).ok()
    }

    fn steps(
        &mut self,
        steps: &[Step],
        at: &str,
        failures: &mut Vec<String>,
        attempts: &mut Vec<(String, u32)>,
    ) -> anyhow::Result<()> {
        for (i, step) in steps.iter().enumerate() {
            let here = format!("{at}step {}", i + 1);
            match step {
                Step::Apply(pods) => {
                    for p in pods {
                        let (name, m) = manifest(p).with_context(|| format!("{here}: apply"))?;
                        self.applied.insert(name.clone());
                        let path = self.dir.join(format!("{name}.json"));
                        std::fs::write(&path, serde_json::to_vec_pretty(&m)?)?;
                        let (ok, out, err) = self.cli(&["apply", "-f", &path.to_string_lossy()]);
                        if !ok {
                            failures.push(format!("{here}: apply {name} failed: {out}{err}"));
                        }
                    }
                }
                Step::Delete(names) => {
                    for name in names {
                        let (ok, out, err) = self.cli(&["delete", "pod", name]);
                        if !ok {
                            failures.push(format!("{here}: delete {name} failed: {out}{err}"));
                        }
                        // Gone from the server, and from its node's report.
                        let gone = Expectation { pod: Some(name.clone()), absent: true, ..Expectation::default() };
                        if let Err(saw) = self.eventually(&gone) {
                            failures.push(format!("{here}: pod {name} still there after delete: {saw}"));
                        }
                    }
                }
                Step::Expect(list) => {
                    for e in list {
                        match self.eventually(e) {
                            Err(saw) => failures.push(format!("{here}: expected {}\n    saw: {saw}", show(e))),
                            Ok(()) if e.phase.as_deref() == Some("Running") => {
                                if let Some(pod) = &e.pod {
                                    attempts.push((pod.clone(), self.last_attempts));
                                }
                            }
                            Ok(()) => {}
                        }
                    }
                }
                Step::Hold { seconds, expect } => {
                    std::thread::sleep(Duration::from_secs_f64(*seconds));
                    for e in expect {
                        if let Err(saw) = self.check(e) {
                            failures.push(format!("{here}: expected to hold {}\n    saw: {saw}", show(e)));
                        }
                    }
                }
                Step::Sleep(s) => std::thread::sleep(Duration::from_secs_f64(*s)),
                Step::ExpectAttempts { total_at_least, total_at_most } => {
                    let total: u32 = attempts.iter().map(|a| a.1).sum();
                    if total_at_least.is_some_and(|min| total < min) || total_at_most.is_some_and(|max| total > max) {
                        failures.push(format!(
                            "{here}: expected between {total_at_least:?} and {total_at_most:?} attempts in all, saw {total} over {} pods",
                            attempts.len()
                        ));
                    }
                }
                Step::Repeat { times, steps } => {
                    for round in 1..=*times {
                        let before = failures.len();
                        self.steps(steps, &format!("{here} round {round}: "), failures, attempts)?;
                        if failures.len() > before {
                            break; // one failed round says enough
                        }
                    }
                }
                Step::KillServer => {
                    self.server = None; // kill -9 (Drop kills with SIGKILL)
                }
                Step::RestartServer => {
                    self.server = None;
                    self.start_server().with_context(|| format!("{here}: restarting the server"))?;
                }
                Step::KillNode(n) => {
                    self.node_mut(n)?.proc = None;
                }
                Step::RestartNode(n) | Step::StartNode(n) => {
                    self.node_mut(n)?.proc = None;
                    self.start_node(n).with_context(|| format!("{here}: starting node {n}"))?;
                }
                Step::Shell(sh) => {
                    if let Err(why) = self.shell(sh) {
                        failures.push(format!("{here}: shell {:?}: {why}", sh.run));
                    }
                }
                Step::ExpectQueue { pods, job_seconds, max_gap_seconds } => {
                    if let Err(why) = self.expect_queue(pods, *job_seconds, *max_gap_seconds) {
                        failures.push(format!("{here}: queue {}: {why}", pods.join(",")));
                    }
                }
                Step::FaultNode { node, fault } => {
                    if nodelet::fault::Fault::parse(fault).is_none() {
                        bail!("{here}: no fault point {fault:?} (see nodelet::fault)");
                    }
                    self.node_mut(node)?.proc = None;
                    self.start_node_with(node, Some(fault))
                        .with_context(|| format!("{here}: starting node {node} with fault {fault}"))?;
                }
                Step::ReconfigureNode {
                    node,
                    reserved_cpus,
                    policy,
                    scope,
                    cpu_manager_options,
                    on_settings_change,
                } => {
                    let n = self.node_mut(node)?;
                    let def = &mut n.def;
                    for (field, v) in [
                        (&mut def.reserved_cpus, reserved_cpus),
                        (&mut def.policy, policy),
                        (&mut def.scope, scope),
                        (&mut def.on_settings_change, on_settings_change),
                    ] {
                        if v.is_some() {
                            field.clone_from(v);
                        }
                    }
                    if let Some(o) = cpu_manager_options {
                        def.cpu_manager_options.clone_from(o);
                    }
                    n.proc = None;
                    self.start_node(node).with_context(|| format!("{here}: restarting node {node} reconfigured"))?;
                }
                Step::RecordProcesses(pods) => {
                    for pod in pods {
                        match self.pod_processes(pod) {
                            Ok(p) if !p.is_empty() => {
                                self.processes.insert(pod.clone(), p);
                            }
                            Ok(_) => failures.push(format!("{here}: pod {pod} runs no process")),
                            Err(why) => failures.push(format!("{here}: processes of {pod}: {why}")),
                        }
                    }
                }
                Step::AwaitNodeKilled(n) => {
                    if let Err(why) = self.await_killed(n) {
                        failures.push(format!("{here}: node {n}: {why}"));
                    }
                }
                Step::ExpectNodeClean(n) => {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    loop {
                        match self.node_clean(n) {
                            Ok(()) => break,
                            Err(why) if Instant::now() > deadline => {
                                failures.push(format!("{here}: node {n} is not clean: {why}"));
                                break;
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(200)),
                        }
                    }
                }
                Step::CutNode(n) => self.node_mut(n)?.relay.set_cut(true),
                Step::RestoreNode(n) => self.node_mut(n)?.relay.set_cut(false),
            }
            if !failures.is_empty() {
                // Later steps build on this one; their failures would only echo it.
                return Ok(());
            }
        }
        Ok(())
    }

    /// Watches the pods (the observer polls every 20 ms; the system under test
    /// may not) until all succeeded; see [`Step::ExpectQueue`].
    fn expect_queue(&mut self, pods: &[String], job_seconds: f64, max_gap: f64) -> Result<(), String> {
        let start = Instant::now();
        let limit = Duration::from_secs_f64(pods.len() as f64 * (job_seconds + max_gap) + 30.0);
        let mut first_seen: BTreeMap<String, f64> = BTreeMap::new();
        let mut done: BTreeMap<String, bool> = BTreeMap::new();
        while done.len() < pods.len() {
            if start.elapsed() > limit {
                return Err(format!("not all Succeeded after {limit:?}: seen running {first_seen:?}, ended {done:?}"));
            }
            let out = Command::new(&self.pinion)
                .args(["get", "pods", "-o", "json", "--config"])
                .arg(self.config())
                .output()
                .map_err(|e| e.to_string())?;
            let at = start.elapsed().as_secs_f64();
            let list: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("get pods -o json: {e}"))?;
            for item in list["items"].as_array().into_iter().flatten() {
                let name = item["metadata"]["name"].as_str().unwrap_or_default().to_string();
                if !pods.contains(&name) {
                    continue;
                }
                let phase = item["status"]["phase"].as_str().unwrap_or_default();
                if matches!(phase, "Running" | "Succeeded" | "Failed") {
                    first_seen.entry(name.clone()).or_insert(at);
                }
                match phase {
                    "Succeeded" => {
                        done.insert(name, true);
                    }
                    "Failed" => return Err(format!("{name} Failed: {}", item["status"])),
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut order: Vec<(&String, f64)> = first_seen.iter().map(|(k, v)| (k, *v)).collect();
        order.sort_by(|a, b| a.1.total_cmp(&b.1));
        let seen: Vec<&str> = order.iter().map(|(k, _)| k.as_str()).collect();
        if seen != pods.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(format!("started in the order {seen:?}, not the submission order"));
        }
        // The observer is a process spawned every 20 ms on a machine that may
        // be running other suites: one late look is its noise, not the
        // system's. A poll or a backoff on the path lengthens every gap, so the
        // median carries the bound; a single gap may reach one job's length.
        let gaps: Vec<f64> = order.windows(2).map(|p| p[1].1 - p[0].1 - job_seconds).collect();
        let mut sorted = gaps.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        if median > max_gap {
            return Err(format!(
                "the median gap between one job's end and the next one's start is {median:.2} s, more than {max_gap} s (gaps {gaps:.2?}; first seen running: {order:?})"
            ));
        }
        for (pair, gap) in order.windows(2).zip(&gaps) {
            if *gap > max_gap + job_seconds {
                return Err(format!(
                    "{} started {:.2} s after {} started: {gap:.2} s after its end, more than {} s (first seen running: {order:?})",
                    pair[1].0,
                    pair[1].1 - pair[0].1,
                    pair[0].0,
                    max_gap + job_seconds
                ));
            }
        }
        Ok(())
    }

    /// Waits for the node's agent to die by itself, and checks it was SIGKILL.
    fn await_killed(&mut self, name: &str) -> Result<(), String> {
        use std::os::unix::process::ExitStatusExt;
        let n = self.nodes.get_mut(name).ok_or_else(|| format!("no node {name}"))?;
        let Some(proc) = n.proc.as_mut() else { return Err("its agent is not running".into()) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match proc.0.try_wait() {
                Ok(Some(status)) => {
                    n.proc = None;
                    return match status.signal() {
                        Some(9) => Ok(()),
                        _ => Err(format!("its agent ended with {status}, not by SIGKILL")),
                    };
                }
                Ok(None) if Instant::now() > deadline => return Err("its agent is still alive after 30 s".into()),
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// See [`Step::ExpectNodeClean`].
    fn node_clean(&self, name: &str) -> Result<(), String> {
        let n = self.nodes.get(name).ok_or_else(|| format!("no node {name}"))?;
        let data = self.dir.join(format!("node-{name}"));
        let cp = nodelet::checkpoint::Checkpoint::load(&data).map_err(|e| e.to_string())?;
        let mut held = std::collections::BTreeSet::new();
        for (key, pod) in &cp.pods {
            for (ctr, rec) in &pod.containers {
                if let Some(id) = &rec.runtime_id {
                    if pod.finished.is_some() {
                        return Err(format!("finished pod {key} still names container {ctr}: {id}"));
                    }
                    held.insert(id.clone());
                }
            }
        }
        let real = n.def.runtime == "libcontainer";
        let present = if real {
            let mut ids = std::collections::BTreeSet::new();
            for dir in ["containers", "libcontainer"] {
                for e in std::fs::read_dir(data.join(dir)).into_iter().flatten().flatten() {
                    ids.insert(e.file_name().to_string_lossy().into_owned());
                }
            }
            ids
        } else {
            let file: Value = std::fs::read(data.join("hollow/containers.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(Value::Null);
            file["containers"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
        };
        if present != held {
            return Err(format!("the runtime holds {present:?}, the checkpoint names {held:?}"));
        }
        if !real {
            return Ok(());
        }
        let ours = |id: &str| self.applied.iter().any(|p| id.starts_with(&format!("{p}_")));
        let stray = |id: &str| ours(id) && !held.contains(id);
        let mut left = Vec::new();
        for base in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            for dir in [base.path().join("pinion"), base.path()] {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let id = e.file_name().to_string_lossy().into_owned();
                    if stray(&id) && e.path().is_dir() {
                        left.push(format!("cgroup {}", e.path().display()));
                    }
                }
            }
        }
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let in_container = cgroup
                .lines()
                // A container's sub-cgroups are its own: the id ends at the next `/`.
                .filter_map(|l| {
                    l.split_once("/pinion/").and_then(|(_, rest)| rest.split('/').next()).map(str::to_string)
                })
                .find(|id| stray(id));
            let shim_of = (args.get(1).map(String::as_str) == Some("shim")
                && args.iter().any(|a| Path::new(a) == data))
            .then(|| args.iter().skip_while(|a| *a != "--id").nth(1).cloned())
            .flatten()
            .filter(|id| !held.contains(id));
            if let Some(id) = in_container.or(shim_of) {
                left.push(format!("process {pid} ({}) of {id}", args.join(" ").trim()));
            }
        }
        let root = data.to_string_lossy().into_owned();
        for line in std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines() {
            let Some(point) = line.split(' ').nth(4) else { continue };
            // Whole path components: `x_1` does not cover `x_10`'s mounts.
            let under_held = held.iter().any(|id| {
                let dir = format!("{root}/containers/{id}");
                point == dir || point.starts_with(&format!("{dir}/"))
            });
            if point.starts_with(&root) && !under_held {
                left.push(format!("mount {point}"));
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(left.join("; "))
        }
    }

    /// The processes in the cgroups of a pod's current containers (as the
    /// checkpoint of the node running it names them), real containers only.
    fn pod_processes(&self, pod: &str) -> Result<std::collections::BTreeSet<u32>, String> {
        let mut ids = Vec::new();
        for name in self.nodes.keys() {
            let data = self.dir.join(format!("node-{name}"));
            let cp = nodelet::checkpoint::Checkpoint::load(&data).map_err(|e| e.to_string())?;
            if let Some(rec) = cp.pods.get(pod).filter(|r| r.finished.is_none()) {
                ids.extend(rec.containers.values().filter_map(|c| c.runtime_id.clone()));
            }
        }
        let mut pids = std::collections::BTreeSet::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let inside = cgroup.lines().filter_map(|l| l.split_once("/pinion/").map(|(_, id)| id.to_string()));
            if inside.into_iter().any(|id| ids.contains(&id)) {
                pids.insert(pid);
            }
        }
        Ok(pids)
    }

    fn node_mut(&mut self, name: &str) -> anyhow::Result<&mut NodeRun> {
        self.nodes.get_mut(name).with_context(|| format!("no node {name} in the scenario"))
    }

    fn eventually(&mut self, e: &Expectation) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs_f64(e.within.unwrap_or(30.0));
        loop {
            match self.check(e) {
                Ok(()) => return Ok(()),
                Err(saw) if Instant::now() > deadline => return Err(saw),
                Err(_) => std::thread::sleep(Duration::from_millis(150)),
            }
        }
    }

    fn check(&mut self, e: &Expectation) -> Result<(), String> {
        match (&e.pod, &e.node) {
            (Some(pod), _) => self.check_pod(pod, e),
            (None, Some(node)) => {
                let n = self.get_json("nodes", node).ok_or_else(|| format!("no node {node}"))?;
                let reserved: Option<specs::CpuSet> =
                    serde_json::from_value(n["spec"]["settings"]["reservedCpus"].clone()).ok();
                match (&e.condition, &e.reserved_cpus) {
                    (Some(c), _) if n["status"]["condition"] != c.as_str() => {
                        Err(format!("node {node} is {}", n["status"]["condition"]))
                    }
                    (_, Some(r)) if reserved != specs::CpuSet::parse_list(r).ok() => {
                        Err(format!("node {node} has reservedCpus {}", n["spec"]["settings"]["reservedCpus"]))
                    }
                    _ => Ok(()),
                }
            }
            (None, None) => Err("an expectation names no pod and no node".into()),
        }
    }

    fn check_pod(&mut self, name: &str, e: &Expectation) -> Result<(), String> {
        let Some(p) = self.get_json("pods", name) else {
            return if e.absent { Ok(()) } else { Err(format!("no pod {name}")) };
        };
        if e.absent {
            return Err(format!("pod {name} exists: phase {}", p["status"]["phase"]));
        }
        let status = &p["status"];
        let mut bad = String::new();
        let mut want = |ok: bool, what: String| {
            if !ok {
                let _ = write!(bad, "{what}; ");
            }
        };
        if let Some(ph) = &e.phase {
            want(status["phase"] == ph.as_str(), format!("phase {}", status["phase"]));
        }
        if let Some(n) = &e.on_node {
            want(p["spec"]["nodeName"] == n.as_str(), format!("node {}", p["spec"]["nodeName"]));
        }
        if let Some(r) = &e.reason {
            want(status["reason"] == r.as_str(), format!("reason {}", status["reason"]));
        }
        if let Some(parts) = &e.message_contains {
            let msg = status["message"].as_str().unwrap_or_default();
            want(parts.iter().all(|s| msg.contains(s.as_str())), format!("message {msg:?}"));
        }
        let tries = status["attempts"].as_u64().unwrap_or(0) as u32;
        if let Some(max) = e.attempts_at_most {
            want(tries <= max, format!("attempts {tries}"));
        }
        if let Some(min) = e.attempts_at_least {
            want(tries >= min, format!("attempts {tries}"));
        }
        if let Some(numa) = &e.numa_affinity {
            let got: Vec<u32> = serde_json::from_value(status["placement"]["numaAffinity"].clone()).unwrap_or_default();
            want(&got == numa, format!("numaAffinity {got:?}"));
        }
        let containers = status["placement"]["containers"].as_array().cloned().unwrap_or_default();
        let placed = match &e.container {
            Some(c) => containers.iter().find(|x| x["name"] == c.as_str()).cloned(),
            None => containers.first().cloned(),
        };
        let cpus: Option<specs::CpuSet> = placed.as_ref().and_then(|c| serde_json::from_value(c["cpus"].clone()).ok());
        let cpu_fields = e.cpus.is_some()
            || e.cpus_one_of.is_some()
            || e.cpus_within.is_some()
            || e.cpus_disjoint_from.is_some()
            || e.cpu_count.is_some()
            || e.mems.is_some()
            || e.cpu_policy.is_some()
            || e.devices.is_some();
        match (&cpus, &placed) {
            (Some(cpus), Some(c)) => {
                let list = |s: &str| specs::CpuSet::parse_list(s).unwrap_or_default();
                if let Some(x) = &e.cpus {
                    want(*cpus == list(x), format!("cpus {cpus}"));
                }
                if let Some(xs) = &e.cpus_one_of {
                    want(xs.iter().any(|x| *cpus == list(x)), format!("cpus {cpus}"));
                }
                if let Some(x) = &e.cpus_within {
                    want(cpus.is_subset(&list(x)), format!("cpus {cpus}"));
                }
                if let Some(x) = &e.cpus_disjoint_from {
                    want(cpus.intersection(&list(x)).is_empty(), format!("cpus {cpus}"));
                }
                if let Some(n) = e.cpu_count {
                    want(cpus.len() == n as usize, format!("cpus {cpus} ({})", cpus.len()));
                }
                if let Some(m) = &e.mems {
                    let got: Vec<u32> = serde_json::from_value(c["mems"].clone()).unwrap_or_default();
                    want(&got == m, format!("mems {got:?}"));
                }
                if let Some(pol) = &e.cpu_policy {
                    want(c["cpuPolicy"] == pol.as_str(), format!("cpuPolicy {}", c["cpuPolicy"]));
                }
                if let Some(d) = &e.devices {
                    let got: Vec<String> = serde_json::from_value(c["devices"].clone()).unwrap_or_default();
                    want(&got == d, format!("devices {got:?}"));
                }
            }
            _ if cpu_fields => want(false, "no placement".into()),
            _ => {}
        }
        if let Some(n) = e.restart_count {
            let got = status["containerStatuses"][0]["restartCount"].as_u64().unwrap_or(0) as u32;
            want(got == n, format!("restartCount {got}"));
        }
        if e.same_processes {
            match (self.processes.get(name), self.pod_processes(name)) {
                (Some(noted), Ok(now)) => want(*noted == now, format!("processes {now:?}, noted {noted:?}")),
                (None, _) => want(false, "no recordProcesses before".into()),
                (_, Err(why)) => want(false, format!("processes: {why}")),
            }
        }
        if let Some(parts) = &e.describe_contains {
            let (_, text, _) = self.cli(&["describe", "pod", name]);
            let missing: Vec<&String> = parts.iter().filter(|s| !text.contains(s.as_str())).collect();
            if !missing.is_empty() {
                let _ = write!(bad, "describe lacks {missing:?}:\n{text}");
            }
        }
        if let Some(parts) = &e.logs_contain {
            let (_, text, err) = self.cli(&["logs", name]);
            if !parts.iter().all(|s| text.contains(s.as_str())) {
                let _ = write!(bad, "logs {text:?} {err}");
            }
        }
        if !bad.is_empty() {
            return Err(format!("pod {name}: {}", bad.trim_end_matches("; ")));
        }
        self.last_attempts = tries;
        Ok(())
    }

    /// Deletes every pod and waits for the nodes to drop them, so that real
    /// containers end with the scenario; then stops the processes.
    fn stop_cleanly(&mut self) {
        let real = self.nodes.values().any(|n| n.def.runtime == "libcontainer" && n.proc.is_some());
        if real && self.server.is_some() {
            let (_, out, _) = self.cli(&["get", "pods", "-o", "json"]);
            let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
            let names: Vec<String> = v["items"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            for n in names {
                let _ = self.cli(&["delete", "pod", &n]);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            for name in self.nodes.keys().cloned().collect::<Vec<_>>() {
                let data = self.dir.join(format!("node-{name}"));
                while Instant::now() < deadline && !node_pods(&self.pinion, &data).is_empty() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        // A graceful stop: the agents remove their networks made ahead (a
        // SIGKILL, what dropping them does, leaves those to the next start).
        for n in self.nodes.values_mut() {
            let Some(p) = n.proc.as_mut() else { continue };
            let _ = Command::new("kill").args(["-TERM", &p.0.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(p.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn node_pods(pinion: &Path, data: &Path) -> Vec<String> {
    let out = Command::new(pinion).args(["agent", "status", "-o", "json", "--data-dir"]).arg(data).output();
    let v: Value = out.ok().and_then(|o| serde_json::from_slice(&o.stdout).ok()).unwrap_or(Value::Null);
    v["pods"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.values_mut() {
            n.proc = None;
        }
        self.server = None;
        // Containers outlive their agent: whatever is left goes through the runtime.
        for (name, n) in &self.nodes {
            if n.def.runtime != "libcontainer" {
                continue;
            }
            let data = self.dir.join(format!("node-{name}"));
            if let Ok(rt) = nodelet::runtime::libcontainer::LibcontainerRuntime::new(&data, &self.pinion) {
                use nodelet::runtime::Runtime;
                for id in rt.list().unwrap_or_default() {
                    let _ = rt.stop(&id, Duration::ZERO);
                    let _ = rt.remove(&id);
                }
            }
            // So do pod networks: a killed agent's, through their records.
            let cni = nodelet::cni::CniConfig::new(
                self.dir.join(format!("cni-{name}")),
                nodelet::cni::parse_bin_dirs(nodelet::cni::DEFAULT_BIN_DIRS),
            );
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                let removal = nodelet::down::remove_leftover_networks(&data, &cni);
                let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), removal).await });
            }
        }
    }
}

fn show(e: &Expectation) -> String {
    let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.retain(|_, x| !x.is_null() && x != &Value::Bool(false));
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthand_pods_expand_to_manifests() {
        let v: Value = serde_yaml_ng::from_str(
            "{name: p, cpu: '2', memory: 1Gi, hugepages2Mi: 2Gi, devices: {example.com/nic: 1}, policy: single-numa-node}",
        )
        .unwrap_or_default();
        let (name, m) = manifest(&v).unwrap_or_default();
        assert_eq!(name, "p");
        let c = &m["spec"]["containers"][0];
        assert_eq!(c["name"], "main");
        assert_eq!(c["resources"]["limits"]["cpu"], "2");
        assert_eq!(c["resources"]["limits"]["hugepages-2Mi"], "2Gi");
        assert_eq!(c["resources"]["requests"]["example.com/nic"], "1");
        assert_eq!(m["spec"]["topology"]["policy"], "single-numa-node");
        let burst: Value = serde_yaml_ng::from_str("{name: b, cpuRequest: 500m}").unwrap_or_default();
        let (_, m) = manifest(&burst).unwrap_or_default();
        assert_eq!(m["spec"]["containers"][0]["resources"]["requests"]["cpu"], "500m");
        assert!(m["spec"]["containers"][0]["resources"]["limits"].as_object().is_some_and(|l| l.is_empty()));
    }

    #[test]
    fn what_a_scenario_leaves_on_the_host_is_named() {
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        let before = HostState { pins: set(&["/run/pinion/netns/p1"]), chains: set(&["CNI-old"]) };
        let after = HostState {
            pins: set(&["/run/pinion/netns/p1", "/run/pinion/netns/w2"]),
            chains: set(&["CNI-new", "CNI-old"]),
        };
        assert_eq!(after.added_since(&before), ["mount /run/pinion/netns/w2", "NAT chain CNI-new"]);
        assert!(before.added_since(&after).is_empty(), "what went is no leak");
    }

    #[test]
    fn every_scenario_file_parses() {
        let dir = crate::binary::repo_root().join("e2e/scenarios");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|x| x == "yaml") {
                if let Err(e) = load(&entry.path()) {
                    panic!("{e:#}");
                }
                seen += 1;
            }
        }
        assert!(seen >= 8, "only {seen} scenarios under {}", dir.display());
    }

    #[test]
    fn a_typo_in_a_scenario_is_an_error_naming_the_field() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, "description: x\nnodes: []\nsteps:\n- expect: [{pod: a, phase: Running, onNod: b}]\n")
            .unwrap_or_default();
        let err = format!("{:#}", load(&path).err().map(|e| e.to_string()).unwrap_or_default());
        assert!(err.contains("steps[0].expect[0]") && err.contains("onNod"), "{err}");
    }
}
