//! `pinion logs NAME [-c CONTAINER] [-f]`: a container's output, which the
//! server fetches from the node the pod runs on.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use orchestrator::api::parse::percent_encode;
use orchestrator::client::Client;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The pod.
    pub name: String,
    /// The container (needed when the pod has more than one).
    #[arg(short = 'c', long, value_name = "NAME")]
    pub container: Option<String>,
    /// Keep printing until the container exits.
    #[arg(short = 'f', long)]
    pub follow: bool,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    copy_logs(&client, &args.name, args.container.as_deref(), args.follow).await?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the log to stdout as it arrives.
pub async fn copy_logs(client: &Client, pod: &str, container: Option<&str>, follow: bool) -> anyhow::Result<()> {
    let mut path = format!("/api/v1/pods/{}/log?follow={follow}", percent_encode(pod));
    if let Some(c) = container {
        path.push_str(&format!("&container={}", percent_encode(c)));
    }
    let mut stream = client.get_stream(&path).await.with_context(|| format!("logs of pod {pod}"))?;
    let mut out = std::io::stdout();
    while let Some(bytes) = stream.next().await.with_context(|| format!("logs of pod {pod}"))? {
        // Straight through, unbuffered: a follower wants each line as it comes.
        out.write_all(&bytes).context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
    }
    Ok(())
}
