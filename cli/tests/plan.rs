//! `pinion plan` as a user runs it: the built binary on synthetic machines, the
//! committed 17-node topology and a sysfs fixture; JSON checked field by field.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../nodelet/tests/device_tree/mod.rs"]
mod device_tree;
#[path = "../../nodelet/tests/sysfs_fixtures/mod.rs"]
mod sysfs_fixtures;

fn pinion(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pinion")).args(args).output().expect("run pinion")
}

/// A pod manifest with one container per (name, cpu, memory), Guaranteed.
fn manifest(dir: &Path, name: &str, containers: &[(&str, &str, &str)], extra: &str) -> PathBuf {
    let mut y =
        format!("apiVersion: pinion.io/v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{extra}  containers:\n");
    for (c, cpu, mem) in containers {
        y.push_str(&format!(
            "  - name: {c}\n    rootfs: host\n    command: [\"/bin/true\"]\n    resources:\n      requests: {{cpu: \"{cpu}\", memory: {mem}}}\n      limits: {{cpu: \"{cpu}\", memory: {mem}}}\n"
        ));
    }
    let path = dir.join(format!("{name}.yaml"));
    std::fs::File::create(&path).and_then(|mut f| f.write_all(y.as_bytes())).expect("write manifest");
    path
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr)))
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("array").iter().filter_map(serde_json::Value::as_u64).collect()
}

const SEED: &str = "pack:2 numa:1 core:28 pu:2";

#[test]
fn four_cpus_on_the_seed_machine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let f = manifest(dir.path(), "web", &[("c", "4", "1Gi")], "");
    let out = pinion(&["plan", "-f", f.to_str().expect("utf-8"), "--synthetic", SEED, "-o", "json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["admit", "containers", "numaAffinity", "reason"]);
    assert_eq!(v["admit"], true);
    assert!(v["reason"].is_null());
    assert_eq!(ids(&v["numaAffinity"]), [0, 1]);
    assert_eq!(v["containers"][0]["name"], "c");
    assert_eq!(ids(&v["containers"][0]["cpus"]), [0, 1, 56, 57]);
    assert_eq!(ids(&v["containers"][0]["mems"]), [0]);
    assert_eq!(v["containers"][0]["devices"], serde_json::json!([]));
}

#[test]
fn flags_change_the_decision() {
    let dir = tempfile::tempdir().expect("temp dir");
    let f4 = manifest(dir.path(), "four", &[("c", "4", "1Gi")], "");
    let f4 = f4.to_str().expect("utf-8");
    let f3 = manifest(dir.path(), "three", &[("c", "3", "1Gi")], "");
    let f3 = f3.to_str().expect("utf-8");
    // (args, admitted, cpus of container 0 or a needle in reason)
    let check = |args: &[&str], admitted: bool, cpus: &[u64], needle: &str| {
        let mut full = vec!["plan", "-o", "json"];
        full.extend_from_slice(args);
        let out = pinion(&full);
        let v = json(&out);
        assert_eq!(v["admit"], admitted, "{args:?}: {v}");
        assert_eq!(out.status.code(), Some(if admitted { 0 } else { 1 }), "{args:?}");
        if admitted {
            assert_eq!(ids(&v["containers"][0]["cpus"]), cpus, "{args:?}");
        } else {
            assert!(v["reason"].as_str().expect("reason").contains(needle), "{args:?}: {v}");
        }
    };
    check(&["-f", f4, "--synthetic", SEED, "--reserved-cpus", "0,56"], true, &[1, 2, 57, 58], "");
    check(
        &["-f", f4, "--synthetic", SEED, "--allocated-cpus", "0-27,56-83", "--topology-policy", "single-numa-node"],
        true,
        &[28, 29, 84, 85],
        "",
    );
    check(
        &["-f", f3, "--synthetic", SEED, "--cpu-manager-option", "full-pcpus-only=true"],
        false,
        &[],
        "SmtAlignment: SMT alignment error",
    );
    check(
        &[
            "-f",
            f4,
            "--synthetic",
            "pack:2 numa:1 core:10 pu:1",
            "--allocated-cpus",
            "0-7,10-17",
            "--topology-policy",
            "single-numa-node",
        ],
        false,
        &[],
        "TopologyAffinity: no single NUMA node has 4 free exclusive CPUs; best is node 0 with 2",
    );
    check(
        &[
            "-f",
            f4,
            "--synthetic",
            "pack:2 numa:1 core:10 pu:1",
            "--allocated-cpus",
            "0-7,10-17",
            "--topology-policy",
            "best-effort",
        ],
        true,
        &[8, 9, 18, 19],
        "",
    );
}

#[test]
fn seventeen_node_topology_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let f = manifest(dir.path(), "wide", &[("c", "12", "1Gi")], "  topology: {policy: restricted}\n");
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/tests/data/128ia64-17n4s2c.json");
    let out =
        pinion(&["plan", "-f", f.to_str().expect("utf-8"), "--topology", topo.to_str().expect("utf-8"), "-o", "json"]);
    let v = json(&out);
    assert_eq!(v["admit"], true, "{v}");
    assert_eq!(ids(&v["numaAffinity"]), [0, 1]);
    assert_eq!(ids(&v["containers"][0]["cpus"]), (0..12).collect::<Vec<u64>>());
}

#[test]
fn text_output_and_bad_input() {
    let dir = tempfile::tempdir().expect("temp dir");
    let f = manifest(dir.path(), "t", &[("c", "2", "1Gi")], "");
    let fs = f.to_str().expect("utf-8");
    let out = pinion(&["plan", "-f", fs, "--synthetic", SEED, "-o", "text"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("admit: yes") && s.contains("container c: cpus 0,56 (2), mems 0"), "{s}");
    for (args, needle) in [
        (vec!["--synthetic", SEED, "--cpu-manager-option", "fast=true"], "unknown option \"fast\""),
        (vec!["--synthetic", SEED, "--cpu-manager-option", "full-pcpus-only=yes"], "must be true or false"),
        (
            vec![
                "--synthetic",
                SEED,
                "--topology-policy",
                "single-numa-node",
                "--cpu-manager-option",
                "align-by-socket=true",
            ],
            "align-by-socket and topology policy single-numa-node cannot be used together",
        ),
        (vec!["--synthetic", SEED, "--allocated-cpus", "200"], "--allocated-cpus: CPUs 200 are not on this machine"),
        (vec!["--synthetic", "pack:0 core:1"], "count must be at least 1"),
        (vec!["--synthetic", SEED, "--reserved-cpus", "3-1"], "reversed"),
    ] {
        let mut full = vec!["plan", "-f", fs];
        full.extend(args.iter().copied());
        let out = pinion(&full);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [], bogus: 1}\n",
    )
    .expect("write");
    let out = pinion(&["plan", "-f", bad.to_str().expect("utf-8"), "--synthetic", SEED]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml") && err.contains("bogus"), "{err}");
}

/// `specs/examples/gpu.yaml` planned on a tree with discovered GPUs
/// (`device_tree`: GPU0 on node 0, GPU1 on node 1): discovery offers both,
/// `--device` replaces the resource's list.
#[test]
fn discovered_gpus_are_planned_and_device_replaces_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("root");
    device_tree::gpu_machine(&root);
    let pod = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/examples/gpu.yaml");
    let base = ["plan", "-f", pod.to_str().expect("utf-8"), "--sysfs-root", root.to_str().expect("utf-8")];
    let plan = |extra: &[&str]| {
        let args: Vec<&str> =
            base.iter().chain(extra).copied().chain(["--topology-policy", "single-numa-node", "-o", "json"]).collect();
        json(&pinion(&args))
    };
    let v = plan(&[]);
    assert_eq!(v["containers"][0]["devices"], serde_json::json!([device_tree::GPU0]), "{v}");
    assert_eq!(ids(&v["containers"][0]["cpus"]), [0, 1]);
    let only_gpu1 = format!("nvidia.com/gpu={}", device_tree::GPU1);
    let v = plan(&["--device", &only_gpu1]);
    assert_eq!(v["containers"][0]["devices"], serde_json::json!([device_tree::GPU1]), "{v}");
    assert_eq!(ids(&v["containers"][0]["cpus"]), [2, 3]);
}

/// Two nodes of 4 CPUs, a VF on node 0, and node 2: 16 GiB of memory-only
/// HBM next to node 0 (distance 12), written as `pinion discover -o json` does.
fn tiered_machine(dir: &Path) -> PathBuf {
    use specs::topology::{NumaKind, NumaNode, PciDevice};
    let mut t = specs::topology::synthetic::parse("pack:2 numa:1 core:4 pu:1").expect("synthetic");
    t.numa_nodes[0].distances.push(12);
    t.numa_nodes[1].distances.push(32);
    t.numa_nodes.push(NumaNode {
        id: 2,
        kind: NumaKind::MemoryOnly,
        cpus: specs::CpuSet::new(),
        memory_bytes: 16 << 30,
        distances: vec![12, 32, 10],
        hugepages: vec![],
    });
    t.devices.push(PciDevice {
        address: "0000:3b:00.1".into(),
        class: "0x020000".into(),
        numa: Some(0),
        ..PciDevice::default()
    });
    let path = dir.join("tiered.json");
    std::fs::write(&path, serde_json::to_string(&t).expect("serialize")).expect("write topology");
    path
}

#[test]
fn relaxed_device_placed_remotely_and_memory_on_hbm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let topo = tiered_machine(dir.path());
    let pod = |name: &str, topology: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        let res = "{cpu: \"2\", memory: 1Gi, pinion.io/sriov-vf: \"1\"}";
        let y = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  topology: {topology}\n  containers:\n  - name: upf\n    rootfs: host\n    command: [\"/bin/true\"]\n    resources: {{requests: {res}, limits: {res}}}\n"
        );
        std::fs::write(&path, y).expect("write manifest");
        path
    };
    let plan = |f: &Path, output: &str| {
        pinion(&[
            "plan",
            "-f",
            f.to_str().expect("utf-8"),
            "--topology",
            topo.to_str().expect("utf-8"),
            "--allocated-cpus",
            "0-3",
            "--topology-policy",
            "single-numa-node",
            "--device",
            "pinion.io/sriov-vf=0000:3b:00.1",
            "-o",
            output,
        ])
    };
    // Node 0's CPUs are taken and the VF is there: strict, refused.
    let strict = pod("strict", "{}");
    let out = plan(&strict, "json");
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert!(v["reason"].as_str().expect("reason").starts_with("TopologyAffinity: "), "{v}");
    assert!(v.get("remote").is_none(), "{v}");
    // Relaxed: on node 1, the VF remote, and plan says so.
    let relaxed = pod("relaxed", "{relaxed: [pinion.io/sriov-vf]}");
    let out = plan(&relaxed, "json");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    assert_eq!(ids(&v["numaAffinity"]), [1]);
    assert_eq!(ids(&v["containers"][0]["cpus"]), [4, 5]);
    assert_eq!(ids(&v["containers"][0]["mems"]), [1]);
    let why = "relaxed: 1 requested, 0 free on the affinity's NUMA node(s) 1";
    assert_eq!(
        v["remote"],
        serde_json::json!([{"container": "upf", "resource": "pinion.io/sriov-vf", "numaNodes": [0], "reason": why}])
    );
    let text = String::from_utf8_lossy(&plan(&relaxed, "text").stdout).into_owned();
    assert!(text.contains(&format!("remote: container upf: pinion.io/sriov-vf on NUMA node 0 ({why})")), "{text}");
    let yaml = String::from_utf8_lossy(&plan(&relaxed, "yaml").stdout).into_owned();
    assert!(yaml.contains("remote:") && yaml.contains("resource: pinion.io/sriov-vf"), "{yaml}");
    // Memory on the HBM nearest the CPUs: node 2 is next to node 0, the nearest memory-only node to node 1 too.
    let hbm = pod("hbm", "{memory: nearest-memory-only, relaxed: [pinion.io/sriov-vf]}");
    let v = json(&plan(&hbm, "json"));
    assert_eq!(v["admit"], true, "{v}");
    assert_eq!(ids(&v["containers"][0]["mems"]), [2]);
}

/// The CPU-manager options on a real machine read through discovery (the
/// 2-socket Intel dump: HT siblings N and N+16, one L3 group per socket): each
/// changes the choice as the kubelet's does, and a pair the kubelet refuses
/// is refused with the reason.
#[test]
fn cpu_manager_options_on_a_real_machine() {
    let root = sysfs_fixtures::extract("32intel64-2p8co2t+8ve");
    let root = root.path().to_str().expect("utf-8");
    let dir = tempfile::tempdir().expect("temp dir");
    let four = manifest(dir.path(), "four", &[("c", "4", "1Gi")], "");
    let twenty = manifest(dir.path(), "twenty", &[("c", "20", "1Gi")], "");
    let shared = dir.path().join("shared.yaml");
    std::fs::write(
        &shared,
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: be}\nspec:\n  containers:\n  - {name: c, rootfs: host, command: [/bin/true]}\n",
    )
    .expect("write manifest");
    let cpus = |pod: &Path, extra: &[&str]| -> Vec<u64> {
        let mut args = vec!["plan", "-f", pod.to_str().expect("utf-8"), "--sysfs-root", root, "-o", "json"];
        args.extend_from_slice(extra);
        let v = json(&pinion(&args));
        assert_eq!(v["admit"], true, "{extra:?}: {v}");
        ids(&v["containers"][0]["cpus"])
    };
    let opt = "--cpu-manager-option";
    // Whole cores first; one thread per core first.
    assert_eq!(cpus(&four, &[]), [0, 1, 16, 17]);
    assert_eq!(cpus(&four, &[opt, "distribute-cpus-across-cores=true"]), [0, 1, 2, 3]);
    // 20 CPUs: packed fills socket 0's cores, then two of socket 1's;
    // distributed takes 10 (five whole cores) on each node.
    let packed: Vec<u64> = (0..10).chain(16..26).collect();
    assert_eq!(cpus(&twenty, &[]), packed);
    let spread: Vec<u64> = (0..5).chain(8..13).chain(16..21).chain(24..29).collect();
    assert_eq!(cpus(&twenty, &[opt, "distribute-cpus-across-numa=true"]), spread);
    // A BestEffort pod's pool keeps the reserved CPUs unless the reservation is strict.
    let all: Vec<u64> = (0..32).collect();
    assert_eq!(cpus(&shared, &["--reserved-cpus", "0,16"]), all);
    let strict: Vec<u64> = (1..16).chain(17..32).collect();
    assert_eq!(cpus(&shared, &["--reserved-cpus", "0,16", opt, "strict-cpu-reservation=true"]), strict);
    // The kubelet's incompatible pair.
    let out = pinion(&[
        "plan",
        "-f",
        four.to_str().expect("utf-8"),
        "--sysfs-root",
        root,
        opt,
        "prefer-align-cpus-by-uncorecache=true",
        opt,
        "distribute-cpus-across-numa=true",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa cannot be used together"),
        "{err}"
    );
}
