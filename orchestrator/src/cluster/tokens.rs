//! Join tokens: made by an admin with a lifetime and a number of uses, listed
//! without their secret, revoked (the record stays, so that nothing brings a
//! revoked token back); checked by a join inside the same store write that
//! claims the node's name, so a use is spent only by a join that got its
//! name. The token `pinion up` and `server` make at first start is the record
//! named `bootstrap`: a token given without an id is that one.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use specs::api::{Token, TokenSpec};
use specs::pod::ObjectMeta;

use super::ClusterError;
use crate::store::Txn;

/// The record of the first start's token (`DATA_DIR/join-token`).
pub const BOOTSTRAP: &str = "bootstrap";

/// What an admin asks for.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// Chosen by the server, the record's name.
    pub id: String,
    /// Hex SHA-256 of the secret (which is never stored).
    pub secret_sha256: String,
    /// None: never expires.
    pub ttl: Option<Duration>,
    /// None: unlimited.
    pub uses: Option<u32>,
    pub description: String,
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn record(new: &NewToken, now: DateTime<Utc>) -> Token {
    let expires = new
        .ttl
        .and_then(|ttl| chrono::Duration::from_std(ttl).ok())
        .and_then(|ttl| now.checked_add_signed(ttl))
        .map(rfc3339);
    Token {
        api_version: specs::pod::API_VERSION.into(),
        kind: "Token".into(),
        metadata: ObjectMeta { name: new.id.clone(), creation_timestamp: Some(rfc3339(now)), ..Default::default() },
        spec: TokenSpec {
            secret_sha256: new.secret_sha256.clone(),
            expires,
            uses_left: new.uses,
            description: new.description.clone(),
            revoked: None,
        },
    }
}

/// Stores a new token; an id already used (even by a revoked one) is a conflict.
pub fn create(t: &mut Txn<'_>, new: &NewToken, now: DateTime<Utc>) -> Result<Token, ClusterError> {
    if t.get::<Token>(&new.id)?.is_some() {
        return Err(ClusterError::Conflict(format!("token {:?} exists", new.id)));
    }
    let mut token = record(new, now);
    t.put(&mut token)?;
    Ok(token)
}

/// The bootstrap token's record, made with this lifetime when there is none;
/// one there already (valid, expired or revoked) is left as it is, so that a
/// restart, or a second server of the cluster, never renews or revives it.
/// Returns the record and whether it was made now.
pub fn ensure_bootstrap(
    t: &mut Txn<'_>,
    secret_sha256: &str,
    ttl: Option<Duration>,
    now: DateTime<Utc>,
) -> Result<(Token, bool), ClusterError> {
    if let Some(existing) = t.get::<Token>(BOOTSTRAP)? {
        return Ok((existing, false));
    }
    let new = NewToken {
        id: BOOTSTRAP.into(),
        secret_sha256: secret_sha256.into(),
        ttl,
        uses: None,
        description: "made at the first start (DATA_DIR/join-token)".into(),
    };
    create(t, &new, now).map(|t| (t, true))
}

/// Marks a token revoked (at once: the next join with it is refused).
pub fn revoke(t: &mut Txn<'_>, id: &str, now: DateTime<Utc>) -> Result<Token, ClusterError> {
    let Some(mut token) = t.get::<Token>(id)? else { return Err(ClusterError::not_found("Token", id)) };
    if token.spec.revoked.is_none() {
        token.spec.revoked = Some(rfc3339(now));
        t.put(&mut token)?;
    }
    Ok(token)
}

/// Why a token does not admit a join now; `None` when it does.
pub fn refusal(token: &Token, now: DateTime<Utc>) -> Option<String> {
    let id = &token.metadata.name;
    if let Some(at) = &token.spec.revoked {
        return Some(format!("the join token {id:?} was revoked at {at}"));
    }
    if let Some(expires) = &token.spec.expires {
        // An expiry that does not parse admits nothing: fail closed.
        match DateTime::parse_from_rfc3339(expires) {
            Ok(at) if now < at => {}
            _ => {
                return Some(format!(
                    "the join token {id:?} expired at {expires}; make another with `pinion token create`"
                ))
            }
        }
    }
    if token.spec.uses_left == Some(0) {
        return Some(format!("the join token {id:?} has no uses left; make another with `pinion token create`"));
    }
    None
}

/// Checks a join's token against its record and spends one use, in the
/// join's own write: `id` is the token's id (`None`: the bootstrap token),
/// `secret_sha256` the digest of the secret it carried.
pub fn spend(t: &mut Txn<'_>, id: Option<&str>, secret_sha256: &str, now: DateTime<Utc>) -> Result<(), ClusterError> {
    let id = id.unwrap_or(BOOTSTRAP);
    let unknown = || ClusterError::Unauthorized("the join token is not valid".into());
    let Some(mut token) = t.get::<Token>(id)? else { return Err(unknown()) };
    if !crate::tls::token_matches(secret_sha256, &token.spec.secret_sha256) {
        return Err(unknown());
    }
    if let Some(why) = refusal(&token, now) {
        return Err(ClusterError::Unauthorized(why));
    }
    if let Some(left) = token.spec.uses_left {
        token.spec.uses_left = Some(left.saturating_sub(1));
        t.put(&mut token)?;
    }
    Ok(())
}

/// A token as listed: without its secret's digest.
pub fn without_secret(mut token: Token) -> Token {
    token.spec.secret_sha256.clear();
    token
}
