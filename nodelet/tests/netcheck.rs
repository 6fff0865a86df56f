//! `pinion up`'s check of the host before it writes its default network
//! (`nodelet::netcheck`), for real: the dry run between two throwaway
//! network namespaces with Debian's plugins leaves nothing on the host, and
//! with plugins of the test's own that refuse as a kernel without bridges
//! does, the refusal is named. Needs root (network namespaces); under
//! `CI=true` its absence is a failure, elsewhere a SKIPPED.

#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nodelet::cni::CniConfig;
use nodelet::netcheck::{check_default, prepare, Prepared, Unfit};
use pinion_wire::testing::{is_root, on_path, requires};

const PLUGINS: &str = "/usr/lib/cni";

/// The host's interfaces and its default network's leases: what a dry run
/// must not change.
fn host_state() -> (Vec<String>, bool) {
    let mut links: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    links.sort();
    // Interfaces of other tests running beside this one come and go: only ours count.
    links.retain(|l| l.starts_with("pinion") || l.starts_with("veth"));
    (links, Path::new("/var/lib/cni/networks/pinion").exists())
}

#[test]
fn the_default_network_runs_here_and_leaves_nothing() {
    let plugins = Path::new(PLUGINS).join("bridge").is_file() && Path::new(PLUGINS).join("host-local").is_file();
    if !requires(
        is_root() && plugins && on_path("iptables"),
        format_args!("root, {PLUGINS}/bridge and host-local, iptables; run e2e/host-setup.sh"),
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = CniConfig::new(dir.path().join("net.d"), vec![PathBuf::from(PLUGINS)]);
    let before = host_state();
    check_default(&cfg).expect("this host runs the default network");
    assert_eq!(host_state(), before, "the dry run left something on the host");
    // And `up`'s step writes it only then.
    assert_eq!(prepare(&cfg).unwrap(), Prepared::Written(nodelet::cni::default_path(&dir.path().join("net.d"))));
    assert_eq!(prepare(&cfg).unwrap(), Prepared::Kept(nodelet::cni::default_path(&dir.path().join("net.d"))));
}

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Plugins of the test's own: `bridge` refuses as the QEMU guest's kernel
/// does, after checking it runs in a fresh namespace (only `lo`) and that
/// the pod's namespace it was given exists.
#[test]
fn a_kernel_without_bridges_is_found_before_anything_is_written() {
    if !requires(is_root() && on_path("iptables"), "root, iptables") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    script(&bin, "host-local", "exit 0");
    script(
        &bin,
        "bridge",
        r#"cat >/dev/null
links=$(tail -n +3 /proc/self/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')
if [ "$links" != "lo " ]; then echo "{\"code\":100,\"msg\":\"not a fresh namespace: $links\"}"; exit 1; fi
if [ ! -e "$CNI_NETNS" ]; then echo "{\"code\":100,\"msg\":\"no pod namespace at $CNI_NETNS\"}"; exit 1; fi
echo '{"code":11,"msg":"failed to create bridge \"pinion0\": could not add \"pinion0\": operation not supported"}'
exit 1"#,
    );
    let conf = dir.path().join("net.d");
    let cfg = CniConfig::new(conf.clone(), vec![bin.clone()]);
    let e = check_default(&cfg).expect_err("the kernel says no");
    assert!(matches!(&e, Unfit::KernelUnsupported { message } if message.contains("operation not supported")), "{e}");
    assert_eq!(e.fix().as_deref(), Some("modprobe bridge veth"));
    match prepare(&cfg).unwrap() {
        Prepared::Unfit { unfit: Unfit::KernelUnsupported { .. }, file: None } => {}
        other => panic!("{other:?}"),
    }
    assert!(!conf.exists(), "nothing written");

    // Without the plugins, the missing one is named before anything runs.
    let cfg = CniConfig::new(conf.clone(), vec![dir.path().join("none")]);
    match prepare(&cfg).unwrap() {
        Prepared::Unfit { unfit: Unfit::PluginMissing { plugin, .. }, file: None } => assert_eq!(plugin, "bridge"),
        other => panic!("{other:?}"),
    }
    assert!(!conf.exists(), "nothing written");
}
