//! The node daemon as a library (as `orchestrator::server` is for the control
//! plane): `run(config, shutdown)` starts the agent with its sources (the
//! static-pod folder, and when joined the link to the orchestrator plus the
//! node's HTTPS endpoint) and returns once they are all stopped. `pinion agent`
//! and `pinion up` only parse flags into a `DaemonConfig` and call it.
//!
//! Order at start: the data dir (made private, see `datadir`), then the join
//! (a bad token is a clear error, not a silent retry loop), then the
//! endpoint's listener, then the runtime (with the real runtime, this process
//! confines itself to the reserved CPUs), then the agent. Containers outlive
//! the daemon.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::agent::{AgentConfig, AgentError};
use crate::link::{LinkConfig, LinkError};
use crate::runtime::{Runtime, RuntimeError};
use crate::source::NodeReport;

/// How long the link and the endpoint get to end after the agent stopped.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Which container runtime the agent drives.
#[derive(Debug, Clone)]
pub enum RuntimeChoice {
    /// Real containers through libcontainer; `shim` is the binary re-executed
    /// per container (`pinion shim`).
    Libcontainer { shim: PathBuf },
    /// Everything but the processes (simulation, benchmarks, tests).
    Hollow,
}

/// Joining an orchestrator.
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// `https://HOST:PORT` of each server of the cluster, tried in this order.
    pub servers: Vec<String>,
    /// The bootstrap token; first start only (the credentials stay in `DATA/node.conf`).
    pub token: Option<String>,
    /// The server's CA certificate, for a token without a CA pin.
    pub ca: Option<PathBuf>,
    /// Node labels for the scheduler's nodeSelector.
    pub labels: BTreeMap<String, String>,
    /// Where the node's HTTPS endpoint listens: `IP:PORT`, or `:PORT` for
    /// the node's own address (`advertise_address`, else the one on the
    /// route to the server); port 0 picks a free one.
    pub endpoint_listen: String,
    /// The address the server calls the endpoint on [default: the listener's
    /// address, or this host's address on the route to the server].
    pub advertise_address: Option<IpAddr>,
    /// The address the other nodes reach this one on, for their routes to
    /// its pods (`spec.address`) [default: `advertise_address`, else this
    /// host's address on the route to the server: what reaches the server
    /// is what the peers can reach].
    pub node_address: Option<IpAddr>,
    /// The streams' heartbeat and silence bound; must match the server's.
    pub liveness: specs::api::Liveness,
    /// Connections the endpoint serves at once; its accept loop waits beyond.
    pub endpoint_max_connections: usize,
}

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The agent's settings; `data_dir` is created and made absolute.
    pub agent: AgentConfig,
    pub runtime: RuntimeChoice,
    /// Static pods: a folder of manifests, rescanned in full this often.
    pub manifests: Option<(PathBuf, Duration)>,
    pub join: Option<JoinConfig>,
    /// Told once the node has joined, its endpoint listens and its runtime
    /// is open, as the agent starts (what `Type=notify` readiness reports).
    pub ready: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// A loopback address serving `GET /metrics` in plain HTTP, for a
    /// scraper on this machine (`--local-listen`); port 0 picks a free one.
    pub local_listen: Option<SocketAddr>,
    /// Where the node's view of the pod network (its range, its peers:
    /// `peers::NetView`) is published, for a caller that follows it; `None`:
    /// the daemon makes its own.
    pub net_view: Option<watch::Sender<crate::peers::NetView>>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("nothing to run: give --manifests DIR (static pods) and/or --server URL (join an orchestrator)")]
    NothingToRun,
    #[error("--manifests {}: not a directory", .0.display())]
    NoManifestFolder(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("--endpoint-listen {addr}: {source}")]
    EndpointListen { addr: String, source: std::io::Error },
    #[error("--local-listen {0}: only a loopback address (127.0.0.0/8, ::1) may serve unauthenticated metrics")]
    LocalListenNotLoopback(SocketAddr),
    #[error("--local-listen {addr}: {source}")]
    LocalListen { addr: SocketAddr, source: std::io::Error },
    #[error("no server to join: give --server URL")]
    NoServers,
    #[error("finding this host's address towards {server}; give --advertise-address: {source}")]
    Route { server: String, source: std::io::Error },
    #[error("the node certificate ({}): {source}", path.display())]
    NodeCertificate { path: PathBuf, source: pinion_wire::tls::TlsError },
    #[error("the container runtime: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("the agent's cgroups: {0}")]
    Cgroups(String),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("--data-dir: {0}")]
    DataDir(#[from] crate::datadir::DataDirError),
    #[error("--cni-conf-dir: {0}")]
    Network(String),
}

/// Runs the node until `shutdown` turns true (or the agent fails).
pub async fn run(config: DaemonConfig, shutdown: watch::Receiver<bool>) -> Result<(), DaemonError> {
    let DaemonConfig { mut agent, runtime, manifests, join, ready, local_listen, net_view } = config;
    if manifests.is_none() && join.is_none() {
        return Err(DaemonError::NothingToRun);
    }
    let local = match local_listen {
        Some(addr) => Some(bind_local(addr).await?),
        None => None,
    };
    if let Some((dir, _)) = &manifests {
        if !dir.is_dir() {
            return Err(DaemonError::NoManifestFolder(dir.clone()));
        }
    }
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| DaemonError::Io { path, source }
    };
    // Before anything writes there (the join's key, the checkpoint).
    crate::datadir::prepare(&agent.data_dir)?;
    agent.data_dir = agent.data_dir.canonicalize().map_err(io(&agent.data_dir))?;
    // The node's view of the pod network: its own range (as last recorded,
    // until a registration says), and its peers once joined; the link
    // writes it. A part that acts on it takes `net_view_tx.subscribe()`, a
    // `watch::Receiver<peers::NetView>`.
    let net_view_tx = match net_view {
        Some(tx) => {
            let own = crate::peers::read_own_cidr(&crate::peers::own_cidr_path(&agent.data_dir));
            tx.send_modify(|v| v.own_cidr = own);
            tx
        }
        None => crate::peers::channel(&agent.data_dir).0,
    };
    let joined = match join {
        Some(join) => Some(prepare_join(&agent, join).await?),
        None => None,
    };
    agent.cni = pod_network(agent.cni.take(), &runtime)?;
    // Real containers run on real CPUs: their pods' tuning writes the
    // host's /proc and /sys (unless the caller pointed it elsewhere).
    if matches!(runtime, RuntimeChoice::Libcontainer { .. }) && agent.tuning_root.is_none() {
        agent.tuning_root = Some(PathBuf::from("/"));
    }
    let runtime = start_runtime(&agent, &runtime)?;

    // The link and the endpoint stop on `shutdown` or when the agent returns.
    let (stop_tx, stop) = watch::channel(false);
    let mut outer = shutdown.clone();
    let forward = {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            let _ = outer.wait_for(|s| *s).await;
            let _ = stop_tx.send(true);
        })
    };
    let (changes_tx, changes_rx) = mpsc::channel(256);
    let (report_tx, report_rx) = watch::channel(NodeReport::default());
    let mut tasks = Vec::new();
    if let Some((dir, rescan)) = manifests {
        let stopped = stopped(stop.clone());
        let changes = changes_tx.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::manifests::watch(dir, changes, rescan.max(Duration::from_secs(1)), stopped).await {
                tracing::error!(error = %e, "static pods: the manifest folder is no longer watched");
            }
        }));
    }
    if let Some(Joined { link, creds, live, listener, tls, endpoint }) = joined {
        let endpoint = crate::endpoint::serve(
            listener,
            tls,
            endpoint,
            agent.data_dir.clone(),
            report_rx.clone(),
            runtime.clone(),
            agent.metrics.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(endpoint));
        let link = crate::link::run(link, creds, live, changes_tx, report_rx, net_view_tx.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = link.await {
                tracing::error!(error = %e, "the link to the server stopped");
            }
        }));
    } else {
        drop(changes_tx);
    }
    // On the default network (the node's range, set up by Pinion): routes
    // to the other nodes' ranges, and the masquerade of its own.
    if let Some(cni) = agent.cni.as_ref().filter(|c| crate::cni::uses_default_network(&c.conf_dir)) {
        let (view, mode) = (net_view_tx.subscribe(), agent.pod_routes);
        tracing::debug!(dir = %cni.conf_dir.display(), ?mode, "routes to peers' pods follow the node's view");
        let stopped = stopped(stop.clone());
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                r = crate::routes::run(view, mode, crate::cni::DEFAULT_SUBNET.parse().ok()) => {
                    if let Err(e) = r {
                        tracing::error!(error = %e, "routes to other nodes' pods are no longer kept");
                    }
                }
                () = stopped => {}
            }
        }));
    }
    if let Some(listener) = local {
        // A scraper, not a crowd: a few connections at once.
        let local = crate::endpoint::serve_local(listener, agent.metrics.clone(), 16, stop.clone());
        tasks.push(tokio::spawn(local));
    }
    if let Some(ready) = ready {
        ready.notify_one();
    }
    let result = crate::agent::run(agent, runtime, changes_rx, report_tx, stopped(shutdown)).await;
    let _ = stop_tx.send(true);
    forward.abort();
    for mut t in tasks {
        if tokio::time::timeout(STOP_TIMEOUT, &mut t).await.is_err() {
            t.abort();
        }
    }
    Ok(result?)
}

/// The `--local-listen` socket: loopback only, refused before anything starts.
async fn bind_local(addr: SocketAddr) -> Result<TcpListener, DaemonError> {
    if !addr.ip().is_loopback() {
        return Err(DaemonError::LocalListenNotLoopback(addr));
    }
    TcpListener::bind(addr).await.map_err(|source| DaemonError::LocalListen { addr, source })
}

/// The pod network the agent uses: none with the hollow runtime (its pods
/// get no address), none when the configuration folder holds no network
/// (pods keep a namespace with only `lo`; said once, here).
fn pod_network(
    cni: Option<crate::cni::CniConfig>,
    runtime: &RuntimeChoice,
) -> Result<Option<crate::cni::CniConfig>, DaemonError> {
    let Some(cni) = cni else { return Ok(None) };
    if matches!(runtime, RuntimeChoice::Hollow) {
        return Ok(None);
    }
    match crate::cni::config_file(&cni.conf_dir).map_err(|e| DaemonError::Network(e.to_string()))? {
        Some(file) => {
            tracing::info!(file = %file.display(), "pod network through CNI");
            Ok(Some(cni))
        }
        None => {
            tracing::warn!(
                dir = %cni.conf_dir.display(),
                "no CNI network configuration found; pods without hostNetwork get a network namespace with only lo"
            );
            Ok(None)
        }
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

struct Joined {
    link: LinkConfig,
    creds: pinion_wire::tls::Credentials,
    /// The node certificate the link and the endpoint present; renewals replace it.
    live: Arc<pinion_wire::tls::LiveIdentity>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    endpoint: crate::endpoint::EndpointConfig,
}

async fn prepare_join(agent: &AgentConfig, join: JoinConfig) -> Result<Joined, DaemonError> {
    let mut link = LinkConfig {
        servers: join.servers.clone(),
        token: join.token,
        ca: join.ca,
        data_dir: agent.data_dir.clone(),
        node_name: agent.node_name.clone(),
        topology: agent.topology.clone(),
        settings: agent.settings.clone(),
        labels: join.labels,
        endpoint: None,
        address: None,
        liveness: join.liveness,
    };
    let creds = crate::link::credentials(&link).await?;
    let listen_err = |source| DaemonError::EndpointListen { addr: join.endpoint_listen.clone(), source };
    // `:PORT` (the default) listens on the node's own address only: the one
    // it advertises, else the one on its route to the server. An address
    // given in full (`0.0.0.0:PORT` included) is taken as said.
    let node_address = || -> Result<IpAddr, DaemonError> {
        match join.advertise_address {
            Some(ip) => Ok(ip),
            // The servers of one site share a route; the first one stands for all.
            None => {
                let server = creds.servers.first().ok_or(DaemonError::NoServers)?;
                route_address(server).map_err(|source| DaemonError::Route { server: server.clone(), source })
            }
        }
    };
    let listener = match join.endpoint_listen.strip_prefix(':') {
        Some(port) => {
            let port: u16 = port.parse().map_err(|_| {
                listen_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a port (use :PORT or IP:PORT)"))
            })?;
            TcpListener::bind(SocketAddr::new(node_address()?, port)).await.map_err(listen_err)?
        }
        None => TcpListener::bind(&join.endpoint_listen).await.map_err(listen_err)?,
    };
    let local = listener.local_addr().map_err(listen_err)?;
    let ip = match join.advertise_address {
        Some(ip) => ip,
        None if !local.ip().is_unspecified() => local.ip(),
        None => node_address()?,
    };
    let certificate_error =
        |source| DaemonError::NodeCertificate { path: crate::link::credentials_path(&agent.data_dir), source };
    let live = pinion_wire::tls::LiveIdentity::new(&creds).map_err(certificate_error)?;
    let tls = creds.serving_config_live(live.clone()).map_err(certificate_error)?;
    link.endpoint = Some(SocketAddr::new(ip, local.port()).to_string());
    link.address = Some(match join.node_address {
        Some(ip) => ip,
        None => node_address()?,
    });
    let endpoint =
        crate::endpoint::EndpointConfig { liveness: join.liveness, max_connections: join.endpoint_max_connections };
    Ok(Joined { link, creds, live, listener, tls: Arc::new(tls), endpoint })
}

/// The local address the kernel would use to reach `server` (a UDP "connect"
/// sends nothing; it only picks the route).
fn route_address(server: &str) -> std::io::Result<IpAddr> {
    let authority = server.trim_start_matches("https://").trim_end_matches('/');
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    sock.connect(authority)?;
    Ok(sock.local_addr()?.ip())
}

fn start_runtime(agent: &AgentConfig, choice: &RuntimeChoice) -> Result<Arc<dyn Runtime>, DaemonError> {
    Ok(match choice {
        RuntimeChoice::Hollow => Arc::new(crate::runtime::hollow::HollowRuntime::new(&agent.data_dir)?),
        RuntimeChoice::Libcontainer { shim } => {
            // The node's own work stays on the reserved CPUs, off the pods'
            // exclusive ones (the kubelet leaves this to systemd's CPUAffinity).
            let reserved = &agent.settings.reserved_cpus;
            if !reserved.is_empty() {
                match crate::affinity::confine_process(reserved) {
                    Ok(n) => tracing::info!(cpus = %reserved, threads = n, "pinion confined to the reserved CPUs"),
                    Err(e) => tracing::warn!(error = %e, "cannot confine pinion to the reserved CPUs"),
                }
            }
            use crate::runtime::libcontainer::{cgroups, LibcontainerRuntime};
            let parent = cgroups::settle_parent().map_err(DaemonError::Cgroups)?;
            Arc::new(LibcontainerRuntime::new(&agent.data_dir, shim)?.with_cgroup_parent(parent))
        }
    })
}
