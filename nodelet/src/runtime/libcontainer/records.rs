//! Files a container leaves under `<data>/containers/<id>/` so that any process
//! (a restarted agent included) can tell what happened to it, and the
//! `/proc` checks that tell a live container from a reused PID.

use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::super::RuntimeError;

/// Where everything lives under the data directory.
/// Where `hostUsers: false` containers' rootfs are mounted (see [`Layout::pod_root`]).
pub const POD_ROOTS: &str = "/run/pinion/rootfs";

#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Self {
        Self { root: root.to_path_buf() }
    }
    pub fn containers(&self) -> PathBuf {
        self.root.join("containers")
    }
    pub fn container(&self, id: &str) -> PathBuf {
        self.containers().join(id)
    }
    /// libcontainer's own state root (`<root>/<id>/state.json`).
    pub fn state_root(&self) -> PathBuf {
        self.root.join("libcontainer")
    }
    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.container(id).join("bundle")
    }
    pub fn rootfs(&self, id: &str) -> PathBuf {
        self.bundle(id).join("rootfs")
    }
    /// Where a `hostUsers: false` container's rootfs is also mounted, out of
    /// the private data dir (whose folders its root may not walk).
    pub fn pod_root(&self, id: &str) -> PathBuf {
        Path::new(POD_ROOTS).join(id)
    }
    pub fn config(&self, id: &str) -> PathBuf {
        self.container(id).join("container.json")
    }
    pub fn shim(&self, id: &str) -> PathBuf {
        self.container(id).join("shim.json")
    }
    pub fn started(&self, id: &str) -> PathBuf {
        self.container(id).join("started.json")
    }
    pub fn exit(&self, id: &str) -> PathBuf {
        self.container(id).join("exit.json")
    }
    pub fn shim_log(&self, id: &str) -> PathBuf {
        self.container(id).join("shim.log")
    }
    /// The exec helpers' own diagnostics (errors only), appended.
    pub fn exec_log(&self, id: &str) -> PathBuf {
        self.container(id).join("exec.log")
    }
    /// Held by an exec helper while it joins the container (see `exec`).
    pub fn exec_lock(&self, id: &str) -> PathBuf {
        self.container(id).join("exec.lock")
    }
    /// One folder for every container's exit notice, so that one inotify watch
    /// sees every exit (`exit.json` lives in each container's own folder).
    pub fn exits(&self) -> PathBuf {
        self.root.join("exits")
    }
    /// A copy of `exit.json`, written (atomically, by rename) after it.
    pub fn exit_notice(&self, id: &str) -> PathBuf {
        self.exits().join(format!("{id}.json"))
    }
}

/// A process identified by PID and kernel start time (PIDs are reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcId {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcId {
    pub fn of(pid: i32) -> Option<Self> {
        proc_stat(pid).map(|(_, start_time)| Self { pid, start_time })
    }
    /// Still running (not a zombie) and the same process.
    pub fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Some((state, start)) if start == self.start_time && state != 'Z' && state != 'X')
    }
}

/// (state, starttime) from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 22 of the whole line is the 20th after the name (state is the 3rd).
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// Written by the shim once the container runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartedRecord {
    pub init: ProcId,
    pub shim: ProcId,
}

/// Written by the shim when the container's init has exited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExitRecord {
    /// The exit code, or 128 + signal when killed by a signal.
    pub code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    /// Read from the container's cgroup as it ended (absent from a shim
    /// before accounting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<specs::status::ContainerUsage>,
}

/// Exit code reported when nobody saw the container exit (its shim died first).
pub(crate) const UNKNOWN_EXIT_CODE: i32 = 255;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io { path: path.to_path_buf(), source }
}

/// Temp file (0600), rename: a reader (or a process restarted after `kill -9`)
/// sees the old content or the new, never half (`fsutil`'s atomic writes).
/// `durable` adds fsync of the file and the directory, for what must also
/// survive a power loss; records about processes need not (the processes do
/// not survive a reboot either), and the fsyncs cost milliseconds on every
/// container start.
fn write_atomic_with(path: &Path, bytes: &[u8], durable: bool) -> Result<(), RuntimeError> {
    let written =
        if durable { crate::fsutil::write_atomic(path, bytes) } else { crate::fsutil::replace_atomic(path, bytes) };
    written.map_err(io_err(path))
}

/// A process record: atomic, not fsynced (see [`write_atomic_with`]).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    write_atomic_with(path, bytes, false)
}

/// Durable JSON (e.g. the image index): atomic and fsynced.
pub(crate) fn write_json_durable<T: Serialize>(path: &Path, value: &T) -> Result<(), RuntimeError> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| RuntimeError::Io { path: path.to_path_buf(), source: std::io::Error::other(e) })?;
    write_atomic_with(path, &bytes, true)
}

pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), RuntimeError> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| RuntimeError::Io { path: path.to_path_buf(), source: std::io::Error::other(e) })?;
    write_atomic(path, &bytes)
}

/// `Ok(None)` when the file does not exist; a corrupt file is an error naming it.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, RuntimeError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| RuntimeError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RuntimeError::Io { path: path.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = ProcId::of(std::process::id() as i32);
        assert!(me.is_some_and(|p| p.alive()));
        let other = me.map(|p| ProcId { pid: p.pid, start_time: p.start_time + 1 });
        assert!(other.is_some_and(|p| !p.alive()));
    }

    #[test]
    fn json_records_round_trip_and_corruption_names_the_file() -> Result<(), RuntimeError> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("tmp")))?;
        let path = dir.path().join("exit.json");
        assert_eq!(read_json::<ExitRecord>(&path)?, None);
        let rec = ExitRecord { code: 137, signal: Some(9), oom_killed: true, usage: None };
        write_json(&path, &rec)?;
        assert_eq!(read_json::<ExitRecord>(&path)?, Some(rec));
        std::fs::write(&path, b"{not json").map_err(io_err(&path))?;
        let err = read_json::<ExitRecord>(&path).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("exit.json"), "{err}");
        Ok(())
    }
}
