//! Paths that go silent without closing: a relay (`e2e::relay`) in front of
//! the server stops forwarding on every established connection but keeps it
//! open, and forwards new ones, as a NAT that forgot an idle flow. The server
//! runs in-process with a short heartbeat (`ApiConfig::liveness`), the readers
//! use the same rule (`PINION_STREAM_HEARTBEAT_MS`, the link's
//! `JoinConfig::liveness`), so each must notice the dead stream within a few
//! heartbeats and resume over a new connection:
//! - the nodelet's binding watch: a pod bound after the silence still reaches
//!   the node, and the node stays Ready;
//! - `pinion get pods -w`: a pod created after the silence gets its row;
//! - `pinion logs -f`: lines written after the silence are printed, each once;
//! - `pinion run`: its attach stream resumes and it exits with the code.
//!
//! Without a bound on silence the streams hang until the OS gives up (or,
//! over HTTP/2, until the pings of the old 15 s + 20 s rule), far beyond
//! `SOON`, so each test fails there.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::process::Proc;
use e2e::relay::Relay;
use nodelet::agent::AgentConfig;
use nodelet::daemon::{DaemonConfig, JoinConfig, RuntimeChoice};
use orchestrator::client::Client;
use orchestrator::server::{Server, ServerOptions};
use orchestrator::tls::Credentials;
use specs::api::{Liveness, NodeCondition};
use specs::{CpuSet, NodeSettings, Pod, PodPhase};
use tokio::sync::watch;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");
const HEARTBEAT: Duration = Duration::from_millis(300);
/// A bound for what must follow within a few silence bounds (0.9 s each) and
/// a reconnect; the rule these tests replace took 20 to 35 s.
const SOON: Duration = Duration::from_secs(15);

fn liveness() -> Liveness {
    Liveness { heartbeat: HEARTBEAT }
}

struct Cluster {
    dir: tempfile::TempDir,
    admin: Client,
    /// In front of the server.
    relay: Relay,
    /// The admin's credentials with the relay's URL.
    relayed_config: PathBuf,
    token: String,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = ServerOptions::new(dir.path().join("server"), "127.0.0.1:0");
        opts.api.liveness = liveness();
        // Several of the link's 3 s heartbeats: one held up on the dead
        // connection until it is found dead must not make the node NotReady.
        opts.controller.heartbeat_grace = Duration::from_secs(10);
        let server = Server::bind(opts).await.expect("bind the server");
        let creds = Credentials::load(&server.admin_config).expect("admin config");
        let admin = Client::new(&creds).expect("admin client").with_liveness(liveness());
        let relay = Relay::start(server.local_addr()).expect("relay");
        let mut relayed = creds.clone();
        relayed.servers = vec![format!("https://127.0.0.1:{}", relay.addr.port())];
        let relayed_config = dir.path().join("relayed.conf");
        relayed.save(&relayed_config).expect("save the relayed config");
        let token = server.join_token.to_string();
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            server.run(rx).await.expect("the server runs and stops cleanly");
        });
        Cluster { dir, admin, relay, relayed_config, token, stop, tasks: vec![task] }
    }

    /// A hollow node `edge` that reaches the server through the relay, or directly.
    fn node(&mut self, through_relay: bool, direct: &str) -> PathBuf {
        self.node_with_endpoint(through_relay, direct, "127.0.0.1:0".into(), None)
    }

    /// `node` (reaching the server directly) whose endpoint the server
    /// reaches through a relay of its own, returned.
    fn node_behind_relay(&mut self) -> (PathBuf, Relay) {
        let direct = format!("https://{}", self.admin.authority());
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
        let endpoint: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        // The node registers its address with its listening port: the relay
        // takes that port on another loopback address.
        let relay = Relay::start_on(format!("127.0.0.2:{port}").parse().expect("addr"), endpoint)
            .expect("relay in front of the node");
        let advertise = Some("127.0.0.2".parse().expect("ip"));
        (self.node_with_endpoint(false, &direct, endpoint.to_string(), advertise), relay)
    }

    /// `node`, its endpoint listening on `listen` and registered as `advertise`.
    fn node_with_endpoint(
        &mut self,
        through_relay: bool,
        direct: &str,
        listen: String,
        advertise: Option<std::net::IpAddr>,
    ) -> PathBuf {
        let data = self.dir.path().join("edge");
        let server =
            if through_relay { format!("https://127.0.0.1:{}", self.relay.addr.port()) } else { direct.into() };
        let settings = NodeSettings { reserved_cpus: CpuSet::parse_list("0").expect("cpus"), ..Default::default() };
        let topology = specs::topology::synthetic::parse("pack:1 numa:1 core:8 pu:1").expect("topology");
        let config = DaemonConfig {
            agent: AgentConfig::new("edge".into(), data.clone(), topology, settings),
            runtime: RuntimeChoice::Hollow,
            manifests: None,
            join: Some(JoinConfig {
                servers: vec![server],
                token: Some(self.token.clone()),
                ca: None,
                labels: BTreeMap::new(),
                endpoint_listen: listen,
                advertise_address: advertise,
                liveness: liveness(),
                endpoint_max_connections: 16,
            }),
        };
        let rx = self.stop.subscribe();
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = nodelet::daemon::run(config, rx).await {
                panic!("the node daemon failed: {e}");
            }
        }));
        data
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        // A task that panicked (the server or a node failing) fails the test.
        for t in self.tasks {
            t.await.expect("a cluster task");
        }
    }

    async fn create(&self, name: &str) {
        let manifest = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}, annotations: {{pinion.io/wait-for-nodes: \"true\"}}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources:\n      limits: {{cpu: 1, memory: 64Mi}}\n"
        );
        self.admin.create_pod(Bytes::from(manifest)).await.expect("create the pod");
    }

    async fn running(&self, name: &str, within: Duration) -> Pod {
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
    fn cli(&self, args: &[&str]) -> (Proc, mpsc::Receiver<String>) {
        let mut child = Command::new(PINION)
            .args(args)
            .env("PINION_CONFIG", &self.relayed_config)
            .env("PINION_STREAM_HEARTBEAT_MS", HEARTBEAT.as_millis().to_string())
            .stdout(Stdio::piped())
            // What it says on failure shows with the test's.
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn pinion");
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
}

async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lines from `rx` until one satisfies `done` (all of them, that one included).
fn lines_until(rx: &mpsc::Receiver<String>, what: &str, within: Duration, done: impl Fn(&str) -> bool) -> Vec<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodelet_whose_watch_went_silent_resumes_and_stays_ready() {
    let mut c = Cluster::start().await;
    c.node(true, "");
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    c.create("before").await;
    c.running("before", SOON).await;

    let silenced = c.relay.silence_established();
    assert!(silenced > 0, "the link's connection went through the relay");
    c.create("after").await;
    let after = c.running("after", SOON).await;
    assert_eq!(after.spec.node_name.as_deref(), Some("edge"));
    assert!(c.relay.connections() > silenced, "the link resumed over a new connection");
    let node = c.admin.get_node("edge").await.expect("the node");
    assert_eq!(node.status.condition, NodeCondition::Ready, "{:?}", node.status);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_whose_stream_went_silent_resumes_without_missing_a_pod() {
    let c = Cluster::start().await;
    let (_get, rx) = c.cli(&["get", "pods", "-w"]);
    let _ = lines_until(&rx, "the table's header", SOON, |l| l.starts_with("NAME"));
    c.create("first").await;
    let _ = lines_until(&rx, "first's row", SOON, |l| l.starts_with("first "));

    let silenced = c.relay.silence_established();
    c.create("second").await;
    let seen = lines_until(&rx, "second's row after the silence", SOON, |l| l.starts_with("second "));
    assert!(seen.iter().all(|l| !l.starts_with("first ")), "first's row again after resuming: {seen:?}");
    assert!(c.relay.connections() > silenced, "the watch resumed over a new connection");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_whose_stream_went_silent_resumes_and_prints_each_line_once() {
    let mut c = Cluster::start().await;
    let direct = c.admin.authority().to_string();
    let data = c.node(false, &format!("https://{direct}"));
    c.create("talker").await;
    let pod = c.running("talker", SOON).await;
    // The hollow runtime writes no output: the test writes the container's log.
    let log = nodelet::agent::reconcile::pod_container_log_path(&data, "talker", &pod, "main");
    std::fs::create_dir_all(log.parent().expect("log folder")).expect("log folder");
    append(&log, "one\n");

    let (_logs, rx) = c.cli(&["logs", "-f", "talker"]);
    let mut printed = lines_until(&rx, "the first line", SOON, |l| l == "one");
    let silenced = c.relay.silence_established();
    append(&log, "two\n");
    printed.extend(lines_until(&rx, "a line written after the silence", SOON, |l| l == "two"));
    append(&log, "three\n");
    printed.extend(lines_until(&rx, "the next line", SOON, |l| l == "three"));
    assert_eq!(printed, ["one", "two", "three"], "each line once, in order");
    assert!(c.relay.connections() > silenced, "the follow resumed over a new connection");
    c.stop().await;
}

/// The other hop of `logs -f`: the server's stream from the node breaks (a
/// relay in front of the node's endpoint drops every connection for a
/// moment). The server must end its reply with an error, not cleanly, so
/// that the follower resumes instead of taking it for the end of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_whose_node_stream_broke_resumes_and_prints_each_line_once() {
    logs_follow_across_the_node_hop(false).await;
}

/// The same hop gone silent: the server's client to the node has the
/// server's silence bound, so it finds the connection dead and the follow
/// resumes over a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_whose_node_stream_went_silent_resumes_and_prints_each_line_once() {
    logs_follow_across_the_node_hop(true).await;
}

async fn logs_follow_across_the_node_hop(silent: bool) {
    let mut c = Cluster::start().await;
    let (data, node_relay) = c.node_behind_relay();
    c.create("chatter").await;
    let pod = c.running("chatter", SOON).await;
    let log = nodelet::agent::reconcile::pod_container_log_path(&data, "chatter", &pod, "main");
    std::fs::create_dir_all(log.parent().expect("log folder")).expect("log folder");
    append(&log, "one\n");

    let (mut logs, rx) = c.cli(&["logs", "-f", "chatter"]);
    let mut printed = lines_until(&rx, "the first line", SOON, |l| l == "one");
    let before = node_relay.connections();
    if silent {
        node_relay.silence_established();
        tokio::time::sleep(Duration::from_millis(400)).await;
    } else {
        node_relay.set_cut(true);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(logs.0.try_wait().expect("poll pinion logs").is_none(), "logs -f ended when the node's stream broke");
        node_relay.set_cut(false);
    }
    append(&log, "two\n");
    // Silent, the server's client finds the connection dead within a few of
    // its silence bounds (0.9 s here), not its default one (15 s).
    let within = if silent { Duration::from_secs(6) } else { SOON };
    printed.extend(lines_until(&rx, "a line written after the break", within, |l| l == "two"));
    assert_eq!(printed, ["one", "two"], "each line once, in order");
    assert!(node_relay.connections() > before, "the server reached the node again over a new connection");
    c.stop().await;
}

/// A node whose endpoint accepts connections and never answers: while the
/// server waits to open the output, the attach stream keeps its heartbeats,
/// so `pinion run` does not take it for dead and reconnect again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_keeps_its_stream_while_the_node_does_not_answer() {
    let mut c = Cluster::start().await;
    let direct = format!("https://{}", c.admin.authority());
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let hole = std::net::TcpListener::bind(("127.0.0.3", port)).expect("a listener that never answers");
    std::thread::spawn(move || {
        let held: Vec<_> = hole.incoming().collect();
        drop(held);
    });
    c.node_with_endpoint(false, &direct, format!("127.0.0.1:{port}"), Some("127.0.0.3".parse().expect("ip")));
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    let (mut run, _out) = c.cli(&["run", "job", "--host", "--no-init", "--", "sleep", "inf"]);
    c.running("job", SOON).await;
    let before = c.relay.connections();
    // Several silence bounds (0.9 s each) while the open hangs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(run.0.try_wait().expect("poll pinion run").is_none(), "pinion run ended");
    assert_eq!(c.relay.connections(), before, "pinion run reconnected: its stream fell silent");
    c.stop().await;
}

/// `pinion run`'s output when the server's stream from the node breaks: the
/// server opens it again and skips what it sent, so the output goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_whose_output_stream_from_the_node_broke_goes_on() {
    let mut c = Cluster::start().await;
    let (data, node_relay) = c.node_behind_relay();
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    // Long enough for the steps below; the hollow runtime ends it with code 0.
    let (mut run, rx) = c.cli(&["run", "job", "--host", "--no-init", "--", "sleep", "8"]);
    let pod = c.running("job", SOON).await;
    let log = nodelet::agent::reconcile::pod_container_log_path(&data, "job", &pod, "main");
    append(&log, "one\n");
    let mut printed = lines_until(&rx, "the first line", SOON, |l| l == "one");
    node_relay.set_cut(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    node_relay.set_cut(false);
    append(&log, "two\n");
    printed.extend(lines_until(&rx, "a line written after the break", SOON, |l| l == "two"));
    assert_eq!(printed, ["one", "two"], "each line once, in order");
    assert_eq!(exit_code(&mut run, "the break").await, Some(0), "the command's exit code");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_whose_attach_stream_went_silent_resumes_to_the_exit_code() {
    let mut c = Cluster::start().await;
    let direct = c.admin.authority().to_string();
    c.node(false, &format!("https://{direct}"));
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    // The hollow runtime ends `sleep 4` after four seconds, with code 0.
    let (mut run, _out) = c.cli(&["run", "job", "--host", "--no-init", "--", "sleep", "4"]);
    c.running("job", SOON).await;
    let silenced = c.relay.silence_established();
    assert_eq!(exit_code(&mut run, "the silence").await, Some(0), "the command's exit code");
    assert!(c.relay.connections() > silenced, "the attach stream resumed over a new connection");
    c.stop().await;
}

/// The exit code of `pinion run`, which must exit within `SOON` of `after`.
async fn exit_code(run: &mut Proc, after: &str) -> Option<i32> {
    let deadline = Instant::now() + SOON;
    loop {
        if let Some(s) = run.0.try_wait().expect("wait for pinion run") {
            return s.code();
        }
        assert!(Instant::now() < deadline, "pinion run did not exit within {SOON:?} of {after}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open the log");
    f.write_all(text.as_bytes()).expect("write the log");
}
