//! End to end with the real binary: `pinion server` in a temp dir, `pinion
//! apply` with the admin credentials it wrote, `kill -9` of the server in the
//! middle of 200 submissions, a restart, and every acknowledged pod is there.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

/// Kills the server when the test ends, even on failure.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(dir: &Path) -> ServerProcess {
    let mut child = Command::new(PINION)
        .args(["server", "--data-dir"])
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pinion server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("listening on") => break,
            Some(Ok(_)) => continue,
            other => panic!("server did not start: {other:?}"),
        }
    }
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    ServerProcess(child)
}

fn apply(config: &Path, name: &str) -> bool {
    let manifest = format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: main, image: busybox}}]\n"
    );
    let mut child = Command::new(PINION)
        .args(["apply", "-f", "-", "--config"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pinion apply");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(manifest.as_bytes());
    }
    match child.wait_with_output() {
        Ok(out) => {
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&format!("pod/{name} created"))
        }
        Err(_) => false,
    }
}

#[test]
fn acknowledged_pods_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("admin.conf");
    let server = Arc::new(Mutex::new(Some(start_server(dir.path()))));
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (server, acknowledged, next, config) = (server.clone(), acknowledged.clone(), next.clone(), config.clone());
        workers.push(std::thread::spawn(move || loop {
            let i = next.fetch_add(1, Ordering::SeqCst);
            if i >= 200 {
                return;
            }
            let name = format!("pod-{i:03}");
            if apply(&config, &name) {
                let mut acked = acknowledged.lock().expect("lock");
                acked.push(name);
                if acked.len() == 100 {
                    // SIGKILL: no shutdown path runs; only what was flushed survives.
                    if let Some(mut s) = server.lock().expect("lock").take() {
                        let _ = s.0.kill();
                        let _ = s.0.wait();
                    }
                }
            }
        }));
    }
    for w in workers {
        w.join().expect("worker");
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    assert!(acknowledged.len() >= 100, "only {} acknowledged before the kill", acknowledged.len());
    assert!(server.lock().expect("lock").is_none(), "the server was not killed mid-stream");

    let _server = start_server(dir.path());
    let out =
        Command::new(PINION).args(["get", "pods", "-o", "json", "--config"]).arg(&config).output().expect("pinion get");
    assert!(out.status.success(), "get failed: {}", String::from_utf8_lossy(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: std::collections::BTreeSet<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|n| !names.contains(*n)).collect();
    assert!(lost.is_empty(), "acknowledged but lost after kill -9: {lost:?}");

    // Errors are one line and a non-zero exit.
    let out = Command::new(PINION).args(["get", "pods", "nope", "--config"]).arg(&config).output().expect("pinion get");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not found"), "{err}");
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = start_server(dir.path());
    assert!(apply(&dir.path().join("admin.conf"), "before-term"));
    let pid = server.0.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let exit = loop {
        if let Some(s) = server.0.try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "server did not stop after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(exit.success(), "exit status {exit:?}");
    // The store was closed cleanly: a new server opens it and finds the pod.
    let _again = start_server(dir.path());
    let out = Command::new(PINION)
        .args(["get", "pods", "before-term", "-o", "json", "--config"])
        .arg(dir.path().join("admin.conf"))
        .output()
        .expect("get");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
