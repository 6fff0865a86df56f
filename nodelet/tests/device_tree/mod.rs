//! A machine with GPUs and SR-IOV functions written as a sysfs tree, in the
//! kernel's and the nvidia driver's layout, for the device discovery tests
//! (`nodelet/tests/devices.rs`) and the agent's (`cli/tests/agent.rs`,
//! through `#[path]`). Device nodes are plain files: discovery only checks
//! that they exist.
//!
//! Two sockets, one NUMA node each (distance 21), two CPUs each:
//! - `0000:3b:00.0` NVIDIA 3D controller on node 0, minor 0; its audio
//!   function `0000:3b:00.1` (no GPU);
//! - `0000:86:00.0` NVIDIA VGA controller on node 1, minor 1;
//! - `0000:87:00.0` NVIDIA 3D controller on node 1 the driver does not know
//!   (no information file: bound to vfio-pci for a VM, say);
//! - `0000:5e:00.0` PF `ens1f0` on node 0 with VFs `0000:5e:02.0` (vfio-pci,
//!   IOMMU group 42) and `0000:5e:02.1` (iavf);
//! - `0000:5e:00.1` PF `ens1f1` with VF `0000:5e:0a.0` on no node (-1);
//! - `/dev/nvidia0`, `/dev/nvidia1`, `/dev/nvidiactl`, `/dev/nvidia-uvm`,
//!   `/dev/vfio/42`, `/dev/vfio/vfio` (no `nvidia-uvm-tools`, no `nvidia-modeset`).
#![allow(dead_code)] // each includer uses its part

use std::path::Path;

pub const GPU0: &str = "0000:3b:00.0";
pub const GPU1: &str = "0000:86:00.0";
pub const VF_VFIO: &str = "0000:5e:02.0";
pub const VF_KERNEL: &str = "0000:5e:02.1";
pub const VF_NO_NODE: &str = "0000:5e:0a.0";

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, content).expect("write");
}

fn link(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink(target, &p).expect("symlink");
}

fn pci(root: &Path, addr: &str, vendor: &str, class: &str, numa: &str) {
    let d = format!("sys/bus/pci/devices/{addr}");
    write(root, &format!("{d}/vendor"), &format!("{vendor}\n"));
    write(root, &format!("{d}/class"), &format!("{class}\n"));
    write(root, &format!("{d}/numa_node"), &format!("{numa}\n"));
}

/// The driver's file, shortened to the lines around the one read.
fn nvidia_information(root: &Path, addr: &str, minor: u32) {
    write(
        root,
        &format!("proc/driver/nvidia/gpus/{addr}/information"),
        &format!(
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 156\nGPU UUID: \t GPU-0f1e2d3c\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {addr}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        ),
    );
}

/// A VF of `pf`, with the PF's `virtfnN` link back to it.
fn vf(root: &Path, pf: &str, n: u32, addr: &str, numa: &str, driver: &str, group: u32) {
    pci(root, addr, "0x8086", "0x020000", numa);
    let d = format!("sys/bus/pci/devices/{addr}");
    link(root, &format!("{d}/physfn"), &format!("../{pf}"));
    link(root, &format!("sys/bus/pci/devices/{pf}/virtfn{n}"), &format!("../{addr}"));
    link(root, &format!("{d}/driver"), &format!("../../../../bus/pci/drivers/{driver}"));
    link(root, &format!("{d}/iommu_group"), &format!("../../../../kernel/iommu_groups/{group}"));
}

pub fn gpu_machine(root: &Path) {
    for cpu in 0..4u32 {
        let t = format!("sys/devices/system/cpu/cpu{cpu}/topology");
        write(root, &format!("{t}/physical_package_id"), &format!("{}\n", cpu / 2));
        write(root, &format!("{t}/core_id"), &format!("{}\n", cpu % 2));
        write(root, &format!("{t}/thread_siblings_list"), &format!("{cpu}\n"));
    }
    write(root, "sys/devices/system/cpu/online", "0-3\n");
    write(root, "sys/devices/system/node/online", "0-1\n");
    for (node, cpus, distance) in [(0, "0-1", "10 21"), (1, "2-3", "21 10")] {
        let d = format!("sys/devices/system/node/node{node}");
        write(root, &format!("{d}/cpulist"), &format!("{cpus}\n"));
        write(root, &format!("{d}/distance"), &format!("{distance}\n"));
        write(root, &format!("{d}/meminfo"), &format!("Node {node} MemTotal:       4194304 kB\n"));
    }

    pci(root, GPU0, "0x10de", "0x030200", "0");
    nvidia_information(root, GPU0, 0);
    pci(root, "0000:3b:00.1", "0x10de", "0x040300", "0");
    pci(root, GPU1, "0x10de", "0x030000", "1");
    nvidia_information(root, GPU1, 1);
    pci(root, "0000:87:00.0", "0x10de", "0x030200", "1");

    for (pf, netdev) in [("0000:5e:00.0", "ens1f0"), ("0000:5e:00.1", "ens1f1")] {
        pci(root, pf, "0x8086", "0x020000", "0");
        write(root, &format!("sys/bus/pci/devices/{pf}/net/{netdev}/ifindex"), "4\n");
        write(root, &format!("sys/bus/pci/devices/{pf}/sriov_numvfs"), "2\n");
    }
    vf(root, "0000:5e:00.0", 0, VF_VFIO, "0", "vfio-pci", 42);
    vf(root, "0000:5e:00.0", 1, VF_KERNEL, "0", "iavf", 43);
    vf(root, "0000:5e:00.1", 0, VF_NO_NODE, "-1", "iavf", 44);

    for node in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "vfio/42", "vfio/vfio"] {
        write(root, &format!("dev/{node}"), "");
    }
}
