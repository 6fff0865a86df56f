//! `pinion user add|list|revoke`: the cluster's people (admins only add and
//! revoke; viewers list).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use orchestrator::tls::Credentials;
use specs::api::{Role, User, UserSpec};
use specs::security::Profile;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Add a person and write their credentials file (give it to them; it
    /// holds their key). A revoked person may be added again.
    Add(AddArgs),
    /// The cluster's people: role, uid, profile, revoked or not.
    List,
    /// Revoke a person: their certificates are refused from their next
    /// request on, on every server. Their pods and jobs stay (an admin
    /// deletes them).
    Revoke { name: String },
}

#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// A DNS label: lower-case letters, digits and '-'.
    pub name: String,
    #[arg(long, default_value = "user", value_parser = parse_role)]
    pub role: Role,
    /// The Unix uid their pods run as on the nodes; unset: the node looks
    /// NAME up in its own passwd database.
    #[arg(long)]
    pub uid: Option<u32>,
    /// The Unix gid their pods run as (with --uid).
    #[arg(long)]
    pub gid: Option<u32>,
    /// Supplementary groups (comma-separated gids).
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<u32>,
    /// The pod security profile (restricted, baseline, privileged); users
    /// baseline and admins privileged by default.
    #[arg(long, value_parser = parse_profile)]
    pub profile: Option<Profile>,
    /// Capabilities granted beyond the profile's list (SYS_NICE,IPC_LOCK for
    /// a telecom function).
    #[arg(long = "allow-cap", value_delimiter = ',')]
    pub capabilities: Vec<String>,
    /// May run pods on the host's network.
    #[arg(long)]
    pub allow_host_network: bool,
    /// Where to write the credentials file (mode 0600); refused if it exists.
    #[arg(long)]
    pub out: PathBuf,
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse()
}

fn parse_profile(s: &str) -> Result<Profile, String> {
    s.parse()
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Add(a) => add(&g, a).await,
        Command::List => list(&g).await,
        Command::Revoke { name } => {
            let user = crate::config::client(&g)?.revoke_user(&name).await?;
            outln!("user/{} revoked ({})", user.metadata.name, user.spec.revoked.unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn add(g: &GlobalArgs, a: AddArgs) -> anyhow::Result<ExitCode> {
    // Claimed before the person exists: a file that cannot be written must
    // not leave a person whose only key was lost.
    let out = OutFile::claim(&a.out)?;
    let admin = crate::config::load(g)?;
    let client = crate::config::client(g)?;
    let user = User {
        api_version: specs::pod::API_VERSION.into(),
        kind: "User".into(),
        metadata: specs::pod::ObjectMeta { name: a.name.clone(), ..Default::default() },
        spec: UserSpec {
            role: a.role,
            uid: a.uid,
            gid: a.gid,
            groups: a.groups,
            profile: a.profile,
            capabilities: a.capabilities,
            host_network: a.allow_host_network,
            revoked: None,
        },
    };
    let added = client.add_user(&user).await?;
    let creds = Credentials {
        servers: admin.servers.clone(),
        ca_cert: added.ca_cert,
        client_cert: added.client_cert,
        client_key: added.client_key,
    };
    out.write(&creds).with_context(|| format!("user {} was added, but their credentials file", a.name))?;
    let u = &added.user;
    outln!(
        "user/{} added: role {}, {}, profile {}; credentials in {} (give the file to them: it holds their key)",
        u.metadata.name,
        u.spec.role,
        runs_as(u),
        u.spec.profile(),
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn list(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    let users = crate::config::client(g)?.list_users().await?;
    let rows: Vec<Vec<String>> = users
        .items
        .iter()
        .map(|u| {
            vec![
                u.metadata.name.clone(),
                u.spec.role.to_string(),
                runs_as(u),
                u.spec.profile().to_string(),
                if u.spec.capabilities.is_empty() { "-".into() } else { u.spec.capabilities.join(",") },
                u.spec.revoked.clone().map_or_else(|| "-".into(), |r| format!("revoked {r}")),
            ]
        })
        .collect();
    out!("{}", crate::cmd::get::table(&["NAME", "ROLE", "RUNS AS", "PROFILE", "GRANTED", "STATUS"], &rows));
    Ok(ExitCode::SUCCESS)
}

/// The credentials file, created exclusively (mode 0600) before the person is
/// added: a check that the path is free followed by a later write would
/// overwrite a file, or replace a symlink, that appeared in between. Removed
/// again unless `write` fills it, so a refused request leaves nothing behind.
#[derive(Debug)]
struct OutFile {
    path: PathBuf,
    file: File,
    /// Written: the file is theirs and stays.
    keep: bool,
}

impl OutFile {
    fn claim(path: &Path) -> anyhow::Result<OutFile> {
        match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
            Ok(file) => Ok(OutFile { path: path.to_path_buf(), file, keep: false }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                anyhow::bail!(
                    "--out {}: the file exists (choose another path; it would hold a new key)",
                    path.display()
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                anyhow::bail!("--out {}: the folder {} does not exist", path.display(), parent(path).display())
            }
            Err(e) => Err(e).with_context(|| format!("--out {}", path.display())),
        }
    }

    fn write(mut self, creds: &Credentials) -> anyhow::Result<()> {
        let text = serde_yaml_ng::to_string(creds)?;
        // On failure the drop removes what was half written: of no use.
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_all())
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.keep = true;
        // The new name lasts through a crash only once its folder is synced.
        if let Ok(dir) = File::open(parent(&self.path)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // Only the file this claimed: if something else now stands at the
        // path, it is not ours to delete.
        let ours = match (self.file.metadata(), std::fs::symlink_metadata(&self.path)) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        };
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The folder a file is in; `.` for a bare name.
fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// `uid 1001 gid 1001`, or `NAME on each node`.
fn runs_as(u: &User) -> String {
    match (u.spec.uid, u.spec.gid) {
        (Some(uid), Some(gid)) => format!("uid {uid} gid {gid}"),
        (Some(uid), None) => format!("uid {uid}"),
        _ => format!("{} on each node", u.metadata.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials {
            servers: vec!["https://127.0.0.1:7443".into()],
            ca_cert: "ca".into(),
            client_cert: "cert".into(),
            client_key: "key".into(),
        }
    }

    #[test]
    fn a_claimed_file_is_written_private_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("alice.conf");
        OutFile::claim(&path).expect("claim").write(&creds()).expect("write");
        assert_eq!(std::fs::metadata(&path).expect("stat").mode() & 0o777, 0o600);
        let back = Credentials::parse(&std::fs::read_to_string(&path).expect("read")).expect("parse");
        assert_eq!(back, creds());
    }

    #[test]
    fn a_claim_never_written_is_removed() {
        // As when the server refuses the person after the file was claimed.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("alice.conf");
        let out = OutFile::claim(&path).expect("claim");
        assert!(path.exists());
        drop(out);
        assert!(!path.exists());
    }

    #[test]
    fn an_existing_file_or_link_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("taken.conf");
        std::fs::write(&file, "theirs").expect("write");
        // A dangling link: `exists()` says no, but writing through or over
        // it would put the key where the link's maker chose.
        let link = dir.path().join("link.conf");
        let target = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        for path in [&file, &link] {
            let err = OutFile::claim(path).expect_err("refused");
            assert_eq!(
                err.to_string(),
                format!("--out {}: the file exists (choose another path; it would hold a new key)", path.display())
            );
        }
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "theirs");
        assert!(std::fs::symlink_metadata(&link).expect("lstat").file_type().is_symlink());
        assert!(!target.exists());
    }

    #[test]
    fn a_missing_folder_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no/such/alice.conf");
        let err = OutFile::claim(&path).expect_err("refused");
        assert_eq!(
            err.to_string(),
            format!("--out {}: the folder {} does not exist", path.display(), dir.path().join("no/such").display())
        );
    }
}
