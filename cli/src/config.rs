//! Where the CLI finds its credentials: `--config` / `PINION_CONFIG`, else
//! `$XDG_CONFIG_HOME/pinion/config`, else `~/.config/pinion/config`. The file is
//! the YAML `orchestrator::tls::Credentials` (server URLs, CA, client cert,
//! key); `--server` replaces the file's list of servers.

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
    Ok(Client::new(&load(g)?)?.with_liveness(g.liveness()))
}
