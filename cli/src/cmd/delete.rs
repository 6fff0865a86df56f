//! `pinion delete pod|node|job|deployment|daemonset|partition NAME...`

use std::process::ExitCode;

use crate::common::GlobalArgs;

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum Kind {
    #[value(alias = "pods")]
    Pod,
    /// Forget a node (its pods are not touched); it may then join again.
    #[value(alias = "nodes")]
    Node,
    /// A job and its member pods (their containers are stopped).
    #[value(alias = "jobs")]
    Job,
    /// A Deployment and its pods.
    #[value(alias = "deployments", alias = "deploy")]
    Deployment,
    /// A DaemonSet and its pods.
    #[value(name = "daemonset", alias = "daemonsets", alias = "ds")]
    DaemonSet,
    /// A partition (admins); jobs placed in it keep what it gave them.
    #[value(alias = "partitions")]
    Partition,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    pub kind: Kind,
    #[arg(required = true)]
    pub names: Vec<String>,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let mut failed = 0;
    for name in &args.names {
        let (kind, result) = match args.kind {
            Kind::Pod => ("pod", client.delete_pod(name).await.map(|_| ())),
            Kind::Node => ("node", client.delete_node(name).await.map(|_| ())),
            Kind::Job => ("job", client.delete_job(name).await.map(|_| ())),
            Kind::Deployment => ("deployment", client.delete_deployment(name).await.map(|_| ())),
            Kind::DaemonSet => ("daemonset", client.delete_daemonset(name).await.map(|_| ())),
            Kind::Partition => ("partition", client.delete_partition(name).await.map(|_| ())),
        };
        match result {
            Ok(()) => outln!("{kind}/{name} deleted"),
            // No server to ask: the next name would fail the same way. Ended
            // as every verb ends then (with the hint to start one).
            Err(e) if !matches!(e, pinion_wire::ClientError::Api(_)) => {
                return Err(anyhow::Error::new(e).context(format!("delete {kind}/{name}")));
            }
            Err(e) => {
                eprintln!("error: {kind}/{name}: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
