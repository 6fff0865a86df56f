//! Routes to the other nodes' pod ranges, so that pods on different nodes
//! reach each other by pod IP, without NAT. Two ways, per peer:
//!
//! - **direct** (flannel's host-gw): the peer's address is on a subnet this
//!   node is attached to; its pod range is routed via that address.
//! - **VXLAN** in the kernel otherwise, or for every peer when the node is
//!   told so: one device, [`VXLAN_DEVICE`], VNI [`VXLAN_VNI`], UDP 4789.
//!   Each node's device has a MAC made from its pod range and the range's
//!   first address (`.0/32`), so a peer needs nothing but the range and the
//!   address to reach it: a route `range via peer.0 dev pinion-vx onlink`, a
//!   permanent neighbour `peer.0 -> peer's MAC` and a forwarding entry
//!   `peer's MAC -> peer's address`. Nothing is learned or flooded.
//!
//! Which routes, devices and entries a view of the cluster wants is [`plan`],
//! pure; [`apply`] makes the kernel's state that, through netlink (routes
//! marked with protocol [`ROUTE_PROTOCOL`], so that those Pinion no longer
//! wants are found and removed, and no one else's are touched). [`run`] does
//! it at every change of the view and every [`RESYNC`], so a route someone
//! deleted by hand comes back.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures_util::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, LinkUnspec, LinkVxlan, RouteMessageBuilder};

/// The VXLAN device's name.
pub const VXLAN_DEVICE: &str = "pinion-vx";
/// Its VXLAN network identifier (flannel uses 1; Pinion its own).
pub const VXLAN_VNI: u32 = 4213;
/// The IANA VXLAN port.
pub const VXLAN_PORT: u16 = 4789;
/// VXLAN's headers: 50 bytes of an underlay packet are not the pod's.
pub const VXLAN_OVERHEAD: u32 = 50;
/// The `proto` Pinion's routes carry (`ip route show proto 213`).
pub const ROUTE_PROTOCOL: u8 = 213;
/// How often the kernel's state is made the plan's again without a change.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Limit on one pass of [`apply`].
const APPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// How peers are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Directly where the peer shares a subnet with this node, VXLAN where not.
    #[default]
    Auto,
    /// VXLAN for every peer (networks that drop packets to foreign ranges).
    Vxlan,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "host-gw" => Ok(Mode::Auto),
            "vxlan" => Ok(Mode::Vxlan),
            other => Err(format!("{other:?}: the pod network mode is auto (direct routes where nodes share a subnet, VXLAN elsewhere) or vxlan")),
        }
    }
}

/// Another node, as routes need it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    pub name: String,
    pub pod_cidr: Ipv4Net,
    pub address: Ipv4Addr,
}

/// One route to a peer's range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    Direct { dst: Ipv4Net, via: Ipv4Addr },
    Vxlan { dst: Ipv4Net, via: Ipv4Addr, mac: [u8; 6], underlay: Ipv4Addr },
}

/// What the kernel should hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub routes: Vec<Route>,
    /// The VXLAN device, when a route uses it: its address (`own.0/32`) and MAC.
    pub vxlan: Option<(Ipv4Addr, [u8; 6])>,
}

/// The MAC of a node's VXLAN device: locally administered, unicast, made
/// of its pod range's network address (unique while ranges are).
pub fn vxlan_mac(range: Ipv4Net) -> [u8; 6] {
    let o = range.network().octets();
    [0x0e, 0x70, o[0], o[1], o[2], o[3]]
}

/// The plan for this node (`own`: its range; `connected`: the subnets of
/// its interfaces) and its peers. A peer with this node's range, with a
/// range that overlaps this node's, or with no address is left out.
pub fn plan(own: Option<Ipv4Net>, peers: &[Peer], connected: &[Ipv4Net], mode: Mode) -> Plan {
    let Some(own) = own else { return Plan::default() };
    let mut routes = Vec::new();
    let mut seen = BTreeSet::new();
    for p in peers {
        let overlaps = p.pod_cidr.contains(&own.network()) || own.contains(&p.pod_cidr.network());
        if overlaps || p.address.is_unspecified() || !seen.insert(p.pod_cidr) {
            continue;
        }
        let direct = mode == Mode::Auto && connected.iter().any(|c| c.contains(&p.address));
        routes.push(if direct {
            Route::Direct { dst: p.pod_cidr, via: p.address }
        } else {
            Route::Vxlan { dst: p.pod_cidr, via: p.pod_cidr.network(), mac: vxlan_mac(p.pod_cidr), underlay: p.address }
        });
    }
    routes.sort();
    let vxlan = routes.iter().any(|r| matches!(r, Route::Vxlan { .. })).then(|| (own.network(), vxlan_mac(own)));
    Plan { routes, vxlan }
}

#[derive(Debug, thiserror::Error)]
pub enum RoutesError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
    #[error("netlink socket: {0}")]
    Socket(#[from] std::io::Error),
    #[error("applying the pod routes took longer than {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Iptables(String),
}

/// Subnets of this network namespace's IPv4 addresses (what `Mode::Auto`
/// reaches directly), the VXLAN device's own left out.
pub async fn connected(handle: &Handle) -> Result<Vec<Ipv4Net>, RoutesError> {
    let vx = link_index(handle, VXLAN_DEVICE).await?;
    let mut out = Vec::new();
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await? {
        if Some(msg.header.index) == vx {
            continue;
        }
        for a in &msg.attributes {
            if let AddressAttribute::Address(IpAddr::V4(ip)) = a {
                if let Ok(net) = Ipv4Net::new(*ip, msg.header.prefix_len) {
                    if !ip.is_loopback() {
                        out.push(net.trunc());
                    }
                }
            }
        }
    }
    Ok(out)
}

async fn link_index(handle: &Handle, name: &str) -> Result<Option<u32>, RoutesError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(LinkMessage { header, .. })) => Ok(Some(header.index)),
        Ok(None) => Ok(None),
        // ENODEV: no such device.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Makes the kernel's routes, VXLAN device and entries `plan`'s, within a
/// limit; what Pinion made that the plan no longer holds goes.
pub async fn apply(handle: &Handle, plan: &Plan) -> Result<(), RoutesError> {
    tokio::time::timeout(APPLY_TIMEOUT, apply_now(handle, plan))
        .await
        .map_err(|_| RoutesError::Timeout(APPLY_TIMEOUT))?
}

async fn apply_now(handle: &Handle, plan: &Plan) -> Result<(), RoutesError> {
    let vx = match plan.vxlan {
        Some((addr, mac)) => Some(ensure_vxlan(handle, addr, mac).await?),
        None => None,
    };
    // Routes: ours that the plan lacks go first (a range moved to another
    // peer must not be routed twice), then each wanted one is put in place.
    let wanted: Vec<RouteMessage> = plan.routes.iter().filter_map(|r| route_message(r, vx)).collect();
    let mut current = handle.route().get(RouteMessageBuilder::<Ipv4Addr>::new().build()).execute();
    let mut stale = Vec::new();
    while let Some(msg) = current.try_next().await? {
        if msg.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL) && !wanted.iter().any(|w| same_route(w, &msg)) {
            stale.push(msg);
        }
    }
    for msg in stale {
        tracing::info!(dst = ?destination(&msg), "removing a route to a pod range no node holds now");
        handle.route().del(msg).execute().await?;
    }
    if let Some(vx) = vx {
        let peers: Vec<(Ipv4Addr, [u8; 6], Ipv4Addr)> = plan
            .routes
            .iter()
            .filter_map(|r| match r {
                Route::Vxlan { via, mac, underlay, .. } => Some((*via, *mac, *underlay)),
                Route::Direct { .. } => None,
            })
            .collect();
        prune_neighbours(handle, vx, &peers).await?;
        for (via, mac, underlay) in &peers {
            handle.neighbours().add(vx, IpAddr::V4(*via)).link_layer_address(mac).replace().execute().await?;
            handle
                .neighbours()
                .add_bridge(vx, mac)
                .destination(IpAddr::V4(*underlay))
                .flags(NeighbourFlags::Own)
                .replace()
                .execute()
                .await?;
        }
    } else if let Some(index) = link_index(handle, VXLAN_DEVICE).await? {
        tracing::info!("removing the VXLAN device: no peer needs it");
        handle.link().del(index).execute().await?;
    }
    for msg in wanted {
        handle.route().add(msg).replace().execute().await?;
    }
    Ok(())
}

fn route_message(r: &Route, vx: Option<u32>) -> Option<RouteMessage> {
    let b = RouteMessageBuilder::<Ipv4Addr>::new().protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
    Some(match r {
        Route::Direct { dst, via } => b.destination_prefix(dst.network(), dst.prefix_len()).gateway(*via).build(),
        Route::Vxlan { dst, via, .. } => b
            .destination_prefix(dst.network(), dst.prefix_len())
            .gateway(*via)
            .output_interface(vx?)
            .onlink()
            .scope(RouteScope::Universe)
            .build(),
    })
}

fn destination(msg: &RouteMessage) -> Option<(Ipv4Addr, u8)> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some((*ip, msg.header.destination_prefix_length)),
        _ => None,
    })
}

fn gateway(msg: &RouteMessage) -> Option<Ipv4Addr> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })
}

/// The same destination and gateway: a route `replace` leaves as it is.
fn same_route(a: &RouteMessage, b: &RouteMessage) -> bool {
    destination(a) == destination(b) && gateway(a) == gateway(b)
}

/// The VXLAN device, made if missing (no learning: every entry is put in
/// place), up, with `addr/32`; its index.
async fn ensure_vxlan(handle: &Handle, addr: Ipv4Addr, mac: [u8; 6]) -> Result<u32, RoutesError> {
    let index = match link_index(handle, VXLAN_DEVICE).await? {
        Some(i) => i,
        None => {
            let msg = LinkVxlan::new(VXLAN_DEVICE, VXLAN_VNI).port(VXLAN_PORT).learning(false).build();
            handle.link().add(msg).execute().await?;
            link_index(handle, VXLAN_DEVICE)
                .await?
                .ok_or_else(|| std::io::Error::other(format!("{VXLAN_DEVICE} vanished after it was made")))?
        }
    };
    let mtu = underlay_mtu(handle).await?.saturating_sub(VXLAN_OVERHEAD).max(576);
    let set = LinkUnspec::new_with_index(index).address(mac.to_vec()).mtu(mtu).up().build();
    handle.link().set(set).execute().await?;
    let mut has = false;
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    while let Some(msg) = addrs.try_next().await? {
        has |= msg.attributes.iter().any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(ip)) if *ip == addr));
    }
    if !has {
        handle.address().add(index, IpAddr::V4(addr), 32).execute().await?;
    }
    Ok(index)
}

/// The smallest MTU of the namespace's up, non-loopback, non-VXLAN links
/// (1500 when there is none): the pods' traffic may take any of them.
async fn underlay_mtu(handle: &Handle) -> Result<u32, RoutesError> {
    let mut links = handle.link().get().execute();
    let mut mtu = None::<u32>;
    while let Some(msg) = links.try_next().await? {
        let name = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        let m = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::Mtu(m) => Some(*m),
            _ => None,
        });
        let skip = name.as_deref().is_none_or(|n| n == "lo" || n == VXLAN_DEVICE || n.starts_with("veth"));
        if let (false, Some(m)) = (skip, m) {
            mtu = Some(mtu.map_or(m, |x| x.min(m)));
        }
    }
    Ok(mtu.unwrap_or(1500))
}

/// Removes the VXLAN device's neighbour and forwarding entries no peer
/// holds now.
async fn prune_neighbours(
    handle: &Handle,
    vx: u32,
    peers: &[(Ipv4Addr, [u8; 6], Ipv4Addr)],
) -> Result<(), RoutesError> {
    let mut stale: Vec<NeighbourMessage> = Vec::new();
    let mut all = handle.neighbours().get().execute();
    while let Some(msg) = all.try_next().await? {
        if msg.header.ifindex != vx {
            continue;
        }
        let dst = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
            _ => None,
        });
        let lla = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(l) => Some(l.clone()),
            _ => None,
        });
        let keep = match msg.header.family {
            AddressFamily::Inet => dst
                .is_some_and(|d| peers.iter().any(|(via, mac, _)| *via == d && lla.as_deref() == Some(mac.as_slice()))),
            _ => true,
        };
        if !keep {
            stale.push(msg);
        }
    }
    let mut bridge = handle.neighbours().get().set_address_family(AddressFamily::Bridge).execute();
    while let Some(msg) = bridge.try_next().await? {
        if msg.header.ifindex != vx {
            continue;
        }
        let lla = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(l) => Some(l.clone()),
            _ => None,
        });
        let dst = msg.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
            _ => None,
        });
        let ours = lla.as_deref().is_some_and(|l| l.len() == 6 && l[0] == 0x0e && l[1] == 0x70);
        if ours && !peers.iter().any(|(_, mac, u)| lla.as_deref() == Some(mac.as_slice()) && dst == Some(*u)) {
            stale.push(msg);
        }
    }
    for msg in stale {
        handle.neighbours().del(msg).execute().await?;
    }
    Ok(())
}

/// The nat chain that masquerades what this node's pods send beyond the
/// pod ranges (to the outside world), and nothing sent to a pod: one rule
/// per range, none per pod (the bridge plugin's `ipMasq` adds a chain per
/// pod, and its rule would hide a pod's address from pods on other nodes).
pub const MASQUERADE_CHAIN: &str = "PINION-MASQ";
/// Limit on one `iptables` run.
const IPTABLES_TIMEOUT: Duration = Duration::from_secs(10);

/// `iptables-restore --noflush` input that makes [`MASQUERADE_CHAIN`]:
/// return for multicast and every pod range in `ranges`, masquerade the rest.
pub fn masquerade_rules(ranges: &[Ipv4Net]) -> String {
    let mut out = format!("*nat\n:{MASQUERADE_CHAIN} - [0:0]\n");
    let mut ranges: Vec<Ipv4Net> = ranges.to_vec();
    ranges.sort();
    ranges.dedup();
    for r in ranges.iter().map(|r| r.to_string()).chain(["224.0.0.0/4".to_string()]) {
        out.push_str(&format!("-A {MASQUERADE_CHAIN} -d {r} -j RETURN\n"));
    }
    out.push_str(&format!("-A {MASQUERADE_CHAIN} -j MASQUERADE\nCOMMIT\n"));
    out
}

async fn iptables(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, RoutesError> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let run = async {
        let mut child = cmd.spawn()?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).await?;
        }
        child.wait_with_output().await
    };
    let out =
        tokio::time::timeout(IPTABLES_TIMEOUT, run).await.map_err(|_| RoutesError::Timeout(IPTABLES_TIMEOUT))??;
    if !out.status.success() {
        return Err(RoutesError::Iptables(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Masquerades what `own`'s pods send beyond `ranges` (theirs and every
/// peer's): the chain made anew, one jump to it from POSTROUTING for `own`,
/// and a jump left for an earlier range removed.
pub async fn masquerade(own: Ipv4Net, ranges: &[Ipv4Net]) -> Result<(), RoutesError> {
    iptables("iptables-restore", &["--noflush", "-w", "5"], Some(&masquerade_rules(ranges))).await?;
    let own = own.to_string();
    let listed = iptables("iptables", &["-w", "5", "-t", "nat", "-S", "POSTROUTING"], None).await?;
    let mut present = false;
    for line in listed.lines().filter(|l| l.ends_with(&format!("-j {MASQUERADE_CHAIN}"))) {
        let Some(rule) = line.strip_prefix("-A ") else { continue };
        if rule == format!("POSTROUTING -s {own} -j {MASQUERADE_CHAIN}") {
            present = true;
            continue;
        }
        let mut args = vec!["-w", "5", "-t", "nat", "-D"];
        args.extend(rule.split_whitespace());
        iptables("iptables", &args, None).await?;
    }
    if !present {
        let args = ["-w", "5", "-t", "nat", "-A", "POSTROUTING", "-s", &own, "-j", MASQUERADE_CHAIN];
        iptables("iptables", &args, None).await?;
    }
    Ok(())
}

/// Keeps the kernel's routes as the view says: at every change, and every
/// [`RESYNC`]; with `masquerade`, the masquerade of the node's range too
/// (the default network, which leaves it to the node), or of `masquerade`'s
/// range while the node has none of its own (not joined). Ends when the
/// view's sender is gone.
pub async fn run(
    mut view: tokio::sync::watch::Receiver<crate::peers::NetView>,
    mode: Option<Mode>,
    masquerade: Option<Ipv4Net>,
) -> Result<(), RoutesError> {
    let (conn, handle, _) = rtnetlink::new_connection()?;
    let conn = tokio::spawn(conn);
    let mut last = None;
    loop {
        let crate::peers::NetView { own_cidr: own, peers } = view.borrow_and_update().clone();
        let peers: Vec<Peer> = peers
            .into_iter()
            .filter_map(|p| match p.address {
                IpAddr::V4(address) => Some(Peer { name: p.name, pod_cidr: p.pod_cidr, address }),
                // IPv6 underlays: not yet (the ranges are IPv4).
                IpAddr::V6(_) => None,
            })
            .collect();
        let result = async {
            let connected = connected(&handle).await?;
            let p = match mode {
                Some(mode) => plan(own, &peers, &connected, mode),
                None => Plan::default(),
            };
            apply(&handle, &p).await?;
            if let Some(own) = masquerade.map(|fallback| own.unwrap_or(fallback)) {
                let ranges: Vec<Ipv4Net> = std::iter::once(own).chain(peers.iter().map(|p| p.pod_cidr)).collect();
                self::masquerade(own, &ranges).await?;
            }
            Ok::<_, RoutesError>(p)
        }
        .await;
        match result {
            Ok(p) => {
                if last.as_ref() != Some(&p) {
                    tracing::info!(routes = p.routes.len(), vxlan = p.vxlan.is_some(), "pod routes to peers in place");
                    last = Some(p);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot put the routes to peers' pod ranges in place; trying again"),
        }
        tokio::select! {
            changed = view.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
    conn.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("cidr")
    }

    fn peer(name: &str, cidr: &str, addr: &str) -> Peer {
        Peer { name: name.into(), pod_cidr: net(cidr), address: addr.parse().expect("ip") }
    }

    #[test]
    fn plans() {
        let own = Some(net("10.213.1.0/24"));
        let lan = [net("192.168.7.0/24")];
        let b = peer("b", "10.213.2.0/24", "192.168.7.2");
        let far = peer("c", "10.213.3.0/24", "172.16.0.9");
        let direct_b = Route::Direct { dst: net("10.213.2.0/24"), via: "192.168.7.2".parse().expect("ip") };
        let vx = |p: &Peer| Route::Vxlan {
            dst: p.pod_cidr,
            via: p.pod_cidr.network(),
            mac: vxlan_mac(p.pod_cidr),
            underlay: p.address,
        };
        let own_vx = Some(("10.213.1.0".parse().expect("ip"), [0x0e, 0x70, 10, 213, 1, 0]));
        struct Case {
            name: &'static str,
            own: Option<Ipv4Net>,
            peers: Vec<Peer>,
            mode: Mode,
            want: Plan,
        }
        let cases = [
            Case {
                name: "no range yet: nothing",
                own: None,
                peers: vec![b.clone()],
                mode: Mode::Auto,
                want: Plan::default(),
            },
            Case {
                name: "a peer on the same subnet: direct",
                own,
                peers: vec![b.clone()],
                mode: Mode::Auto,
                want: Plan { routes: vec![direct_b.clone()], vxlan: None },
            },
            Case {
                name: "a peer elsewhere: VXLAN, and the device",
                own,
                peers: vec![b.clone(), far.clone()],
                mode: Mode::Auto,
                want: Plan { routes: vec![direct_b.clone(), vx(&far)], vxlan: own_vx },
            },
            Case {
                name: "told VXLAN: every peer",
                own,
                peers: vec![far.clone(), b.clone()],
                mode: Mode::Vxlan,
                want: Plan { routes: vec![vx(&b), vx(&far)], vxlan: own_vx },
            },
            Case {
                name: "this node's range, an overlap, a duplicate, no address: left out",
                own,
                peers: vec![
                    peer("self", "10.213.1.0/24", "192.168.7.1"),
                    peer("wide", "10.213.0.0/16", "192.168.7.3"),
                    b.clone(),
                    peer("dup", "10.213.2.0/24", "192.168.7.4"),
                    peer("none", "10.213.4.0/24", "0.0.0.0"),
                ],
                mode: Mode::Auto,
                want: Plan { routes: vec![direct_b.clone()], vxlan: None },
            },
        ];
        for c in cases {
            assert_eq!(plan(c.own, &c.peers, &lan, c.mode), c.want, "{}", c.name);
        }
    }

    #[test]
    fn one_masquerade_rule_per_range_and_none_per_pod() {
        let rules = masquerade_rules(&[net("10.213.2.0/24"), net("10.213.1.0/24"), net("10.213.2.0/24")]);
        assert_eq!(
            rules,
            "*nat\n:PINION-MASQ - [0:0]\n\
             -A PINION-MASQ -d 10.213.1.0/24 -j RETURN\n\
             -A PINION-MASQ -d 10.213.2.0/24 -j RETURN\n\
             -A PINION-MASQ -d 224.0.0.0/4 -j RETURN\n\
             -A PINION-MASQ -j MASQUERADE\nCOMMIT\n"
        );
    }

    #[test]
    fn modes_parse_and_a_bad_one_says_what_is_allowed() {
        assert_eq!("vxlan".parse::<Mode>(), Ok(Mode::Vxlan));
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        let e = "wireguard".parse::<Mode>().expect_err("refused");
        assert!(e.contains("auto") && e.contains("vxlan"), "{e}");
    }
}
