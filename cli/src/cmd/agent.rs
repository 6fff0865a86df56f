//! `pinion agent`: runs the node agent on this machine with pods from a manifest
//! folder (static pods) and/or bound by an orchestrator (`--server URL --token T`),
//! and `pinion agent status` prints what it last reported.
//!
//! This file only parses flags (topology, settings, devices, the runtime, the
//! sources) into a `nodelet::daemon::DaemonConfig` and calls
//! `nodelet::daemon::run`. SIGTERM or SIGINT stops the agent and leaves
//! containers running (they outlive it; a restarted agent adopts them).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use nodelet::agent::resettle::OnSettingsChange;
use nodelet::agent::AgentConfig;
use nodelet::daemon::{DaemonConfig, JoinConfig, RuntimeChoice};
use nodelet::source::NodeReport;
use specs::{CpuManagerOptions, CpuSet, NodeSettings, NodeTopology, TopologyPolicy, TopologyScope};
use tokio::sync::watch;

use crate::common::{parse_kebab, GlobalArgs, Output, TopologyArgs};

const DEFAULT_DATA_DIR: &str = "/var/lib/pinion";

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<AgentCommand>,
    // Boxed: the flags are many and `Command` holds every verb's `Args` inline.
    #[command(flatten)]
    pub run: Box<RunArgs>,
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Print the status the agent last wrote under its data dir.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The agent's data directory (`pinion up` keeps its node's under DIR/node:
    /// that is read when DIR itself holds no status).
    #[arg(long, value_name = "DIR", env = "PINION_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Where the status to print is: DIR (an agent's data dir) or DIR/node (the
/// node of `pinion up --data-dir DIR`), whichever holds one, DIR first.
fn status_dir(dir: &Path) -> Option<PathBuf> {
    [dir.to_path_buf(), dir.join("node")].into_iter().find(|d| nodelet::agent::status::path(d).is_file())
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// Real containers through youki's libcontainer.
    Libcontainer,
    /// Everything but the processes (simulation, benchmarks).
    Hollow,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Folder of pod manifests (static pods): one pod per `.yaml`/`.yml`/`.json` file.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// Where the checkpoint, status, logs and container state live.
    #[arg(long, value_name = "DIR", env = "PINION_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub node: NodeArgs,
    /// The orchestrator's servers to join and follow (`https://HOST:PORT`),
    /// run the pods it binds here: the global `--server`, repeatable.
    #[arg(skip)]
    pub servers: Vec<String>,
    /// The server's bootstrap join token (first start only; `DIR/join-token`
    /// on the server). On a shared machine prefer --token-file or the
    /// environment: every local user can read a process's command line.
    #[arg(long, value_name = "TOKEN", env = "PINION_JOIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the join token (its first line), as `pinion install` writes it.
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// The server's CA certificate (its `pki/ca.crt`) for the first join; not
    /// needed with a token that pins the CA (`PIN.SECRET`, as the server prints it).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Node labels for the scheduler's nodeSelector (repeatable `K=V`).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Where the node's HTTPS endpoint (container logs, for the server) listens
    /// when joined: `:PORT` is the node's own address (--advertise-address,
    /// else the one on the route to the server), not every interface;
    /// `0.0.0.0:PORT` is every interface. Port 0 picks a free one. Open it to
    /// the server only.
    #[arg(long, value_name = "ADDR", default_value = ":10250")]
    pub endpoint_listen: String,
    /// The address the server should call the endpoint on [default: this
    /// host's address on the route to the server].
    #[arg(long, value_name = "IP")]
    pub advertise_address: Option<std::net::IpAddr>,
    /// How often the manifest folder is rescanned in full (inotify covers the rest).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, hide = true)]
    pub rescan_seconds: u64,
    /// Also serve `GET /metrics` (Prometheus) in plain HTTP on this loopback
    /// address, for a scraper on this machine (e.g. 127.0.0.1:9101); any
    /// other address is refused.
    #[arg(long, value_name = "ADDR")]
    pub local_listen: Option<std::net::SocketAddr>,
}

/// What the node is and how it admits pods: the flags `pinion agent` and
/// `pinion up` share.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    #[command(flatten)]
    pub topology: TopologyArgs,
    #[arg(long, value_enum, default_value = "libcontainer")]
    pub runtime: RuntimeKind,
    /// CPUs kept for the system: never exclusive (e.g. `0` or `0,32`);
    /// `pinion up` keeps the first core's threads when it is not given.
    #[arg(long, value_name = "LIST")]
    pub reserved_cpus: Option<String>,
    /// none | best-effort | restricted | single-numa-node
    #[arg(long, value_name = "P", value_parser = parse_kebab::<TopologyPolicy>)]
    pub topology_policy: Option<TopologyPolicy>,
    /// container | pod
    #[arg(long, value_name = "S", value_parser = parse_kebab::<TopologyScope>)]
    pub topology_scope: Option<TopologyScope>,
    /// KEY=true|false, the kubelet's CPU-manager options: full-pcpus-only,
    /// distribute-cpus-across-numa, align-by-socket, distribute-cpus-across-cores,
    /// prefer-align-cpus-by-uncorecache, strict-cpu-reservation; also
    /// prefer-closest-numa-nodes (repeatable).
    #[arg(long = "cpu-manager-option", value_name = "K=V")]
    pub cpu_manager_options: Vec<String>,
    /// YAML: resource name -> list of {address, deviceNodes}, over what
    /// discovery offers: a resource named here has exactly the devices listed
    /// (`[]`: none); a listed address moves to it.
    #[arg(long, value_name = "CONFIG")]
    pub devices: Option<PathBuf>,
    /// Offer the SR-IOV VFs of the PF with netdev PF as NAME rather than
    /// `pinion.io/sriov-vf-PF` (repeatable `PF=NAME`).
    #[arg(long = "sriov-resource", value_name = "PF=NAME")]
    pub sriov_resources: Vec<String>,
    /// This node's name in reports [default: the host name].
    #[arg(long, value_name = "N")]
    pub node_name: Option<String>,
    /// A running pod whose CPUs or alignment the settings no longer allow
    /// (after a restart with other --reserved-cpus, policy, options or
    /// devices): keep (report it, leave it running) | restart (report it,
    /// admit it again under the new settings, else hand it back to the scheduler).
    #[arg(long, value_name = "WHAT", default_value = "keep", value_parser = parse_kebab::<OnSettingsChange>)]
    pub on_settings_change: OnSettingsChange,
    /// The pod network: the first `.conflist`/`.conf`/`.json` here by name
    /// (none: pods without hostNetwork get a namespace with only lo).
    #[arg(long, value_name = "DIR", default_value = nodelet::cni::DEFAULT_CONF_DIR)]
    pub cni_conf_dir: PathBuf,
    /// Folders holding the CNI plugins, separated by `:`.
    #[arg(long, value_name = "DIRS", default_value = nodelet::cni::DEFAULT_BIN_DIRS)]
    pub cni_bin_dir: String,
    /// The address the other nodes reach this one on, for their routes to
    /// its pods [default: --advertise-address, else this host's address on
    /// the route to the server].
    #[arg(long, value_name = "IP")]
    pub node_address: Option<std::net::IpAddr>,
    /// Routes to the other nodes' pods on the default pod network: auto
    /// (direct where a node shares a subnet with this one, VXLAN where
    /// not) | vxlan (for every node) | off (Pinion makes none).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_pod_routes)]
    pub pod_routes: PodRoutes,
    /// Pod networks made ahead and kept waiting, so a pod's start does not
    /// wait for the CNI plugins (each holds an address and a veth pair); 0: none.
    #[arg(long, value_name = "N", default_value_t = nodelet::agent::DEFAULT_WARM_NETWORKS)]
    pub warm_pod_networks: usize,
    /// Each container's process limit (its cgroup's pids.max) when its pod
    /// sets no `spec.pidsLimit`, so one fork bomb cannot exhaust the host; 0: none.
    #[arg(long, value_name = "N", default_value_t = nodelet::agent::DEFAULT_POD_PIDS_LIMIT,
          value_parser = clap::value_parser!(u64).range(0..=specs::limits::MAX_PIDS_LIMIT))]
    pub pod_pids_limit: u64,
    /// A registry spoken to over plain HTTP, without TLS (a lab's own);
    /// repeatable. Credentials are read from DATA_DIR/auth.json (Docker's
    /// config.json shape) and CAs from DATA_DIR/certs.d/HOST[:PORT]/*.crt.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    /// Pull images of REGISTRY from MIRROR instead (docker.io=mirror.site:5000); repeatable.
    #[arg(long, value_name = "REGISTRY=MIRROR", value_parser = parse_mirror)]
    pub registry_mirror: Vec<(String, String)>,
    /// Images no container uses are removed when the image store's disk is
    /// fuller than this percent...
    #[arg(long, value_name = "PERCENT", default_value_t = 85, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub image_gc_high_threshold: u8,
    /// ...until it is below this one.
    #[arg(long, value_name = "PERCENT", default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_low_threshold: u8,
}

/// `--registry-mirror REGISTRY=MIRROR`.
pub(crate) fn parse_mirror(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((from, to)) if !from.is_empty() && !to.is_empty() && !to.contains('/') => {
            Ok((from.to_string(), to.to_string()))
        }
        _ => Err(format!("{s:?}: want REGISTRY=MIRROR, as docker.io=mirror.site:5000")),
    }
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(AgentCommand::Status(s)) => status(s),
        None => {
            let mut run = *args.run;
            run.servers = g.servers.clone();
            run_agent(run, g.liveness()).await
        }
    }
}

/// Applies `--sriov-resource` and `--devices` to what discovery offered
/// (`nodelet::devices` has the rule).
fn adjust_devices(args: &NodeArgs, topology: &mut NodeTopology) -> anyhow::Result<()> {
    let mut names = BTreeMap::new();
    for m in &args.sriov_resources {
        let (pf, name) = m.split_once('=').with_context(|| format!("--sriov-resource {m:?}: expected PF=NAME"))?;
        names.insert(pf.to_string(), name.to_string());
    }
    nodelet::devices::rename_sriov(topology, &names).context("--sriov-resource")?;
    if let Some(path) = &args.devices {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: nodelet::devices::DevicesFile =
            serde_yaml_ng::from_str(&text).with_context(|| format!("{}: not a devices config", path.display()))?;
        nodelet::devices::apply_file(topology, &file).with_context(|| path.display().to_string())?;
    }
    Ok(())
}

fn settings(args: &NodeArgs, topology: &NodeTopology) -> anyhow::Result<NodeSettings> {
    let reserved = match &args.reserved_cpus {
        Some(list) => CpuSet::parse_list(list).context("--reserved-cpus")?,
        None => topology.reserved_cpus.clone(),
    };
    let all = topology.all_cpus();
    if !reserved.is_subset(&all) {
        bail!("--reserved-cpus: CPUs {} are not on this machine (it has {all})", reserved.difference(&all));
    }
    let s = NodeSettings {
        reserved_cpus: reserved,
        topology_policy: args.topology_policy.unwrap_or_default(),
        topology_scope: args.topology_scope.unwrap_or_default(),
        cpu_manager: CpuManagerOptions::default(),
        ..Default::default()
    };
    with_cpu_manager_options(s, &args.cpu_manager_options)
}

/// Applies `--cpu-manager-option` flags to `settings` and refuses the
/// kubelet's incompatible combinations (`agent`, `up` and `plan`).
pub(crate) fn with_cpu_manager_options(mut settings: NodeSettings, options: &[String]) -> anyhow::Result<NodeSettings> {
    for opt in options {
        settings.set_option_flag(opt).map_err(|e| anyhow::anyhow!("--cpu-manager-option {opt}: {e}"))?;
    }
    settings.validate().map_err(|e| anyhow::anyhow!("--cpu-manager-option: {e}"))?;
    Ok(settings)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

async fn run_agent(args: RunArgs, liveness: specs::api::Liveness) -> anyhow::Result<ExitCode> {
    let mut config = daemon_config(args, liveness)?;
    let ready = std::sync::Arc::new(tokio::sync::Notify::new());
    config.ready = Some(ready.clone());
    // Before anything can say it is ready: a SIGTERM from then on stops it cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let node = tokio::spawn(nodelet::daemon::run(config, stop_rx));
    tokio::spawn(async move {
        ready.notified().await;
        crate::common::notify_ready();
    });
    tokio::pin!(node);
    let result = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        r = &mut node => Some(r),
    };
    let _ = stop_tx.send(true);
    let result = match result {
        Some(r) => r,
        None => {
            tracing::info!("signal received; stopping the agent, containers keep running");
            crate::common::notify_stopping();
            node.await
        }
    };
    result.context("agent task")??;
    Ok(ExitCode::SUCCESS)
}

/// The node daemon's configuration from the flags (also used by `pinion up`).
pub fn daemon_config(args: RunArgs, liveness: specs::api::Liveness) -> anyhow::Result<DaemonConfig> {
    let join = join_config(&args, liveness)?;
    let mut topology = args.node.topology.load().context("loading the topology")?;
    adjust_devices(&args.node, &mut topology)?;
    let mut settings = settings(&args.node, &topology)?;
    settings.devices = topology.device_resources();
    let device_nodes = topology.device_nodes();
    for (resource, addrs) in &settings.devices {
        tracing::info!(%resource, devices = addrs.len(), "device resource offered");
    }
    let node_name = args.node.node_name.clone().unwrap_or_else(host_name);
    let mut agent = AgentConfig::new(node_name, args.data_dir, topology, settings);
    agent.device_nodes = device_nodes;
    agent.sysfs_root = args.node.topology.sysfs_source();
    agent.on_settings_change = args.node.on_settings_change;
    agent.pod_pids_limit = (args.node.pod_pids_limit > 0).then_some(args.node.pod_pids_limit);
    agent.pod_routes = args.node.pod_routes.0;
    agent.warm_networks = args.node.warm_pod_networks;
    agent.registry.insecure = args.node.insecure_registry.clone();
    agent.registry.mirrors = args.node.registry_mirror.iter().cloned().collect();
    if args.node.image_gc_low_threshold > args.node.image_gc_high_threshold {
        anyhow::bail!(
            "--image-gc-low-threshold {} is above --image-gc-high-threshold {}",
            args.node.image_gc_low_threshold,
            args.node.image_gc_high_threshold
        );
    }
    agent.registry.gc_high = args.node.image_gc_high_threshold;
    agent.registry.gc_low = args.node.image_gc_low_threshold;
    // Used only with a configuration and real containers (`nodelet::daemon`).
    agent.cni = Some(nodelet::cni::CniConfig::new(
        args.node.cni_conf_dir.clone(),
        nodelet::cni::parse_bin_dirs(&args.node.cni_bin_dir),
    ));
    let runtime = match args.node.runtime {
        RuntimeKind::Hollow => RuntimeChoice::Hollow,
        // The shim is this same binary (`pinion shim`), re-executed per container.
        RuntimeKind::Libcontainer => RuntimeChoice::Libcontainer {
            shim: std::env::current_exe().context("finding the pinion binary for the shim")?,
        },
    };
    let manifests = args.manifests.map(|dir| (dir, Duration::from_secs(args.rescan_seconds.max(1))));
    Ok(DaemonConfig { agent, runtime, manifests, join, ready: None, local_listen: args.local_listen, net_view: None })
}

/// The join half of the node's configuration: none without `--server`.
/// (`pinion up` fills it in once its server is up.)
pub fn join_config(args: &RunArgs, liveness: specs::api::Liveness) -> anyhow::Result<Option<JoinConfig>> {
    let mut labels = BTreeMap::new();
    for l in &args.labels {
        let (k, v) = l.split_once('=').with_context(|| format!("--label {l:?}: expected K=V"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    if args.servers.is_empty() {
        return Ok(None);
    }
    let token = match &args.token_file {
        None => args.token.clone(),
        Some(path) => Some(read_token(path)?),
    };
    Ok(Some(JoinConfig {
        servers: args.servers.clone(),
        token,
        ca: args.ca.clone(),
        labels,
        endpoint_listen: args.endpoint_listen.clone(),
        advertise_address: args.advertise_address,
        node_address: args.node.node_address,
        liveness,
        endpoint_max_connections: nodelet::endpoint::EndpointConfig::default().max_connections,
    }))
}

/// The token in `path`: its first line, which must not be empty. A file
/// other users may read is used, with a warning.
fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::File::open(path).with_context(|| format!("--token-file {}", path.display()))?;
    let mode = f.metadata().with_context(|| format!("--token-file {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(file = %path.display(), mode = format!("{:o}", mode & 0o777), "the join token file is readable by other users; chmod 600 it");
    }
    // A token is a line; a bound keeps a wrong path (a device, a log) from being read whole.
    let mut text = String::new();
    Read::take(&mut f, 4096).read_to_string(&mut text).with_context(|| format!("--token-file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        bail!("--token-file {}: the file holds no token", path.display());
    }
    Ok(token.to_string())
}

fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let Some(dir) = status_dir(&args.data_dir) else {
        bail!(
            "no agent status under {} or {} (is an agent or `pinion up` running with --data-dir {}?)",
            nodelet::agent::status::path(&args.data_dir).display(),
            nodelet::agent::status::path(&args.data_dir.join("node")).display(),
            args.data_dir.display()
        );
    };
    // Which node's status this is, on stderr so that -o json stays clean;
    // with no agent running, it is the last one's, and how old it is.
    let path = nodelet::agent::status::path(&dir);
    eprintln!("reading {}", path.display());
    if nodelet::agent::status::agent_running(&dir) == Some(false) {
        let age = std::fs::metadata(&path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).map_or_else(
            || "at an unknown time".to_string(),
            |d| format!("{} ago", super::get::short_duration(d.as_secs() as i64)),
        );
        eprintln!("no agent is running on this data dir: this is the last status one wrote, {age}");
    }
    let report = nodelet::agent::status::read(&dir)?;
    let text = match args.output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
        Output::Yaml => serde_yaml_ng::to_string(&report)?,
        Output::Text => table(&report),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).context("writing to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// One row per container (one per pod when it has none yet), columns aligned.
pub fn table(report: &NodeReport) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "POD".into(),
        "PHASE".into(),
        "CONTAINER".into(),
        "STATE".into(),
        "RESTARTS".into(),
        "CPUS".into(),
        "MEMS".into(),
        "REASON".into(),
    ]];
    let dash = || "-".to_string();
    for (key, pod) in &report.pods {
        let phase = format!("{:?}", pod.phase);
        let pod_reason = match (&pod.reason, &pod.message) {
            (Some(r), Some(m)) => format!("{r}: {m}"),
            (Some(r), None) => r.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => dash(),
        };
        if pod.container_statuses.is_empty() {
            rows.push([key.clone(), phase, dash(), dash(), dash(), dash(), dash(), pod_reason]);
            continue;
        }
        for (i, c) in pod.container_statuses.iter().enumerate() {
            let placed = pod.placement.as_ref().and_then(|p| p.containers.iter().find(|pc| pc.name == c.name));
            let cpus = placed.map_or_else(dash, |p| p.cpus.to_string());
            let mems = placed.map_or_else(dash, |p| if p.mems.is_empty() { "all".into() } else { p.mems.to_string() });
            let mut reason = c.reason.clone().unwrap_or_default();
            if let Some(code) = c.last_exit_code {
                reason = if reason.is_empty() { format!("exit {code}") } else { format!("{reason} (exit {code})") };
            }
            if i == 0 && pod_reason != "-" {
                reason = if reason.is_empty() { pod_reason.clone() } else { format!("{reason}; {pod_reason}") };
            }
            if reason.is_empty() {
                reason = dash();
            }
            let (k, ph) = if i == 0 { (key.clone(), phase.clone()) } else { (String::new(), String::new()) };
            rows.push([
                k,
                ph,
                c.name.clone(),
                format!("{:?}", c.state),
                c.restart_count.to_string(),
                cpus,
                mems,
                reason,
            ]);
        }
    }
    let mut widths = [0usize; 8];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!("NODE {}\n", report.node_name);
    for r in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in r.iter().zip(widths).enumerate() {
            if i == 7 {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `--pod-routes`: a mode, or `off` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct PodRoutes(pub Option<nodelet::routes::Mode>);

fn parse_pod_routes(s: &str) -> Result<PodRoutes, String> {
    match s {
        "off" => Ok(PodRoutes(None)),
        other => other.parse().map(|m| PodRoutes(Some(m))).map_err(|e: String| format!("{e}, or off")),
    }
}
