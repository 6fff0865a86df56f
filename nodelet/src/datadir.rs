//! The node's data dir is private: 0700, and what the node wrote inside it
//! (checkpoint, status, logs, records, keys, the CNI records, the hollow
//! runtime's state) 0600, since a pod's spec holds its env and containers run
//! as uid 0. A container's own tree (its overlay upper and work folders, its
//! rootfs, an image's unpacked rootfs) stays as the container or the image
//! made it: a setuid file there is reachable by nobody but root only because
//! no folder above it lets anyone else in.
//!
//! [`prepare`] makes the folder, and tightens one an older version left open
//! (0755 folders, 0644 files) at every start.

use std::io;
use std::path::{Path, PathBuf};

use crate::fsutil::private_dir;
use pinion_wire::private::tighten_tree;

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data dir {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// A folder other users share (`/`, `/tmp`): making it 0700 would lock
    /// them out, and leaving it open would expose the node's files.
    #[error("data dir {}: {reason}; give a folder of the node's own (default /var/lib/pinion)", path.display())]
    Shared { path: PathBuf, reason: &'static str },
}

/// Folders whose content a container or an image made, left untouched: the
/// modes there are the container's (its `/tmp` is 1777, its binaries 0755).
fn is_container_tree(rel: &Path) -> bool {
    let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
    match parts.as_slice() {
        ["containers", _, "upper" | "work"] | ["containers", _, "bundle", "rootfs"] => true,
        ["images", _, "rootfs"] => true,
        // An import in progress (or its leftover, which the runtime removes).
        ["images", name] => name.starts_with(".import-") || name.starts_with(".ready-"),
        _ => false,
    }
}

/// Creates the data dir 0700 (or tightens it), then takes group and other
/// permissions away from every folder and file the node wrote in it. Returns
/// how many it tightened (non-zero only on a node an older version ran).
pub fn prepare(root: &Path) -> Result<usize, DataDirError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataDirError::Io { path, source }
    };
    if root.parent().is_none() {
        return Err(DataDirError::Shared { path: root.to_path_buf(), reason: "the root folder" });
    }
    match std::fs::metadata(root) {
        Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o1000 != 0 => {
            return Err(DataDirError::Shared {
                path: root.to_path_buf(),
                reason: "a shared folder (its sticky bit is set, as /tmp's)",
            })
        }
        _ => {}
    }
    private_dir(root).map_err(io(root))?;
    let tightened = tighten_tree(root, is_container_tree).map_err(io(root))?;
    if tightened > 0 {
        tracing::warn!(dir = %root.display(), tightened, "the data dir let other users in: made private (0700 folders, 0600 files)");
    }
    Ok(tightened)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn put(p: &Path, file_mode: u32) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, "x").unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(file_mode)).unwrap();
    }

    #[test]
    fn an_open_data_dir_is_made_private_but_container_trees_keep_their_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("data");
        // What an older version left: 0755 folders, 0644 files.
        let node_files = [
            "checkpoint.json",
            "status.json",
            "node.conf",
            "logs/static_web_1/main.log",
            "logs/static_web_1/main.log.1",
            "cni/p0123.json",
            "hollow/containers.json",
            "containers/c1/container.json",
            "containers/c1/shim.log",
            "containers/c1/bundle/config.json",
            "libcontainer/c1/state.json",
            "exits/c1.json",
            "images/refs.json",
            "images/abc/image.json",
        ];
        for f in node_files {
            put(&root.join(f), 0o644);
        }
        let container_files = [
            ("containers/c1/upper/x", 0o4755),
            ("containers/c1/upper/tmp/y", 0o644),
            ("containers/c1/bundle/rootfs/usr/z", 0o755),
            ("images/abc/rootfs/bin/sh", 0o755),
            ("images/.import-1-2/layout/index.json", 0o644),
        ];
        for (f, m) in container_files {
            put(&root.join(f), m);
        }
        let walk = |p: &Path| {
            for d in p.ancestors().take_while(|a| a.starts_with(&root)) {
                fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
            }
        };
        for f in node_files.iter().chain(container_files.iter().map(|(f, _)| f)) {
            walk(root.join(f).parent().unwrap());
        }
        symlink_outside(&root, tmp.path());

        assert!(prepare(&root).unwrap() > node_files.len());
        assert_eq!(mode(&root), 0o700);
        for f in node_files {
            assert_eq!(mode(&root.join(f)), 0o600, "{f}");
            assert_eq!(mode(root.join(f).parent().unwrap()), 0o700, "{f}'s folder");
        }
        for (f, m) in container_files {
            assert_eq!(mode(&root.join(f)), m, "{f}");
        }
        assert_eq!(mode(&root.join("containers/c1/upper")), 0o755);
        assert_eq!(mode(&tmp.path().join("outside")), 0o644, "a symlink's target is not the node's");
        // Nothing left to do the second time.
        assert_eq!(prepare(&root).unwrap(), 0);
    }

    fn symlink_outside(root: &Path, tmp: &Path) {
        put(&tmp.join("outside"), 0o644);
        std::os::unix::fs::symlink(tmp.join("outside"), root.join("link")).unwrap();
    }

    #[test]
    fn a_new_data_dir_is_private_and_a_shared_folder_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("var/lib/pinion");
        assert_eq!(prepare(&root).unwrap(), 0);
        assert_eq!(mode(&root), 0o700);
        let shared = tmp.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let err = prepare(&shared).unwrap_err().to_string();
        assert!(err.contains("sticky"), "{err}");
        assert_eq!(mode(&shared), 0o1777, "left as it was");
        let err = prepare(Path::new("/")).unwrap_err().to_string();
        assert!(err.contains("root folder"), "{err}");
    }
}
