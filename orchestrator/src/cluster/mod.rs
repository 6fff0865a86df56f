//! The cluster's rules, apart from how they are asked for: each user or node
//! command is a function over one store write (`Txn`) that returns a typed
//! `ClusterError`, and `authorize` is the one answer to who may do what. The
//! API authorizes, parses, calls, and maps a `ClusterError` to HTTP once
//! (`api::error::answer`); the controller calls the same functions. Nothing
//! here knows of HTTP or of the API layer (a test checks the imports).

pub mod acct;
mod authorize;
pub mod daemonsets;
pub mod deployments;
mod error;
pub mod jobs;
pub mod nodes;
pub mod partitions;
pub mod pods;
#[cfg(test)]
mod tests;
pub mod tokens;
pub mod users;

pub use authorize::{
    authorize, env_values, node_status_shown, owner_filter, person_name, pods_visible_to, sees, Access, EnvValues,
    Request,
};
pub use error::ClusterError;
use specs::api::{Event, ObjectRef};
use specs::pod::ObjectMeta;
pub use users::resolve;

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub fn event(kind: &str, name: &str, event_type: &str, reason: &str, message: impl Into<String>) -> Event {
    Event {
        metadata: ObjectMeta::default(),
        involved_object: ObjectRef { kind: kind.into(), name: name.into() },
        event_type: event_type.into(),
        reason: reason.into(),
        message: message.into(),
        timestamp: now_rfc3339(),
    }
}

/// A new object's uid: 16 characters of the random token alphabet.
pub fn new_uid() -> Result<String, ClusterError> {
    let token = crate::tls::random_token().map_err(|e| ClusterError::Internal(e.to_string()))?;
    Ok(token.chars().take(16).collect())
}
