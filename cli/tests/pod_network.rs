//! Pods on two nodes reach each other by pod IP, without NAT (issue 28), for
//! real: two "hosts" that are network namespaces this test makes, joined by a
//! bridge in a third, a `pinion server` in the first, a `pinion agent` with
//! the libcontainer runtime and the default pod network in each. The server
//! gives each node a range; each node routes the other's (directly, the
//! hosts sharing a subnet, or over VXLAN when told); a pod on one node sends
//! to a pod on the other, which sees the sender's pod IP; a deleted node's
//! range is no longer routed. Only addresses inside the test's namespaces.
//! Needs root, two CPUs, iproute2, nsenter and the CNI plugins; under
//! `CI=true` their absence is a failure, elsewhere a skip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::process::Proc;
use nodelet::runtime::libcontainer::LibcontainerRuntime;
use nodelet::runtime::Runtime;
use serde_json::Value;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");
const PLUGINS: &str = "/usr/lib/cni";

/// One test at a time: both use CPU 1 and the same namespace names' pattern.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn available() -> bool {
    let root = pinion_wire::testing::is_root();
    let tools = ["ip", "nsenter", "iptables"].iter().all(|t| pinion_wire::testing::on_path(t));
    let plugins = Path::new(PLUGINS).join("bridge").is_file();
    pinion_wire::testing::requires(
        root && tools && plugins && pinion_wire::testing::has_two_cpus(),
        format_args!("root ({root}), ip, nsenter, iptables ({tools}), {PLUGINS}/bridge ({plugins}), CPUs 0 and 1"),
    )
}

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The test's hosts: namespaces `<tag>a` and `<tag>b` on a bridge in `<tag>l`.
struct Lan {
    tag: String,
    dir: tempfile::TempDir,
    procs: Vec<Proc>,
    data: Vec<PathBuf>,
}

impl Lan {
    fn new() -> Lan {
        let tag = format!("pn{}", std::process::id() % 100_000);
        let dir = tempfile::Builder::new().prefix("pinion-pn-").tempdir().unwrap();
        let lan = Lan { tag, dir, procs: Vec::new(), data: Vec::new() };
        let l = lan.ns("l");
        run(&["ip", "netns", "add", &l]);
        run(&["ip", "-n", &l, "link", "add", "name", "br0", "type", "bridge"]);
        run(&["ip", "-n", &l, "link", "set", "br0", "up"]);
        for (host, addr) in [("a", "192.168.213.1/24"), ("b", "192.168.213.2/24")] {
            let ns = lan.ns(host);
            run(&["ip", "netns", "add", &ns]);
            let (inside, outside) = (format!("{}{host}", lan.tag), format!("{}{host}l", lan.tag));
            run(&["ip", "link", "add", "name", &inside, "type", "veth", "peer", "name", &outside]);
            run(&["ip", "link", "set", &inside, "netns", &ns]);
            run(&["ip", "link", "set", &outside, "netns", &l]);
            run(&["ip", "-n", &l, "link", "set", &outside, "master", "br0", "up"]);
            run(&["ip", "-n", &ns, "addr", "add", addr, "dev", &inside]);
            run(&["ip", "-n", &ns, "link", "set", &inside, "up"]);
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        lan
    }

    fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.tag)
    }

    /// `pinion ARGS` in host `host`'s network (and only that: the mounts and
    /// cgroups are the machine's, so the test sees and cleans them).
    fn pinion(&self, host: &str, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns(host))).arg("--").arg(PINION).args(args);
        c
    }

    fn cli(&self, args: &[&str]) -> (bool, String) {
        let config = self.dir.path().join("srv/admin.conf");
        let out = self.pinion("a", args).arg("--config").arg(&config).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    /// The server in host a; its URL.
    fn server(&mut self) -> String {
        let data = self.dir.path().join("srv");
        let mut child = self
            .pinion("a", &["server", "--listen", "192.168.213.1:0", "--pod-cidr", "10.214.0.0/16", "--data-dir"])
            .arg(&data)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.dir.path().join("server.log")).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("listening on") => break l,
                Some(Ok(_)) => continue,
                other => panic!("the server did not start: {other:?}"),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        self.procs.push(Proc(child));
        // The line names a loopback URL; the nodes dial the listener's address.
        let url = line.split('(').nth(1).and_then(|s| s.strip_suffix(')')).expect("server URL");
        format!("https://192.168.213.1:{}", url.rsplit(':').next().expect("port"))
    }

    /// A node agent in `host`, its own default pod network (leases in the
    /// test's folder), routes in `mode`.
    fn agent(&mut self, host: &str, url: &str, mode: &str) {
        let token = std::fs::read_to_string(self.dir.path().join("srv/join-token")).unwrap();
        let (data, cni) = (self.dir.path().join(format!("node-{host}")), self.dir.path().join(format!("cni-{host}")));
        std::fs::create_dir_all(&cni).unwrap();
        // The default network, as `pinion up` writes it, with its leases here;
        // the node puts its own range in.
        let network = serde_json::json!({
            "cniVersion": "1.0.0", "name": "pinion",
            "plugins": [{"type": "bridge", "bridge": "pinion0", "isGateway": true, "ipMasq": false,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.213.0.0/16"}]],
                                  "routes": [{"dst": "0.0.0.0/0"}],
                                  "dataDir": self.dir.path().join(format!("leases-{host}"))}}],
        });
        std::fs::write(cni.join("10-pinion.conflist"), network.to_string()).unwrap();
        let addr = if host == "a" { "192.168.213.1" } else { "192.168.213.2" };
        let child = self
            .pinion(host, &["agent", "--server", url, "--token", token.trim(), "--runtime", "libcontainer"])
            .args(["--node-name", &format!("node-{host}"), "--node-address", addr, "--pod-routes", mode])
            .args(["--endpoint-listen", &format!("{addr}:0"), "--cni-bin-dir", PLUGINS, "--cni-conf-dir"])
            .arg(&cni)
            .arg("--data-dir")
            .arg(&data)
            .env("PINION_LOG", "info,libcgroups=error,libcontainer=error")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join(format!("agent-{host}.log"))).unwrap())
            .spawn()
            .unwrap();
        self.procs.push(Proc(child));
        self.data.push(data);
    }

    fn wait(&self, what: &str, pred: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !pred() {
            if Instant::now() > deadline {
                let logs: Vec<String> = ["server.log", "agent-a.log", "agent-b.log"]
                    .iter()
                    .map(|f| {
                        let text = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(15).collect();
                        format!("--- {f}\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
                    })
                    .collect();
                panic!("timed out waiting for {what}\n{}", logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn pod(&self, name: &str) -> Value {
        let (_, out) = self.cli(&["get", "pods", name, "-o", "json"]);
        serde_json::from_str(&out).unwrap_or(Value::Null)
    }

    fn routes(&self, host: &str) -> String {
        run(&["ip", "-n", &self.ns(host), "route", "show", "proto", "213"])
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        self.procs.clear();
        for data in &self.data {
            if let Ok(rt) = LibcontainerRuntime::new(data, Path::new(PINION)) {
                for id in rt.list().unwrap_or_default() {
                    let _ = rt.stop(&id, Duration::ZERO);
                    let _ = rt.remove(&id);
                }
            }
        }
        // The pods' network namespaces an agent killed mid-way left pinned.
        for data in &self.data {
            let records = std::fs::read_dir(data.join("cni")).map(|d| d.flatten().collect::<Vec<_>>());
            for e in records.unwrap_or_default() {
                let name = e.file_name().to_string_lossy().trim_end_matches(".json").to_string();
                for dir in ["/run/pinion/netns", "/run/pinion/userns"] {
                    let pin = Path::new(dir).join(&name);
                    let _ = Command::new("umount").arg("-l").arg(&pin).status();
                    let _ = std::fs::remove_file(&pin);
                }
            }
        }
        for host in ["a", "b", "l"] {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(host)]).status();
        }
    }
}

fn manifest(name: &str, node: &str, script: &str) -> String {
    serde_json::json!({
        "apiVersion": "pinion.io/v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "main", "rootfs": "host", "command": ["python3", "-c", script]}]},
    })
    .to_string()
}

fn two_nodes_reach_each_others_pods(mode: &str) {
    if !available() {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut lan = Lan::new();
    let url = lan.server();
    lan.agent("a", &url, mode);
    lan.agent("b", &url, mode);
    lan.wait("both nodes Ready with a range each", || {
        let (_, out) = lan.cli(&["get", "nodes", "-o", "json"]);
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let nodes = v["items"].as_array().cloned().unwrap_or_default();
        nodes.len() == 2
            && nodes.iter().all(|n| n["status"]["condition"] == "Ready" && n["spec"]["podCIDR"].is_string())
    });
    // Each node routes the other's range.
    lan.wait("routes to each other's range", || {
        lan.routes("a").contains("10.214.") && lan.routes("b").contains("10.214.")
    });

    // A listener on b prints who sent to it; a sender on a sends to b's pod IP.
    let listen = "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('',9999))\n\
                  d,a=s.recvfrom(100)\nprint('from', a[0], d.decode(), flush=True)";
    let dir = lan.dir.path().to_path_buf();
    let put = |name: &str, text: &str| {
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, text).unwrap();
        let (ok, out) = lan.cli(&["apply", "-f", file.to_str().unwrap()]);
        assert!(ok, "{out}");
    };
    put("listener", &manifest("listener", "node-b", listen));
    lan.wait("the listener's pod IP", || lan.pod("listener")["status"]["podIP"].is_string());
    let target = lan.pod("listener")["status"]["podIP"].as_str().unwrap().to_string();
    let send = format!(
        "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         for i in range(40):\n    s.sendto(b'hello', ('{target}', 9999)); time.sleep(0.25)"
    );
    put("sender", &manifest("sender", "node-a", &send));
    lan.wait("the sender's pod IP", || lan.pod("sender")["status"]["podIP"].is_string());
    let sender_ip = lan.pod("sender")["status"]["podIP"].as_str().unwrap().to_string();
    lan.wait("the listener to hear the sender", || lan.pod("listener")["status"]["phase"] == "Succeeded");
    let (_, log) = lan.cli(&["logs", "listener"]);
    assert_eq!(log.trim(), format!("from {sender_ip} hello"), "the sender's own pod IP, not its node's");
    if mode == "vxlan" {
        let link = run(&["ip", "-n", &lan.ns("a"), "-d", "link", "show", "pinion-vx"]);
        assert!(link.contains("vxlan id 4213"), "{link}");
        assert!(lan.routes("a").contains("dev pinion-vx"), "{}", lan.routes("a"));
    } else {
        assert!(lan.routes("a").contains("via 192.168.213.2"), "{}", lan.routes("a"));
    }

    // Node b deleted: a no longer routes its range.
    let (_, out) = lan.cli(&["delete", "pod", "sender"]);
    let _ = out;
    let (ok, out) = lan.cli(&["delete", "node", "node-b"]);
    assert!(ok, "{out}");
    lan.wait("the route to b's range removed", || !lan.routes("a").contains("10.214."));
}

#[test]
fn pods_on_two_nodes_reach_each_other_by_direct_routes() {
    two_nodes_reach_each_others_pods("auto");
}

#[test]
fn pods_on_two_nodes_reach_each_other_over_vxlan() {
    two_nodes_reach_each_others_pods("vxlan");
}
