//! The node's view of the cluster's pod network, for the parts that act on
//! it (the routes to other nodes' pods; the default network's range, `cni`):
//! this node's own pod range, the server's choice, learned from its
//! registration's reply; and its peers, every other node with a range and
//! an address, kept current from the server's node watch.
//!
//! The view is a `tokio::sync::watch` channel of [`NetView`]. `daemon::run`
//! makes it (or takes the sender its caller gave, `DaemonConfig::net_view`)
//! and the link writes it; a consumer holds a `watch::Receiver<NetView>`
//! from `Sender::subscribe`: `borrow()` for the view now, `changed()` to
//! wait for the next. It changes only when a range or an address does (a
//! node's status reports wake no one). Peers are sorted by name; a node
//! without a range (registered before ranges) or an address (an older
//! nodelet), or with one that does not parse, is left out.
//!
//! The own range is also written to `<data>/cni/pod-cidr` (fsynced) as soon
//! as a registration's reply brings a new one, before the link follows its
//! bindings: the default network reads it at each pod setup (`cni`), and a
//! node started again while the server is away starts with it.
//!
//! The peers come from a list of the nodes, then their watch (a node reads
//! the others' metadata and spec, never their status), each read bounded by
//! the client (a list by its request timeout, the watch by its silence
//! bound); a watch that ends or fails is listed again after the link's
//! backoff.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::Method;
use pinion_wire::backoff::Doubling;
use pinion_wire::{Client, ClientError};
use specs::api::{List, Node, WatchEventType};
pub use specs::net::Ipv4Net;
use tokio::sync::watch;

/// The own range's file, in the pod networks' state folder (`<data>/cni`).
pub(crate) const OWN_CIDR_FILE: &str = "pod-cidr";
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY: Doubling = Doubling::new(RETRY_MIN, Duration::from_secs(10));

/// Another node, as the routes to its pods need it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    /// Its node name.
    pub name: String,
    /// Its pod range (`spec.podCIDR`).
    pub pod_cidr: Ipv4Net,
    /// The address it is reached on (`spec.address`).
    pub address: IpAddr,
}

/// What this node knows of the pod network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetView {
    /// This node's pod range: `None` until a server has given one (a node
    /// not joined, or not registered yet on its first start).
    pub own_cidr: Option<Ipv4Net>,
    /// Every other node with a range and an address, by name.
    pub peers: Vec<Peer>,
}

/// A new view, its own range as this node last recorded it.
pub fn channel(data_dir: &Path) -> (watch::Sender<NetView>, watch::Receiver<NetView>) {
    watch::channel(NetView { own_cidr: read_own_cidr(&own_cidr_path(data_dir)), peers: Vec::new() })
}

/// Where the node's own range is kept under its data dir.
pub(crate) fn own_cidr_path(data_dir: &Path) -> PathBuf {
    data_dir.join("cni").join(OWN_CIDR_FILE)
}

/// The range recorded at `path`; `None` when there is none or it does not
/// parse (said once, here).
pub(crate) fn read_own_cidr(path: &Path) -> Option<Ipv4Net> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the node's pod range");
            return None;
        }
    };
    match text.trim().parse() {
        Ok(range) => Some(range),
        Err(_) => {
            tracing::warn!(file = %path.display(), "the node's recorded pod range does not parse; ignored");
            None
        }
    }
}

/// A registration's reply: its range becomes the view's own (recorded
/// durably first when it is new). A reply without one (a server that
/// predates ranges) leaves the view as it is.
pub(crate) fn learn_own(view: &watch::Sender<NetView>, data_dir: &Path, reply: &Node) -> std::io::Result<()> {
    let Some(text) = reply.spec.pod_cidr.as_deref() else { return Ok(()) };
    let Ok(range) = text.parse::<Ipv4Net>() else {
        tracing::warn!(range = text, "the server gave a pod range that does not parse; ignored");
        return Ok(());
    };
    if view.borrow().own_cidr == Some(range) {
        return Ok(());
    }
    let path = own_cidr_path(data_dir);
    if let Some(dir) = path.parent() {
        crate::fsutil::private_dir(dir)?;
    }
    crate::fsutil::write_atomic(&path, format!("{range}\n").as_bytes())?;
    tracing::info!(range = %range, "this node's pod range");
    view.send_modify(|v| v.own_cidr = Some(range));
    Ok(())
}

/// `node` as a peer of `me`: another node with a range and an address.
fn peer_of(me: &str, node: &Node) -> Option<Peer> {
    let name = &node.metadata.name;
    if name == me {
        return None;
    }
    let pod_cidr = node.spec.pod_cidr.as_deref()?.parse().ok();
    let address = node.spec.address.as_deref()?.parse().ok();
    match (pod_cidr, address) {
        (Some(pod_cidr), Some(address)) => Some(Peer { name: name.clone(), pod_cidr, address }),
        _ => {
            tracing::debug!(node = %name, "a node whose range or address does not parse is no peer");
            None
        }
    }
}

/// The peers become `known` (only when that changes them).
fn publish(view: &watch::Sender<NetView>, known: &BTreeMap<String, Peer>) {
    view.send_if_modified(|v| {
        let peers: Vec<Peer> = known.values().cloned().collect();
        if v.peers == peers {
            return false;
        }
        let names: Vec<String> = peers.iter().map(|p| format!("{} {} via {}", p.name, p.pod_cidr, p.address)).collect();
        tracing::info!(peers = ?names, "the other nodes' pod ranges");
        v.peers = peers;
        true
    });
}

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the server ended the nodes' watch")]
    Ended,
}

/// Keeps the view's peers current until `stop` turns true: list, then watch
/// from the list's version; listed again, after a backoff, whenever the
/// watch ends or fails. The peers stay as they were meanwhile.
pub(crate) async fn follow(client: Client, me: String, view: watch::Sender<NetView>, mut stop: watch::Receiver<bool>) {
    let mut delay = RETRY_MIN;
    loop {
        match watch_once(&client, &me, &view, &mut stop, &mut delay).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "the nodes' watch failed; peers kept as they were"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        delay = RETRY.after(delay);
    }
}

/// One list and the watch after it; `Ok` when stopped. `delay` starts over
/// once the watch is open.
async fn watch_once(
    client: &Client,
    me: &str,
    view: &watch::Sender<NetView>,
    stop: &mut watch::Receiver<bool>,
    delay: &mut Duration,
) -> Result<(), FollowError> {
    let (_, list): (u16, List<Node>) = client.call(Method::GET, "/api/v1/nodes", None).await?;
    let mut known: BTreeMap<String, Peer> =
        list.items.iter().filter_map(|n| peer_of(me, n)).map(|p| (p.name.clone(), p)).collect();
    publish(view, &known);
    let mut w = client.watch_nodes(Some(list.resource_version)).await?;
    *delay = RETRY_MIN;
    loop {
        let next = tokio::select! {
            n = w.next() => n?,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let Some((ty, node)) = next else { return Err(FollowError::Ended) };
        match ty {
            WatchEventType::Added | WatchEventType::Modified => match peer_of(me, &node) {
                Some(p) => known.insert(p.name.clone(), p),
                None => known.remove(&node.metadata.name),
            },
            WatchEventType::Deleted => known.remove(&node.metadata.name),
            WatchEventType::Error => return Err(FollowError::Ended),
            WatchEventType::Bookmark => continue,
        };
        publish(view, &known);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    fn node(name: &str, pod_cidr: Option<&str>, address: Option<&str>) -> Node {
        let mut n = Node {
            api_version: specs::pod::API_VERSION.into(),
            kind: "Node".into(),
            metadata: specs::pod::ObjectMeta { name: name.into(), ..Default::default() },
            spec: Default::default(),
            status: Default::default(),
        };
        n.spec.pod_cidr = pod_cidr.map(str::to_string);
        n.spec.address = address.map(str::to_string);
        n
    }

    #[test]
    fn a_peer_is_another_node_with_a_range_and_an_address() {
        let peer = |name: &str, cidr: &str, addr: &str| {
            Some(Peer { name: name.into(), pod_cidr: cidr.parse().unwrap(), address: addr.parse().unwrap() })
        };
        let cases = [
            (node("b", Some("10.213.1.0/24"), Some("192.0.2.2")), peer("b", "10.213.1.0/24", "192.0.2.2")),
            (node("b", Some("10.213.1.0/24"), Some("2001:db8::2")), peer("b", "10.213.1.0/24", "2001:db8::2")),
            (node("a", Some("10.213.0.0/24"), Some("192.0.2.1")), None),
            (node("b", None, Some("192.0.2.2")), None),
            (node("b", Some("10.213.1.0/24"), None), None),
            (node("b", Some("10.213.1.0"), Some("192.0.2.2")), None),
            (node("b", Some("10.213.1.0/24"), Some("b.example")), None),
        ];
        for (n, want) in cases {
            assert_eq!(peer_of("a", &n), want, "{:?}", n.spec);
        }
    }

    #[test]
    fn the_own_range_is_recorded_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = channel(dir.path());
        assert_eq!(rx.borrow_and_update().own_cidr, None);
        learn_own(&tx, dir.path(), &node("a", None, None)).unwrap();
        assert!(!rx.has_changed().unwrap(), "a reply without a range changes nothing");
        learn_own(&tx, dir.path(), &node("a", Some("10.213.4.0/24"), None)).unwrap();
        assert_eq!(rx.borrow_and_update().own_cidr, Some("10.213.4.0/24".parse().unwrap()));
        learn_own(&tx, dir.path(), &node("a", Some("10.213.4.0/24"), None)).unwrap();
        assert!(!rx.has_changed().unwrap(), "the same range again wakes no one");
        let path = own_cidr_path(dir.path());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "10.213.4.0/24\n");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        // A node started again starts with it.
        let (_, again) = channel(dir.path());
        assert_eq!(again.borrow().own_cidr, Some("10.213.4.0/24".parse().unwrap()));
        std::fs::write(&path, "garbage\n").unwrap();
        assert_eq!(channel(dir.path()).1.borrow().own_cidr, None);
    }

    #[test]
    fn peers_are_published_only_when_they_change() {
        let (tx, mut rx) = watch::channel(NetView::default());
        let mut known = BTreeMap::new();
        publish(&tx, &known);
        assert!(!rx.has_changed().unwrap());
        let b = Peer {
            name: "b".into(),
            pod_cidr: "10.213.1.0/24".parse().unwrap(),
            address: "192.0.2.2".parse().unwrap(),
        };
        known.insert("b".to_string(), b.clone());
        publish(&tx, &known);
        assert_eq!(rx.borrow_and_update().peers, [b]);
        publish(&tx, &known);
        assert!(!rx.has_changed().unwrap());
    }
}
