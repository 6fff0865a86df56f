//! `pinion user add|list|revoke`: the cluster's people (admins only add and
//! revoke; viewers list).

use std::path::PathBuf;
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
            println!("user/{} revoked ({})", user.metadata.name, user.spec.revoked.unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn add(g: &GlobalArgs, a: AddArgs) -> anyhow::Result<ExitCode> {
    // Checked before the person exists: a file that cannot be written must
    // not leave a person whose only key was lost.
    if a.out.exists() {
        anyhow::bail!("--out {}: the file exists (choose another path; it would hold a new key)", a.out.display());
    }
    let parent = a.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        anyhow::bail!("--out {}: the folder {} does not exist", a.out.display(), parent.display());
    }
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
    creds.save(&a.out).with_context(|| format!("user {} was added, but their credentials file", a.name))?;
    let u = &added.user;
    println!(
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
    print!("{}", crate::cmd::get::table(&["NAME", "ROLE", "RUNS AS", "PROFILE", "GRANTED", "STATUS"], &rows));
    Ok(ExitCode::SUCCESS)
}

/// `uid 1001 gid 1001`, or `NAME on each node`.
fn runs_as(u: &User) -> String {
    match (u.spec.uid, u.spec.gid) {
        (Some(uid), Some(gid)) => format!("uid {uid} gid {gid}"),
        (Some(uid), None) => format!("uid {uid}"),
        _ => format!("{} on each node", u.metadata.name),
    }
}
