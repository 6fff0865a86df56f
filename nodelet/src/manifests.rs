//! The static-pod source: a folder of pod manifests (`--manifests DIR`). A file
//! with one pod is keyed `static/<file stem>`; a file with several (YAML `---`
//! documents or a JSON list) keys each `static/<file stem>/<pod name>`. A new
//! file starts its pods, a changed file replaces them, a removed file stops
//! them. A malformed file is reported under `static/<file stem>` (file name and
//! field) and skipped; the pods it used to describe keep running.
//!
//! Changes are noticed with inotify on the folder (so a new manifest starts
//! within milliseconds, which the pod-start benchmark measures) and, as a safety
//! net for lost events (queue overflow, filesystems without inotify such as
//! NFS), by a full rescan every `rescan` interval. Either way the folder is
//! re-read whole and compared with the last scan by content hash, so a burst of
//! events is one scan and an editor's temp-file dance is seen as one change.
//! Files starting with `.` or ending in `~` are ignored (editor temporaries);
//! only `.yaml`, `.yml` and `.json` are read.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use specs::limits::MAX_STATIC_MANIFEST_BYTES;
use specs::Pod;
use tokio::sync::mpsc;

use crate::fsutil::fnv1a64;
use crate::source::{DesiredChange, SourceKind};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ManifestError {
    #[error("manifest folder {path}: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
}

/// One file as last seen.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    file: String,
    hash: u64,
    parsed: Result<Pod, String>,
}

/// Parses one manifest text into its pods; the error names the file and field.
pub fn parse_manifest(file: &str, text: &str) -> Result<Vec<Pod>, String> {
    let pods =
        specs::manifest::parse_pods(text).map_err(|e| format!("{file}: {}", e.to_string().replace('\n', "; ")))?;
    if pods.len() > 1 {
        let mut names: Vec<&str> = pods.iter().map(|p| p.metadata.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("{file}: two pods are named {:?}; names must be unique within a file", w[0]));
        }
    }
    Ok(pods)
}

fn is_manifest(name: &str) -> bool {
    !name.starts_with('.')
        && !name.ends_with('~')
        && [".yaml", ".yml", ".json"].iter().any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

/// Whether an inotify event may change the scan: one about a manifest file,
/// or one without a name (the folder itself, a queue overflow).
fn about_manifests(name: &Option<std::ffi::OsString>) -> bool {
    match name {
        None => true,
        Some(n) => n.to_str().is_some_and(is_manifest),
    }
}

/// Reads every manifest in `dir`: key -> what the file says.
fn scan(dir: &Path) -> Result<BTreeMap<String, Seen>, ManifestError> {
    let derr = |source| ManifestError::Dir { path: dir.to_path_buf(), source };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(derr)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| is_manifest(n))
        .collect();
    names.sort();
    let mut out: BTreeMap<String, Seen> = BTreeMap::new();
    let mut stems: BTreeMap<String, String> = BTreeMap::new();
    for name in names {
        let stem = Path::new(&name).file_stem().and_then(|s| s.to_str()).unwrap_or(&name).to_string();
        let key = format!("static/{stem}");
        let path = dir.join(&name);
        let (hash, parsed) = match read_limited(&path) {
            Ok(text) => (fnv1a64(text.as_bytes()), parse_manifest(&name, &text)),
            // Removed since the listing: gone, not malformed (a malformed file
            // would keep its pods). A dangling symlink is still there: reported.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && std::fs::symlink_metadata(&path).is_err() => continue,
            Err(e) => (0, Err(format!("{name}: {e}"))),
        };
        if let Some(first) = stems.get(&stem) {
            let message = format!("{name}: another manifest ({first}) has the same name stem {stem:?}");
            out.insert(key, Seen { file: name.clone(), hash, parsed: Err(message) });
            continue;
        }
        stems.insert(stem.clone(), name.clone());
        match parsed {
            Ok(pods) if pods.len() > 1 => {
                for pod in pods {
                    let key = format!("static/{stem}/{}", pod.metadata.name);
                    out.insert(key, Seen { file: name.clone(), hash, parsed: Ok(pod) });
                }
            }
            Ok(mut pods) => {
                let pod = pods.remove(0);
                out.insert(key, Seen { file: name, hash, parsed: Ok(pod) });
            }
            Err(message) => {
                out.insert(key, Seen { file: name, hash, parsed: Err(message) });
            }
        }
    }
    Ok(out)
}

/// A file that turned malformed keeps its pods: their last good entries stay in
/// the new scan (so no Remove is sent for them) beside the file's error.
fn keep_pods_of_broken_files(old: &BTreeMap<String, Seen>, new: &mut BTreeMap<String, Seen>) {
    let broken: Vec<String> = new.values().filter(|s| s.parsed.is_err()).map(|s| s.file.clone()).collect();
    for (key, seen) in old {
        if seen.parsed.is_ok() && broken.contains(&seen.file) && !new.contains_key(key) {
            new.insert(key.clone(), seen.clone());
        }
    }
}

fn read_limited(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    if meta.len() > MAX_STATIC_MANIFEST_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_STATIC_MANIFEST_BYTES} bytes"),
        ));
    }
    std::fs::read_to_string(path)
}

/// The changes that turn `old` into `new`.
fn diff(old: &BTreeMap<String, Seen>, new: &BTreeMap<String, Seen>) -> Vec<DesiredChange> {
    let mut out = Vec::new();
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        out.push(DesiredChange::Remove { key: key.clone() });
    }
    for (key, seen) in new {
        // Same file, same bytes, same verdict: nothing to say.
        if old.get(key) == Some(seen) {
            continue;
        }
        out.push(match &seen.parsed {
            Ok(pod) => DesiredChange::Apply { key: key.clone(), pod: Box::new(pod.clone()), plan: None },
            Err(message) => DesiredChange::Invalid { key: key.clone(), message: message.clone() },
        });
    }
    out
}

/// The first message for a folder: the malformed files, then the full set.
fn initial(seen: &BTreeMap<String, Seen>) -> Vec<DesiredChange> {
    let mut out = Vec::new();
    let mut pods = Vec::new();
    for (key, s) in seen {
        match &s.parsed {
            Ok(pod) => pods.push((key.clone(), pod.clone(), None)),
            Err(message) => out.push(DesiredChange::Invalid { key: key.clone(), message: message.clone() }),
        }
    }
    out.push(DesiredChange::Resync { source: SourceKind::Static, pods });
    out
}

/// The inotify instance, owned, with the raw fd tokio's reactor needs.
struct InotifyFd(nix::sys::inotify::Inotify);

impl std::os::fd::AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

/// inotify on the folder, as an async stream of "something changed".
struct Watch {
    fd: tokio::io::unix::AsyncFd<InotifyFd>,
}

impl Watch {
    fn new(dir: &Path) -> std::io::Result<Watch> {
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        ino.add_watch(
            dir,
            F::IN_CLOSE_WRITE | F::IN_MOVED_TO | F::IN_MOVED_FROM | F::IN_DELETE | F::IN_CREATE | F::IN_ATTRIB,
        )?;
        // SAFETY: the fd belongs to the `Inotify` moved into the `AsyncFd`; it is
        // closed only when the `AsyncFd` (which deregisters first) is dropped,
        // and nothing else closes or replaces it meanwhile.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(InotifyFd(ino)) }.map_err(|e| e.into_parts().1)?;
        Ok(Watch { fd })
    }

    /// Resolves once an event about a manifest arrived (all pending events are
    /// drained). Events only about ignored names (an editor's or a careful
    /// writer's `.name.tmp` before its rename) do not count: a scan for them
    /// would find nothing new and could still be running when the rename comes.
    async fn changed(&self) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else { return };
            let mut relevant = false;
            loop {
                match guard.get_inner().0.read_events() {
                    Ok(events) => relevant |= events.iter().any(|e| about_manifests(&e.name)),
                    Err(nix::errno::Errno::EAGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    Err(_) => return,
                }
            }
            if relevant {
                return;
            }
        }
    }
}

/// Watches `dir` and sends changes until `shutdown` resolves or the receiver is
/// gone. The folder must exist at start; if it disappears later the pods keep
/// running (an unmounted disk is not a request to stop everything) and a
/// warning is logged at every rescan.
pub(crate) async fn watch(
    dir: PathBuf,
    tx: mpsc::Sender<DesiredChange>,
    rescan: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ManifestError> {
    let mut seen = scan(&dir)?;
    for ch in initial(&seen) {
        if tx.send(ch).await.is_err() {
            return Ok(());
        }
    }
    let watch = match Watch::new(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no inotify; rescanning the manifest folder on a timer only");
            None
        }
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = async { match &watch { Some(w) => w.changed().await, None => std::future::pending().await } } => {}
            _ = tokio::time::sleep(rescan) => {}
        }
        let mut now = match scan(&dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the manifest folder; keeping the pods as they are");
                continue;
            }
        };
        keep_pods_of_broken_files(&seen, &mut now);
        for ch in diff(&seen, &now) {
            match &ch {
                DesiredChange::Invalid { key, message } => tracing::warn!(key, message, "malformed manifest skipped"),
                DesiredChange::Apply { key, .. } => tracing::debug!(target: "podstart", key, "manifest read"),
                _ => {}
            }
            if tx.send(ch).await.is_err() {
                return Ok(());
            }
        }
        seen = now;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n";

    fn kinds(chs: &[DesiredChange]) -> Vec<String> {
        chs.iter()
            .map(|c| match c {
                DesiredChange::Apply { key, .. } => format!("apply {key}"),
                DesiredChange::Remove { key } => format!("remove {key}"),
                DesiredChange::Invalid { key, message } => format!("invalid {key}: {message}"),
                DesiredChange::Resync { pods, .. } => {
                    format!("resync {}", pods.iter().map(|p| p.0.as_str()).collect::<Vec<_>>().join(","))
                }
            })
            .collect()
    }

    #[test]
    fn malformed_manifests_name_file_and_field() {
        let check = |text: &str, expected: &str| {
            let err = parse_manifest("bad.yaml", text).unwrap_err();
            assert!(err.starts_with("bad.yaml: "), "{err}");
            assert!(err.contains(expected), "{err} lacks {expected:?}");
        };
        check(&GOOD.replace("command", "comand"), "unknown field `comand`");
        check(&GOOD.replace("kind: Pod", "kind: Job"), "kind: must be");
        check(&GOOD.replace("pinion.io/v1", "v1"), "apiVersion: must be");
        check(&GOOD.replace("    rootfs: host\n", ""), "spec.containers[0].image: set exactly one of image or rootfs");
        check(&GOOD.replace("name: web", "name: ''"), "metadata.name: \"\" is not a DNS-1123 label");
        check(
            &GOOD.replace(
                "  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n",
                "  containers: []\n",
            ),
            "spec.containers",
        );
        check("{", "bad.yaml");
        assert!(parse_manifest("ok.yaml", GOOD).is_ok());
    }

    #[test]
    fn scan_and_diff_follow_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("web.yaml"), GOOD).unwrap();
        std::fs::write(d.join("broken.yml"), "apiVersion: [").unwrap();
        std::fs::write(d.join(".web.yaml.swp"), "junk").unwrap();
        std::fs::write(d.join("notes.txt"), "junk").unwrap();
        let first = scan(d).unwrap();
        let init = kinds(&initial(&first));
        assert_eq!(init.len(), 2, "{init:?}");
        assert!(init[0].starts_with("invalid static/broken: broken.yml: "), "{init:?}");
        assert_eq!(init[1], "resync static/web");

        // Unchanged folder: nothing to do.
        assert!(diff(&first, &scan(d).unwrap()).is_empty());

        // A new file, a changed one, a fixed one, a removed one.
        std::fs::write(d.join("db.json"), GOOD.replace("web", "db")).unwrap();
        std::fs::write(d.join("web.yaml"), GOOD.replace("inf", "'100'")).unwrap();
        std::fs::write(d.join("broken.yml"), GOOD.replace("web", "broken")).unwrap();
        let second = scan(d).unwrap();
        assert_eq!(kinds(&diff(&first, &second)), vec!["apply static/broken", "apply static/db", "apply static/web"]);
        std::fs::remove_file(d.join("db.json")).unwrap();
        std::fs::write(d.join("web.json"), GOOD).unwrap();
        let third = scan(d).unwrap();
        let got = kinds(&diff(&second, &third));
        assert_eq!(got[0], "remove static/db");
        assert!(got[1].starts_with("invalid static/web: web.yaml: another manifest (web.json)"), "{got:?}");
    }

    #[test]
    fn several_pods_in_one_file_and_a_broken_file_keeps_its_pods() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let two = format!("{GOOD}---\n{}", GOOD.replace("web", "db"));
        std::fs::write(d.join("many.yaml"), &two).unwrap();
        let first = scan(d).unwrap();
        assert_eq!(kinds(&initial(&first)), vec!["resync static/many/db,static/many/web"]);

        // Broken: reported under the file's key, its pods are not removed.
        std::fs::write(d.join("many.yaml"), "apiVersion: [").unwrap();
        let mut second = scan(d).unwrap();
        keep_pods_of_broken_files(&first, &mut second);
        let got = kinds(&diff(&first, &second));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("invalid static/many: many.yaml: "), "{got:?}");

        // Fixed, one pod changed: both re-applied (the agent skips the unchanged one).
        std::fs::write(d.join("many.yaml"), two.replace("inf", "'5'")).unwrap();
        let mut third = scan(d).unwrap();
        keep_pods_of_broken_files(&second, &mut third);
        assert_eq!(
            kinds(&diff(&second, &third)),
            vec!["remove static/many", "apply static/many/db", "apply static/many/web"]
        );

        let dup = format!("{GOOD}---\n{GOOD}");
        let err = parse_manifest("dup.yaml", &dup).unwrap_err();
        assert!(err.contains("two pods are named \"web\""), "{err}");
    }

    #[test]
    fn a_dangling_symlink_is_reported_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere.yaml"), dir.path().join("link.yaml")).unwrap();
        let got = kinds(&initial(&scan(dir.path()).unwrap()));
        assert!(got[0].starts_with("invalid static/link: link.yaml: No such file"), "{got:?}");
    }

    #[test]
    fn only_events_about_manifests_wake_the_scan() {
        let check = |name: Option<&str>, expected: bool| {
            assert_eq!(about_manifests(&name.map(std::ffi::OsString::from)), expected, "{name:?}");
        };
        check(Some("web.yaml"), true);
        check(Some("web.json"), true);
        check(Some(".web.tmp"), false);
        check(Some("web.yaml~"), false);
        check(Some("notes.txt"), false);
        check(None, true);
    }

    #[test]
    fn missing_folder_is_an_error_naming_it() {
        let err = scan(Path::new("/nonexistent/manifests")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/manifests"), "{err}");
    }

    async fn next(rx: &mut mpsc::Receiver<DesiredChange>) -> String {
        let ch = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
        kinds(&[ch]).remove(0)
    }

    #[tokio::test]
    async fn watch_sees_new_changed_and_removed_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // A long rescan interval: only inotify can make this test pass in time.
        let task = tokio::spawn(watch(dir.path().to_path_buf(), tx, Duration::from_secs(3600), async {
            let _ = stop_rx.await;
        }));
        assert_eq!(next(&mut rx).await, "resync static/a");
        std::fs::write(dir.path().join("b.yaml"), GOOD).unwrap();
        assert_eq!(next(&mut rx).await, "apply static/b");
        std::fs::write(dir.path().join("b.yaml"), GOOD.replace("inf", "'5'")).unwrap();
        assert_eq!(next(&mut rx).await, "apply static/b");
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        assert_eq!(next(&mut rx).await, "remove static/a");
        stop_tx.send(()).unwrap();
        task.await.unwrap().unwrap();
    }
}
