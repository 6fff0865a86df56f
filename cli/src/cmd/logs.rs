//! `pinion logs NAME [-c CONTAINER] [-f]`: a container's output, which the
//! server fetches from the node the pod runs on.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use orchestrator::api::percent_encode;
use pinion_wire::Client;

use crate::common::{GlobalArgs, Resumes};

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

/// Writes the log to stdout as it arrives. A follow whose stream breaks (its
/// connection died: the client's pings went unanswered for the liveness
/// bound) is opened again and the bytes already printed are skipped, so each
/// line is printed once.
pub async fn copy_logs(client: &Client, pod: &str, container: Option<&str>, follow: bool) -> anyhow::Result<()> {
    let mut path = format!("/api/v1/pods/{}/log?follow={follow}", percent_encode(pod));
    if let Some(c) = container {
        path.push_str(&format!("&container={}", percent_encode(c)));
    }
    let mut out = std::io::stdout();
    let mut printed = 0u64;
    let mut resumes = Resumes::new();
    let mut resuming = false;
    loop {
        let mut stream = match client.get_stream(&path).await {
            Ok(s) => s,
            // Resuming, what may pass is retried: no answer, or the server
            // not reaching the node yet (502) or busy (503).
            Err(e) if resuming && e.is_retryable() => {
                let Some(pause) = resumes.pause() else {
                    anyhow::bail!("logs of pod {pod}: {e}; gave up resuming after {} tries", resumes.tries());
                };
                tracing::debug!(error = %e, "cannot resume the log follow yet");
                tokio::time::sleep(pause).await;
                continue;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("logs of pod {pod}"))),
        };
        resumes.opened();
        // What the earlier streams printed comes again first: skip it.
        let mut skip = printed;
        loop {
            let bytes = match stream.next().await {
                Ok(Some(b)) => b,
                Ok(None) => return Ok(()),
                Err(e) if follow && e.is_dead_stream() => {
                    tracing::debug!(error = %e, printed, "log follow broke; resuming");
                    break;
                }
                Err(e) => return Err(anyhow::Error::new(e).context(format!("logs of pod {pod}"))),
            };
            let already = skip.min(bytes.len() as u64) as usize;
            skip -= already as u64;
            let new = &bytes[already..];
            if new.is_empty() {
                continue;
            }
            // Straight through, unbuffered: a follower wants each line as it comes.
            out.write_all(new).context("writing to stdout")?;
            out.flush().context("writing to stdout")?;
            printed += new.len() as u64;
        }
        let Some(pause) = resumes.pause() else {
            anyhow::bail!("logs of pod {pod}: the follow kept breaking; gave up after {} tries", resumes.tries());
        };
        tokio::time::sleep(pause).await;
        resuming = true;
    }
}
