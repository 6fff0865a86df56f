//! Pod networks through Debian's CNI plugins (`containernetworking-plugins`,
//! installed by `e2e/host-setup.sh`), for real: pinned namespaces, a bridge
//! and a subnet this test owns, leases in its own folder. Needs root and the
//! plugins; under `CI=true` their absence is a failure, elsewhere a SKIPPED.

#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nodelet::cni::{CniConfig, CniError, PodNetRequest, PodNetworks};

const PLUGINS: &str = "/usr/lib/cni";

/// Whether this host can build pod networks (a skip on a laptop without
/// them, a failure under `CI=true`).
fn available() -> bool {
    let root = nix::unistd::geteuid().is_root();
    let plugins = Path::new(PLUGINS).join("bridge").is_file() && Path::new(PLUGINS).join("host-device").is_file();
    let tools = ["ip", "nsenter", "ping", "iptables"].iter().all(|t| pinion_wire::testing::on_path(t));
    pinion_wire::testing::requires(
        root && plugins && tools,
        format_args!(
            "root ({root}), {PLUGINS}/bridge and host-device ({plugins}), ip, nsenter, ping, iptables ({tools}); \
             run e2e/host-setup.sh"
        ),
    )
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A test's own network world: a folder (configuration, leases, records,
/// pins), a bridge and a subnet named after the process, removed in Drop
/// whatever happened (the pods' networks first, through the plugins).
struct World {
    dir: tempfile::TempDir,
    bridge: String,
    subnet: String,
    dummies: Vec<String>,
}

impl World {
    fn new(tag: u8) -> World {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id() % 10_000;
        let bridge = format!("pt{tag}b{pid}");
        let subnet = format!("10.250.{}.0/24", (pid % 200) + u32::from(tag));
        std::fs::create_dir_all(dir.path().join("net.d")).unwrap();
        let w = World { dir, bridge, subnet, dummies: Vec::new() };
        w.write_config(&w.network());
        w
    }

    fn network(&self) -> String {
        format!(
            r#"{{"cniVersion": "1.0.0", "name": "pinion-test", "plugins": [{{"type": "bridge", "bridge": "{}",
            "isGateway": true, "ipMasq": true, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{}"}}]],
            "dataDir": "{}"}}}}]}}"#,
            self.bridge,
            self.subnet,
            self.leases().display()
        )
    }

    fn write_config(&self, text: &str) {
        std::fs::write(self.dir.path().join("net.d/10-test.conflist"), text).unwrap();
    }

    fn leases(&self) -> PathBuf {
        self.dir.path().join("leases")
    }

    fn cni(&self) -> CniConfig {
        let mut cfg = CniConfig::new(self.dir.path().join("net.d"), vec![PathBuf::from(PLUGINS)]);
        cfg.netns_dir = self.dir.path().join("netns");
        cfg.timeout = Duration::from_secs(20);
        cfg
    }

    fn networks(&self) -> PodNetworks {
        PodNetworks::new(self.cni(), self.dir.path().join("state")).unwrap()
    }

    /// A veth end standing in for a VF (this kernel may lack `dummy`); its
    /// peer stays on the host.
    fn fake_vf(&mut self, name: &str) -> String {
        let name = format!("{name}{}", std::process::id() % 10_000);
        let peer = format!("{name}p");
        let made = Command::new("ip").args(["link", "add", &name, "type", "veth", "peer", "name", &peer]).status();
        assert!(made.unwrap().success());
        self.dummies.push(name.clone());
        self.dummies.push(peer);
        name
    }

    /// What a pod network may leave behind: pins, records, leases, veths
    /// on the bridge, NAT rules for the subnet.
    fn leaks(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sub in ["netns", "state"] {
            for e in std::fs::read_dir(self.dir.path().join(sub)).into_iter().flatten().flatten() {
                out.push(format!("{sub}/{}", e.file_name().to_string_lossy()));
            }
        }
        let net = self.leases().join("pinion-test");
        for e in std::fs::read_dir(&net).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // host-local's own bookkeeping, not a lease.
            if name != "lock" && !name.starts_with("last_reserved_ip") {
                out.push(format!("lease {name}"));
            }
        }
        let ports = sh(&format!("ip -o link show master {} 2>/dev/null", self.bridge));
        out.extend(ports.lines().map(|l| format!("bridge port {l}")));
        let prefix = self.subnet.trim_end_matches(".0/24");
        out.extend(
            sh("iptables -t nat -S 2>/dev/null")
                .lines()
                .filter(|l| l.contains(prefix))
                .map(|l| format!("iptables {l}")),
        );
        out
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // The plugins undo what they did (NAT rules included); on their own thread,
        // since a test's runtime cannot be blocked on from inside.
        let (cni, state) = (self.cni(), self.dir.path().join("state"));
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok(nets) = PodNetworks::new(cni, state) {
                    for s in nets.leftovers() {
                        let _ = nets.teardown(&s).await;
                    }
                }
            })
        })
        .join();
        for e in std::fs::read_dir(self.dir.path().join("netns")).into_iter().flatten().flatten() {
            let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        for d in &self.dummies {
            let _ = Command::new("ip").args(["link", "del", d]).output();
        }
    }
}

fn pod(key: &str) -> PodNetRequest {
    PodNetRequest { key: key.into(), sandbox: nodelet::cni::sandbox_id(key, "uid"), netdevs: Vec::new(), userns: None }
}

fn in_pod(w: &World, sandbox: &str, cmd: &str) -> std::process::Output {
    let netns = w.cni().netns_path(sandbox);
    Command::new("nsenter").arg(format!("--net={}", netns.display())).args(["sh", "-c", cmd]).output().unwrap()
}

#[tokio::test]
async fn pods_on_one_bridge_reach_each_other_and_leave_nothing() {
    if !available() {
        return;
    }
    let w = World::new(1);
    let nets = w.networks();
    let (a, b) = (pod("default/a"), pod("default/b"));
    let ip_a = nets.setup(&a).await.unwrap();
    let ip_b = nets.setup(&b).await.unwrap();
    assert_eq!((ip_a.len(), ip_b.len()), (1, 1), "{ip_a:?} {ip_b:?}");
    assert_ne!(ip_a, ip_b);
    assert_eq!(nets.setup(&a).await.unwrap(), ip_a, "a second setup is the first's");
    let ping = in_pod(&w, &a.sandbox, &format!("ping -c1 -W5 {}", ip_b[0]));
    assert!(ping.status.success(), "{}", String::from_utf8_lossy(&ping.stdout));
    let lo = in_pod(&w, &a.sandbox, "ping -c1 -W5 127.0.0.1");
    assert!(lo.status.success(), "lo is up in the pod");
    assert!(!w.leaks().is_empty(), "the checks see a pod network");
    // The kind of CHECK a restarted agent runs on an adopted pod.
    assert_eq!(w.networks().check(&a.sandbox).await.unwrap(), ip_a);
    nets.teardown(&a.sandbox).await.unwrap();
    nets.teardown(&b.sandbox).await.unwrap();
    nets.teardown(&b.sandbox).await.unwrap();
    assert_eq!(w.leaks(), Vec::<String>::new());
}

/// Networks made ahead: a pod takes one (its namespace pinned at the pod's
/// path, its address the warm one's, reachable), CHECK and DEL work on it
/// under the id it was added with (its lease is released), one made with a
/// configuration since changed is not handed out, and a new agent finds
/// the warm ones left over and removes them: nothing leaks.
#[tokio::test]
async fn a_pod_takes_a_network_made_ahead_and_nothing_leaks() {
    if !available() {
        return;
    }
    let w = World::new(5);
    let nets = w.networks();
    nets.keep_warm(2);
    nets.refill().await;
    assert_eq!(nets.warm_count(), 2);
    let warm_pins: Vec<String> = w.leaks().into_iter().filter(|l| l.starts_with("netns/w")).collect();
    assert_eq!(warm_pins.len(), 2, "{:?}", w.leaks());
    let leases_before: Vec<String> = w.leaks().into_iter().filter(|l| l.starts_with("lease")).collect();
    assert_eq!(leases_before.len(), 2, "a lease per warm network");

    let a = pod("default/a");
    let ip_a = nets.setup(&a).await.unwrap();
    assert_eq!(nets.warm_count(), 1, "a took one");
    let leases: Vec<String> = w.leaks().into_iter().filter(|l| l.starts_with("lease")).collect();
    assert_eq!(leases, leases_before, "no new address: the pod has a warm one's");
    assert!(leases.iter().any(|l| l.ends_with(&ip_a[0].split('/').next().unwrap().to_string())), "{leases:?} {ip_a:?}");
    let addr = in_pod(&w, &a.sandbox, "ip -o -4 addr show eth0");
    assert!(String::from_utf8_lossy(&addr.stdout).contains(ip_a[0].split('/').next().unwrap()), "{addr:?}");
    assert_eq!(w.networks().check(&a.sandbox).await.unwrap(), ip_a, "CHECK under the warm id");

    // The node's network changes: the one left warm is not handed out.
    w.write_config(&w.network().replace("\"ipMasq\": true", "\"ipMasq\": false"));
    let b = pod("default/b");
    let ip_b = nets.setup(&b).await.unwrap();
    assert_eq!(nets.warm_count(), 0);
    assert_ne!(ip_a, ip_b);
    let ping = in_pod(&w, &a.sandbox, &format!("ping -c1 -W5 {}", ip_b[0].split('/').next().unwrap()));
    assert!(ping.status.success(), "{}", String::from_utf8_lossy(&ping.stdout));

    nets.teardown(&a.sandbox).await.unwrap();
    nets.teardown(&b.sandbox).await.unwrap();
    // The stale warm one is left over, for the background removal (or the next agent).
    let later = w.networks();
    let left = later.leftovers();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with('w'), "{left:?}");
    for s in left {
        later.teardown(&s).await.unwrap();
    }
    assert_eq!(w.leaks(), Vec::<String>::new());

    // A stopping agent removes the ones still waiting, and makes no more.
    later.keep_warm(2);
    later.refill().await;
    assert_eq!(later.warm_count(), 2);
    later.drain_warm().await;
    later.refill().await;
    assert_eq!(later.warm_count(), 0);
    assert_eq!(w.leaks(), Vec::<String>::new());
}

/// A finished pod's network given back (`release` with `reusable`) waits
/// for the next pod with its address, pinned under a new warm id: the next
/// pod takes it (the same address, no new lease) and reaches the others.
/// Past twice `keep_warm`'s number, or not reusable, a network is removed
/// through the plugins; DEL of a reused one frees its lease; nothing leaks.
#[tokio::test]
async fn a_finished_pods_network_is_reused_by_the_next_pod_and_nothing_leaks() {
    if !available() {
        return;
    }
    let w = World::new(6);
    let nets = w.networks();
    nets.keep_warm(1);
    let leases = || w.leaks().into_iter().filter(|l| l.starts_with("lease")).count();
    let (a, b, c, d) = (pod("default/a"), pod("default/b"), pod("default/c"), pod("default/d"));
    let ip_a = nets.setup(&a).await.unwrap();
    let ip_b = nets.setup(&b).await.unwrap();
    let ip_c = nets.setup(&c).await.unwrap();
    assert_eq!(leases(), 3);

    nets.release(&a.sandbox, true).await.unwrap();
    assert_eq!(nets.warm_count(), 1, "a's network waits for the next pod");
    assert!(!w.cni().netns_path(&a.sandbox).exists(), "a's own pin is gone");
    assert_eq!(leases(), 3, "its address is kept, not freed");
    let d_ip = nets.setup(&d).await.unwrap();
    assert_eq!(d_ip, ip_a, "the next pod has a's address");
    assert_eq!(nets.warm_count(), 0);
    let ping = in_pod(&w, &d.sandbox, &format!("ping -c1 -W5 {}", ip_b[0].split('/').next().unwrap()));
    assert!(ping.status.success(), "{}", String::from_utf8_lossy(&ping.stdout));
    assert_eq!(w.networks().check(&d.sandbox).await.unwrap(), ip_a, "CHECK under the id ADD used");

    // A connection its process closed first stays in TIME_WAIT in the
    // namespace after the process is gone: such a network is removed.
    let f = pod("default/f");
    nets.setup(&f).await.unwrap();
    let held = leases();
    let tw = in_pod(
        &w,
        &f.sandbox,
        "python3 -c 'import socket\ns=socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(1)\n\
         c=socket.create_connection(s.getsockname()); a,_=s.accept(); a.close(); c.recv(1); c.close()'",
    );
    assert!(tw.status.success(), "{}", String::from_utf8_lossy(&tw.stderr));
    nets.release(&f.sandbox, true).await.unwrap();
    assert_eq!((nets.warm_count(), leases()), (0, held - 1), "f's network went through DEL");

    // Not reusable (the agent saw a capability): removed, its lease freed.
    nets.release(&b.sandbox, false).await.unwrap();
    assert_eq!((nets.warm_count(), leases()), (0, 2));
    // Two kept at most with keep_warm(1): the third goes through DEL.
    nets.release(&c.sandbox, true).await.unwrap();
    nets.release(&d.sandbox, true).await.unwrap();
    assert_eq!(nets.warm_count(), 2);
    let e = pod("default/e");
    nets.setup(&e).await.unwrap();
    nets.release(&e.sandbox, true).await.unwrap();
    assert_eq!((nets.warm_count(), leases()), (2, 2), "e's network was removed, not kept");
    assert!(ip_c != ip_a);
    nets.drain_warm().await;
    assert_eq!(w.leaks(), Vec::<String>::new());
}

#[tokio::test]
async fn bad_config_missing_plugin_and_hang_are_clear_errors_that_leak_nothing() {
    if !available() {
        return;
    }
    let w = World::new(2);
    let nets = w.networks();
    let file = w.dir.path().join("net.d/10-test.conflist");

    w.write_config(r#"{"cniVersion": "1.0.0", "name": "pinion-test", "plugins": [{"bridge": "x"}]}"#);
    let err = nets.setup(&pod("default/bad")).await.unwrap_err();
    assert!(
        matches!(&err, CniError::Config { path, field, .. } if *path == file && field == "plugins[0].type"),
        "{err}"
    );
    assert!(err.to_string().contains("10-test.conflist: plugins[0].type"), "{err}");
    assert_eq!(w.leaks(), Vec::<String>::new());

    w.write_config(&w.network().replace(r#""type": "bridge""#, r#""type": "nosuchplugin""#));
    let err = nets.setup(&pod("default/missing")).await.unwrap_err();
    assert!(matches!(&err, CniError::PluginMissing { plugin, .. } if plugin == "nosuchplugin"), "{err}");
    assert_eq!(w.leaks(), Vec::<String>::new());

    // A plugin that never answers: the call ends at the limit, and so does the plugin.
    let bin = w.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // A sleep this test alone runs, to look for afterwards.
    let marker = format!("sleep {}", 100_000 + std::process::id());
    std::fs::write(bin.join("hang"), format!("#!/bin/sh\n{marker}\n")).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(bin.join("hang"), mode).unwrap();
    w.write_config(r#"{"cniVersion": "1.0.0", "name": "pinion-test", "plugins": [{"type": "hang"}]}"#);
    let mut cfg = w.cni();
    cfg.bin_dirs = vec![bin];
    cfg.timeout = Duration::from_secs(1);
    let hanging = PodNetworks::new(cfg, w.dir.path().join("state")).unwrap();
    let err =
        tokio::time::timeout(Duration::from_secs(30), hanging.setup(&pod("default/hang"))).await.unwrap().unwrap_err();
    // ADD timed out; the cleanup's DEL of the same plugin timed out too, and both are said.
    assert!(err.to_string().contains("CNI plugin hang ADD: timed out after 1s"), "{err}");
    assert!(
        sh(&format!("pgrep -f '[{}]{}'", &marker[..1], &marker[1..])).trim().is_empty(),
        "the hung plugin was killed"
    );
}

#[tokio::test]
async fn a_netdev_moves_into_the_pod_renamed_and_back_even_after_a_kill() {
    if !available() {
        return;
    }
    let mut w = World::new(3);
    let vf = w.fake_vf("pvf");
    let mut req = pod("default/nf");
    req.netdevs = vec![(vf.clone(), "net1".into())];
    {
        let nets = w.networks();
        nets.setup(&req).await.unwrap();
        // The agent dies here: nothing is torn down; the pin keeps the dummy alive.
    }
    assert!(sh(&format!("ip -o link show {vf} 2>/dev/null")).is_empty(), "the device left the host");
    let inside = in_pod(&w, &req.sandbox, "ip -o link show net1");
    assert!(inside.status.success(), "net1 in the pod: {}", String::from_utf8_lossy(&inside.stderr));

    let restarted = w.networks();
    assert_eq!(restarted.leftovers(), vec![req.sandbox.clone()], "the record survives the agent");
    restarted.check(&req.sandbox).await.unwrap();
    assert_eq!(restarted.unwanted(&Default::default()), vec![req.sandbox.clone()], "unwanted once the pod is gone");
    restarted.remove(&req.sandbox).await.unwrap();
    assert!(!sh(&format!("ip -o link show {vf}")).is_empty(), "the device is back on the host under its name");
    assert_eq!(w.leaks(), Vec::<String>::new());
}
