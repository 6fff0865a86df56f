//! `pinion down`, for real, in a network and mount namespace of the test's
//! own (`unshare`): there the test leaves what `pinion up` leaves on a host
//! (its default network file, a pod's network made by Debian's bridge
//! plugin with the bridge `pinion0` and its masquerade rules, the node's
//! masquerade chain, a route to a peer's pod range, the address leases, the
//! data dir with its lock), with tmpfs over /var/lib and /run so nothing of
//! the host is seen or touched; `down` removes it all, refuses while the
//! data dir is locked, and a second run finds nothing to do. Needs root,
//! the plugins, iptables, ip and unshare; under `CI=true` their absence is
//! a failure, elsewhere a SKIPPED.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use pinion_wire::testing::{is_root, on_path, requires};

const PINION: &str = env!("CARGO_BIN_EXE_pinion");
const PLUGINS: &str = "/usr/lib/cni";

fn available() -> bool {
    let plugins = Path::new(PLUGINS).join("bridge").is_file() && Path::new(PLUGINS).join("host-local").is_file();
    let tools = ["iptables", "ip", "unshare", "flock"].iter().all(|t| on_path(t));
    requires(
        is_root() && plugins && tools,
        format_args!("root, {PLUGINS}/bridge and host-local, iptables, ip, unshare, flock; run e2e/host-setup.sh"),
    )
}

/// Runs `script` with `sh -eu` in new network and mount namespaces.
fn in_own_namespaces(dir: &Path, script: &str) -> Output {
    let out = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "--", "sh", "-euc", script])
        .env("PINION", PINION)
        .env("T", dir)
        .env("PINION_LOG", "warn")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    eprintln!("--- stdout\n{}--- stderr\n{}", text(&out.stdout), text(&out.stderr));
    out
}

/// What `up` leaves, made in the namespaces, then `down` (refused while
/// the lock is held, then done, then done again).
const SCRIPT: &str = r#"
mount -t tmpfs tmpfs /var/lib
mount -t tmpfs tmpfs /run
ip link set lo up
ip netns add pod
mkdir -p "$T/net.d" /var/lib/pinion/node /var/lib/pinion/server
cp "$T/default.conflist" "$T/net.d/10-pinion.conflist"
: > /var/lib/pinion/node/agent.lock
# A pod's network through the default network, as the agent makes it.
CNI_COMMAND=ADD CNI_CONTAINERID=p0123456789abcdef01234567 CNI_NETNS=/run/netns/pod CNI_IFNAME=eth0 \
  CNI_PATH=/usr/lib/cni /usr/lib/cni/bridge < "$T/bridge.json" > /dev/null
# The node's own masquerade and a route to a peer's range, as routes.rs makes them.
iptables -w 5 -t nat -N PINION-MASQ
iptables -w 5 -t nat -A PINION-MASQ -j MASQUERADE
iptables -w 5 -t nat -A POSTROUTING -s 10.213.0.0/24 -j PINION-MASQ
ip route add 10.213.7.0/24 dev pinion0 proto 213
echo "== before"
iptables -w 5 -t nat -S; ip -o link; ip route show proto 213; ls /var/lib/cni/networks
echo "== locked"
if flock /var/lib/pinion/node/agent.lock "$PINION" down --data-dir /var/lib/pinion --cni-conf-dir "$T/net.d" 2>&1; then
  echo "down ran under the lock"; exit 1
fi
echo "== down"
"$PINION" down --data-dir /var/lib/pinion --cni-conf-dir "$T/net.d" --purge
echo "== after"
iptables -w 5 -t nat -S; ip -o link; ip route show proto 213
ls /var/lib/cni/networks; ls "$T/net.d"; ls /var/lib
echo "== again"
"$PINION" down --data-dir /var/lib/pinion --cni-conf-dir "$T/net.d" --purge
echo "== end"
"#;

#[test]
fn down_removes_what_up_left_and_refuses_while_up_runs() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("default.conflist"), nodelet::cni::default_bytes()).unwrap();
    // The bridge plugin's own input: its part of the list, with the list's name and version.
    let list: serde_json::Value = serde_json::from_slice(&nodelet::cni::default_bytes()).unwrap();
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    // The plugin's own masquerade (a chain per pod), as the default network
    // had it before the node masqueraded its range itself: what an older
    // `up` left, which `down` removes too.
    plugin["ipMasq"] = serde_json::Value::Bool(true);
    std::fs::write(dir.path().join("bridge.json"), serde_json::to_vec(&plugin).unwrap()).unwrap();

    let out = in_own_namespaces(dir.path(), SCRIPT);
    assert!(out.status.success(), "the script failed: {:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let section = |name: &str| {
        let start = stdout.find(&format!("== {name}\n")).unwrap_or_else(|| panic!("no section {name}"));
        let rest = &stdout[start + name.len() + 4..];
        rest[..rest.find("\n== ").map_or(rest.len(), |i| i + 1)].to_string()
    };
    let before = section("before");
    // The setup made what `down` must remove, or the test proves nothing.
    for made in ["pinion0", "veth", "name: \\\"pinion\\\"", "PINION-MASQ", "10.213.7.0/24", "pinion\n"] {
        assert!(before.contains(made), "the setup did not make {made:?}:\n{before}");
    }
    let locked = section("locked");
    assert!(locked.contains("is running on this data dir"), "{locked}");
    let down = section("down");
    for said in ["removed 1 masquerade rule(s)", "removed the chain PINION-MASQ", "removed the device pinion0"] {
        assert!(down.contains(said), "down did not say {said:?}:\n{down}");
    }
    assert!(down.contains("removed the data dir /var/lib/pinion"), "{down}");
    let after = section("after");
    for gone in [
        "pinion0",
        "veth",
        "CNI-",
        "name: \\\"pinion\\\"",
        "PINION-MASQ",
        "10.213.7.0/24",
        "10-pinion.conflist",
        "pinion\n",
    ] {
        assert!(!after.contains(gone), "{gone:?} is still there:\n{after}");
    }
    let again = section("again");
    assert!(!again.contains("removed"), "a second down found something to remove:\n{again}");
}
