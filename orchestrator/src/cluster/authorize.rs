//! Who may do what: the one answer to "may this identity do this to this
//! object", for every route of the API. Where the answer depends on the
//! object (a node reads only the pods bound to it, a user only their own
//! pods and jobs), the command asks again once it has read the object,
//! inside its store write.
//!
//! The roles: the bootstrap `admin` certificate and people with the `admin`
//! role may do everything; a `viewer` reads everything and writes nothing; a
//! `user` creates pods and jobs and reads, follows, execs in and deletes only
//! their own, and sees another's as absent (404, not 403: not even its
//! existence); a node acts for itself and its pods only, and reads the
//! other nodes' specs (their pod ranges and addresses, to reach their pods),
//! not their status (`node_status_shown`).
//!
//! Reading an object is not reading its secrets: the values of a pod's or a
//! job template's env (tokens, passwords) are shown to its owner, admins and
//! the node that runs it; a viewer, who reads others' objects only through
//! its read-all power, gets the names alone (`EnvValues`).

use specs::api::Role;
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
    /// Listing or watching pods, of one node or of all (a user's list is
    /// then narrowed to their own, `visible`).
    ReadPods {
        node: Option<&'a str>,
    },
    /// A pod as stored, to read.
    Pod(&'a Pod),
    /// A pod as stored, to report its status or reject its binding: its
    /// node's part (and an admin's).
    ReportPod(&'a Pod),
    /// A stored pod or job, to act on as `access` says: a user must own it.
    Owned {
        kind: &'static str,
        name: &'a str,
        owner: Option<&'a str>,
        access: Access,
    },
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
    /// List or read Deployments (a user's list narrowed to their own; one
    /// read asks again with the object, `Owned`).
    ReadDeployments,
    /// Create or change (apply, scale, undo, restart, delete) Deployments;
    /// a change asks again with the object (`Owned`).
    WriteDeployments,
    /// List or read DaemonSets (as Deployments: a user's own).
    ReadDaemonSets,
    /// Create, change or delete DaemonSets; a change asks again with the
    /// object (`Owned`).
    WriteDaemonSets,
    /// List or read partitions (anyone known but nodes).
    ReadPartitions,
    /// Create, change or delete partitions (admin only).
    WritePartitions,
    /// Read the users' and accounts' fair shares (anyone known but nodes).
    ReadShares,
    ListUsers,
    /// Add, change or revoke a person.
    ManageUsers,
    /// A fresh certificate for the caller's own identity (any known one).
    Renew,
    /// List join tokens (admin only).
    ListTokens,
    /// Create or revoke a join token (admin only).
    ManageTokens,
}

/// How a request touches an object it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Get, list, watch, logs, attach.
    Read,
    /// Delete, exec.
    Write,
}

/// What a caller may do, by kind of identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    Everything,
    ReadAll,
    Own,
}

/// `Ok` when `id` may make `request`; else why not, naming the identity.
pub fn authorize(id: &Identity, request: Request<'_>) -> Result<(), ClusterError> {
    if let Request::Public | Request::Join = request {
        return Ok(());
    }
    let (power, who) = match id {
        Identity::Anonymous => {
            return Err(ClusterError::Unauthorized(
                "a client certificate is required (a user's or admin credentials, or a joined node's)".into(),
            ))
        }
        Identity::Other(cn) => {
            return Err(ClusterError::Forbidden(format!("certificate {cn:?} is not an admin, user or node identity")))
        }
        Identity::User(name) => {
            return Err(ClusterError::Unauthorized(format!("user {name:?} is not known to the cluster")))
        }
        Identity::Node(n) => return authorize_node(n, request),
        Identity::Admin => (Power::Everything, "admin".to_string()),
        Identity::Person(p) => {
            let power = match p.spec.role {
                Role::Admin => Power::Everything,
                Role::Viewer => Power::ReadAll,
                Role::User => Power::Own,
            };
            (power, format!("{} {:?}", p.spec.role, p.metadata.name))
        }
    };
    if power == Power::Everything {
        return Ok(());
    }
    let refuse = |what: &str| Err(ClusterError::Forbidden(format!("{who} may not {what}")));
    let writes = |what: &str| match power {
        Power::Own => Ok(()),
        _ => refuse(what),
    };
    match request {
        Request::Public | Request::Join | Request::Known => Ok(()),
        Request::ReadPods { .. } => Ok(()),
        Request::Pod(pod) => match power {
            Power::Own if pod.metadata.owner.as_deref() != person_name(id) => {
                Err(ClusterError::not_found("Pod", &pod.metadata.name))
            }
            _ => Ok(()),
        },
        Request::ReportPod(pod) => refuse(&format!("report the status of pod {:?}", pod.metadata.name)),
        Request::ListNodes
        | Request::WatchNodes
        | Request::ListJobs
        | Request::ReadJob
        | Request::ReadEvents
        | Request::ReadDeployments
        | Request::ReadDaemonSets
        | Request::ReadPartitions
        | Request::ReadShares => Ok(()),
        Request::Owned { kind, name, owner, access } => match power {
            Power::ReadAll if access == Access::Read => Ok(()),
            Power::ReadAll => refuse(&format!("change {} {name:?}", kind.to_lowercase())),
            // Another's object is absent to them, not forbidden: its very
            // existence is not theirs to learn.
            _ if owner != person_name(id) => Err(ClusterError::not_found(kind, name)),
            _ => Ok(()),
        },
        // Reads of one object: the command asks again with the object (`Owned`).
        Request::PodLogs | Request::AttachPod => Ok(()),
        Request::ReadMetrics => match power {
            Power::ReadAll => Ok(()),
            _ => refuse("read the metrics"),
        },
        Request::ListUsers => match power {
            Power::ReadAll => Ok(()),
            _ => refuse("list users"),
        },
        Request::CreatePod => writes("create pods"),
        Request::DeletePod => writes("delete pods"),
        Request::ExecPod => writes("exec in pods"),
        Request::CreateJob => writes("create jobs"),
        Request::DeleteJob => writes("delete jobs"),
        Request::WriteDeployments => writes("create or change deployments"),
        Request::WriteDaemonSets => writes("create or change daemonsets"),
        Request::ActForNode(n) => refuse(&format!("act for node {n:?}")),
        Request::DeleteNode => refuse("delete nodes"),
        Request::ManageUsers => refuse("manage users"),
        Request::WritePartitions => refuse("create, change or delete partitions"),
        Request::Renew => Ok(()),
        Request::ListTokens => refuse("list join tokens"),
        Request::ManageTokens => refuse("manage join tokens"),
    }
}

/// A node's narrow rights: itself, and the pods bound to it.
fn authorize_node(me: &str, request: Request<'_>) -> Result<(), ClusterError> {
    let refuse = |what: &str| Err(ClusterError::Forbidden(format!("node {me:?} may not {what}")));
    match request {
        Request::Public | Request::Join | Request::Known => Ok(()),
        Request::ReadPods { node: Some(n) } if n != me => refuse(&format!("read the pods of node {n:?}")),
        Request::ReadPods { .. } => Ok(()),
        Request::Pod(pod) | Request::ReportPod(pod) if pod.spec.node_name.as_deref() != Some(me) => {
            refuse(&format!("access pod {:?} (not bound to it)", pod.metadata.name))
        }
        Request::Pod(_) | Request::ReportPod(_) => Ok(()),
        Request::ActForNode(n) if n != me => refuse(&format!("act for node {n:?}")),
        Request::ActForNode(_) => Ok(()),
        Request::Owned { kind, name, .. } => refuse(&format!("access {} {name:?}", kind.to_lowercase())),
        Request::ReadMetrics => refuse("read the metrics"),
        Request::CreatePod => refuse("create pods"),
        Request::DeletePod => refuse("delete pods"),
        Request::PodLogs => refuse("read pod logs"),
        Request::AttachPod => refuse("attach to pods"),
        Request::ExecPod => refuse("exec in pods"),
        // Its peers' ranges and addresses; the status is left out of what it reads.
        Request::ListNodes | Request::WatchNodes => Ok(()),
        Request::DeleteNode => refuse("delete nodes"),
        Request::ListJobs => refuse("list jobs"),
        Request::ReadJob => refuse("read jobs"),
        Request::CreateJob => refuse("create jobs"),
        Request::DeleteJob => refuse("delete jobs"),
        Request::ReadDeployments => refuse("read deployments"),
        Request::WriteDeployments => refuse("create or change deployments"),
        Request::ReadDaemonSets => refuse("read daemonsets"),
        Request::WriteDaemonSets => refuse("create or change daemonsets"),
        Request::ReadPartitions => refuse("read partitions"),
        Request::ReadShares => refuse("read fair shares"),
        Request::ReadEvents => refuse("list events"),
        Request::ListUsers => refuse("list users"),
        Request::ManageUsers => refuse("manage users"),
        Request::WritePartitions => refuse("create, change or delete partitions"),
        Request::Renew => Ok(()),
        Request::ListTokens => refuse("list join tokens"),
        Request::ManageTokens => refuse("manage join tokens"),
    }
}

/// The name a caller's objects are owned under: `admin` for the bootstrap
/// certificate, a person's name; nodes and strangers own nothing.
pub fn person_name(id: &Identity) -> Option<&str> {
    match id {
        Identity::Admin => Some("admin"),
        Identity::Person(p) => Some(&p.metadata.name),
        _ => None,
    }
}

/// Whether a caller sees an object with this owner in lists and watches: a
/// user sees only their own; everyone else who may list sees all.
pub fn sees(id: &Identity, owner: Option<&str>) -> bool {
    match id {
        Identity::Person(p) if p.spec.role == Role::User => owner == Some(p.metadata.name.as_str()),
        _ => true,
    }
}

/// The owner a list or watch is narrowed to (`None`: every owner).
pub fn owner_filter(id: &Identity) -> Option<String> {
    match id {
        Identity::Person(p) if p.spec.role == Role::User => Some(p.metadata.name.clone()),
        _ => None,
    }
}

/// Whose env values a caller is shown in the pods and job templates it reads:
/// its owner's, an admin's and a node's business, not a viewer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValues {
    /// Every object's: admins, and nodes (which run what they are given).
    All,
    /// Only those of the objects this person owns: a viewer (or a user, who
    /// reads no one else's anyway) sees another's names without values.
    OwnedBy(String),
    /// No object's: the local listener, which every user of the machine
    /// may call, and identities refused before any reply.
    None,
}

impl EnvValues {
    /// Whether an object with this owner is shown with its env values.
    pub fn shows(&self, owner: Option<&str>) -> bool {
        match self {
            EnvValues::All => true,
            EnvValues::OwnedBy(me) => owner == Some(me.as_str()),
            EnvValues::None => false,
        }
    }
}

/// The env values `id` is shown (`EnvValues`).
pub fn env_values(id: &Identity) -> EnvValues {
    match id {
        Identity::Admin | Identity::Node(_) => EnvValues::All,
        Identity::Person(p) if p.spec.role == Role::Admin => EnvValues::All,
        Identity::Person(p) => EnvValues::OwnedBy(p.metadata.name.clone()),
        Identity::User(_) | Identity::Anonymous | Identity::Other(_) => EnvValues::None,
    }
}

/// Whether the nodes `id` lists or watches come with their status. A node
/// reads the others' metadata and spec (pod range, address) only: their
/// status names the pods they run, which are not its business.
pub fn node_status_shown(id: &Identity) -> bool {
    !matches!(id, Identity::Node(_))
}

/// The node filter a pod list or watch really uses: a node sees only its own
/// pods, whatever it asked for (after `authorize` let it ask).
pub fn pods_visible_to(id: &Identity, node: Option<String>) -> Option<String> {
    match id {
        Identity::Node(me) => Some(me.clone()),
        _ => node,
    }
}
