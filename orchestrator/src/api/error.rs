//! API errors: every refusal is an `ApiError` body (code, reason, message, and
//! each field problem) with the matching HTTP status.

use specs::api::ApiError;
use specs::validate::FieldError;

use crate::cluster::ClusterError;
use crate::store::StoreError;

pub fn error(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
    ApiError { code, reason: reason.to_string(), message: message.into(), details: Vec::new() }
}

pub fn bad_request(message: impl Into<String>) -> ApiError {
    error(400, "BadRequest", message)
}

/// 400 caused by one field (of the body, the query or the path), named in
/// `details` so that a client can point at it without parsing the message.
/// As with `invalid`, the problem travels in `details` (which `Display`
/// lists) and the message is the summary.
pub fn bad_field(field: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_field(field, message)
}

/// 422 with every field problem.
pub fn invalid(kind: &str, name: &str, details: Vec<FieldError>) -> ApiError {
    // The problems travel in `details` (and `Display` lists them): the message is the summary.
    let n = details.len();
    let what = if name.is_empty() { kind.to_lowercase() } else { format!("{} {name:?}", kind.to_lowercase()) };
    let message = format!("{what} is invalid ({n} problem{})", if n == 1 { "" } else { "s" });
    ApiError { code: 422, reason: "Invalid".into(), message, details }
}

pub fn conflict(message: impl Into<String>) -> ApiError {
    error(409, "Conflict", message)
}

pub fn unauthorized(message: impl Into<String>) -> ApiError {
    error(401, "Unauthorized", message)
}

pub fn forbidden(message: impl Into<String>) -> ApiError {
    error(403, "Forbidden", message)
}

pub fn internal(message: impl Into<String>) -> ApiError {
    error(500, "InternalError", message)
}

/// The one mapping from the cluster's refusals to HTTP answers.
pub fn answer(e: ClusterError) -> ApiError {
    let message = e.to_string();
    match e {
        ClusterError::NotFound { .. } => error(404, "NotFound", message),
        ClusterError::Conflict(_) => conflict(message),
        ClusterError::Unauthorized(_) => unauthorized(message),
        ClusterError::Forbidden(_) => forbidden(message),
        ClusterError::Disallowed(details) => ApiError { details, ..forbidden(message) },
        ClusterError::Invalid(details) => ApiError { details, ..error(422, "Invalid", message) },
        ClusterError::Unschedulable(_) => error(422, "Unschedulable", message),
        // Nothing upstream failed (that is 502 NodeUnreachable): the node's
        // registration lacks what this needs, a state to change, not a server fault.
        ClusterError::NoNodeEndpoint(m) => error(409, "NoNodeEndpoint", m),
        ClusterError::BadField { field, message } => bad_field(field, message),
        // The node may try again later: a node deleted frees a range.
        ClusterError::PodRangesExhausted(_) => error(503, "PodRangesExhausted", message),
        ClusterError::NotLeader => error(503, "NotLeader", message),
        ClusterError::Store(e) => store_error(e),
        ClusterError::Internal(_) => internal(message),
    }
}

impl From<ClusterError> for ApiError {
    fn from(e: ClusterError) -> ApiError {
        answer(e)
    }
}

pub fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Gone { .. } => error(410, "Gone", e.to_string()),
        StoreError::Future { .. } => {
            let message = e.to_string();
            let field = FieldError { field: "resourceVersion".into(), message: message.clone() };
            ApiError { details: vec![field], ..bad_request(message) }
        }
        StoreError::Closed => error(503, "ShuttingDown", e.to_string()),
        // Another server leads: the client may try again (there, or here later).
        StoreError::NotLeader => error(503, "NotLeader", e.to_string()),
        StoreError::TooLarge { .. } => error(413, "TooLarge", e.to_string()),
        // etcd out of reach: the write was not acknowledged, and may be retried
        // (an unconfirmed one after reading it back, as the message says).
        StoreError::Failed(ref inner) if matches!(**inner, StoreError::Etcd(_) | StoreError::Unconfirmed(_)) => {
            error(503, "StoreUnavailable", e.to_string())
        }
        // The client may retry later; the message names the data dir and what to do.
        ref full if full.is_disk_full() => error(507, "InsufficientStorage", full.to_string()),
        other => internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;

    fn check(e: StoreError, code: u16, reason: &str) {
        let text = e.to_string();
        let api = store_error(e);
        assert_eq!((api.code, api.reason.as_str()), (code, reason), "{text}");
        assert_eq!(api.message, text);
    }

    #[test]
    fn store_errors_map_to_their_status() {
        let full = || StoreError::DiskFull { dir: PathBuf::from("/d/store"), available: 0, needed: 4 << 20 };
        let enospc = || sled::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull));
        check(full(), 507, "InsufficientStorage");
        check(StoreError::Failed(Arc::new(full())), 507, "InsufficientStorage");
        check(StoreError::Failed(Arc::new(StoreError::Sled(enospc()))), 507, "InsufficientStorage");
        let broken =
            |disk_full| StoreError::Broken { dir: PathBuf::from("/d/store"), cause: "sled: x".into(), disk_full };
        check(broken(true), 507, "InsufficientStorage");
        check(broken(false), 500, "InternalError");
        check(
            StoreError::Failed(Arc::new(StoreError::Sled(sled::Error::Unsupported("x".into())))),
            500,
            "InternalError",
        );
        check(StoreError::Closed, 503, "ShuttingDown");
        check(StoreError::NotLeader, 503, "NotLeader");
        check(
            StoreError::Failed(Arc::new(StoreError::Unconfirmed("no answer within 5s".into()))),
            503,
            "StoreUnavailable",
        );
        check(StoreError::Failed(Arc::new(StoreError::Etcd("connection refused".into()))), 503, "StoreUnavailable");
        check(StoreError::Gone { requested: 1, oldest: 5 }, 410, "Gone");
    }
}
