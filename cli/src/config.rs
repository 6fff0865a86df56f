//! Where the CLI finds its credentials: `--config` / `PINION_CONFIG`, else
//! `$XDG_CONFIG_HOME/pinion/config`, else `~/.config/pinion/config`. The file is
//! the YAML `orchestrator::tls::Credentials` (server URLs, CA, client cert,
//! key); `--server` replaces the file's list of servers. A file whose
//! certificate is two thirds into its life is renewed in place, quietly, by
//! whatever command reads it (`POST /api/v1/renew`).

use std::path::PathBuf;

use anyhow::Context;
use orchestrator::tls::Credentials;
use pinion_wire::Client;

use crate::common::GlobalArgs;

/// The default location when no `--config` is given.
pub fn default_path() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("pinion/config"));
    }
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".config/pinion/config"))
}

pub fn path(g: &GlobalArgs) -> anyhow::Result<PathBuf> {
    match &g.config {
        Some(p) => Ok(p.clone()),
        None => default_path().context("no --config given and neither XDG_CONFIG_HOME nor HOME is set"),
    }
}

pub fn load(g: &GlobalArgs) -> anyhow::Result<Credentials> {
    let p = path(g)?;
    if !p.exists() {
        anyhow::bail!(
            "no credentials at {} (pass --config DIR/admin.conf from `pinion server`, or set PINION_CONFIG)",
            p.display()
        );
    }
    let mut creds = Credentials::load(&p)?;
    if !g.servers.is_empty() {
        creds.servers = g.servers.clone();
    }
    Ok(creds)
}

pub fn client(g: &GlobalArgs) -> anyhow::Result<Client> {
    let mut creds = load(g)?;
    if creds.renewal_due(std::time::SystemTime::now()).unwrap_or(false) {
        if let Some(renewed) = renew(g, &creds) {
            creds = renewed;
        }
    }
    Ok(Client::new(&creds)?.with_liveness(g.liveness()))
}

/// The longest a renewal may hold up the command that asked for it.
const RENEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The credentials file renewed (same identity, a fresh lifetime), written
/// back in place (0600, atomically); `None`, logged at debug, when it could
/// not be: the command goes on with the credentials it has, still valid.
fn renew(g: &GlobalArgs, creds: &Credentials) -> Option<Credentials> {
    // The CLI's runtime has worker threads; a runtime without them (none
    // today) skips the renewal rather than block its only thread.
    let handle = tokio::runtime::Handle::try_current().ok()?;
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return None;
    }
    let client = Client::new(creds).ok()?.with_liveness(g.liveness());
    let call = tokio::time::timeout(RENEW_TIMEOUT, client.renew());
    let renewed = match tokio::task::block_in_place(|| handle.block_on(call)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot renew the credentials");
            return None;
        }
        Err(_) => {
            tracing::debug!("renewing the credentials timed out");
            return None;
        }
    };
    let path = path(g).ok()?;
    // The file as written (its own servers, not --server's), with the new pair.
    let mut file = Credentials::load(&path).ok()?;
    file.ca_cert = renewed.ca_cert;
    file.client_cert = renewed.client_cert;
    file.client_key = renewed.client_key;
    if let Err(e) = file.save(&path) {
        tracing::debug!(path = %path.display(), error = %e, "cannot write the renewed credentials");
    }
    Some(Credentials { servers: creds.servers.clone(), ..file })
}
