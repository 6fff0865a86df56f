//! Root filesystems of containers: the private directory of a `rootfs: host`
//! container (mount points for the host's read-only system directories, the
//! host's own symlinks such as `/bin -> usr/bin` copied as symlinks), and the
//! overlay (image as lower layer, a per-container upper layer) of an image
//! container, mounted before create and unmounted on remove.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::spec::HOST_DIRS;
use crate::host::{Host, MountRequest};

/// Prepares `rootfs` for a host-rootfs container; returns the host directories
/// to bind-mount read-only over their mount points.
pub fn prepare_host(rootfs: &Path) -> io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(rootfs)?;
    // The container's `/`: a non-root process must be able to walk it,
    // whatever the agent's umask (a unit with `UMask=0077` would make it
    // 0700). The folders above it stay private: after `pivot_root` the
    // container never walks them.
    fs::set_permissions(rootfs, fs::Permissions::from_mode(0o755))?;
    let mut binds = Vec::new();
    for dir in HOST_DIRS {
        let host = Path::new(dir);
        let inside = rootfs.join(dir.trim_start_matches('/'));
        match fs::symlink_metadata(host) {
            Ok(m) if m.file_type().is_symlink() => {
                // Debian's merged /usr: keep `/bin -> usr/bin` a symlink so the
                // container sees the same tree as the host.
                let target = fs::read_link(host)?;
                if fs::symlink_metadata(&inside).is_err() {
                    symlink(target, &inside)?;
                }
            }
            Ok(m) if m.is_dir() => {
                fs::create_dir_all(&inside)?;
                binds.push(host.to_path_buf());
            }
            _ => {}
        }
    }
    for dir in ["tmp", "proc", "dev", "sys"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    Ok(binds)
}

/// Mounts an overlay of `lower` (read-only) and a fresh `upper` on `target`.
pub(crate) fn mount_overlay(host: &dyn Host, lower: &Path, upper: &Path, work: &Path, target: &Path) -> io::Result<()> {
    for p in [lower, upper, work, target] {
        let s = p.to_string_lossy();
        if s.contains([',', ':', '\n']) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{s}: overlay paths may not hold , or :")));
        }
    }
    fs::create_dir_all(upper)?;
    fs::create_dir_all(work)?;
    fs::create_dir_all(target)?;
    let opts = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
    let m = MountRequest { source: "overlay", target, fstype: "overlay", flags: MsFlags::empty(), data: &opts };
    host.mount(&m).map_err(io::Error::from)
}

/// The image's layer idmapped for a user namespace (mounted on
/// `mount_point`), and `upper` made for it: owned by the namespace's root
/// (host id `base`), which then owns the rootfs's `/`. Returns the layer to
/// use as the overlay's lower. (An overlay itself cannot be idmapped; its
/// layers can, and the upper layer is the container's alone.)
pub(crate) fn idmapped_layers(
    lower: &Path,
    userns: std::os::fd::BorrowedFd<'_>,
    base: u32,
    mount_point: &Path,
    upper: &Path,
) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(mount_point)?;
    crate::runtime::userns::idmapped_bind(lower, userns, mount_point).map_err(io::Error::other)?;
    fs::create_dir_all(upper)?;
    nix::unistd::chown(upper, Some(base.into()), Some(base.into()))?;
    let mode = fs::metadata(lower)?.permissions().mode() & 0o7777;
    fs::set_permissions(upper, fs::Permissions::from_mode(mode))?;
    Ok(mount_point.to_path_buf())
}

/// Mounts `rootfs` (bind) on `target`, a folder in a root-owned 0711 parent
/// outside the data dir, so that a pod's root that is nobody on the host can
/// reach it without listing anything; returns `target`.
pub(crate) fn open_to_pod(host: &dyn Host, rootfs: &Path, target: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let parent = target.parent().ok_or_else(|| io::Error::other(format!("{}: no parent", target.display())))?;
    fs::create_dir_all(parent)?;
    // Search but not list; the folders above it searchable too.
    fs::set_permissions(parent, fs::Permissions::from_mode(0o711))?;
    for dir in parent.ancestors().skip(1).filter(|d| d.starts_with("/run/pinion")) {
        let mode = fs::metadata(dir)?.permissions().mode() & 0o7777;
        if mode & 0o011 != 0o011 {
            fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o011))?;
        }
    }
    match fs::DirBuilder::new().mode(0o700).create(target) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let source = rootfs.to_string_lossy();
    let m = MountRequest { source: &source, target, fstype: "", flags: MsFlags::MS_BIND | MsFlags::MS_REC, data: "" };
    host.mount(&m).map_err(io::Error::from)?;
    Ok(target.to_path_buf())
}

/// Undoes [`open_to_pod`]; nothing there is fine.
pub(crate) fn close_to_pod(host: &dyn Host, target: &Path) -> io::Result<()> {
    unmount_all(host, target)?;
    match fs::remove_dir(target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Mount points at or under `path` in this mount namespace, deepest first.
pub(crate) fn mounts_under(host: &dyn Host, path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = host.mount_points().into_iter().filter(|m| m.starts_with(path)).collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// Detaches every mount under `path` (the overlay of an image container).
pub(crate) fn unmount_all(host: &dyn Host, path: &Path) -> io::Result<()> {
    for m in mounts_under(host, path) {
        match host.unmount(&m) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(io::Error::other(format!("unmounting {}: {e}", m.display()))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_rootfs_has_mount_points_and_copied_symlinks() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("rootfs");
        let binds = prepare_host(&root)?;
        assert!(binds.contains(&PathBuf::from("/usr")));
        assert!(root.join("usr").is_dir() && root.join("tmp").is_dir());
        for d in ["/bin", "/lib"] {
            let inside = root.join(&d[1..]);
            if Path::new(d).is_symlink() {
                assert_eq!(fs::read_link(&inside)?, fs::read_link(d)?);
                assert!(!binds.contains(&PathBuf::from(d)));
            }
        }
        Ok(())
    }
}
