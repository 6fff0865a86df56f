//! Pod networking through CNI (the Container Network Interface, spec 1.0):
//! one network namespace per pod, pinned by a bind mount, and the plugins
//! called on it directly, as libcni does.
//!
//! The operator's network configuration is the first file by name in the
//! configuration folder (`.conflist`, `.conf` or `.json`, as containerd and
//! CRI-O pick it); it is read again at every pod setup, so a fixed file
//! applies to the next try. A plugin is the executable named by its `type`
//! in one of the plugin folders, run with the `CNI_*` variables and its
//! configuration on stdin, within a time limit (its process group is killed
//! past it).
//!
//! A pod's network is a list of attachments: the configured network on
//! `eth0`, then one `host-device` attachment per network-function device
//! the pod holds, named as the pod asks (`pinion.io/interfaces`). What was
//! attached is recorded in `<state>/<sandbox>.json` (fsynced) before each
//! ADD and with its result after, so DEL and CHECK get the configuration
//! used and the `prevResult`, even after a kill -9 of the agent: the pinned
//! namespace keeps virtual devices alive, the record lets DEL find them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fsutil::write_atomic;
use crate::host::{Host, PluginFailure, PluginRun, RealHost};

/// Where operators put network configurations.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Debian's `containernetworking-plugins`, then the upstream default.
pub const DEFAULT_BIN_DIRS: &str = "/usr/lib/cni:/opt/cni/bin";
/// Where pods' network namespaces are pinned.
pub const DEFAULT_NETNS_DIR: &str = "/run/pinion/netns";
/// The interface of the configured network inside a pod.
const POD_IFNAME: &str = "eth0";
/// How long one plugin call may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the node's pod network comes from (`--cni-conf-dir`, `--cni-bin-dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniConfig {
    pub(crate) conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    pub netns_dir: PathBuf,
    /// Limit on one plugin call.
    pub timeout: Duration,
}

impl CniConfig {
    pub fn new(conf_dir: PathBuf, bin_dirs: Vec<PathBuf>) -> Self {
        CniConfig { conf_dir, bin_dirs, netns_dir: PathBuf::from(DEFAULT_NETNS_DIR), timeout: DEFAULT_TIMEOUT }
    }

    /// Where the pod network of `sandbox` is pinned.
    pub fn netns_path(&self, sandbox: &str) -> PathBuf {
        self.netns_dir.join(sandbox)
    }

    /// Where the user namespace of a `hostUsers: false` pod is pinned: a
    /// folder beside the network namespaces' (not in it: each name there
    /// is a sandbox).
    pub fn userns_path(&self, sandbox: &str) -> PathBuf {
        self.netns_dir.with_file_name("userns").join(sandbox)
    }
}

/// `--cni-bin-dir`: folders separated by `:`.
pub fn parse_bin_dirs(value: &str) -> Vec<PathBuf> {
    value.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("{path}: {field}: {reason}")]
    Config { path: PathBuf, field: String, reason: String },
    #[error("no CNI network configuration (.conflist, .conf or .json) in {dir}")]
    NoConfig { dir: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("CNI plugin {plugin:?} not found in {dirs}")]
    PluginMissing { plugin: String, dirs: String },
    #[error("CNI plugin {plugin} {command}: timed out after {after:?}")]
    Timeout { plugin: String, command: &'static str, after: Duration },
    #[error("CNI plugin {plugin} {command} failed: {message}")]
    Plugin { plugin: String, command: &'static str, message: String },
    #[error("network namespace {path}: {reason}")]
    Netns { path: PathBuf, reason: String },
    /// A setup failed and so did the cleanup of what it had done.
    #[error("{error}; cleaning up after it: {cleanup}")]
    Cleanup { error: Box<CniError>, cleanup: Box<CniError> },
}

// ---------------------------------------------------------------------------
// Configuration

/// A network configuration list as libcni reads it: a `.conf` is a list of
/// one plugin.
#[derive(Debug, Clone, PartialEq)]
struct NetworkConfig {
    path: PathBuf,
    cni_version: String,
    name: String,
    /// Each plugin's own configuration, `type` checked.
    plugins: Vec<Map<String, Value>>,
}

impl NetworkConfig {
    /// The list as recorded with an attachment (so DEL uses what ADD used).
    fn to_value(&self) -> Value {
        serde_json::json!({ "cniVersion": self.cni_version, "name": self.name, "plugins": self.plugins })
    }
}

const CONFIG_EXTENSIONS: [&str; 3] = ["conflist", "conf", "json"];

/// The configuration file libcni-based runtimes would use: the first by
/// name with a configuration extension. `None` when the folder is absent or
/// holds none.
pub(crate) fn config_file(dir: &Path) -> Result<Option<PathBuf>, CniError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CniError::Io { path: dir.to_path_buf(), source }),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| CniError::Io { path: dir.to_path_buf(), source })?;
        names.push(entry.file_name());
    }
    Ok(first_config(names.iter().filter_map(|n| n.to_str())).map(|n| dir.join(n)))
}

/// The first name (byte order) with a configuration extension.
fn first_config<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    names
        .filter(|n| {
            !n.starts_with('.')
                && Path::new(n).extension().and_then(|e| e.to_str()).is_some_and(|e| CONFIG_EXTENSIONS.contains(&e))
        })
        .min()
}

/// Reads the configuration in `dir` (see `config_file`).
fn load_config(dir: &Path) -> Result<NetworkConfig, CniError> {
    let path = config_file(dir)?.ok_or_else(|| CniError::NoConfig { dir: dir.to_path_buf() })?;
    let bytes = std::fs::read(&path).map_err(|source| CniError::Io { path: path.clone(), source })?;
    parse_config(&path, &bytes)
}

/// Parses a `.conflist` (an object with `plugins`) or a single plugin's
/// `.conf`; every problem names its field.
fn parse_config(path: &Path, bytes: &[u8]) -> Result<NetworkConfig, CniError> {
    let bad = |field: &str, reason: String| CniError::Config { path: path.to_path_buf(), field: field.into(), reason };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| bad("(file)", format!("not JSON: {e}")))?;
    let Value::Object(top) = value else {
        return Err(bad("(file)", "want a JSON object".into()));
    };
    let string = |field: &str| match top.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(bad(field, "want a non-empty string".into())),
        None => Err(bad(field, "missing".into())),
    };
    let cni_version = string("cniVersion")?;
    let name = string("name")?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        return Err(bad("name", format!("{name:?}: want letters, digits, '_', '.' or '-'")));
    }
    let plugins = match top.get("plugins") {
        Some(Value::Array(list)) => {
            if list.is_empty() {
                return Err(bad("plugins", "must list at least one plugin".into()));
            }
            let mut plugins = Vec::new();
            for (i, p) in list.iter().enumerate() {
                let Value::Object(p) = p else {
                    return Err(bad(&format!("plugins[{i}]"), "want an object".into()));
                };
                check_type(p).map_err(|reason| bad(&format!("plugins[{i}].type"), reason))?;
                plugins.push(p.clone());
            }
            plugins
        }
        Some(_) => return Err(bad("plugins", "want an array".into())),
        None => {
            check_type(&top).map_err(|reason| bad("type", reason))?;
            vec![top.clone()]
        }
    };
    Ok(NetworkConfig { path: path.to_path_buf(), cni_version, name, plugins })
}

/// A plugin's `type`: the executable's file name.
fn check_type(plugin: &Map<String, Value>) -> Result<(), String> {
    match plugin.get("type") {
        None => Err("missing".into()),
        Some(Value::String(t))
            if !t.is_empty()
                && !t.starts_with('.')
                && t.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) =>
        {
            Ok(())
        }
        Some(t) => Err(format!("{t}: want a plugin's file name (letters, digits, '_', '.', '-')")),
    }
}

pub(crate) fn plugin_type(plugin: &Map<String, Value>) -> &str {
    plugin.get("type").and_then(Value::as_str).unwrap_or("")
}

// ---------------------------------------------------------------------------
// Running plugins

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Add,
    Del,
    Check,
}

impl Command {
    fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
        }
    }
}

/// The environment of one plugin call (CNI spec 1.0, "Parameters").
pub(crate) fn plugin_env(
    command: Command,
    container_id: &str,
    netns: &Path,
    ifname: &str,
    bin_dirs: &[PathBuf],
) -> Vec<(&'static str, String)> {
    let path = bin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":");
    vec![
        ("CNI_COMMAND", command.as_str().to_string()),
        ("CNI_CONTAINERID", container_id.to_string()),
        ("CNI_NETNS", netns.display().to_string()),
        ("CNI_IFNAME", ifname.to_string()),
        ("CNI_PATH", path),
    ]
}

/// One plugin's stdin: its configuration with the list's `cniVersion` and
/// `name`, and the previous result (ADD: the previous plugin's; DEL and
/// CHECK: the recorded final one).
pub(crate) fn plugin_input(list: &Value, plugin: &Map<String, Value>, prev: Option<&Value>) -> Value {
    let mut conf = plugin.clone();
    for field in ["cniVersion", "name"] {
        if let Some(v) = list.get(field) {
            conf.insert(field.into(), v.clone());
        }
    }
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    Value::Object(conf)
}

/// The addresses a result gives the pod: those on interfaces inside the
/// sandbox (an interface with `sandbox` set), or every one when the result
/// does not say which interface holds them; without the prefix length.
fn result_ips(result: &Value) -> Vec<String> {
    let interfaces = result.get("interfaces").and_then(Value::as_array);
    let in_sandbox = |i: u64| {
        interfaces
            .and_then(|l| l.get(usize::try_from(i).ok()?))
            .and_then(|itf| itf.get("sandbox"))
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    let mut out = Vec::new();
    for ip in result.get("ips").and_then(Value::as_array).into_iter().flatten() {
        let Some(address) = ip.get("address").and_then(Value::as_str) else { continue };
        if let Some(i) = ip.get("interface").and_then(Value::as_u64) {
            if !in_sandbox(i) {
                continue;
            }
        }
        let bare = address.split('/').next().unwrap_or(address);
        if bare.parse::<IpAddr>().is_ok() {
            out.push(bare.to_string());
        }
    }
    out
}

/// The error a failing plugin printed (`{"code", "msg", "details"}`), or
/// what it wrote to stderr.
fn plugin_message(code: Option<i32>, stdout: &[u8], stderr: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(stdout) {
        if let Some(msg) = v.get("msg").and_then(Value::as_str) {
            let details = v.get("details").and_then(Value::as_str).filter(|d| !d.is_empty());
            let code = v.get("code").and_then(Value::as_u64).map(|c| format!(" (CNI error {c})")).unwrap_or_default();
            return match details {
                Some(d) => format!("{msg}: {d}{code}"),
                None => format!("{msg}{code}"),
            };
        }
    }
    let text = String::from_utf8_lossy(if stderr.is_empty() { stdout } else { stderr });
    let text = text.trim();
    let status = code.map_or("killed by a signal".to_string(), |c| format!("exit code {c}"));
    if text.is_empty() {
        status
    } else {
        format!("{status}: {}", text.chars().take(2000).collect::<String>())
    }
}

pub(crate) fn find_plugin(host: &dyn Host, bin_dirs: &[PathBuf], name: &str) -> Result<PathBuf, CniError> {
    bin_dirs.iter().map(|d| d.join(name)).find(|p| host.is_file(p)).ok_or_else(|| CniError::PluginMissing {
        plugin: name.to_string(),
        dirs: bin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":"),
    })
}

/// Runs one plugin; its result (ADD) or `None` (DEL, CHECK, empty output).
pub(crate) async fn exec_plugin(
    host: &dyn Host,
    cfg: &CniConfig,
    plugin: &str,
    env: Vec<(&'static str, String)>,
    input: &Value,
    command: Command,
) -> Result<Option<Value>, CniError> {
    let bin = find_plugin(host, &cfg.bin_dirs, plugin)?;
    let stdin = serde_json::to_vec(input).map_err(|e| CniError::Plugin {
        plugin: plugin.into(),
        command: command.as_str(),
        message: format!("configuration: {e}"),
    })?;
    let run = PluginRun { bin: &bin, env: &env, stdin: &stdin, timeout: cfg.timeout };
    let out = match host.run_plugin(run).await {
        Ok(out) => out,
        Err(PluginFailure::Io(source)) => return Err(CniError::Io { path: bin.clone(), source }),
        Err(PluginFailure::TimedOut) => {
            return Err(CniError::Timeout { plugin: plugin.into(), command: command.as_str(), after: cfg.timeout });
        }
    };
    if !out.success() {
        return Err(CniError::Plugin {
            plugin: plugin.into(),
            command: command.as_str(),
            message: plugin_message(out.code, &out.stdout, &out.stderr),
        });
    }
    if command != Command::Add || out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&out.stdout).map(Some).map_err(|e| CniError::Plugin {
        plugin: plugin.into(),
        command: command.as_str(),
        message: format!("result is not JSON: {e}"),
    })
}

// ---------------------------------------------------------------------------
// A pod's network

/// What a pod's network is made of, from the planner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetRequest {
    /// The pod key, for logs.
    pub key: String,
    /// The CNI container id and the pinned namespace's file name (`sandbox_id`).
    pub sandbox: String,
    /// Network-function devices: (host interface, name in the pod).
    pub netdevs: Vec<(String, String)>,
    /// `hostUsers: false`: the host id of the pod's root (the agent fills
    /// it in when it claims the pod's ids). The network namespace is then
    /// made inside the pod's user namespace, pinned beside it, so that
    /// the pod's containers (root only inside it) may join it.
    pub userns: Option<u32>,
}

/// A pod's sandbox id: `p` and 24 hex digits of a hash of its key and uid,
/// a valid CNI container id and file name, different for a pod re-created
/// under the same name.
pub fn sandbox_id(pod_key: &str, uid: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{pod_key}\0{uid}").as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("p{hex}")
}

/// A warm network's id: `w` and 24 hex digits (the shape of `sandbox_id`),
/// new at every call.
fn warm_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seed = format!("{}:{}:{n}", std::process::id(), now.as_nanos());
    format!("w{}", &sandbox_id(&seed, "warm")[1..])
}

fn is_warm_id(id: &str) -> bool {
    id.len() == 25 && id.starts_with('w')
}

/// One attachment of a pod's network: a configuration list on an interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Attachment {
    ifname: String,
    /// `{cniVersion, name, plugins}` as ADD used it.
    config: Value,
    /// The final result once ADD returned; `None` while (or if killed while) adding.
    #[serde(default)]
    result: Option<Value>,
}

/// `<state>/<sandbox>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    key: String,
    netns: PathBuf,
    attachments: Vec<Attachment>,
    /// The CNI container id the attachments were added under when it is not
    /// the sandbox's own: a warm network's, handed to this pod. DEL and
    /// CHECK use it (host-local keys its leases by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cni_id: Option<String>,
}

impl Record {
    fn cni_id<'a>(&'a self, sandbox: &'a str) -> &'a str {
        self.cni_id.as_deref().unwrap_or(sandbox)
    }
}

/// A network made ahead, with nothing in it yet, waiting for a pod.
#[derive(Debug, Clone)]
struct Warm {
    id: String,
    /// The attachment's configuration as ADD used it: a pod takes it only
    /// while the node's network is still that one.
    config: Value,
}

/// The key warm networks are recorded under (no pod has it: keys are
/// `namespace/name` or a static pod's file name, never in parentheses).
const WARM_KEY: &str = "(warm)";

/// The pods' networks on this node. Calls for one sandbox run one at a time.
pub struct PodNetworks {
    cfg: CniConfig,
    /// The attachment records (`<data>/cni`).
    state_dir: PathBuf,
    locks: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Sandboxes set up (or adopted) by this process, with their addresses.
    up: Mutex<BTreeMap<String, Vec<String>>>,
    /// Sandboxes to remove that are not up: an earlier agent's, or whose
    /// removal failed; each tried again from its time on.
    leftover: Mutex<BTreeMap<String, std::time::Instant>>,
    /// Removals in flight.
    removing: Mutex<std::collections::BTreeSet<String>>,
    /// Networks made ahead (`keep_warm`), oldest first: a pod without
    /// network-function devices or a user namespace of its own takes one
    /// instead of waiting for the plugins.
    warm: Mutex<Vec<Warm>>,
    /// How many to keep made ahead.
    warm_target: std::sync::atomic::AtomicUsize,
    /// A refill is under way (one at a time).
    refilling: std::sync::atomic::AtomicBool,
    /// Namespaces and plugins go through it (the host itself, or a test's double).
    host: Arc<dyn Host>,
}

/// A failed removal is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(10);

impl PodNetworks {
    /// The networks of this node, with what an earlier agent left recorded.
    pub fn new(cfg: CniConfig, state_dir: PathBuf) -> Result<Self, CniError> {
        Self::with_host(cfg, state_dir, Arc::new(RealHost))
    }

    /// [`Self::new`] with its namespace and plugin calls made on `host`.
    pub(crate) fn with_host(cfg: CniConfig, state_dir: PathBuf, host: Arc<dyn Host>) -> Result<Self, CniError> {
        let nets = PodNetworks {
            cfg,
            state_dir,
            locks: Mutex::default(),
            up: Mutex::default(),
            leftover: Mutex::default(),
            removing: Mutex::default(),
            warm: Mutex::default(),
            warm_target: Default::default(),
            refilling: Default::default(),
            host,
        };
        // A record an earlier agent was writing when it was killed, never
        // renamed into place. The first write of a network's record comes
        // before its namespace, so nothing was made; a later write's older
        // record is still in place and is what the cleanup below goes by.
        match crate::fsutil::remove_temporaries(&nets.state_dir) {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed half-written network records a killed agent left"),
            Err(source) => return Err(CniError::Io { path: nets.state_dir.clone(), source }),
        }
        let now = std::time::Instant::now();
        *nets.leftover.lock().unwrap_or_else(|p| p.into_inner()) =
            nets.recorded()?.into_iter().map(|s| (s, now)).collect();
        Ok(nets)
    }

    /// Sandboxes to remove now: up or left over, not `wanted`, not being
    /// removed already; each is marked as being removed until `removed`.
    pub fn unwanted(&self, wanted: &std::collections::BTreeSet<String>) -> Vec<String> {
        let now = std::time::Instant::now();
        let up = self.up.lock().unwrap_or_else(|p| p.into_inner());
        let leftover = self.leftover.lock().unwrap_or_else(|p| p.into_inner());
        let mut removing = self.removing.lock().unwrap_or_else(|p| p.into_inner());
        // A warm network is briefly `up` while it is made; it is no pod's.
        let made_here = up.keys().filter(|s| !is_warm_id(s));
        let candidates = made_here.chain(leftover.iter().filter(|(_, at)| **at <= now).map(|(s, _)| s));
        let out: Vec<String> = candidates.filter(|s| !wanted.contains(*s) && !removing.contains(*s)).cloned().collect();
        removing.extend(out.iter().cloned());
        out
    }

    /// `teardown` of a sandbox `unwanted` gave, then its bookkeeping.
    pub async fn remove(&self, sandbox: &str) -> Result<(), CniError> {
        let r = self.teardown(sandbox).await;
        let mut leftover = self.leftover.lock().unwrap_or_else(|p| p.into_inner());
        match &r {
            Ok(()) => leftover.remove(sandbox),
            Err(_) => leftover.insert(sandbox.to_string(), std::time::Instant::now() + RETRY_AFTER),
        };
        self.removing.lock().unwrap_or_else(|p| p.into_inner()).remove(sandbox);
        r
    }

    /// Sandboxes an earlier agent left (see `new`).
    pub fn leftovers(&self) -> Vec<String> {
        self.leftover.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    #[cfg(test)]
    fn config(&self) -> &CniConfig {
        &self.cfg
    }

    fn lock_of(&self, sandbox: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(sandbox.to_string()).or_default().clone()
    }

    fn set_up(&self, sandbox: &str, ips: Option<Vec<String>>) {
        let mut up = self.up.lock().unwrap_or_else(|p| p.into_inner());
        match ips {
            Some(ips) => up.insert(sandbox.to_string(), ips),
            None => up.remove(sandbox),
        };
    }

    /// The pod's network, created when missing: the namespace pinned with
    /// `lo` up, then each attachment added. Returns the pod's addresses. On
    /// error nothing is left (every attachment deleted, the pin removed).
    pub async fn setup(&self, req: &PodNetRequest) -> Result<Vec<String>, CniError> {
        let lock = self.lock_of(&req.sandbox);
        let _held = lock.lock().await;
        if let Some(ips) = self.up.lock().unwrap_or_else(|p| p.into_inner()).get(&req.sandbox) {
            return Ok(ips.clone());
        }
        self.setup_locked(req, true).await
    }

    /// `setup` under the sandbox's lock; `take_warm`: a warm network may be
    /// handed over instead of adding one now.
    async fn setup_locked(&self, req: &PodNetRequest, take_warm: bool) -> Result<Vec<String>, CniError> {
        let netns = self.cfg.netns_path(&req.sandbox);
        // What an earlier agent left: whole (adopted, checked at recovery)
        // or half made (killed in the middle): the latter goes first.
        match self.read_record(&req.sandbox)? {
            Some(rec)
                if rec.attachments.iter().all(|a| a.result.is_some())
                    && is_mounted(&*self.host, &netns)
                    && (req.userns.is_none() || is_mounted(&*self.host, &self.cfg.userns_path(&req.sandbox))) =>
            {
                let ips = rec.attachments.first().and_then(|a| a.result.as_ref()).map(result_ips).unwrap_or_default();
                self.set_up(&req.sandbox, Some(ips.clone()));
                self.leftover.lock().unwrap_or_else(|p| p.into_inner()).remove(&req.sandbox);
                return Ok(ips);
            }
            Some(rec) => self.teardown_locked(&req.sandbox, Some(rec)).await?,
            None if netns.exists() => self.teardown_locked(&req.sandbox, None).await?,
            None => {}
        }
        let own = crate::peers::read_own_cidr(&self.state_dir.join(crate::peers::OWN_CIDR_FILE));
        let network = in_own_range(load_config(&self.cfg.conf_dir)?, own).to_value();
        if take_warm && req.netdevs.is_empty() && req.userns.is_none() {
            if let Some(ips) = self.take_warm(req, &network) {
                return Ok(ips);
            }
        }
        let mut attachments = vec![Attachment { ifname: POD_IFNAME.into(), config: network, result: None }];
        for (host, ifname) in &req.netdevs {
            attachments.push(Attachment { ifname: ifname.clone(), config: host_device_config(host), result: None });
        }
        // Every plugin is there before anything is made: a missing one is
        // its own clear error, with nothing to undo.
        for a in &attachments {
            for plugin in plugins_of(&a.config) {
                find_plugin(&*self.host, &self.cfg.bin_dirs, plugin_type(plugin))?;
            }
        }
        let mut rec = Record { key: req.key.clone(), netns: netns.clone(), attachments, cni_id: None };
        // Recorded before the namespace exists: a kill -9 from here on leaves
        // a record the next agent cleans up.
        self.write_record(&req.sandbox, &rec)?;
        // How many attachments were tried: only those are deleted on failure.
        let mut tried = 0;
        let made = async {
            let owner = req.userns.map(|base| (base, self.cfg.userns_path(&req.sandbox)));
            create_netns(&self.host, &netns, owner).await?;
            for i in 0..rec.attachments.len() {
                tried = i + 1;
                let result = self.add(&req.sandbox, &netns, &rec.attachments[i]).await?;
                rec.attachments[i].result = Some(result);
                self.write_record(&req.sandbox, &rec)?;
            }
            Ok::<(), CniError>(())
        }
        .await;
        if let Err(error) = made {
            rec.attachments.truncate(tried);
            return Err(match self.teardown_locked(&req.sandbox, Some(rec)).await {
                Ok(()) => error,
                Err(cleanup) => CniError::Cleanup { error: Box::new(error), cleanup: Box::new(cleanup) },
            });
        }
        let ips = rec.attachments.first().and_then(|a| a.result.as_ref()).map(result_ips).unwrap_or_default();
        tracing::info!(key = req.key, sandbox = req.sandbox, ?ips, "pod network set up");
        self.set_up(&req.sandbox, Some(ips.clone()));
        self.leftover.lock().unwrap_or_else(|p| p.into_inner()).remove(&req.sandbox);
        Ok(ips)
    }

    /// Deletes every attachment (last first), then the namespace's pin and
    /// the record. Nothing recorded: nothing to do. A DEL that fails keeps
    /// the record, for the next try.
    pub async fn teardown(&self, sandbox: &str) -> Result<(), CniError> {
        let lock = self.lock_of(sandbox);
        let _held = lock.lock().await;
        let rec = self.read_record(sandbox)?;
        self.teardown_locked(sandbox, rec).await
    }

    async fn teardown_locked(&self, sandbox: &str, rec: Option<Record>) -> Result<(), CniError> {
        self.set_up(sandbox, None);
        let netns = self.cfg.netns_path(sandbox);
        if let Some(rec) = &rec {
            // A pin that is not mounted is no namespace (a kill -9 between
            // the record and the mount, or a reboot): CNI's DEL then gets an
            // empty CNI_NETNS, which the spec has plugins accept (they free
            // the address and the host side); given the bare file, the
            // bridge plugin refuses it forever and the record never goes.
            let del_ns = if is_mounted(&*self.host, &netns) { netns.clone() } else { PathBuf::new() };
            for a in rec.attachments.iter().rev() {
                self.del(rec.cni_id(sandbox), &del_ns, a).await?;
            }
        }
        remove_netns(&*self.host, &netns)?;
        // A `hostUsers: false` pod's user namespace, pinned beside it.
        let user_pin = self.cfg.userns_path(sandbox);
        if user_pin.exists() {
            remove_netns(&*self.host, &user_pin)?;
        }
        let path = self.record_path(sandbox);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(CniError::Io { path, source }),
        }
        if let Some(rec) = rec {
            tracing::info!(key = rec.key, sandbox, "pod network removed");
        }
        Ok(())
    }

    /// CHECK on every attachment of an adopted pod; its addresses.
    pub async fn check(&self, sandbox: &str) -> Result<Vec<String>, CniError> {
        let lock = self.lock_of(sandbox);
        let _held = lock.lock().await;
        let netns = self.cfg.netns_path(sandbox);
        let Some(rec) = self.read_record(sandbox)? else {
            return Err(CniError::Netns { path: netns, reason: "no record of this pod's network".into() });
        };
        // Held from now on whatever CHECK says: the record is what removes it.
        let ips = rec.attachments.first().and_then(|a| a.result.as_ref()).map(result_ips).unwrap_or_default();
        self.set_up(sandbox, Some(ips.clone()));
        self.leftover.lock().unwrap_or_else(|p| p.into_inner()).remove(sandbox);
        if !is_mounted(&*self.host, &netns) {
            return Err(CniError::Netns { path: netns, reason: "not mounted".into() });
        }
        for a in &rec.attachments {
            let Some(result) = &a.result else {
                return Err(CniError::Netns { path: netns, reason: format!("{} was never fully added", a.ifname) });
            };
            for plugin in plugins_of(&a.config) {
                let env = plugin_env(Command::Check, rec.cni_id(sandbox), &netns, &a.ifname, &self.cfg.bin_dirs);
                let input = plugin_input(&a.config, plugin, Some(result));
                exec_plugin(&*self.host, &self.cfg, plugin_type(plugin), env, &input, Command::Check).await?;
            }
        }
        Ok(ips)
    }

    /// Every sandbox with a record or a pinned namespace (an earlier agent's).
    fn recorded(&self) -> Result<Vec<String>, CniError> {
        let mut out = std::collections::BTreeSet::new();
        for (dir, suffix) in [(&self.state_dir, ".json"), (&self.cfg.netns_dir, "")] {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(CniError::Io { path: dir.clone(), source }),
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str().and_then(|n| n.strip_suffix(suffix)) else { continue };
                // Only ours: `sandbox_id`'s shape (another tool may share the folder).
                if name.len() == 25
                    && (name.starts_with('p') || is_warm_id(name))
                    && name[1..].bytes().all(|b| b.is_ascii_hexdigit())
                {
                    out.insert(name.to_string());
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Keeps `n` networks made ahead (0: none). `refill` makes them.
    pub fn keep_warm(&self, n: usize) {
        self.warm_target.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many networks are made ahead now.
    pub fn warm_count(&self) -> usize {
        self.warm.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Makes networks ahead until `keep_warm`'s number are waiting; one
    /// refill at a time (a second call returns at once). A failure ends
    /// this refill (the next one tries again).
    pub async fn refill(&self) {
        use std::sync::atomic::Ordering;
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        while self.warm_count() < self.warm_target.load(Ordering::Relaxed) && self.settled() {
            let id = warm_id();
            let req = PodNetRequest { key: WARM_KEY.into(), sandbox: id.clone(), netdevs: Vec::new(), userns: None };
            let made = {
                let lock = self.lock_of(&id);
                let _held = lock.lock().await;
                let made = self.setup_locked(&req, false).await;
                // Held by the pool, not by a pod: never in `up`.
                self.set_up(&id, None);
                made
            };
            if let Err(e) = made {
                tracing::warn!(error = %e, "cannot make a pod network ahead");
                break;
            }
            let config =
                self.read_record(&id).ok().flatten().and_then(|r| r.attachments.into_iter().next()).map(|a| a.config);
            if self.warm_target.load(Ordering::Relaxed) == 0 {
                // Drained while this one was made.
                if self.teardown(&id).await.is_err() {
                    self.leftover.lock().unwrap_or_else(|p| p.into_inner()).insert(id, std::time::Instant::now());
                }
                break;
            }
            match config {
                Some(config) => self.warm.lock().unwrap_or_else(|p| p.into_inner()).push(Warm { id, config }),
                None => {
                    self.leftover.lock().unwrap_or_else(|p| p.into_inner()).insert(id, std::time::Instant::now());
                    break;
                }
            }
        }
        self.refilling.store(false, Ordering::Release);
    }

    /// Removes every network made ahead and makes no more (the agent is
    /// stopping: they are no pod's, and a later agent with another data dir
    /// would never find their records). A failed removal is logged; a
    /// restart with this data dir removes what is left.
    pub async fn drain_warm(&self) {
        self.keep_warm(0);
        let warm: Vec<Warm> = std::mem::take(&mut *self.warm.lock().unwrap_or_else(|p| p.into_inner()));
        for w in warm {
            if let Err(e) = self.teardown(&w.id).await {
                tracing::warn!(warm = w.id, error = %e, "cannot remove a pod network made ahead");
            }
        }
    }

    /// Whether the node's network is what its pods will get: Pinion's
    /// default network waits for the node's own range (made on the file's
    /// range, a warm network would also give the bridge that range's
    /// gateway address, which the node's range then conflicts with).
    fn settled(&self) -> bool {
        let Ok(network) = load_config(&self.cfg.conf_dir) else { return false };
        network.name != DEFAULT_NAME
            || crate::peers::read_own_cidr(&self.state_dir.join(crate::peers::OWN_CIDR_FILE)).is_some()
    }

    /// Hands a warm network made with `network` to the pod: its namespace
    /// pinned at the pod's path, its record renamed to the pod's (the
    /// leases stay under the warm id, kept in the record). A warm network
    /// made with another configuration (the node's range arrived since) is
    /// left over, for the background removal. `None`: none to take.
    fn take_warm(&self, req: &PodNetRequest, network: &Value) -> Option<Vec<String>> {
        loop {
            let w = {
                let mut warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
                if warm.is_empty() {
                    return None;
                }
                warm.remove(0)
            };
            if &w.config != network {
                self.leftover.lock().unwrap_or_else(|p| p.into_inner()).insert(w.id, std::time::Instant::now());
                continue;
            }
            match self.hand_over(&w.id, req) {
                Ok(ips) => {
                    tracing::info!(
                        key = req.key,
                        sandbox = req.sandbox,
                        warm = w.id,
                        ?ips,
                        "pod network set up (made ahead)"
                    );
                    self.set_up(&req.sandbox, Some(ips.clone()));
                    return Some(ips);
                }
                Err(e) => {
                    tracing::warn!(key = req.key, warm = w.id, error = %e, "cannot hand a network made ahead to the pod");
                    self.leftover.lock().unwrap_or_else(|p| p.into_inner()).insert(w.id, std::time::Instant::now());
                }
            }
        }
    }

    /// The steps of `take_warm`: the warm network moved to the pod's pin
    /// and record.
    fn hand_over(&self, warm: &str, req: &PodNetRequest) -> Result<Vec<String>, CniError> {
        let rec = self.move_network(warm, &req.sandbox, &req.key)?;
        Ok(rec.attachments.first().and_then(|a| a.result.as_ref()).map(result_ips).unwrap_or_default())
    }

    /// Moves a network from one sandbox id to another: its namespace
    /// pinned at the new path, its record renamed (the leases stay under
    /// the id ADD used, kept in the record). Each step leaves what a
    /// restart cleans up: the new pin without a record is removed, a
    /// record (renamed or not) is deleted under its CNI id.
    fn move_network(&self, from: &str, to: &str, key: &str) -> Result<Record, CniError> {
        let from_pin = self.cfg.netns_path(from);
        let to_pin = self.cfg.netns_path(to);
        let mut rec = self
            .read_record(from)?
            .ok_or_else(|| CniError::Netns { path: from_pin.clone(), reason: "the network has no record".into() })?;
        std::fs::File::create(&to_pin).map_err(|source| CniError::Io { path: to_pin.clone(), source })?;
        let source = from_pin.to_string_lossy();
        let bind = crate::host::MountRequest {
            source: &source,
            target: &to_pin,
            fstype: "",
            flags: nix::mount::MsFlags::MS_BIND,
            data: "",
        };
        if let Err(e) = self.host.mount(&bind) {
            let _ = std::fs::remove_file(&to_pin);
            return Err(CniError::Netns { path: to_pin, reason: format!("bind mount of {}: {e}", from_pin.display()) });
        }
        rec.cni_id = Some(rec.cni_id(from).to_string());
        rec.key = key.to_string();
        rec.netns = to_pin.clone();
        // The results name the namespace by its pin; CHECK compares.
        for a in &mut rec.attachments {
            let interfaces = a.result.as_mut().and_then(|r| r.get_mut("interfaces")).and_then(Value::as_array_mut);
            for i in interfaces.into_iter().flatten() {
                if i.get("sandbox").and_then(Value::as_str) == Some(&*source) {
                    i["sandbox"] = Value::String(to_pin.to_string_lossy().into_owned());
                }
            }
        }
        self.write_record(from, &rec)?;
        let (old, new) = (self.record_path(from), self.record_path(to));
        std::fs::rename(&old, &new).map_err(|source| CniError::Io { path: new.clone(), source })?;
        crate::fsutil::sync_dir(&self.state_dir)
            .map_err(|source| CniError::Io { path: self.state_dir.clone(), source })?;
        remove_netns(&*self.host, &from_pin)?;
        Ok(rec)
    }

    /// `remove`, except that a network its pod could not have changed
    /// (`reusable`: the agent knows the pod held no capability that
    /// configures a network) and that holds no socket any more goes back
    /// to the networks made ahead while
    /// they are fewer than twice `keep_warm`'s number: the next pod takes
    /// it with its address, and neither DEL nor a refill's ADD runs (the
    /// plugins' processes were most of a queue's work on the node's
    /// reserved CPUs). Anything unusual (another configuration since, a
    /// device or user namespace attached, a half-made record) is removed.
    pub async fn release(&self, sandbox: &str, reusable: bool) -> Result<(), CniError> {
        if reusable && self.reuse(sandbox).await {
            self.leftover.lock().unwrap_or_else(|p| p.into_inner()).remove(sandbox);
            self.removing.lock().unwrap_or_else(|p| p.into_inner()).remove(sandbox);
            return Ok(());
        }
        self.remove(sandbox).await
    }

    async fn reuse(&self, sandbox: &str) -> bool {
        let lock = self.lock_of(sandbox);
        let _held = lock.lock().await;
        let target = self.warm_target.load(std::sync::atomic::Ordering::Relaxed);
        if target == 0 || self.warm_count() >= 2 * target {
            return false;
        }
        let Ok(Some(rec)) = self.read_record(sandbox) else { return false };
        let Ok(config) = load_config(&self.cfg.conf_dir) else { return false };
        let own = crate::peers::read_own_cidr(&self.state_dir.join(crate::peers::OWN_CIDR_FILE));
        let network = in_own_range(config, own).to_value();
        let whole = matches!(rec.attachments.as_slice(), [a] if a.result.is_some() && a.config == network);
        let pin = self.cfg.netns_path(sandbox);
        if !whole || !is_mounted(&*self.host, &pin) || self.cfg.userns_path(sandbox).exists() {
            return false;
        }
        // A socket the pod's processes left to the kernel (a TCP
        // connection in TIME_WAIT holds its port for a minute) would be the
        // next pod's: a server of it could not bind that port.
        let (host, at) = (self.host.clone(), pin.clone());
        match tokio::task::spawn_blocking(move || host.netns_sockets(&at)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => {
                tracing::debug!(sandbox, sockets = n, "pod network still holds sockets; removed, not kept");
                return false;
            }
            Ok(Err(e)) => {
                tracing::debug!(sandbox, error = %e, "cannot read a pod network's sockets; removed, not kept");
                return false;
            }
            Err(_) => return false,
        }
        let id = warm_id();
        match self.move_network(sandbox, &id, WARM_KEY) {
            Ok(_) => {
                self.set_up(sandbox, None);
                tracing::info!(key = rec.key, sandbox, warm = id, "pod network kept for the next pod");
                self.warm.lock().unwrap_or_else(|p| p.into_inner()).push(Warm { id, config: network });
                true
            }
            Err(e) => {
                // What the move made under the new id goes in the background.
                tracing::warn!(key = rec.key, sandbox, error = %e, "cannot keep a pod network for the next pod");
                self.leftover.lock().unwrap_or_else(|p| p.into_inner()).insert(id, std::time::Instant::now());
                false
            }
        }
    }

    async fn add(&self, sandbox: &str, netns: &Path, a: &Attachment) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for plugin in plugins_of(&a.config) {
            let env = plugin_env(Command::Add, sandbox, netns, &a.ifname, &self.cfg.bin_dirs);
            let input = plugin_input(&a.config, plugin, prev.as_ref());
            let kind = plugin_type(plugin);
            let result = exec_plugin(&*self.host, &self.cfg, kind, env, &input, Command::Add).await?;
            prev = Some(result.ok_or_else(|| CniError::Plugin {
                plugin: kind.into(),
                command: "ADD",
                message: "no result on stdout".into(),
            })?);
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    async fn del(&self, sandbox: &str, netns: &Path, a: &Attachment) -> Result<(), CniError> {
        for plugin in plugins_of(&a.config).into_iter().rev() {
            let env = plugin_env(Command::Del, sandbox, netns, &a.ifname, &self.cfg.bin_dirs);
            let input = plugin_input(&a.config, plugin, a.result.as_ref());
            exec_plugin(&*self.host, &self.cfg, plugin_type(plugin), env, &input, Command::Del).await?;
        }
        Ok(())
    }

    fn record_path(&self, sandbox: &str) -> PathBuf {
        self.state_dir.join(format!("{sandbox}.json"))
    }

    fn read_record(&self, sandbox: &str) -> Result<Option<Record>, CniError> {
        let path = self.record_path(sandbox);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CniError::Io { path, source }),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| CniError::Config {
            path,
            field: "(file)".into(),
            reason: format!("not a pod network record: {e}"),
        })
    }

    fn write_record(&self, sandbox: &str, rec: &Record) -> Result<(), CniError> {
        let path = self.record_path(sandbox);
        // The records hold the pod's addresses and the plugins' config.
        crate::fsutil::private_dir(&self.state_dir)
            .map_err(|source| CniError::Io { path: self.state_dir.clone(), source })?;
        let bytes = serde_json::to_vec_pretty(rec).map_err(|e| CniError::Io {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?;
        write_atomic(&path, &bytes).map_err(|source| CniError::Io { path, source })
    }
}

pub(crate) fn plugins_of(config: &Value) -> Vec<&Map<String, Value>> {
    config.get("plugins").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_object).collect()
}

/// The attachment that moves a host interface into the pod (CNI `host-device`).
fn host_device_config(host: &str) -> Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "pinion-netdev",
        "plugins": [{ "type": "host-device", "device": host }],
    })
}

// ---------------------------------------------------------------------------
// Pinned network namespaces

/// Whether `path` is a mount point (a pinned namespace).
fn is_mounted(host: &dyn Host, path: &Path) -> bool {
    host.mount_points().iter().any(|m| m == path)
}

/// A new network namespace, bind-mounted on `path`, with `lo` up. Made on a
/// thread of its own, which alone enters the namespace and then ends. With
/// `owner` (a pod's root host id and where to pin its user namespace): the
/// network namespace belongs to that new user namespace, pinned there too.
async fn create_netns(host: &Arc<dyn Host>, path: &Path, owner: Option<(u32, PathBuf)>) -> Result<(), CniError> {
    let path = path.to_path_buf();
    let err = |path: &Path, reason: String| CniError::Netns { path: path.to_path_buf(), reason };
    let mut pins = vec![path.clone()];
    pins.extend(owner.as_ref().map(|(_, p)| p.clone()));
    for pin in &pins {
        if let Some(dir) = pin.parent() {
            std::fs::create_dir_all(dir).map_err(|source| CniError::Io { path: dir.to_path_buf(), source })?;
        }
        std::fs::File::create(pin).map_err(|source| CniError::Io { path: pin.clone(), source })?;
    }
    let (target, pinner) = (path.clone(), host.clone());
    let made = tokio::task::spawn_blocking(move || match owner {
        None => pinner.pin_new_netns(&target),
        Some((base, user_pin)) => pinner.pin_pod_netns(base, &user_pin, &target),
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    if let Err(reason) = made {
        for pin in &pins {
            let _ = remove_netns(&**host, pin);
        }
        return Err(err(&path, reason));
    }
    Ok(())
}

/// Unmounts and removes a pin; absent is fine.
fn remove_netns(host: &dyn Host, path: &Path) -> Result<(), CniError> {
    match host.unmount(path) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(CniError::Netns { path: path.to_path_buf(), reason: format!("unmount: {e}") }),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CniError::Io { path: path.to_path_buf(), source }),
    }
}

// ---------------------------------------------------------------------------
// The default network

/// The network `pinion up` writes when the folder holds none: a bridge
/// `pinion0` that is the pods' gateway, host-local addresses from the
/// node's own pod range (`in_own_range`; the file's /16, which common ranges
/// (Docker's 172.17/16, Kubernetes' 10.96/12 and 10.244/16, podman's
/// 10.88/16, home 192.168/16) leave alone, stands in until the node has
/// one); the node masquerades what its pods send beyond the pod ranges
/// (`crate::routes::masquerade`), so they reach past the node with no route
/// set up for them upstream.
fn default_network() -> Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": DEFAULT_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "pinion0",
                "isGateway": true,
                // The node masquerades its range, one rule per range
                // (`crate::routes`): the plugin's per-pod rule would also
                // hide a pod's address from pods on other nodes.
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": DEFAULT_SUBNET }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": DEFAULT_IPAM_DIR,
                },
            },
        ],
    })
}

/// The default network's subnet in its file: the cluster's default range
/// (`specs::net::DEFAULT_CLUSTER_RANGE`), for a node without a range of its
/// own (not joined, or not registered yet); one with a range uses that.
pub const DEFAULT_SUBNET: &str = specs::net::DEFAULT_CLUSTER_RANGE;
/// The default network's name: the one whose range is the node's own.
const DEFAULT_NAME: &str = "pinion";
/// host-local's leases for the default network (its own default is /var/lib/cni/networks).
const DEFAULT_IPAM_DIR: &str = "/var/lib/cni/networks";
const DEFAULT_FILE: &str = "10-pinion.conflist";

/// Whether the network configured in `dir` is Pinion's default one (named
/// `pinion`): the node's own range, its masquerade and routes to peers are
/// then Pinion's to keep (`crate::routes`).
pub fn uses_default_network(dir: &Path) -> bool {
    load_config(dir).is_ok_and(|n| n.name == DEFAULT_NAME)
}

/// Writes `default_network` as `dir/10-pinion.conflist` (temp file, fsync,
/// rename) when `dir` holds no configuration; the file written, if any.
pub fn write_default(dir: &Path) -> Result<Option<PathBuf>, CniError> {
    if config_file(dir)?.is_some() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir).map_err(|source| CniError::Io { path: dir.to_path_buf(), source })?;
    let path = default_path(dir);
    write_atomic(&path, &default_bytes()).map_err(|source| CniError::Io { path: path.clone(), source })?;
    Ok(Some(path))
}

/// The default network (the one named `pinion`, whichever file holds it)
/// with its host-local IPv4 ranges made the node's own pod range `own`, as
/// it is loaded for a pod: so the file `pinion up` writes stays the same on
/// every node, and the bridge's gateway is the range's first address
/// (host-local's default). Any other network, or no range yet: as it is.
fn in_own_range(mut network: NetworkConfig, own: Option<specs::net::Ipv4Net>) -> NetworkConfig {
    let Some(own) = own else { return network };
    if network.name != DEFAULT_NAME {
        return network;
    }
    let is_v4 = |v: &Value| v.as_str().is_some_and(|s| s.parse::<specs::net::Ipv4Net>().is_ok());
    for plugin in &mut network.plugins {
        let Some(Value::Object(ipam)) = plugin.get_mut("ipam") else { continue };
        if ipam.get("type").and_then(Value::as_str) != Some("host-local") {
            continue;
        }
        // The older single-range form, then `ranges` (sets of ranges).
        if ipam.get("subnet").is_some_and(is_v4) {
            ipam.insert("subnet".into(), Value::String(own.to_string()));
            for k in ["rangeStart", "rangeEnd", "gateway"] {
                ipam.remove(k);
            }
        }
        let Some(Value::Array(sets)) = ipam.get_mut("ranges") else { continue };
        for range in sets.iter_mut().filter_map(Value::as_array_mut).flatten() {
            let Some(range) = range.as_object_mut() else { continue };
            if range.get("subnet").is_some_and(is_v4) {
                range.insert("subnet".into(), Value::String(own.to_string()));
                // Bounds of the file's range would fall outside the node's.
                for k in ["rangeStart", "rangeEnd", "gateway"] {
                    range.remove(k);
                }
            }
        }
    }
    network
}

/// Where `write_default` writes in `dir`.
pub fn default_path(dir: &Path) -> PathBuf {
    dir.join(DEFAULT_FILE)
}

/// The default network's file, byte for byte as `write_default` writes it:
/// `pinion down` removes a file only when it is this one.
pub fn default_bytes() -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(&default_value()).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The default network as a configuration list (what `pinion up` checks
/// the host against before writing it, `crate::netcheck`).
pub(crate) fn default_value() -> Value {
    default_network()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;
    use crate::host::{Call, PluginOutput, Recorder};

    #[test]
    fn config_selection() {
        let check = |names: &[&str], want: Option<&str>| {
            assert_eq!(first_config(names.iter().copied()), want, "{names:?}");
        };
        check(&[], None);
        check(&["README", "x.yaml"], None);
        check(&["20-b.conf", "10-a.conflist"], Some("10-a.conflist"));
        check(&["99.json", "10.conf", "05.conf.bak"], Some("10.conf"));
        check(&[".10-hidden.conflist", "50.conflist"], Some("50.conflist"));
        check(&["B.conf", "a.conf"], Some("B.conf"));
    }

    #[test]
    fn config_parsing_names_file_and_field() {
        let path = Path::new("/x/10.conflist");
        let check = |text: &str, want: Result<(&str, usize), &str>| {
            let got = parse_config(path, text.as_bytes());
            match (want, got) {
                (Ok((name, n)), Ok(c)) => {
                    assert_eq!((c.name.as_str(), c.plugins.len()), (name, n), "{text}");
                }
                (Err(field), Err(e)) => {
                    let msg = e.to_string();
                    assert!(msg.starts_with("/x/10.conflist: "), "{msg}");
                    assert!(matches!(&e, CniError::Config { field: f, .. } if f == field), "{text}: {msg}");
                }
                (want, got) => panic!("{text}: want {want:?}, got {got:?}"),
            }
        };
        let good = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#;
        check(good, Ok(("n", 2)));
        check(r#"{"cniVersion":"1.0.0","name":"single","type":"bridge"}"#, Ok(("single", 1)));
        check("{", Err("(file)"));
        check("[]", Err("(file)"));
        check(r#"{"name":"n","plugins":[{"type":"bridge"}]}"#, Err("cniVersion"));
        check(r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#, Err("name"));
        check(r#"{"cniVersion":"1.0.0","name":"a b","plugins":[{"type":"bridge"}]}"#, Err("name"));
        check(r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#, Err("plugins"));
        check(r#"{"cniVersion":"1.0.0","name":"n","plugins":{}}"#, Err("plugins"));
        check(r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"mtu":1}]}"#, Err("plugins[1].type"));
        check(r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../bin/sh"}]}"#, Err("plugins[0].type"));
        check(r#"{"cniVersion":"1.0.0","name":"n"}"#, Err("type"));
    }

    #[test]
    fn result_addresses() {
        let check = |result: Value, want: &[&str]| assert_eq!(result_ips(&result), want, "{result}");
        check(serde_json::json!({}), &[]);
        check(
            serde_json::json!({
                "interfaces": [{"name": "pinion0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/x"}],
                "ips": [{"address": "10.213.0.5/16", "gateway": "10.213.0.1", "interface": 2}],
            }),
            &["10.213.0.5"],
        );
        // An address on a host-side interface is not the pod's.
        check(
            serde_json::json!({
                "interfaces": [{"name": "pinion0"}, {"name": "eth0", "sandbox": "/run/x"}],
                "ips": [{"address": "10.0.0.1/24", "interface": 0}, {"address": "fd00::5/64", "interface": 1}],
            }),
            &["fd00::5"],
        );
        // No interface index: every address counts; garbage does not.
        check(serde_json::json!({"ips": [{"address": "192.0.2.7/24"}, {"address": "nope"}]}), &["192.0.2.7"]);
    }

    #[test]
    fn environment_and_input() {
        let env = plugin_env(
            Command::Del,
            "p1",
            Path::new("/run/pinion/netns/p1"),
            "net1",
            &[PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")],
        );
        let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let want: BTreeMap<&str, &str> = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "p1"),
            ("CNI_NETNS", "/run/pinion/netns/p1"),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/usr/lib/cni:/opt/cni/bin"),
        ]
        .into();
        assert_eq!(env, want);
        let list =
            serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge", "name": "ignored"}]});
        let plugin = plugins_of(&list)[0];
        let prev = serde_json::json!({"ips": []});
        let input = plugin_input(&list, plugin, Some(&prev));
        assert_eq!(
            input,
            serde_json::json!({"type": "bridge", "name": "n", "cniVersion": "1.0.0", "prevResult": {"ips": []}})
        );
        assert!(plugin_input(&list, plugin, None).get("prevResult").is_none());
    }

    #[test]
    fn sandbox_ids_are_plain_and_differ_by_uid() {
        let a = sandbox_id("default/web", "u1");
        assert_eq!(a.len(), 25);
        assert!(a.starts_with('p') && a[1..].bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, sandbox_id("default/web", "u2"));
        assert_ne!(a, sandbox_id("default/we", "bu1"));
    }

    #[test]
    fn plugin_errors_read_the_cni_error_first() {
        let check = |code, out: &str, err: &str, want: &str| {
            assert_eq!(plugin_message(code, out.as_bytes(), err.as_bytes()), want)
        };
        check(Some(1), r#"{"code":7,"msg":"bad ipam","details":"no subnet"}"#, "", "bad ipam: no subnet (CNI error 7)");
        check(Some(1), r#"{"msg":"x"}"#, "noise", "x");
        check(Some(2), "", "boom\n", "exit code 2: boom");
        check(None, "", "", "killed by a signal");
    }

    /// A node's pod networks on a double of the host: a bridge + portmap
    /// network, the plugins (and `host-device`) in `/opt/cni/bin`.
    struct Nets {
        _dir: tempfile::TempDir,
        host: Arc<Recorder>,
        nets: PodNetworks,
        netns: PathBuf,
        record: PathBuf,
    }

    fn nets(host: Recorder) -> Nets {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        std::fs::create_dir_all(&conf).unwrap();
        let list = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#;
        std::fs::write(conf.join("10-n.conflist"), list).unwrap();
        let mut cfg = CniConfig::new(conf, vec![PathBuf::from("/opt/cni/bin")]);
        cfg.netns_dir = dir.path().join("netns");
        let host = Arc::new(host);
        let nets = PodNetworks::with_host(cfg, dir.path().join("state"), host.clone()).unwrap();
        let netns = nets.config().netns_path(&sandbox());
        let record = nets.record_path(&sandbox());
        Nets { _dir: dir, host, nets, netns, record }
    }

    fn plugins(host: Recorder, names: &[&str]) -> Recorder {
        names.iter().fold(host, |h, n| h.file(format!("/opt/cni/bin/{n}"), ""))
    }

    fn sandbox() -> String {
        sandbox_id("default/web", "u1")
    }

    fn request(netdevs: &[(&str, &str)]) -> PodNetRequest {
        let netdevs = netdevs.iter().map(|(h, i)| (h.to_string(), i.to_string())).collect();
        PodNetRequest { key: "default/web".into(), sandbox: sandbox(), netdevs, userns: None }
    }

    fn refused(msg: &str) -> PluginOutput {
        PluginOutput { code: Some(1), stdout: format!(r#"{{"code":11,"msg":"{msg}"}}"#).into_bytes(), stderr: vec![] }
    }

    /// The calls, by what they do (the paths are the fixture's).
    #[derive(Debug, Clone, Copy)]
    enum Did {
        Pin,
        Unpin,
        Add(&'static str, &'static str),
        Del(&'static str, &'static str),
    }

    fn calls(n: &Nets, did: &[Did]) -> Vec<Call> {
        did.iter()
            .map(|d| match *d {
                Did::Pin => Call::PinNetns(n.netns.clone()),
                Did::Unpin => Call::Unmount(n.netns.clone()),
                Did::Add(plugin, ifname) => Call::plugin(plugin, "ADD", ifname),
                Did::Del(plugin, ifname) => Call::plugin(plugin, "DEL", ifname),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_failed_pod_network_setup_undoes_what_it_did() {
        use nix::errno::Errno;
        use Did::*;
        let all = |h: Recorder| plugins(h, &["bridge", "portmap", "host-device"]);
        struct Case {
            name: &'static str,
            host: Recorder,
            netdevs: &'static [(&'static str, &'static str)],
            /// `None`: set up.
            error: Option<&'static str>,
            calls: &'static [Did],
            /// The record and the pin are left (set up, or a cleanup that failed).
            left: bool,
        }
        let cases = [
            Case {
                name: "set up",
                host: all(Recorder::default()),
                netdevs: &[("ens1f0v1", "net1")],
                error: None,
                calls: &[Pin, Add("bridge", "eth0"), Add("portmap", "eth0"), Add("host-device", "net1")],
                left: true,
            },
            Case {
                name: "the second plugin's ADD fails: both are deleted, last first, then the pin",
                host: all(Recorder::default()).plugin("portmap", "ADD", refused("no chain")),
                netdevs: &[],
                error: Some("CNI plugin portmap ADD failed: no chain (CNI error 11)"),
                calls: &[
                    Pin,
                    Add("bridge", "eth0"),
                    Add("portmap", "eth0"),
                    Del("portmap", "eth0"),
                    Del("bridge", "eth0"),
                    Unpin,
                ],
                left: false,
            },
            Case {
                name: "a device's ADD fails: every attachment is deleted",
                host: all(Recorder::default()).plugin("host-device", "ADD", refused("no such device")),
                netdevs: &[("ens1f0v1", "net1")],
                error: Some("CNI plugin host-device ADD failed: no such device"),
                calls: &[
                    Pin,
                    Add("bridge", "eth0"),
                    Add("portmap", "eth0"),
                    Add("host-device", "net1"),
                    Del("host-device", "net1"),
                    Del("portmap", "eth0"),
                    Del("bridge", "eth0"),
                    Unpin,
                ],
                left: false,
            },
            Case {
                name: "the namespace cannot be made: no plugin runs",
                host: all(Recorder::default()).fail_first(|c| matches!(c, Call::PinNetns(_)), Errno::EPERM),
                netdevs: &[],
                error: Some("unshare: EPERM"),
                // Its own cleanup, then the setup's.
                calls: &[Pin, Unpin, Unpin],
                left: false,
            },
            Case {
                name: "a plugin is missing: nothing is made",
                host: plugins(Recorder::default(), &["bridge"]),
                netdevs: &[],
                error: Some("CNI plugin \"portmap\" not found in /opt/cni/bin"),
                calls: &[],
                left: false,
            },
            Case {
                name: "the cleanup's DEL fails too: both errors, the record and pin kept for the next try",
                host: all(Recorder::default()).plugin("portmap", "ADD", refused("no chain")).plugin(
                    "portmap",
                    "DEL",
                    refused("busy"),
                ),
                netdevs: &[],
                error: Some("no chain (CNI error 11); cleaning up after it: CNI plugin portmap DEL failed: busy"),
                calls: &[Pin, Add("bridge", "eth0"), Add("portmap", "eth0"), Del("portmap", "eth0")],
                left: true,
            },
        ];
        for case in cases {
            let n = nets(case.host);
            let got = n.nets.setup(&request(case.netdevs)).await;
            match (&got, case.error) {
                (Ok(_), None) => {}
                (Err(e), Some(text)) => assert!(e.to_string().contains(text), "{}: {e}", case.name),
                (got, want) => panic!("{}: got {got:?}, want {want:?}", case.name),
            }
            assert_eq!(n.host.calls(), calls(&n, case.calls), "{}", case.name);
            assert_eq!(n.record.exists(), case.left, "{}: the record", case.name);
            assert_eq!(n.host.is_mounted(&n.netns), case.left, "{}: the pin", case.name);
            assert_eq!(n.netns.exists(), case.left, "{}: the pin's file", case.name);
        }
    }

    /// `hostUsers: false`: the pod's user namespace is pinned beside the
    /// network namespace (which it owns) and goes with it.
    #[tokio::test]
    async fn a_user_namespace_pod_network_pins_both_and_removes_both() {
        let n = nets(plugins(Recorder::default(), &["bridge", "portmap"]));
        let mut req = request(&[]);
        req.userns = Some(crate::runtime::userns::base_of(3));
        n.nets.setup(&req).await.unwrap();
        let user_pin = n.netns.with_file_name("").with_file_name("userns").join(sandbox());
        assert!(n.host.is_mounted(&n.netns) && n.host.is_mounted(&user_pin), "{:?}", n.host.calls());
        // Adopted as set up while both are pinned.
        n.host.take_calls();
        n.nets.setup(&req).await.unwrap();
        assert_eq!(n.host.take_calls(), []);
        n.nets.teardown(&sandbox()).await.unwrap();
        assert!(!n.host.is_mounted(&n.netns) && !n.host.is_mounted(&user_pin));
        assert!(!n.netns.exists() && !user_pin.exists());
    }

    #[tokio::test]
    async fn a_pod_network_is_torn_down_last_attachment_first() {
        use Did::*;
        let n = nets(plugins(Recorder::default(), &["bridge", "portmap", "host-device"]));
        n.nets.setup(&request(&[("ens1f0v1", "net1")])).await.unwrap();
        n.host.take_calls();
        // Set up already: nothing runs again.
        n.nets.setup(&request(&[("ens1f0v1", "net1")])).await.unwrap();
        assert_eq!(n.host.take_calls(), []);
        n.nets.teardown(&sandbox()).await.unwrap();
        let want = [Del("host-device", "net1"), Del("portmap", "eth0"), Del("bridge", "eth0"), Unpin];
        assert_eq!(n.host.take_calls(), calls(&n, &want));
        assert!(!n.record.exists() && !n.netns.exists());
        // Nothing recorded: only the (absent) pin is looked at.
        n.nets.teardown(&sandbox()).await.unwrap();
        assert_eq!(n.host.take_calls(), calls(&n, &[Unpin]));
    }

    /// A kill -9 between the record and the mount leaves a record and a
    /// bare file: DEL runs with no namespace (the plugins free what they
    /// hold outside it), and the record and the file go.
    #[tokio::test]
    async fn a_record_whose_namespace_was_never_mounted_is_removed() {
        use Did::*;
        let n = nets(plugins(Recorder::default(), &["bridge", "portmap"]));
        n.nets.setup(&request(&[])).await.unwrap();
        // The namespace gone under the file, as after a kill -9 mid-setup.
        n.host.unmount(&n.netns).unwrap();
        assert!(n.netns.exists() && !n.host.is_mounted(&n.netns));
        n.host.take_calls();
        let before = n.host.plugin_netns().len();
        n.nets.teardown(&sandbox()).await.unwrap();
        assert_eq!(n.host.take_calls(), calls(&n, &[Del("portmap", "eth0"), Del("bridge", "eth0"), Unpin]));
        assert_eq!(n.host.plugin_netns()[before..], ["", ""], "DEL is told there is no namespace");
        assert!(!n.record.exists() && !n.netns.exists());
        // A mounted one is named.
        n.nets.setup(&request(&[])).await.unwrap();
        let before = n.host.plugin_netns().len();
        n.nets.teardown(&sandbox()).await.unwrap();
        let named = n.netns.display().to_string();
        assert_eq!(n.host.plugin_netns()[before..], [named.clone(), named]);
    }

    #[test]
    fn the_default_network_takes_the_nodes_own_range() {
        let subnets = |n: &NetworkConfig| -> Vec<String> {
            n.plugins[0]["ipam"]["ranges"][0].as_array().unwrap().iter().map(|r| r["subnet"].to_string()).collect()
        };
        let own: specs::net::Ipv4Net = "10.213.5.0/24".parse().unwrap();
        let default = parse_config(Path::new("d"), &default_bytes()).unwrap();
        assert_eq!(subnets(&default), ["\"10.213.0.0/16\""]);
        assert_eq!(subnets(&in_own_range(default.clone(), Some(own))), ["\"10.213.5.0/24\""]);
        assert_eq!(in_own_range(default.clone(), None), default, "no range yet: the file's");
        // Bounds and a gateway go with the file's range; IPv6 ranges and
        // other networks are left alone; the older `subnet` form is taken too.
        let file = r#"{"cniVersion":"1.0.0","name":"pinion","plugins":[{"type":"bridge","ipam":{"type":"host-local",
            "ranges":[[{"subnet":"10.213.0.0/16","rangeStart":"10.213.0.10","gateway":"10.213.0.1"}],[{"subnet":"fd00::/64"}]]}},
            {"type":"bridge","ipam":{"type":"host-local","subnet":"10.213.0.0/16","gateway":"10.213.0.1"}}]}"#;
        let fitted = in_own_range(parse_config(Path::new("f"), file.as_bytes()).unwrap(), Some(own));
        assert_eq!(
            fitted.plugins[0]["ipam"]["ranges"],
            serde_json::json!([[{"subnet": "10.213.5.0/24"}], [{"subnet": "fd00::/64"}]])
        );
        assert_eq!(fitted.plugins[1]["ipam"], serde_json::json!({"type": "host-local", "subnet": "10.213.5.0/24"}));
        let other = parse_config(Path::new("o"), file.replace("\"pinion\"", "\"mine\"").as_bytes()).unwrap();
        assert_eq!(in_own_range(other.clone(), Some(own)), other);
    }

    /// A pod's setup loads the default network in the node's range, as the
    /// link recorded it, and records that configuration for its DEL.
    #[tokio::test]
    async fn a_pods_default_network_is_in_the_nodes_range() {
        let n = nets(plugins(Recorder::default(), &["bridge"]));
        let conf = n.nets.config().conf_dir.clone();
        std::fs::remove_file(conf.join("10-n.conflist")).unwrap();
        write_default(&conf).unwrap();
        std::fs::create_dir_all(&n.nets.state_dir).unwrap();
        std::fs::write(n.nets.state_dir.join(crate::peers::OWN_CIDR_FILE), "10.213.9.0/24\n").unwrap();
        n.nets.setup(&request(&[])).await.unwrap();
        let rec: Record = serde_json::from_slice(&std::fs::read(&n.record).unwrap()).unwrap();
        assert_eq!(rec.attachments[0].config["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.213.9.0/24");
    }

    #[test]
    fn default_network_parses_and_is_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        let path = write_default(&conf).unwrap().unwrap();
        let parsed = load_config(&conf).unwrap();
        assert_eq!(parsed.path, path);
        assert_eq!(parsed.plugins.iter().map(plugin_type).collect::<Vec<_>>(), ["bridge"]);
        assert_eq!(write_default(&conf).unwrap(), None, "an existing configuration is kept");
    }
}
