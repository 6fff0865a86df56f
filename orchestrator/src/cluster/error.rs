//! Why a command of the cluster was not carried out. The API maps each case to
//! an HTTP answer in one place (`api::error::answer`); the controller decides
//! from the case, never from a status code.

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{} {name:?} not found", kind.to_lowercase())]
    NotFound { kind: &'static str, name: String },
    /// The object's state refuses the command (exists with another spec,
    /// already bound, finished).
    #[error("{0}")]
    Conflict(String),
    /// Who asks is not known (no certificate naming an identity).
    #[error("{0}")]
    Unauthorized(String),
    /// Who asks is known and may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// Who asks may create such objects, not with these fields (a pod
    /// security profile's refusals), each at its field.
    #[error("{}", join_fields(.0))]
    Disallowed(Vec<specs::validate::FieldError>),
    /// The request's fields, each problem at its field.
    #[error("{}", join_fields(.0))]
    Invalid(Vec<specs::validate::FieldError>),
    /// No node of the cluster could ever hold the pod or gang.
    #[error("{0}")]
    Unschedulable(String),
    /// The node registered no endpoint, so what the command needs from it
    /// cannot be reached.
    #[error("{0}")]
    NoNodeEndpoint(String),
    /// A field of the request names something the object does not have.
    #[error("{field}: {message}")]
    BadField { field: &'static str, message: String },
    /// A node cannot register: every pod range of the cluster range is
    /// held (a node deleted frees its own).
    #[error("{0}")]
    PodRangesExhausted(String),
    /// Another server leads the cluster: a node's calls go there.
    #[error("this server does not lead the cluster now: a node's calls go to the leader (try the next server)")]
    NotLeader,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

fn join_fields(problems: &[specs::validate::FieldError]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl ClusterError {
    pub fn not_found(kind: &'static str, name: &str) -> ClusterError {
        ClusterError::NotFound { kind, name: name.to_string() }
    }

    /// Whether the server, not the object, stood in the way: the same command
    /// may succeed later (a full disk, an unreachable store, leadership moving).
    pub fn is_server_fault(&self) -> bool {
        matches!(self, ClusterError::Store(_) | ClusterError::NotLeader | ClusterError::Internal(_))
    }
}
