//! `pinion up` with real containers (its nodelet joined over loopback, the
//! libcontainer runtime, CPU 0 reserved), driven as a user would:
//! `pinion run` streams the output and exits with the command's code, `pinion
//! logs [-f]` reads a container's output through the server, Ctrl-C on `run`
//! deletes the pod and its container, and a node's own credential may not read
//! logs. Needs root and two CPUs: without them the test skips, except under
//! `CI=true` where it fails.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nodelet::runtime::libcontainer::LibcontainerRuntime;
use nodelet::runtime::Runtime;
use pinion_wire::testing::{has_two_cpus, is_root, requires, Relay};
use serde_json::Value;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

#[path = "common/layers.rs"]
mod layers;
#[path = "common/registry.rs"]
mod registry;

/// One `pinion up` at a time: two would give the same CPU 1 to their pods.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Up {
    _serial: std::sync::MutexGuard<'static, ()>,
    _tmp: tempfile::TempDir,
    data: PathBuf,
    config: PathBuf,
    up: Option<Child>,
    /// What `up` printed up to its `stop:` line.
    first_screen: String,
}

impl Up {
    fn start() -> Option<Up> {
        Up::start_with(&[])
    }

    /// `pinion up` with `extra` flags.
    fn start_with(extra: &[&str]) -> Option<Up> {
        if !requires(is_root() && has_two_cpus(), "root and CPUs 0 and 1") {
            return None;
        }
        let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let tmp = tempfile::Builder::new().prefix("pinion-up-").tempdir().unwrap();
        let data = tmp.path().join("data");
        let config = tmp.path().join("config");
        let mut child = Command::new(PINION)
            .args(["up", "--listen", "127.0.0.1:0", "--runtime", "libcontainer", "--data-dir"])
            .arg(&data)
            // The default pod network `up` writes goes here, not to /etc/cni/net.d.
            .arg("--cni-conf-dir")
            .arg(tmp.path().join("cni"))
            .args(extra)
            .env("PINION_CONFIG", &config)
            .env("PINION_LOG", "info,libcgroups=error,libcontainer=error")
            .stdout(Stdio::piped())
            // Kept for reading when the test fails.
            .stderr(std::fs::File::create(Path::new(env!("CARGO_TARGET_TMPDIR")).join("up_real.log")).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut first_screen = String::new();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("stop:") => break,
                Some(Ok(l)) => {
                    first_screen.push_str(&l);
                    first_screen.push('\n');
                }
                other => panic!("pinion up did not come up: {other:?}\n{first_screen}"),
            }
        }
        assert!(first_screen.contains("pinion is up"), "{first_screen}");
        std::thread::spawn(move || for _ in lines {});
        let up = Up { _serial: serial, _tmp: tmp, data, config, up: Some(child), first_screen };
        // The node registers right after; `run` before that would wait Pending.
        up.wait("the node Ready", || {
            let out = up.cli(&["get", "nodes", "-o", "json"]);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            v["items"].as_array().is_some_and(|n| n.iter().any(|n| n["status"]["condition"] == "Ready"))
        });
        Some(up)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(PINION);
        c.args(args).env("PINION_CONFIG", &self.config);
        c
    }

    fn cli(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn wait(&self, what: &str, pred: impl Fn() -> bool) {
        let t = Instant::now();
        let deadline = t + Duration::from_secs(30);
        while !pred() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("waited {:?} for {what}", t.elapsed());
    }

    /// A pod `PREFIX-PID` on CPU 1 that sleeps, once it runs (to exec in).
    fn sleeping_pod(&self, prefix: &str) -> String {
        let pod = format!("{prefix}-{}", std::process::id());
        let out = self.cli(&["run", "--detach", &pod, "--cpus", "1", "--", "sleep", "3000"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        self.wait("the pod running", || self.phase(&pod).as_deref() == Some("Running"));
        pod
    }

    fn phase(&self, pod: &str) -> Option<String> {
        let out = self.cli(&["get", "pods", pod, "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["status"]["phase"].as_str().map(str::to_string)
    }

    /// Pods the nodelet still holds (its own status file).
    fn node_pods(&self) -> Vec<String> {
        let out = Command::new(PINION)
            .args(["agent", "status", "-o", "json", "--data-dir"])
            .arg(self.data.join("node"))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["pods"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut up) = self.up.take() {
            // A graceful stop first: the agent removes its warm pod networks
            // (their records die with this test's data dir).
            let _ = Command::new("kill").args(["-TERM", &up.id().to_string()]).status();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while matches!(up.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = up.kill();
            let _ = up.wait();
        }
        // Whatever a failed run left: containers outlive the agent, so remove them.
        if let Ok(rt) = LibcontainerRuntime::new(&self.data.join("node"), Path::new(PINION)) {
            for id in rt.list().unwrap_or_default() {
                let _ = rt.stop(&id, Duration::ZERO);
                let _ = rt.remove(&id);
            }
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_streams_output_and_exits_with_the_code_logs_read_through_the_server() {
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let (a, b, c) = (format!("run-a-{tag}"), format!("run-b-{tag}"), format!("run-c-{tag}"));

    // An exclusive CPU, the command's output (stdout and stderr), its exit code.
    let out = up.cli(&[
        "run",
        &a,
        "--cpus",
        "1",
        "--",
        "sh",
        "-c",
        "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status; echo to-stderr >&2; exit 7",
    ]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "stdout: {shown}\nstderr: {}", text(&out.stderr));
    assert!(shown.contains("Cpus_allowed_list:\t1\n"), "pinned to CPU 1, CPU 0 reserved: {shown}");
    assert!(shown.contains("Mems_allowed_list:\t0\n"), "{shown}");
    assert!(shown.contains("to-stderr"), "{shown}");
    assert_eq!(up.phase(&a).as_deref(), Some("Failed"));
    let logs = up.cli(&["logs", &a]);
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    assert_eq!(text(&logs.stdout), shown, "the same bytes, read again through the server");

    // `up` wrote the default network and the pod has an address on it.
    let net = format!("run-net-{tag}");
    let out = up.cli(&["run", &net, "--", "sh", "-c", "ip -4 -o addr show eth0"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "stdout: {shown}\nstderr: {}", text(&out.stderr));
    assert!(shown.contains("inet 10.213."), "an address of the default network 10.213.0.0/16: {shown}");
    let pod = text(&up.cli(&["get", "pods", &net, "-o", "json"]).stdout);
    assert!(pod.contains("\"podIP\": \"10.213."), "podIP in the status: {pod}");
    assert!(up.cli(&["delete", "pod", &net]).status.success());

    // Detached, then followed: every line, and `logs -f` returns when it exits.
    let out = up.cli(&["run", "--detach", &b, "--", "sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.3; done"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("pod b running or done", || up.phase(&b).is_some_and(|p| p != "Pending" && p != "Scheduled"));
    let followed = up.cli(&["logs", "-f", &b]);
    assert!(followed.status.success(), "{}", text(&followed.stderr));
    assert_eq!(text(&followed.stdout), "line 1\nline 2\nline 3\n");
    up.wait("pod b Succeeded", || up.phase(&b).as_deref() == Some("Succeeded"));

    // Clear refusals: an unknown container, an unknown pod.
    let out = up.cli(&["logs", &b, "-c", "nope"]);
    assert!(!out.status.success() && text(&out.stderr).contains("no container \"nope\""), "{}", text(&out.stderr));
    let out = up.cli(&["logs", "missing"]);
    assert!(!out.status.success() && text(&out.stderr).contains("not found"), "{}", text(&out.stderr));

    // A node's credential may not read logs (only the admin may).
    let node_conf = up.data.join("node/node.conf");
    let out = Command::new(PINION).args(["logs", &b, "--config"]).arg(&node_conf).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("403"), "{}", text(&out.stderr));

    // Ctrl-C on `run` deletes the pod, and the nodelet stops its container.
    let mut running = up
        .cmd(&["run", &c, "--grace", "1", "--", "sleep", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    up.wait("pod c running", || up.phase(&c).as_deref() == Some("Running"));
    let ok = Command::new("kill").args(["-INT", &running.id().to_string()]).status().unwrap().success();
    assert!(ok);
    let status = running.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(up.phase(&c), None, "the pod is gone from the server");
    up.wait("the nodelet to drop pod c", || !up.node_pods().contains(&c));

    // --timeout: a pod that cannot be placed (more CPUs than the host has)
    // gives up with 124 and is deleted.
    let d = format!("run-d-{tag}");
    let out = up.cli(&["run", &d, "--cpus", "64", "--wait-for-nodes", "--timeout", "2", "--", "true"]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is pending"), "it said why it waited: {}", text(&out.stderr));
    assert_eq!(up.phase(&d), None);

    // Deleting the finished pods leaves the node with no container.
    let out = up.cli(&["delete", "pod", &a, &b]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("the nodelet to drop every pod", || up.node_pods().is_empty());
    let rt = LibcontainerRuntime::new(&up.data.join("node"), Path::new(PINION)).unwrap();
    up.wait("no container left", || rt.list().unwrap_or_default().is_empty());
}

#[test]
fn run_follows_one_stream_arrays_label_and_aggregate_and_errors_say_what_to_do() {
    let Some(mut up) = Up::start() else { return };
    let tag = std::process::id();

    // The exit code and the output, both streams, through one attach stream.
    let one = format!("three-{tag}");
    let out = up.cli(&["run", &one, "--cpus", "1", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\nerr\n");
    // STATUS says how it ended, as kubectl does; RESTARTS is there.
    let table = text(&up.cli(&["get", "pods", &one]).stdout);
    assert!(table.starts_with("NAME") && table.contains("RESTARTS"), "{table}");
    assert!(table.lines().any(|l| l.starts_with(&one) && l.contains(" Error ")), "{table}");
    let described = text(&up.cli(&["describe", "pod", &one]).stdout);
    assert!(described.contains("Status:      Error\n") && described.contains("Restarts:    0\n"), "{described}");
    assert!(described.contains("state: Terminated (Error), last exit code 3"), "{described}");

    // An array of 4, at most 2 at once: every task ran with its index, lines
    // are labelled, the highest exit code wins.
    let arr = format!("arr-{tag}");
    let script = "echo id=$PINION_ARRAY_TASK_ID; [ $PINION_ARRAY_TASK_ID = 2 ] && exit 5; exit 0";
    let out = up.cli(&["run", &arr, "--array", "0-3%2", "--rm", "--", "sh", "-c", script]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "stdout: {shown}\nstderr: {}", text(&out.stderr));
    let mut lines: Vec<&str> = shown.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["0: id=0", "1: id=1", "2: id=2", "3: id=3"]);
    // --rm removed every task.
    let left = up.cli(&["get", "pods", "-l", &format!("pinion.io/array={arr}"), "-o", "json"]);
    let v: Value = serde_json::from_slice(&left.stdout).unwrap();
    assert_eq!(v["items"].as_array().map(Vec::len), Some(0), "{v:#}");

    // Detached: created with the array's label, annotations and environment.
    let out = up.cli(&["run", &arr, "--array", "1,3%1", "-d", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = up.cli(&["get", "pods", "-l", &format!("pinion.io/array={arr}"), "-o", "json"]);
    let v: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let mut names: Vec<String> = items.iter().map(|p| p["metadata"]["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, [format!("{arr}-1"), format!("{arr}-3")]);
    for p in &items {
        let task = p["metadata"]["name"].as_str().unwrap().rsplit('-').next().unwrap().to_string();
        assert_eq!(p["metadata"]["annotations"]["pinion.io/array-task"], task.as_str(), "{p:#}");
        assert_eq!(p["metadata"]["annotations"]["pinion.io/array-parallelism"], "1", "{p:#}");
        let env = &p["spec"]["containers"][0]["env"][0];
        assert_eq!((env["name"].as_str(), env["value"].as_str()), (Some("PINION_ARRAY_TASK_ID"), Some(task.as_str())));
    }
    let out = up.cli(&["delete", "pod", &format!("{arr}-1"), &format!("{arr}-3"), &one]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Ctrl-C of an array deletes every task, running or waiting, and their
    // containers go (init as PID 1 passes the SIGTERM on to `sleep`).
    let stop = format!("stop-{tag}");
    let mut running = Command::new(PINION)
        .args(["run", &stop, "--array", "1-3%1", "--cpus", "1", "--", "sleep", "1000"])
        .env("PINION_CONFIG", &up.config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Tasks are created concurrently, so any of them may be the one running.
    let tasks: Vec<String> = (1..=3).map(|i| format!("{stop}-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tasks.iter().any(|t| up.phase(t).as_deref() == Some("Running")) {
        if let Ok(Some(status)) = running.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut running.stderr.take().unwrap(), &mut err).unwrap();
            panic!("run --array ended ({status}) before a task ran: {err}");
        }
        assert!(
            Instant::now() < deadline,
            "no task of the array is running after 60 s:\n{}",
            text(&up.cli(&["get", "pods", "-o", "wide"]).stdout)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // %1: one at a time.
    let running_now = tasks.iter().filter(|t| up.phase(t).as_deref() == Some("Running")).count();
    assert_eq!(running_now, 1, "{}", text(&up.cli(&["get", "pods", "-o", "wide"]).stdout));
    let sent = Command::new("kill").args(["-INT", &running.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let status = running.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut running.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "stderr: {err}");
    assert!(err.contains(&format!("array {stop} deleted")), "{err}");
    up.wait("every task of the interrupted array gone", || {
        let listed = up.cli(&["get", "pods", "-l", &format!("pinion.io/array={stop}"), "-o", "json"]);
        let v: Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        v["items"].as_array().is_some_and(Vec::is_empty)
    });
    up.wait("the node runs none of the array's pods", || !up.node_pods().iter().any(|p| p.starts_with(&stop)));

    // A command that cannot be executed is the job's failure: exit 127 and one
    // line; running the same name again replaces the finished pod.
    let missing = format!("missing-{tag}");
    for _ in 0..2 {
        let out = up.cli(&["run", &missing, "--", "/no/such/binary"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(127), "stderr: {err}");
        assert!(err.contains("/no/such/binary") && err.contains("not found") && err.lines().count() == 1, "{err}");
    }

    // The connection to the server breaks while the command runs: `run`
    // reconnects and resumes, so every byte of output comes once.
    let creds = std::fs::read_to_string(&up.config).unwrap();
    let url = orchestrator::tls::Credentials::parse(&creds).unwrap().servers[0].clone();
    let relay = Relay::start(url.trim_start_matches("https://").parse().unwrap()).unwrap();
    let relayed = up.config.with_file_name("relayed-config");
    std::fs::write(&relayed, creds.replace(&url, &format!("https://{}", relay.addr))).unwrap();
    let cut = format!("cut-{tag}");
    let mut running = Command::new(PINION)
        .args(["run", &cut, "--rm", "--", "sh", "-c", "echo before; sleep 2; echo after; exit 4"])
        .env("PINION_CONFIG", &relayed)
        .env("PINION_LOG", "pinion=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(running.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "before\n");
    relay.set_cut(true);
    std::thread::sleep(Duration::from_millis(500));
    relay.set_cut(false);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = running.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut running.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!((status.code(), rest.as_str()), (Some(4), "after\n"), "stderr: {err}");
    assert!(err.contains("reconnecting"), "the cut broke the stream: {err}");
    // --rm holds on the resumed stream too: the pod is gone.
    let left = up.cli(&["get", "pods", "-o", "json"]);
    let v: Value = serde_json::from_slice(&left.stdout).unwrap();
    let names: Vec<&str> =
        v["items"].as_array().unwrap().iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    assert!(!names.contains(&cut.as_str()), "{names:?}");

    // `agent status` finds the node of `pinion up` under its data dir, and says so.
    let out = Command::new(PINION).args(["agent", "status", "--data-dir"]).arg(&up.data).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("node/status.json"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("NODE "), "{}", text(&out.stdout));

    // No server: the cause once, and what to do.
    let mut child = up.up.take().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let out = up.cli(&["get", "pods"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
    assert!(err.contains("is a server running at https://127.0.0.1:") && err.contains("pinion up"), "{err}");
}

/// Processes on this host whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<i32> {
    let want = argv.join("\0") + "\0";
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
                .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn exec_runs_in_the_pods_container_and_ends_with_its_caller() {
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let (pod, done) = (format!("exec-{tag}"), format!("exec-done-{tag}"));
    let out = up.cli(&["run", "--detach", &pod, "--cpus", "1", "--", "sleep", "3000"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("the pod running", || up.phase(&pod).as_deref() == Some("Running"));

    // stdout and stderr apart, the container's cpuset and cgroup, the exit code.
    let script = "echo out; echo err >&2; grep Cpus_allowed_list /proc/self/status; \
                  cmp -s /proc/1/cgroup /proc/self/cgroup && echo same-cgroup; exit 3";
    let out = up.cli(&["exec", &pod, "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\nCpus_allowed_list:\t1\nsame-cgroup\n");
    assert_eq!(text(&out.stderr), "err\n");

    // A command that cannot run: 127 and one line, as `run` says it.
    let out = up.cli(&["exec", &pod, "--", "/no/such/binary"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(err.contains("/no/such/binary: command not found") && err.lines().count() == 1, "{err}");

    // Refusals that say what is wrong: a container the pod lacks, a pod not running.
    let out = up.cli(&["exec", &pod, "-c", "nope", "--", "true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("container") && err.contains("\"nope\""), "{err}");
    let out = up.cli(&["run", &done, "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = up.cli(&["exec", &done, "--", "true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("409") && err.contains("not Running"), "{err}");

    // The caller killed (SIGKILL: no goodbye): the command and its children
    // are gone from the node within a bound, and no exec helper is left.
    let secs = (100_000 + tag % 100_000).to_string();
    let mut caller = up
        .cmd(&["exec", &pod, "--", "sh", "-c", &format!("sleep {secs} & sleep {secs}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    up.wait("the exec's two sleeps", || processes_running(&["sleep", &secs]).len() == 2);
    caller.kill().unwrap();
    let _ = caller.wait();
    up.wait("no process of the exec left", || {
        processes_running(&["sleep", &secs]).is_empty()
            && !std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .any(|e| std::fs::read_to_string(e.path().join("cmdline")).is_ok_and(|c| c.contains(&secs)))
    });
    assert_eq!(up.phase(&pod).as_deref(), Some("Running"), "the pod itself runs on");

    let out = up.cli(&["delete", "pod", &pod, &done]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("the nodelet to drop both pods", || up.node_pods().is_empty());
}

/// Issue 27, end to end: the admin adds alice (uid 1001) and bob; alice's
/// `pinion run` runs as uid 1001 with no capabilities and cannot read
/// `/etc/shadow` on the host root filesystem; bob does not see her pod;
/// her SYS_ADMIN and host-path `/` pods are refused at their field; once
/// revoked, her credentials file is refused.
#[test]
fn a_users_pod_runs_as_their_uid_sees_only_what_they_may_and_a_revoked_user_is_refused() {
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let (alice_conf, bob_conf) = (dir.path().join("alice.conf"), dir.path().join("bob.conf"));
    let out =
        up.cli(&["user", "add", "alice", "--uid", "1001", "--gid", "1001", "--out", alice_conf.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = up.cli(&["user", "add", "bob", "--out", bob_conf.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&alice_conf).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the credentials file holds a key");
    let as_user =
        |conf: &Path, args: &[&str]| Command::new(PINION).arg("--config").arg(conf).args(args).output().unwrap();

    let pod = format!("alice-id-{tag}");
    let script = "id -u; id -g; grep CapEff /proc/self/status; cat /etc/shadow >/dev/null && echo SHADOW-READ; exit 0";
    let out = as_user(&alice_conf, &["run", &pod, "--", "sh", "-c", script]);
    let shown = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{shown}");
    assert!(shown.starts_with("1001\n1001\n"), "runs as uid and gid 1001: {shown}");
    assert!(shown.contains("CapEff:\t0000000000000000"), "no capabilities: {shown}");
    assert!(shown.contains("Permission denied") && !shown.contains("SHADOW-READ"), "/etc/shadow stays closed: {shown}");
    let got = text(&up.cli(&["get", "pods", &pod, "-o", "json"]).stdout);
    let v: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(v["metadata"]["owner"], "alice", "{got}");

    // Bob does not see it: not in his list, 404 when named.
    let listed = text(&as_user(&bob_conf, &["get", "pods"]).stdout);
    assert!(!listed.contains(&pod), "{listed}");
    let got = as_user(&bob_conf, &["get", "pods", &pod]);
    assert!(!got.status.success() && text(&got.stderr).contains("not found"), "{}", text(&got.stderr));
    let del = as_user(&bob_conf, &["delete", "pod", &pod]);
    assert!(!del.status.success(), "bob may not delete it");
    assert!(up.phase(&pod).is_some(), "and it is still there");

    // Refused at the field, naming the profile; nothing is stored.
    let out = as_user(&alice_conf, &["run", &format!("alice-admin-{tag}"), "--cap-add", "SYS_ADMIN", "--", "true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("spec.containers[0].securityContext.capabilities.add[0]: SYS_ADMIN is not allowed for user alice (profile baseline)"),
        "{err}"
    );
    let out = as_user(&alice_conf, &["run", &format!("alice-root-{tag}"), "-v", "/:/host", "--", "true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("hostPath.path: host path \"/\" is not allowed"), "{err}");

    // Root inside a user namespace of her pod's own: root to her command,
    // the pod's block of host ids to the host (its network namespace, made
    // by the pod network, belongs to it). /etc/shadow stays closed, and
    // the block is given back when the pod is gone.
    let pod = format!("alice-userns-{tag}");
    let script = "cat /proc/self/uid_map; id -u; grep CapEff /proc/self/status; \
                  cat /etc/shadow >/dev/null 2>&1 && echo SHADOW-READ; ip -o -4 addr show eth0 | grep -c inet";
    let out = as_user(&alice_conf, &["run", &pod, "--userns", "--", "sh", "-c", script]);
    let shown = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{shown}");
    let map: Vec<&str> = shown.lines().next().unwrap_or_default().split_whitespace().collect();
    let base: u32 = map.get(1).and_then(|b| b.parse().ok()).unwrap_or_else(|| panic!("uid_map: {shown}"));
    assert!(map[0] == "0" && base >= 1 << 31 && map[2] == "65536", "{shown}");
    assert!(shown.contains("\n0\n") && !shown.contains("SHADOW-READ"), "root inside, shadow closed: {shown}");
    assert!(!shown.contains("CapEff:\t0000000000000000"), "root's default set, in its namespace: {shown}");
    assert!(shown.trim_end().ends_with("\n1"), "the pod network's address on eth0: {shown}");
    up.wait("the pod's host ids given back", || {
        // The folder is made at the first claim and stays.
        std::fs::read_dir(up.data.join("node/userns")).map(|d| d.count() == 0).unwrap_or(false)
    });
    up.wait("its pinned user namespace removed with its network", || {
        !std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().contains("/run/pinion/userns/")
    });

    // Revoked: her file is refused at once.
    let out = up.cli(&["user", "revoke", "alice"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = as_user(&alice_conf, &["get", "pods"]);
    assert!(!out.status.success() && text(&out.stderr).contains("revoked"), "{}", text(&out.stderr));
}

/// A host without the CNI plugins (here: `--cni-bin-dir` naming none):
/// `up` writes no pod network, says so once on its first screen with the
/// fix, the node says it as a condition, and a pod runs with `lo` only
/// rather than failing to start.
#[test]
fn up_on_a_host_without_the_plugins_runs_pods_with_lo_only_and_says_why() {
    let Some(up) = Up::start_with(&["--cni-bin-dir", "/nonexistent/cni"]) else { return };
    let screen = &up.first_screen;
    assert!(
        screen.contains("pod network: NONE (none written), pods get only lo: CNI plugin \"bridge\" not found"),
        "{screen}"
    );
    assert!(screen.contains("fix: apt-get install containernetworking-plugins"), "{screen}");
    assert!(!up._tmp.path().join("cni").exists(), "no network written");

    up.wait("the node's condition", || text(&up.cli(&["get", "nodes"]).stdout).contains("Ready,PodNetwork=False"));
    let node = text(&up.cli(&["get", "nodes", "-o", "json"]).stdout);
    let v: Value = serde_json::from_str(&node).unwrap();
    let name = v["items"][0]["metadata"]["name"].as_str().unwrap().to_string();
    let described = text(&up.cli(&["describe", "node", &name]).stdout);
    assert!(described.contains("PodNetwork=False (CNIPluginMissing)"), "{described}");
    assert!(described.contains("fix: apt-get install containernetworking-plugins"), "{described}");

    let pod = format!("lo-only-{}", std::process::id());
    let out = up.cli(&["run", &pod, "--", "sh", "-c", "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "stdout: {shown}\nstderr: {}", text(&out.stderr));
    assert_eq!(shown, "lo\n", "only lo in the pod");
    let status = text(&up.cli(&["get", "pods", &pod, "-o", "json"]).stdout);
    let v: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["status"]["phase"], "Succeeded", "{status}");
    assert!(v["status"].get("podIP").is_none(), "{status}");
}

/// One HTTP GET to `ip:8080`: the body, or why there was none.
fn http_get(ip: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = format!("{ip}:8080").parse().map_err(|e| format!("{ip}: {e}"))?;
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| format!("{ip}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").map_err(|e| format!("{ip}: {e}"))?;
    let mut got = String::new();
    s.read_to_string(&mut got).map_err(|e| format!("{ip}: {e}"))?;
    match got.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => Ok(body.to_string()),
        _ => Err(format!("{ip}: {got:?}")),
    }
}

/// A web server Deployment whose pods answer `version`. On SIGTERM it goes
/// on serving for 2 s before it exits, as a service behind a list of
/// endpoints does (Kubernetes users put a preStop sleep there): a client
/// that read the pod's address just before its deletion is still answered.
fn web_deployment(name: &str, version: &str) -> String {
    let server = "import http.server, os, signal, sys, threading\n\
        body = sys.argv[1].encode()\n\
        class H(http.server.BaseHTTPRequestHandler):\n    \
            def do_GET(self):\n        \
                self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n    \
            def log_message(self, *a):\n        pass\n\
        signal.signal(signal.SIGTERM, lambda *a: threading.Timer(2, os._exit, [0]).start())\n\
        http.server.ThreadingHTTPServer(('', 8080), H).serve_forever()\n";
    let every_second = serde_json::json!({"periodSeconds": 1, "failureThreshold": 2});
    let mut ready = every_second.clone();
    ready["httpGet"] = serde_json::json!({"port": 8080, "path": "/"});
    let mut live = every_second;
    live["exec"] = serde_json::json!({"command": ["sh", "-c", "test ! -f /tmp/sick"]});
    serde_json::json!({
        "apiVersion": "pinion.io/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "web",
                        "rootfs": "host",
                        "command": ["python3", "-c", server, version],
                        "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                        "readinessProbe": ready,
                        "livenessProbe": live,
                    }],
                },
            },
        },
    })
    .to_string()
}

/// The Deployment's pods as the server has them: (name, address, Ready).
fn web_pods(up: &Up, app: &str) -> Vec<(String, Option<String>, bool)> {
    let out = up.cli(&["get", "pods", "-l", &format!("app={app}"), "-o", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        // A deleted pod still draining is listed Terminating; like
        // Kubernetes' surge, the Deployment's count leaves it out.
        .filter(|p| p["status"]["reason"] != "Terminating")
        .map(|p| {
            let s = &p["status"];
            let ready = s["phase"] == "Running"
                && s["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (p["metadata"]["name"].as_str().unwrap_or("").to_string(), s["podIP"].as_str().map(String::from), ready)
        })
        .collect()
}

/// Issue 29 with real containers: a Python web server as a Deployment of
/// 2 with an HTTP readiness probe and an exec liveness probe. A rolling
/// update (maxUnavailable 0, maxSurge 1) to a new version, while a client
/// asks every Ready pod over and over: no request is refused, the Ready
/// pods never number fewer than 2 nor the pods (those not Terminating) more
/// than 3, and at the end
/// every pod answers the new version. Then a liveness failure (a file the
/// probe looks for) restarts that pod's container in place.
#[test]
fn a_rolling_update_of_a_probed_web_server_never_refuses_a_client() {
    let Some(up) = Up::start() else { return };
    let app = format!("web{}", std::process::id());
    let file = up._tmp.path().join("web.json");
    std::fs::write(&file, web_deployment(&app, "v1")).unwrap();
    let out = up.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = up.cli(&["rollout", "status", "deployment", &app, "--timeout", "60s"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let ready: Vec<_> = web_pods(&up, &app).into_iter().filter(|p| p.2).collect();
    assert_eq!(ready.len(), 2, "{ready:?}");
    for (name, ip, _) in &ready {
        let ip = ip.as_deref().unwrap_or_else(|| panic!("{name} has an address"));
        assert_eq!(http_get(ip).as_deref(), Ok("v1"), "{name}");
    }

    // The client, from now until the rollout is done.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (stop, app, config) = (stop.clone(), app.clone(), up.config.clone());
        std::thread::spawn(move || {
            let list = |app: &str| {
                let out = Command::new(PINION)
                    .args(["get", "pods", "-l", &format!("app={app}"), "-o", "json"])
                    .env("PINION_CONFIG", &config)
                    .output()
                    .unwrap();
                serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
            };
            let (mut asked, mut refused, mut fewest_ready, mut most_pods, mut versions) =
                (0, Vec::new(), usize::MAX, 0, std::collections::BTreeSet::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let v = list(&app);
                let Some(items) = v["items"].as_array() else { continue };
                // Draining pods are listed Terminating: the surge counts the others.
                let items: Vec<&Value> = items.iter().filter(|p| p["status"]["reason"] != "Terminating").collect();
                most_pods = most_pods.max(items.len());
                let ready: Vec<&str> = items
                    .iter()
                    .filter(|p| {
                        p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                    .filter_map(|p| p["status"]["podIP"].as_str())
                    .collect();
                fewest_ready = fewest_ready.min(ready.len());
                for ip in ready {
                    asked += 1;
                    match http_get(ip) {
                        Ok(body) => {
                            versions.insert(body);
                        }
                        Err(e) => refused.push(e),
                    }
                }
            }
            (asked, refused, fewest_ready, most_pods, versions)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&file, web_deployment(&app, "v2")).unwrap();
    let out = up.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = up.cli(&["rollout", "status", "deployment", &app, "--timeout", "90s"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    // The last old pod's grace: the client asks on while it drains.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (asked, refused, fewest_ready, most_pods, versions) = client.join().unwrap();
    eprintln!("the client asked {asked} times during the rollout; versions {versions:?}");
    assert!(asked >= 10, "the client asked throughout: {asked}");
    assert_eq!(refused, Vec::<String>::new(), "no request refused");
    assert!(fewest_ready >= 2, "never fewer than replicas - maxUnavailable Ready: {fewest_ready}");
    assert!(most_pods <= 3, "never more than replicas + maxSurge pods: {most_pods}");
    assert!(versions.contains("v1") && versions.contains("v2"), "{versions:?}");
    let after = web_pods(&up, &app);
    assert_eq!(after.len(), 2, "{after:?}");
    for (name, ip, ready) in &after {
        assert!(ready, "{name}");
        assert_eq!(http_get(ip.as_deref().unwrap()).as_deref(), Ok("v2"), "{name}");
    }

    // Liveness: the probe fails twice, the container restarts in place.
    let (sick, ..) = &after[0];
    let out = up.cli(&["exec", sick, "--", "touch", "/tmp/sick"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let restarts = || {
        let out = up.cli(&["get", "pods", sick, "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["status"]["containerStatuses"][0]["restartCount"].as_u64().unwrap_or(0)
    };
    up.wait("the liveness restart", || restarts() >= 1);
    up.wait("ready again", || web_pods(&up, &app).iter().any(|p| &p.0 == sick && p.2));

    let out = up.cli(&["delete", "deployment", &app]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("the nodelet to drop the pods", || up.node_pods().is_empty());
}

/// Issue 33: a deleted pod whose command ignores SIGTERM keeps its CPU until
/// the node kills it at the end of its grace. Meanwhile it is listed
/// `Terminating` with the grace left, and a pod waiting for that CPU names
/// it; then it goes, and the waiting pod runs.
#[test]
fn a_deleted_pod_is_terminating_until_its_cpu_is_free_and_a_waiting_pod_names_it() {
    let Some(up) = Up::start() else { return };
    let file = up._tmp.path().join("stubborn.yaml");
    std::fs::write(
        &file,
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: stubborn}\nspec:\n  \
         terminationGracePeriodSeconds: 6\n  containers:\n  - name: main\n    rootfs: host\n    \
         command: [/bin/sh, -c, \"trap '' TERM; while :; do sleep 0.2; done\"]\n    \
         resources:\n      limits: {cpu: 1, memory: 64Mi}\n",
    )
    .unwrap();
    let out = up.cli(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("stubborn Running", || up.phase("stubborn").as_deref() == Some("Running"));
    // Its events say where and when it started, as kubectl's do.
    up.wait("a Started event", || {
        text(&up.cli(&["describe", "pod", "stubborn"]).stdout).contains("started container main on")
    });
    let out = up.cli(&["delete", "pod", "stubborn"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("stubborn listed Terminating with its grace left", || {
        let table = text(&up.cli(&["get", "pods"]).stdout);
        table.lines().any(|l| l.starts_with("stubborn") && l.contains("Terminating ("))
    });
    let out = up.cli(&["run", "next", "--cpus", "1", "-d", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("next's reason naming stubborn", || {
        let out = up.cli(&["get", "pods", "next", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let message = v["status"]["message"].as_str().unwrap_or("");
        message.contains("waiting for terminating pods to free their resources: stubborn on")
    });
    // Past its grace the node kills it: it leaves the list and `next` runs.
    up.wait("stubborn gone and next run", || {
        let table = text(&up.cli(&["get", "pods"]).stdout);
        !table.contains("stubborn") && matches!(up.phase("next").as_deref(), Some("Succeeded"))
    });
}

/// The job's status as `get jobs NAME -o json` shows it.
fn job_status(up: &Up, job: &str) -> Value {
    let out = up.cli(&["get", "jobs", job, "-o", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["status"].clone()
}

/// `pinion batch` as alice (uid 1001): the script's output lands in her
/// `-o` file on the node, created by her uid, besides the job's log; a
/// folder she may not write in, or one that does not exist, fails the job
/// with a reason that says so, and nothing is written there.
#[test]
fn a_batch_script_writes_its_output_file_as_its_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.path().join("alice.conf");
    let out = up.cli(&["user", "add", "alice", "--uid", "1001", "--gid", "1001", "--out", conf.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Her folder, and root's (0755: she may read it, not write in it).
    let hers = dir.path().join("hers");
    let roots = dir.path().join("roots");
    for d in [&hers, &roots] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::os::unix::fs::chown(&hers, Some(1001), Some(1001)).unwrap();
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#SBATCH --time=5 -c 1\n# a comment\n\nid -u\necho \"args $*\"\necho to-stderr >&2\n",
    )
    .unwrap();
    let batch = |name: &str, extra: &[&str]| {
        Command::new(PINION)
            .arg("--config")
            .arg(&conf)
            .arg("batch")
            .arg(&script)
            .args(["-J", name])
            .args(extra)
            .current_dir(&hers)
            .output()
            .unwrap()
    };
    let ended = |job: &str| {
        up.wait(&format!("job {job} ended"), || {
            matches!(job_status(&up, job)["phase"].as_str(), Some("Succeeded" | "Failed"))
        });
        job_status(&up, job)
    };

    // The default file, pinion-%j.out in the submission's folder.
    let job = format!("out-{tag}");
    let t = Instant::now();
    let out = batch(&job, &["--", "one", "two"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("Submitted batch job {job}\n"));
    assert!(t.elapsed() < Duration::from_secs(5), "batch returns at once");
    let st = ended(&job);
    assert_eq!(st["phase"], "Succeeded", "{st}");
    let file = hers.join(format!("pinion-{job}.out"));
    let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!((meta.uid(), meta.gid()), (1001, 1001), "made by her uid");
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written, "1001\nargs one two\nto-stderr\n", "{written}");
    // Pinion's own log has it too.
    let logs = up.cli(&["logs", &format!("{job}-0")]);
    assert!(text(&logs.stdout).contains("args one two"), "{}", text(&logs.stdout));

    // -o and -e apart, with patterns.
    let job = format!("split-{tag}");
    let out = batch(&job, &["-o", "%x.%j.o", "-e", "%x.e"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ended(&job)["phase"], "Succeeded");
    assert_eq!(std::fs::read_to_string(hers.join(format!("{job}.{job}.o"))).unwrap(), "1001\nargs \n");
    assert_eq!(std::fs::read_to_string(hers.join(format!("{job}.e"))).unwrap(), "to-stderr\n");

    // An array: one job per task, each with its own file (%A the array, %a the task).
    std::fs::write(&script, "#!/bin/sh\n#SBATCH --array=1-2 -o arr-%A-%a.out\necho task $PINION_ARRAY_TASK_ID\n")
        .unwrap();
    let arr = format!("arr-{tag}");
    let out = batch(&arr, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(&format!("Submitted batch job {arr} (2 array tasks")),
        "{}",
        text(&out.stdout)
    );
    for task in [1, 2] {
        assert_eq!(ended(&format!("{arr}-{task}"))["phase"], "Succeeded");
        let file = hers.join(format!("arr-{arr}-{task}.out"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("task {task}\n"));
        assert_eq!(std::fs::metadata(&file).unwrap().uid(), 1001);
    }
    std::fs::write(&script, "#!/bin/sh\n#SBATCH --time=5 -c 1\nid -u\necho \"args $*\"\necho to-stderr >&2\n").unwrap();

    // Root's folder: refused to her uid, nothing written.
    let job = format!("denied-{tag}");
    let o = format!("{}/x.out", roots.display());
    let out = batch(&job, &["-o", &o]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ended(&job)["phase"], "Failed");
    let pod = text(&up.cli(&["get", "pods", &format!("{job}-0"), "-o", "json"]).stdout);
    assert!(pod.contains("uid 1001 may not write there"), "{pod}");
    assert!(!roots.join("x.out").exists());

    // A folder the node does not have.
    let job = format!("nodir-{tag}");
    let out = batch(&job, &["-o", "/no/such/dir/x.out"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ended(&job)["phase"], "Failed");
    let pod = text(&up.cli(&["get", "pods", &format!("{job}-0"), "-o", "json"]).stdout);
    assert!(pod.contains("the directory /no/such/dir does not exist on this node"), "{pod}");

    // An unknown directive: refused at submission, naming its line.
    std::fs::write(&script, "#!/bin/sh\n#SBATCH -n 1\n#SBATCH --qos=high\ntrue\n").unwrap();
    let out = batch(&format!("bad-{tag}"), &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("line 3: unknown option \"--qos\""), "{}", text(&out.stderr));
}

/// `--time`: the server stops a job at its deadline (SIGTERM, then SIGKILL
/// after the grace) and it ends Failed, DeadlineExceeded; `run --time`
/// exits 124. A chain `afterok` on a failed job ends DependencyNeverSatisfied;
/// `afterany` on it runs. `cancel`, `hold` and `release`.
#[test]
fn a_job_past_its_time_ends_deadline_exceeded_and_dependencies_order_jobs() {
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sleep.sh");
    std::fs::write(&script, "#!/bin/sh\n#SBATCH -t 0:02\necho started\nsleep 300\n").unwrap();
    let job = format!("slow-{tag}");
    let out = up.cmd(&["batch", script.to_str().unwrap(), "-J", &job]).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("the job running", || job_status(&up, &job)["phase"] == "Running");
    let started = Instant::now();
    up.wait("the job ended", || job_status(&up, &job)["phase"] == "Failed");
    let took = started.elapsed();
    let st = job_status(&up, &job);
    assert_eq!(st["reason"], "DeadlineExceeded", "{st}");
    // 2 s, then SIGTERM ends `sleep` under the init at once; well within the
    // 30 s grace.
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(15), "{took:?}");
    up.wait("its member stopped", || up.phase(&format!("{job}-0")).is_none());
    assert!(std::fs::read_to_string(dir.path().join(format!("pinion-{job}.out"))).unwrap().contains("started"));

    // srun's --time: exit 124.
    let t = Instant::now();
    let out = up.cli(&["run", &format!("run-slow-{tag}"), "-t", "0:2", "--", "sleep", "300"]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("DeadlineExceeded"), "{}", text(&out.stderr));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());

    // A chain: a fails; b (afterok:a) never runs; c (afterany:a) does.
    // sbatch's order here: the options before the script.
    let batch = |name: &str, body: &str, extra: &[&str]| {
        let s = dir.path().join(format!("{name}.sh"));
        std::fs::write(&s, format!("#!/bin/sh\n{body}\n")).unwrap();
        let out =
            up.cmd(&["batch", "-J", name, s.to_str().unwrap()]).args(extra).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let (a, b, c) = (format!("a-{tag}"), format!("b-{tag}"), format!("c-{tag}"));
    batch(&a, "sleep 1; exit 3", &[]);
    batch(&b, "echo b", &["-d", &format!("afterok:{a}")]);
    batch(&c, "echo c", &["-d", &format!("afterany:{a}")]);
    let st = job_status(&up, &b);
    assert_eq!((st["phase"].as_str(), st["reason"].as_str()), (Some("Pending"), Some("Dependency")), "{st}");
    up.wait("b given up", || job_status(&up, &b)["phase"] == "Failed");
    let st = job_status(&up, &b);
    assert_eq!(st["reason"], "DependencyNeverSatisfied", "{st}");
    assert!(st["message"].as_str().unwrap_or_default().contains(&format!("job {a} failed")), "{st}");
    up.wait("c done", || job_status(&up, &c)["phase"] == "Succeeded");
    assert!(up.phase(&format!("{b}-0")).is_none(), "b never had members");

    // hold and release: e waits for the one pinnable CPU d holds; held, it
    // has no member, and stays so after d is cancelled (scancel) until it
    // is released. A running job cannot be held.
    let (d, e) = (format!("d-{tag}"), format!("e-{tag}"));
    batch(&d, "sleep 300", &["-c", "1"]);
    up.wait("d running", || job_status(&up, &d)["phase"] == "Running");
    let out = up.cli(&["hold", &d]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("only a pending job can be held"),
        "{}",
        text(&out.stderr)
    );
    batch(&e, "echo e", &["-c", "1"]);
    up.wait("e queued", || up.phase(&format!("{e}-0")).as_deref() == Some("Pending"));
    let out = up.cli(&["hold", &e]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(job_status(&up, &e)["reason"], "JobHeldUser");
    up.wait("e's member gone", || up.phase(&format!("{e}-0")).is_none());
    let out = up.cli(&["cancel", &d]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("d gone", || up.phase(&format!("{d}-0")).is_none());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(job_status(&up, &e)["phase"], "Pending", "held, it does not start");
    assert!(up.phase(&format!("{e}-0")).is_none());
    let out = up.cli(&["release", &e]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("e done", || job_status(&up, &e)["phase"] == "Succeeded");
}

/// `pinion run --image` of an image in a registry on loopback: the node
/// pulls it and runs it; a pod whose tag the registry lacks waits in
/// ImagePullBackOff with the registry's words in `get pods -o wide`.
#[test]
fn a_pod_runs_an_image_from_a_registry_and_a_missing_one_says_why() {
    let tools = ["docker-registry", "skopeo"]
        .iter()
        .all(|b| std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(b).is_file())));
    if !requires(tools, "docker-registry and skopeo (e2e/host-setup.sh installs them)") {
        return;
    }
    let regdir = tempfile::Builder::new().prefix("pinion-reg-").tempdir().unwrap();
    let reg = registry::Registry::plain(&regdir.path().join("registry"));
    let Some(up) = Up::start_with(&["--insecure-registry", &reg.host]) else { return };
    let layout = regdir.path().join("layout");
    let mut files = layers::shell_files();
    files.push(layers::file("hello.txt", b"from the registry\n"));
    let config = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}});
    let layer = layers::gzip(&layers::layer_tar(&files));
    layers::write_layout(&layout, &[(layer, "application/vnd.oci.image.layer.v1.tar+gzip")], config, "v1");
    let image = reg.push(&layout, "v1", "app:1", None);

    let out = up.cli(&["run", "pulled", "--image", &image, "--", "/bin/sh", "-c", "read l < /hello.txt; echo $l"]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("from the registry"), "{}", text(&out.stdout));

    let missing = format!("{}/app:missing", reg.host);
    let out = up.cli(&["run", "missing", "-d", "--image", &missing, "--", "/bin/true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("ImagePullBackOff with the registry's words", || {
        let wide = text(&up.cli(&["get", "pods", "missing", "-o", "wide"]).stdout);
        wide.contains("ImagePullBackOff") && wide.contains("MANIFEST_UNKNOWN")
    });
    up.wait("a Failed event with the registry's words", || {
        let d = text(&up.cli(&["describe", "pod", "missing"]).stdout);
        d.lines().any(|l| l.contains("Failed") && l.contains("MANIFEST_UNKNOWN"))
    });
    let out = up.cli(&["delete", "pod", "missing"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `pinion acct` (sacct) over real containers: a job that burns CPU and
/// fills memory shows COMPLETED with TotalCPU and MaxRSS read from its
/// cgroup as it ended (cgroup v1 on this host), after its pods are gone; a
/// failed job shows FAILED and its code; a pod of `pinion run` is a job of
/// its own; a user does not see another's records; `--efficiency` is seff.
#[test]
fn acct_shows_finished_jobs_with_their_cgroup_figures_to_their_owner() {
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("burn.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#SBATCH -c 1 --mem=256M\ni=0; while [ $i -lt 300000 ]; do i=$((i+1)); done\n\
         x=$(head -c 30000000 /dev/zero | tr '\\0' a)\necho ${#x}\n",
    )
    .unwrap();
    let batch = |name: &str, extra: &[&str]| {
        let out = up
            .cmd(&["batch", "-J", name, script.to_str().unwrap()])
            .args(extra)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let ended = |job: &str| {
        up.wait(&format!("job {job} ended"), || {
            matches!(job_status(&up, job)["phase"].as_str(), Some("Succeeded" | "Failed"))
        });
    };
    let acct = |conf: Option<&Path>, args: &[&str]| {
        let mut c = up.cmd(&[]);
        if let Some(conf) = conf {
            c.arg("--config").arg(conf);
        }
        let out = c.arg("acct").args(args).output().unwrap();
        assert!(out.status.success(), "acct {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let cols = "--format=JobID,State,ExitCode,TotalCPU,MaxRSS,User,NCPUS";

    let (burn, fail) = (format!("burn-{tag}"), format!("fail-{tag}"));
    batch(&burn, &[]);
    ended(&burn);
    assert_eq!(job_status(&up, &burn)["phase"], "Succeeded");
    // Its pods go: the records stay.
    let out = up.cli(&["cancel", &burn]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("its member gone", || up.phase(&format!("{burn}-0")).is_none());
    let shown = acct(None, &["-P", "-n", "-j", &burn, cols]);
    let lines: Vec<Vec<&str>> = shown.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(lines.len(), 2, "the job line and its member's: {shown}");
    let member = format!("{burn}.0");
    assert_eq!((lines[0][0], lines[1][0]), (burn.as_str(), member.as_str()), "{shown}");
    for l in &lines {
        assert_eq!((l[1], l[2], l[5], l[6]), ("COMPLETED", "0:0", "admin", "1"), "{shown}");
        assert!(!l[3].is_empty() && l[3] != "00:00.000", "TotalCPU > 0: {shown}");
        let kib: u64 = l[4].trim_end_matches('K').parse().unwrap_or(0);
        assert!(kib > 30_000, "MaxRSS holds the 30 MB string: {shown}");
    }
    eprintln!("acct: {shown}");
    let seff = acct(None, &["--efficiency", &burn]);
    for want in ["State: COMPLETED", "Cores: 1", "CPU Efficiency: ", "Memory Efficiency: ", "of 256Mi"] {
        assert!(seff.contains(want), "{want}: {seff}");
    }
    eprintln!("seff: {seff}");

    std::fs::write(&script, "#!/bin/sh\nexit 3\n").unwrap();
    batch(&fail, &[]);
    ended(&fail);
    let shown = acct(None, &["-P", "-n", "-X", "-j", &fail, "--format=JobID,State,ExitCode"]);
    assert_eq!(shown, format!("{fail}|FAILED|3:0\n"));
    // Past its time limit: TIMEOUT, its member stopped with SIGTERM, CANCELLED.
    let slow = format!("slow-{tag}");
    std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
    batch(&slow, &["-t", "0:01"]);
    ended(&slow);
    let shown = acct(None, &["-P", "-n", "-j", &slow, "--format=JobID,State,ExitCode"]);
    assert_eq!(shown, format!("{slow}|TIMEOUT|0:15\n{slow}.0|CANCELLED|0:15\n"));

    // A pod of `pinion run` is a job of its own; alice sees hers, bob none of hers.
    let (alice, bob) = (dir.path().join("alice.conf"), dir.path().join("bob.conf"));
    for (name, uid, conf) in [("alice", "1001", &alice), ("bob", "1002", &bob)] {
        let out = up.cli(&["user", "add", name, "--uid", uid, "--gid", uid, "--out", conf.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let one = format!("one-{tag}");
    let out = up.cmd(&["--config", alice.to_str().unwrap(), "run", &one, "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    up.wait("her record", || acct(Some(&alice), &["-P", "-n", "--format=JobID"]).contains(&one));
    assert_eq!(
        acct(Some(&alice), &["-P", "-n", "-j", &one, "--format=JobID,User,State"]),
        format!("{one}|alice|COMPLETED\n")
    );
    let his = acct(Some(&bob), &["-P", "-n", "-S", "now-1day"]);
    assert!(!his.contains(&one) && !his.contains(&burn), "{his}");
    assert!(acct(None, &["-P", "-n", "--format=JobID"]).contains(&one), "an admin sees all");
    let out = up.cli(&["acct", "--format=JobID,Colour"]);
    assert!(!out.status.success() && text(&out.stderr).contains("unknown column \"Colour\""), "{}", text(&out.stderr));
}

/// Issue 30, interactive: `pinion alloc -c 1 -- COMMAND` holds one member on
/// CPU 1, runs COMMAND here with PINION_JOB set; `pinion run` in it is a
/// step in the member (its host name, its PINION_JOB, `--pty`: a terminal
/// of the member's), a step bigger than
/// the allocation is refused naming the flag; the job is gone once COMMAND
/// ends, with COMMAND's exit code. A SIGTERM to `alloc` releases its
/// allocation as well, and so does its time limit (the command hung up).
#[test]
fn an_allocation_runs_steps_in_its_member_and_is_released_after() {
    let Some(up) = Up::start() else { return };
    let tag = std::process::id();
    let name = format!("salloc-{tag}");
    let script = format!(
        "{PINION} run -- hostname; {PINION} run -- sh -c 'echo $PINION_JOB'; {PINION} run --pty -- tty; \
         {PINION} run -n 2 -- true; {PINION} run -c 2 -- true; exit 7"
    );
    let out = up.cli(&["alloc", "-c", "1", "-J", &name, "--", "sh", "-c", &script]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    // The third step on a terminal of the member's (its newline is the terminal's).
    let said = text(&out.stdout);
    let pty = said.strip_prefix(&format!("{name}-0\n{name}\n")).unwrap_or_else(|| panic!("{said:?} {err}"));
    assert!(pty.starts_with("/dev/pts/") && pty.ends_with("\r\n"), "{said:?}");
    for said in [
        format!("salloc: Granted job allocation {name}"),
        format!("salloc: Relinquishing job allocation {name}"),
        format!("--ntasks 2: allocation {name} holds 1 task"),
        format!("--cpus 2: member {name}-0 of allocation {name} holds 1 CPUs"),
    ] {
        assert!(err.contains(&said), "{said:?} in {err}");
    }
    up.wait("the allocation gone", || !up.cli(&["get", "jobs", &name]).status.success() && up.node_pods().is_empty());

    // Released by a signal while its command runs: no job is left.
    let held = format!("held-{tag}");
    let mut alloc = up
        .cmd(&["alloc", "-c", "1", "-J", &held, "--", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(alloc.stderr.take().unwrap()).lines();
    let granted = format!("salloc: Granted job allocation {held}");
    assert!(lines.by_ref().map_while(Result::ok).any(|l| l == granted), "never granted");
    let _ = Command::new("kill").args(["-TERM", &alloc.id().to_string()]).status();
    let status = alloc.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    up.wait("the signalled allocation gone", || {
        !up.cli(&["get", "jobs", &held]).status.success() && up.node_pods().is_empty()
    });

    // Past its time limit the allocation is revoked: the command is hung
    // up (SIGHUP, 129) and the job deleted.
    let short = format!("short-{tag}");
    let t = Instant::now();
    let out = up.cli(&["alloc", "-c", "1", "-t", "0:02", "-J", &short, "--", "sleep", "1000"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(129), "{err}");
    assert!(err.contains(&format!("salloc: Job allocation {short} has been revoked")), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    up.wait("the revoked allocation gone", || {
        !up.cli(&["get", "jobs", &short]).status.success() && up.node_pods().is_empty()
    });
}

/// `pinion exec -i`: the caller's stdin reaches the command, its end is the
/// command's end of file; without `-i` the command reads an empty stdin.
#[test]
fn exec_with_stdin_forwards_it_and_its_end() {
    use std::io::Write;
    let Some(up) = Up::start() else { return };
    let pod = up.sleeping_pod("stdin");

    let mut cat =
        up.cmd(&["exec", "-i", &pod, "--", "cat"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = cat.stdin.take().unwrap();
    // Two writes apart in time: each is its own post, kept in order.
    stdin.write_all(b"hello\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all("wörld\n".as_bytes()).unwrap();
    drop(stdin);
    let out = cat.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "hello\nwörld\n");

    // Without -i: /dev/null, whatever this process's stdin holds.
    let mut cat = up.cmd(&["exec", &pod, "--", "cat"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    cat.stdin.take().unwrap().write_all(b"not sent\n").unwrap();
    let out = cat.wait_with_output().unwrap();
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), String::new()));

    let out = up.cli(&["delete", "pod", &pod]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `pinion exec -it`: the command runs on a terminal of the container's own
/// (`tty` names /dev/pts/N; /dev/tty opens: it is the command's
/// controlling terminal) of the caller's size, driven here from a pty of
/// `script(1)`; without `-t` it has none.
#[test]
fn exec_with_a_tty_runs_on_a_terminal_of_the_containers() {
    let Some(up) = Up::start() else { return };
    let pod = up.sleeping_pod("tty");

    // script's terminal given a size: the command's terminal has it too.
    let line =
        format!("stty rows 30 cols 100; {PINION} exec -it {pod} -- sh -c 'tty; stty size; : </dev/tty && echo ctty'");
    let mut script = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("PINION_CONFIG", &up.config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held open until it ends: script(1) ends its session at its stdin's end.
    let stdin = script.stdin.take();
    let deadline = Instant::now() + Duration::from_secs(30);
    while script.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "exec -it did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(stdin);
    let out = script.wait_with_output().unwrap();
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said} {}", text(&out.stderr));
    assert!(said.contains("/dev/pts/") && said.contains("30 100"), "{said:?}");
    // Its controlling terminal: /dev/tty opens (^C is SIGINT there).
    assert!(said.contains("ctty"), "{said:?}");

    let out = up.cli(&["exec", &pod, "--", "tty"]);
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(1), "not a tty\n".to_string()));

    let out = up.cli(&["delete", "pod", &pod]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
