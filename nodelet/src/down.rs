//! What `pinion down` removes from the host: everything `pinion up` made
//! there. Containers the node still runs (they outlive the agent), every
//! pod network recorded (CNI DEL), the default network's masquerade rules
//! left without a record (the bridge plugin's `CNI-...` chains, found by
//! their comment `name: "pinion"`), the node's own masquerade chain, the
//! routes to peers' pod ranges and the VXLAN device (`crate::routes`), the
//! bridge, its address leases, the network file (only when it is byte for
//! byte the one `up` writes), and with `purge` the data dir. Each step finds nothing to do the second
//! time; each outside program runs within `COMMAND_TIMEOUT`. Refused while
//! an agent holds the node's data dir.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::cni::{CniConfig, PodNetworks};
use crate::runtime::Runtime;

/// Limit on each `iptables` or `ip` call.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Grace of a container still running.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DownError {
    #[error("{path}: an agent (pinion up or pinion agent) is running on this data dir; stop it first")]
    Running { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{program}: {reason}")]
    Command { program: String, reason: String },
}

/// What to remove.
#[derive(Debug, Clone)]
pub struct Down {
    /// `pinion up`'s `--data-dir` (the node's is `node/` inside).
    pub data_dir: PathBuf,
    /// The pod network's configuration folder and plugins.
    pub cni: CniConfig,
    /// The pinion binary, the containers' shim.
    pub shim: PathBuf,
    /// Remove the data dir too.
    pub purge: bool,
}

/// One thing done, or found already done, for the screen.
pub type Step = String;

/// The default network's names on the host: its bridge, its network name
/// (in the masquerade rules' comments) and its leases folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultNames {
    pub bridge: String,
    pub network: String,
    pub leases: PathBuf,
}

impl DefaultNames {
    /// Read from the default network itself, so the two cannot differ.
    pub fn of_default() -> DefaultNames {
        let net = crate::cni::default_value();
        let plugin = net.get("plugins").and_then(|p| p.get(0)).cloned().unwrap_or(Value::Null);
        let text = |v: Option<&Value>, or: &str| v.and_then(Value::as_str).unwrap_or(or).to_string();
        let network = text(net.get("name"), "pinion");
        let ipam_dir = text(plugin.get("ipam").and_then(|i| i.get("dataDir")), "/var/lib/cni/networks");
        DefaultNames {
            bridge: text(plugin.get("bridge"), "pinion0"),
            leases: Path::new(&ipam_dir).join(&network),
            network,
        }
    }
}

/// Holds the node's data dir lock (`agent.lock`) while `down` runs, so no
/// agent starts meanwhile; `None` when no agent ever ran there.
pub fn lock(data_dir: &Path) -> Result<Option<nix::fcntl::Flock<std::fs::File>>, DownError> {
    let path = data_dir.join("node").join("agent.lock");
    let file = match std::fs::OpenOptions::new().write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(DownError::Io { path, source }),
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(Some(held)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(DownError::Running { path: data_dir.to_path_buf() }),
        Err((_, e)) => Err(DownError::Io { path, source: e.into() }),
    }
}

/// Removes what `pinion up` made (see the module). Returns what it did;
/// a step that fails stops it with that error (run it again once fixed).
/// The caller holds `lock`.
pub async fn run(down: &Down) -> Result<Vec<Step>, DownError> {
    let mut steps = Vec::new();
    let node = down.data_dir.join("node");
    let names = DefaultNames::of_default();
    if node.is_dir() {
        stop_containers(&node, &down.shim, &mut steps).await?;
        remove_pod_networks(&node, &down.cni, &mut steps).await;
    }
    // The containers' parent cgroup in every hierarchy, now that none is left.
    let parent = std::path::Path::new(crate::runtime::libcontainer::cgroups::DEFAULT_PARENT);
    for dir in crate::runtime::libcontainer::cgroups::remove_parent_if_empty(&crate::host::RealHost, parent) {
        steps.push(format!("removed cgroup {}", dir.display()));
    }
    let masquerade = tokio::task::spawn_blocking({
        let network = names.network.clone();
        move || remove_masquerade(&network)
    })
    .await
    .map_err(|e| DownError::Command { program: "iptables".into(), reason: e.to_string() })??;
    steps.extend(masquerade);
    let bridge = names.bridge.clone();
    let links = tokio::task::spawn_blocking(move || {
        let mut steps = remove_node_masquerade()?;
        steps.extend(remove_routes()?);
        for link in [bridge.as_str(), crate::routes::VXLAN_DEVICE] {
            steps.extend(remove_link(link)?);
        }
        Ok::<_, DownError>(steps)
    })
    .await
    .map_err(|e| DownError::Command { program: "ip".into(), reason: e.to_string() })??;
    steps.extend(links);
    if remove_dir(&names.leases)? {
        steps.push(format!("removed the address leases {}", names.leases.display()));
    }
    steps.push(remove_network_file(&crate::cni::default_path(&down.cni.conf_dir))?);
    if down.purge {
        if remove_dir(&down.data_dir)? {
            steps.push(format!("removed the data dir {}", down.data_dir.display()));
        } else {
            steps.push(format!("no data dir at {}", down.data_dir.display()));
        }
    }
    Ok(steps)
}

/// Containers outlive the agent: the ones the node's runtime still holds
/// are stopped and removed (their pods' networks go next).
async fn stop_containers(node: &Path, shim: &Path, steps: &mut Vec<Step>) -> Result<(), DownError> {
    if !node.join("libcontainer").exists() && !node.join("containers").exists() {
        return Ok(());
    }
    let rt = crate::runtime::libcontainer::LibcontainerRuntime::new(node, shim)
        .map_err(|e| DownError::Command { program: "the container runtime".into(), reason: e.to_string() })?;
    let rt: Arc<dyn Runtime> = Arc::new(rt);
    let ids = {
        let rt = rt.clone();
        tokio::task::spawn_blocking(move || rt.list()).await
    };
    let ids = ids
        .map_err(|e| DownError::Command { program: "the container runtime".into(), reason: e.to_string() })?
        .map_err(|e| DownError::Command { program: "the container runtime".into(), reason: e.to_string() })?;
    for id in ids {
        let rt = rt.clone();
        let rid = id.clone();
        let bound = STOP_GRACE + COMMAND_TIMEOUT;
        let stopped = tokio::time::timeout(
            bound,
            tokio::task::spawn_blocking(move || rt.stop(&rid, STOP_GRACE).and_then(|()| rt.remove(&rid))),
        )
        .await;
        match stopped {
            Ok(Ok(Ok(()))) => steps.push(format!("stopped and removed container {id}")),
            Ok(Ok(Err(e))) => {
                return Err(DownError::Command { program: format!("container {id}"), reason: e.to_string() })
            }
            Ok(Err(e)) => return Err(DownError::Command { program: format!("container {id}"), reason: e.to_string() }),
            Err(_) => {
                return Err(DownError::Command {
                    program: format!("container {id}"),
                    reason: format!("not stopped within {bound:?}"),
                })
            }
        }
    }
    Ok(())
}

/// CNI DEL of every pod network the node recorded. A failure is said and
/// left to the steps after (the masquerade rules and the bridge go anyway).
/// Removes every pod network whose record is under `node` (a node's data
/// dir): what an agent killed with its pods' networks up left. What it did.
pub async fn remove_leftover_networks(node: &Path, cni: &CniConfig) -> Vec<Step> {
    let mut steps = Vec::new();
    remove_pod_networks(node, cni, &mut steps).await;
    steps
}

async fn remove_pod_networks(node: &Path, cni: &CniConfig, steps: &mut Vec<Step>) {
    let nets = match PodNetworks::new(cni.clone(), node.join("cni")) {
        Ok(n) => n,
        Err(e) => {
            steps.push(format!("cannot read the pod networks' records: {e}"));
            return;
        }
    };
    for sandbox in nets.leftovers() {
        match nets.remove(&sandbox).await {
            Ok(()) => steps.push(format!("removed pod network {sandbox}")),
            Err(e) => steps.push(format!("pod network {sandbox}: {e} (its rules go below)")),
        }
    }
}

/// The bridge plugin's masquerade for pods of `network`: a rule in nat
/// POSTROUTING per pod, commented `name: "NETWORK" id: "..."`, jumping to a
/// chain `CNI-...` of its own. Rules deleted last first, then the chains.
fn remove_masquerade(network: &str) -> Result<Vec<Step>, DownError> {
    let Some(iptables) = find_program("iptables") else {
        return Ok(Vec::new());
    };
    let listed = run_bounded(&iptables, &["-w", "5", "-t", "nat", "-L", "POSTROUTING", "-n", "--line-numbers"])?;
    let ours = masquerade_rules(&listed, network);
    let mut steps = Vec::new();
    for (num, _) in ours.iter().rev() {
        run_bounded(&iptables, &["-w", "5", "-t", "nat", "-D", "POSTROUTING", &num.to_string()])?;
    }
    let mut chains: Vec<&str> =
        ours.iter().map(|(_, chain)| chain.as_str()).filter(|c| c.starts_with("CNI-")).collect();
    chains.sort_unstable();
    chains.dedup();
    for chain in &chains {
        run_bounded(&iptables, &["-w", "5", "-t", "nat", "-F", chain])?;
        run_bounded(&iptables, &["-w", "5", "-t", "nat", "-X", chain])?;
    }
    if !ours.is_empty() {
        steps.push(format!(
            "removed {} masquerade rule(s) of network {network:?} and chains {}",
            ours.len(),
            if chains.is_empty() { "-".to_string() } else { chains.join(", ") }
        ));
    }
    Ok(steps)
}

/// `iptables -L POSTROUTING -n --line-numbers`' rules of `network`: their
/// numbers and targets, in the listing's order.
fn masquerade_rules(listing: &str, network: &str) -> Vec<(u32, String)> {
    let marker = format!("/* name: \"{network}\" id: ");
    listing
        .lines()
        .filter(|l| l.contains(&marker))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let num = words.next()?.parse().ok()?;
            Some((num, words.next()?.to_string()))
        })
        .collect()
}

/// The node's own masquerade of its pod range (`routes::MASQUERADE_CHAIN`,
/// one jump from POSTROUTING per range).
fn remove_node_masquerade() -> Result<Vec<Step>, DownError> {
    let Some(iptables) = find_program("iptables") else {
        return Ok(Vec::new());
    };
    let chain = crate::routes::MASQUERADE_CHAIN;
    let listed = run_bounded(&iptables, &["-w", "5", "-t", "nat", "-S", "POSTROUTING"])?;
    let jump = format!("-j {chain}");
    let mut steps = Vec::new();
    for rule in listed.lines().filter(|l| l.ends_with(&jump)).filter_map(|l| l.strip_prefix("-A ")) {
        let mut args = vec!["-w", "5", "-t", "nat", "-D"];
        args.extend(rule.split_whitespace());
        run_bounded(&iptables, &args)?;
        steps.push(format!("removed the rule {rule}"));
    }
    // Present only when `-S CHAIN` lists it.
    if run_bounded(&iptables, &["-w", "5", "-t", "nat", "-S", chain]).is_ok() {
        run_bounded(&iptables, &["-w", "5", "-t", "nat", "-F", chain])?;
        run_bounded(&iptables, &["-w", "5", "-t", "nat", "-X", chain])?;
        steps.push(format!("removed the chain {chain}"));
    }
    Ok(steps)
}

/// The routes to peers' pod ranges, marked with `routes::ROUTE_PROTOCOL`.
fn remove_routes() -> Result<Vec<Step>, DownError> {
    let Some(ip) = find_program("ip") else {
        return Ok(Vec::new());
    };
    let proto = crate::routes::ROUTE_PROTOCOL.to_string();
    let listed = run_bounded(&ip, &["route", "show", "proto", &proto])?;
    if listed.trim().is_empty() {
        return Ok(Vec::new());
    }
    run_bounded(&ip, &["route", "flush", "proto", &proto])?;
    Ok(vec![format!("removed {} route(s) to peers' pod ranges", listed.lines().count())])
}

/// A device pinion made (the bridge, the VXLAN device), when present.
fn remove_link(link: &str) -> Result<Option<Step>, DownError> {
    let ip = find_program("ip").ok_or_else(|| DownError::Command {
        program: "ip".into(),
        reason: format!("not on PATH; remove {link} by hand if present (ip link delete {link})"),
    })?;
    // Asked of this network namespace (/sys/class/net is the one sysfs was
    // mounted in, not necessarily ours).
    if run_bounded(&ip, &["link", "show", "dev", link]).is_err() {
        return Ok(None);
    }
    // The host ends of veth pairs still on it (a pod network whose record
    // was lost): deleting one deletes the pair.
    let ports = run_bounded(&ip, &["-o", "link", "show", "master", link])?;
    for port in bridge_ports(&ports) {
        run_bounded(&ip, &["link", "delete", port])?;
    }
    run_bounded(&ip, &["link", "delete", link])?;
    Ok(Some(format!("removed the device {link}")))
}

fn remove_network_file(path: &Path) -> Result<Step, DownError> {
    match std::fs::read(path) {
        Ok(bytes) if bytes == crate::cni::default_bytes() => {
            std::fs::remove_file(path).map_err(|source| DownError::Io { path: path.to_path_buf(), source })?;
            Ok(format!("removed the default network {}", path.display()))
        }
        Ok(_) => Ok(format!("kept {}: it is not the default network pinion up writes", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(format!("no default network at {}", path.display())),
        Err(source) => Err(DownError::Io { path: path.to_path_buf(), source }),
    }
}

/// The devices `ip -o link show master BRIDGE` lists (`3: vethab12@if2: ...`).
fn bridge_ports(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name))
        .filter(|name| !name.is_empty())
        .collect()
}

/// Whether there was something to remove.
fn remove_dir(path: &Path) -> Result<bool, DownError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DownError::Io { path: path.to_path_buf(), source }),
    }
}

/// `name` in `PATH`, or in the folders root's programs live in.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    let sbin = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from);
    path.iter().chain(sbin.iter()).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Runs `program` within `COMMAND_TIMEOUT`; its stdout, or its stderr as the error.
fn run_bounded(program: &Path, args: &[&str]) -> Result<String, DownError> {
    let what = || format!("{} {}", program.display(), args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DownError::Command { program: what(), reason: e.to_string() })?;
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let readers = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        if let Some(s) = out.as_mut() {
            let _ = s.read_to_string(&mut o);
        }
        if let Some(s) = err.as_mut() {
            let _ = s.read_to_string(&mut e);
        }
        (o, e)
    });
    let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(DownError::Command {
                    program: what(),
                    reason: format!("timed out after {COMMAND_TIMEOUT:?}"),
                });
            }
            Err(e) => return Err(DownError::Command { program: what(), reason: e.to_string() }),
        }
    };
    let (stdout, stderr) = readers.join().unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        Err(DownError::Command { program: what(), reason: format!("{status}: {}", stderr.trim()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_networks_masquerade_rules() {
        let listing = r#"Chain POSTROUTING (policy ACCEPT)
num  target     prot opt source               destination
1    MASQUERADE  all  --  172.17.0.0/16        0.0.0.0/0
2    CNI-1f2e3d  all  --  10.213.0.2           0.0.0.0/0            /* name: "pinion" id: "p0a1" */
3    CNI-9a8b7c  all  --  10.88.0.4            0.0.0.0/0            /* name: "podman" id: "c1" */
4    CNI-4c5d6e  all  --  10.213.0.3           0.0.0.0/0            /* name: "pinion" id: "p0a2" */
5    CNI-0000aa  all  --  10.9.0.3             0.0.0.0/0            /* name: "pinion-test" id: "x" */
"#;
        assert_eq!(masquerade_rules(listing, "pinion"), [(2, "CNI-1f2e3d".into()), (4, "CNI-4c5d6e".into())]);
        assert_eq!(masquerade_rules("", "pinion"), []);
    }

    #[test]
    fn the_ports_of_a_bridge() {
        let listing = "3: vethbd7e96c1@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 master pinion0 state UP\n\
                       7: tap0: <BROADCAST> mtu 1500 master pinion0\n";
        assert_eq!(bridge_ports(listing), ["vethbd7e96c1", "tap0"]);
        assert!(bridge_ports("").is_empty());
    }

    #[test]
    fn the_default_networks_names() {
        let names = DefaultNames::of_default();
        assert_eq!(names.bridge, "pinion0");
        assert_eq!(names.network, "pinion");
        assert_eq!(names.leases, Path::new("/var/lib/cni/networks/pinion"));
    }

    #[test]
    fn a_network_file_goes_only_when_it_is_the_default() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = crate::cni::default_path(dir.path());
        assert!(remove_network_file(&path).expect("absent").starts_with("no default network"));
        std::fs::write(&path, b"{\"edited\": true}").expect("write");
        assert!(remove_network_file(&path).expect("kept").starts_with("kept"));
        assert!(path.exists());
        std::fs::write(&path, crate::cni::default_bytes()).expect("write");
        assert!(remove_network_file(&path).expect("removed").starts_with("removed"));
        assert!(!path.exists());
    }

    #[test]
    fn a_running_agent_holds_the_data_dir() {
        let dir = tempfile::tempdir().expect("tmp");
        assert!(lock(dir.path()).expect("no agent ever").is_none());
        std::fs::create_dir_all(dir.path().join("node")).expect("mkdir");
        let file = std::fs::File::create(dir.path().join("node/agent.lock")).expect("lock file");
        let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).expect("held");
        let e = lock(dir.path()).expect_err("an agent runs");
        assert!(matches!(e, DownError::Running { .. }), "{e}");
        drop(held);
        assert!(lock(dir.path()).expect("free now").is_some());
    }
}
