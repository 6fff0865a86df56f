//! Files only this machine's Pinion may read: the server's and the node's
//! data dirs hold pod specs (their env), logs and keys. Folders 0700, files
//! 0600, by explicit modes rather than the process's umask (which a node's
//! containers would inherit), and a tree an older version left open is
//! tightened. Here because both `orchestrator` and `nodelet` keep data dirs.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// The mode of every file Pinion writes under a data dir.
pub const PRIVATE_FILE: u32 = 0o600;
/// The mode of every folder Pinion makes under (and of) a data dir.
pub const PRIVATE_DIR: u32 = 0o700;

/// Creates `dir` and its missing parents 0700; an existing `dir` that lets its
/// group or others in is tightened to 0700 (a data dir an older version made
/// 0755).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(PRIVATE_DIR).create(dir)?;
    tighten(dir).map(drop)
}

/// Takes every group and other permission away from `path` (a file or a
/// folder; a symlink is left alone, its target may not be ours). Whether it
/// changed anything.
pub fn tighten(path: &Path) -> io::Result<bool> {
    let meta = fs::symlink_metadata(path)?;
    let mode = meta.permissions().mode();
    if meta.file_type().is_symlink() || mode & 0o077 == 0 {
        return Ok(false);
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7700))?;
    Ok(true)
}

/// [`tighten`]s everything under `root` but the folders `keep` names (by
/// their path relative to `root`), which are left as they are with all they
/// hold; symlinks are not followed. What vanishes meanwhile is skipped. How
/// many entries it changed.
pub fn tighten_tree(root: &Path, keep: impl Fn(&Path) -> bool) -> io::Result<usize> {
    let mut tightened = 0;
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_symlink() || (kind.is_dir() && keep(path.strip_prefix(root).unwrap_or(&path))) {
                continue;
            }
            match tighten(&path) {
                Ok(changed) => tightened += usize::from(changed),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            if kind.is_dir() {
                todo.push(path);
            }
        }
    }
    Ok(tightened)
}
