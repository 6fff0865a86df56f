//! Who may do what: the one answer to "may this identity do this to this
//! object", for every route of the API. Where the answer depends on the
//! object (a node reads only the pods bound to it), the command asks again
//! once it has read the object, inside its store write.

use specs::Pod;

use super::ClusterError;
use crate::tls::Identity;

/// What is asked, with the object where the answer depends on it.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// Health and version: open to anyone, certificate or not.
    Public,
    /// A join: open to anyone; the bootstrap token is the join's own check.
    Join,
    /// Anything that needs only a known identity before the object is read
    /// (reading a pod that may not exist, reporting a pod's status).
    Known,
    ReadMetrics,
    /// Listing or watching pods, of one node or of all.
    ReadPods {
        node: Option<&'a str>,
    },
    /// A pod as stored: read it, report its status, reject its binding.
    Pod(&'a Pod),
    CreatePod,
    DeletePod,
    PodLogs,
    AttachPod,
    ExecPod,
    ListNodes,
    WatchNodes,
    /// What a node does for itself: register, heartbeat, report, read itself.
    ActForNode(&'a str),
    DeleteNode,
    ListJobs,
    ReadJob,
    CreateJob,
    DeleteJob,
    ReadEvents,
}

/// `Ok` when `id` may make `request`; else why not, naming the identity.
pub fn authorize(id: &Identity, request: Request<'_>) -> Result<(), ClusterError> {
    let admin_only = |what: &str| match id {
        Identity::Admin => Ok(()),
        Identity::Node(n) => Err(ClusterError::Forbidden(format!("node {n:?} may not {what}"))),
        _ => Err(ClusterError::Forbidden(format!("may not {what}"))),
    };
    match request {
        Request::Public | Request::Join => return Ok(()),
        _ => {}
    }
    match id {
        Identity::Anonymous => {
            return Err(ClusterError::Unauthorized(
                "a client certificate is required (admin credentials or a joined node's)".into(),
            ))
        }
        Identity::Other(cn) => {
            return Err(ClusterError::Forbidden(format!("certificate {cn:?} is not an admin or node identity")))
        }
        Identity::Admin | Identity::Node(_) => {}
    }
    match request {
        Request::Public | Request::Join | Request::Known => Ok(()),
        Request::ReadPods { node } => match (id, node) {
            (Identity::Node(me), Some(n)) if n != me => {
                Err(ClusterError::Forbidden(format!("node {me:?} may not read the pods of node {n:?}")))
            }
            _ => Ok(()),
        },
        Request::Pod(pod) => match id {
            Identity::Node(n) if pod.spec.node_name.as_deref() != Some(n) => Err(ClusterError::Forbidden(format!(
                "node {n:?} may not access pod {:?} (not bound to it)",
                pod.metadata.name
            ))),
            _ => Ok(()),
        },
        Request::ActForNode(node) => match id {
            Identity::Node(n) if n != node => {
                Err(ClusterError::Forbidden(format!("node {n:?} may not act for node {node:?}")))
            }
            _ => Ok(()),
        },
        Request::ReadMetrics => admin_only("read the metrics"),
        Request::CreatePod => admin_only("create pods"),
        Request::DeletePod => admin_only("delete pods"),
        Request::PodLogs => admin_only("read pod logs"),
        Request::AttachPod => admin_only("attach to pods"),
        Request::ExecPod => admin_only("exec in pods"),
        Request::ListNodes => admin_only("list nodes"),
        Request::WatchNodes => admin_only("watch nodes"),
        Request::DeleteNode => admin_only("delete nodes"),
        Request::ListJobs => admin_only("list jobs"),
        Request::ReadJob => admin_only("read jobs"),
        Request::CreateJob => admin_only("create jobs"),
        Request::DeleteJob => admin_only("delete jobs"),
        Request::ReadEvents => admin_only("list events"),
    }
}

/// The node filter a pod list or watch really uses: a node sees only its own
/// pods, whatever it asked for (after `authorize` let it ask).
pub fn pods_visible_to(id: &Identity, node: Option<String>) -> Option<String> {
    match id {
        Identity::Node(me) => Some(me.clone()),
        _ => node,
    }
}
