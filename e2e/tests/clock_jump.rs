//! Issue 12, clock jumps: the real `pinion server` and `pinion agent` (hollow
//! runtime), each under libfaketime with its own shift of the realtime clock
//! (the monotonic clock left alone, as a settimeofday or an NTP step leaves
//! it), moved by minutes, hours and a day, back and forth, while they run.
//! Heartbeats, grace periods, backoff and expiries are on the monotonic clock
//! and the certificates are valid from 1975, so through every jump the node
//! stays Ready and a new pod is bound, reported and runs.
//!
//! Needs libfaketime (Debian `faketime`, installed by `e2e/host-setup.sh`):
//! skipped without it on a laptop, a failure under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::process::Proc;
use pinion_wire::testing::{missing, wait_for};
use serde_json::Value;

const GRACE_SECS: u64 = 3;

fn libfaketime() -> Option<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
        .iter()
        .map(|d| Path::new(d).join("faketime/libfaketime.so.1"))
        .find(|p| p.is_file())
}

/// `cmd` with its realtime clock shifted by what `shift` holds (re-read
/// every second), its monotonic clock untouched.
fn faked(cmd: &mut Command, lib: &Path, shift: &Path) {
    cmd.env("LD_PRELOAD", lib)
        .env("FAKETIME_TIMESTAMP_FILE", shift)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("FAKETIME_CACHE_DURATION", "1");
}

struct Cli {
    pinion: PathBuf,
    config: PathBuf,
}

impl Cli {
    fn get(&self, kind: &str, name: &str) -> Option<Value> {
        let out = Command::new(&self.pinion)
            .args(["get", kind, name, "-o", "json", "--config"])
            .arg(&self.config)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn node_ready(&self) -> bool {
        self.get("node", "edge").is_some_and(|n| n["status"]["condition"] == "Ready")
    }

    fn apply(&self, dir: &Path, name: &str) {
        let path = dir.join(format!("{name}.yaml"));
        let manifest = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, inf]\n    resources:\n      limits: {{cpu: 1, memory: 64Mi}}\n"
        );
        std::fs::write(&path, manifest).expect("write the manifest");
        let out = Command::new(&self.pinion)
            .args(["apply", "-f"])
            .arg(&path)
            .arg("--config")
            .arg(&self.config)
            .output()
            .expect("run pinion apply");
        assert!(out.status.success(), "pinion apply {name}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn running(&self, name: &str) -> bool {
        self.get("pod", name).is_some_and(|p| p["status"]["phase"] == "Running")
    }
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-11-24T13:57:20.123Z`).
fn unix_secs(t: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// A libfaketime shift in seconds (`+0`, `-10m`, `+2h`, `-1d`).
fn shift_secs(by: &str) -> i64 {
    let (n, unit) = by.split_at(by.len() - 1);
    let scale = match unit {
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return by.parse().unwrap_or(0),
    };
    n.parse::<i64>().unwrap_or(0) * scale
}

fn now_secs() -> i64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

#[test]
fn a_node_and_a_server_whose_realtime_clocks_jump_keep_working() {
    let Some(lib) = libfaketime() else {
        missing("libfaketime (apt-get install faketime; e2e/host-setup.sh)");
        return;
    };
    let pinion = e2e::binary::pinion().expect("the pinion binary");
    let dir = tempfile::tempdir().expect("tempdir");
    let (srv_shift, node_shift) = (dir.path().join("server.shift"), dir.path().join("node.shift"));
    std::fs::write(&srv_shift, "+0\n").expect("shift file");
    std::fs::write(&node_shift, "+0\n").expect("shift file");

    // The daemons' output outlives a failing run.
    let logs = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("clock_jump");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).expect("the log folder");
    let logged = |what: &str| format!("{what} (the daemons' output: {})", logs.display());
    let srv = dir.path().join("srv");
    let srv_log = logs.join("server.out");
    let mut cmd = Command::new(&pinion);
    cmd.args(["server", "--listen", "127.0.0.1:0", "--heartbeat-grace", &GRACE_SECS.to_string(), "--data-dir"])
        .arg(&srv)
        .stdout(std::fs::File::create(&srv_log).expect("log"))
        .stderr(std::fs::File::create(logs.join("server.err")).expect("log"));
    faked(&mut cmd, &lib, &srv_shift);
    let _server = Proc(cmd.spawn().expect("start pinion server"));
    let addr = wait_for(logged("the server listens"), Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&srv_log).unwrap_or_default();
        let line = text.lines().find(|l| l.starts_with("listening on"))?.to_string();
        line.split_whitespace().nth(2).map(str::to_string)
    });

    let token = std::fs::read_to_string(srv.join("join-token")).expect("join token");
    let mut cmd = Command::new(&pinion);
    cmd.args(["agent", "--server", &format!("https://{addr}"), "--token", token.trim(), "--ca"])
        .arg(srv.join("pki/ca.crt"))
        .arg("--data-dir")
        .arg(dir.path().join("node"))
        .args(["--node-name", "edge", "--endpoint-listen", "127.0.0.1:0", "--runtime", "hollow"])
        .args(["--synthetic", "pack:1 core:8 pu:1", "--reserved-cpus", "0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(logs.join("node.err")).expect("log"));
    faked(&mut cmd, &lib, &node_shift);
    let _node = Proc(cmd.spawn().expect("start pinion agent"));

    let cli = Cli { pinion: pinion.clone(), config: srv.join("admin.conf") };
    wait_for(logged("the node is Ready"), Duration::from_secs(60), || cli.node_ready().then_some(()));
    cli.apply(dir.path(), "p0");
    wait_for(logged("p0 runs"), Duration::from_secs(60), || cli.running("p0").then_some(()));

    // (server's shift, node's shift), each relative to the true time.
    let jumps = [("+0", "-10m"), ("-10m", "+10m"), ("+2h", "-1d"), ("+0", "+0")];
    for (i, (server_by, node_by)) in jumps.iter().enumerate() {
        std::fs::write(&srv_shift, format!("{server_by}\n")).expect("shift the server");
        std::fs::write(&node_shift, format!("{node_by}\n")).expect("shift the node");
        // A node whose heartbeats were judged on the realtime clock would
        // turn NotReady within a grace period or two of such a jump.
        let hold = Instant::now() + Duration::from_secs(3 * GRACE_SECS);
        while Instant::now() < hold {
            assert!(cli.node_ready(), "jump {i} (server {server_by}, node {node_by}): the node went NotReady");
            std::thread::sleep(Duration::from_millis(250));
        }
        let name = format!("p{}", i + 1);
        cli.apply(dir.path(), &name);
        wait_for(
            logged(&format!("{name} runs after jump {i} (server {server_by}, node {node_by})")),
            Duration::from_secs(60),
            || cli.running(&name).then_some(()),
        );
        // The jump was real: the server stamped the pod with its shifted clock.
        let pod = cli.get("pod", &name).expect("the pod");
        let created = pod["metadata"]["creationTimestamp"].as_str().and_then(unix_secs).expect("a creation time");
        let off = created - now_secs() - shift_secs(server_by);
        assert!(off.abs() < 120, "{name}: created at {created}, {off} s away from the server's shifted clock");
    }
}
