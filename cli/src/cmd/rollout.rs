//! `pinion scale deployment NAME --replicas N` and `pinion rollout
//! status|history|undo|restart deployment|daemonset NAME`: a Deployment's
//! count and revisions, a DaemonSet's revisions and its update, node by
//! node. The server keeps the revisions (`status.history`, both kinds);
//! `status` follows the workload until its rollout is complete, has stopped
//! at its progress deadline (a Deployment), or `--timeout` passes.

use std::process::ExitCode;
use std::time::Duration;

use specs::deployment::{reason, ConditionType, Deployment};

use crate::common::GlobalArgs;

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    #[value(alias = "deployments", alias = "deploy")]
    Deployment,
    /// Not `scale`: a DaemonSet runs one pod per matching node.
    #[value(name = "daemonset", alias = "daemonsets", alias = "ds")]
    DaemonSet,
}

#[derive(clap::Args, Debug)]
pub struct ScaleArgs {
    pub kind: Kind,
    pub name: String,
    #[arg(long)]
    pub replicas: u32,
}

#[derive(clap::Subcommand, Debug)]
pub enum RolloutCommand {
    /// Wait until the rollout is complete (exit 0), stopped at its progress
    /// deadline or past --timeout (exit 1).
    Status {
        kind: Kind,
        name: String,
        /// How long to wait, e.g. `90s`, `5m`.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// The revisions kept for `undo`.
    History { kind: Kind, name: String },
    /// Back to the revision before the current, or to --to-revision.
    Undo {
        kind: Kind,
        name: String,
        #[arg(long)]
        to_revision: Option<u64>,
    },
    /// Replace every pod (a new revision of the same template).
    Restart { kind: Kind, name: String },
}

#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: RolloutCommand,
}

/// `90`, `90s`, `5m`, `1h`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: want a number of s, m or h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{s:?}: want a number of s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

pub async fn scale(g: GlobalArgs, args: ScaleArgs) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    if args.kind == Kind::DaemonSet {
        anyhow::bail!("a daemonset runs one pod per matching node: it has no replicas to scale");
    }
    client.scale_deployment(&args.name, args.replicas).await?;
    outln!("deployment/{} scaled to {}", args.name, args.replicas);
    Ok(ExitCode::SUCCESS)
}

/// Where a rollout stands, from the Deployment as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Still moving: what it waits for.
    Waiting(String),
    Complete,
    /// Stopped at its progress deadline.
    Stopped(String),
}

pub fn standing(d: &Deployment) -> Standing {
    let s = d.status.clone().unwrap_or_default();
    let want = d.spec.replicas;
    if s.observed_generation < d.metadata.generation.unwrap_or(0) {
        return Standing::Waiting("waiting for the deployment's spec to be observed".into());
    }
    if let Some(c) = s.condition(ConditionType::Progressing) {
        if c.reason == reason::PROGRESS_DEADLINE_EXCEEDED {
            return Standing::Stopped(c.message.clone());
        }
    }
    if s.updated_replicas < want {
        return Standing::Waiting(format!("{} of {want} new replicas have been updated", s.updated_replicas));
    }
    if s.replicas > s.updated_replicas {
        return Standing::Waiting(format!("{} old replicas are pending termination", s.replicas - s.updated_replicas));
    }
    if s.available_replicas < want {
        return Standing::Waiting(format!("{} of {want} updated replicas are available", s.available_replicas));
    }
    Standing::Complete
}

/// Where a DaemonSet's update stands, as kubectl's `rollout status
/// daemonset` says it.
pub fn daemonset_standing(d: &specs::daemonset::DaemonSet) -> Standing {
    use specs::daemonset::DaemonSetStrategyType;
    if d.spec.update_strategy.kind != DaemonSetStrategyType::RollingUpdate {
        return Standing::Stopped("rollout status is only available for the RollingUpdate strategy".into());
    }
    let s = d.status.clone().unwrap_or_default();
    if s.observed_generation < d.metadata.generation.unwrap_or(0) {
        return Standing::Waiting("waiting for the daemonset's spec to be observed".into());
    }
    let want = s.desired_number_scheduled;
    if s.updated_number_scheduled < want {
        return Standing::Waiting(format!("{} out of {want} new pods have been updated", s.updated_number_scheduled));
    }
    if s.number_available < want {
        return Standing::Waiting(format!("{} of {want} updated pods are available", s.number_available));
    }
    Standing::Complete
}

/// `rollout status daemonset NAME`: follows the DaemonSet until its update
/// is complete or `timeout` passes.
async fn daemonset_status(client: &pinion_wire::Client, name: &str, timeout: Duration) -> anyhow::Result<ExitCode> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = String::new();
    loop {
        let d = client.get_daemonset(name).await?;
        match daemonset_standing(&d) {
            Standing::Complete => {
                outln!("daemon set {name:?} successfully rolled out");
                return Ok(ExitCode::SUCCESS);
            }
            Standing::Stopped(why) => {
                eprintln!("error: daemonset {name:?}: {why}");
                return Ok(ExitCode::FAILURE);
            }
            Standing::Waiting(what) => {
                if what != said {
                    outln!("Waiting for daemon set {name:?} rollout to finish: {what}...");
                    said = what;
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("error: timed out waiting for daemonset {name:?} ({})", humantime(timeout));
            return Ok(ExitCode::FAILURE);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn rollout(g: GlobalArgs, args: RolloutArgs) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    match &args.command {
        RolloutCommand::Status { kind: Kind::DaemonSet, name, timeout } => {
            return daemonset_status(&client, name, *timeout).await;
        }
        RolloutCommand::History { kind: Kind::DaemonSet, name } => {
            let d = client.get_daemonset(name).await?;
            let s = d.status.unwrap_or_default();
            outln!("daemonset/{name}");
            out!("{}", history(&s.history, s.revision));
            return Ok(ExitCode::SUCCESS);
        }
        RolloutCommand::Undo { kind: Kind::DaemonSet, name, to_revision } => {
            client.undo_daemonset(name, *to_revision).await?;
            outln!("daemonset/{name} rolled back");
            return Ok(ExitCode::SUCCESS);
        }
        RolloutCommand::Restart { kind: Kind::DaemonSet, name } => {
            client.restart_daemonset(name).await?;
            outln!("daemonset/{name} restarted");
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    match args.command {
        RolloutCommand::Status { name, timeout, .. } => {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut said = String::new();
            loop {
                let d = client.get_deployment(&name).await?;
                match standing(&d) {
                    Standing::Complete => {
                        outln!("deployment {name:?} successfully rolled out");
                        return Ok(ExitCode::SUCCESS);
                    }
                    Standing::Stopped(why) => {
                        eprintln!("error: deployment {name:?} exceeded its progress deadline: {why}");
                        return Ok(ExitCode::FAILURE);
                    }
                    Standing::Waiting(what) => {
                        if what != said {
                            outln!("Waiting for deployment {name:?} rollout to finish: {what}...");
                            said = what;
                        }
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    eprintln!("error: timed out waiting for deployment {name:?} ({})", humantime(timeout));
                    return Ok(ExitCode::FAILURE);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        RolloutCommand::History { name, .. } => {
            let d = client.get_deployment(&name).await?;
            let s = d.status.unwrap_or_default();
            outln!("deployment/{name}");
            out!("{}", history(&s.history, s.revision));
        }
        RolloutCommand::Undo { name, to_revision, .. } => {
            client.undo_deployment(&name, to_revision).await?;
            outln!("deployment/{name} rolled back");
        }
        RolloutCommand::Restart { name, .. } => {
            client.restart_deployment(&name).await?;
            outln!("deployment/{name} restarted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The table of `rollout history`, for either kind: each revision kept, the
/// current one marked, and a restart's time as its cause.
fn history(revisions: &[specs::deployment::Revision], current: u64) -> String {
    let rows: Vec<Vec<String>> = revisions
        .iter()
        .map(|r| {
            let cause = r
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.get(specs::deployment::RESTARTED_AT_ANNOTATION))
                .map_or("-".to_string(), |t| format!("restarted at {t}"));
            let mark = if r.number == current { "current" } else { "-" };
            vec![r.number.to_string(), r.template_hash.clone(), mark.into(), cause]
        })
        .collect();
    crate::cmd::get::table(&["REVISION", "HASH", "CURRENT", "CHANGE-CAUSE"], &rows)
}

fn humantime(d: Duration) -> String {
    format!("{} s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5d").is_err());
    }
}
