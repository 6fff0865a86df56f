//! Local images: `pinion image import` of an OCI image layout (a directory or a
//! tar archive of one) into `<data>/images/`, and lookup by `NAME:TAG`.
//!
//! Layers (tar, tar+gzip) are unpacked without trusting them: an entry whose path
//! climbs out with `..`, or that passes through a symlink pointing outside the
//! rootfs, is refused; symlinks met on the way are resolved inside the rootfs;
//! whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) remove what lower
//! layers put there; device nodes and FIFOs are skipped. Blob digests are
//! verified (sha256). No registry is ever contacted.
//!
//! An import is bounded ([`ImportLimits`]: layers, bytes written, files
//! written), each checked from the tar headers before the bytes they
//! announce are read, so a small archive that would unpack to gigabytes is
//! refused at once. Its work folder (`images/.import-PID-N`) is removed when
//! it fails; one a `kill -9` left is removed by the next import or the next
//! start of the runtime ([`remove_leftovers`]).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::records::{read_json, write_json, write_json_durable};
use crate::runtime::RuntimeError;

/// What an imported image is and the defaults it gives a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// `NAME:TAG`.
    pub reference: String,
    /// The manifest's digest (`sha256:...`).
    pub digest: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub(crate) env: Vec<String>,
    pub(crate) working_dir: String,
    pub layers: usize,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RefIndex {
    /// `NAME:TAG` -> manifest digest hex (the directory under `images/`).
    refs: BTreeMap<String, String>,
}

/// The bounds of one import. The defaults hold the biggest images sites run
/// (CUDA development images unpack to about 10 GiB and 150,000 files; the
/// overlay driver of Docker stops at 128 layers) and stop an archive made to
/// fill the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// Layers in the image's manifest (`--max-layers`).
    pub max_layers: usize,
    /// Bytes written: the layout archive's files and every layer's files,
    /// as their tar headers declare them (`--max-bytes`).
    pub max_bytes: u64,
    /// Files, folders and links written, the same way (`--max-files`).
    pub max_files: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        ImportLimits { max_layers: 128, max_bytes: 32 << 30, max_files: 1_000_000 }
    }
}

/// What an import has written so far, against its limits.
#[derive(Clone, Copy)]
struct Budget {
    limits: ImportLimits,
    bytes: u64,
    files: u64,
}

impl Budget {
    fn new(limits: ImportLimits) -> Self {
        Budget { limits, bytes: 0, files: 0 }
    }

    /// One more entry of `size` bytes; refused, naming the bound, past either.
    fn take(&mut self, size: u64) -> Result<(), String> {
        self.files += 1;
        self.bytes = self.bytes.saturating_add(size);
        if self.files > self.limits.max_files {
            return Err(format!(
                "the image holds more than {} files (the import's bound, --max-files)",
                self.limits.max_files
            ));
        }
        if self.bytes > self.limits.max_bytes {
            return Err(format!(
                "the image unpacks to more than {} bytes (the import's bound, --max-bytes)",
                self.limits.max_bytes
            ));
        }
        Ok(())
    }
}

fn err(reference: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Image { reference: reference.to_string(), message: message.into() }
}

/// `name` or `name:tag` -> `name:tag` (default tag `latest`), checked.
pub(crate) fn normalize_reference(reference: &str) -> Result<String, RuntimeError> {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    let full = if last.contains(':') { reference.to_string() } else { format!("{reference}:latest") };
    let ok = !reference.is_empty()
        && full.len() <= 255
        && full.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c))
        && !full.starts_with(['/', ':', '.', '-']);
    if ok {
        Ok(full)
    } else {
        Err(err(reference, "not a valid NAME:TAG (letters, digits, `._-/`, one `:` before the tag)"))
    }
}

fn index_path(images: &Path) -> PathBuf {
    images.join("refs.json")
}

/// Every imported image, sorted by reference.
pub fn list(images: &Path) -> Result<Vec<ImageRecord>, RuntimeError> {
    let index: RefIndex = read_json(&index_path(images))?.unwrap_or_default();
    let mut out = Vec::new();
    for hex in index.refs.values() {
        if let Some(mut rec) = read_json::<ImageRecord>(&images.join(hex).join("image.json"))? {
            // One content may carry several names: report each under its own.
            for (r, h) in &index.refs {
                if h == hex && !out.iter().any(|o: &ImageRecord| &o.reference == r) {
                    rec.reference = r.clone();
                    out.push(rec.clone());
                }
            }
        }
    }
    out.sort_by(|a, b| a.reference.cmp(&b.reference));
    Ok(out)
}

/// The images (their folder names under `images/`) that a container on this
/// node was made from: a container record naming an image by a name the
/// index still holds. Such files are never removed.
pub fn in_use(layout: &super::records::Layout) -> Result<std::collections::BTreeSet<String>, RuntimeError> {
    let index: RefIndex = read_json(&index_path(&layout.images()))?.unwrap_or_default();
    let mut used = std::collections::BTreeSet::new();
    let dir = layout.containers();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(used),
        Err(source) => return Err(RuntimeError::Io { path: dir, source }),
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else { continue };
        // A record that does not read is skipped: its container cannot start.
        let Ok(Some(cfg)) = read_json::<crate::runtime::ContainerConfig>(&layout.config(&id)) else { continue };
        if let crate::runtime::RootfsConfig::Image(r) = &cfg.rootfs {
            if let Some(hex) = normalize_reference(r).ok().and_then(|full| index.refs.get(&full)) {
                used.insert(hex.clone());
            }
        }
    }
    Ok(used)
}

/// What [`remove`] took away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The name and the files (no other name, no container).
    Files,
    /// The name; another name still holds the files.
    NameOnly,
    /// The name; a container uses the files, which stay.
    InUse,
}

/// Removes the name `reference`, and the files when nothing else holds them.
pub fn remove(
    images: &Path,
    reference: &str,
    in_use: &std::collections::BTreeSet<String>,
) -> Result<Removed, RuntimeError> {
    let full = normalize_reference(reference)?;
    let _lock = lock(images).map_err(|source| RuntimeError::Io { path: images.to_path_buf(), source })?;
    let mut idx: RefIndex = read_json(&index_path(images))?.unwrap_or_default();
    let hex = idx.refs.remove(&full).ok_or_else(|| err(&full, "no such image on this node"))?;
    // The index first: a crash between the two leaves files no name points
    // at, which the next collection removes; never a name without files.
    write_json_durable(&index_path(images), &idx)?;
    if idx.refs.values().any(|h| *h == hex) {
        return Ok(Removed::NameOnly);
    }
    if in_use.contains(&hex) {
        return Ok(Removed::InUse);
    }
    let dir = images.join(&hex);
    match fs::remove_dir_all(&dir) {
        Ok(()) => Ok(Removed::Files),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Removed::Files),
        Err(source) => Err(RuntimeError::Io { path: dir, source }),
    }
}

/// When the image store's filesystem is fuller than `high` percent,
/// removes images no container uses (and files no name points at), the
/// least recently pulled first, until it is below `low` percent (the
/// kubelet's image GC thresholds). Returns the names (or folders) removed.
pub fn collect_garbage(
    images: &Path,
    in_use: &std::collections::BTreeSet<String>,
    high: u8,
    low: u8,
) -> Result<Vec<String>, RuntimeError> {
    let io_err = |source| RuntimeError::Io { path: images.to_path_buf(), source };
    let used_percent = || -> Result<u8, RuntimeError> {
        let st = nix::sys::statvfs::statvfs(images).map_err(|e| io_err(io::Error::from(e)))?;
        let total = st.blocks() as u128;
        let free = st.blocks_available() as u128;
        Ok((free * 100).checked_div(total).map_or(0, |f| (100 - f.min(100)) as u8))
    };
    if !images.is_dir() || used_percent()? <= high {
        return Ok(Vec::new());
    }
    let _lock = lock(images).map_err(io_err)?;
    let mut idx: RefIndex = read_json(&index_path(images))?.unwrap_or_default();
    // Every image folder, oldest first (a pull or import makes it anew).
    let mut folders: Vec<(std::time::SystemTime, String)> = fs::read_dir(images)
        .map_err(io_err)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let is_image = name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
            let made = e.metadata().ok()?.modified().ok()?;
            is_image.then_some((made, name))
        })
        .collect();
    folders.sort();
    let mut removed = Vec::new();
    for (_, hex) in folders {
        if in_use.contains(&hex) {
            continue;
        }
        if !removed.is_empty() && used_percent()? < low {
            break;
        }
        let names: Vec<String> = idx.refs.iter().filter(|(_, h)| **h == hex).map(|(r, _)| r.clone()).collect();
        idx.refs.retain(|_, h| *h != hex);
        write_json_durable(&index_path(images), &idx)?;
        let dir = images.join(&hex);
        fs::remove_dir_all(&dir).map_err(|source| RuntimeError::Io { path: dir, source })?;
        tracing::info!(image = names.join(", "), folder = hex, "image removed to free disk space");
        removed.extend(if names.is_empty() { vec![hex] } else { names });
    }
    Ok(removed)
}

/// The image's record and its unpacked rootfs (read-only lower layer).
pub(crate) fn resolve(images: &Path, reference: &str) -> Result<(ImageRecord, PathBuf), RuntimeError> {
    let full = normalize_reference(reference)?;
    let index: RefIndex = read_json(&index_path(images))?.unwrap_or_default();
    let hex = index
        .refs
        .get(&full)
        .ok_or_else(|| err(&full, "not imported (use `pinion image import FILE --name NAME:TAG`)"))?;
    let dir = images.join(hex);
    let rec: ImageRecord =
        read_json(&dir.join("image.json"))?.ok_or_else(|| err(&full, format!("{} is missing", dir.display())))?;
    Ok((rec, dir.join("rootfs")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
struct ImageConfig {
    #[serde(default)]
    config: Option<ImageRunConfig>,
}

#[derive(Deserialize, Default)]
struct ImageRunConfig {
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const MT_INDEX: &str = "application/vnd.oci.image.index.v1+json";

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A work folder in `images/` (`.import-PID-N`), removed when dropped; one a
/// `kill -9` left is removed with the other leftovers, by its prefix. Imports
/// and registry pulls (which write their layout here) share it.
pub(crate) struct WorkDir(pub(crate) PathBuf);

impl WorkDir {
    pub(crate) fn new(images: &Path) -> Result<WorkDir, RuntimeError> {
        let path = images.join(format!("{WORK_PREFIX}{}-{}", std::process::id(), unique()));
        fs::create_dir_all(&path).map_err(|source| RuntimeError::Io { path: path.clone(), source })?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The prefix of an import's work folder in `images/`: `.import-PID-N`.
pub(crate) const WORK_PREFIX: &str = ".import-";
/// The prefix of an image being published (under the images' `.lock`).
const READY_PREFIX: &str = ".ready-";
const LOCK: &str = ".lock";

/// Imports `source` (an OCI layout directory or a tar of one) as `name`
/// (default: the layout's `org.opencontainers.image.ref.name`), within the
/// default [`ImportLimits`].
pub fn import(images: &Path, source: &Path, name: Option<&str>) -> Result<ImageRecord, RuntimeError> {
    import_with(images, source, name, ImportLimits::default())
}

/// Removes what interrupted imports left in `images`: work folders whose
/// process is gone and half-published images. Returns what it removed.
pub(crate) fn remove_leftovers(images: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(images) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    // A `.ready-` folder exists only while its importer holds the lock.
    let _lock = lock(images)?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale = if let Some(rest) = name.strip_prefix(WORK_PREFIX) {
            let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
            // A live importer (the CLI beside the agent) keeps its folder.
            !pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
        } else {
            name.starts_with(READY_PREFIX)
        };
        if stale {
            let path = entry.path();
            match fs::remove_dir_all(&path) {
                Ok(()) => removed.push(path),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
            }
        }
    }
    Ok(removed)
}

/// The images' publishing lock (released by the kernel on `kill -9`).
fn lock(images: &Path) -> io::Result<nix::fcntl::Flock<File>> {
    let path = images.join(LOCK);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::fsutil::PRIVATE_FILE)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io::Error::new(io::Error::from(e).kind(), format!("locking {}: {e}", path.display())))
}

/// [`import`] within `limits`. A refused import leaves nothing behind.
pub fn import_with(
    images: &Path,
    source: &Path,
    name: Option<&str>,
    limits: ImportLimits,
) -> Result<ImageRecord, RuntimeError> {
    let label = name.map(str::to_string).unwrap_or_else(|| source.display().to_string());
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source: io::Error| RuntimeError::Io { path: p, source }
    };
    // Image files keep their modes (setuid ones too): the folder above them
    // must be root's alone.
    crate::fsutil::private_dir(images).map_err(io(images))?;
    for dir in remove_leftovers(images).map_err(io(images))? {
        tracing::warn!(dir = %dir.display(), "removed what an interrupted image import left");
    }
    let work = WorkDir::new(images)?;
    let meta = fs::metadata(source).map_err(io(source))?;
    let mut written = Budget::new(limits);
    let layout = if meta.is_dir() {
        source.to_path_buf()
    } else {
        let dir = work.0.join("layout");
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let file = File::open(source).map_err(io(source))?;
        unpack_tar(open_maybe_gzip(file).map_err(io(source))?, &dir, false, &mut written)
            .map_err(|m| err(&label, format!("{}: {m}", source.display())))?;
        dir
    };
    if !layout.join("index.json").is_file() {
        return Err(err(&label, format!("{}: not an OCI image layout (no index.json)", source.display())));
    }
    let index: Index = read_blob_json(&layout.join("index.json"), &label)?;
    let (desc, reference) = pick_manifest(&layout, index, name, &label)?;
    let reference = normalize_reference(&reference)?;
    let manifest_path = blob_path(&layout, &desc.digest, &reference)?;
    verify_digest(&manifest_path, &desc.digest, &reference)?;
    let manifest: Manifest = read_blob_json(&manifest_path, &reference)?;
    let config_path = blob_path(&layout, &manifest.config.digest, &reference)?;
    verify_digest(&config_path, &manifest.config.digest, &reference)?;
    let config: ImageConfig = read_blob_json(&config_path, &reference)?;
    let run = config.config.unwrap_or_default();
    if manifest.layers.len() > limits.max_layers {
        return Err(err(
            &reference,
            format!(
                "{} layers, more than the import's bound of {} (--max-layers)",
                manifest.layers.len(),
                limits.max_layers
            ),
        ));
    }

    let rootfs = work.0.join("rootfs");
    fs::create_dir_all(&rootfs).map_err(io(&rootfs))?;
    fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755)).map_err(io(&rootfs))?;
    for (i, layer) in manifest.layers.iter().enumerate() {
        let path = blob_path(&layout, &layer.digest, &reference)?;
        verify_digest(&path, &layer.digest, &reference)?;
        apply_layer(&path, &rootfs, &mut written)
            .map_err(|m| err(&reference, format!("layer {i} ({}): {m}", layer.digest)))?;
    }
    let hex = digest_hex(&desc.digest, &reference)?.to_string();
    let record = ImageRecord {
        reference: reference.clone(),
        digest: desc.digest.clone(),
        entrypoint: run.entrypoint.unwrap_or_default(),
        cmd: run.cmd.unwrap_or_default(),
        env: run.env.unwrap_or_default(),
        working_dir: run.working_dir.unwrap_or_default(),
        layers: manifest.layers.len(),
    };
    write_json(&work.0.join("image.json"), &record)?;
    // Publishing (the image directory and the name index) is one writer at a
    // time: two imports racing would lose an index entry or trip on the rename.
    // Unpacking above runs in parallel. The kernel drops the lock on kill -9.
    let _lock = lock(images).map_err(io(images))?;
    let dest = images.join(&hex);
    if !dest.exists() {
        // Keep only what the image needs; the tar's layout copy goes with `work`.
        let keep = images.join(format!("{READY_PREFIX}{hex}-{}", unique()));
        fs::create_dir_all(&keep).map_err(io(&keep))?;
        fs::rename(&rootfs, keep.join("rootfs")).map_err(io(&rootfs))?;
        fs::rename(work.0.join("image.json"), keep.join("image.json")).map_err(io(&keep))?;
        fs::rename(&keep, &dest).map_err(io(&dest))?;
    }
    let mut idx: RefIndex = read_json(&index_path(images))?.unwrap_or_default();
    idx.refs.insert(reference, hex);
    write_json_durable(&index_path(images), &idx)?;
    Ok(record)
}

fn unique() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn pick_manifest(
    layout: &Path,
    index: Index,
    name: Option<&str>,
    label: &str,
) -> Result<(Descriptor, String), RuntimeError> {
    let mut manifests = index.manifests;
    // A nested index (multi-platform): take this machine's platform.
    if manifests.len() == 1 && manifests[0].media_type == MT_INDEX {
        let outer = manifests.remove(0);
        let inner: Index = read_blob_json(&blob_path(layout, &outer.digest, label)?, label)?;
        let ref_name = outer.annotations.get(REF_NAME).cloned();
        manifests = inner
            .manifests
            .into_iter()
            .filter(|m| m.platform.as_ref().is_none_or(|p| p.os == "linux" && p.architecture == go_arch()))
            .map(|mut m| {
                if let Some(r) = &ref_name {
                    m.annotations.entry(REF_NAME.to_string()).or_insert_with(|| r.clone());
                }
                m
            })
            .collect();
    }
    let chosen = match (manifests.len(), name) {
        (0, _) => return Err(err(label, "index.json lists no manifest for this platform")),
        (1, _) => manifests.remove(0),
        (_, Some(n)) => {
            let tag = n.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
            let pos = manifests
                .iter()
                .position(|m| m.annotations.get(REF_NAME).is_some_and(|r| r == n || r == tag))
                .ok_or_else(|| err(label, "index.json has several manifests and none is annotated with this name"))?;
            manifests.remove(pos)
        }
        (_, None) => return Err(err(label, "index.json has several manifests: pass --name NAME:TAG to pick one")),
    };
    let reference = match (name, chosen.annotations.get(REF_NAME)) {
        (Some(n), _) => n.to_string(),
        (None, Some(r)) if r.contains(':') => r.clone(),
        _ => return Err(err(label, "the layout names no image (no ref.name annotation): pass --name NAME:TAG")),
    };
    Ok((chosen, reference))
}

fn read_blob_json<T: for<'de> Deserialize<'de>>(path: &Path, reference: &str) -> Result<T, RuntimeError> {
    let bytes = fs::read(path).map_err(|source| RuntimeError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&bytes).map_err(|e| err(reference, format!("{}: {e}", path.display())))
}

fn digest_hex<'a>(digest: &'a str, reference: &str) -> Result<&'a str, RuntimeError> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) => Ok(hex),
        _ => Err(err(reference, format!("digest {digest:?}: only well-formed sha256 digests are accepted"))),
    }
}

fn blob_path(layout: &Path, digest: &str, reference: &str) -> Result<PathBuf, RuntimeError> {
    let hex = digest_hex(digest, reference)?;
    let path = layout.join("blobs").join("sha256").join(hex);
    if !path.is_file() {
        return Err(err(reference, format!("blob {digest} is missing from the layout ({})", path.display())));
    }
    Ok(path)
}

fn verify_digest(path: &Path, digest: &str, reference: &str) -> Result<(), RuntimeError> {
    let io = |source| RuntimeError::Io { path: path.to_path_buf(), source };
    let mut f = File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if Some(got.as_str()) != digest.strip_prefix("sha256:") {
        return Err(err(reference, format!("blob {digest} is corrupt: its content hashes to sha256:{got}")));
    }
    Ok(())
}

/// The file as a plain stream: gzip and zstd are told by their magic bytes
/// (a layer's media type may say either, or neither for Docker's).
fn open_maybe_gzip(mut file: File) -> io::Result<Box<dyn Read>> {
    use std::io::{Seek, SeekFrom};
    const ZSTD: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic)?;
    file.seek(SeekFrom::Start(0))?;
    if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        Ok(Box::new(flate2::read::GzDecoder::new(file)))
    } else if n == 4 && magic == ZSTD {
        let d = ruzstd::decoding::StreamingDecoder::new(io::BufReader::new(file))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}")))?;
        Ok(Box::new(d))
    } else {
        Ok(Box::new(file))
    }
}

/// Applies one layer: whiteouts first (they only hide what lower layers put
/// there), then the content. The first pass also weighs the layer from its
/// headers, so nothing of a layer past the bounds is written; the second
/// counts what it writes again (the blob is read twice).
fn apply_layer(blob: &Path, root: &Path, written: &mut Budget) -> Result<(), String> {
    let open = || -> Result<Box<dyn Read>, String> {
        File::open(blob).and_then(open_maybe_gzip).map_err(|e| format!("{}: {e}", blob.display()))
    };
    let mut declared = *written;
    let mut archive = tar::Archive::new(open()?);
    for entry in archive.entries().map_err(|e| format!("not a tar archive: {e}"))? {
        let entry = entry.map_err(|e| format!("reading the archive: {e}"))?;
        declared.take(entry.header().entry_size().map_err(|e| format!("entry size: {e}"))?)?;
        let rel = clean_path(&entry.path().map_err(|e| format!("entry name: {e}"))?)?;
        let Some(file_name) = rel.file_name().and_then(|n| n.to_str()) else { continue };
        let parent = rel.parent().unwrap_or(Path::new(""));
        if file_name == ".wh..wh..opq" {
            let dir = resolve_in_root(root, parent, &rel)?;
            if dir.is_dir() {
                for child in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
                    remove_any(&child.path())?;
                }
            }
        } else if let Some(hidden) = file_name.strip_prefix(".wh.") {
            let dir = resolve_in_root(root, parent, &rel)?;
            remove_any(&dir.join(hidden))?;
        }
    }
    unpack_tar(open()?, root, true, written)
}

fn remove_any(path: &Path) -> Result<(), String> {
    let res = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    res.map_err(|e| format!("removing {}: {e}", path.display()))
}

/// The entry's path as plain components; `..` anywhere is refused.
fn clean_path(path: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!("entry {} escapes the rootfs (`..`)", path.display()))
            }
        }
    }
    Ok(out)
}

/// Resolves directory `rel` inside `root`, following symlinks as the container
/// would see them (absolute targets relative to `root`); a symlink that climbs
/// above `root` is refused, naming `entry`.
fn resolve_in_root(root: &Path, rel: &Path, entry: &Path) -> Result<PathBuf, String> {
    let mut stack: Vec<std::ffi::OsString> = Vec::new();
    let mut todo: Vec<std::ffi::OsString> = rel
        .components()
        .rev()
        .filter_map(|c| if let Component::Normal(p) = c { Some(p.to_owned()) } else { None })
        .collect();
    let mut hops = 0;
    while let Some(part) = todo.pop() {
        let mut cur = root.to_path_buf();
        cur.extend(&stack);
        let next = cur.join(&part);
        match fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(format!("entry {}: too many symlinks", entry.display()));
                }
                let target = fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
                if target.is_absolute() {
                    stack.clear();
                }
                let mut pending = Vec::new();
                for c in target.components() {
                    match c {
                        Component::Normal(p) => pending.push(Some(p.to_owned())),
                        Component::ParentDir => pending.push(None),
                        _ => {}
                    }
                }
                // Apply `..` of the target right away so an escape is caught here.
                let mut rest = Vec::new();
                for p in pending {
                    match p {
                        None if rest.is_empty() => {
                            if stack.pop().is_none() {
                                return Err(format!(
                                    "entry {}: symlink {} points outside the rootfs",
                                    entry.display(),
                                    next.strip_prefix(root).unwrap_or(&next).display()
                                ));
                            }
                        }
                        None => {
                            rest.pop();
                        }
                        Some(p) => rest.push(p),
                    }
                }
                todo.extend(rest.into_iter().rev());
            }
            _ => stack.push(part),
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&stack);
    Ok(out)
}

/// Unpacks a tar into `root` safely. `layer`: a container layer (symlinks,
/// hard links and ownership kept, devices skipped); otherwise an image layout
/// archive (only files and directories). Each entry is weighed in `written`
/// from its header, before its bytes are read.
fn unpack_tar(reader: Box<dyn Read>, root: &Path, layer: bool, written: &mut Budget) -> Result<(), String> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(|e| format!("not a tar archive: {e}"))? {
        let mut entry = entry.map_err(|e| format!("reading the archive: {e}"))?;
        written.take(entry.header().entry_size().map_err(|e| format!("entry size: {e}"))?)?;
        let raw = entry.path().map_err(|e| format!("entry name: {e}"))?.into_owned();
        let rel = clean_path(&raw)?;
        let Some(file_name) = rel.file_name().map(|n| n.to_owned()) else { continue };
        if layer && file_name.to_string_lossy().starts_with(".wh.") {
            continue;
        }
        let parent = resolve_in_root(root, rel.parent().unwrap_or(Path::new("")), &raw)?;
        fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        let dest = parent.join(&file_name);
        let header = entry.header();
        let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
        // Set-id bits only for the image's root-owned files (a setuid file of
        // another owner is a way to become that owner); every container runs
        // with no_new_privs besides, so none raises a pod's rights.
        let mode = set_id_rule(header.mode().unwrap_or(0o644) & 0o7777, uid, gid, layer);
        let kind = header.entry_type();
        let existing = fs::symlink_metadata(&dest).ok();
        let io = |e: io::Error| format!("{}: {e}", raw.display());
        use tar::EntryType as T;
        match kind {
            T::Directory => {
                if existing.as_ref().is_some_and(|m| !m.is_dir()) {
                    remove_any(&dest)?;
                }
                if !dest.is_dir() {
                    fs::create_dir(&dest).map_err(io)?;
                }
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode)).map_err(io)?;
            }
            T::Regular | T::Continuous => {
                if existing.is_some() {
                    remove_any(&dest)?;
                }
                let mut f = fs::OpenOptions::new().write(true).create_new(true).open(&dest).map_err(io)?;
                io::copy(&mut entry, &mut f).map_err(io)?;
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode)).map_err(io)?;
            }
            T::Symlink if layer => {
                let target = entry
                    .link_name()
                    .map_err(io)?
                    .ok_or_else(|| format!("{}: symlink without a target", raw.display()))?;
                if existing.is_some() {
                    remove_any(&dest)?;
                }
                symlink(&*target, &dest).map_err(io)?;
            }
            T::Link if layer => {
                let target = entry
                    .link_name()
                    .map_err(io)?
                    .ok_or_else(|| format!("{}: hard link without a target", raw.display()))?;
                let target_rel = clean_path(&target)?;
                let tparent = resolve_in_root(root, target_rel.parent().unwrap_or(Path::new("")), &raw)?;
                let tpath = tparent.join(target_rel.file_name().unwrap_or_default());
                match fs::symlink_metadata(&tpath) {
                    Ok(m) if m.is_file() => {}
                    _ => {
                        return Err(format!(
                            "{}: hard link to {} which is not a file in the rootfs",
                            raw.display(),
                            target.display()
                        ))
                    }
                }
                if existing.is_some() {
                    remove_any(&dest)?;
                }
                fs::hard_link(&tpath, &dest).map_err(io)?;
            }
            T::Char | T::Block | T::Fifo if layer => {
                tracing::debug!(entry = %raw.display(), "skipping a device node or FIFO in an image layer");
                continue;
            }
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => continue,
            other => return Err(format!("{}: unsupported entry type {other:?}", raw.display())),
        }
        if layer {
            let _ = std::os::unix::fs::lchown(&dest, Some(uid as u32), Some(gid as u32));
            // chown clears the set-id bits of a file: given back after it.
            if mode & 0o6000 != 0 && matches!(kind, T::Regular | T::Continuous) {
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode)).map_err(io)?;
            }
        }
    }
    Ok(())
}

/// A layer entry's mode: setuid only when root owns it, setgid (on a file)
/// only when root's group does. The layout archive's own files keep theirs.
fn set_id_rule(mode: u32, uid: u64, gid: u64, layer: bool) -> u32 {
    if !layer {
        return mode;
    }
    let mut m = mode;
    if uid != 0 {
        m &= !0o4000;
    }
    if gid != 0 {
        m &= !0o2000;
    }
    m
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A layer of `files` regular files (path, size in bytes of zeros), gzipped.
    fn layer(files: &[(&str, usize)]) -> Vec<u8> {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (path, size) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(*size as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, io::repeat(0).take(*size as u64)).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    /// An OCI layout in `dir` with these layers, named `bomb:1`.
    fn layout(dir: &Path, layers: &[Vec<u8>]) {
        let blobs = dir.join("blobs/sha256");
        fs::create_dir_all(&blobs).unwrap();
        let put = |bytes: &[u8]| {
            fs::write(blobs.join(hex(bytes)), bytes).unwrap();
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                               "digest": format!("sha256:{}", hex(bytes)), "size": bytes.len()})
        };
        let config = put(br#"{"config": {"Cmd": ["true"]}}"#);
        let layers: Vec<_> = layers.iter().map(|l| put(l)).collect();
        let manifest = put(&serde_json::to_vec(&serde_json::json!({"config": config, "layers": layers})).unwrap());
        let mut m = manifest;
        m["annotations"] = serde_json::json!({REF_NAME: "bomb:1"});
        fs::write(dir.join("index.json"), serde_json::to_vec(&serde_json::json!({"manifests": [m]})).unwrap()).unwrap();
    }

    /// What `images` holds apart from the publishing lock.
    fn left(images: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(images)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.retain(|n| n != LOCK);
        names.sort();
        names
    }

    #[test]
    fn set_id_bits_stay_only_on_roots_files() {
        let tmp = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        for (path, uid, gid) in [("root-suid", 0, 0), ("user-suid", 1000, 0), ("user-sgid", 0, 1000)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_mode(0o6755);
            h.set_uid(uid);
            h.set_gid(gid);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, &b"x"[..]).unwrap();
        }
        let plain = b.into_inner().unwrap();
        let src = tmp.path().join("layout");
        layout(&src, &[plain]);
        let images = tmp.path().join("images");
        import_with(&images, &src, None, ImportLimits::default()).unwrap();
        let (_, root) = resolve(&images, "bomb:1").unwrap();
        let mode = |f: &str| fs::metadata(root.join(f)).unwrap().permissions().mode() & 0o7777;
        // Run as root (as the node agent does), chown keeps the owners.
        assert_eq!((mode("root-suid"), mode("user-suid"), mode("user-sgid")), (0o6755, 0o2755, 0o4755));
        let cases = [(0o4755, 0, 0, true, 0o4755), (0o4755, 5, 0, true, 0o755), (0o2755, 0, 5, true, 0o755)];
        for (m, uid, gid, layer, want) in cases {
            assert_eq!(set_id_rule(m, uid, gid, layer), want, "{m:o} {uid} {gid}");
        }
        assert_eq!(set_id_rule(0o4755, 5, 5, false), 0o4755, "the layout archive's own files");
    }

    #[test]
    fn an_import_past_its_bounds_is_refused_naming_the_bound_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let images = tmp.path().join("data/images");
        let small = ImportLimits { max_layers: 2, max_bytes: 1 << 20, max_files: 10 };
        let check = |name: &str, layers: Vec<Vec<u8>>, bound: &str| {
            let src = tmp.path().join(name);
            layout(&src, &layers);
            let started = std::time::Instant::now();
            let e = import_with(&images, &src, None, small).unwrap_err().to_string();
            assert!(e.contains(bound) && e.contains("bomb:1"), "{name}: {e}");
            assert!(started.elapsed() < std::time::Duration::from_secs(5), "{name}: refused from the headers");
            assert_eq!(left(&images), Vec::<String>::new(), "{name}");
        };
        // 64 MiB of zeros in a gzip of about 64 KiB: refused from its header.
        check(
            "bytes",
            vec![layer(&[("zeros", 64 << 20)])],
            "more than 1048576 bytes (the import's bound, --max-bytes)",
        );
        // Within the bytes, across two layers: the total counts.
        check(
            "total",
            vec![layer(&[("a", 600 << 10)]), layer(&[("b", 600 << 10)])],
            "more than 1048576 bytes (the import's bound, --max-bytes)",
        );
        let many: Vec<(String, usize)> = (0..11).map(|i| (format!("f{i}"), 1)).collect();
        let many: Vec<(&str, usize)> = many.iter().map(|(p, s)| (p.as_str(), *s)).collect();
        check("files", vec![layer(&many)], "more than 10 files (the import's bound, --max-files)");
        check(
            "layers",
            vec![layer(&[("a", 1)]), layer(&[("b", 1)]), layer(&[("c", 1)])],
            "3 layers, more than the import's bound of 2 (--max-layers)",
        );
        // Within every bound it imports.
        let src = tmp.path().join("fine");
        layout(&src, &[layer(&[("a", 1000)]), layer(&[("b", 1000)])]);
        let rec = import_with(&images, &src, None, small).unwrap();
        assert_eq!((rec.reference.as_str(), rec.layers), ("bomb:1", 2));
    }

    #[test]
    fn what_a_killed_import_left_is_removed_and_a_live_one_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let images = data.join("images");
        // PIDs above the kernel's PID_MAX_LIMIT (2^22) never run.
        let dead = images.join(".import-99999999-1");
        let live = images.join(format!(".import-{}-2", std::process::id()));
        let ready = images.join(".ready-abc-3");
        for d in [&dead, &live, &ready] {
            fs::create_dir_all(d.join("rootfs/usr")).unwrap();
            fs::write(d.join("rootfs/usr/big"), "x").unwrap();
        }
        // At the runtime's start (the agent's), as at the next import.
        crate::runtime::libcontainer::LibcontainerRuntime::new(&data, Path::new("/bin/true")).unwrap();
        assert_eq!(left(&images), vec![live.file_name().unwrap().to_string_lossy().into_owned()]);
        fs::create_dir_all(&dead).unwrap();
        assert_eq!(remove_leftovers(&images).unwrap(), vec![dead.clone()]);
        assert!(live.exists());
    }

    #[test]
    fn references_are_normalized_or_refused() {
        let check = |input: &str, expected: Option<&str>| {
            assert_eq!(normalize_reference(input).ok().as_deref(), expected, "{input}");
        };
        check("busybox", Some("busybox:latest"));
        check("busybox:1.36", Some("busybox:1.36"));
        check("reg.example:5000/team/app", Some("reg.example:5000/team/app:latest"));
        check("", None);
        check("bad name", None);
        check("../x", None);
    }

    #[test]
    fn paths_with_dotdot_are_refused() {
        assert!(clean_path(Path::new("a/../../x")).is_err());
        assert_eq!(clean_path(Path::new("/./a/b")).ok(), Some(PathBuf::from("a/b")));
    }

    #[test]
    fn symlinks_resolve_inside_the_root_or_are_refused() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib"))?;
        symlink("usr/lib", root.join("lib"))?;
        symlink("/usr", root.join("abs"))?;
        symlink("../../..", root.join("esc"))?;
        let e = Path::new("entry");
        assert_eq!(resolve_in_root(root, Path::new("lib"), e).ok(), Some(root.join("usr/lib")));
        assert_eq!(resolve_in_root(root, Path::new("abs/lib"), e).ok(), Some(root.join("usr/lib")));
        let msg = resolve_in_root(root, Path::new("esc/x"), e).err().unwrap_or_default();
        assert!(msg.contains("points outside the rootfs"), "{msg}");
        Ok(())
    }
}
