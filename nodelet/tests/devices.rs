//! Device discovery through `discovery::discover` on trees built here
//! (`device_tree`): which GPUs and VFs become resources, with which device
//! nodes, NUMA node and DRA locality.
#![allow(clippy::unwrap_used)]

mod device_tree;

use device_tree::{GPU0, GPU1, VF_KERNEL, VF_NO_NODE, VF_VFIO};
use nodelet::discovery::{discover, DiscoveryError};
use specs::NodeTopology;

/// (address, resource, numa, device nodes, DRA numaNode) of every offered device.
type Offered = (String, String, Option<u32>, Vec<String>, Vec<u32>);

fn offered(t: &NodeTopology) -> Vec<Offered> {
    t.devices
        .iter()
        .filter_map(|d| {
            let nodes = d.device_nodes.iter().map(|p| p.display().to_string()).collect();
            Some((d.address.clone(), d.resource.clone()?, d.numa, nodes, d.numa_node.clone()))
        })
        .collect()
}

fn row(addr: &str, resource: &str, numa: Option<u32>, nodes: &[&str], dra: &[u32]) -> Offered {
    (addr.into(), resource.into(), numa, nodes.iter().map(|n| n.to_string()).collect(), dra.to_vec())
}

fn machine() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    device_tree::gpu_machine(dir.path());
    dir
}

#[test]
fn gpus_and_vfs_are_offered_with_their_nodes_and_locality() {
    let dir = machine();
    let t = discover(dir.path()).unwrap();
    let control = ["/dev/nvidiactl", "/dev/nvidia-uvm"];
    assert_eq!(
        offered(&t),
        vec![
            row(GPU0, "nvidia.com/gpu", Some(0), &["/dev/nvidia0", control[0], control[1]], &[0]),
            row(VF_VFIO, "pinion.io/sriov-vf-ens1f0", Some(0), &["/dev/vfio/42", "/dev/vfio/vfio"], &[0]),
            row(VF_KERNEL, "pinion.io/sriov-vf-ens1f0", Some(0), &[], &[0]),
            row(VF_NO_NODE, "pinion.io/sriov-vf-ens1f1", None, &[], &[]),
            row(GPU1, "nvidia.com/gpu", Some(1), &["/dev/nvidia1", control[0], control[1]], &[1]),
        ]
    );
    // The GPU's audio function, the GPU the driver does not serve and the PFs are PCI devices only.
    assert_eq!(t.devices.len(), 9);
    assert_eq!(t.device_resources()["nvidia.com/gpu"], [GPU0, GPU1]);

    // What `discover -o json` prints is what `--topology FILE` reads back.
    let json = serde_json::to_value(&t).unwrap();
    let gpu = json["devices"].as_array().unwrap().iter().find(|d| d["address"] == GPU1).unwrap();
    assert_eq!(gpu["resource"], "nvidia.com/gpu");
    assert_eq!(gpu["numaNode"], serde_json::json!([1]));
    assert_eq!(gpu["deviceNodes"][0], "/dev/nvidia1");
    let back: NodeTopology = serde_json::from_value(json).unwrap();
    assert_eq!(back, t);
}

#[test]
fn what_is_missing_is_not_offered() {
    // No /dev/nvidia1 yet (nothing created it): that GPU is not offered.
    let dir = machine();
    std::fs::remove_file(dir.path().join("dev/nvidia1")).unwrap();
    let t = discover(dir.path()).unwrap();
    assert_eq!(t.device_resources()["nvidia.com/gpu"], [GPU0]);

    // A PF without a netdev: its VFs have no name to go by.
    let dir = machine();
    std::fs::remove_dir_all(dir.path().join("sys/bus/pci/devices/0000:5e:00.1/net")).unwrap();
    let t = discover(dir.path()).unwrap();
    assert!(!t.device_resources().contains_key("pinion.io/sriov-vf-ens1f1"));
    assert!(t.device_resources().contains_key("pinion.io/sriov-vf-ens1f0"));

    // A VF bound to vfio-pci whose group node is absent gets only what exists.
    let dir = machine();
    std::fs::remove_file(dir.path().join("dev/vfio/42")).unwrap();
    let t = discover(dir.path()).unwrap();
    let vf = t.devices.iter().find(|d| d.address == VF_VFIO).unwrap();
    assert_eq!(vf.device_nodes, [std::path::PathBuf::from("/dev/vfio/vfio")]);
}

#[test]
fn a_driver_file_without_a_minor_names_the_file() {
    let dir = machine();
    let info = dir.path().join(format!("proc/driver/nvidia/gpus/{GPU1}/information"));
    for (content, reason) in
        [("Model: H100\n", "no \"Device Minor:\" line"), ("Device Minor: \t x\n", "is not a number")]
    {
        std::fs::write(&info, content).unwrap();
        match discover(dir.path()) {
            Err(DiscoveryError::Malformed { path, reason: got }) => {
                assert_eq!(path, info);
                assert!(got.contains(reason), "{got}");
            }
            other => panic!("{content:?}: {other:?}"),
        }
    }
}

#[test]
fn two_nodes_per_socket_share_the_locality() {
    // The same machine folded onto one socket at distance 11 (SNC2): each
    // device's DRA list names both nodes, its own first.
    let dir = machine();
    for cpu in 2..4 {
        std::fs::write(dir.path().join(format!("sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id")), "0\n")
            .unwrap();
    }
    std::fs::write(dir.path().join("sys/devices/system/node/node0/distance"), "10 11\n").unwrap();
    std::fs::write(dir.path().join("sys/devices/system/node/node1/distance"), "11 10\n").unwrap();
    let t = discover(dir.path()).unwrap();
    let dra: Vec<(&str, &[u32])> = t
        .devices
        .iter()
        .filter(|d| d.resource.is_some())
        .map(|d| (d.address.as_str(), d.numa_node.as_slice()))
        .collect();
    assert_eq!(
        dra,
        [
            (GPU0, &[0, 1][..]),
            (VF_VFIO, &[0, 1][..]),
            (VF_KERNEL, &[0, 1][..]),
            (VF_NO_NODE, &[][..]),
            (GPU1, &[1, 0][..])
        ]
    );
}
