//! `pinion agent` and `pinion agent status` as a user runs them: the real
//! binary, a manifest folder, the hollow runtime on a 2x2 machine.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

#[path = "../../nodelet/tests/device_tree/mod.rs"]
mod device_tree;

/// Two NUMA nodes, two CPUs each.
const TOPOLOGY: &str = r#"{"cpus":[{"id":0,"core":0,"socket":0,"numa":0},{"id":1,"core":1,"socket":0,"numa":0},
{"id":2,"core":2,"socket":1,"numa":1},{"id":3,"core":3,"socket":1,"numa":1}],
"numaNodes":[{"id":0,"cpus":[0,1],"memoryBytes":1073741824,"distances":[10,20]},
{"id":1,"cpus":[2,3],"memoryBytes":1073741824,"distances":[20,10]}]}"#;

fn manifest(name: &str, cpu: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources: {{limits: {{cpu: '{cpu}', memory: 64Mi}}}}\n"
    )
}

struct Setup {
    _tmp: tempfile::TempDir,
    manifests: PathBuf,
    data: PathBuf,
    topology: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let topology = tmp.path().join("topology.json");
    std::fs::write(&topology, TOPOLOGY).unwrap();
    let data = tmp.path().join("data");
    Setup { manifests, data, topology, _tmp: tmp }
}

/// Kills the agent when a test fails half-way.
struct AgentProc(Child);

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(s: &Setup, extra: &[&str]) -> AgentProc {
    agent_on(s, "--topology", &s.topology, extra)
}

/// `agent` on another topology source (`--sysfs-root DIR`).
fn agent_on(s: &Setup, source: &str, path: &Path, extra: &[&str]) -> AgentProc {
    let child = Command::new(PINION)
        .args(["agent", "--runtime", "hollow", "--reserved-cpus", "0", "--node-name", "t1"])
        .arg("--manifests")
        .arg(&s.manifests)
        .arg("--data-dir")
        .arg(&s.data)
        .arg(source)
        .arg(path)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    AgentProc(child)
}

fn status_json(data: &Path) -> Option<Value> {
    let out = Command::new(PINION).args(["agent", "status", "-o", "json", "--data-dir"]).arg(data).output().unwrap();
    out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
}

fn wait_status(data: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(v) = status_json(data) {
            if pred(&v) {
                return v;
            }
            last = Some(v);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}; last status: {last:#?}");
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().unwrap().success();
    assert!(ok, "kill -{sig}");
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "agent did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn malformed_manifest_is_reported_by_file_and_field_and_sigterm_stops_cleanly() {
    let s = setup();
    std::fs::write(s.manifests.join("good.yaml"), manifest("good", "500m")).unwrap();
    std::fs::write(s.manifests.join("bad.yaml"), manifest("bad", "1").replace("command:", "comand:")).unwrap();
    let mut a = agent(&s, &[]);
    let v = wait_status(&s.data, "both pods listed", |v| {
        v["pods"]["static/bad"].is_object() && v["pods"]["static/good"].is_object()
    });
    assert_eq!(v["nodeName"], "t1");
    assert_eq!(v["pods"]["static/bad"]["reason"], "InvalidManifest");
    let msg = v["pods"]["static/bad"]["message"].as_str().unwrap();
    assert!(msg.starts_with("bad.yaml: spec.containers[0].comand: unknown field `comand`"), "{msg}");

    let out = Command::new(PINION).args(["agent", "status", "--data-dir"]).arg(&s.data).output().unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("no agent is running"), "the agent runs");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "NODE t1");
    assert!(lines[1].starts_with("POD") && lines[1].contains("PHASE") && lines[1].contains("CPUS"), "{text}");
    let bad = lines.iter().find(|l| l.starts_with("static/bad")).unwrap();
    assert!(bad.contains("Pending") && bad.contains("InvalidManifest: bad.yaml"), "{text}");
    // Aligned: every row's PHASE column starts where the header's does.
    let col = lines[1].find("PHASE").unwrap();
    for l in &lines[2..] {
        assert!(l[col..].starts_with("Pending") || l[col..].starts_with("Running"), "misaligned: {text}");
    }

    // Fixing the file clears the error.
    std::fs::write(s.manifests.join("bad.yaml"), manifest("bad", "1")).unwrap();
    wait_status(&s.data, "bad fixed", |v| v["pods"]["static/bad"]["reason"] != "InvalidManifest");

    signal(&a.0, "TERM");
    let st = wait_exit(&mut a.0);
    assert!(st.success(), "{st:?}");
    // Stopped, its last status is still read, and said to be the last one.
    let out = Command::new(PINION).args(["agent", "status", "--data-dir"]).arg(&s.data).output().unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no agent is running on this data dir: this is the last status one wrote, "), "{said}");
}

#[test]
fn bad_flags_and_files_are_clear_errors() {
    let s = setup();
    let check = |extra: &[&str], expected: &str| {
        let out = Command::new(PINION)
            .args(["agent", "--runtime", "hollow"])
            .arg("--manifests")
            .arg(&s.manifests)
            .arg("--data-dir")
            .arg(&s.data)
            .arg("--topology")
            .arg(&s.topology)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} succeeded");
        assert!(err.contains(expected), "{extra:?}: {err}");
    };
    check(&["--reserved-cpus", "7"], "--reserved-cpus: CPUs 7 are not on this machine");
    check(&["--reserved-cpus", "x"], "--reserved-cpus");
    check(&["--topology-policy", "tight"], "tight");
    check(&["--cpu-manager-option", "full-pcpus-only"], "expected KEY=VALUE");
    check(&["--cpu-manager-option", "smt=true"], "unknown option \"smt\"");
    check(
        &["--cpu-manager-option", "full-pcpus-only=true", "--cpu-manager-option", "distribute-cpus-across-cores=true"],
        "full-pcpus-only and distribute-cpus-across-cores cannot be used together",
    );
    let devices = s.data.parent().unwrap().join("devices.yaml");
    std::fs::write(&devices, "pinion.io/vf:\n- address: '0000:3b:00.1'\n").unwrap();
    check(&["--devices", devices.to_str().unwrap()], "pinion.io/vf[0].address: 0000:3b:00.1 is not a PCI device");
    std::fs::write(&devices, "pinion.io/vf: []\ngpu: []\n").unwrap();
    check(&["--devices", devices.to_str().unwrap()], "gpu: \"gpu\" is not a device resource name");
    check(&["--sriov-resource", "ens1f0"], "--sriov-resource \"ens1f0\": expected PF=NAME");
    check(&["--sriov-resource", "ens1f0=example.com/x"], "ens1f0: no SR-IOV virtual functions");

    std::fs::create_dir_all(&s.data).unwrap();
    std::fs::write(s.data.join("checkpoint.json"), "{").unwrap();
    check(&[], &format!("{}: corrupt checkpoint", s.data.join("checkpoint.json").display()));

    let out = Command::new(PINION).args(["agent", "status", "--data-dir", "/nonexistent/pinion"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/pinion/status.json"));
}

/// Needs the admission engine: pods must run to be adopted.
#[test]
fn hollow_pods_survive_kill_9_of_the_agent() {
    let s = setup();
    std::fs::write(s.manifests.join("a.yaml"), manifest("a", "1")).unwrap();
    std::fs::write(s.manifests.join("b.yaml"), manifest("b", "1")).unwrap();
    std::fs::write(s.manifests.join("s.yaml"), manifest("s", "500m")).unwrap();
    let running = |v: &Value| ["a", "b", "s"].iter().all(|k| v["pods"][format!("static/{k}")]["phase"] == "Running");
    let mut a = agent(&s, &[]);
    let before = wait_status(&s.data, "all running", running);
    let hollow = || std::fs::read_to_string(s.data.join("hollow/containers.json")).unwrap();
    let containers_before: Value = serde_json::from_str(&hollow()).unwrap();
    signal(&a.0, "KILL");
    wait_exit(&mut a.0);

    // Removed while the agent was away: stopped after the restart.
    std::fs::remove_file(s.manifests.join("b.yaml")).unwrap();
    let _a = agent(&s, &[]);
    let after = wait_status(&s.data, "b gone", |v| {
        v["pods"]["static/b"].is_null() && v["pods"]["static/a"]["phase"] == "Running"
    });
    let cpus = |v: &Value, k: &str| -> Vec<u64> {
        let list = v["pods"][k]["placement"]["containers"][0]["cpus"].as_array().cloned().unwrap_or_default();
        list.iter().map(|c| c.as_u64().unwrap()).collect()
    };
    assert_eq!(cpus(&after, "static/a"), cpus(&before, "static/a"), "a kept its CPU");
    // b's CPU went back to the pool: the shared pod has every CPU but a's.
    let a_cpu = cpus(&after, "static/a")[0];
    assert_eq!(cpus(&after, "static/s"), (0..4).filter(|&c| c != a_cpu).collect::<Vec<u64>>());
    let containers_after: Value = serde_json::from_str(&hollow()).unwrap();
    let ids = |v: &Value| v["containers"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(ids(&containers_after).len(), 2);
    for id in ids(&containers_after) {
        assert!(ids(&containers_before).contains(&id), "{id} is not a new container");
    }
}

/// A pod asking for devices, with a Guaranteed CPU and memory and one NUMA node.
fn device_manifest(name: &str, cpu: &str, resource: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  topology: {{policy: single-numa-node}}\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources: {{limits: {{cpu: '{cpu}', memory: 64Mi, {resource}: 1}}}}\n"
    )
}

/// The hollow runtime's record of a pod's container (its config as the agent built it).
fn hollow_config(data: &Path, pod: &str) -> Value {
    let all: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("hollow/containers.json")).unwrap()).unwrap();
    let found = all["containers"].as_object().unwrap().values().find(|c| c["config"]["pod"] == pod);
    found.unwrap_or_else(|| panic!("no container of {pod}: {all:#}"))["config"].clone()
}

/// No devices file: the GPUs come from discovery (`nodelet/tests/device_tree`:
/// GPU0 on node 0, GPU1 on node 1, CPU 0 reserved). Two CPUs and a GPU on one
/// node fit only on node 1, so the pod gets GPU1, CPUs 2-3 and node 1's
/// memory, and its container the GPU's device nodes with the control nodes.
#[test]
fn discovered_gpus_are_placed_aligned_with_their_device_nodes() {
    let s = setup();
    let root = s.data.parent().unwrap().join("root");
    device_tree::gpu_machine(&root);
    std::fs::write(s.manifests.join("train.yaml"), device_manifest("train", "2", "nvidia.com/gpu")).unwrap();
    let _a = agent_on(&s, "--sysfs-root", &root, &[]);
    let v = wait_status(&s.data, "train running", |v| v["pods"]["static/train"]["phase"] == "Running");
    let placed = &v["pods"]["static/train"]["placement"]["containers"][0];
    assert_eq!(placed["devices"], serde_json::json!([device_tree::GPU1]), "{v:#}");
    assert_eq!(placed["cpus"], serde_json::json!([2, 3]), "{v:#}");
    assert_eq!(placed["mems"], serde_json::json!([1]), "{v:#}");
    let config = hollow_config(&s.data, "static/train");
    assert_eq!(config["deviceNodes"], serde_json::json!(["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]));
}

/// The devices file over discovery: GPU0 renamed (keeping its nodes), no
/// `nvidia.com/gpu` left, the ens1f0 VFs under the operator's name.
#[test]
fn the_devices_file_and_sriov_names_override_discovery() {
    let s = setup();
    let root = s.data.parent().unwrap().join("root");
    device_tree::gpu_machine(&root);
    let devices = s.data.parent().unwrap().join("devices.yaml");
    std::fs::write(&devices, format!("example.com/h100:\n- address: '{}'\nnvidia.com/gpu: []\n", device_tree::GPU0))
        .unwrap();
    std::fs::write(s.manifests.join("renamed.yaml"), device_manifest("renamed", "1", "example.com/h100")).unwrap();
    std::fs::write(s.manifests.join("gone.yaml"), device_manifest("gone", "1", "nvidia.com/gpu")).unwrap();
    std::fs::write(s.manifests.join("vf.yaml"), device_manifest("vf", "500m", "example.com/fast-nic")).unwrap();
    let extra = ["--devices", devices.to_str().unwrap(), "--sriov-resource", "ens1f0=example.com/fast-nic"];
    let _a = agent_on(&s, "--sysfs-root", &root, &extra);
    let v = wait_status(&s.data, "renamed and vf running, gone refused", |v| {
        let pods = &v["pods"];
        pods["static/renamed"]["phase"] == "Running"
            && pods["static/vf"]["phase"] == "Running"
            && pods["static/gone"]["reason"].is_string()
    });
    let devices_of = |pod: &str| v["pods"][pod]["placement"]["containers"][0]["devices"].clone();
    assert_eq!(devices_of("static/renamed"), serde_json::json!([device_tree::GPU0]));
    assert_eq!(devices_of("static/vf"), serde_json::json!([device_tree::VF_VFIO]));
    assert_eq!(v["pods"]["static/gone"]["phase"], "Pending", "{v:#}");
    let config = hollow_config(&s.data, "static/renamed");
    assert_eq!(config["deviceNodes"], serde_json::json!(["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]));
    let config = hollow_config(&s.data, "static/vf");
    assert_eq!(config["deviceNodes"], serde_json::json!(["/dev/vfio/42", "/dev/vfio/vfio"]));
}
