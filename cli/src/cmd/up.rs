//! `pinion up`: the all-in-one default. The server and a nodelet on this host in
//! one process; the nodelet joins its own server over loopback with the join
//! token, exactly as a remote one would, so the single-box setup exercises the
//! same paths as a cluster. The first core's threads are reserved for the system
//! (the kubelet's `--reserved-cpus`), and the admin credentials are written where
//! the CLI looks by default, so the next command can be `pinion apply`/`pinion run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use orchestrator::server::{LocalListen, Server, ServerOptions};
use orchestrator::tls::Credentials;
use specs::CpuSet;
use tokio::signal::unix::{signal, SignalKind};

use crate::cmd::agent::{NodeArgs, RunArgs};
use crate::cmd::server_opts::{Access, NodeLoss, PodNetwork, Retention};
use crate::common::GlobalArgs;

/// The web view's port under `pinion up`, so the quick start can name it.
const DEFAULT_LOCAL_LISTEN: &str = "127.0.0.1:7480";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Server state under DIR/server, the nodelet's under DIR/node.
    #[arg(long, value_name = "DIR", env = "PINION_DATA_DIR", default_value = "/var/lib/pinion")]
    pub data_dir: PathBuf,
    /// Address the API listens on (HTTPS). Loopback by default: open it up with care.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7443")]
    pub listen: String,
    /// The web view (`/ui/`) and the read-only JSON it reads, over plain HTTP
    /// on this loopback address (IP:PORT); `off` for none. Without the flag,
    /// 127.0.0.1:7480 when that port is free.
    #[arg(long, value_name = "ADDR")]
    pub local_listen: Option<String>,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub retention: Retention,
    #[command(flatten)]
    pub node_loss: NodeLoss,
    #[command(flatten)]
    pub access: Access,
    #[command(flatten)]
    pub pod_network: PodNetwork,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    if !g.servers.is_empty() {
        anyhow::bail!("--server: `pinion up` runs its own server (use `pinion agent --server URL` to join another)");
    }
    let topology = args.node.topology.load().context("loading the topology")?;
    let mut node_args = args.node.clone();
    let reserved = node_args.reserved_cpus.get_or_insert_with(|| first_core(&topology).to_string()).clone();
    // The node's flags as `pinion agent` takes them; the join is filled in
    // once the server is up.
    let node = |join: Option<(String, String, PathBuf)>| {
        let (servers, token, ca) = join.map_or((Vec::new(), None, None), |(s, t, c)| (vec![s], Some(t), Some(c)));
        RunArgs {
            manifests: None,
            data_dir: args.data_dir.join("node"),
            node: node_args.clone(),
            servers,
            token,
            token_file: None,
            ca,
            labels: Vec::new(),
            endpoint_listen: "127.0.0.1:0".into(),
            advertise_address: None,
            rescan_seconds: 10,
            // The node's metrics are on its endpoint, for the admin `up` made.
            local_listen: None,
        }
    };
    // The node's configuration before anything starts: a flag `pinion agent`
    // would refuse stops `up` here.
    let mut config = crate::cmd::agent::daemon_config(node(None), g.liveness())?;
    // The server's and the node's data dirs are inside: neither is reachable
    // through this one by another user.
    nodelet::fsutil::private_dir(&args.data_dir).with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    // A cluster in one command gives its pods addresses: the default
    // network unless the operator has one, and only on a host that can run
    // it (else pods get only `lo`, and the node and this screen say why).
    let network = match (&config.runtime, &config.agent.cni) {
        (nodelet::daemon::RuntimeChoice::Libcontainer { .. }, Some(cni)) => {
            let cni = cni.clone();
            let prepared = tokio::task::spawn_blocking(move || nodelet::netcheck::prepare(&cni))
                .await
                .context("checking the pod network")?
                .with_context(|| format!("--cni-conf-dir {}", args.node.cni_conf_dir.display()))?;
            config.agent.network_unfit = prepared.unfit().cloned();
            Some(prepared)
        }
        _ => None,
    };
    let server_dir = args.data_dir.join("server");
    let mut opts = ServerOptions::new(&server_dir, &args.listen);
    opts.controller.heartbeat_grace = Duration::from_secs(40);
    opts.api.liveness = g.liveness();
    args.retention.apply(&mut opts);
    args.node_loss.apply(&mut opts);
    args.access.apply(&mut opts)?;
    opts.local_listen = match args.local_listen.as_deref() {
        None => Some(LocalListen { addr: DEFAULT_LOCAL_LISTEN.into(), if_free: true }),
        Some("off") => None,
        Some(addr) => Some(LocalListen { addr: addr.into(), if_free: false }),
    };
    args.pod_network.apply(&mut opts)?;
    let server = Server::bind(opts).await?;
    let web = server.local_listen_addr();
    let url = server.server_url();
    let token = server.join_token.to_string();
    let admin = Credentials::load(&server.admin_config)?;
    let config_path = install_admin_config(&g, &admin, &server.admin_config)?;

    // Before it says it is up: a SIGTERM from then on stops it cleanly.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server_task = tokio::spawn(server.run(stop_rx.clone()));
    config.join =
        crate::cmd::agent::join_config(&node(Some((url.clone(), token, server_dir.join("pki/ca.crt")))), g.liveness())?;
    let node_task = tokio::spawn(nodelet::daemon::run(config, stop_rx));

    outln!("pinion is up: server {url}, this host as a node (CPUs {reserved} reserved for the system)");
    outln!("credentials: {}", config_path.display());
    if let Some(addr) = web {
        outln!("web view: http://{addr}/ui/ (from another machine: ssh -L 7480:{addr} THIS-HOST)");
    }
    if let Some(network) = &network {
        out!("{}", network_lines(network));
    }
    outln!("try:  pinion run hello --cpus 1 -- grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status");
    outln!("      pinion apply -f specs/examples/pinned.yaml && pinion get pods -o wide");
    outln!("stop: Ctrl-C (containers keep running; the next `pinion up` adopts them)");
    crate::common::notify_ready();

    tokio::pin!(node_task);
    let early = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        r = &mut node_task => Some(r),
    };
    let _ = stop_tx.send(true);
    let node_result = match early {
        Some(r) => r,
        None => node_task.await,
    };
    server_task.await.context("server task")??;
    node_result.context("node task")??;
    Ok(ExitCode::SUCCESS)
}

/// What the first screen says of the pod network, once.
fn network_lines(network: &nodelet::netcheck::Prepared) -> String {
    use nodelet::netcheck::Prepared;
    match network {
        Prepared::Written(file) => {
            format!("pod network: {} (written now; `pinion down` removes it)\n", file.display())
        }
        Prepared::Kept(file) => format!("pod network: {}\n", file.display()),
        Prepared::Unfit { unfit, file } => {
            let mut out = match file {
                Some(file) => format!("pod network: NONE, pods get only lo: {}: {unfit}\n", file.display()),
                None => format!("pod network: NONE (none written), pods get only lo: {unfit}\n"),
            };
            if let Some(fix) = unfit.fix() {
                out.push_str(&format!("      fix: {fix}, then start pinion up again\n"));
            }
            out
        }
    }
}

/// The threads of the machine's first core, like a kubelet's usual `--reserved-cpus`.
fn first_core(t: &specs::NodeTopology) -> CpuSet {
    match t.cpus.first() {
        Some(c0) => t.all_cpus().filter(|id| t.cpu(id).is_some_and(|c| c.core == c0.core)),
        None => CpuSet::new(),
    }
}

/// Writes the admin credentials where the CLI looks by default, unless a file
/// there already points at another server (then it says which `--config` to use).
fn install_admin_config(g: &GlobalArgs, admin: &Credentials, source: &std::path::Path) -> anyhow::Result<PathBuf> {
    let path = crate::config::path(g)?;
    if path.exists() {
        if let Ok(existing) = Credentials::load(&path) {
            if existing.servers != admin.servers {
                eprintln!(
                    "note: {} points at {}; use --config {} (or PINION_CONFIG) for this cluster",
                    path.display(),
                    existing.servers.join(", "),
                    source.display()
                );
                return Ok(source.to_path_buf());
            }
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    admin.save(&path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodelet::netcheck::{Prepared, Unfit};

    #[test]
    fn the_first_screen_says_what_became_of_the_pod_network() {
        let file = PathBuf::from("/etc/cni/net.d/10-pinion.conflist");
        let missing = Unfit::PluginMissing { plugin: "bridge".into(), dirs: "/usr/lib/cni:/opt/cni/bin".into() };
        let check = |p: Prepared, want: &str| assert_eq!(network_lines(&p), want);
        check(
            Prepared::Written(file.clone()),
            "pod network: /etc/cni/net.d/10-pinion.conflist (written now; `pinion down` removes it)\n",
        );
        check(Prepared::Kept(file.clone()), "pod network: /etc/cni/net.d/10-pinion.conflist\n");
        check(
            Prepared::Unfit { unfit: missing, file: None },
            "pod network: NONE (none written), pods get only lo: CNI plugin \"bridge\" not found in \
             /usr/lib/cni:/opt/cni/bin\n      fix: apt-get install containernetworking-plugins, then start pinion up again\n",
        );
        check(
            Prepared::Unfit { unfit: Unfit::CannotCheck { message: "unshare: EPERM".into() }, file: Some(file) },
            "pod network: NONE, pods get only lo: /etc/cni/net.d/10-pinion.conflist: cannot check the pod network: \
             unshare: EPERM\n",
        );
    }
}
