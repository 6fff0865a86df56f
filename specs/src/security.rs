//! Pod security: the profiles a person's pods are held to, with the meaning
//! Kubernetes' Pod Security Standards give them.

use serde::{Deserialize, Serialize};

/// How much of the host a person's pods may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Profile {
    /// No host paths, no host network, not root, no added capability but
    /// `NET_BIND_SERVICE`.
    Restricted,
    /// Host paths under the prefixes an admin allows, host network and the
    /// capabilities beyond a short list only where granted, root only inside
    /// a user namespace of the pod's own.
    Baseline,
    /// Anything, as an admin's pods.
    Privileged,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Restricted => "restricted",
            Profile::Baseline => "baseline",
            Profile::Privileged => "privileged",
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Profile, String> {
        match s {
            "restricted" => Ok(Profile::Restricted),
            "baseline" => Ok(Profile::Baseline),
            "privileged" => Ok(Profile::Privileged),
            other => Err(format!("{other:?} is not a profile (restricted, baseline, privileged)")),
        }
    }
}
