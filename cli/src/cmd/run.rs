//! `pinion run NAME [--host | --image I] [--cpus N] [--memory Q] [--policy P] -- CMD...`:
//! the srun-like one-liner. It creates a one-container pod that is never
//! restarted, waits for it to be placed (saying why while it is Pending),
//! streams its output, and exits with the command's exit code. Ctrl-C deletes
//! the pod (its container is stopped), as srun cancels its job step.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use orchestrator::client::Client;
use specs::pod::{
    Capabilities, Container, EnvVar, ObjectMeta, ResourceRequirements, RestartPolicy, RootfsSource, SecurityContext,
    TopologySpec, API_VERSION, RESOURCE_CPU, RESOURCE_MEMORY,
};
use specs::status::ContainerState;
use specs::{CpuPolicy, Pod, PodPhase, PodSpec, Quantity, TopologyPolicy};
use tokio::signal::unix::{signal, SignalKind};

use crate::common::{parse_kebab, GlobalArgs};

/// The label `run` puts on its pods, so that it can watch just the one.
pub const RUN_LABEL: &str = "pinion.io/run";
/// Memory given to a `--cpus` pod without `--memory`: pinned CPUs need a
/// Guaranteed pod, and that needs a memory limit.
const DEFAULT_MEMORY: &str = "256Mi";
/// How long the end of the output may precede the pod's final status.
const FINAL_STATUS_WAIT: Duration = Duration::from_secs(60);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The pod's name.
    pub name: String,
    /// Run on the host's own binaries (read-only /usr, /bin, /lib, /etc) [default].
    #[arg(long, conflicts_with = "image")]
    pub host: bool,
    /// Run in an image imported with `pinion image import`.
    #[arg(long, value_name = "NAME:TAG")]
    pub image: Option<String>,
    /// CPUs: an integer gets exclusive, pinned CPUs (with a memory limit,
    /// 256Mi unless --memory says otherwise); a fraction shares the pool.
    #[arg(long, value_name = "N")]
    pub cpus: Option<Quantity>,
    /// Memory request and limit (e.g. 512Mi, 4Gi).
    #[arg(long, value_name = "Q")]
    pub memory: Option<Quantity>,
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
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
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
    let env = args
        .env
        .iter()
        .map(|e| key_value("--env", e).map(|(name, value)| EnvVar { name, value }))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let node_selector =
        args.node_selector.iter().map(|s| key_value("--node-selector", s)).collect::<anyhow::Result<_>>()?;
    let container = Container {
        name: "main".into(),
        image: args.image.clone(),
        rootfs: if args.image.is_none() { Some(RootfsSource::Host) } else { None },
        command: args.command.clone(),
        args: Vec::new(),
        env,
        working_dir: None,
        resources,
        cpu_policy: args.cpu_policy,
        security_context: (!args.cap_add.is_empty()).then(|| SecurityContext {
            capabilities: Some(Capabilities { add: args.cap_add.clone(), drop: Vec::new() }),
        }),
    };
    Ok(Pod {
        api_version: API_VERSION.into(),
        kind: "Pod".into(),
        metadata: ObjectMeta {
            name: args.name.clone(),
            labels: BTreeMap::from([(RUN_LABEL.to_string(), args.name.clone())]),
            ..Default::default()
        },
        spec: PodSpec {
            containers: vec![container],
            restart_policy: RestartPolicy::Never,
            node_selector,
            topology: args.policy.map(|p| TopologySpec { policy: Some(p), scope: None }),
            scheduling_strategy: None,
            host_network: false,
            node_name: None,
            termination_grace_period_seconds: args.grace,
            init: true,
            ttl_seconds_after_finished: None,
        },
        status: None,
    })
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let pod = pod(&args)?;
    let client = crate::config::client(&g)?;
    let body = serde_json::to_vec(&pod).context("encoding the pod")?;
    let (code, created) = client.create_pod(Bytes::from(body)).await.with_context(|| format!("pod {}", args.name))?;
    if code != 201 {
        bail!("pod {} already exists: delete it (`pinion delete pod {}`) or pick another name", args.name, args.name);
    }
    tracing::debug!(pod = %args.name, "created");
    if args.detach {
        println!("pod/{} created", args.name);
        return Ok(ExitCode::SUCCESS);
    }
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let limit = async {
        match args.timeout {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        r = follow(&client, &created) => Ended::Done(r),
        _ = term.recv() => Ended::Interrupted,
        _ = int.recv() => Ended::Interrupted,
        _ = limit => Ended::TimedOut,
    };
    if args.rm || !matches!(ended, Ended::Done(_)) {
        if let Err(e) = client.delete_pod(&args.name).await {
            eprintln!("pinion: could not delete pod {}: {e}", args.name);
        }
    }
    match ended {
        Ended::Done(r) => r.map(ExitCode::from),
        Ended::Interrupted => {
            eprintln!("pinion: interrupted; pod {} deleted", args.name);
            Ok(ExitCode::from(130))
        }
        Ended::TimedOut => {
            eprintln!("pinion: no result within {}s; pod {} deleted", args.timeout.unwrap_or(0), args.name);
            Ok(ExitCode::from(124))
        }
    }
}

/// How `run` stopped following: the command's exit code (or an error), a
/// signal, or `--timeout`; the last two delete the pod.
enum Ended {
    Done(anyhow::Result<u8>),
    Interrupted,
    TimedOut,
}

/// Waits for the pod to start, copies its output, and returns the command's
/// exit code (as a process exit status byte).
async fn follow(client: &Client, created: &Pod) -> anyhow::Result<u8> {
    let name = created.metadata.name.clone();
    let selector = format!("{RUN_LABEL}={name}");
    let mut watch = client
        .watch_pods(None, Some(&selector), created.metadata.resource_version)
        .await
        .context("watching the pod")?;
    let mut said = None;
    // Until it runs (or is already done): say why it waits.
    let mut pod = created.clone();
    loop {
        let status = pod.status.clone().unwrap_or_default();
        match status.phase {
            PodPhase::Running | PodPhase::Succeeded | PodPhase::Failed => break,
            PodPhase::Pending => {
                let why = status.message.or(status.reason);
                if why.is_some() && why != said {
                    eprintln!("pinion: pod {name} is pending: {}", why.clone().unwrap_or_default());
                    said = why;
                }
            }
            PodPhase::Scheduled | PodPhase::Unknown => {}
        }
        pod = next_version(&mut watch, &name).await?;
    }
    tracing::debug!(pod = %name, phase = ?pod.status.as_ref().map(|s| s.phase), "started; following the output");
    if let Err(e) = crate::cmd::logs::copy_logs(client, &name, None, true).await {
        eprintln!("pinion: cannot stream the output: {e:#}");
    }
    tracing::debug!(pod = %name, "output ended; waiting for the final status");
    // The output ends when the container exits; the final status follows.
    let done = tokio::time::timeout(FINAL_STATUS_WAIT, async {
        loop {
            if pod.status.as_ref().is_some_and(|s| s.phase.is_terminal()) {
                return Ok::<_, anyhow::Error>(pod.clone());
            }
            pod = next_version(&mut watch, &name).await?;
        }
    })
    .await
    .with_context(|| format!("pod {name}: the output ended but no final status came in {FINAL_STATUS_WAIT:?}"))??;
    Ok(exit_code(&done))
}

async fn next_version(watch: &mut orchestrator::client::PodWatch, name: &str) -> anyhow::Result<Pod> {
    loop {
        match watch.next().await.context("watching the pod")? {
            Some((specs::api::WatchEventType::Deleted, p)) if p.metadata.name == name => {
                bail!("pod {name} was deleted")
            }
            Some((_, p)) if p.metadata.name == name => return Ok(p),
            Some(_) => {}
            None => bail!("the server ended the watch"),
        }
    }
}

/// The container's exit code; 1 for a pod that failed without one (it never
/// started), after saying why.
fn exit_code(pod: &Pod) -> u8 {
    let status = pod.status.clone().unwrap_or_default();
    let ctr = status.container_statuses.first();
    match ctr.and_then(|c| c.last_exit_code) {
        Some(code) if ctr.is_some_and(|c| c.state == ContainerState::Terminated) => {
            if let Some(reason) = ctr.and_then(|c| c.reason.clone()).filter(|r| r != "Completed" && r != "Error") {
                eprintln!("pinion: pod {}: {reason}", pod.metadata.name);
            }
            code.clamp(0, 255) as u8
        }
        _ => {
            let why = status.message.or(status.reason).unwrap_or_else(|| format!("{:?}", status.phase));
            eprintln!("pinion: pod {} failed: {why}", pod.metadata.name);
            1
        }
    }
}
