//! Whether this host can run a pod network, and what to say when it cannot.
//!
//! `pinion up` asks before it writes its default network: the plugins the
//! network names (and their IPAM's), the binaries they call (`iptables` for
//! the bridge's masquerade), then the kernel, by running the network's ADD
//! once between two throwaway network namespaces (a bridge and a veth pair
//! made there vanish with them; nothing is made on the host). The agent
//! reads a failed pod network setup the same way (`Unfit::of`), so a node
//! says the same thing whichever of the two found it first: a
//! `PodNetwork=False` condition with its reason and the command that fixes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::cni::{self, CniConfig, CniError};
use crate::host::{Host, RealHost};

/// Limit on each plugin call of the dry run.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why this host cannot run a pod network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// A CNI plugin the network names is in none of the plugin folders.
    PluginMissing { plugin: String, dirs: String },
    /// A program a plugin runs is not on `PATH` (`iptables` for `ipMasq`).
    ToolMissing { tool: String },
    /// The kernel refused what a plugin asked of it (no bridge, no veth).
    KernelUnsupported { message: String },
    /// A device on the host is in the network's way: a bridge of the
    /// network's name holding another address (one an older pinion, or
    /// another tool, made).
    DeviceConflict { device: String, message: String },
    /// The check itself could not run (no network namespace, a plugin hung).
    CannotCheck { message: String },
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::PluginMissing { plugin, dirs } => write!(f, "CNI plugin {plugin:?} not found in {dirs}"),
            Unfit::ToolMissing { tool } => write!(f, "{tool:?}, which the pod network runs, is not on PATH"),
            Unfit::KernelUnsupported { message } => write!(f, "the kernel refused the pod network: {message}"),
            Unfit::DeviceConflict { device, message } => write!(f, "the host's {device} is in the way: {message}"),
            Unfit::CannotCheck { message } => write!(f, "cannot check the pod network: {message}"),
        }
    }
}

impl Unfit {
    /// The condition's reason, one CamelCase word.
    pub fn reason(&self) -> &'static str {
        match self {
            Unfit::PluginMissing { .. } => "CNIPluginMissing",
            Unfit::ToolMissing { .. } => "ToolMissing",
            Unfit::KernelUnsupported { .. } => "KernelUnsupported",
            Unfit::DeviceConflict { .. } => "DeviceConflict",
            Unfit::CannotCheck { .. } => "HostCheckFailed",
        }
    }

    /// The one command that fixes it on a Debian host, when there is one.
    pub fn fix(&self) -> Option<String> {
        match self {
            Unfit::PluginMissing { .. } => Some("apt-get install containernetworking-plugins".into()),
            Unfit::ToolMissing { tool } if tool.starts_with("iptables") => Some("apt-get install iptables".into()),
            Unfit::ToolMissing { .. } => None,
            // A module not loaded yet; a kernel built without them needs another kernel.
            Unfit::KernelUnsupported { .. } => Some("modprobe bridge veth".into()),
            // Nothing of pinion's runs on it any more once its pods are gone.
            Unfit::DeviceConflict { device, .. } => Some(format!("ip link delete {device}")),
            Unfit::CannotCheck { .. } => None,
        }
    }

    /// `PodNetwork=False`: pods get only `lo`, and why.
    pub fn condition(&self) -> specs::api::Condition {
        specs::api::Condition {
            kind: specs::api::POD_NETWORK.into(),
            status: specs::api::ConditionStatus::False,
            reason: self.reason().into(),
            message: format!("pods without hostNetwork get only lo: {self}; restart pinion once fixed"),
            fix: self.fix(),
        }
    }

    /// A pod network's failure that is the host's (a plugin or a program
    /// missing, the kernel lacking a feature), or `None` when it is the
    /// configuration's or one pod's (retried as any failed start). A device in
    /// the way counts as the host's: nothing the pod does changes it.
    pub fn of(error: &CniError) -> Option<Unfit> {
        match error {
            CniError::PluginMissing { plugin, dirs } => {
                Some(Unfit::PluginMissing { plugin: plugin.clone(), dirs: dirs.clone() })
            }
            CniError::Plugin { message, .. } => of_message(message),
            CniError::Cleanup { error, .. } => Unfit::of(error),
            _ => None,
        }
    }
}

/// What a plugin's error text says of the host. The bridge plugin says
/// `could not add "pinion0": operation not supported` on a kernel without
/// bridges, `failed to find plugin "host-local" in path [...]` for a
/// missing IPAM plugin, `exec: "iptables": executable file not found in
/// $PATH` without iptables, and `"pinion0" already has an IP address
/// different from ...` when a bridge of that name holds another address.
fn of_message(message: &str) -> Option<Unfit> {
    let lower = message.to_ascii_lowercase();
    let quoted_after = |marker: &str| {
        let rest = &message[lower.find(marker)? + marker.len()..];
        let rest = rest.trim_start().strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_string())
    };
    if lower.contains("operation not supported") || lower.contains("protocol not supported") {
        return Some(Unfit::KernelUnsupported { message: message.to_string() });
    }
    if lower.contains("already has an ip address different from") {
        let device = message[..lower.find("already has an ip address")?]
            .trim_end()
            .rsplit(' ')
            .next()
            .map(|d| d.trim_matches('"').to_string())
            .filter(|d| !d.is_empty() && !d.contains(char::is_whitespace))?;
        return Some(Unfit::DeviceConflict { device, message: message.to_string() });
    }
    if lower.contains("failed to find plugin") {
        let plugin = quoted_after("failed to find plugin").unwrap_or_else(|| "?".into());
        return Some(Unfit::PluginMissing { plugin, dirs: "CNI_PATH".into() });
    }
    if lower.contains("executable file not found") {
        let tool = quoted_after("exec:").unwrap_or_else(|| "?".into());
        return Some(Unfit::ToolMissing { tool });
    }
    None
}

/// The plugins a network runs: each plugin's `type` and its IPAM's.
fn plugins_needed(network: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for plugin in cni::plugins_of(network) {
        out.push(cni::plugin_type(plugin).to_string());
        if let Some(ipam) = plugin.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str) {
            out.push(ipam.to_string());
        }
    }
    out.dedup();
    out
}

/// The programs a network's plugins run from `PATH`.
fn tools_needed(network: &Value) -> Vec<&'static str> {
    let masquerades = cni::plugins_of(network).iter().any(|p| p.get("ipMasq").and_then(Value::as_bool) == Some(true));
    if masquerades {
        vec!["iptables"]
    } else {
        Vec::new()
    }
}

/// The programs the node runs for the default network itself: its
/// masquerade, one chain for the node's range (`crate::routes::masquerade`).
const DEFAULT_NETWORK_TOOLS: [&str; 2] = ["iptables", "iptables-restore"];

/// What `network` needs that `host` lacks, without running anything: its
/// plugins in `cfg`'s folders, and its programs and `tools` in `path`
/// (`PATH`'s folders).
pub(crate) fn lacks(
    host: &dyn Host,
    cfg: &CniConfig,
    network: &Value,
    tools: &[&'static str],
    path: &[PathBuf],
) -> Result<(), Unfit> {
    for plugin in plugins_needed(network) {
        cni::find_plugin(host, &cfg.bin_dirs, &plugin).map_err(|e| Unfit::of(&e).unwrap_or_else(|| cannot(e)))?;
    }
    for tool in tools_needed(network).into_iter().chain(tools.iter().copied()) {
        if !path.iter().any(|d| host.is_file(&d.join(tool))) {
            return Err(Unfit::ToolMissing { tool: tool.into() });
        }
    }
    Ok(())
}

fn cannot(e: impl std::fmt::Display) -> Unfit {
    Unfit::CannotCheck { message: e.to_string() }
}

/// `PATH`'s folders, as the plugins (which inherit it) search them.
fn search_path() -> Vec<PathBuf> {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default()
}

/// Whether this host can run `pinion up`'s default network: its plugins
/// and programs are there, and its ADD succeeds in throwaway namespaces.
/// Needs root (it makes network namespaces). Blocks for at most
/// `CHECK_TIMEOUT` per plugin.
pub fn check_default(cfg: &CniConfig) -> Result<(), Unfit> {
    let network = cni::default_value();
    lacks(&RealHost, cfg, &network, &DEFAULT_NETWORK_TOOLS, &search_path())?;
    dry_run(cfg, &network)
}

/// Whether the operator's network file `path` can run here, as far as
/// can be told without running it (its plugins may reach outside the
/// node): its plugins and programs are there.
pub fn check_file(cfg: &CniConfig, path: &Path) -> Result<(), Unfit> {
    let bytes = std::fs::read(path).map_err(|e| cannot(format!("{}: {e}", path.display())))?;
    let network: Value = serde_json::from_slice(&bytes).map_err(|e| cannot(format!("{}: {e}", path.display())))?;
    // A single plugin's `.conf` is a list of one.
    let network = match network.get("plugins") {
        Some(_) => network,
        None => serde_json::json!({ "plugins": [network] }),
    };
    lacks(&RealHost, cfg, &network, &[], &search_path())
}

/// What `pinion up` did about the pod network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// The folder held none and the host can run the default: written.
    Written(PathBuf),
    /// The folder's network (the operator's, or the default written
    /// before), which the host can run.
    Kept(PathBuf),
    /// The host cannot run it: nothing written, pods get only `lo`.
    Unfit { unfit: Unfit, file: Option<PathBuf> },
}

impl Prepared {
    pub fn unfit(&self) -> Option<&Unfit> {
        match self {
            Prepared::Unfit { unfit, .. } => Some(unfit),
            _ => None,
        }
    }
}

/// `pinion up`'s pod network: the network in `cfg`'s folder when there is
/// one, else the default, written only once the host is known to run it
/// (`check_default`; an operator's network only has its plugins and
/// programs looked for). Blocks (see `check_default`).
pub fn prepare(cfg: &CniConfig) -> Result<Prepared, CniError> {
    let Some(file) = cni::config_file(&cfg.conf_dir)? else {
        return Ok(match check_default(cfg) {
            Ok(()) => match cni::write_default(&cfg.conf_dir)? {
                Some(path) => Prepared::Written(path),
                // Another writer was first.
                None => Prepared::Kept(cni::config_file(&cfg.conf_dir)?.unwrap_or_default()),
            },
            Err(unfit) => Prepared::Unfit { unfit, file: None },
        });
    };
    let bytes = std::fs::read(&file).map_err(|source| CniError::Io { path: file.clone(), source })?;
    let checked = if bytes == cni::default_bytes() { check_default(cfg) } else { check_file(cfg, &file) };
    Ok(match checked {
        Ok(()) => Prepared::Kept(file),
        Err(unfit) => Prepared::Unfit { unfit, file: Some(file) },
    })
}

/// Runs `network`'s ADD with the plugins of `cfg` from a throwaway network
/// namespace (the host side: the bridge, its address, the masquerade
/// rules) into another (the pod side), with the addresses leased in a
/// temporary folder. Both namespaces end with the threads that hold them;
/// nothing is left on the host.
pub fn dry_run(cfg: &CniConfig, network: &Value) -> Result<(), Unfit> {
    let leases = Leases::new()?;
    let mut network = network.clone();
    for plugin in network.get_mut("plugins").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(ipam) = plugin.get_mut("ipam").and_then(Value::as_object_mut) {
            ipam.insert("dataDir".into(), Value::String(leases.0.display().to_string()));
        }
    }
    let mut cfg = cfg.clone();
    cfg.timeout = cfg.timeout.min(CHECK_TIMEOUT);

    // The pod side: a thread in a namespace of its own, which the plugins
    // reach through /proc while it waits.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<PathBuf, String>>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let pod_side = std::thread::spawn(move || {
        let made = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map(|()| PathBuf::from(format!("/proc/{}/task/{}/ns/net", std::process::id(), nix::unistd::gettid())))
            .map_err(|e| format!("unshare: {e}"));
        let ok = made.is_ok();
        let _ = ready_tx.send(made);
        if ok {
            // Until the host side is done (or gone).
            let _ = done_rx.recv();
        }
    });
    let netns = ready_rx.recv().map_err(cannot).and_then(|r| r.map_err(cannot));
    let result = netns.and_then(|netns| {
        // The host side: the plugins run from a thread in another new
        // namespace, and a child starts in its parent thread's namespace.
        std::thread::spawn(move || host_side(&cfg, &network, &netns))
            .join()
            .unwrap_or_else(|_| Err(cannot("the check's thread panicked")))
    });
    let _ = done_tx.send(());
    let _ = pod_side.join();
    result
}

/// host-local's leases of the dry run: a private folder removed on drop.
struct Leases(PathBuf);

impl Leases {
    fn new() -> Result<Leases, Unfit> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!("pinion-netcheck-{}-{nanos}", std::process::id()));
        crate::fsutil::private_dir(&path).map_err(|e| cannot(format!("{}: {e}", path.display())))?;
        Ok(Leases(path))
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn host_side(cfg: &CniConfig, network: &Value, netns: &Path) -> Result<(), Unfit> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| cannot(format!("unshare: {e}")))?;
    // A runtime of this thread's: the plugins it spawns start in this namespace.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(cannot)?;
    rt.block_on(async {
        let mut prev: Option<Value> = None;
        for plugin in cni::plugins_of(network) {
            let kind = cni::plugin_type(plugin);
            let env = cni::plugin_env(cni::Command::Add, "pinion-netcheck", netns, "eth0", &cfg.bin_dirs);
            let input = cni::plugin_input(network, plugin, prev.as_ref());
            let out = cni::exec_plugin(&RealHost, cfg, kind, env, &input, cni::Command::Add)
                .await
                .map_err(|e| Unfit::of(&e).unwrap_or_else(|| cannot(e)))?;
            prev = out;
        }
        Ok(())
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;
    use crate::host::Recorder;

    #[test]
    fn a_failed_pod_network_is_the_hosts_or_not() {
        let plugin =
            |message: &str| CniError::Plugin { plugin: "bridge".into(), command: "ADD", message: message.into() };
        let check = |error: CniError, want: Option<(&str, Option<&str>)>| {
            let got = Unfit::of(&error);
            let got = got.as_ref().map(|u| (u.reason(), u.fix()));
            let want = want.map(|(r, f)| (r, f.map(str::to_string)));
            assert_eq!(got, want, "{error}");
        };
        check(
            CniError::PluginMissing { plugin: "bridge".into(), dirs: "/usr/lib/cni".into() },
            Some(("CNIPluginMissing", Some("apt-get install containernetworking-plugins"))),
        );
        // The QEMU guest's kernel has no bridge.
        check(
            plugin(r#"failed to create bridge "pinion0": could not add "pinion0": operation not supported"#),
            Some(("KernelUnsupported", Some("modprobe bridge veth"))),
        );
        check(
            plugin(r#"failed to find plugin "host-local" in path [/usr/lib/cni]"#),
            Some(("CNIPluginMissing", Some("apt-get install containernetworking-plugins"))),
        );
        check(
            plugin(r#"failed to setup IP masquerade: exec: "iptables": executable file not found in $PATH"#),
            Some(("ToolMissing", Some("apt-get install iptables"))),
        );
        // A bridge an older pinion left with its /16 while the node's range is a /24.
        check(
            plugin(r#"failed to set bridge addr: "pinion0" already has an IP address different from 10.213.0.1/24"#),
            Some(("DeviceConflict", Some("ip link delete pinion0"))),
        );
        // Its own: a bad configuration, an address range used up, a timeout.
        check(plugin("no IP addresses available in range set: 10.213.0.1-10.213.255.254"), None);
        check(CniError::Config { path: "/x.conflist".into(), field: "name".into(), reason: "missing".into() }, None);
        check(CniError::Timeout { plugin: "bridge".into(), command: "ADD", after: Duration::from_secs(30) }, None);
        // Behind a cleanup that failed too, the first error counts.
        let kernel = plugin(r#"could not add "pinion0": operation not supported"#);
        let cleanup = CniError::Cleanup { error: Box::new(kernel), cleanup: Box::new(plugin("busy")) };
        check(cleanup, Some(("KernelUnsupported", Some("modprobe bridge veth"))));
    }

    /// The agent's view: a pod network set up on a host double whose
    /// kernel has no bridge (as the QEMU guest's) fails, leaves nothing,
    /// and reads as the host's fault.
    #[tokio::test]
    async fn a_kernel_without_bridges_is_the_hosts_fault() {
        use crate::host::PluginOutput;
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(
            conf.join("10-n.conflist"),
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let mut cfg = CniConfig::new(conf, vec![PathBuf::from("/cni")]);
        cfg.netns_dir = dir.path().join("netns");
        let refused = PluginOutput {
            code: Some(1),
            stdout: br#"{"code":11,"msg":"failed to create bridge \"pinion0\": could not add \"pinion0\": operation not supported"}"#
                .to_vec(),
            stderr: vec![],
        };
        let host = Recorder::default().file("/cni/bridge", "").plugin("bridge", "ADD", refused);
        let nets = cni::PodNetworks::with_host(cfg, dir.path().join("state"), std::sync::Arc::new(host)).unwrap();
        let req = cni::PodNetRequest {
            key: "default/web".into(),
            sandbox: cni::sandbox_id("default/web", "u"),
            netdevs: vec![],
            userns: None,
        };
        let e = nets.setup(&req).await.expect_err("no bridge in this kernel");
        assert!(matches!(Unfit::of(&e), Some(Unfit::KernelUnsupported { .. })), "{e}");
        assert!(nets.leftovers().is_empty() && !dir.path().join("netns").join(&req.sandbox).exists());
    }

    #[test]
    fn the_missing_part_is_named() {
        let cfg = CniConfig::new(PathBuf::from("/net.d"), vec![PathBuf::from("/cni")]);
        let path = [PathBuf::from("/usr/sbin")];
        let network = cni::default_value();
        let all = || {
            Recorder::default()
                .file("/cni/bridge", "")
                .file("/cni/host-local", "")
                .file("/usr/sbin/iptables", "")
                .file("/usr/sbin/iptables-restore", "")
        };
        let check = |host: Recorder, want: Result<(), Unfit>| {
            assert_eq!(lacks(&host, &cfg, &network, &DEFAULT_NETWORK_TOOLS, &path), want);
        };
        check(all(), Ok(()));
        check(
            Recorder::default().file("/cni/host-local", "").file("/usr/sbin/iptables", ""),
            Err(Unfit::PluginMissing { plugin: "bridge".into(), dirs: "/cni".into() }),
        );
        check(
            Recorder::default().file("/cni/bridge", "").file("/usr/sbin/iptables", ""),
            Err(Unfit::PluginMissing { plugin: "host-local".into(), dirs: "/cni".into() }),
        );
        check(
            Recorder::default().file("/cni/bridge", "").file("/cni/host-local", ""),
            Err(Unfit::ToolMissing { tool: "iptables".into() }),
        );
        check(
            Recorder::default().file("/cni/bridge", "").file("/cni/host-local", "").file("/usr/sbin/iptables", ""),
            Err(Unfit::ToolMissing { tool: "iptables-restore".into() }),
        );
        // No masquerade, no iptables needed.
        let plain = serde_json::json!({"plugins": [{"type": "bridge", "ipam": {"type": "host-local"}}]});
        let host = Recorder::default().file("/cni/bridge", "").file("/cni/host-local", "");
        assert_eq!(lacks(&host, &cfg, &plain, &[], &path), Ok(()));
        // The bridge plugin's own masquerade runs iptables.
        let masq = serde_json::json!({"plugins": [{"type": "bridge", "ipMasq": true, "ipam": {"type": "host-local"}}]});
        assert_eq!(lacks(&host, &cfg, &masq, &[], &path), Err(Unfit::ToolMissing { tool: "iptables".into() }));
    }

    #[test]
    fn the_condition_says_why_and_the_fix() {
        let c = Unfit::PluginMissing { plugin: "bridge".into(), dirs: "/usr/lib/cni:/opt/cni/bin".into() }.condition();
        assert_eq!(
            (c.kind.as_str(), c.status, c.reason.as_str()),
            ("PodNetwork", specs::api::ConditionStatus::False, "CNIPluginMissing")
        );
        assert_eq!(
            c.message,
            "pods without hostNetwork get only lo: CNI plugin \"bridge\" not found in /usr/lib/cni:/opt/cni/bin; \
             restart pinion once fixed"
        );
        assert_eq!(c.fix.as_deref(), Some("apt-get install containernetworking-plugins"));
    }
}
