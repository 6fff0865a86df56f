//! Images from registries: a pod's image is pulled by the node when it is
//! not there (or always, or never: `imagePullPolicy`), through `oci-client`
//! (the OCI distribution protocol, token and basic auth, digests checked as
//! they arrive), into an OCI layout that the import path then applies: one
//! layer applier for `pinion image import` and pulls, with its bounds, its
//! confinement of links and its whiteouts.
//!
//! A site's registries: credentials in `<data>/auth.json` (Docker's
//! `config.json` shape, 0600), a CA bundle per registry in
//! `<data>/certs.d/HOST[:PORT]/*.crt` (Docker's and containerd's layout),
//! plain HTTP only for the `--insecure-registry` hosts, and mirrors
//! (`docker.io=mirror.site:5000`) tried instead of the registry named.
//!
//! Pulls of one reference are one at a time on a node: ten pods of one image
//! wait for the first pull and then find the image there.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use specs::pod::PullPolicy;
use tokio::io::AsyncWrite;

use crate::runtime::libcontainer::image::{self, ImageRecord, ImportLimits};
use crate::runtime::RuntimeError;

/// How this node reaches registries.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// `HOST[:PORT]` spoken to over plain HTTP (a lab's own registry).
    pub insecure: Vec<String>,
    /// Registry host -> the mirror pulled from instead (`docker.io` ->
    /// `mirror.site:5000`).
    pub mirrors: BTreeMap<String, String>,
    /// `auth.json` and `certs.d/` live here (the node's data dir).
    pub data_dir: PathBuf,
    /// The whole pull, manifest to last layer.
    pub timeout: Duration,
    /// Connecting, and any silence of the registry mid-answer.
    pub io_timeout: Duration,
    pub limits: ImportLimits,
    /// Unused images go when the image store's disk is fuller than
    /// `gc_high` percent, until it is below `gc_low` (the kubelet's
    /// `--image-gc-high-threshold` and `--image-gc-low-threshold`).
    pub gc_high: u8,
    pub gc_low: u8,
}

/// How often the agent looks at the image store's disk.
pub const GC_INTERVAL: Duration = Duration::from_secs(300);

impl RegistryConfig {
    pub fn new(data_dir: &Path) -> Self {
        RegistryConfig {
            insecure: Vec::new(),
            mirrors: BTreeMap::new(),
            data_dir: data_dir.to_path_buf(),
            timeout: Duration::from_secs(600),
            io_timeout: Duration::from_secs(30),
            limits: ImportLimits::default(),
            gc_high: 85,
            gc_low: 80,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The registry's answer, or why it could not be reached.
    #[error("{reference}: {message}")]
    Registry { reference: String, message: String },
    /// What came is refused: a digest that differs, an image past the bounds.
    #[error("{reference}: {message}")]
    Refused { reference: String, message: String },
    /// `imagePullPolicy: Never` and the image is not on the node.
    #[error("{reference}: not on this node and imagePullPolicy is Never (import it with `pinion image import`, or pull it with `pinion image pull`)")]
    NeverPull { reference: String },
    /// The node's own registry settings are wrong.
    #[error("{path}: {message}")]
    Settings { path: PathBuf, message: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What [`Puller::ensure`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    Present,
    Pulled(ImageRecord),
}

/// Pulls images into a node's image store, one pull per reference at a time.
pub struct Puller {
    cfg: RegistryConfig,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pulls: AtomicU64,
}

impl Puller {
    pub fn new(cfg: RegistryConfig) -> Self {
        Puller { cfg, locks: Mutex::new(HashMap::new()), pulls: AtomicU64::new(0) }
    }

    /// How many pulls reached a registry (pulls are shared: tests count them).
    pub fn pulls(&self) -> u64 {
        self.pulls.load(Ordering::Relaxed)
    }

    /// Makes `reference` present in `images` as `policy` says.
    pub async fn ensure(&self, images: &Path, reference: &str, policy: PullPolicy) -> Result<Ensured, PullError> {
        self.ensure_telling(images, reference, policy, || {}).await
    }

    /// [`Self::ensure`], calling `pulling` once a pull is about to reach the
    /// registry (not when the image is there).
    pub async fn ensure_telling(
        &self,
        images: &Path,
        reference: &str,
        policy: PullPolicy,
        pulling: impl FnOnce(),
    ) -> Result<Ensured, PullError> {
        let present = |images: &Path| image::resolve(images, reference).is_ok();
        match policy {
            PullPolicy::Never if present(images) => return Ok(Ensured::Present),
            PullPolicy::Never => return Err(PullError::NeverPull { reference: reference.to_string() }),
            // Never on the path of a pod whose image is here.
            PullPolicy::IfNotPresent if present(images) => return Ok(Ensured::Present),
            _ => {}
        }
        let lock = self.lock_for(reference);
        let _held = lock.lock().await;
        // Another pod's pull of the same image may have finished meanwhile.
        if policy == PullPolicy::IfNotPresent && present(images) {
            return Ok(Ensured::Present);
        }
        pulling();
        self.pull_locked(images, reference).await.map(Ensured::Pulled)
    }

    /// Pulls `reference` into `images` (`pinion image pull`, `Always`).
    pub async fn pull(&self, images: &Path, reference: &str) -> Result<ImageRecord, PullError> {
        let lock = self.lock_for(reference);
        let _held = lock.lock().await;
        self.pull_locked(images, reference).await
    }

    fn lock_for(&self, reference: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(reference.to_string()).or_default().clone()
    }

    async fn pull_locked(&self, images: &Path, reference: &str) -> Result<ImageRecord, PullError> {
        let limit = self.cfg.timeout;
        match tokio::time::timeout(limit, self.fetch_and_import(images, reference)).await {
            Ok(r) => r,
            Err(_) => Err(PullError::Registry {
                reference: reference.to_string(),
                message: format!("the pull did not finish within {}s", limit.as_secs()),
            }),
        }
    }

    async fn fetch_and_import(&self, images: &Path, spelled: &str) -> Result<ImageRecord, PullError> {
        let name = image::normalize_reference(spelled)?;
        let (target, host) = target(spelled, &self.cfg.mirrors)
            .map_err(|message| PullError::Refused { reference: spelled.to_string(), message })?;
        let client = self.client(&host)?;
        let auth = self.auth(&host)?;
        let registry = |e: oci_client::errors::OciDistributionError| PullError::Registry {
            reference: spelled.to_string(),
            message: registry_words(&e),
        };
        let refused = |message: String| PullError::Refused { reference: spelled.to_string(), message };
        self.pulls.fetch_add(1, Ordering::Relaxed);
        tracing::info!(reference = spelled, registry = host, "pulling image");

        crate::fsutil::private_dir(images).map_err(|source| RuntimeError::Io { path: images.to_path_buf(), source })?;
        let work = image::WorkDir::new(images)?;
        let blobs = work.0.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|source| RuntimeError::Io { path: blobs.clone(), source })?;

        // The manifest, through an index when the tag names several platforms.
        let (mut body, mut digest) = client.pull_manifest_raw(&target, &auth, ACCEPTED).await.map_err(registry)?;
        let mut media_type = media_type_of(&body);
        if is_index(&media_type) {
            let chosen = pick_platform(&body, "linux", go_arch()).map_err(refused)?;
            (body, digest) =
                client.pull_manifest_raw(&target.clone_with_digest(chosen), &auth, ACCEPTED).await.map_err(registry)?;
            media_type = media_type_of(&body);
        }
        let manifest: WireManifest = serde_json::from_slice(&body)
            .map_err(|e| refused(format!("the manifest is not an image manifest: {e}")))?;
        let limits = self.cfg.limits;
        if manifest.layers.len() > limits.max_layers {
            return Err(refused(format!(
                "{} layers, more than the node's bound of {}",
                manifest.layers.len(),
                limits.max_layers
            )));
        }
        // The blobs' declared sizes against the bound, before any is fetched.
        let declared = manifest.layers.iter().chain([&manifest.config]).map(|d| d.size.max(0) as u64).sum::<u64>();
        if declared > limits.max_bytes {
            return Err(refused(format!(
                "its blobs are {declared} bytes, more than the node's bound of {}",
                limits.max_bytes
            )));
        }
        write_blob(&blobs, &digest, &body).map_err(refused)?;
        for d in manifest.layers.iter().chain([&manifest.config]) {
            let hex = hex_of(&d.digest).map_err(refused)?;
            let path = blobs.join(hex);
            let file = tokio::fs::File::create(&path)
                .await
                .map_err(|source| RuntimeError::Io { path: path.clone(), source })?;
            // A registry sending more than the descriptor says is cut off there.
            let out = Bounded { inner: file, left: d.size.max(0) as u64 };
            client.pull_blob(&target, d.digest.as_str(), out).await.map_err(registry)?;
        }
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": media_type,
                "digest": digest,
                "size": body.len(),
                "annotations": { "org.opencontainers.image.ref.name": name },
            }],
        });
        let index_path = work.0.join("index.json");
        std::fs::write(&index_path, index.to_string())
            .map_err(|source| RuntimeError::Io { path: index_path.clone(), source })?;
        let (images, layout) = (images.to_path_buf(), work.0.clone());
        let rec = tokio::task::spawn_blocking(move || image::import_with(&images, &layout, Some(&name), limits))
            .await
            .map_err(|e| refused(format!("the unpacking task failed: {e}")))??;
        tracing::info!(reference = spelled, digest = rec.digest, layers = rec.layers, "image pulled");
        Ok(rec)
    }

    fn client(&self, host: &str) -> Result<Client, PullError> {
        // reqwest's rustls takes the process's provider: ours is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let protocol = if self.cfg.insecure.iter().any(|h| h == host) {
            ClientProtocol::HttpsExcept(vec![host.to_string()])
        } else {
            ClientProtocol::Https
        };
        Ok(Client::new(ClientConfig {
            protocol,
            extra_root_certificates: self.certificates(host)?,
            connect_timeout: Some(self.cfg.io_timeout),
            read_timeout: Some(self.cfg.io_timeout),
            max_concurrent_download: 4,
            platform_resolver: None,
            ..ClientConfig::default()
        }))
    }

    /// `certs.d/HOST/*.crt`, PEM.
    fn certificates(&self, host: &str) -> Result<Vec<Certificate>, PullError> {
        let dir = self.cfg.data_dir.join("certs.d").join(host);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(PullError::Settings { path: dir, message: e.to_string() }),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "crt" || e == "pem") {
                let data = read_small(&path, MAX_SETTINGS_FILE)?;
                out.push(Certificate { encoding: CertificateEncoding::Pem, data });
            }
        }
        Ok(out)
    }

    fn auth(&self, host: &str) -> Result<RegistryAuth, PullError> {
        let path = self.cfg.data_dir.join("auth.json");
        let text = match std::fs::metadata(&path) {
            // Passwords: the file is root's alone, as ssh asks of a key.
            Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o077 != 0 => {
                let mode = std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777;
                return Err(PullError::Settings {
                    path,
                    message: format!("holds passwords but its mode is {mode:o}: chmod 600 it"),
                });
            }
            Ok(_) => read_small(&path, MAX_SETTINGS_FILE)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RegistryAuth::Anonymous),
            Err(e) => return Err(PullError::Settings { path, message: e.to_string() }),
        };
        credentials(&text, host).map_err(|message| PullError::Settings { path, message })
    }
}

/// Registry settings files are small; a bigger one is a mistake, not read.
const MAX_SETTINGS_FILE: u64 = 1 << 20;

fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, PullError> {
    use std::io::Read;
    let settings = |message: String| PullError::Settings { path: path.to_path_buf(), message };
    let file = std::fs::File::open(path).map_err(|e| settings(e.to_string()))?;
    let mut data = Vec::new();
    file.take(max + 1).read_to_end(&mut data).map_err(|e| settings(e.to_string()))?;
    if data.len() as u64 > max {
        return Err(settings(format!("larger than {max} bytes")));
    }
    Ok(data)
}

/// What is asked of the registry: images and indexes, OCI and Docker's.
const ACCEPTED: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

fn is_index(media_type: &str) -> bool {
    media_type.ends_with("image.index.v1+json") || media_type.ends_with("manifest.list.v2+json")
}

/// A manifest's `mediaType`; an OCI one may leave it out (then an index has
/// `manifests`, an image `layers`).
fn media_type_of(body: &[u8]) -> String {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: String,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Probe>(body) {
        Ok(p) if !p.media_type.is_empty() => p.media_type,
        Ok(p) if p.manifests.is_some() => ACCEPTED[1].to_string(),
        _ => ACCEPTED[0].to_string(),
    }
}

#[derive(Deserialize)]
struct WireDescriptor {
    digest: String,
    #[serde(default)]
    size: i64,
}

#[derive(Deserialize)]
struct WireManifest {
    config: WireDescriptor,
    layers: Vec<WireDescriptor>,
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The digest of the index's manifest for `os`/`arch` (a `variant` is not
/// asked for: the first of the architecture wins, as Docker picks).
pub(crate) fn pick_platform(index: &[u8], os: &str, arch: &str) -> Result<String, String> {
    #[derive(Deserialize)]
    struct Platform {
        #[serde(default)]
        os: String,
        #[serde(default)]
        architecture: String,
    }
    #[derive(Deserialize)]
    struct Entry {
        digest: String,
        #[serde(default)]
        platform: Option<Platform>,
    }
    #[derive(Deserialize)]
    struct Index {
        manifests: Vec<Entry>,
    }
    let index: Index = serde_json::from_slice(index).map_err(|e| format!("the image index does not parse: {e}"))?;
    let offered: Vec<String> = index
        .manifests
        .iter()
        .filter_map(|m| m.platform.as_ref().map(|p| format!("{}/{}", p.os, p.architecture)))
        .collect();
    index
        .manifests
        .into_iter()
        .find(|m| m.platform.as_ref().is_some_and(|p| p.os == os && p.architecture == arch))
        .map(|m| m.digest)
        .ok_or_else(|| format!("no manifest for {os}/{arch} in the image index (it has {})", offered.join(", ")))
}

/// The reference to fetch (through a mirror where one is set) and the host
/// it is fetched from.
pub(crate) fn target(spelled: &str, mirrors: &BTreeMap<String, String>) -> Result<(Reference, String), String> {
    let r: Reference = spelled.parse().map_err(|e| format!("not an image reference: {e}"))?;
    let Some(mirror) = mirrors.get(r.registry()) else {
        let host = r.resolve_registry().to_string();
        return Ok((r, host));
    };
    let repo = r.repository().to_string();
    let fetched = match (r.tag(), r.digest()) {
        (Some(tag), Some(d)) => Reference::with_tag_and_digest(mirror.clone(), repo, tag.to_string(), d.to_string()),
        (None, Some(d)) => Reference::with_digest(mirror.clone(), repo, d.to_string()),
        (tag, None) => Reference::with_tag(mirror.clone(), repo, tag.unwrap_or("latest").to_string()),
    };
    Ok((fetched, mirror.clone()))
}

/// The credentials `auth.json` (Docker's `config.json` shape) holds for
/// `host`: `auths.HOST.auth` (base64 `user:password`) or `username` and
/// `password`; keys may carry `https://` and a path, as `docker login`
/// writes them. Anonymous when none matches.
pub(crate) fn credentials(text: &[u8], host: &str) -> Result<RegistryAuth, String> {
    #[derive(Deserialize, Default)]
    struct Entry {
        #[serde(default)]
        auth: Option<String>,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
    }
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    let file: File = serde_json::from_slice(text).map_err(|e| format!("not a Docker config.json: {e}"))?;
    let key_host = |k: &str| {
        let k = k.trim_start_matches("https://").trim_start_matches("http://");
        k.split('/').next().unwrap_or(k).to_string()
    };
    let docker_hub = |h: &str| matches!(h, "docker.io" | "index.docker.io" | "registry-1.docker.io");
    let Some((key, entry)) =
        file.auths.iter().find(|(k, _)| key_host(k) == host || (docker_hub(&key_host(k)) && docker_hub(host)))
    else {
        return Ok(RegistryAuth::Anonymous);
    };
    match (&entry.auth, &entry.username, &entry.password) {
        (Some(b64), _, _) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| format!("auths.{key}.auth is not base64: {e}"))?;
            let text = String::from_utf8(raw).map_err(|_| format!("auths.{key}.auth is not UTF-8"))?;
            let (user, password) =
                text.split_once(':').ok_or_else(|| format!("auths.{key}.auth is not user:password"))?;
            Ok(RegistryAuth::Basic(user.to_string(), password.to_string()))
        }
        (None, Some(u), Some(p)) => Ok(RegistryAuth::Basic(u.clone(), p.clone())),
        _ => Err(format!("auths.{key}: neither auth nor username and password")),
    }
}

/// The registry's own words where it gave some (`MANIFEST_UNKNOWN: manifest
/// unknown`), else the error.
fn registry_words(e: &oci_client::errors::OciDistributionError) -> String {
    use oci_client::errors::OciDistributionError as E;
    match e {
        E::RegistryError { envelope, .. } => {
            let code = |x: &oci_client::errors::OciError| match serde_json::to_value(&x.code) {
                Ok(serde_json::Value::String(s)) => s,
                _ => format!("{:?}", x.code),
            };
            let words: Vec<String> = envelope.errors.iter().map(|x| format!("{}: {}", code(x), x.message)).collect();
            if words.is_empty() {
                e.to_string()
            } else {
                words.join("; ")
            }
        }
        other => {
            // reqwest's own words stop at "error sending request": the cause
            // (refused, a TLS failure, a timeout) is in its sources.
            let mut words = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(s) = source {
                let w = s.to_string();
                if !words.contains(&w) {
                    words.push_str(": ");
                    words.push_str(&w);
                }
                source = s.source();
            }
            words
        }
    }
}

fn hex_of(digest: &str) -> Result<&str, String> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(h),
        _ => Err(format!("digest {digest:?} is not sha256:HEX")),
    }
}

fn write_blob(blobs: &Path, digest: &str, body: &[u8]) -> Result<(), String> {
    let path = blobs.join(hex_of(digest)?);
    std::fs::write(&path, body).map_err(|e| format!("{}: {e}", path.display()))
}

/// A writer that refuses past `left` bytes.
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Bounded<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(std::io::Error::other("the registry sent more bytes than the descriptor's size")));
        }
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.left -= n as u64;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_mirrors() {
        let mirrors: BTreeMap<String, String> = [("docker.io".to_string(), "mirror.site:5000".to_string())].into();
        let cases: &[(&str, &str, &str)] = &[
            ("registry.site:5000/upf:1.2", "registry.site:5000/upf:1.2", "registry.site:5000"),
            ("busybox", "mirror.site:5000/library/busybox:latest", "mirror.site:5000"),
            ("docker.io/library/busybox:1.36", "mirror.site:5000/library/busybox:1.36", "mirror.site:5000"),
            ("localhost:5000/a/b:c", "localhost:5000/a/b:c", "localhost:5000"),
        ];
        for (spelled, want, host) in cases {
            let (r, h) = target(spelled, &mirrors).expect(spelled);
            assert_eq!((r.whole(), h.as_str()), (want.to_string(), *host), "{spelled}");
        }
        let pinned = format!("busybox@sha256:{}", "a".repeat(64));
        let (r, _) = target(&pinned, &mirrors).expect("pinned");
        assert_eq!(r.digest(), Some(format!("sha256:{}", "a".repeat(64)).as_str()));
        let (r, h) = target("quay.io/x/y:1", &BTreeMap::new()).expect("no mirror");
        assert_eq!((r.registry(), h.as_str()), ("quay.io", "quay.io"));
    }

    #[test]
    fn credentials_as_docker_login_writes_them() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let file = format!(
            r#"{{"auths": {{"https://registry.site:5000/v1/": {{"auth": "{b64}"}}, "https://index.docker.io/v1/": {{"username": "bob", "password": "pw"}}, "bad.site": {{"auth": "!!"}}}}}}"#
        );
        let basic = |u: &str, p: &str| format!("{:?}", RegistryAuth::Basic(u.into(), p.into()));
        let got = |host: &str| credentials(file.as_bytes(), host).map(|a| format!("{a:?}"));
        assert_eq!(got("registry.site:5000"), Ok(basic("alice", "s3cret")));
        assert_eq!(got("index.docker.io"), Ok(basic("bob", "pw")));
        assert_eq!(got("other.site"), Ok(format!("{:?}", RegistryAuth::Anonymous)));
        assert!(got("bad.site").is_err_and(|e| e.contains("auths.bad.site.auth")));
        assert!(credentials(b"nope", "x").is_err_and(|e| e.contains("config.json")));
    }

    #[test]
    fn platforms_from_an_index() {
        let index = br#"{"manifests": [
            {"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": "sha256:att", "platform": {"os": "unknown", "architecture": "unknown"}}]}"#;
        assert_eq!(pick_platform(index, "linux", "amd64"), Ok("sha256:amd".to_string()));
        let none = pick_platform(index, "linux", "riscv64").expect_err("no riscv64 manifest");
        assert!(none.contains("linux/arm64, linux/amd64"), "{none}");
        assert!(pick_platform(b"{", "linux", "amd64").is_err());
        assert!(is_index(&media_type_of(br#"{"manifests": []}"#)));
        assert!(!is_index(&media_type_of(br#"{"layers": []}"#)));
        assert!(is_index(&media_type_of(
            br#"{"mediaType": "application/vnd.docker.distribution.manifest.list.v2+json"}"#
        )));
    }
}
