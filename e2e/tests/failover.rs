//! Issue 14: a control plane that survives losing a machine. Three etcd
//! members (Debian's `etcd`, each on its own loopback ports and data dir),
//! three `pinion server`s on them (each reaches etcd through relays of its own
//! that the test can cut) and hollow nodelets that know all three servers:
//! - kill -9 of the leader during a burst of submissions: another server leads
//!   within a bound, every acknowledged pod is there once and bound once, no
//!   CPU is given twice, and the nodelets keep their pods and go on through
//!   another server;
//! - kill -9 of one etcd member: nothing stops;
//! - a server cut off from etcd stops acknowledging writes and gives up the
//!   lead; the other carries on.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::process::Proc;
use orchestrator::testing::etcd::{available, EtcdCluster};
use pinion_wire::testing::{wait_for, Relay};
use serde_json::Value;

/// Submissions in the burst, and after how many acknowledged ones the leader dies.
const BURST: usize = 500;
const KILL_AFTER: usize = 150;
/// A new leader binds a pod submitted after the kill within this (the lease's
/// TTL is 3 s; the figure measured is printed).
const FAILOVER_BOUND: Duration = Duration::from_secs(15);

fn pinion() -> PathBuf {
    e2e::binary::pinion().expect("build pinion")
}

/// Starts `pinion server` on etcd `endpoints`, listening on (and
/// advertising) loopback `port`; returns it and its URL.
fn server(dir: &Path, endpoints: &str, port: u16) -> (Proc, String) {
    let mut cmd = Command::new(pinion());
    let listen = format!("127.0.0.1:{port}");
    cmd.args(["server", "--listen", &listen, "--advertise-url", &format!("https://{listen}")])
        .args(["--etcd", endpoints, "--heartbeat-grace", "10"])
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(dir.with_extension("log")).expect("server log")));
    let mut child = cmd.spawn().expect("spawn pinion server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("listening on") => {
                break l.split('(').nth(1).and_then(|s| s.strip_suffix(')')).expect("server URL").to_string()
            }
            Some(Ok(_)) => continue,
            other => panic!("pinion server did not start: {other:?}; log: {}", log(dir)),
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), url)
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default()
}

fn agent(dir: &Path, servers: &[String], token: &str, name: &str) -> Proc {
    let mut cmd = Command::new(pinion());
    cmd.arg("agent");
    for s in servers {
        cmd.args(["--server", s]);
    }
    cmd.args(["--token", token])
        .arg("--data-dir")
        .arg(dir.join(name))
        .args(["--runtime", "hollow", "--synthetic", "pack:2 numa:2 core:32 pu:2", "--reserved-cpus", "0"])
        .args(["--node-name", name, "--endpoint-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.join(format!("{name}.log"))).expect("agent log")));
    Proc(cmd.spawn().expect("spawn pinion agent"))
}

/// `pinion ARGS` with every server given; (success, stdout, stderr).
fn cli(config: &Path, servers: &[String], args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(pinion());
    // Global flags first: what follows `--` in ARGS is the pod's command.
    cmd.arg("--config").arg(config);
    for s in servers {
        cmd.args(["--server", s]);
    }
    let out = cmd.args(args).output().expect("run pinion");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn pods(config: &Path, servers: &[String]) -> Vec<Value> {
    let (ok, out, err) = cli(config, servers, &["get", "pods", "-o", "json"]);
    assert!(ok, "get pods: {err}");
    let v: Value = serde_json::from_str(&out).expect("pods json");
    v["items"].as_array().cloned().unwrap_or_default()
}

/// The URL the leader key names, read with etcdctl.
fn leader(endpoints: &str) -> Option<String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints, "--command-timeout=2s", "get", "/pinion/leader", "--print-value-only"])
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!v.is_empty()).then_some(v)
}

/// `pinion run NAME -d`: Ok when the create was acknowledged, else its error.
fn submit(config: &Path, servers: &[String], name: &str) -> Result<(), String> {
    let (ok, _, err) = cli(config, servers, &["run", name, "-d", "--cpus", "1", "--", "sleep", "3600"]);
    if ok {
        Ok(())
    } else {
        Err(err)
    }
}

/// Pod -> nodelet, from each hollow nodelet's status file; panics on a pod
/// that two nodelets run.
fn running_on(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for i in 1..=4 {
        let name = format!("n{i}");
        let text = std::fs::read_to_string(dir.join(&name).join("status.json")).unwrap_or_default();
        let status: Value = serde_json::from_str(&text).unwrap_or_default();
        for pod in status["pods"].as_object().cloned().unwrap_or_default().keys() {
            if let Some(other) = out.insert(pod.clone(), name.clone()) {
                panic!("pod {pod} runs on {other} and {name}");
            }
        }
    }
    out
}

#[test]
fn three_servers_on_etcd_survive_losing_the_leader_an_etcd_member_and_a_cut_server() {
    let test = "three_servers_on_etcd_survive_losing_the_leader_an_etcd_member_and_a_cut_server";
    if !available(test) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut etcd = rt.block_on(EtcdCluster::start(3)).unwrap_or_else(|e| panic!("{test}: {e}"));
    let members: Vec<std::net::SocketAddr> =
        etcd.endpoints().iter().map(|e| e.trim_start_matches("http://").parse().expect("a member's address")).collect();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let direct = etcd.endpoints().join(",");
    // Each server reaches every member through relays of its own, which the test can cut.
    let mut procs: BTreeMap<String, Proc> = BTreeMap::new();
    let mut relays: BTreeMap<String, Vec<Relay>> = BTreeMap::new();
    let mut servers = Vec::new();
    // Ports known before the start, so that each server advertises its URL.
    let held: Vec<std::net::TcpListener> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
    let ports: Vec<u16> = held.iter().map(|l| l.local_addr().expect("port").port()).collect();
    drop(held);
    for i in 1..=3 {
        let mine: Vec<Relay> = members.iter().map(|a| Relay::start(*a).expect("relay")).collect();
        let endpoints = mine.iter().map(|r| format!("http://{}", r.addr)).collect::<Vec<_>>().join(",");
        let (p, url) = server(&dir.join(format!("s{i}")), &endpoints, ports[i - 1]);
        procs.insert(url.clone(), p);
        relays.insert(url.clone(), mine);
        servers.push(url);
    }
    // One CA for the cluster: the first server's admin credentials work on all three.
    let config = dir.join("s1/admin.conf");
    for dir_i in ["s2", "s3"] {
        assert_eq!(
            std::fs::read_to_string(dir.join(dir_i).join("pki/ca.crt")).expect("ca"),
            std::fs::read_to_string(dir.join("s1/pki/ca.crt")).expect("ca"),
            "the CA is shared"
        );
    }
    let token = std::fs::read_to_string(dir.join("s2/join-token")).expect("join token");
    // The nodes are told one server; the join answer names the others.
    let _nodes: Vec<Proc> =
        (1..=4).map(|i| agent(dir, std::slice::from_ref(&servers[1]), token.trim(), &format!("n{i}"))).collect();
    // The last server to start wrote admin credentials that list all three.
    let config3 = dir.join("s3/admin.conf");
    wait_for("four Ready nodes", Duration::from_secs(60), || {
        let (ok, out, _) = cli(&config3, &[], &["get", "nodes"]);
        ok && out.matches(" Ready ").count() == 4
    });
    let listed = std::fs::read_to_string(&config3).expect("s3/admin.conf");
    for i in 1..=4 {
        let node_conf = std::fs::read_to_string(dir.join(format!("n{i}/node.conf"))).expect("node.conf");
        for s in &servers {
            assert!(node_conf.contains(s.as_str()), "n{i}'s node.conf does not list {s}:\n{node_conf}");
            assert!(listed.contains(s.as_str()), "s3/admin.conf does not list {s}");
        }
    }
    let first = leader(&direct).expect("a leader");
    assert!(servers.contains(&first), "leader {first} is one of {servers:?}");
    let before = running_on(dir);

    // The burst, from 8 submitters through every server in turn; the leader
    // is killed once KILL_AFTER submissions were acknowledged.
    let acked = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let killed_at = Arc::new(Mutex::new(None::<Duration>));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for w in 0..8 {
            let (acked, next, servers, config) = (acked.clone(), next.clone(), servers.clone(), config.clone());
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= BURST {
                    return;
                }
                let mut order = servers.clone();
                order.rotate_left(w % 3);
                let name = format!("b{i}");
                if submit(&config, &order, &name).is_ok() {
                    acked.lock().expect("acked").insert(name);
                }
            });
        }
        wait_for("the first acknowledged submissions", Duration::from_secs(120), || {
            acked.lock().expect("acked").len() >= KILL_AFTER
        });
        if let Some(mut p) = procs.remove(&first) {
            let _ = p.0.kill();
            let _ = p.0.wait();
        }
        let killed = Instant::now();
        // While the burst goes on: a pod submitted after the kill is bound by the new leader.
        let survivors: Vec<String> = servers.iter().filter(|s| **s != first).cloned().collect();
        if let Err(e) = submit(&config, &survivors, "after-kill") {
            panic!("a submission after the kill: {e}");
        }
        wait_for("a new leader's binding", FAILOVER_BOUND, || {
            pods(&config, &survivors)
                .iter()
                .any(|p| p["metadata"]["name"] == "after-kill" && p["spec"]["nodeName"].is_string())
        });
        *killed_at.lock().expect("killed") = Some(killed.elapsed());
    });
    let failover = killed_at.lock().expect("killed").expect("the leader was killed");
    let survivors: Vec<String> = servers.iter().filter(|s| **s != first).cloned().collect();
    let second = leader(&direct).expect("a new leader");
    assert_ne!(second, first);
    println!("figure: leader killed -> a pod submitted after it bound: {:.2} s", failover.as_secs_f64());

    let acked = acked.lock().expect("acked").clone();
    println!("figure: {} of {BURST} submissions acknowledged across the kill", acked.len());
    wait_for("every acknowledged pod running", Duration::from_secs(120), || {
        let all = pods(&config, &survivors);
        let running: BTreeSet<String> = all
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        acked.iter().all(|n| running.contains(n))
    });
    let all = pods(&config, &survivors);
    let mut names = BTreeSet::new();
    let mut cpus_by_node: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for p in &all {
        let name = p["metadata"]["name"].as_str().expect("name").to_string();
        assert!(names.insert(name.clone()), "pod {name} listed twice");
        let Some(node) = p["spec"]["nodeName"].as_str() else { continue };
        for c in p["status"]["placement"]["containers"][0]["cpus"].as_array().cloned().unwrap_or_default() {
            let c = c.as_u64().expect("cpu");
            assert!(cpus_by_node.entry(node.to_string()).or_default().insert(c), "CPU {c} of {node} given twice");
        }
    }
    // No pod bound twice (no pod runs on two nodelets), every acknowledged pod
    // runs, and the nodelets kept the pods they ran before the kill.
    let after = running_on(dir);
    for n in &acked {
        assert!(after.contains_key(n), "acknowledged pod {n} runs on no nodelet");
    }
    for (pod, node) in &before {
        assert_eq!(after.get(pod), Some(node), "pod {pod} ran on {node} before the kill");
    }

    // kill -9 of one etcd member: writes and bindings go on.
    etcd.kill(0);
    // The killed member may have led etcd's raft: while the two left elect
    // a leader (a second or more under load) a write can outlast the
    // server's 5 s bound and be refused; one more try must then succeed.
    let mut refused = 0;
    for i in 0..5 {
        let name = format!("m{i}");
        if let Err(first) = submit(&config, &survivors, &name) {
            refused += 1;
            if let Err(e) = submit(&config, &survivors, &name) {
                panic!("a submission with one etcd member down, twice: {first}; then {e}");
            }
        }
    }
    println!("figure: submissions refused once while etcd lost a member: {refused} of 5");
    wait_for("pods bound with one etcd member down", Duration::from_secs(30), || {
        let all = pods(&config, &survivors);
        (0..5)
            .all(|i| all.iter().any(|p| p["metadata"]["name"] == format!("m{i}") && p["spec"]["nodeName"].is_string()))
    });

    // The leader cut off from etcd: it acknowledges no write and leads no more;
    // the other server takes over.
    let cut = second.clone();
    for r in &relays[&cut] {
        r.set_cut(true);
    }
    let t = Instant::now();
    let (ok, _, err) = cli(&config, std::slice::from_ref(&cut), &["run", "cut", "-d", "--cpus", "1", "--", "true"]);
    assert!(!ok, "a server cut off from etcd acknowledged a write");
    println!("figure: a cut-off server refused a write after {:.2} s: {}", t.elapsed().as_secs_f64(), err.trim());
    wait_for("the lead away from the cut-off server", Duration::from_secs(15), || {
        leader(&direct).is_some_and(|l| l != cut)
    });
    let others: Vec<String> = survivors.iter().filter(|s| **s != cut).cloned().collect();
    if let Err(e) = submit(&config, &others, "after-cut") {
        panic!("the other server carries on: {e}");
    }
    wait_for("a binding after the cut", Duration::from_secs(30), || {
        pods(&config, &others).iter().any(|p| p["metadata"]["name"] == "after-cut" && p["spec"]["nodeName"].is_string())
    });
    drop(procs);
}
