//! `pinion plan` as a user runs it: the built binary on synthetic machines, the
//! committed 17-node topology and a sysfs fixture; JSON checked field by field.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

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
