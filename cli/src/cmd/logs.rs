//! `pinion logs NAME [-c CONTAINER] [-f]`: a container's output, which the
//! server fetches from the node the pod runs on.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use orchestrator::api::parse::percent_encode;
use orchestrator::client::{Client, ClientError};

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

/// Opens of a broken follow before `logs -f` gives up.
const RESUMES: u32 = 8;

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
    let mut tries = 0u32;
    loop {
        let mut stream = match client.get_stream(&path).await {
            Ok(s) => s,
            Err(e) if follow && tries > 0 && tries < RESUMES && !matches!(e, ClientError::Api(_)) => {
                tries += 1;
                tracing::debug!(error = %e, "cannot resume the log follow yet");
                tokio::time::sleep(Duration::from_millis(100 << tries.min(6))).await;
                continue;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("logs of pod {pod}"))),
        };
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
            tries = 0;
            // Straight through, unbuffered: a follower wants each line as it comes.
            out.write_all(new).context("writing to stdout")?;
            out.flush().context("writing to stdout")?;
            printed += new.len() as u64;
        }
        tries += 1;
        if tries >= RESUMES {
            anyhow::bail!("logs of pod {pod}: the follow kept breaking; gave up after {tries} tries");
        }
    }
}
