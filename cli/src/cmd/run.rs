//! `pinion run NAME [--host | --image I] [--cpus N] [--memory Q] [--policy P]
//! [--gpus N] [--device NAME=N]
//! [--array SPEC] -- CMD...`: the srun-like one-liner. It creates a
//! one-container pod that is never restarted, then follows it on one stream
//! (`GET /api/v1/pods/{name}/attach`: status changes, saying why while it is
//! Pending, its output, its exit code) and exits with the command's exit code.
//! Ctrl-C deletes the pod (its container is stopped), as srun cancels its job
//! step. A silent stream (no heartbeat) is reconnected and resumed from the
//! last version and output offset.
//!
//! `--array 1-100%N` (Slurm's `sbatch --array`) runs one pod per task,
//! `NAME-<i>`, prefixes each output line with `i: ` (as `srun --label`) and
//! exits with the highest task exit code.
//!
//! `-N NODES [--ntasks-per-node K | -n TASKS]` (Slurm's multi-node run) makes
//! a Job whose members, one per task, are placed together as a gang (all at
//! once or none), each with its own pinned CPUs and its rank in its
//! environment; output as for an array, `rank: ` before each line, and the
//! highest rank's exit code. Ctrl-C deletes the job.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use pinion_wire::{Client, ClientError};
use specs::api::AttachFrame;
use specs::pod::{
    Capabilities, Container, EnvVar, HostPathVolume, ObjectMeta, PodSecurityContext, ResourceRequirements,
    RestartPolicy, RootfsSource, SecurityContext, TopologySpec, Volume, VolumeMount, API_VERSION, ARRAY_LABEL,
    ARRAY_PARALLELISM_ANNOTATION, ARRAY_TASK_ANNOTATION, RESOURCE_CPU, RESOURCE_MEMORY, WAIT_FOR_NODES_ANNOTATION,
    WAIT_FOR_NODES_HINT,
};
use specs::{CpuPolicy, Pod, PodPhase, PodSpec, Quantity, TopologyPolicy};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::common::{parse_kebab, GlobalArgs};

/// The label `run` puts on its pods, so that it can watch just the one.
pub const RUN_LABEL: &str = "pinion.io/run";
/// Memory given to a `--cpus` pod without `--memory`: pinned CPUs need a
/// Guaranteed pod, and that needs a memory limit.
const DEFAULT_MEMORY: &str = "256Mi";
/// Consecutive failed reconnects before `run` gives up on the server.
const RECONNECTS: u32 = 10;
/// Creates (and deletes) of an array's pods in flight at once, multiplexed on
/// the client's one HTTP/2 connection: enough to overlap the server's group
/// commits, few enough to stay polite.
const ARRAY_IN_FLIGHT: usize = 64;
/// Array tasks followed at once (one attach stream each).
const MAX_FOLLOWED: usize = 256;
/// Slurm's default `MaxArraySize` is 1001; more tasks are refused with a reason.
const MAX_ARRAY_TASKS: usize = 10_000;
/// The environment variable holding an array task's index (Slurm's
/// `SLURM_ARRAY_TASK_ID`).
pub const ARRAY_TASK_ENV: &str = "PINION_ARRAY_TASK_ID";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The pod's name (needed outside an allocation; inside one, where
    /// `PINION_JOB` is set, the step's id).
    #[arg(default_value = "", hide_default_value = true)]
    pub name: String,
    /// Run on the host's own binaries (read-only /usr, /bin, /lib, /etc) [default].
    #[arg(long, conflicts_with = "image")]
    pub host: bool,
    /// Run in an image: pulled by the node from its registry, or imported
    /// with `pinion image import`.
    #[arg(long, value_name = "[REGISTRY/]NAME[:TAG]")]
    pub image: Option<String>,
    /// When the node pulls --image: IfNotPresent (default), Always, Never.
    #[arg(long, value_name = "POLICY", requires = "image", value_parser = parse_pull)]
    pub pull: Option<Pull>,
    /// CPUs (per task): an integer gets exclusive, pinned CPUs (with a memory
    /// limit, 256Mi unless --memory says otherwise); a fraction shares the pool.
    #[arg(long, visible_alias = "cpus-per-task", short = 'c', value_name = "N")]
    pub cpus: Option<Quantity>,
    /// Memory request and limit (per task; e.g. 512Mi, 4Gi).
    #[arg(long, visible_alias = "mem-per-task", value_name = "Q")]
    pub memory: Option<Quantity>,
    /// A multi-node run on at most this many nodes (Slurm's -N): a Job whose
    /// tasks are placed together, all at once or none.
    #[arg(short = 'N', long, value_name = "NODES", conflicts_with = "array")]
    pub nodes: Option<u32>,
    /// Tasks on each of the --nodes (Slurm's --ntasks-per-node) [default: 1].
    #[arg(long, value_name = "K", requires = "nodes", conflicts_with = "ntasks")]
    pub ntasks_per_node: Option<u32>,
    /// Tasks in all (Slurm's -n), packed onto the fewest nodes (at most
    /// --nodes when given).
    #[arg(short = 'n', long, value_name = "TASKS", conflicts_with = "array")]
    pub ntasks: Option<u32>,
    /// A multi-node run: one task per node, never two on one node.
    #[arg(long, conflicts_with = "ntasks_per_node")]
    pub spread: bool,
    /// A multi-node run: its priority; a higher one is placed before runs
    /// submitted earlier [default: 0].
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub priority: Option<i32>,
    /// A multi-node run: a task that fails does not stop the others (by
    /// default it does, as `srun --kill-on-bad-exit`).
    #[arg(long)]
    pub keep_running: bool,
    /// A device resource and how many (repeatable `NAME=N`), e.g.
    /// `nvidia.com/gpu=1`, `pinion.io/sriov-vf-ens1f0=2`.
    #[arg(long = "device", value_name = "NAME=N")]
    pub devices: Vec<String>,
    /// GPUs: `--device nvidia.com/gpu=N`.
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// Topology policy for this pod: none | best-effort | restricted | single-numa-node.
    #[arg(long, value_name = "P", value_parser = parse_kebab::<TopologyPolicy>)]
    pub policy: Option<TopologyPolicy>,
    /// CPU policy: exclusive | numa | immovable | shared.
    #[arg(long, value_name = "P", value_parser = parse_kebab::<CpuPolicy>)]
    pub cpu_policy: Option<CpuPolicy>,
    /// A Linux capability on top of the default set (repeatable), e.g.
    /// SYS_NICE for realtime priorities, IPC_LOCK for locked memory.
    #[arg(long = "cap-add", value_name = "CAP")]
    pub cap_add: Vec<String>,
    /// Environment variable (repeatable `K=V`).
    #[arg(short = 'e', long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// A host folder in the container (repeatable `HOST:DEST[:ro]`, as
    /// docker's -v): the program and its data on the node's filesystem.
    #[arg(short = 'v', long = "volume", value_name = "HOST:DEST[:ro]")]
    pub volumes: Vec<String>,
    /// Use the node's network (its interfaces and addresses) instead of a
    /// network namespace of the pod's own (an address on the node's pod
    /// network, which reaches the pods of every node; only `lo` where the
    /// node has no pod network): for MPI's launcher to reach `mpirun`.
    #[arg(long)]
    pub host_network: bool,
    /// Run as root inside a user namespace of the pod's own (`hostUsers:
    /// false`): root to the command, an unprivileged block of host ids to
    /// the host. For images that expect root, where your profile keeps
    /// you off the host's root.
    #[arg(long, conflicts_with = "host_network")]
    pub userns: bool,
    /// Only nodes with this label (repeatable `K=V`).
    #[arg(long = "node-selector", value_name = "K=V")]
    pub node_selector: Vec<String>,
    /// Create the pod and return at once.
    #[arg(short = 'd', long)]
    pub detach: bool,
    /// Delete the pod once it has finished.
    #[arg(long, conflicts_with = "detach")]
    pub rm: bool,
    /// Seconds between SIGTERM and SIGKILL when the pod is deleted (Ctrl-C,
    /// --timeout) [default: the node's, 30].
    #[arg(long, value_name = "SECONDS")]
    pub grace: Option<u64>,
    /// Give up after this many seconds, waiting and running included: the pod
    /// is deleted and the exit status is 124, as timeout(1) does. Without it,
    /// `run` waits as long as the pod is pending (srun waits for resources too).
    #[arg(long, value_name = "SECONDS", conflicts_with = "detach")]
    pub timeout: Option<u64>,
    /// A time limit counted from the start, enforced by the server (Slurm's
    /// --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S): the run is a Job with
    /// `activeDeadlineSeconds`; past it its tasks get SIGTERM, then SIGKILL
    /// after their grace, the job ends Failed (DeadlineExceeded) and `run`
    /// exits 124.
    #[arg(short = 't', long, value_name = "TIME", value_parser = parse_time, conflicts_with = "array")]
    pub time: Option<u64>,
    /// Run the command as PID 1 itself instead of under the init that reaps
    /// zombies and forwards signals.
    #[arg(long)]
    pub no_init: bool,
    /// Accept the pod even if no node that exists could ever run it, and wait
    /// for one to join (by default the server refuses such a pod).
    #[arg(long)]
    pub wait_for_nodes: bool,
    /// A job array, as Slurm's: `1-100`, `0-15%4` (at most 4 running at
    /// once), `1,3,5-7`, `0-20:5` (every 5th). One pod per task, NAME-<i>,
    /// with PINION_ARRAY_TASK_ID=i; output lines prefixed `i: `.
    #[arg(long, value_name = "SPEC", value_parser = parse_array)]
    pub array: Option<ArraySpec>,
    /// Inside an allocation: run the step's one task on a terminal
    /// (Slurm's `srun --pty`), stdin forwarded.
    #[arg(long)]
    pub pty: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn parse_time(s: &str) -> Result<u64, String> {
    specs::batch::parse_time(s)?.ok_or_else(|| "UNLIMITED: leave --time out".to_string())
}

fn key_value(flag: &str, s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s.split_once('=').with_context(|| format!("{flag} {s:?}: expected K=V"))?;
    Ok((k.to_string(), v.to_string()))
}

/// The pod `run` submits.
pub fn pod(args: &Args) -> anyhow::Result<Pod> {
    let mut resources = ResourceRequirements::default();
    let memory = match (&args.cpus, &args.memory) {
        (_, Some(m)) => Some(m.clone()),
        (Some(_), None) => Some(DEFAULT_MEMORY.parse::<Quantity>().context("default memory")?),
        (None, None) => None,
    };
    for (name, q) in [(RESOURCE_CPU, &args.cpus), (RESOURCE_MEMORY, &memory)] {
        if let Some(q) = q {
            resources.requests.insert(name.to_string(), q.clone());
            resources.limits.insert(name.to_string(), q.clone());
        }
    }
    for (name, q) in device_requests(&args.devices, args.gpus)? {
        resources.requests.insert(name.clone(), q.clone());
        resources.limits.insert(name, q);
    }
    let env = args
        .env
        .iter()
        .map(|e| key_value("--env", e).map(|(name, value)| EnvVar { name, value }))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let node_selector =
        args.node_selector.iter().map(|s| key_value("--node-selector", s)).collect::<anyhow::Result<_>>()?;
    let (volumes, volume_mounts) = volumes(&args.volumes)?;
    let container = Container {
        name: "main".into(),
        image: args.image.clone(),
        image_pull_policy: args.pull.map(|p| p.0),
        rootfs: if args.image.is_none() { Some(RootfsSource::Host) } else { None },
        command: args.command.clone(),
        args: Vec::new(),
        env,
        working_dir: None,
        resources,
        cpu_policy: args.cpu_policy,
        security_context: (!args.cap_add.is_empty()).then(|| SecurityContext {
            capabilities: Some(Capabilities { add: args.cap_add.clone(), drop: Vec::new() }),
            ..Default::default()
        }),
        volume_mounts,
        liveness_probe: None,
        readiness_probe: None,
        startup_probe: None,
    };
    Ok(Pod {
        api_version: API_VERSION.into(),
        kind: "Pod".into(),
        metadata: ObjectMeta {
            name: args.name.clone(),
            labels: BTreeMap::from([(RUN_LABEL.to_string(), args.name.clone())]),
            annotations: if args.wait_for_nodes {
                BTreeMap::from([(WAIT_FOR_NODES_ANNOTATION.to_string(), "true".to_string())])
            } else {
                BTreeMap::new()
            },
            ..Default::default()
        },
        spec: PodSpec {
            containers: vec![container],
            restart_policy: RestartPolicy::Never,
            node_selector,
            topology: args.policy.map(|p| TopologySpec { policy: Some(p), ..Default::default() }),
            scheduling_strategy: None,
            host_network: args.host_network,
            node_name: None,
            termination_grace_period_seconds: args.grace,
            init: !args.no_init,
            ttl_seconds_after_finished: None,
            volumes,
            pids_limit: None,
            security_context: args.userns.then(|| PodSecurityContext { run_as_user: Some(0), ..Default::default() }),
            host_users: args.userns.then_some(false),
            node_lost_replace_after_seconds: None,
            tuning: None,
        },
        status: None,
    })
}

/// `-v HOST:DEST[:ro]`: a hostPath volume `v<i>` each, mounted at DEST.
fn volumes(flags: &[String]) -> anyhow::Result<(Vec<Volume>, Vec<VolumeMount>)> {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (i, f) in flags.iter().enumerate() {
        let parts: Vec<&str> = f.split(':').collect();
        let (host, dest, read_only) = match parts.as_slice() {
            [h, d] => (*h, *d, false),
            [h, d, "ro"] => (*h, *d, true),
            [h, d, "rw"] => (*h, *d, false),
            _ => bail!("--volume {f:?}: expected HOST:DEST or HOST:DEST:ro"),
        };
        let name = format!("v{i}");
        volumes.push(Volume { name: name.clone(), host_path: HostPathVolume { path: host.to_string() } });
        mounts.push(VolumeMount { name, mount_path: dest.to_string(), read_only });
    }
    Ok((volumes, mounts))
}

/// `--device NAME=N` and `--gpus N`: resource name -> count, each named
/// once, each count a whole number of at least 1 (a device is not shared).
fn device_requests(devices: &[String], gpus: Option<u32>) -> anyhow::Result<BTreeMap<String, Quantity>> {
    let mut out = BTreeMap::new();
    // (the flag and its value as given, the NAME=N it means)
    let asked = devices.iter().map(|d| (format!("--device {d:?}"), d.clone()));
    let gpus = gpus.map(|n| (format!("--gpus {n}"), format!("{}={n}", nodelet::devices::NVIDIA_GPU)));
    for (flag, d) in asked.chain(gpus) {
        let (name, count) = d.split_once('=').with_context(|| format!("{flag}: expected NAME=N"))?;
        if !specs::validate::is_device_resource_name(name) {
            bail!("{flag}: {name:?} is not a device resource (want domain/name, e.g. nvidia.com/gpu; cpu and memory have their own flags)");
        }
        let n: u32 = count.parse().map_err(|_| anyhow::anyhow!("{flag}: {count:?} is not a whole number"))?;
        if n == 0 {
            bail!("{flag}: ask for at least 1");
        }
        if out.insert(name.to_string(), Quantity::from_units(i64::from(n))).is_some() {
            bail!("{flag}: {name} is asked for twice");
        }
    }
    Ok(out)
}

/// `--array`: the task indices, in order, and the `%N` limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArraySpec {
    pub tasks: Vec<u32>,
    pub parallelism: Option<u32>,
}

/// Slurm's `--array` syntax: comma-separated indices and ranges `A-B`, a
/// range optionally with a step `A-B:S`, the whole optionally followed by
/// `%N`. Duplicates count once.
pub fn parse_array(spec: &str) -> Result<ArraySpec, String> {
    let err = |why: String| format!("--array {spec:?}: {why}");
    let (list, parallelism) = match spec.split_once('%') {
        Some((list, n)) => {
            let n: u32 = n.trim().parse().map_err(|_| err(format!("%{n}: expected a whole number of tasks")))?;
            if n == 0 {
                return Err(err("%0: at least one task must be able to run".into()));
            }
            (list, Some(n))
        }
        None => (spec, None),
    };
    let index = |s: &str| -> Result<u32, String> {
        s.trim().parse::<u32>().map_err(|_| err(format!("{s:?} is not a task index (a whole number)")))
    };
    let mut tasks = BTreeSet::new();
    for part in list.split(',') {
        if part.trim().is_empty() {
            return Err(err("empty element (expected e.g. 1-100, 0-15%4 or 1,3,5-7)".into()));
        }
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => (r, Some(index(s)?)),
            None => (part, None),
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (index(a)?, index(b)?),
            None if step.is_some() => return Err(err(format!("{part:?}: a step needs a range (A-B:S)"))),
            None => (index(range)?, index(range)?),
        };
        if last < first {
            return Err(err(format!("{range:?}: the range ends before it starts")));
        }
        let step = step.unwrap_or(1);
        if step == 0 {
            return Err(err(format!("{part:?}: the step must be at least 1")));
        }
        if (last - first) / step >= MAX_ARRAY_TASKS as u32 {
            return Err(err(format!("more than {MAX_ARRAY_TASKS} tasks")));
        }
        tasks.extend((first..=last).step_by(step as usize));
        if tasks.len() > MAX_ARRAY_TASKS {
            return Err(err(format!("more than {MAX_ARRAY_TASKS} tasks")));
        }
    }
    Ok(ArraySpec { tasks: tasks.into_iter().collect(), parallelism })
}

/// The pod of array task `task`.
pub fn task_pod(args: &Args, spec: &ArraySpec, task: u32) -> anyhow::Result<Pod> {
    let mut pod = pod(args)?;
    let name = format!("{}-{task}", args.name);
    pod.metadata.name = name.clone();
    pod.metadata.labels.insert(RUN_LABEL.to_string(), name);
    pod.metadata.labels.insert(ARRAY_LABEL.to_string(), args.name.clone());
    pod.metadata.annotations.insert(ARRAY_TASK_ANNOTATION.to_string(), task.to_string());
    if let Some(n) = spec.parallelism {
        pod.metadata.annotations.insert(ARRAY_PARALLELISM_ANNOTATION.to_string(), n.to_string());
    }
    for c in &mut pod.spec.containers {
        if !c.env.iter().any(|e| e.name == ARRAY_TASK_ENV) {
            c.env.insert(0, EnvVar { name: ARRAY_TASK_ENV.to_string(), value: task.to_string() });
        }
    }
    Ok(pod)
}

/// SIGINT and SIGTERM (and SIGHUP for `alloc`), caught from before the
/// first create: a Ctrl-C while pods are being created still deletes them all.
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn catch() -> anyhow::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: None,
        })
    }

    /// SIGHUP too: a closed terminal ends an allocation as Ctrl-C does.
    pub(crate) fn catch_with_hangup() -> anyhow::Result<Signals> {
        let mut s = Signals::catch()?;
        s.hup = Some(signal(SignalKind::hangup()).context("SIGHUP handler")?);
        Ok(s)
    }

    /// The signal's number, once one comes.
    pub(crate) async fn recv(&mut self) -> i32 {
        let hup = async {
            match &mut self.hup {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.term.recv() => 15,
            _ = self.int.recv() => 2,
            _ = hup => 1,
        }
    }
}

/// The Job a multi-node run submits (`-N`, `-n`, `--ntasks-per-node`), or
/// `None` for a single pod.
pub fn job(args: &Args) -> anyhow::Result<Option<specs::job::Job>> {
    use specs::job::{FailurePolicy, GangPlacement, GangSpec, Job, JobSpec, PodTemplate, TemplateMeta};
    if args.nodes.is_none() && args.ntasks.is_none() && !args.spread && args.time.is_none() {
        return Ok(None);
    }
    for (flag, v) in [("--nodes", args.nodes), ("--ntasks", args.ntasks), ("--ntasks-per-node", args.ntasks_per_node)] {
        if v == Some(0) {
            bail!("{flag} 0: at least 1");
        }
    }
    let (size, per_node) = match (args.nodes, args.ntasks, args.ntasks_per_node) {
        (Some(n), None, k) => {
            let k = k.unwrap_or(1);
            (n.checked_mul(k).context("--nodes times --ntasks-per-node is too many tasks")?, Some(k))
        }
        (Some(n), Some(t), _) => {
            if n > t {
                bail!("--nodes {n} is more than --ntasks {t}: every node runs at least one task");
            }
            (t, Some(t.div_ceil(n)))
        }
        (None, Some(t), _) => (t, None),
        (None, None, _) if args.spread => bail!("--spread needs --nodes or --ntasks"),
        // `--time` alone: a job of one task, for the server to time.
        (None, None, _) => (1, None),
    };
    let mut pod = pod(args)?;
    pod.metadata.labels.remove(RUN_LABEL);
    let placement = if args.spread { GangPlacement::Spread } else { GangPlacement::Pack };
    Ok(Some(Job {
        api_version: API_VERSION.into(),
        kind: "Job".into(),
        metadata: ObjectMeta { name: args.name.clone(), ..Default::default() },
        spec: JobSpec {
            template: PodTemplate {
                metadata: (!pod.metadata.annotations.is_empty())
                    .then(|| TemplateMeta { labels: BTreeMap::new(), annotations: pod.metadata.annotations.clone() }),
                spec: pod.spec,
            },
            parallelism: size,
            completions: None,
            completion_mode: Default::default(),
            backoff_limit: 0,
            gang: GangSpec {
                min_members: None,
                placement,
                nodes: args.nodes,
                per_node: if args.spread { None } else { per_node },
            },
            priority: args.priority.unwrap_or(0),
            failure_policy: if args.keep_running { FailurePolicy::KeepRunning } else { FailurePolicy::StopAll },
            ttl_seconds_after_finished: None,
            active_deadline_seconds: args.time,
            dependency: None,
            partition: None,
        },
        status: None,
    }))
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    // Inside an allocation (`pinion alloc`'s shell) a run is a step in its members.
    if let Some(job) = std::env::var(specs::step::JOB_ENV).ok().filter(|j| !j.is_empty()) {
        return super::step::run(&g, &args, &job).await;
    }
    if args.pty {
        bail!("--pty: only inside an allocation (`pinion alloc`); for a running pod, `pinion exec -it POD -- CMD`");
    }
    if args.name.is_empty() {
        bail!("a NAME for the pod is needed (only inside an allocation, `pinion alloc`, may it be left out)");
    }
    let client = crate::config::client(&g)?;
    let signals = Signals::catch()?;
    if let Some(spec) = args.array.clone() {
        return run_array(&client, &args, &spec, signals).await;
    }
    if let Some(job) = job(&args)? {
        return run_job(&client, &args, job, signals).await;
    }
    let pod = pod(&args)?;
    let body = serde_json::to_vec(&pod).context("encoding the pod")?;
    // The create and the attach share the client's pooled connection: one TLS handshake.
    let (code, created) = client.create_pod(Bytes::from(body)).await.map_err(|e| create_error(&args.name, e))?;
    if code != 201 {
        bail!("pod {} already exists: delete it (`pinion delete pod {}`) or pick another name", args.name, args.name);
    }
    tracing::debug!(pod = %args.name, "created");
    if args.detach {
        outln!("pod/{} created", args.name);
        return Ok(ExitCode::SUCCESS);
    }
    let names = [args.name.clone()];
    let followed = async {
        let mut out = Stdout;
        // With --rm the server deletes the pod at its end, before the exit
        // frame: no delete request after it.
        let (code, removed) = follow(&client, &created, &args.command, args.rm, &mut out).await?;
        Ok(Outcome { code: code.clamp(0, 255) as u8, removed })
    };
    finish(&client, &args, &names, followed, signals).await
}

/// How a followed run ended.
struct Outcome {
    /// The exit status.
    code: u8,
    /// The server already deleted what `--rm` asked to delete.
    removed: bool,
}

/// Waits for `followed`, a signal or `--timeout`; deletes the pods when asked
/// (`--rm`, unless the server did) or cut short, and turns the outcome into
/// the exit status.
async fn finish(
    client: &Client,
    args: &Args,
    names: &[String],
    followed: impl std::future::Future<Output = anyhow::Result<Outcome>>,
    signals: Signals,
) -> anyhow::Result<ExitCode> {
    finish_as(client, args, Cleanup::Pods(names), followed, signals).await
}

/// What a cut-short run deletes.
enum Cleanup<'a> {
    Pods(&'a [String]),
    /// The job, and its members with it.
    Job(&'a str),
}

async fn finish_as(
    client: &Client,
    args: &Args,
    cleanup: Cleanup<'_>,
    followed: impl std::future::Future<Output = anyhow::Result<Outcome>>,
    mut signals: Signals,
) -> anyhow::Result<ExitCode> {
    let limit = async {
        match args.timeout {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        r = followed => Ended::Done(r),
        _ = signals.recv() => Ended::Interrupted,
        _ = limit => Ended::TimedOut,
    };
    let removed = matches!(&ended, Ended::Done(Ok(o)) if o.removed);
    if (args.rm && !removed) || !matches!(ended, Ended::Done(_)) {
        match cleanup {
            Cleanup::Pods(names) => delete_all(client, names).await,
            Cleanup::Job(name) => match client.delete_job(name).await {
                Ok(_) => {}
                Err(ClientError::Api(e)) if e.code == 404 => {}
                Err(e) => eprintln!("pinion: could not delete job {name}: {e}"),
            },
        }
    }
    let what = match cleanup {
        Cleanup::Pods([_]) => format!("pod {}", args.name),
        Cleanup::Pods(_) => format!("array {}", args.name),
        Cleanup::Job(_) => format!("job {}", args.name),
    };
    match ended {
        Ended::Done(r) => r.map(|o| ExitCode::from(o.code)),
        Ended::Interrupted => {
            eprintln!("pinion: interrupted; {what} deleted");
            Ok(ExitCode::from(130))
        }
        Ended::TimedOut => {
            eprintln!("pinion: no result within {}s; {what} deleted", args.timeout.unwrap_or(0));
            Ok(ExitCode::from(124))
        }
    }
}

/// How `run` stopped following: the command's exit code (or an error), a
/// signal, or `--timeout`; the last two delete the pod.
enum Ended {
    Done(anyhow::Result<Outcome>),
    Interrupted,
    TimedOut,
}

/// A refused create in one line: the server's reason (422: no node could
/// ever run it, or a field problem).
fn create_error(name: &str, e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Api(api) if api.code == 422 => {
            // `run` has a flag for what the server suggests.
            let message = api.message.replace(WAIT_FOR_NODES_HINT, "run with --wait-for-nodes to wait for such a node");
            let mut line = format!("run {name}: {message}");
            for d in &api.details {
                line.push_str(&format!("; {d}"));
            }
            anyhow::anyhow!(line)
        }
        e => anyhow::Error::new(e).context(format!("run {name}: creating the pod")),
    }
}

/// Deletes pods, a few at once; failures are said, not fatal.
async fn delete_all(client: &Client, names: &[String]) {
    let queue = Arc::new(Mutex::new(names.iter().cloned().collect::<VecDeque<_>>()));
    let mut workers = JoinSet::new();
    for _ in 0..ARRAY_IN_FLIGHT.min(names.len()) {
        let (client, queue) = (client.clone(), queue.clone());
        workers.spawn(async move {
            loop {
                let Some(name) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else { return };
                match client.delete_pod(&name).await {
                    Ok(_) => {}
                    Err(ClientError::Api(e)) if e.code == 404 => {}
                    Err(e) => eprintln!("pinion: could not delete pod {name}: {e}"),
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
}

/// Where a followed pod's output and notes go.
trait Sink {
    fn output(&mut self, data: &str);
    /// A line for stderr (`pinion: ...`).
    fn note(&mut self, line: String);
    /// Whether to say why the pod waits (a single run does; an array's
    /// pending tasks would drown the output).
    fn says_pending(&self) -> bool;
}

/// A single run: straight through, unbuffered (a follower wants each line as
/// it comes).
struct Stdout;

impl Sink for Stdout {
    fn output(&mut self, data: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data.as_bytes());
        let _ = out.flush();
    }

    fn note(&mut self, line: String) {
        eprintln!("{line}");
    }

    fn says_pending(&self) -> bool {
        true
    }
}

/// Follows one pod to its end over attach streams, reconnecting (from the
/// last version and output offset) when a stream breaks or falls silent;
/// returns the command's exit code (1 for a pod that failed without one,
/// after saying why), and whether the server deleted the pod at its end
/// (asked with `rm`).
async fn follow(
    client: &Client,
    created: &Pod,
    command: &[String],
    rm: bool,
    sink: &mut (dyn Sink + Send),
) -> anyhow::Result<(i32, bool)> {
    let name = created.metadata.name.clone();
    let mut from = created.metadata.resource_version;
    let mut offset = 0u64;
    let mut said: Option<String> = None;
    let mut failures = 0u32;
    loop {
        let opened = client.attach_pod(&name, from, offset, rm).await;
        let mut stream = match opened {
            Ok(s) => s,
            Err(ClientError::Api(e)) if e.code == 404 => bail!("pod {name} was deleted"),
            Err(e) if !e.is_retryable() => return Err(anyhow::Error::new(e).context(format!("following pod {name}"))),
            Err(e) => {
                failures += 1;
                if failures >= RECONNECTS {
                    return Err(anyhow::Error::new(e).context(format!("following pod {name}: gave up reconnecting")));
                }
                tracing::debug!(pod = %name, error = %e, "attach failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 << failures.min(5))).await;
                continue;
            }
        };
        loop {
            // A silent stream (no heartbeat within the client's bound) ends
            // with `ClientError::Silent`, its connection out of the pool.
            let frame = match stream.next().await {
                Err(e) => {
                    tracing::debug!(pod = %name, error = %e, "attach stream broke or fell silent; reconnecting");
                    break;
                }
                Ok(None) => break,
                Ok(Some(f)) => f,
            };
            failures = 0;
            tracing::debug!(pod = %name, ?frame, "frame");
            match frame {
                AttachFrame::Status { resource_version, status } => {
                    from = Some(resource_version);
                    // Why it waits for a node (capacity, throttling); once bound,
                    // the short steps before it runs are not worth a line.
                    if status.phase == PodPhase::Pending && status.node_name.is_none() && sink.says_pending() {
                        let why = status.message.or(status.reason);
                        if why.is_some() && why != said {
                            sink.note(format!("pinion: pod {name} is pending: {}", why.clone().unwrap_or_default()));
                            said = why;
                        }
                    }
                }
                AttachFrame::Output { offset: o, data } => {
                    offset = o;
                    sink.output(&data);
                }
                AttachFrame::Heartbeat => {}
                AttachFrame::Notice { message } => sink.note(format!("pinion: pod {name}: {message}")),
                AttachFrame::Exit { phase, exit_code, reason, message, removed } => {
                    return Ok((exit_code_of(&name, command, phase, exit_code, reason, message, sink), removed));
                }
                AttachFrame::Deleted => bail!("pod {name} was deleted"),
                // Gone: the change log moved past us; a new stream starts from the pod as it is.
                AttachFrame::Error { error } if error.code == 410 => break,
                AttachFrame::Error { error } => {
                    return Err(anyhow::Error::new(ClientError::Api(error)).context(format!("following pod {name}")))
                }
            }
        }
        failures += 1;
        if failures >= RECONNECTS {
            bail!("following pod {name}: the stream kept breaking; gave up after {RECONNECTS} tries");
        }
        tokio::time::sleep(Duration::from_millis(100 << failures.min(5))).await;
    }
}

/// The exit status for a finished pod, after a line for anything a person
/// should know (a command that could not run, an OOM kill, a pod that never
/// started).
fn exit_code_of(
    name: &str,
    command: &[String],
    phase: PodPhase,
    exit_code: Option<i32>,
    reason: Option<String>,
    message: Option<String>,
    sink: &mut (dyn Sink + Send),
) -> i32 {
    let program = command.first().map(String::as_str).unwrap_or("the command");
    match exit_code {
        // The exec failed (the shell's codes): say which, once.
        Some(code @ (126 | 127)) if phase == PodPhase::Failed => {
            let what = if code == 127 { "command not found" } else { "cannot be executed" };
            // "Not found" says it all; "cannot be executed" has reasons (the
            // node's message: permission denied, a bad interpreter...).
            let detail =
                message.filter(|m| code == 126 && !m.is_empty()).map(|m| format!(" ({m})")).unwrap_or_default();
            sink.note(format!("pinion: run {name}: {program}: {what} (exit {code}){detail}"));
            code
        }
        Some(code) => {
            if let Some(reason) = reason.filter(|r| r != "Completed" && r != "Error") {
                sink.note(format!("pinion: pod {name}: {reason}"));
            }
            code
        }
        None if phase == PodPhase::Succeeded => 0,
        None => {
            let why = message.or(reason).unwrap_or_else(|| format!("{phase:?}"));
            sink.note(format!("pinion: pod {name} failed: {why}"));
            1
        }
    }
}

/// What an array task's follower tells the printer.
enum TaskEvent {
    Output(u32, String),
    Note(String),
}

/// An array task: whole lines only, each prefixed `i: ` by the printer.
struct TaskSink {
    task: u32,
    tx: mpsc::UnboundedSender<TaskEvent>,
}

impl Sink for TaskSink {
    fn output(&mut self, data: &str) {
        let _ = self.tx.send(TaskEvent::Output(self.task, data.to_string()));
    }

    fn note(&mut self, line: String) {
        let _ = self.tx.send(TaskEvent::Note(line));
    }

    fn says_pending(&self) -> bool {
        false
    }
}

/// Prefixes complete lines with their task (`srun --label`); a partial line
/// waits for its end, or for the task's end.
#[derive(Default)]
pub(crate) struct Labeler {
    partial: BTreeMap<u32, String>,
    /// Lines as they come, without a label.
    plain: bool,
}

impl Labeler {
    /// Lines labelled with their task, or (`label` false) as they come.
    pub(crate) fn new(label: bool) -> Labeler {
        Labeler { plain: !label, ..Default::default() }
    }

    pub(crate) fn push(&mut self, task: u32, data: &str) -> String {
        if self.plain {
            return data.to_string();
        }
        let buf = self.partial.entry(task).or_default();
        buf.push_str(data);
        let mut out = String::new();
        while let Some(pos) = buf.find('\n') {
            let line: String = buf.drain(..=pos).collect();
            out.push_str(&format!("{task}: {line}"));
        }
        out
    }

    pub(crate) fn finish(&mut self, task: u32) -> String {
        if self.plain {
            return String::new();
        }
        match self.partial.remove(&task) {
            Some(rest) if !rest.is_empty() => format!("{task}: {rest}\n"),
            _ => String::new(),
        }
    }
}

async fn run_array(client: &Client, args: &Args, spec: &ArraySpec, signals: Signals) -> anyhow::Result<ExitCode> {
    let pods = spec.tasks.iter().map(|t| Ok((*t, task_pod(args, spec, *t)?))).collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<String> = pods.iter().map(|(_, p)| p.metadata.name.clone()).collect();
    // Several creates in flight at once (streams of one HTTP/2 connection):
    // the server commits what arrives together in one group.
    let queue = Arc::new(Mutex::new(pods.into_iter().collect::<VecDeque<_>>()));
    let mut workers = JoinSet::new();
    for _ in 0..ARRAY_IN_FLIGHT.min(names.len()) {
        let (client, queue) = (client.clone(), queue.clone());
        workers.spawn(async move {
            let mut made = Vec::new();
            loop {
                let Some((task, pod)) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else {
                    return (made, None);
                };
                let name = pod.metadata.name.clone();
                let body = match serde_json::to_vec(&pod) {
                    Ok(b) => b,
                    Err(e) => return (made, Some(anyhow::anyhow!("encoding pod {name}: {e}"))),
                };
                match client.create_pod(Bytes::from(body)).await {
                    Ok((201, created)) => made.push((task, created)),
                    Ok(_) => {
                        let why = format!(
                            "pod {name} already exists: delete the array (`pinion delete pod` each of `pinion get pods -l {ARRAY_LABEL}={}`) or pick another name",
                            pod.metadata.labels.get(ARRAY_LABEL).cloned().unwrap_or_default()
                        );
                        return (made, Some(anyhow::anyhow!(why)));
                    }
                    Err(e) => return (made, Some(create_error(&name, e))),
                }
            }
        });
    }
    let mut created = Vec::new();
    let mut failed = None;
    while let Some(r) = workers.join_next().await {
        let (made, err) = r.context("creating the array's pods")?;
        created.extend(made);
        if failed.is_none() {
            failed = err;
        }
    }
    if let Some(e) = failed {
        // All or nothing: a half-created array would run without its peers.
        queue.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let made: Vec<String> = created.iter().map(|(_, p): &(u32, Pod)| p.metadata.name.clone()).collect();
        delete_all(client, &made).await;
        return Err(e);
    }
    created.sort_by_key(|(t, _)| *t);
    if args.detach {
        outln!(
            "array {}: {} pods created (`pinion get pods -l {ARRAY_LABEL}={}`)",
            args.name,
            created.len(),
            args.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    finish(client, args, &names, follow_tasks(client, args, created, "task", true), signals).await
}

/// A multi-node run: the job in one create (its members with it), then each
/// member followed as an array's task is, by rank.
async fn run_job(client: &Client, args: &Args, job: specs::job::Job, signals: Signals) -> anyhow::Result<ExitCode> {
    let body = serde_json::to_vec(&job).context("encoding the job")?;
    let (code, _) = client.create_job(Bytes::from(body)).await.map_err(|e| create_error(&args.name, e))?;
    if code != 201 {
        bail!("job {} already exists: delete it (`pinion delete job {}`) or pick another name", args.name, args.name);
    }
    let selector = format!("{}={}", specs::job::JOB_LABEL, args.name);
    if args.detach {
        outln!("job/{} created: {} tasks (`pinion get pods -l {selector}`)", args.name, job.spec.parallelism);
        return Ok(ExitCode::SUCCESS);
    }
    let listed = client.list_pods(Some(&selector)).await.context("reading the job's members")?;
    let mut members: Vec<(u32, Pod)> = listed
        .items
        .into_iter()
        .filter_map(|p| specs::job::membership(&p).map(|(_, rank, _)| rank).map(|r| (r, p)))
        .map(|(r, mut p)| {
            // A list may show a version the store has not published yet (a
            // binding committing meanwhile): each stream starts from the pod
            // as it is then, so nothing is missed either way.
            p.metadata.resource_version = None;
            (r, p)
        })
        .collect();
    members.sort_by_key(|(r, _)| *r);
    let label = job.spec.parallelism > 1;
    let code =
        finish_as(client, args, Cleanup::Job(&args.name), follow_tasks(client, args, members, "rank", label), signals)
            .await?;
    if args.time.is_some() {
        // Its members were stopped at the deadline: say so, with timeout(1)'s code.
        if let Ok(j) = client.get_job(&args.name).await {
            let st = j.status.unwrap_or_default();
            if st.reason.as_deref() == Some(specs::job::DEADLINE_EXCEEDED) {
                eprintln!(
                    "pinion: job {}: {} ({})",
                    args.name,
                    specs::job::DEADLINE_EXCEEDED,
                    st.message.unwrap_or_default()
                );
                return Ok(ExitCode::from(124));
            }
        }
    }
    Ok(code)
}

/// Follows every task (an array's, or a job's ranks) to its end, printing
/// their lines labelled (unless `label` is false: a job of one task); the
/// highest exit code.
async fn follow_tasks(
    client: &Client,
    args: &Args,
    created: Vec<(u32, Pod)>,
    noun: &str,
    label: bool,
) -> anyhow::Result<Outcome> {
    // One attach stream per task rather than one label watch plus a log
    // request each: the stream already carries the status, the output and
    // the exit code of its task, resumes on its own, and the server's log
    // follow is per container anyway.
    // At most MAX_FOLLOWED streams at once, in task order: a task followed
    // late loses nothing (a finished pod's stream replays its whole output),
    // and a big array does not take all of the server's connections.
    let (tx, mut rx) = mpsc::unbounded_channel::<TaskEvent>();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_FOLLOWED));
    let mut followers = JoinSet::new();
    for (task, pod) in created {
        let (client, command, tx) = (client.clone(), args.command.clone(), tx.clone());
        let slots = slots.clone();
        followers.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let mut sink = TaskSink { task, tx };
            // An array's or job's tasks are deleted together at the end.
            let r = follow(&client, &pod, &command, false, &mut sink).await.map(|(code, _)| code);
            (task, r)
        });
    }
    drop(tx);
    let followed = async {
        let mut labels = Labeler::new(label);
        let mut worst = 0i32;
        let mut out = std::io::stdout();
        let mut events_open = true;
        loop {
            tokio::select! {
                ev = rx.recv(), if events_open => match ev {
                    Some(TaskEvent::Output(task, data)) => {
                        let _ = out.write_all(labels.push(task, &data).as_bytes());
                        let _ = out.flush();
                    }
                    Some(TaskEvent::Note(line)) => eprintln!("{line}"),
                    None => events_open = false,
                },
                done = followers.join_next() => match done {
                    Some(Ok((task, r))) => {
                        // The task's own output is all in the channel before its result.
                        while let Ok(ev) = rx.try_recv() {
                            match ev {
                                TaskEvent::Output(t, data) => { let _ = out.write_all(labels.push(t, &data).as_bytes()); }
                                TaskEvent::Note(line) => eprintln!("{line}"),
                            }
                        }
                        let _ = out.write_all(labels.finish(task).as_bytes());
                        let _ = out.flush();
                        match r {
                            Ok(code) => worst = worst.max(code),
                            Err(e) => {
                                eprintln!("pinion: {noun} {task}: {e:#}");
                                worst = worst.max(1);
                            }
                        }
                    }
                    Some(Err(e)) => {
                        eprintln!("pinion: a task's follower failed: {e}");
                        worst = worst.max(1);
                    }
                    None => break,
                },
            }
        }
        Ok::<Outcome, anyhow::Error>(Outcome { code: worst.clamp(0, 255) as u8, removed: false })
    };
    followed.await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: &str, expected: Result<(&[u32], Option<u32>), &str>) {
        let got = parse_array(spec);
        match expected {
            Ok((tasks, parallelism)) => {
                assert_eq!(got, Ok(ArraySpec { tasks: tasks.to_vec(), parallelism }), "{spec}")
            }
            Err(part) => {
                let e = got.expect_err(spec);
                assert!(e.starts_with("--array ") && e.contains(part), "{spec}: {e}");
            }
        }
    }

    #[test]
    fn device_flags_become_whole_requests() {
        let check = |devices: &[&str], gpus: Option<u32>, expected: Result<&[(&str, &str)], &str>| {
            let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
            let got = device_requests(&devices, gpus);
            match (got, expected) {
                (Ok(got), Ok(want)) => {
                    let got: Vec<(String, String)> = got.into_iter().map(|(k, q)| (k, q.to_string())).collect();
                    let want: Vec<(String, String)> =
                        want.iter().map(|(k, q)| (k.to_string(), q.to_string())).collect();
                    assert_eq!(got, want, "{devices:?} {gpus:?}");
                }
                (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{devices:?} {gpus:?}: {e}"),
                (got, _) => panic!("{devices:?} {gpus:?}: {got:?}"),
            }
        };
        check(&[], None, Ok(&[]));
        check(&[], Some(2), Ok(&[("nvidia.com/gpu", "2")]));
        check(
            &["nvidia.com/gpu=1", "pinion.io/sriov-vf-ens1f0=2"],
            None,
            Ok(&[("nvidia.com/gpu", "1"), ("pinion.io/sriov-vf-ens1f0", "2")]),
        );
        check(&["nvidia.com/gpu"], None, Err("--device \"nvidia.com/gpu\": expected NAME=N"));
        check(&["gpu=1"], None, Err("--device \"gpu=1\": \"gpu\" is not a device resource"));
        check(&["cpu=1"], None, Err("cpu and memory have their own flags"));
        check(&["nvidia.com/gpu=0.5"], None, Err("\"0.5\" is not a whole number"));
        check(&["nvidia.com/gpu=0"], None, Err("--device \"nvidia.com/gpu=0\": ask for at least 1"));
        check(&[], Some(0), Err("--gpus 0: ask for at least 1"));
        check(&["nvidia.com/gpu=1"], Some(1), Err("--gpus 1: nvidia.com/gpu is asked for twice"));
    }

    #[test]
    fn array_specs_as_slurm_writes_them() {
        check("1-4", Ok((&[1, 2, 3, 4], None)));
        check("0-3%2", Ok((&[0, 1, 2, 3], Some(2))));
        check("1,3,5-7", Ok((&[1, 3, 5, 6, 7], None)));
        check("7", Ok((&[7], None)));
        check("0-10:5", Ok((&[0, 5, 10], None)));
        check("3,1,3", Ok((&[1, 3], None)));
        check("1-100%4", Ok((&(1..=100).collect::<Vec<_>>(), Some(4))));
        check("5-1", Err("ends before it starts"));
        check("1-x", Err("not a task index"));
        check("-3", Err("not a task index"));
        check("1,,2", Err("empty element"));
        check("", Err("empty element"));
        check("1-4%0", Err("%0"));
        check("1-4%x", Err("whole number of tasks"));
        check("3:2", Err("a step needs a range"));
        check("1-5:0", Err("step must be at least 1"));
        check("0-20000", Err("more than 10000 tasks"));
    }

    /// What a follower said, for tests.
    #[derive(Default)]
    struct Said(Vec<String>);

    impl Sink for Said {
        fn output(&mut self, data: &str) {
            self.0.push(format!("out {data}"));
        }
        fn note(&mut self, line: String) {
            self.0.push(line);
        }
        fn says_pending(&self) -> bool {
            true
        }
    }

    fn check_exit(
        phase: PodPhase,
        code: Option<i32>,
        reason: Option<&str>,
        message: Option<&str>,
        expected: (i32, &[&str]),
    ) {
        let mut said = Said::default();
        let cmd = ["/no/such/binary".to_string(), "x".to_string()];
        let got =
            exit_code_of("job", &cmd, phase, code, reason.map(str::to_string), message.map(str::to_string), &mut said);
        let said: Vec<&str> = said.0.iter().map(String::as_str).collect();
        assert_eq!((got, said.as_slice()), expected, "{phase:?} {code:?} {reason:?}");
    }

    #[test]
    fn exit_codes_and_what_is_said_about_them() {
        check_exit(PodPhase::Succeeded, Some(0), Some("Completed"), None, (0, &[]));
        check_exit(PodPhase::Failed, Some(3), Some("Error"), None, (3, &[]));
        check_exit(PodPhase::Failed, Some(137), Some("OOMKilled"), None, (137, &["pinion: pod job: OOMKilled"]));
        check_exit(
            PodPhase::Failed,
            Some(127),
            Some("StartError"),
            None,
            (127, &["pinion: run job: /no/such/binary: command not found (exit 127)"]),
        );
        check_exit(
            PodPhase::Failed,
            Some(126),
            None,
            Some("permission denied"),
            (126, &["pinion: run job: /no/such/binary: cannot be executed (exit 126) (permission denied)"]),
        );
        check_exit(
            PodPhase::Failed,
            None,
            Some("Evicted"),
            Some("node lost"),
            (1, &["pinion: pod job failed: node lost"]),
        );
        check_exit(PodPhase::Succeeded, None, None, None, (0, &[]));
    }

    #[test]
    fn lines_are_labelled_whole() {
        let mut l = Labeler::default();
        assert_eq!(l.push(3, "a\nb"), "3: a\n");
        assert_eq!(l.push(4, "x\n"), "4: x\n");
        assert_eq!(l.push(3, "c\nd\n"), "3: bc\n3: d\n");
        assert_eq!(l.push(3, "tail"), "");
        assert_eq!(l.finish(3), "3: tail\n");
        assert_eq!(l.finish(4), "");
    }
}

/// `--pull`: Kubernetes' `imagePullPolicy` words, any case.
#[derive(Debug, Clone, Copy)]
pub struct Pull(specs::pod::PullPolicy);

fn parse_pull(s: &str) -> Result<Pull, String> {
    use specs::pod::PullPolicy as P;
    match s.to_ascii_lowercase().as_str() {
        "ifnotpresent" => Ok(Pull(P::IfNotPresent)),
        "always" => Ok(Pull(P::Always)),
        "never" => Ok(Pull(P::Never)),
        _ => Err(format!("{s:?}: want IfNotPresent, Always or Never")),
    }
}
