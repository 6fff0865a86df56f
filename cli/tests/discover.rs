//! `pinion discover` as a user runs it: the built binary on an extracted fixture,
//! its JSON checked field by field, and its errors checked for naming the problem.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../nodelet/tests/device_tree/mod.rs"]
mod device_tree;
#[path = "../../nodelet/tests/sysfs_fixtures/mod.rs"]
mod sysfs_fixtures;

use sysfs_fixtures::extract;

fn pinion(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pinion")).args(args).output().expect("run pinion")
}

#[test]
fn discover_json_on_the_intel_fixture() {
    let root = extract("32intel64-2p8co2t+8ve");
    let root = root.path().to_str().expect("utf-8 temp path");
    let out = pinion(&["discover", "--sysfs-root", root, "-o", "json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");

    let cpus = v["cpus"].as_array().expect("cpus array");
    assert_eq!(cpus.len(), 32);
    // HT siblings N and N+16 share a core; CPU 8 is on socket 1 and NUMA node 1.
    assert_eq!(cpus[3]["core"], cpus[19]["core"]);
    assert_ne!(cpus[3]["core"], cpus[4]["core"]);
    assert_eq!(
        (cpus[8]["id"].as_u64(), cpus[8]["socket"].as_u64(), cpus[8]["numa"].as_u64()),
        (Some(8), Some(1), Some(1))
    );
    let mut cores: Vec<u64> = cpus.iter().filter_map(|c| c["core"].as_u64()).collect();
    cores.sort_unstable();
    cores.dedup();
    assert_eq!(cores, (0..16).collect::<Vec<u64>>(), "core ids unique per machine, 0..16");

    let nodes = v["numaNodes"].as_array().expect("numaNodes array");
    assert_eq!(nodes.len(), 2);
    let node0_cpus: Vec<u64> = nodes[0]["cpus"].as_array().expect("cpus").iter().filter_map(|c| c.as_u64()).collect();
    assert_eq!(node0_cpus, (0..8).chain(16..24).collect::<Vec<u64>>());
    assert_eq!(nodes[0]["distances"], serde_json::json!([10, 21]));
    assert_eq!(nodes[0]["memoryBytes"].as_u64(), Some(47_925_628 * 1024));
    assert!(nodes[1]["hugepages"]
        .as_array()
        .expect("hugepages")
        .contains(&serde_json::json!({"pageSizeBytes": 2 << 20, "total": 2048})));

    let devices = v["devices"].as_array().expect("devices array");
    assert_eq!(devices.len(), 28);
    assert!(devices.iter().all(|d| d["numa"] == 0 && d["address"].is_string() && d["class"].is_string()));

    // The same JSON fed back through --topology gives the same JSON.
    let saved = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(saved.path(), &out.stdout).expect("write topology");
    let again = pinion(&["discover", "--topology", saved.path().to_str().expect("utf-8"), "-o", "json"]);
    assert!(again.status.success(), "stderr: {}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(again.stdout, out.stdout);

    // Text draws sockets, nodes and cores.
    let text = pinion(&["discover", "--sysfs-root", root, "-o", "text"]);
    let text = String::from_utf8(text.stdout).expect("utf-8");
    assert!(text.starts_with("machine: 2 sockets, 2 NUMA nodes, 16 cores, 32 CPUs, 2 L3 groups\n"), "{text}");
    assert!(text.contains("    L3: 0-7,16-23\n"), "{text}");
    assert!(text.contains("core 0: [0 16]"), "{text}");
}

#[test]
fn discover_names_the_malformed_file() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let topo = tmp.path().join("sys/devices/system/cpu/cpu0/topology");
    std::fs::create_dir_all(&topo).expect("mkdir");
    std::fs::write(topo.join("physical_package_id"), "one\n").expect("write");
    let out = pinion(&["discover", "--sysfs-root", tmp.path().to_str().expect("utf-8"), "-o", "json"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cpu0/topology/physical_package_id") && stderr.contains("not an integer"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing half-written on stdout");
}

/// GPUs and VFs found on a tree built by `device_tree`: each offered device
/// with its resource, NUMA node, DRA locality and device nodes, in every format.
#[test]
fn discover_shows_offered_devices_in_every_format() {
    let tmp = tempfile::tempdir().expect("temp dir");
    device_tree::gpu_machine(tmp.path());
    let root = tmp.path().to_str().expect("utf-8 temp path");

    let out = pinion(&["discover", "--sysfs-root", root, "-o", "json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let gpu1 =
        v["devices"].as_array().expect("devices").iter().find(|d| d["address"] == device_tree::GPU1).expect("GPU1");
    assert_eq!(
        *gpu1,
        serde_json::json!({"address": device_tree::GPU1, "class": "0x030000", "numa": 1, "resource": "nvidia.com/gpu",
            "deviceNodes": ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"], "numaNode": [1]})
    );

    let yaml = pinion(&["discover", "--sysfs-root", root, "-o", "yaml"]);
    let y: serde_json::Value = serde_yaml_ng::from_slice(&yaml.stdout).expect("YAML on stdout");
    assert_eq!(y, v, "the YAML says what the JSON says");

    let text = pinion(&["discover", "--sysfs-root", root, "-o", "text"]);
    let text = String::from_utf8(text.stdout).expect("utf-8");
    let offered = text.split("devices offered:\n").nth(1).unwrap_or_else(|| panic!("no devices section: {text}"));
    let rows: Vec<Vec<&str>> = offered.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows,
        [
            vec!["RESOURCE", "ADDRESS", "NUMA", "NUMANODE", "DEVICE", "NODES"],
            vec!["nvidia.com/gpu", device_tree::GPU0, "0", "[0]", "/dev/nvidia0,/dev/nvidiactl,/dev/nvidia-uvm"],
            vec!["nvidia.com/gpu", device_tree::GPU1, "1", "[1]", "/dev/nvidia1,/dev/nvidiactl,/dev/nvidia-uvm"],
            vec!["pinion.io/sriov-vf-ens1f0", device_tree::VF_VFIO, "0", "[0]", "/dev/vfio/42,/dev/vfio/vfio"],
            vec!["pinion.io/sriov-vf-ens1f0", device_tree::VF_KERNEL, "0", "[0]", "-"],
            vec!["pinion.io/sriov-vf-ens1f1", device_tree::VF_NO_NODE, "-", "[]", "-"],
        ],
        "{text}"
    );
}

/// lstopo's XML of the same Intel machine (e2e/fixtures/hwloc/README.md).
fn intel_xml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/fixtures/hwloc/32intel64-2p8co2t+8ve.xml")
}

#[test]
fn discover_hwloc_xml_equals_the_sysfs_tree_it_was_made_from() {
    let root = extract("32intel64-2p8co2t+8ve");
    let json = |args: &[&str]| -> serde_json::Value {
        let out = pinion(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON on stdout")
    };
    let mut sysfs = json(&["discover", "--sysfs-root", root.path().to_str().expect("utf-8"), "-o", "json"]);
    let xml = json(&["discover", "--hwloc-xml", intel_xml().to_str().expect("utf-8"), "-o", "json"]);
    // The one field that differs: the kernel's die_id 0, where hwloc writes no
    // Die object for a package of one die.
    for cpu in sysfs["cpus"].as_array_mut().expect("cpus") {
        assert_eq!(cpu.as_object_mut().expect("cpu").remove("die"), Some(serde_json::json!(0)));
    }
    assert_eq!(sysfs, xml);

    let text = pinion(&["discover", "--hwloc-xml", intel_xml().to_str().expect("utf-8"), "-o", "text"]);
    let text = String::from_utf8(text.stdout).expect("utf-8");
    assert!(text.starts_with("machine: 2 sockets, 2 NUMA nodes, 16 cores, 32 CPUs, 2 L3 groups\n"), "{text}");
    assert!(text.contains("    L3: 8-15,24-31\n"), "{text}");
}

#[test]
fn one_topology_source_at_a_time() {
    let xml = intel_xml();
    let xml = xml.to_str().expect("utf-8");
    let tmp = tempfile::tempdir().expect("temp dir");
    let pod = tmp.path().join("pod.yaml");
    std::fs::write(&pod, "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n")
        .expect("write");
    let pod = pod.to_str().expect("utf-8");
    let data = tmp.path().to_str().expect("utf-8");
    // (verb and its own arguments) x (a second source beside --hwloc-xml)
    let verbs: &[&[&str]] =
        &[&["discover"], &["plan", "-f", pod], &["agent", "--data-dir", data], &["up", "--data-dir", data]];
    let others: &[&[&str]] = &[&["--sysfs-root", "/"], &["--synthetic", "core:2"], &["--topology", "t.json"]];
    for verb in verbs {
        for other in others {
            let mut args: Vec<&str> = verb.to_vec();
            args.extend(["--hwloc-xml", xml]);
            args.extend_from_slice(other);
            let out = pinion(&args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("--hwloc-xml <FILE>") && err.contains("cannot be used with"), "{args:?}: {err}");
            assert!(err.contains(other[0]), "{args:?}: {err}");
        }
    }
    // A bad file is named, with the element and the reason.
    let bad = tmp.path().join("bad.xml");
    std::fs::write(&bad, "<topology version=\"2.0\">\n<object type=\"PU\" os_index=\"x\"/></topology>").expect("write");
    let out = pinion(&["discover", "--hwloc-xml", bad.to_str().expect("utf-8"), "-o", "json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.xml: line 2: <object type=\"PU\" os_index=\"x\">: attribute os_index: \"x\" is not"),
        "{err}"
    );
}
