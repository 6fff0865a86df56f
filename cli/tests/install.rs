//! Running Pinion as a service: `pinion install` writes units that systemd's
//! own checker accepts, and the daemons tell systemd when they are ready
//! (`Type=notify`), checked on a notify socket of the test's own.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::process::Proc;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

/// `systemd-analyze`, or `None` outside CI when it is missing (under CI=true
/// a missing tool fails the test: CI's machines have systemd).
fn systemd_analyze() -> Option<&'static str> {
    let found = pinion_wire::testing::on_path("systemd-analyze");
    pinion_wire::testing::requires(found, "systemd-analyze").then_some("systemd-analyze")
}

fn install(unit_dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(PINION)
        .arg("install")
        .arg("--unit-dir")
        .arg(unit_dir)
        .args(args)
        .output()
        .expect("run pinion install");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn installed_units_pass_systemds_own_checks() {
    let Some(analyze) = systemd_analyze() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let units = tmp.path().join("units");
    let (ok, out) = install(&units, &["server", "--", "--data-dir", "/var/lib/pinion", "--listen", "0.0.0.0:7443"]);
    assert!(ok, "{out}");
    let token_file = tmp.path().join("etc/join-token");
    let (ok, out) = install(
        &units,
        &[
            "agent",
            "--token-file",
            token_file.to_str().expect("utf-8"),
            "--",
            "--server",
            "https://10.0.0.1:7443",
            "--token",
            "abc.def",
            "--label",
            "zone=edge 1",
        ],
    );
    assert!(ok, "{out}");
    for unit in ["pinion-server.service", "pinion-agent.service"] {
        let path = units.join(unit);
        let v = Command::new(analyze).arg("verify").arg(&path).output().expect("systemd-analyze");
        let said = format!("{}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr));
        assert!(v.status.success() && said.trim().is_empty(), "{unit}: systemd-analyze verify said:\n{said}");
        let text = std::fs::read_to_string(&path).expect("unit");
        assert!(text.contains("Type=notify\n"), "{text}");
        assert!(text.contains(&format!("ExecStart={PINION} ")), "{text}");
    }
    let agent = std::fs::read_to_string(units.join("pinion-agent.service")).expect("agent unit");
    let by_file = format!("--token-file {}", token_file.display());
    for line in ["Delegate=yes\n", "KillMode=process\n", "\"zone=edge 1\"", &by_file] {
        assert!(agent.contains(line), "agent unit lacks {line:?}:\n{agent}");
    }
    // The token is in a file of root's, never in the unit, so never in `ps`.
    assert!(!agent.contains("abc.def"), "the unit holds the token:\n{agent}");
    assert_eq!(std::fs::read_to_string(&token_file).expect("token file"), "abc.def\n");
    let mode_of = |p: &Path| std::fs::metadata(p).expect("file").permissions().mode() & 0o777;
    assert_eq!(mode_of(&token_file), 0o600, "the token file is root's only");
    assert_eq!(mode_of(token_file.parent().expect("dir")), 0o700);
    let mode = |u: &str| mode_of(&units.join(u));
    assert_eq!(mode("pinion-agent.service"), 0o644);
    assert_eq!(mode("pinion-server.service"), 0o644);
    // Flags the daemon would refuse are refused here, and nothing is written.
    let (ok, out) = install(&units, &["server", "--", "--listn", "0.0.0.0:7443"]);
    assert!(!ok && out.contains("--listn"), "{out}");
    let after = std::fs::read_to_string(units.join("pinion-server.service")).expect("unit");
    assert!(after.contains("--listen 0.0.0.0:7443"), "the unit was left as it was:\n{after}");
}

/// Waits for `READY=1` on the notify socket, within a bound.
fn ready(socket: &UnixDatagram) -> String {
    socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.recv(&mut buf).expect("a notification within 30 s");
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if msg.lines().any(|l| l == "READY=1") {
            return msg;
        }
    }
}

#[test]
fn the_server_and_the_agent_tell_systemd_they_are_ready() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let notify = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&notify).expect("notify socket");
    let spawn = |args: &[&str]| {
        Proc(
            Command::new(PINION)
                .args(args)
                .env("NOTIFY_SOCKET", &notify)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn pinion"),
        )
    };
    let srv = dir.join("srv");
    let _server = spawn(&["server", "--data-dir", srv.to_str().expect("utf-8"), "--listen", "127.0.0.1:0"]);
    ready(&socket);
    // The server is up: its admin credentials name its URL, the token is written.
    let admin = std::fs::read_to_string(srv.join("admin.conf")).expect("admin.conf");
    let url = admin
        .lines()
        .find_map(|l| l.trim().trim_start_matches("- ").trim_start_matches("server: ").strip_prefix("https://"))
        .map(|rest| format!("https://{rest}"))
        .expect("a server URL in admin.conf");
    // The token from a file, as an installed unit passes it.
    let token = srv.join("join-token");
    let node = dir.join("node");
    let _agent = spawn(&[
        "agent",
        "--server",
        &url,
        "--token-file",
        token.to_str().expect("utf-8"),
        "--runtime",
        "hollow",
        "--synthetic",
        "pack:1 numa:1 core:2 pu:1",
        "--node-name",
        "n1",
        "--endpoint-listen",
        "127.0.0.1:0",
        "--data-dir",
        node.to_str().expect("utf-8"),
    ]);
    ready(&socket);
    // Ready means joined: the node's credentials are on disk.
    assert!(node.join("node.conf").exists(), "the agent said ready before it joined");
}

/// `--log-format json`: every log line is one JSON object a collector can
/// read, with its level, target and message.
#[test]
fn json_logs_are_one_object_per_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let notify = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&notify).expect("notify socket");
    let err = std::fs::File::create(dir.join("stderr")).expect("stderr file");
    let mut child = Command::new(PINION)
        .args(["--log", "info", "--log-format", "json", "server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("srv"))
        .env("NOTIFY_SOCKET", &notify)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn pinion server");
    ready(&socket);
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill").success();
    assert!(ok);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    let text = std::fs::read_to_string(dir.join("stderr")).expect("stderr");
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "info logs expected");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["target"].is_string() && v["message"].is_string(), "{l}");
    }
    assert!(lines.iter().any(|l| l.contains("server stopped")), "{text}");
}

#[test]
fn a_unit_that_runs_a_build_folders_binary_says_so_and_how_to_install_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let units = tmp.path().join("units");
    // This test's binary is cargo's build output.
    let (ok, out) = install(&units, &["server", "--", "--data-dir", "/var/lib/pinion"]);
    assert!(ok, "{out}");
    assert!(out.contains("in a build folder") && out.contains("install -m 755"), "{out}");
    let (ok, out) =
        install(&units, &["server", "--bin", "/usr/local/bin/pinion", "--", "--data-dir", "/var/lib/pinion"]);
    assert!(ok, "{out}");
    assert!(!out.contains("build folder"), "{out}");
    let unit = std::fs::read_to_string(units.join("pinion-server.service")).expect("the unit");
    assert!(unit.contains("ExecStart=/usr/local/bin/pinion server"), "{unit}");
}
