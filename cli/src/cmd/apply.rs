//! `pinion apply -f FILE|DIR|-`: every pod, job, deployment, daemonset or partition document in the files (YAML, JSON,
//! several documents per file) is sent to the server; each gets one line
//! (`pod/web created`, `unchanged`, or the error), and any failure makes the
//! exit status non-zero.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use bytes::Bytes;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A manifest file, a folder of them (*.yaml, *.yml, *.json), or `-` for stdin (repeatable).
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", required = true)]
    pub files: Vec<PathBuf>,
}

/// (where it came from, the document's own text). Documents are split on `---`
/// lines and sent as written, so the server's line numbers point into them.
fn documents(source: &str, text: &str) -> Vec<(String, Bytes)> {
    let mut docs = vec![(1usize, String::new())];
    for (i, line) in text.lines().enumerate() {
        if line == "---" || line.starts_with("--- ") {
            docs.push((i + 2, String::new()));
            continue;
        }
        if let Some((_, d)) = docs.last_mut() {
            d.push_str(line);
            d.push('\n');
        }
    }
    let mut out = Vec::new();
    for (n, (first_line, doc)) in docs.into_iter().enumerate() {
        // Empty or comment-only documents are skipped; anything else goes to the
        // server, which reports what is wrong with it.
        if matches!(serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&doc), Ok(v) if v.is_null()) {
            continue;
        }
        out.push((format!("{source}: document {} (from line {first_line})", n + 1), Bytes::from(doc)));
    }
    out
}

/// A document's `kind`, to send it where it goes (a pod when it has none:
/// the server then says what is missing).
fn kind_of(doc: &[u8]) -> Option<String> {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_slice(doc).ok()?;
    v.get("kind")?.as_str().map(str::to_string)
}

fn files_in(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json"))
        .collect();
    files.sort();
    Ok(files)
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let mut docs = Vec::new();
    for f in &args.files {
        if f.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("reading stdin")?;
            docs.extend(documents("stdin", &text));
            continue;
        }
        for file in files_in(f)? {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            docs.extend(documents(&file.display().to_string(), &text));
        }
    }
    if docs.is_empty() {
        anyhow::bail!("no documents found in {:?}", args.files);
    }
    let client = crate::config::client(&g)?;
    let mut failed = 0;
    for (source, body) in docs {
        let result = match kind_of(&body).as_deref() {
            Some("Job") => client.create_job(body).await.map(|(code, j)| (code, "job", j.metadata.name)),
            Some("Deployment") => client.apply_deployment(body).await.map(|(code, d)| {
                // 200: unchanged, or changed (a new generation).
                let code = if code == 200 && d.metadata.generation.unwrap_or(1) > 1 { 202 } else { code };
                (code, "deployment", d.metadata.name)
            }),
            Some("DaemonSet") => client.apply_daemonset(body).await.map(|(code, d)| {
                // 200: unchanged, or changed (a new generation).
                let code = if code == 200 && d.metadata.generation.unwrap_or(1) > 1 { 202 } else { code };
                (code, "daemonset", d.metadata.name)
            }),
            Some("Partition") => client.apply_partition(body).await.map(|(code, p)| {
                let code = if code == 200 && p.metadata.generation.unwrap_or(1) > 1 { 202 } else { code };
                (code, "partition", p.metadata.name)
            }),
            _ => client.create_pod(body).await.map(|(code, p)| (code, "pod", p.metadata.name)),
        };
        match result {
            Ok((201, kind, name)) => outln!("{kind}/{name} created"),
            Ok((202, kind, name)) => outln!("{kind}/{name} configured"),
            Ok((_, kind, name)) => outln!("{kind}/{name} unchanged"),
            Err(e) => {
                eprintln!("error: {source}: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
