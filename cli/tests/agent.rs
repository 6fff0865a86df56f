//! `pinion agent` and `pinion agent status` as a user runs them: the real
//! binary, a manifest folder, the hollow runtime on a 2x2 machine.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

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
    let child = Command::new(PINION)
        .args(["agent", "--runtime", "hollow", "--reserved-cpus", "0", "--node-name", "t1"])
        .arg("--manifests")
        .arg(&s.manifests)
        .arg("--data-dir")
        .arg(&s.data)
        .arg("--topology")
        .arg(&s.topology)
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
