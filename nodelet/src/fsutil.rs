//! Crash-safe file writes shared by the checkpoint, the status file and the
//! hollow runtime's state: a reader sees the old content or the new one, never a
//! torn file, and an acknowledged write survives `kill -9` and (except for
//! [`replace_atomic`]) power loss.
//!
//! And private files: everything the node writes under its data dir may hold a
//! pod's spec (its env), a log or a key, so files are made 0600 and folders
//! 0700 at creation, by explicit modes rather than the process's umask (which
//! the containers would inherit).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub use pinion_wire::private::private_dir;
pub(crate) use pinion_wire::private::{PRIVATE_DIR, PRIVATE_FILE};

/// Opens `path` for writing, created 0600 (truncated: `append` false).
pub(crate) fn create_private(path: &Path, append: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).mode(PRIVATE_FILE);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    let f = o.open(path)?;
    // The mode only applies to a new file: one left by an older version keeps
    // its own unless told.
    tighten_file(&f)?;
    Ok(f)
}

fn tighten_file(f: &File) -> io::Result<()> {
    let mode = f.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        f.set_permissions(fs::Permissions::from_mode(mode & 0o7700))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory,
/// fsync, rename over `path`, fsync the directory (so the rename itself is durable).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, bytes, true)
}

/// [`write_atomic`] without the fsyncs: readers and a process restarted after
/// `kill -9` still see the old content or the new one, never a torn file; a
/// power loss may lose the write. For files rebuilt from memory at every
/// change and at start (the status report), where two fsyncs per change would
/// only slow the agent's loop down.
pub(crate) fn replace_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, bytes, false)
}

fn write_atomic_with(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = create_private(&tmp, false)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        drop(f);
        fs::rename(&tmp, path)?;
        if durable {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        // Never leave the temporary behind: the next write would reuse it anyway,
        // but a reader listing the directory should not see it.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes from `dir` the temporaries [`write_atomic`] leaves when the process
/// is killed between creating one and renaming it (`.NAME.tmp`, a regular
/// file): what they held was never acknowledged. Only for a folder no other
/// process writes, before this one writes to it. Returns how many went.
pub(crate) fn remove_temporaries(dir: &Path) -> io::Result<usize> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let is_temporary = name.to_str().is_some_and(|n| n.len() > 5 && n.starts_with('.') && n.ends_with(".tmp"));
        if is_temporary && entry.file_type()?.is_file() {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// fsync of a directory: a rename in it is durable once this returns.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// FNV-1a, 64 bits: a stable hash for spec fingerprints and id suffixes. Unlike
/// `DefaultHasher` its output is fixed forever, which a checkpoint needs.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_the_temporaries_a_killed_write_left_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_atomic(&d.join("kept.json"), b"{}").unwrap();
        // What a kill -9 between create and rename leaves, and look-alikes that stay.
        fs::write(d.join(".half.json.tmp"), b"{").unwrap();
        fs::write(d.join("plain.tmp"), b"").unwrap();
        fs::write(d.join(".tmp"), b"").unwrap();
        fs::create_dir(d.join(".folder.tmp")).unwrap();
        assert_eq!(remove_temporaries(d).unwrap(), 1);
        let mut left: Vec<String> =
            fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, [".folder.tmp", ".tmp", "kept.json", "plain.tmp"]);
        assert_eq!(remove_temporaries(&d.join("absent")).unwrap(), 0);
    }

    #[test]
    fn replaces_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn replace_atomic_replaces_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("status.json");
        replace_atomic(&p, b"one").unwrap();
        replace_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_atomic(&p, b"old").unwrap();
        // A directory where the temporary should go makes the write fail.
        fs::create_dir(dir.path().join(".state.json.tmp")).unwrap();
        assert!(write_atomic(&p, b"new").is_err());
        assert_eq!(fs::read(&p).unwrap(), b"old");
    }

    #[test]
    fn written_files_and_made_folders_are_private_even_over_loose_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        // A temporary and a folder left 0644/0755 by an older version.
        fs::write(dir.path().join(".checkpoint.json.tmp"), "x").unwrap();
        fs::set_permissions(dir.path().join(".checkpoint.json.tmp"), fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&p, b"{}").unwrap();
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        replace_atomic(&p, b"{}").unwrap();
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let logs = dir.path().join("logs/a/b");
        private_dir(&logs).unwrap();
        assert_eq!(fs::metadata(&logs).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(fs::metadata(dir.path().join("logs")).unwrap().permissions().mode() & 0o777, 0o700);
        fs::set_permissions(&logs, fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&logs).unwrap();
        assert_eq!(fs::metadata(&logs).unwrap().permissions().mode() & 0o777, 0o700);
        let log = logs.join("c.log");
        fs::write(&log, "old").unwrap();
        fs::set_permissions(&log, fs::Permissions::from_mode(0o644)).unwrap();
        drop(create_private(&log, true).unwrap());
        assert_eq!(fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read(&log).unwrap(), b"old", "append keeps the content");
    }

    #[test]
    fn fnv_is_the_published_function() {
        // Reference values of FNV-1a 64.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
    }
}
