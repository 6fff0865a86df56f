//! `pinion token create|list|revoke`: join tokens with a lifetime and a
//! number of uses (admins only). The token is printed once, at creation; the
//! server keeps only its digest.

use std::process::ExitCode;
use std::time::Duration;

use specs::api::TokenRequest;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Make a join token and print it (`PIN.ID.SECRET`, for `pinion agent --token`).
    Create(CreateArgs),
    /// The join tokens: id, expiry, uses left, description (never the secret).
    List,
    /// Revoke a join token: the next join with it is refused.
    Revoke { id: String },
}

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// How long it admits nodes (`90s`, `30m`, `24h`, `7d`; at most a year); `0`: until revoked.
    #[arg(long, default_value = "24h", value_parser = crate::common::parse_duration)]
    pub ttl: Duration,
    /// How many joins it admits; unlimited when not given.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub uses: Option<u32>,
    /// A note shown by `pinion token list` (what or whom it is for).
    #[arg(long, default_value = "")]
    pub description: String,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    match args.command {
        Command::Create(a) => {
            let request = TokenRequest {
                ttl_seconds: (!a.ttl.is_zero()).then(|| a.ttl.as_secs().max(1)),
                uses: a.uses,
                description: a.description,
            };
            let made = client.create_token(&request).await?;
            outln!("{}", made.token);
            eprintln!(
                "token {}: expires {}, uses {} (shown once: the server keeps only its digest)",
                made.record.metadata.name,
                made.record.spec.expires.as_deref().unwrap_or("never"),
                made.record.spec.uses_left.map_or_else(|| "unlimited".to_string(), |u| u.to_string())
            );
        }
        Command::List => {
            let tokens = client.list_tokens().await?;
            let rows: Vec<Vec<String>> = tokens
                .items
                .iter()
                .map(|t| {
                    let expires = match &t.spec.revoked {
                        Some(at) => format!("revoked {at}"),
                        None => t.spec.expires.clone().unwrap_or_else(|| "never".into()),
                    };
                    vec![
                        t.metadata.name.clone(),
                        expires,
                        t.spec.uses_left.map_or_else(|| "unlimited".into(), |u| u.to_string()),
                        if t.spec.description.is_empty() { "-".into() } else { t.spec.description.clone() },
                    ]
                })
                .collect();
            out!("{}", crate::cmd::get::table(&["ID", "EXPIRES", "USES LEFT", "DESCRIPTION"], &rows));
        }
        Command::Revoke { id } => {
            let t = client.revoke_token(&id).await?;
            outln!("token/{} revoked ({})", t.metadata.name, t.spec.revoked.unwrap_or_default());
        }
    }
    Ok(ExitCode::SUCCESS)
}
