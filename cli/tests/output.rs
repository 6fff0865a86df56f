//! What the CLI prints when its reader or its server goes away: a closed pipe
//! (`| head -1`) ends every output quietly, as it ends Unix tools, and a pod
//! watch whose server stops says so and ends with an error once the server
//! stays away, instead of ending with status 0 and no word.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, PINION};

/// `pinion ARGS` with its stdout's reader gone before it prints: the status
/// and what it said on stderr.
fn with_a_closed_stdout(config: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(PINION)
        .args(args)
        .env("PINION_CONFIG", config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pinion");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for pinion");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_pipe_ends_every_output_quietly() {
    let c = Cluster::start().await;
    c.create("piped").await;
    let config = c.relayed_config.clone();
    let outputs: &[&[&str]] = &[
        &["get", "pods", "-o", "yaml"],
        &["get", "pods", "-o", "json"],
        &["get", "pods"],
        &["get", "pods", "-w"],
        &["describe", "pod", "piped"],
        &["completions", "bash"],
    ];
    for args in outputs {
        let config = config.clone();
        let (code, stderr) =
            tokio::task::spawn_blocking(move || with_a_closed_stdout(&config, args)).await.expect("the blocking task");
        // 141: what a shell shows for a process that SIGPIPE ended.
        assert_eq!((code, stderr.as_str()), (Some(141), ""), "pinion {args:?}: status and stderr");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_whose_server_stops_says_so_and_ends_with_an_error() {
    let c = Cluster::start().await;
    c.create("watched").await;
    let mut child = Command::new(PINION)
        .args(["get", "pods", "-w"])
        .env("PINION_CONFIG", &c.relayed_config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pinion get pods -w");
    let stdout = child.stdout.take().expect("stdout");
    let first_row = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let header = lines.next();
        let row = lines.next();
        (header, row, lines)
    });
    let (header, row, rest) = tokio::time::timeout(Duration::from_secs(15), first_row)
        .await
        .expect("the table within 15 s")
        .expect("the reading task");
    assert!(row.and_then(Result::ok).is_some_and(|r| r.starts_with("watched")), "header {header:?}");
    c.stop().await;
    // The resumes' bound is about 20 s of tries; then the watch ends.
    let stderr = child.stderr.take().expect("stderr");
    let started = Instant::now();
    let ended = tokio::task::spawn_blocking(move || {
        let said: Vec<String> = BufReader::new(stderr).lines().map_while(Result::ok).collect();
        drop(rest);
        (child.wait().expect("wait"), said)
    });
    let (status, said) = tokio::time::timeout(Duration::from_secs(60), ended)
        .await
        .expect("the watch ends within 60 s of its server's stop")
        .expect("the waiting task");
    let said = said.join("\n");
    assert!(!status.success(), "a watch whose server went away ends with an error: {status:?}\n{said}");
    assert!(said.contains("error: "), "and says why:\n{said}");
    // A server that ends its watches as it stops (the usual way): said at
    // once, tried again, then given up on.
    if said.contains("the server ended the watch") {
        assert!(said.contains("the server went away") && said.contains("gave up"), "and why it ended:\n{said}");
        assert!(started.elapsed() >= Duration::from_secs(5), "it tried again first: {:?}", started.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_verb_says_how_to_start_a_server_when_none_answers() {
    let c = Cluster::start().await;
    // The server's own address, which refuses once it has stopped.
    let direct = c.dir.path().join("direct.conf");
    let mut creds = c.creds.clone();
    creds.servers = vec![format!("https://{}", c.addr)];
    creds.save(&direct).expect("save the direct config");
    let keep = tempfile::tempdir().expect("tempdir");
    let config = keep.path().join("direct.conf");
    std::fs::copy(&direct, &config).expect("copy the config");
    c.stop().await;
    for args in [&["get", "pods"][..], &["delete", "pod", "gone"], &["describe", "pod", "gone"]] {
        let out = Command::new(PINION).args(args).env("PINION_CONFIG", &config).output().expect("run pinion");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "pinion {args:?}");
        assert!(stderr.contains("(start one with: pinion up)"), "pinion {args:?}: {stderr}");
    }
}
