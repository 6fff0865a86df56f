//! Routes to peers' pod ranges, put in place through netlink for real, in a
//! network namespace this test makes (an interface on a test subnet as
//! the node's link, a veth pair): a direct route, the VXLAN device with its neighbour and
//! forwarding entries, what a later plan drops removed, and a route Pinion
//! did not make left alone. Needs root and `ip`/`bridge` (iproute2) to look;
//! under `CI=true` their absence is a failure, elsewhere a skip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::process::Command;

use nodelet::routes::{apply, connected, plan, Mode, Peer, Plan};

struct Netns(String);

impl Netns {
    fn new() -> Option<Netns> {
        let tools = ["ip", "bridge"].iter().all(|t| pinion_wire::testing::on_path(t));
        let root = nix::unistd::geteuid().is_root();
        if !pinion_wire::testing::requires(root && tools, format_args!("root ({root}), ip and bridge ({tools})")) {
            return None;
        }
        let ns = Netns(format!("prt{}", std::process::id()));
        ns.ip(&["netns", "add", &ns.0]);
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["link", "add", "name", "eth9", "type", "veth", "peer", "name", "eth9p"],
            vec!["addr", "add", "192.168.77.1/24", "dev", "eth9"],
            vec!["link", "set", "eth9", "up"],
            vec!["link", "set", "eth9p", "up"],
        ] {
            ns.ip_in(&args);
        }
        Some(ns)
    }

    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn ip_in(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.0.as_str()];
        all.extend_from_slice(args);
        self.ip(&all)
    }

    fn bridge(&self, args: &[&str]) -> String {
        let out = Command::new("bridge").args(["-n", &self.0]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `f` with a netlink handle opened inside the namespace.
    fn with_handle<T: Send + 'static>(
        &self,
        f: impl FnOnce(rtnetlink::Handle) -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
    ) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let (conn, handle, _) = rtnetlink::new_connection().unwrap();
                let conn = tokio::spawn(conn);
                let out = f(handle).await;
                conn.abort();
                out
            })
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn peer(name: &str, cidr: &str, addr: &str) -> Peer {
    Peer { name: name.into(), pod_cidr: cidr.parse().unwrap(), address: addr.parse().unwrap() }
}

#[test]
fn routes_to_peers_are_put_in_place_and_taken_back() {
    let Some(ns) = Netns::new() else { return };
    let own = Some("10.213.1.0/24".parse().unwrap());
    let near = peer("b", "10.213.2.0/24", "192.168.77.2");
    let far = peer("c", "10.213.3.0/24", "172.16.0.9");
    // Someone else's route to a range: not Pinion's to touch.
    ns.ip_in(&["route", "add", "10.99.0.0/24", "via", "192.168.77.5"]);

    let peers = vec![near.clone(), far.clone()];
    let made: Plan = ns.with_handle(move |h| {
        Box::pin(async move {
            let c = connected(&h).await.unwrap();
            let p = plan(own, &peers, &c, Mode::Auto);
            apply(&h, &p).await.unwrap();
            // Twice: the same state, no error (a resync).
            apply(&h, &p).await.unwrap();
            p
        })
    });
    assert_eq!(made.routes.len(), 2, "{made:?}");
    let routes = ns.ip_in(&["route", "show", "proto", "213"]);
    assert!(routes.contains("10.213.2.0/24 via 192.168.77.2 dev eth9"), "{routes}");
    assert!(routes.contains("10.213.3.0/24 via 10.213.3.0 dev pinion-vx") && routes.contains("onlink"), "{routes}");
    let link = ns.ip_in(&["-d", "link", "show", "pinion-vx"]);
    assert!(link.contains("vxlan id 4213") && link.contains("dstport 4789") && link.contains("nolearning"), "{link}");
    assert!(link.contains("0e:70:0a:d5:01:00") && link.contains("mtu 1450"), "{link}");
    assert!(ns.ip_in(&["addr", "show", "pinion-vx"]).contains("inet 10.213.1.0/32"));
    let neigh = ns.ip_in(&["neigh", "show", "dev", "pinion-vx"]);
    assert!(neigh.contains("10.213.3.0 lladdr 0e:70:0a:d5:03:00 PERMANENT"), "{neigh}");
    let fdb = ns.bridge(&["fdb", "show", "dev", "pinion-vx"]);
    assert!(fdb.contains("0e:70:0a:d5:03:00 dst 172.16.0.9"), "{fdb}");

    // The far node is gone and the near one forced onto VXLAN: the direct
    // route and the far node's entries go, the near one's come.
    let peers = vec![near.clone()];
    ns.with_handle(move |h| {
        Box::pin(async move {
            let c = connected(&h).await.unwrap();
            apply(&h, &plan(own, &peers, &c, Mode::Vxlan)).await.unwrap();
        })
    });
    let routes = ns.ip_in(&["route", "show", "proto", "213"]);
    assert!(routes.contains("10.213.2.0/24 via 10.213.2.0 dev pinion-vx"), "{routes}");
    assert!(!routes.contains("10.213.3.0") && !routes.contains("via 192.168.77.2"), "{routes}");
    let neigh = ns.ip_in(&["neigh", "show", "dev", "pinion-vx"]);
    assert!(!neigh.contains("10.213.3.0") && neigh.contains("10.213.2.0 lladdr 0e:70:0a:d5:02:00"), "{neigh}");
    let fdb = ns.bridge(&["fdb", "show", "dev", "pinion-vx"]);
    assert!(!fdb.contains("172.16.0.9") && fdb.contains("0e:70:0a:d5:02:00 dst 192.168.77.2"), "{fdb}");

    // The masquerade: one chain, a rule per range, one jump for the node's range.
    ns.with_handle(move |_| {
        Box::pin(async move {
            let (own, peer) = ("10.213.1.0/24".parse().unwrap(), "10.213.2.0/24".parse().unwrap());
            nodelet::routes::masquerade(own, &[own, peer]).await.unwrap();
            nodelet::routes::masquerade(own, &[own, peer]).await.unwrap();
        })
    });
    let nat = Command::new("ip").args(["netns", "exec", &ns.0, "iptables", "-t", "nat", "-S"]).output().unwrap();
    let nat = String::from_utf8_lossy(&nat.stdout).into_owned();
    assert_eq!(nat.matches("-A POSTROUTING -s 10.213.1.0/24 -j PINION-MASQ").count(), 1, "{nat}");
    for rule in ["-d 10.213.1.0/24 -j RETURN", "-d 10.213.2.0/24 -j RETURN", "-A PINION-MASQ -j MASQUERADE"] {
        assert_eq!(nat.matches(rule).count(), 1, "{rule}: {nat}");
    }

    // No peer: nothing of Pinion's is left; the other route stays.
    ns.with_handle(move |h| Box::pin(async move { apply(&h, &plan(own, &[], &[], Mode::Auto)).await.unwrap() }));
    assert_eq!(ns.ip_in(&["route", "show", "proto", "213"]).trim(), "");
    assert!(!ns.ip_in(&["link", "show"]).contains("pinion-vx"));
    assert!(ns.ip_in(&["route", "show"]).contains("10.99.0.0/24 via 192.168.77.5"));
}
