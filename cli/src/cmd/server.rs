//! `pinion server`: the control plane (store, API, scheduler) until SIGTERM or
//! Ctrl-C; then it stops accepting, finishes in-flight requests and flushes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use orchestrator::server::{LocalListen, Server, ServerOptions};
use orchestrator::store::EtcdConfig;
use specs::pod::SchedulingStrategy;
use tokio::signal::unix::{signal, SignalKind};

use crate::cmd::server_opts::{Access, NodeLoss, PodNetwork, Retention};
use crate::common::{parse_kebab, GlobalArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where the store, the CA, the admin credentials and the join token live.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/pinion")]
    pub data_dir: PathBuf,
    /// Address to listen on (HTTPS).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:7443")]
    pub listen: String,
    /// Also serve the web view (`/ui/`) and the read-only JSON it reads over
    /// plain HTTP on this loopback address (IP:PORT), for a browser here or
    /// through `ssh -L`; no client certificate is asked for.
    #[arg(long, value_name = "ADDR")]
    pub local_listen: Option<String>,
    /// Extra DNS names or IP addresses for the server certificate (repeatable).
    #[arg(long = "tls-san", value_name = "NAME")]
    pub tls_sans: Vec<String>,
    /// Seconds without a heartbeat before a node becomes NotReady.
    #[arg(long, value_name = "SECONDS", default_value_t = 40)]
    pub heartbeat_grace: u64,
    /// See only each node's totals, as the default Kubernetes scheduler does:
    /// no NUMA check, no plan; the nodelet decides and may reject (for
    /// comparing; pods still land, with retries).
    #[arg(long)]
    pub topology_blind: bool,
    /// The cluster's scoring strategy (a pod's spec.schedulingStrategy wins):
    /// least-allocated | most-allocated | balanced | least-numa-nodes.
    #[arg(long, value_name = "S", default_value = "least-allocated", value_parser = parse_kebab::<SchedulingStrategy>)]
    pub scheduling_strategy: SchedulingStrategy,
    /// sled's page cache, in MiB (the rest of the store is read from disk).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub store_cache_mib: u64,
    #[command(flatten)]
    pub retention: Retention,
    #[command(flatten)]
    pub node_loss: NodeLoss,
    /// Largest request body accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub body_limit: usize,
    /// The URL nodes and users on other machines reach this server by
    /// (`https://HOST:PORT`): a joining node is given it, and on etcd every
    /// server's, so a node that joins through one server knows them all.
    #[arg(long, value_name = "URL")]
    pub advertise_url: Option<String>,
    /// Keep the cluster's state in etcd instead of the data dir's store:
    /// endpoints, comma-separated or repeated (`https://HOST:2379`). Several
    /// servers on one etcd each serve the API; one at a time schedules.
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The CA that signed etcd's certificates (for https endpoints).
    #[arg(long, value_name = "FILE", requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// This server's etcd client certificate, when etcd asks for one.
    #[arg(long, value_name = "FILE", requires_all = ["etcd", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// The key of `--etcd-cert`.
    #[arg(long, value_name = "FILE", requires_all = ["etcd", "etcd_cert"])]
    pub etcd_key: Option<PathBuf>,
    /// The cluster's keys in etcd start with this (one etcd may hold several clusters).
    #[arg(long, value_name = "PREFIX", default_value = "/pinion/", requires = "etcd")]
    pub etcd_prefix: String,
    /// etcd's `--max-txn-ops`, when raised there (its default is 128): a
    /// commit's batch holds up to this many operations.
    #[arg(long, value_name = "N", default_value_t = 128, requires = "etcd")]
    pub etcd_max_txn_ops: usize,
    /// etcd's `--max-request-bytes`, when raised there (its default is 1.5 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 1536 * 1024, requires = "etcd")]
    pub etcd_max_request_bytes: usize,
    /// Most commits in flight to etcd at once (1: each waits for the one
    /// before); the next batch is sent while one waits for etcd's fsyncs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16), requires = "etcd")]
    pub etcd_pipeline_depth: u64,
    /// Seconds between compactions of etcd's history by the leader (0: none,
    /// where etcd runs with `--auto-compaction-retention`). A watch resumes
    /// from up to this far back; older, it is told to list again.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, requires = "etcd")]
    pub etcd_compaction_interval: u64,
    /// Seconds a leader's lease lives without renewal: a dead leader is
    /// replaced within about this long (etcd only).
    #[arg(long, value_name = "SECONDS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub leader_ttl: u64,
    #[command(flatten)]
    pub access: Access,
    #[command(flatten)]
    pub pod_network: PodNetwork,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let mut opts = ServerOptions::new(&args.data_dir, &args.listen);
    opts.api.liveness = g.liveness();
    opts.tls_sans = args.tls_sans;
    opts.controller.heartbeat_grace = Duration::from_secs(args.heartbeat_grace.max(1));
    args.retention.apply(&mut opts);
    args.node_loss.apply(&mut opts);
    opts.api.body_limit = args.body_limit;
    opts.store.cache_bytes = args.store_cache_mib.max(1) << 20;
    opts.controller.scheduler.topology_aware = !args.topology_blind;
    opts.controller.scheduler.default_strategy = args.scheduling_strategy;
    opts.leader_ttl = Duration::from_secs(args.leader_ttl);
    args.access.apply(&mut opts)?;
    args.pod_network.apply(&mut opts)?;
    opts.local_listen = args.local_listen.map(|addr| LocalListen { addr, if_free: false });
    if let Some(url) = &args.advertise_url {
        if let Err(e) = pinion_wire::parse_url(url) {
            anyhow::bail!("--advertise-url: {e}");
        }
        opts.advertise_url = Some(url.clone());
    }
    if !args.etcd.is_empty() {
        opts.etcd = Some(EtcdConfig {
            endpoints: args.etcd.clone(),
            ca: args.etcd_ca.clone(),
            cert: args.etcd_cert.clone(),
            key: args.etcd_key.clone(),
            prefix: args.etcd_prefix.clone(),
        });
        opts.etcd_options.max_txn_ops = args.etcd_max_txn_ops.max(8);
        opts.etcd_options.max_request_bytes = args.etcd_max_request_bytes.max(64 << 10);
        opts.etcd_options.pipeline_depth = usize::try_from(args.etcd_pipeline_depth).unwrap_or(1);
        opts.etcd_options.compaction_interval =
            (args.etcd_compaction_interval > 0).then(|| Duration::from_secs(args.etcd_compaction_interval));
    }
    let server = Server::bind(opts).await?;
    // Before the server says it listens (and systemd that it is ready): a
    // SIGTERM from then on is a clean stop, never the default death.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let dir = args.data_dir.display();
    if server.first_start {
        outln!("first start: created a CA in {dir}/pki");
        outln!("join token (also in {dir}/join-token): {}", server.join_token);
        outln!(
            "join a node: pinion agent --server https://THIS-HOST:{} --token {} --data-dir /var/lib/pinion",
            server.local_addr().port(),
            server.join_token
        );
    }
    outln!("admin credentials: {} (use --config or PINION_CONFIG)", server.admin_config.display());
    outln!("listening on {} ({})", server.local_addr(), server.server_url());
    if let Some(addr) = server.local_listen_addr() {
        outln!("web view: http://{addr}/ui/ (plain HTTP on loopback, read-only)");
    }
    crate::common::notify_ready();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(stopped));
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    crate::common::daemon_note(&g, "shutting down: finishing in-flight requests");
    crate::common::notify_stopping();
    let _ = stop.send(true);
    task.await??;
    Ok(ExitCode::SUCCESS)
}
