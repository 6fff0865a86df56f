//! The rules of people: adding one (a new incarnation each time), revoking
//! one (their certificates are refused from the next request on, on every
//! server), knowing a certificate's holder at each request, and what their
//! pods are held to.

use std::sync::Arc;

use specs::api::{User, UserSpec};
use specs::security::{Policy, Profile, UnixUser};
use specs::validate::FieldError;

use super::{now_rfc3339, ClusterError};
use crate::store::{Store, Txn};
use crate::tls::Identity;

/// The name the bootstrap certificate owns objects under; no person may
/// take it.
pub const ADMIN_NAME: &str = "admin";

/// Adds a person, or adds a revoked one again under a new incarnation
/// (`uid`), which their old certificates do not carry. A person not revoked
/// is a conflict: revoke first.
pub fn add(t: &mut Txn<'_>, given: &User, uid: &str) -> Result<User, ClusterError> {
    let name = given.metadata.name.clone();
    let problems = validate(given);
    if !problems.is_empty() {
        return Err(ClusterError::Invalid(problems));
    }
    if let Some(existing) = t.get::<User>(&name)? {
        if existing.spec.revoked.is_none() {
            return Err(ClusterError::Conflict(format!(
                "user {name:?} exists; revoke them first (pinion user revoke {name}) to issue new credentials"
            )));
        }
    }
    let mut user = User {
        api_version: specs::pod::API_VERSION.into(),
        kind: "User".into(),
        metadata: specs::pod::ObjectMeta {
            name,
            uid: Some(uid.to_string()),
            creation_timestamp: Some(now_rfc3339()),
            labels: given.metadata.labels.clone(),
            ..Default::default()
        },
        spec: UserSpec { revoked: None, ..given.spec.clone() },
    };
    t.put(&mut user)?;
    Ok(user)
}

/// Every problem of a person as given, at its field.
pub fn validate(user: &User) -> Vec<FieldError> {
    let mut problems = Vec::new();
    let mut push = |field: &str, message: String| problems.push(FieldError { field: field.into(), message });
    let name = &user.metadata.name;
    if let Some(p) = specs::validate::name_problem(name) {
        push("metadata.name", p);
    } else if !specs::validate::is_dns1123_label(name) {
        push("metadata.name", format!("{name:?}: want lower-case letters, digits and '-' (a DNS-1123 label)"));
    }
    if name == ADMIN_NAME {
        push("metadata.name", format!("{ADMIN_NAME:?} is the bootstrap certificate's name"));
    }
    for (i, cap) in user.spec.capabilities.iter().enumerate() {
        if specs::pod::capability_name(cap).is_none() {
            push(&format!("spec.capabilities[{i}]"), format!("unknown capability {cap:?}"));
        }
    }
    if user.spec.capabilities.len() > specs::pod::CAPABILITIES.len() {
        push("spec.capabilities", format!("at most {} entries", specs::pod::CAPABILITIES.len()));
    }
    if user.spec.groups.len() > specs::limits::MAX_SUPPLEMENTAL_GROUPS {
        push("spec.groups", format!("at most {} groups", specs::limits::MAX_SUPPLEMENTAL_GROUPS));
    }
    let ids = [("spec.uid", user.spec.uid), ("spec.gid", user.spec.gid)];
    for (field, id) in ids.into_iter().chain(user.spec.groups.iter().map(|g| ("spec.groups", Some(*g)))) {
        if id == Some(u32::MAX) {
            push(field, "4294967295 is not an id".into());
        }
    }
    if user.spec.uid == Some(0) {
        push("spec.uid", "0 is root: a person's pods do not run as root on the host".into());
    }
    problems
}

/// Revokes a person: every certificate of theirs is refused from now on. The
/// record stays, so the objects they own keep a name.
pub fn revoke(t: &mut Txn<'_>, name: &str) -> Result<User, ClusterError> {
    let Some(mut user) = t.get::<User>(name)? else { return Err(ClusterError::not_found("User", name)) };
    if user.spec.revoked.is_none() {
        user.spec.revoked = Some(now_rfc3339());
        t.put(&mut user)?;
    }
    Ok(user)
}

/// Who a certificate's holder is at this request. A person must be in the
/// store, not revoked, and hold a certificate of their current incarnation
/// (`incarnation`, from the certificate); a node must hold its name's join
/// claim with the same incarnation; anyone else is as presented.
pub fn resolve(store: &Store, presented: &Identity, incarnation: Option<&str>) -> Result<Identity, ClusterError> {
    if let Identity::Node(name) = presented {
        // A node acts while the join that issued its certificate holds the
        // name: deleting the node, or a new join of the name, ends it.
        return match super::nodes::incarnation(store, name)? {
            Some(current) if current == incarnation.unwrap_or("") => Ok(presented.clone()),
            Some(_) => Err(ClusterError::Unauthorized(format!(
                "these credentials of node {name:?} are from an earlier join (the node was deleted and joined again)"
            ))),
            None => Err(ClusterError::Unauthorized(format!(
                "node {name:?} is not joined (it was deleted): its credentials are no longer valid"
            ))),
        };
    }
    let Identity::User(name) = presented else { return Ok(presented.clone()) };
    let user = store.get::<User>(name)?;
    let Some(user) = user else {
        return Err(ClusterError::Unauthorized(format!("user {name:?} is not known to the cluster")));
    };
    if user.spec.revoked.is_some() {
        return Err(ClusterError::Unauthorized(format!("the credentials of user {name:?} were revoked")));
    }
    if incarnation.is_none() || user.metadata.uid.as_deref() != incarnation {
        return Err(ClusterError::Unauthorized(format!(
            "these credentials of user {name:?} were revoked (the user was added again since)"
        )));
    }
    Ok(Identity::Person(Arc::new(user)))
}

/// What a person's pods run as and are held to, for `specs::security`.
pub struct Held {
    pub who: String,
    pub profile: Profile,
    pub unix: UnixUser,
    pub capabilities: Vec<String>,
    pub host_network: bool,
}

impl Held {
    /// `None` for a caller whose pods run as they say (the bootstrap admin,
    /// a person with the privileged profile).
    pub fn of(id: &Identity) -> Option<Held> {
        let Identity::Person(user) = id else { return None };
        let profile = user.spec.profile();
        if profile == Profile::Privileged {
            return None;
        }
        Some(Held {
            who: format!("user {}", user.metadata.name),
            profile,
            unix: UnixUser {
                name: user.metadata.name.clone(),
                uid: user.spec.uid,
                gid: user.spec.gid,
                groups: user.spec.groups.clone(),
            },
            capabilities: user.spec.capabilities.clone(),
            host_network: user.spec.host_network,
        })
    }

    /// Fills in whom the pod runs as, then every refusal of the profile, as
    /// one `Invalid` error listing them.
    pub fn apply(
        &self,
        spec: &mut specs::PodSpec,
        prefix: &str,
        allowed_host_paths: &[String],
    ) -> Result<(), ClusterError> {
        specs::security::run_as(spec, &self.unix);
        let policy = Policy {
            who: &self.who,
            profile: self.profile,
            allowed_host_paths,
            granted_capabilities: &self.capabilities,
            host_network: self.host_network,
            unix: Some(&self.unix),
        };
        let problems = specs::security::check(spec, prefix, &policy);
        if problems.is_empty() {
            return Ok(());
        }
        Err(ClusterError::Disallowed(problems))
    }
}
