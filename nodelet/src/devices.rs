//! Device resources without a hand-written file: which PCI functions of a
//! machine are offered to pods, under which resource name, with which device
//! nodes, as device plugins find them.
//!
//! Discovery (`offer`, called by `discovery::discover` on the same root) reads
//! `sys/bus/pci/devices/*`, `proc/driver/nvidia/gpus/ADDR/information` and
//! `dev/`:
//! - an NVIDIA GPU (vendor `0x10de`, a display class `0x03xxxx`) that the
//!   driver knows (its information file names the `Device Minor` N) and whose
//!   `/dev/nvidiaN` exists is `nvidia.com/gpu`, with `/dev/nvidiaN` and the
//!   control nodes present (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`,
//!   `nvidia-modeset`);
//! - an SR-IOV virtual function (a function with a `physfn` link) whose
//!   physical function has a netdev (`physfn/net/NAME`) is
//!   `pinion.io/sriov-vf-NAME`; bound to `vfio-pci` it gets
//!   `/dev/vfio/GROUP` (its `iommu_group`) and `/dev/vfio/vfio`, bound to a
//!   kernel driver none, and its netdev (`net/NAME`), which the agent moves
//!   into the network namespace of the pod holding it.
//!
//! Every offered device gets its DRA locality (`NodeTopology::set_device_locality`).
//! The agent's operator then adjusts what was found: `rename_sriov` (the
//! `--sriov-resource PF=NAME` flag) and `apply_file` (the `--devices` file,
//! whose rule is on `apply_file`). An absent file is tolerated; a present one
//! that does not parse is an error naming it, as everywhere in discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use specs::NodeTopology;

use crate::discovery::{dir_entries, malformed, read_opt, DiscoveryError};

/// The resource NVIDIA's device plugin offers GPUs as.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// Prefix of a physical function's VFs' resource; the PF's netdev follows.
const SRIOV_PREFIX: &str = "pinion.io/sriov-vf-";
const NVIDIA_VENDOR: &str = "0x10de";
/// What every process using an NVIDIA GPU opens besides the GPU's own node.
const NVIDIA_CONTROL_NODES: [&str; 4] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

/// Finds the GPUs and VFs among `topology.devices` (read under `root`) and
/// marks them offered, then fills every device's DRA locality.
pub(crate) fn offer(root: &Path, topology: &mut NodeTopology) -> Result<(), DiscoveryError> {
    let pci = root.join("sys/bus/pci/devices");
    for d in &mut topology.devices {
        let dir = pci.join(&d.address);
        let found = match nvidia_gpu(root, &dir, &d.address, &d.class)? {
            Some(nodes) => Some((NVIDIA_GPU.to_string(), nodes)),
            None => sriov_vf(root, &dir)?,
        };
        if let Some((resource, nodes)) = found {
            tracing::debug!(address = %d.address, %resource, "device offered");
            d.resource = Some(resource);
            d.device_nodes = nodes;
            // A VF with a kernel driver is a netdev, which the pod gets moved in.
            let mut netdevs: Vec<String> = dir_entries(&dir.join("net"))?.into_iter().map(|(n, _)| n).collect();
            netdevs.sort();
            d.netdev = netdevs.into_iter().next();
        }
    }
    topology.set_device_locality();
    Ok(())
}

/// A host path (`/dev/...`) when it exists under `root`.
fn present(root: &Path, host: &str) -> Option<PathBuf> {
    root.join(host.trim_start_matches('/')).exists().then(|| PathBuf::from(host))
}

/// An NVIDIA GPU's device nodes, or `None` when `dir` is not a GPU the
/// driver serves.
fn nvidia_gpu(root: &Path, dir: &Path, address: &str, class: &str) -> Result<Option<Vec<PathBuf>>, DiscoveryError> {
    // Display controllers only: a GPU's audio (0x0403) and USB (0x0c03)
    // functions, or an NVSwitch (0x0680), are no GPUs.
    if !class.starts_with("0x03") || read_opt(&dir.join("vendor"))?.as_deref() != Some(NVIDIA_VENDOR) {
        return Ok(None);
    }
    let info = root.join("proc/driver/nvidia/gpus").join(address).join("information");
    let Some(text) = read_opt(&info)? else {
        tracing::info!(address, "NVIDIA GPU without the nvidia driver's information file: not offered");
        return Ok(None);
    };
    let minor = text
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == "Device Minor").map(|(_, v)| v.trim()))
        .ok_or_else(|| malformed(&info, "no \"Device Minor:\" line"))?;
    let minor: u32 = minor.parse().map_err(|_| malformed(&info, format!("Device Minor {minor:?} is not a number")))?;
    let Some(gpu) = present(root, &format!("/dev/nvidia{minor}")) else {
        // The nodes appear once something (nvidia-modprobe, nvidia-persistenced) creates them.
        tracing::warn!(address, "NVIDIA GPU without /dev/nvidia{minor}: not offered");
        return Ok(None);
    };
    let mut nodes = vec![gpu];
    nodes.extend(NVIDIA_CONTROL_NODES.iter().filter_map(|n| present(root, &format!("/dev/{n}"))));
    Ok(Some(nodes))
}

/// An SR-IOV VF's resource and device nodes, or `None` when `dir` is no VF
/// (or one whose PF has no netdev to name it by).
fn sriov_vf(root: &Path, dir: &Path) -> Result<Option<(String, Vec<PathBuf>)>, DiscoveryError> {
    let physfn = dir.join("physfn");
    if !physfn.is_dir() {
        return Ok(None);
    }
    let mut netdevs: Vec<String> = dir_entries(&physfn.join("net"))?.into_iter().map(|(name, _)| name).collect();
    netdevs.sort();
    let Some(pf) = netdevs.into_iter().next() else {
        tracing::info!(vf = %dir.display(), "SR-IOV VF whose PF has no netdev: not offered (list it in --devices)");
        return Ok(None);
    };
    let resource = format!("{SRIOV_PREFIX}{pf}");
    if !specs::validate::is_device_resource_name(&resource) {
        tracing::warn!(vf = %dir.display(), %resource, "not a resource name: VF not offered (list it in --devices)");
        return Ok(None);
    }
    let mut nodes = Vec::new();
    if link_name(&dir.join("driver")).as_deref() == Some("vfio-pci") {
        if let Some(group) = link_name(&dir.join("iommu_group")) {
            nodes.extend(present(root, &format!("/dev/vfio/{group}")));
            nodes.extend(present(root, "/dev/vfio/vfio"));
        }
    }
    Ok(Some((resource, nodes)))
}

/// The last component of a symlink's target (`driver` -> `.../vfio-pci`).
fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path).ok()?.file_name()?.to_str().map(String::from)
}

// ---------------------------------------------------------------------------
// The operator's word

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DevicesError {
    #[error("{field}: {address} is not a PCI device of this machine")]
    UnknownAddress { field: String, address: String },
    #[error("{field}: {address} is listed twice")]
    Duplicate { field: String, address: String },
    #[error("{field}: {name:?} is not a device resource name (want domain/name, e.g. example.com/nic)")]
    BadName { field: String, name: String },
    #[error("{field}: {path} is not an absolute path")]
    RelativeNode { field: String, path: String },
    #[error("{field}: give the device's PCI address, or its netdev")]
    NoAddress { field: String },
    #[error("{field}: {name:?} {why}")]
    BadNetdev { field: String, name: String, why: &'static str },
    #[error("{pf}: no SR-IOV virtual functions of a PF with this netdev were found (found: {found})")]
    UnknownPf { pf: String, found: String },
}

/// One device as the `--devices` file lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceEntry {
    /// A PCI function of this machine; may be left out for a `netdev`
    /// that is no PCI function (a veth or dummy end standing in for a VF):
    /// its address is then `netdev/NAME`.
    #[serde(default)]
    address: String,
    /// The device is this network interface on the host: a pod holding it
    /// gets it moved into its network namespace (CNI `host-device`).
    #[serde(default)]
    netdev: Option<String>,
    /// Absent: the nodes discovery found for the device (none for one it did
    /// not offer); given (even empty): exactly these.
    #[serde(default)]
    device_nodes: Option<Vec<PathBuf>>,
}

/// The address of a `--devices` netdev that is no PCI function: this and its name.
const NETDEV_PREFIX: &str = "netdev/";

/// The `--devices` file: resource name -> its devices.
pub type DevicesFile = BTreeMap<String, Vec<DeviceEntry>>;

/// `--sriov-resource PF=NAME`: the VFs discovered as `pinion.io/sriov-vf-PF`
/// are offered as `NAME`. A PF with no discovered VFs is an error (a typo
/// would otherwise leave the VFs under their default name unnoticed).
pub fn rename_sriov(topology: &mut NodeTopology, names: &BTreeMap<String, String>) -> Result<(), DevicesError> {
    for (pf, name) in names {
        if !specs::validate::is_device_resource_name(name) {
            return Err(DevicesError::BadName { field: format!("--sriov-resource {pf}"), name: name.clone() });
        }
        let from = format!("{SRIOV_PREFIX}{pf}");
        let mut renamed = false;
        for d in topology.devices.iter_mut().filter(|d| d.resource.as_deref() == Some(from.as_str())) {
            d.resource = Some(name.clone());
            renamed = true;
        }
        if !renamed {
            let found: BTreeSet<&str> =
                topology.devices.iter().filter_map(|d| d.resource.as_deref()?.strip_prefix(SRIOV_PREFIX)).collect();
            let found =
                if found.is_empty() { "none".to_string() } else { found.into_iter().collect::<Vec<_>>().join(", ") };
            return Err(DevicesError::UnknownPf { pf: pf.clone(), found });
        }
    }
    Ok(())
}

/// Applies the `--devices` file over what discovery found. Each resource the
/// file names is the file's: its devices are exactly the ones listed under
/// it (`nvidia.com/gpu: []` offers no GPU; a discovered device of that
/// resource not listed is no longer offered). A listed address is taken
/// from whatever resource discovery gave it (a rename) or offered for the
/// first time (an addition; it must be a PCI device of this machine), with
/// the entry's `deviceNodes` when given, else the discovered ones. Resources
/// the file does not name keep their discovered devices. Field paths in
/// errors read `RESOURCE[i].address`.
pub fn apply_file(topology: &mut NodeTopology, file: &DevicesFile) -> Result<(), DevicesError> {
    let mut listed: BTreeMap<String, (&str, &DeviceEntry)> = BTreeMap::new();
    for (resource, entries) in file {
        if !specs::validate::is_device_resource_name(resource) {
            return Err(DevicesError::BadName { field: resource.clone(), name: resource.clone() });
        }
        for (i, e) in entries.iter().enumerate() {
            let field = format!("{resource}[{i}].address");
            if let Some(name) = &e.netdev {
                let ok =
                    specs::pod::ifname_ok(name)
                        .and_then(|()| if name == "lo" { Err("is the loopback") } else { Ok(()) });
                if let Err(why) = ok {
                    let field = format!("{resource}[{i}].netdev");
                    return Err(DevicesError::BadNetdev { field, name: name.clone(), why });
                }
            }
            if e.address.is_empty() && e.netdev.is_none() {
                return Err(DevicesError::NoAddress { field });
            }
            let address = match &e.netdev {
                Some(name) if e.address.is_empty() => format!("{NETDEV_PREFIX}{name}"),
                _ => e.address.clone(),
            };
            if !address.starts_with(NETDEV_PREFIX) && !topology.devices.iter().any(|d| d.address == address) {
                return Err(DevicesError::UnknownAddress { field, address });
            }
            if listed.insert(address.clone(), (resource.as_str(), e)).is_some() {
                return Err(DevicesError::Duplicate { field, address });
            }
            for (j, node) in e.device_nodes.iter().flatten().enumerate() {
                if !node.is_absolute() {
                    let field = format!("{resource}[{i}].deviceNodes[{j}]");
                    return Err(DevicesError::RelativeNode { field, path: node.display().to_string() });
                }
            }
        }
    }
    for d in &mut topology.devices {
        if let Some((resource, entry)) = listed.remove(d.address.as_str()) {
            d.resource = Some(resource.to_string());
            if let Some(nodes) = &entry.device_nodes {
                d.device_nodes = nodes.clone();
            }
            if entry.netdev.is_some() {
                d.netdev = entry.netdev.clone();
            }
        } else if d.resource.as_ref().is_some_and(|r| file.contains_key(r)) {
            d.resource = None;
            d.device_nodes.clear();
        }
    }
    // What is left is a netdev that is no PCI function of this machine.
    for (address, (resource, entry)) in listed {
        topology.devices.push(specs::topology::PciDevice {
            address,
            class: "0x020000".into(),
            numa: None,
            resource: Some(resource.to_string()),
            device_nodes: entry.device_nodes.clone().unwrap_or_default(),
            numa_node: Vec::new(),
            netdev: entry.netdev.clone(),
        });
    }
    topology.set_device_locality();
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;
    use specs::topology::PciDevice;

    /// Discovery's result on a small machine: two GPUs, two VFs, a NIC nobody offers.
    fn found() -> NodeTopology {
        let dev = |address: &str, resource: Option<&str>, nodes: &[&str]| PciDevice {
            address: address.into(),
            class: "0x030200".into(),
            numa: Some(0),
            resource: resource.map(String::from),
            device_nodes: nodes.iter().map(PathBuf::from).collect(),
            numa_node: Vec::new(),
            netdev: None,
        };
        let mut t = specs::topology::synthetic::parse("pack:1 numa:1 core:2 pu:1").unwrap();
        t.devices = vec![
            dev("0000:3b:00.0", Some(NVIDIA_GPU), &["/dev/nvidia0", "/dev/nvidiactl"]),
            dev("0000:3c:00.0", Some(NVIDIA_GPU), &["/dev/nvidia1", "/dev/nvidiactl"]),
            dev("0000:5e:00.2", Some("pinion.io/sriov-vf-ens1f0"), &["/dev/vfio/42"]),
            dev("0000:5e:00.3", Some("pinion.io/sriov-vf-ens1f0"), &[]),
            dev("0000:60:00.0", None, &[]),
        ];
        t
    }

    /// (address, resource, device nodes) of an offered device.
    type Offered = (String, String, Vec<String>);

    fn offered(t: &NodeTopology) -> Vec<Offered> {
        t.devices
            .iter()
            .filter_map(|d| {
                let nodes = d.device_nodes.iter().map(|p| p.display().to_string()).collect();
                Some((d.address.clone(), d.resource.clone()?, nodes))
            })
            .collect()
    }

    fn row(address: &str, resource: &str, nodes: &[&str]) -> Offered {
        (address.into(), resource.into(), nodes.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn the_file_renames_adds_and_removes() {
        let gpu0 = row("0000:3b:00.0", NVIDIA_GPU, &["/dev/nvidia0", "/dev/nvidiactl"]);
        let gpu1 = row("0000:3c:00.0", NVIDIA_GPU, &["/dev/nvidia1", "/dev/nvidiactl"]);
        let vf2 = row("0000:5e:00.2", "pinion.io/sriov-vf-ens1f0", &["/dev/vfio/42"]);
        let vf3 = row("0000:5e:00.3", "pinion.io/sriov-vf-ens1f0", &[]);
        let cases: Vec<(&str, &str, Vec<Offered>)> = vec![
            ("nothing said", "{}", vec![gpu0.clone(), gpu1.clone(), vf2.clone(), vf3.clone()]),
            // Naming a resource keeps only what is listed under it.
            (
                "one GPU kept",
                "nvidia.com/gpu: [{address: '0000:3c:00.0'}]",
                vec![gpu1.clone(), vf2.clone(), vf3.clone()],
            ),
            ("no GPU", "nvidia.com/gpu: []", vec![vf2.clone(), vf3.clone()]),
            // A rename keeps the discovered nodes unless the entry gives its own.
            (
                "GPU renamed",
                "example.com/a100: [{address: '0000:3b:00.0'}]",
                vec![
                    row("0000:3b:00.0", "example.com/a100", &["/dev/nvidia0", "/dev/nvidiactl"]),
                    gpu1.clone(),
                    vf2.clone(),
                    vf3.clone(),
                ],
            ),
            (
                "VF renamed with its own nodes",
                "example.com/fast: [{address: '0000:5e:00.2', deviceNodes: []}]",
                vec![gpu0.clone(), gpu1.clone(), row("0000:5e:00.2", "example.com/fast", &[]), vf3.clone()],
            ),
            // A device discovery did not offer, added as before discovery existed.
            (
                "NIC added",
                "example.com/nic: [{address: '0000:60:00.0', deviceNodes: [/dev/vfio/7]}]",
                vec![
                    gpu0.clone(),
                    gpu1.clone(),
                    vf2.clone(),
                    vf3.clone(),
                    row("0000:60:00.0", "example.com/nic", &["/dev/vfio/7"]),
                ],
            ),
            (
                "NIC added bare",
                "example.com/nic: [{address: '0000:60:00.0'}]",
                vec![gpu0.clone(), gpu1.clone(), vf2.clone(), vf3.clone(), row("0000:60:00.0", "example.com/nic", &[])],
            ),
        ];
        for (what, yaml, expected) in cases {
            let file: DevicesFile = serde_yaml_ng::from_str(yaml).unwrap();
            let mut t = found();
            apply_file(&mut t, &file).unwrap();
            assert_eq!(offered(&t), expected, "{what}");
            assert!(t.devices.iter().all(|d| d.resource.is_none() == d.numa_node.is_empty()), "{what}: locality");
        }
    }

    #[test]
    fn bad_files_name_the_entry() {
        let cases = [
            (
                "example.com/x: [{address: '0000:99:00.0'}]",
                DevicesError::UnknownAddress {
                    field: "example.com/x[0].address".into(),
                    address: "0000:99:00.0".into(),
                },
            ),
            (
                "a.io/x: [{address: '0000:3b:00.0'}]\nb.io/y: [{address: '0000:3b:00.0'}]",
                DevicesError::Duplicate { field: "b.io/y[0].address".into(), address: "0000:3b:00.0".into() },
            ),
            ("gpu: []", DevicesError::BadName { field: "gpu".into(), name: "gpu".into() }),
            ("a.io/x: [{deviceNodes: []}]", DevicesError::NoAddress { field: "a.io/x[0].address".into() }),
            (
                "a.io/x: [{netdev: 'a/b'}]",
                DevicesError::BadNetdev {
                    field: "a.io/x[0].netdev".into(),
                    name: "a/b".into(),
                    why: "must be printable ASCII without '/', ':' or spaces, and not . or ..",
                },
            ),
            (
                "a.io/x: [{netdev: lo}]",
                DevicesError::BadNetdev { field: "a.io/x[0].netdev".into(), name: "lo".into(), why: "is the loopback" },
            ),
            (
                "a.io/x: [{netdev: v0}, {netdev: v0}]",
                DevicesError::Duplicate { field: "a.io/x[1].address".into(), address: "netdev/v0".into() },
            ),
            (
                "a.io/x: [{address: '0000:3b:00.0', deviceNodes: [dev/nvidia0]}]",
                DevicesError::RelativeNode { field: "a.io/x[0].deviceNodes[0]".into(), path: "dev/nvidia0".into() },
            ),
        ];
        for (yaml, expected) in cases {
            let file: DevicesFile = serde_yaml_ng::from_str(yaml).unwrap();
            assert_eq!(apply_file(&mut found(), &file), Err(expected), "{yaml}");
        }
    }

    #[test]
    fn netdevs_from_the_file() {
        let mut t = found();
        let yaml = "example.com/vf: [{address: '0000:5e:00.3', netdev: ens1f0v3}, {netdev: pvf0}]";
        let file: DevicesFile = serde_yaml_ng::from_str(yaml).unwrap();
        apply_file(&mut t, &file).unwrap();
        let vfs: Vec<(&str, Option<&str>)> = t
            .devices
            .iter()
            .filter(|d| d.resource.as_deref() == Some("example.com/vf"))
            .map(|d| (d.address.as_str(), d.netdev.as_deref()))
            .collect();
        assert_eq!(vfs, [("0000:5e:00.3", Some("ens1f0v3")), ("netdev/pvf0", Some("pvf0"))]);
        assert_eq!(t.device_resources().get("example.com/vf").map(Vec::len), Some(2));
    }

    #[test]
    fn sriov_names_map_by_pf() {
        let mut t = found();
        rename_sriov(&mut t, &BTreeMap::from([("ens1f0".into(), "example.com/fast-nic".into())])).unwrap();
        let vfs: Vec<Option<&str>> = t.devices[2..4].iter().map(|d| d.resource.as_deref()).collect();
        assert_eq!(vfs, [Some("example.com/fast-nic"); 2]);
        assert_eq!(t.devices[0].resource.as_deref(), Some(NVIDIA_GPU));

        let err = rename_sriov(&mut found(), &BTreeMap::from([("ens9".into(), "example.com/x".into())])).unwrap_err();
        assert_eq!(err, DevicesError::UnknownPf { pf: "ens9".into(), found: "ens1f0".into() });
        let err = rename_sriov(&mut found(), &BTreeMap::from([("ens1f0".into(), "fast".into())])).unwrap_err();
        assert!(matches!(err, DevicesError::BadName { .. }), "{err}");
    }
}
