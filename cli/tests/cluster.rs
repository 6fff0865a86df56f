//! A cluster from the real binary: `pinion server` with two joined hollow
//! nodelets (2x20 and 2x10 cores, single-numa-node), and `pinion up` on its own.
//! The seed scenario: a 20-CPU pod lands on the 2x20 node; a 30-CPU pod stays
//! Pending with a reason naming each node; a nodelet killed with `kill -9` and
//! restarted keeps its pod on the same CPUs.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::process::Proc;
use pinion_wire::testing::{wait_for, Relay};
use serde_json::Value;

#[path = "../../nodelet/tests/device_tree/mod.rs"]
mod device_tree;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

/// Starts `pinion ARGS` and waits for a stdout line starting with `ready`; returns
/// the process and that line.
fn start(args: &[&str], env: &[(&str, &Path)], ready: &str) -> (Proc, String) {
    let mut cmd = Command::new(PINION);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn pinion");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with(ready) => break l,
            Some(Ok(_)) => continue,
            other => panic!("pinion {args:?} did not print {ready:?}: {other:?}"),
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), line)
}

fn agent(dir: &Path, url: &str, token: &str, name: &str, cores: u32) -> Proc {
    let data = dir.join(name);
    let synthetic = format!("pack:2 numa:1 core:{cores} pu:1");
    let mut cmd = Command::new(PINION);
    // The URL and the token only, as the server prints it: the token pins the CA.
    cmd.args(["agent", "--server", url, "--token", token])
        .arg("--data-dir")
        .arg(&data)
        .args(["--runtime", "hollow", "--synthetic", &synthetic, "--topology-policy", "single-numa-node"])
        .args(["--node-name", name, "--endpoint-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Proc(cmd.spawn().expect("spawn pinion agent"))
}

fn cli(config: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(PINION).args(args).arg("--config").arg(config).output().expect("run pinion");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn apply(config: &Path, dir: &Path, name: &str, cpus: u32) {
    let (ok, out) = try_apply(config, dir, name, cpus, "{}");
    assert!(ok, "apply {name}: {out}");
}

/// Applies a one-container pod with these annotations (a YAML flow map);
/// whether it was accepted, and what the CLI printed on both streams.
fn try_apply(config: &Path, dir: &Path, name: &str, cpus: u32, annotations: &str) -> (bool, String) {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}, annotations: {annotations}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources:\n      limits: {{cpu: \"{cpus}\", memory: 1Gi}}\n"
        ),
    )
    .expect("write manifest");
    let out = Command::new(PINION)
        .args(["apply", "-f", path.to_str().expect("utf-8 path"), "--config"])
        .arg(config)
        .output()
        .expect("run pinion");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn pod(config: &Path, name: &str) -> Value {
    let (ok, out) = cli(config, &["get", "pods", name, "-o", "json"]);
    assert!(ok, "get pod {name}: {out}");
    serde_json::from_str(&out).expect("pod JSON")
}

fn wait_pod(config: &Path, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = Value::Null;
    while Instant::now() < deadline {
        last = pod(config, name);
        if pred(&last) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}; last: {last:#}");
}

fn cpus(p: &Value) -> Value {
    p["status"]["placement"]["containers"][0]["cpus"].clone()
}

#[test]
fn server_with_two_joined_nodelets_places_by_numa_and_survives_a_nodelet_kill() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (_server, line) = start(
        &["server", "--data-dir", dir.join("srv").to_str().expect("utf-8"), "--listen", "0.0.0.0:0"],
        &[],
        "listening on",
    );
    let url = line.split('(').nth(1).and_then(|s| s.strip_suffix(')')).expect("server URL").to_string();
    // A remote node dials the machine's own address: the wildcard listener's
    // certificate must name it.
    let port = url.rsplit(':').next().expect("port");
    let hostname_i = Command::new("hostname").arg("-I").output().map(|o| o.stdout).unwrap_or_default();
    let external = String::from_utf8_lossy(&hostname_i)
        .split_whitespace()
        .find(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
        .map_or_else(|| url.clone(), |ip| format!("https://{ip}:{port}"));
    let token = std::fs::read_to_string(dir.join("srv/join-token")).expect("join token");
    let config = dir.join("srv/admin.conf");
    // A bare secret (no CA pin) and no --ca: one clear line, nothing joined.
    let secret = token.trim().split_once('.').expect("PIN.SECRET").1;
    let out = Command::new(PINION)
        .args(["agent", "--server", &url, "--token", secret, "--runtime", "hollow", "--node-name", "nopin"])
        .arg("--data-dir")
        .arg(dir.join("nopin"))
        .output()
        .expect("run pinion agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--ca FILE"), "{err}");
    assert!(!dir.join("nopin/node.conf").exists());
    let mut big = agent(dir, &url, token.trim(), "big", 20);
    let _small = agent(dir, &external, token.trim(), "small", 10);
    // Both joined first: with only `small` registered, a 20-CPU pod is one no
    // node could ever run, and the server refuses it (a CI run lost this race).
    wait_for("big Ready", CHANGE, || node_condition(&config, "big") == "Ready");
    wait_for("small Ready", CHANGE, || node_condition(&config, "small") == "Ready");

    apply(&config, dir, "p20", 20);
    let placed = wait_pod(&config, "p20", "p20 running", |p| p["status"]["phase"] == "Running");
    assert_eq!(placed["spec"]["nodeName"], "big", "{placed:#}");
    let expected: Vec<u32> = (0..20).collect();
    assert_eq!(cpus(&placed), serde_json::json!(expected));
    let (ok, drawing) = cli(&config, &["topology", "big"]);
    assert!(ok && drawing.contains("node big") && drawing.contains("p20"), "{drawing}");
    // The node's requests against what it offers, as the engine counts them
    // (the status reaches the server with the next report).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (ok, described) = cli(&config, &["describe", "node", "big"]);
        if ok && described.contains("Requested:   cpu 20 of 40 allocatable") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{described}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // `get pods -w` prints the table, then a row per change.
    let mut watcher = Command::new(PINION)
        .args(["get", "pods", "-w", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn get -w");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = watcher.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the table's header");
    assert!(first.starts_with("NAME") && first.contains("STATUS"), "{first}");

    // Too big for any single NUMA node of any node: refused at submission
    // with each node's reason, as Slurm refuses an impossible job...
    let (ok, out) = try_apply(&config, dir, "p30", 30, "{}");
    assert!(!ok && out.contains("no node can ever run") && out.contains("big") && out.contains("small"), "{out}");
    // ...unless it asks to wait for nodes to join: Pending, with every node's best option.
    let (ok, out) = try_apply(&config, dir, "p30", 30, "{pinion.io/wait-for-nodes: \"true\"}");
    assert!(ok, "apply p30: {out}");
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.starts_with("p30 ") && l.contains("Pending")) {
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(l) => seen.push(l),
            Err(e) => panic!("no row for p30 from get -w ({e}): {seen:?}"),
        }
    }
    let pending = wait_pod(&config, "p30", "p30 reason", |p| p["status"]["message"].is_string());
    // The scheduler retries p30 (each retry a change): no row repeats the
    // pod's previous one (AGE aside, which moves with the clock).
    std::thread::sleep(Duration::from_secs(1));
    seen.extend(rx.try_iter());
    let _ = watcher.kill();
    let _ = watcher.wait();
    let mut last: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for l in &seen {
        let mut cells: Vec<String> = l.split_whitespace().map(str::to_string).collect();
        if cells.len() > 4 {
            cells.remove(4);
        }
        let name = cells[0].clone();
        assert_ne!(last.get(&name), Some(&cells), "a repeated row for {name}: {seen:?}");
        last.insert(name, cells);
    }
    assert_eq!(pending["status"]["phase"], "Pending");
    let msg = pending["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("big") && msg.contains("small"), "{msg}");

    // kill -9 of the nodelet, then a restart with its saved credentials (no token).
    let _ = big.0.kill();
    let _ = big.0.wait();
    let mut cmd = Command::new(PINION);
    cmd.args(["agent", "--server", &url, "--data-dir"])
        .arg(dir.join("big"))
        .args(["--runtime", "hollow", "--synthetic", "pack:2 numa:1 core:20 pu:1"])
        .args(["--topology-policy", "single-numa-node", "--node-name", "big", "--endpoint-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _big = Proc(cmd.spawn().expect("restart agent"));
    apply(&config, dir, "p10", 10);
    let p10 = wait_pod(&config, "p10", "p10 running", |p| p["status"]["phase"] == "Running");
    let after = pod(&config, "p20");
    assert_eq!(after["status"]["phase"], "Running");
    assert_eq!(cpus(&after), serde_json::json!(expected), "p20 kept its CPUs");
    // p10 fits either node; wherever it went it shares no CPU with p20 on big.
    if p10["spec"]["nodeName"] == "big" {
        let p10_cpus: Vec<u64> = serde_json::from_value(cpus(&p10)).expect("cpus");
        assert!(p10_cpus.iter().all(|c| *c >= 20), "{p10_cpus:?}");
    }
}

#[test]
fn up_runs_server_and_node_in_one_process() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let xdg = dir.join("xdg");
    let (_up, line) = start(
        &[
            "up",
            "--data-dir",
            dir.join("d").to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
            "--runtime",
            "hollow",
            "--synthetic",
            "pack:1 numa:1 core:4 pu:2",
        ],
        &[("XDG_CONFIG_HOME", &xdg)],
        "pinion is up",
    );
    // The first core's threads (0 and 4 in Linux numbering) are reserved.
    assert!(line.contains("CPUs 0,4 reserved"), "{line}");
    let config = xdg.join("pinion/config");
    assert!(config.exists(), "credentials written where the CLI looks by default");
    apply(&config, dir, "two", 2);
    let p = wait_pod(&config, "two", "two running", |p| p["status"]["phase"] == "Running");
    let got: Vec<u64> = serde_json::from_value(cpus(&p)).expect("cpus");
    assert_eq!(got, vec![1, 5], "a whole core, not the reserved one");
}

/// `pinion up` takes the node's device flags as `pinion agent` does: on a tree
/// with GPUs and VFs, `--sriov-resource` renames a PF's VFs and `--devices`
/// withdraws the GPUs, and `describe node` shows what the node offers.
#[test]
fn up_takes_the_node_device_flags() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let root = dir.join("root");
    device_tree::gpu_machine(&root);
    let devices = dir.join("devices.yaml");
    std::fs::write(&devices, "nvidia.com/gpu: []\n").expect("write devices");
    let xdg = dir.join("xdg");
    let (_up, _) = start(
        &[
            "up",
            "--data-dir",
            dir.join("d").to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
            "--runtime",
            "hollow",
            "--sysfs-root",
            root.to_str().expect("utf-8"),
            "--sriov-resource",
            "ens1f0=example.com/fast-nic",
            "--devices",
            devices.to_str().expect("utf-8"),
            "--node-name",
            "edge",
        ],
        &[("XDG_CONFIG_HOME", &xdg)],
        "pinion is up",
    );
    let config = xdg.join("pinion/config");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (ok, text) = cli(&config, &["describe", "node", "edge"]);
        if ok && text.contains("Devices:") {
            break text;
        }
        assert!(Instant::now() < deadline, "no node with devices after 30s: {text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("0000:")).collect();
    assert!(rows.iter().any(|l| l.contains("example.com/fast-nic") && l.contains(device_tree::VF_VFIO)), "{text}");
    assert!(!text.contains("nvidia.com/gpu"), "the file withdrew the GPUs: {text}");
}

/// A node flag `pinion up` cannot honour stops it before anything starts:
/// no server state is written, and the message names the flag.
#[test]
fn up_refuses_bad_node_flags_before_starting() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("d");
    let check = |extra: &[&str], expected: &str| {
        let out = Command::new(PINION)
            .args(["up", "--listen", "127.0.0.1:0", "--runtime", "hollow", "--synthetic", "pack:1 numa:1 core:4 pu:2"])
            .arg("--data-dir")
            .arg(&data)
            .args(extra)
            .env("XDG_CONFIG_HOME", tmp.path().join("xdg"))
            .output()
            .expect("run pinion up");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} succeeded");
        assert!(err.contains(expected), "{extra:?}: {err}");
        assert!(!data.join("server").exists(), "{extra:?}: the server started");
    };
    check(&["--sriov-resource", "bogus"], "--sriov-resource \"bogus\": expected PF=NAME");
    check(
        &["--cpu-manager-option", "full-pcpus-only=true", "--cpu-manager-option", "distribute-cpus-across-cores=true"],
        "full-pcpus-only and distribute-cpus-across-cores cannot be used together",
    );
    check(&["--reserved-cpus", "9"], "--reserved-cpus: CPUs 9 are not on this machine");
    check(&["--topology-scope", "wide"], "wide");
    check(&["--devices", "/nonexistent/devices.yaml"], "devices.yaml");
}

fn node_condition(config: &Path, name: &str) -> String {
    let (_, out) = cli(config, &["get", "nodes", name, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    v["status"]["condition"].as_str().unwrap_or_default().to_string()
}

fn agent_pods(data: &Path) -> Value {
    let out = Command::new(PINION)
        .args(["agent", "status", "-o", "json", "--data-dir"])
        .arg(data)
        .output()
        .expect("agent status");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["pods"].clone()
}

/// How long a node's condition or the nodelet's pods may take to change.
const CHANGE: Duration = Duration::from_secs(30);

#[test]
fn a_nodelet_cut_off_keeps_its_pods_and_reconciles_when_it_comes_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let srv = dir.join("srv");
    let (_server, line) = start(
        &["server", "--data-dir", srv.to_str().expect("utf-8"), "--listen", "127.0.0.1:0", "--heartbeat-grace", "2"],
        &[],
        "listening on",
    );
    let url = line.split('(').nth(1).and_then(|s| s.strip_suffix(')')).expect("server URL").to_string();
    let server_addr: std::net::SocketAddr = url.trim_start_matches("https://").parse().expect("server address");
    let relay = Relay::start(server_addr).expect("relay");
    let token = std::fs::read_to_string(srv.join("join-token")).expect("join token");
    let config = srv.join("admin.conf");
    // The nodelet reaches the server only through the relay.
    let relayed = format!("https://127.0.0.1:{}", relay.addr.port());
    let mut cmd = Command::new(PINION);
    cmd.args(["agent", "--server", &relayed, "--token", token.trim(), "--ca"])
        .arg(srv.join("pki/ca.crt"))
        .arg("--data-dir")
        .arg(dir.join("edge"))
        .args(["--runtime", "hollow", "--synthetic", "pack:1 numa:1 core:8 pu:1", "--reserved-cpus", "0"])
        .args(["--node-name", "edge", "--endpoint-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _edge = Proc(cmd.spawn().expect("spawn agent"));

    apply(&config, dir, "keep", 2);
    apply(&config, dir, "gone", 2);
    let keep = wait_pod(&config, "keep", "keep running", |p| p["status"]["phase"] == "Running");
    wait_pod(&config, "gone", "gone running", |p| p["status"]["phase"] == "Running");
    let keep_cpus = cpus(&keep);

    relay.set_cut(true);
    wait_for("edge NotReady", CHANGE, || node_condition(&config, "edge") == "NotReady");
    let unknown = wait_pod(&config, "keep", "keep Unknown", |p| p["status"]["phase"] == "Unknown");
    assert_eq!(unknown["spec"]["nodeName"], "edge", "left bound, not deleted: {unknown:#}");
    // While cut off: one pod deleted, one created (nowhere to go: the only node is NotReady).
    let (ok, out) = cli(&config, &["delete", "pod", "gone"]);
    assert!(ok, "{out}");
    apply(&config, dir, "new", 2);
    std::thread::sleep(Duration::from_secs(2));
    let new = pod(&config, "new");
    assert!(new["spec"]["nodeName"].is_null(), "not bound to a NotReady node: {new:#}");
    // Edge autonomy: the nodelet kept running both, unaware of the delete.
    let pods = agent_pods(&dir.join("edge"));
    assert_eq!(pods["keep"]["phase"], "Running", "{pods:#}");
    assert_eq!(pods["gone"]["phase"], "Running", "{pods:#}");

    relay.set_cut(false);
    wait_for("edge Ready", CHANGE, || node_condition(&config, "edge") == "Ready");
    let back = wait_pod(&config, "keep", "keep Running again", |p| p["status"]["phase"] == "Running");
    assert_eq!(cpus(&back), keep_cpus, "the same CPUs: untouched while away");
    let new = wait_pod(&config, "new", "new running", |p| p["status"]["phase"] == "Running");
    assert_eq!(new["spec"]["nodeName"], "edge");
    wait_for("the nodelet to drop the pod deleted while it was away", CHANGE, || {
        agent_pods(&dir.join("edge")).get("gone").is_none()
    });
    // Nothing duplicated: each pod once on the node, no CPU given twice.
    let pods = agent_pods(&dir.join("edge"));
    let names: Vec<&String> = pods.as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert_eq!(names, ["keep", "new"], "{pods:#}");
    let a: Vec<u64> = serde_json::from_value(cpus(&back)).expect("cpus");
    let b: Vec<u64> = serde_json::from_value(cpus(&new)).expect("cpus");
    assert!(a.iter().all(|c| !b.contains(c)), "{a:?} vs {b:?}");
}

/// `pinion run -N/-n`: a Job whose ranks are placed together, exit codes and
/// refusals as a user of `srun` expects them (hollow node: `true` exits 0,
/// `false` 1).
#[test]
fn run_with_nodes_and_tasks_makes_a_gang_job() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let xdg = dir.join("xdg");
    let data = dir.join("d");
    let (_up, _) = start(
        &[
            "up",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
            "--runtime",
            "hollow",
            "--synthetic",
            "pack:1 numa:2 core:4 pu:1",
        ],
        &[("XDG_CONFIG_HOME", &xdg)],
        "pinion is up",
    );
    let config = xdg.join("pinion/config");
    let run = |args: &[&str]| {
        let out = Command::new(PINION).arg("--config").arg(&config).args(args).output().expect("run pinion");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    // Three ranks on the one node, one CPU each.
    let (code, text) = run(&["run", "ok", "-N", "1", "--ntasks-per-node", "3", "--cpus", "1", "--", "true"]);
    assert_eq!(code, Some(0), "{text}");
    let (_, job) = cli(&config, &["get", "jobs", "ok", "-o", "json"]);
    let job: Value = serde_json::from_str(&job).expect("job json");
    assert_eq!(job["status"]["phase"], "Succeeded", "{job}");
    assert_eq!(job["spec"]["gang"]["perNode"], 3, "{job}");
    // A failing rank: the run's code, the job's first failure.
    let (code, text) = run(&["run", "bad", "-n", "2", "--cpus", "1", "--", "false"]);
    assert_eq!(code, Some(1), "{text}");
    let (_, described) = cli(&config, &["describe", "job", "bad"]);
    assert!(described.contains("Phase:       Failed") && described.contains("failed: exit code 1"), "{described}");
    // Seven allocatable CPUs (the first core is reserved): eight never fit, nor
    // two nodes on a cluster of one; refused at once, nothing left behind.
    let (code, text) = run(&["run", "big", "-n", "8", "--cpus", "1", "--", "true"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("can never run") && text.contains("7 fit"), "{text}");
    let (code, text) = run(&["run", "wide", "-N", "2", "--cpus", "1", "--", "true"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("can never run"), "{text}");
    // One pod that no node can ever hold: `run` says its own flag for waiting,
    // not the annotation a manifest would carry.
    let (code, text) = run(&["run", "huge", "--cpus", "64", "--", "true"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("no node can ever run") && text.contains("run with --wait-for-nodes"), "{text}");
    assert!(!text.contains("annotate"), "{text}");
    let (_, jobs) = cli(&config, &["get", "jobs"]);
    assert!(!jobs.contains("big") && !jobs.contains("wide"), "{jobs}");
    let (code, text) = run(&["run", "zero", "-N", "0", "--", "true"]);
    assert_ne!(code, Some(0));
    assert!(text.contains("--nodes 0"), "{text}");
}
