//! Root filesystems of containers: the private directory of a `rootfs: host`
//! container (mount points for the host's read-only system directories, the
//! host's own symlinks such as `/bin -> usr/bin` copied as symlinks), and the
//! overlay (image as lower layer, a per-container upper layer) of an image
//! container, mounted before create and unmounted on remove.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::spec::HOST_DIRS;

/// Prepares `rootfs` for a host-rootfs container; returns the host directories
/// to bind-mount read-only over their mount points.
pub fn prepare_host(rootfs: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(rootfs)?;
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
pub fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> io::Result<()> {
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
    mount(Some("overlay"), target, Some("overlay"), MsFlags::empty(), Some(opts.as_str())).map_err(io::Error::from)
}

/// Mount points at or under `path` in this mount namespace, deepest first.
pub fn mounts_under(path: &Path) -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
        .filter(|m| m.starts_with(path))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches every mount under `path` (the overlay of an image container).
pub fn unmount_all(path: &Path) -> io::Result<()> {
    for m in mounts_under(path) {
        match umount2(&m, MntFlags::MNT_DETACH) {
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
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b\134c"), "/a b\\c");
        assert_eq!(unescape("/plain"), "/plain");
    }

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
