//! A real server in-process with a short heartbeat, a cuttable relay in
//! front of it (`pinion_wire::testing::Relay`), hollow nodes that join it and the `pinion`
//! binary pointed at it: for the tests of dead and moved connections.
#![allow(dead_code)] // each test crate uses a part

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::process::Proc;
use nodelet::agent::AgentConfig;
use nodelet::daemon::{DaemonConfig, JoinConfig, RuntimeChoice};
use orchestrator::server::{Server, ServerOptions};
use orchestrator::tls::Credentials;
use pinion_wire::testing::{eventually, Relay};
use pinion_wire::Client;
use specs::api::Liveness;
use specs::{CpuSet, NodeSettings, Pod, PodPhase};
use tokio::sync::watch;

pub const PINION: &str = env!("CARGO_BIN_EXE_pinion");
pub const HEARTBEAT: Duration = Duration::from_millis(300);
/// A bound for what must follow within a few silence bounds (0.9 s each) and
/// a reconnect; the rule these tests replace took 20 to 35 s.
pub const SOON: Duration = Duration::from_secs(15);

pub fn liveness() -> Liveness {
    Liveness { heartbeat: HEARTBEAT }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub admin: Client,
    /// The admin's credentials (the server's URL).
    pub creds: Credentials,
    /// Where the server listens.
    pub addr: std::net::SocketAddr,
    /// In front of the server.
    pub relay: Relay,
    /// The admin's credentials with the relay's URL.
    pub relayed_config: PathBuf,
    pub token: String,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = ServerOptions::new(dir.path().join("server"), "127.0.0.1:0");
        opts.api.liveness = liveness();
        // Several of the link's 3 s heartbeats: one held up on the dead
        // connection until it is found dead must not make the node NotReady.
        opts.controller.heartbeat_grace = Duration::from_secs(10);
        let server = Server::bind(opts).await.expect("bind the server");
        let creds = Credentials::load(&server.admin_config).expect("admin config");
        let admin = Client::new(&creds).expect("admin client").with_liveness(liveness());
        let addr = server.local_addr();
        let relay = Relay::start(addr).expect("relay");
        let mut relayed = creds.clone();
        relayed.servers = vec![format!("https://127.0.0.1:{}", relay.addr.port())];
        let relayed_config = dir.path().join("relayed.conf");
        relayed.save(&relayed_config).expect("save the relayed config");
        let token = server.join_token.to_string();
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            server.run(rx).await.expect("the server runs and stops cleanly");
        });
        Cluster { dir, admin, creds, addr, relay, relayed_config, token, stop, tasks: vec![task] }
    }

    /// A hollow node `edge` that reaches the server through the relay, or directly.
    pub fn node(&mut self, through_relay: bool, direct: &str) -> PathBuf {
        let server =
            if through_relay { format!("https://127.0.0.1:{}", self.relay.addr.port()) } else { direct.into() };
        self.node_with_endpoint(vec![server], "127.0.0.1:0".into(), None)
    }

    /// A hollow node `edge` that knows the server by these URLs.
    pub fn node_of(&mut self, servers: Vec<String>) -> PathBuf {
        self.node_with_endpoint(servers, "127.0.0.1:0".into(), None)
    }

    /// `node` (reaching the server directly) whose endpoint the server
    /// reaches through a relay of its own, returned.
    pub fn node_behind_relay(&mut self) -> (PathBuf, Relay) {
        let direct = format!("https://{}", self.admin.authority());
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
        let endpoint: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        // The node registers its address with its listening port: the relay
        // takes that port on another loopback address.
        let relay = Relay::start_on(format!("127.0.0.2:{port}").parse().expect("addr"), endpoint)
            .expect("relay in front of the node");
        let advertise = Some("127.0.0.2".parse().expect("ip"));
        (self.node_with_endpoint(vec![direct], endpoint.to_string(), advertise), relay)
    }

    /// `node_of`, its endpoint listening on `listen` and registered as `advertise`.
    pub fn node_with_endpoint(
        &mut self,
        servers: Vec<String>,
        listen: String,
        advertise: Option<std::net::IpAddr>,
    ) -> PathBuf {
        let rx = self.stop.subscribe();
        self.named_node("edge", servers, listen, advertise, BTreeMap::new(), rx)
    }

    /// A hollow node `name` with `labels` that reaches the server directly,
    /// with a stop of its own (it stops with the cluster too): send `true`
    /// to stop only it.
    pub fn labelled_node(&mut self, name: &str, labels: &[(&str, &str)]) -> watch::Sender<bool> {
        let direct = format!("https://{}", self.admin.authority());
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (own, rx) = watch::channel(false);
        let mut cluster = self.stop.subscribe();
        let own_tx = own.clone();
        // The cluster's stop reaches this node through its own channel.
        self.tasks.push(tokio::spawn(async move {
            let _ = cluster.wait_for(|s| *s).await;
            let _ = own_tx.send(true);
        }));
        self.named_node(name, vec![direct], "127.0.0.1:0".into(), None, labels, rx);
        own
    }

    fn named_node(
        &mut self,
        name: &str,
        servers: Vec<String>,
        listen: String,
        advertise: Option<std::net::IpAddr>,
        labels: BTreeMap<String, String>,
        rx: watch::Receiver<bool>,
    ) -> PathBuf {
        let data = self.dir.path().join(name);
        let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0").expect("cpus"), ..Default::default() };
        let topology = specs::topology::synthetic::parse("pack:1 numa:1 core:8 pu:1").expect("topology");
        let config = DaemonConfig {
            ready: None,
            local_listen: None,
            net_view: None,
            agent: AgentConfig::new(name.into(), data.clone(), topology, settings),
            runtime: RuntimeChoice::Hollow,
            manifests: None,
            join: Some(JoinConfig {
                servers,
                token: Some(self.token.clone()),
                ca: None,
                labels,
                endpoint_listen: listen,
                advertise_address: advertise,
                node_address: None,
                liveness: liveness(),
                endpoint_max_connections: 16,
            }),
        };
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = nodelet::daemon::run(config, rx).await {
                panic!("the node daemon failed: {e}");
            }
        }));
        data
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        // A task that panicked (the server or a node failing) fails the test.
        for t in self.tasks {
            t.await.expect("a cluster task");
        }
    }

    pub async fn create(&self, name: &str) {
        let manifest = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}, annotations: {{pinion.io/wait-for-nodes: \"true\"}}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources:\n      limits: {{cpu: 1, memory: 64Mi}}\n"
        );
        self.admin.create_pod(Bytes::from(manifest)).await.expect("create the pod");
    }

    pub async fn running(&self, name: &str, within: Duration) -> Pod {
        eventually(&format!("pod {name} running"), within, || async {
            self.admin
                .get_pod(name)
                .await
                .ok()
                .filter(|p| p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running))
        })
        .await
    }

    /// `pinion ARGS` against the server through the relay, with the same
    /// heartbeat; its stdout lines come on the channel.
    pub fn cli(&self, args: &[&str]) -> (Proc, mpsc::Receiver<String>) {
        let mut cmd = Command::new(PINION);
        cmd.args(args)
            .env("PINION_CONFIG", &self.relayed_config)
            .env("PINION_STREAM_HEARTBEAT_MS", HEARTBEAT.as_millis().to_string())
            // What it says on failure shows with the test's.
            .stderr(Stdio::inherit());
        with_stdout_lines(cmd)
    }
}

/// Starts `cmd` with its stdout's lines sent to the receiver.
pub fn with_stdout_lines(mut cmd: Command) -> (Proc, mpsc::Receiver<String>) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn pinion");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (Proc(child), rx)
}

/// Lines from `rx` until one satisfies `done` (all of them, that one included).
pub fn lines_until(
    rx: &mpsc::Receiver<String>,
    what: &str,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let last = done(&line);
                seen.push(line);
                if last {
                    return seen;
                }
            }
            Err(e) => panic!("{what}: not within {within:?} ({e}); printed {seen:?}"),
        }
    }
}
