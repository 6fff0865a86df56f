//! Topology discovery: a Linux sysfs tree under a root directory -> `NodeTopology`.

use std::path::{Path, PathBuf};

use specs::NodeTopology;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// Reads `root/sys/devices/system/{cpu,node}` and `root/sys/bus/pci/devices`.
pub fn discover(root: &Path) -> Result<NodeTopology, DiscoveryError> {
    Err(DiscoveryError::Malformed { path: root.to_path_buf(), reason: "not built yet".into() })
}
