//! Semantic validation of API objects: every problem with its field path.

use crate::pod::Pod;

/// One problem: `spec.containers[1].resources.limits.cpu: must be >= requests.cpu`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem in a pod, in field order. Empty means valid.
pub fn validate_pod(pod: &Pod) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if pod.metadata.name.is_empty() {
        errs.push(FieldError { field: "metadata.name".into(), message: "must not be empty".into() });
    }
    errs
}
