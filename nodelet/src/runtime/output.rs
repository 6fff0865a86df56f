//! A batch job's output files (`-o`/`-e`): opened on the node as the
//! container's user, so a person can make Pinion write only where they could
//! write themselves. The shim calls [`open_as`] before it creates the
//! container; it is single-threaded then, so switching the process's file
//! system identity (`setfsuid`, `setfsgid`, its groups) for one `open`
//! affects nothing else, and it switches back before going on.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::unistd::{Gid, Uid};

use super::users::ProcessUser;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("output file {path}: not an absolute path")]
    Relative { path: String },
    #[error("output file {path}: the directory {dir} does not exist on this node")]
    NoDirectory { path: String, dir: String },
    #[error("output file {path}: uid {uid} may not write there (permission denied)")]
    Denied { path: String, uid: u32 },
    #[error("output file {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("output file {path}: taking the user's identity: {source}")]
    Identity { path: String, source: nix::Error },
    #[error("output file {path}: not a regular file")]
    NotAFile { path: String },
    #[error("output files are not written for a pod in a user namespace of its own (hostUsers: false)")]
    UserNamespace,
}

/// Opens `path` for appending (created 0644 if missing) with `user`'s
/// permissions: its uid and gid for the file system and its groups. The
/// caller must be single-threaded (the shim): the groups are the process's.
pub fn open_as(path: &Path, user: &ProcessUser) -> Result<File, OutputError> {
    let shown = path.display().to_string();
    if !path.is_absolute() {
        return Err(OutputError::Relative { path: shown });
    }
    let saved_groups =
        nix::unistd::getgroups().map_err(|source| OutputError::Identity { path: shown.clone(), source })?;
    let switch = || -> Result<(), nix::Error> {
        let groups: Vec<Gid> = user.additional_gids.iter().map(|g| Gid::from_raw(*g)).collect();
        nix::unistd::setgroups(&groups)?;
        nix::unistd::setfsgid(Gid::from_raw(user.gid));
        nix::unistd::setfsuid(Uid::from_raw(user.uid));
        Ok(())
    };
    let switched = switch();
    let opened = switched.map(|()| {
        // Non-blocking: a FIFO with no reader must not hang the shim; what
        // is not a regular file is refused below.
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
    });
    // Back to root's identity whatever happened.
    nix::unistd::setfsuid(Uid::from_raw(0));
    nix::unistd::setfsgid(Gid::from_raw(0));
    let restored = nix::unistd::setgroups(&saved_groups);
    let opened = opened.map_err(|source| OutputError::Identity { path: shown.clone(), source })?;
    restored.map_err(|source| OutputError::Identity { path: shown.clone(), source })?;
    let file = opened.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => OutputError::NoDirectory {
            path: shown.clone(),
            dir: path.parent().map(|d| d.display().to_string()).unwrap_or_default(),
        },
        std::io::ErrorKind::PermissionDenied => OutputError::Denied { path: shown.clone(), uid: user.uid },
        _ => OutputError::Open { path: shown.clone(), source: e },
    })?;
    let meta = file.metadata().map_err(|source| OutputError::Open { path: shown.clone(), source })?;
    if !meta.is_file() {
        return Err(OutputError::NotAFile { path: shown });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what needs no identity switch: the switch itself is the shim's,
    /// single-threaded, and is tested with real containers
    /// (`cli/tests/up_real.rs`, `a_batch_script_writes_its_output_file_as_its_user`).
    #[test]
    fn a_relative_path_is_refused_before_anything_is_opened() {
        let e = open_as(Path::new("out.txt"), &ProcessUser::default()).expect_err("relative");
        assert_eq!(e.to_string(), "output file out.txt: not an absolute path");
    }
}
